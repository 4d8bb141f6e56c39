"""What a running vLLM service really loaded, read from its processes' memory maps."""

import socket
from pathlib import Path

from socketwise.serve.verify import check_instance, missing_preloads, port_clashes, runtime

VENV = "/opt/socketwise/venvs/9fc1d65d5fe4/lib/python3.11/site-packages"


def _maps(proc: Path, pid: int, paths: list[str]) -> None:
    (proc / str(pid)).mkdir(parents=True)
    lines = [
        f"7f00{i:04x}000-7f00{i:04x}fff r-xp 00000000 08:01 {i} {p}" for i, p in enumerate(paths)
    ]
    lines.append("7ffd0000-7ffd1000 rw-p 00000000 00:00 0 [stack]")
    (proc / str(pid) / "maps").write_text("\n".join(lines) + "\n")


def test_zentorch_loaded_means_vllm_chose_its_zen_platform(tmp_path):
    _maps(tmp_path, 10, [f"{VENV}/torch/lib/libtorch_cpu.so", "/usr/bin/python3.11"])
    zentorch = f"{VENV}/zentorch/_C.cpython-311-x86_64-linux-gnu.so"
    tcmalloc = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.9"
    _maps(tmp_path, 11, [f"{VENV}/vllm/_C.abi3.so", zentorch, tcmalloc])
    assert runtime([10, 11, 12], tmp_path) == {
        "platform": "ZenCpuPlatform",
        "kernels": ["_C"],
        "runtime_libraries": ["libtcmalloc_minimal.so.4.5.9"],
    }


def test_without_zentorch_it_is_the_generic_platform_with_the_kernels_it_picked(tmp_path):
    _maps(tmp_path, 20, [f"{VENV}/vllm/_C_AVX2.abi3.so", f"{VENV}/torch/lib/libgomp-a34b3233.so.1"])
    assert runtime([20], tmp_path) == {
        "platform": "CpuPlatform",
        "kernels": ["_C_AVX2"],
        "runtime_libraries": ["libgomp-a34b3233.so.1"],
    }


def test_a_process_gone_meanwhile_reads_as_nothing_loaded(tmp_path):
    assert runtime([99], tmp_path) == {
        "platform": "CpuPlatform",
        "kernels": [],
        "runtime_libraries": [],
    }


def test_a_preload_the_service_did_not_load_is_named():
    loaded = {"runtime_libraries": ["libgomp.so.1", "libtcmalloc_minimal.so.4.5.9"]}
    preload = ["/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", "/opt/v/lib/libiomp5.so"]
    assert missing_preloads("vllm-sn", preload, loaded) == [
        "vllm-sn: /opt/v/lib/libiomp5.so is in LD_PRELOAD but no process of the service loaded it"
    ]


def test_a_listener_on_every_address_clashes_with_a_server_on_one_of_them():
    """Another program listening on the kit's port on 0.0.0.0 stops the kit's server from
    binding any address there; one on another single address does not."""
    with (
        socket.create_server(("0.0.0.0", 0)) as everywhere,
        socket.create_server(("127.0.0.3", 0)) as one,
    ):
        port, other = everywhere.getsockname()[1], one.getsockname()[1]
        [clash] = port_clashes("127.0.0.2", [port], set())
        assert (clash["address"], clash["port"]) == ("0.0.0.0", port)
        assert port_clashes("127.0.0.2", [other], set()) == []
        assert [c["address"] for c in port_clashes("127.0.0.3", [other], set())] == ["127.0.0.3"]


def test_a_process_of_the_service_allowed_beyond_the_plans_cpus_is_named():
    """The deploy's check: each process of an instance may run on its planned CPUs alone.
    One left on more (a helper the service started before its placement) is named, with
    the CPUs it should not have; one within them is not."""
    instance = {"name": "vllm-sn", "ranks": [{"cpus": [0, 1]}], "cpus_allowed": [0, 1]}
    worker = {"pid": 11, "comm": "VLLM::Worker_TP0", "title": "VLLM::Worker_TP0",
              "thread_cpus": [0, 1], "cpus_allowed": [0, 1]}  # fmt: skip
    helper = worker | {
        "pid": 12,
        "comm": "python3",
        "title": "python3",
        "cpus_allowed": [0, 1, 2, 3],
    }
    assert check_instance(instance, [worker]) == []
    assert check_instance(instance, [worker, helper]) == [
        "vllm-sn: process 12 (python3) may run on CPUs [2, 3] outside the planned [0, 1]"
    ]
