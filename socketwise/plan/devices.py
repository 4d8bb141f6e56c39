"""The host's GPUs as the GPU planners (`gpu`, `hybrid`) read them from the topology: the
vendor a plan serves on, each GPU's memory, node and links, the numbers the driver and
CUDA give them, and GPU instances finished into the plan's shape.

Plain Python with no Ansible import.
"""

from __future__ import annotations

from dataclasses import dataclass

from .nodes import PlanError, malformed
from .shape import PlanRequest, instance_port, threads_bind

# vLLM's share of a GPU's memory (its --gpu-memory-utilization default), and the least of
# it the KV cache keeps for a group of GPUs to count as holding the model.
GPU_MEMORY_UTILIZATION = 0.9
KV_FLOOR = 0.1


@dataclass(frozen=True)
class Gpu:
    pci: str
    vendor: str
    node: int | None
    gb: float
    name: str
    links: dict[str, str | None]
    minor: int | None = None


# The vendor a host's plan serves on where it has GPUs of several: NVIDIA's, AMD's, then
# Intel's (its display devices sit on boards beside other makers' cards).
VENDOR_ORDER = ["nvidia", "amd", "intel"]


def serving_gpus(topo: dict, request: PlanRequest) -> list[Gpu]:
    """The topology's GPUs of the vendor the plan serves on (VENDOR_ORDER's first the host
    has), each with its memory in GiB (gpu_memory_gb where unknown)."""
    entries = topo.get("gpus", [])
    # One build serves one vendor's GPUs: a host's own display device of another maker
    # (an Intel GPU on the board beside NVIDIA cards) is left out, unasked for its memory.
    ranked = sorted({str(entry.get("vendor")) for entry in entries}, key=_vendor_rank)
    gpus = []
    for i, entry in enumerate(entries):
        where = f"gpus[{i}]"
        if str(entry.get("vendor")) != ranked[0]:
            continue
        if not isinstance(entry.get("pci"), str):
            raise malformed(f"{where}.pci", "must be the GPU's PCI address")
        node, memory = entry.get("numa_node"), entry.get("memory_mb")
        if node is not None and not (isinstance(node, int) and node >= 0):
            raise malformed(f"{where}.numa_node", f"is {node!r}, not a node number or null")
        if memory is not None and not (isinstance(memory, int | float) and memory > 0):
            raise malformed(f"{where}.memory_mb", f"is {memory!r}, not a number of MB or null")
        links = entry.get("links") or {}
        if not isinstance(links, dict):
            raise malformed(f"{where}.links", "must be an object of PCI address -> path")
        if memory is None and request.gpu_memory_gb is None:
            raise PlanError(
                "gpu_memory_gb",
                f"GPU {entry['pci']} has no memory size in the topology (nvidia-smi was not "
                "there to ask, or the tree kept no answer of it): give every GPU's memory",
            )
        gb = memory / 1024 if memory is not None else request.gpu_memory_gb
        minor = entry.get("minor")
        if minor is not None and not (isinstance(minor, int) and minor >= 0):
            raise malformed(f"{where}.minor", f"is {minor!r}, not a device minor or null")
        name = entry.get("name") or ""
        gpus.append(Gpu(entry["pci"], str(entry.get("vendor")), node, gb, name, links, minor))
    if not gpus:
        raise PlanError("device", "the topology has no GPU to plan on", ["device cpu"])
    return sorted(gpus, key=lambda gpu: gpu.pci)


def _vendor_rank(vendor: str) -> int:
    return VENDOR_ORDER.index(vendor) if vendor in VENDOR_ORDER else len(VENDOR_ORDER)


def minors(group: list[Gpu] | tuple[Gpu, ...], numbered: dict[str, int]) -> list[int]:
    """The GROUP's device minors: the driver's, else the PCI-order number (NUMBERED) the
    driver gives them where it probes in bus order."""
    return [numbered[gpu.pci] if gpu.minor is None else gpu.minor for gpu in group]


def indices(gpus: list[Gpu]) -> dict[str, int]:
    """Each GPU's index in PCI bus order among the host's GPUs of its vendor."""
    seen: dict[str, int] = {}
    numbered = {}
    for gpu in gpus:
        numbered[gpu.pci] = seen.get(gpu.vendor, 0)
        seen[gpu.vendor] = numbered[gpu.pci] + 1
    return numbered


def finish_instances(instances: list[dict], names: list[str], port: int) -> list[dict]:
    """GPU instances named, on the ports after the front door's, with their ranks' bind
    string and CPUs, in the CPU plan's key order (the GPU keys after)."""
    finished = []
    for position, (name, instance) in enumerate(zip(names, instances, strict=True)):
        cpus = sorted(cpu for rank in instance["ranks"] for cpu in rank["cpus"])
        finished.append(
            {"name": name, "port": instance_port(port, position), "tp": instance["tp"],
             "data_parallel": instance["data_parallel"], "ranks": instance["ranks"],
             "omp_threads_bind": threads_bind(instance["ranks"])}
            | instance
            | {"cpus_allowed": cpus}
        )  # fmt: skip
    return finished
