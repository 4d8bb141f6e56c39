"""A lab of fresh machines for one test module, always powered off afterwards."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from socketwise.lab import machines as lab

from .playbooks import REPO


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


def run_on(machine: lab.Machine, command: str) -> str:
    """COMMAND's standard output on MACHINE over SSH; the test fails if it fails."""
    result = subprocess.run(
        lab.ssh_command(machine, command), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"{machine.name}: {command!r}: {result.stderr}"
    return result.stdout.strip()


def eager_inventory(into: Path) -> Path:
    """The lab inventory as `lab up` just wrote it, with vLLM's `--enforce-eager`: the tiny
    model then starts in about 20 s instead of 60 s (no torch compile). For modules whose
    subject is what the kit does around vLLM (sweeps, rollouts), not vLLM's speed."""
    (into / "group_vars").mkdir(parents=True)
    shutil.copy(REPO / "inventories" / "lab" / "hosts.yml", into / "hosts.yml")
    committed = (REPO / "inventories" / "lab" / "group_vars" / "lab.yml").read_text()
    (into / "group_vars" / "lab.yml").write_text(
        committed + 'vllm_service_extra_args: ["--enforce-eager"]\n'
    )
    return into
