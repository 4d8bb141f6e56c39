"""What nspawn machines leave on the controller: their processes, mounts and cgroups, read
from /proc and /sys, and removed on the way down."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from socketwise.lab.common import LabError, lab_cgroup, machines_dir, run, say

# Where nspawn keeps per-machine bookkeeping on the controller.
NSPAWN_RUN_DIR = Path("/run/systemd/nspawn")
KILL_TIMEOUT_S = 10.0
# Set in nspawn's environment for a machine booted with writable /proc/sys and /sys.
PROC_WRITABLE_ENV = "SYSTEMD_NSPAWN_API_VFS_WRITABLE"


# --- mounts and processes ----------------------------------------------------------------


def mounts_under(directory: Path) -> list[Path]:
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


def unmount_under(directory: Path) -> list[Path]:
    """Unmount what is left below `directory` (debootstrap's /proc after an interrupted
    build, a machine's mounts if its nspawn died); return what was unmounted."""
    leftovers = mounts_under(directory)
    for point in leftovers:
        if run(["umount", str(point)], check=False).returncode != 0:
            # Busy: detach it now; the kernel frees it when its last user goes.
            run(["umount", "--lazy", str(point)])
    remaining = mounts_under(directory)
    if remaining:
        raise LabError(f"mounts remain under {directory}: {', '.join(map(str, remaining))}")
    return leftovers


def remove_tree(directory: Path) -> None:
    # Never let rmtree walk into a mounted /proc or /sys of an interrupted build.
    unmount_under(directory)
    shutil.rmtree(directory, ignore_errors=False)


def proc_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    # A zombie has an empty cmdline: it is not running any more.
    return raw.decode(errors="replace").split("\0")[:-1]


def pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def nspawn_processes() -> dict[str, int]:
    """Lab machine name -> PID of the systemd-nspawn process running it."""
    found = {}
    for pid in pids():
        argv = proc_cmdline(pid)
        if not argv or Path(argv[0]).name != "systemd-nspawn" or "-D" not in argv[:-1]:
            continue
        directory = Path(argv[argv.index("-D") + 1])
        if directory.parent == machines_dir():
            found[directory.name] = pid
    return found


def container_inits() -> dict[str, int]:
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
    for pid in pids():
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


def systemd_is_pid1() -> bool:
    # The check sd_booted() makes.
    return Path("/run/systemd/system").is_dir()


def lab_cgroups() -> list[Path]:
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
                found.append((mount_point / inside).resolve() / lab_cgroup())
    return found


def machine_cgroups(name: str) -> list[Path]:
    return [cgroup / name for cgroup in lab_cgroups()]


def enter_cgroups(cgroups: list[Path]) -> None:
    # Runs in the child between fork and exec: "0" moves the writing process.
    for cgroup in cgroups:
        (cgroup / "cgroup.procs").write_text("0")


def remove_lab_cgroups() -> None:
    """Remove the lab's cgroups, which must empty once every machine has stopped.

    A killed container's processes take a moment to leave their cgroups after its PID 1
    is gone from /proc, hence the bounded retry.
    """
    deadline = time.monotonic() + KILL_TIMEOUT_S
    for cgroup in lab_cgroups():
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


def proc_is_writable(nspawn_pid: int) -> bool | None:
    try:
        environ = Path(f"/proc/{nspawn_pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return f"{PROC_WRITABLE_ENV}=1".encode() in environ


# What `lab up --net-admin` gives a machine: nftables in the shared network namespace.
NET_ADMIN_ARG = "--capability=CAP_NET_ADMIN"


def net_admin_granted(nspawn_pid: int) -> bool | None:
    try:
        argv = Path(f"/proc/{nspawn_pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    return NET_ADMIN_ARG.encode() in argv


def remove_kit_tables(lab: str) -> list[str]:
    """Delete the nftables tables the kit named for machines of the lab LAB (`inet
    socketwise_cluster_<machine>`, the cluster's engine ports, and `inet
    socketwise_metrics_<machine>`, a metrics door's): the machines share the controller's
    network namespace, so a table stays in it when a machine dies without stopping its
    units. Returns the tables deleted."""
    if shutil.which("nft") is None:
        return []
    listed = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True)
    machine = re.escape(re.sub(r"[^A-Za-z0-9]", "_", lab)) + r"\d+"
    ours = re.compile("socketwise_(cluster|metrics)_" + machine)
    deleted = []
    for line in listed.stdout.splitlines():
        words = line.split()
        if len(words) == 3 and words[:2] == ["table", "inet"] and ours.fullmatch(words[2]):
            subprocess.run(["nft", "delete", "table", "inet", words[2]], check=True)
            deleted.append(words[2])
    return deleted


def remove_nspawn_leftovers() -> None:
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
                remove_tree(leftover)
            elif leftover.exists():
                leftover.unlink()
            else:
                continue
            say(f"removed nspawn's leftover {leftover}")
