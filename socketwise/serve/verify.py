"""What really runs on a host, checked against the plan: CPU affinity and port owners,
and which vLLM platform and kernel library the server really loaded.

Stdlib only: shipped to hosts as the role's module_utils package (roles/vllm_service),
and read by pytest directly. Everything reads /proc under a configurable root.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..facts.files import parse_cpulist
from .frontend import ENGINE_PREFIX, WORKER_PREFIX, tree

# vLLM's x86 kernel libraries: it loads one at run time, by what the CPU can do.
KERNEL_LIBRARIES = ("_C", "_C_AVX512", "_C_AVX2")
# Allocators and OpenMP runtimes: which ones really serve shows whether preloads took.
RUNTIME_LIBRARIES = ("libtcmalloc", "libjemalloc", "libiomp5", "libgomp")
_LISTEN = "0A"
# CAP_NET_ADMIN's bit in a process's capability sets.
_CAP_NET_ADMIN = 12


def _status_field(path: Path, field: str) -> str:
    for line in path.read_text().splitlines():
        if line.startswith(field + ":"):
            return line.split(":", 1)[1].strip()
    return ""


def holds_net_admin(proc: Path = Path("/proc")) -> bool:
    """Whether this process holds CAP_NET_ADMIN: as root, whether systemd here can give a
    unit a network namespace of its own with its loopback up (a container may withhold it)."""
    effective = _status_field(proc / "self/status", "CapEff")
    return bool(effective) and bool(int(effective, 16) >> _CAP_NET_ADMIN & 1)


def process_tree(main_pid: int, proc: Path = Path("/proc")) -> list[int]:
    """`main_pid` and every descendant, parents before children."""
    return [pid for pid, _ in tree(main_pid, proc)]


def describe(pid: int, proc: Path = Path("/proc")) -> dict | None:
    """Name, title, process affinity and the CPUs its threads are allowed (None if gone)."""
    base = proc / str(pid)
    try:
        comm = (base / "comm").read_text().strip()
        title = (base / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        allowed = parse_cpulist(_status_field(base / "status", "Cpus_allowed_list"))
        thread_cpus: set[int] = set()
        for task in (base / "task").iterdir():
            thread_cpus |= set(parse_cpulist(_status_field(task / "status", "Cpus_allowed_list")))
    except OSError:
        return None
    return {
        "pid": pid,
        "comm": comm,
        "title": title,
        "cpus_allowed": allowed,
        "thread_cpus": sorted(thread_cpus),
    }


def mapped_libraries(pid: int, proc: Path = Path("/proc")) -> set[str]:
    """Paths of the shared libraries mapped into PID (empty if it is gone)."""
    try:
        lines = (proc / str(pid) / "maps").read_text().splitlines()
    except OSError:
        return set()
    paths = {line.split(maxsplit=5)[5] for line in lines if len(line.split(maxsplit=5)) == 6}
    return {path for path in paths if ".so" in Path(path).name}


def runtime(pids: list[int], proc: Path = Path("/proc")) -> dict:
    """{"platform", "kernels", "runtime_libraries"} of a vLLM service, from what its
    processes map.

    vLLM imports zentorch only while choosing its platform, and keeps it only when it
    chose ZenCpuPlatform: zentorch mapped in a process means that platform runs.
    `kernels` names the kernel libraries loaded (one, when the server is up);
    `runtime_libraries` the allocators and OpenMP runtimes mapped (file names).
    """
    libraries = set().union(*(mapped_libraries(pid, proc) for pid in pids))
    names = {Path(path).name: path for path in libraries}
    kernels = sorted(k for k in KERNEL_LIBRARIES if f"{k}.abi3.so" in names)
    zen = any("/zentorch/" in path for path in libraries)
    allocators_and_openmp = sorted(n for n in names if n.startswith(RUNTIME_LIBRARIES))
    return {
        "platform": "ZenCpuPlatform" if zen else "CpuPlatform",
        "kernels": kernels,
        "runtime_libraries": allocators_and_openmp,
    }


def missing_preloads(name: str, preload: list[str], loaded: dict) -> list[str]:
    """One problem per LD_PRELOAD library the instance's processes do not map.

    The loader ignores a preload it cannot open with no more than a line on stderr;
    maps name the real file behind a symlink (libtcmalloc_minimal.so.4 -> .so.4.5.9).
    """
    return [
        f"{name}: {path} is in LD_PRELOAD but no process of the service loaded it"
        for path in preload
        if not any(lib.startswith(Path(path).name) for lib in loaded["runtime_libraries"])
    ]


def check_instance(instance: dict, processes: list[dict]) -> list[str]:
    """Problems between a planned instance and its processes; empty when they agree.

    Each rank must be served by exactly one worker whose threads run on exactly the
    rank's CPUs, the front end and engine core where the plan keeps them, and no
    process of the service may run outside `cpus_allowed`.
    """
    problems = []
    name = instance["name"]
    workers = [p for p in processes if p["comm"].startswith(WORKER_PREFIX)]
    ranks = [sorted(rank["cpus"]) for rank in instance["ranks"]]
    if len(workers) != len(ranks):
        problems.append(f"{name}: {len(workers)} vLLM worker process(es), plan has {len(ranks)}")
    unmatched = list(ranks)
    for worker in workers:
        if worker["thread_cpus"] in unmatched:
            unmatched.remove(worker["thread_cpus"])
        else:
            problems.append(
                f"{name}: worker {worker['pid']} ({worker['title']}) threads run on CPUs "
                f"{worker['thread_cpus']}, plan's ranks: {ranks}"
            )
    problems += _front_end_problems(instance, processes)
    allowed = set(instance["cpus_allowed"])
    for process in processes:
        outside = sorted(set(process["cpus_allowed"]) - allowed)
        if outside:
            problems.append(
                f"{name}: process {process['pid']} ({process['title']}) may run on CPUs "
                f"{outside} outside the planned {sorted(allowed)}"
            )
    return problems


def _front_end_problems(instance: dict, processes: list[dict]) -> list[str]:
    """Where the plan keeps CPUs for the front end (`frontend_cpus`), the API server's
    threads and its other processes' run on them, and an engine core's main thread on
    `engine_cpus` (frontend.py placed them when the unit started)."""
    frontend = sorted(instance.get("frontend_cpus") or [])
    engine = sorted(instance.get("engine_cpus") or [])
    if not frontend:
        return []
    problems = []
    for process in processes:
        if process["comm"].startswith(WORKER_PREFIX):
            continue
        if process["comm"].startswith(ENGINE_PREFIX):
            if engine and process["cpus_allowed"] != engine:
                problems.append(
                    f"{instance['name']}: engine core process {process['pid']} "
                    f"({process['title']}) schedules on CPUs {process['cpus_allowed']}, "
                    f"planned {engine}"
                )
        elif process["thread_cpus"] != frontend:
            problems.append(
                f"{instance['name']}: front end process {process['pid']} ({process['title']}) "
                f"runs on CPUs {process['thread_cpus']}, planned {frontend}"
            )
    return problems


def check_pinned(name: str, processes: list[dict], cpus: list[int]) -> list[str]:
    """Problems between a unit planned on exactly CPUS (a llama.cpp server, which runs one
    process) and its processes: every process and thread must be allowed those CPUs, no
    more and no fewer."""
    if not processes:
        return [f"{name}: no process runs"]
    planned = sorted(cpus)
    return [
        f"{name}: process {p['pid']} ({p['title']}) runs on CPUs {p['thread_cpus']}, "
        f"planned {planned}"
        for p in processes
        if p["thread_cpus"] != planned or sorted(p["cpus_allowed"]) != planned
    ]


def _hex_address(text: str) -> str:
    """/proc/net/tcp's little-endian hex IPv4 address -> dotted quad."""
    return ".".join(str(b) for b in reversed(bytes.fromhex(text)))


def listeners(proc: Path = Path("/proc")) -> list[dict]:
    """Listening IPv4/IPv6 TCP sockets: address, port and owner PID (None if not visible)."""
    owners: dict[str, int] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    owners[target[8:-1]] = int(entry.name)
        except OSError:
            continue
    found = []
    for table, v6 in (("tcp", False), ("tcp6", True)):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != _LISTEN:
                continue
            address, port = fields[1].split(":")
            if v6:
                address = "::" if set(address) == {"0"} else "v6:" + address
            else:
                address = _hex_address(address)
            found.append({"address": address, "port": int(port, 16), "pid": owners.get(fields[9])})
    return found


def port_clashes(
    address: str, ports: list[int], own_pids: set[int], proc: Path = Path("/proc")
) -> list[dict]:
    """Listeners on `ports` that would stop a server binding `address` and are not ours.

    A wildcard listener clashes with any address and vice versa; a listener whose
    owner is not visible (another container sharing the network) still clashes.
    """
    wildcard = ("0.0.0.0", "::")
    clashes = []
    for sock in listeners(proc):
        if sock["port"] not in ports or sock["pid"] in own_pids:
            continue
        if address in wildcard or sock["address"] in wildcard or sock["address"] == address:
            owner = describe(sock["pid"], proc) if sock["pid"] else None
            clashes.append({**sock, "owner": owner["title"] if owner else "unknown"})
    return clashes
