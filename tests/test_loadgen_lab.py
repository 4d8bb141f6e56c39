"""A real sweep whose load comes from another host: lab2 (group socketwise_loadgen)
drives GuideLLM against lab1, which serves SN and then DP-2. The sweep reports progress
per step, and the run directory joins lab2's results with lab1's measurements. vLLM runs
in eager mode here (it starts three times faster; the figures' size is not what is tested)."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from socketwise.lab import machines as lab
from socketwise.lab.common import api_key_path

from .frontdoor import files_holding, key_places_on_host
from .labs import eager_inventory, fresh_lab
from .playbooks import run_playbook
from .test_deploy_lab import on_host
from .test_report import assert_renders

pytestmark = pytest.mark.lab

STEPS = ["c1", "r"]  # per layout: concurrency 1 and two calibrated rates


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory) -> Iterator[tuple[Path, str, list[lab.Machine]]]:
    run_dir = tmp_path_factory.mktemp("run")
    with fresh_lab(machines=2, loadgen=1) as machines:
        inventory = eager_inventory(tmp_path_factory.mktemp("inventory"))
        done = subprocess.run(
            [str(Path(sys.executable).parent / "socketwise"), "sweep", "-i", str(inventory),
             "--layouts", "sn,dp", "--tool", "guidellm", "--concurrencies", "1",
             "--rate-fractions", "0.5,1.0", "--step-seconds", "4", "--input-len", "64",
             "--output-len", "32", "--run-dir", str(run_dir)],
            capture_output=True, text=True, timeout=1800,
            env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        yield run_dir, done.stdout, machines


def test_guidellm_measured_every_step_of_both_layouts(sweep_run):
    run_dir, _, _ = sweep_run
    with (run_dir / "summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["host"] for r in rows} == {"lab1"}  # the load generator serves nothing
    for layout in ("sn", "dp"):
        mine = [r for r in rows if r["layout"] == layout]
        assert len(mine) == 3
        assert all(int(r["completed"]) > 0 and r["failed"] == "0" for r in mine)
        for step in (run_dir / "hosts" / "lab1" / layout / "sweep").glob("*/step.json"):
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
    assert manifest["hosts"]["lab1"]["load_generator_host"] == "lab2"


def test_the_load_came_from_the_load_generator(sweep_run):
    _, _, (served, loadgen) = sweep_run
    # The last batch (DP's sweep) ran its GuideLLM steps on lab2, not on lab1.
    assert "c1" in on_host(loadgen, "ls /var/lib/socketwise/bench-load/lab1").split()
    assert on_host(loadgen, "ls /var/lib/socketwise/bench-load/lab1/c1").count("guidellm.json")
    assert (
        on_host(served, "ls /var/lib/socketwise/bench-load || echo absent", check=False) == "absent"
    )
    assert on_host(loadgen, "systemctl list-units --plain --no-legend 'socketwise-*'") == ""
    assert on_host(served, "test -e /opt/socketwise/guidellm || echo absent").strip() == "absent"
    assert on_host(served, "systemctl is-active socketwise-vllm-sn").strip() == "active"
    # GuideLLM runs on vLLM's CPU torch, in its own venv with its own pins.
    frozen = on_host(loadgen, "/opt/socketwise/guidellm/bin/python -m pip freeze")
    assert "torch==2.13.0+cpu" in frozen.split() and "guidellm==0.8.1" in frozen.split()
    assert not re.search(r"^nvidia-", frozen, re.MULTILINE)


def test_progress_moves_with_every_step_and_gives_an_eta(sweep_run):
    _, stdout, _ = sweep_run
    finished = re.findall(
        r"\[sweep\] step (\d+)/(\d+), ETA ([0-9.]+) min: \w+: lab1 (\S+) done", stdout
    )
    # Calibration, then c1 and two rates on each layout.
    assert [int(n) for n, _, _, _ in finished] == list(range(1, 8))
    assert {total for _, total, _, _ in finished} == {"7"}
    assert finished[-1][2] == "0.0"
    assert [name[0] for _, _, _, name in finished[1:]] == ["c", "r", "r"] * 2


def test_the_report_of_the_run_renders(sweep_run, tmp_path):
    run_dir, stdout, _ = sweep_run
    assert f"wrote {run_dir / 'report.html'}" in stdout
    assert_renders(run_dir / "report.html", tmp_path, min_images=4)


def test_a_load_generator_outside_the_group_is_refused_before_any_load(sweep_run):
    _, _, (served, _) = sweep_run
    before = on_host(served, "stat -c %Y /var/lib/socketwise/bench/spec.json")
    run = run_playbook("playbooks/bench.yml", "-e", "benchmark_loadgen=lab9")
    assert run.returncode != 0 and run.recap("lab1")["failed"] == 1
    assert "lab1: benchmark_loadgen=lab9 is not a host of the group socketwise_loadgen" in " ".join(
        run.output.split()
    )
    # The last run's results on the served host are untouched.
    assert on_host(served, "stat -c %Y /var/lib/socketwise/bench/spec.json") == before


def test_the_key_guidellm_sent_is_gone_from_the_load_generator_and_the_run(sweep_run):
    run_dir, stdout, machines = sweep_run
    key = api_key_path().read_text().strip()
    assert key not in stdout
    assert files_holding(run_dir, key) == []
    loadgen = machines[-1]
    assert key_places_on_host(loadgen, key) == []
    assert on_host(loadgen, "ls /etc/socketwise/secrets") == ""
