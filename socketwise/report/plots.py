"""The report's plots (matplotlib, imported only when plotting: the analysis and
`report --json` need none of it)."""

from __future__ import annotations

import re
from pathlib import Path

from socketwise.measure import rundir
from socketwise.report.points import Curves, fmt_load, layout_key

PLOTS_DIR = "plots"


# --- plots ----------------------------------------------------------------------------

# Plain vLLM (the baseline) in black: the line every other layout is read against.
_COLOURS = {
    rundir.BASELINE: "#000000",
    "sn": "#1f77b4",
    "tp": "#d62728",
    "dp": "#2ca02c",
    "dp-vllm": "#9467bd",
}
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
    ax.set_xticklabels([fmt_load(x) for x in sorted(set(loads))])
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
        ax.axvline(value, color="#555555", linestyle="--", label=f"crossover {fmt_load(value)}")
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
        plain = name == rundir.BASELINE
        ax.errorbar(
            xs, ys, yerr=errs, color=colour, marker="o", capsize=4,
            linestyle="--" if plain else "-", label="plain vLLM (baseline)" if plain else name,
        )  # fmt: skip
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


def plot_cluster(cluster: dict, run_dir: Path) -> tuple[str, str]:
    """Prefill and decode tok/s against the number of hosts, one line per concurrency (log
    scale: the two differ by orders of magnitude)."""
    figure, axes = _figure()
    for metric, style, name in (
        ("prefill_tok_s", "-", "prefill"),
        ("decode_tok_s", "--", "decode"),
    ):
        for index, (concurrency, series) in enumerate(cluster["by_concurrency"].items()):
            points = sorted((int(n), v) for n, v in series[metric].items())
            if points:
                xs, ys = zip(*points, strict=True)
                axes.plot(xs, ys, style, marker="o", color=_SPARE_COLOURS[index % 6],
                          label=f"{name}, concurrency {concurrency}")  # fmt: skip
    axes.set_xticks(cluster["hosts"])
    axes.set_xlabel("hosts in the cluster")
    axes.set_yscale("log")
    axes.set_ylabel("tok/s (llama.cpp's timings)")
    axes.set_title("cluster: prefill and decode against the number of hosts")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    alt = "cluster: prefill and decode tok/s against the number of hosts"
    return _save(figure, run_dir, "cluster-hosts.png"), alt


def plots_for(run_dir: Path, host: str, axes: dict[str, Curves], d: dict) -> dict:
    plots: dict[str, list[tuple[str, str]]] = {}
    for axis, curves in axes.items():
        made = [_plot_throughput(host, axis, curves, d, run_dir)]
        for metric, label in (("ttft", "TTFT"), ("itl", "ITL")):
            plot = _plot_latency(host, axis, curves, metric, label, run_dir)
            if plot:
                made.append(plot)
        plots[axis] = made
    if d["energy"]["status"] == "measured":
        names = sorted({n for curves in axes.values() for n in curves}, key=layout_key)
        plots["energy"] = _plot_energy(host, d["energy"]["steps"], names, run_dir)
    return plots
