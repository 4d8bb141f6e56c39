"""A lab of fresh machines for one test module, always powered off afterwards.

Installing vLLM on a lab machine (copying its 900 MB wheelhouse, unpacking and compiling
about 2 GB of wheels) takes two minutes of the lab's two cores per machine, and most
modules are not about the install: the deploy module installs for real. The others may
ask for `preinstalled` machines: the venvs and wheelhouses an earlier module's deploy
installed on a lab machine are kept at its teardown (moved, not copied, into
`installed_dir()`, per rootfs build and version of the install tasks) and hard-linked into
each new machine's copy before anything runs there, so the role finds its marker and
skips the install, as on a server deployed before. With nothing kept yet (a fresh
controller) the module installs for real, and its teardown keeps what it installed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from socketwise.lab import machines as lab
from socketwise.lab.common import default_inventory_dir, lab_dir
from socketwise.lab.rootfs import rootfs_build_id

from .playbooks import REPO

# Where the vllm and benchmark roles install on a host.
KIT_HOME = "opt/socketwise"
# Where test_deploy_lab installs the zen wheel set on a host of another build class.
ZEN_ASIDE = "/var/tmp/socketwise-zen"
# The markers of what the vllm and benchmark roles install, relative to a machine's root:
# the directory holding one is complete (the roles' own `creates:`).
INSTALL_MARKERS = (
    f"{KIT_HOME}/venvs/*/.socketwise-*",
    f"{KIT_HOME}/wheelhouse/*/socketwise-wheelhouse.json",
    f"{KIT_HOME}/guidellm/.socketwise-*",
    f"{ZEN_ASIDE.lstrip('/')}/venv/.socketwise-*",
)
# What only a load generator installs: a serving host never holds GuideLLM.
LOADGEN_ONLY = f"{KIT_HOME}/guidellm"


# The parts of the lab a run leaves out unless asked (docs/development/testing.md): each
# costs minutes of the controller's two cores that a slow CI machine cannot pay within
# its time. This variable asks for all of them; some have a variable of their own too.
FULL_LAB = "SOCKETWISE_FULL_LAB"


def asked(variable: str = FULL_LAB) -> bool:
    """Whether VARIABLE=1 or SOCKETWISE_FULL_LAB=1 asks for a part the suite leaves out."""
    return "1" in (os.environ.get(variable), os.environ.get(FULL_LAB))


def left_out(what: str, variable: str = FULL_LAB) -> str:
    """Why WHAT was skipped, for `-ra`: what it is and how to ask for it."""
    how = f"{variable}=1" + (f" (or {FULL_LAB}=1)" if variable != FULL_LAB else "")
    return f"{what}: run it with {how}"


def unless_asked(what: str, variable: str = FULL_LAB) -> pytest.MarkDecorator:
    """Skip WHAT unless asked(VARIABLE)."""
    return pytest.mark.skipif(not asked(variable), reason=left_out(what, variable))


def installed_dir() -> Path:
    """Per rootfs build and version of the venv install: a change to either installs anew."""
    install = hashlib.sha256((REPO / "roles/vllm/tasks/venv.yml").read_bytes()).hexdigest()
    return lab_dir() / "installed" / f"{rootfs_build_id()}-{install[:12]}"


@contextlib.contextmanager
def fresh_lab(
    machines: int = 1,
    loadgen: int = 0,
    frontdoor: int = 0,
    preinstalled: bool = False,
    net_admin: bool = False,
) -> Iterator[list[lab.Machine]]:
    """Machines copied anew from the rootfs (nothing left from an earlier test); with
    PREINSTALLED, every machine but the front doors holds the kept venvs and wheelhouses;
    with NET_ADMIN, they may load nftables tables (lab up --net-admin)."""
    if any(m.running for m in lab.status()):
        pytest.fail("a lab is already running: `socketwise lab down` first")
    lab.down(purge=True)
    booted: list[lab.Machine] = []
    try:
        booted = lab.up(
            machines=machines, loadgen=loadgen, frontdoor=frontdoor, net_admin=net_admin
        )
        if preinstalled:
            serving = booted[: len(booted) - loadgen - frontdoor]
            for machine in serving:
                link_installed(machine.directory, KIT_HOME, leave=LOADGEN_ONLY)
            for machine in booted[len(booted) - loadgen :]:
                link_installed(machine.directory, KIT_HOME)
        yield booted
    finally:
        lab.down()
        for machine in booted:
            keep_installed(machine.directory)
        lab.down(purge=True)


def _installed(root: Path) -> Iterator[Path]:
    """The complete installs under ROOT, relative to it."""
    for marker in INSTALL_MARKERS:
        for found in sorted(root.glob(marker)):
            yield found.parent.relative_to(root)


def keep_installed(machine_root: Path, under: str = "") -> None:
    """Move MACHINE_ROOT's complete installs below UNDER that are not kept yet into
    installed_dir()."""
    kept = installed_dir()
    for entry in _installed(machine_root):
        if entry.is_relative_to(under) and not (kept / entry).exists():
            (kept / entry).parent.mkdir(parents=True, exist_ok=True)
            try:
                (machine_root / entry).rename(kept / entry)
            except OSError:
                # Another worker's lab kept the same install first: theirs serves.
                if not (kept / entry).exists():
                    raise


def link_installed(machine_root: Path, under: str, leave: str = "") -> bool:
    """Hard-link the kept installs below UNDER (relative to a machine's root), but those
    below LEAVE, into MACHINE_ROOT; False when none is kept."""
    kept = installed_dir()
    entries = [
        entry
        for entry in _installed(kept)
        if entry.is_relative_to(under) and not (leave and entry.is_relative_to(leave))
    ]
    for entry in entries:
        (machine_root / entry).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-al", str(kept / entry), str(machine_root / entry)], check=True)
    return bool(entries)


@contextlib.contextmanager
def named_lab(name: str) -> Iterator[None]:
    """Work in the lab NAME (SOCKETWISE_LAB) until the block ends: its own machines
    (NAME1, NAME2, ...), addresses and inventory, so it runs beside another test worker's
    lab. The lab's API key and kept installs are shared."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SOCKETWISE_LAB", name)
        yield


def run_on(machine: lab.Machine, command: str) -> str:
    """COMMAND's standard output on MACHINE over SSH; the test fails if it fails."""
    result = subprocess.run(
        lab.ssh_command(machine, command), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"{machine.name}: {command!r}: {result.stderr}"
    return result.stdout.strip()


def eager_inventory(into: Path) -> Path:
    """The lab inventory as `lab up` just wrote it, with vLLM's `--enforce-eager`: the tiny
    model then starts in about 20 s instead of 60 s (no torch compile). For modules whose
    subject is what the kit does around vLLM (sweeps, rollouts), not vLLM's speed."""
    (into / "group_vars").mkdir(parents=True)
    shutil.copy(default_inventory_dir() / "hosts.yml", into / "hosts.yml")
    committed = (REPO / "inventories" / "lab" / "group_vars" / "lab.yml").read_text()
    (into / "group_vars" / "lab.yml").write_text(
        committed + 'vllm_service_extra_args: ["--enforce-eager"]\n'
    )
    return into
