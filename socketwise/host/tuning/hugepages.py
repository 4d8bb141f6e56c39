"""Hugepages on each serving NUMA node: 2 MB pools written at run time, 1 GB pools reserved at
boot from the kernel command line. A request a node cannot spare after the plan's weights,
KV cache and OS reserve is refused on the controller."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from ...plan.nodes import os_reserve_gb
from .base import GIB_KB, REBOOT_REQUIRED, SHORT, FileKind, Host, Knob, TuningError, Unavailable

# What host_tuning_hugepages_size accepts, as the kernel names the pools.
HUGEPAGE_SIZES_KB = {"2M": 2048, "1G": 1048576}


def knobs(
    nodes: dict[int, dict],
    serving: dict[int, dict],
    plan: dict,
    size: str,
    per_node: int | None,
    gb_per_node: float | None,
) -> list[Knob]:
    """Pages on each node that serves, never on the others: memory on a node that runs no
    rank is not where the model's pages will be."""
    size_kb = HUGEPAGE_SIZES_KB[size]
    if per_node is not None:
        pages: int | None = per_node
        variable = "hugepages_per_node"
    elif gb_per_node is not None:
        pages = math.ceil(gb_per_node * GIB_KB / size_kb)
        variable = "hugepages_gb_per_node"
    else:
        pages, variable = None, ""
    planned: list[Knob] = []
    for node in sorted(serving):
        if pages:
            _check_room(nodes[node], plan, size_kb, pages, variable)
        planned.append(
            {
                "name": f"hugepages.node{node}.{size_kb}kB",
                "kind": "hugepages",
                "node": node,
                "size_kb": size_kb,
                "desired": pages,
            }
        )
    return planned


def _check_room(node: dict, plan: dict, size_kb: int, pages: int, variable: str) -> None:
    node_id = int(node["id"])
    node_gb = node["memory_mb"] / 1024
    weights = kv = 0.0
    for instance in plan["instances"]:
        for rank in instance["ranks"]:
            if rank["node"] == node_id:
                weights += plan["model_gb"] / instance["tp"]
                kv += instance["kvcache_gb"]
    # Pools of the other page size hold memory too.
    other_gb = sum(
        int(size[: -len("kB")]) * pool["total"] / GIB_KB
        for size, pool in node.get("hugepages", {}).items()
        if size != f"{size_kb}kB"
    )
    reserve = os_reserve_gb(node_gb)
    spare = node_gb - reserve - weights - kv - other_gb
    most = max(0, math.floor(spare * GIB_KB / size_kb))
    if pages <= most:
        return
    wanted = pages * size_kb / GIB_KB
    if variable == "hugepages_per_node":
        asked, fix = f"{pages} pages ({wanted:.1f} GB)", f"{most}"
    else:
        asked, fix = f"{wanted:.4g} GB", f"{math.floor(most * size_kb / GIB_KB * 10) / 10:g}"
    other = f", other hugepages {other_gb:g} GB" if other_gb else ""
    raise TuningError(
        variable,
        f"node {node_id} can spare {max(spare, 0):.1f} GB for hugepages, not {asked} "
        f"(its {node_gb:g} GB less the plan's model weights {weights:g} GB, KV cache {kv:g} GB, "
        f"OS reserve {reserve:.1f} GB{other}); set host_tuning_{variable} to at most {fix}, "
        "or lower plan_kv_gb",
    )


class HugePages(FileKind):
    def path(self, host: Host, knob: Knob) -> str:
        pool = f"hugepages/hugepages-{knob['size_kb']}kB/nr_hugepages"
        # A kernel without CONFIG_NUMA has only the global pools; topology calls it node 0.
        if knob["node"] == 0 and not host.exists("sys/devices/system/node"):
            return f"sys/kernel/mm/{pool}"
        return f"sys/devices/system/node/node{knob['node']}/{pool}"

    def missing(self, knob: Knob) -> str:
        return f"no {knob['size_kb']}kB hugepage pool on node {knob['node']}"

    def check(self, host: Host, knob: Knob, current: Any) -> None:
        if knob["size_kb"] == HUGEPAGE_SIZES_KB["1G"]:
            # 1 GB pages are reserved at boot, from the kernel command line.
            if not host.exists("usr/sbin/update-grub"):
                raise Unavailable(
                    "no update-grub to put 1 GB pages on the kernel command line: add "
                    f"'{kernel_args([knob])}' to it yourself"
                )
            return
        super().check(host, knob, current)

    def boot_only(self, knob: Knob) -> bool:
        return is_one_gb(knob)

    def shortfall(self, host: Host, knob: Knob, after: Any) -> tuple[str, str]:
        if not is_one_gb(knob):
            return SHORT, _short_reason(knob, after, "now")
        if _booted_with(host, knob):
            return SHORT, _short_reason(knob, after, "at boot")
        return REBOOT_REQUIRED, f"'{kernel_args([knob])}' takes effect at the next boot"


def kernel_args(knobs: Iterable[Knob]) -> str:
    """The kernel command line that reserves the knobs' 1 GB pages at boot, per node."""
    per_node = ",".join(f"{k['node']}:{k['desired']}" for k in knobs)
    return f"hugepagesz=1G hugepages={per_node}"


def is_one_gb(knob: Knob) -> bool:
    return knob["kind"] == "hugepages" and knob["size_kb"] == HUGEPAGE_SIZES_KB["1G"]


def _booted_with(host: Host, knob: Knob) -> bool:
    """Whether the running kernel's command line asked for this node's 1 GB pages."""
    words = host.read("proc/cmdline", "").split()
    # Index pairs, not zip(): zip(strict=) is 3.10+, and targets may run an older Python.
    for index in range(len(words) - 1):
        size, pages = words[index], words[index + 1]
        if size == "hugepagesz=1G" and pages.startswith("hugepages="):
            return f"{knob['node']}:{knob['desired']}" in pages.split("=", 1)[1].split(",")
    return False


def _short_reason(knob: Knob, after: Any, when: str) -> str:
    return (
        f"the kernel found {after} of {knob['desired']} free {knob['size_kb']}kB pages on node "
        f"{knob['node']} {when} (memory fragmented or in use: reserve them at boot, or reboot)"
    )
