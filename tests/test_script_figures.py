"""The figures the comparison scripts print, from a run directory made by hand
(tests/fixtures/kit-run, whose README gives the medians): scripts/kit-vs-baseline's
ratios to plain vLLM and scripts/roofline's share of the memory-bandwidth limit, each
read from sweeps already made (`--from`), as a user runs them; the search
scripts/rollout-timing --find-rate makes over load rates; and that every mutation of
scripts/mutate-templates still applies."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUN = REPO / "tests" / "fixtures" / "kit-run"


def script(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / name), *args],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_kit_vs_baseline_prints_each_layouts_medians_against_plain_vllms():
    done = script("kit-vs-baseline", "--from", str(RUN))
    assert done.returncode == 0, done.stderr
    # Closed-loop rows only (the 2 req/s rows are left out). The run directory is one
    # round, its figure the median of its three repetitions: 11 / 9, 160 / 200 and
    # 100 / 125 at concurrency 1; 40 / 32, 300 / 410 and 120 / 155 at 4; TP's one step
    # against plain vLLM's median, 15 / 9.
    assert done.stdout.splitlines() == [
        "box concurrency 1: output tok/s sn 11.0, plain 9.0: sn/plain 1.222 (rounds 1.222); "
        "TTFT p50 sn 160.0, plain 200.0: sn/plain 0.800 (rounds 0.800); "
        "TPOT p50 sn 100.0, plain 125.0: sn/plain 0.800 (rounds 0.800) (1 round(s))",
        "box concurrency 4: output tok/s sn 40.0, plain 32.0: sn/plain 1.250 (rounds 1.250); "
        "TTFT p50 sn 300.0, plain 410.0: sn/plain 0.732 (rounds 0.732); "
        "TPOT p50 sn 120.0, plain 155.0: sn/plain 0.774 (rounds 0.774) (1 round(s))",
        "box concurrency 1: output tok/s tp 15.0, plain 9.0: tp/plain 1.667 (rounds 1.667); "
        "TTFT p50 tp 100.0, plain 200.0: tp/plain 0.500 (rounds 0.500); "
        "TPOT p50 tp 50.0, plain 125.0: tp/plain 0.400 (rounds 0.400) (1 round(s))",
    ]


def test_kit_vs_baseline_counts_each_run_directory_as_a_round():
    done = script("kit-vs-baseline", "--from", str(RUN), "--from", str(RUN))
    assert done.returncode == 0, done.stderr
    # The same figures twice over: the same medians, two rounds.
    assert done.stdout.splitlines()[0].endswith("sn/plain 0.800 (rounds 0.800, 0.800) (2 round(s))")


def test_roofline_prints_decode_against_the_bandwidth_of_the_nodes_each_layout_reads():
    done = script("roofline", "--from", str(RUN))
    assert done.returncode == 0, done.stderr
    # Decode 1000 / TPOT p50 at concurrency 1; limit = GB/s of the nodes read / 1 GB.
    assert sorted(done.stdout.splitlines()) == sorted(
        [
            "box: 1.00 GB of weights; measured node 0 20.0 GB/s, node 1 25.0 GB/s",
            # No plan: one node at the slowest bandwidth, 20 GB/s; 8 of 20 tok/s.
            "box baseline: decode 8.00 tok/s (1000 / TPOT p50), "
            "limit 20.00 tok/s (nodes ?, 20.0 GB/s): 40.0% of the roofline",
            # SN reads node 1 only: 10 of 25 tok/s.
            "box sn: decode 10.00 tok/s (1000 / TPOT p50), "
            "limit 25.00 tok/s (nodes 1, 25.0 GB/s): 40.0% of the roofline",
            # TP-2 reads both nodes, 20 + 25 GB/s: 20 of 45 tok/s.
            "box tp: decode 20.00 tok/s (1000 / TPOT p50), "
            "limit 45.00 tok/s (nodes 0,1, 45.0 GB/s): 44.4% of the roofline",
        ]
    )


def test_the_scripts_want_hosts_to_sweep_or_sweeps_made_not_both():
    for name in ("kit-vs-baseline", "roofline"):
        for args in ((), ("-i", "inventories/lab", "--from", str(RUN))):
            done = script(name, *args)
            assert done.returncode == 2 and "give -i INVENTORY" in done.stderr, (name, args)


def test_plain_vllm_against_itself_is_swept_not_read_from_sweeps_made():
    # A sweep made holds the kit's layout where the second plain vLLM would be.
    done = script("kit-vs-baseline", "--plain-twice", "--from", str(RUN))
    assert done.returncode == 2
    assert "--plain-twice sweeps plain vLLM twice: not with --from" in done.stderr


def test_the_rollout_rate_search_halves_towards_the_highest_rate_that_passes():
    path = str(REPO / "scripts" / "rollout-timing")
    loader = importlib.machinery.SourceFileLoader("rollout_timing", path)
    timing = importlib.util.module_from_spec(
        importlib.util.spec_from_loader("rollout_timing", loader)
    )
    loader.exec_module(timing)
    tried = []

    def trial(rate: float) -> bool:  # a fleet whose rollouts keep up to 6 req/s of its 16
        tried.append(rate)
        return rate <= 6

    assert timing.bisect_rate(16, 4, trial) == (6.0, 7.0)
    assert tried == [8.0, 4.0, 6.0, 7.0]
    # Nothing passes: the lowest rate tried, and none that passed.
    assert timing.bisect_rate(16, 3, lambda rate: False) == (0.0, 2.0)


def test_every_template_mutation_still_finds_its_text_once():
    # A template edit that moves a mutation's text would leave that mutation unapplied
    # in the next by-hand run (docs/development/testing.md): --check names it now.
    done = script("mutate-templates", "--check")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    assert "each text found exactly once in its template" in done.stdout
