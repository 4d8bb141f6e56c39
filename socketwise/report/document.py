"""The report as a document: one list of blocks built from the analysis, rendered as
Markdown and as HTML."""

from __future__ import annotations

import html
from pathlib import Path

from socketwise.measure import rundir
from socketwise.report.analysis import CLUSTER_METHOD, CLUSTER_SERIES
from socketwise.report.crossover import CROSSOVER_METHOD
from socketwise.report.points import (
    UNITS,
    Curves,
    fmt_count,
    fmt_load,
    fmt_loads,
    fmt_num,
    fmt_step_load,
)
from socketwise.report.recommendation import BASELINE_METHOD, BASELINE_RATIOS
from socketwise.report.saturation import SATURATION_METHOD

# --- the document: one list of blocks, rendered as Markdown and as HTML ----------------

Block = tuple  # ("h", level, text) | ("p", text) | ("list", items) | ("table", head, rows)
# | ("img", relative path, alt text)


def _spread_text(spread: dict | None, repetitions: int) -> str:
    if spread is None:
        return "-"
    text = fmt_num(spread["median"])
    if repetitions > 1:
        text += f" ({fmt_num(spread['min'])}-{fmt_num(spread['max'])}, n={repetitions})"
    return text


def _range_text(recommendation: list[dict], index: int, axis: str) -> str:
    bound = f"max_{axis}"
    low = recommendation[index - 1][bound] if index else None
    high = recommendation[index][bound]
    unit = UNITS[axis]
    if low is None and high is None:
        return "all measured loads"
    if low is None:
        return f"up to {fmt_load(high)} {unit}"
    if high is None:
        return f"above {fmt_load(low)} {unit}"
    return f"{fmt_load(low)} to {fmt_load(high)} {unit}"


def _recommendation_blocks(rec: list[dict], not_rec: dict, axis: str) -> list[Block]:
    head = ["load range", "layout", "rule"]
    rows = [[_range_text(rec, i, axis), r["layout"], r["rule"]] for i, r in enumerate(rec)]
    if any("baseline_as_good_at" in r for r in rec):
        head.append("plain vLLM as good at")
        for row, r in zip(rows, rec, strict=True):
            row.append(fmt_loads(r.get("baseline_as_good_at") or []) or "no measured load")
    blocks: list[Block] = [("table", head, rows)]
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
            f"SN/DP crossover by {axis}: {fmt_load(value)} {unit}, between the measured "
            f"{fmt_load(between[0])} and {fmt_load(between[1])} {unit}: "
            f"{crossovers[dp]['evidence']}."
        )
    return f"SN/DP crossover by {axis}: none ({status}): {crossovers[dp]['evidence']}."


def _baseline_blocks(baseline: dict, h: int) -> list[Block]:
    blocks: list[Block] = [("h", h, "Against plain vLLM")]
    if baseline["status"] != "measured":
        return blocks + [
            ("p", f"Against plain vLLM: {baseline['status']} (sweep --layouts baseline,...).")
        ]
    blocks.append(("p", baseline["summary"][0].upper() + baseline["summary"][1:] + "."))
    head = ["layout", "load", "output tok/s", "TTFT p50", "TTFT p99", "TPOT p50"]
    rows = [
        [name, f"{fmt_load(r[axis])} {UNITS[axis]}"]
        + ["-" if r[m] is None else f"{r[m]:g}x" for m in BASELINE_RATIOS]
        for axis, by_layout in baseline["ratios"].items()
        for name, ratios in by_layout.items()
        for r in ratios
    ]
    return blocks + [
        ("p", "Each figure as a ratio to plain vLLM's at the same load:"),
        ("table", head, rows),
    ]


def _cluster_blocks(cluster: dict, plot: tuple[str, str] | None) -> list[Block]:
    blocks: list[Block] = [
        ("h", 2, "Cluster: prefill and decode against the number of hosts"),
        ("p", cluster["summary"][0].upper() + cluster["summary"][1:] + "."),
    ]
    if plot:
        blocks.append(("img", *plot))
    for concurrency, series in cluster["by_concurrency"].items():
        rows = [
            [count] + [fmt_num(series[m].get(str(count))) for m in CLUSTER_SERIES]
            for count in cluster["hosts"]
        ]
        blocks += [
            ("p", f"Concurrency {concurrency}:"),
            ("table", ["hosts", "prefill tok/s", "decode tok/s", "output tok/s"], rows),
        ]
    return blocks


def _points_table(curves: Curves, axis: str) -> Block:
    rows = []
    for name, points in curves.items():
        for p in points:
            rows.append(
                [name, fmt_load(p.load)]
                + [_spread_text(p.stats[m], p.repetitions) for m in rundir.METRICS]
                + [fmt_count(p.completed), fmt_count(p.failed)]
            )
    head = [
        "layout",
        axis,
        "output tok/s",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "ITL p50 ms",
        "ITL p99 ms",
        "TPOT p50 ms",
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
    blocks += _baseline_blocks(d["baseline"], h)
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
                    "-" if e[e["axis"]] is None else f"{fmt_load(e[e['axis']])} {UNITS[e['axis']]}",
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
        blocks.append(("p", f"No failed requests ({fmt_count(err['completed'])} completed)."))
    else:
        blocks.append(
            (
                "table",
                ["layout", "load", "failed", "completed"],
                [
                    [
                        s["layout"],
                        fmt_step_load(s),
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
            f"{fmt_num(idle)} W." if idle is not None else "not measured, so no tok/W above idle."
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
                        fmt_step_load(s),
                        fmt_num(s["watts"]),
                        fmt_num(s["output_tok_s"]),
                        fmt_num(s["tok_per_w"]),
                        fmt_num(s["tok_per_w_above_idle"]),
                    ]
                    for s in en["steps"]
                ],
            )
        )
    blocks.append(("h", h, "Bandwidth roofline"))
    bw = d["bandwidth"]
    if bw["status"] != "measured":
        blocks.append(("p", f"Bandwidth roofline: {bw['status']}."))
    else:
        blocks.append(
            (
                "p",
                "Decode at batch 1 reads every weight once per token: one stream decodes "
                f"at most (GB/s of the nodes it reads) / {bw['model_bytes'] / 1e9:.2f} GB of "
                f"weights; one node at {fmt_num(bw['bandwidth_gbps'])} GB/s gives "
                f"{fmt_num(bw['limit_tok_s'])} tok/s.",
            )
        )
        blocks.append(
            (
                "table",
                [
                    "layout",
                    "measured at",
                    "decode tok/s",
                    "nodes",
                    "GB/s",
                    "limit tok/s",
                    "share of the limit",
                ],  # fmt: skip
                [
                    [
                        n,
                        e["basis"],
                        f"{fmt_num(e['decode_tok_s'])} ({e['decode_basis']})",
                        ",".join(e["nodes"]) if e["nodes"] else "one (no plan)",
                        fmt_num(e["bandwidth_gbps"]),
                        fmt_num(e["limit_tok_s"]),
                        f"{e['fraction']:.1%}",
                    ]
                    for n, e in bw["layouts"].items()
                ],
            )
        )
    return blocks


def document_blocks(
    analysis: dict, axes_by_host: dict, plots: dict, cluster_plot: tuple[str, str] | None = None
) -> list[Block]:
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
    if analysis.get("cluster"):
        blocks += _cluster_blocks(analysis["cluster"], cluster_plot)
    blocks.append(("h", 2, "Methods"))
    blocks.append(
        (
            "list",
            [
                *(
                    [f"Cluster (sweep --hosts): {CLUSTER_METHOD}."]
                    if analysis.get("cluster")
                    else []
                ),
                "Every value is the median of the repetitions of a point; (min-max, n) shows "
                "their spread.",
                f"Crossover: {CROSSOVER_METHOD}. SN is the default; a layout is recommended "
                f"above its crossover over the layout recommended below it.",
                f"Saturation: {SATURATION_METHOD}.",
                f"Against plain vLLM (the baseline layout): {BASELINE_METHOD}.",
                "Bandwidth roofline: decode tok/s (1000 / TPOT p50, else ITL p50) at "
                "concurrency 1 (else the lowest load) x model_bytes / the measured GB/s of "
                "the nodes one request reads (manifest.json: the layout's plan and "
                "bandwidth_per_node_gbps).",
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
