"""The adaptive sweep's search (run_adaptive), and the fixed grid it is measured against
(run_fixed), on layouts whose throughput is a known curve: where the search puts the
SN/DP crossover, the saturation it reads, and what each costs."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from socketwise.measure.sweep import Profile, Sweep, offered, run_adaptive, run_fixed

OUTPUT_LEN = 32


@dataclass(frozen=True)
class Curve:
    """A layout that sustains `saturation` req/s flat out (`sustained` in an open-loop
    step, when its burst of flat-out requests flatters it), each request worth
    `efficiency` x OUTPUT_LEN output tokens a second."""

    saturation: float
    efficiency: float = 1.0
    sustained: float | None = None

    def output_tok_s(self, rate: float) -> float:
        limit = self.saturation if self.sustained is None else self.sustained
        return OUTPUT_LEN * self.efficiency * min(rate, limit)


class CurveSweep(Sweep):
    """Sweep with its layouts measured from curves instead of deployed and benchmarked:
    the search reads the same bookkeeping (summary rows, flat-out rates, throughput)."""

    def __init__(self, curves: dict[str, Curve]):
        self.curves, self.profile = curves, Profile(output_len=OUTPUT_LEN)
        self.summary: list[dict] = []
        self.flat_out: dict[str, float] = {}
        self.deployed: str | None = None
        self.deploys, self.steps_run = 0, 0
        self.batches: dict[str, set[str]] = {}
        self.hosts, self.steps_planned, self.said = 1, 0, []

    def _say(self, message: str) -> None:
        self.said.append(message)

    def measure(
        self, layout: str, steps: list[dict], batch: str, fresh: bool = False
    ) -> dict[str, dict[str, dict]]:
        if fresh or self.deployed != layout:
            self.deployed, self.deploys = layout, self.deploys + 1
        self.steps_run += len(steps)
        self.batches.setdefault(layout, set()).add(batch)
        curve, found = self.curves[layout], {}
        for step in steps:
            if step["name"] == "max":
                self.flat_out[layout] = curve.saturation
                found["max"] = {"request_throughput": curve.saturation}
                continue
            rate = step.get("rate")
            tok = curve.output_tok_s(rate if rate is not None else step["concurrency"])
            self.summary.append({"layout": layout, "rate": rate, "output_tok_s": tok})
            found[step["name"]] = {"output_throughput": tok}
        return {"host": found}


def crossover(sn: Curve, dp: Curve) -> float:
    """The lowest rate at which DP is ahead of SN by the search's 3 %, for these curves
    (SN saturating first, DP ahead only once SN has saturated)."""
    return 1.03 * OUTPUT_LEN * sn.efficiency * sn.saturation / (OUTPUT_LEN * dp.efficiency)


# SN saturates at 10 req/s; DP-2 runs each request 10 % slower but saturates at 16 req/s,
# so it overtakes SN (by more than 3 %) at 10.3 / 0.9 = 11.44 req/s.
SN, DP = Curve(saturation=10.0), Curve(saturation=16.0, efficiency=0.9)


def grid_steps(layouts: int) -> tuple[int, float]:
    """The fixed grid's cost for as many layouts (a calibration, then every step of the
    default profile on each) and its spacing of rates at SN's flat-out rate."""
    profile = Profile()
    fractions = sorted(profile.rate_fractions)
    spacing = min(b - a for a, b in zip(fractions, fractions[1:], strict=False))
    return 1 + len(profile.steps(1.0)) * layouts, spacing * SN.saturation


def test_the_crossover_is_found_within_one_grid_step_in_fewer_steps_than_the_grid():
    experiment = CurveSweep({"sn": SN, "dp": DP})
    search = run_adaptive(experiment, ["sn", "dp"], rounds=3)
    assert search["saturation_rate"] == {"sn": 10.0, "dp": 16.0}
    low, high = search["crossover_between"]
    grid_cost, grid_step = grid_steps(2)
    assert low <= crossover(SN, DP) <= high and high - low <= grid_step, search
    # SN saturates below every midpoint, so each round measures both layouts: two
    # bracket steps and three midpoints on each, against the grid's 15.
    assert experiment.steps_run == 2 * (2 + 3) < grid_cost
    assert [r["measured"] for r in search["rounds"]] == [["sn", "dp"], ["dp", "sn"], ["sn", "dp"]]
    # Each round starts on the layout deployed: one redeploy a round.
    assert experiment.deploys == 2 + 3
    # Each round halves the bracket it was given, keeping the side the crossover is on.
    for made, following in zip(search["rounds"], search["rounds"][1:], strict=False):
        assert following["high"] - following["low"] == pytest.approx(
            (made["high"] - made["low"]) / 2, abs=0.01
        )
        assert made["second_ahead"] == (made["rate"] > crossover(SN, DP))


def test_the_search_starts_between_half_of_sns_flat_out_rate_and_the_highest_one():
    search = run_adaptive(CurveSweep({"sn": SN, "dp": DP}), ["sn", "dp"], rounds=1)
    (first,) = search["rounds"]
    assert (first["low"], first["high"], first["rate"]) == (5.0, 16.0, 10.5)
    # DP-2 is behind at 10.5 req/s: the crossover is above it.
    assert not first["second_ahead"] and search["crossover_between"] == [10.5, 16.0]


@pytest.mark.parametrize(
    ("dp", "end"),
    [
        # Never ahead by 3 % (2 % more per request and no more flat out): the bracket closes
        # on its top, the highest flat-out rate.
        (Curve(saturation=10.0, efficiency=1.02), 1),
        # Ahead everywhere: SN's flat-out burst flatters it, it sustains 4 req/s only.
        (Curve(saturation=16.0), 0),
    ],
)
def test_a_layout_never_or_always_ahead_drives_the_bracket_to_its_end(dp, end):
    sn = SN if end else Curve(saturation=10.0, sustained=4.0)
    search = run_adaptive(CurveSweep({"sn": sn, "dp": dp}), ["sn", "dp"], rounds=4)
    start = [SN.saturation / 2, max(SN.saturation, dp.saturation)]
    assert search["crossover_between"][end] == start[end]
    assert {r["second_ahead"] for r in search["rounds"]} == {end == 0}


def test_where_sn_delivers_what_is_offered_dp_is_not_measured_and_not_redeployed():
    # DP-2 saturates later (11 req/s) but runs each request 5 % slower: it overtakes SN at
    # 1.03 x 10 / 0.95 = 10.84 req/s. The midpoints 8 and 9.5 req/s are below SN's
    # saturation: SN delivers them, and DP, which cannot deliver more than the arrivals,
    # cannot be 3 % ahead there.
    dp = Curve(saturation=11.0, efficiency=0.95)
    experiment = CurveSweep({"sn": SN, "dp": dp})
    search = run_adaptive(experiment, ["sn", "dp"], rounds=4)
    # At 10.25 req/s SN delivers 10, 97.6 % of what was offered: still not measured.
    assert [(r["rate"], r["measured"]) for r in search["rounds"]] == [
        (8.0, ["sn"]), (9.5, ["sn"]), (10.25, ["sn"]), (10.62, ["sn", "dp"]),
    ]  # fmt: skip
    assert [r["rate"] for r in experiment.summary if r["layout"] == "dp"] == [None, 10.62]
    low, high = search["crossover_between"]
    assert (low, high) == (10.62, 11.0) and low <= crossover(SN, dp) <= high
    # DP bracketed first, SN last, then DP once more: three deploys where alternating the
    # layouts every round took five.
    assert experiment.deploys == 3
    assert experiment.steps_planned == -3
    assert experiment.said[0] == (
        "dp: 1 step(s) not needed: sn delivered 100.0% of the most any layout can at 8 "
        "req/s, so dp cannot lead it by 3 %"
    )


def test_a_round_that_starts_on_dp_measures_both_and_drops_nothing():
    # DP is ahead at 10.5 req/s, where SN has saturated; the next round, at 7.75, starts
    # on DP, deployed, and SN delivers it: both were measured, no step is dropped.
    experiment = CurveSweep({"sn": SN, "dp": Curve(saturation=16.0)})
    search = run_adaptive(experiment, ["sn", "dp"], rounds=2)
    assert [(r["rate"], r["measured"]) for r in search["rounds"]] == [
        (10.5, ["sn", "dp"]), (7.75, ["dp", "sn"]),
    ]  # fmt: skip
    assert (experiment.said, experiment.steps_planned) == ([], 0)


@pytest.mark.parametrize(("sustained", "measured"), [(10.3, ["sn"]), (10.28, ["sn", "dp"])])
def test_dp_is_measured_unless_sn_delivered_within_3_percent_of_the_most_it_could(
    sustained, measured
):
    experiment = CurveSweep({"sn": Curve(saturation=10.0, sustained=sustained), "dp": DP})
    experiment.profile = Profile(output_len=OUTPUT_LEN, step_seconds=10)
    search = run_adaptive(experiment, ["sn", "dp"], rounds=1)
    # The midpoint of 5 and 16 req/s: 105 requests, the last sent at least 104 / 10.5 s
    # after the first, so no layout delivers more than 10.6 req/s; 10.29 is 3 % short.
    (made,) = search["rounds"]
    assert made["rate"] == 10.5
    assert offered(experiment.profile.rate_step(10.5)) == pytest.approx(
        105 * OUTPUT_LEN / (104 / 10.5)
    )
    assert made["measured"] == measured


def test_plain_vllm_is_bracketed_but_not_bisected():
    experiment = CurveSweep({"baseline": Curve(saturation=8.0), "sn": SN, "dp": DP})
    search = run_adaptive(experiment, ["baseline", "sn", "dp"], rounds=2)
    assert experiment.batches == {
        "baseline": {"bracket"},
        "sn": {"bracket", "round-1", "round-2"},
        "dp": {"bracket", "round-1", "round-2"},
    }
    assert search["saturation_rate"]["baseline"] == 8.0
    # Baseline's lower flat-out rate does not move the search: it starts at SN's half.
    assert search["rounds"][0]["low"] == 5.0


def test_the_grid_measures_every_layout_at_fractions_of_the_first_layout_s_flat_out_rate():
    experiment = CurveSweep({"baseline": SN, "sn": DP})
    experiment.profile = Profile(concurrencies=[1], rate_fractions=[0.5, 1.5])
    run_fixed(experiment, ["baseline", "sn"])
    # Only the first layout is driven flat out, once; its 10 req/s places every rate step.
    assert experiment.flat_out == {"baseline": 10.0}
    assert experiment.batches == {"baseline": {"calibration", "sweep"}, "sn": {"sweep"}}
    for layout in ("baseline", "sn"):
        mine = [r["rate"] for r in experiment.summary if r["layout"] == layout]
        assert mine == [None, 5.0, 15.0]
