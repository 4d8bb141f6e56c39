"""Writing a run directory's report (report.md, report.html, plots/), and the
`socketwise report` command."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from socketwise.measure import rundir
from socketwise.report.analysis import analyse
from socketwise.report.document import document_blocks, render_html, render_markdown
from socketwise.report.plots import plot_cluster, plots_for
from socketwise.report.points import group


def write(run_dir: str | Path) -> tuple[Path, Path]:
    """Analyse RUN_DIR and write RUN_DIR/report.md, report.html and plots/*.png."""
    run_dir = Path(run_dir)
    analysis = analyse(run_dir)
    axes_by_host = group(rundir.read_summary(run_dir))
    plots = {
        host: plots_for(run_dir, host, axes_by_host[host], decisions)
        for host, decisions in analysis["hosts"].items()
    }
    cluster_plot = plot_cluster(analysis["cluster"], run_dir) if analysis["cluster"] else None
    blocks = document_blocks(analysis, axes_by_host, plots, cluster_plot)
    markdown, page = run_dir / "report.md", run_dir / "report.html"
    markdown.write_text(render_markdown(blocks))
    page.write_text(render_html(blocks, f"socketwise report: {run_dir.name}"))
    return markdown, page


# --- CLI door -------------------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help="write report.md/report.html for a run directory; --json prints the decisions",
        description=(
            "Read RUN_DIR/summary.csv (and manifest.json, power.csv when present), decide the "
            "SN/DP crossover, each layout's saturation and the layout per load range, and "
            "write RUN_DIR/report.md and report.html with plots in RUN_DIR/plots/."
        ),
    )
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the run directory")
    parser.add_argument("--json", action="store_true", help="print the decisions as JSON")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        if args.json:
            # The decisions only: nothing is written and nothing is plotted.
            print(json.dumps(analyse(args.run_dir), indent=2))
            return 0
        markdown, page = write(args.run_dir)
    except rundir.RunDirError as exc:
        print(f"socketwise report: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(
            f"socketwise report: error: cannot write the report: {exc.filename}: {exc.strerror}; "
            "make RUN_DIR writable, or copy it somewhere that is",
            file=sys.stderr,
        )
        return 2
    print(f"wrote {markdown} and {page}")
    return 0
