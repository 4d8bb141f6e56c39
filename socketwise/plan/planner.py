"""The layout planner: topology facts + a request -> where every vLLM rank runs.

Plain Python with no Ansible import. The CLI (`socketwise plan`, in `command`) and the
Ansible filter `socketwise_plan` are thin doors into `plan()`; the host as the planner
sees it (the checked topology, its NUMA nodes) is `nodes`.

Rules (see docs/concepts/plan.md):
- One OpenMP thread per physical core: the lowest logical CPU of each core; SMT
  siblings are left to the OS.
- Each node that serves keeps `reserve_cores` physical cores (its highest-numbered
  ones) for the OS and the HTTP front end. Default: 2 on nodes with 8 or more cores,
  1 on nodes with 4 to 7, 0 below that (a 2-core lab host cannot spare any).
- A rank never straddles a NUMA node; memory-only nodes never get a rank. Several
  ranks on one node get contiguous, disjoint groups of its cores.
- KV cache per rank (GiB, what VLLM_CPU_KVCACHE_SPACE takes):
      available = (node_gb - os_reserve_gb - weights on the node) / ranks on the node
      os_reserve_gb = max(1, 10 % of node_gb)
      default kv = floor(0.75 * available), at least 1
  where a rank holds the whole model (SN, DP) or 1/tp of it (TP). An explicit
  `kv_gb` may use all of `available` but not more.
- Every layout is served behind the front door on `port`; the instances take the
  ports after it (port + 1, + 2, ...), each capped at the requests its engines
  schedule at once (`max_connections`).
- Every plan names the host's hardware class (`hwclass`): hosts of one class get
  the same plan shape from the same request, and its vLLM build (`build`: class,
  dtype, reason; see hwclass.build). A CPU without AVX2 gets no plan.
- `auto`: TP only when the model does not fit one node; DP when the expected
  concurrency is above the SN/DP crossover (measured value if given, else
  DEFAULT_CROSSOVER from the field notes' dual-socket Broadwell); SN otherwise.
- A value a calibration measured for the host's class (`measured`, see `calibrated`)
  is used as given, and the reason says where it was measured.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from .gpu import plan_gpus
from .hwclass import BuildRefused, build
from .nodes import Node, PlanError, cpu_nodes, os_reserve_gb, reserve_for
from .shape import (
    MAX_PORT,
    MIN_KV_GB,
    PlanRequest,
    finish_plan,
    instance_port,
    kv_cache_gb,
    node_use,
    refuse_ranks_with_auto,
    threads_bind,
)

LAYOUTS = ("sn", "tp", "dp", "auto", "hybrid")
DP_MODES = ("instances", "vllm")
BALANCES = ("leastconn", "prefix")
# What serves: the CPUs (this module), or the GPUs (`gpu`, with the host side bound).
DEVICES = ("cpu", "gpu")
# Concurrent requests above which one replica per node beat one instance on the
# field notes' 2x E5-2680 v4; a starting point only, `socketwise sweep` measures it.
DEFAULT_CROSSOVER = 6.0
KV_FRACTION = 0.75


def _split(cores: list[list[int]], groups: int) -> list[list[list[int]]]:
    """`groups` contiguous, disjoint, equal groups of cores; leftovers stay unused."""
    size = len(cores) // groups
    return [cores[i * size : (i + 1) * size] for i in range(groups)]


def _valid_rank_counts(node_count: int, usable: list[int], split: bool) -> list[int]:
    """One rank on each of the first k nodes, or (split) the same number on every node."""
    counts = list(range(1, node_count + 1))
    if split:
        counts += [per_node * node_count for per_node in range(2, min(usable) + 1)]
    return counts


def _describe_counts(what: str, counts: list[int]) -> list[str]:
    shown = [f"{what} ranks {k}" for k in counts[:6]]
    if len(counts) > 6:
        shown.append(f"... up to {what} ranks {counts[-1]}")
    return shown


def _spread_cost(group: tuple[Node, ...]) -> int:
    """Sum of the NUMA distances between every pair of nodes (unknown: the local 10)."""
    return sum(a.distances.get(b.id, 10) for a, b in itertools.combinations(group, 2))


def _closest(nodes: list[Node], count: int) -> list[Node]:
    """The `count` nodes closest to each other by the distance matrix (ties: lowest ids), so
    a TP group on a ring of four sockets takes neighbours, not the lowest node numbers."""
    if count >= len(nodes):
        return list(nodes)
    best = min(itertools.combinations(nodes, count), key=_spread_cost)
    return sorted(best, key=lambda n: n.id)


def _place_ranks(
    nodes: list[Node], ranks: int, request: PlanRequest, split: bool, what: str, equal: bool
) -> list[dict]:
    """Spread `ranks` over the nodes in id order (SNC nodes of a socket are adjacent)."""
    usable = [len(n.cores) - reserve_for(n, request.reserve_cores) for n in nodes]
    valid = _valid_rank_counts(len(nodes), usable, split)
    if ranks not in valid:
        hint = "" if split else " (ranks beyond the node count need --split-nodes)"
        raise PlanError(
            "ranks",
            f"{what} with {ranks} ranks does not fit {len(nodes)} NUMA node(s) with CPUs "
            f"(nodes {', '.join(str(n.id) for n in nodes)}; usable cores {usable}){hint}",
            _describe_counts(what, valid),
        )
    per_node = 1 if ranks <= len(nodes) else ranks // len(nodes)
    # TP ranks talk after every layer: keep the group on nodes close to each other.
    chosen = _closest(nodes, ranks // per_node) if equal else nodes[: ranks // per_node]
    chosen_usable = [usable[nodes.index(node)] for node in chosen]
    # TP ranks run in lockstep, so the slowest rank sets the pace: give all the same count.
    width = min(chosen_usable)
    placed = []
    for node, count in zip(chosen, chosen_usable, strict=True):
        serving = node.cores[: width if equal else count]
        for group in _split(serving, per_node):
            placed.append({"node": node.id, "cores": group, "_node": node, "_share": per_node})
    return placed


def _kv_for(placed: list[dict], weights_per_rank: float, request: PlanRequest) -> int:
    room = min(
        (r["_node"].gb - os_reserve_gb(r["_node"].gb)) / r["_share"] - weights_per_rank
        for r in placed
    )
    if room < MIN_KV_GB:
        raise PlanError(
            "model_gb",
            f"model of {request.model_gb:g} GB leaves {room:.1f} GB per rank for the KV cache "
            f"(needs at least {MIN_KV_GB})",
        )
    return kv_cache_gb(
        request.kv_gb, room, KV_FRACTION * room, "rank", "its node has after weights and OS reserve"
    )


def _instance(name: str, port: int, placed: list[dict], tp: int, dp: int, kv: int) -> dict:
    ranks = [{"node": r["node"], "cpus": [core[0] for core in r["cores"]]} for r in placed]
    return {
        "name": name,
        "port": port,
        "tp": tp,
        "data_parallel": dp,
        "ranks": ranks,
        "omp_threads_bind": threads_bind(ranks),
        "membind": sorted({r["node"] for r in ranks}),
        "kvcache_gb": kv,
        "max_connections": MAX_SEQS_PER_RANK * tp * dp,
    }


def _holds(node: Node, weights_gb: float) -> bool:
    return node.gb - os_reserve_gb(node.gb) - weights_gb >= MIN_KV_GB


def _fits_one_node(nodes: list[Node], model_gb: float) -> bool:
    return any(_holds(n, model_gb) for n in nodes)


def _smallest_tp(nodes: list[Node], model_gb: float) -> int | None:
    for ranks in range(2, len(nodes) + 1):
        if all(_holds(n, model_gb / ranks) for n in _closest(nodes, ranks)):
            return ranks
    return None


def _measured_source(request: PlanRequest, name: str) -> str | None:
    """The calibration's "measured in RUN (DATE)" when NAME is among the values it kept
    (calibrated.vet keeps only those equal to what the deploy was given)."""
    measured = request.measured or {}
    return str(measured["source"]) if name in measured else None


def _measured_clauses(request: PlanRequest, build_of_host: dict) -> tuple[str, dict]:
    """The reason's clause for a measured reserve, and the build with a measured dtype."""
    clause = ""
    reserve = _measured_source(request, "reserve_cores")
    if reserve:
        clause = (
            f"; {request.reserve_cores} core(s) of each serving node kept for the front end "
            f"and the OS, {reserve}"
        )
    dtype = _measured_source(request, "dtype")
    if dtype:
        chosen = str((request.measured or {})["dtype"])
        build_of_host = build_of_host | {
            "dtype": chosen,
            "reason": f"{build_of_host['reason']}; dtype {chosen}, {dtype}",
        }
    return clause, build_of_host


def _cached_weights_clause(nodes: list[Node], request: PlanRequest) -> str:
    """The rule keeps no core on nodes of 2-3 (default_reserve_cores): decode of weights no
    cache holds is bound by memory bandwidth, and one core draws less of it than two.
    Weights that every node's last-level cache holds are not, and there SN serves better
    with a core kept for vLLM's front end, as vLLM's own binding keeps one (measured on a
    2-core node: docs/measurements.md). The reason's clause where that applies, else ''.
    A given or measured reserve stands."""
    if request.reserve_cores is not None or not request.model_gb or not request.own_front_end:
        return ""
    weights_kb = request.model_gb * 2**20
    if not all(2 <= len(n.cores) < 4 and n.llc_kb and weights_kb <= n.llc_kb for n in nodes):
        return ""
    llc = min(n.llc_kb or 0 for n in nodes) / 1024
    return (
        f"; 1 core of each serving node kept for the front end and the OS: the model's "
        f"{request.model_gb * 1024:.0f} MB of weights fit in the node's {llc:.0f} MB "
        "last-level cache, so a second core would add no memory bandwidth decode needs"
    )


def _decide(nodes: list[Node], request: PlanRequest) -> tuple[str, int | None, str]:
    """Resolve `auto` into (layout, ranks, reason)."""
    size = f"model {request.model_gb:g} GB"
    if request.layout != "auto":
        return request.layout, request.ranks, f"layout {request.layout} requested"
    refuse_ranks_with_auto(request)
    if not _fits_one_node(nodes, request.model_gb):
        tp = _smallest_tp(nodes, request.model_gb)
        if tp is None:
            total = sum(n.gb for n in nodes)
            raise PlanError(
                "model_gb",
                f"{size} fits no node and not even sharded over all {len(nodes)} nodes "
                f"({total:.0f} GB in all, less OS reserve and KV cache)",
            )
        return (
            "tp",
            tp,
            (
                f"auto: {size} does not fit one NUMA node, so it is sharded over the fewest "
                f"nodes that hold it (TP-{tp})"
            ),
        )
    crossover = request.crossover if request.crossover is not None else DEFAULT_CROSSOVER
    source = (
        "default, not yet measured here"
        if request.crossover is None
        else _measured_source(request, "crossover") or "given in plan_crossover"
    )
    if request.concurrency is not None and request.concurrency > crossover:
        return (
            "dp",
            request.ranks,
            (
                f"auto: {size} fits one node and expected concurrency {request.concurrency:g} is "
                f"above the SN/DP crossover {crossover:g} ({source}), so independent "
                f"replicas, one per node or per half of a lone node (DP)"
            ),
        )
    load = (
        "no expected concurrency given"
        if request.concurrency is None
        else f"expected concurrency {request.concurrency:g} is at or below the SN/DP crossover "
        f"{crossover:g} ({source})"
    )
    return (
        "sn",
        1,
        (
            f"auto: {size} fits one node and {load}, so one instance on one node (SN); "
            f"TP across nodes only pays when the model does not fit one"
        ),
    )


# vLLM's default --max-num-seqs on CPU for its API server: 128 per rank of an engine's
# TP group, for each DP engine. The front door lets no more requests than that through
# to an instance at once; the rest wait in its queue, not in vLLM's.
MAX_SEQS_PER_RANK = 128


def _check_numbers(request: PlanRequest) -> None:
    """Refuse numbers no plan can use, naming the input: negative or non-finite sizes and
    loads, rank counts below one, ports outside 1-65535."""
    for name in ("model_gb", "concurrency", "crossover", "gpu_memory_gb", "expert_gb"):
        value = getattr(request, name)
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise PlanError(name, f"{name.replace('_', ' ')} {value!r} must be a number >= 0")
    if request.gpu_memory_gb is not None and request.device != "gpu":
        raise PlanError("gpu_memory_gb", "GPU memory is for plans on GPUs", ["device gpu"])
    for name in ("ranks", "layers"):
        value = getattr(request, name)
        if value is not None and value < 1:
            raise PlanError(name, f"{name} {value} must be at least 1")
    if request.dense_layers < 0:
        raise PlanError("dense_layers", f"dense layers {request.dense_layers} must be >= 0")
    if not 1 <= request.port <= MAX_PORT:
        raise PlanError("port", f"port {request.port} is not in 1-{MAX_PORT}")


def plan(topo: dict, request: PlanRequest) -> dict:
    """Place vLLM on the host described by `topo`; raises PlanError on a request it cannot meet."""
    if request.layout not in LAYOUTS:
        raise PlanError(
            "layout", f"unknown layout {request.layout!r}", [f"layout {x}" for x in LAYOUTS]
        )
    if request.dp_mode not in DP_MODES:
        raise PlanError(
            "dp_mode", f"unknown DP mode {request.dp_mode!r}", [f"dp mode {x}" for x in DP_MODES]
        )
    if request.balance not in BALANCES:
        raise PlanError(
            "balance", f"unknown balance {request.balance!r}", [f"balance {x}" for x in BALANCES]
        )
    if request.device not in DEVICES:
        raise PlanError(
            "device", f"unknown device {request.device!r}", [f"device {x}" for x in DEVICES]
        )
    if request.layout == "hybrid":
        # It keeps the dense weights on a GPU.
        request = replace(request, device="gpu")
    _check_numbers(request)
    nodes = cpu_nodes(topo)
    try:
        build_of_host = build(topo, request.build_class)
    except BuildRefused as exc:
        raise PlanError("build_class", str(exc)) from exc
    if request.device == "gpu":
        return plan_gpus(topo, nodes, request, build_of_host)
    layout, ranks, reason = _decide(nodes, request)
    cached = _cached_weights_clause(nodes, request) if layout == "sn" else ""
    if cached:
        request = replace(request, reserve_cores=1)
        reason += cached
    if layout != "sn" and _measured_source(request, "reserve_cores"):
        # A calibration measures the front end's cores on SN alone: DP and TP keep the
        # rule's, so DP-2 stays possible on a node too small for it with SN's reserve.
        measured = {k: v for k, v in (request.measured or {}).items() if k != "reserve_cores"}
        reason += (
            f"; the rule's reserve for {layout.upper()} (the {request.reserve_cores} core(s) "
            f"{_measured_source(request, 'reserve_cores')} are SN's)"
        )
        request = replace(request, reserve_cores=None, measured=measured)
    clause, build_of_host = _measured_clauses(request, build_of_host)
    reason += clause
    # Every layout sits behind the front door on the public port; the instances take the
    # ports after it, on a private address.
    port = request.port
    dp_mode = None
    if layout == "sn":
        if ranks not in (None, 1):
            raise PlanError("ranks", f"SN runs one rank, not {ranks}", ["layout tp", "layout dp"])
        # Among the nodes the model fits: the node the GPUs hang off serves (cross-node
        # access costs 15-30 %), else the node with the most cores; ties go to the lowest id.
        gpus = [g.get("numa_node") for g in topo.get("gpus", [])]
        candidates = [n for n in nodes if _holds(n, request.model_gb)] or nodes
        best = sorted(candidates, key=lambda n: (-gpus.count(n.id), -len(n.cores), n.id))[:1]
        placed = _place_ranks(best, 1, request, False, "SN", equal=False)
        kv = _kv_for(placed, request.model_gb, request)
        instances = [_instance("vllm-sn", instance_port(port, 0), placed, 1, 1, kv)]
    elif layout == "tp":
        if ranks is None:
            ranks = len(nodes) if len(nodes) > 1 or not request.split_nodes else 2
        placed = _place_ranks(nodes, ranks, request, request.split_nodes, "TP", equal=True)
        kv = _kv_for(placed, request.model_gb / ranks, request)
        instances = [_instance("vllm-tp", instance_port(port, 0), placed, ranks, 1, kv)]
    else:
        if ranks is None:
            # One replica per node; a single node is split in halves.
            ranks = max(len(nodes), 2)
        placed = _place_ranks(nodes, ranks, request, True, "DP", equal=False)
        kv = _kv_for(placed, request.model_gb, request)
        dp_mode = request.dp_mode
        if dp_mode == "vllm":
            instances = [_instance("vllm-dp", instance_port(port, 0), placed, 1, ranks, kv)]
        else:
            instances = [
                _instance(f"vllm-dp{i}", instance_port(port, i), [rank], 1, 1, kv)
                for i, rank in enumerate(placed)
            ]
    used = sorted({r["node"] for r in placed})
    node_uses = [node_use(n, placed) for n in nodes if n.id in used]
    reserved = {use["node"]: use["reserved_cpus"] for use in node_uses}
    for instance in instances:
        # The whole service may run on its ranks' CPUs and its nodes' reserved ones; vLLM
        # pins each worker's threads to its rank's CPUs, and the unit then places the API
        # server and the engine core's scheduler (socketwise.serve.frontend).
        threads = {cpu for rank in instance["ranks"] for cpu in rank["cpus"]}
        front = {cpu for node in instance["membind"] for cpu in reserved[node]}
        instance["cpus_allowed"] = sorted(threads | front)
        instance["frontend_cpus"], instance["engine_cpus"] = _front_end(instance, nodes, front)
    placement = (layout, dp_mode, reason, instances, node_uses)
    return finish_plan(topo, request, build_of_host, *placement)


def _front_end(instance: dict, nodes: list[Node], front: set[int]) -> tuple[list[int], list[int]]:
    """Where the unit puts vLLM's API server (with the engine core's socket threads) and the
    engine core's scheduler thread: ([], []) where no core is kept (both stay on
    `cpus_allowed`). The scheduler runs beside each step of the workers and the API server
    beside each token, so each gets a core of its own where the first rank's node keeps
    two or more: the last of them is the scheduler's. Where it keeps one, the scheduler
    goes beside the first rank: with the API server it left the server too little CPU at
    concurrency 4 (tokens sent in one chunk, half the throughput), beside the worker it
    cost about a fifth at concurrency 1 (docs/measurements.md). vLLM's own DP (several
    engine cores in one unit) leaves the engine cores where they are."""
    if not front:
        return [], []
    if instance["data_parallel"] > 1:
        return sorted(front), []
    first = instance["ranks"][0]
    node = next(n for n in nodes if n.id == first["node"])
    kept = [core for core in node.cores if core[0] in front]
    if len(kept) >= 2:
        return sorted(front - set(kept[-1])), sorted(kept[-1])
    return sorted(front), sorted(first["cpus"])
