"""What each unit the kit renders may use, sized from the plan: its MemoryMax= and TasksMax=.

Generous on purpose: a limit too tight kills a server that was serving, so these stop a
runaway unit from taking the host with it, not a busy one from working.

- Memory: the weights the unit holds, twice (while a checkpoint loads its file pages and
  the engine's tensors are both resident, and a bf16 checkpoint served as float32 takes
  twice its size), plus its KV cache, plus RUNTIME_GIB for each of its processes (the
  Python and torch runtime of vLLM's API server, engine core and each rank's worker; a
  llama.cpp server's compute buffers), rounded up to whole GiB. The plan's sizes are GiB,
  as VLLM_CPU_KVCACHE_SPACE is.
- Tasks: one OpenMP thread per CPU of each rank (what VLLM_CPU_OMP_THREADS_BIND or
  --threads binds), plus for each process TASKS_PER_PROCESS and TASKS_PER_CPU for every
  CPU it may run on: Python's, torch's, the tokenizer's, ZMQ's and inductor's compile
  pools, and llama-server's HTTP threads, size themselves by the CPUs they see.

A front door (HAProxy) holds no model: its units have a fixed cap (the vllm_service role's
__vllm_service_front_door_limits).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

WEIGHT_COPIES = 2
RUNTIME_GIB = 2
TASKS_PER_PROCESS = 512
TASKS_PER_CPU = 4
# vLLM's processes besides one worker per rank: the API server and the engine core.
VLLM_FRONT_PROCESSES = 2


def unit_limits(
    weights_gb: float, cache_gb: float, processes: int, threads: int, cpus: int
) -> dict:
    """{"memory_max": "<N>G", "tasks_max": N, "reason": how} for a unit of PROCESSES that
    holds WEIGHTS_GB and CACHE_GB, binds THREADS and may run on CPUS."""
    memory = math.ceil(WEIGHT_COPIES * weights_gb + cache_gb + RUNTIME_GIB * processes)
    tasks = threads + processes * (TASKS_PER_PROCESS + TASKS_PER_CPU * cpus)
    reason = (
        f"{WEIGHT_COPIES} x {weights_gb:.4g} GiB of weights + {cache_gb:.4g} GiB of KV cache + "
        f"{RUNTIME_GIB} GiB x {processes} process(es), rounded up; {threads} bound thread(s) + "
        f"{processes} process(es) x ({TASKS_PER_PROCESS} + {TASKS_PER_CPU} x {cpus} CPUs)"
    )
    return {"memory_max": f"{memory}G", "tasks_max": tasks, "reason": reason}


def host_cpus(hardware_class: Mapping) -> int:
    """The logical CPUs of a plan's host (its hardware class: cores per node and SMT)."""
    cores = sum(node["cores"] for node in hardware_class["nodes"])
    return cores * (2 if hardware_class["smt"] else 1)


def _vllm(placement: Mapping, weights_per_rank_gb: float, cpus: int) -> dict:
    ranks = placement["ranks"]
    return unit_limits(
        weights_gb=weights_per_rank_gb * len(ranks),
        cache_gb=placement["kvcache_gb"] * len(ranks),
        processes=VLLM_FRONT_PROCESSES + len(ranks),
        threads=sum(len(rank["cpus"]) for rank in ranks),
        cpus=cpus,
    )


def instance_limits(plan: Mapping, instance: Mapping, placed: bool = True) -> dict:
    """A single host's vLLM instance: each rank holds 1/tp of the model and the instance's
    KV cache. Without the plan's placement (vllm_service_placement: vllm) it may run on
    every CPU of the host."""
    cpus = len(instance["cpus_allowed"]) if placed else host_cpus(plan["hardware_class"])
    return _vllm(instance, plan["model_gb"] / instance["tp"], cpus)


def stage_limits(entry: Mapping) -> dict:
    """A vLLM pipeline stage (a cluster plan's host entry): its layers' weights over its
    TP ranks, each with the stage's KV cache."""
    stage = entry["stage"]
    return _vllm(stage, entry["weights_gb"] / len(stage["ranks"]), len(stage["cpus_allowed"]))


def llamacpp_limits(
    plan: Mapping, layers: int, threads: int, cpus: int, kv_bytes_per_token: int, tokens: int
) -> dict:
    """A llama.cpp server (the head's llama-server or a worker's RPC server) holding LAYERS
    of the cluster plan's model, their KV cache (f16, llama.cpp's default, for every token
    of --ctx-size), with THREADS threads on CPUS."""
    share = layers / plan["model_layers"]
    return unit_limits(
        weights_gb=plan["model_gb"] * share,
        cache_gb=kv_bytes_per_token * tokens * share / 2**30,
        processes=1,
        threads=threads,
        cpus=cpus,
    )
