"""Deciding, on the controller: from the topology facts, the plan and the host_tuning_*
variables, the spec of every knob (its desired value, or None to leave it alone, or why the
host cannot have it). A request the host cannot hold raises TuningError before anything on
the host changes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import cpu, hugepages, irq, numa_balancing, thp
from .base import SCHEMA_VERSION, Knob, Spec, TuningError


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
                value = numa_balancing.VALUES.get(str(value).lower(), value)
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
    knobs: list[Knob] = [numa_balancing.knob(settings.numa_balancing)]
    knobs += hugepages.knobs(
        nodes,
        serving,
        plan,
        settings.hugepages_size,
        settings.hugepages_per_node,
        settings.hugepages_gb_per_node,
    )
    knobs += thp.knobs(settings.thp, settings.thp_defrag)
    on_gpus = plan.get("device") == "gpu"
    knobs += irq.affinity_knobs(
        topology, nodes, serving, settings.irq_nics, settings.irq_affinity, on_gpus
    )
    knobs.append(irq.irqbalance_knob(nodes, serving, settings.irqbalance))
    knobs += cpu.knobs(nodes, serving, settings.cpu_governor, settings.cstate_max_latency_us)
    return {"schema": SCHEMA_VERSION, "knobs": knobs}


def _check_settings(settings: Settings) -> None:
    if settings.hugepages_size not in hugepages.HUGEPAGE_SIZES_KB:
        raise TuningError(
            "hugepages_size",
            f"use one of {', '.join(hugepages.HUGEPAGE_SIZES_KB)} (2 MB or 1 GB pages)",
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
        ("thp", thp.THP_MODES),
        ("thp_defrag", thp.THP_DEFRAG_MODES),
        ("irqbalance", irq.IRQBALANCE_MODES),
    ):
        value = getattr(settings, name)
        if value is not None and value not in allowed:
            raise TuningError(name, f"use one of {', '.join(allowed)}, or null to leave it alone")
