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
- Against plain vLLM: the `baseline` layout (vLLM's own defaults behind the same front
  door) is never recommended; every other layout's figures at each load are given as a
  ratio to its, and the baseline is as good as the recommended layout at a load where
  that layout is not ahead of it (the rule above).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from socketwise.measure import rundir
from socketwise.report.points import (
    UNITS,
    Curves,
    Point,
    fmt_load,
    fmt_loads,
    fmt_num,
    group,
    layout_key,
    rounded,
    sum_counts,
)

TOLERANCE = 0.03
CONFIRM_POINTS = 2
GAIN = 0.05
# Throughput is judged flat only against a load at least this much below: closely spaced
# (adaptive) points on a rising line would otherwise each look like no gain.
LOAD_MARGIN = 0.10
TTFT_FACTOR = 3.0
ERROR_SHARE = 0.01
BASE_LAYOUT = "sn"
# Plain vLLM, measured for comparison (socketwise sweep --layouts baseline,...).
BASELINE_LAYOUT = rundir.BASELINE
# The figures given as a ratio to the baseline's: throughput (above 1 is better) and
# latency (below 1 is better); a latency ratio above 1 + LATENCY_TOLERANCE is named.
BASELINE_RATIOS = ("output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms")
LATENCY_TOLERANCE = 0.10
_LATENCY_NAMES = {"ttft_p50_ms": "TTFT p50", "ttft_p99_ms": "TTFT p99", "tpot_p50_ms": "TPOT p50"}
SCHEMA = 1
CROSSOVER_METHOD = (
    f"lowest measured load from which the challenger's median output tok/s is ahead of the "
    f"incumbent's (by more than {TOLERANCE:.0%} of the larger, and above its maximum when "
    f"both are repeated) at every higher load measured by both, on at least "
    f"{CONFIRM_POINTS} loads; one tied point (neither ahead) between two leads does not "
    f"break it; interpolated between the bracketing loads"
)
SATURATION_METHOD = (
    f"last load before the first point that departs, persistently (the next point departs "
    f"too): throughput not above {1 + GAIN:g}x the best so far at a load at least "
    f"{LOAD_MARGIN:.0%} above that best's, TTFT p50 above "
    f"{TTFT_FACTOR:g}x its lowest-load value (by rate only: in a closed loop latency grows "
    f"with concurrency by construction), or more than {ERROR_SHARE:.0%} failed (medians)"
)


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
    # One tied point with a lead on both sides is noise, not the end of the lead.
    bridged = [
        0 < i < len(common) - 1
        and ahead[i - 1]
        and ahead[i + 1]
        and not ahead[i]
        and not _ahead(inc[common[i]], ch[common[i]])
        for i in range(len(common))
    ]
    first = len(common)
    while first > 0 and (ahead[first - 1] or bridged[first - 1]):
        first -= 1
    sustained = common[first:]  # the lead that lasts to the top, bridged ties included
    lead = [x for x in sustained if x in result["ahead_at"]]
    spikes = [x for x in result["ahead_at"] if x not in sustained]
    ties = [x for x in sustained if x not in lead]
    spike_note = (
        f"; its lead at {fmt_loads(spikes)} {unit} is not sustained at higher load, so it does "
        f"not count"
        if spikes
        else ""
    )
    if ties:
        spike_note += f"; level at {fmt_loads(ties)} {unit} between leads, which does not end them"
    pairs = "; ".join(
        f"{fmt_load(x)}: {fmt_num(ch[x].tok)} vs {fmt_num(inc[x].tok)}" for x in common
    )
    tok = f" (median output tok/s {ch_name} vs {inc_name} at {axis} {pairs})"
    if not result["ahead_at"]:
        result["status"] = "never"
        result["evidence"] = f"{ch_name} is ahead of {inc_name} at no measured {axis}{tok}"
    elif not lead:
        result["status"] = "never"
        result["evidence"] = (
            f"{ch_name} is not ahead of {inc_name} at the highest measured {axis} "
            f"{fmt_load(common[-1])}{spike_note}{tok}"
        )
    elif len(lead) < CONFIRM_POINTS:
        result["status"] = "unconfirmed"
        result["evidence"] = (
            f"{ch_name} is ahead of {inc_name} only at the highest measured {axis} "
            f"{fmt_load(lead[0])}: one point is not enough, measure beyond it{spike_note}{tok}"
        )
    elif first == 0:
        result["status"] = "ahead-everywhere"
        result["evidence"] = (
            f"{ch_name} is ahead of {inc_name} by more than {TOLERANCE:.0%} at every measured "
            f"{axis} ({fmt_loads(common)} {unit}), so any crossover lies below "
            f"{fmt_load(common[0])}{spike_note}{tok}"
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
            f"{axis} from {fmt_load(high)} to {fmt_load(common[-1])} {unit}, "
            f"not at {fmt_load(low)}"
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
        "peak_output_tok_s": rounded(max(p.tok for p in points)),
        f"peak_at_{axis}": max(points, key=lambda p: p.tok).load,
    }
    if len(points) < 2:
        entry["status"] = "too-few-points"
        entry["evidence"] = f"one measured {axis}: a saturation point needs at least two"
        return entry
    base_ttft = points[0].median("ttft_p50_ms")
    best = points[0]
    signals: list[list[str]] = [[]]
    for point in points[1:]:
        reasons = []
        grown = point.load >= best.load * (1 + LOAD_MARGIN)
        if grown and point.tok <= best.tok * (1 + GAIN):
            reasons.append(
                f"{fmt_num(point.tok)} tok/s at {fmt_load(point.load)} is no gain over the best "
                f"{fmt_num(best.tok)} so far (at {fmt_load(best.load)})"
            )
        ttft = point.median("ttft_p50_ms")
        # In a closed loop latency grows with concurrency by construction (Little's law),
        # so there only throughput and errors tell saturation.
        if axis == "rate" and base_ttft and ttft is not None and ttft > TTFT_FACTOR * base_ttft:
            reasons.append(
                f"TTFT p50 {fmt_num(ttft)} ms at {fmt_load(point.load)} is over "
                f"{TTFT_FACTOR:g}x the "
                f"{fmt_num(base_ttft)} ms at {fmt_load(points[0].load)}"
            )
        share = point.failed_share
        if share is not None and share > ERROR_SHARE:
            reasons.append(f"{share:.0%} of requests failed at {fmt_load(point.load)}")
        signals.append(reasons)
        if point.tok > best.tok:
            best = point
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
                f"{fmt_load(points[i].load)} {unit} to confirm"
            )
        else:
            entry["status"] = "confirmed"
            entry["evidence"] = "; ".join(seen)
        return entry
    entry["status"] = "not-reached"
    entry["evidence"] = (
        f"throughput still rising and latency steady up to the highest measured {axis} "
        f"{fmt_load(points[-1].load)} {unit}"
    )
    return entry


# --- bandwidth limit, errors, energy --------------------------------------------------


def _stream_nodes(facts: dict, name: str) -> list[str] | None:
    """The NUMA nodes one request's decode reads its weights from under layout NAME: those
    of the first instance's first `tp` ranks (TP: all its nodes; DP, by instances or by
    vLLM's ranks: one replica's node), or None when the manifest has no such plan."""
    try:
        instance = facts["layouts"][name]["instances"][0]
        return sorted({str(rank["node"]) for rank in instance["ranks"][: int(instance["tp"])]})
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def _positive_numbers(mapping: object) -> dict[str, float]:
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


def _decode_rate(point: Point) -> tuple[float, str]:
    """One stream's decode tok/s: 1000 / median TPOT, else ITL, else its output tok/s.

    TPOT first: vLLM CPU streams tokens several a chunk, so its median ITL is about 0.
    """
    for metric, name in (("tpot_p50_ms", "TPOT"), ("itl_p50_ms", "ITL")):
        value = point.median(metric)
        if value:
            return 1000 / value, f"1000 / {name} p50"
    return point.tok, "output tok/s (no TPOT or ITL measured)"


def bandwidth(axes: dict[str, Curves], facts: dict | None) -> dict:
    """The roofline of decode at batch 1 per layout: every weight is read once per token,
    so one stream decodes at most (bandwidth of the nodes it reads) / (weight bytes)."""
    try:
        model_bytes = float(facts["model_bytes"])
        gbps = float(facts["bandwidth_gbps"])
    except (TypeError, KeyError, ValueError):
        return {"status": "not measured: manifest.json has no model_bytes and bandwidth_gbps"}
    if model_bytes <= 0 or gbps <= 0:
        return {"status": "not measured: model_bytes and bandwidth_gbps must be above 0"}
    per_node = _positive_numbers(facts.get("bandwidth_per_node_gbps"))
    layouts = {}
    names = sorted({n for curves in axes.values() for n in curves}, key=layout_key)
    for name in names:
        closed = {p.load: p for p in axes.get("concurrency", {}).get(name, [])}
        if 1 in closed:
            point, basis = closed[1], "concurrency 1"
        else:
            axis = "rate" if name in axes.get("rate", {}) else "concurrency"
            point = axes[axis][name][0]
            basis = f"lowest {axis} {fmt_load(point.load)} (no concurrency-1 step)"
        nodes = _stream_nodes(facts, name)
        if nodes and all(n in per_node for n in nodes):
            layout_gbps = sum(per_node[n] for n in nodes)
        else:
            nodes, layout_gbps = None, gbps  # no plan: one node, the slowest measured
        decode, decode_basis = _decode_rate(point)
        limit = layout_gbps * 1e9 / model_bytes
        layouts[name] = {
            "basis": basis,
            "output_tok_s": rounded(point.tok),
            "decode_tok_s": rounded(decode),
            "decode_basis": decode_basis,
            "nodes": nodes,
            "bandwidth_gbps": rounded(layout_gbps),
            "limit_tok_s": round(limit, 3),
            "fraction": round(decode / limit, 3),
        }
    return {
        "status": "measured",
        "bandwidth_gbps": gbps,
        "bandwidth_per_node_gbps": per_node or None,
        "model_bytes": int(model_bytes),
        "limit_tok_s": round(gbps * 1e9 / model_bytes, 3),
        "note": "per layout: the nodes one request reads (TP: all of its nodes, DP: one "
        "replica's); limit_tok_s above: one node, the slowest measured",
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
        "completed": sum_counts([s["completed"] for s in steps]),
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
                            "watts": rounded(w, 2),
                            "output_tok_s": rounded(p.tok),
                            "tok_per_w": rounded(p.tok / w) if w > 0 else None,
                            "tok_per_w_above_idle": rounded(p.tok / above)
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


# --- against plain vLLM ---------------------------------------------------------------

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
            as_good = not _ahead(point, base_point)
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
                        else {k: rounded(v) for k, v in p.stats[m].items()}
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


def host_decisions(axes: dict[str, Curves], facts: dict | None, power, host: str) -> dict:
    # The baseline is measured to compare against, never recommended.
    kit = {
        axis: {name: points for name, points in curves.items() if name != BASELINE_LAYOUT}
        for axis, curves in axes.items()
    }
    by_axis = {axis: recommend(curves, axis) for axis, curves in kit.items()}
    rate = by_axis.get("rate", {"recommendation": [], "crossovers": {}, "not_recommended": {}})
    pair = _crossover_pair(kit.get("rate", {}), rate["crossovers"])
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
    names = sorted({n for curves in axes.values() for n in curves}, key=layout_key)
    # One entry per layout: by rate where it was measured by rate, else by concurrency.
    decisions["saturation"] = {
        name: by_axis_saturation.get("rate", {}).get(name)
        or by_axis_saturation["concurrency"][name]
        for name in names
    }
    if "concurrency" in by_axis:
        closed = by_axis["concurrency"]
        pair_c = _crossover_pair(kit["concurrency"], closed["crossovers"])
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
    for name in kit.get("concurrency", {}):
        if name not in kit.get("rate", {}) and "rate" in kit:
            why = by_axis["concurrency"]["not_recommended"].get(name)
            decisions["not_recommended"][name] = "not measured by rate" + (
                f"; by concurrency: {why}" if why else "; by concurrency it is recommended"
            )
    decisions["baseline"] = against_baseline(axes, by_axis)
    decisions["bandwidth"] = bandwidth(axes, facts)
    decisions["errors"] = errors(axes)
    decisions["energy"] = energy(axes, power, host)
    decisions["series"] = _series(axes)
    return decisions


def _crossover_pair(curves: Curves, crossovers: dict) -> tuple[str, str] | None:
    """(sn, the DP layout) whose crossover is the headline: `dp`, else the first dp-*."""
    dps = [n for n in crossovers if n == "dp"] or [n for n in crossovers if n.startswith("dp")]
    return (BASE_LAYOUT, dps[0]) if dps and BASE_LAYOUT in curves else None


def _adaptive_bracket(manifest: dict | None) -> list[float] | None:
    """An adaptive sweep's [low, high] of the SN/DP crossover, when the manifest holds one."""
    search = (manifest or {}).get("adaptive")
    bracket = search.get("crossover_between") if isinstance(search, dict) else None
    if not isinstance(bracket, list) or len(bracket) != 2:
        return None
    numbers = _positive_numbers(dict(enumerate(bracket)))
    return [numbers["0"], numbers["1"]] if len(numbers) == 2 else None


CLUSTER_SERIES = ("prefill_tok_s", "decode_tok_s", "output_tok_s")
CLUSTER_METHOD = (
    "prefill and decode tok/s are llama.cpp's own timings summed over a step's requests "
    "(prompt tokens over the time spent on prompts, generated tokens over the time spent "
    "generating), the median of the repetitions; output tok/s is the client's"
)


def cluster_hosts(rows: list[rundir.ClusterRow] | None) -> dict | None:
    """A cluster measured at several numbers of hosts: each series against the count, per
    concurrency, and how prefill and decode changed from the fewest hosts to the most at the
    lowest concurrency (the field notes' finding: prefill gains, decode does not)."""
    if not rows:
        return None
    hosts = sorted({r.hosts for r in rows})
    by_concurrency = {}
    for concurrency in sorted({r.concurrency for r in rows}):
        series = {}
        for metric in CLUSTER_SERIES:
            values = {}
            for count in hosts:
                taken = [
                    getattr(r, metric)
                    for r in rows
                    if r.hosts == count and r.concurrency == concurrency
                    and getattr(r, metric) is not None
                ]  # fmt: skip
                if taken:
                    values[str(count)] = statistics.median(taken)
            series[metric] = values
        by_concurrency[str(concurrency)] = series
    lowest = by_concurrency[str(min(r.concurrency for r in rows))]
    first, last = str(hosts[0]), str(hosts[-1])
    change = {
        metric: round(lowest[metric][last] / lowest[metric][first], 3)
        if first in lowest[metric] and last in lowest[metric] and lowest[metric][first]
        else None
        for metric in CLUSTER_SERIES
    }
    words = []
    for metric, name in (("prefill_tok_s", "prefill"), ("decode_tok_s", "decode")):
        if change[metric] is not None:
            words.append(
                f"{name} {fmt_num(lowest[metric][first])} -> {fmt_num(lowest[metric][last])} "
                f"tok/s ({change[metric]:.2f}x)"
            )
    summary = (
        f"from {first} to {last} host(s) at concurrency {min(r.concurrency for r in rows)}: "
        + ", ".join(words)
        if len(hosts) > 1 and words
        else f"measured at {', '.join(map(str, hosts))} host(s) only"
    )
    return {"hosts": hosts, "by_concurrency": by_concurrency, "change": change, "summary": summary}


def analyse(run_dir: str | Path) -> dict:
    """The decisions of a run directory (see README, "Reports", for every key)."""
    run_dir = Path(run_dir)
    steps = rundir.read_summary(run_dir)
    manifest = rundir.read_manifest(run_dir)
    power = rundir.read_power(run_dir)
    grouped = group(steps)
    facts = (manifest or {}).get("hosts", {})
    hosts = {
        host: host_decisions(axes, facts.get(host), power, host) for host, axes in grouped.items()
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
    search = _adaptive_bracket(manifest)
    if search:
        low, high = search
        notes.append(
            f"the adaptive search kept the SN/DP crossover between {fmt_load(low)} and "
            f"{fmt_load(high)} req/s (each round's midpoint on both layouts, and the flat-out "
            "rates, which the crossover above cannot compare: only rates both layouts were "
            "measured at count there)"
        )
    result = {
        "schema": SCHEMA,
        "run_dir": str(run_dir),
        "inputs": {
            rundir.SUMMARY: len(steps),
            rundir.MANIFEST: manifest is not None,
            rundir.POWER: power is not None,
        },
        "notes": notes,
        "adaptive_search": search,
        "cluster": cluster_hosts(rundir.read_cluster(run_dir)),
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
