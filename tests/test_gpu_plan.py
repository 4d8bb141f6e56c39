"""`socketwise plan --device gpu` on the fixture topologies of real GPU servers: which GPUs
each instance gets, the NUMA node its host side is bound to, and the refusals."""

import json
import subprocess
import sys

import pytest

from socketwise.facts.gpus import CAPTURED_NVIDIA_SMI
from socketwise.facts.topology import detect
from socketwise.plan.nodes import PlanError
from socketwise.plan.planner import PlanRequest, plan
from socketwise.serve.unitvalues import NVIDIA_CONTROL_DEVICES, gpu_devices

from .machines import link_matrix, nvidia_smi_answers

# The DGX's GPUs on each socket.
NODE0 = ["0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0"]
NODE1 = ["0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0"]


@pytest.fixture
def gpu_plan(machine_root):
    def planned(machine: str, **request) -> dict:
        return plan(detect(machine_root(machine)), PlanRequest(device="gpu", **request))

    return planned


def physical(first: int, count: int) -> list[int]:
    """`count` physical cores from CPU `first` on, as the plan names them (lowest CPU)."""
    return list(range(first, first + count))


def test_the_cross_numa_server_binds_both_gpus_instances_to_socket_0(gpu_plan):
    # Both A100s hang off node 0: a 30 GB model takes one each, both replicas on node 0's
    # 30 cores (32 less the reserve of 2), half each, never on node 1.
    planned = gpu_plan("gpu-cross", model_gb=30)

    assert (planned["device"], planned["layout"], planned["dp_mode"]) == ("gpu", "dp", "instances")
    assert [(i["gpus"], i["cuda_visible_devices"], i["tp"]) for i in planned["instances"]] == [
        (["0000:17:00.0"], "0", 1),
        (["0000:31:00.0"], "1", 1),
    ]
    assert [i["membind"] for i in planned["instances"]] == [[0], [0]]
    assert [i["cpus_allowed"] for i in planned["instances"]] == [physical(0, 15), physical(15, 15)]
    assert planned["nodes"] == [
        {"node": 0, "inference_cpus": physical(0, 30), "reserved_cpus": [30, 31, 94, 95]}
    ]
    # An A100 has 80 GB but vLLM's default batch for the smaller GPUs: the door lets each
    # instance 256 requests at once, not the 1,024 of an H100, and queues the rest itself.
    assert [i["max_connections"] for i in planned["instances"]] == [256, 256]
    assert planned["reason"] == (
        "auto: model 30 GB needs 1 of the 2 GPU(s) (TP-1), so 2 instances of it as DP "
        "replicas; each instance inside one NUMA node (node 0) and bound there"
    )
    # A model that needs both GPUs: one TP-2 instance, still on node 0.
    both = gpu_plan("gpu-cross", model_gb=100)
    assert [(i["tp"], i["gpus"], i["membind"]) for i in both["instances"]] == [
        (2, ["0000:17:00.0", "0000:31:00.0"], [0])
    ]
    assert "TP-2), so one instance; each instance inside one NUMA node (node 0; its GPUs at " \
        "most NODE apart)" in both["reason"]  # fmt: skip


def test_the_nvlink_box_keeps_each_tp_group_on_one_socket(gpu_plan):
    # 140 GB: TP-2 leaves under 10 % of an 80 GB H100 for the KV cache, TP-4 holds it; two
    # replicas, one per socket.
    planned = gpu_plan("dgx-h100", model_gb=140)

    assert planned["layout"] == "dp"
    assert [
        (i["name"], i["port"], i["tp"], i["gpus"], i["cuda_visible_devices"], i["membind"])
        for i in planned["instances"]
    ] == [
        ("vllm-dp0", 8001, 4, NODE0, "0,1,2,3", [0]),
        ("vllm-dp1", 8002, 4, NODE1, "4,5,6,7", [1]),
    ]
    # 54 of node 0's 56 cores, 13 a rank (two left over); node 1's start at CPU 56.
    first = planned["instances"][0]
    assert [rank["cpus"] for rank in first["ranks"]] == [physical(13 * k, 13) for k in range(4)]
    assert [rank["gpu"] for rank in first["ranks"]] == NODE0
    assert planned["instances"][1]["cpus_allowed"] == physical(56, 52)
    assert [i["kvcache_gb"] for i in planned["instances"]] == [36, 36]
    assert [i["max_connections"] for i in planned["instances"]] == [1024, 1024]
    assert planned["reason"].endswith(
        "each instance inside one NUMA node (nodes 0, 1; its GPUs at most NV18 apart) and bound "
        "there"
    )
    assert planned["load_balancer"]["backends"] == [8001, 8002]


def test_a_group_that_must_span_sockets_binds_memory_to_both_and_says_so(gpu_plan):
    planned = gpu_plan("dgx-h100", model_gb=405)

    assert planned["layout"] == "tp"
    (instance,) = planned["instances"]
    assert (instance["tp"], instance["gpus"], instance["membind"]) == (8, NODE0 + NODE1, [0, 1])
    assert [rank["node"] for rank in instance["ranks"]] == [0] * 4 + [1] * 4
    assert (
        "a group must span nodes 0 and 1: its memory is interleaved over them"
        in (planned["reason"])
    )


def test_the_pcie_box_pairs_the_gpus_behind_one_switch(gpu_plan):
    # 60 GB on 48 GB L40S: TP-2, each pair behind its socket's switch (PIX), not across.
    planned = gpu_plan("pcie-4gpu", model_gb=60)

    assert [(i["gpus"], i["cuda_visible_devices"], i["membind"]) for i in planned["instances"]] == [
        (["0000:02:00.0", "0000:03:00.0"], "0,1", [0]),
        (["0000:82:00.0", "0000:83:00.0"], "2,3", [1]),
    ]
    # CUDA numbers them in bus order; the driver's device nodes are its own minors.
    assert [i["gpu_minors"] for i in planned["instances"]] == [[2, 3], [0, 1]]
    # 82:00.0 came with no node; its local CPUs put it, and its rank, on node 1.
    assert [rank["cpus"] for rank in planned["instances"][1]["ranks"]] == [
        physical(32, 15), physical(47, 15)
    ]  # fmt: skip
    assert planned["instances"][0]["max_connections"] == 256
    assert "at most PIX apart" in planned["reason"]


def test_an_intel_display_device_does_not_shift_the_nvidia_cards_numbers(gpu_plan):
    # The Intel device comes first in bus order, but CUDA counts NVIDIA's cards only, and
    # with no minors from the driver the unit's device nodes follow CUDA's numbers.
    planned = gpu_plan("igpu-2gpu", model_gb=20)

    (instance,) = planned["instances"]
    assert (instance["gpus"], instance["cuda_visible_devices"]) == (
        ["0000:01:00.0", "0000:02:00.0"], "0,1"
    )  # fmt: skip
    assert gpu_devices(instance["gpu_minors"]) == [
        *NVIDIA_CONTROL_DEVICES, "/dev/nvidia0", "/dev/nvidia1"
    ]  # fmt: skip


def test_a_board_s_intel_display_device_serves_no_replica_beside_nvidia_cards(gpu_plan):
    # A model one card holds: a replica on each NVIDIA card, none on the Intel device
    # (a CUDA build cannot drive it; it took a replica, numbered as NVIDIA's card 0).
    planned = gpu_plan("igpu-2gpu", model_gb=8)
    assert [i["gpus"] for i in planned["instances"]] == [["0000:01:00.0"], ["0000:02:00.0"]]
    assert [i["cuda_visible_devices"] for i in planned["instances"]] == ["0", "1"]
    assert planned["build"]["device"] == "cuda"


def test_the_hybrid_host_serves_a_model_its_gpu_holds_on_the_gpus_socket(gpu_plan):
    planned = gpu_plan("hybrid-9554", model_gb=20)

    assert planned["layout"] == "sn"
    (instance,) = planned["instances"]
    assert (instance["name"], instance["gpus"], instance["membind"]) == (
        "vllm-sn", ["0000:41:00.0"], [0]
    )  # fmt: skip
    assert instance["cpus_allowed"] == physical(0, 62)
    # 0.9 of 48 GB less 20 GB of weights.
    assert instance["kvcache_gb"] == 23


@pytest.mark.parametrize(
    ("machine", "request_", "field", "message"),
    [
        (
            "hybrid-9554",
            {"model_gb": 400},
            "model_gb",
            "model 400 GB fits no group of the 1 GPU(s) (48 GB each, 90% of it for vLLM, at "
            "least 10% left for the KV cache): serve a mixture of experts with its experts in "
            "system memory (--layout hybrid, with --expert-gb and --model-layers, or --gguf), "
            "or any model over several hosts (--layout pp)",
        ),
        (
            "dgx-h100",
            {"model_gb": 140, "layout": "tp", "ranks": 2},
            "model_gb",
            "model 140 GB does not fit 2 GPU(s) of 80 GB with room for the KV cache (1.7 GB "
            "each after the weights); plans that would work: layout tp ranks 4",
        ),
        (
            "dgx-h100",
            {"model_gb": 140, "layout": "dp", "ranks": 3},
            "ranks",
            "3 group(s) of 4 GPU(s) need 12; this host has 8; plans that would work: layout dp "
            "ranks 1, layout dp ranks 2",
        ),
        (
            "gpu-cross",
            {"layout": "tp", "ranks": 4},
            "ranks",
            "1 group(s) of 4 GPU(s) need 4; this host has 2; plans that would work: layout tp "
            "ranks 1, layout tp ranks 2",
        ),
        (
            "gpu",
            {"model_gb": 20},
            "gpu_memory_gb",
            "GPU 0000:ca:00.0 has no memory size in the topology (nvidia-smi was not there to "
            "ask, or the tree kept no answer of it): give every GPU's memory",
        ),
        (
            "r730",
            {},
            "device",
            "the topology has no GPU to plan on; plans that would work: device cpu",
        ),
    ],
)
def test_a_plan_the_gpus_cannot_serve_is_refused_naming_the_input(
    gpu_plan, machine, request_, field, message
):
    with pytest.raises(PlanError) as refused:
        gpu_plan(machine, **request_)
    assert (refused.value.field, str(refused.value)) == (field, message)


def test_gpu_memory_stands_in_where_the_topology_has_none(gpu_plan):
    # Two H100s on node 1 whose tree kept no nvidia-smi answers.
    planned = gpu_plan("gpu", model_gb=20, gpu_memory_gb=80)

    assert [(i["gpus"], i["membind"], i["kvcache_gb"]) for i in planned["instances"]] == [
        (["0000:ca:00.0"], [1], 52),
        (["0000:e1:00.0"], [1], 52),
    ]


def test_vllm_data_parallel_is_one_instance_over_every_group(gpu_plan):
    planned = gpu_plan("dgx-h100", model_gb=140, layout="dp", dp_mode="vllm")

    (instance,) = planned["instances"]
    assert (instance["name"], instance["tp"], instance["data_parallel"]) == ("vllm-dp", 4, 2)
    assert instance["cuda_visible_devices"] == "0,1,2,3,4,5,6,7"
    assert instance["max_connections"] == 2048


def test_a_gpu_no_node_is_known_for_interleaves_its_instance(gpu_plan, machine_root):
    root = machine_root("gpu-cross")
    (root / "sys/bus/pci/devices/0000:31:00.0/numa_node").write_text("-1\n")
    (root / "sys/bus/pci/devices/0000:31:00.0/local_cpulist").write_text("0-127\n")
    planned = plan(detect(root), PlanRequest(device="gpu", model_gb=30))

    assert [i["membind"] for i in planned["instances"]] == [[0], [0, 1]]
    assert planned["instances"][1]["ranks"] == [{"node": None, "cpus": [], "gpu": "0000:31:00.0"}]
    assert "interleaved over every node" in planned["reason"]


def test_cpu_plans_name_their_device_and_refuse_gpu_memory(machine_root):
    topology = detect(machine_root("r730"))
    assert plan(topology, PlanRequest(model_gb=8))["device"] == "cpu"
    with pytest.raises(PlanError, match="GPU memory is for plans on GPUs"):
        plan(topology, PlanRequest(model_gb=8, gpu_memory_gb=80))


def test_the_cli_plans_on_gpus_from_a_saved_topology(machine_root, tmp_path):
    saved = tmp_path / "dgx.json"
    saved.write_text(json.dumps(detect(machine_root("dgx-h100"))))
    command = [sys.executable, "-m", "socketwise.cli", "plan", "--topology", str(saved)]
    done = subprocess.run(
        [*command, "--device", "gpu", "--model-gb", "140"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert [i["gpus"] for i in json.loads(done.stdout)["instances"]] == [NODE0, NODE1]
    refused = subprocess.run(
        [*command, "--device", "gpu", "--model-gb", "900"], capture_output=True, text=True
    )
    assert refused.returncode == 2
    assert refused.stderr.startswith("socketwise plan: error: --model-gb: model 900 GB fits no")
    assert refused.stderr.count("\n") == 1


def test_groups_stay_in_one_node_then_take_the_nearest_links_over_pci_order(machine_root):
    # The DGX rewired: each GPU shares a PCIe switch (PIX) with the GPU two after it on its
    # socket, and an NVLink bridge (NV4) with its counterpart on the other socket.
    root = machine_root("dgx-h100")

    def link(a: int, b: int) -> str:
        if a // 4 != b // 4:
            return "NV4" if a % 4 == b % 4 else "SYS"
        return "PIX" if a % 2 == b % 2 else "NODE"

    gpus = [
        (pci, "NVIDIA H100 80GB HBM3", 81559, "", i // 4) for i, pci in enumerate(NODE0 + NODE1)
    ]
    answers = nvidia_smi_answers(gpus, link_matrix(8, link))
    (root / CAPTURED_NVIDIA_SMI["topo"]).write_text(answers["topo"])
    planned = plan(detect(root), PlanRequest(device="gpu", model_gb=100))

    assert [i["gpus"] for i in planned["instances"]] == [
        [NODE0[0], NODE0[2]], [NODE0[1], NODE0[3]], [NODE1[0], NODE1[2]], [NODE1[1], NODE1[3]]
    ]  # fmt: skip
    assert "at most PIX apart" in planned["reason"]
