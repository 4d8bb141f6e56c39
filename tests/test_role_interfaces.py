"""Roles talk through declared interfaces. Each entry point's argument spec declares exactly
the role's variables it reads (tests/role_reads.py finds them); the entry point that checks
a role's values in play 1 declares every variable any of its entry points reads, so a bad
value is refused before anything changes. A role's `__<role>_*` names are its own, and no
other role, template or playbook reads them: a reach-in fails here, naming the file, the
role and the name (publish what others need as a documented output instead). The inputs
of other roles an entry point still reads are recorded in tests/fixtures/foreign-inputs.yml;
that record only shrinks, and one that is gone fails until it leaves the record, so the
list stays the true size of what is left to untangle."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from .playbooks import REPO
from .role_reads import (
    entry_point_reads,
    flat_tasks,
    foreign_inputs,
    names_in,
    renderers,
    used_entry_points,
)

INPUTS_RECORD = REPO / "tests/fixtures/foreign-inputs.yml"
ROLES = sorted((path.name for path in (REPO / "roles").iterdir() if path.is_dir()), key=len)
# A private name, not part of a longer word or a dotted attribute.
PRIVATE = re.compile(r"(?<![\w.])__([a-z][a-z0-9_]*)")


def owner_of_name(name: str) -> str | None:
    """The role whose private name NAME (without its `__`) is: the longest role name it
    starts with (`vllm_service_x` is vllm_service's, `vllm_x` vllm's), else None."""
    owners = [role for role in ROLES if name.startswith(f"{role}_")]
    return owners[-1] if owners else None


def scanned_files() -> list[Path]:
    patterns = ["roles/**/*.yml", "roles/**/*.j2", "templates/**/*.j2", "playbooks/**/*.yml",
                "molecule/**/*.yml", "*.yml"]  # fmt: skip
    return sorted({path for pattern in patterns for path in REPO.glob(pattern)})


def foreign_reads() -> dict[str, list[str]]:
    """For each file, the private names of other roles it reads. A file under roles/R owns
    R's names; a template, the names of the one role that renders it (a role's name read
    in a template another role renders too, directly or through an include, is that
    other role's reach-in: the template takes it from a declared output or from what its
    including template sets); playbooks/ and molecule/ own none."""
    found: dict[str, list[str]] = {}
    rendering = renderers()
    for path in scanned_files():
        relative = path.relative_to(REPO)
        if relative.parts[0] == "roles":
            mine = {relative.parts[1]}
        else:
            rendered_by = set(rendering.get(path, ()))
            mine = rendered_by if len(rendered_by) == 1 else set()
        names = {
            f"__{name}"
            for name in PRIVATE.findall(path.read_text())
            if owner_of_name(name) is not None and owner_of_name(name) not in mine
        }
        if names:
            found[str(relative)] = sorted(names)
    return found


def beyond_record(found: dict[str, list[str]], record: Path) -> tuple[list, list[str]]:
    """What FOUND holds that the shrinking RECORD does not, as (key, name) pairs, and a
    line for each recorded name no longer found (take it out of the record)."""
    recorded = yaml.safe_load(record.read_text()) or {}
    new = [(key, name) for key, names in found.items() for name in names
           if name not in recorded.get(key, [])]  # fmt: skip
    gone = [
        f"{key} no longer reads {name}: take it out of {record.relative_to(REPO)}"
        for key, names in recorded.items()
        for name in names
        if name not in found.get(key, [])
    ]
    return new, gone


def test_no_file_reads_another_roles_private_names():
    assert [
        f"{path} reads {owner_of_name(name[2:])}'s private {name}: read a declared output "
        "of that role (its argument spec or a documented fact) instead"
        for path, names in foreign_reads().items()
        for name in names
    ] == []


def test_the_scan_sees_a_reach_in_and_names_its_owner():
    assert owner_of_name("credentials_api_key") == "credentials"
    assert owner_of_name("vllm_service_hf_token") == "vllm_service"
    assert owner_of_name("door_listen_address") == "door"
    assert owner_of_name("vllm_venv_path") == "vllm"
    assert owner_of_name("socketwise_plan") is None
    text = "{{ __vllm_service_api_key }} {{ __benchmark_dir }} {{ x.__vllm_y }} a__cluster_b"
    assert {owner_of_name(name) for name in PRIVATE.findall(text)} == {"vllm_service", "benchmark"}


# The entry point that checks a role's values in play 1 (playbooks/check.yml), before any
# other of its entry points runs anywhere.
CHECKS = {"vllm_service": "values", "cluster": "check", "host_tuning": "decide",
          "vllm": "prepare", "monitor": "preflight", "rollout": "check",
          "fleet_door": "preflight", "node_exporter": "check",
          "credentials": "check"}  # fmt: skip


def specs(role: str) -> dict[str, dict]:
    path = REPO / "roles" / role / "meta" / "argument_specs.yml"
    return yaml.safe_load(path.read_text())["argument_specs"]


def inventory_variables(role: str) -> set[str]:
    """ROLE's variables an inventory sets (defaults/main.yml gives each a value), unlike an
    entry point's parameters, which its caller binds."""
    return set(yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text()) or {})


def expected_options(role: str, entry_point: str) -> set[str]:
    reads = set(entry_point_reads(role, entry_point))
    if CHECKS.get(role) == entry_point:
        for other in used_entry_points()[role] | set(specs(role)):
            reads |= entry_point_reads(role, other) & inventory_variables(role)
    return reads


def test_every_entry_point_declares_exactly_the_variables_it_reads():
    wrong = []
    for role, entry_points in used_entry_points().items():
        declared_specs = specs(role)
        for entry_point in sorted(entry_points | set(declared_specs)):
            if entry_point not in declared_specs:
                wrong.append(f"roles/{role}: tasks_from {entry_point} has no argument spec")
                continue
            declared = set(declared_specs[entry_point].get("options") or {})
            expected = expected_options(role, entry_point)
            wrong += [f"roles/{role}: {entry_point} reads {name}: declare it in its argument spec"
                      for name in sorted(expected - declared)]  # fmt: skip
            wrong += [f"roles/{role}: {entry_point} declares {name} but never reads it: take it out"
                      for name in sorted(declared - expected)]  # fmt: skip
    assert wrong == []


def test_the_read_scan_follows_includes_templates_defaults_and_typed_values(tmp_path):
    # A bare condition, a typed value, another host's value, a loop variable bound by the
    # task, a name a template sets itself, and quoted alternatives of an include.
    assert names_in("x_a is defined and __r_typed.x_b", bare=True) == {"x_a", "x_b"}
    assert names_in("{{ hostvars[h]['x_c'] + hostvars[h].x_d }}") >= {"x_c", "x_d", "h"}
    assert names_in("{% set y = 1 %}{% for i in x_e %}{{ i + y }}{% endfor %}") == {"x_e"}
    # The kit's own roles: an entry point's includes, the templates its tasks render and the
    # definitions of vars/ those reach.
    assert "vllm_service_restart_sec" in entry_point_reads(
        "vllm_service", "main"
    )  # vllm.service.j2
    assert "door_start_limit_burst" in entry_point_reads("door", "unit")  # socketwise-lb.service.j2
    assert "fleet_door_drain_out" in entry_point_reads("fleet_door", "drain")
    assert "fleet_door_port" not in entry_point_reads("fleet_door", "drain")
    # deploy.yml: tasks_from "{{ 'main' if vllm_service_state ... == 'present' else 'absent' }}"
    assert {"main", "absent"} <= used_entry_points()["cluster"]
    assert "present" not in used_entry_points()["cluster"]


def test_each_role_says_its_job_and_names_each_entry_point_in_its_readme():
    for role in used_entry_points():
        readme = REPO / "roles" / role / "README.md"
        assert readme.exists(), f"roles/{role} has no README.md"
        text = readme.read_text()
        job = text.split("\n\n")[1]
        assert job.count(". ") == 0 and job.endswith("."), f"roles/{role}: its job in one sentence"
        missing = [entry for entry in specs(role) if f"- `{entry}` (" not in text]
        assert missing == [], f"roles/{role}/README.md names no entry point {missing}"


def undeclared_foreign_inputs() -> dict[str, list[str]]:
    """{"ROLE: ENTRY_POINT": the inputs of other roles it reads and its spec does not
    declare}: where a role still reads another role's input instead of a declared output."""
    found = {}
    for role, entry_points in used_entry_points().items():
        for entry_point in sorted(entry_points):
            declared = set(specs(role).get(entry_point, {}).get("options") or {})
            names = foreign_inputs(role, entry_point) - declared
            if names:
                found[f"{role}: {entry_point}"] = sorted(names)
    return found


def test_no_entry_point_reads_another_roles_inputs_beyond_the_shrinking_record():
    """An entry point that reads another role's input (the monitor reading
    door_metrics_port) depends on that role's inputs, not on what it publishes.
    Those that remain are recorded in tests/fixtures/foreign-inputs.yml, which only
    shrinks: a new one fails here (read a declared output of that role instead), and one
    that is gone fails until it leaves the record."""
    new, gone = beyond_record(undeclared_foreign_inputs(), INPUTS_RECORD)
    assert [
        f"{entry} reads the input {name} of another role: "
        "read a declared output of that role instead"
        for entry, name in new
    ] == []
    assert gone == []


def _role_calls(task: dict) -> list[tuple[str, str, bool]]:
    """(role, entry point, public) of a task that includes or imports a role."""
    return [
        (call["name"].rsplit(".", 1)[-1], call.get("tasks_from", "main"), bool(call.get("public")))
        for key, call in task.items()
        if key.rsplit(".", 1)[-1] in ("include_role", "import_role") and isinstance(call, dict)
    ]


def _roles_run_by(role: str, entry_point: str) -> set[str]:
    """The roles an entry point includes, through its own task files."""
    found: set[str] = set()
    seen: set[str] = set()

    def walk(name: str) -> None:
        name = name if name.endswith(".yml") else f"{name}.yml"
        if name in seen:
            return
        seen.add(name)
        path = REPO / "roles" / role / "tasks" / name
        for task in flat_tasks(yaml.safe_load(path.read_text())):
            found.update(called for called, _, _ in _role_calls(task))
            for key, value in task.items():
                if key.rsplit(".", 1)[-1] in ("include_tasks", "import_tasks"):
                    target = value if isinstance(value, str) else value["file"]
                    if "{{" not in target:
                        walk(target)

    walk(entry_point)
    return found


def test_a_role_that_includes_vllm_service_gives_what_every_door_shares_first():
    """vllm_service depends on the door role, so a play-level vllm_service (deploy.yml) gives
    the roles its entry points include (credentials, release) door_settings. Included from
    another role, it does not: those roles see vllm_service's variables but not those of
    its dependency, and the run fails with 'door_settings is undefined' (a rollout did, at
    its install step). Such a role includes door: shared with public: true first."""
    readers = {
        role
        for role in ROLES
        if role not in ("door", "vllm_service")
        and any(
            "door_settings" in path.read_text() for path in (REPO / "roles" / role).rglob("*.yml")
        )
    }
    missing = []
    for path in sorted((REPO / "roles").glob("*/tasks/*.yml")):
        caller = path.parts[-3]
        if caller in ("door", "vllm_service"):
            continue
        shared = False
        for task in flat_tasks(yaml.safe_load(path.read_text())):
            for role, entry_point, public in _role_calls(task):
                if (role, entry_point, public) == ("door", "shared", True):
                    shared = True
                if role == "vllm_service" and not shared:
                    needs = _roles_run_by("vllm_service", entry_point) & readers
                    if needs:
                        missing.append(
                            f"{path.relative_to(REPO)}: vllm_service: {entry_point} runs"
                            f" {', '.join(sorted(needs))}, which read door_settings"
                        )
    assert not missing, "include door: shared with public: true first:\n" + "\n".join(missing)
