"""`socketwise plan --layout hybrid`: a mixture of experts on the hybrid study's 2x EPYC 9554
with one 48 GB GPU, its dense weights on the GPU and as few layers' experts as possible in
system memory, bound to the GPU's node when that node holds them."""

import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from socketwise.facts.topology import detect
from socketwise.host.tuning.decide import Settings, decide
from socketwise.plan import modelfile
from socketwise.plan.cluster import ClusterRequest, plan_cluster
from socketwise.plan.nodes import PlanError
from socketwise.plan.planner import PlanRequest, plan

NODE0_CORES = list(range(62))  # node 0's 64 cores less the reserve of 2
NODE1_CORES = list(range(64, 126))


@pytest.fixture
def hybrid(machine_root):
    topology = detect(machine_root("hybrid-9554"))

    def planned(**request) -> dict:
        return plan(topology, PlanRequest(layout="hybrid", **request))

    return planned


def test_deepseek_r1_keeps_its_dense_layers_on_the_gpu_and_spreads_its_experts(hybrid):
    # DeepSeek-R1 at Q4_K_M: about 404 GB, 392 of them routed experts in layers 3-60.
    planned = hybrid(model_gb=404, expert_gb=392, layers=61, dense_layers=3)

    assert (planned["device"], planned["layout"]) == ("gpu", "hybrid")
    assert {key: planned["hybrid"][key] for key in ("gpu", "n_cpu_moe", "numa", "membind")} == {
        "gpu": "0000:41:00.0", "n_cpu_moe": 57, "numa": "distribute", "membind": [0, 1]
    }  # fmt: skip
    # 0.9 of 48 GB, less 12 GB dense and 4 GB of KV: the experts of 4 layers (6.8 GB each).
    assert planned["hybrid"]["threads"] == 124
    assert planned["hybrid"]["cpus_allowed"] == NODE0_CORES + NODE1_CORES
    (instance,) = planned["instances"]
    assert (instance["name"], instance["port"], instance["gpus"]) == (
        "llamacpp-hybrid", 8001, ["0000:41:00.0"]
    )  # fmt: skip
    assert instance["cpus_allowed"] == planned["hybrid"]["cpus_allowed"]
    assert planned["load_balancer"]["backends"] == [8001]
    assert "node 0, the GPU's, cannot hold the 365 GB of experts" in planned["reason"]


@pytest.mark.parametrize(
    ("expert_gb", "numa", "membind", "threads"),
    [
        # 10 GB dense, 40 layers: the GPU keeps 3 layers' experts; 37 stay in memory. Node
        # 0 has 345.6 GB after the OS reserve: 37 x 8.4 = 310.8 GB and 10 % to spare fit...
        (336, "bind", [0], 62),
        # ...37 x 8.5 = 314.5 GB with 10 % does not.
        (340, "distribute", [0, 1], 124),
        # 39 x 16 = 624 GB with 10 % fits both nodes' 691.2 GB.
        (640, "distribute", [0, 1], 124),
    ],
)
def test_the_experts_bind_to_the_gpus_node_only_while_it_holds_them(
    hybrid, expert_gb, numa, membind, threads
):
    planned = hybrid(model_gb=expert_gb + 10, expert_gb=expert_gb, layers=40)

    assert (planned["hybrid"]["numa"], planned["hybrid"]["membind"]) == (numa, membind)
    assert planned["hybrid"]["threads"] == threads
    assert planned["instances"][0]["membind"] == membind


@pytest.mark.parametrize(
    ("request_", "field", "words"),
    [
        # 39 x 17 = 663 GB with 10 % to spare: more than both nodes hold.
        (
            {"model_gb": 690, "expert_gb": 680, "layers": 40},
            "model_gb",
            "model 690 GB: with 27 GB of it on GPU 0000:41:00.0, the other 663 GB (experts) and "
            "10% to spare exceed the 691 GB the nodes have after the OS reserve: serve it over "
            "several hosts (--layout pp)",
        ),
        (
            {"model_gb": 142, "expert_gb": 90, "layers": 94},
            "model_gb",
            "the model's 52.0 GB of dense weights and 4 GB of KV cache do not fit GPU "
            "0000:41:00.0 (48 GB, 90% of it usable) even with every expert in system memory",
        ),
        (
            {"model_gb": 142},
            "expert_gb",
            "a hybrid plan needs the experts' share of the weights and the layer count: give "
            "them, or the model's GGUF file",
        ),
        (
            {"model_gb": 142, "expert_gb": 133, "layers": 94, "kv_gb": 0},
            "kv_gb",
            "KV cache 0 GB must be a whole number of GB, at least 1",
        ),
        (
            {"model_gb": 142, "expert_gb": 133, "layers": 94, "ranks": 2},
            "ranks",
            "a hybrid plan is one llama.cpp server, on one GPU: no ranks",
        ),
        # A layer count or a count of dense layers no model has: named before any sizing
        # (a count of 0 would else read as experts in no layer; -1 would place them).
        ({"model_gb": 142, "expert_gb": 133, "layers": 0}, "layers", "layers 0 must be at least 1"),
        (
            {"model_gb": 142, "expert_gb": 133, "layers": 94, "dense_layers": -1},
            "dense_layers",
            "dense layers -1 must be >= 0",
        ),
    ],
)
def test_a_model_the_gpu_and_memory_cannot_hold_is_refused_in_one_line(
    hybrid, request_, field, words
):
    with pytest.raises(PlanError) as refused:
        hybrid(**request_)
    assert refused.value.field == field
    assert str(refused.value).startswith(words)


def test_auto_on_the_gpus_takes_hybrid_once_no_gpu_set_holds_the_model(machine_root):
    topology = detect(machine_root("hybrid-9554"))
    fits_gpu = plan(topology, PlanRequest(device="gpu", model_gb=20))
    assert fits_gpu["layout"] == "sn"
    qwen = PlanRequest(device="gpu", model_gb=142, expert_gb=133, layers=94)
    planned = plan(topology, qwen)
    assert planned["layout"] == "hybrid" and planned["hybrid"]["numa"] == "bind"
    assert planned["reason"].startswith(
        "auto: model 142 GB fits no group of the GPUs, but one GPU and system memory together"
    )


def test_deployed_it_is_a_llamacpp_cluster_of_one_host_with_the_plans_flags(machine_root):
    # The cluster role serves it (deploy.yml with cluster_layout: hybrid): its head alone.
    topology = detect(machine_root("hybrid-9554"))
    deepseek = {"model_gb": 404, "expert_gb": 392, "layers": 61, "dense_layers": 3}
    request = ClusterRequest(engine="llamacpp", layout="hybrid", **deepseek)
    planned = plan_cluster([("gpu1", topology)], request)
    assert (planned["layout"], planned["device"], planned["head"]) == ("hybrid", "gpu", "gpu1")
    assert planned["build"]["device"] == "cuda"
    (head,) = planned["hosts"]
    assert head["ports"] == {"front_door": 8000, "rpc": []}
    assert head["rpc_servers"] == [] and head["layers"] == {"first": 0, "count": 61}
    assert head["stage"]["cpus_allowed"] == NODE0_CORES + NODE1_CORES
    assert head["stage"]["membind"] == [0, 1]
    assert planned["engine_settings"] | {"gpus": None} == {
        "n_gpu_layers": "all", "n_cpu_moe": 57, "numa": "distribute", "threads": 124,
        "gpus": None, "cuda_visible_devices": "0", "gpu_minors": [0], "tensor_split": [],
        "rpc": [],
    }  # fmt: skip
    assert planned["hybrid"]["n_cpu_moe"] == 57
    # The host tuning reads it as a host's plan on the GPU: both nodes serve.
    knobs = {k["name"]: k for k in decide(topology, planned, Settings())["knobs"]}
    assert knobs["kernel.numa_balancing"]["desired"] == 0
    assert {"hugepages.node0.2048kB", "hugepages.node1.2048kB"} <= set(knobs)
    # Without the GPU (a lab): the same flags on the CPU build, and the reason says so.
    on_cpu = plan_cluster([("gpu1", topology)], replace(request, build_device="cpu"))
    assert on_cpu["build"]["device"] == "cpu"
    assert on_cpu["engine_settings"] == planned["engine_settings"]
    assert on_cpu["reason"].endswith(
        "; CPU build: the flags are the plan's, but nothing is offloaded"
    )


@pytest.mark.parametrize(
    ("machine", "hosts", "change", "field", "words"),
    [
        ("hybrid-9554", 2, {}, "layout",
         "a hybrid server is one host running llama.cpp: give one host, not 2 (gpu1, gpu2)"),
        ("hybrid-9554", 1, {"engine": "vllm"}, "layout",
         "a hybrid server is one host running llama.cpp: set the engine to llamacpp"),
        ("hybrid-9554", 1, {"build_device": "rocm"}, "build_device",
         "build 'rocm' for GPU 0000:41:00.0, which needs cuda: leave it unset, or cpu"),
        ("mi210", 1, {}, "build_device",
         "GPU 0000:23:00.0 needs a rocm build of llama.cpp, which the kit does not make"),
        ("hybrid-9554", 1, {"layout": "tp"}, "layout", "unknown layout 'tp'"),
    ],
)  # fmt: skip
def test_a_hybrid_cluster_it_cannot_serve_is_refused_in_one_line(
    machine_root, machine, hosts, change, field, words
):
    topology = detect(machine_root(machine))
    members = [(f"gpu{i + 1}", topology) for i in range(hosts)]
    request = ClusterRequest(
        model_gb=142, expert_gb=133, layers=94, engine="llamacpp", layout="hybrid",
        gpu_memory_gb=64,
    )  # fmt: skip
    with pytest.raises(PlanError) as refused:
        plan_cluster(members, replace(request, **change))
    assert refused.value.field == field
    assert str(refused.value).startswith(words)


def write_moe_gguf(path, layers: int = 4, dense: int = 1) -> None:
    """A GGUF laid out as llama.cpp's mixture of experts: experts stacked per layer from
    layer `dense` on, a dense feed-forward before it."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(layers)
    writer.add_expert_count(4)
    for layer in range(layers):
        writer.add_tensor(f"blk.{layer}.attn_q.weight", np.zeros((8, 8), np.float32))
        if layer < dense:
            writer.add_tensor(f"blk.{layer}.ffn_up.weight", np.zeros((16, 8), np.float32))
            continue
        for part in ("gate", "up", "down"):
            writer.add_tensor(
                f"blk.{layer}.ffn_{part}_exps.weight", np.zeros((4, 256, 256), np.float32)
            )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_the_experts_share_is_read_from_a_gguf(tmp_path, machine_root):
    write_moe_gguf(tmp_path / "moe.gguf")
    described = modelfile.describe(tmp_path / "moe.gguf")
    # 3 layers of 3 stacks of 4 x 256 x 256 float32.
    assert described["expert_gb"] == round(3 * 3 * 4 * 256 * 256 * 4 / 2**30, 3)
    assert (described["layers"], described["dense_layers"]) == (4, 1)

    saved = tmp_path / "hybrid.json"
    saved.write_text(json.dumps(detect(machine_root("hybrid-9554"))))
    done = subprocess.run(
        [sys.executable, "-m", "socketwise.cli", "plan", "--topology", str(saved),
         "--layout", "hybrid", "--gguf", str(tmp_path / "moe.gguf")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    request = json.loads(done.stdout)["request"]
    assert (request["layers"], request["dense_layers"]) == (4, 1)
    assert request["model_gb"] == described["gb"]


# One rule for the KV cache asked for, whatever serves: the same request on the CPUs, the
# GPUs and a hybrid plan of one host.
ON_EVERY_DEVICE = {
    "cpu": {"layout": "sn", "model_gb": 8},
    "gpu": {"layout": "sn", "device": "gpu", "model_gb": 8},
    "hybrid": {"layout": "hybrid", "model_gb": 142, "expert_gb": 133, "layers": 94},
}


@pytest.mark.parametrize("device", ON_EVERY_DEVICE)
def test_a_kv_cache_asked_for_is_refused_and_granted_alike_on_every_device(machine_root, device):
    topology = detect(machine_root("hybrid-9554"))
    request = ON_EVERY_DEVICE[device]
    for asked in (0, 2.5):
        with pytest.raises(PlanError) as refused:
            plan(topology, PlanRequest(**request, kv_gb=asked))  # type: ignore[arg-type]
        assert (refused.value.field, str(refused.value)) == (
            "kv_gb",
            f"KV cache {asked:g} GB must be a whole number of GB, at least 1",
        )
    (instance,) = plan(topology, PlanRequest(**request, kv_gb=3))["instances"]
    assert instance["kvcache_gb"] == 3
