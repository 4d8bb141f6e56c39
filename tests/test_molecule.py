"""The molecule scenarios, run as CI runs everything: through pytest.

The default scenario's subject is the roles' layout, front door, idempotence and check
mode, not the venv install (test_deploy_lab installs for real), so its machine gets the
venvs kept from an earlier module (`labs.fresh_lab`'s preinstalled) between molecule's
create and converge: its steps run one by one, in the scenario's own test_sequence.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from socketwise.lab import machines as lab

from .labs import KIT_HOME, LOADGEN_ONLY, link_installed, unless_asked
from .playbooks import REPO

pytestmark = pytest.mark.lab
BIN = Path(sys.executable).parent
SEQUENCE = yaml.safe_load((REPO / "molecule/default/molecule.yml").read_text())["scenario"][
    "test_sequence"
]


def molecule(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "molecule"), *args],
        cwd=REPO,
        env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


# Every behaviour the default scenario verifies (DP-2 behind the front door, its key, each
# worker on its rank's CPUs; a second converge and --check changing nothing, there on SN)
# is asserted by tests/test_deploy_lab.py on its own deployments; in the suite the
# scenario cost about 5 minutes of the two cores more, which a slow CI machine could not
# pay within its time. It runs when asked: before a change to molecule/default or the
# roles' layout.
@unless_asked(
    "molecule's default scenario re-proves what tests/test_deploy_lab.py asserts",
    "SOCKETWISE_MOLECULE_DEFAULT",
)
def test_molecule_default_scenario_passes(monkeypatch):
    finished = False
    try:
        for step in SEQUENCE:
            result = molecule(step, "-s", "default")
            print(result.stdout[-6000:])
            assert result.returncode == 0, f"molecule {step}: {result.stdout[-6000:]}"
            if step == "create":
                monkeypatch.setenv("SOCKETWISE_LAB", "molecule")
                for machine in lab.status():
                    link_installed(machine.directory, KIT_HOME, leave=LOADGEN_ONLY)
                monkeypatch.delenv("SOCKETWISE_LAB")
        finished = True
    finally:
        if not finished:
            molecule("destroy", "-s", "default")


# The image method's only lab proof: the image built on the controller from nothing (about
# 4 minutes of its two cores, a 1.3 GB archive), loaded and served on a machine. Run it
# before a change to the image build, the image units or molecule/image.
@unless_asked("molecule's image scenario (an image built)", "SOCKETWISE_MOLECULE_IMAGE")
def test_molecule_image_scenario_passes():
    result = molecule("test", "-s", "image")
    print(result.stdout[-6000:])
    assert result.returncode == 0, result.stdout[-6000:]
