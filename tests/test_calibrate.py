"""`socketwise calibrate`'s decisions from figures it measured: which variants a class is
measured on, which reserve and dtype win against plain vLLM, how the SN/DP crossover's
request rate becomes a concurrency, and the refusal of a class without a group of its
own before anything is measured."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from socketwise.measure import calibrate, runner
from socketwise.measure.calibrate import CalibrateError, Target, choose, variants
from socketwise.measure.sweep import Profile

from .playbooks import REPO

FLEET = REPO / "inventories" / "example-fleet"


def target(node_cores: int = 14, isa: str = "avx512", rule_dtype: str = "bfloat16") -> Target:
    return Target("intel-x", "h1", ["h1"], "g", node_cores, isa, rule_dtype, Path("g.yml"), 2, "h1")


def test_each_reserve_the_node_allows_and_on_avx2_the_other_dtype_are_measured():
    assert list(variants(target(node_cores=14))) == ["baseline", "sn-k0", "sn-k1", "sn-k2"]
    # A 2-core node keeps at least one core to serve.
    assert list(variants(target(node_cores=2))) == ["baseline", "sn-k0", "sn-k1"]
    on_avx2 = variants(target(isa="avx2", rule_dtype="bfloat16"))
    assert on_avx2["sn-float32"]["vllm_service_dtype"] == "float32"
    # Every variant names each decided variable, so an earlier calibration cannot leak in.
    for found in on_avx2.values():
        assert {"plan_reserve_cores", "plan_crossover", "vllm_service_dtype"} <= set(found)
    assert on_avx2["baseline"]["vllm_service_placement"] == "vllm"


def figures(**by_layout: tuple[float, float, float]) -> dict:
    """{layout: (output tok/s, TTFT p50, TPOT p50)} at concurrencies 1 and 4 alike."""
    names = ("output_tok_s", "ttft_p50_ms", "tpot_p50_ms")
    return {
        layout: {c: dict(zip(names, values, strict=True)) for c in (1, 4)}
        for layout, values in by_layout.items()
    }


def test_the_reserve_whose_worst_figure_against_plain_vllm_is_best_wins():
    measured = figures(
        baseline=(100, 50, 10),
        **{"sn-k0": (130, 60, 8), "sn-k1": (110, 45, 9.5), "sn-k2": (105, 44, 9.8)},
    )
    # sn-k0 has the most throughput but a TTFT 20 % worse than plain vLLM's; sn-k1's
    # worst figure (1.053 on TPOT) beats sn-k2's (1.02).
    chosen = choose(target(), measured, [measured])
    assert chosen["decided"] == {"plan_reserve_cores": 1}
    assert chosen["worst_ratio"]["sn-k0"] == pytest.approx(50 / 60, abs=0.001)


# Calibration cal-tiny2 on the zen lab (docs/measurements.md), per round as (output tok/s,
# TTFT p50, TPOT p50) at concurrency 1 and 4; 0 where a step's tokens came in one chunk.
CAL_TINY2 = {
    "baseline": [((719.3, 10.0, 1.25), (1703.9, 24.29, 1.62)),
                 ((428.1, 14.82, 2.22), (1663.6, 27.56, 2.11)),
                 ((543.9, 12.17, 1.53), (1523.2, 18.83, 2.5))],
    "sn-k0": [((672.2, 171.46, 0), (1792.3, 18.46, 1.86)),
              ((812.5, 8.72, 1.14), (1595.5, 21.21, 1.73)),
              ((504.1, 12.8, 1.69), (1426.6, 23.11, 2.56))],
    "sn-k1": [((717.1, 11.24, 1.31), (1979.2, 28.01, 1.78)),
              ((601.1, 9.4, 1.6), (2057.6, 16.96, 1.78)),
              ((636.8, 13.49, 1.41), (2003.2, 26.51, 1.74))],
}  # fmt: skip


def test_each_round_is_judged_against_its_own_plain_vllm_and_one_bad_round_does_not_decide():
    names = ("output_tok_s", "ttft_p50_ms", "tpot_p50_ms")
    by_round = [
        [{"layout": layout, "concurrency": c, **dict(zip(names, values, strict=True))}
         for layout, each in CAL_TINY2.items() for c, values in zip((1, 4), each[n], strict=True)]
        for n in range(3)
    ]  # fmt: skip
    medians = {name: calibrate.medians(sum(by_round, []), name) for name in CAL_TINY2}
    rounds = [{name: calibrate.medians(rows, name) for name in CAL_TINY2} for rows in by_round]
    chosen = choose(target(node_cores=2), medians, rounds)
    # K=0's worst median is the higher (TTFT at c4, plain vLLM's fast third round against
    # K=1), and it chose K=0, which then served a third behind plain vLLM. Round by
    # round, K=1 reaches 0.95x of plain vLLM in 13 of 18 figures, K=0 in 10 of 17.
    assert chosen["worst_ratio"]["sn-k0"] > chosen["worst_ratio"]["sn-k1"]
    assert chosen["at_bar"] == {"sn-k0": round(10 / 17, 3), "sn-k1": round(13 / 18, 3)}
    assert chosen["decided"] == {"plan_reserve_cores": 1}


def test_a_latency_of_zero_tells_nothing_and_leaves_the_other_figures_to_decide():
    # The tiny model on the lab, as measured: at concurrency 1 the whole answer comes in
    # its first chunk, so TPOT p50 is 0 on every side. Counted as a ratio of 0 it made
    # every variant's worst figure 0 and the smaller K won by the tie; left out, K=1
    # wins on its worst remaining figure (output tok/s at c1, 792 against 760).
    measured = {
        "baseline": {1: {"output_tok_s": 759.6, "ttft_p50_ms": 167.3, "tpot_p50_ms": 0.0},
                     4: {"output_tok_s": 1638.5, "ttft_p50_ms": 54.52, "tpot_p50_ms": 1.24}},
        "sn-k0": {1: {"output_tok_s": 682.6, "ttft_p50_ms": 182.88, "tpot_p50_ms": 0.0},
                  4: {"output_tok_s": 2131.3, "ttft_p50_ms": 50.54, "tpot_p50_ms": 1.49}},
        "sn-k1": {1: {"output_tok_s": 792.0, "ttft_p50_ms": 156.16, "tpot_p50_ms": 0.0},
                  4: {"output_tok_s": 2356.0, "ttft_p50_ms": 47.18, "tpot_p50_ms": 1.12}},
    }  # fmt: skip
    chosen = choose(target(node_cores=2), measured, [measured])
    assert chosen["decided"] == {"plan_reserve_cores": 1}
    assert chosen["worst_ratio"]["sn-k1"] == pytest.approx(792.0 / 759.6, abs=0.001)
    assert calibrate.ratios(measured, "sn-k1")[1]["tpot_p50_ms"] is None
    # A variant that completed nothing is worse than any: its throughput ratio is 0.
    assert calibrate.ratio(0.0, 759.6, more_is_better=True) == 0.0


def medians_of(rounds: list[dict]) -> dict:
    """The medians over ROUNDS, as calibrate_class hands them to choose."""
    return {
        layout: {
            c: {m: statistics.median(r[layout][c][m] for r in rounds) for m in by_metric}
            for c, by_metric in by_load.items()
        }
        for layout, by_load in rounds[0].items()
    }


def test_a_tie_goes_to_the_better_worst_ratio_then_to_fewer_cores_kept():
    plain = (100, 50, 10)

    def rounds(k2_first: tuple[float, float, float]) -> list[dict]:
        # K=0 falls to 0.9x of plain vLLM's throughput in the first round; K=1 and K=2
        # reach 0.95x in every figure of both rounds.
        first = {"sn-k0": (90, 50, 10), "sn-k1": (104, 48, 9.6), "sn-k2": k2_first}
        second = {"sn-k0": plain, "sn-k1": plain, "sn-k2": plain}
        return [figures(baseline=plain, **first), figures(baseline=plain, **second)]

    same = rounds(k2_first=(104, 48, 9.6))
    chosen = choose(target(), medians_of(same), same)
    assert chosen["at_bar"] == {"sn-k0": round(10 / 12, 3), "sn-k1": 1.0, "sn-k2": 1.0}
    assert chosen["worst_ratio"]["sn-k1"] == chosen["worst_ratio"]["sn-k2"]
    # Equal on both counts: the core goes back to serving.
    assert chosen["decided"] == {"plan_reserve_cores": 1}
    # Equal at the bar only: K=2's better worst median ratio wins though it keeps more.
    better = rounds(k2_first=(106, 47, 9.4))
    chosen = choose(target(), medians_of(better), better)
    assert chosen["at_bar"]["sn-k1"] == chosen["at_bar"]["sn-k2"] == 1.0
    assert chosen["worst_ratio"]["sn-k2"] > chosen["worst_ratio"]["sn-k1"]
    assert chosen["decided"] == {"plan_reserve_cores": 2}


def test_the_other_dtype_wins_only_when_it_beats_the_rule_s_own_variant():
    plain = (100, 50, 10)
    # On a 14-core node the rule keeps 2 cores: float32 is compared with sn-k2.
    kit = {"sn-k0": (90, 50, 10), "sn-k1": (95, 50, 10), "sn-k2": (101, 49, 9.9)}
    better = figures(baseline=plain, **kit, **{"sn-float32": (120, 45, 8)})
    assert (
        choose(target(isa="avx2"), better, [better])["decided"]["vllm_service_dtype"] == "float32"
    )
    worse = {**better, "sn-float32": better["sn-k0"]}
    assert choose(target(isa="avx2"), worse, [worse])["decided"]["vllm_service_dtype"] == "bfloat16"


# One start each of plain vLLM and the kit's SN keeping one core on the zen lab, 4
# repetitions of each step back to back (run rep4, 2026-11-29), as (output tok/s, TTFT
# p50, TPOT p50); None where the step's tokens came in one chunk. Plain vLLM's steps
# scatter by a third, the kit's by a tenth.
REP4 = {
    "baseline": {1: [(601.3, 12.0, 1.46), (546.5, 14.98, 1.6), (804.4, 7.83, 1.17),
                     (736.2, 156.43, None)],
                 4: [(2090.3, 24.95, 1.68), (1265.9, 17.69, 1.82), (1360.4, 17.37, 1.44),
                     (1410.2, 16.44, 1.51)]},
    "sn-k1": {1: [(694.0, 11.27, 1.35), (738.7, 8.3, 1.29), (693.3, 9.19, 1.4),
                  (717.5, 8.88, 1.31)],
              4: [(2234.0, 24.8, 1.61), (2216.3, 16.16, 1.69), (2341.8, 14.9, 1.48),
                  (2132.0, 17.23, 1.66)]},
}  # fmt: skip


class RepeatingSweep:
    """What calibrate_class drives of a sweep: each step's figures from REP4 by its
    repetition (sn-k0 a tenth slower than sn-k1), no deploys."""

    def __init__(self, inventory, run_dir, profile, planned, tool, layouts, limit):
        self.profile, self.summary, self.batches, self.fresh = profile, [], [], []

    def drive_flat_out(self, layout: str) -> dict:
        return {"layout": layout, "max_request_rate": 20.0}

    def measure(self, layout: str, steps: list[dict], batch: str, fresh: bool = False) -> None:
        self.batches.append((layout, batch, [step["name"] for step in steps]))
        self.fresh.append(fresh)
        for step in steps:
            repetition = int(step["name"].rpartition("-")[2]) - 1
            tok, ttft, tpot = REP4[layout.replace("k0", "k1")][step["concurrency"]][repetition]
            slower = 0.9 if layout == "sn-k0" else 1.0
            self.summary.append(
                {"layout": layout, "concurrency": step["concurrency"], "rate": None,
                 "output_tok_s": tok * slower, "ttft_p50_ms": ttft, "tpot_p50_ms": tpot}
            )  # fmt: skip


def test_a_round_s_figure_is_the_median_of_its_repetitions(monkeypatch):
    monkeypatch.setattr(calibrate, "Sweep", RepeatingSweep)
    # A 2-core node: DP-2 does not fit beside the rule's reserve, so nothing is searched.
    two_cores = Target("zen", "lab1", ["lab1"], "lab", 2, "zen", "bf16", Path("l.yml"), 1, "lab1")
    profile = Profile(concurrencies=[1, 4], rate_fractions=[], repetitions=4)
    options = {"rounds": 1, "search_rounds": 1, "tool": "vllm"}
    measured = calibrate.calibrate_class(Path("inv"), Path("run"), two_cores, profile, options)
    steps = ["c1-1", "c4-1", "c1-2", "c4-2", "c1-3", "c4-3", "c1-4", "c4-4"]
    assert measured["experiment"].batches == [
        (name, "round-1", steps) for name in ("baseline", "sn-k0", "sn-k1")
    ]
    (against,) = measured["figures"]["per_round_ratios"]["sn-k1"]
    # Medians of the four: 705.8 against plain vLLM's 668.8 at c1 (plain's third step
    # alone, 804.4, would put the kit at 0.862), TPOT 1.33 against 1.46 (the one-chunk
    # step has none), 2225.2 against 1385.3 at c4.
    assert against["1"] == {"output_tok_s": 1.055, "ttft_p50_ms": 1.493, "tpot_p50_ms": 1.098}
    assert against["4"]["output_tok_s"] == 1.606
    assert measured["figures"]["at_bar"]["sn-k1"] == 1.0
    assert measured["decided"] == {"plan_reserve_cores": 1}


def test_every_round_starts_on_a_restarted_server(monkeypatch):
    """The first layout of a round is the one the flat-out run or the last round ended
    on: without a restart its prefix cache still holds their prompts, and on a model of a
    small vocabulary it answered a third of the next prompts' tokens from there."""
    monkeypatch.setattr(calibrate, "Sweep", RepeatingSweep)
    two_cores = Target("zen", "lab1", ["lab1"], "lab", 2, "zen", "bf16", Path("l.yml"), 1, "lab1")
    profile = Profile(concurrencies=[1, 4], rate_fractions=[], repetitions=2)
    options = {"rounds": 3, "search_rounds": 1, "tool": "vllm"}
    measured = calibrate.calibrate_class(Path("inv"), Path("run"), two_cores, profile, options)
    experiment = measured["experiment"]
    order = [(layout, batch) for layout, batch, _ in experiment.batches]
    assert order == [
        ("baseline", "round-1"), ("sn-k0", "round-1"), ("sn-k1", "round-1"),
        ("sn-k1", "round-2"), ("sn-k0", "round-2"), ("baseline", "round-2"),
        ("baseline", "round-3"), ("sn-k0", "round-3"), ("sn-k1", "round-3"),
    ]  # fmt: skip
    assert experiment.fresh == [True, False, False] * 3


class Rows:
    """What crossover_concurrency reads of a sweep: its rows and its profile."""

    def __init__(self, rows: list[dict], output_len: int):
        self.summary, self.profile = rows, Profile(output_len=output_len)


def test_the_crossover_rate_becomes_concurrency_by_little_s_law():
    rows = [
        {"layout": "sn", "rate": 1.0, "ttft_p50_ms": 100, "tpot_p50_ms": 20},
        {"layout": "sn", "rate": 4.0, "ttft_p50_ms": 300, "tpot_p50_ms": 50},
        {"layout": "dp", "rate": 2.0, "ttft_p50_ms": 1, "tpot_p50_ms": 1},
        {"layout": "sn", "rate": None, "ttft_p50_ms": 1, "tpot_p50_ms": 1},
    ]
    # Nearest SN step to 3.5 req/s is 4.0: a request takes 0.3 + 0.05 x 31 = 1.85 s.
    assert calibrate.crossover_concurrency(Rows(rows, 32), "sn", 3.5) == pytest.approx(
        6.5, abs=0.05
    )
    # Below one request in flight, the crossover is one.
    assert calibrate.crossover_concurrency(Rows(rows, 32), "sn", 0.1) == 1.0
    assert calibrate.crossover_concurrency(Rows([], 32), "sn", 3.5) is None


def inventory(tmp_path: Path, groups: dict[str, list[str]]) -> Path:
    children = {name: {"hosts": {h: {} for h in hosts}} for name, hosts in groups.items()}
    (tmp_path / "inv").mkdir()
    (tmp_path / "inv" / "hosts.yml").write_text(json.dumps({"all": {"children": children}}))
    return tmp_path / "inv"


def survey(tmp_path: Path, classes: dict[str, list[str]]) -> Path:
    """A survey's fleet-plan.json and plan.json files, as playbooks/plan.yml writes them."""
    folder = tmp_path / "survey"
    fleet = {"classes": []}
    for class_id, hosts in classes.items():
        nodes = [{"cores": 2, "memory_gb": 24}]
        fleet["classes"].append(
            {"id": class_id, "nodes": nodes, "isa": "avx2", "hosts": [{"host": h} for h in hosts]}
        )
        for host in hosts:
            (folder / host).mkdir(parents=True)
            (folder / host / "plan.json").write_text(json.dumps({"build": {"dtype": "bfloat16"}}))
    (folder / "fleet-plan.json").write_text(json.dumps(fleet))
    return folder


def test_each_class_is_measured_on_its_first_host_and_written_to_its_own_group(tmp_path):
    inv = inventory(tmp_path, {"old": ["a2", "a1"], "new": ["b1"], "socketwise_loadgen": ["l1"]})
    found = calibrate.targets(inv, survey(tmp_path, {"cls-a": ["a2", "a1"], "cls-b": ["b1"]}), None)
    assert [(t.class_id, t.host, t.group) for t in found] == [
        ("cls-a", "a1", "old"), ("cls-b", "b1", "new")
    ]  # fmt: skip
    assert found[0].vars_file == inv / "group_vars" / "old.yml"
    assert (found[0].node_cores, found[0].rule_dtype) == (2, "bfloat16")
    # Every deploy and batch reaches the host and the load generators alone; DP-2 fits the
    # 2-core node with the rule's reserve (none below 4 cores).
    assert found[0].limit == "a1,l1" and found[0].dp_cores == 2


def test_a_class_spanning_groups_is_refused_before_anything_is_measured(tmp_path):
    inv = inventory(tmp_path, {"rack1": ["a1", "b1"], "rack2": ["a2"]})
    with pytest.raises(CalibrateError, match=r"cls-a \(a1, a2\) spans groups rack1, rack2"):
        calibrate.targets(inv, survey(tmp_path, {"cls-a": ["a1", "a2"], "cls-b": ["b1"]}), None)


def test_a_group_file_that_sets_a_decided_value_itself_is_refused_before_measuring(tmp_path):
    inv = inventory(tmp_path, {"rack1": ["a1"]})
    (inv / "group_vars").mkdir()
    (inv / "group_vars" / "rack1.yml").write_text("plan_crossover: 8\n")
    with pytest.raises(CalibrateError, match=r"cls-a: .*rack1.yml: sets plan_crossover outside"):
        calibrate.targets(inv, survey(tmp_path, {"cls-a": ["a1"]}), None)


def test_limit_picks_the_classes_and_hosts_measured_from_a_survey_of_the_whole_fleet(tmp_path):
    # The real survey (playbooks/plan.yml) of the example fleet, planned from its saved
    # topologies: a class's group is checked against all its hosts, --limit only picks.
    runner.run_playbook("playbooks/plan.yml", FLEET, {}, tmp_path)
    (found,) = calibrate.targets(FLEET, tmp_path, "epyc-02")
    assert (found.host, found.group, found.hosts) == (
        "epyc-02",
        "epyc_nps4",
        ["epyc-01", "epyc-02"],
    )
    assert found.limit == "epyc-02"
    # The r730 group's file sets plan_crossover itself: the measurement is refused first.
    with pytest.raises(CalibrateError, match=r"r730.yml: sets plan_crossover outside"):
        calibrate.targets(FLEET, tmp_path, "r730")
    with pytest.raises(CalibrateError, match="--limit nosuch"):
        calibrate.targets(FLEET, tmp_path, "nosuch")


def test_a_ratio_of_exactly_the_bar_counts_at_the_bar_and_a_dtype_tie_keeps_the_rule():
    """BAR (0.95 of plain vLLM) is reached at 0.95: 95 tok/s against 100 counts. And the
    other dtype replaces the rule's only by doing better: equal figures keep the rule."""
    plain = (100, 50, 10)
    at = figures(baseline=plain, **{"sn-k1": (95, 50, 10)})
    assert calibrate.at_bar([at], "sn-k1") == 1.0
    kit = {"sn-k0": (90, 50, 10), "sn-k1": (95, 50, 10), "sn-k2": (101, 49, 9.9)}
    tie = figures(baseline=plain, **kit, **{"sn-float32": (101, 49, 9.9)})
    assert choose(target(isa="avx2"), tie, [tie])["decided"]["vllm_service_dtype"] == "bfloat16"
