#!/usr/bin/python
"""What of an install a host has already, and which of its servers run older files, read in
one call."""

DOCUMENTATION = r"""
---
module: install_state
short_description: Read the paths, packages and servers an install or a service needs, in one call
description:
  - A converged host installs nothing, and each task that finds that out (a directory
    that exists, a venv with its marker, a package installed) cost a round trip of its
    own. This reads them all at once; the tasks that would change something run only
    for what is missing or different.
  - Read-only; the same answer in check mode.
options:
  paths:
    description: Paths to read (whether each exists, is a directory, its owner and mode).
    type: list
    elements: path
    default: []
  packages:
    description: Debian packages to ask dpkg about.
    type: list
    elements: str
    default: []
  globs:
    description: Shell patterns of paths to list (a unit directory's units of a name).
    type: list
    elements: str
    default: []
  running:
    description:
      - Units, each with the files it reads (its unit file, its environment files), to
        ask systemd about. C(outdated) lists those whose main process runs since before
        one of their files was last written, as a deploy stopped between writing them
        and restarting the unit leaves them, so the next one restarts them although it
        writes nothing new.
    type: dict
    default: {}
author: socketwise
"""

EXAMPLES = r"""
- name: Read what of the install the host has already
  socketwise.kit.install_state:
    paths: [/opt/socketwise, /opt/socketwise/models]
    packages: [g++, libtcmalloc-minimal4]
  register: state
"""

RETURN = r"""
paths:
  description: Per path, C(exists), C(isdir), C(uid), C(gid) and C(mode) (octal text).
  type: dict
  returned: always
installed:
  description: Those of I(packages) dpkg has installed.
  type: list
  returned: always
found:
  description: Per pattern of I(globs), the paths that match it, sorted.
  type: dict
  returned: always
outdated:
  description: Those of I(running) whose main process started before one of its files was
    written, sorted.
  type: list
  returned: always
"""

import glob
import os
import stat

from ansible.module_utils.basic import AnsibleModule


def read(path):
    try:
        info = os.stat(path)
    except OSError:
        return {"exists": False, "isdir": False, "uid": None, "gid": None, "mode": None}
    return {
        "exists": True,
        "isdir": stat.S_ISDIR(info.st_mode),
        "uid": info.st_uid,
        "gid": info.st_gid,
        "mode": f"{stat.S_IMODE(info.st_mode):04o}",
    }


def started(pid, proc="/proc"):
    """When process PID started, in seconds since the epoch (the kernel's own record: its
    start in clock ticks after boot), or None when it is gone."""
    try:
        with open(f"{proc}/{pid}/stat") as handle:
            # The name, in parentheses, may hold spaces: the fields after it count from ')'.
            ticks = int(handle.read().rsplit(")", 1)[1].split()[19])
        with open(f"{proc}/stat") as handle:
            booted = next(int(line.split()[1]) for line in handle if line.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return booted + ticks / os.sysconf("SC_CLK_TCK")


def outdated(main_pids, files, proc="/proc"):
    """The units of MAIN_PIDS ({unit: its main process, 0 when it runs none}) whose process
    started before one of their FILES ({unit: [path]}) was last written."""
    stale = []
    for unit, pid in main_pids.items():
        since = started(pid, proc) if pid else None
        written = [os.stat(path).st_mtime for path in files.get(unit, []) if os.path.exists(path)]
        if since is not None and written and max(written) > since:
            stale.append(unit)
    return sorted(stale)


def main_pids(module, units):
    """{unit: its main process, 0 when it runs none}, in one systemctl call."""
    if not units:
        return {}
    _, out, _ = module.run_command(
        ["systemctl", "show", "--property=Id,MainPID", "--", *units], check_rc=True
    )
    shown = {}
    for block in out.strip().split("\n\n"):
        fields = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if "Id" in fields:
            shown[fields["Id"]] = int(fields.get("MainPID") or 0)
    return shown


def main():
    module = AnsibleModule(
        argument_spec={
            "paths": {"type": "list", "elements": "path", "default": []},
            "packages": {"type": "list", "elements": "str", "default": []},
            "globs": {"type": "list", "elements": "str", "default": []},
            "running": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    running = module.params["running"]
    installed = []
    if module.params["packages"]:
        # 1 when dpkg has never heard of one: its line is then missing.
        _, out, _ = module.run_command(
            ["dpkg-query", "--show", "--showformat=${Package} ${db:Status-Abbrev}\n"]
            + module.params["packages"],
            environ_update={"LC_ALL": "C"},
        )
        installed = [line.split(" ")[0] for line in out.splitlines() if line.endswith(" ii ")]
    module.exit_json(
        changed=False,
        paths={path: read(path) for path in module.params["paths"]},
        installed=installed,
        found={pattern: sorted(glob.glob(pattern)) for pattern in module.params["globs"]},
        outdated=outdated(main_pids(module, list(running)), running),
    )


if __name__ == "__main__":
    main()
