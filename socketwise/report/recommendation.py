"""Recommendation: the layout to run per load range, and how it compares with plain vLLM.

Plain Python with no Ansible import, no plotting. Methods (docs/guides/sweeps-and-reports.md):

- Recommended layout per load range: SN (else the first layout) until a challenger
  overtakes it for good (`crossover.overtake`), then that layout until another overtakes
  it.
- Against plain vLLM: the `baseline` layout (vLLM's own defaults behind the same front
  door) is never recommended; every other layout's figures at each load are given as a
  ratio to its, and the baseline is as good as the recommended layout at a load where
  that layout is not ahead of it (`crossover.ahead_of`).
"""

from __future__ import annotations

from socketwise.measure import rundir
from socketwise.report.crossover import BASE_LAYOUT, TOLERANCE, ahead_of, overtake
from socketwise.report.points import UNITS, Curves, Point, fmt_load, fmt_loads

# Plain vLLM, measured for comparison (socketwise sweep --layouts baseline,...).
BASELINE_LAYOUT = rundir.BASELINE
# The figures given as a ratio to the baseline's: throughput (above 1 is better) and
# latency (below 1 is better); a latency ratio above 1 + LATENCY_TOLERANCE is named.
BASELINE_RATIOS = ("output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms")
LATENCY_TOLERANCE = 0.10
_LATENCY_NAMES = {"ttft_p50_ms": "TTFT p50", "ttft_p99_ms": "TTFT p99", "tpot_p50_ms": "TPOT p50"}


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
                # A later challenger must overtake the new incumbent where it leads; one
                # ahead of it everywhere there takes the incumbent's whole range.
                above = [p for p in curves[incumbent] if p.load >= floor]
                result = overtake(above, curves[name], axis, (incumbent, name))
                accepted = ("found", "ahead-everywhere")
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
        # Ahead everywhere above the floor: the next challenger is judged from there too.
        floor = options[name]["between"][1] if options[name]["between"] else floor
        incumbent = name
    ranges = _ranges(curves, axis, base, switches)
    chosen = {r["layout"] for r in ranges}
    # A layout that another is ahead of everywhere it would have held.
    displaced = {
        held: f"{taker} is ahead of it wherever it would hold: {result['evidence']}"
        for held, taker, result in switches
        if result["status"] == "ahead-everywhere" and held != base
    }
    not_recommended = {
        name: displaced.get(name, crossovers[name]["evidence"])
        if name != base
        else _base_loses(base, crossovers)
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
        start = "" if since is None else f"from {fmt_load(since)} "
        spikes = [x for x in result["ahead_at"] if x < high]
        rule = (
            f"{held}{default} {start}up to {fmt_load(result[axis])} {unit}, the {held}/{taker} "
            f"crossover (interpolated between the measured {fmt_load(low)} and "
            f"{fmt_load(high)}): "
            f"{taker} is ahead of {held} {margin} at every measured {axis} from {fmt_load(high)} "
            f"up, not at {fmt_load(low)}"
        )
        if spikes:
            rule += f"; its lead at {fmt_loads(spikes)} is not sustained, so it does not count"
        ranges.append({bound: result[axis], "layout": held, "rule": rule})
        since = result[axis]
    top = max(p.load for points in curves.values() for p in points)
    if not switches:
        rule = f"{base} at every measured {axis} up to {fmt_load(top)} {unit}: " + (
            "no other layout stays ahead of it to the highest measured load (see not_recommended)"
            if len(curves) > 1
            else "the only layout measured"
        )
        return [{bound: None, "layout": base, "rule": rule}]
    held, taker, result = switches[-1]
    if result["status"] == "found":
        rule = (
            f"{taker} above {fmt_load(result[axis])} {unit}: ahead of {held} {margin} at every "
            f"measured {axis} from {fmt_load(result['between'][1])} to {fmt_load(top)} {unit}"
        )
    elif since is not None:
        # Ahead of a later incumbent everywhere it led: it takes over where that one did.
        rule = f"{taker} above {fmt_load(since)} {unit}: {result['evidence']}"
    else:
        rule = f"{taker} at every measured {axis}: {result['evidence']}"
    ranges.append({bound: None, "layout": taker, "rule": rule})
    return ranges


def _base_loses(base: str, crossovers: dict) -> str:
    winners = [n for n, c in crossovers.items() if c["status"] == "ahead-everywhere"]
    return f"{', '.join(winners)} ahead of {base} at every measured load"


BASELINE_METHOD = (
    f"each layout's median at a load divided by the baseline's at the same load (output "
    f"tok/s: above 1 is better; TTFT and TPOT: below 1 is better); the baseline is as good "
    f"as the recommended layout at a load where that layout's median output tok/s is not "
    f"ahead of the baseline's by more than {TOLERANCE:.0%}"
)


def _ratio(point: Point, base: Point, metric: str) -> float | None:
    mine, theirs = point.median(metric), base.median(metric)
    if mine is None or not theirs:
        return None
    return round(mine / theirs, 3)


def _range_at(ranges: list[dict], axis: str, load: float) -> dict:
    """The recommendation's range that holds LOAD ({} when there is none)."""
    for entry in ranges:
        if entry[f"max_{axis}"] is None or load <= entry[f"max_{axis}"]:
            return entry
    return {}


def against_baseline(axes: dict[str, Curves], recommendations: dict[str, dict]) -> dict:
    """Every layout against plain vLLM at each load, and where the baseline would have
    been as good as the recommended layout. Adds `baseline_as_good_at` (the loads of its
    range where it would) to each entry of the recommendations' ranges."""
    if not any(BASELINE_LAYOUT in curves for curves in axes.values()):
        return {"status": f"not measured: no {BASELINE_LAYOUT} layout in this run"}
    ratios: dict[str, dict] = {}
    recommended: dict[str, list] = {}
    slower: list[str] = []
    for axis, curves in axes.items():
        base = {p.load: p for p in curves.get(BASELINE_LAYOUT, [])}
        if not base:
            continue
        ratios[axis] = {
            name: [
                {axis: p.load, **{m: _ratio(p, base[p.load], m) for m in BASELINE_RATIOS}}
                for p in points
                if p.load in base
            ]
            for name, points in curves.items()
            if name != BASELINE_LAYOUT
        }
        ranges = recommendations.get(axis, {}).get("recommendation", [])
        for entry in ranges:
            entry["baseline_as_good_at"] = []
        recommended[axis] = []
        for load, base_point in sorted(base.items()):
            held = _range_at(ranges, axis, load)
            layout = held.get("layout")
            point = {p.load: p for p in curves.get(layout, [])}.get(load)
            if point is None:
                continue
            as_good = not ahead_of(point, base_point)
            row = {axis: load, "layout": layout, "baseline_as_good": as_good}
            row.update({m: _ratio(point, base_point, m) for m in BASELINE_RATIOS})
            recommended[axis].append(row)
            if as_good:
                held["baseline_as_good_at"].append(load)
            slower += [
                f"{_LATENCY_NAMES[m]} {row[m]:g}x at {fmt_load(load)} {UNITS[axis]} ({layout})"
                for m in BASELINE_RATIOS[1:]
                if row[m] is not None and row[m] > 1 + LATENCY_TOLERANCE
            ]
    as_good_at = {
        axis: [row[axis] for row in rows if row["baseline_as_good"]]
        for axis, rows in recommended.items()
    }
    return {
        "status": "measured",
        "layout": BASELINE_LAYOUT,
        "method": BASELINE_METHOD,
        "ratios": ratios,
        "recommended": recommended,
        "as_good_at": as_good_at,
        "summary": _baseline_summary(recommended, as_good_at, slower),
    }


def _baseline_summary(recommended: dict, as_good_at: dict, slower: list[str]) -> str:
    if not any(recommended.values()):
        return "the recommended layouts were not measured at the baseline's loads"
    parts = []
    for axis, rows in recommended.items():
        if not rows:
            continue
        unit = UNITS[axis]
        good = as_good_at[axis]
        tok = ", ".join(f"{r['output_tok_s']:g}x at {fmt_load(r[axis])}" for r in rows)
        if len(good) == len(rows):
            verdict = f"plain vLLM would have been as good at every measured {axis}"
        elif good:
            verdict = f"plain vLLM would have been as good at {fmt_loads(good)} {unit} only"
        else:
            verdict = f"the recommended layout beats plain vLLM at every measured {axis}"
        parts.append(f"by {axis}: {verdict} (output tok/s against plain vLLM: {tok} {unit})")
    text = "; ".join(parts)
    if slower:
        text += f"; latency above plain vLLM's by more than {LATENCY_TOLERANCE:.0%}: " + ", ".join(
            slower
        )
    return text
