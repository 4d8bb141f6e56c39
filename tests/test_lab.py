"""End to end: `socketwise lab` boots real systemd machines that Ansible reaches over SSH.

Slow and root-only: it boots systemd-nspawn machines (and builds the cached rootfs with
debootstrap on the first run, about a minute). Select it with `-m lab`, skip it with
`-m "not lab"`. It reads /proc/sys permissions but never writes a kernel value: the
machines share the controller's kernel.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from socketwise.common import paths
from socketwise.lab import command as lab_command
from socketwise.lab import machines as lab

pytestmark = pytest.mark.lab

# The ansible of the venv that runs the tests: the pinned controller tools.
ANSIBLE_BIN = Path(sys.executable).parent
INVENTORY = paths.repo_root() / "inventories" / "lab"
UNUSED_LAB_ADDRESS = lab.machine_address(lab.machine_name(3))


class Stages:
    """Times each stage of the test and prints it, so slow steps show up in CI logs."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        yield
        self.seconds[name] = time.monotonic() - started
        print(f"[lab stage] {name}: {self.seconds[name]:.1f} s", flush=True)


@pytest.fixture
def stages() -> Iterator[Stages]:
    timings = Stages()
    yield timings
    print("[lab stages] " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.seconds.items()))


@pytest.fixture
def lab_owned() -> Iterator[None]:
    """The test owns the lab: it refuses to take over a running one, and always tears down."""
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    running = [machine.name for machine in lab.status() if machine.running]
    if running:
        pytest.fail(f"a lab is already running ({', '.join(running)}): `socketwise lab down` first")
    try:
        yield
    finally:
        lab.down()


def on_machine(machine: lab.Machine, command: str) -> str:
    result = subprocess.run(
        lab.ssh_command(machine, command), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"{machine.name}: {command!r} failed: {result.stderr}"
    return result.stdout.strip()


def ansible_json(*args: str) -> dict[str, dict[str, object]]:
    """Run ad-hoc ansible against the lab inventory; return each host's result."""
    env = dict(
        os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json"
    )
    result = subprocess.run(
        [str(ANSIBLE_BIN / "ansible"), "-i", str(INVENTORY), "lab", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=paths.repo_root(),
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)["plays"][0]["tasks"][0]["hosts"]


def lab_processes() -> list[str]:
    """Command lines of every systemd-nspawn process running a lab machine."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            if "systemd-nspawn" in cmdline and str(lab.machines_dir()) in cmdline:
                found.append(cmdline)
    return found


def lab_mounts() -> list[str]:
    mountinfo = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line for line in mountinfo if str(lab.lab_dir()) in line]


def lab_status_cli() -> list[dict[str, object]]:
    """`socketwise lab status` through the subcommand's own parser."""
    parser = argparse.ArgumentParser(prog="socketwise")
    lab_command.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["lab", "status"])
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        assert args.func(args) == 0
    return json.loads(output.getvalue())


def test_lab_boots_machines_that_ansible_reaches(lab_owned: None, stages: Stages) -> None:
    with stages("up lab1 (builds the rootfs if not cached)"):
        first = lab.up(machines=1)
    build_id = lab.rootfs_build_id()
    assert build_id
    assert [machine.name for machine in first] == ["lab1"]

    with stages("up lab2 with --readonly-proc (adds a machine)"):
        machines = lab.up(machines=2, readonly_proc=True)
    lab1, lab2 = machines
    assert lab.rootfs_build_id() == build_id, "the rootfs was rebuilt"
    assert lab1.pid == first[0].pid, "lab1 was restarted"
    assert (lab1.proc_writable, lab2.proc_writable) == (True, False)
    assert {lab1.system_state, lab2.system_state} <= {"running", "degraded"}

    with stages("up again with the same N (no-op)"):
        again = lab.up(machines=2)
    assert [(m.name, m.pid) for m in again] == [(m.name, m.pid) for m in machines]

    reported = {entry["name"]: entry for entry in lab_status_cli()}
    assert reported["lab1"]["running"] and reported["lab2"]["running"]
    assert reported["lab2"]["address"] == "127.0.0.12"

    with stages("ansible-inventory --list"):
        inventory = subprocess.run(
            [str(ANSIBLE_BIN / "ansible-inventory"), "-i", str(INVENTORY), "--list"],
            capture_output=True,
            text=True,
            check=True,
        )
    hostvars = json.loads(inventory.stdout)["_meta"]["hostvars"]
    assert hostvars["lab1"]["ansible_host"] == "127.0.0.11"
    assert hostvars["lab2"]["ansible_host"] == "127.0.0.12"
    assert hostvars["lab1"]["socketwise_lab_proc_writable"] is True
    assert hostvars["lab2"]["socketwise_lab_proc_writable"] is False

    with stages("ansible -m ping"):
        pings = ansible_json("-m", "ping")
    assert {name: result["ping"] for name, result in pings.items()} == {
        "lab1": "pong",
        "lab2": "pong",
    }

    with stages("ansible -m setup (service manager, hostname)"):
        facts = ansible_json("-m", "setup", "-a", "filter=ansible_service_mgr,ansible_hostname")
    for name in ("lab1", "lab2"):
        host_facts = facts[name]["ansible_facts"]
        assert host_facts == {"ansible_service_mgr": "systemd", "ansible_hostname": name}

    with stages("addresses, identities, /proc/sys, apt"):
        for machine in machines:
            # Its address reaches it, and its sshd holds no other address. The network is
            # shared, so ss lists every machine's port 22; only its own show a process.
            assert on_machine(machine, "hostname") == machine.name
            listeners = on_machine(machine, "ss -Hltnp 'sport = :22'").splitlines()
            own = [line.split()[3] for line in listeners if '"sshd"' in line]
            assert own == [f"{machine.address}:22"]
        with pytest.raises(ConnectionRefusedError), socket.socket() as probe:
            probe.connect((UNUSED_LAB_ADDRESS, 22))

        identities = [
            on_machine(m, "cat /etc/machine-id /etc/ssh/ssh_host_ed25519_key.pub") for m in machines
        ]
        assert identities[0] != identities[1], "the machines share machine-id or host keys"

        # access() reports EROFS for a read-only mount without writing the kernel value.
        probe_proc = (
            "python3 -c 'import os; print(os.access(\"/proc/sys/vm/nr_hugepages\", os.W_OK))'"
        )
        assert on_machine(lab1, probe_proc) == "True"
        assert on_machine(lab2, probe_proc) == "False"

        # The controller's apt sources came along: packages can be installed inside.
        on_machine(lab1, "apt-get install --simulate --yes hwloc")

    with stages("down"):
        lab.down()
    assert lab_processes() == []
    assert lab_mounts() == []
    assert not lab.state_path().exists()
    assert lab.rootfs_dir().is_dir(), "down must keep the rootfs cache"
    assert (lab.machines_dir() / "lab1").is_dir(), "down without --purge keeps the copies"

    with stages("up lab1 again (reuses its copy)"):
        (lab1_again,) = lab.up(machines=1)
    assert on_machine(lab1_again, "cat /etc/machine-id") == identities[0].splitlines()[0]
    assert lab.rootfs_build_id() == build_id

    with stages("down --purge"):
        lab.down(purge=True)
    assert lab_processes() == []
    assert lab_mounts() == []
    assert not lab.machines_dir().exists()
    assert lab.rootfs_dir().is_dir(), "--purge must keep the rootfs cache"
