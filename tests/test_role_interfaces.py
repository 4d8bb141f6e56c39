"""Roles talk through declared interfaces: a role's `__<role>_*` names are its own, and no
other role, template or playbook reads them. The reads that remain from before the
collection's redesign are recorded, file by file, in tests/fixtures/foreign-private-names.yml;
the record only shrinks. A new reach-in fails here, naming the file, the role and the name
(publish what others need as a documented output instead), and one that is gone fails
until it leaves the record, so the list stays the true size of what is left to untangle."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from .playbooks import REPO

RECORD = REPO / "tests/fixtures/foreign-private-names.yml"
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
    R's names; templates/, playbooks/ and molecule/ own none."""
    found: dict[str, list[str]] = {}
    for path in scanned_files():
        relative = path.relative_to(REPO)
        mine = relative.parts[1] if relative.parts[0] == "roles" else None
        names = {
            f"__{name}"
            for name in PRIVATE.findall(path.read_text())
            if owner_of_name(name) not in (None, mine)
        }
        if names:
            found[str(relative)] = sorted(names)
    return found


def test_no_file_reads_another_roles_private_names_beyond_the_shrinking_record():
    recorded = yaml.safe_load(RECORD.read_text()) or {}
    found = foreign_reads()
    new = [
        f"{path} reads {owner_of_name(name[2:])}'s private {name}: read a declared output "
        "of that role (its argument spec or a documented fact) instead"
        for path, names in found.items()
        for name in names
        if name not in recorded.get(path, [])
    ]
    assert new == []
    gone = [
        f"{path} no longer reads {name}: take it out of {RECORD.relative_to(REPO)}"
        for path, names in recorded.items()
        for name in names
        if name not in found.get(path, [])
    ]
    assert gone == []


def test_the_scan_sees_a_reach_in_and_names_its_owner():
    assert owner_of_name("vllm_service_api_key") == "vllm_service"
    assert owner_of_name("vllm_venv_path") == "vllm"
    assert owner_of_name("socketwise_plan") is None
    text = "{{ __vllm_service_api_key }} {{ __benchmark_dir }} {{ x.__vllm_y }} a__cluster_b"
    assert {owner_of_name(name) for name in PRIVATE.findall(text)} == {"vllm_service", "benchmark"}
