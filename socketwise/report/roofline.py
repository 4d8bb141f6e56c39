"""The roofline of decode at batch 1 per layout: how close one stream comes to the
memory bandwidth of the NUMA nodes it reads its weights from.

Plain Python with no Ansible import, no plotting.
"""

from __future__ import annotations

from socketwise.report.points import Curves, Point, fmt_load, layout_key, positive_numbers, rounded


def _stream_nodes(facts: dict, name: str) -> list[str] | None:
    """The NUMA nodes one request's decode reads its weights from under layout NAME: those
    of the first instance's first `tp` ranks (TP: all its nodes; DP, by instances or by
    vLLM's ranks: one replica's node), or None when the manifest has no such plan."""
    try:
        instance = facts["layouts"][name]["instances"][0]
        return sorted({str(rank["node"]) for rank in instance["ranks"][: int(instance["tp"])]})
    except (KeyError, IndexError, TypeError, ValueError):
        return None


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
    per_node = positive_numbers(facts.get("bandwidth_per_node_gbps"))
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
