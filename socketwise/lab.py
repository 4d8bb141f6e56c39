"""The local lab: real systemd hosts as systemd-nspawn machines on loopback addresses.

Users without spare servers, CI and test scenarios need hosts that boot systemd, run sshd
and take Ansible over real SSH. One Debian rootfs is built with debootstrap once and cached;
each machine `labK` boots from its own copy of it and serves SSH on 127.0.0.(10+K).

The machines share the controller's network namespace, so every service in them must bind
to its own address; 127.0.0.1 stays the controller's.

Layout under `socketwise.paths.cache_dir()/lab`:

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

import argparse
import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from socketwise import paths

SUITE = "bookworm"
# What roles later expect on a target, so that no lab run depends on installing it first.
ROOTFS_PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "python3",
    "python3-venv",
    "openssh-server",
    "iproute2",
    "numactl",
    "procps",
    "ca-certificates",
    "haproxy",
    "curl",
    # vLLM's CPU backend compiles its kernels with torch inductor when it starts.
    "g++",
    "python3-dev",
)
# Debian packages the controller needs: systemd-nspawn, debootstrap, ssh and ssh-keygen.
CONTROLLER_PACKAGES = ("systemd-container", "debootstrap", "openssh-client")
HOST_APT_SOURCES = (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list"))
# 127.0.0.(10+K) must stay a valid last octet.
MAX_MACHINES = 244
BOOT_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
KILL_TIMEOUT_S = 10.0
# Written into the rootfs when its build completes; every machine copy carries it, so a
# copy made from an older rootfs is recognisable after the cache was rebuilt.
BUILD_ID_FILE = "etc/socketwise-lab-build"
SSH_LISTEN_DROPIN = "etc/ssh/sshd_config.d/socketwise-lab.conf"
PROC_WRITABLE_ENV = "SYSTEMD_NSPAWN_API_VFS_WRITABLE"
# Several labs can run side by side (say, one per test suite): SOCKETWISE_LAB names
# the lab, its machines (NAME1, NAME2, ...), their directory, cgroup and inventory.
DEFAULT_LAB = "lab"
# Where nspawn keeps per-machine bookkeeping on the controller.
NSPAWN_RUN_DIR = Path("/run/systemd/nspawn")
INVENTORY_FILE = "hosts.yml"
# Any of these in a failed `apt-get install` means the package lists are missing or stale.
MISSING_LISTS_MARKERS = (
    "Unable to locate package",
    "has no installation candidate",
    "Failed to fetch",
)


class LabError(RuntimeError):
    """A lab operation failed; the message names the machine and what to look at."""


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


# --- where things live -------------------------------------------------------------------


def lab_dir() -> Path:
    return paths.cache_dir().absolute() / "lab"


def rootfs_dir() -> Path:
    # Named by its recipe: a changed package list builds a new rootfs instead of reusing
    # one that lacks a package (machine copies of the old one are then replaced).
    recipe = hashlib.sha1(",".join(ROOTFS_PACKAGES).encode()).hexdigest()[:8]
    return lab_dir() / f"rootfs-{SUITE}-{recipe}"


def lab_name() -> str:
    name = os.environ.get("SOCKETWISE_LAB", DEFAULT_LAB)
    if not re.fullmatch(r"[a-z][a-z-]{0,15}", name):
        raise LabError(f"SOCKETWISE_LAB={name!r}: use 1-16 lower-case letters or dashes")
    return name


def _own_dir() -> Path:
    """This lab's machines, state and consoles; the rootfs and SSH key are shared."""
    name = lab_name()
    return lab_dir() if name == DEFAULT_LAB else lab_dir() / "labs" / name


def machines_dir() -> Path:
    return _own_dir() / "machines"


def key_path() -> Path:
    return lab_dir() / "id_ed25519"


def state_path() -> Path:
    return _own_dir() / "state.json"


def default_inventory_dir() -> Path:
    name = lab_name()
    return paths.repo_root() / "inventories" / ("lab" if name == DEFAULT_LAB else f"lab-{name}")


def machine_name(index: int) -> str:
    return f"{lab_name()}{index}"


def machine_index(name: str) -> int:
    match = re.fullmatch(rf"{lab_name()}([1-9][0-9]*)", name)
    if match is None:
        raise LabError(f"{name!r} is not a machine of lab {lab_name()!r} ({machine_name(1)}, ...)")
    return int(match.group(1))


def machine_address(name: str) -> str:
    # The default lab uses 127.0.0.x; another lab gets its own 127.0.N.x, N from its name.
    lab = lab_name()
    subnet = 0 if lab == DEFAULT_LAB else 1 + zlib.crc32(lab.encode()) % 254
    return f"127.0.{subnet}.{10 + machine_index(name)}"


def _lab_cgroup() -> str:
    """The cgroup, below the caller's, that holds one cgroup per machine."""
    return f"socketwise-{lab_name()}"


def _machine(name: str) -> Machine:
    return Machine(
        name=name,
        address=machine_address(name),
        directory=machines_dir() / name,
        console_log=_own_dir() / "consoles" / f"{name}.log",
    )


# --- small helpers -----------------------------------------------------------------------


def _say(message: str) -> None:
    print(f"lab: {message}", flush=True)


def _run(
    argv: list[str], *, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, env=env)
    if check and result.returncode != 0:
        output = (result.stdout + result.stderr).strip()
        raise LabError(f"`{' '.join(argv)}` failed with exit code {result.returncode}:\n{output}")
    return result


def _write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    partial.chmod(mode)
    partial.replace(path)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """Serialise up/down: two of them racing would boot one machine twice."""
    lab_dir().mkdir(parents=True, exist_ok=True)
    with open(lab_dir() / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (systemd-nspawn, debootstrap, mounts): run it as root")


# --- controller packages -----------------------------------------------------------------


def _dpkg_installed(package: str) -> bool:
    result = _run(["dpkg-query", "-W", "-f=${db:Status-Status}", package], check=False)
    return result.stdout.strip() == "installed"


def ensure_controller_packages() -> None:
    missing = [package for package in CONTROLLER_PACKAGES if not _dpkg_installed(package)]
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise LabError(f"the lab needs the Debian packages {', '.join(missing)} and apt-get")
    _say(f"installing {' '.join(missing)} on the controller")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # --no-install-recommends: systemd-container recommends libnss-mymachines, which edits
    # the controller's nsswitch.conf; the lab does not need it.
    install = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
    result = _run(install, check=False, env=env)
    output = result.stdout + result.stderr
    if result.returncode != 0 and any(marker in output for marker in MISSING_LISTS_MARKERS):
        _say("package lists are missing or stale: running apt-get update once")
        _run(["apt-get", "update"], env=env)
        result = _run(install, check=False, env=env)
        output = result.stdout + result.stderr
    if result.returncode != 0:
        raise LabError(f"could not install {' '.join(missing)} on the controller:\n{output}")


# --- apt sources and mirror --------------------------------------------------------------


def _deb822_stanzas(text: str) -> list[dict[str, str]]:
    stanzas: list[dict[str, str]] = []
    fields: dict[str, str] = {}
    last = ""
    for line in [*text.splitlines(), ""]:
        if line.startswith("#"):
            continue
        if not line.strip():
            if fields:
                stanzas.append(fields)
            fields, last = {}, ""
        elif line[0].isspace() and last:
            fields[last] += " " + line.strip()
        elif ":" in line:
            last, _, value = line.partition(":")
            last = last.strip().lower()
            fields[last] = value.strip()
    return stanzas


def _mirror_in(source: Path, suite: str) -> str | None:
    text = source.read_text()
    if source.suffix == ".sources":
        for stanza in _deb822_stanzas(text):
            if stanza.get("enabled", "yes").lower() == "no":
                continue
            if (
                "deb" in stanza.get("types", "").split()
                and suite in stanza.get("suites", "").split()
            ):
                return stanza["uris"].split()[0]
        return None
    for line in text.splitlines():
        words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
        if len(words) >= 3 and words[0] == "deb" and words[2] == suite:
            return words[1]
    return None


def host_apt_source(suite: str = SUITE) -> tuple[Path, str]:
    """The controller's apt source file that serves `suite`, and its mirror URI."""
    for source in HOST_APT_SOURCES:
        if source.is_file():
            mirror = _mirror_in(source, suite)
            if mirror:
                return source, mirror
    names = " or ".join(str(source) for source in HOST_APT_SOURCES)
    raise LabError(f"no 'deb' entry for {suite} in {names}: cannot tell debootstrap a mirror")


# --- mounts and processes ----------------------------------------------------------------


def _mounts_under(directory: Path) -> list[Path]:
    """Mount points at or below `directory` in our mount namespace, deepest first."""
    prefix = str(directory)
    found = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            # Field 5 is the mount point, with space, tab, newline, backslash octal-escaped.
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
            if point == prefix or point.startswith(prefix + "/"):
                found.append(Path(point))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def _unmount_under(directory: Path) -> list[Path]:
    """Unmount what is left below `directory` (debootstrap's /proc after an interrupted
    build, a machine's mounts if its nspawn died); return what was unmounted."""
    leftovers = _mounts_under(directory)
    for point in leftovers:
        if _run(["umount", str(point)], check=False).returncode != 0:
            # Busy: detach it now; the kernel frees it when its last user goes.
            _run(["umount", "--lazy", str(point)])
    remaining = _mounts_under(directory)
    if remaining:
        raise LabError(f"mounts remain under {directory}: {', '.join(map(str, remaining))}")
    return leftovers


def _remove_tree(directory: Path) -> None:
    # Never let rmtree walk into a mounted /proc or /sys of an interrupted build.
    _unmount_under(directory)
    shutil.rmtree(directory, ignore_errors=False)


def _proc_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    # A zombie has an empty cmdline: it is not running any more.
    return raw.decode(errors="replace").split("\0")[:-1]


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _nspawn_processes() -> dict[str, int]:
    """Lab machine name -> PID of the systemd-nspawn process running it."""
    found = {}
    for pid in _pids():
        argv = _proc_cmdline(pid)
        if not argv or Path(argv[0]).name != "systemd-nspawn" or "-D" not in argv[:-1]:
            continue
        directory = Path(argv[argv.index("-D") + 1])
        if directory.parent == machines_dir():
            found[directory.name] = pid
    return found


def _container_inits() -> dict[str, int]:
    """Lab machine name -> PID of the container's PID 1, found by its root directory.

    Needed because killing systemd-nspawn does not stop the container: its PID 1 is then
    re-parented and keeps running, so `down` must also find machines whose nspawn died.
    """
    if not machines_dir().is_dir():
        return {}
    roots = {}
    for directory in machines_dir().iterdir():
        with contextlib.suppress(OSError):
            info = directory.stat()
            roots[(info.st_dev, info.st_ino)] = directory.name
    found = {}
    for pid in _pids():
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            info = os.stat(f"/proc/{pid}/root")
        except OSError:
            continue
        nspids = re.search(r"^NSpid:\s+(.*)$", status, re.MULTILINE)
        # PID 1 of a nested PID namespace: NSpid lists the host PID first, then 1.
        if nspids and nspids.group(1).split()[1:] == ["1"]:
            name = roots.get((info.st_dev, info.st_ino))
            if name:
                found[name] = pid
    return found


def _systemd_is_pid1() -> bool:
    # The check sd_booted() makes.
    return Path("/run/systemd/system").is_dir()


def _lab_cgroups() -> list[Path]:
    """The lab's cgroup below ours in each hierarchy nspawn uses: cgroup2 and, on a
    hybrid host like this one, the named v1 hierarchy `name=systemd`."""
    own = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, cgroup_path = line.split(":", 2)
        if controllers in ("", "name=systemd"):
            own[controllers] = cgroup_path
    found = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            fields = line.split()
            separator = fields.index("-")
            fstype, super_options = fields[separator + 1], fields[separator + 3].split(",")
            if fstype == "cgroup2":
                controllers = ""
            elif fstype == "cgroup" and "name=systemd" in super_options:
                controllers = "name=systemd"
            else:
                continue
            if controllers in own:
                mount_root, mount_point = fields[3], Path(fields[4])
                inside = os.path.relpath(own.pop(controllers), mount_root)
                found.append((mount_point / inside).resolve() / _lab_cgroup())
    return found


def _machine_cgroups(name: str) -> list[Path]:
    return [cgroup / name for cgroup in _lab_cgroups()]


def _enter_cgroups(cgroups: list[Path]) -> None:
    # Runs in the child between fork and exec: "0" moves the writing process.
    for cgroup in cgroups:
        (cgroup / "cgroup.procs").write_text("0")


def _remove_lab_cgroups() -> None:
    """Remove the lab's cgroups, which must empty once every machine has stopped.

    A killed container's processes take a moment to leave their cgroups after its PID 1
    is gone from /proc, hence the bounded retry.
    """
    deadline = time.monotonic() + KILL_TIMEOUT_S
    for cgroup in _lab_cgroups():
        if not cgroup.is_dir():
            continue
        for directory, _, _ in os.walk(cgroup, topdown=False):
            while True:
                try:
                    os.rmdir(directory)
                    break
                except OSError as error:
                    if error.errno != errno.EBUSY or time.monotonic() > deadline:
                        procs = (Path(directory) / "cgroup.procs").read_text().split()
                        raise LabError(
                            f"cannot remove the lab cgroup {directory} ({error.strerror}): "
                            f"processes {' '.join(procs) or 'none'} still in it"
                        ) from None
                    time.sleep(0.2)


def _proc_writable(nspawn_pid: int) -> bool | None:
    try:
        environ = Path(f"/proc/{nspawn_pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return f"{PROC_WRITABLE_ENV}=1".encode() in environ


def _remove_nspawn_leftovers() -> None:
    """An nspawn that was killed leaves its propagation directory and its image lock in
    /run/systemd/nspawn; remove those of lab machines (none of which runs any more)."""
    if not machines_dir().is_dir():
        return
    for directory in machines_dir().iterdir():
        info = directory.stat()
        propagate = NSPAWN_RUN_DIR / "propagate" / directory.name
        lock = NSPAWN_RUN_DIR / "locks" / f"inode-{info.st_dev}:{info.st_ino}"
        for leftover in (propagate, lock):
            if leftover.is_dir():
                _remove_tree(leftover)
            elif leftover.exists():
                leftover.unlink()
            else:
                continue
            _say(f"removed nspawn's leftover {leftover}")


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
    _write_atomically(state_path(), json.dumps(document, indent=2) + "\n")


# --- rootfs ------------------------------------------------------------------------------


def rootfs_build_id() -> str | None:
    with contextlib.suppress(FileNotFoundError):
        return (rootfs_dir() / BUILD_ID_FILE).read_text().strip()
    return None


def build_rootfs() -> Path:
    """Return the cached rootfs, building it first if there is none.

    The build runs in a `.partial` directory renamed into place only when complete, so an
    interrupted build is never taken for a cached one (it is removed by the next build).
    """
    final = rootfs_dir()
    if final.is_dir():
        return final
    partial = final.with_name(final.name + ".partial")
    if partial.exists():
        _say(f"removing the interrupted build {partial}")
        _remove_tree(partial)
    source, mirror = host_apt_source()
    _say(f"building the {SUITE} rootfs with debootstrap from {mirror} (about a minute)")
    started = time.monotonic()
    try:
        _run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(ROOTFS_PACKAGES)}",
                SUITE,
                str(partial),
                mirror,
            ]
        )
    finally:
        # debootstrap mounts /proc (and more) in the target and leaves them if it fails.
        _unmount_under(partial)
    _say(f"debootstrap took {time.monotonic() - started:.1f} s")
    _configure_rootfs(partial, source)
    (partial / BUILD_ID_FILE).write_text(f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex}\n")
    partial.rename(final)
    # Builds of earlier recipes are no longer copied from (machine copies are standalone).
    for stale in lab_dir().glob(f"rootfs-{SUITE}*"):
        if stale != final and not stale.name.endswith(".partial"):
            _say(f"removing the rootfs of an earlier recipe, {stale}")
            _remove_tree(stale)
    return final


def _configure_rootfs(root: Path, apt_source: Path) -> None:
    """What every machine shares; what must differ per machine is removed here."""
    # The controller's Debian sources (with updates and security, and the signing key it
    # names, which debian-archive-keyring provides) so `apt-get install` works inside.
    # Only that file: other repositories may need keyrings the rootfs does not have.
    (root / "etc/apt/sources.list").unlink(missing_ok=True)
    destination = "etc/apt/sources.list.d" if apt_source.suffix == ".sources" else "etc/apt"
    shutil.copy2(apt_source, root / destination / apt_source.name)
    _run(["chroot", str(root), "apt-get", "update"])
    # Identity: each machine gets its own machine-id, host keys and hostname.
    for host_key in (root / "etc/ssh").glob("ssh_host_*"):
        host_key.unlink()
    (root / "etc/machine-id").write_text("")
    dbus_id = root / "var/lib/dbus/machine-id"
    dbus_id.unlink(missing_ok=True)
    dbus_id.symlink_to("/etc/machine-id")
    (root / "etc/hostname").unlink(missing_ok=True)
    # A lab machine lives minutes; its daily apt jobs would only race Ansible for the lock.
    for timer in ("apt-daily.timer", "apt-daily-upgrade.timer"):
        mask = root / "etc/systemd/system" / timer
        mask.unlink(missing_ok=True)
        mask.symlink_to("/dev/null")


# --- machines ----------------------------------------------------------------------------


def ensure_key() -> Path:
    key = key_path()
    if not (key.is_file() and key.with_suffix(".pub").is_file()):
        key.unlink(missing_ok=True)
        key.with_suffix(".pub").unlink(missing_ok=True)
        _run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "socketwise-lab", "-f", str(key)]
        )
    return key


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
        _say(f"{machine.name}: its copy was made from another rootfs build; replacing it")
        _remove_tree(directory)
    if not directory.is_dir():
        partial = directory.with_name(directory.name + ".partial")
        if partial.exists():
            _remove_tree(partial)
        started = time.monotonic()
        directory.parent.mkdir(parents=True, exist_ok=True)
        _run(["cp", "-a", str(rootfs_dir()), str(partial)])
        (partial / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
        # -f is a prefix: the keys land in the copy's /etc/ssh, distinct per machine.
        _run(["ssh-keygen", "-A", "-f", str(partial)])
        partial.rename(directory)
        _say(f"{machine.name}: copied the rootfs in {time.monotonic() - started:.1f} s")
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
    _write_atomically(
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


def _boot(machine: Machine, proc_writable: bool) -> None:
    env = dict(os.environ)
    env.pop(PROC_WRITABLE_ENV, None)
    if proc_writable:
        env[PROC_WRITABLE_ENV] = "1"
    # The lab needs no machined; where PID 1 is not systemd there is none to register with.
    argv = ["systemd-nspawn", "--register=no"]
    enter_cgroups = None
    # Where PID 1 is systemd, nspawn asks it for a scope of its own per machine.
    if not _systemd_is_pid1():
        # Elsewhere, --keep-unit nests nspawn's supervisor/payload cgroups in the caller's
        # cgroup, where all machines would share one /payload and one machine's systemd
        # could kill another's processes (seen as status=219/CGROUP on the second machine
        # to boot). So each nspawn enters a cgroup of its own machine before exec.
        argv.append("--keep-unit")
        cgroups = _machine_cgroups(machine.name)
        for cgroup in cgroups:
            cgroup.mkdir(parents=True, exist_ok=True)
        enter_cgroups = functools.partial(_enter_cgroups, cgroups)
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
            preexec_fn=enter_cgroups,
        )
    _children[machine.name] = child
    machine.pid = child.pid
    machine.running = True
    machine.proc_writable = proc_writable


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


def write_inventory(machines: list[Machine], inventory_dir: Path, loadgen: int = 0) -> Path:
    """Write `hosts.yml` with group `lab`; the last `loadgen` machines are also in the
    group `socketwise_loadgen` (they generate load and serve nothing). Strings are
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
    inventory_dir.mkdir(parents=True, exist_ok=True)
    path = inventory_dir / INVENTORY_FILE
    _write_atomically(path, "\n".join(lines) + "\n")
    return path


# --- the public operations ---------------------------------------------------------------


def status() -> list[Machine]:
    """Every lab machine that runs, was started, or has a copy on disk, by name."""
    _reap_children()
    state = _read_state()
    nspawns = _nspawn_processes()
    inits = _container_inits()
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
            machine.proc_writable = _proc_writable(machine.pid)
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
) -> list[Machine]:
    """Make lab1..lab`machines` run, write the inventory, return the running machines.

    The last `loadgen` of the running machines go into the group socketwise_loadgen.

    Machines already running are left as they are, including their /proc mode:
    `readonly_proc` applies to the machines this call boots. Machines beyond `machines`
    that are running keep running (only `down` stops machines) and stay in the inventory.
    """
    if not 1 <= machines <= MAX_MACHINES:
        raise LabError(f"--machines must be between 1 and {MAX_MACHINES}, not {machines}")
    if not 0 <= loadgen < machines:
        raise LabError(
            f"--loadgen {loadgen}: it must leave at least one of the {machines} machine(s) "
            f"to serve; raise --machines or lower --loadgen"
        )
    _require_root()
    with _locked():
        current = {machine.name: machine for machine in status()}
        orphans = [m.name for m in current.values() if m.running and m.pid is None]
        if orphans:
            raise LabError(
                f"{', '.join(orphans)} still running without their systemd-nspawn; "
                "run `socketwise lab down` first"
            )
        wanted = [machine_name(index) for index in range(1, machines + 1)]
        to_boot = [current.get(name) or _machine(name) for name in wanted]
        to_boot = [machine for machine in to_boot if not machine.running]
        for machine in current.values():
            if machine.running and machine.name in wanted:
                mode = "writable" if machine.proc_writable else "read-only"
                _say(f"{machine.name} ({machine.address}) already running, /proc/sys {mode}")
                if machine.proc_writable != (not readonly_proc):
                    _say(f"{machine.name}: the /proc mode is set at boot; `lab down` to change it")
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
                _boot(machine, proc_writable=not readonly_proc)
                current[machine.name] = machine
            try:
                for machine in to_boot:
                    machine.system_state = _wait_until_up(machine, started + BOOT_TIMEOUT_S)
                    mode = "writable" if machine.proc_writable else "read-only"
                    detail = f"{machine.system_state} after {time.monotonic() - started:.1f} s"
                    if machine.system_state == "degraded":
                        detail += f" (failed units: {_failed_units(machine) or 'none listed'})"
                    _say(f"{machine.name} ({machine.address}) {detail}, /proc/sys {mode}")
            finally:
                # Even a failed boot is recorded: `down` must know what was started.
                _write_state([m for m in current.values() if m.running])
        running = [machine for machine in current.values() if machine.running]
        running.sort(key=lambda machine: machine_index(machine.name))
        inventory = write_inventory(running, inventory_dir or default_inventory_dir(), loadgen)
        _say(f"inventory {inventory}")
        return running


def _wait_gone(names: set[str], started: float, timeout: float) -> set[str]:
    """Wait until none of the machines runs; say when each stops; return those still up."""
    alive = set(names)
    deadline = time.monotonic() + timeout
    while alive:
        _reap_children()
        stopped = alive - (set(_nspawn_processes()) | set(_container_inits()))
        for name in sorted(stopped, key=machine_index):
            _say(f"{name} stopped after {time.monotonic() - started:.1f} s")
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
    _require_root()
    with _locked():
        started = time.monotonic()
        nspawns = _nspawn_processes()
        inits = _container_inits()
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
            _say(f"{', '.join(sorted(alive))} did not power off in {STOP_TIMEOUT_S:.0f} s: killing")
            for pid in [*_container_inits().values(), *_nspawn_processes().values()]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            alive = _wait_gone(alive, started, KILL_TIMEOUT_S)
            if alive:
                raise LabError(f"{', '.join(sorted(alive))} still running after SIGKILL")
        # The nspawns this process started are dead by now; collect their exit status.
        for name in list(_children):
            _children.pop(name).wait(timeout=KILL_TIMEOUT_S)
        for leftover in _unmount_under(lab_dir()):
            _say(f"unmounted leftover {leftover}")
        _remove_nspawn_leftovers()
        _remove_lab_cgroups()
        state_path().unlink(missing_ok=True)
        if purge and machines_dir().exists():
            _remove_tree(machines_dir())
            _say(f"removed the machine copies in {machines_dir()}")
        _say("lab is down")


# --- command line ------------------------------------------------------------------------


def _cmd_up(args: argparse.Namespace) -> int:
    up(args.machines, args.readonly_proc, args.inventory, args.loadgen)
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    down(args.purge)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    print(json.dumps([machine.to_json() for machine in status()], indent=2))
    return 0


def _handle_errors(
    command: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    """A LabError is a message for the user, not a traceback."""

    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except LabError as error:
            print(f"socketwise lab: {error}", file=sys.stderr)
            return 1

    return run


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "lab",
        help="boot local systemd-nspawn machines to deploy to",
        description="Real systemd hosts on this machine: systemd-nspawn machines on "
        "127.0.0.11, 127.0.0.12, ... with an Ansible inventory for them.",
    )
    actions = parser.add_subparsers(dest="lab_command", required=True, metavar="ACTION")

    up_parser = actions.add_parser("up", help="boot lab1..labN and write the inventory")
    up_parser.add_argument("--machines", type=int, default=1, metavar="N", help="default: 1")
    up_parser.add_argument(
        "--loadgen",
        type=int,
        default=0,
        metavar="N",
        help="put the last N machines in the group socketwise_loadgen (load generators)",
    )
    up_parser.add_argument(
        "--readonly-proc",
        action="store_true",
        help="boot with /proc/sys read-only, like a container target",
    )
    up_parser.add_argument(
        "--inventory",
        type=Path,
        metavar="DIR",
        help=f"where to write {INVENTORY_FILE} (default: inventories/lab in the checkout)",
    )
    up_parser.set_defaults(func=_handle_errors(_cmd_up))

    down_parser = actions.add_parser("down", help="stop every lab machine")
    down_parser.add_argument(
        "--purge", action="store_true", help="also delete the machine copies (not the rootfs)"
    )
    down_parser.set_defaults(func=_handle_errors(_cmd_down))

    status_parser = actions.add_parser("status", help="print the machines as JSON")
    status_parser.set_defaults(func=_handle_errors(_cmd_status))
