"""Run the kit's playbooks the way a user does, with the venv's ansible, and read the recap."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def kit_plugin(name: str) -> ModuleType:
    """A plugin of the collection socketwise.kit (`filter.fleet`, `modules.install_state`)
    imported as Ansible imports it: by its fully qualified name, through Ansible's
    collection loader, from this checkout's collections path (ansible.cfg's)."""
    from ansible.plugins.loader import init_plugin_loader

    if "ansible_collections" not in sys.modules:
        init_plugin_loader([str(REPO / "collections")])
    return importlib.import_module(f"ansible_collections.socketwise.kit.plugins.{name}")


@dataclass
class PlaybookRun:
    returncode: int
    output: str

    def recap(self, host: str) -> dict[str, int]:
        """The PLAY RECAP counters of `host` (ok, changed, failed, ...)."""
        match = re.search(rf"^{re.escape(host)}\s+:\s+(.*)$", self.output, re.MULTILINE)
        assert match, f"no recap for {host}:\n{self.output[-3000:]}"
        return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", match.group(1))}

    def changed_tasks(self, host: str) -> list[str]:
        """The names of the tasks that reported `host` changed, for an assertion's message."""
        task, changed = "", []
        for line in self.output.splitlines():
            if line.startswith("TASK ["):
                task = line[6:].split("]", 1)[0]
            elif line.startswith(f"changed: [{host}]"):
                changed.append(task)
        return changed


def render_task(name: str, source: str, dest: str, task_vars: dict) -> dict:
    """A task that renders SOURCE with Ansible's template engine and its task's variables,
    as the template module would, into the host's `rendered` fact at DEST (which may hold
    Jinja: a loop's item); WRITE_RENDERED then writes them all. A module's run costs about
    a third of a second here, a rendering far less, so a fixture of many renderings runs
    one module, not one each."""
    return {
        "name": name,
        "ansible.builtin.set_fact": {
            "rendered": "{{ rendered | default({}) | combine({__render_dest: "
            "lookup('ansible.builtin.template', __render_source)}) }}"
        },
        "vars": task_vars | {"__render_dest": dest, "__render_source": source},
    }


# Writes the host's `rendered` fact ({path: text}), each file root's alone.
WRITE_RENDERED = {
    "name": "Write what was rendered",
    "ansible.builtin.command": {
        "argv": [
            "{{ ansible_playbook_python }}",
            "-c",
            "import json, os, sys\n"
            "for path, text in json.load(sys.stdin).items():\n"
            "    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)\n"
            "    os.write(fd, text.encode())\n"
            "    os.close(fd)\n",
        ],
        "stdin": "{{ rendered | to_json }}",
    },
    "changed_when": True,
    "when": "rendered is defined",
}


def render_all(renders: list[tuple[str, str, dict]]) -> list[dict]:
    """Tasks that render each (SOURCE, DEST, VARIABLES) with Ansible's template engine, as
    the template module would with VARIABLES as its task's vars, and write them all, each
    file root's alone. One task renders them all, where render_task costs a task each (a
    process that loads the templates and the kit's filters again, a third of a second
    here). The loop templates VARIABLES first, with the play's variables alone: where a
    value needs another of its own VARIABLES to resolve, use render_task."""
    items = [{"source": source, "dest": dest, "vars": values} for source, dest, values in renders]
    return [
        {
            "name": "Render the files",
            "ansible.builtin.set_fact": {
                "__render_text": "{{ lookup('ansible.builtin.template', item.source, "
                "template_vars=item.vars) }}"
            },
            "loop": items,
            "loop_control": {"label": "{{ item.dest }}"},
            "register": "__renders",
        },
        WRITE_RENDERED
        | {
            "vars": {
                "rendered": "{{ dict(__renders.results | map(attribute='item.dest') | zip("
                "__renders.results | map(attribute='ansible_facts.__render_text'))) }}"
            }
        },
    ]


def run_playbook(playbook: str, *args: str, env: dict[str, str] | None = None) -> PlaybookRun:
    environment = dict(
        os.environ, PATH=f"{BIN}:{os.environ['PATH']}", ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0"
    )
    environment.update(env or {})
    result = subprocess.run(
        [str(BIN / "ansible-playbook"), playbook, *args],
        cwd=REPO,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return PlaybookRun(result.returncode, result.stdout)


def run_module(module: str, args: dict, *extra: str) -> tuple[dict, str]:
    """Run one of the kit's modules (socketwise.kit.NAME) with ansible against localhost,
    as a task would: its result and ansible's whole output (to look for what it must not
    show)."""
    done = subprocess.run(
        [str(BIN / "ansible"), "localhost", "-i", "inventories/local", "-m", module,
         "-a", json.dumps(args), *extra],
        cwd=REPO, capture_output=True, text=True, check=False,
        env=dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="json"),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"], done.stdout
