"""The GPU planner (`socketwise plan --device gpu`): vLLM on a host's GPUs, each instance's
host side bound to its GPUs' NUMA node.

Plain Python with no Ansible import, a part of `planner` (which hands a GPU request here);
the host's GPUs are read in `devices`, the request and plan shape are `shape`'s. Rules
(see docs/guides/gpu-servers.md):
- A GPU's memory comes from the topology (`memory_mb`: nvidia-smi, amdgpu's sysfs), or
  from `gpu_memory_gb` where the topology has none. vLLM uses GPU_MEMORY_UTILIZATION of it
  (its default); what the weights leave of that is the KV cache, which must keep at least
  KV_FLOOR of the GPU (and MIN_KV_GB) for a group to count as holding the model.
- `auto`: the smallest TP group (1, 2, 4, 8, ... GPUs) that holds the model, and as many
  such groups as the GPUs make, each a DP replica behind the front door. `tp`: one group of
  `ranks` GPUs (default all). `dp`: `ranks` replicas (default as many as fit) of the
  smallest group. `sn`: one GPU.
- A group is chosen inside one NUMA node first, then over the nearest links
  (`nvidia-smi topo -m`: NVLink, then one PCIe switch, several, the host bridge, the
  node, the interconnect), then by PCI address. A group that must span nodes binds its
  memory to all of them (interleaved), and the plan's reason says so.
- Each rank's host CPUs are physical cores (the lowest logical CPU of each) of its GPU's
  node, less the node's reserve (`reserve_cores`, as on CPU hosts), split evenly between
  the ranks on that node; `cpus_allowed` is an instance's ranks' cores.
- A host with GPUs of several vendors is planned on one vendor's: NVIDIA's, else AMD's,
  else Intel's; the others are left out.
- `cuda_visible_devices` numbers an instance's GPUs in PCI bus order among the host's GPUs
  of the same vendor (CUDA_DEVICE_ORDER=PCI_BUS_ID); `gpu_minors` are their device
  minors (/dev/nvidiaN, what the unit may open), the driver's where the topology has them,
  else that same number.
- `max_connections` is vLLM's default `--max-num-seqs` for an API server on that GPU (1024
  on GPUs of 70 GiB or more other than the A100, else 256), for each DP engine.
"""

from __future__ import annotations

import itertools
import re

from .devices import (
    GPU_MEMORY_UTILIZATION,
    KV_FLOOR,
    Gpu,
    finish_instances,
    indices,
    minors,
    serving_gpus,
)
from .hybrid import fits, plan_hybrid
from .nodes import Node, PlanError, reserve_for
from .shape import (
    MIN_KV_GB,
    PlanRequest,
    finish_plan,
    kv_cache_gb,
    node_use,
    refuse_ranks_with_auto,
)

# vLLM's get_batch_defaults: the API server's max_num_seqs by the GPU's memory and name.
LARGE_GPU_GIB = 70
MAX_SEQS = {"large": 1024, "other": 256}
# `nvidia-smi topo -m`'s path kinds, nearest first (NV# ranks by its link count).
PATHS = ("NV", "PIX", "PXB", "PHB", "NODE", "SYS")


def _path(a: Gpu, b: Gpu) -> tuple[int, int]:
    """How near b is to a, as a sortable pair (lower is nearer): the path nvidia-smi named,
    else the node's or the interconnect's."""
    kind = a.links.get(b.pci) or b.links.get(a.pci)
    if kind is None:
        kind = "NODE" if a.node is not None and a.node == b.node else "SYS"
    links = re.fullmatch(r"NV(\d+)", kind)
    if links:
        return 0, -int(links[1])
    return PATHS.index(kind), 0


def _cost(group: tuple[Gpu, ...]) -> tuple:
    """A group's cost: the nodes it spans, its farthest path, all its paths, its addresses."""
    paths = [_path(a, b) for a, b in itertools.combinations(group, 2)]
    return (
        len({gpu.node for gpu in group}),
        max(paths, default=(0, 0)),
        sorted(paths, reverse=True),
        [gpu.pci for gpu in group],
    )


def _groups(gpus: list[Gpu], size: int, count: int) -> list[tuple[Gpu, ...]]:
    """`count` disjoint groups of `size` GPUs, each the cheapest of what is left."""
    left, groups = list(gpus), []
    for _ in range(count):
        best = min(itertools.combinations(left, size), key=_cost)
        groups.append(best)
        left = [gpu for gpu in left if gpu not in best]
    return groups


def _room(gpu_gb: float, model_gb: float, size: int) -> float:
    """GB each GPU of a group of `size` has for the KV cache once it holds its weights."""
    return GPU_MEMORY_UTILIZATION * gpu_gb - model_gb / size


def _holds(gpu_gb: float, model_gb: float, size: int) -> bool:
    return _room(gpu_gb, model_gb, size) >= max(MIN_KV_GB, KV_FLOOR * gpu_gb)


def _sizes(count: int) -> list[int]:
    return [2**k for k in range(count.bit_length()) if 2**k <= count]


def _smallest_group(gpus: list[Gpu], model_gb: float) -> int | None:
    smallest = min(gpu.gb for gpu in gpus)
    return next((size for size in _sizes(len(gpus)) if _holds(smallest, model_gb, size)), None)


def _no_group(gpus: list[Gpu], request: PlanRequest) -> PlanError:
    smallest = min(gpu.gb for gpu in gpus)
    return PlanError(
        "model_gb",
        f"model {request.model_gb:g} GB fits no group of the {len(gpus)} GPU(s) "
        f"({smallest:.0f} GB each, {GPU_MEMORY_UTILIZATION:.0%} of it for vLLM, at least "
        f"{KV_FLOOR:.0%} left for the KV cache): serve a mixture of experts with its experts "
        "in system memory (--layout hybrid, with --expert-gb and --model-layers, or --gguf), "
        "or any model over several hosts (--layout pp)",
    )


def _decide(gpus: list[Gpu], request: PlanRequest) -> tuple[str, int, int, str]:
    """(layout, GPUs per group, groups, reason)."""
    count, size = len(gpus), _smallest_group(gpus, request.model_gb)
    model = f"model {request.model_gb:g} GB"
    if request.layout == "auto":
        refuse_ranks_with_auto(request)
        if size is None:
            raise _no_group(gpus, request)
        groups = count // size
        layout = "sn" if size == groups == 1 else "tp" if groups == 1 else "dp"
        return (
            layout,
            size,
            groups,
            f"auto: {model} needs {size} of the {count} GPU(s) (TP-{size}), so "
            + ("one instance" if groups == 1 else f"{groups} instances of it as DP replicas"),
        )
    if request.layout == "sn":
        if request.ranks not in (None, 1):
            raise PlanError(
                "ranks", f"SN runs on one GPU, not {request.ranks}", ["layout tp", "layout dp"]
            )
        size, groups = 1, 1
    elif request.layout == "tp":
        size, groups = request.ranks or count, 1
    else:
        if size is None:
            raise _no_group(gpus, request)
        groups = request.ranks or count // size
    if size * groups > count:
        raise PlanError(
            "ranks",
            f"{groups} group(s) of {size} GPU(s) need {size * groups}; this host has {count}",
            [f"layout {request.layout} ranks {k}" for k in range(1, count // size + 1)]
            if request.layout == "dp"
            else [f"layout tp ranks {k}" for k in _sizes(count)],
        )
    smallest = min(gpu.gb for gpu in gpus)
    if not _holds(smallest, request.model_gb, size):
        fits = _smallest_group(gpus, request.model_gb)
        raise PlanError(
            "model_gb",
            f"{model} does not fit {size} GPU(s) of {smallest:.0f} GB with room for the KV "
            f"cache ({_room(smallest, request.model_gb, size):.1f} GB each after the weights)",
            [f"layout tp ranks {fits}"] if fits else [],
        )
    return request.layout, size, groups, f"layout {request.layout} requested"


def _where(groups: list[tuple[Gpu, ...]]) -> str:
    """The reason's words on where the groups sit."""
    spanning = [group for group in groups if len({gpu.node for gpu in group}) > 1]
    nodes = sorted({gpu.node for group in groups for gpu in group if gpu.node is not None})
    if any(gpu.node is None for group in groups for gpu in group):
        return (
            "; a GPU whose NUMA node neither the firmware nor its local CPUs tell leaves its "
            "instance's memory interleaved over every node"
        )
    if spanning:
        shown = " and ".join(str(node) for node in sorted({g.node for g in spanning[0]}))
        return (
            f"; a group must span nodes {shown}: its memory is interleaved over them and its "
            "ranks run on each GPU's own node"
        )
    where = f"node {nodes[0]}" if len(nodes) == 1 else f"nodes {', '.join(map(str, nodes))}"
    paths = [_path(a, b) for group in groups for a, b in itertools.combinations(group, 2)]
    farthest = max(paths, default=None)
    near = ""
    if farthest is not None:
        kind = PATHS[farthest[0]] + (str(-farthest[1]) if farthest[0] == 0 else "")
        near = f"; its GPUs at most {kind} apart"
    return f"; each instance inside one NUMA node ({where}{near}) and bound there"


def _cores(nodes: dict[int, Node], ranks: dict[int, int], request: PlanRequest) -> dict:
    """Per node, its ranks' core shares: the physical cores less the reserve, split evenly."""
    shares = {}
    for node_id, count in ranks.items():
        node = nodes[node_id]
        usable = node.cores[: len(node.cores) - reserve_for(node, request.reserve_cores)]
        if len(usable) < count:
            raise PlanError(
                "reserve_cores",
                f"node {node_id} has {len(usable)} core(s) after its reserve for {count} GPU "
                "rank(s): each needs one",
                [f"reserve cores {k}" for k in range(len(node.cores) - count, -1, -1)][:2],
            )
        width = len(usable) // count
        shares[node_id] = [usable[i * width : (i + 1) * width] for i in range(count)]
    return shares


def _max_seqs(gpu: Gpu) -> int:
    large = gpu.gb >= LARGE_GPU_GIB and "a100" not in gpu.name.lower()
    return MAX_SEQS["large" if large else "other"]


def _kv(group: tuple[Gpu, ...], request: PlanRequest) -> int:
    room = _room(min(gpu.gb for gpu in group), request.model_gb, len(group))
    leaves = "vLLM's share of the GPU leaves after the weights"
    return kv_cache_gb(request.kv_gb, room, room, "GPU", leaves)


def plan_gpus(
    topo: dict, host_nodes: list[Node], request: PlanRequest, build_of_host: dict
) -> dict:
    """Place vLLM on the GPUs of the host described by `topo` (its `host_nodes`, checked by
    the planner; see the module's rules), or llama.cpp on a GPU and the CPUs (`hybrid`)."""
    nodes = {node.id: node for node in host_nodes}
    gpus = serving_gpus(topo, request)
    alone = _smallest_group(gpus, request.model_gb) is not None
    auto = request.layout == "auto" and request.ranks is None
    if request.layout == "hybrid" or (
        auto and not alone and fits(list(nodes.values()), gpus, request)
    ):
        return plan_hybrid(topo, nodes, gpus, request, build_of_host)
    layout, size, count, reason = _decide(gpus, request)
    groups = _groups(gpus, size, count)
    reason += _where(groups)
    on_node: dict[int, int] = {}
    for gpu in (gpu for group in groups for gpu in group):
        if gpu.node is not None:
            on_node[gpu.node] = on_node.get(gpu.node, 0) + 1
    shares = _cores(nodes, on_node, request)
    taken = dict.fromkeys(shares, 0)
    numbered = indices(gpus)
    placed, instances = [], []
    for group in groups:
        ranks = []
        for gpu in group:
            cores: list[list[int]] = []
            if gpu.node is not None:
                cores = shares[gpu.node][taken[gpu.node]]
                taken[gpu.node] += 1
                placed.append({"node": gpu.node, "cores": cores})
            ranks.append({"node": gpu.node, "cpus": [core[0] for core in cores], "gpu": gpu.pci})
        unbound = any(gpu.node is None for gpu in group)
        instances.append(
            {
                "tp": size,
                "data_parallel": 1,
                "ranks": ranks,
                "membind": sorted(nodes) if unbound else sorted({gpu.node for gpu in group}),
                "kvcache_gb": _kv(group, request),
                "max_connections": _max_seqs(group[0]),
                "gpus": [gpu.pci for gpu in group],
                "cuda_visible_devices": ",".join(str(numbered[gpu.pci]) for gpu in group),
                "gpu_minors": minors(group, numbered),
            }
        )
    if layout == "dp" and request.dp_mode == "vllm":
        instances = [
            {
                "tp": size,
                "data_parallel": count,
                "ranks": [rank for i in instances for rank in i["ranks"]],
                "membind": sorted({node for i in instances for node in i["membind"]}),
                "kvcache_gb": min(i["kvcache_gb"] for i in instances),
                "max_connections": sum(i["max_connections"] for i in instances),
                "gpus": [pci for i in instances for pci in i["gpus"]],
                "cuda_visible_devices": ",".join(i["cuda_visible_devices"] for i in instances),
                "gpu_minors": [minor for i in instances for minor in i["gpu_minors"]],
            }
        ]
    names = [f"vllm-{layout}"] if len(instances) == 1 else [f"vllm-dp{i}" for i in range(count)]
    instances = finish_instances(instances, names, request.port)
    dp_mode = request.dp_mode if layout == "dp" else None
    node_uses = [node_use(nodes[node_id], placed) for node_id in sorted(shares)]
    placement = (layout, dp_mode, reason, instances, node_uses)
    return finish_plan(topo, request, build_of_host, *placement)
