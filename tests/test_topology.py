import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable

import pytest

from socketwise.facts import topology as topology_module
from socketwise.facts.files import TopologyError, format_cpulist, parse_cpulist
from socketwise.facts.gpus import ask_nvidia_smi
from socketwise.facts.topology import detect, detect_here, register

from .playbooks import BIN, REPO


def node(topology: dict, node_id: int) -> dict:
    return next(n for n in topology["nodes"] if n["id"] == node_id)


def test_r730_sockets_hold_even_and_odd_cpus(machine_root):
    topology = detect(machine_root("r730"))

    assert topology["schema"] == 1
    assert topology["cpu"] == {
        "vendor": "GenuineIntel",
        "model_name": "Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz",
        "family": 6,
        "model": 79,
    }
    assert topology["isa"]["avx2"] is True
    assert topology["isa"]["avx512f"] is False
    assert topology["isa"]["amx_bf16"] is False
    assert topology["smt"] is True
    assert topology["sockets"] == [
        {"id": 0, "nodes": [0], "cores": 14},
        {"id": 1, "nodes": [1], "cores": 14},
    ]
    socket0 = node(topology, 0)
    assert socket0["socket"] == 0
    assert socket0["cpus"] == list(range(0, 27, 2)) + list(range(28, 55, 2))
    assert socket0["cores"][:3] == [[0, 28], [2, 30], [4, 32]]
    assert len(socket0["cores"]) == 14
    assert node(topology, 1)["cores"][0] == [1, 29]
    assert socket0["memory_mb"] == 65536
    assert topology["memory_mb"] == 131072
    assert [n["distances"] for n in topology["nodes"]] == [[10, 21], [21, 10]]
    assert socket0["hugepages"] == {
        "2048kB": {"total": 1024, "free": 1000},
        "1048576kB": {"total": 0, "free": 0},
    }
    assert topology["kernel"] == {
        "numa_balancing": 1,
        "thp": "madvise",
        "thp_defrag": "madvise",
        "irqbalance_active": True,
    }


def test_epyc_siblings_are_cpu_plus_128(machine_root):
    topology = detect(machine_root("epyc2s"))

    assert topology["cpu"]["vendor"] == "AuthenticAMD"
    assert (topology["cpu"]["family"], topology["cpu"]["model"]) == (25, 17)
    assert {flag for flag, present in topology["isa"].items() if present} == {
        "avx2",
        "avx512f",
        "avx512_bf16",
        "avx512_vnni",
    }
    assert [s["cores"] for s in topology["sockets"]] == [64, 64]
    assert node(topology, 0)["cpus"] == list(range(64)) + list(range(128, 192))
    for numa_node in topology["nodes"]:
        assert all(core == [core[0], core[0] + 128] for core in numa_node["cores"])
    assert node(topology, 1)["cores"][0] == [64, 192]
    assert node(topology, 1)["memory_mb"] == 384 * 1024


def test_sub_numa_clustering_puts_two_nodes_on_each_socket(machine_root):
    topology = detect(machine_root("snc"))

    assert [s["nodes"] for s in topology["sockets"]] == [[0, 1], [2, 3]]
    assert [s["cores"] for s in topology["sockets"]] == [56, 56]
    assert [n["socket"] for n in topology["nodes"]] == [0, 0, 1, 1]
    assert [len(n["cores"]) for n in topology["nodes"]] == [28, 28, 28, 28]
    assert node(topology, 1)["cores"][0] == [28, 140]
    assert node(topology, 0)["distances"] == [10, 12, 21, 21]
    assert all(topology["isa"][flag] for flag in ("amx_bf16", "amx_int8", "amx_tile"))


def test_memory_only_node_has_no_socket_and_no_cpus(machine_root):
    topology = detect(machine_root("cxl"))

    cxl = node(topology, 2)
    assert (cxl["socket"], cxl["cpus"], cxl["cores"]) == (None, [], [])
    assert cxl["memory_mb"] == 128 * 1024
    assert cxl["distances"] == [14, 24, 10]
    assert [s["nodes"] for s in topology["sockets"]] == [[0], [1]]


def test_offline_cpus_are_absent_and_their_siblings_stand_alone(machine_root):
    topology = detect(machine_root("offline"))

    (only,) = topology["nodes"]
    assert only["cpus"] == [0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13, 14, 15]
    assert only["cores"][-3:] == [[5, 13], [14], [15]]
    assert topology["sockets"] == [{"id": 0, "nodes": [0], "cores": 8}]


def test_smt_switched_off_reports_no_smt_even_where_sibling_lists_name_offline_threads(
    machine_root,
):
    # The R730 with SMT switched off (threads 28-55 offline), in a tree whose
    # thread_siblings_list still names each online CPU's offline sibling.
    root = machine_root("r730")
    cpu_dir = root / "sys/devices/system/cpu"
    (cpu_dir / "online").write_text("0-27\n")
    for cpu in range(28, 56):
        shutil.rmtree(cpu_dir / f"cpu{cpu}/topology")
        (cpu_dir / f"cpu{cpu}/online").write_text("0\n")
    assert (cpu_dir / "cpu0/topology/thread_siblings_list").read_text() == "0,28\n"

    topology = detect(root)

    assert topology["smt"] is False
    assert node(topology, 0)["cores"] == [[cpu] for cpu in range(0, 28, 2)]
    assert [s["cores"] for s in topology["sockets"]] == [14, 14]


def test_vm_without_smt_finds_the_virtio_nics_pci_function(machine_root):
    topology = detect(machine_root("vm"))

    assert topology["smt"] is False
    assert all(len(core) == 1 for core in node(topology, 0)["cores"])
    assert topology["nics"] == [{"name": "eth0", "pci": "0000:00:03.0", "numa_node": None}]
    assert topology["gpus"] == []
    assert topology["kernel"]["numa_balancing"] is None
    assert topology["kernel"]["irqbalance_active"] is False


def test_gpu_server_reports_gpus_and_physical_nics_with_their_nodes(machine_root):
    topology = detect(machine_root("gpu"))

    # The BMC's ASPEED VGA is a display controller too, but not one vLLM can use.
    # No nvidia-smi answers captured in this tree: what only nvidia-smi tells is null.
    unknown = {"local_cpus": None, "memory_mb": None, "name": None, "links": None, "minor": None}
    assert topology["gpus"] == [
        {"pci": "0000:ca:00.0", "vendor": "nvidia", "numa_node": 1} | unknown,
        {"pci": "0000:e1:00.0", "vendor": "nvidia", "numa_node": 1} | unknown,
    ]
    assert topology["nics"] == [
        {"name": "ens2f0np0", "pci": "0000:31:00.0", "numa_node": 0},
        {"name": "ens2f1np1", "pci": "0000:31:00.1", "numa_node": 0},
    ]


def gpu(topology: dict, pci: str) -> dict:
    return next(g for g in topology["gpus"] if g["pci"] == pci)


def test_nvidia_gpus_get_name_memory_and_links_from_the_captured_nvidia_smi(machine_root):
    topology = detect(machine_root("dgx-h100"))

    assert [(g["pci"], g["numa_node"]) for g in topology["gpus"]] == [
        ("0000:1b:00.0", 0), ("0000:43:00.0", 0), ("0000:52:00.0", 0), ("0000:61:00.0", 0),
        ("0000:9d:00.0", 1), ("0000:c3:00.0", 1), ("0000:d1:00.0", 1), ("0000:df:00.0", 1),
    ]  # fmt: skip
    first = gpu(topology, "0000:1b:00.0")
    assert (first["name"], first["memory_mb"]) == ("NVIDIA H100 80GB HBM3", 81559)
    assert first["local_cpus"] == node(topology, 0)["cpus"]
    # nvidia-smi numbers GPUs in its own order (PCI bus order): GPU7 is df:00.0.
    assert first["links"] == {g["pci"]: "NV18" for g in topology["gpus"][1:]}
    # The driver's device minors, from /proc/driver/nvidia/gpus/*/information.
    assert [g["minor"] for g in topology["gpus"]] == list(range(8))


def test_pcie_links_and_a_gpu_without_a_node_placed_by_its_local_cpus(machine_root):
    topology = detect(machine_root("pcie-4gpu"))

    # 82:00.0's numa_node is -1; its local_cpulist is node 1's CPUs.
    assert [g["numa_node"] for g in topology["gpus"]] == [0, 0, 1, 1]
    assert gpu(topology, "0000:82:00.0")["links"] == {
        "0000:02:00.0": "SYS", "0000:03:00.0": "SYS", "0000:83:00.0": "PIX"
    }  # fmt: skip
    assert {g["memory_mb"] for g in topology["gpus"]} == {46068}
    # Its driver numbered the second switch's GPUs first.
    assert [g["minor"] for g in topology["gpus"]] == [2, 3, 0, 1]


def test_amd_gpus_tell_memory_and_name_in_sysfs(machine_root):
    topology = detect(machine_root("mi210"))

    assert [
        (g["vendor"], g["name"], g["memory_mb"], g["links"], g["minor"]) for g in topology["gpus"]
    ] == [("amd", "AMD Instinct MI210", 65536, None, None)] * 2


def test_a_gpu_whose_local_cpus_span_nodes_has_no_node(machine_root):
    root = machine_root("gpu-cross")
    (root / "sys/bus/pci/devices/0000:17:00.0/numa_node").write_text("-1\n")
    (root / "sys/bus/pci/devices/0000:17:00.0/local_cpulist").write_text("0-127\n")

    assert gpu(detect(root), "0000:17:00.0")["numa_node"] is None


@pytest.fixture
def nvidia_smi(machine_root, tmp_path, monkeypatch) -> Callable[[int], None]:
    """An nvidia-smi on PATH that prints what the DGX's did (this machine has none), or
    fails as it does with no driver loaded."""

    def install(exit_code: int = 0) -> None:
        captured = machine_root("dgx-h100") / "socketwise"
        tool = tmp_path / "bin" / "nvidia-smi"
        tool.parent.mkdir(exist_ok=True)
        tool.write_text(
            "#!/bin/sh\n"
            + (f"echo 'NVIDIA-SMI has failed' >&2; exit {exit_code}\n" if exit_code else "")
            + f'if [ "$1" = topo ]; then cat {captured}/nvidia-smi-topo.txt; '
            + f"else cat {captured}/nvidia-smi-query.csv; fi\n"
        )
        tool.chmod(0o755)
        monkeypatch.setenv("PATH", f"{tool.parent}:{os.environ['PATH']}")

    return install


def test_nvidia_smi_is_asked_on_a_live_host(nvidia_smi, machine_root):
    nvidia_smi()
    answers = ask_nvidia_smi()
    assert answers is not None
    # The same tree without its captured answers, given nvidia-smi's own.
    root = machine_root("dgx-h100")
    shutil.rmtree(root / "socketwise")
    assert gpu(detect(root), "0000:df:00.0")["memory_mb"] is None
    last = gpu(detect(root, answers), "0000:df:00.0")
    assert last["memory_mb"] == 81559
    assert last["links"]["0000:1b:00.0"] == "NV18"  # from `nvidia-smi topo -m`


def test_nvidia_smi_s_links_past_its_gpus_or_of_a_kind_unknown_are_left_out(machine_root):
    root = machine_root("dgx-h100")
    captured = root / "socketwise"
    query = (captured / "nvidia-smi-query.csv").read_text()
    rows = (captured / "nvidia-smi-topo.txt").read_text().splitlines()
    first = next(i for i, row in enumerate(rows) if row.startswith("GPU0"))
    # A link kind this parser does not know, and a row for a GPU the query did not list.
    rows[first] = rows[first].replace("NV18", "NV?", 1)
    rows.insert(first + 8, rows[first + 7].replace("GPU7", "GPU8", 1))
    found = detect(root, {"query": query, "topo": "\n".join(rows)})
    links = gpu(found, "0000:1b:00.0")["links"]
    assert links["0000:43:00.0"] is None
    assert links["0000:52:00.0"] == "NV18"
    assert len(found["gpus"]) == 8


def test_a_pci_domain_in_hex_is_the_sysfs_address_of_that_domain(machine_root):
    root = machine_root("dgx-h100")
    captured = root / "socketwise"
    query = (captured / "nvidia-smi-query.csv").read_text()
    # nvidia-smi spells the domain in 8 hex digits: 0x1a is sysfs's 001a.
    moved = query.replace("00000000:1B:00.0", "0000001A:1B:00.0")
    assert moved != query
    for path in (root / "sys/bus/pci/devices").glob("0000:1b:00.0"):
        path.rename(path.with_name("001a:1b:00.0"))
    answers = {"query": moved, "topo": (captured / "nvidia-smi-topo.txt").read_text()}
    first = gpu(detect(root, answers), "001a:1b:00.0")
    assert first["memory_mb"] == 81559


def test_only_the_live_host_asks_nvidia_smi(machine_root, monkeypatch):
    # A saved tree (--root) is another host's: this host's nvidia-smi would describe the
    # wrong GPUs, so only "/" (however spelled) asks it.
    answers = {"query": "what nvidia-smi printed", "topo": "its links"}
    asked = []
    monkeypatch.setattr(topology_module, "ask_nvidia_smi", lambda: asked.append(1) or answers)
    root = machine_root("dgx-h100")
    assert gpu(detect_here(root), "0000:df:00.0")["memory_mb"] == 81559
    assert asked == []
    # This host's own tree is not read here: what detect is given is the subject.
    monkeypatch.setattr(topology_module, "detect", lambda root, given: (str(root), given))
    assert detect_here("/") == ("/", answers)
    assert detect_here("//") == ("//", answers)
    assert asked == [1, 1]


def test_an_nvidia_smi_that_cannot_answer_leaves_the_figures_null(nvidia_smi):
    nvidia_smi(exit_code=9)
    assert ask_nvidia_smi() is None


def test_kernel_without_numa_gets_one_synthesized_node(machine_root):
    topology = detect(machine_root("nonuma"))

    assert topology["nodes"] == [
        {
            "id": 0,
            "socket": 0,
            "cpus": list(range(16)),
            "cores": [[c, c + 8] for c in range(8)],
            "memory_mb": 64 * 1024,
            "distances": [10],
            "hugepages": {
                "2048kB": {"total": 0, "free": 0},
                "1048576kB": {"total": 0, "free": 0},
            },
            "llc_kb": None,
        }
    ]
    assert topology["sockets"] == [{"id": 0, "nodes": [0], "cores": 8}]
    assert topology["kernel"] == {
        "numa_balancing": None,
        "thp": None,
        "thp_defrag": None,
        "irqbalance_active": None,
    }


def test_missing_knobs_and_devices_are_null_or_empty(machine_root):
    root = machine_root("r730")
    for knob in (
        "proc/sys/kernel/numa_balancing",
        "sys/kernel/mm/transparent_hugepage",
        "proc/1",
        "sys/class/net",
        "sys/bus/pci",
        "sys/devices/system/node/node0/hugepages",
    ):
        target = root / knob
        shutil.rmtree(target) if target.is_dir() else target.unlink()

    topology = detect(root)

    assert set(topology["kernel"].values()) == {None}
    assert (topology["nics"], topology["gpus"]) == ([], [])
    assert node(topology, 0)["hugepages"] == {}


@pytest.mark.parametrize(
    ("relative_path", "content"),
    [
        ("proc/cpuinfo", None),
        ("proc/cpuinfo", ""),
        ("proc/cpuinfo", "processor : 0\ncpu family : six\n"),
        ("proc/meminfo", "MemFree: 1 kB\n"),
        ("sys/devices/system/cpu/online", "0-x\n"),
        ("sys/devices/system/cpu/cpu3/topology/thread_siblings_list", None),
        ("sys/devices/system/cpu/cpu3/topology/physical_package_id", "zero\n"),
        ("sys/devices/system/node/node1/cpulist", "27-1\n"),
        ("sys/devices/system/node/node1/distance", "21 ten\n"),
        ("sys/devices/system/node/node0/meminfo", None),
        ("sys/kernel/mm/transparent_hugepage/enabled", "always madvise never\n"),
    ],
)
def test_malformed_input_raises_naming_the_file(machine_root, relative_path, content):
    root = machine_root("r730")
    path = root / relative_path
    if content is None:
        path.unlink()
    else:
        path.write_text(content)

    with pytest.raises(TopologyError, match=re.escape(str(path))):
        detect(root)


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11]),
        ("0-2,5\n", [0, 1, 2, 5]),
        ("7", [7]),
        ("0-1", [0, 1]),
        ("", []),
        ("\n", []),
    ],
)
def test_parse_cpulist(text, cpus):
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("text", ["3-1", "a", "1,,2", "-1", "0-", "0-3:2"])
def test_parse_cpulist_rejects_garbage(text):
    with pytest.raises(ValueError, match="bad cpulist"):
        parse_cpulist(text)


@pytest.mark.parametrize(
    ("cpus", "text"),
    [
        ([0, 1, 2, 5], "0-2,5"),
        ([5, 2, 1, 0, 2], "0-2,5"),
        ([0, 2, 4], "0,2,4"),
        ([3, 4], "3-4"),
        ([], ""),
    ],
)
def test_format_cpulist(cpus, text):
    assert format_cpulist(cpus) == text


@pytest.mark.parametrize("text", ["0-2,5", "0,2,4,28-55", "1", "0-255"])
def test_cpulist_round_trips(text):
    assert format_cpulist(parse_cpulist(text)) == text


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="socketwise")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_prints_the_topology_as_json(machine_root, capsys):
    root = machine_root("pcie-4gpu")

    assert run_cli(["topology", "--root", str(root)]) == 0
    assert json.loads(capsys.readouterr().out) == detect(root)


def test_cli_reports_a_broken_tree_in_one_line(tmp_path, capsys):
    assert run_cli(["topology", "--root", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"socketwise topology: error: cannot read {tmp_path}/proc/cpuinfo: "
        "No such file or directory\n"
    )


def lscpu_fields(entries: list[dict]) -> dict[str, str]:
    # Newer util-linux nests fields under "children"; flatten them.
    fields = {}
    for entry in entries:
        fields[entry["field"].rstrip(":")] = entry.get("data") or ""
        fields.update(lscpu_fields(entry.get("children", [])))
    return fields


@pytest.mark.skipif(shutil.which("lscpu") is None, reason="lscpu is not installed")
def test_live_host_agrees_with_lscpu():
    topology = detect("/")

    fields = lscpu_fields(
        json.loads(subprocess.run(["lscpu", "-J"], capture_output=True, check=True).stdout)["lscpu"]
    )
    parsable = subprocess.run(
        ["lscpu", "-p=CPU,CORE,SOCKET,NODE"], capture_output=True, text=True, check=True
    ).stdout
    rows = [line.split(",") for line in parsable.splitlines() if not line.startswith("#")]
    # lscpu renumbers sockets and cores logically, so compare groupings, not ids.
    lscpu_sockets: dict[str, set[int]] = {}
    for cpu, _core, socket, _node in rows:
        lscpu_sockets.setdefault(socket, set()).add(int(cpu))
    lscpu_node_of = {int(cpu): int(numa_node or 0) for cpu, _core, _socket, numa_node in rows}

    node_of = {cpu: n["id"] for n in topology["nodes"] for cpu in n["cpus"]}
    assert node_of == lscpu_node_of
    our_sockets = {}
    for n in topology["nodes"]:
        if n["socket"] is not None:
            our_sockets.setdefault(n["socket"], set()).update(n["cpus"])
    assert sorted(map(sorted, our_sockets.values())) == sorted(map(sorted, lscpu_sockets.values()))
    assert sum(s["cores"] for s in topology["sockets"]) == len({(r[1], r[2]) for r in rows})
    assert topology["smt"] == (len(rows) > len({(r[1], r[2]) for r in rows}))
    assert topology["cpu"]["vendor"] == fields["Vendor ID"]
    assert topology["cpu"]["model_name"] == fields["Model name"]
    lscpu_flags = set(fields.get("Flags", "").split())
    assert topology["isa"] == {flag: flag in lscpu_flags for flag in topology["isa"]}


def _caches(root, cpus: list[int], shared_l3: str, l3_kb: int) -> None:
    """sysfs's cache directories for CPUS: L1 data and instruction, and an L3 of L3_KB
    shared by SHARED_L3 (as the kernel writes them)."""
    for cpu in cpus:
        base = root / f"sys/devices/system/cpu/cpu{cpu}/cache"
        for index, (level, kind, size, shared) in enumerate(
            [(1, "Data", "48K", str(cpu)), (1, "Instruction", "32K", str(cpu)),
             (3, "Unified", f"{l3_kb}K", shared_l3)]
        ):  # fmt: skip
            directory = base / f"index{index}"
            directory.mkdir(parents=True, exist_ok=True)
            for name, value in (("level", level), ("type", kind), ("size", size),
                                ("shared_cpu_list", shared)):  # fmt: skip
                (directory / name).write_text(f"{value}\n")


def test_each_node_reports_the_last_level_cache_its_cpus_share(machine_root):
    root = machine_root("r730")
    for first in (0, 1):
        socket = list(range(first, 56, 2))
        _caches(root, socket, format_cpulist(socket), 35840)
    topology = detect(root)
    assert [n["llc_kb"] for n in topology["nodes"]] == [35840, 35840]


def test_a_tree_without_cache_directories_reports_the_cache_unknown(machine_root):
    assert {n["llc_kb"] for n in detect(machine_root("vm"))["nodes"]} == {None}


def test_the_ansible_module_ships_the_topology_with_its_neighbours_and_reads_the_same(
    machine_root, tmp_path
):
    # As a deploy runs it on a host: Ansible bundles the module's imports from the
    # collection's module_utils (facts.topology and the files it imports), and nothing else
    # of the package.
    root = machine_root("dgx-h100")
    done = subprocess.run(
        [str(BIN / "ansible"), "localhost", "-c", "local", "-i", "localhost,",
         "-e", f"ansible_python_interpreter={sys.executable}",
         "-m", "socketwise.kit.topology", "-a", f"root={root}", "-o"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
             "ANSIBLE_LOCAL_TEMP": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    answer = json.loads(done.stdout.split(" => ", 1)[1])
    shipped = answer["ansible_facts"]["socketwise_topology"]
    assert shipped == detect(root)
    assert [gpu["memory_mb"] for gpu in shipped["gpus"]] == [81559] * 8
