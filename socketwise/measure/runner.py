"""The measuring commands' way into Ansible: a playbook of the checkout run through
ansible-runner against an inventory, its artifacts where the run directory keeps them, and
one line per failed task when it fails.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from socketwise.common import paths


class SweepError(RuntimeError):
    """Why a measuring command (sweep, calibrate) stopped: one line for the user."""


def run_playbook(
    playbook: str,
    inventory: Path,
    extravars: dict,
    artifacts: Path,
    on_event: Callable[[dict], bool] | None = None,
    limit: str | None = None,
) -> None:
    import ansible_runner

    repo = paths.repo_root()
    bin_dir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory(prefix="socketwise-runner-") as private:
        result = ansible_runner.run(
            private_data_dir=private,
            project_dir=str(repo),
            playbook=str(repo / playbook),
            inventory=str(inventory.resolve()),
            extravars=extravars,
            envvars={
                "ANSIBLE_CONFIG": str(repo / "ansible.cfg"),
                "ANSIBLE_ROLES_PATH": str(repo / "roles"),
                "SOCKETWISE_ARTIFACTS": str(artifacts),
                "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            },
            quiet=True,
            event_handler=on_event,
            limit=limit,
        )
        if result.rc != 0:
            failed = "; ".join(failures(result.events))
            raise SweepError(f"{playbook} failed ({result.status}): {failed}")


def failures(events: Iterable[dict]) -> list[str]:
    """Host, task and why for every failed task or loop item: an item's own stderr (a
    benchmark step prints its log's tail there), else the message. A loop's summary
    ("One or more items failed") is left out: its items said more."""
    found = []
    for event in events:
        data = event.get("event_data", {})
        result = data.get("res", {})
        item = event.get("event") == "runner_item_on_failed"
        if item or (event.get("event") == "runner_on_failed" and "results" not in result):
            why = result.get("stderr") or result.get("msg", "")
            label = f" {result['_ansible_item_label']}" if "_ansible_item_label" in result else ""
            found.append(f"{data.get('host')}: {data.get('task')}{label}: {why}")
    return found
