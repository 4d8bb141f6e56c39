"""`socketwise report` on the field notes' R730 sweep and on synthetic run directories:
the decisions a user acts on (crossover, saturation, recommended layout), and a report
that really renders in a browser."""

from __future__ import annotations

import base64
import io
import json
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from socketwise.measure import rundir
from socketwise.report import analysis, render
from socketwise.report.points import Point
from socketwise.report.recommendation import against_baseline

FIXTURE = Path(__file__).parent / "fixtures" / "r730-sweep"
RATES = (1, 2, 4, 6, 8)
# Field notes, section 1: output tok/s by request rate.
SN_BY_RATE = (3.90, 6.23, 7.07, 5.80, 4.95)
DP_BY_RATE = (3.90, 7.25, 6.42, 8.87, 8.33)


@pytest.fixture
def r730(tmp_path: Path) -> Path:
    """A copy of the R730 fixture run directory (reports are written into it)."""
    run = tmp_path / "r730"
    shutil.copytree(FIXTURE, run)
    return run


def step(
    layout: str,
    tok: float,
    rate: float | None = None,
    concurrency: float | None = None,
    host: str = "box",
    ttft: float = 300.0,
    failed: int = 0,
    completed: int = 50,
) -> dict:
    return {
        "host": host,
        "layout": layout,
        "rate": rate,
        "concurrency": concurrency,
        "output_tok_s": tok,
        "ttft_p50_ms": ttft,
        "ttft_p99_ms": ttft * 2,
        "itl_p50_ms": 250,
        "itl_p99_ms": 300,
        "completed": completed,
        "failed": failed,
    }


def sweep(run: Path, curves: dict[str, list[float]], rates=RATES, **extra) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    rows = [
        step(layout, tok, rate=r, **extra)
        for layout, toks in curves.items()
        for r, tok in zip(rates, toks, strict=True)
    ]
    rundir.write_csv(run / rundir.SUMMARY, rundir.SUMMARY_COLUMNS, rows)
    return run


# --- the R730 of the field notes ------------------------------------------------------


def test_r730_crossover_lies_between_4_and_6_req_s(r730):
    decisions = analysis.analyse(r730)
    assert decisions["host"] == "r730"
    assert decisions["crossover_between"] == [4, 6]
    assert 4 < decisions["crossover_rate"] < 6
    assert decisions["crossover_layouts"] == ["sn", "dp"]
    assert decisions["crossover_status"] == "found"


def test_r730_recommends_sn_below_the_crossover_dp_above_and_never_tp(r730):
    decisions = analysis.analyse(r730)
    rec = decisions["recommendation"]
    assert [r["layout"] for r in rec] == ["sn", "dp"]
    assert rec[0]["max_rate"] == decisions["crossover_rate"]
    assert rec[1]["max_rate"] is None
    # DP's lead at 2 req/s (7.25 vs 6.23) is the noise the notes have: it does not count.
    assert "lead at 2 is not sustained" in rec[0]["rule"]
    by_concurrency = decisions["by_concurrency"]["recommendation"]
    assert all(r["layout"] != "tp" for r in rec + by_concurrency)
    assert "tp" in decisions["not_recommended"]
    assert "not measured by rate" in decisions["not_recommended"]["tp"]
    assert "ahead of sn at no measured concurrency" in decisions["not_recommended"]["tp"]


def test_r730_saturation_of_sn_at_4_req_s_and_dp_not_confirmed(r730):
    saturation = analysis.analyse(r730)["saturation"]
    assert saturation["sn"]["axis"] == "rate"
    assert saturation["sn"]["rate"] == 4
    assert saturation["sn"]["status"] == "confirmed"
    assert saturation["sn"]["between"] == [4, 6]
    # DP dips at 4, recovers at 6 and is flat at 8, the highest point: not confirmed.
    assert saturation["dp"]["rate"] == 6
    assert saturation["dp"]["status"] == "unconfirmed"
    # TP was measured by concurrency only: its throughput falls from 1 to 4.
    assert saturation["tp"]["axis"] == "concurrency"
    assert saturation["tp"]["concurrency"] == 1


def test_r730_reaches_89_percent_of_the_bandwidth_limit_at_concurrency_1(r730):
    bandwidth = analysis.analyse(r730)["bandwidth"]
    assert bandwidth["limit_tok_s"] == pytest.approx(34e9 / 7.7e9, rel=1e-3)
    sn = bandwidth["layouts"]["sn"]
    assert (sn["basis"], sn["decode_basis"], sn["nodes"]) == (
        "concurrency 1", "1000 / ITL p50", ["0"]
    )  # fmt: skip
    assert sn["decode_tok_s"] == pytest.approx(1000 / 255, rel=1e-3)
    assert sn["fraction"] == pytest.approx(0.89, abs=0.01)


def test_r730_roofline_of_tp_counts_both_sockets_and_dp_one(r730):
    """TP-2 reads its weights from both sockets at once, so its roof is twice SN's: the
    field notes' TP-2 decode (ITL 403 ms) reaches only 28 % of it."""
    layouts = analysis.analyse(r730)["bandwidth"]["layouts"]
    assert (layouts["tp"]["nodes"], layouts["tp"]["bandwidth_gbps"]) == (["0", "1"], 68.0)
    assert layouts["tp"]["limit_tok_s"] == pytest.approx(2 * 34e9 / 7.7e9, rel=1e-3)
    assert layouts["tp"]["fraction"] == pytest.approx(0.28, abs=0.01)
    assert (layouts["dp"]["nodes"], layouts["dp"]["bandwidth_gbps"]) == (["0"], 34.0)


def test_vllm_s_own_data_parallel_streams_read_one_rank_s_node(r730):
    """dp-vllm is one instance over both sockets, but each request runs on one rank."""
    manifest = json.loads((r730 / rundir.MANIFEST).read_text())
    ranks = [{"node": 0, "cpus": [0]}, {"node": 1, "cpus": [14]}]
    one = {"name": "dp", "tp": 1, "data_parallel": 2, "ranks": ranks, "membind": [0, 1]}
    manifest["hosts"]["r730"]["layouts"]["dp"] = {"layout": "dp", "instances": [one]}
    (r730 / rundir.MANIFEST).write_text(json.dumps(manifest))
    dp = analysis.analyse(r730)["bandwidth"]["layouts"]["dp"]
    assert (dp["nodes"], dp["bandwidth_gbps"]) == (["0"], 34.0)


def test_an_adaptive_search_bracket_is_named_even_where_the_steps_show_no_crossover(r730):
    manifest = json.loads((r730 / rundir.MANIFEST).read_text())
    manifest["adaptive"] = {"crossover_between": [19.66, 23.04], "rounds": []}
    (r730 / rundir.MANIFEST).write_text(json.dumps(manifest))
    decisions = analysis.analyse(r730)
    assert decisions["adaptive_search"] == [19.66, 23.04]
    assert any("between 19.66 and 23.04 req/s" in note for note in decisions["notes"])
    markdown, _ = render.write(r730)
    assert "the adaptive search kept the SN/DP crossover between 19.66" in markdown.read_text()
    manifest.pop("adaptive")
    (r730 / rundir.MANIFEST).write_text(json.dumps(manifest))
    assert analysis.analyse(r730)["adaptive_search"] is None


def test_without_plans_the_roofline_is_one_node_at_the_slowest_bandwidth(r730):
    manifest = json.loads((r730 / rundir.MANIFEST).read_text())
    del manifest["hosts"]["r730"]["layouts"]
    (r730 / rundir.MANIFEST).write_text(json.dumps(manifest))
    layouts = analysis.analyse(r730)["bandwidth"]["layouts"]
    assert {e["nodes"] for e in layouts.values()} == {None}
    assert {e["bandwidth_gbps"] for e in layouts.values()} == {34.0}


def test_r730_tokens_per_watt_above_idle_match_the_field_notes(r730):
    energy = analysis.analyse(r730)["energy"]
    assert energy["source"] == "ipmi"
    assert energy["idle_watts"] == 147
    medium = {s["layout"]: s for s in energy["steps"] if s.get("concurrency") == 4}
    assert medium["sn"]["tok_per_w_above_idle"] == pytest.approx(0.105, abs=0.001)
    assert medium["tp"]["tok_per_w_above_idle"] == pytest.approx(0.022, abs=0.001)
    assert medium["dp"]["tok_per_w_above_idle"] == pytest.approx(0.046, abs=0.001)
    assert medium["sn"]["tok_per_w"] == pytest.approx(8.11 / 224, abs=1e-4)


def test_r730_report_names_every_decision(r730):
    markdown, page = render.write(r730)
    text = markdown.read_text()
    assert "| up to 4.47 req/s | sn |" in text
    assert "| above 4.47 req/s | dp |" in text
    assert "SN/DP crossover by rate: 4.47 req/s, between the measured 4 and 6 req/s" in text
    assert "| sn | rate | 4 req/s | confirmed |" in text
    # the notes' "~89 %"
    assert "| sn | concurrency 1 | 3.92 (1000 / ITL p50) | 0 | 34 | 4.42 | 88.8% |" in text
    assert "| tp | concurrency 1 | 2.48 (1000 / ITL p50) | 0,1 | 68 | 8.83 | 28.1% |" in text
    assert "No failed requests" in text
    for image in ("throughput", "ttft", "itl", "energy"):
        assert (r730 / "plots" / f"r730-rate-{image}.png").is_file()
    assert '<img src="plots/r730-rate-throughput.png"' in page.read_text()


# --- noise and repetitions --------------------------------------------------------------


def test_one_outlier_below_the_crossover_does_not_move_it(tmp_path):
    # DP really wins from 6 on; at 2 one noisy point puts it far ahead.
    run = sweep(
        tmp_path / "run",
        {
            "sn": [3.9, 6.2, 7.1, 5.8, 5.0],
            "dp": [3.9, 9.5, 6.4, 8.9, 8.3],
        },
    )
    decisions = analysis.analyse(run)
    assert decisions["crossover_between"] == [4, 6]
    assert [r["layout"] for r in decisions["recommendation"]] == ["sn", "dp"]


def test_a_lead_only_at_the_highest_rate_is_not_a_crossover(tmp_path):
    run = sweep(
        tmp_path / "run",
        {
            "sn": [3.9, 6.2, 7.1, 7.3, 7.2],
            "dp": [3.9, 6.0, 6.9, 7.0, 8.5],
        },
    )
    decisions = analysis.analyse(run)
    assert decisions["crossover_rate"] is None
    assert decisions["crossover_between"] is None
    assert decisions["crossover_status"] == "unconfirmed"
    assert [r["layout"] for r in decisions["recommendation"]] == ["sn"]
    assert "only at the highest measured rate 8" in decisions["not_recommended"]["dp"]


def test_a_dip_within_the_tolerance_is_a_tie(tmp_path):
    # At 6 DP is 1 % above SN: level within the 3 % tolerance, so DP wins from 8 only,
    # and the crossover needs two points: unconfirmed.
    run = sweep(tmp_path / "run", {"sn": [4, 6, 7, 7, 7], "dp": [4, 6, 7, 7.07, 9]})
    assert analysis.analyse(run)["crossover_status"] == "unconfirmed"


def test_dp_ahead_everywhere_is_recommended_everywhere(tmp_path):
    run = sweep(tmp_path / "run", {"sn": [3, 5, 6, 6, 6], "dp": [4, 7, 10, 12, 13]})
    decisions = analysis.analyse(run)
    assert decisions["crossover_rate"] is None
    assert decisions["crossover_status"] == "ahead-everywhere"
    assert decisions["recommendation"] == [
        {"max_rate": None, "layout": "dp", "rule": decisions["recommendation"][0]["rule"]}
    ]
    assert "sn" in decisions["not_recommended"]


def test_a_third_layout_that_overtakes_later_gets_its_own_range(tmp_path):
    rates = (1, 2, 4, 6, 8, 10, 12)
    run = sweep(
        tmp_path / "run",
        {
            "sn": [4, 6, 7, 6, 5, 5, 5],
            "dp": [4, 6, 9, 11, 12, 12, 12],
            "dp-vllm": [4, 5, 8, 10, 13, 15, 16],
        },
        rates=rates,
    )
    rec = analysis.analyse(run)["recommendation"]
    assert [(r["layout"], r["max_rate"] is None) for r in rec] == [
        ("sn", False),
        ("dp", False),
        ("dp-vllm", True),
    ]
    assert 2 < rec[0]["max_rate"] < 4
    assert 6 < rec[1]["max_rate"] < 8


def test_a_later_layout_ahead_everywhere_it_competes_takes_that_range(tmp_path):
    # SN -> DP between 2 and 3; dp-vllm is 14-40 % ahead of DP at every rate from 3 up.
    rates = (1, 2, 3, 4, 6)
    run = sweep(
        tmp_path / "run",
        {"sn": [4, 6, 6, 6, 6], "dp": [4, 5.5, 8, 9, 10], "dp-vllm": [4, 5, 9.2, 11, 14]},
        rates=rates,
    )
    decisions = analysis.analyse(run)
    rec = decisions["recommendation"]
    assert [(r["layout"], r["max_rate"] is None) for r in rec] == [("sn", False), ("dp-vllm", True)]
    assert 2 < rec[0]["max_rate"] < 3
    assert rec[1]["rule"].startswith(f"dp-vllm above {rec[0]['max_rate']:g} req/s")
    assert decisions["not_recommended"]["dp"].startswith("dp-vllm is ahead of it wherever")


def test_one_tied_point_between_leads_does_not_void_the_crossover(tmp_path):
    # DP 1.3-2.4x SN at 4, 6 and 10, level at 8.
    rates = (1, 2, 4, 6, 8, 10)
    run = sweep(
        tmp_path / "run",
        {"sn": [4, 6, 6, 5, 5, 5], "dp": [4, 6, 7.8, 12, 5.05, 12]},
        rates=rates,
    )
    decisions = analysis.analyse(run)
    assert decisions["crossover_status"] == "found"
    assert decisions["crossover_between"] == [2, 4]
    assert [r["layout"] for r in decisions["recommendation"]] == ["sn", "dp"]
    assert "level at 8 req/s between leads" in decisions["crossovers"]["dp"]["evidence"]
    # Two ties in a row, or SN ahead at a point, still end the lead.
    run = sweep(
        tmp_path / "two",
        {"sn": [4, 6, 6, 5, 5, 5], "dp": [4, 6, 7.8, 5.05, 5.05, 12]},
        rates=rates,
    )
    assert analysis.analyse(run)["crossover_status"] == "unconfirmed"
    run = sweep(
        tmp_path / "behind",
        {"sn": [4, 6, 6, 5, 5, 5], "dp": [4, 6, 7.8, 12, 4, 12]},
        rates=rates,
    )
    assert analysis.analyse(run)["crossover_status"] == "unconfirmed"


def test_closely_spaced_points_on_a_rising_line_are_not_saturation(tmp_path):
    # Adaptive points: 1, 2, 3, then every 0.1 up to 6, throughput linear in the rate.
    rates = [1.0, 2.0] + [round(3 + i / 10, 1) for i in range(31)]
    run = sweep(tmp_path / "run", {"sn": [2 * r for r in rates]}, rates=rates)
    saturation = analysis.analyse(run)["saturation"]["sn"]
    assert saturation["status"] == "not-reached", saturation["evidence"]
    # A real plateau at the same spacing is still found, within the 10 % margin of its knee.
    flat = [2 * min(r, 4.0) for r in rates]
    run = sweep(tmp_path / "flat", {"sn": flat}, rates=rates)
    saturation = analysis.analyse(run)["saturation"]["sn"]
    assert saturation["status"] == "confirmed"
    assert 4.0 <= saturation["rate"] <= 4.4


def test_rising_ttft_marks_saturation_by_rate_but_not_by_concurrency(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    # (load, output tok/s, TTFT p50 ms). By rate (open loop) throughput still rises, but
    # TTFT passes 3x its first value at 6 req/s: requests queue, so sn saturates at 4.
    open_loop = ((1, 4, 300), (2, 8, 320), (4, 16, 400), (6, 24, 1200), (8, 32, 3000))
    # By concurrency (closed loop) TTFT doubles with concurrency, as Little's law says it
    # must, while throughput keeps rising: no saturation.
    closed_loop = ((1, 100, 50), (2, 190, 100), (4, 360, 200), (8, 650, 400), (16, 1100, 800))
    rows = [step("sn", tok, rate=r, ttft=ttft) for r, tok, ttft in open_loop]
    rows += [step("sn", tok, concurrency=c, ttft=ttft) for c, tok, ttft in closed_loop]
    rundir.write_csv(run / rundir.SUMMARY, rundir.SUMMARY_COLUMNS, rows)
    decisions = analysis.analyse(run)

    by_rate = decisions["saturation"]["sn"]
    assert (by_rate["axis"], by_rate["rate"], by_rate["status"]) == ("rate", 4, "confirmed")
    assert by_rate["between"] == [4, 6]
    assert "TTFT p50 1200 ms at 6 is over 3x the 300 ms at 1" in by_rate["evidence"]
    by_concurrency = decisions["by_concurrency"]["saturation"]["sn"]
    assert by_concurrency["status"] == "not-reached", by_concurrency["evidence"]
    assert by_concurrency["concurrency"] is None
    # The capacity read off the closed loop is its highest point, not 2 concurrent.
    assert by_concurrency["peak_output_tok_s"] == 1100
    assert by_concurrency["peak_at_concurrency"] == 16
    markdown = render.write(run)[0].read_text()
    assert "| sn | rate | 4 req/s | confirmed |" in markdown
    assert "| sn | concurrency | - | not-reached |" in markdown


def test_repetitions_report_median_and_spread(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = []
    for layout, toks in (("sn", SN_BY_RATE), ("dp", DP_BY_RATE)):
        for rate, tok in zip(RATES, toks, strict=True):
            for factor in (0.98, 1.0, 1.02):
                rows.append(step(layout, round(tok * factor, 3), rate=rate))
    # One wild repetition does not move the median.
    rows.append(step("dp", 30.0, rate=2))
    rundir.write_csv(run / rundir.SUMMARY, rundir.SUMMARY_COLUMNS, rows)
    decisions = analysis.analyse(run)
    sn_at_4 = next(p for p in decisions["series"]["rate"]["sn"] if p["rate"] == 4)
    assert sn_at_4["repetitions"] == 3
    assert sn_at_4["output_tok_s"] == {
        "median": 7.07,
        "min": round(7.07 * 0.98, 3),
        "max": round(7.07 * 1.02, 3),
    }
    dp_at_2 = next(p for p in decisions["series"]["rate"]["dp"] if p["rate"] == 2)
    assert dp_at_2["repetitions"] == 4 and dp_at_2["output_tok_s"]["max"] == 30.0
    assert decisions["crossover_between"] == [4, 6]
    assert decisions["saturation"]["sn"]["rate"] == 4
    markdown, _ = render.write(run)
    assert f"| sn | 4 | 7.07 ({round(7.07 * 0.98, 3):.2f}-{round(7.07 * 1.02, 3):.2f}, n=3) |" in (
        markdown.read_text()
    )


def test_overlapping_repetitions_do_not_count_as_a_lead(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = []
    for rate in (1, 2, 4):
        rows += [step("sn", tok, rate=rate) for tok in (5.0, 6.0, 7.5)]
        rows += [step("dp", tok, rate=rate) for tok in (5.5, 6.3, 7.0)]
    rundir.write_csv(run / rundir.SUMMARY, rundir.SUMMARY_COLUMNS, rows)
    # DP's median is 5 % above SN's, but below SN's best repetition at every rate.
    assert analysis.analyse(run)["crossover_status"] == "never"


# --- errors, hosts, inputs --------------------------------------------------------------


def test_failed_requests_are_reported_and_mark_saturation(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [
        step("sn", tok, rate=r, failed=f, completed=100 - f)
        for r, tok, f in zip(RATES, (4, 7, 10, 13, 16), (0, 0, 0, 9, 30), strict=True)
    ]
    rundir.write_csv(run / rundir.SUMMARY, rundir.SUMMARY_COLUMNS, rows)
    decisions = analysis.analyse(run)
    assert decisions["errors"]["failed"] == 39
    assert [s["rate"] for s in decisions["errors"]["steps_with_failures"]] == [6, 8]
    assert decisions["saturation"]["sn"]["rate"] == 4
    assert "9% of requests failed at 6" in decisions["saturation"]["sn"]["evidence"]
    markdown, _ = render.write(run)
    assert "| sn | 6 req/s | 9 | 91 |" in markdown.read_text()


def test_a_directory_with_only_summary_csv_is_enough(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(FIXTURE / rundir.SUMMARY, run / rundir.SUMMARY)
    decisions = analysis.analyse(run)
    assert decisions["crossover_between"] == [4, 6]
    assert decisions["energy"] == {"status": "not measured: no power.csv"}
    assert decisions["bandwidth"]["status"].startswith("not measured")
    assert "no power.csv: energy not measured" in decisions["notes"]
    markdown, page = render.write(run)
    assert "Energy: not measured: no power.csv." in markdown.read_text()
    assert page.is_file()
    assert not list((run / "plots").glob("*energy*"))


def test_several_hosts_get_decisions_each(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [
        step(layout, tok, rate=r, host=host)
        for host in ("a", "b")
        for layout, toks in (("sn", SN_BY_RATE), ("dp", DP_BY_RATE))
        for r, tok in zip(RATES, toks, strict=True)
    ]
    # On host b DP pulls ahead from 4 on.
    rows = [
        dict(r, output_tok_s=r["output_tok_s"] + 2)
        if (r["host"], r["layout"], r["rate"]) == ("b", "dp", 4)
        else r
        for r in rows
    ]
    rundir.write_csv(run / rundir.SUMMARY, rundir.SUMMARY_COLUMNS, rows)
    decisions = analysis.analyse(run)
    assert decisions["host"] is None
    assert decisions["crossover_rate"] is None and decisions["recommendation"] == []
    assert decisions["hosts"]["a"]["crossover_between"] == [4, 6]
    assert decisions["hosts"]["b"]["crossover_between"] == [1, 2]
    markdown, _ = render.write(run)
    assert "## Host a" in markdown.read_text() and "## Host b" in markdown.read_text()
    assert (run / "plots" / "b-rate-throughput.png").is_file()


def test_every_layout_is_read_against_plain_vllm_which_is_never_recommended(tmp_path):
    # The lab's hand measurement: SN matches plain vLLM at concurrency 1 (with a longer
    # TPOT) and is 1.17x at 4; DP leads SN from concurrency 4.
    run = tmp_path / "run"
    run.mkdir()
    rows = [
        dict(step(layout, tok, concurrency=c, ttft=ttft), tpot_p50_ms=tpot)
        for layout, c, tok, ttft, tpot in (
            ("baseline", 1, 100.0, 20.0, 7.1),
            ("baseline", 4, 300.0, 40.0, 12.0),
            ("baseline", 8, 400.0, 80.0, 18.0),
            ("sn", 1, 101.0, 19.0, 8.4),
            ("sn", 4, 351.0, 36.0, 11.0),
            ("sn", 8, 380.0, 90.0, 20.0),
            ("dp", 1, 90.0, 25.0, 9.0),
            ("dp", 4, 372.0, 35.0, 10.0),
            ("dp", 8, 480.0, 60.0, 15.0),
        )
    ]
    rundir.write_csv(run / rundir.SUMMARY, rundir.SUMMARY_COLUMNS, rows)
    decisions = analysis.analyse(run)["by_concurrency"]
    ranges = decisions["recommendation"]
    assert [r["layout"] for r in ranges] == ["sn", "dp"]
    assert "baseline" not in decisions["crossovers"]
    assert "baseline" not in decisions["not_recommended"]
    # At concurrency 1 SN (recommended there) is within 3 % of plain vLLM: as good.
    assert ranges[0]["baseline_as_good_at"] == [1] and ranges[1]["baseline_as_good_at"] == []
    baseline = analysis.analyse(run)["baseline"]
    assert baseline["as_good_at"] == {"concurrency": [1]}
    sn = {r["concurrency"]: r for r in baseline["ratios"]["concurrency"]["sn"]}
    assert sn[1]["output_tok_s"] == 1.01 and sn[4]["output_tok_s"] == 1.17
    assert sn[1]["tpot_p50_ms"] == round(8.4 / 7.1, 3) and sn[4]["ttft_p50_ms"] == 0.9
    assert [r["layout"] for r in baseline["recommended"]["concurrency"]] == ["sn", "dp", "dp"]
    assert "as good at 1 concurrent only" in baseline["summary"]
    assert "TPOT p50 1.183x at 1 concurrent (sn)" in baseline["summary"]
    markdown = render.write(run)[0].read_text()
    assert "## Against plain vLLM" in markdown and "| sn | 4 concurrent | 1.17x |" in markdown
    assert "plain vLLM as good at" in markdown


def test_a_run_without_the_baseline_says_so(r730):
    baseline = analysis.analyse(r730)["baseline"]
    assert baseline == {"status": "not measured: no baseline layout in this run"}
    assert all("baseline_as_good_at" not in r for r in analysis.analyse(r730)["recommendation"])
    assert "Against plain vLLM: not measured" in render.write(r730)[0].read_text()


def test_a_bad_summary_row_is_named_by_line_and_column(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / rundir.SUMMARY).write_text(
        ",".join(rundir.SUMMARY_COLUMNS) + "\n"
        "box,sn,1,,3.9,1,2,3,4,5,0,7\n"
        "box,sn,2,,fast,1,2,3,4,5,0,7\n"
    )
    with pytest.raises(rundir.RunDirError, match=r"line 3: output_tok_s 'fast' is not a number"):
        analysis.analyse(run)
    (run / rundir.SUMMARY).write_text("host,layout,rate\nbox,sn,1\n")
    with pytest.raises(rundir.RunDirError, match="missing column"):
        analysis.analyse(run)


def socketwise(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "socketwise.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_cli_prints_the_decisions_as_json_and_writes_both_files_without_it(r730):
    before = sorted(p.name for p in r730.rglob("*"))
    # --json analyses only: no plotting import, no file written.
    done = subprocess.run(
        [sys.executable, "-c",
         "import sys; from socketwise.cli import main; code = main(sys.argv[1:]); "
         "assert 'matplotlib' not in sys.modules, 'plotting imported'; sys.exit(code)",
         "report", str(r730), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    decisions = json.loads(done.stdout)
    for key in ("crossover_rate", "crossover_between", "saturation", "recommendation"):
        assert key in decisions
    assert decisions["crossover_between"] == [4, 6]
    assert {"max_rate", "layout", "rule"} <= set(decisions["recommendation"][0])
    assert sorted(p.name for p in r730.rglob("*")) == before
    done = socketwise("report", str(r730))
    assert done.returncode == 0 and "report.html" in done.stdout
    assert (r730 / "report.md").is_file() and (r730 / "report.html").is_file()


def test_cli_says_what_is_missing(tmp_path):
    done = socketwise("report", str(tmp_path))
    assert done.returncode == 2
    assert "summary.csv: not found" in done.stderr
    assert "Traceback" not in done.stderr


# --- the HTML in a real browser ---------------------------------------------------------


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    pytest.fail(
        "headless Chromium is needed to check that report.html renders: install Debian's "
        "`chromium` package (apt-get install -y chromium; scripts/setup does)"
    )


def browse(page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=5000",
        *args,
        page.resolve().as_uri(),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


class Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.sources: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.sources.append(dict(attrs).get("src", ""))


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_bytes(page: Path, src: str) -> bytes:
    if src.startswith("data:"):
        header, _, payload = src.partition(",")
        assert header == "data:image/png;base64", header
        return base64.b64decode(payload)
    assert "://" not in src, f"{src} is not a relative path"
    path = page.parent / src
    assert path.is_file(), f"broken image: {src} does not exist next to {page.name}"
    return path.read_bytes()


def test_report_html_renders_its_plots_in_headless_chromium(r730, tmp_path):
    _, page = render.write(r730)
    assert_renders(page, tmp_path, min_images=8)


SN_BLUE, DP_GREEN = (0x1F, 0x77, 0xB4), (0x2C, 0xA0, 0x2C)


def assert_renders(
    page: Path, tmp_path: Path, min_images: int, colours: tuple = (SN_BLUE, DP_GREEN)
) -> None:
    """Headless Chromium loads every plot of `page` as a real PNG, and the screenshot
    shows the curves of `colours` (the SN and DP curves unless told)."""
    import matplotlib.image
    import numpy

    dom = browse(page, tmp_path / "profile-dom", "--dump-dom").stdout
    images = Images()
    images.feed(dom)
    assert len(images.sources) >= min_images, images.sources
    for src in images.sources:
        data = png_bytes(page, src)
        assert data.startswith(PNG_MAGIC), f"{src} is not a PNG"
        pixels = matplotlib.image.imread(io.BytesIO(data), format="png")
        assert pixels.shape[0] > 200 and pixels.shape[1] > 400, src

    shot = tmp_path / "report.png"
    browse(page, tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1200,3000")
    assert shot.is_file() and shot.stat().st_size > 10_000
    pixels = matplotlib.image.imread(shot)[..., :3]
    assert pixels.std() > 0.05, "the screenshot is blank"
    # The plots draw SN in #1f77b4 and DP in #2ca02c; nothing else on the page has these
    # colours, so finding them proves that images rendered, not just text and alt text.
    for colour in colours:
        close = numpy.abs(pixels * 255 - numpy.array(colour)).max(axis=-1) < 12
        assert close.sum() > 500, f"no plot pixels of colour {colour} in the screenshot"


def _point(load: float, tok: float, ttft: float) -> Point:
    one = {"output_tok_s": tok, "ttft_p50_ms": ttft, "ttft_p99_ms": ttft * 2, "tpot_p50_ms": 10.0}
    stats = {m: {"median": v, "min": v, "max": v} for m, v in one.items()}
    return Point(load, 1, stats, 10, 0)


def test_latency_within_the_tolerance_of_plain_vllm_is_not_named_as_slower():
    """The summary names a recommended layout's latency above plain vLLM's only past
    LATENCY_TOLERANCE (10 %): 5 % slower to the first token is not named, 20 % is."""
    base = [_point(1.0, 100, 100), _point(2.0, 150, 100)]
    sn = [_point(1.0, 130, 105), _point(2.0, 190, 120)]
    ranges = {"rate": {"recommendation": [{"layout": "sn", "min_rate": 1.0, "max_rate": None}]}}
    summary = against_baseline({"rate": {"baseline": base, "sn": sn}}, ranges)["summary"]
    assert "TTFT p50 1.2x at 2 req/s (sn)" in summary
    assert "1.05x" not in summary


def test_a_third_layout_behind_where_the_second_took_over_gets_its_range_from_its_crossover(
    tmp_path,
):
    """The third layout is judged against the second from the load where the second took
    over, that load included: DP takes over from SN between 2 and 3 req/s, dp-vllm is
    behind DP at 3 and ahead from 4, so DP holds 3 req/s and dp-vllm takes over after it."""
    run = sweep(
        tmp_path / "run",
        {"sn": [4, 6, 6, 6, 6], "dp": [4, 5.5, 8, 9, 10], "dp-vllm": [4, 5, 7, 11, 14]},
        rates=(1, 2, 3, 4, 6),
    )
    rec = analysis.analyse(run)["recommendation"]
    assert [r["layout"] for r in rec] == ["sn", "dp", "dp-vllm"]
    assert 2 < rec[0]["max_rate"] < 3 < rec[1]["max_rate"] < 4
