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

from ..plan.planner import MAX_PORT

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_PATH = re.compile(r"/[A-Za-z0-9._/+-]*")
_CLUSTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]*")
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")
# What a key or token may hold: one word a unit's EnvironmentFile and HAProxy's
# configuration read as itself, long enough not to be guessed.
_SECRET = re.compile(r"[A-Za-z0-9._~+/=-]{16,512}")
# vLLM's --dtype choices ("" takes the build class's).
DTYPES = ("", "auto", "half", "float16", "bfloat16", "float", "float32")


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


def _paths_and_name(values: Mapping[str, object], paths: tuple[str, ...]) -> list[str]:
    """The PATHS variables as plain absolute paths, and the served model name."""
    errors = []
    for variable in paths:
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
    return errors


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
    errors += _paths_and_name(values, ("vllm_home", "vllm_venv"))
    dtype = values.get("vllm_service_dtype", "")
    if dtype not in DTYPES:
        errors.append(
            _problem(
                "vllm_service_dtype",
                dtype,
                "is not one of vLLM's dtypes",
                f"give one of {', '.join(DTYPES[1:])}, or leave it empty for the build class's",
            )
        )
    if values.get("vllm_model_hf_id") and not _HUB_ID.fullmatch(str(values["vllm_model_hf_id"])):
        errors.append(
            _problem(
                "vllm_model_hf_id",
                values["vllm_model_hf_id"],
                "is not a Hugging Face model id",
                "give ORG/NAME with letters, digits and . _ - only",
            )
        )
    return errors + address_errors(values)


def cluster_value_errors(values: Mapping[str, object]) -> list[str]:
    """The values a cluster's units and front door are written with (socketwise_cluster,
    vllm_served_name, vllm_home, cluster_address), as unit_value_errors says them."""
    errors = []
    name = values.get("socketwise_cluster")
    if not isinstance(name, str) or not _CLUSTER_NAME.fullmatch(name):
        errors.append(
            _problem(
                "socketwise_cluster",
                name,
                "is not a cluster name",
                "use up to 64 letters, digits and . _ - (first a letter or digit)",
            )
        )
    errors += _paths_and_name(values, ("vllm_home",))
    return errors + address_errors({"cluster_address": values.get("cluster_address")})


def address_errors(values: Mapping[str, object]) -> list[str]:
    """The front door on the public address, the instances on a loopback one, the metrics
    listener on a named (not wildcard) one, each port in 1-65535 (those given in `values`;
    a fleet front door has only the public address and its port)."""
    errors = []
    rules = [
        ("vllm_service_listen_address", lambda a: True, "give one such as 127.0.0.1 or 0.0.0.0"),
        (
            "vllm_service_backend_address",
            lambda a: a.is_loopback,
            "give a loopback address such as 127.0.0.1: only the front door may be reachable",
        ),
        (
            "vllm_service_metrics_address",
            lambda a: not a.is_unspecified,
            "give the monitoring network's address of this host, or 127.0.0.1, not a wildcard",
        ),
        (
            "cluster_address",
            lambda a: not a.is_unspecified and (a.is_private or a.is_loopback),
            "give this host's address on the cluster's private network (llama.cpp's RPC and "
            "vLLM's pipeline have no authentication), not a wildcard or a public one",
        ),
    ]
    for variable, allowed, fix in rules:
        if variable not in values:
            continue
        address = values[variable]
        try:
            parsed = ipaddress.ip_address(str(address))
        except ValueError:
            errors.append(_problem(variable, address, "is not an IP address", fix))
            continue
        if not allowed(parsed):
            errors.append(_problem(variable, address, "is not allowed here", fix))
    for variable in ("vllm_service_metrics_port", "vllm_service_fleet_port"):
        port = values.get(variable, 1)
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= MAX_PORT:
            errors.append(_problem(variable, port, "is not a port", f"give 1-{MAX_PORT}"))
    return errors


def secret_errors(values: Mapping[str, object]) -> list[str]:
    """What is wrong with the API key and the Hugging Face token, naming the variable but
    never the value; and a public front door without a key that was not asked for."""
    errors = []
    for variable in ("vllm_service_api_key", "vllm_service_hf_token"):
        secret = values.get(variable) or ""
        if secret and not (isinstance(secret, str) and _SECRET.fullmatch(secret)):
            errors.append(
                f"{variable}: is shorter than 16 characters or holds others than letters, "
                "digits and . _ ~ + / = -; generate one with `openssl rand -hex 32`"
            )
    listen = str(values.get("vllm_service_listen_address", ""))
    try:
        public = not ipaddress.ip_address(listen).is_loopback
    except ValueError:
        public = True
    if (
        public
        and not values.get("vllm_service_api_key")
        and not values.get("vllm_service_allow_anonymous")
    ):
        errors.append(
            f"vllm_service_api_key: is empty and the front door listens on {listen}, which "
            "is not a loopback address; set vllm_service_api_key (with Ansible Vault) or "
            "vllm_service_api_key_file, or vllm_service_allow_anonymous: true on purpose"
        )
    return errors
