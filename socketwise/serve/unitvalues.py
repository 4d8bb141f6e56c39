"""Values that go into a systemd unit: checked before anything changes, then quoted so no
value can rewrite the unit.

A value with a newline would start a new unit line (`--x\\nUser=root` runs the service
as root); `%` is a systemd specifier, `$` expands a variable on a command line, and a
space splits a word. `unit_value_errors` refuses what cannot be made safe, naming the
variable and the fix; `quote` writes any other value as one systemd word that stands
for itself.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_PATH = re.compile(r"/[A-Za-z0-9._/+-]*")
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]*")


def quote(value: object, command_line: bool = True) -> str:
    """One systemd word for `value`: double-quoted, `\\` and `"` escaped, `%` doubled (a
    specifier otherwise) and, on a command line, `$` doubled (a variable otherwise)."""
    text = str(value)
    if _CONTROL.search(text):
        raise ValueError(f"{text!r} holds a control character (a newline?)")
    text = text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    if command_line:
        text = text.replace("$", "$$")
    return f'"{text}"'


def _problem(variable: str, value: object, what: str, fix: str) -> str:
    return f"{variable}={value!r}: {what}; {fix}"


def unit_value_errors(values: Mapping[str, object]) -> list[str]:
    """Every value of `values` (the role variables that reach a unit) that cannot go into one,
    as 'variable=value: what is wrong; the fix'. Empty when all can."""
    errors = []
    words = [
        (f"vllm_service_extra_args[{i}]", arg)
        for i, arg in enumerate(values.get("vllm_service_extra_args") or [])
    ]
    words += [("vllm_model", values.get("vllm_model", ""))]
    for variable, word in words:
        if not isinstance(word, str) or _CONTROL.search(word):
            errors.append(
                _problem(
                    variable,
                    word,
                    "holds a newline or another control "
                    "character, which would start a new unit line",
                    "give each argument as one line of text",
                )
            )
    environment = values.get("vllm_service_environment") or {}
    if not isinstance(environment, Mapping):
        errors.append(
            _problem(
                "vllm_service_environment",
                environment,
                "is not a mapping",
                "give NAME: value pairs",
            )
        )
        environment = {}
    for name, value in environment.items():
        variable = f"vllm_service_environment.{name}"
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            errors.append(
                _problem(
                    variable,
                    name,
                    "is not an environment variable name",
                    "use letters, digits and _ (not first a digit), no spaces",
                )
            )
        elif _CONTROL.search(str(value)):
            errors.append(
                _problem(
                    variable,
                    value,
                    "holds a newline or another control character",
                    "give the value on one line",
                )
            )
    user = values.get("vllm_user")
    if not isinstance(user, str) or not _USER.fullmatch(user) or user == "root":
        errors.append(
            _problem(
                "vllm_user",
                user,
                "is root or not a user name",
                "name a dedicated account such as vllm (lower case, up to 32)",
            )
        )
    for variable in ("vllm_home", "vllm_venv"):
        path = values.get(variable)
        if not isinstance(path, str) or not _PATH.fullmatch(path):
            errors.append(
                _problem(
                    variable,
                    path,
                    "is not an absolute path of plain characters",
                    "use letters, digits and . _ - + / only",
                )
            )
    name = values.get("vllm_served_name")
    if not isinstance(name, str) or not _MODEL_NAME.fullmatch(name):
        errors.append(
            _problem(
                "vllm_served_model_name",
                name,
                "is not a model name",
                "use letters, digits and . _ : / - only",
            )
        )
    address = values.get("vllm_service_listen_address")
    try:
        ipaddress.ip_address(str(address))
    except ValueError:
        errors.append(
            _problem(
                "vllm_service_listen_address",
                address,
                "is not an IP address",
                "give one such as 127.0.0.1 or 0.0.0.0",
            )
        )
    return errors
