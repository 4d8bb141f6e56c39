"""The comparison scripts' arithmetic (scripts/image-vs-venv, kit-vs-baseline,
dtype-compare): medians over rounds, each figure against the reference side's."""

from socketwise.lab.compare import Figures


def test_medians_over_rounds_are_compared_figure_by_figure():
    figures = Figures()
    for tok, tpot in ((100, 8.0), (120, 9.0), (110, 8.5)):
        figures.add(
            ("lab1", "sn"), {"output_tok_s": str(tok), "ttft_p50_ms": "", "tpot_p50_ms": str(tpot)}
        )
    for tok, tpot in ((100, 7.0), (90, 7.2)):
        figures.add(
            ("lab1", "plain"),
            {"output_tok_s": str(tok), "ttft_p50_ms": "20", "tpot_p50_ms": str(tpot)},
        )
    assert figures.median(("lab1", "sn"), "output_tok_s") == 110
    assert figures.median(("lab1", "sn"), "ttft_p50_ms") is None  # an empty cell: not measured
    line = figures.against(("lab1", "sn"), ("lab1", "plain"), ("sn", "plain"))
    # 110 / 95 and 8.5 / 7.1, then round by round (100/100, 120/90; the third round has
    # no plain side); TTFT left out where one side has none.
    assert line == (
        "output tok/s sn 110.0, plain 95.0: sn/plain 1.158 (rounds 1.000, 1.333); "
        "TPOT p50 sn 8.5, plain 7.1: sn/plain 1.197 (rounds 1.143, 1.250) (3 round(s))"
    )
