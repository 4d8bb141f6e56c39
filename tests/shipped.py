"""Code the roles ship to hosts, copied the way the role copies it, to run as it runs there."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def ship(role: str, variable: str, destination: Path) -> Path:
    """Copy exactly the package files `role` lists in `variable` (its vars/main.yml) below
    `destination`, and return it: the directory to put on PYTHONPATH."""
    files = yaml.safe_load((REPO / "roles" / role / "vars" / "main.yml").read_text())[variable]
    for name in files:
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / name, target)
    return destination


def host_python(shipped: Path, module: str, *args: str) -> tuple[list[str], dict[str, str]]:
    """argv and environment that run `python3 -m module` from the shipped copy only: -S keeps
    site-packages (so socketwise itself and every third-party package) off the path."""
    return [sys.executable, "-S", "-m", module, *args], {"PYTHONPATH": str(shipped)}
