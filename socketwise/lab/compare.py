"""Interleaved sweeps for the shipped comparison scripts (scripts/): the same hosts and
load measured with one thing changed, round after round, compared on the medians."""

from __future__ import annotations

import csv
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from socketwise.common import paths
from socketwise.measure.rundir import BASELINE
from socketwise.measure.sweep import LAYOUTS, Profile, SweepError, sweep

# Plain vLLM once more, under another name: a comparison of plain vLLM against itself
# (plain_twice_rows). The one variable more, which every deploy of a sweep sets anyway,
# makes the two differ, so the sweep deploys (restarts) it for its own steps as it would
# the kit's layout, instead of measuring it on the first one's server.
PLAIN_AGAIN = "plain-again"

# summary.csv's figures a comparison prints: throughput, then latency. Not ITL: with a
# small model vLLM CPU streams several tokens a chunk and ITL's median is 0.
FIGURES = (
    ("output_tok_s", "output tok/s"),
    ("ttft_p50_ms", "TTFT p50"),
    ("tpot_p50_ms", "TPOT p50"),
)


def closed_loop_rows(
    inventory: Path, layouts: list[str], run_dir: Path, sweep_args: list[str], who: str
) -> list[dict]:
    """One `socketwise sweep` of LAYOUTS on INVENTORY, left on the last layout; summary.csv's
    closed-loop rows. SWEEP_ARGS are more sweep flags (concurrencies, lengths, seconds).
    Exits with WHO's name and the sweep's last words when it fails."""
    bin_dir = Path(sys.executable).parent
    done = subprocess.run(
        [str(bin_dir / "socketwise"), "sweep", "-i", str(inventory), "--layouts", ",".join(layouts),
         "--rate-fractions", "1.0", "--no-restore", "--run-dir", str(run_dir), *sweep_args],
        cwd=paths.repo_root(), capture_output=True, text=True,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"{who}: the sweep failed:\n{done.stderr[-3000:]}")
    return read_closed_loop_rows(run_dir)


def plain_twice_rows(
    inventory: Path, order: list[str], run_dir: Path, profile: Profile, who: str
) -> list[dict]:
    """One fixed sweep, as closed_loop_rows makes, of plain vLLM and PLAIN_AGAIN in ORDER
    (a layout the sweep's command does not know, so it runs in this process); its
    closed-loop rows. Exits with WHO's name and the error when it fails."""
    known = {
        BASELINE: LAYOUTS[BASELINE],
        PLAIN_AGAIN: {**LAYOUTS[BASELINE], "vllm_service_fresh_start": True},
    }
    try:
        sweep(inventory, order, run_dir, profile, restore=False, known=known)
    except SweepError as exc:
        sys.exit(f"{who}: the sweep failed: {exc}")
    return read_closed_loop_rows(run_dir)


def read_closed_loop_rows(run_dir: Path) -> list[dict]:
    """The closed-loop rows of RUN_DIR's summary.csv (a sweep made earlier, or just now)."""
    with (run_dir / "summary.csv").open() as handle:
        return [row for row in csv.DictReader(handle) if row["concurrency"] and not row["rate"]]


class Figures:
    """Every round's figures per key (say host, side, concurrency), compared as medians."""

    def __init__(self) -> None:
        self.values: dict[tuple, dict[str, list[float]]] = {}

    def add(self, key: tuple, row: dict) -> None:
        got = self.values.setdefault(key, {})
        for metric, _ in FIGURES:
            if row.get(metric):
                got.setdefault(metric, []).append(float(row[metric]))

    def add_round(self, rows: list[dict], key: Callable[[dict], tuple]) -> None:
        """One round's ROWS, grouped by KEY(row): each group added as one round, each
        figure the median of the group's rows (a sweep's repetitions of one step)."""
        grouped = Figures()
        for row in rows:
            grouped.add(key(row), row)
        for name, by_metric in grouped.values.items():
            self.add(name, {metric: statistics.median(v) for metric, v in by_metric.items()})

    def median(self, key: tuple, metric: str) -> float | None:
        values = self.values.get(key, {}).get(metric)
        return statistics.median(values) if values else None

    def against(self, key: tuple, reference: tuple, names: tuple[str, str]) -> str:
        """KEY's medians against REFERENCE's, each figure with the ratio of the two, then
        each round's ratio (the rounds in the order they were added)."""
        parts = []
        for metric, label in FIGURES:
            mine, theirs = self.median(key, metric), self.median(reference, metric)
            if mine is not None and theirs:
                each = zip(self.values[key][metric], self.values[reference][metric], strict=False)
                rounds = ", ".join(f"{a / b:.3f}" for a, b in each if b)
                parts.append(
                    f"{label} {names[0]} {mine:.1f}, {names[1]} {theirs:.1f}: "
                    f"{names[0]}/{names[1]} {mine / theirs:.3f} (rounds {rounds})"
                )
        rounds = len(self.values.get(key, {}).get("output_tok_s", []))
        return f"{'; '.join(parts)} ({rounds} round(s))"
