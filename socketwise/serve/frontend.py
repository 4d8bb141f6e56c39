"""Keep vLLM's front end on the cores the plan keeps for it (stdlib only).

Shipped by the vllm_service role and run by each placed instance's unit once it has
started (ExecStartPost, in the background), as the service's own user:

    python3 place-frontend.py --pid MAINPID --frontend 1 [--engine 0] --workers 1

vLLM pins only its workers' threads (VLLM_CPU_OMP_THREADS_BIND). Its API server and its
engine core (the scheduler) are left on every CPU of the unit, so the kernel may run
them beside a worker's threads, or crowd them onto one core with whatever else the host
runs; the same load then gives one throughput or half of it (docs/measurements.md).
This waits until the instance has started its `--workers` workers (they start on their
parent's CPUs, and each worker's OpenMP binds from there), then moves every thread of
the API server and its other processes, and the engine core's socket threads, to the
`--frontend` CPUs, and the engine core's main thread (its scheduler loop) to the
`--engine` CPUs (the plan's `engine_cpus`); without `--engine` the engine core stays
where it is. Threads made later take their maker's CPUs. Never fails the unit: a worker
that does not come within `--timeout` seconds, or a process gone meanwhile, is one line
in the journal.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

# vLLM names its processes (setproctitle); comm keeps the first 15 characters.
WORKER_PREFIX = "VLLM::Worker"
ENGINE_PREFIX = "VLLM::EngineCor"


def cpu_list(text: str) -> set[int]:
    """'0,2-3' as {0, 2, 3}: the plan's lists as the unit passes them. Not
    socketwise.facts.files.parse_cpulist: this file runs on the host alone, shipped
    without the package."""
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def tree(main_pid: int, proc: Path = Path("/proc")) -> list[tuple[int, str]]:
    """(pid, comm) of `main_pid` and every descendant, parents before children."""
    children: dict[int, list[int]] = {}
    comms: dict[int, str] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # comm may hold spaces and parentheses: the parent PID follows the last ')'.
        head, _, rest = stat.rpartition(")")
        comms[int(entry.name)] = head.split("(", 1)[1]
        children.setdefault(int(rest.split()[1]), []).append(int(entry.name))
    found, queue = [], [main_pid]
    while queue:
        pid = queue.pop(0)
        if pid in comms:
            found.append((pid, comms[pid]))
            queue.extend(sorted(children.get(pid, [])))
    return found


def pin(pid: int, cpus: set[int], main: set[int] | None = None, proc: Path = Path("/proc")) -> None:
    """Every thread of PID to CPUS, its main thread to MAIN where given (a thread gone
    meanwhile is skipped)."""
    for task in (proc / str(pid) / "task").iterdir():
        tid = int(task.name)
        try:
            os.sched_setaffinity(tid, main if main is not None and tid == pid else cpus)
        except (ProcessLookupError, FileNotFoundError):
            continue


def place(
    main_pid: int, frontend: set[int], engine: set[int] | None, workers: int, timeout: float
) -> str:
    """Wait for the workers, then place the front end and engine core; says what it did."""
    deadline = time.monotonic() + timeout
    while True:
        processes = tree(main_pid)
        if not processes:
            return f"process {main_pid} is gone: nothing placed"
        started = sum(comm.startswith(WORKER_PREFIX) for _, comm in processes)
        if started >= workers:
            break
        if time.monotonic() > deadline:
            return (
                f"{started} of {workers} worker(s) started within {timeout:g} s: the front "
                "end is left on every CPU of the unit"
            )
        time.sleep(0.5)
    placed = {"front end": [], "engine core": []}
    for pid, comm in processes:
        if comm.startswith(WORKER_PREFIX):
            continue
        if comm.startswith(ENGINE_PREFIX):
            if engine is not None:
                pin(pid, frontend, main=engine)
                placed["engine core"].append(pid)
            continue
        pin(pid, frontend)
        placed["front end"].append(pid)
    said = f"front end (pid {', '.join(map(str, placed['front end']))}) on CPUs {sorted(frontend)}"
    if placed["engine core"]:
        pids = ", ".join(map(str, placed["engine core"]))
        said += f"; engine core (pid {pids}) schedules on CPUs {sorted(engine or ())}"
    return said


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=int, required=True, help="the unit's main PID")
    parser.add_argument("--frontend", type=cpu_list, required=True, help="the front end's CPUs")
    parser.add_argument("--engine", type=cpu_list, help="the engine core's CPUs")
    parser.add_argument("--workers", type=int, default=1, help="workers to wait for")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for them")
    args = parser.parse_args(argv)
    try:
        said = place(args.pid, args.frontend, args.engine, args.workers, args.timeout)
    except OSError as error:
        said = f"nothing placed: {error}"
    print(f"socketwise: {said}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
