"""The decisions of a run directory, as `socketwise report RUN_DIR --json` gives them.

Plain Python with no Ansible import, no plotting; `analyse(run_dir)` returns the decisions
as JSON-ready data and `render.write` turns them into report.md / report.html. Each
decision has its own module, with its method (docs/guides/sweeps-and-reports.md): `crossover`,
`saturation`, `recommendation` (with the comparison against plain vLLM), `roofline` (the
bandwidth limit) and `energy`; this module assembles them per host, with the errors, the
series and the run-wide parts (the cluster by number of hosts, the adaptive search).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from socketwise.measure import rundir
from socketwise.report.crossover import (
    BASE_LAYOUT,
    CONFIRM_POINTS,
    CROSSOVER_METHOD,
    TOLERANCE,
    crossover_pair,
    overtake,
)
from socketwise.report.energy import energy
from socketwise.report.points import (
    Curves,
    fmt_load,
    fmt_num,
    group,
    layout_key,
    positive_numbers,
    rounded,
    sum_counts,
)
from socketwise.report.recommendation import (
    BASELINE_LAYOUT,
    BASELINE_METHOD,
    BASELINE_RATIOS,
    LATENCY_TOLERANCE,
    against_baseline,
    recommend,
)
from socketwise.report.roofline import bandwidth
from socketwise.report.saturation import (
    ERROR_SHARE,
    GAIN,
    LOAD_MARGIN,
    SATURATION_METHOD,
    TTFT_FACTOR,
    saturation,
)

# The decisions' names from where they were before each had its own module (2026-11-26).
__all__ = [
    "BASELINE_LAYOUT",
    "BASELINE_METHOD",
    "BASELINE_RATIOS",
    "BASE_LAYOUT",
    "CLUSTER_METHOD",
    "CLUSTER_SERIES",
    "CONFIRM_POINTS",
    "CROSSOVER_METHOD",
    "ERROR_SHARE",
    "GAIN",
    "LATENCY_TOLERANCE",
    "LOAD_MARGIN",
    "SATURATION_METHOD",
    "SCHEMA",
    "TOLERANCE",
    "TTFT_FACTOR",
    "against_baseline",
    "analyse",
    "bandwidth",
    "cluster_hosts",
    "energy",
    "errors",
    "host_decisions",
    "overtake",
    "recommend",
    "saturation",
]

SCHEMA = 1


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
    pair = crossover_pair(kit.get("rate", {}), rate["crossovers"])
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
        pair_c = crossover_pair(kit["concurrency"], closed["crossovers"])
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


def _adaptive_bracket(manifest: dict | None) -> list[float] | None:
    """An adaptive sweep's [low, high] of the SN/DP crossover, when the manifest holds one."""
    search = (manifest or {}).get("adaptive")
    bracket = search.get("crossover_between") if isinstance(search, dict) else None
    if not isinstance(bracket, list) or len(bracket) != 2:
        return None
    numbers = positive_numbers(dict(enumerate(bracket)))
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
    """The decisions of a run directory (docs/reference/decisions-json.md has every key)."""
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
            f"{fmt_load(high)} req/s (each round's midpoint, on DP where SN fell short of it, "
            "and the flat-out rates, which the crossover above cannot compare: only rates "
            "both layouts were measured at count there)"
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
