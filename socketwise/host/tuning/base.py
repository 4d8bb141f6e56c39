"""What every knob family shares: the spec and report types, the statuses, the errors, the
host's files and commands (`Host`), and the `Kind` interface each family implements.

Runs on targets (and on the controller in tests): standard library only.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

SCHEMA_VERSION = 1
GIB_KB = 1024 * 1024

# Statuses in the report.
SET = "set"  # the knob has the desired value (read back)
SHORT = "short"  # hugepages: the kernel found fewer free pages than asked for
PARTIAL = "partial"  # written, but the kernel kept part of it (IRQs with managed affinity)
REBOOT_REQUIRED = "reboot-required"  # 1 GB pages: on the kernel command line, not yet booted
UNAVAILABLE = "unavailable"  # the host lacks the knob or cannot change it; `reason` says why
UNMANAGED = "unmanaged"  # its variable is null: read, reported, left alone
RESTORED = "restored"  # state absent: back at the recorded original
NOT_RESTORED = "not-restored"  # state absent: the original could not be written back


# Errors that mean "this host does not let us change that": a read-only /proc/sys or
# /sys (containers), no privilege.
_NOT_ALLOWED = (errno.EROFS, errno.EACCES, errno.EPERM)


class TuningError(ValueError):
    """A request this host cannot hold; `variable` names the host_tuning_* variable at fault
    (without the prefix) and the message says what to change."""

    def __init__(self, variable: str, message: str):
        self.variable = variable
        super().__init__(message)


class KnobError(RuntimeError):
    """Writing a knob failed for a reason other than the host not having it."""

    def __init__(self, message: str, code: int | None = None):
        self.errno = code
        super().__init__(message)


class Unavailable(Exception):
    """The host does not have this knob, or does not let it be changed; str() says why."""


class Knob(TypedDict, total=False):
    name: str  # unique per host, e.g. "hugepages.node0.2048kB"
    kind: str  # numa_balancing, hugepages, thp, irq_affinity, irqbalance, cpu_governor, cpuidle
    desired: Any  # None: not managed (reported, left alone)
    unavailable: str | None  # decided on the controller: why the host cannot have it
    # Where the knob lives, by kind:
    node: int  # hugepages, cpu_governor, cpuidle
    size_kb: int  # hugepages
    file: str  # thp: "enabled" or "defrag"
    nic: str  # irq_affinity
    pci: str | None  # irq_affinity
    cpus: list[int]  # cpu_governor, cpuidle


class Spec(TypedDict):
    schema: int
    knobs: list[Knob]


class Entry(TypedDict):
    name: str
    desired: Any
    before: Any
    after: Any
    status: str
    reason: str | None


class Persist(TypedDict):
    sysctl: dict[str, int]  # sysctl key -> value, for /etc/sysctl.d
    boot: list[Knob]  # knobs the boot-time unit re-applies
    kernel_args: str | None  # for 1 GB pages


class Outcome(TypedDict):
    changed: bool
    report: dict[str, Any]
    persist: Persist
    reboot_required: bool
    diff: dict[str, str]


# --- the host -----------------------------------------------------------------------------


def _run_command(argv: list[str]) -> tuple[int, str, str]:
    env = dict(os.environ, LC_ALL="C")
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    return done.returncode, done.stdout, done.stderr


def _os_writable(path: Path) -> bool:
    # access() answers EROFS for a read-only mount without writing anything.
    return os.access(path, os.W_OK)


class Host:
    """The files and commands of one host, below `root` (a fixture tree in tests)."""

    def __init__(
        self,
        root: str | Path = "/",
        run: Callable[[list[str]], tuple[int, str, str]] = _run_command,
        writable: Callable[[Path], bool] = _os_writable,
    ):
        self.root = Path(root)
        self.run = run
        self._writable = writable

    def path(self, relative: str) -> Path:
        return self.root / relative.lstrip("/")

    def exists(self, relative: str) -> bool:
        return self.path(relative).exists()

    def read(self, relative: str, missing: str) -> str:
        """The file's text; Unavailable(`missing`) when the host does not have it."""
        try:
            return self.path(relative).read_text()
        except FileNotFoundError:
            raise Unavailable(missing) from None
        except OSError as exc:
            raise Unavailable(f"cannot read /{relative.lstrip('/')}: {exc.strerror}") from None

    def require_writable(self, relative: str) -> None:
        path = self.path(relative)
        if not self._writable(path):
            raise Unavailable(_read_only_reason(relative))

    def write(self, relative: str, text: str) -> None:
        path = self.path(relative)
        try:
            with open(path, "w") as handle:
                handle.write(text)
        except OSError as exc:
            raise _write_failure(relative, exc, f"writing {text.strip()!r} to") from None

    def replace(self, relative: str, text: str | None) -> bool:
        """Make the file hold exactly `text` (None: no file), written atomically with the
        mode it had (else 0644). Whether it changed."""
        path = self.path(relative)
        try:
            old = path.read_text() if path.is_file() else None
            if old == text:
                return False
            if text is None:
                path.unlink()
                return True
            mode = path.stat().st_mode & 0o7777 if old is not None else 0o644
            partial = path.with_name(f".{path.name}.socketwise-partial")
            partial.write_text(text)
            partial.chmod(mode)
            partial.replace(path)
        except OSError as exc:
            raise _write_failure(relative, exc, "replacing") from None
        return True

    def systemctl(self, *args: str) -> str:
        rc, out, err = self.run(["systemctl", *args])
        # is-active/is-enabled answer with their exit code; their stdout is the answer.
        if rc != 0 and args[0] not in ("is-active", "is-enabled"):
            raise KnobError(f"systemctl {' '.join(args)} failed: {(err or out).strip()}")
        return out.strip()


def _write_failure(relative: str, exc: OSError, doing: str) -> Exception:
    """A failed write as the knobs report it: the host does not let us (Unavailable), or
    an error naming what was being done to which file."""
    if exc.errno in _NOT_ALLOWED:
        return Unavailable(_read_only_reason(relative))
    return KnobError(f"{doing} /{relative.lstrip('/')}: {exc.strerror}", exc.errno)


def _read_only_reason(relative: str) -> str:
    return f"/{relative.lstrip('/')} is read-only here (mounted read-only, as in a container)"


# Each kind reads, checks, compares, writes and restores its knob. `value` is what the
# report shows: an int, a mode string, or a small dict keyed by IRQ, governor or C-state.


class Kind:
    def read(self, host: Host, knob: Knob) -> Any:
        raise NotImplementedError

    def writable(self, host: Host, knob: Knob, current: Any) -> None:
        """Raise Unavailable if this host does not let the knob be written."""

    def check(self, host: Host, knob: Knob, current: Any) -> None:
        """Raise Unavailable if the knob cannot be set to its desired value here."""
        self.writable(host, knob, current)

    def matches(self, knob: Knob, current: Any, desired: Any) -> bool:
        return current == desired

    def apply(self, host: Host, knob: Knob, current: Any, desired: Any) -> None:
        raise NotImplementedError

    def predict(self, knob: Knob, current: Any, desired: Any) -> Any:
        return desired

    def restore(self, host: Host, knob: Knob, current: Any, original: Any) -> None:
        self.apply(host, knob, current, original)

    def restored(self, current: Any, original: Any) -> bool:
        return current == original

    def snapshot(self, host: Host, knob: Knob) -> Any:
        """What the host has beyond the knob's value that restoring must put back exactly
        (recorded with the original before the first change); None: the value is enough."""
        return None

    def put_back(self, host: Host, knob: Knob, current: Any, original: Any, snapshot: Any) -> None:
        """Restore the original, from the snapshot where one was recorded."""
        self.restore(host, knob, current, original)

    def boot_only(self, knob: Knob) -> bool:
        """Whether the knob takes effect only at the next boot (never written at run time)."""
        return False

    def shortfall(self, host: Host, knob: Knob, after: Any) -> tuple[str, str]:
        """(status, reason) for a knob that does not read back as desired."""
        return PARTIAL, f"read back {json.dumps(after)} after writing it"


class FileKind(Kind):
    """One file holding one value."""

    def path(self, host: Host, knob: Knob) -> str:
        raise NotImplementedError

    def missing(self, knob: Knob) -> str:
        raise NotImplementedError

    def parse(self, text: str) -> Any:
        return int(text)

    def read(self, host: Host, knob: Knob) -> Any:
        return self.parse(host.read(self.path(host, knob), self.missing(knob)))

    def writable(self, host: Host, knob: Knob, current: Any) -> None:
        host.require_writable(self.path(host, knob))

    def apply(self, host: Host, knob: Knob, current: Any, desired: Any) -> None:
        host.write(self.path(host, knob), f"{desired}\n")
