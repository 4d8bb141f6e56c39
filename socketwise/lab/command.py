"""`socketwise lab up|down|status`: the lab's machines (`machines`) from the command line,
a LabError as one line for the user, not a traceback."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from .common import LabError
from .machines import INVENTORY_FILE, down, status, up


def _cmd_up(args: argparse.Namespace) -> int:
    up(
        args.machines,
        args.readonly_proc,
        args.inventory,
        args.loadgen,
        args.frontdoor,
        args.net_admin,
    )
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    down(args.purge)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    print(json.dumps([machine.to_json() for machine in status()], indent=2))
    return 0


def _handle_errors(
    command: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    """A LabError is a message for the user, not a traceback."""

    def guarded(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except LabError as error:
            print(f"socketwise lab: {error}", file=sys.stderr)
            return 1

    return guarded


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "lab",
        help="boot local systemd-nspawn machines to deploy to",
        description="Real systemd hosts on this machine: systemd-nspawn machines on "
        "127.0.0.11, 127.0.0.12, ... with an Ansible inventory for them.",
    )
    actions = parser.add_subparsers(dest="lab_command", required=True, metavar="ACTION")

    up_parser = actions.add_parser("up", help="boot lab1..labN and write the inventory")
    up_parser.add_argument("--machines", type=int, default=1, metavar="N", help="default: 1")
    up_parser.add_argument(
        "--loadgen",
        type=int,
        default=0,
        metavar="N",
        help="put the last N machines in the group socketwise_loadgen (load generators)",
    )
    up_parser.add_argument(
        "--frontdoor",
        type=int,
        default=0,
        metavar="N",
        help="put the N machines before the load generators in the group socketwise_frontdoor "
        "(the fleet front door)",
    )
    up_parser.add_argument(
        "--readonly-proc",
        action="store_true",
        help="boot with /proc/sys read-only, like a container target",
    )
    up_parser.add_argument(
        "--net-admin",
        action="store_true",
        help="boot with CAP_NET_ADMIN, so a cluster deploy can load its nftables table "
        "(into the controller's network namespace, which the machines share)",
    )
    up_parser.add_argument(
        "--inventory",
        type=Path,
        metavar="DIR",
        help=f"where to write {INVENTORY_FILE} (default: inventories/lab in the checkout)",
    )
    up_parser.set_defaults(func=_handle_errors(_cmd_up))

    down_parser = actions.add_parser("down", help="stop every lab machine")
    down_parser.add_argument(
        "--purge", action="store_true", help="also delete the machine copies (not the rootfs)"
    )
    down_parser.set_defaults(func=_handle_errors(_cmd_down))

    status_parser = actions.add_parser("status", help="print the machines as JSON")
    status_parser.set_defaults(func=_handle_errors(_cmd_status))
