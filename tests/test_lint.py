"""The repository passes its own linters: ruff for Python, ansible-lint (production) for YAML,
import-linter for the import contracts in pyproject.toml."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "."],
        ["ansible-lint", "--offline", "-q"],
        ["lint-imports"],
    ],
    ids=["ruff-check", "ruff-format", "ansible-lint", "import-contracts"],
)
def test_linter_is_clean(command):
    result = subprocess.run(
        [str(BIN / command[0]), *command[1:]], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]


# A module past this many lines holds more than one job: split it along them
# (docs/development/architecture.md).
MAX_MODULE_LINES = 600


def test_no_module_of_the_package_is_longer_than_one_job():
    long = {
        str(path.relative_to(REPO)): lines
        for path in sorted((REPO / "socketwise").rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"over {MAX_MODULE_LINES} lines: {long}"
