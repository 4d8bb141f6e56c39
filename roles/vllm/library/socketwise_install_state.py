#!/usr/bin/python
"""What of an install a host has already, read in one call."""

DOCUMENTATION = r"""
---
module: socketwise_install_state
short_description: Read the paths and packages an install or a service needs, in one round trip
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
author: socketwise
"""

EXAMPLES = r"""
- name: Read what of the install the host has already
  socketwise_install_state:
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


def main():
    module = AnsibleModule(
        argument_spec={
            "paths": {"type": "list", "elements": "path", "default": []},
            "packages": {"type": "list", "elements": "str", "default": []},
            "globs": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
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
    )


if __name__ == "__main__":
    main()
