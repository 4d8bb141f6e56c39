"""End to end on a real systemd host: deploy.yml serves SN, DP-2 behind HAProxy, TP-2 and
vLLM's own DP-2 on a 2-core lab machine, each answering a real completion, with every
worker thread where the plan put it; bad input stops before the host changes.

Slow (a vLLM install and five server starts): marked `lab`. The tests run in file
order on one machine, as a user would change layouts on one host.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from socketwise.lab import machines as lab

from .labs import fresh_lab
from .playbooks import PlaybookRun, run_playbook
from .test_unitvalues import HOSTILE_ARG, HOSTILE_ENV, render_vllm_unit

pytestmark = pytest.mark.lab

HOST = "lab1"
ADDRESS = "127.0.0.11"
INVENTORY = "inventories/lab"


@pytest.fixture(scope="module")
def machine() -> Iterator[lab.Machine]:
    """A fresh lab machine (copied anew from the rootfs), powered off at the end."""
    with fresh_lab() as (machine,):
        yield machine


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("artifacts")


def on_host(machine: lab.Machine, command: str, check: bool = True) -> str:
    result = subprocess.run(
        lab.ssh_command(machine, command), capture_output=True, text=True, timeout=120
    )
    assert not check or result.returncode == 0, f"{command!r}: {result.stderr}"
    return result.stdout.strip()


def deploy(artifacts: Path, *extra: str) -> PlaybookRun:
    started = time.monotonic()
    run = run_playbook(
        "deploy.yml", "-i", INVENTORY, "-e", f"socketwise_artifacts_dir={artifacts}", *extra
    )
    print(f"[deploy {' '.join(extra)}] {time.monotonic() - started:.0f} s", flush=True)
    return run


def completion(port: int) -> dict:
    request = urllib.request.Request(
        f"http://{ADDRESS}:{port}/v1/completions",
        data=json.dumps({"model": "tiny-llama", "prompt": "Hello", "max_tokens": 6}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def units(machine: lab.Machine) -> list[str]:
    listing = on_host(machine, "ls /etc/systemd/system | grep '^socketwise-' || true")
    return sorted(listing.split())


def summary(artifacts: Path) -> dict:
    return json.loads((artifacts / HOST / "deploy-summary.json").read_text())


def worker_cpus(artifacts: Path) -> list[list[int]]:
    """The CPUs each vLLM worker's threads really run on, as read from /proc on the host."""
    return sorted(
        process["thread_cpus"]
        for instance in summary(artifacts)["affinity"]
        for process in instance["processes"]
        if process["comm"].startswith("VLLM::Worker")
    )


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (
            ["-e", "vllm_model_path=/nonexistent/model"],
            f"{HOST}: vllm_model_path=/nonexistent/model: no model there on the controller",
        ),
        (
            ["-e", "plan_layout=tp", "-e", "plan_ranks=3"],
            f"{HOST}: plan_ranks=3: TP with 3 ranks does not fit 1 NUMA node(s)",
        ),
        (
            ["-e", "plan_layout=sn", "-e", "plan_kv_gb=4000"],
            f"{HOST}: plan_kv_gb=4000: KV cache 4000 GB per rank exceeds",
        ),
        (
            ["-e", "plan_layout=banana"],
            # The role's argument spec refuses it before the planner sees it.
            "value of plan_layout must be one of: sn, tp, dp, auto, got: banana",
        ),
        (
            # A newline would start a unit line of its own: the service would run as root.
            ["-e", json.dumps({"vllm_service_extra_args": ["--x\nUser=root"]})],
            f"{HOST}: vllm_service_extra_args[0]='--x\\\\nUser=root': holds a newline",
        ),
        (
            ["-e", json.dumps({"vllm_service_environment": {"MY VAR": "1"}})],
            f"{HOST}: vllm_service_environment.MY VAR='MY VAR': is not an environment variable",
        ),
        (["-e", "vllm_user=root"], f"{HOST}: vllm_user='root': is root or not a user name"),
    ],
    ids=[
        "model-missing",
        "tp-too-wide",
        "kv-too-big",
        "unknown-layout",
        "unit-injection",
        "env-name-space",
        "root-user",
    ],
)
def test_bad_input_stops_before_the_host_changes(machine, artifacts, extra, words):
    run = deploy(artifacts, *extra)
    assert run.returncode != 0
    assert words in " ".join(run.output.split()), run.output[-3000:]
    assert on_host(machine, "test -e /opt/socketwise && echo installed || echo clean") == "clean"
    assert units(machine) == []


def test_systemd_reads_every_quoted_value_as_written(machine):
    # The template as the role renders it, with values full of what systemd interprets;
    # loaded (not started) by the machine's real systemd, which reports what it parsed.
    text = render_vllm_unit(
        vllm_service_extra_args=["--note", HOSTILE_ARG],
        vllm_service_environment={"PROBE": HOSTILE_ENV},
    )
    encoded = base64.b64encode(text.encode()).decode()
    unit = "/etc/systemd/system/probe-quoting.service"
    on_host(machine, f"echo {encoded} | base64 -d > {unit} && systemctl daemon-reload")
    try:
        environment = on_host(machine, "systemctl show -p Environment --value probe-quoting")
        command = on_host(machine, "systemctl show -p ExecStart --value probe-quoting")
        user = on_host(machine, "systemctl show -p User --value probe-quoting")
    finally:
        on_host(machine, f"rm -f {unit} && systemctl daemon-reload")
    # `show` prints an entry with spaces in double quotes, escaping \\, " and $ with a
    # backslash: one entry, the value exactly as given.
    shown = HOSTILE_ENV.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    assert f'"PROBE={shown}"' in environment, environment
    # It prints argv before exec, where `$$` becomes `$`; `%%`, quotes and backslashes
    # are already resolved to the characters given.
    assert f"--note {HOSTILE_ARG.replace('$', '$$')} --uvicorn-log-level" in command, command
    assert user == "vllm"


def test_a_port_held_by_another_program_stops_the_deploy(machine, artifacts):
    on_host(machine, f"systemd-run --unit=squatter python3 -m http.server 8000 --bind {ADDRESS}")
    try:
        on_host(
            machine,
            f"for i in $(seq 50); do ss -Hltn | grep -q '{ADDRESS}:8000' && break; sleep 0.1; done",
        )
        run = deploy(artifacts, "-e", "plan_layout=sn")
        assert run.returncode != 0
        text = " ".join(run.output.split())
        assert f"{HOST}: plan_port=8000: port 8000 on {ADDRESS} is held by /usr/bin/python3" in text
        assert (
            on_host(machine, "test -e /opt/socketwise && echo installed || echo clean") == "clean"
        )
    finally:
        on_host(machine, "systemctl stop squatter")


def test_sn_serves_a_real_completion_on_the_cores_the_plan_gave_it(machine, artifacts):
    run = deploy(artifacts, "-e", "plan_layout=sn")
    assert run.returncode == 0, run.output[-4000:]
    assert units(machine) == ["socketwise-vllm-sn.service"]
    assert completion(8000)["usage"]["completion_tokens"] > 0
    plan = json.loads((artifacts / HOST / "plan.json").read_text())
    assert worker_cpus(artifacts) == [plan["instances"][0]["ranks"][0]["cpus"]] == [[0, 1]]
    shown = on_host(machine, "systemctl show -p CPUAffinity -p NUMAPolicy socketwise-vllm-sn")
    assert "CPUAffinity=0-1" in shown and "NUMAPolicy=bind" in shown
    assert summary(artifacts)["versions"]["vllm"] == "0.32.0"


def test_a_converged_host_reports_no_change_again_or_in_check_mode(machine, artifacts):
    again = deploy(artifacts, "-e", "plan_layout=sn")
    assert again.recap(HOST)["changed"] == 0, again.output[-4000:]
    checked = deploy(artifacts, "-e", "plan_layout=sn", "--check")
    assert checked.returncode == 0 and checked.recap(HOST)["changed"] == 0, checked.output[-4000:]


def test_dp2_instances_answer_behind_the_load_balancer(machine, artifacts):
    run = deploy(artifacts, "-e", "plan_layout=dp")
    assert run.returncode == 0, run.output[-4000:]
    # The SN unit of the previous layout is gone.
    assert units(machine) == [
        "socketwise-lb.service",
        "socketwise-vllm-dp0.service",
        "socketwise-vllm-dp1.service",
    ]
    for port in (8001, 8002, 8000):
        assert completion(port)["usage"]["completion_tokens"] > 0
    assert worker_cpus(artifacts) == [[0], [1]]
    assert summary(artifacts)["ports"] == [8001, 8002, 8000]


def test_tp2_runs_one_rank_per_core(machine, artifacts):
    run = deploy(artifacts, "-e", "plan_layout=tp")
    assert run.returncode == 0, run.output[-4000:]
    assert units(machine) == ["socketwise-vllm-tp.service"]
    assert completion(8000)["usage"]["completion_tokens"] > 0
    assert worker_cpus(artifacts) == [[0], [1]]
    assert on_host(machine, "pgrep -c -f '^VLLM::Worker_TP'") == "2"


def test_vllm_internal_dp2_runs_two_engines_in_one_service(machine, artifacts):
    run = deploy(artifacts, "-e", "plan_layout=dp", "-e", "plan_dp_mode=vllm")
    assert run.returncode == 0, run.output[-4000:]
    assert units(machine) == ["socketwise-vllm-dp.service"]
    assert completion(8000)["usage"]["completion_tokens"] > 0
    assert worker_cpus(artifacts) == [[0], [1]]


def test_absent_removes_every_service_and_frees_the_port(machine, artifacts):
    run = deploy(artifacts, "-e", "vllm_service_state=absent")
    assert run.returncode == 0, run.output[-4000:]
    assert units(machine) == []
    with pytest.raises(OSError):
        completion(8000)
