"""Detect a Linux host's CPU, NUMA, device and kernel-knob topology from /sys and /proc.

`detect(root)` returns one JSON-ready document (schema 1, described by `Topology`);
every later step plans from that document instead of probing the host again.

This file is also shipped to target hosts (as part of the role's module_utils package
`ansible.module_utils.socketwise`), so it imports nothing outside the standard library
but its neighbours `files` (reading sysfs and procfs, CPU lists) and `gpus` (the GPUs),
by relative imports, which Ansible ships with it (an import contract checks it).
The `from __future__` import keeps the annotations below from being evaluated, so
targets whose system Python predates 3.10 can still import it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import TypedDict

from .files import TopologyError, numa_node, parse, parse_cpulist, parse_optional
from .gpus import NVIDIA_DRIVER_GPUS, Gpu, ask_nvidia_smi, captured_nvidia_smi, read_gpus

SCHEMA_VERSION = 1

ISA_FLAGS = (
    "avx2",
    "avx512f",
    "avx512_bf16",
    "avx512_vnni",
    "amx_bf16",
    "amx_int8",
    "amx_tile",
)

# Domains can be wider than four digits (Intel VMD puts devices in 10000:...).
_PCI_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_MEM_TOTAL = re.compile(r"^(?:Node \d+ )?MemTotal:\s*(\d+) kB\s*$", re.MULTILINE)


class CpuInfo(TypedDict):
    vendor: str | None
    model_name: str | None
    family: int | None
    model: int | None


class Socket(TypedDict):
    id: int
    nodes: list[int]
    cores: int


class HugePages(TypedDict):
    total: int
    free: int


class Node(TypedDict):
    id: int
    socket: int | None
    cpus: list[int]
    cores: list[list[int]]
    memory_mb: int
    distances: list[int]
    hugepages: dict[str, HugePages]
    # The last-level caches the node's CPUs share, in KiB (each counted once); None where
    # sysfs does not describe the caches.
    llc_kb: int | None


class Nic(TypedDict):
    name: str
    pci: str | None
    numa_node: int | None


class Kernel(TypedDict):
    numa_balancing: int | None
    thp: str | None
    thp_defrag: str | None
    irqbalance_active: bool | None


class Topology(TypedDict):
    schema: int
    cpu: CpuInfo
    isa: dict[str, bool]
    smt: bool
    memory_mb: int
    sockets: list[Socket]
    nodes: list[Node]
    gpus: list[Gpu]
    nics: list[Nic]
    kernel: Kernel


def detect(root: str | Path = "/", nvidia_smi: dict[str, str] | None = None) -> Topology:
    """Read `root`/sys and `root`/proc and return the schema-1 topology document.

    `root` other than "/" reads a copied or synthetic tree (tests, offline analysis).
    `nvidia_smi` holds what NVIDIA_SMI_QUERY and NVIDIA_SMI_TOPO printed (`query`, `topo`;
    `ask_nvidia_smi()` runs them on a live host); without it, the copies a captured tree
    keeps at CAPTURED_NVIDIA_SMI are read, where they exist.
    Raises TopologyError naming the file when a file that every Linux host has
    is missing or malformed; optional kernel knobs that are absent come back as None.
    """
    sys_dir = Path(root) / "sys"
    proc_dir = Path(root) / "proc"
    cpu, isa = parse(proc_dir / "cpuinfo", _parse_cpuinfo)
    cpu_dir = sys_dir / "devices/system/cpu"
    online = parse(cpu_dir / "online", parse_cpulist)
    package, core_of = _read_cpus(cpu_dir, online)
    memory_mb = parse(proc_dir / "meminfo", _parse_mem_total_mb)
    nodes = _read_nodes(sys_dir, online, package, core_of, memory_mb)
    caches = _read_last_level_caches(cpu_dir, online)
    for node in nodes:
        reached = [kb for cpus, kb in caches.items() if cpus & set(node["cpus"])]
        node["llc_kb"] = sum(reached) if reached else None
    if nvidia_smi is None:
        nvidia_smi = captured_nvidia_smi(Path(root))
    return {
        "schema": SCHEMA_VERSION,
        "cpu": cpu,
        "isa": isa,
        "smt": any(len(core) > 1 for core in core_of.values()),
        "memory_mb": memory_mb,
        "sockets": _sockets(nodes, package, core_of),
        "nodes": nodes,
        "gpus": read_gpus(
            sys_dir / "bus/pci/devices", online, nodes, nvidia_smi, proc_dir / NVIDIA_DRIVER_GPUS
        ),
        "nics": _read_nics(sys_dir / "class/net"),
        "kernel": _read_kernel(sys_dir, proc_dir),
    }


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `topology` subcommand to the socketwise CLI."""
    parser = subparsers.add_parser(
        "topology",
        help="print this host's CPU/NUMA topology as JSON",
        description="Print the CPU, NUMA, GPU, NIC and kernel-knob topology as JSON (schema 1).",
    )
    parser.add_argument(
        "--root",
        default="/",
        metavar="DIR",
        help="read DIR/sys and DIR/proc instead of the live host's (default: /)",
    )
    parser.set_defaults(func=_run)


def detect_here(root: str | Path = "/") -> Topology:
    """detect(), with nvidia-smi asked on the live host (root "/"): what the CLI and the
    Ansible module both return."""
    return detect(root, ask_nvidia_smi() if Path(root).resolve() == Path("/") else None)


def _run(args: argparse.Namespace) -> int:
    try:
        topology = detect_here(args.root)
    except TopologyError as err:
        print(f"socketwise topology: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(topology, indent=2))
    return 0


def _parse_cpuinfo(text: str) -> tuple[CpuInfo, dict[str, bool]]:
    # Every processor block repeats the same identity and flags; the first speaks for all.
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, colon, value = line.partition(":")
        if not colon:
            raise ValueError(f"line without 'key: value': {line!r}")
        fields[key.strip()] = value.strip()
    if not fields:
        raise ValueError("no processor entries")
    flags = set(fields.get("flags", "").split())
    # Non-x86 kernels name these fields differently; such hosts get nulls, not an error.
    cpu: CpuInfo = {
        "vendor": fields.get("vendor_id"),
        "model_name": fields.get("model name"),
        "family": int(fields["cpu family"]) if "cpu family" in fields else None,
        "model": int(fields["model"]) if "model" in fields else None,
    }
    return cpu, {flag: flag in flags for flag in ISA_FLAGS}


def _parse_mem_total_mb(text: str) -> int:
    match = _MEM_TOTAL.search(text)
    if match is None:
        raise ValueError("no 'MemTotal: <n> kB' line")
    return int(match[1]) // 1024


def _parse_distances(text: str) -> list[int]:
    distances = [int(field) for field in text.split()]
    if not distances:
        raise ValueError("empty distance row")
    return distances


def _parse_bracketed(text: str) -> str:
    match = re.search(r"\[([^\]]+)\]", text)
    if match is None:
        raise ValueError(f"no [selected] mode in {text.strip()!r}")
    return match[1]


def _read_cpus(
    cpu_dir: Path, online: list[int]
) -> tuple[dict[int, int], dict[int, tuple[int, ...]]]:
    """Map each online CPU to its socket and to its physical core (the core's online CPUs)."""
    online_set = set(online)
    package: dict[int, int] = {}
    core_of: dict[int, tuple[int, ...]] = {}
    for cpu in online:
        topology_dir = cpu_dir / f"cpu{cpu}/topology"
        package[cpu] = parse(topology_dir / "physical_package_id", int)
        # core_id repeats across sockets and dies, so a core is identified by its
        # sibling set instead; offline siblings are not part of the usable core.
        siblings = parse(topology_dir / "thread_siblings_list", parse_cpulist)
        core_of[cpu] = tuple(sorted(online_set.intersection(siblings) | {cpu}))
    return package, core_of


def _read_last_level_caches(cpu_dir: Path, online: list[int]) -> dict[frozenset[int], int]:
    """Each last-level cache (its CPUs -> its KiB): the highest-level data or unified cache
    sysfs lists for each online CPU; empty where sysfs lists none."""
    caches: dict[frozenset[int], int] = {}
    for cpu in online:
        best: tuple[int, frozenset[int], int] | None = None
        for index in sorted((cpu_dir / f"cpu{cpu}/cache").glob("index*")):
            try:
                if (index / "type").read_text().strip() == "Instruction":
                    continue
                level = int((index / "level").read_text())
                # The kernel writes the size in KiB: "32768K".
                kb = int((index / "size").read_text().strip().removesuffix("K"))
                shared = frozenset(parse_cpulist((index / "shared_cpu_list").read_text()))
            except (OSError, ValueError):
                continue
            if kb > 0 and (best is None or level > best[0]):
                best = (level, shared, kb)
        if best is not None:
            caches[best[1]] = best[2]
    return caches


def _read_nodes(
    sys_dir: Path,
    online: list[int],
    package: dict[int, int],
    core_of: dict[int, tuple[int, ...]],
    memory_mb: int,
) -> list[Node]:
    node_root = sys_dir / "devices/system/node"
    if not node_root.is_dir():
        # A kernel built without CONFIG_NUMA has no node directory: all of the
        # machine is one node, with the global hugepage pools.
        hugepages = _read_hugepages(sys_dir / "kernel/mm/hugepages")
        return [_node(0, online, package, core_of, memory_mb, [10], hugepages)]
    online_set = set(online)
    nodes = []
    for node_dir in node_root.iterdir():
        match = re.fullmatch(r"node(\d+)", node_dir.name)
        if match is None:
            continue
        # Some architectures keep offline CPUs in the node's cpulist.
        cpus = sorted(online_set.intersection(parse(node_dir / "cpulist", parse_cpulist)))
        nodes.append(
            _node(
                int(match[1]),
                cpus,
                package,
                core_of,
                parse(node_dir / "meminfo", _parse_mem_total_mb),
                parse(node_dir / "distance", _parse_distances),
                _read_hugepages(node_dir / "hugepages"),
            )
        )
    return sorted(nodes, key=lambda node: node["id"])


def _node(
    node_id: int,
    cpus: list[int],
    package: dict[int, int],
    core_of: dict[int, tuple[int, ...]],
    memory_mb: int,
    distances: list[int],
    hugepages: dict[str, HugePages],
) -> Node:
    in_node = set(cpus)
    cores = sorted({tuple(cpu for cpu in core_of[first] if cpu in in_node) for first in cpus})
    # A VM whose vNUMA layout disagrees with its vCPU sockets can put several
    # sockets in one node; the lowest one stands for the node then. Memory-only
    # nodes (CXL, HBM, PMEM) have no socket.
    sockets = {package[cpu] for cpu in cpus}
    return {
        "id": node_id,
        "socket": min(sockets) if sockets else None,
        "cpus": cpus,
        "cores": [list(core) for core in cores],
        "memory_mb": memory_mb,
        "distances": distances,
        "hugepages": hugepages,
        "llc_kb": None,
    }


def _read_hugepages(pools_dir: Path) -> dict[str, HugePages]:
    if not pools_dir.is_dir():
        return {}
    sizes = {pool.name.removeprefix("hugepages-"): pool for pool in pools_dir.glob("hugepages-*")}
    return {
        size: {
            "total": parse(sizes[size] / "nr_hugepages", int),
            "free": parse(sizes[size] / "free_hugepages", int),
        }
        # Pools are named "<n>kB"; shorter names are smaller pages.
        for size in sorted(sizes, key=lambda size: (len(size), size))
    }


def _sockets(
    nodes: list[Node], package: dict[int, int], core_of: dict[int, tuple[int, ...]]
) -> list[Socket]:
    cores: dict[int, set[tuple[int, ...]]] = {}
    for cpu, socket in package.items():
        cores.setdefault(socket, set()).add(core_of[cpu])
    nodes_of: dict[int, set[int]] = {}
    for node in nodes:
        for cpu in node["cpus"]:
            nodes_of.setdefault(package[cpu], set()).add(node["id"])
    return [
        {"id": socket, "nodes": sorted(nodes_of.get(socket, ())), "cores": len(cores[socket])}
        for socket in sorted(cores)
    ]


def _read_nics(net_dir: Path) -> list[Nic]:
    """Network interfaces backed by a device; virtual ones (lo, bridges, veth,
    bonds, VLANs, ifb) have no `device` link and are left out."""
    if not net_dir.is_dir():
        return []
    nics: list[Nic] = []
    for interface in sorted(net_dir.iterdir()):
        device = interface / "device"
        if not device.exists():
            continue
        # The device may be a child of the PCI function (virtio NICs are virtioN
        # under it), and the function may sit below bridges: the nearest
        # PCI-address component of the resolved path is the NIC's own function.
        resolved = device.resolve()
        function = next(
            (path for path in (resolved, *resolved.parents) if _PCI_ADDRESS.fullmatch(path.name)),
            None,
        )
        nics.append(
            {
                "name": interface.name,
                "pci": function.name if function else None,
                "numa_node": numa_node(function) if function else None,
            }
        )
    return nics


def _read_kernel(sys_dir: Path, proc_dir: Path) -> Kernel:
    thp_dir = sys_dir / "kernel/mm/transparent_hugepage"
    return {
        "numa_balancing": parse_optional(proc_dir / "sys/kernel/numa_balancing", int),
        "thp": parse_optional(thp_dir / "enabled", _parse_bracketed),
        "thp_defrag": parse_optional(thp_dir / "defrag", _parse_bracketed),
        "irqbalance_active": _irqbalance_active(proc_dir),
    }


def _irqbalance_active(proc_dir: Path) -> bool | None:
    # PID 1 always exists; if its comm cannot be read, /proc is not a readable
    # process table here (hidepid=, a bare tree) and the answer is unknowable.
    # Inside a container's PID namespace only the container's processes show up,
    # so the answer there speaks for the container, not the host.
    if parse_optional(proc_dir / "1/comm", str) is None:
        return None
    for entry in proc_dir.iterdir():
        # A process may exit between listing and reading; that is not an error.
        if entry.name.isdigit() and parse_optional(entry / "comm", str.strip) == "irqbalance":
            return True
    return False
