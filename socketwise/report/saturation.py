"""Saturation: the last load before a layout stops gaining, on one load axis.

Plain Python with no Ansible import, no plotting. Method (docs/guides/sweeps-and-reports.md), on the
median of the repetitions of each point: a point *departs* when its throughput is not
above (1 + GAIN) times the best so far, or (by rate only) its TTFT p50 exceeds
TTFT_FACTOR times that at the lowest load, or more than ERROR_SHARE of its requests
failed. Saturation is the last load before the first departure that persists at the next
point too.
"""

from __future__ import annotations

from socketwise.report.points import UNITS, Point, fmt_load, fmt_num, rounded

GAIN = 0.05
# Throughput is judged flat only against a load at least this much below: closely spaced
# (adaptive) points on a rising line would otherwise each look like no gain.
LOAD_MARGIN = 0.10
TTFT_FACTOR = 3.0
ERROR_SHARE = 0.01
SATURATION_METHOD = (
    f"last load before the first point that departs, persistently (the next point departs "
    f"too): throughput not above {1 + GAIN:g}x the best so far at a load at least "
    f"{LOAD_MARGIN:.0%} above that best's, TTFT p50 above "
    f"{TTFT_FACTOR:g}x its lowest-load value (by rate only: in a closed loop latency grows "
    f"with concurrency by construction), or more than {ERROR_SHARE:.0%} failed (medians)"
)


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
