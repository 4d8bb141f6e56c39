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


def test_a_round_s_repetitions_count_once_as_their_median():
    figures = Figures()
    # Plain vLLM's four steps of one start (run rep4, 2026-11-29): its third was fast.
    plain = [(601.3, "1.46"), (546.5, "1.6"), (804.4, "1.17"), (736.2, "")]
    kit = [(694.0, "1.35"), (738.7, "1.29"), (693.3, "1.4"), (717.5, "1.31")]
    rows = [
        {"host": "lab1", "layout": layout, "output_tok_s": str(tok), "ttft_p50_ms": "",
         "tpot_p50_ms": tpot}
        for layout, steps in (("sn", kit), ("baseline", plain)) for tok, tpot in steps
    ]  # fmt: skip
    figures.add_round(rows, lambda row: (row["host"], row["layout"]))
    assert figures.median(("lab1", "baseline"), "output_tok_s") == 668.75
    # The step whose tokens came in one chunk has no TPOT: the median of the other three.
    assert figures.median(("lab1", "baseline"), "tpot_p50_ms") == 1.46
    line = figures.against(("lab1", "sn"), ("lab1", "baseline"), ("sn", "plain"))
    assert line.endswith("(1 round(s))") and "sn/plain 1.055 (rounds 1.055)" in line
