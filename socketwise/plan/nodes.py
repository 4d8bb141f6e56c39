"""What a host is to the planners: a checked topology document and its NUMA nodes with CPUs.

Plain Python with no Ansible import, shared by the host planner (`planner`) and the cluster
planner (`cluster`), which builds on it. A topology document (schema 1, `socketwise
topology`'s output) is checked here once, whichever door it comes through (a saved file,
the role's facts, live detection), and every key the planners read is named where it is
not what they need.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..facts.files import format_cpulist  # relative: shipped to hosts with host.tuning


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
class Node:
    id: int
    gb: float
    cores: list[list[int]]  # online logical CPUs of each physical core
    distances: dict[int, int]  # node id -> NUMA distance from this node
    llc_kb: int | None = None  # the last-level caches its CPUs reach; None: unknown


def default_reserve_cores(core_count: int) -> int:
    if core_count >= 8:
        return 2
    if core_count >= 4:
        return 1
    return 0


def os_reserve_gb(node_gb: float) -> float:
    return max(1.0, 0.1 * node_gb)


def reserve_for(node: Node, reserve_cores: int | None) -> int:
    """The physical cores NODE keeps for the OS: RESERVE_CORES, else the default."""
    count = len(node.cores)
    if reserve_cores is None:
        return default_reserve_cores(count)
    if reserve_cores < 0:
        raise PlanError("reserve_cores", f"reserve cores {reserve_cores} is negative")
    if reserve_cores >= count:
        raise PlanError(
            "reserve_cores",
            f"reserve cores {reserve_cores} >= the {count} physical cores of node "
            f"{node.id}: nothing would be left for inference",
            [f"reserve cores {k}" for k in range(min(count, 3))],
        )
    return reserve_cores


def malformed(where: str, what: str) -> PlanError:
    return PlanError(
        "topology",
        f"malformed topology: {where} {what}; give the document `socketwise topology` "
        "prints (schema 1, docs/reference/topology-schema.md)",
    )


def _shown(value: object) -> str:
    """VALUE as the JSON document spells it (null, "0-3", ["avx2"]), cut short."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_node(where: str, node: object) -> None:
    if not isinstance(node, dict):
        raise malformed(where, "is not an object")
    if not _whole(node.get("id")) or node["id"] < 0:
        raise malformed(f"{where}.id", f"is {node.get('id')!r}, not a node number")
    if not _number(node.get("memory_mb")) or node["memory_mb"] < 0:
        raise malformed(f"{where}.memory_mb", "must be a number of MB >= 0")
    # Optional (hand-written documents may leave it out); where given, the cores must
    # agree with it.
    cpus = node.get("cpus")
    if "cpus" in node and not (isinstance(cpus, list) and all(_whole(c) and c >= 0 for c in cpus)):
        raise malformed(
            f"{where}.cpus",
            f"is {_shown(cpus)}, not a list of CPU numbers (such as [0, 1, 2, 3])",
        )
    cores = node.get("cores")
    if not isinstance(cores, list):
        raise malformed(f"{where}.cores", "must be a list of cores (lists of CPUs)")
    for j, core in enumerate(cores):
        if not isinstance(core, list) or not core or not all(_whole(c) for c in core):
            raise malformed(f"{where}.cores[{j}]", "must be a non-empty list of CPU numbers")
        foreign = [c for c in core if cpus is not None and c not in cpus]
        if foreign:
            raise malformed(
                f"{where}.cores[{j}]",
                f"is {_shown(core)}, with CPU {foreign[0]} that {where}.cpus "
                f"({format_cpulist(cpus) or 'none'}) does not have: a core lists only its "
                "node's CPUs",
            )
    distances = node.get("distances", [])
    if not isinstance(distances, list) or not all(_number(d) for d in distances):
        raise malformed(f"{where}.distances", "must be a list of numbers")
    llc = node.get("llc_kb")
    if llc is not None and not (_whole(llc) and llc > 0):
        raise malformed(f"{where}.llc_kb", f"is {_shown(llc)}, not a size in KiB > 0 or null")


def check_topology(topo: object) -> None:
    """The keys the planners read, each of the type they need, named where one is not."""
    if not isinstance(topo, dict):
        raise malformed("the document", "is not a JSON object")
    if topo.get("schema") != 1:
        raise malformed("schema", f"is {topo.get('schema')!r}, not 1")
    nodes = topo.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise malformed("nodes", "must be a non-empty list")
    for i, node in enumerate(nodes):
        _check_node(f"nodes[{i}]", node)
    if len({node["id"] for node in nodes}) != len(nodes):
        raise malformed("nodes", "repeat a node id")
    gpus = topo.get("gpus", [])
    if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus):
        raise malformed("gpus", "must be a list of objects")
    # What the hardware class and the build read; each optional, none may be null.
    sockets = topo.get("sockets", [])
    if not isinstance(sockets, list) or not all(isinstance(s, dict) for s in sockets):
        raise malformed("sockets", f"is {_shown(sockets)}, not a list of sockets (objects)")
    isa = topo.get("isa", {})
    if not isinstance(isa, dict) or not all(isinstance(v, bool) for v in isa.values()):
        raise malformed(
            "isa", f'is {_shown(isa)}, not an object of flags (such as {{"avx2": true}})'
        )
    cpu = topo.get("cpu", {})
    if not isinstance(cpu, dict):
        raise malformed("cpu", f'is {_shown(cpu)}, not an object (such as {{"vendor": ...}})')


def read_topology(path: Path) -> dict:
    """A saved topology document (`socketwise topology` output), checked as plan() would;
    PlanError("topology", ...) names what is wrong with it."""
    try:
        topo = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError("topology", f"cannot read topology file {path}: {exc}") from exc
    check_topology(topo)
    return topo


def cpu_nodes(topo: dict) -> list[Node]:
    """The checked document's NUMA nodes that have online CPUs (memory-only ones left out)."""
    check_topology(topo)
    ids = sorted(n["id"] for n in topo["nodes"])
    nodes = [
        Node(
            n["id"],
            n["memory_mb"] / 1024,
            [list(c) for c in n["cores"]],
            # A node's row of the distance matrix, in node id order.
            dict(zip(ids, n.get("distances", []), strict=False)),
            n.get("llc_kb"),
        )
        for n in topo["nodes"]
    ]
    with_cpus = [n for n in nodes if n.cores]
    if not with_cpus:
        raise PlanError("topology", "topology has no NUMA node with online CPUs")
    return with_cpus
