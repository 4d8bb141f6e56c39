#!/usr/bin/python
"""Ansible door into socketwise.serve.releases (shipped as module_utils, stdlib only)."""

DOCUMENTATION = r"""
---
module: prune
short_description: Remove the releases older than previous, and the venvs and models only they used
description:
  - Keeps the releases in I(keep), the releases the C(current) and C(previous) links in
    I(releases) point at, and every venv and model those releases name.
  - Removes only direct children of C(<home>/releases), C(<home>/venvs) and
    C(<home>/models) that are directories (never a link or a file) and carry the kit's
    marker for their name; a release holds a C(release.json) with its name as C(id), a
    venv a C(.socketwise-<name>) file, a model C(<name>-<revision>) a
    C(.socketwise-complete) file recording C(<revision>). An operator's own directory
    there is left alone.
  - Paths are compared where they really are, so a home given with a trailing C(/) or
    through a symlink keeps what it runs.
  - Check mode removes nothing and returns what would go.
options:
  home:
    description: The kit's home on the host (C(vllm_home)).
    type: path
    required: true
  releases:
    description: The releases directory; must be C(<home>/releases).
    type: path
    required: true
  keep:
    description: Releases to keep, as in their release.json (at least C(id); C(venv) and
      C(model) are kept with them).
    type: list
    elements: dict
    required: true
author: socketwise
"""

EXAMPLES = r"""
- name: Remove releases older than previous, and what only they used
  socketwise.kit.prune:
    home: /opt/socketwise
    releases: /opt/socketwise/releases
    keep:
      - id: sn-0123456789ab
        venv: /opt/socketwise/venvs/9fc1d65d5fe4
        model: /opt/socketwise/models/tiny-llama-5e1f0c2a9b3d
"""

RETURN = r"""
removed:
  description: The directories removed (in check mode, those that would be), releases first.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.serve.releases import prune


def main():
    module = AnsibleModule(
        argument_spec={
            "home": {"type": "path", "required": True},
            "releases": {"type": "path", "required": True},
            "keep": {"type": "list", "elements": "dict", "required": True},
        },
        supports_check_mode=True,
    )
    params = module.params
    missing = [i for i, release in enumerate(params["keep"]) if not release.get("id")]
    if missing:
        module.fail_json(msg=f"keep: release(s) at {missing} have no id")
    try:
        removed = prune(params["home"], params["releases"], params["keep"], module.check_mode)
    except (ValueError, OSError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=bool(removed), removed=removed)


if __name__ == "__main__":
    main()
