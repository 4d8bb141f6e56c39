"""Small file helpers shared by the builders of cached artefacts (stdlib only)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


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
