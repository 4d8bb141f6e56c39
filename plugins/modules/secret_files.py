#!/usr/bin/python
"""Ansible door into socketwise.serve.secretfiles (shipped as module_utils)."""

DOCUMENTATION = r"""
---
module: secret_files
short_description: Write, remove and make a host's root-only secret files in one call
description:
  - One round trip for what took one per file. Each file is written (root's, mode
    C(0600), atomically) only when its content, owner or mode differ.
  - Contents are no_log options, and the task that calls this should be C(no_log) too,
    since I(once) credentials come back in C(contents).
  - Supports check mode (says what would change; a credential not made yet is not read).
options:
  dir:
    description: The secrets directory.
    type: path
    required: true
  dir_mode:
    description: Make the directory (root's) with this mode, and keep it so; omit to leave it.
    type: str
  files:
    description:
      - Files to write, name to content. A no_log option whose contents are masked, never
        its names.
    type: dict
    default: {}
  keep:
    description: Names of I(files) left as they are when they exist.
    type: list
    elements: str
    default: []
  absent:
    description: Names of files that must not be there.
    type: list
    elements: str
    default: []
  once:
    description: Names of credentials made once (48 letters and digits, a line) and read back.
    type: list
    elements: str
    default: []
author: socketwise
"""

EXAMPLES = r"""
- name: Make and read the backend credential
  socketwise.kit.secret_files:
    dir: /etc/socketwise/secrets
    dir_mode: "0700"
    once: [backend-key]
  register: made
  no_log: true
"""

RETURN = r"""
changed_names:
  description: The names written, made or removed (C(.) for the directory itself).
  type: list
  returned: always
contents:
  description: Each I(once) credential's text.
  type: dict
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.serve.secretfiles import (
    apply,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "dir": {"type": "path", "required": True},
            "dir_mode": {"type": "str"},
            "files": {"type": "dict", "default": {}, "no_log": True},
            "keep": {"type": "list", "elements": "str", "default": []},
            "absent": {"type": "list", "elements": "str", "default": []},
            "once": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        dir_mode = int(params["dir_mode"], 8) if params["dir_mode"] else None
        files = [
            {"name": name, "content": content, "force": name not in params["keep"]}
            for name, content in params["files"].items()
        ]
        result = apply(
            params["dir"], files, params["absent"], params["once"], dir_mode, module.check_mode
        )
    except (ValueError, OSError) as exc:
        module.fail_json(msg=f"{params['dir']}: {exc}")
    module.exit_json(
        changed=bool(result["changed"]), changed_names=result["changed"],
        contents=result["contents"],
    )  # fmt: skip


if __name__ == "__main__":
    main()
