"""The files of a run directory: `summary.csv`, `power.csv`, `manifest.json`, and a
cluster's `cluster.csv`.

Plain Python, stdlib only. The benchmark runner writes these files, `socketwise report`
reads them, and people feed in results from elsewhere, so `summary.csv` is a public
contract (docs/reference/run-directory.md). Only `summary.csv` is required.

A step is one measured load point of one layout on one host: open loop by request rate
(`rate`, req/s) or closed loop by concurrency. When both cells are filled the step is
open loop and `concurrency` was only a cap. Repetitions are several rows of the same
(host, layout, rate|concurrency).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

SUMMARY = "summary.csv"
POWER = "power.csv"
MANIFEST = "manifest.json"
SUMMARY_COLUMNS = (
    "host",
    "layout",
    "rate",
    "concurrency",
    "output_tok_s",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "completed",
    "failed",
    "tpot_p50_ms",
)
# Columns a summary.csv may leave out (written by socketwise; older and foreign files lack
# them): read as not measured.
OPTIONAL_COLUMNS = ("tpot_p50_ms",)
POWER_COLUMNS = ("host", "layout", "rate", "concurrency", "watts", "source")
# A cluster measured at several numbers of hosts (`socketwise sweep --hosts`): one row per
# count and concurrency, prefill and decode at llama.cpp's own timings.
CLUSTER = "cluster.csv"
CLUSTER_COLUMNS = (
    "hosts",
    "concurrency",
    "requests",
    "prompt_tokens",
    "output_tokens",
    "prefill_tok_s",
    "decode_tok_s",
    "output_tok_s",
)
METRICS = ("output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "tpot_p50_ms")
AXES = ("rate", "concurrency")
IDLE = "idle"
# The layout name of plain vLLM, which a report reads every other layout against.
BASELINE = "baseline"
MANIFEST_SCHEMA = 1


class RunDirError(ValueError):
    """A run directory file that cannot be read; the message names file, line and fix."""


@dataclass(frozen=True)
class Step:
    """One row of summary.csv. Metrics other than output_tok_s may be None (not measured)."""

    host: str
    layout: str
    axis: str  # "rate" or "concurrency"
    load: float
    output_tok_s: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    completed: int | None
    failed: int | None
    tpot_p50_ms: float | None = None  # median time per output token after the first


@dataclass(frozen=True)
class PowerRow:
    """One row of power.csv; axis and load are None on an idle row."""

    host: str
    layout: str
    axis: str | None
    load: float | None
    watts: float
    source: str


def _number(path: Path, line: int, column: str, text: str, kind: type = float):
    try:
        value = kind(text)
    except ValueError:
        raise RunDirError(
            f"{path}: line {line}: {column} {text!r} is not a"
            f"{'n integer' if kind is int else ' number'}"
        ) from None
    if not math.isfinite(value) or value < 0:
        raise RunDirError(f"{path}: line {line}: {column} {text!r} must be a number >= 0")
    return value


def _optional(path: Path, line: int, row: Mapping[str, str], column: str, kind: type = float):
    text = (row.get(column) or "").strip()
    return None if text == "" else _number(path, line, column, text, kind)


def _axis_and_load(path: Path, line: int, row: Mapping[str, str]) -> tuple[str, float]:
    for axis in AXES:
        load = _optional(path, line, row, axis)
        if load is not None:
            if load <= 0:
                raise RunDirError(f"{path}: line {line}: {axis} must be above 0, not {load:g}")
            return axis, load
    raise RunDirError(
        f"{path}: line {line}: both rate and concurrency are empty; fill rate (req/s, open "
        f"loop) or concurrency (closed loop)"
    )


def _rows(path: Path, columns: tuple[str, ...]) -> Iterable[tuple[int, dict[str, str]]]:
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in columns if c not in (reader.fieldnames or [])]
            if missing:
                raise RunDirError(
                    f"{path}: missing column(s) {', '.join(missing)}; the header must hold "
                    f"{','.join(columns)}"
                )
            width = len(reader.fieldnames or [])
            for row in reader:
                # DictReader files extra cells under the key None, missing ones as None.
                extra = row.pop(None, [])  # type: ignore[call-overload]
                cells = width + len(extra) - sum(value is None for value in row.values())
                if cells != width:
                    raise RunDirError(
                        f"{path}: line {reader.line_num}: {cells} cells under a header of "
                        f"{width}; give every row exactly the header's columns"
                    )
                if not any(value.strip() for value in row.values()):
                    continue
                yield reader.line_num, row
    except UnicodeDecodeError as exc:
        raise RunDirError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except csv.Error as exc:
        raise RunDirError(f"{path}: not CSV: {exc}") from None


def read_summary(run_dir: str | Path) -> list[Step]:
    path = Path(run_dir) / SUMMARY
    if not path.is_file():
        raise RunDirError(
            f"{path}: not found; a run directory needs at least {SUMMARY} with the columns "
            f"{','.join(c for c in SUMMARY_COLUMNS if c not in OPTIONAL_COLUMNS)}"
        )
    steps = []
    required = tuple(c for c in SUMMARY_COLUMNS if c not in OPTIONAL_COLUMNS)
    for line, row in _rows(path, required):
        host, layout = row["host"].strip(), row["layout"].strip()
        if not host or not layout:
            raise RunDirError(f"{path}: line {line}: host and layout must not be empty")
        axis, load = _axis_and_load(path, line, row)
        tok = _optional(path, line, row, "output_tok_s")
        if tok is None:
            raise RunDirError(
                f"{path}: line {line}: output_tok_s is empty; write 0 for a step that "
                f"completed nothing"
            )
        latency = {m: _optional(path, line, row, m) for m in METRICS[1:]}
        steps.append(
            Step(
                host=host,
                layout=layout,
                axis=axis,
                load=load,
                output_tok_s=tok,
                **latency,
                completed=_optional(path, line, row, "completed", int),
                failed=_optional(path, line, row, "failed", int),
            )
        )
    if not steps:
        raise RunDirError(f"{path}: no rows below the header")
    return steps


def read_power(run_dir: str | Path) -> list[PowerRow] | None:
    """power.csv's rows, or None when the run has no power.csv (energy not measured)."""
    path = Path(run_dir) / POWER
    if not path.is_file():
        return None
    rows = []
    for line, row in _rows(path, POWER_COLUMNS):
        layout = row["layout"].strip()
        watts = _optional(path, line, row, "watts")
        if watts is None:
            continue  # a source that was missing for this step
        if layout == IDLE:
            axis, load = None, None
        else:
            axis, load = _axis_and_load(path, line, row)
        rows.append(PowerRow(row["host"].strip(), layout, axis, load, watts, row["source"].strip()))
    return rows


@dataclass(frozen=True)
class ClusterRow:
    """One row of cluster.csv; a rate is None where nothing completed."""

    hosts: int
    concurrency: int
    requests: int
    prefill_tok_s: float | None
    decode_tok_s: float | None
    output_tok_s: float


def read_cluster(run_dir: str | Path) -> list[ClusterRow] | None:
    """cluster.csv's rows, or None when the run measured no cluster."""
    path = Path(run_dir) / CLUSTER
    if not path.is_file():
        return None
    rows = []
    for line, row in _rows(path, CLUSTER_COLUMNS):
        rows.append(
            ClusterRow(
                hosts=_number(path, line, "hosts", row["hosts"], int),
                concurrency=_number(path, line, "concurrency", row["concurrency"], int),
                requests=_number(path, line, "requests", row["requests"], int),
                prefill_tok_s=_optional(path, line, row, "prefill_tok_s"),
                decode_tok_s=_optional(path, line, row, "decode_tok_s"),
                output_tok_s=_number(path, line, "output_tok_s", row["output_tok_s"]),
            )
        )
    return rows


def read_manifest(run_dir: str | Path) -> dict | None:
    """manifest.json, or None when the run has none. Unknown keys are kept, not checked."""
    path = Path(run_dir) / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise RunDirError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise RunDirError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("schema") != MANIFEST_SCHEMA:
        raise RunDirError(f'{path}: expected an object with "schema": {MANIFEST_SCHEMA}')
    hosts = manifest.get("hosts", {})
    if not isinstance(hosts, dict) or not all(isinstance(v, dict) for v in hosts.values()):
        raise RunDirError(f'{path}: "hosts" must map host names to objects')
    return manifest


def _cell(value: object) -> str:
    return "" if value is None else str(value)


def write_csv(path: str | Path, columns: tuple[str, ...], rows: Iterable[Mapping]) -> None:
    """Write rows (mappings with exactly `columns`; None is an empty cell)."""
    with Path(path).open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            unknown = set(row) - set(columns)
            if unknown:
                raise RunDirError(f"{path}: unknown column(s) {', '.join(sorted(unknown))}")
            writer.writerow([_cell(row.get(c)) for c in columns])


def power_rows(
    host: str, layout: str, rate: float | None, concurrency: float | None, measurement: dict
) -> list[dict]:
    """power.csv rows for one step (layout "idle" for the baseline) from the JSON that
    socketwise/power.py prints; a missing source gets no row, which reads as not measured."""
    return [
        {
            "host": host,
            "layout": layout,
            "rate": rate,
            "concurrency": concurrency,
            "watts": reading["watts"],
            "source": source,
        }
        for source, reading in sorted(measurement.get("sources", {}).items())
        if reading.get("watts") is not None
    ]
