"""What a user checks on a converged DP-2 host: units up, the front door answering a
real completion with the API key (and refusing one without it), every vLLM worker
thread on the CPUs of its rank, and a --check run that would change nothing."""

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import testinfra.utils.ansible_runner

from socketwise.facts.files import parse_cpulist

testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(
    os.environ["MOLECULE_INVENTORY_FILE"]
).get_hosts("all")

REPO = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
ARTIFACTS = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "artifacts"


def plan(host) -> dict:
    name = host.backend.get_hostname()
    return json.loads((ARTIFACTS / name / "plan.json").read_text())


def address(host) -> str:
    return host.ansible.get_variables()["ansible_host"]


def test_every_planned_unit_and_the_load_balancer_are_enabled_and_running(host):
    for instance in plan(host)["instances"]:
        unit = host.service(f"socketwise-{instance['name']}")
        assert unit.is_enabled and unit.is_running
        assert host.file(f"/etc/systemd/system/socketwise-{instance['name']}.service").exists
    assert host.service("socketwise-lb").is_running


def completion(host, key: str | None) -> dict:
    """A completion asked of the front door from the controller, as a client would."""
    request = urllib.request.Request(
        f"http://{address(host)}:{plan(host)['endpoint_port']}/v1/completions",
        data=json.dumps({"model": "tiny-llama", "prompt": "Hello", "max_tokens": 5}).encode(),
        headers={"Content-Type": "application/json"}
        | ({"Authorization": f"Bearer {key}"} if key else {}),
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def test_the_front_door_answers_a_real_completion_with_the_key_only(host):
    # The key `socketwise lab up` made, which the lab's group_vars hand to the deploy.
    cache = Path(os.environ.get("SOCKETWISE_CACHE", "/var/cache/socketwise"))
    key = (cache / "lab" / "api-key").read_text().strip()
    assert completion(host, key)["usage"]["completion_tokens"] > 0
    try:
        completion(host, None)
        raise AssertionError("the front door answered without the key")
    except urllib.error.HTTPError as refused:
        assert refused.code == 401


def test_worker_threads_run_on_exactly_the_planned_cpus(host):
    for instance in plan(host)["instances"]:
        main_pid = host.check_output(
            f"systemctl show -p MainPID --value socketwise-{instance['name']}"
        )
        workers = host.check_output(f"pgrep -P $(pgrep -P {main_pid} -f EngineCore) || true")
        # Each thread's CPU set as the kernel lists it ("0-1" and "0,1" are one set).
        cpus = set()
        for pid in workers.split():
            status = host.check_output(f"cat /proc/{pid}/task/*/status")
            for listed in re.findall(r"Cpus_allowed_list:\s*(\S+)", status):
                cpus.add(frozenset(parse_cpulist(listed)))
        assert cpus == {frozenset(instance["ranks"][0]["cpus"])}


def test_check_mode_on_the_converged_host_changes_nothing(host):
    inventory = Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(inventory),
            "--check",
            "deploy.yml",
            "-e",
            f"socketwise_artifacts_dir={ARTIFACTS}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            # molecule forces colour; the recap is read as plain text.
            "ANSIBLE_FORCE_COLOR": "0",
            "ANSIBLE_NOCOLOR": "1",
        },
    )
    assert result.returncode == 0, result.stdout[-3000:]
    recap = re.search(rf"^{host.backend.get_hostname()}\s+:.*changed=(\d+)", result.stdout, re.M)
    assert recap and recap.group(1) == "0", result.stdout[-3000:]
