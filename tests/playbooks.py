"""Run the kit's playbooks the way a user does, with the venv's ansible, and read the recap."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


@dataclass
class PlaybookRun:
    returncode: int
    output: str

    def recap(self, host: str) -> dict[str, int]:
        """The PLAY RECAP counters of `host` (ok, changed, failed, ...)."""
        match = re.search(rf"^{re.escape(host)}\s+:\s+(.*)$", self.output, re.MULTILINE)
        assert match, f"no recap for {host}:\n{self.output[-3000:]}"
        return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", match.group(1))}

    def changed_tasks(self, host: str) -> list[str]:
        """The names of the tasks that reported `host` changed, for an assertion's message."""
        task, changed = "", []
        for line in self.output.splitlines():
            if line.startswith("TASK ["):
                task = line[6:].split("]", 1)[0]
            elif line.startswith(f"changed: [{host}]"):
                changed.append(task)
        return changed


def run_playbook(playbook: str, *args: str, env: dict[str, str] | None = None) -> PlaybookRun:
    environment = dict(
        os.environ, PATH=f"{BIN}:{os.environ['PATH']}", ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0"
    )
    environment.update(env or {})
    result = subprocess.run(
        [str(BIN / "ansible-playbook"), playbook, *args],
        cwd=REPO,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return PlaybookRun(result.returncode, result.stdout)


def run_module(module: str, args: dict, *extra: str) -> tuple[dict, str]:
    """Run one of vllm_service's modules with ansible against localhost, as a task would:
    its result and ansible's whole output (to look for what it must not show)."""
    done = subprocess.run(
        [str(BIN / "ansible"), "localhost", "-i", "inventories/local", "-m", module,
         "-a", json.dumps(args), *extra],
        cwd=REPO, capture_output=True, text=True, check=False,
        env=dict(os.environ, ANSIBLE_LIBRARY=str(REPO / "roles/vllm_service/library"),
                 ANSIBLE_MODULE_UTILS=str(REPO / "roles/vllm_service/module_utils"),
                 ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="json"),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"], done.stdout
