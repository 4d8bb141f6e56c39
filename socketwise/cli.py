"""The `socketwise` command: a thin door into the stages.

Each subcommand lives in the module that does its work, which exposes `register(subparsers)`;
that function adds the subparser and sets `func(args) -> int` as its default. This door is
the one place that may wire stages together: `sweep` (measure) gets the report writer
(report) handed in, so no stage imports one downstream of it.
"""

import argparse
import sys

from socketwise.facts import topology
from socketwise.lab import command as lab_command
from socketwise.measure import calibrate, status, sweepcli
from socketwise.plan import command as plan_command
from socketwise.report import render


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="socketwise",
        description="Place vLLM on CPU servers by their NUMA topology, deploy it, measure it.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    topology.register(subparsers)
    plan_command.register(subparsers)
    lab_command.register(subparsers)
    sweepcli.register(subparsers, write_report=render.write)
    calibrate.register(subparsers, write_report=render.write)
    render.register(subparsers)
    status.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
