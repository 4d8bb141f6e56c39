"""Which benchmark run directory a host may be given (benchmark_host_dir).

A run starts by removing its directory, and its load generator's `<dir>-load/<host>`,
recursively, so the directory must be one the benchmark owns: under the kit's state
directory, written as the path it is (a `..`, `//` or trailing `/` hides where it lands),
and clear of what the kit keeps there for other purposes, such as host_tuning's record
of the host's original kernel settings, without which they cannot be put back.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

STATE_DIR = "/var/lib/socketwise"
EXAMPLE = f"{STATE_DIR}/bench"
# Names a shell and a glob take as they are, and no hidden ones (the kit's own partial
# files start with a dot).
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


def _within(path: str, parent: str) -> bool:
    return path.startswith(parent.rstrip("/") + "/")


def _clash(directory: str, kept: str) -> str | None:
    if directory == kept:
        return "is"
    if _within(kept, directory):
        return "holds"
    if _within(directory, kept):
        return "lies inside"
    return None


def host_dir_error(path: object, kept: Iterable[tuple[str, str]]) -> str | None:
    """Why `path` cannot be benchmark_host_dir, as `benchmark_host_dir=PATH: why; fix`, or
    None. `kept` holds (path, what it is) of what the kit keeps that a run must not empty."""
    head = f"benchmark_host_dir={path}:"
    fix = f"give a directory of the benchmark's own such as {EXAMPLE}"
    under = f"{head} is not a directory under {STATE_DIR}, and a run empties it; {fix}"
    if not isinstance(path, str) or not path.startswith("/"):
        return under
    # normpath leaves a leading `//` as it is (POSIX gives it a meaning of its own).
    normal = os.path.normpath(path)
    if normal != path or "//" in path:
        fix = f"write it as {normal}" if _within(normal, STATE_DIR) else fix
        return f"{head} is not a normalized path (no `.`, `..`, `//` or trailing `/`); {fix}"
    if not _within(path, STATE_DIR):
        return under
    names = path[len(STATE_DIR) + 1 :].split("/")
    odd = [name for name in names if not _NAME.fullmatch(name)]
    if odd:
        return (
            f"{head} {odd[0]!r} is not a name of letters, digits, `_`, `.` and `-` that "
            f"starts with a letter, digit or `_`; {fix}"
        )
    for directory in (path, f"{path}-load"):
        subject = "it" if directory == path else f"its load generator's {directory}"
        for kept_path, what in kept:
            relation = _clash(directory, os.path.normpath(kept_path))
            if relation:
                return (
                    f"{head} {subject} {relation} {kept_path}, {what}, and a run empties it; {fix}"
                )
    return None
