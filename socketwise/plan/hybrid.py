"""The hybrid MoE planner (`socketwise plan --layout hybrid`): one llama.cpp server whose
attention and dense weights sit on a GPU and whose routed experts, as many layers of them
as the GPU cannot hold, stay in system memory and run on the CPU.

Plain Python with no Ansible import, a part of the GPU planner (`gpu`, which hands a hybrid
request here). Rules (see docs/guides/hybrid-moe.md):
- The model is `model_gb` of weights, `expert_gb` of them routed experts, spread evenly
  over the layers after the `dense_layers` that have none (a GGUF file says all three).
- The GPU (the one with the most memory, then the lowest PCI address) keeps the dense
  weights, the KV cache (`kv_gb`, default KV_FLOOR of the GPU and at least MIN_KV_GB) and
  the experts of as many layers as fit in GPU_MEMORY_UTILIZATION of it (the rest is
  CUDA's and llama.cpp's buffers); `n_cpu_moe` is llama.cpp's `--n-cpu-moe`: the first
  layers, whose experts stay in system memory.
- Those experts go on the GPU's node (`numa` `bind`) when its memory, less the OS
  reserve, holds them with MARGIN to spare; otherwise on every node with CPUs (`numa`
  `distribute`, memory interleaved).
- Threads: one per physical core (the lowest logical CPU; never an SMT sibling) of the
  bound nodes, less each node's reserve.
"""

from __future__ import annotations

import math

from .devices import GPU_MEMORY_UTILIZATION, KV_FLOOR, Gpu, finish_instances, indices, minors
from .nodes import Node, PlanError, os_reserve_gb, reserve_for
from .shape import PlanRequest, finish_plan, kv_cache_gb, node_use

MARGIN = 0.1
# llama-server's slots (--parallel): requests it decodes at once, as a cluster head's.
PARALLEL = 4


def _sizes(request: PlanRequest) -> tuple[float, float, int]:
    """(dense GB, expert GB per layer that has experts, layers that have experts)."""
    if request.expert_gb is None or request.layers is None:
        raise PlanError(
            "expert_gb",
            "a hybrid plan needs the experts' share of the weights and the layer count: give "
            "them, or the model's GGUF file",
            ["expert gb and model layers", "gguf"],
        )
    expert_layers = request.layers - request.dense_layers
    if not 0 < request.expert_gb <= request.model_gb or expert_layers < 1:
        raise PlanError(
            "expert_gb",
            f"experts of {request.expert_gb:g} GB over layers {request.dense_layers}-"
            f"{request.layers - 1} of a {request.model_gb:g} GB model: the experts must be "
            "part of the weights, in at least one layer",
        )
    return request.model_gb - request.expert_gb, request.expert_gb / expert_layers, expert_layers


def _gpu_keeps(gpu: Gpu, request: PlanRequest, dense: float, per_layer: float, count: int):
    """(KV GB, layers whose experts the GPU also holds)."""
    # Any KV cache the GPU holds at all: whether it fits beside the dense weights is the
    # next check, in the model's terms.
    kv = kv_cache_gb(request.kv_gb, math.inf, KV_FLOOR * gpu.gb, "GPU", "")
    free = GPU_MEMORY_UTILIZATION * gpu.gb - dense - kv
    if free < 0:
        raise PlanError(
            "model_gb",
            f"the model's {dense:.1f} GB of dense weights and {kv:g} GB of KV cache do not fit "
            f"GPU {gpu.pci} ({gpu.gb:.0f} GB, {GPU_MEMORY_UTILIZATION:.0%} of it usable) even "
            "with every expert in system memory",
        )
    return kv, min(count, math.floor(free / per_layer))


def _threads(nodes: list[Node], request: PlanRequest) -> list[dict]:
    ranks = []
    for node in nodes:
        cores = node.cores[: len(node.cores) - reserve_for(node, request.reserve_cores)]
        ranks.append({"node": node.id, "cores": cores})
    return ranks


def _place(nodes: list[Node], gpus: list[Gpu], request: PlanRequest) -> tuple:
    """(placed ranks, instance, the plan's `hybrid` object, reason)."""
    if request.ranks not in (None, 1):
        raise PlanError("ranks", "a hybrid plan is one llama.cpp server, on one GPU: no ranks")
    dense, per_layer, count = _sizes(request)
    gpu = sorted(gpus, key=lambda g: (-g.gb, g.pci))[0]
    kv, on_gpu = _gpu_keeps(gpu, request, dense, per_layer, count)
    in_memory = (count - on_gpu) * per_layer
    usable = sum(node.gb - os_reserve_gb(node.gb) for node in nodes)
    if in_memory * (1 + MARGIN) > usable:
        raise PlanError(
            "model_gb",
            f"model {request.model_gb:g} GB: with {dense + on_gpu * per_layer:.0f} GB of it on "
            f"GPU {gpu.pci}, the other {in_memory:.0f} GB (experts) and {MARGIN:.0%} to spare "
            f"exceed the {usable:.0f} GB the nodes have after the OS reserve: serve it over "
            "several hosts (--layout pp)",
        )
    home = next((node for node in nodes if node.id == gpu.node), None)
    bound = home is not None and in_memory * (1 + MARGIN) <= home.gb - os_reserve_gb(home.gb)
    serving = [home] if bound else nodes
    placed = _threads(serving, request)
    cpus = sorted(core[0] for rank in placed for core in rank["cores"])
    membind = [node.id for node in serving]
    if bound:
        why = (
            f"bound to node {gpu.node}, the GPU's, whose memory holds the {in_memory:.0f} GB of "
            f"experts with {MARGIN:.0%} to spare"
        )
    elif home is None:
        why = (
            "spread over every node (memory interleaved): neither the firmware nor its local "
            "CPUs say which node the GPU hangs off"
        )
    else:
        why = (
            f"spread over nodes {', '.join(map(str, membind))} (memory interleaved): node "
            f"{gpu.node}, the GPU's, cannot hold the {in_memory:.0f} GB of experts with "
            f"{MARGIN:.0%} to spare"
        )
    n_cpu_moe = request.dense_layers + count - on_gpu if on_gpu < count else 0
    keeps = f"hybrid: GPU {gpu.pci} keeps the {dense:.1f} GB of dense weights, {kv} GB of KV cache"
    if n_cpu_moe:
        reason = (
            f"{keeps} and the experts of {on_gpu} of {count} layers; the first {n_cpu_moe} "
            f"layers' experts stay in system memory, computed on {len(cpus)} cores, {why}"
        )
    else:
        reason = (
            f"{keeps} and every expert, so no layer's experts stay in system memory; its threads "
            f"run on {len(cpus)} cores of node {membind[0]}"
            if bound
            else f"{keeps} and every expert, so no layer's experts stay in system memory"
        )
    numbered = indices(gpus)
    instance = {
        "tp": 1,
        "data_parallel": 1,
        "ranks": [
            {"node": rank["node"], "cpus": [core[0] for core in rank["cores"]], "gpu": gpu.pci}
            for rank in placed
        ],
        "membind": membind,
        "kvcache_gb": kv,
        "max_connections": PARALLEL,
        "gpus": [gpu.pci],
        "cuda_visible_devices": str(numbered[gpu.pci]),
        "gpu_minors": minors([gpu], numbered),
    }
    hybrid = {
        "engine": "llamacpp",
        "gpu": gpu.pci,
        "n_cpu_moe": n_cpu_moe,
        "threads": len(cpus),
        "cpus_allowed": cpus,
        "membind": membind,
        "numa": "bind" if bound else "distribute",
        "parallel": PARALLEL,
        "experts_in_memory_gb": round(in_memory, 3),
        "on_gpu_gb": round(dense + kv + on_gpu * per_layer, 3),
    }
    return placed, instance, hybrid, reason


def plan_hybrid(
    topo: dict, nodes: dict[int, Node], gpus: list[Gpu], request: PlanRequest, build: dict
) -> dict:
    """The hybrid plan of the host `topo` describes (see the module's rules)."""
    placed, instance, hybrid, reason = _place(list(nodes.values()), gpus, request)
    if request.layout == "auto":
        reason = (
            f"auto: model {request.model_gb:g} GB fits no group of the GPUs, but one GPU and "
            f"system memory together; {reason}"
        )
    (instance,) = finish_instances([instance], ["llamacpp-hybrid"], request.port)
    node_uses = [node_use(nodes[rank["node"]], placed) for rank in placed]
    planned = finish_plan(topo, request, build, "hybrid", None, reason, [instance], node_uses)
    return planned | {"hybrid": hybrid}


def fits(nodes: list[Node], gpus: list[Gpu], request: PlanRequest) -> bool:
    """Whether a hybrid plan holds the model (`auto`'s question once no GPU set does)."""
    try:
        _place(nodes, gpus, request)
    except PlanError:
        return False
    return True
