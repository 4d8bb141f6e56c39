"""What each unit may use (MemoryMax=, TasksMax=), sized from the plan by the rule the
security guide states: a unit holds its share of the weights twice, its KV cache and
2 GiB for each of its processes; its tasks are its bound threads plus, for each process,
512 and 4 for every CPU it may run on. test_unit_security renders the units with them."""

from __future__ import annotations

import math

import pytest

from socketwise.plan.planner import PlanRequest, plan
from socketwise.serve.limits import host_cpus, instance_limits, llamacpp_limits, stage_limits

# Two nodes of 4 cores with their SMT siblings: 16 logical CPUs.
TWO_NODES = {
    "schema": 1,
    "nodes": [
        {"id": 0, "cores": [[0, 8], [1, 9], [2, 10], [3, 11]], "memory_mb": 64000},
        {"id": 1, "cores": [[4, 12], [5, 13], [6, 14], [7, 15]], "memory_mb": 64000},
    ],
    "isa": {"avx2": True},
    "smt": True,
}
MODEL_GB = 6.0


def gib(limits: dict) -> int:
    return int(limits["memory_max"].removesuffix("G"))


@pytest.mark.parametrize("layout", ["sn", "tp"])
def test_an_instance_holds_the_model_twice_its_caches_and_two_gib_a_process(layout):
    planned = plan(TWO_NODES, PlanRequest(layout=layout, model_gb=MODEL_GB))
    instance = planned["instances"][0]
    ranks = len(instance["ranks"])
    assert instance["tp"] == ranks == (2 if layout == "tp" else 1)
    limits = instance_limits(planned, instance)
    # Each of TP's ranks holds half the model: the instance holds it once, as SN does.
    expected = math.ceil(2 * MODEL_GB + ranks * instance["kvcache_gb"] + 2 * (2 + ranks))
    assert gib(limits) == expected
    threads = sum(len(rank["cpus"]) for rank in instance["ranks"])
    cpus = len(instance["cpus_allowed"])
    assert limits["tasks_max"] == threads + (2 + ranks) * (512 + 4 * cpus)


def test_an_instance_left_unplaced_may_run_on_every_cpu_of_the_host():
    planned = plan(TWO_NODES, PlanRequest(layout="sn", model_gb=MODEL_GB))
    instance = planned["instances"][0]
    assert host_cpus(planned["hardware_class"]) == 16
    assert len(instance["cpus_allowed"]) < 16
    placed, unplaced = instance_limits(planned, instance), instance_limits(planned, instance, False)
    assert unplaced["tasks_max"] - placed["tasks_max"] == 3 * 4 * (
        16 - len(instance["cpus_allowed"])
    )
    assert unplaced["memory_max"] == placed["memory_max"]


def test_smt_off_counts_one_cpu_a_core():
    hardware_class = {"nodes": [{"cores": 4}, {"cores": 6}], "smt": False}
    assert host_cpus(hardware_class) == 10
    assert host_cpus(hardware_class | {"smt": True}) == 20


def test_a_pipeline_stage_holds_its_layers_weights_once_over_its_ranks():
    ranks = [{"node": 0, "cpus": [0, 1]}, {"node": 1, "cpus": [4, 5]}]
    stage = {"ranks": ranks, "kvcache_gb": 3, "cpus_allowed": [0, 1, 2, 4, 5, 6]}
    limits = stage_limits({"weights_gb": 5.0, "stage": stage})
    assert gib(limits) == math.ceil(2 * 5.0 + 2 * 3 + 2 * 4)
    assert limits["tasks_max"] == 4 + 4 * (512 + 4 * 6)


def test_a_llama_cpp_server_holds_its_share_of_the_layers_and_their_cache():
    cluster = {"model_gb": 8.0, "model_layers": 32}
    # 16 of 32 layers, 131072 bytes of f16 KV a token for the whole model, 8192 tokens.
    limits = llamacpp_limits(cluster, 16, threads=6, cpus=8, kv_bytes_per_token=131072,
                             tokens=8192)  # fmt: skip
    assert gib(limits) == math.ceil(2 * 4.0 + 0.5 + 2)
    assert limits["tasks_max"] == 6 + 512 + 4 * 8
    assert "2 x 4 GiB of weights + 0.5 GiB of KV cache" in limits["reason"]
