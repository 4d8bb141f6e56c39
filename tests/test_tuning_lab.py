"""End to end: the host_tuning role on real systemd machines, through molecule.

Slow and root-only (`-m lab` selects it, `-m "not lab"` skips it). Both scenarios boot the
machine tune1 of the lab `tune` (SOCKETWISE_LAB=tune, 127.0.93.11), apart from the default
lab. The writable scenario changes the kernel values the machines share with the
controller; it restores them itself, and this test checks that every value is back.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from .labs import unless_asked

# The host_tuning role's only lab proof (its rendering has fast tests in
# tests/test_tuning.py): both scenarios take about 6 minutes of the controller's two cores
# alone. Run them before a change to the role or to molecule/tuning*.
pytestmark = [
    pytest.mark.lab,
    unless_asked("the tuning scenarios (tune, reboot, revert)", "SOCKETWISE_TUNING_LAB"),
]

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def kernel_state() -> ModuleType:
    """The scenario's own snapshot helper, so both sides read the same values."""
    path = REPO / "molecule/tuning/kernel_state.py"
    spec = importlib.util.spec_from_file_location("kernel_state", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def failure_lines(output: str) -> str:
    """What failed, from a molecule run's output: pytest's E lines, Ansible's fatal lines."""
    marks = ("E  ", "FAILED", "fatal:", "failed:", "Executed: Failed", "ERROR", "CRITICAL")
    return "\n".join(line for line in output.splitlines() if line.lstrip().startswith(marks))


@pytest.mark.parametrize("scenario", ["tuning", "tuning-readonly"])
def test_molecule_scenario_passes_and_leaves_the_kernel_as_it_was(scenario, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    state = kernel_state()
    before = state.snapshot()
    env = dict(
        os.environ,
        SOCKETWISE_LAB="tune",
        PATH=f"{BIN}:{os.environ['PATH']}",
        NO_COLOR="1",
        PY_COLORS="0",
        ANSIBLE_NOCOLOR="1",
    )
    started = time.monotonic()
    try:
        done = subprocess.run(
            [str(BIN / "molecule"), "test", "-s", scenario],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        # The scenario restores the kernel in its cleanup; this is the net under it.
        rewritten = state.restore(before)
    print(f"[lab stage] molecule test -s {scenario}: {time.monotonic() - started:.1f} s")
    log = tmp_path / f"molecule-{scenario}.log"
    log.write_text(done.stdout + done.stderr)
    assert done.returncode == 0, f"{failure_lines(log.read_text())}\n(full output: {log})"
    assert rewritten == [], f"{scenario} left kernel values changed: {rewritten}"
    assert "idempotence: Executed: Successful" in done.stdout + done.stderr
