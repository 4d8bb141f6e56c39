"""The lab's shared pieces: its name, where its files live, and small helpers."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path

from socketwise.common import paths

# Several labs can run side by side (say, one per test suite): SOCKETWISE_LAB names
# the lab, its machines (NAME1, NAME2, ...), their directory, cgroup and inventory.
DEFAULT_LAB = "lab"


class LabError(RuntimeError):
    """A lab operation failed; the message names the machine and what to look at."""


# --- where things live -------------------------------------------------------------------


def lab_dir() -> Path:
    return paths.cache_dir().absolute() / "lab"


def lab_name() -> str:
    name = os.environ.get("SOCKETWISE_LAB", DEFAULT_LAB)
    if not re.fullmatch(r"[a-z][a-z-]{0,15}", name):
        raise LabError(f"SOCKETWISE_LAB={name!r}: use 1-16 lower-case letters or dashes")
    return name


def own_dir() -> Path:
    """This lab's machines, state and consoles; the rootfs and SSH key are shared."""
    name = lab_name()
    return lab_dir() if name == DEFAULT_LAB else lab_dir() / "labs" / name


def machines_dir() -> Path:
    return own_dir() / "machines"


def key_path() -> Path:
    return lab_dir() / "id_ed25519"


def api_key_path() -> Path:
    """The lab's front-door API key, shared by every lab (group_vars/lab.yml reads it)."""
    return lab_dir() / "api-key"


def scrape_token_path() -> Path:
    """The lab's scrape token, the metrics doors' credential (group_vars/lab.yml reads it)."""
    return lab_dir() / "scrape-token"


def state_path() -> Path:
    return own_dir() / "state.json"


def default_inventory_dir() -> Path:
    name = lab_name()
    return paths.repo_root() / "inventories" / ("lab" if name == DEFAULT_LAB else f"lab-{name}")


def machine_name(index: int) -> str:
    return f"{lab_name()}{index}"


def machine_index(name: str) -> int:
    match = re.fullmatch(rf"{lab_name()}([1-9][0-9]*)", name)
    if match is None:
        raise LabError(f"{name!r} is not a machine of lab {lab_name()!r} ({machine_name(1)}, ...)")
    return int(match.group(1))


def machine_address(name: str) -> str:
    # The default lab uses 127.0.0.x; another lab gets its own 127.0.N.x, N from its name.
    lab = lab_name()
    subnet = 0 if lab == DEFAULT_LAB else 1 + zlib.crc32(lab.encode()) % 254
    return f"127.0.{subnet}.{10 + machine_index(name)}"


def lab_cgroup() -> str:
    """The cgroup, below the caller's, that holds one cgroup per machine."""
    return f"socketwise-{lab_name()}"


# --- small helpers -----------------------------------------------------------------------


def say(message: str) -> None:
    print(f"lab: {message}", flush=True)


def run(
    argv: list[str], *, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, env=env)
    if check and result.returncode != 0:
        output = (result.stdout + result.stderr).strip()
        raise LabError(f"`{' '.join(argv)}` failed with exit code {result.returncode}:\n{output}")
    return result


def write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    partial = path.with_name(f".{path.name}.partial")
    # Private while it is written: the text may be a key.
    partial.unlink(missing_ok=True)
    partial.touch(mode=0o600)
    partial.write_text(text)
    partial.chmod(mode)
    partial.replace(path)


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """Serialise up/down: two of them racing would boot one machine twice."""
    lab_dir().mkdir(parents=True, exist_ok=True)
    with open(lab_dir() / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (systemd-nspawn, debootstrap, mounts): run it as root")
