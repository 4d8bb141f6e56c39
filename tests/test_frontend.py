"""An instance's front end moved to the cores the plan keeps for it once its workers have
started (socketwise.serve.frontend), and the deploy's check of where it runs: on a real
process tree named as vLLM names its processes."""

import os
import subprocess
import sys
import time

import pytest

from socketwise.serve.frontend import main, place
from socketwise.serve.verify import check_instance, describe, process_tree

CPUS = sorted(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to move processes between")
FRONT, RANK = {CPUS[-1]}, {CPUS[0]}

# vLLM's processes as it names them (comm keeps 15 characters): the API server starts
# its engine core (a scheduler thread and a socket thread), which starts its worker a
# second later.
WORKER = "import sys, time; open('/proc/self/comm', 'w').write('VLLM::Worker_TP0'); time.sleep(60)"
ENGINE = (
    "import subprocess, sys, threading, time; "
    "open('/proc/self/comm', 'w').write('VLLM::EngineCore'); "
    "threading.Thread(target=time.sleep, args=(60,), daemon=True).start(); "
    "time.sleep(1); subprocess.Popen([sys.executable, '-c', sys.argv[1]]); time.sleep(60)"
)
API = (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', *sys.argv[1:]]); time.sleep(60)"
)


@pytest.fixture
def server():
    api = subprocess.Popen([sys.executable, "-c", API, ENGINE, WORKER])
    yield api.pid
    for pid in reversed(process_tree(api.pid)):
        os.kill(pid, 9)
    api.wait()


def _cpus_of(main_pid: int) -> dict[str, set[int]]:
    """Each process's comm ("api" for the main one) and the union of its threads' CPUs;
    "scheduler" is the engine core's main thread's."""
    found = {}
    for p in filter(None, map(describe, process_tree(main_pid))):
        found["api" if p["pid"] == main_pid else p["comm"]] = set(p["thread_cpus"])
        if p["comm"] == "VLLM::EngineCor":
            found["scheduler"] = set(p["cpus_allowed"])
    return found


def _instance() -> dict:
    return {
        "name": "vllm-sn",
        "ranks": [{"cpus": sorted(RANK)}],
        "cpus_allowed": CPUS,
        "frontend_cpus": sorted(FRONT),
        "engine_cpus": sorted(RANK),
        "data_parallel": 1,
    }


def test_the_front_end_moves_to_its_cores_and_the_scheduler_to_the_engines(server):
    said = place(server, FRONT, RANK, workers=1, timeout=20)
    cpus = _cpus_of(server)
    assert cpus["api"] == FRONT
    # The engine core's scheduler on the engine's CPUs, its other threads with the front end.
    assert cpus["scheduler"] == RANK
    assert cpus["VLLM::EngineCor"] == FRONT | RANK
    # The worker keeps the unit's CPUs: vLLM's OpenMP binds it within them.
    assert cpus["VLLM::Worker_TP"] == set(CPUS)
    assert f"on CPUs {sorted(FRONT)}" in said and f"(pid {server}" in said
    assert f"schedules on CPUs {sorted(RANK)}" in said
    processes = [p for p in map(describe, process_tree(server)) if p]
    assert not [
        x for x in check_instance(_instance(), processes) if "front end" in x or "engine core" in x
    ]


def test_the_deploy_check_names_a_front_end_left_on_every_cpu(server):
    time.sleep(2)  # the worker has started; nothing placed
    processes = [p for p in map(describe, process_tree(server)) if p]
    problems = check_instance(_instance(), processes)
    assert any(
        f"front end process {server}" in x and f"planned {sorted(FRONT)}" in x for x in problems
    )
    assert any("engine core process" in x for x in problems)


def test_without_its_workers_nothing_moves_and_the_unit_still_starts(server, capsys):
    assert (
        main(
            [
                "--pid",
                str(server),
                "--frontend",
                ",".join(map(str, FRONT)),
                "--workers",
                "2",
                "--timeout",
                "2",
            ]
        )
        == 0
    )
    assert "1 of 2 worker(s) started within 2 s" in capsys.readouterr().out
    assert _cpus_of(server)["api"] == set(CPUS)


def test_a_server_gone_is_one_line_not_a_failed_unit(capsys):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert main(["--pid", str(gone.pid), "--frontend", "0"]) == 0
    assert f"process {gone.pid} is gone" in capsys.readouterr().out
