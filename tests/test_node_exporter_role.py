"""The node_exporter role's marks: while the kit rolls out or sweeps a monitored host, its
node exporter's textfile collector serves socketwise_operation_in_progress{operation}=1,
which the monitor's SocketwiseOperationInProgress alert reads; the mark is gone when the
operation ends. Run as rollout.yml and bench.yml run it (include_role), the host reached
as the controller itself, on a real directory in place of the collector's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from .playbooks import run_playbook

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Mark or clear the operation
      ansible.builtin.include_role:
        name: node_exporter
        tasks_from: mark
      vars:
        node_exporter_operation: "{{ operation }}"
        node_exporter_operation_done: "{{ done }}"
"""


def mark(tmp_path: Path, textfile: Path, operation: str, done: bool) -> int:
    """One mark (or its clearing) on a host whose collector reads TEXTFILE; how many tasks
    changed the host."""
    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    extra = {"operation": operation, "done": done, "__node_exporter_textfile_dir": str(textfile)}
    run = run_playbook(
        str(play), "-i", "localhost,", "-c", "local", "-e", json.dumps(extra),
        "-e", "ansible_python_interpreter={{ ansible_playbook_python }}",
    )  # fmt: skip
    assert run.returncode == 0, run.output[-3000:]
    return run.recap("localhost")["changed"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool (Debian's prometheus)")
def test_an_operation_is_served_while_it_lasts_and_gone_after(tmp_path):
    textfile = tmp_path / "metrics"
    textfile.mkdir()
    assert mark(tmp_path, textfile, "rollout", done=False) == 0
    assert mark(tmp_path, textfile, "sweep", done=False) == 0
    rollout = (textfile / "rollout.prom").read_text()
    # The exposition format the collector parses, and the one sample the alert reads.
    checked = subprocess.run(
        ["promtool", "check", "metrics"], input=rollout, text=True, capture_output=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    samples = [line for line in rollout.splitlines() if not line.startswith("#")]
    assert samples == ['socketwise_operation_in_progress{operation="rollout"} 1']
    # The rollout ends: its mark goes, the sweep's stays until the sweep ends.
    assert mark(tmp_path, textfile, "rollout", done=True) == 0
    assert sorted(path.name for path in textfile.iterdir()) == ["sweep.prom"]


def test_a_host_without_the_node_exporter_is_left_alone(tmp_path):
    textfile = tmp_path / "metrics"
    assert mark(tmp_path, textfile, "rollout", done=False) == 0
    assert not textfile.exists()
