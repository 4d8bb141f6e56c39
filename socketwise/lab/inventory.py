"""An inventory that is another one plus variables for all its hosts, for the shipped
comparison scripts (scripts/): the same hosts measured with one setting changed."""

from __future__ import annotations

import json
from pathlib import Path


def inventory_with(inventory: Path, variables: dict[str, object], into: Path) -> Path:
    """INTO: INVENTORY's files and group_vars (linked), plus group_vars/all.yml holding
    VARIABLES. Refused when INVENTORY already has group_vars for `all`, which this would
    shadow or be shadowed by."""
    into.mkdir(parents=True)
    for entry in inventory.iterdir():
        if entry.name != "group_vars":
            (into / entry.name).symlink_to(entry.resolve())
    group_vars = into / "group_vars"
    group_vars.mkdir()
    for entry in (inventory / "group_vars").iterdir():
        if entry.stem == "all":
            raise ValueError(f"{entry} exists: set {', '.join(variables)} there instead")
        (group_vars / entry.name).symlink_to(entry.resolve())
    # JSON is YAML: every value arrives with its type and nothing needs escaping.
    lines = [f"{name}: {json.dumps(value)}" for name, value in variables.items()]
    (group_vars / "all.yml").write_text("---\n" + "\n".join(lines) + "\n")
    return into
