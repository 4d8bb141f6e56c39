"""The repository passes its own linters: ruff for Python, ansible-lint (production) for YAML,
import-linter for the import contracts in pyproject.toml."""

import json
import os
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
        ["lint-imports"],
    ],
    ids=["ruff-check", "ruff-format", "import-contracts"],
)
def test_linter_is_clean(command):
    result = subprocess.run(
        [str(BIN / command[0]), *command[1:]], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]


# ansible-lint checks each playbook and role's syntax with an ansible-playbook run of its
# own (39 of them, half its time); this runs ansible-lint with those runs recorded instead
# of made, then checks the same playbooks and roles in one ansible-playbook run, in the
# way ansible-lint does (a role through a play that imports it).
LINT = """
import json, sys
from ansiblelint import runner
from ansiblelint.__main__ import main

checked = []
assert hasattr(runner.Runner, "_get_ansible_syntax_check_matches"), "ansible-lint changed"

def record(self, lintable, app):
    if lintable.kind in ("playbook", "role"):
        checked.append((lintable.kind, str(lintable.path)))
    return []

runner.Runner._get_ansible_syntax_check_matches = record
code = main(["ansible-lint", "--offline", "-q"])
print("CHECKED " + json.dumps(sorted(checked)))
sys.exit(code)
"""


def test_ansible_lint_is_clean(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", LINT], cwd=REPO, capture_output=True, text=True,
        env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    checked = json.loads(result.stdout.split("CHECKED ", 1)[1].splitlines()[0])
    playbooks = [path for kind, path in checked if kind == "playbook"]
    roles = [path for kind, path in checked if kind == "role"]
    assert "deploy.yml" in playbooks and "roles/vllm_service" in roles, checked
    plays = [
        {"name": f"Syntax of {role}", "hosts": "localhost", "gather_facts": False,
         "tasks": [{"ansible.builtin.import_role": {"name": str(REPO / role)}}]}
        for role in roles
    ]  # fmt: skip
    (tmp_path / "roles.yml").write_text(json.dumps(plays))
    syntax = subprocess.run(
        [str(BIN / "ansible-playbook"), "--syntax-check", *playbooks, str(tmp_path / "roles.yml")],
        cwd=REPO, capture_output=True, text=True,
        env={**os.environ, "ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED": "False"},
    )  # fmt: skip
    assert syntax.returncode == 0, syntax.stdout[-4000:] + syntax.stderr[-4000:]


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
