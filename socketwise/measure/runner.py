"""The measuring commands' way into Ansible: a playbook of the checkout run through
ansible-runner against an inventory, its artifacts where the run directory keeps them, and
one line per failed task when it fails; the inventory as Ansible lists it, read once while
its files stay unchanged.
"""

from __future__ import annotations

import copy
import functools
import json
import subprocess
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


def read_inventory(inventory: Path, limit: str | None = None) -> dict:
    """`ansible-inventory --list` of INVENTORY (only the hosts the pattern LIMIT names, when
    given): groups, their hosts and children, _meta. Read once per command while its files
    stay as they are (a command's parts ask for it again and again, and each read starts
    Ansible, about two seconds); a copy each time."""
    inventory = Path(inventory).resolve()
    return copy.deepcopy(_listed(inventory, limit, _files_as_they_are(inventory)))


def _files_as_they_are(inventory: Path) -> tuple:
    """What Ansible reads of INVENTORY (a file with its group_vars and host_vars beside it,
    or a folder), each file with its size and time of change."""
    if inventory.is_dir():
        files = [f for f in inventory.rglob("*") if f.is_file()]
    else:
        beside = [inventory.parent / "group_vars", inventory.parent / "host_vars"]
        files = [inventory, *(f for folder in beside for f in folder.rglob("*") if f.is_file())]
    stats = ((f, f.stat()) for f in sorted(files) if f.exists())
    return tuple((str(f), stat.st_size, stat.st_mtime_ns) for f, stat in stats)


@functools.cache
def _listed(inventory: Path, limit: str | None, _files: tuple) -> dict:
    listed = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(inventory), "--list",
         *(["--limit", limit] if limit else [])],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if listed.returncode != 0:
        raise SweepError(f"cannot read the inventory {inventory}: {listed.stderr.strip()}")
    return json.loads(listed.stdout)
