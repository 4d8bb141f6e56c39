"""Host tuning for vLLM on CPU: what each kernel knob should be, and setting it with proof.

Two halves, one implementation:

- `decide(topology, plan, settings)` runs on the controller. From the topology facts,
  the plan and the host_tuning variables it returns a spec: one entry per knob with the
  value it should have (or `None`: leave it alone), or why the host cannot have it. A
  request the host cannot hold (more hugepages than a node can spare after the planned
  model and KV cache) raises `TuningError`, before anything on the host changes.
- `tune(host, spec, backup, check)` and `restore(host, backup, check)` run on the target.
  They read every knob, record the originals before the first change (never overwriting
  a recorded original), write what differs, read it back, and report desired, before,
  after and status per knob. A knob the host lacks is `unavailable`, with the reason,
  never an error and never skipped.

This file is shipped to targets as the host_tuning role's module_utils and as the
boot-time helper (`python3 socketwise_tuning.py apply SPEC`), so it imports only the
standard library; decide() imports the planner's memory rule when it runs, which is on
the controller only. `from __future__ import annotations` keeps the annotations from
being evaluated on targets whose Python predates 3.10.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass

# One cpulist parser for the kit: from the package, from Ansible's module_utils on a
# host, or from the copy installed beside this file for the boot-time helper.
try:
    from socketwise.topology import format_cpulist, parse_cpulist
except ImportError:
    try:
        from ansible.module_utils.socketwise_topology import (  # type: ignore
            format_cpulist,
            parse_cpulist,
        )
    except ImportError:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from socketwise_topology import format_cpulist, parse_cpulist  # type: ignore
from pathlib import Path
from typing import Any, TypedDict

SCHEMA_VERSION = 1

THP_MODES = ("always", "madvise", "never")
THP_DEFRAG_MODES = ("always", "defer", "defer+madvise", "madvise", "never")
IRQBALANCE_MODES = ("ban", "stop")
# What host_tuning_hugepages_size accepts, as the kernel names the pools.
HUGEPAGE_SIZES_KB = {"2M": 2048, "1G": 1048576}
GIB_KB = 1024 * 1024

# Statuses in the report.
SET = "set"  # the knob has the desired value (read back)
SHORT = "short"  # hugepages: the kernel found fewer free pages than asked for
PARTIAL = "partial"  # written, but the kernel kept part of it (IRQs with managed affinity)
REBOOT_REQUIRED = "reboot-required"  # 1 GB pages: on the kernel command line, not yet booted
UNAVAILABLE = "unavailable"  # the host lacks the knob or cannot change it; `reason` says why
UNMANAGED = "unmanaged"  # its variable is null: read, reported, left alone
RESTORED = "restored"  # state absent: back at the recorded original
NOT_RESTORED = "not-restored"  # state absent: the original could not be written back

# Kinds whose runtime value does not survive a reboot and that the boot-time unit
# re-applies; numa_balancing is persisted through sysctl.d, irqbalance through its own
# config file and unit state, 1 GB pages through the kernel command line.
BOOT_KINDS = ("hugepages", "thp", "irq_affinity", "cpu_governor", "cpuidle")
SYSCTL_KEYS = {"numa_balancing": "kernel.numa_balancing"}

# Errors that mean "this host does not let us change that": a read-only /proc/sys or
# /sys (containers), no privilege.
_NOT_ALLOWED = (errno.EROFS, errno.EACCES, errno.EPERM)
_CPULIST_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_IRQBALANCE_BANNED = "IRQBALANCE_BANNED_CPULIST"
# What kernel.numa_balancing may be set to, however the variable arrives (YAML, -e).
_NUMA_BALANCING = {"0": 0, "1": 1, "false": 0, "true": 1}


class TuningError(ValueError):
    """A request this host cannot hold; `variable` names the host_tuning_* variable at fault
    (without the prefix) and the message says what to change."""

    def __init__(self, variable: str, message: str):
        self.variable = variable
        super().__init__(message)


class KnobError(RuntimeError):
    """Writing a knob failed for a reason other than the host not having it."""

    def __init__(self, message: str, code: int | None = None):
        self.errno = code
        super().__init__(message)


class Unavailable(Exception):
    """The host does not have this knob, or does not let it be changed; str() says why."""


class Knob(TypedDict, total=False):
    name: str  # unique per host, e.g. "hugepages.node0.2048kB"
    kind: str  # numa_balancing, hugepages, thp, irq_affinity, irqbalance, cpu_governor, cpuidle
    desired: Any  # None: not managed (reported, left alone)
    unavailable: str | None  # decided on the controller: why the host cannot have it
    # Where the knob lives, by kind:
    node: int  # hugepages, cpu_governor, cpuidle
    size_kb: int  # hugepages
    file: str  # thp: "enabled" or "defrag"
    nic: str  # irq_affinity
    pci: str | None  # irq_affinity
    cpus: list[int]  # cpu_governor, cpuidle


class Spec(TypedDict):
    schema: int
    knobs: list[Knob]


class Entry(TypedDict):
    name: str
    desired: Any
    before: Any
    after: Any
    status: str
    reason: str | None


class Persist(TypedDict):
    sysctl: dict[str, int]  # sysctl key -> value, for /etc/sysctl.d
    boot: list[Knob]  # knobs the boot-time unit re-applies
    kernel_args: str | None  # for 1 GB pages


class Outcome(TypedDict):
    changed: bool
    report: dict[str, Any]
    persist: Persist
    reboot_required: bool
    diff: dict[str, str]


# --- cpulists ------------------------------------------------------------------------------
# The same format topology.py reads; duplicated because each of the two files is shipped
# to hosts on its own.


# --- deciding (controller) -----------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """The host_tuning_* variables, without the prefix; None leaves a knob alone."""

    numa_balancing: int | None = 0
    hugepages_size: str = "2M"
    hugepages_per_node: int | None = None
    hugepages_gb_per_node: float | None = None
    thp: str | None = "always"
    thp_defrag: str | None = "madvise"
    irq_affinity: bool = True
    irq_nics: tuple[str, ...] = ()
    irqbalance: str | None = "ban"
    cpu_governor: str | None = "performance"
    cstate_max_latency_us: int | None = None

    @classmethod
    def from_values(cls, **values: Any) -> Settings:
        """Build settings from loosely typed values (extra vars arrive as strings)."""
        converted: dict[str, Any] = {}
        for name, value in values.items():
            if value == "":
                value = None
            if name == "irq_affinity" and isinstance(value, str):
                value = value.lower() in ("1", "true", "yes", "on")
            elif name == "numa_balancing" and value is not None:
                value = _NUMA_BALANCING.get(str(value).lower(), value)
            elif name == "irq_nics":
                value = tuple(value or ())
            elif value is not None and name in ("hugepages_per_node", "cstate_max_latency_us"):
                value = _number(name, value, int)
            elif value is not None and name == "hugepages_gb_per_node":
                value = _number(name, value, float)
            converted[name] = value
        return cls(**converted)


def _number(name: str, value: Any, kind: Callable[[Any], Any]) -> Any:
    try:
        return kind(value)
    except (TypeError, ValueError) as exc:
        raise TuningError(name, f"{value!r} is not a number") from exc


def decide(topology: dict, plan: dict, settings: Settings) -> Spec:
    """The spec for this host: every knob with its desired value, in a fixed order.

    Raises TuningError (naming the variable and the fix) for a request the host cannot hold.
    """
    _check_settings(settings)
    nodes = {int(n["id"]): n for n in topology["nodes"]}
    serving = {int(use["node"]): use for use in plan["nodes"]}
    knobs: list[Knob] = [
        {
            "name": "kernel.numa_balancing",
            "kind": "numa_balancing",
            "desired": settings.numa_balancing,
        }
    ]
    knobs += _hugepage_knobs(nodes, serving, plan, settings)
    for file, mode in (("enabled", settings.thp), ("defrag", settings.thp_defrag)):
        knobs.append({"name": f"thp.{file}", "kind": "thp", "file": file, "desired": mode})
    knobs += _irq_knobs(topology, nodes, serving, settings)
    knobs.append(_irqbalance_knob(nodes, serving, settings))
    for node in sorted(serving):
        cpus = list(nodes[node]["cpus"])
        knobs.append(
            {
                "name": f"cpu_governor.node{node}",
                "kind": "cpu_governor",
                "node": node,
                "cpus": cpus,
                "desired": settings.cpu_governor,
            }
        )
        knobs.append(
            {
                "name": f"cpuidle.node{node}",
                "kind": "cpuidle",
                "node": node,
                "cpus": cpus,
                "desired": settings.cstate_max_latency_us,
            }
        )
    return {"schema": SCHEMA_VERSION, "knobs": knobs}


def _check_settings(settings: Settings) -> None:
    if settings.hugepages_size not in HUGEPAGE_SIZES_KB:
        raise TuningError(
            "hugepages_size", f"use one of {', '.join(HUGEPAGE_SIZES_KB)} (2 MB or 1 GB pages)"
        )
    if settings.hugepages_per_node is not None and settings.hugepages_gb_per_node is not None:
        raise TuningError(
            "hugepages_gb_per_node",
            "give hugepages as a count (host_tuning_hugepages_per_node) or as GB "
            "(host_tuning_hugepages_gb_per_node), not both",
        )
    if settings.numa_balancing not in (None, 0, 1):
        raise TuningError(
            "numa_balancing", "use 0 (off, the default), 1 (on), or null to leave it alone"
        )
    for name in ("hugepages_per_node", "hugepages_gb_per_node", "cstate_max_latency_us"):
        value = getattr(settings, name)
        if value is not None and value < 0:
            raise TuningError(name, "must not be negative")
    for name, allowed in (
        ("thp", THP_MODES),
        ("thp_defrag", THP_DEFRAG_MODES),
        ("irqbalance", IRQBALANCE_MODES),
    ):
        value = getattr(settings, name)
        if value is not None and value not in allowed:
            raise TuningError(name, f"use one of {', '.join(allowed)}, or null to leave it alone")


def _hugepage_knobs(
    nodes: dict[int, dict], serving: dict[int, dict], plan: dict, settings: Settings
) -> list[Knob]:
    """Pages on each node that serves, never on the others: memory on a node that runs no
    rank is not where the model's pages will be."""
    size_kb = HUGEPAGE_SIZES_KB[settings.hugepages_size]
    if settings.hugepages_per_node is not None:
        pages: int | None = settings.hugepages_per_node
        variable = "hugepages_per_node"
    elif settings.hugepages_gb_per_node is not None:
        pages = math.ceil(settings.hugepages_gb_per_node * GIB_KB / size_kb)
        variable = "hugepages_gb_per_node"
    else:
        pages, variable = None, ""
    knobs: list[Knob] = []
    for node in sorted(serving):
        if pages:
            _check_room(nodes[node], plan, size_kb, pages, variable)
        knobs.append(
            {
                "name": f"hugepages.node{node}.{size_kb}kB",
                "kind": "hugepages",
                "node": node,
                "size_kb": size_kb,
                "desired": pages,
            }
        )
    return knobs


def _check_room(node: dict, plan: dict, size_kb: int, pages: int, variable: str) -> None:
    from socketwise.planner import os_reserve_gb  # the controller's, see the module docstring

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


def _irq_knobs(
    topology: dict, nodes: dict[int, dict], serving: dict[int, dict], settings: Settings
) -> list[Knob]:
    """Each NIC's IRQs go to CPUs that do not infer, on the NIC's own node if it has any."""
    nics = topology.get("nics", [])
    known = [nic["name"] for nic in nics]
    unknown = [name for name in settings.irq_nics if name not in known]
    if unknown:
        raise TuningError(
            "irq_nics",
            f"no NIC named {', '.join(unknown)} in the topology facts (NICs: "
            f"{', '.join(known) or 'none'}); list some of those, or [] for all",
        )
    chosen = [nic for nic in nics if not settings.irq_nics or nic["name"] in settings.irq_nics]
    if not chosen:
        return [
            {
                "name": "irq_affinity",
                "kind": "irq_affinity",
                "desired": None,
                "unavailable": "the topology facts list no NIC with a device behind it",
            }
        ]
    with_cpus = [n for n in nodes if nodes[n]["cpus"]]
    knobs: list[Knob] = []
    for nic in chosen:
        node = nic.get("numa_node")
        # Firmware that does not say (VMs) on a host with one node: it is that node.
        if node is None and len(with_cpus) == 1:
            node = with_cpus[0]
        cpus, unavailable = _irq_cpus(node, nodes, serving, nic["name"])
        knobs.append(
            {
                "name": f"irq_affinity.{nic['name']}",
                "kind": "irq_affinity",
                "nic": nic["name"],
                "pci": nic.get("pci"),
                "desired": format_cpulist(cpus) if settings.irq_affinity and cpus else None,
                "unavailable": unavailable if settings.irq_affinity else None,
            }
        )
    return knobs


def _irq_cpus(
    node: int | None, nodes: dict[int, dict], serving: dict[int, dict], nic: str
) -> tuple[list[int], str | None]:
    if node in serving:
        cpus = serving[node]["reserved_cpus"]
        if cpus:
            return cpus, None
        return [], (
            f"node {node}, where {nic} sits, infers on all of its cores (the plan reserves "
            f"none): no core is left for its IRQs; set plan_reserve_cores to 1 or more"
        )
    if node is not None:
        # A node that runs no rank: its CPUs are all free of inference.
        return list(nodes[node]["cpus"]), None
    # Node unknown on a multi-node host: any CPU that does not infer.
    free = sorted(
        {c for use in serving.values() for c in use["reserved_cpus"]}
        | {c for n, info in nodes.items() if n not in serving for c in info["cpus"]}
    )
    if free:
        return free, None
    return [], (
        f"{nic}'s NUMA node is unknown and every CPU infers: set plan_reserve_cores to 1 or more"
    )


def _inference_core_cpus(nodes: dict[int, dict], serving: dict[int, dict]) -> list[int]:
    """Every logical CPU of a core that infers: the plan's inference CPUs and their siblings."""
    return sorted(
        c for n, use in serving.items() for c in nodes[n]["cpus"] if c not in use["reserved_cpus"]
    )


def _irqbalance_knob(nodes: dict[int, dict], serving: dict[int, dict], settings: Settings) -> Knob:
    knob: Knob = {"name": "irqbalance", "kind": "irqbalance", "desired": None}
    if settings.irqbalance == "stop":
        knob["desired"] = {"active": False, "enabled": False}
    elif settings.irqbalance == "ban":
        banned = _inference_core_cpus(nodes, serving)
        if len(banned) == sum(len(info["cpus"]) for info in nodes.values()):
            knob["unavailable"] = (
                "the plan infers on every CPU, so banning them would leave irqbalance none: "
                "set plan_reserve_cores to 1 or more, or host_tuning_irqbalance to stop"
            )
        else:
            knob["desired"] = {"banned_cpulist": format_cpulist(banned)}
    return knob


# --- the host (target) ---------------------------------------------------------------------


def _run_command(argv: list[str]) -> tuple[int, str, str]:
    env = dict(os.environ, LC_ALL="C")
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    return done.returncode, done.stdout, done.stderr


def _os_writable(path: Path) -> bool:
    # access() answers EROFS for a read-only mount without writing anything.
    return os.access(path, os.W_OK)


class Host:
    """The files and commands of one host, below `root` (a fixture tree in tests)."""

    def __init__(
        self,
        root: str | Path = "/",
        run: Callable[[list[str]], tuple[int, str, str]] = _run_command,
        writable: Callable[[Path], bool] = _os_writable,
    ):
        self.root = Path(root)
        self.run = run
        self._writable = writable

    def path(self, relative: str) -> Path:
        return self.root / relative.lstrip("/")

    def exists(self, relative: str) -> bool:
        return self.path(relative).exists()

    def read(self, relative: str, missing: str) -> str:
        """The file's text; Unavailable(`missing`) when the host does not have it."""
        try:
            return self.path(relative).read_text()
        except FileNotFoundError:
            raise Unavailable(missing) from None
        except OSError as exc:
            raise Unavailable(f"cannot read /{relative.lstrip('/')}: {exc.strerror}") from None

    def require_writable(self, relative: str) -> None:
        path = self.path(relative)
        if not self._writable(path):
            raise Unavailable(_read_only_reason(relative))

    def write(self, relative: str, text: str) -> None:
        path = self.path(relative)
        try:
            with open(path, "w") as handle:
                handle.write(text)
        except OSError as exc:
            if exc.errno in _NOT_ALLOWED:
                raise Unavailable(_read_only_reason(relative)) from None
            raise KnobError(
                f"writing {text.strip()!r} to /{relative.lstrip('/')}: {exc.strerror}", exc.errno
            ) from None

    def systemctl(self, *args: str) -> str:
        rc, out, err = self.run(["systemctl", *args])
        # is-active/is-enabled answer with their exit code; their stdout is the answer.
        if rc != 0 and args[0] not in ("is-active", "is-enabled"):
            raise KnobError(f"systemctl {' '.join(args)} failed: {(err or out).strip()}")
        return out.strip()


def _read_only_reason(relative: str) -> str:
    return f"/{relative.lstrip('/')} is read-only here (mounted read-only, as in a container)"


# Each kind reads, checks, compares, writes and restores its knob. `value` is what the
# report shows: an int, a mode string, or a small dict keyed by IRQ, governor or C-state.


class _Kind:
    def read(self, host: Host, knob: Knob) -> Any:
        raise NotImplementedError

    def writable(self, host: Host, knob: Knob, current: Any) -> None:
        """Raise Unavailable if this host does not let the knob be written."""

    def check(self, host: Host, knob: Knob, current: Any) -> None:
        """Raise Unavailable if the knob cannot be set to its desired value here."""
        self.writable(host, knob, current)

    def matches(self, knob: Knob, current: Any, desired: Any) -> bool:
        return current == desired

    def apply(self, host: Host, knob: Knob, current: Any, desired: Any) -> None:
        raise NotImplementedError

    def predict(self, knob: Knob, current: Any, desired: Any) -> Any:
        return desired

    def restore(self, host: Host, knob: Knob, current: Any, original: Any) -> None:
        self.apply(host, knob, current, original)

    def restored(self, current: Any, original: Any) -> bool:
        return current == original


class _File(_Kind):
    """One file holding one value."""

    def path(self, host: Host, knob: Knob) -> str:
        raise NotImplementedError

    def missing(self, knob: Knob) -> str:
        raise NotImplementedError

    def parse(self, text: str) -> Any:
        return int(text)

    def read(self, host: Host, knob: Knob) -> Any:
        return self.parse(host.read(self.path(host, knob), self.missing(knob)))

    def writable(self, host: Host, knob: Knob, current: Any) -> None:
        host.require_writable(self.path(host, knob))

    def apply(self, host: Host, knob: Knob, current: Any, desired: Any) -> None:
        host.write(self.path(host, knob), f"{desired}\n")


class _NumaBalancing(_File):
    def path(self, host: Host, knob: Knob) -> str:
        return "proc/sys/kernel/numa_balancing"

    def missing(self, knob: Knob) -> str:
        return "no /proc/sys/kernel/numa_balancing (kernel without NUMA balancing)"


class _HugePages(_File):
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


class _Thp(_File):
    def path(self, host: Host, knob: Knob) -> str:
        return f"sys/kernel/mm/transparent_hugepage/{knob['file']}"

    def missing(self, knob: Knob) -> str:
        return "no /sys/kernel/mm/transparent_hugepage (kernel without THP)"

    def parse(self, text: str) -> Any:
        # The kernel lists every mode and brackets the selected one; a file that holds
        # one bare word (a copied tree) holds the mode itself.
        match = re.search(r"\[([^\]]+)\]", text)
        if match:
            return match[1]
        if len(text.split()) == 1:
            return text.strip()
        raise KnobError(f"no [selected] mode in {text.strip()!r}")


class _IrqAffinity(_Kind):
    """value: {irq: cpulist}; desired: the cpulist the IRQs must stay within."""

    def read(self, host: Host, knob: Knob) -> Any:
        if not knob.get("nic"):
            raise Unavailable(knob.get("unavailable") or "no NIC")
        irqs = nic_irqs(host, knob["nic"], knob.get("pci"))
        if not irqs:
            raise Unavailable(
                f"{knob['nic']} has no IRQs to steer (no msi_irqs, no legacy IRQ, "
                "nothing in /proc/interrupts)"
            )
        return {
            str(irq): format_cpulist(
                parse_cpulist(host.read(f"proc/irq/{irq}/smp_affinity_list", f"no /proc/irq/{irq}"))
            )
            for irq in irqs
        }

    def writable(self, host: Host, knob: Knob, current: Any) -> None:
        for irq in current:
            host.require_writable(f"proc/irq/{irq}/smp_affinity_list")

    def matches(self, knob: Knob, current: Any, desired: Any) -> bool:
        # Within, not equal: irqbalance (banned from the inference cores) may narrow an
        # IRQ to one of the allowed CPUs, which is just as far from inference.
        allowed = set(parse_cpulist(desired))
        return all(set(parse_cpulist(cpus)) <= allowed for cpus in current.values())

    def predict(self, knob: Knob, current: Any, desired: Any) -> Any:
        return {
            irq: cpus if self.matches(knob, {irq: cpus}, desired) else desired
            for irq, cpus in current.items()
        }

    def apply(self, host: Host, knob: Knob, current: Any, desired: Any) -> None:
        moved = managed = 0
        for irq, cpus in current.items():
            if not self.matches(knob, {irq: cpus}, desired):
                if _write_irq(host, irq, desired):
                    moved += 1
                else:
                    managed += 1
        if managed and not moved:
            raise Unavailable(f"the kernel manages the affinity of {knob['nic']}'s IRQs")

    def restore(self, host: Host, knob: Knob, current: Any, original: Any) -> None:
        default = _default_irq_affinity(host)
        for irq, cpus in current.items():
            # An IRQ the NIC did not have when the original was recorded (renumbered at a
            # later boot) goes back to the kernel's default.
            wanted = original.get(irq, default)
            if wanted and cpus != wanted:
                _write_irq(host, irq, wanted)

    def restored(self, current: Any, original: Any) -> bool:
        return all(original.get(irq, cpus) == cpus for irq, cpus in current.items())


def _default_irq_affinity(host: Host) -> str:
    """The kernel's affinity for new IRQs (a hex mask with comma-separated 32-bit words)."""
    try:
        mask = int(host.read("proc/irq/default_smp_affinity", "").strip().replace(",", ""), 16)
    except (Unavailable, ValueError):
        return ""
    return format_cpulist(cpu for cpu in range(mask.bit_length()) if mask >> cpu & 1)


def _write_irq(host: Host, irq: str, cpus: str) -> bool:
    """Write an IRQ's affinity; False when the kernel manages it (EIO): not ours to move."""
    try:
        host.write(f"proc/irq/{irq}/smp_affinity_list", f"{cpus}\n")
    except KnobError as exc:
        if exc.errno == errno.EIO:
            return False
        raise
    return True


def nic_irqs(host: Host, nic: str, pci: str | None) -> list[int]:
    """The IRQs of a NIC: its PCI function's MSI/MSI-X vectors, else its legacy IRQ, else the
    /proc/interrupts lines that name it (virtio NICs: the vectors belong to the function)."""
    candidates = []
    if pci:
        candidates.append(f"sys/bus/pci/devices/{pci}")
    candidates.append(f"sys/class/net/{nic}/device")
    for device in candidates:
        msi = host.path(f"{device}/msi_irqs")
        if msi.is_dir():
            return sorted(int(entry.name) for entry in msi.iterdir() if entry.name.isdigit())
    for device in candidates:
        legacy = host.path(f"{device}/irq")
        if legacy.is_file():
            irq = int(legacy.read_text().strip() or 0)
            if irq > 0:
                return [irq]
    irqs = []
    interrupts = host.path("proc/interrupts")
    if interrupts.is_file():
        for line in interrupts.read_text().splitlines():
            number, _, rest = line.strip().partition(":")
            names = rest.split()
            if number.isdigit() and any(nic in n or (pci and pci in n) for n in names[-1:]):
                irqs.append(int(number))
    return irqs


class _CpuGovernor(_Kind):
    """value: {governor: cpulist}; desired: one governor for all of the node's CPUs."""

    def _dir(self, cpu: int) -> str:
        return f"sys/devices/system/cpu/cpu{cpu}/cpufreq"

    def read(self, host: Host, knob: Knob) -> Any:
        by_governor: dict[str, list[int]] = {}
        for cpu in knob["cpus"]:
            governor = host.read(
                f"{self._dir(cpu)}/scaling_governor",
                f"no cpufreq on CPU {cpu} (a VM, or no cpufreq driver loaded)",
            ).strip()
            by_governor.setdefault(governor, []).append(cpu)
        return {g: format_cpulist(cpus) for g, cpus in sorted(by_governor.items())}

    def writable(self, host: Host, knob: Knob, current: Any) -> None:
        for cpu in knob["cpus"]:
            host.require_writable(f"{self._dir(cpu)}/scaling_governor")

    def check(self, host: Host, knob: Knob, current: Any) -> None:
        for cpu in knob["cpus"]:
            offered = host.read(
                f"{self._dir(cpu)}/scaling_available_governors",
                f"CPU {cpu} lists no cpufreq governors",
            ).split()
            if knob["desired"] not in offered:
                raise Unavailable(
                    f"the cpufreq driver of CPU {cpu} offers no {knob['desired']} governor "
                    f"(it offers: {', '.join(offered) or 'none'})"
                )
        self.writable(host, knob, current)

    def matches(self, knob: Knob, current: Any, desired: Any) -> bool:
        return current == {desired: format_cpulist(knob["cpus"])}

    def predict(self, knob: Knob, current: Any, desired: Any) -> Any:
        return {desired: format_cpulist(knob["cpus"])}

    def apply(self, host: Host, knob: Knob, current: Any, desired: Any) -> None:
        self.restore(host, knob, current, {desired: format_cpulist(knob["cpus"])})

    def restore(self, host: Host, knob: Knob, current: Any, original: Any) -> None:
        now = {cpu: g for g, cpus in current.items() for cpu in parse_cpulist(cpus)}
        for governor, cpus in original.items():
            for cpu in parse_cpulist(cpus):
                if now.get(cpu) != governor:
                    host.write(f"{self._dir(cpu)}/scaling_governor", f"{governor}\n")


class _CpuIdle(_Kind):
    """value: {state: {"name", "latency_us", "disabled": cpulist}}; desired: the deepest exit
    latency (us) allowed: deeper states are disabled on the node's CPUs."""

    def _states(self, host: Host, cpu: int) -> list[str]:
        directory = host.path(f"sys/devices/system/cpu/cpu{cpu}/cpuidle")
        if not directory.is_dir():
            raise Unavailable(f"no cpuidle states on CPU {cpu} (no cpuidle driver: usual in VMs)")
        return sorted(
            (e.name for e in directory.iterdir() if re.fullmatch(r"state\d+", e.name)),
            key=lambda name: int(name[5:]),
        )

    def read(self, host: Host, knob: Knob) -> Any:
        value: dict[str, dict[str, Any]] = {}
        for cpu in knob["cpus"]:
            for state in self._states(host, cpu):
                base = f"sys/devices/system/cpu/cpu{cpu}/cpuidle/{state}"
                entry = value.setdefault(
                    state,
                    {
                        "name": host.read(f"{base}/name", "").strip(),
                        "latency_us": int(host.read(f"{base}/latency", "0")),
                        "disabled": [],
                    },
                )
                if host.read(f"{base}/disable", "0").strip() == "1":
                    entry["disabled"].append(cpu)
        for entry in value.values():
            entry["disabled"] = format_cpulist(entry["disabled"])
        return value

    def writable(self, host: Host, knob: Knob, current: Any) -> None:
        for cpu in knob["cpus"]:
            for state in self._states(host, cpu):
                host.require_writable(f"sys/devices/system/cpu/cpu{cpu}/cpuidle/{state}/disable")

    def matches(self, knob: Knob, current: Any, desired: Any) -> bool:
        return current == self.predict(knob, current, desired)

    def predict(self, knob: Knob, current: Any, desired: Any) -> Any:
        everywhere = format_cpulist(knob["cpus"])
        return {
            state: dict(entry, disabled=everywhere) if entry["latency_us"] > desired else entry
            for state, entry in current.items()
        }

    def apply(self, host: Host, knob: Knob, current: Any, desired: Any) -> None:
        self.restore(host, knob, current, self.predict(knob, current, desired))

    def restore(self, host: Host, knob: Knob, current: Any, original: Any) -> None:
        for state, entry in original.items():
            if state not in current:
                continue
            was = set(parse_cpulist(entry["disabled"]))
            now = set(parse_cpulist(current[state]["disabled"]))
            for cpu in knob["cpus"]:
                if (cpu in was) != (cpu in now):
                    host.write(
                        f"sys/devices/system/cpu/cpu{cpu}/cpuidle/{state}/disable",
                        "1\n" if cpu in was else "0\n",
                    )


class _Irqbalance(_Kind):
    """value: {"banned_cpulist": str|None, "active": bool, "enabled": bool}."""

    config = "etc/default/irqbalance"
    unit = "irqbalance.service"

    def read(self, host: Host, knob: Knob) -> Any:
        if not host.exists("usr/sbin/irqbalance"):
            raise Unavailable("irqbalance is not installed: nothing moves IRQs back")
        return {
            "banned_cpulist": self._banned(host),
            "active": host.systemctl("is-active", self.unit) == "active",
            "enabled": host.systemctl("is-enabled", self.unit) == "enabled",
        }

    def _banned(self, host: Host) -> str | None:
        path = host.path(self.config)
        text = path.read_text() if path.is_file() else ""
        for line in text.splitlines():
            match = re.fullmatch(rf"\s*{_IRQBALANCE_BANNED}=\"?([^\"]*)\"?\s*", line)
            if match:
                return match[1]
        return None

    def writable(self, host: Host, knob: Knob, current: Any) -> None:
        host.require_writable(self.config if host.exists(self.config) else "etc/default")

    def matches(self, knob: Knob, current: Any, desired: Any) -> bool:
        return all(current.get(key) == value for key, value in desired.items())

    def predict(self, knob: Knob, current: Any, desired: Any) -> Any:
        return dict(current, **desired)

    def apply(self, host: Host, knob: Knob, current: Any, desired: Any) -> None:
        self.restore(host, knob, current, self.predict(knob, current, desired))

    def restore(self, host: Host, knob: Knob, current: Any, original: Any) -> None:
        banned_changed = original["banned_cpulist"] != current["banned_cpulist"]
        if banned_changed:
            self._write_banned(host, original["banned_cpulist"])
        if original["enabled"] != current["enabled"]:
            host.systemctl("enable" if original["enabled"] else "disable", self.unit)
        if original["active"] and (banned_changed or not current["active"]):
            host.systemctl("restart", self.unit)
        elif not original["active"] and current["active"]:
            host.systemctl("stop", self.unit)

    def _write_banned(self, host: Host, cpulist: str | None) -> None:
        path = host.path(self.config)
        lines = path.read_text().splitlines() if path.is_file() else []
        pattern = re.compile(rf"\s*{_IRQBALANCE_BANNED}=.*")
        kept = [line for line in lines if not pattern.fullmatch(line)]
        if cpulist is not None:
            kept.append(f"{_IRQBALANCE_BANNED}={cpulist}")
        host.write(self.config, "".join(f"{line}\n" for line in kept))


KINDS: dict[str, _Kind] = {
    "numa_balancing": _NumaBalancing(),
    "hugepages": _HugePages(),
    "thp": _Thp(),
    "irq_affinity": _IrqAffinity(),
    "irqbalance": _Irqbalance(),
    "cpu_governor": _CpuGovernor(),
    "cpuidle": _CpuIdle(),
}


def kernel_args(knobs: Iterable[Knob]) -> str:
    """The kernel command line that reserves the knobs' 1 GB pages at boot, per node."""
    per_node = ",".join(f"{k['node']}:{k['desired']}" for k in knobs)
    return f"hugepagesz=1G hugepages={per_node}"


def _is_one_gb(knob: Knob) -> bool:
    return knob["kind"] == "hugepages" and knob["size_kb"] == HUGEPAGE_SIZES_KB["1G"]


# --- tune and restore ----------------------------------------------------------------------


@dataclass
class _Look:
    """One knob as found: its current value, or why it is unavailable; and whether it
    needs a write."""

    knob: Knob
    current: Any = None
    reason: str | None = None
    # Not at its desired value yet; written now unless it is a 1 GB pool (boot only).
    pending: bool = False
    needs_write: bool = False


def _look(host: Host, knob: Knob) -> _Look:
    look = _Look(knob)
    kind = KINDS[knob["kind"]]
    try:
        look.current = kind.read(host, knob)
    except Unavailable as exc:
        look.reason = str(exc)
        return look
    if knob.get("unavailable"):
        look.reason = knob["unavailable"]
    elif knob["desired"] is not None:
        # Checked even when the value is already right: a knob the host does not let us
        # set (read-only /proc/sys) is unavailable, and nothing is persisted for it.
        try:
            kind.check(host, knob, look.current)
        except Unavailable as exc:
            look.reason = str(exc)
        else:
            look.pending = not kind.matches(knob, look.current, knob["desired"])
            look.needs_write = look.pending and not _is_one_gb(knob)
    return look


def _settle(host: Host, look: _Look, check: bool) -> tuple[Any, str, str | None]:
    """Write a knob that needs it (unless `check`), read it back: (after, status, reason)."""
    knob = look.knob
    kind = KINDS[knob["kind"]]
    if look.reason is not None:
        return look.current, UNAVAILABLE, look.reason
    if knob["desired"] is None:
        return look.current, UNMANAGED, None
    after = look.current
    if look.needs_write:
        if check:
            return kind.predict(knob, look.current, knob["desired"]), SET, None
        try:
            kind.apply(host, knob, look.current, knob["desired"])
        except Unavailable as exc:
            return look.current, UNAVAILABLE, str(exc)
        after = kind.read(host, knob)
    if kind.matches(knob, after, knob["desired"]):
        return after, SET, None
    if knob["kind"] == "irq_affinity":
        return (
            after,
            PARTIAL,
            (
                "the kernel manages the affinity of IRQs "
                + ", ".join(
                    irq
                    for irq, cpus in after.items()
                    if not kind.matches(knob, {irq: cpus}, knob["desired"])
                )
            ),
        )
    if _is_one_gb(knob):
        if _booted_with(host, knob):
            return after, SHORT, _short_reason(knob, after, "at boot")
        return after, REBOOT_REQUIRED, f"'{kernel_args([knob])}' takes effect at the next boot"
    if knob["kind"] == "hugepages":
        return after, SHORT, _short_reason(knob, after, "now")
    return after, PARTIAL, f"read back {json.dumps(after)} after writing it"


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


def tune(host: Host, spec: Spec, backup: str | None, check: bool = False) -> Outcome:
    """Bring every knob of `spec` to its desired value and report it.

    With `backup` (a path on the host), the current value of every managed knob is
    recorded there before the first write; values already recorded are kept, so the file
    always holds what the host had before socketwise tuned it. The report's `before` is
    that original. `check` changes nothing and predicts `after`.
    """
    looks = [_look(host, knob) for knob in spec["knobs"]]
    recorded = _load_backup(host, backup) if backup else {}
    changed = False
    if backup and any(look.pending for look in looks):
        fresh = {
            look.knob["name"]: {"knob": look.knob, "original": look.current}
            for look in looks
            if look.reason is None
            and look.knob["desired"] is not None
            and look.knob["name"] not in recorded
        }
        if fresh:
            recorded.update(fresh)
            if not check:
                _save_backup(host, backup, recorded)
            changed = True
    entries: list[Entry] = []
    diff_before, diff_after = [], []
    for look in looks:
        after, status, reason = _settle(host, look, check)
        name = look.knob["name"]
        if look.needs_write and after != look.current:
            changed = True
            diff_before.append(f"{name}: {json.dumps(look.current, sort_keys=True)}\n")
            diff_after.append(f"{name}: {json.dumps(after, sort_keys=True)}\n")
        before = recorded[name]["original"] if name in recorded else look.current
        entries.append(_entry(look.knob, look.knob["desired"], before, after, status, reason))
    return {
        "changed": changed,
        "report": _report("present", backup, entries),
        "persist": _persistence(entries, spec),
        "reboot_required": any(e["status"] == REBOOT_REQUIRED for e in entries),
        "diff": {"before": "".join(diff_before), "after": "".join(diff_after)},
    }


def restore(host: Host, backup: str, check: bool = False) -> Outcome:
    """Write back every original recorded in `backup`, read it back, and report it.

    The backup file is removed once every knob is back (or unavailable); a knob that could
    not be restored (hugepages still in use) keeps it, so a later run can finish.
    """
    recorded = _load_backup(host, backup)
    entries: list[Entry] = []
    diff_before, diff_after = [], []
    pending = False
    for name, saved in recorded.items():
        knob, original = saved["knob"], saved["original"]
        kind = KINDS[knob["kind"]]
        try:
            current = kind.read(host, knob)
        except Unavailable as exc:
            entries.append(_entry(knob, original, None, None, UNAVAILABLE, str(exc)))
            continue
        after, status, reason = current, RESTORED, None
        if not kind.restored(current, original):
            try:
                kind.writable(host, knob, current)
                if check:
                    after = original
                else:
                    kind.restore(host, knob, current, original)
                    after = kind.read(host, knob)
            except Unavailable as exc:
                status, reason = UNAVAILABLE, str(exc)
            if status == RESTORED and not kind.restored(after, original):
                status, reason, pending = NOT_RESTORED, f"still {json.dumps(after)}", True
            if after != current:
                diff_before.append(f"{name}: {json.dumps(current, sort_keys=True)}\n")
                diff_after.append(f"{name}: {json.dumps(after, sort_keys=True)}\n")
        entries.append(_entry(knob, original, current, after, status, reason))
    changed = bool(diff_after)
    if recorded and not pending:
        changed = True
        if not check:
            host.path(backup).unlink()
    return {
        "changed": changed,
        "report": _report("absent", backup, entries),
        "persist": {"sysctl": {}, "boot": [], "kernel_args": None},
        "reboot_required": False,
        "diff": {"before": "".join(diff_before), "after": "".join(diff_after)},
    }


def _entry(
    knob: Knob, desired: Any, before: Any, after: Any, status: str, reason: str | None
) -> Entry:
    return {
        "name": knob["name"],
        "desired": desired,
        "before": before,
        "after": after,
        "status": status,
        "reason": reason,
    }


def _report(state: str, backup: str | None, entries: list[Entry]) -> dict[str, Any]:
    return {
        "schema": SCHEMA_VERSION,
        "state": state,
        "backup": backup,
        "reboot_required": any(e["status"] == REBOOT_REQUIRED for e in entries),
        "knobs": entries,
    }


def _persistence(entries: list[Entry], spec: Spec) -> Persist:
    """What must survive a reboot: only knobs that are managed and that this host has."""
    live = {e["name"] for e in entries if e["status"] not in (UNAVAILABLE, UNMANAGED)}
    knobs = [k for k in spec["knobs"] if k["name"] in live]
    one_gb = [k for k in knobs if _is_one_gb(k)]
    return {
        "sysctl": {SYSCTL_KEYS[k["kind"]]: k["desired"] for k in knobs if k["kind"] in SYSCTL_KEYS},
        "boot": [k for k in knobs if k["kind"] in BOOT_KINDS and not _is_one_gb(k)],
        "kernel_args": kernel_args(one_gb) if one_gb else None,
    }


def _load_backup(host: Host, backup: str) -> dict[str, Any]:
    path = host.path(backup)
    if not path.is_file():
        return {}
    try:
        document = json.loads(path.read_text())
        return dict(document["knobs"])
    except (ValueError, KeyError, TypeError) as exc:
        raise KnobError(
            f"the tuning backup {backup} is unreadable ({exc}): fix or remove it by hand"
        ) from None


def _save_backup(host: Host, backup: str, recorded: dict[str, Any]) -> None:
    path = host.path(backup)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(
        json.dumps({"schema": SCHEMA_VERSION, "knobs": recorded}, indent=2, sort_keys=True) + "\n"
    )
    partial.chmod(0o600)
    partial.replace(path)


# --- boot-time helper ----------------------------------------------------------------------


def apply_at_boot(host: Host, knobs: list[Knob]) -> list[str]:
    """Re-apply runtime knobs after a reboot (no backup, no report): one line per knob."""
    lines = []
    for knob in knobs:
        after, status, reason = _settle(host, _look(host, knob), check=False)
        lines.append(
            f"{knob['name']}: {status} {json.dumps(after)}{f' ({reason})' if reason else ''}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    """`python3 socketwise_tuning.py apply SPEC.json`: what the boot-time unit runs."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "apply":
        print("usage: socketwise_tuning.py apply SPEC.json", file=sys.stderr)
        return 2
    try:
        knobs = json.loads(Path(args[1]).read_text())["knobs"]
        for line in apply_at_boot(Host(), knobs):
            print(line)
    except (OSError, ValueError, KeyError, KnobError) as exc:
        print(f"socketwise tuning: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
