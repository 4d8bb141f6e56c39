"""The local lab: real systemd hosts as systemd-nspawn machines on loopback addresses.

Users without spare servers, CI and test scenarios need hosts that boot systemd, run sshd
and take Ansible over real SSH. One Debian rootfs is built with debootstrap once and cached;
each machine `labK` boots from its own copy of it and serves SSH on 127.0.0.(10+K).

The machines share the controller's network namespace, so every service in them must bind
to its own address; 127.0.0.1 stays the controller's.

Layout under `socketwise.common.paths.cache_dir()/lab`:

    rootfs-bookworm/    the cached rootfs (complete: it is renamed into place at the end)
    machines/labK/      each machine's copy; kept by `down`, deleted by `down --purge`
    consoles/labK.log   each machine's console output of its latest boot
    id_ed25519(.pub)    the lab SSH keypair, generated once
    state.json          what `up` started: written by `up`, removed by `down`
    lock                serialises `up` and `down`

What is running is read from /proc, not trusted from state.json: a crashed `up` or a
deleted state file must not hide a machine from `down`.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from socketwise.lab.common import (
    LabError,
    api_key_path,
    default_inventory_dir,
    key_path,
    lab_dir,
    lab_name,
    locked,
    machine_address,
    machine_index,
    machine_name,
    machines_dir,
    own_dir,
    require_root,
    run,
    say,
    scrape_token_path,
    state_path,
    write_atomically,
)
from socketwise.lab.nspawn import (
    KILL_TIMEOUT_S,
    NET_ADMIN_ARG,
    PROC_WRITABLE_ENV,
    container_inits,
    enter_cgroups,
    machine_cgroups,
    net_admin_granted,
    nspawn_processes,
    proc_is_writable,
    remove_kit_tables,
    remove_lab_cgroups,
    remove_nspawn_leftovers,
    remove_tree,
    systemd_is_pid1,
    unmount_under,
)
from socketwise.lab.rootfs import (
    BUILD_ID_FILE,
    build_rootfs,
    ensure_controller_packages,
    rootfs_build_id,
    rootfs_dir,
)

# 127.0.0.(10+K) must stay a valid last octet.
MAX_MACHINES = 244
BOOT_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
SSH_LISTEN_DROPIN = "etc/ssh/sshd_config.d/socketwise-lab.conf"
INVENTORY_FILE = "hosts.yml"


@dataclass
class Machine:
    """One lab machine as seen now: what `status` prints and `up` returns."""

    name: str
    address: str
    directory: Path
    console_log: Path
    pid: int | None = None
    running: bool = False
    # None when not running: the mode is chosen at boot, not stored in the copy.
    proc_writable: bool | None = None
    # Booted with CAP_NET_ADMIN (nftables); None when not running.
    net_admin: bool | None = None
    # What `systemctl is-system-running` answered when `up` saw it ready.
    system_state: str | None = None

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["directory"] = str(self.directory)
        data["console_log"] = str(self.console_log)
        data["identity_file"] = str(key_path())
        return data


# nspawn processes this Python process started: kept so that they are reaped once they
# exit (tests call up() and down() in one process), and never garbage collected early.
_children: dict[str, subprocess.Popen[bytes]] = {}


def _machine(name: str) -> Machine:
    return Machine(
        name=name,
        address=machine_address(name),
        directory=machines_dir() / name,
        console_log=own_dir() / "consoles" / f"{name}.log",
    )


def _reap_children() -> None:
    for name, child in list(_children.items()):
        if child.poll() is not None:
            del _children[name]


# --- state -------------------------------------------------------------------------------


def _read_state() -> dict[str, dict[str, object]]:
    try:
        return json.loads(state_path().read_text())["machines"]
    except FileNotFoundError:
        return {}
    except (ValueError, KeyError) as error:
        raise LabError(f"{state_path()} is damaged ({error}); run `socketwise lab down`") from None


def _write_state(machines: list[Machine]) -> None:
    document = {"machines": {machine.name: machine.to_json() for machine in machines}}
    write_atomically(state_path(), json.dumps(document, indent=2) + "\n")


# --- machines ----------------------------------------------------------------------------


def ensure_key() -> Path:
    key = key_path()
    if not (key.is_file() and key.with_suffix(".pub").is_file()):
        key.unlink(missing_ok=True)
        key.with_suffix(".pub").unlink(missing_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "socketwise-lab", "-f", str(key)])
    return key


def ensure_api_key() -> Path:
    """A random key for the lab's front doors, readable by root only, made once; and the
    scrape token of their metrics doors, another one."""
    for path in (api_key_path(), scrape_token_path()):
        if not path.is_file():
            write_atomically(path, secrets.token_urlsafe(32) + "\n", mode=0o600)
    return api_key_path()


def _prepare_machine(machine: Machine) -> None:
    """Make the machine's copy of the rootfs ready to boot.

    An existing copy made from the current rootfs is reused as it is, like a server that
    was powered off: what was deployed on it stays (`down --purge` starts afresh). A copy
    of an older rootfs, or an interrupted copy, is replaced.
    """
    directory = machine.directory
    build_id = rootfs_build_id()
    copy_id = None
    with contextlib.suppress(FileNotFoundError):
        copy_id = (directory / BUILD_ID_FILE).read_text().strip()
    if directory.is_dir() and copy_id != build_id:
        say(f"{machine.name}: its copy was made from another rootfs build; replacing it")
        remove_tree(directory)
    if not directory.is_dir():
        partial = directory.with_name(directory.name + ".partial")
        if partial.exists():
            remove_tree(partial)
        started = time.monotonic()
        directory.parent.mkdir(parents=True, exist_ok=True)
        run(["cp", "-a", str(rootfs_dir()), str(partial)])
        (partial / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
        # -f is a prefix: the keys land in the copy's /etc/ssh, distinct per machine.
        run(["ssh-keygen", "-A", "-f", str(partial)])
        partial.rename(directory)
        say(f"{machine.name}: copied the rootfs in {time.monotonic() - started:.1f} s")
    # Rewritten on every boot: cheap, and it repairs a copy someone edited.
    (directory / "etc/hostname").write_text(machine.name + "\n")
    (directory / "etc/hosts").write_text(
        f"127.0.0.1\tlocalhost\n{machine.address}\t{machine.name}\n"
        "::1\tlocalhost ip6-localhost ip6-loopback\n"
    )
    # The network is the controller's: sshd must not take port 22 on every address.
    (directory / SSH_LISTEN_DROPIN).write_text(
        f"# Written by socketwise lab: {machine.name} serves SSH on its own address only.\n"
        f"ListenAddress {machine.address}\n"
    )
    ssh_dir = directory / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    write_atomically(
        ssh_dir / "authorized_keys", key_path().with_suffix(".pub").read_text(), mode=0o600
    )


def _check_port_free(machine: Machine) -> None:
    """Fail before booting if something already holds the machine's SSH port: its sshd
    would not start, and SSH could even reach that other server instead."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((machine.address, 22))
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise
            raise LabError(
                f"{machine.name}: {machine.address}:22 is already in use on the controller "
                "(an sshd listening on 0.0.0.0:22 takes it too); free it or stop that server"
            ) from None


def _boot(machine: Machine, proc_writable: bool, net_admin: bool) -> None:
    env = dict(os.environ)
    env.pop(PROC_WRITABLE_ENV, None)
    if proc_writable:
        env[PROC_WRITABLE_ENV] = "1"
    # The lab needs no machined; where PID 1 is not systemd there is none to register with.
    argv = ["systemd-nspawn", "--register=no"]
    if net_admin:
        # nftables for the cluster role; the rules land in the controller's own namespace.
        argv.append(NET_ADMIN_ARG)
    preexec = None
    # Where PID 1 is systemd, nspawn asks it for a scope of its own per machine.
    if not systemd_is_pid1():
        # Elsewhere, --keep-unit nests nspawn's supervisor/payload cgroups in the caller's
        # cgroup, where all machines would share one /payload and one machine's systemd
        # could kill another's processes (seen as status=219/CGROUP on the second machine
        # to boot). So each nspawn enters a cgroup of its own machine before exec.
        argv.append("--keep-unit")
        cgroups = machine_cgroups(machine.name)
        for cgroup in cgroups:
            cgroup.mkdir(parents=True, exist_ok=True)
        preexec = functools.partial(enter_cgroups, cgroups)
    # The console goes to the log whether or not `up` runs in a terminal.
    argv += ["--console=read-only", "-M", machine.name, "-D", str(machine.directory), "-b"]
    machine.console_log.parent.mkdir(parents=True, exist_ok=True)
    with open(machine.console_log, "wb") as console:
        child = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=console,
            stderr=subprocess.STDOUT,
            env=env,
            # Its own session: Ctrl-C on `lab up` must not shoot the machines it started.
            start_new_session=True,
            preexec_fn=preexec,
        )
    _children[machine.name] = child
    machine.pid = child.pid
    machine.running = True
    machine.proc_writable = proc_writable
    machine.net_admin = net_admin


def ssh_command(machine: Machine, command: str) -> list[str]:
    """The argv that runs `command` as root on the machine, with the lab key only."""
    return [
        "ssh",
        "-F",
        "/dev/null",
        "-i",
        str(key_path()),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "LogLevel=ERROR",
        "-o",
        "ConnectTimeout=3",
        f"root@{machine.address}",
        command,
    ]


def _console_tail(machine: Machine, lines: int = 15) -> str:
    with contextlib.suppress(OSError):
        text = machine.console_log.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])
    return ""


def _wait_until_up(machine: Machine, deadline: float) -> str:
    """Wait until systemd in the machine says running or degraded; return which."""
    answer = "no answer yet"
    while True:
        # The child handle, not /proc: until exec its cmdline is still Python's.
        code = _children[machine.name].poll()
        if code is not None:
            raise LabError(
                f"{machine.name}: systemd-nspawn exited (code {code}) while booting; "
                f"console log {machine.console_log} ends with:\n{_console_tail(machine)}"
            )
        try:
            result = subprocess.run(
                ssh_command(machine, "systemctl is-system-running"),
                capture_output=True,
                text=True,
                timeout=15,
            )
            answer = result.stdout.strip() or result.stderr.strip() or answer
        except subprocess.TimeoutExpired:
            answer = "ssh timed out"
        if answer in ("running", "degraded"):
            return answer
        if answer in ("maintenance", "stopping"):
            raise LabError(
                f"{machine.name}: systemd reports {answer!r} instead of booting; "
                f"see its console log {machine.console_log}"
            )
        if time.monotonic() > deadline:
            raise LabError(
                f"{machine.name} ({machine.address}) was not running within "
                f"{BOOT_TIMEOUT_S:.0f} s (last answer: {answer}); see its console log "
                f"{machine.console_log}, and `socketwise lab down` to stop it"
            )
        time.sleep(0.5)


def _failed_units(machine: Machine) -> str:
    result = subprocess.run(
        ssh_command(machine, "systemctl --failed --no-legend --plain"),
        capture_output=True,
        text=True,
        timeout=15,
    )
    return " ".join(line.split()[0] for line in result.stdout.splitlines() if line.strip())


# --- inventory ---------------------------------------------------------------------------


def write_inventory(
    machines: list[Machine], inventory_dir: Path, loadgen: int = 0, frontdoor: int = 0
) -> Path:
    """Write `hosts.yml` with group `lab`; the last `loadgen` machines are also in the
    group `socketwise_loadgen` (they generate load and serve nothing), the `frontdoor`
    ones before them in `socketwise_frontdoor` (the fleet front door). Strings are
    JSON-quoted: valid YAML scalars."""
    lines = [
        "# Written by `socketwise lab up`; rewritten on every `up`. Do not edit.",
        "all:",
        "  children:",
        "    lab:",
        "      hosts:",
    ]
    for machine in machines:
        host_vars = {
            "ansible_host": machine.address,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(key_path()),
            "ansible_ssh_common_args": (
                "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
            ),
            "ansible_python_interpreter": "/usr/bin/python3",
            "socketwise_lab_proc_writable": bool(machine.proc_writable),
        }
        lines.append(f"        {machine.name}:")
        lines.extend(f"          {key}: {json.dumps(value)}" for key, value in host_vars.items())
    if loadgen:
        lines += ["    socketwise_loadgen:", "      hosts:"]
        lines += [f"        {machine.name}:" for machine in machines[-loadgen:]]
    if frontdoor:
        lines += ["    socketwise_frontdoor:", "      hosts:"]
        doors = machines[len(machines) - loadgen - frontdoor : len(machines) - loadgen]
        lines += [f"        {machine.name}:" for machine in doors]
    inventory_dir.mkdir(parents=True, exist_ok=True)
    path = inventory_dir / INVENTORY_FILE
    write_atomically(path, "\n".join(lines) + "\n")
    return path


# --- the public operations ---------------------------------------------------------------


def status() -> list[Machine]:
    """Every lab machine that runs, was started, or has a copy on disk, by name."""
    _reap_children()
    state = _read_state()
    nspawns = nspawn_processes()
    inits = container_inits()
    names = set(state) | set(nspawns) | set(inits)
    if machines_dir().is_dir():
        names |= {
            p.name for p in machines_dir().iterdir() if re.fullmatch(rf"{lab_name()}\d+", p.name)
        }
    machines = []
    for name in sorted(names, key=machine_index):
        machine = _machine(name)
        machine.pid = nspawns.get(name)
        machine.running = name in nspawns or name in inits
        if machine.pid is not None:
            machine.proc_writable = proc_is_writable(machine.pid)
            machine.net_admin = net_admin_granted(machine.pid)
            recorded = state.get(name, {})
            system_state = recorded.get("system_state")
            if recorded.get("pid") == machine.pid and isinstance(system_state, str):
                machine.system_state = system_state
        machines.append(machine)
    return machines


def up(
    machines: int = 1,
    readonly_proc: bool = False,
    inventory_dir: Path | None = None,
    loadgen: int = 0,
    frontdoor: int = 0,
    net_admin: bool = False,
) -> list[Machine]:
    """Make lab1..lab`machines` run, write the inventory, return the running machines.

    The last `loadgen` of the running machines go into the group socketwise_loadgen, the
    `frontdoor` before them into socketwise_frontdoor.

    Machines already running are left as they are, including their /proc mode and
    capabilities: `readonly_proc` and `net_admin` (CAP_NET_ADMIN, which the cluster role's
    nftables table needs) apply to the machines this call boots. Machines beyond `machines`
    that are running keep running (only `down` stops machines) and stay in the inventory.
    """
    if not 1 <= machines <= MAX_MACHINES:
        raise LabError(f"--machines must be between 1 and {MAX_MACHINES}, not {machines}")
    if loadgen < 0 or frontdoor < 0 or loadgen + frontdoor >= machines:
        raise LabError(
            f"--loadgen {loadgen} --frontdoor {frontdoor}: they must leave at least one of "
            f"the {machines} machine(s) to serve; raise --machines or lower them"
        )
    require_root()
    with locked():
        current = {machine.name: machine for machine in status()}
        orphans = [m.name for m in current.values() if m.running and m.pid is None]
        if orphans:
            raise LabError(
                f"{', '.join(orphans)} still running without their systemd-nspawn; "
                "run `socketwise lab down` first"
            )
        ensure_api_key()
        wanted = [machine_name(index) for index in range(1, machines + 1)]
        to_boot = [current.get(name) or _machine(name) for name in wanted]
        to_boot = [machine for machine in to_boot if not machine.running]
        for machine in current.values():
            if machine.running and machine.name in wanted:
                mode = "writable" if machine.proc_writable else "read-only"
                say(f"{machine.name} ({machine.address}) already running, /proc/sys {mode}")
                if machine.proc_writable != (not readonly_proc):
                    say(f"{machine.name}: the /proc mode is set at boot; `lab down` to change it")
                if machine.net_admin != net_admin:
                    say(f"{machine.name}: CAP_NET_ADMIN is set at boot; `lab down` to change it")
        if to_boot:
            for machine in to_boot:
                _check_port_free(machine)
            ensure_controller_packages()
            build_rootfs()
            ensure_key()
            for machine in to_boot:
                _prepare_machine(machine)
            # Boot all, then wait for all: the machines come up in parallel.
            started = time.monotonic()
            for machine in to_boot:
                _boot(machine, proc_writable=not readonly_proc, net_admin=net_admin)
                current[machine.name] = machine
            try:
                for machine in to_boot:
                    machine.system_state = _wait_until_up(machine, started + BOOT_TIMEOUT_S)
                    mode = "writable" if machine.proc_writable else "read-only"
                    detail = f"{machine.system_state} after {time.monotonic() - started:.1f} s"
                    if machine.system_state == "degraded":
                        detail += f" (failed units: {_failed_units(machine) or 'none listed'})"
                    say(f"{machine.name} ({machine.address}) {detail}, /proc/sys {mode}")
            finally:
                # Even a failed boot is recorded: `down` must know what was started.
                _write_state([m for m in current.values() if m.running])
        running = [machine for machine in current.values() if machine.running]
        running.sort(key=lambda machine: machine_index(machine.name))
        inventory = write_inventory(
            running, inventory_dir or default_inventory_dir(), loadgen, frontdoor
        )
        say(f"inventory {inventory}")
        return running


def _wait_gone(names: set[str], started: float, timeout: float) -> set[str]:
    """Wait until none of the machines runs; say when each stops; return those still up."""
    alive = set(names)
    deadline = time.monotonic() + timeout
    while alive:
        _reap_children()
        stopped = alive - (set(nspawn_processes()) | set(container_inits()))
        for name in sorted(stopped, key=machine_index):
            say(f"{name} stopped after {time.monotonic() - started:.1f} s")
        alive -= stopped
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return alive


def down(purge: bool = False) -> None:
    """Stop every lab machine, leave no process or mount behind, keep the rootfs cache.

    SIGTERM to systemd-nspawn -b makes it send SIGRTMIN+3 to the container's systemd:
    an orderly poweroff (units stopped, file systems unmounted), after which nspawn exits.
    Unlike `poweroff` over SSH it works when sshd or the key is broken. SIGKILL is the
    last resort and must hit the container's PID 1 too: killing nspawn alone leaves the
    container running.
    """
    require_root()
    with locked():
        started = time.monotonic()
        nspawns = nspawn_processes()
        inits = container_inits()
        for pid in nspawns.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for name, pid in inits.items():
            if name not in nspawns:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGRTMIN + 3)
        names = set(nspawns) | set(inits)
        alive = _wait_gone(names, started, STOP_TIMEOUT_S)
        if alive:
            say(f"{', '.join(sorted(alive))} did not power off in {STOP_TIMEOUT_S:.0f} s: killing")
            for pid in [*container_inits().values(), *nspawn_processes().values()]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            alive = _wait_gone(alive, started, KILL_TIMEOUT_S)
            if alive:
                raise LabError(f"{', '.join(sorted(alive))} still running after SIGKILL")
        # The nspawns this process started are dead by now; collect their exit status.
        for name in list(_children):
            _children.pop(name).wait(timeout=KILL_TIMEOUT_S)
        for leftover in unmount_under(lab_dir()):
            say(f"unmounted leftover {leftover}")
        remove_nspawn_leftovers()
        for table in remove_kit_tables(lab_name()):
            say(f"removed the nftables table {table}, which a machine left in the shared network")
        remove_lab_cgroups()
        state_path().unlink(missing_ok=True)
        if purge and machines_dir().exists():
            remove_tree(machines_dir())
            say(f"removed the machine copies in {machines_dir()}")
        say("lab is down")
