"""socketwise_install_state's `outdated`: the instances a deploy restarts although it
writes nothing new, because an earlier deploy wrote their files and stopped before it
restarted them (their servers run what the files no longer say)."""

import json
import os
import re
import subprocess
import time

import pytest

from .playbooks import REPO, kit_plugin, run_playbook

state = kit_plugin("modules.install_state")

# `systemctl show --property=Id,MainPID -- UNITS` as systemd 252 prints it (read on a lab
# host): a block per unit, in the order asked, MainPID=0 for one that runs nothing.
SHOWN = """MainPID=950
Id=socketwise-vllm-dp0.service

MainPID=972
Id=socketwise-vllm-dp1.service

MainPID=0
Id=socketwise-vllm-x.service
"""


class Systemctl:
    """What the module asks systemd through: AnsibleModule.run_command, answered with
    SHOWN (this machine runs no systemd), recording the command."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    def run_command(self, argv: list[str], check_rc: bool = False) -> tuple[int, str, str]:
        self.asked.append(argv)
        return 0, SHOWN, ""


def test_each_unit_s_main_process_is_read_in_one_call():
    systemctl = Systemctl()
    units = [
        "socketwise-vllm-dp0.service",
        "socketwise-vllm-dp1.service",
        "socketwise-vllm-x.service",
    ]
    assert state.main_pids(systemctl, units) == {
        "socketwise-vllm-dp0.service": 950,
        "socketwise-vllm-dp1.service": 972,
        "socketwise-vllm-x.service": 0,
    }
    assert len(systemctl.asked) == 1 and systemctl.asked[0][-3:] == units
    # Nothing to ask: no call.
    assert state.main_pids(systemctl, []) == {} and len(systemctl.asked) == 1


@pytest.fixture
def server():
    """A running process, as a unit's main process."""
    process = subprocess.Popen(["sleep", "60"])
    time.sleep(0.2)
    yield process
    process.kill()
    process.wait()


def test_a_server_running_since_before_its_files_were_written_is_outdated(server, tmp_path):
    began = state.started(server.pid)
    assert began is not None and abs(began - time.time()) < 5
    unit, env = tmp_path / "socketwise-vllm-sn.service", tmp_path / "vllm.env"
    for path in (unit, env):
        path.write_text("")
        os.utime(path, (began - 60, began - 60))
    files = {"socketwise-vllm-sn.service": [str(unit), str(env)]}
    running = {"socketwise-vllm-sn.service": server.pid}
    # Written, then the server started: it runs what they say.
    assert state.outdated(running, files) == []
    # A unit file written after the server started (the deploy stopped there).
    os.utime(unit, (began + 2, began + 2))
    assert state.outdated(running, files) == ["socketwise-vllm-sn.service"]
    # The environment file the same way.
    os.utime(unit, (began - 60, began - 60))
    os.utime(env, (began + 2, began + 2))
    assert state.outdated(running, files) == ["socketwise-vllm-sn.service"]
    # A unit that runs nothing, or whose process is gone, is started, not restarted; a
    # file not there yet dates nothing.
    assert state.outdated({"socketwise-vllm-sn.service": 0}, files) == []
    server.kill()
    server.wait()
    assert state.outdated(running, files) == []
    missing = {"socketwise-vllm-sn.service": [str(tmp_path / "none")]}
    assert state.outdated({"socketwise-vllm-sn.service": os.getpid()}, missing) == []


def decided(tmp_path, outdated: list[str], fresh_start: bool = False) -> tuple[list[str], bool]:
    """What the role's own vars/main.yml decides (Ansible evaluating it) on a DP-2 host
    where dp0's unit file changed in this deploy and render.yml found OUTDATED: the
    instances __vllm_service_restarts names, and whether the image method's Podman
    secrets are made anew (__vllm_service_podman_secrets_anew)."""
    given = {
        "socketwise_plan": {"instances": [{"name": "vllm-dp0"}, {"name": "vllm-dp1"}]},
        "__vllm_service_typed": {"vllm_service_fresh_start": fresh_start},
        "__vllm_service_secrets": {"changed_names": []},
        "__vllm_service_unit_files": {"results": [
            {"changed": True, "instance": {"name": "vllm-dp0"}},
            {"changed": False, "instance": {"name": "vllm-dp1"}},
        ]},
        "__vllm_service_host": {"outdated": outdated},
    }  # fmt: skip
    shown = (
        "RESTARTS {{ __vllm_service_restarts | map(attribute='name') | join(',') }} "
        "ANEW {{ __vllm_service_podman_secrets_anew }}"
    )
    play = [{
        "hosts": "localhost", "gather_facts": False,
        "vars_files": [str(REPO / f"roles/{r}/vars/main.yml") for r in ("door", "vllm_service")],
        "tasks": [{"ansible.builtin.debug": {"msg": shown}}],
    }]  # fmt: skip
    (tmp_path / "play.yml").write_text(json.dumps(play))
    # Extra vars: above the role's own, as the tasks' registered results are.
    done = run_playbook(str(tmp_path / "play.yml"), "-i", "localhost,", "-c", "local",
                        "-e", json.dumps(given))  # fmt: skip
    assert done.returncode == 0, done.output
    restarts, anew = re.search(r"RESTARTS ([\w,-]*) ANEW (\w+)", done.output).groups()
    return restarts.split(","), anew == "True"


def test_the_deploy_restarts_the_outdated_instances_beside_the_changed_ones_once(tmp_path):
    assert decided(tmp_path, []) == (["vllm-dp0"], False)
    outdated = ["socketwise-vllm-dp0.service", "socketwise-vllm-dp1.service"]
    assert decided(tmp_path, outdated) == (["vllm-dp0", "vllm-dp1"], True)
    # An image's server restarted for an earlier deploy's vllm.env gets its secrets anew.
    assert decided(tmp_path, outdated[1:]) == (["vllm-dp0", "vllm-dp1"], True)
    assert decided(tmp_path, [], fresh_start=True) == (["vllm-dp0", "vllm-dp1"], False)
