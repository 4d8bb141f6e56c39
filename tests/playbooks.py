"""Run the kit's playbooks the way a user does, with the venv's ansible, and read the recap."""

from __future__ import annotations

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
