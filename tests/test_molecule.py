"""The molecule scenarios, run as CI runs everything: through pytest."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .playbooks import REPO

pytestmark = pytest.mark.lab
BIN = Path(sys.executable).parent


@pytest.mark.parametrize("scenario", ["default", "image"])
def test_molecule_scenario_passes(scenario):
    result = subprocess.run(
        [str(BIN / "molecule"), "test", "-s", scenario],
        cwd=REPO,
        env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    print(result.stdout[-6000:])
    assert result.returncode == 0, result.stdout[-6000:]
