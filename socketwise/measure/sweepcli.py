"""`socketwise sweep`'s command line, and what the measuring commands (`sweep`,
`calibrate`) share there: lists of numbers and numbers above 0 checked per flag, the
report written at the end."""

from __future__ import annotations

import argparse
import functools
import math
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from socketwise.measure import hostcount
from socketwise.measure.rundir import RunDirError
from socketwise.measure.runner import SweepError
from socketwise.measure.sweep import DATASETS, LAYOUTS, TOOLS, Profile, sweep


def positive(flag: str, value: float) -> None:
    """Refuse a flag's number that is not finite and above 0, naming the flag."""
    if not (math.isfinite(value) and value > 0):
        raise SweepError(f"{flag} {value!r}: give a number above 0")


def register(
    subparsers: argparse._SubParsersAction, write_report: Callable[[Path], Iterable[Path]]
) -> None:
    """Add `sweep`; `write_report(run_dir)` (the report stage, handed in by the CLI so that
    measuring never imports what is downstream of it) writes the report at the end."""
    parser = subparsers.add_parser(
        "sweep",
        help="deploy and benchmark each layout, write a run directory and its report",
        description="Deploy each layout on every host of the inventory, benchmark it, "
        "collect everything into a run directory, restore the configured layout, report.",
    )
    parser.add_argument("-i", "--inventory", type=Path, default=Path("inventories/lab"))
    parser.add_argument("--layouts", default="sn,dp", help=f"comma list of {', '.join(LAYOUTS)}")
    parser.add_argument("--run-dir", type=Path, help="default runs/<time>")
    parser.add_argument("--concurrencies", default="1,4", help="closed-loop points")
    parser.add_argument("--rate-fractions", default="0.25,0.5,0.75,1.0,1.5")
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument(
        "--dataset",
        default="random",
        help="the prompts: random, or prefix (a few shared beginnings, each prompt one of "
        "them and its own end; the vllm load generator only)",
    )
    parser.add_argument("--step-seconds", type=float, default=300.0)
    parser.add_argument("--repetitions", type=int, default=1)
    parser.add_argument("--no-restore", action="store_true", help="leave the last layout")
    parser.add_argument(
        "--mode", default="fixed", help="fixed (calibrated grid) or adaptive (bracket+bisect)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="bisection rounds (adaptive)")
    parser.add_argument(
        "--tool", default="vllm", help=f"load generator: {' or '.join(TOOLS)} (default vllm)"
    )
    parser.add_argument(
        "--hosts",
        help="measure the inventory's one cluster at each of these numbers of hosts "
        "(e.g. 1,2,3: the head and the first workers) instead of layouts",
    )
    parser.add_argument(
        "--api-key-file",
        type=Path,
        help="with --hosts: a file with the front door's key (default: the head's "
        "credentials_api_key_file; none: no key)",
    )
    parser.set_defaults(func=functools.partial(_run, write_report=write_report))


def numbers(flag: str, text: str, kind: type) -> list:
    """A comma list of numbers above 0, or a SweepError naming the flag."""
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        kind_name = "whole numbers" if kind is int else "numbers"
        raise SweepError(f"{flag} {text!r}: give a comma list of {kind_name} above 0")
    return values


def _profile(args: argparse.Namespace) -> Profile:
    for flag, value in (
        ("--input-len", args.input_len),
        ("--output-len", args.output_len),
        ("--step-seconds", args.step_seconds),
        ("--repetitions", args.repetitions),
        ("--rounds", args.rounds),
    ):
        positive(flag, value)
    if args.dataset not in DATASETS:
        raise SweepError(f"--dataset {args.dataset!r}: choose {' or '.join(DATASETS)}")
    if args.dataset != "random" and args.tool != "vllm":
        raise SweepError(f"--dataset {args.dataset} needs --tool vllm (prefix_repetition)")
    return Profile(
        dataset=args.dataset,
        concurrencies=numbers("--concurrencies", args.concurrencies, int),
        rate_fractions=numbers("--rate-fractions", args.rate_fractions, float),
        input_len=args.input_len,
        output_len=args.output_len,
        step_seconds=args.step_seconds,
        repetitions=args.repetitions,
    )


def _run(args: argparse.Namespace, write_report: Callable[[Path], Iterable[Path]]) -> int:
    run_dir = args.run_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    try:
        profile = _profile(args)
        if args.hosts:
            hostcount.sweep_hosts(
                args.inventory, numbers("--hosts", args.hosts, int), run_dir, profile,
                args.api_key_file, not args.no_restore,
            )  # fmt: skip
        else:
            sweep(
                args.inventory, args.layouts.split(","), run_dir, profile,
                not args.no_restore, args.mode, args.rounds, args.tool,
            )  # fmt: skip
    except (SweepError, hostcount.HostCountError) as exc:
        print(f"socketwise sweep: error: {exc}", file=sys.stderr)
        return 2
    return report_at_end("sweep", run_dir, write_report)


def report_at_end(
    command: str, run_dir: Path, write_report: Callable[[Path], Iterable[Path]]
) -> int:
    """Name the run directory and what the report stage wrote of it: COMMAND's exit code."""
    print(f"[{command}] run directory {run_dir}", flush=True)
    try:
        for written in write_report(run_dir):
            print(f"[{command}] wrote {written}", flush=True)
    except (RunDirError, OSError) as exc:
        print(f"socketwise {command}: error: the report of {run_dir}: {exc}", file=sys.stderr)
        return 2
    return 0
