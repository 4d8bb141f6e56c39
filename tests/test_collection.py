"""The repository is the collection socketwise.kit: built with ansible-galaxy, installed
offline into an empty collections path, its playbooks run by name and its modules are
documented, with nothing of the checkout in reach. In the checkout, every plugin lives
once under plugins/ and is called by its fully qualified name; a filter imports the core
only when called, and every name it imports then exists."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import yaml

from .playbooks import BIN, REPO

PLAYBOOKS = sorted(path.stem for path in (REPO / "playbooks").glob("*.yml"))
MODULES = sorted(path.stem for path in (REPO / "plugins/modules").glob("*.py"))


def galaxy_tool(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(BIN / args[0]), *args[1:]], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, f"{args}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done


def test_the_built_collection_installs_offline_and_runs_its_playbooks_by_name(tmp_path):
    # Away from the checkout: no ansible.cfg of the repository, only the installed copy.
    (tmp_path / "ansible.cfg").write_text("[defaults]\n")
    installed = tmp_path / "collections"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env |= {
        "ANSIBLE_CONFIG": str(tmp_path / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_COLLECTIONS_PATH": str(installed),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path),
    }
    galaxy_tool("ansible-galaxy", "collection", "build", str(REPO), "--output-path",
                str(tmp_path), cwd=tmp_path, env=env)  # fmt: skip
    version = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    tarball = tmp_path / f"socketwise-kit-{version}.tar.gz"
    with tarfile.open(tarball) as archive:
        tops = {name.split("/", 1)[0] for name in archive.getnames()}
    # What a user of the collection runs is in it; the controller's tools are not.
    assert {"playbooks", "roles", "templates", "plugins", "socketwise", "locks"} <= tops
    assert not tops & {".venv", "tests", "docs", "molecule", "collections", "artifacts"}
    galaxy_tool("ansible-galaxy", "collection", "install", "--offline", "-p", str(installed),
                str(tarball), cwd=tmp_path, env=env)  # fmt: skip
    root = installed / "ansible_collections/socketwise/kit"
    # The modules take the Python core from module_utils: one copy, linked to the package.
    assert (root / "plugins/module_utils/socketwise/facts/topology.py").is_file()

    playbooks = [f"socketwise.kit.{name}" for name in PLAYBOOKS]
    assert "socketwise.kit.deploy" in playbooks and "socketwise.kit.rollout" in playbooks
    checked = galaxy_tool("ansible-playbook", "--syntax-check", "-i", "localhost,", *playbooks,
                          cwd=tmp_path, env=env)  # fmt: skip
    assert checked.stdout.count("playbook: ") == len(PLAYBOOKS), checked.stdout

    documented = galaxy_tool("ansible-doc", *(f"socketwise.kit.{m}" for m in MODULES),
                             cwd=tmp_path, env=env)  # fmt: skip
    for module in MODULES:
        assert f"socketwise.kit.{module} ({root}/plugins/modules/{module}.py)" in (
            documented.stdout
        ), module
    assert "ERROR" not in documented.stderr, documented.stderr


def test_every_plugin_lives_once_under_plugins_and_roles_hold_no_links():
    links = [str(path) for path in (REPO / "roles").rglob("*") if path.is_symlink()]
    assert links == []
    for kind in ("library", "filter_plugins", "module_utils", "action_plugins"):
        assert list(REPO.glob(f"roles/*/{kind}")) == [], kind
        assert list(REPO.glob(f"playbooks/{kind}")) == [], kind
    plugins = [
        path
        for path in (REPO / "plugins").rglob("*.py")
        if "module_utils" not in path.relative_to(REPO / "plugins").parts
    ]
    assert len(plugins) >= 20
    # No plugin finds the package by a path of its own: Ansible's collection loader does.
    assert [str(p) for p in plugins if "sys.path" in p.read_text()] == []
    assert (REPO / "plugins/module_utils/socketwise").resolve() == REPO / "socketwise"
    assert (REPO / "collections/ansible_collections/socketwise/kit").resolve() == REPO


def in_a_task_process(script: str) -> str:
    """What SCRIPT prints, run in a process of its own as Ansible runs a task, with the
    checkout's collections path as its argument."""
    done = subprocess.run(
        [str(BIN / "python"), "-c", script, str(REPO / "collections")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


# What loading the collection's filters, and then calling `typed`, imports of the core.
_LOADED = """
import json, sys
from ansible.plugins.loader import filter_loader, init_plugin_loader
init_plugin_loader([sys.argv[1]])
core = "ansible_collections.socketwise.kit.plugins.module_utils.socketwise."
typed = filter_loader.get("socketwise.kit.typed")
on_load = sorted(name for name in sys.modules if name.startswith(core))
assert typed.j2_function({"credentials_tls": "yes"}) == {"credentials_tls": True}
on_call = sorted(name[len(core):] for name in sys.modules if name.startswith(core))
print(json.dumps([on_load, on_call]))
"""


def test_a_task_that_uses_a_filter_imports_only_the_core_that_filter_needs():
    # Each task loads every filter file of the collection in a process of its own; the
    # core imported at the top of them cost about 90 ms in every such task
    # (docs/development/architecture.md).
    on_load, on_call = yaml.safe_load(in_a_task_process(_LOADED))
    assert on_load == []
    assert on_call == ["common", "common.typed"]


_RESOLVED = """
import ast, importlib, pathlib, sys
from ansible.plugins.loader import filter_loader, init_plugin_loader
init_plugin_loader([sys.argv[1]])
filter_loader.get("socketwise.kit.typed")
core = "ansible_collections.socketwise.kit.plugins.module_utils.socketwise."
for path in sorted(pathlib.Path("plugins/filter").glob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module.startswith(core):
            for alias in node.names:
                module = importlib.import_module(node.module)
                if not hasattr(module, alias.name):
                    importlib.import_module(f"{node.module}.{alias.name}")
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "core_filter":
            module, name = (argument.value for argument in node.args)
            getattr(importlib.import_module(core + module), name)
"""


def test_every_import_a_filter_makes_when_called_resolves():
    # Imported only when a filter is called, a misspelt name would fail only in the task
    # that first calls it.
    in_a_task_process(_RESOLVED)
