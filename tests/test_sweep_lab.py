"""Real short sweeps on one lab machine: a grid over plain vLLM (the baseline), SN and
DP-2, calibrated, a few steps each, ending in a complete run directory and a report that
reads the kit's layouts against plain vLLM; then, on the same machine,
the adaptive mode: brackets and one bisection round instead of a grid. vLLM runs in eager
mode here (it starts three times faster; the figures' size is not what is tested)."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from socketwise.facts.topology import detect
from socketwise.lab.common import api_key_path
from socketwise.measure.sweep import Profile, sweep
from socketwise.plan.hwclass import isa_class
from socketwise.report import analysis, render

from .frontdoor import files_holding
from .labs import eager_inventory, fresh_lab
from .test_report import assert_renders

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def machine(tmp_path_factory) -> Iterator[Path]:
    """One machine for both sweeps (the adaptive one starts from the grid's restored SN);
    its inventory, vLLM in eager mode."""
    with fresh_lab():
        yield eager_inventory(tmp_path_factory.mktemp("inventory"))


@pytest.fixture(scope="module")
def run_dir(machine, tmp_path_factory) -> Path:
    profile = Profile(
        concurrencies=[1],
        rate_fractions=[0.5, 1.5],
        input_len=64,
        output_len=32,
        step_seconds=4,
        min_prompts=4,
        calibration_prompts=16,
    )
    return sweep(machine, ["baseline", "sn", "dp"], tmp_path_factory.mktemp("run"), profile)


@pytest.fixture(scope="module")
def adaptive_run(machine, run_dir, tmp_path_factory) -> Path:
    profile = Profile(
        input_len=64, output_len=32, step_seconds=4, min_prompts=4, calibration_prompts=16
    )
    run = tmp_path_factory.mktemp("adaptive")
    return sweep(machine, ["sn", "dp"], run, profile, mode="adaptive", rounds=1)


def test_summary_has_every_step_of_every_layout(run_dir):
    with (run_dir / "summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["layout"] for r in rows} == {"baseline", "sn", "dp"}
    for layout in ("baseline", "sn", "dp"):
        mine = [r for r in rows if r["layout"] == layout]
        assert [r["concurrency"] for r in mine if r["concurrency"]] == ["1"]
        assert len([r for r in mine if r["rate"]]) == 2
        assert all(int(r["completed"]) > 0 and float(r["output_tok_s"]) > 0 for r in mine)


def test_run_directory_discloses_what_was_measured(run_dir):
    manifest = json.loads((run_dir / "manifest.json").read_text())
    host = manifest["hosts"]["lab1"]
    assert host["vllm_version"] == "0.32.0"
    # What ran, as the server loaded it: the build class of the machine's own CPU.
    built = host["build"]
    assert built["class"] == isa_class(detect()) and built["install_method"] == "venv"
    assert built["platform"] == ("ZenCpuPlatform" if built["class"] == "zen" else "CpuPlatform")
    assert host["model_bytes"] > 0 and host["bandwidth_gbps"] > 0
    assert manifest["calibration"] == {
        "layout": "baseline",
        "max_request_rate": manifest["calibration"]["max_request_rate"],
    }
    assert manifest["calibration"]["max_request_rate"] > 0
    assert "vLLM's own defaults" in manifest["baseline"]
    for layout in ("baseline", "sn", "dp"):
        results = run_dir / "hosts" / "lab1" / layout / "sweep"
        assert (results / "idle.json").exists()
        assert (
            "Started" in (results / "journal.txt").read_text()
            or (results / "journal.txt").stat().st_size > 0
        )
        assert "task" in (results / "placement.txt").read_text()
        assert (results / "c1" / "metrics.jsonl").read_text().strip()
        assert (run_dir / "artifacts" / layout / "lab1" / "plan.json").exists()


def _deployed(run_dir: Path, layout: str) -> dict:
    return json.loads((run_dir / "artifacts" / layout / "lab1" / "deploy-summary.json").read_text())


def _workers(deployed: dict) -> list[list[int]]:
    (instance,) = deployed["affinity"]
    return [p["thread_cpus"] for p in instance["processes"] if p["comm"].startswith("VLLM::Worker")]


def test_the_baseline_is_plain_vllm_placing_itself_behind_the_same_front_door(run_dir):
    plain, kit = _deployed(run_dir, "baseline"), _deployed(run_dir, "sn")
    assert (plain["placement"], kit["placement"]) == ("vllm", "plan")
    assert plain["endpoint"] == kit["endpoint"] and plain["front_door"] == kit["front_door"]
    assert plain["dtype"] == kit["dtype"] and plain["completions"]
    # The kit pins its one rank's threads to the plan's CPUs; plain vLLM's own binding
    # chose others (on a small host it keeps a CPU for its front end).
    (rank,) = kit["plan"]["instances"][0]["ranks"]
    assert _workers(kit) == [sorted(rank["cpus"])]
    (plain_worker,) = _workers(plain)
    assert plain_worker and plain_worker != sorted(rank["cpus"])
    # No preload in plain vLLM's processes, the build class's in the kit's.
    assert not any(lib.startswith("libtcmalloc") for lib in plain["build"]["runtime_libraries"])
    assert any(lib.startswith("libtcmalloc") for lib in kit["build"]["runtime_libraries"])


def test_every_layout_is_measured_warm(run_dir):
    # The first step after each deploy sends warm-up requests it leaves out: the first
    # layout's calibration, then each later layout's first measured step.
    def step(layout: str, batch: str, name: str) -> dict:
        path = run_dir / "hosts" / "lab1" / layout / batch / name / "step.json"
        return json.loads(path.read_text())

    assert step("baseline", "calibration", "max")["warmups"] == 4
    assert "warmups" not in step("baseline", "sweep", "c1")
    assert step("sn", "sweep", "c1")["warmups"] == step("dp", "sweep", "c1")["warmups"] == 4


def test_the_host_is_back_on_its_configured_layout(run_dir):
    restored = _deployed(run_dir, "restored")
    assert (restored["layout"], restored["placement"]) == ("sn", "plan")


def test_the_report_of_the_run_renders_and_decides(run_dir, tmp_path):
    decisions = analysis.analyse(run_dir)
    assert {"crossover_rate", "crossover_between", "saturation", "recommendation"} <= set(decisions)
    assert decisions["recommendation"], decisions
    # Plain vLLM is compared against, never recommended.
    assert {r["layout"] for r in decisions["recommendation"]} <= {"sn", "dp"}
    baseline = decisions["baseline"]
    assert baseline["status"] == "measured" and set(baseline["ratios"]) == {"rate", "concurrency"}
    for by_layout in baseline["ratios"].values():
        assert set(by_layout) == {"sn", "dp"}
        assert all(r["output_tok_s"] > 0 for ratios in by_layout.values() for r in ratios)
    assert all("baseline_as_good_at" in r for r in decisions["recommendation"])
    _, page = render.write(run_dir)
    assert_renders(page, tmp_path, min_images=4)


def test_the_run_directory_holds_no_api_key(run_dir):
    # The load went through the front door with the lab's key; none of it was kept.
    key = api_key_path().read_text().strip()
    assert files_holding(run_dir, key) == []


def test_adaptive_measures_brackets_and_the_bisection_midpoint_on_both_layouts(adaptive_run):
    manifest = json.loads((adaptive_run / "manifest.json").read_text())
    search = manifest["adaptive"]
    assert set(search["saturation_rate"]) == {"sn", "dp"}
    assert all(rate > 0 for rate in search["saturation_rate"].values())
    (round_1,) = search["rounds"]
    low, high = search["crossover_between"]
    assert low < high and round_1["rate"] in (low, high)
    with (adaptive_run / "summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    # Per layout: the synchronous bracket and the midpoint; the flat-out run is not a row.
    for layout in ("sn", "dp"):
        mine = [r for r in rows if r["layout"] == layout]
        assert sorted((r["concurrency"], r["rate"]) for r in mine) == sorted(
            [("1", ""), ("", str(round_1["rate"]))]
        )
    assert (adaptive_run / "hosts" / "lab1" / "dp" / "round-1").is_dir()
