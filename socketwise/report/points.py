"""Run-directory steps reduced to points (median/min/max of the repetitions per load),
grouped by host, axis and layout; the number formats every report text uses; and the
positive numbers of a hand-made manifest's mappings."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from socketwise.measure import rundir

# Plain vLLM (the sweep's `baseline`) first: every other layout is read against it.
LAYOUT_ORDER = (rundir.BASELINE, "sn", "tp", "dp", "dp-vllm")
UNITS = {"rate": "req/s", "concurrency": "concurrent"}


# --- points ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """The repetitions of one (host, layout, axis, load), reduced to median/min/max."""

    load: float
    repetitions: int
    stats: dict[str, dict[str, float] | None]
    completed: int | None
    failed: int | None

    @property
    def tok(self) -> float:
        return self.stats["output_tok_s"]["median"]

    def median(self, metric: str) -> float | None:
        spread = self.stats[metric]
        return None if spread is None else spread["median"]

    @property
    def failed_share(self) -> float | None:
        if self.failed is None:
            return None
        total = self.failed + (self.completed or 0)
        return self.failed / total if total else 0.0


def _spread(values: list[float | None]) -> dict[str, float] | None:
    known = [v for v in values if v is not None]
    if not known:
        return None
    return {"median": statistics.median(known), "min": min(known), "max": max(known)}


def sum_counts(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def points_of(steps: list[rundir.Step]) -> list[Point]:
    by_load: dict[float, list[rundir.Step]] = {}
    for step in steps:
        by_load.setdefault(step.load, []).append(step)
    return [
        Point(
            load=load,
            repetitions=len(reps),
            stats={m: _spread([getattr(s, m) for s in reps]) for m in rundir.METRICS},
            completed=sum_counts([s.completed for s in reps]),
            failed=sum_counts([s.failed for s in reps]),
        )
        for load, reps in sorted(by_load.items())
    ]


def layout_key(layout: str) -> tuple[int, str]:
    return (LAYOUT_ORDER.index(layout) if layout in LAYOUT_ORDER else len(LAYOUT_ORDER), layout)


Curves = dict[str, list[Point]]  # layout -> points of one axis, sorted by load


def group(steps: list[rundir.Step]) -> dict[str, dict[str, Curves]]:
    """host -> axis -> layout -> points."""
    grouped: dict[str, dict[str, dict[str, list[rundir.Step]]]] = {}
    for step in steps:
        grouped.setdefault(step.host, {}).setdefault(step.axis, {}).setdefault(
            step.layout, []
        ).append(step)
    return {
        host: {
            axis: {
                layout: points_of(by_layout[layout]) for layout in sorted(by_layout, key=layout_key)
            }
            for axis, by_layout in sorted(axes.items(), key=lambda kv: rundir.AXES.index(kv[0]))
        }
        for host, axes in sorted(grouped.items())
    }


# --- formatting -----------------------------------------------------------------------


def fmt_num(value: float | None) -> str:
    if value is None:
        return "-"
    size = abs(value)
    if size >= 100 or value == int(value) and size >= 10:
        return f"{value:.0f}"
    if size >= 10:
        return f"{value:.1f}"
    if size >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def fmt_count(value: int | None) -> str:
    return "-" if value is None else str(value)


def fmt_load(value: float) -> str:
    return f"{value:g}"


def rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def fmt_step_load(step: dict) -> str:
    """A step's load with its unit, as the tables show it."""
    return f"{fmt_load(step[step['axis']])} {UNITS[step['axis']]}"


def fmt_loads(values: Iterable[float]) -> str:
    return ", ".join(fmt_load(v) for v in values)


# --- crossover and recommendation -----------------------------------------------------


def positive_numbers(mapping: object) -> dict[str, float]:
    """{key: value} of MAPPING's finite values above 0 (a hand-made manifest may hold any)."""
    if not isinstance(mapping, dict):
        return {}
    found = {}
    for key, value in mapping.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number) and number > 0:
            found[str(key)] = number
    return found
