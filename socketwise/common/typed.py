"""The roles' numbers and switches as their types, converted once.

Ansible's argument-spec check says a variable is an int but hands the role the value as
given, and `-e name=3` gives the string "3": multiplied, it repeats ("3" * 610), added to
a number it fails deep in a later play. Each role converts the variables it reads here,
with the types its `meta/argument_specs.yml` declares, and refuses in play 1 a value that
does not convert, naming the variable and the value.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path

ROLES = Path(__file__).resolve().parents[2] / "roles"
# Ansible's own spellings of a boolean (module_utils.parsing.convert_bool).
TRUE = {"yes", "on", "1", "true", "y", "t"}
FALSE = {"no", "off", "0", "false", "n", "f", ""}
_INT = re.compile(r"[+-]?[0-9]+")
CONVERTED = ("int", "float", "bool")


class NotConverted(ValueError):
    """A value that does not spell its declared type."""


def convert(value: object, kind: str) -> object:
    """VALUE as KIND (int, float or bool); None stays None (a spec'd null default)."""
    if value is None:
        return None
    text = value.strip() if isinstance(value, str) else value
    if kind == "bool":
        if isinstance(text, bool):
            return text
        if isinstance(text, int | float) and text in (0, 1):
            return bool(text)
        if isinstance(text, str) and text.lower() in TRUE | FALSE:
            return text.lower() in TRUE
        raise NotConverted("is not a boolean; give true or false")
    if isinstance(text, bool):
        raise NotConverted(f"is a boolean, not a{'n integer' if kind == 'int' else ' number'}")
    if kind == "int":
        if isinstance(text, int):
            return text
        if isinstance(text, float) and text.is_integer():
            return int(text)
        if isinstance(text, str) and _INT.fullmatch(text):
            return int(text)
        raise NotConverted("is not a whole number")
    if isinstance(text, int | float):
        number = float(text)
    else:
        try:
            number = float(str(text))
        except ValueError:
            raise NotConverted("is not a number") from None
    # "nan" and "inf" spell floats to Python, and a threshold of either never trips.
    if not math.isfinite(number):
        raise NotConverted("is not a finite number")
    return number


@cache
def declared_types() -> dict[str, str]:
    """Every role variable the argument specs declare int, float or bool: {name: type}."""
    import yaml  # controller-side only: hosts never convert

    # libyaml's loader where PyYAML has it: each task that reads a role's typed values runs
    # this in a process of its own, and the pure-Python loader takes about 12 times as long.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    types: dict[str, str] = {}
    for spec in sorted(ROLES.glob("*/meta/argument_specs.yml")):
        for entry in (yaml.load(spec.read_text(), Loader=loader)["argument_specs"] or {}).values():
            for name, option in (entry.get("options") or {}).items():
                if option.get("type") in CONVERTED:
                    types[name] = option["type"]
    return types


def typed(values: Mapping[str, object], types: Mapping[str, str]) -> dict[str, object]:
    """VALUES with each converted to its declared type; one that does not convert stays as
    given (type_errors names it, and play 1 stops on it)."""
    result: dict[str, object] = {}
    for name, value in values.items():
        try:
            result[name] = convert(value, types[name])
        except NotConverted:
            result[name] = value
    return result


def type_errors(values: Mapping[str, object], types: Mapping[str, str]) -> list[str]:
    """'name=value: what is wrong; the fix' for each value of VALUES that does not convert."""
    errors = []
    for name, value in values.items():
        try:
            convert(value, types[name])
        except NotConverted as wrong:
            errors.append(f"{name}={value!r}: {wrong}")
    return errors


def undeclared(names: Iterable[str], types: Mapping[str, str]) -> list[str]:
    """NAMES the specs do not declare as int, float or bool (a role's typed list that drifted)."""
    return sorted(set(names) - set(types))
