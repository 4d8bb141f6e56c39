"""The layout planner: topology facts + a request -> where every vLLM rank runs.

Plain Python with no Ansible import. The CLI (`socketwise plan`) and the Ansible
filter `socketwise_plan` are thin doors into `plan()`.

Rules (see README, "The plan"):
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
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from ..facts import topology  # relative: shipped to hosts with host.tuning
from .hwclass import BuildRefused, build, hardware_class

LAYOUTS = ("sn", "tp", "dp", "auto")
DP_MODES = ("instances", "vllm")
# Concurrent requests above which one replica per node beat one instance on the
# field notes' 2x E5-2680 v4; a starting point only, `socketwise sweep` measures it.
DEFAULT_CROSSOVER = 6.0
MIN_KV_GB = 1
KV_FRACTION = 0.75


class PlanError(ValueError):
    """A request this host cannot meet. `field` names the input at fault."""

    def __init__(self, field: str, message: str, alternatives: list[str] | None = None):
        self.field = field
        self.alternatives = alternatives or []
        text = message
        if self.alternatives:
            text += "; plans that would work: " + ", ".join(self.alternatives)
        super().__init__(text)


@dataclass(frozen=True)
class PlanRequest:
    layout: str = "auto"
    ranks: int | None = None
    model_gb: float = 0.0
    reserve_cores: int | None = None
    kv_gb: int | None = None
    concurrency: float | None = None
    crossover: float | None = None
    dp_mode: str = "instances"
    split_nodes: bool = False
    port: int = 8000
    build_class: str | None = None

    @classmethod
    def from_values(cls, **values: object) -> PlanRequest:
        """Build a request from loosely typed values (Ansible extra vars arrive as strings)."""
        kinds = {"ranks": int, "reserve_cores": int, "kv_gb": int, "port": int}
        kinds |= {"model_gb": float, "concurrency": float, "crossover": float}
        converted: dict[str, object] = {}
        for name, value in values.items():
            if name == "split_nodes":
                value = str(value).lower() in ("1", "true", "yes", "on")
            elif value is not None and value != "" and name in kinds:
                try:
                    value = kinds[name](value)
                except (TypeError, ValueError) as exc:
                    raise PlanError(name, f"{value!r} is not a number") from exc
            elif value == "":
                value = None
            converted[name] = value
        return cls(**converted)


@dataclass(frozen=True)
class _Node:
    id: int
    gb: float
    cores: list[list[int]]  # online logical CPUs of each physical core
    distances: dict[int, int]  # node id -> NUMA distance from this node


def default_reserve_cores(core_count: int) -> int:
    if core_count >= 8:
        return 2
    if core_count >= 4:
        return 1
    return 0


def os_reserve_gb(node_gb: float) -> float:
    return max(1.0, 0.1 * node_gb)


def _malformed(where: str, what: str) -> PlanError:
    return PlanError(
        "topology",
        f"malformed topology: {where} {what}; give the document `socketwise topology` "
        'prints (schema 1, README "Topology facts")',
    )


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_topology(topo: object) -> None:
    """The keys the planner reads, each of the type it needs, named where one is not."""
    if not isinstance(topo, dict):
        raise _malformed("the document", "is not a JSON object")
    if topo.get("schema") != 1:
        raise _malformed("schema", f"is {topo.get('schema')!r}, not 1")
    nodes = topo.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise _malformed("nodes", "must be a non-empty list")
    for i, node in enumerate(nodes):
        where = f"nodes[{i}]"
        if not isinstance(node, dict):
            raise _malformed(where, "is not an object")
        if not _whole(node.get("id")) or node["id"] < 0:
            raise _malformed(f"{where}.id", f"is {node.get('id')!r}, not a node number")
        if not _number(node.get("memory_mb")) or node["memory_mb"] < 0:
            raise _malformed(f"{where}.memory_mb", "must be a number of MB >= 0")
        cores = node.get("cores")
        if not isinstance(cores, list):
            raise _malformed(f"{where}.cores", "must be a list of cores (lists of CPUs)")
        for j, core in enumerate(cores):
            if not isinstance(core, list) or not core or not all(_whole(c) for c in core):
                raise _malformed(f"{where}.cores[{j}]", "must be a non-empty list of CPU numbers")
        distances = node.get("distances", [])
        if not isinstance(distances, list) or not all(_number(d) for d in distances):
            raise _malformed(f"{where}.distances", "must be a list of numbers")
    if len({node["id"] for node in nodes}) != len(nodes):
        raise _malformed("nodes", "repeat a node id")
    gpus = topo.get("gpus", [])
    if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus):
        raise _malformed("gpus", "must be a list of objects")


def _cpu_nodes(topo: dict) -> list[_Node]:
    _check_topology(topo)
    ids = sorted(n["id"] for n in topo["nodes"])
    nodes = [
        _Node(
            n["id"],
            n["memory_mb"] / 1024,
            [list(c) for c in n["cores"]],
            # A node's row of the distance matrix, in node id order.
            dict(zip(ids, n.get("distances", []), strict=False)),
        )
        for n in topo["nodes"]
    ]
    with_cpus = [n for n in nodes if n.cores]
    if not with_cpus:
        raise PlanError("topology", "topology has no NUMA node with online CPUs")
    return with_cpus


def _reserve_for(node: _Node, request: PlanRequest) -> int:
    count = len(node.cores)
    if request.reserve_cores is None:
        return default_reserve_cores(count)
    if request.reserve_cores < 0:
        raise PlanError("reserve_cores", f"reserve cores {request.reserve_cores} is negative")
    if request.reserve_cores >= count:
        raise PlanError(
            "reserve_cores",
            f"reserve cores {request.reserve_cores} >= the {count} physical cores of node "
            f"{node.id}: nothing would be left for inference",
            [f"reserve cores {k}" for k in range(min(count, 3))],
        )
    return request.reserve_cores


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


def _spread_cost(group: tuple[_Node, ...]) -> int:
    """Sum of the NUMA distances between every pair of nodes (unknown: the local 10)."""
    return sum(a.distances.get(b.id, 10) for a, b in itertools.combinations(group, 2))


def _closest(nodes: list[_Node], count: int) -> list[_Node]:
    """The `count` nodes closest to each other by the distance matrix (ties: lowest ids), so
    a TP group on a ring of four sockets takes neighbours, not the lowest node numbers."""
    if count >= len(nodes):
        return list(nodes)
    best = min(itertools.combinations(nodes, count), key=_spread_cost)
    return sorted(best, key=lambda n: n.id)


def _place_ranks(
    nodes: list[_Node], ranks: int, request: PlanRequest, split: bool, what: str, equal: bool
) -> list[dict]:
    """Spread `ranks` over the nodes in id order (SNC nodes of a socket are adjacent)."""
    usable = [len(n.cores) - _reserve_for(n, request) for n in nodes]
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
    if request.kv_gb is None:
        return max(MIN_KV_GB, math.floor(KV_FRACTION * room))
    if request.kv_gb > room:
        raise PlanError(
            "kv_gb",
            f"KV cache {request.kv_gb:g} GB per rank exceeds the {room:.1f} GB its node has "
            f"after weights and OS reserve",
            [f"kv {math.floor(room)} GB"],
        )
    if request.kv_gb < MIN_KV_GB or not float(request.kv_gb).is_integer():
        raise PlanError(
            "kv_gb", f"KV cache {request.kv_gb:g} GB must be a whole number of GB, at least 1"
        )
    return int(request.kv_gb)


def _instance(name: str, port: int, placed: list[dict], tp: int, dp: int, kv: int) -> dict:
    ranks = [{"node": r["node"], "cpus": [core[0] for core in r["cores"]]} for r in placed]
    return {
        "name": name,
        "port": port,
        "tp": tp,
        "data_parallel": dp,
        "ranks": ranks,
        "omp_threads_bind": "|".join(",".join(map(str, r["cpus"])) for r in ranks),
        "membind": sorted({r["node"] for r in ranks}),
        "kvcache_gb": kv,
        "max_connections": MAX_SEQS_PER_RANK * tp * dp,
    }


def _holds(node: _Node, weights_gb: float) -> bool:
    return node.gb - os_reserve_gb(node.gb) - weights_gb >= MIN_KV_GB


def _fits_one_node(nodes: list[_Node], model_gb: float) -> bool:
    return any(_holds(n, model_gb) for n in nodes)


def _smallest_tp(nodes: list[_Node], model_gb: float) -> int | None:
    for ranks in range(2, len(nodes) + 1):
        if all(_holds(n, model_gb / ranks) for n in _closest(nodes, ranks)):
            return ranks
    return None


def _decide(nodes: list[_Node], request: PlanRequest) -> tuple[str, int | None, str]:
    """Resolve `auto` into (layout, ranks, reason)."""
    size = f"model {request.model_gb:g} GB"
    if request.layout != "auto":
        return request.layout, request.ranks, f"layout {request.layout} requested"
    if request.ranks is not None:
        raise PlanError(
            "ranks",
            f"layout auto chooses the rank count itself, so {request.ranks} ranks would be "
            "ignored: drop the ranks, or choose the layout",
            [f"layout tp ranks {request.ranks}", f"layout dp ranks {request.ranks}"],
        )
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
    source = "measured" if request.crossover is not None else "default, not yet measured here"
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


MAX_PORT = 65535
# vLLM's default --max-num-seqs on CPU for its API server: 128 per rank of an engine's
# TP group, for each DP engine. The front door lets no more requests than that through
# to an instance at once; the rest wait in its queue, not in vLLM's.
MAX_SEQS_PER_RANK = 128


def _check_numbers(request: PlanRequest) -> None:
    """Refuse numbers no plan can use, naming the input: negative or non-finite sizes and
    loads, rank counts below one, ports outside 1-65535."""
    for name in ("model_gb", "concurrency", "crossover"):
        value = getattr(request, name)
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise PlanError(name, f"{name.replace('_', ' ')} {value!r} must be a number >= 0")
    if request.ranks is not None and request.ranks < 1:
        raise PlanError("ranks", f"ranks {request.ranks} must be at least 1")
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
    _check_numbers(request)
    nodes = _cpu_nodes(topo)
    try:
        build_of_host = build(topo, request.build_class)
    except BuildRefused as exc:
        raise PlanError("build_class", str(exc)) from exc
    layout, ranks, reason = _decide(nodes, request)
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
        instances = [
            _instance("vllm-sn", port + 1, placed, 1, 1, _kv_for(placed, request.model_gb, request))
        ]
    elif layout == "tp":
        if ranks is None:
            ranks = len(nodes) if len(nodes) > 1 or not request.split_nodes else 2
        placed = _place_ranks(nodes, ranks, request, request.split_nodes, "TP", equal=True)
        kv = _kv_for(placed, request.model_gb / ranks, request)
        instances = [_instance("vllm-tp", port + 1, placed, ranks, 1, kv)]
    else:
        if ranks is None:
            # One replica per node; a single node is split in halves.
            ranks = max(len(nodes), 2)
        placed = _place_ranks(nodes, ranks, request, True, "DP", equal=False)
        kv = _kv_for(placed, request.model_gb, request)
        dp_mode = request.dp_mode
        if dp_mode == "vllm":
            instances = [_instance("vllm-dp", port + 1, placed, 1, ranks, kv)]
        else:
            instances = [
                _instance(f"vllm-dp{i}", port + 1 + i, [rank], 1, 1, kv)
                for i, rank in enumerate(placed)
            ]
    highest = max(i["port"] for i in instances)
    if highest > MAX_PORT:
        raise PlanError(
            "port",
            f"port {port} leaves no room for the {len(instances)} backend(s) on the ports "
            f"after it (up to {highest}, above {MAX_PORT})",
            [f"port {MAX_PORT - len(instances)}"],
        )
    load_balancer = {
        "port": port,
        "balance": "leastconn",
        "backends": [i["port"] for i in instances],
    }
    used = sorted({r["node"] for r in placed})
    node_uses = [_node_use(n, placed) for n in nodes if n.id in used]
    reserved = {use["node"]: use["reserved_cpus"] for use in node_uses}
    for instance in instances:
        # The whole service may run on its ranks' CPUs and its nodes' reserved ones (API
        # server, engine core); vLLM then pins each worker's threads to its rank's CPUs.
        threads = {cpu for rank in instance["ranks"] for cpu in rank["cpus"]}
        front = {cpu for node in instance["membind"] for cpu in reserved[node]}
        instance["cpus_allowed"] = sorted(threads | front)
    return {
        "layout": layout,
        "dp_mode": dp_mode,
        "reason": reason,
        "endpoint_port": port,
        "model_gb": request.model_gb,
        "instances": instances,
        "load_balancer": load_balancer,
        "nodes": node_uses,
        "request": asdict(request),
        "hardware_class": hardware_class(topo),
        "build": build_of_host,
    }


def _node_use(node: _Node, placed: list[dict]) -> dict:
    """Which CPUs of a serving node infer and which are left to the OS (IRQs go there)."""
    inference = sorted(core[0] for r in placed if r["node"] == node.id for core in r["cores"])
    serving = {cpu for r in placed if r["node"] == node.id for core in r["cores"] for cpu in core}
    reserved = sorted(cpu for core in node.cores for cpu in core if cpu not in serving)
    return {"node": node.id, "inference_cpus": inference, "reserved_cpus": reserved}


# --- CLI door -------------------------------------------------------------------------

_FLAGS = {
    "layout": "--layout",
    "ranks": "--ranks",
    "model_gb": "--model-gb",
    "reserve_cores": "--reserve-cores",
    "kv_gb": "--kv-gb",
    "concurrency": "--concurrency",
    "crossover": "--crossover",
    "dp_mode": "--dp-mode",
    "topology": "--topology/--root",
    "port": "--port",
    "build_class": "--build-class",
    "layers": "--model-layers",
    "engine": "--engine",
    "stages": "--stages",
    "master_port": "--master-port",
    "rpc_port": "--rpc-port",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="plan where vLLM ranks run on a host (JSON on stdout)",
        description="Plan the vLLM layout for one host from its topology facts.",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--topology",
        type=Path,
        action="append",
        help="topology JSON (from `socketwise topology`); several, one per host with the "
        "head first, plan a cluster (its file names name the hosts)",
    )
    source.add_argument("--root", default=None, help="detect from this root instead (default /)")
    parser.add_argument("--layout", default="auto", help="sn, tp, dp, pp or auto (default auto)")
    parser.add_argument("--ranks", type=int, help="TP or DP ranks (default: one per node)")
    parser.add_argument("--model-gb", type=float, default=0.0, help="weight size in GB")
    parser.add_argument("--reserve-cores", type=int, help="cores per node left to the OS")
    parser.add_argument("--kv-gb", type=int, help="KV cache per rank in GB (default: sized)")
    parser.add_argument("--concurrency", type=float, help="expected concurrent requests")
    parser.add_argument("--crossover", type=float, help="measured SN/DP crossover (concurrency)")
    parser.add_argument(
        "--dp-mode", default="instances", help="instances (behind a LB, default) or vllm"
    )
    parser.add_argument(
        "--split-nodes", action="store_true", help="allow several TP ranks on one node"
    )
    parser.add_argument("--port", type=int, default=8000, help="public port (default 8000)")
    parser.add_argument(
        "--build-class", help="avx2, avx512, amx or zen instead of the detected class"
    )
    cluster = parser.add_argument_group("clusters (several --topology, or --layout pp)")
    cluster.add_argument("--model-layers", type=int, help="the model's layer count")
    cluster.add_argument("--engine", default="vllm", help="vllm (default) or llamacpp")
    cluster.add_argument("--stages", type=int, help="hosts the pipeline uses (default all)")
    cluster.add_argument("--master-port", type=int, default=29501, help="vLLM's, on the head")
    cluster.add_argument("--rpc-port", type=int, default=50052, help="llama.cpp's first RPC port")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.layout == "pp" or len(args.topology or []) > 1:
        return _run_cluster(args)
    try:
        topo = _load_topology(args)
        result = plan(
            topo,
            PlanRequest(
                layout=args.layout,
                ranks=args.ranks,
                model_gb=args.model_gb,
                reserve_cores=args.reserve_cores,
                kv_gb=args.kv_gb,
                concurrency=args.concurrency,
                crossover=args.crossover,
                dp_mode=args.dp_mode,
                split_nodes=args.split_nodes,
                port=args.port,
                build_class=args.build_class,
            ),
        )
    except PlanError as exc:
        source = args.topology[0] if exc.field == "topology" and args.topology else None
        flag = f"--topology {source}" if source else _FLAGS.get(exc.field, exc.field)
        print(f"socketwise plan: error: {flag}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0


def _run_cluster(args: argparse.Namespace) -> int:
    # Imported here: the cluster planner builds on this module's.
    from .cluster import ClusterRequest, plan_hosts

    files = args.topology or []
    try:
        if not files:
            raise PlanError("topology", "a cluster plan reads one --topology file per host")
        if args.model_layers is None:
            raise PlanError("layers", "give the model's layer count (its num_hidden_layers)")
        hosts = []
        for path in files:
            try:
                hosts.append((path.stem, read_topology(path)))
            except PlanError as exc:
                raise PlanError("topology", f"{path}: {exc}") from exc
        result = plan_hosts(
            hosts,
            ClusterRequest(
                model_gb=args.model_gb,
                layers=args.model_layers,
                engine=args.engine,
                stages=args.stages,
                port=args.port,
                master_port=args.master_port,
                rpc_port=args.rpc_port,
                reserve_cores=args.reserve_cores,
                kv_gb=args.kv_gb,
                build_class=args.build_class,
            ),
            args.layout,
        )
    except PlanError as exc:
        print(f"socketwise plan: error: {_FLAGS.get(exc.field, exc.field)}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0


def _load_topology(args: argparse.Namespace) -> dict:
    if args.topology is None:
        try:
            return topology.detect(args.root or "/")
        except topology.TopologyError as exc:
            raise PlanError("topology", str(exc)) from exc
    return read_topology(args.topology[0])


def read_topology(path: Path) -> dict:
    """A saved topology document (`socketwise topology` output), checked as plan() would;
    PlanError("topology", ...) names what is wrong with it."""
    try:
        topo = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError("topology", f"cannot read topology file {path}: {exc}") from exc
    _check_topology(topo)
    return topo
