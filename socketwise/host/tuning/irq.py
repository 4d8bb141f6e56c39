"""NIC interrupts away from the inference cores: each NIC's IRQ affinity, and irqbalance
(banned from those cores, or stopped) so it does not move them back."""

from __future__ import annotations

import errno
import re
from typing import Any

from ...facts.files import format_cpulist, parse_cpulist
from .base import PARTIAL, Host, Kind, Knob, KnobError, TuningError, Unavailable

IRQBALANCE_MODES = ("ban", "stop")
_BANNED = "IRQBALANCE_BANNED_CPULIST"


def affinity_knobs(
    topology: dict,
    nodes: dict[int, dict],
    serving: dict[int, dict],
    irq_nics: tuple[str, ...],
    enabled: bool,
    on_gpus: bool = False,
) -> list[Knob]:
    """Each NIC's IRQs go to CPUs that do not infer, on the NIC's own node if it has any;
    for a plan on GPUs (ON_GPUS), on the node that serves, the GPUs' (the field notes' GPU
    servers: the requests' packets are handled beside the process that feeds the GPUs)."""
    nics = topology.get("nics", [])
    known = [nic["name"] for nic in nics]
    unknown = [name for name in irq_nics if name not in known]
    if unknown:
        raise TuningError(
            "irq_nics",
            f"no NIC named {', '.join(unknown)} in the topology facts (NICs: "
            f"{', '.join(known) or 'none'}); list some of those, or [] for all",
        )
    chosen = [nic for nic in nics if not irq_nics or nic["name"] in irq_nics]
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
        if on_gpus and node not in serving:
            cpus, unavailable = _serving_reserve(serving, nic["name"])
        else:
            cpus, unavailable = _irq_cpus(node, nodes, serving, nic["name"])
        knobs.append(
            {
                "name": f"irq_affinity.{nic['name']}",
                "kind": "irq_affinity",
                "nic": nic["name"],
                "pci": nic.get("pci"),
                "desired": format_cpulist(cpus) if enabled and cpus else None,
                "unavailable": unavailable if enabled else None,
            }
        )
    return knobs


def _serving_reserve(serving: dict[int, dict], nic: str) -> tuple[list[int], str | None]:
    cpus = sorted(c for use in serving.values() for c in use["reserved_cpus"])
    if cpus:
        return cpus, None
    return [], (
        f"the GPUs' node(s) {', '.join(map(str, sorted(serving)))}, where {nic}'s IRQs go, "
        "infer on all of their cores (the plan reserves none): set plan_reserve_cores to 1 "
        "or more"
    )


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


def irqbalance_knob(nodes: dict[int, dict], serving: dict[int, dict], mode: str | None) -> Knob:
    knob: Knob = {"name": "irqbalance", "kind": "irqbalance", "desired": None}
    if mode == "stop":
        knob["desired"] = {"active": False, "enabled": False}
    elif mode == "ban":
        banned = _inference_core_cpus(nodes, serving)
        if len(banned) == sum(len(info["cpus"]) for info in nodes.values()):
            knob["unavailable"] = (
                "the plan infers on every CPU, so banning them would leave irqbalance none: "
                "set plan_reserve_cores to 1 or more, or host_tuning_irqbalance to stop"
            )
        else:
            knob["desired"] = {"banned_cpulist": format_cpulist(banned)}
    return knob


class IrqAffinity(Kind):
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

    def shortfall(self, host: Host, knob: Knob, after: Any) -> tuple[str, str]:
        stuck = [
            irq
            for irq, cpus in after.items()
            if not self.matches(knob, {irq: cpus}, knob["desired"])
        ]
        return PARTIAL, f"the kernel manages the affinity of IRQs {', '.join(stuck)}"


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


class Irqbalance(Kind):
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
            match = re.fullmatch(rf"\s*{_BANNED}=\"?([^\"]*)\"?\s*", line)
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

    def snapshot(self, host: Host, knob: Knob) -> Any:
        # Its config byte for byte (or that there was none), so restoring leaves no trace.
        path = host.path(self.config)
        return {"config": path.read_text() if path.is_file() else None}

    def put_back(self, host: Host, knob: Knob, current: Any, original: Any, snapshot: Any) -> None:
        if snapshot is None:  # recorded by a release that kept no snapshot
            self.restore(host, knob, current, original)
            return
        config_changed = host.replace(self.config, snapshot["config"])
        self._set_service(host, current, original, config_changed)

    def restore(self, host: Host, knob: Knob, current: Any, original: Any) -> None:
        banned_changed = original["banned_cpulist"] != current["banned_cpulist"]
        if banned_changed:
            self._write_banned(host, original["banned_cpulist"])
        self._set_service(host, current, original, banned_changed)

    def _set_service(self, host: Host, current: Any, original: Any, reread: bool) -> None:
        """Enable/disable and start/stop as in `original`; restart a running one whose
        config changed (`reread`)."""
        if original["enabled"] != current["enabled"]:
            host.systemctl("enable" if original["enabled"] else "disable", self.unit)
        if original["active"] and (reread or not current["active"]):
            host.systemctl("restart", self.unit)
        elif not original["active"] and current["active"]:
            host.systemctl("stop", self.unit)

    def _write_banned(self, host: Host, cpulist: str | None) -> None:
        path = host.path(self.config)
        lines = path.read_text().splitlines() if path.is_file() else []
        pattern = re.compile(rf"\s*{_BANNED}=.*")
        kept = [line for line in lines if not pattern.fullmatch(line)]
        if cpulist is not None:
            kept.append(f"{_BANNED}={cpulist}")
        host.write(self.config, "".join(f"{line}\n" for line in kept))
