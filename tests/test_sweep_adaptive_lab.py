"""Adaptive mode on a lab machine: brackets and one bisection round instead of a grid."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from socketwise.measure.sweep import Profile, sweep

from .labs import fresh_lab

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Iterator[Path]:
    profile = Profile(
        input_len=64, output_len=32, step_seconds=4, min_prompts=4, calibration_prompts=16
    )
    run = tmp_path_factory.mktemp("adaptive")
    with fresh_lab():
        yield sweep(Path("inventories/lab"), ["sn", "dp"], run, profile, mode="adaptive", rounds=1)


def test_adaptive_measures_brackets_and_the_bisection_midpoint_on_both_layouts(run_dir):
    manifest = json.loads((run_dir / "manifest.json").read_text())
    search = manifest["adaptive"]
    assert set(search["saturation_rate"]) == {"sn", "dp"}
    assert all(rate > 0 for rate in search["saturation_rate"].values())
    (round_1,) = search["rounds"]
    low, high = search["crossover_between"]
    assert low < high and round_1["rate"] in (low, high)
    with (run_dir / "summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    # Per layout: the synchronous bracket and the midpoint; the flat-out run is not a row.
    for layout in ("sn", "dp"):
        mine = [r for r in rows if r["layout"] == layout]
        assert sorted((r["concurrency"], r["rate"]) for r in mine) == sorted(
            [("1", ""), ("", str(round_1["rate"]))]
        )
    assert (run_dir / "hosts" / "lab1" / "dp" / "round-1").is_dir()
