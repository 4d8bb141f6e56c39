"""What each entry point of each role reads, found by reading the role as Ansible runs it:
the entry point's task file, the task files it includes (with the variables each include
binds), the templates its tasks render (and those they include), the handlers its tasks
notify, and the role's `defaults/` and `vars/` definitions those reach, followed to the
end. A read of `__ROLE_typed.NAME` is a read of NAME alone (the typed copy of the role's
inputs). Dynamic includes name their files: a template with quoted alternatives
(`{{ 'a' if x else 'b' }}.yml`) includes each; any other is listed in DYNAMIC."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import jinja2
import yaml
from jinja2 import meta, nodes

from .playbooks import REPO

ROLES = sorted((path.name for path in (REPO / "roles").iterdir() if path.is_dir()), key=len)
TEMPLATED = re.compile(r"{{|{%")
BARE = {"when", "failed_when", "changed_when", "until"}  # Jinja expressions without braces
INCLUDES = {"include_tasks", "import_tasks"}
ROLE_CALLS = {"include_role", "import_role"}
# Includes and templates whose file name comes from a variable without quoted
# alternatives: the files each may name. An unlisted one fails the scan, asking for it.
DYNAMIC = {
    ("cluster", "{{ __cluster_engine }}.yml"): ["vllm.yml", "llamacpp.yml"],
    ("cluster", "{{ __cluster_engine }}-start.yml"): ["vllm-start.yml", "llamacpp-start.yml"],
    ("monitor", "{{ __monitor_templates }}/{{ item }}.j2"): [
        "socketwise-prometheus.service.j2",
        "socketwise-alertmanager.service.j2",
    ],
}


class _AnyName(dict):
    """Filters and tests by any name: the scan parses, it never renders."""

    def __contains__(self, key: object) -> bool:
        return True

    def get(self, key, default=None):
        return super().get(key) or (lambda *args, **kwargs: None)

    def __getitem__(self, key):
        return self.get(key)


_ENV = jinja2.Environment(extensions=["jinja2.ext.do", "jinja2.ext.loopcontrols"])
_ENV.filters = _AnyName(_ENV.filters)
_ENV.tests = _AnyName(_ENV.tests)


def _names(ast: nodes.Template) -> set[str]:
    """The variables a parsed template reads; `__R_typed.X` (or `['X']`) reads X."""
    found = set(meta.find_undeclared_variables(ast))
    for typed in [name for name in found if re.fullmatch(r"__\w+_typed", name)]:
        uses = [node for node in ast.find_all(nodes.Name) if node.name == typed]
        keys = [
            node.attr
            for node in ast.find_all(nodes.Getattr)
            if isinstance(node.node, nodes.Name) and node.node.name == typed
        ] + [
            node.arg.value
            for node in ast.find_all(nodes.Getitem)
            if isinstance(node.node, nodes.Name) and node.node.name == typed
            and isinstance(node.arg, nodes.Const)
        ]  # fmt: skip
        if len(keys) == len(uses):
            found = (found - {typed}) | set(keys)
    # Another host's value of a variable: hostvars[host].NAME or hostvars[host]['NAME'].
    for node in ast.find_all((nodes.Getattr, nodes.Getitem)):
        inner = node.node
        if (
            isinstance(inner, nodes.Getitem)
            and isinstance(inner.node, nodes.Name)
            and inner.node.name == "hostvars"
        ):
            if isinstance(node, nodes.Getattr):
                found.add(node.attr)
            elif isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
                found.add(node.arg.value)
    return found


def names_in(value: object, bare: bool = False) -> set[str]:
    """The variables a task's value reads (strings, lists and mappings of them)."""
    if isinstance(value, str):
        if bare and not TEMPLATED.search(value):
            value = "{{ " + value + " }}"
        return _names(_ENV.parse(value)) if TEMPLATED.search(value) else set()
    if isinstance(value, list):
        return set().union(*(names_in(item, bare) for item in value))
    if isinstance(value, dict):
        return set().union(*(names_in(item) for item in value.values()))
    return set()


def flat_tasks(tasks: list | None) -> list[dict]:
    """A task file's tasks in the order they run, blocks opened."""
    flat = []
    for task in tasks or []:
        inner = [t for key in ("block", "rescue", "always") for t in task.get(key) or []]
        flat += flat_tasks(inner) if inner else [task]
    return flat


def _action(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def included_files(role: str, target: str) -> list[str]:
    """The task files an include of TARGET may run."""
    if not TEMPLATED.search(target):
        return [target]
    if (role, target) in DYNAMIC:
        return DYNAMIC[(role, target)]
    head, expression, tail = re.fullmatch(r"(.*){{(.*)}}(.*)", target).groups()
    choices = _branches(_ENV.parse("{{" + expression + "}}").body[0].nodes[0])
    assert choices, f"roles/{role}: include of {target}: list the files it may name in DYNAMIC"
    return [head + choice + tail for choice in choices]


def _branches(node: nodes.Node) -> list[str]:
    """The strings an expression of quoted alternatives gives (`'a' if x else 'b'`)."""
    if isinstance(node, nodes.CondExpr) and node.expr2 is not None:
        choices = [_branches(node.expr1), _branches(node.expr2)]
        return choices[0] + choices[1] if all(choices) else []
    return [node.value] if isinstance(node, nodes.Const) and isinstance(node.value, str) else []


def template_paths(role: str, source: str) -> list[Path]:
    """The files a template task's src may name: by the name after its last folder, in
    the role's templates/ or the kit's."""
    paths = []
    for name in DYNAMIC.get((role, source), [source.rsplit("/", 1)[-1]]):
        assert not TEMPLATED.search(name), f"roles/{role}: template {source}: list it in DYNAMIC"
        folders = [REPO / "roles" / role / "templates", REPO / "templates"]
        found = [
            path for folder in folders if folder.is_dir() for path in sorted(folder.rglob(name))
        ]
        assert found, f"roles/{role}: no template {source}"
        paths.append(found[0])
    return paths


@cache
def template_files(path: Path) -> frozenset[Path]:
    """PATH and the templates it includes, followed to the end."""
    found = {path}
    for included in meta.find_referenced_templates(_ENV.parse(path.read_text())):
        if included and (sibling := path.parent / included).exists():
            found |= template_files(sibling)
    return frozenset(found)


@cache
def template_reads(path: Path) -> frozenset[str]:
    """What PATH and the templates it includes read."""
    return frozenset().union(
        *(_names(_ENV.parse(file.read_text())) for file in template_files(path))
    )


@dataclass
class _Walk:
    role: str
    rendered: set[Path] = field(default_factory=set)
    reads: set[str] = field(default_factory=set)
    sets: set[str] = field(default_factory=set)
    notified: set[str] = field(default_factory=set)
    walked: set[tuple[str, frozenset[str]]] = field(default_factory=set)

    def file(self, name: str, bound: frozenset[str] = frozenset()) -> None:
        name = name if name.endswith(".yml") else f"{name}.yml"
        if (name, bound) in self.walked:
            return
        self.walked.add((name, bound))
        for task in yaml.safe_load((REPO / "roles" / self.role / "tasks" / name).read_text()) or []:
            self.task(task, bound)

    def task(self, task: dict, bound: frozenset[str]) -> None:
        variables = task.get("vars") or {}
        self.reads |= names_in(variables) - bound
        loop_var = (task.get("loop_control") or {}).get("loop_var", "item")
        local = bound | set(variables) | {loop_var, "item", "ansible_loop"}
        for key, value in task.items():
            if key in ("block", "rescue", "always"):
                for inner in value or []:
                    self.task(inner, local)
                continue
            if key == "vars":
                continue
            self.reads |= names_in(value, bare=key in BARE) - local
            action = _action(key)
            if action in INCLUDES:
                target = value if isinstance(value, str) else value["file"]
                for name in included_files(self.role, target):
                    self.file(name, local)
            elif action == "set_fact":
                self.sets |= set(value) - {"cacheable"}
            elif action == "template":
                for path in template_paths(self.role, value["src"]):
                    self.reads |= template_reads(path) - local
                    self.rendered |= template_files(path)
            elif key == "register":
                self.sets.add(value)
            elif key == "notify":
                self.notified |= {value} if isinstance(value, str) else set(value)

    def handlers(self) -> None:
        path = REPO / "roles" / self.role / "handlers" / "main.yml"
        for handler in (yaml.safe_load(path.read_text()) if path.exists() else None) or []:
            if {handler.get("name"), handler.get("listen")} & self.notified:
                self.task(handler, frozenset())


def _definitions(role: str, kind: str) -> dict[str, object]:
    path = REPO / "roles" / role / kind / "main.yml"
    return (yaml.safe_load(path.read_text()) if path.exists() else None) or {}


def public_of(role: str, names: set[str]) -> set[str]:
    """The names that are ROLE's public ones (`vllm_x` is vllm's, `vllm_service_x` is not)."""
    longer = [other for other in ROLES if other != role and other.startswith(f"{role}_")]
    return {
        name for name in names
        if name.startswith(f"{role}_") and not any(name.startswith(f"{other}_") for other in longer)
    }  # fmt: skip


@cache
def _whole_role(role: str) -> _Walk:
    """A walk of every task file of ROLE."""
    walk = _Walk(role)
    for path in sorted((REPO / "roles" / role / "tasks").glob("*.yml")):
        walk.file(path.name)
    return walk


@cache
def renderers() -> dict[Path, frozenset[str]]:
    """{template: the roles whose tasks render it, or a template it is included in}."""
    found: dict[Path, set[str]] = {}
    for role in ROLES:
        for path in _whole_role(role).rendered:
            found.setdefault(path, set()).add(role)
    return {path: frozenset(roles) for path, roles in found.items()}


@cache
def outputs(role: str) -> frozenset[str]:
    """ROLE's public names that the role sets itself (in vars/ or by set_fact) and no
    default gives: what it publishes, not what it is given (and may normalise)."""
    published = set(_definitions(role, "vars")) | _whole_role(role).sets
    return frozenset(public_of(role, published) - set(_definitions(role, "defaults")))


@cache
def reached_names(role: str, entry_point: str) -> frozenset[str]:
    """Every variable ENTRY_POINT of ROLE reads that it does not set itself, its role's
    `defaults/` and `vars/` definitions followed to the names they read."""
    walk = _Walk(role)
    walk.file(entry_point)
    walk.handlers()
    defaults = _definitions(role, "defaults")
    definitions = defaults | _definitions(role, "vars")
    reached: set[str] = set()
    todo = [name for name in walk.reads if name not in walk.sets or name in defaults]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo += names_in(definitions.get(name))
    return frozenset(reached)


@cache
def entry_point_reads(role: str, entry_point: str) -> frozenset[str]:
    """The public variables of ROLE that ENTRY_POINT reads and is given (not those the
    role publishes itself)."""
    return frozenset(public_of(role, set(reached_names(role, entry_point))) - outputs(role))


def foreign_inputs(role: str, entry_point: str) -> frozenset[str]:
    """The inputs of other roles that ENTRY_POINT reads (`door_metrics_port` read
    by the monitor): public names of another role that it does not publish."""
    reached = set(reached_names(role, entry_point))
    return frozenset(
        name
        for other in ROLES
        if other != role
        for name in public_of(other, reached) - outputs(other)
    )


@cache
def used_entry_points() -> dict[str, frozenset[str]]:
    """{role: the entry points something in the kit runs}: main (a role that has one), and
    every tasks_from of a playbook, a role or a molecule scenario."""
    used: dict[str, set[str]] = {
        role: {"main"} if (REPO / "roles" / role / "tasks" / "main.yml").exists() else set()
        for role in ROLES
    }

    def visit(value: object) -> None:
        if isinstance(value, list):
            for item in value:
                visit(item)
        elif isinstance(value, dict):
            for key, inner in value.items():
                if _action(key) in ROLE_CALLS and isinstance(inner, dict):
                    role = inner["name"].rsplit(".", 1)[-1]
                    target = inner.get("tasks_from", "main")
                    used[role] |= {Path(name).stem for name in included_files(role, target)}
                visit(inner)

    patterns = ["roles/*/tasks/*.yml", "playbooks/*.yml", "molecule/*/*.yml", "*.yml"]
    for pattern in patterns:
        for path in REPO.glob(pattern):
            visit(yaml.safe_load(path.read_text()))
    return {role: frozenset(entry_points) for role, entry_points in used.items()}
