"""Small file helpers shared by the builders of cached artefacts (stdlib only)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def building(dest: Path) -> Iterator[None]:
    """Hold DEST's build lock (a file beside it) for the block: two runs on one controller
    that build the same cached artefact at once (two deploys, two test workers) build it
    once; the second waits, then finds it complete."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def publish(staging: Path, dest: Path, marker_name: str, marker: dict) -> Path:
    """Write the marker that says `staging` is complete, then put it in place of `dest`.

    The marker is written last and atomically, so a directory that has one is whole.
    """
    tmp = staging / (marker_name + ".tmp")
    tmp.write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, staging / marker_name)
    return replace_dir(staging, dest)


def replace_dir(staging: Path, dest: Path) -> Path:
    """Put the complete `staging` directory in place of `dest`, never leaving `dest` half
    written: a reader sees the old directory or the new one."""
    old = dest.parent / f".{dest.name}.old"
    if old.exists():
        shutil.rmtree(old)
    if dest.exists():
        os.replace(dest, old)
    os.replace(staging, dest)
    if old.exists():
        shutil.rmtree(old)
    return dest


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_json(path: Path) -> dict | None:
    """A JSON marker file, or None when it is missing or damaged (an unfinished build)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
