"""Hardware classes: hosts a fleet can treat alike, derived from their topology facts.

Plain Python with no Ansible import; the planner adds the class to every plan.

A class is what the planner reads: CPU vendor and model, sockets, NUMA nodes with their
physical cores and memory, SMT, and the ISA class that decides the vLLM build. Two hosts
of one class get the same plan shape from the same request. Memory is rounded to
MEMORY_STEP_GB so the firmware's few reserved megabytes do not split identical servers.

ISA classes (vLLM's x86 CPU builds):
- `amx`: AMX tiles (Sapphire Rapids and later);
- `zen`: AMD with AVX-512 (Zen 4, Zen 5), where AMD's ZenTorch helps;
- `avx512`: AVX-512 without AMX (Skylake-SP to Ice Lake);
- `avx2`: AVX2 only (Broadwell, Zen 2/3), vLLM's floor;
- `none`: below that; vLLM cannot run there.
"""

from __future__ import annotations

import hashlib
import json
import re

MEMORY_STEP_GB = 8
ISA_CLASSES = ("amx", "zen", "avx512", "avx2", "none")
_VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}


def isa_class(topo: dict) -> str:
    """The vLLM build class of the host's CPU (see the module's docstring)."""
    isa = topo.get("isa") or {}
    if isa.get("amx_tile") and isa.get("amx_bf16"):
        return "amx"
    if isa.get("avx512f"):
        return "zen" if (topo.get("cpu") or {}).get("vendor") == "AuthenticAMD" else "avx512"
    return "avx2" if isa.get("avx2") else "none"


def _rounded_gb(memory_mb: float) -> int:
    return int(round(memory_mb / 1024 / MEMORY_STEP_GB) * MEMORY_STEP_GB)


def hardware_class(topo: dict) -> dict:
    """{"id", "cpu_model", "sockets", "nodes", "smt", "memory_gb", "isa"} of the host.

    `nodes` lists each NUMA node's physical cores and memory (GB, rounded), memory-only
    nodes included. `id` reads as vendor-sockets-nodes-cores-memory-isa, then a short
    hash of everything (the CPU model too), so two classes never share an id.
    """
    cpu = topo.get("cpu") or {}
    nodes = [
        {"cores": len(node["cores"]), "memory_gb": _rounded_gb(node["memory_mb"])}
        for node in sorted(topo["nodes"], key=lambda n: n["id"])
    ]
    described = {
        "cpu_model": " ".join((cpu.get("model_name") or "unknown").split()),
        "sockets": len(topo.get("sockets") or []) or 1,
        "nodes": nodes,
        "smt": bool(topo.get("smt")),
        "memory_gb": _rounded_gb(sum(node["memory_mb"] for node in topo["nodes"])),
        "isa": isa_class(topo),
    }
    digest = hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:6]
    vendor = _VENDORS.get(cpu.get("vendor") or "", "cpu")
    cores = sum(node["cores"] for node in nodes)
    readable = (
        f"{vendor}-{described['sockets']}s{len(nodes)}n-{cores}c-"
        f"{described['memory_gb']}g-{described['isa']}"
    )
    return {"id": f"{re.sub(r'[^a-z0-9-]', '', readable)}-{digest}", **described}
