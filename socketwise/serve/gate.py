"""The rollout's benchmark gate: a new release must keep a host's output throughput and
its TTFT p99 within a tolerance of the figures of the release it replaces, measured the
same way (a short run of vLLM's serving benchmark through the host's own front door)."""

from __future__ import annotations


def figures(bench: dict) -> dict:
    """The gate's figures from a vLLM benchmark result (its bench.json)."""
    return {
        "output_tok_s": round(float(bench["output_throughput"]), 2),
        "ttft_p99_ms": round(float(bench["p99_ttft_ms"]), 1),
        "completed": int(bench["completed"]),
        "failed": int(bench.get("failed", 0)),
    }


def tolerance_error(tolerance: object) -> str | None:
    """Why a rollout_gate_tolerance cannot be used, or None (empty means no benchmark)."""
    if tolerance in (None, ""):
        return None
    try:
        value = float(str(tolerance))
    except ValueError:
        value = -1.0
    if not 0 < value < 1:
        return (
            f"rollout_gate_tolerance={tolerance!r} is not a fraction between 0 and 1; give "
            "for example 0.15 (a new release keeps at least 85 % of the output tok/s and at "
            "most 115 % of the TTFT p99), or leave it empty for no benchmark"
        )
    return None


def problems(before: dict, after: dict, tolerance: float) -> list[str]:
    """What keeps the new release (`after`) from passing against `before`; empty passes."""
    tolerance = float(tolerance)
    found = []
    if after["failed"]:
        found.append(f"{after['failed']} of the benchmark's requests failed")
    floor = before["output_tok_s"] * (1 - tolerance)
    if after["output_tok_s"] < floor:
        found.append(
            f"output {after['output_tok_s']:.1f} tok/s is below {floor:.1f} "
            f"({1 - tolerance:.0%} of the previous release's {before['output_tok_s']:.1f})"
        )
    ceiling = before["ttft_p99_ms"] * (1 + tolerance)
    if after["ttft_p99_ms"] > ceiling:
        found.append(
            f"TTFT p99 {after['ttft_p99_ms']:.1f} ms is above {ceiling:.1f} "
            f"({1 + tolerance:.0%} of the previous release's {before['ttft_p99_ms']:.1f})"
        )
    return found
