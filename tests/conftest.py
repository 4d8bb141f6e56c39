"""Shared fixtures: fake hosts from tests/machines.py, built in a fresh tmp dir."""

from collections.abc import Callable
from pathlib import Path

import pytest

from .machines import build_machine


@pytest.fixture
def machine_root(tmp_path: Path) -> Callable[[str], Path]:
    """Factory: machine_root("r730") writes that machine's sys/proc tree and returns its root."""

    def build(name: str) -> Path:
        return build_machine(name, tmp_path / name)

    return build
