"""The lab's Debian rootfs: controller packages, the apt mirror, one debootstrap build,
cached and reused by every machine (and by the lab's images).

    python -m socketwise.lab.rootfs    # print the cached rootfs's path, built if missing
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import sys
import time
import uuid
from pathlib import Path

from socketwise.lab.common import LabError, lab_dir, run, say
from socketwise.lab.nspawn import remove_tree, unmount_under

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
    # The cluster role's filter of engine ports (machines booted with --net-admin).
    "nftables",
    "curl",
    # vLLM's CPU backend compiles its kernels with torch inductor when it starts.
    "g++",
    "python3-dev",
)
# Debian packages the controller needs: systemd-nspawn, debootstrap, ssh and ssh-keygen,
# and nft to remove the tables a cluster machine left in the shared network namespace.
CONTROLLER_PACKAGES = ("systemd-container", "debootstrap", "openssh-client", "nftables")
HOST_APT_SOURCES = (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list"))
# Written into the rootfs when its build completes; every machine copy carries it, so a
# copy made from an older rootfs is recognisable after the cache was rebuilt.
BUILD_ID_FILE = "etc/socketwise-lab-build"
# Any of these in a failed `apt-get install` means the package lists are missing or stale.
MISSING_LISTS_MARKERS = (
    "Unable to locate package",
    "has no installation candidate",
    "Failed to fetch",
)


def rootfs_dir() -> Path:
    # Named by its recipe: a changed package list builds a new rootfs instead of reusing
    # one that lacks a package (machine copies of the old one are then replaced).
    recipe = hashlib.sha1(",".join(ROOTFS_PACKAGES).encode()).hexdigest()[:8]
    return lab_dir() / f"rootfs-{SUITE}-{recipe}"


# --- controller packages -----------------------------------------------------------------


def _dpkg_installed(package: str) -> bool:
    result = run(["dpkg-query", "-W", "-f=${db:Status-Status}", package], check=False)
    return result.stdout.strip() == "installed"


def ensure_controller_packages() -> None:
    missing = [package for package in CONTROLLER_PACKAGES if not _dpkg_installed(package)]
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise LabError(f"the lab needs the Debian packages {', '.join(missing)} and apt-get")
    say(f"installing {' '.join(missing)} on the controller")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # --no-install-recommends: systemd-container recommends libnss-mymachines, which edits
    # the controller's nsswitch.conf; the lab does not need it.
    install = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
    result = run(install, check=False, env=env)
    output = result.stdout + result.stderr
    if result.returncode != 0 and any(marker in output for marker in MISSING_LISTS_MARKERS):
        say("package lists are missing or stale: running apt-get update once")
        run(["apt-get", "update"], env=env)
        result = run(install, check=False, env=env)
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
        say(f"removing the interrupted build {partial}")
        remove_tree(partial)
    source, mirror = host_apt_source()
    say(f"building the {SUITE} rootfs with debootstrap from {mirror} (about a minute)")
    started = time.monotonic()
    try:
        run(
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
        unmount_under(partial)
    say(f"debootstrap took {time.monotonic() - started:.1f} s")
    _configure_rootfs(partial, source)
    (partial / BUILD_ID_FILE).write_text(f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex}\n")
    partial.rename(final)
    # Builds of earlier recipes are no longer copied from (machine copies are standalone).
    for stale in lab_dir().glob(f"rootfs-{SUITE}*"):
        if stale != final and not stale.name.endswith(".partial"):
            say(f"removing the rootfs of an earlier recipe, {stale}")
            remove_tree(stale)
    return final


def _configure_rootfs(root: Path, apt_source: Path) -> None:
    """What every machine shares; what must differ per machine is removed here."""
    # The controller's Debian sources (with updates and security, and the signing key it
    # names, which debian-archive-keyring provides) so `apt-get install` works inside.
    # Only that file: other repositories may need keyrings the rootfs does not have.
    (root / "etc/apt/sources.list").unlink(missing_ok=True)
    destination = "etc/apt/sources.list.d" if apt_source.suffix == ".sources" else "etc/apt"
    shutil.copy2(apt_source, root / destination / apt_source.name)
    run(["chroot", str(root), "apt-get", "update"])
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


def main() -> int:
    """Print the rootfs's path alone on stdout (what the lab's `vllm_image_rootfs` reads)."""
    try:
        with contextlib.redirect_stdout(sys.stderr):
            root = build_rootfs()
    except LabError as error:
        print(f"socketwise.lab.rootfs: {error}", file=sys.stderr)
        return 2
    print(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
