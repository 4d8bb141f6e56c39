"""The host's secret files in one call (socketwise.serve.secretfiles and its Ansible door):
written root-only and only when they differ, kept, removed and made once as asked, and
never shown; the fleet door's removal takes its own secrets alone, and the controller's
credentials directory stays out of git."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess

import pytest
import yaml

from socketwise.serve.secretfiles import apply

from .playbooks import REPO, run_module, run_playbook
from .role_reads import flat_tasks

SECRET = "SOCKETWISE_BACKEND_KEY=never-shown-1234\n"


def _module(args: dict, *extra: str) -> tuple[dict, str]:
    return run_module("socketwise.kit.secret_files", args, *extra)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_one_call_makes_the_directory_writes_removes_and_makes_a_credential_once(tmp_path):
    secrets = tmp_path / "secrets"
    args = {
        "dir": str(secrets),
        "dir_mode": "0700",
        "once": ["backend-key"],
        "files": {"frontdoor.env": SECRET, "client-keys": ""},
        "absent": ["frontdoor.pem"],
    }
    predicted, _ = _module(args, "--check")
    assert predicted["changed"] and not secrets.exists()
    first, output = _module(args)
    assert first["changed_names"] == [".", "backend-key", "frontdoor.env", "client-keys"]
    assert SECRET.strip() not in output  # a content is a no_log value
    key = first["contents"]["backend-key"]
    assert len(key.strip()) == 48 and key.strip().isalnum()
    assert _mode(secrets) == 0o700
    assert all(_mode(path) == 0o600 for path in secrets.iterdir())
    assert (secrets / "frontdoor.env").read_text() == SECRET
    again, _ = _module(args)
    assert (again["changed"], again["changed_names"]) == (False, [])
    assert again["contents"]["backend-key"] == key  # made once, read back
    (secrets / "frontdoor.pem").write_text("old certificate\n")
    args["files"]["client-keys"] = "a-new-client-key\n"
    moved, _ = _module(args)
    assert moved["changed_names"] == ["client-keys", "frontdoor.pem"]
    assert not (secrets / "frontdoor.pem").exists()
    assert (secrets / "client-keys").read_text() == "a-new-client-key\n"


def test_kept_names_stay_and_a_file_with_the_wrong_mode_is_rewritten(tmp_path):
    uid, gid = os.getuid(), os.getgid()
    (tmp_path / "client-keys").write_text("old-key\n")
    (tmp_path / "vllm.env").write_text("VLLM_API_KEY=x\n")
    os.chmod(tmp_path / "vllm.env", 0o644)
    files = [{"name": "client-keys", "content": "new-key\n", "force": False},
             {"name": "vllm.env", "content": "VLLM_API_KEY=x\n"}]  # fmt: skip
    assert apply(str(tmp_path), files, uid=uid, gid=gid)["changed"] == ["vllm.env"]
    assert (tmp_path / "client-keys").read_text() == "old-key\n"
    assert _mode(tmp_path / "vllm.env") == 0o600
    assert apply(str(tmp_path), files, uid=uid, gid=gid)["changed"] == []


def test_a_name_that_leaves_the_directory_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match="not a file name"):
        apply(str(tmp_path), [{"name": "ok", "content": "x"}], absent=["../elsewhere"])
    assert list(tmp_path.iterdir()) == []


FLEET_ABSENT = """
- name: Remove the fleet front door
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Remove it
      ansible.builtin.include_role:
        name: fleet_door
        tasks_from: absent
"""


def test_removing_the_fleet_door_leaves_a_monitors_token_beside_its_secrets(tmp_path):
    """The fleet door's removal on a host that also runs the monitor: the door's files go,
    the monitor's scrape token in the same directory stays; alone, the directory goes."""
    secrets, etc = tmp_path / "secrets", tmp_path / "etc"
    secrets.mkdir()
    etc.mkdir()
    fleet = ["client-keys", "scrape-keys", "frontdoor.pem", "fleet-client.pem"]
    for name in [*fleet, "scrape-token"]:
        (secrets / name).write_text("secret\n")
    (etc / "fleet-haproxy.cfg").write_text("global\n")
    playbook = tmp_path / "fleet-absent.yml"
    playbook.write_text(FLEET_ABSENT)
    where = {
        "__door_secrets_dir": str(secrets),
        "__fleet_door_config": str(etc / "fleet-haproxy.cfg"),
        "__fleet_door_unit_dir": str(tmp_path / "units"),
    }
    for left in (["scrape-token"], []):
        done = run_playbook(str(playbook), "-i", "inventories/local", "-e", json.dumps(where))
        assert done.returncode == 0, done.output[-3000:]
        assert sorted(p.name for p in etc.iterdir()) == []
        if left:
            assert sorted(p.name for p in secrets.iterdir()) == left
            (secrets / "scrape-token").unlink()
        else:
            assert not secrets.exists()


@pytest.mark.parametrize("inventory", ["example-fleet", "lab"])
def test_a_copied_inventory_never_commits_its_credentials(tmp_path, inventory):
    """A shipped inventory copied into a repository of the user's own: the fleet door's
    client certificate and key the kit writes to its credentials/ stay out of git."""
    copy = tmp_path / "inventory"
    shutil.copytree(REPO / "inventories" / inventory, copy)
    (copy / "credentials").mkdir(exist_ok=True)
    (copy / "credentials" / "fleet-client.pem").write_text("key\n")
    (copy / "hosts.yml").write_text("all: {}\n")
    subprocess.run(["git", "init", "-q", str(copy)], check=True)
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=copy, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "hosts.yml" in status.stdout
    assert "credentials" not in status.stdout


# A secret's value named in a task's module arguments (what -v prints, and a set_fact's
# or copy's result shows), and the files that hold one.
SECRET_VALUE = re.compile(r"api_key|client_keys?\b|backend_key|scrape_token|hf_token|_pem\b")
SECRET_FILE = re.compile(r"vllm\.env|client-keys|scrape-keys|\.pem\b|\.key\b")
TASK_KEYWORDS = {"name", "when", "register", "loop", "loop_control", "vars", "no_log", "tags",
                 "delegate_to", "run_once", "throttle", "changed_when", "failed_when", "until",
                 "retries", "delay", "notify", "check_mode", "diff", "ignore_errors", "args",
                 "environment", "become", "become_user", "listen"}  # fmt: skip


def handles_a_secret(module: str, arguments: object) -> bool:
    text = json.dumps(arguments)
    if module == "socketwise.kit.secret_files":
        return True
    if module == "ansible.builtin.slurp":
        return bool(SECRET_FILE.search(text))
    if module == "ansible.builtin.copy":
        return bool(SECRET_VALUE.search(json.dumps(arguments.get("content", ""))))
    if module in ("ansible.builtin.set_fact", "ansible.builtin.shell", "ansible.builtin.command"):
        return bool(SECRET_VALUE.search(text))
    return False


def test_every_task_that_handles_a_secret_keeps_it_out_of_the_output():
    """A task that writes, reads back or publishes a secret is no_log: without it `-v`
    (and a failure) prints the key or token in its arguments or result. The kit's own
    modules mark their secret options no_log themselves."""
    shown = []
    for path in sorted((REPO / "roles").glob("*/tasks/*.yml")):
        for task in flat_tasks(yaml.safe_load(path.read_text())):
            actions = [key for key in task if key not in TASK_KEYWORDS]
            if (
                actions
                and handles_a_secret(actions[0], task[actions[0]])
                and not task.get("no_log")
            ):
                shown.append(f"{path.relative_to(REPO)}: {task['name']}")
    assert shown == []
    for module in sorted((REPO / "plugins/modules").glob("*.py")):
        for option in re.findall(r'"(\w*(?:key|token)\w*)": \{([^}]*)\}', module.read_text()):
            assert '"no_log": True' in option[1], f"{module.name}: {option[0]}"
