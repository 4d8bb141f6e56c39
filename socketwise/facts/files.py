"""Reading a host's sysfs and procfs files for its topology: one error naming the file
when a file every Linux host has is missing or malformed, None where an optional one is
absent; the kernel's CPU lists; the node a device hangs off.

Shipped to hosts with the topology (`ansible.module_utils.socketwise`): the standard
library only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

_CPULIST_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


class TopologyError(ValueError):
    """A file that detection needs is missing or cannot be parsed; the message names it."""


T = TypeVar("T")


def parse_cpulist(text: str) -> list[int]:
    """Parse the kernel's cpulist format: "0-3,8,10-11" -> [0, 1, 2, 3, 8, 10, 11].

    An empty list (as in a memory-only node's cpulist) is an empty string.
    Raises TopologyError (a ValueError) on anything else.
    """
    cpus: set[int] = set()
    stripped = text.strip()
    for part in stripped.split(",") if stripped else ():
        match = _CPULIST_RANGE.fullmatch(part.strip())
        if match is None or (match[2] is not None and int(match[2]) < int(match[1])):
            raise TopologyError(f"bad cpulist {stripped!r}: cannot read {part!r}")
        first = int(match[1])
        cpus.update(range(first, int(match[2] or first) + 1))
    return sorted(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """Format CPUs the way the kernel does: [0, 1, 2, 5] -> "0-2,5"."""
    runs: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in runs)


def read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as err:
        raise TopologyError(f"cannot read {path}: {err.strerror or err}") from err


def parse(path: Path, parse: Callable[[str], T]) -> T:
    text = read(path)
    try:
        return parse(text)
    except ValueError as err:
        raise TopologyError(f"cannot parse {path}: {err}") from err


def parse_optional(path: Path, parse: Callable[[str], T]) -> T | None:
    # Knobs come and go with kernel config and container sandboxes; absent or
    # unreadable means "this host does not have it", which the document reports as null.
    try:
        text = path.read_text()
    except OSError:
        return None
    try:
        return parse(text)
    except ValueError as err:
        raise TopologyError(f"cannot parse {path}: {err}") from err


def numa_node(device_dir: Path) -> int | None:
    # -1 means the firmware did not say which node the device hangs off.
    node = parse_optional(device_dir / "numa_node", int)
    return None if node is None or node < 0 else node
