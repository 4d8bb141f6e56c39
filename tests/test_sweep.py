"""The sweep's own decisions: where its steps go and how results become summary.csv."""

import csv
import json
from pathlib import Path

from socketwise.cli import build_parser
from socketwise.measure import sweep, sweepcli
from socketwise.measure.rundir import SUMMARY_COLUMNS, write_csv
from socketwise.measure.runner import failures
from socketwise.measure.sweep import Profile, Sweep, prompt_seed, run_fixed, summary_rows


def test_rates_are_placed_relative_to_the_measured_maximum():
    steps = Profile(rate_fractions=[0.5, 1.0, 1.5], step_seconds=10).steps(max_rate=4.0)
    rates = [s["rate"] for s in steps if "rate" in s]
    assert rates == [2.0, 4.0, 6.0]
    # Each open-loop step lasts about step_seconds: prompts = rate x seconds.
    assert [s["num_prompts"] for s in steps if "rate" in s] == [20, 40, 60]
    assert [s["concurrency"] for s in steps if "concurrency" in s] == [1, 4]


def test_closed_loop_steps_last_about_step_seconds_at_most_and_send_8_per_request_in_flight():
    profile = Profile(concurrencies=[1, 4, 64], step_seconds=30)
    # 40 req/s flat out with 32 in flight: 4 in flight deliver at least 5 req/s, so 150
    # requests take 30 s at most; one in flight 38; 64 no more than the flat-out run's 32.
    fast = {s["concurrency"]: s["num_prompts"] for s in profile.steps(40.0) if "concurrency" in s}
    assert fast == {1: 38, 4: 150, 64: 1200}
    # A host that sustains 1 req/s flat out gets the floor: 8 requests per one in flight.
    slow = {s["concurrency"]: s["num_prompts"] for s in profile.steps(1.0) if "concurrency" in s}
    assert slow == {1: 8, 4: 32, 64: 512}


def test_the_same_sweep_scales_with_the_host():
    small = Profile().steps(max_rate=0.8)
    big = Profile().steps(max_rate=80.0)
    assert [s["rate"] for s in big if "rate" in s] == [
        round(100 * s["rate"], 2) for s in small if "rate" in s
    ]


def test_repetitions_repeat_every_point_under_distinct_names():
    steps = Profile(repetitions=3).steps(max_rate=2.0)
    names = [s["name"] for s in steps]
    assert len(names) == len(set(names)) == 3 * 7
    assert sum(1 for s in steps if s.get("rate") == 1.0) == 3


def test_no_step_sends_the_prompts_of_another_step_or_run():
    """vLLM's prefix cache answers a prompt it has seen without its prefill: a step that
    repeated an earlier one's prompts on the same server measured a faster server."""
    steps = [s["name"] for s in Profile(repetitions=2).steps(max_rate=2.0)]
    seeds = [
        prompt_seed(0, run, layout, batch, step)
        for run in (1, 2)
        for layout in ("baseline", "sn")
        for batch in ("round-1", "round-2")
        for step in steps
    ]
    assert len(set(seeds)) == len(seeds) == 2 * 2 * 2 * len(steps)
    # Drawn from the profile's seed: the same step of the same run gets the same prompts.
    assert prompt_seed(0, 1, "sn", "round-1", "c1-1") == prompt_seed(0, 1, "sn", "round-1", "c1-1")
    assert prompt_seed(0, 1, "sn", "round-1", "c1-1") != prompt_seed(1, 1, "sn", "round-1", "c1-1")
    assert all(0 <= seed < 2**32 for seed in seeds)  # numpy's seed range


def test_every_layout_starts_its_steps_on_a_server_started_for_them(monkeypatch, tmp_path):
    """A server's prefix cache keeps the prompts it answered: one left running by an
    earlier run, or by the flat-out run that sized the steps, answers prompts that share
    a start with them faster, so the layout measured first would be flattered."""
    deploys, batches = [], []

    def runner(playbook, inventory, variables, artifacts, on_event=None, limit=None):
        deploys.append((artifacts.name, variables.get("vllm_service_fresh_start")))

    def bench(inventory, layout, steps, run_dir, batch, *rest):
        batches.append((layout, batch, steps[0].get("warmups")))
        results = run_dir / "hosts" / "lab1" / layout / batch
        for step in steps:
            (results / step["name"]).mkdir(parents=True)
            (results / step["name"] / "bench.json").write_text('{"request_throughput": 4.0}')
        return {"lab1": results}

    monkeypatch.setattr(sweep, "run_playbook", runner)
    monkeypatch.setattr(sweep, "_bench", bench)
    monkeypatch.setattr(sweep, "summary_rows", lambda *_: [])
    monkeypatch.setattr(sweep, "step_power_rows", lambda *_: [])
    experiment = Sweep(Path("inv"), tmp_path, Profile(concurrencies=[1]), 3, limit="lab1")
    run_fixed(experiment, ["baseline", "sn"])
    # Every deploy restarts, changed or not (a host may already serve the first layout);
    # the first layout again after its flat-out run, each one warmed up.
    assert deploys == [("baseline", True), ("baseline", True), ("sn", True)]
    assert batches == [
        ("baseline", "calibration", 4), ("baseline", "sweep", 4), ("sn", "sweep", 4)
    ]  # fmt: skip
    # A layout deployed and not asked to start afresh measures on.
    experiment.measure("sn", [{"name": "c1", "concurrency": 1}], "more")
    assert len(deploys) == 3 and batches[-1] == ("sn", "more", None)


def test_bench_results_become_contract_rows(tmp_path):
    bench = {
        "output_throughput": 123.456, "median_ttft_ms": 20.0, "p99_ttft_ms": 40.0,
        "median_itl_ms": 4.0, "p99_itl_ms": 9.0, "completed": 8, "failed": 0,
        "median_tpot_ms": 8.444,
    }  # fmt: skip
    steps = (("r2", {"rate": 2.0}), ("c1", {"concurrency": 1}), ("max", {"rate": "inf"}))
    for started, (name, step) in zip((2, 1, 0), steps, strict=True):
        (tmp_path / name).mkdir()
        record = {"name": name, "started": started, **step}
        (tmp_path / name / "step.json").write_text(json.dumps(record))
        (tmp_path / name / "bench.json").write_text(json.dumps(bench))
    rows = summary_rows("lab1", "sn", tmp_path)
    assert [(r["rate"], r["concurrency"]) for r in rows] == [(None, 1), (2.0, None)]
    write_csv(tmp_path / "summary.csv", SUMMARY_COLUMNS, rows)
    with (tmp_path / "summary.csv").open() as f:
        read = list(csv.DictReader(f))
    assert list(read[0]) == list(SUMMARY_COLUMNS)
    assert read[1]["output_tok_s"] == "123.456" and read[1]["rate"] == "2.0"
    assert read[1]["tpot_p50_ms"] == "8.44"  # the report's decode rate, not ITL's ~0


def test_a_step_whose_tokens_came_in_one_chunk_has_no_tpot(tmp_path):
    """0.07 ms a token is no decoder's pace: the server sent each answer whole, and a
    ratio against it would make a streaming server look 20 times slower."""
    for name, tpot in (("c1", 1.24), ("c4", 0.07)):
        (tmp_path / name).mkdir()
        step = {"name": name, "started": tpot, "concurrency": int(name[1])}
        (tmp_path / name / "step.json").write_text(json.dumps(step))
        bench = {
            "output_throughput": 1000.0, "median_ttft_ms": 60.0, "p99_ttft_ms": 90.0,
            "median_itl_ms": 0.0, "p99_itl_ms": 30.0, "completed": 100, "median_tpot_ms": tpot,
        }  # fmt: skip
        (tmp_path / name / "bench.json").write_text(json.dumps(bench))
    rows = summary_rows("lab1", "sn", tmp_path)
    assert [(r["concurrency"], r["tpot_p50_ms"]) for r in rows] == [(4, None), (1, 1.24)]


def test_a_failed_step_says_why_not_only_that_items_failed():
    item = {
        "event": "runner_item_on_failed",
        "event_data": {
            "host": "lab1",
            "task": "Run step",
            "res": {"_ansible_item_label": "max", "stderr": "guidellm: connection refused"},
        },
    }
    loop = {
        "event": "runner_on_failed",
        "event_data": {
            "host": "lab1",
            "task": "Run step",
            "res": {"msg": "One or more items failed", "results": [{}]},
        },
    }
    task = {
        "event": "runner_on_failed",
        "event_data": {"host": "lab2", "task": "Wait", "res": {"msg": "timed out"}},
    }
    assert failures([item, loop, task]) == [
        "lab1: Run step max: guidellm: connection refused",
        "lab2: Wait: timed out",
    ]


def test_every_step_of_a_sweep_sends_its_profiles_prompts():
    # A sweep of shared prefixes: each step, the flat-out run and the adaptive search's
    # bracket send prefix_repetition's prompts, not random ones; dp-prefix is dp whose
    # door balances by prefix.
    profile = Profile(concurrencies=[2], rate_fractions=[0.5], dataset="prefix")
    steps = profile.steps(4.0) + [sweep._flat_out_step(profile)]
    assert {step["dataset"] for step in steps} == {"prefix"}
    assert {step["dataset"] for step in Profile().steps(4.0)} == {"random"}
    assert sweep.LAYOUTS["dp-prefix"] == sweep.LAYOUTS["dp"] | {"plan_balance": "prefix"}


def test_the_sweeps_dataset_flag_reaches_its_profile():
    args = build_parser().parse_args(["sweep", "--dataset", "prefix", "--layouts", "dp,dp-prefix"])
    assert sweepcli._profile(args).dataset == "prefix"
    assert sweepcli._profile(build_parser().parse_args(["sweep"])).dataset == "random"
