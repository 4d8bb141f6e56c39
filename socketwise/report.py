"""The report of a run directory: the decisions (crossover, saturation, recommended layout
per load range, bandwidth limit, energy) and report.md / report.html with plots.

Plain Python with no Ansible import; `socketwise report RUN_DIR [--json]` is its door.
`analyse(run_dir)` returns the decisions as JSON-ready data, `write(run_dir)` renders
them. Methods (README, "Reports"), all on the median of the repetitions of each point:

- A layout is *ahead* of another at a load point when its median output tok/s is higher
  by more than TOLERANCE of the larger one and, when both points were repeated, also
  above the other's maximum.
- Crossover of a challenger over the incumbent (SN first): the lowest measured load from
  which the challenger is ahead at every higher measured load, shared by both, with at
  least CONFIRM_POINTS such loads. A lead that does not last to the top of the measured
  range (one spike) does not count; a lead at the top point alone is unconfirmed. The
  value is interpolated linearly, within the bracketing points, where the challenger's
  lead less the tolerance crosses zero.
- Saturation: a point *departs* when its throughput is not above (1 + GAIN) times the
  best so far, or (by rate only) its TTFT p50 exceeds TTFT_FACTOR times that at the
  lowest load, or more than ERROR_SHARE of its requests failed. Saturation is the last
  load before the first departure that persists at the next point too.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import statistics
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from socketwise import rundir

TOLERANCE = 0.03
CONFIRM_POINTS = 2
GAIN = 0.05
TTFT_FACTOR = 3.0
ERROR_SHARE = 0.01
BASE_LAYOUT = "sn"
LAYOUT_ORDER = ("sn", "tp", "dp", "dp-vllm")
UNITS = {"rate": "req/s", "concurrency": "concurrent"}
PLOTS_DIR = "plots"
SCHEMA = 1
CROSSOVER_METHOD = (
    f"lowest measured load from which the challenger's median output tok/s is ahead of the "
    f"incumbent's (by more than {TOLERANCE:.0%} of the larger, and above its maximum when "
    f"both are repeated) at every higher load measured by both, on at least "
    f"{CONFIRM_POINTS} loads; interpolated between the bracketing loads"
)
SATURATION_METHOD = (
    f"last load before the first point that departs, persistently (the next point departs "
    f"too): throughput not above {1 + GAIN:g}x the best so far, TTFT p50 above "
    f"{TTFT_FACTOR:g}x its lowest-load value (by rate only: in a closed loop latency grows "
    f"with concurrency by construction), or more than {ERROR_SHARE:.0%} failed (medians)"
)


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


def _sum(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _points(steps: list[rundir.Step]) -> list[Point]:
    by_load: dict[float, list[rundir.Step]] = {}
    for step in steps:
        by_load.setdefault(step.load, []).append(step)
    return [
        Point(
            load=load,
            repetitions=len(reps),
            stats={m: _spread([getattr(s, m) for s in reps]) for m in rundir.METRICS},
            completed=_sum([s.completed for s in reps]),
            failed=_sum([s.failed for s in reps]),
        )
        for load, reps in sorted(by_load.items())
    ]


def _layout_key(layout: str) -> tuple[int, str]:
    return (LAYOUT_ORDER.index(layout) if layout in LAYOUT_ORDER else len(LAYOUT_ORDER), layout)


Curves = dict[str, list[Point]]  # layout -> points of one axis, sorted by load


def _group(steps: list[rundir.Step]) -> dict[str, dict[str, Curves]]:
    """host -> axis -> layout -> points."""
    grouped: dict[str, dict[str, dict[str, list[rundir.Step]]]] = {}
    for step in steps:
        grouped.setdefault(step.host, {}).setdefault(step.axis, {}).setdefault(
            step.layout, []
        ).append(step)
    return {
        host: {
            axis: {
                layout: _points(by_layout[layout]) for layout in sorted(by_layout, key=_layout_key)
            }
            for axis, by_layout in sorted(axes.items(), key=lambda kv: rundir.AXES.index(kv[0]))
        }
        for host, axes in sorted(grouped.items())
    }


# --- formatting -----------------------------------------------------------------------


def _num(value: float | None) -> str:
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


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _load(value: float) -> str:
    return f"{value:g}"


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _step_load(step: dict) -> str:
    """A step's load with its unit, as the tables show it."""
    return f"{_load(step[step['axis']])} {UNITS[step['axis']]}"


def _loads(values: Iterable[float]) -> str:
    return ", ".join(_load(v) for v in values)


# --- crossover and recommendation -----------------------------------------------------


def _ahead(a: Point, b: Point) -> bool:
    if a.tok - b.tok <= TOLERANCE * max(a.tok, b.tok):
        return False
    if a.repetitions > 1 and b.repetitions > 1:
        return a.tok > b.stats["output_tok_s"]["max"]
    return True


def _margin(a: Point, b: Point) -> float:
    return a.tok - b.tok - TOLERANCE * max(a.tok, b.tok)


def overtake(incumbent: list[Point], challenger: list[Point], axis: str, names: tuple[str, str]):
    """Where `challenger` overtakes `incumbent` for good (see the module docstring)."""
    inc_name, ch_name = names
    unit = UNITS[axis]
    inc = {p.load: p for p in incumbent}
    ch = {p.load: p for p in challenger}
    common = sorted(set(inc) & set(ch))
    result = {"status": "", axis: None, "between": None, "evidence": "", "ahead_at": []}
    if not common:
        result["status"] = "no-common-points"
        result["evidence"] = f"{ch_name} and {inc_name} share no measured {axis}"
        return result
    ahead = [_ahead(ch[x], inc[x]) for x in common]
    result["ahead_at"] = [x for x, is_ahead in zip(common, ahead, strict=True) if is_ahead]
    first = len(common)
    while first > 0 and ahead[first - 1]:
        first -= 1
    lead = common[first:]
    spikes = [x for x in result["ahead_at"] if x not in lead]
    spike_note = (
        f"; its lead at {_loads(spikes)} {unit} is not sustained at higher load, so it does "
        f"not count"
        if spikes
        else ""
    )
    pairs = "; ".join(f"{_load(x)}: {_num(ch[x].tok)} vs {_num(inc[x].tok)}" for x in common)
    tok = f" (median output tok/s {ch_name} vs {inc_name} at {axis} {pairs})"
    if not result["ahead_at"]:
        result["status"] = "never"
        result["evidence"] = f"{ch_name} is ahead of {inc_name} at no measured {axis}{tok}"
    elif not lead:
        result["status"] = "never"
        result["evidence"] = (
            f"{ch_name} is not ahead of {inc_name} at the highest measured {axis} "
            f"{_load(common[-1])}{spike_note}{tok}"
        )
    elif len(lead) < CONFIRM_POINTS:
        result["status"] = "unconfirmed"
        result["evidence"] = (
            f"{ch_name} is ahead of {inc_name} only at the highest measured {axis} "
            f"{_load(lead[0])}: one point is not enough, measure beyond it{spike_note}{tok}"
        )
    elif first == 0:
        result["status"] = "ahead-everywhere"
        result["evidence"] = (
            f"{ch_name} is ahead of {inc_name} by more than {TOLERANCE:.0%} at every measured "
            f"{axis} ({_loads(common)} {unit}), so any crossover lies below "
            f"{_load(common[0])}{tok}"
        )
    else:
        low, high = common[first - 1], common[first]
        m_low, m_high = _margin(ch[low], inc[low]), _margin(ch[high], inc[high])
        share = -m_low / (m_high - m_low) if m_high > m_low else 0.0
        result["status"] = "found"
        result[axis] = round(low + min(1.0, max(0.0, share)) * (high - low), 2)
        result["between"] = [low, high]
        result["evidence"] = (
            f"{ch_name} is ahead of {inc_name} by more than {TOLERANCE:.0%} at every measured "
            f"{axis} from {_load(high)} to {_load(common[-1])} {unit}, not at {_load(low)}"
            f"{spike_note}{tok}"
        )
    return result


def recommend(curves: Curves, axis: str) -> dict:
    """Recommended layout per load range on one axis: SN (else the first layout) until a
    challenger overtakes it for good, then that layout until another overtakes it."""
    layouts = list(curves)
    if not layouts:
        return {"recommendation": [], "crossovers": {}, "not_recommended": {}}
    base = BASE_LAYOUT if BASE_LAYOUT in curves else layouts[0]
    crossovers = {
        name: overtake(curves[base], curves[name], axis, (base, name))
        for name in layouts
        if name != base
    }
    switches: list[tuple[str, str, dict]] = []  # (overtaken, overtaking, overtake result)
    incumbent, floor = base, 0.0
    while True:
        options = {}
        for name in layouts:
            if name == base or any(name == to for _, to, _ in switches):
                continue
            if incumbent == base:
                result, accepted = crossovers[name], ("found", "ahead-everywhere")
            else:
                # A later challenger must overtake the new incumbent where it already leads.
                above = [p for p in curves[incumbent] if p.load >= floor]
                result = overtake(above, curves[name], axis, (incumbent, name))
                accepted = ("found",)
            if result["status"] in accepted:
                options[name] = result
        if not options:
            break
        name = min(
            options,
            key=lambda n: (
                options[n][axis] if options[n][axis] is not None else float("-inf"),
                -max(p.tok for p in curves[n]),
            ),
        )
        switches.append((incumbent, name, options[name]))
        floor = options[name]["between"][1] if options[name]["between"] else 0.0
        incumbent = name
    ranges = _ranges(curves, axis, base, switches)
    chosen = {r["layout"] for r in ranges}
    not_recommended = {
        name: crossovers[name]["evidence"] if name != base else _base_loses(base, crossovers)
        for name in layouts
        if name not in chosen
    }
    return {"recommendation": ranges, "crossovers": crossovers, "not_recommended": not_recommended}


def _ranges(curves: Curves, axis: str, base: str, switches: list) -> list[dict]:
    unit, bound = UNITS[axis], f"max_{axis}"
    margin = f"by more than {TOLERANCE:.0%} of median output tok/s"
    ranges = []
    since = None
    for held, taker, result in switches:
        if result["status"] != "found":
            continue  # ahead everywhere: the overtaken layout holds no range
        low, high = result["between"]
        default = " (the single-node default)" if held == base else ""
        start = "" if since is None else f"from {_load(since)} "
        spikes = [x for x in result["ahead_at"] if x < high]
        rule = (
            f"{held}{default} {start}up to {_load(result[axis])} {unit}, the {held}/{taker} "
            f"crossover (interpolated between the measured {_load(low)} and {_load(high)}): "
            f"{taker} is ahead of {held} {margin} at every measured {axis} from {_load(high)} "
            f"up, not at {_load(low)}"
        )
        if spikes:
            rule += f"; its lead at {_loads(spikes)} is not sustained, so it does not count"
        ranges.append({bound: result[axis], "layout": held, "rule": rule})
        since = result[axis]
    top = max(p.load for points in curves.values() for p in points)
    if not switches:
        rule = f"{base} at every measured {axis} up to {_load(top)} {unit}: " + (
            "no other layout stays ahead of it to the highest measured load (see not_recommended)"
            if len(curves) > 1
            else "the only layout measured"
        )
        return [{bound: None, "layout": base, "rule": rule}]
    held, taker, result = switches[-1]
    if result["status"] == "found":
        rule = (
            f"{taker} above {_load(result[axis])} {unit}: ahead of {held} {margin} at every "
            f"measured {axis} from {_load(result['between'][1])} to {_load(top)} {unit}"
        )
    else:
        rule = f"{taker} at every measured {axis}: {result['evidence']}"
    ranges.append({bound: None, "layout": taker, "rule": rule})
    return ranges


def _base_loses(base: str, crossovers: dict) -> str:
    winners = [n for n, c in crossovers.items() if c["status"] == "ahead-everywhere"]
    return f"{', '.join(winners)} ahead of {base} at every measured load"


# --- saturation -----------------------------------------------------------------------


def saturation(points: list[Point], axis: str) -> dict:
    unit = UNITS[axis]
    entry = {
        "axis": axis,
        axis: None,
        "between": None,
        "status": "",
        "method": SATURATION_METHOD,
        "evidence": "",
        "peak_output_tok_s": _round(max(p.tok for p in points)),
        f"peak_at_{axis}": max(points, key=lambda p: p.tok).load,
    }
    if len(points) < 2:
        entry["status"] = "too-few-points"
        entry["evidence"] = f"one measured {axis}: a saturation point needs at least two"
        return entry
    base_ttft = points[0].median("ttft_p50_ms")
    best = points[0].tok
    signals: list[list[str]] = [[]]
    for point in points[1:]:
        reasons = []
        if point.tok <= best * (1 + GAIN):
            reasons.append(
                f"{_num(point.tok)} tok/s at {_load(point.load)} is no gain over the best "
                f"{_num(best)} so far"
            )
        ttft = point.median("ttft_p50_ms")
        # In a closed loop latency grows with concurrency by construction (Little's law),
        # so there only throughput and errors tell saturation.
        if axis == "rate" and base_ttft and ttft is not None and ttft > TTFT_FACTOR * base_ttft:
            reasons.append(
                f"TTFT p50 {_num(ttft)} ms at {_load(point.load)} is over {TTFT_FACTOR:g}x the "
                f"{_num(base_ttft)} ms at {_load(points[0].load)}"
            )
        share = point.failed_share
        if share is not None and share > ERROR_SHARE:
            reasons.append(f"{share:.0%} of requests failed at {_load(point.load)}")
        signals.append(reasons)
        best = max(best, point.tok)
    for i in range(1, len(points)):
        if not signals[i]:
            continue
        last_point = i == len(points) - 1
        if not last_point and not signals[i + 1]:
            continue  # one noisy point: the next one recovers
        entry[axis] = points[i - 1].load
        entry["between"] = [points[i - 1].load, points[i].load]
        seen = signals[i] + ([] if last_point else signals[i + 1])
        if last_point:
            entry["status"] = "unconfirmed"
            entry["evidence"] = (
                "; ".join(seen) + f"; only at the highest measured {axis}, measure beyond "
                f"{_load(points[i].load)} {unit} to confirm"
            )
        else:
            entry["status"] = "confirmed"
            entry["evidence"] = "; ".join(seen)
        return entry
    entry["status"] = "not-reached"
    entry["evidence"] = (
        f"throughput still rising and latency steady up to the highest measured {axis} "
        f"{_load(points[-1].load)} {unit}"
    )
    return entry


# --- bandwidth limit, errors, energy --------------------------------------------------


def bandwidth(axes: dict[str, Curves], facts: dict | None) -> dict:
    """Share of the decode bound (bandwidth / weight bytes) reached at the lowest load."""
    try:
        model_bytes = float(facts["model_bytes"])
        gbps = float(facts["bandwidth_gbps"])
    except (TypeError, KeyError, ValueError):
        return {"status": "not measured: manifest.json has no model_bytes and bandwidth_gbps"}
    if model_bytes <= 0 or gbps <= 0:
        return {"status": "not measured: model_bytes and bandwidth_gbps must be above 0"}
    limit = gbps * 1e9 / model_bytes
    layouts = {}
    names = sorted({n for curves in axes.values() for n in curves}, key=_layout_key)
    for name in names:
        closed = {p.load: p for p in axes.get("concurrency", {}).get(name, [])}
        if 1 in closed:
            point, basis = closed[1], "concurrency 1"
        else:
            axis = "rate" if name in axes.get("rate", {}) else "concurrency"
            point = axes[axis][name][0]
            basis = f"lowest {axis} {_load(point.load)} (no concurrency-1 step)"
        layouts[name] = {
            "basis": basis,
            "output_tok_s": _round(point.tok),
            "fraction": round(point.tok / limit, 3),
        }
    return {
        "status": "measured",
        "bandwidth_gbps": gbps,
        "model_bytes": int(model_bytes),
        "limit_tok_s": round(limit, 3),
        "note": "limit of one NUMA node; a TP layout over N nodes reads N times as fast",
        "layouts": layouts,
    }


def errors(axes: dict[str, Curves]) -> dict:
    steps = [
        {
            "layout": name,
            "axis": axis,
            axis: p.load,
            "failed": p.failed,
            "completed": p.completed,
        }
        for axis, curves in axes.items()
        for name, points in curves.items()
        for p in points
    ]
    counted = [s["failed"] for s in steps if s["failed"] is not None]
    return {
        "failed": sum(counted) if counted else None,
        "completed": _sum([s["completed"] for s in steps]),
        "steps_with_failures": [s for s in steps if s["failed"]],
    }


def energy(axes: dict[str, Curves], rows: list[rundir.PowerRow] | None, host: str) -> dict:
    if rows is None:
        return {"status": "not measured: no power.csv"}
    rows = [r for r in rows if r.host == host]
    if not rows:
        return {"status": f"not measured: power.csv has no row for {host}"}
    sources = sorted({r.source for r in rows}, key=lambda s: (s != "ipmi", s != "rapl", s))
    by_source = {}
    for source in sources:
        mine = [r for r in rows if r.source == source]
        idle_rows = [r.watts for r in mine if r.layout == rundir.IDLE]
        idle = statistics.median(idle_rows) if idle_rows else None
        steps = []
        for axis, curves in axes.items():
            for name, points in curves.items():
                for p in points:
                    watts = [
                        r.watts for r in mine if (r.layout, r.axis, r.load) == (name, axis, p.load)
                    ]
                    if not watts:
                        continue
                    w = statistics.median(watts)
                    above = w - idle if idle is not None else None
                    steps.append(
                        {
                            "layout": name,
                            "axis": axis,
                            axis: p.load,
                            "watts": _round(w, 2),
                            "output_tok_s": _round(p.tok),
                            "tok_per_w": _round(p.tok / w) if w > 0 else None,
                            "tok_per_w_above_idle": _round(p.tok / above)
                            if above and above > 0
                            else None,
                        }
                    )
        by_source[source] = {"idle_watts": idle, "steps": steps}
    primary = sources[0]
    return {
        "status": "measured",
        "source": primary,
        "idle_watts": by_source[primary]["idle_watts"],
        "steps": by_source[primary]["steps"],
        "sources": by_source,
    }


# --- analysis -------------------------------------------------------------------------


def _series(axes: dict[str, Curves]) -> dict:
    return {
        axis: {
            name: [
                {
                    axis: p.load,
                    "repetitions": p.repetitions,
                    **{
                        m: None
                        if p.stats[m] is None
                        else {k: _round(v) for k, v in p.stats[m].items()}
                        for m in rundir.METRICS
                    },
                    "completed": p.completed,
                    "failed": p.failed,
                }
                for p in points
            ]
            for name, points in curves.items()
        }
        for axis, curves in axes.items()
    }


def _host_decisions(axes: dict[str, Curves], facts: dict | None, power, host: str) -> dict:
    by_axis = {axis: recommend(curves, axis) for axis, curves in axes.items()}
    rate = by_axis.get("rate", {"recommendation": [], "crossovers": {}, "not_recommended": {}})
    pair = _crossover_pair(axes.get("rate", {}), rate["crossovers"])
    crossover = rate["crossovers"].get(pair[1]) if pair else None
    decisions = {
        "crossover_rate": crossover["rate"] if crossover else None,
        "crossover_between": crossover["between"] if crossover else None,
        "crossover_layouts": list(pair) if pair else None,
        "crossover_status": crossover["status"] if crossover else "not-measured",
        "crossover_method": CROSSOVER_METHOD,
        "crossovers": rate["crossovers"],
        "saturation": {},
        "recommendation": rate["recommendation"],
        "not_recommended": dict(rate["not_recommended"]),
    }
    by_axis_saturation = {
        axis: {name: saturation(points, axis) for name, points in curves.items()}
        for axis, curves in axes.items()
    }
    names = sorted({n for curves in axes.values() for n in curves}, key=_layout_key)
    # One entry per layout: by rate where it was measured by rate, else by concurrency.
    decisions["saturation"] = {
        name: by_axis_saturation.get("rate", {}).get(name)
        or by_axis_saturation["concurrency"][name]
        for name in names
    }
    if "concurrency" in by_axis:
        closed = by_axis["concurrency"]
        pair_c = _crossover_pair(axes["concurrency"], closed["crossovers"])
        cross_c = closed["crossovers"].get(pair_c[1]) if pair_c else None
        decisions["by_concurrency"] = {
            "crossover_concurrency": cross_c["concurrency"] if cross_c else None,
            "crossover_between": cross_c["between"] if cross_c else None,
            "crossover_layouts": list(pair_c) if pair_c else None,
            "crossover_status": cross_c["status"] if cross_c else "not-measured",
            "crossovers": closed["crossovers"],
            "saturation": by_axis_saturation["concurrency"],
            "recommendation": closed["recommendation"],
            "not_recommended": closed["not_recommended"],
        }
    # A layout measured only by concurrency is still named, so nobody reads silence as
    # "not considered".
    for name in axes.get("concurrency", {}):
        if name not in axes.get("rate", {}) and "rate" in axes:
            why = by_axis["concurrency"]["not_recommended"].get(name)
            decisions["not_recommended"][name] = "not measured by rate" + (
                f"; by concurrency: {why}" if why else "; by concurrency it is recommended"
            )
    decisions["bandwidth"] = bandwidth(axes, facts)
    decisions["errors"] = errors(axes)
    decisions["energy"] = energy(axes, power, host)
    decisions["series"] = _series(axes)
    return decisions


def _crossover_pair(curves: Curves, crossovers: dict) -> tuple[str, str] | None:
    """(sn, the DP layout) whose crossover is the headline: `dp`, else the first dp-*."""
    dps = [n for n in crossovers if n == "dp"] or [n for n in crossovers if n.startswith("dp")]
    return (BASE_LAYOUT, dps[0]) if dps and BASE_LAYOUT in curves else None


def analyse(run_dir: str | Path) -> dict:
    """The decisions of a run directory (see README, "Reports", for every key)."""
    run_dir = Path(run_dir)
    steps = rundir.read_summary(run_dir)
    manifest = rundir.read_manifest(run_dir)
    power = rundir.read_power(run_dir)
    grouped = _group(steps)
    facts = (manifest or {}).get("hosts", {})
    hosts = {
        host: _host_decisions(axes, facts.get(host), power, host) for host, axes in grouped.items()
    }
    notes = [
        f"{host}: no rate (open-loop) steps, so the rate decisions are empty; see by_concurrency"
        for host, axes in grouped.items()
        if "rate" not in axes
    ]
    if manifest is None:
        notes.append("no manifest.json: bandwidth limit not computed")
    if power is None:
        notes.append("no power.csv: energy not measured")
    result = {
        "schema": SCHEMA,
        "run_dir": str(run_dir),
        "inputs": {
            rundir.SUMMARY: len(steps),
            rundir.MANIFEST: manifest is not None,
            rundir.POWER: power is not None,
        },
        "notes": notes,
        "host": None,
        "hosts": hosts,
    }
    if len(hosts) == 1:
        ((host, decisions),) = hosts.items()
        result["host"] = host
        result.update(decisions)
    else:
        notes.append(f"{len(hosts)} hosts: the decisions of each are under hosts.<name>")
        result.update(crossover_rate=None, crossover_between=None, saturation={}, recommendation=[])
    return result


# --- the document: one list of blocks, rendered as Markdown and as HTML ----------------

Block = tuple  # ("h", level, text) | ("p", text) | ("list", items) | ("table", head, rows)
# | ("img", relative path, alt text)


def _spread_text(spread: dict | None, repetitions: int) -> str:
    if spread is None:
        return "-"
    text = _num(spread["median"])
    if repetitions > 1:
        text += f" ({_num(spread['min'])}-{_num(spread['max'])}, n={repetitions})"
    return text


def _range_text(recommendation: list[dict], index: int, axis: str) -> str:
    bound = f"max_{axis}"
    low = recommendation[index - 1][bound] if index else None
    high = recommendation[index][bound]
    unit = UNITS[axis]
    if low is None and high is None:
        return "all measured loads"
    if low is None:
        return f"up to {_load(high)} {unit}"
    if high is None:
        return f"above {_load(low)} {unit}"
    return f"{_load(low)} to {_load(high)} {unit}"


def _recommendation_blocks(rec: list[dict], not_rec: dict, axis: str) -> list[Block]:
    blocks: list[Block] = [
        (
            "table",
            ["load range", "layout", "rule"],
            [[_range_text(rec, i, axis), r["layout"], r["rule"]] for i, r in enumerate(rec)],
        )
    ]
    if not_rec:
        blocks.append(("p", "Not recommended:"))
        blocks.append(("list", [f"{name}: {why}" for name, why in not_rec.items()]))
    return blocks


def _crossover_text(axis: str, value, between, layouts, status: str, crossovers: dict) -> str:
    unit = UNITS[axis]
    if layouts is None:
        return f"SN/DP crossover by {axis}: not measured (needs sn and a dp layout by {axis})."
    dp = layouts[1]
    if value is not None:
        return (
            f"SN/DP crossover by {axis}: {_load(value)} {unit}, between the measured "
            f"{_load(between[0])} and {_load(between[1])} {unit}: {crossovers[dp]['evidence']}."
        )
    return f"SN/DP crossover by {axis}: none ({status}): {crossovers[dp]['evidence']}."


def _points_table(curves: Curves, axis: str) -> Block:
    rows = []
    for name, points in curves.items():
        for p in points:
            rows.append(
                [name, _load(p.load)]
                + [_spread_text(p.stats[m], p.repetitions) for m in rundir.METRICS]
                + [_count(p.completed), _count(p.failed)]
            )
    head = [
        "layout",
        axis,
        "output tok/s",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "ITL p50 ms",
        "ITL p99 ms",
        "completed",
        "failed",
    ]
    return ("table", head, rows)


def _host_blocks(host: str, d: dict, axes: dict[str, Curves], plots: dict, level: int) -> list:
    h = level
    blocks: list[Block] = []
    if "rate" in axes:
        blocks.append(("h", h, f"Recommendation for {host} by request rate"))
        blocks += _recommendation_blocks(d["recommendation"], d["not_recommended"], "rate")
        blocks.append(
            (
                "p",
                _crossover_text(
                    "rate",
                    d["crossover_rate"],
                    d["crossover_between"],
                    d["crossover_layouts"],
                    d["crossover_status"],
                    d["crossovers"],
                ),
            )
        )
    if "by_concurrency" in d:
        c = d["by_concurrency"]
        blocks.append(("h", h, f"Recommendation for {host} by concurrency"))
        blocks += _recommendation_blocks(c["recommendation"], c["not_recommended"], "concurrency")
        blocks.append(
            (
                "p",
                _crossover_text(
                    "concurrency",
                    c["crossover_concurrency"],
                    c["crossover_between"],
                    c["crossover_layouts"],
                    c["crossover_status"],
                    c["crossovers"],
                ),
            )
        )
    blocks.append(("h", h, "Saturation"))
    entries = list(d["saturation"].items())
    entries += [
        (n, e)
        for n, e in d.get("by_concurrency", {}).get("saturation", {}).items()
        if d["saturation"][n]["axis"] == "rate"
    ]
    blocks.append(
        (
            "table",
            ["layout", "by", "saturates at", "status", "evidence"],
            [
                [
                    name,
                    e["axis"],
                    "-" if e[e["axis"]] is None else f"{_load(e[e['axis']])} {UNITS[e['axis']]}",
                    e["status"],
                    e["evidence"],
                ]
                for name, e in entries
            ],
        )
    )
    for axis, curves in axes.items():
        title = "request rate" if axis == "rate" else "concurrency"
        blocks.append(("h", h, f"Throughput and latency by {title}"))
        for path, alt in plots.get(axis, []):
            blocks.append(("img", path, alt))
        blocks.append(_points_table(curves, axis))
    blocks.append(("h", h, "Errors"))
    err = d["errors"]
    if err["failed"] is None:
        blocks.append(("p", "Failed requests: not reported (the failed column is empty)."))
    elif not err["steps_with_failures"]:
        blocks.append(("p", f"No failed requests ({_count(err['completed'])} completed)."))
    else:
        blocks.append(
            (
                "table",
                ["layout", "load", "failed", "completed"],
                [
                    [
                        s["layout"],
                        _step_load(s),
                        s["failed"],
                        s["completed"],
                    ]
                    for s in err["steps_with_failures"]
                ],
            )
        )
    blocks.append(("h", h, "Energy"))
    en = d["energy"]
    if en["status"] != "measured":
        blocks.append(("p", f"Energy: {en['status']}."))
    else:
        idle = en["idle_watts"]
        others = [s for s in en["sources"] if s != en["source"]]
        text = f"Mean power per step from {en['source']}; idle " + (
            f"{_num(idle)} W." if idle is not None else "not measured, so no tok/W above idle."
        )
        text += (
            " tok/W is output tok/s per watt (tokens per joule); above idle divides by the "
            "watts above the idle baseline."
        )
        if others:
            text += f" Other sources in the JSON: {', '.join(others)}."
        blocks.append(("p", text))
        for path, alt in plots.get("energy", []):
            blocks.append(("img", path, alt))
        blocks.append(
            (
                "table",
                ["layout", "load", "watts", "output tok/s", "tok/W", "tok/W above idle"],
                [
                    [
                        s["layout"],
                        _step_load(s),
                        _num(s["watts"]),
                        _num(s["output_tok_s"]),
                        _num(s["tok_per_w"]),
                        _num(s["tok_per_w_above_idle"]),
                    ]
                    for s in en["steps"]
                ],
            )
        )
    blocks.append(("h", h, "Bandwidth limit"))
    bw = d["bandwidth"]
    if bw["status"] != "measured":
        blocks.append(("p", f"Bandwidth limit: {bw['status']}."))
    else:
        blocks.append(
            (
                "p",
                f"Decode at batch 1 reads every weight once per token: tok/s <= "
                f"{_num(bw['bandwidth_gbps'])} GB/s / {bw['model_bytes'] / 1e9:.2f} GB = "
                f"{_num(bw['limit_tok_s'])} tok/s ({bw['note']}).",
            )
        )
        blocks.append(
            (
                "table",
                ["layout", "measured at", "output tok/s", "share of the limit"],
                [
                    [n, e["basis"], _num(e["output_tok_s"]), f"{e['fraction']:.1%}"]
                    for n, e in bw["layouts"].items()
                ],
            )
        )
    return blocks


def _document(analysis: dict, axes_by_host: dict, plots: dict) -> list[Block]:
    run = Path(analysis["run_dir"]).name
    inputs = analysis["inputs"]
    blocks: list[Block] = [
        ("h", 1, f"socketwise report: {run}"),
        (
            "p",
            f"{rundir.SUMMARY}: {inputs[rundir.SUMMARY]} rows; {rundir.MANIFEST}: "
            f"{'present' if inputs[rundir.MANIFEST] else 'missing'}; {rundir.POWER}: "
            f"{'present' if inputs[rundir.POWER] else 'missing (energy not measured)'}.",
        ),
    ]
    if analysis["notes"]:
        blocks.append(("list", analysis["notes"]))
    several = len(analysis["hosts"]) > 1
    for host, decisions in analysis["hosts"].items():
        if several:
            blocks.append(("h", 2, f"Host {host}"))
        blocks += _host_blocks(
            host, decisions, axes_by_host[host], plots[host], 3 if several else 2
        )
    blocks.append(("h", 2, "Methods"))
    blocks.append(
        (
            "list",
            [
                "Every value is the median of the repetitions of a point; (min-max, n) shows "
                "their spread.",
                f"Crossover: {CROSSOVER_METHOD}. SN is the default; a layout is recommended "
                f"above its crossover over the layout recommended below it.",
                f"Saturation: {SATURATION_METHOD}.",
                "Bandwidth limit: bandwidth_gbps x 1e9 / model_bytes (manifest.json), against "
                "output tok/s at concurrency 1 (else the lowest load).",
            ],
        )
    )
    return blocks


def _md_cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def render_markdown(blocks: list[Block]) -> str:
    out = []
    for block in blocks:
        kind = block[0]
        if kind == "h":
            out.append(f"{'#' * block[1]} {block[2]}")
        elif kind == "p":
            out.append(block[1])
        elif kind == "list":
            out.append("\n".join(f"- {item}" for item in block[1]))
        elif kind == "table":
            head, rows = block[1], block[2]
            lines = ["| " + " | ".join(_md_cell(h) for h in head) + " |"]
            lines.append("|" + "---|" * len(head))
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
            out.append("\n".join(lines))
        elif kind == "img":
            out.append(f"![{block[2]}]({block[1]})")
    return "\n\n".join(out) + "\n"


_CSS = (
    "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:1em 0;font-size:0.9em}"
    "th,td{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}"
    "th{background:#f0f0f0}img{max-width:100%;display:block;margin:1em 0}"
)


def render_html(blocks: list[Block], title: str) -> str:
    esc = html.escape
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>",
    ]
    for block in blocks:
        kind = block[0]
        if kind == "h":
            out.append(f"<h{block[1]}>{esc(block[2])}</h{block[1]}>")
        elif kind == "p":
            out.append(f"<p>{esc(block[1])}</p>")
        elif kind == "list":
            out.append("<ul>" + "".join(f"<li>{esc(str(i))}</li>" for i in block[1]) + "</ul>")
        elif kind == "table":
            head = "".join(f"<th>{esc(str(h))}</th>" for h in block[1])
            rows = "".join(
                "<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in row) + "</tr>"
                for row in block[2]
            )
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif kind == "img":
            out.append(f'<img src="{esc(block[1])}" alt="{esc(block[2])}">')
    out.append("</body></html>")
    return "\n".join(out) + "\n"


# --- plots ----------------------------------------------------------------------------

_COLOURS = {"sn": "#1f77b4", "tp": "#d62728", "dp": "#2ca02c", "dp-vllm": "#9467bd"}
_SPARE_COLOURS = ("#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def _colour(layout: str, layouts: list[str]) -> str:
    if layout in _COLOURS:
        return _COLOURS[layout]
    others = [n for n in layouts if n not in _COLOURS]
    return _SPARE_COLOURS[others.index(layout) % len(_SPARE_COLOURS)]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


def _figure():
    from matplotlib.figure import Figure  # imported here: analyse() and --json need no plots

    figure = Figure(figsize=(8, 4.2), dpi=110, layout="constrained")
    return figure, figure.subplots()


def _save(figure, run_dir: Path, name: str) -> str:
    path = Path(PLOTS_DIR) / name
    (run_dir / PLOTS_DIR).mkdir(exist_ok=True)
    figure.savefig(run_dir / path, format="png", metadata={"Software": None})
    return path.as_posix()


def _x_axis(ax, axis: str, loads: list[float]) -> None:
    ax.set_xlabel("request rate (req/s)" if axis == "rate" else "concurrency (requests in flight)")
    ax.set_xticks(sorted(set(loads)))
    ax.set_xticklabels([_load(x) for x in sorted(set(loads))])
    ax.grid(True, alpha=0.3)


def _plot_throughput(host, axis, curves, d, run_dir) -> tuple[str, str]:
    figure, ax = _figure()
    names = list(curves)
    loads = [p.load for points in curves.values() for p in points]
    if axis == "rate":
        value, between = d["crossover_rate"], d["crossover_between"]
    else:
        c = d.get("by_concurrency", {})
        value, between = c.get("crossover_concurrency"), c.get("crossover_between")
    if between:
        ax.axvspan(*between, color="#999999", alpha=0.15, label="crossover bracket")
    if value is not None:
        ax.axvline(value, color="#555555", linestyle="--", label=f"crossover {_load(value)}")
    if axis == "concurrency":
        sat = d.get("by_concurrency", {}).get("saturation", {})
    else:
        sat = {n: e for n, e in d["saturation"].items() if e["axis"] == "rate"}
    for name, points in curves.items():
        xs = [p.load for p in points]
        ys = [p.tok for p in points]
        spread = [p.stats["output_tok_s"] for p in points]
        errs = [
            [y - s["min"] for y, s in zip(ys, spread, strict=True)],
            [s["max"] - y for y, s in zip(ys, spread, strict=True)],
        ]
        colour = _colour(name, names)
        ax.errorbar(xs, ys, yerr=errs, color=colour, marker="o", capsize=4, label=name)
        entry = sat.get(name)
        if entry and entry[axis] is not None:
            y = next(p.tok for p in points if p.load == entry[axis])
            ax.plot(
                [entry[axis]],
                [y],
                marker="o",
                markersize=16,
                markerfacecolor="none",
                markeredgecolor=colour,
                linestyle="none",
            )
            ax.annotate(
                f"{name} saturates" + ("" if entry["status"] == "confirmed" else "?"),
                (entry[axis], y),
                textcoords="offset points",
                xytext=(0, 12),
                ha="center",
                fontsize=8,
                color=colour,
            )
    _x_axis(ax, axis, loads)
    ax.set_ylabel("output tok/s (median)")
    ax.set_ylim(
        bottom=0,
        top=max(p.stats["output_tok_s"]["max"] for pts in curves.values() for p in pts) * 1.2,
    )
    ax.set_title(f"{host}: output throughput by {axis}")
    ax.legend(fontsize=8)
    alt = f"{host}: output tok/s by {axis} per layout, crossover and saturation marked"
    return _save(figure, run_dir, f"{_slug(host)}-{axis}-throughput.png"), alt


def _plot_latency(host, axis, curves, metric, label, run_dir) -> tuple[str, str] | None:
    figure, ax = _figure()
    names = list(curves)
    values = []
    for name, points in curves.items():
        colour = _colour(name, names)
        for pct, style in (("p50", "-"), ("p99", "--")):
            series = [(p.load, p.median(f"{metric}_{pct}_ms")) for p in points]
            series = [(x, y) for x, y in series if y is not None]
            if series:
                xs, ys = zip(*series, strict=True)
                values += ys
                ax.plot(xs, ys, color=colour, linestyle=style, marker="o", label=f"{name} {pct}")
    if not values:
        return None
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > 20:
        from matplotlib.ticker import FuncFormatter

        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    _x_axis(ax, axis, [p.load for points in curves.values() for p in points])
    ax.set_ylabel(f"{label} (ms, median)")
    ax.set_title(f"{host}: {label} p50 (solid) and p99 (dashed) by {axis}")
    ax.legend(fontsize=8, ncol=2)
    alt = f"{host}: {label} p50 and p99 by {axis} per layout"
    return _save(figure, run_dir, f"{_slug(host)}-{axis}-{metric}.png"), alt


def _plot_energy(host, steps, names, run_dir) -> list[tuple[str, str]]:
    made = []
    for axis in rundir.AXES:
        mine = [s for s in steps if s["axis"] == axis and s["tok_per_w_above_idle"] is not None]
        if not mine:
            continue
        figure, ax = _figure()
        for name in names:
            pts = [(s[axis], s["tok_per_w_above_idle"]) for s in mine if s["layout"] == name]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, marker="o", color=_colour(name, names), label=name)
        _x_axis(ax, axis, [s[axis] for s in mine])
        ax.set_ylim(bottom=0)
        ax.set_ylabel("output tok/s per watt above idle")
        ax.set_title(f"{host}: energy efficiency above idle by {axis}")
        ax.legend(fontsize=8)
        alt = f"{host}: tok/s per watt above idle by {axis}"
        made.append((_save(figure, run_dir, f"{_slug(host)}-{axis}-energy.png"), alt))
    return made


def _plots(run_dir: Path, host: str, axes: dict[str, Curves], d: dict) -> dict:
    plots: dict[str, list[tuple[str, str]]] = {}
    for axis, curves in axes.items():
        made = [_plot_throughput(host, axis, curves, d, run_dir)]
        for metric, label in (("ttft", "TTFT"), ("itl", "ITL")):
            plot = _plot_latency(host, axis, curves, metric, label, run_dir)
            if plot:
                made.append(plot)
        plots[axis] = made
    if d["energy"]["status"] == "measured":
        names = sorted({n for curves in axes.values() for n in curves}, key=_layout_key)
        plots["energy"] = _plot_energy(host, d["energy"]["steps"], names, run_dir)
    return plots


def write(run_dir: str | Path) -> tuple[Path, Path]:
    """Analyse RUN_DIR and write RUN_DIR/report.md, report.html and plots/*.png."""
    _, markdown, page = _write(Path(run_dir))
    return markdown, page


def _write(run_dir: Path) -> tuple[dict, Path, Path]:
    analysis = analyse(run_dir)
    axes_by_host = _group(rundir.read_summary(run_dir))
    plots = {
        host: _plots(run_dir, host, axes_by_host[host], decisions)
        for host, decisions in analysis["hosts"].items()
    }
    blocks = _document(analysis, axes_by_host, plots)
    markdown, page = run_dir / "report.md", run_dir / "report.html"
    markdown.write_text(render_markdown(blocks))
    page.write_text(render_html(blocks, f"socketwise report: {run_dir.name}"))
    return analysis, markdown, page


# --- CLI door -------------------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help="write report.md/report.html for a run directory; --json prints the decisions",
        description=(
            "Read RUN_DIR/summary.csv (and manifest.json, power.csv when present), decide the "
            "SN/DP crossover, each layout's saturation and the layout per load range, and "
            "write RUN_DIR/report.md and report.html with plots in RUN_DIR/plots/."
        ),
    )
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the run directory")
    parser.add_argument("--json", action="store_true", help="print the decisions as JSON")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        analysis, markdown, page = _write(args.run_dir)
    except rundir.RunDirError as exc:
        print(f"socketwise report: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(analysis, indent=2))
    else:
        print(f"wrote {markdown} and {page}")
    return 0
