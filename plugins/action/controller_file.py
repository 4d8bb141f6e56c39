"""Write a report file on the controller, in the controller's own process.

A deploy saves what it learned of each host (topology.json, plan.json,
deploy-summary.json) under the artifacts directory. A `copy` delegated to localhost
starts a Python process per file, a third of a second each; this action writes the file
where Ansible runs, with no module to start. The parent directories are made; a file is
rewritten only when its content differs (atomically), and the result says whether it
was. Its documentation is plugins/modules/controller_file.py, where
ansible-doc looks for it.
"""

from __future__ import annotations

import os
import tempfile

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("dest", "content", "mode"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        if "dest" not in args or "content" not in args:
            raise AnsibleActionFail("socketwise.kit.controller_file needs dest and content")
        dest = os.path.expanduser(str(args["dest"]))
        content = str(args["content"])
        try:
            mode = int(str(args.get("mode", "0644")), 8)
        except ValueError as exc:
            raise AnsibleActionFail(f"mode {args.get('mode')!r}: give an octal mode") from exc
        result.update(dest=dest, changed=False)
        try:
            with open(dest) as handle:
                if handle.read() == content:
                    return result
        except OSError:
            pass
        if self._play_context.check_mode:
            result["changed"] = True
            return result
        directory = os.path.dirname(dest) or "."
        try:
            os.makedirs(directory, exist_ok=True)
            handle, tmp_path = tempfile.mkstemp(prefix=".socketwise-", dir=directory)
            with os.fdopen(handle, "w") as out:
                out.write(content)
            os.chmod(tmp_path, mode)
            os.replace(tmp_path, dest)
        except OSError as exc:
            raise AnsibleActionFail(f"{dest}: {exc}") from exc
        result["changed"] = True
        return result
