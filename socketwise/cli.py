"""The `socketwise` command: a thin door into the package's modules.

Each subcommand lives in its own module, which exposes `register(subparsers)`;
that function adds the subparser and sets `func(args) -> int` as its default.
"""

import argparse
import importlib
import sys

SUBCOMMAND_MODULES = ("topology", "planner", "lab", "sweep", "report")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="socketwise",
        description="Place vLLM on CPU servers by their NUMA topology, deploy it, measure it.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(f"socketwise.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
