"""A lab of fresh machines for one test module, always powered off afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from socketwise.lab import machines as lab


@contextlib.contextmanager
def fresh_lab(
    machines: int = 1, loadgen: int = 0, frontdoor: int = 0
) -> Iterator[list[lab.Machine]]:
    """Machines copied anew from the rootfs (nothing left from an earlier test)."""
    if any(m.running for m in lab.status()):
        pytest.fail("a lab is already running: `socketwise lab down` first")
    lab.down(purge=True)
    try:
        yield lab.up(machines=machines, loadgen=loadgen, frontdoor=frontdoor)
    finally:
        lab.down(purge=True)
