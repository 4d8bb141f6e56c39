"""Real short sweeps on a lab of its own (`sweep`, beside the other test worker's lab):
sweep1 serves, sweep2 (group socketwise_loadgen) generates the load and serves nothing.
First `socketwise sweep` with GuideLLM over plain vLLM (the baseline) and SN, calibrated,
a few steps each, with progress per step, ending in a complete run directory that joins
sweep2's results with sweep1's measurements and a report that reads the kit against
plain vLLM; then, on the same machines, the adaptive mode with vLLM's own benchmark over
SN and DP-2: brackets and one bisection round instead of a grid, and the report's SN/DP
decision. DP-2 is measured once, by the adaptive run (each layout
measured costs a deploy and a batch, about three minutes of the lab's two cores). vLLM
runs in eager mode here (it starts three times faster; the figures' size is not what is
tested). One lab and one deployment serve both sweeps: every lab module pays a boot, an
install and a first start, so the sweeps share them."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from socketwise.facts.topology import detect
from socketwise.lab import machines as lab
from socketwise.lab.common import api_key_path
from socketwise.measure.sweep import Profile, sweep
from socketwise.plan.hwclass import isa_class
from socketwise.report import analysis, render

from .frontdoor import files_holding, key_places_on_host
from .labs import eager_inventory, fresh_lab, named_lab, run_on
from .playbooks import run_playbook
from .test_report import PNG_MAGIC, assert_renders

# Its own lab (tests/conftest.py's LAB_OF): the suite's two workers run it beside another.
LAB = "sweep"
SERVED, LOADGEN = f"{LAB}1", f"{LAB}2"
pytestmark = pytest.mark.lab

LAYOUTS = ("baseline", "sn")
BIN = Path(sys.executable).parent


@dataclass
class Lab:
    inventory: Path
    served: lab.Machine
    loadgen: lab.Machine


@dataclass
class Grid:
    run_dir: Path
    stdout: str


@pytest.fixture(scope="module")
def machines(tmp_path_factory) -> Iterator[Lab]:
    """sweep1 serves, sweep2 loads it; the inventory `lab up` wrote, vLLM in eager mode."""
    with (
        named_lab(LAB),
        fresh_lab(machines=2, loadgen=1, preinstalled=True) as (served, loadgen),
    ):
        assert (served.name, loadgen.name) == (SERVED, LOADGEN)
        yield Lab(eager_inventory(tmp_path_factory.mktemp("inventory")), served, loadgen)


@pytest.fixture(scope="module")
def grid(machines, tmp_path_factory) -> Grid:
    """The calibrated grid through the CLI, as a user runs it: c1 and two rates a layout."""
    run_dir = tmp_path_factory.mktemp("run")
    done = subprocess.run(
        [str(BIN / "socketwise"), "sweep", "-i", str(machines.inventory),
         "--layouts", ",".join(LAYOUTS), "--tool", "guidellm", "--concurrencies", "1",
         "--rate-fractions", "0.5,1.5", "--step-seconds", "4", "--input-len", "64",
         "--output-len", "32", "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=1800,
        env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return Grid(run_dir, done.stdout)


@pytest.fixture(scope="module")
def run_dir(grid) -> Path:
    return grid.run_dir


@pytest.fixture(scope="module")
def adaptive_run(machines, grid, tmp_path_factory) -> Path:
    """After the grid (it starts from the grid's restored SN), with vLLM's benchmark;
    the lab goes down after it, so it leaves DP (restoring is the grid's test): only the
    module's last tests ask for it, after every test of the grid's lab."""
    profile = Profile(
        input_len=64, output_len=32, step_seconds=4, min_prompts=4, calibration_prompts=16
    )
    run = tmp_path_factory.mktemp("adaptive")
    return sweep(
        machines.inventory, ["sn", "dp"], run, profile, restore=False, mode="adaptive", rounds=1
    )


def test_summary_has_every_step_of_every_layout(run_dir):
    with (run_dir / "summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["layout"] for r in rows} == set(LAYOUTS)
    for layout in LAYOUTS:
        mine = [r for r in rows if r["layout"] == layout]
        assert [r["concurrency"] for r in mine if r["concurrency"]] == ["1"]
        assert len([r for r in mine if r["rate"]]) == 2
        assert all(int(r["completed"]) > 0 and float(r["output_tok_s"]) > 0 for r in mine)


def test_run_directory_discloses_what_was_measured(run_dir):
    manifest = json.loads((run_dir / "manifest.json").read_text())
    host = manifest["hosts"][SERVED]
    assert host["vllm_version"] == "0.32.0"
    # What ran, as the server loaded it: the build class of the machine's own CPU.
    built = host["build"]
    assert built["class"] == isa_class(detect()) and built["install_method"] == "venv"
    assert built["platform"] == ("ZenCpuPlatform" if built["class"] == "zen" else "CpuPlatform")
    assert host["model_bytes"] > 0 and host["bandwidth_gbps"] > 0
    # The calibration is the request rate the first layout sustained flat out, as its own
    # benchmark measured it, and the rate steps sit at the asked fractions of it.
    flat_out = run_dir / "hosts" / SERVED / "baseline" / "calibration" / "max" / "bench.json"
    sustained = json.loads(flat_out.read_text())["request_throughput"]
    assert sustained > 0
    assert manifest["calibration"] == {"layout": "baseline", "max_request_rate": sustained}
    with (run_dir / "summary.csv").open() as f:
        rates = {float(r["rate"]) for r in csv.DictReader(f) if r["rate"]}
    assert rates == {round(sustained * fraction, 2) for fraction in (0.5, 1.5)}
    assert "vLLM's own defaults" in manifest["baseline"]
    for layout in LAYOUTS:
        results = run_dir / "hosts" / SERVED / layout / "sweep"
        assert (results / "idle.json").exists()
        assert_journal_shows_the_server_decoding(results)
        assert "task" in (results / "placement.txt").read_text()
        assert (results / "c1" / "metrics.jsonl").read_text().strip()
        assert (run_dir / "artifacts" / layout / SERVED / "plan.json").exists()


def assert_journal_shows_the_server_decoding(results: Path) -> None:
    """journal.txt is the servers' journal over the batch: lines of the served host, among
    them the statistics vLLM logs every 10 s from the server placement.txt names, reporting
    tokens generated while a step's load ran."""
    placement = (results / "placement.txt").read_text()
    (pid,) = re.findall(r"^== socketwise-vllm-\S+ \(pid (\d+)\)", placement, re.MULTILINE)
    lines = [line for line in (results / "journal.txt").read_text().splitlines() if line.strip()]
    # journalctl -o short-iso: TIME HOST UNIT[PID]: MESSAGE (an entry's further lines indented)
    assert lines and {line.split()[1] for line in lines if not line[0].isspace()} == {SERVED}
    decoding = []
    for line in lines:
        stats = re.search(r"Avg generation throughput: ([0-9.]+) tokens/s", line)
        if not line[0].isspace() and f"[{pid}]: " in line and stats and float(stats[1]) > 0:
            decoding.append(datetime.fromisoformat(line.split()[0]).timestamp())
    windows = [json.loads(p.read_text())["window"] for p in results.glob("*/step.json")]
    # The journal has whole seconds; a statistics line covers the 10 s before it.
    assert any(start - 1 <= at <= end + 11 for at in decoding for start, end in windows), (
        lines,
        windows,
    )


def _deployed(run_dir: Path, layout: str) -> dict:
    return json.loads((run_dir / "artifacts" / layout / SERVED / "deploy-summary.json").read_text())


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
        path = run_dir / "hosts" / SERVED / layout / batch / name / "step.json"
        return json.loads(path.read_text())

    assert step("baseline", "calibration", "max")["warmups"] == 4
    assert "warmups" not in step("baseline", "sweep", "c1")
    assert step("sn", "sweep", "c1")["warmups"] == 4


def test_the_host_is_back_on_its_configured_layout(run_dir):
    restored = _deployed(run_dir, "restored")
    assert (restored["layout"], restored["placement"]) == ("sn", "plan")


def test_the_report_of_the_run_reads_the_kit_against_plain_vllm(run_dir):
    decisions = analysis.analyse(run_dir)
    assert decisions["recommendation"], decisions
    # Plain vLLM is compared against, never recommended.
    assert {r["layout"] for r in decisions["recommendation"]} == {"sn"}
    baseline = decisions["baseline"]
    assert baseline["status"] == "measured" and set(baseline["ratios"]) == {"rate", "concurrency"}
    for by_layout in baseline["ratios"].values():
        assert set(by_layout) == {"sn"}
        assert all(r["output_tok_s"] > 0 for ratios in by_layout.values() for r in ratios)
    assert all("baseline_as_good_at" in r for r in decisions["recommendation"])


def test_guidellm_measured_every_step_of_every_layout(machines, run_dir):
    with (run_dir / "summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["host"] for r in rows} == {machines.served.name}  # the load generator serves nothing
    for layout in LAYOUTS:
        steps = list((run_dir / "hosts" / SERVED / layout / "sweep").glob("*/step.json"))
        # The message (read only on a failure): each step's reasons, as its bench.json kept them.
        assert all(r["failed"] == "0" for r in rows if r["layout"] == layout), {
            s.parent.name: json.loads((s.parent / "bench.json").read_text()).get("failure_reasons")
            for s in steps
        }
        assert len(steps) == 3
        for step in steps:
            record = json.loads(step.read_text())
            bench = json.loads((step.parent / "bench.json").read_text())
            assert record["tool"] == bench["tool"] == "guidellm"
            assert (step.parent / "guidellm.json").exists()
            # Power and CPU are cut to the load itself, inside the step's wall time.
            start, end = record["window"]
            assert record["started"] < start < end < record["ended"]
            assert record["power"]["seconds"] == pytest.approx(end - start, abs=0.01)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["load_generator"].startswith("guidellm")
    assert "socketwise_loadgen" in manifest["measured_boundary"]
    assert manifest["hosts"][SERVED]["load_generator_host"] == machines.loadgen.name


def test_the_load_came_from_the_load_generator(machines, grid):
    served, loadgen = machines.served, machines.loadgen
    # The last batch (SN's sweep) ran its GuideLLM steps on the load generator.
    assert "c1" in run_on(loadgen, f"ls /var/lib/socketwise/bench-load/{SERVED}").split()
    assert run_on(loadgen, f"ls /var/lib/socketwise/bench-load/{SERVED}/c1").count("guidellm.json")
    assert run_on(served, "ls /var/lib/socketwise/bench-load || echo absent") == "absent"
    assert run_on(loadgen, "systemctl list-units --plain --no-legend 'socketwise-*'") == ""
    assert run_on(served, "test -e /opt/socketwise/guidellm || echo absent") == "absent"
    assert run_on(served, "systemctl is-active socketwise-vllm-sn") == "active"
    # GuideLLM runs on vLLM's CPU torch, in its own venv with its own pins.
    frozen = run_on(loadgen, "/opt/socketwise/guidellm/bin/python -m pip freeze")
    assert "torch==2.13.0+cpu" in frozen.split() and "guidellm==0.8.1" in frozen.split()
    assert not re.search(r"^nvidia-", frozen, re.MULTILINE)


def test_progress_moves_with_every_step_and_gives_an_eta(grid):
    finished = re.findall(
        rf"\[sweep\] step (\d+)/(\d+), ETA ([0-9.]+) min: \w+: {SERVED} (\S+) done", grid.stdout
    )
    # Calibration, then c1 and two rates on each layout.
    total = 1 + 3 * len(LAYOUTS)
    assert [int(n) for n, _, _, _ in finished] == list(range(1, total + 1))
    assert {t for _, t, _, _ in finished} == {str(total)}
    assert finished[-1][2] == "0.0"
    assert [name[0] for _, _, _, name in finished[1:]] == ["c", "r", "r"] * len(LAYOUTS)


def test_the_sweep_wrote_the_report_of_its_run(grid):
    # Rendered in Chromium with the adaptive run's report below (its SN and DP curves).
    assert f"wrote {grid.run_dir / 'report.html'}" in grid.stdout
    plots = sorted((grid.run_dir / "plots").glob("*.png"))
    assert len(plots) >= 4 and all(p.read_bytes().startswith(PNG_MAGIC) for p in plots)
    page = (grid.run_dir / "report.html").read_text()
    assert all(f'src="plots/{p.name}"' in page for p in plots)


def test_a_load_generator_outside_the_group_is_refused_before_any_load(machines, grid):
    spec_time = "stat -c %Y /var/lib/socketwise/bench/spec.json"
    before = run_on(machines.served, spec_time)
    run = run_playbook(
        "playbooks/bench.yml", "-i", str(machines.inventory), "-e", f"benchmark_loadgen={LAB}9"
    )
    assert run.returncode != 0 and run.recap(SERVED)["failed"] == 1
    assert (
        f"{SERVED}: benchmark_loadgen={LAB}9 is not a host of the group socketwise_loadgen"
        in " ".join(run.output.split())
    )
    # The last run's results on the served host are untouched.
    assert run_on(machines.served, spec_time) == before


def test_the_key_guidellm_sent_is_gone_from_the_load_generator_and_the_run(machines, grid):
    key = api_key_path().read_text().strip()
    assert key not in grid.stdout
    assert files_holding(grid.run_dir, key) == []
    assert key_places_on_host(machines.loadgen, key) == []
    assert run_on(machines.loadgen, "ls /etc/socketwise/secrets") == ""


def test_adaptive_measures_brackets_and_the_bisection_midpoint_on_both_layouts(adaptive_run):
    manifest = json.loads((adaptive_run / "manifest.json").read_text())
    search = manifest["adaptive"]
    # Each layout saturates at the request rate its flat-out bracket step sustained.
    saturation = search["saturation_rate"]
    for layout in ("sn", "dp"):
        flat_out = adaptive_run / "hosts" / SERVED / layout / "bracket" / "max" / "bench.json"
        assert saturation[layout] == json.loads(flat_out.read_text())["request_throughput"] > 0
    # The search starts between half of SN's flat-out rate and the highest flat-out rate and
    # measures the midpoint; DP is ahead there when it leads SN by more than 3 %, and the
    # crossover then lies below the midpoint, else above it.
    (round_1,) = search["rounds"]
    low, high = round(saturation["sn"] / 2, 2), round(max(saturation.values()), 2)
    assert (round_1["low"], round_1["high"]) == (low, high)
    assert round_1["rate"] == round((low + high) / 2, 2)
    with (adaptive_run / "summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    at_midpoint = {r["layout"]: float(r["output_tok_s"]) for r in rows if r["rate"]}
    assert round_1["second_ahead"] == (at_midpoint["dp"] > 1.03 * at_midpoint["sn"])
    half = [low, round_1["rate"]] if round_1["second_ahead"] else [round_1["rate"], high]
    assert search["crossover_between"] == half
    # Per layout: the synchronous bracket and the midpoint; the flat-out run is not a row.
    for layout in ("sn", "dp"):
        mine = [r for r in rows if r["layout"] == layout]
        assert sorted((r["concurrency"], r["rate"]) for r in mine) == sorted(
            [("1", ""), ("", str(round_1["rate"]))]
        )
    assert (adaptive_run / "hosts" / SERVED / "dp" / "round-1").is_dir()


def test_the_report_of_the_adaptive_run_decides_between_sn_and_dp(adaptive_run, tmp_path):
    decisions = analysis.analyse(adaptive_run)
    assert {"crossover_rate", "crossover_between", "saturation", "recommendation"} <= set(decisions)
    assert decisions["recommendation"], decisions
    assert {r["layout"] for r in decisions["recommendation"]} <= {"sn", "dp"}
    _, page = render.write(adaptive_run)
    assert_renders(page, tmp_path, min_images=1)
