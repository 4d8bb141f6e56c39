"""The rollout's benchmark gate: what passes and what stops a new release."""

import pytest

from socketwise.serve import gate

# vLLM's serving benchmark result (bench.json), the fields the gate reads.
BENCH = {
    "completed": 16, "failed": 0, "output_throughput": 412.345, "p99_ttft_ms": 81.26,
    "mean_ttft_ms": 40.0, "duration": 2.5,
}  # fmt: skip
BEFORE = gate.figures(BENCH)


def test_figures_are_the_output_rate_and_ttft_p99_of_the_run():
    assert BEFORE == {"output_tok_s": 412.35, "ttft_p99_ms": 81.3, "completed": 16, "failed": 0}
    assert gate.figures({**BENCH, "completed": 14, "failed": 2})["failed"] == 2


def test_a_release_within_the_tolerance_passes():
    after = {**BEFORE, "output_tok_s": 412.35 * 0.86, "ttft_p99_ms": 81.3 * 1.14}
    assert gate.problems(BEFORE, after, 0.15) == []


def test_a_slower_release_is_stopped_with_both_figures_named():
    after = {**BEFORE, "output_tok_s": 300.0, "ttft_p99_ms": 120.0}
    assert gate.problems(BEFORE, after, 0.15) == [
        "output 300.0 tok/s is below 350.5 (85% of the previous release's 412.4)",
        "TTFT p99 120.0 ms is above 93.5 (115% of the previous release's 81.3)",
    ]


def test_a_faster_release_passes_whatever_the_tolerance():
    after = {**BEFORE, "output_tok_s": 900.0, "ttft_p99_ms": 10.0}
    assert gate.problems(BEFORE, after, 0.01) == []


def test_failed_requests_stop_a_release_even_when_it_is_fast():
    after = {**BEFORE, "output_tok_s": 900.0, "failed": 2}
    assert gate.problems(BEFORE, after, 0.5) == ["2 of the benchmark's requests failed"]


@pytest.mark.parametrize("tolerance", [None, "", "0.15", 0.5, 0.999])
def test_a_fraction_or_nothing_is_a_usable_tolerance(tolerance):
    assert gate.tolerance_error(tolerance) is None


@pytest.mark.parametrize("tolerance", ["1.5", 0, 1, "-0.1", "15%", "fast"])
def test_anything_else_is_refused_with_the_fix(tolerance):
    assert gate.tolerance_error(tolerance) == (
        f"rollout_gate_tolerance={tolerance!r} is not a fraction between 0 and 1; give for "
        "example 0.15 (a new release keeps at least 85 % of the output tok/s and at most "
        "115 % of the TTFT p99), or leave it empty for no benchmark"
    )


def test_a_release_exactly_at_the_tolerance_passes():
    """At least 75 % of the output and at most 125 % of the TTFT p99 pass (figures chosen
    so that the edges are exact in floating point)."""
    before = {**BEFORE, "output_tok_s": 400.0, "ttft_p99_ms": 80.0}
    after = {**before, "output_tok_s": 300.0, "ttft_p99_ms": 100.0}
    assert gate.problems(before, after, 0.25) == []


def test_a_release_just_past_the_tolerance_is_stopped():
    before = {**BEFORE, "output_tok_s": 400.0, "ttft_p99_ms": 80.0}
    slower = {**before, "output_tok_s": 299.99}
    later = {**before, "ttft_p99_ms": 100.1}
    assert [len(gate.problems(before, after, 0.25)) for after in (slower, later)] == [1, 1]


def test_a_tolerance_given_as_text_on_the_command_line_gates_as_the_number_does():
    """`-e rollout_gate_tolerance=0.15` reaches the filter as the string "0.15"."""
    after = {**BEFORE, "output_tok_s": 300.0, "ttft_p99_ms": 120.0}
    assert gate.problems(BEFORE, after, "0.15") == gate.problems(BEFORE, after, 0.15)
    assert len(gate.problems(BEFORE, after, "0.15")) == 2


def test_a_single_failed_request_stops_a_release():
    after = {**BEFORE, "failed": 1}
    assert gate.problems(BEFORE, after, 0.5) == ["1 of the benchmark's requests failed"]


def test_a_benchmark_result_without_a_failed_count_counts_none_failed():
    bench = {key: value for key, value in BENCH.items() if key != "failed"}
    assert gate.figures(bench) == BEFORE
