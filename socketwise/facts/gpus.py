"""A host's GPUs for its topology: display controllers and accelerators of the makers vLLM
drives, from sysfs, with what NVIDIA's driver and nvidia-smi tell of them (name, memory,
the paths between them, the device minor).

Shipped to hosts with the topology (`ansible.module_utils.socketwise`): the standard
library only.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypedDict

from .files import TopologyError, numa_node, parse, parse_cpulist, parse_optional, read

# NVIDIA's driver's own description of each GPU (its device minor), by PCI address.
NVIDIA_DRIVER_GPUS = "driver/nvidia/gpus"

# PCI vendor ids of the GPU makers vLLM can drive, as sysfs spells them.
GPU_VENDORS = {"0x10de": "nvidia", "0x1002": "amd", "0x8086": "intel"}
# The paths between two GPUs that `nvidia-smi topo -m` names (its legend).
_LINK_KIND = re.compile(r"NV\d+|PIX|PXB|PHB|NODE|SYS")

# What nvidia-smi tells about NVIDIA GPUs that sysfs does not (name, memory, links). A live
# host's answers come from running it; a captured tree keeps them, as these commands
# printed them, under CAPTURED_NVIDIA_SMI below its root.
NVIDIA_SMI_QUERY = (
    "nvidia-smi",
    "--query-gpu=pci.bus_id,name,memory.total",
    "--format=csv,noheader,nounits",
)
NVIDIA_SMI_TOPO = ("nvidia-smi", "topo", "-m")
CAPTURED_NVIDIA_SMI = {
    "query": "socketwise/nvidia-smi-query.csv",
    "topo": "socketwise/nvidia-smi-topo.txt",
}


class Gpu(TypedDict):
    pci: str
    vendor: str
    numa_node: int | None
    local_cpus: list[int] | None
    memory_mb: int | None
    name: str | None
    # Each other GPU's PCI address -> the path to it (`nvidia-smi topo -m`'s NV#, PIX, PXB,
    # PHB, NODE, SYS); None where nvidia-smi did not say.
    links: dict[str, str | None] | None
    # NVIDIA's device minor (/dev/nvidiaN), from /proc/driver/nvidia/gpus/PCI/information.
    minor: int | None


def ask_nvidia_smi() -> dict[str, str] | None:
    """What NVIDIA_SMI_QUERY and NVIDIA_SMI_TOPO print on this host, or None where
    nvidia-smi is not installed or cannot answer (no driver loaded): detect() then leaves
    the NVIDIA figures null."""
    if shutil.which(NVIDIA_SMI_QUERY[0]) is None:
        return None
    answers = {}
    for name, command in (("query", NVIDIA_SMI_QUERY), ("topo", NVIDIA_SMI_TOPO)):
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        answers[name] = done.stdout
    return answers


def read_gpus(
    pci_dir: Path,
    online: list[int],
    nodes: Sequence[Mapping],
    nvidia_smi: dict[str, str] | None,
    driver_dir: Path,
) -> list[Gpu]:
    """GPUs: display controllers (class 0x03xxxx) from NVIDIA, AMD and Intel, plus
    NVIDIA and AMD processing accelerators (0x1200xx: AMD Instinct MI300 reports
    itself that way; Intel's 0x1200 devices are client NPUs, not GPUs)."""
    if not pci_dir.is_dir():
        return []
    told = _nvidia_figures(nvidia_smi)
    gpus: list[Gpu] = []
    for device in sorted(pci_dir.iterdir()):
        vendor = GPU_VENDORS.get(read(device / "vendor").strip())
        if vendor is None:
            continue
        pci_class = parse(device / "class", lambda text: int(text, 16))
        accelerator = pci_class >> 8 == 0x1200 and vendor != "intel"
        if pci_class >> 16 != 0x03 and not accelerator:
            continue
        local = parse_optional(device / "local_cpulist", parse_cpulist)
        local_cpus = None if local is None else sorted(set(local).intersection(online))
        # amdgpu's own files; NVIDIA's driver has none, nvidia-smi says instead.
        vram = parse_optional(device / "mem_info_vram_total", int)
        product = parse_optional(device / "product_name", str.strip)
        figures = told.get(device.name, {})
        node = numa_node(device)
        gpus.append(
            {
                "pci": device.name,
                "vendor": vendor,
                "numa_node": _node_holding(local_cpus, nodes) if node is None else node,
                "local_cpus": local_cpus,
                "memory_mb": figures.get("memory_mb", vram // 2**20 if vram else None),
                "name": figures.get("name", product or None),
                "links": figures.get("links"),
                "minor": _nvidia_minor(driver_dir / device.name) if vendor == "nvidia" else None,
            }
        )
    return gpus


def _nvidia_minor(device_dir: Path) -> int | None:
    """The GPU's device minor (its node is /dev/nvidiaN) from NVIDIA's driver, or None
    where the driver is not loaded or says none."""
    text = parse_optional(device_dir / "information", str)
    found = re.search(r"^Device Minor:\s*(\d+)\s*$", text or "", re.MULTILINE)
    return int(found[1]) if found else None


def _node_holding(cpus: list[int] | None, nodes: Sequence[Mapping]) -> int | None:
    """The one node whose CPUs include all of `cpus` (a device's local CPUs, where the
    firmware gave no node), or None: no CPUs, or CPUs of several nodes."""
    holding = [node["id"] for node in nodes if cpus and set(cpus) <= set(node["cpus"])]
    return holding[0] if len(holding) == 1 else None


def captured_nvidia_smi(root: Path) -> dict[str, str] | None:
    captured = {name: root / path for name, path in CAPTURED_NVIDIA_SMI.items()}
    if not captured["query"].exists():
        return None
    return {name: read(path) for name, path in captured.items() if path.exists()}


def _sysfs_address(bus_id: str) -> str:
    """nvidia-smi's "00000000:CA:00.0" as sysfs spells it: "0000:ca:00.0"."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    if not rest:
        raise ValueError(f"PCI bus id {bus_id.strip()!r} has no domain")
    return f"{int(domain, 16):04x}:{rest}"


def _nvidia_figures(answers: dict[str, str] | None) -> dict[str, dict]:
    """PCI address -> name, memory_mb and links, from nvidia-smi's answers (CSV rows of
    NVIDIA_SMI_QUERY, in nvidia-smi's own order, which `topo -m` numbers GPU0, GPU1...)."""
    if not answers:
        return {}
    figures: dict[str, dict] = {}
    order: list[str] = []
    for row in answers.get("query", "").splitlines():
        if not row.strip():
            continue
        fields = [field.strip() for field in row.split(",")]
        if len(fields) < 3:
            raise TopologyError(f"nvidia-smi's answer {row!r}: not pci.bus_id, name, memory.total")
        try:
            address = _sysfs_address(fields[0])
            memory = int(fields[-1]) if fields[-1].isdigit() else None
        except ValueError as err:
            raise TopologyError(f"nvidia-smi's answer {row!r}: {err}") from err
        order.append(address)
        figures[address] = {"name": ",".join(fields[1:-1]) or None, "memory_mb": memory}
    for address, links in _nvidia_links(answers.get("topo", ""), order).items():
        figures[address]["links"] = links
    return figures


def _nvidia_links(matrix: str, order: list[str]) -> dict[str, dict[str, str | None]]:
    """`nvidia-smi topo -m`'s GPU rows: each GPU's path to every other one, by address."""
    links: dict[str, dict[str, str | None]] = {}
    for line in matrix.splitlines():
        match = re.match(r"GPU(\d+)\s", line)
        if match is None or int(match[1]) >= len(order):
            continue
        # The row's first columns are the GPUs, in the header's order; NIC and affinity
        # columns follow.
        cells = line.split()[1 : len(order) + 1]
        row = order[int(match[1])]
        links[row] = {
            peer: cell if _LINK_KIND.fullmatch(cell) else None
            for peer, cell in zip(order, cells, strict=False)
            if peer != row
        }
    return links
