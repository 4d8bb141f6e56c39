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
import os.path
import re
from collections.abc import Mapping

from ..plan.shape import MAX_PORT

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
# `vllm serve` flags the kit sets from the plan and its own variables: given again in
# vllm_service_extra_args, argparse keeps the last one, and `--host 0.0.0.0` would put an
# instance past the front door. Each maps to what sets it.
_SOCKET_ONLY = (
    "an instance serves only on the Unix socket the kit gives it, which its door alone opens"
)
OWNED_FLAGS = {
    "--model": "vllm_model_path or vllm_model_hf_id",
    "--served-model-name": "vllm_served_model_name",
    "--host": _SOCKET_ONLY,
    "--port": _SOCKET_ONLY,
    "--api-key": "credentials_api_key",
    "--dtype": "vllm_service_dtype",
    "--max-model-len": "vllm_service_max_model_len",
    "--tensor-parallel-size": "plan_layout and plan_ranks",
    "--pipeline-parallel-size": "the cluster's plan",
    "--data-parallel-size": "plan_layout and plan_ranks",
    "--data-parallel-size-local": "plan_layout and plan_ranks",
    "--data-parallel-rank": "plan_layout and plan_ranks",
    "--data-parallel-address": "plan_layout",
    "--data-parallel-rpc-port": "plan_layout",
    "--distributed-executor-backend": "the plan",
    "--nnodes": "the cluster's plan",
    "--node-rank": "the cluster's plan",
    "--master-addr": "the cluster's plan",
    "--master-port": "cluster_master_port",
    "--headless": "the cluster's plan",
    "--api-server-count": "the cluster's plan",
    "--ssl-keyfile": "credentials_tls_cert and credentials_tls_key (TLS is the front door's)",
    "--ssl-certfile": "credentials_tls_cert and credentials_tls_key (TLS is the front door's)",
    "--uds": _SOCKET_ONLY,
    "--uvicorn-log-level": "the kit (warning)",
}
OWNED_SHORT_FLAGS = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size",
                     "-dp": "--data-parallel-size"}  # fmt: skip
# Environment the units set themselves, and names that hold a secret: a unit is
# world-readable, the secrets go to root-only files (credentials_api_key, _hf_token).
OWNED_ENVIRONMENT = {"VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE", "LD_PRELOAD", "HOME",
                     "USER", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "HF_HUB_OFFLINE"}  # fmt: skip
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|PRIVATE", re.IGNORECASE)
# Trees vllm_home may not be, nor lie in: the kit deletes below it what it made.
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/run", "/sbin",
                "/sys", "/tmp", "/usr", "/var/tmp")  # fmt: skip


# The least each count or duration may be: a 0 s HAProxy timeout means none, a start
# burst of 0 lets a unit restart forever, and systemd or llama.cpp refuse the rest.
MINIMUMS = {
    "vllm_service_restart_sec": 0,
    "vllm_service_start_limit_burst": 1,
    "door_start_limit_burst": 1,
    "vllm_service_ready_timeout": 1,
    "door_request_timeout": 1,
    "door_queue_timeout": 1,
    "door_max_body_bytes": 1,
    "door_client_max_connections": 0,
    "door_client_max_rate": 0,
    "cluster_ctx_size": 1,
    "cluster_parallel": 1,
    "cluster_check_interval": 1,
    "cluster_ready_timeout": 1,
    "cluster_wait_rpc_seconds": 1,
}


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


def path_error(variable: str, path: object) -> str | None:
    """Why PATH cannot be one of the kit's paths: not absolute, not plain characters, or
    not in its one normal form (`..`, `.`, `//` or a trailing `/`), which every comparison
    of paths (what to keep, what to delete) relies on."""
    if not isinstance(path, str) or not _PATH.fullmatch(path):
        return _problem(
            variable,
            path,
            "is not an absolute path of plain characters",
            "use letters, digits and . _ - + / only",
        )
    if path != "/" and os.path.normpath(path) != path or "//" in path:
        return _problem(
            variable,
            path,
            "is not a normalized path",
            f"write it as {os.path.normpath(path)!r}: no '..', '.', '//' or trailing '/'",
        )
    return None


def _paths_and_name(values: Mapping[str, object], paths: tuple[str, ...]) -> list[str]:
    """The PATHS variables of VALUES as plain, normalized absolute paths (a kit home one
    outside the system's own trees), and the served model name, each where given."""
    errors = [error for v in paths if v in values and (error := path_error(v, values[v]))]
    home = values.get("vllm_home")
    if "vllm_home" in values and not path_error("vllm_home", home):
        inside = [t for t in SYSTEM_TREES if home == t or home.startswith(t + "/")]
        if home.count("/") < 2 or inside:
            errors.append(
                _problem(
                    "vllm_home",
                    home,
                    f"is {'inside ' + inside[0] if inside else 'a top-level directory'}, "
                    "where the kit would keep and remove its releases",
                    "give a directory of the kit's own, such as /opt/socketwise",
                )
            )
    if "vllm_served_name" in values:
        name = values["vllm_served_name"]
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


def served_name_errors(servers: list[Mapping[str, object]]) -> list[str]:
    """Each of the fleet door's SERVERS (the fleet_servers filter's) whose model name the
    door could not route by or list, as 'host: variable=value: what is wrong; the fix'."""
    return [
        f"{server['name']}: {error}"
        for server in servers
        for error in _paths_and_name({"vllm_served_name": server["model"]}, ())
    ]


def owned_flag(arg: str) -> str | None:
    """The kit's flag that ARG sets: the flag itself, its `--flag=value`, `_` or
    abbreviated spelling (argparse takes a unique prefix), or a short alias."""
    if arg in OWNED_SHORT_FLAGS:
        return OWNED_SHORT_FLAGS[arg]
    if not arg.startswith("--") or len(arg) < 4:
        return None
    flag = arg.split("=", 1)[0].replace("_", "-")
    matches = [owned for owned in OWNED_FLAGS if owned == flag or owned.startswith(flag)]
    return matches[0] if matches else None


def _argument_errors(arguments: object) -> list[str]:
    if not isinstance(arguments, list):
        return [_problem("vllm_service_extra_args", arguments, "is not a list", "give a list")]
    errors = []
    for i, arg in enumerate(arguments):
        variable = f"vllm_service_extra_args[{i}]"
        if not isinstance(arg, str) or _CONTROL.search(arg):
            errors.append(
                _problem(
                    variable,
                    arg,
                    "holds a newline or another control "
                    "character, which would start a new unit line",
                    "give each argument as one line of text",
                )
            )
        elif flag := owned_flag(arg):
            errors.append(
                _problem(
                    variable,
                    arg,
                    f"sets {flag}, which the kit sets itself",
                    f"remove it from vllm_service_extra_args ({_SOCKET_ONLY})"
                    if OWNED_FLAGS[flag] == _SOCKET_ONLY
                    else f"set it with {OWNED_FLAGS[flag]}, and remove it from "
                    "vllm_service_extra_args",
                )
            )
    return errors


def _environment_errors(environment: object) -> list[str]:
    if not isinstance(environment, Mapping):
        return [
            _problem(
                "vllm_service_environment",
                environment,
                "is not a mapping",
                "give NAME: value pairs",
            )
        ]
    errors = []
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
        elif _SECRET_NAME.search(name):
            errors.append(
                _problem(
                    variable,
                    name,
                    "looks like a secret, and a unit file is readable by every local user",
                    "give the API key as credentials_api_key and a Hugging Face token as "
                    "vllm_service_hf_token (both go to root-only files), or rename a variable "
                    "that holds no secret",
                )
            )
        elif name in OWNED_ENVIRONMENT:
            errors.append(
                _problem(
                    variable, name, "is set by the kit itself", "remove it from the environment"
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
    return errors


# What NVIDIA's driver gives a process that computes on a GPU: its control nodes, and one
# node per GPU, /dev/nvidiaN.
NVIDIA_CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def gpu_devices(minors: list[int]) -> list[str]:
    """The device nodes (DeviceAllow=) of a unit serving on the GPUs of device MINORS (the
    plan's `gpu_minors`); none for a unit on CPUs."""
    if not minors:
        return []
    return [*NVIDIA_CONTROL_DEVICES, *(f"/dev/nvidia{int(minor)}" for minor in minors)]


def unit_value_errors(values: Mapping[str, object]) -> list[str]:
    """Every value of `values` (the role variables that reach a unit, each checked where
    given) that cannot go into one, as 'variable=value: what is wrong; the fix'. Empty
    when all can."""
    errors = []
    if "vllm_service_extra_args" in values:
        errors += _argument_errors(values["vllm_service_extra_args"] or [])
    if "vllm_model" in values and (
        not isinstance(values["vllm_model"], str) or _CONTROL.search(values["vllm_model"])
    ):
        errors.append(
            _problem(
                "vllm_model",
                values["vllm_model"],
                "holds a newline or another control character, which would start a new unit line",
                "give the model on one line",
            )
        )
    if "vllm_service_environment" in values:
        errors += _environment_errors(values["vllm_service_environment"] or {})
    user = values.get("vllm_user", "vllm")
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
    length = values.get("vllm_service_max_model_len")
    whole = isinstance(length, int) and not isinstance(length, bool)
    if length is not None and not (whole and length > 0):
        errors.append(
            _problem(
                "vllm_service_max_model_len",
                length,
                "is not a number of tokens",
                "give a whole number such as 4096, or null for the model's own",
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
    return errors + number_errors(values) + address_errors(values) + _range_errors(values)


# Sizes a door reads of each request, least and most, and why no more. The fleet door's
# buffer (fleet_door_buffer_bytes): HAProxy's default up to the size whose connections, at
# the door's 4,096, fill half its MemoryMax (2G; about twice the buffer per connection,
# scripts/fleet-buffer-memory). The prompt's leading bytes a door balancing by prefix
# hashes (door_prefix_bytes): within one buffer of HAProxy's default size.
RANGES = {
    "fleet_door_buffer_bytes": (
        16384,
        131072,
        "more would let the door's connections outgrow its memory limit; clients that send "
        "model before messages need no more",
    ),
    "door_prefix_bytes": (16, 8192, "the door reads the prompt from one 16 KiB buffer"),
}


def _range_errors(values: Mapping[str, object]) -> list[str]:
    errors = []
    for name, (least, most, why) in RANGES.items():
        if name not in values:
            continue
        size = values[name]
        if isinstance(size, int) and not isinstance(size, bool) and least <= size <= most:
            continue
        errors.append(
            _problem(name, size, f"is not {least}-{most} bytes", f"give {least}-{most}: {why}")
        )
    return errors


NOLOGIN = ("/usr/sbin/nologin", "/sbin/nologin", "/bin/false", "/usr/bin/false")


def number_errors(values: Mapping[str, object]) -> list[str]:
    """Each count or duration of VALUES (those in MINIMUMS, already converted) below its least."""
    return [
        _problem(name, values[name], f"is less than {least}", f"give {least} or more")
        for name, least in MINIMUMS.items()
        if isinstance(values.get(name), int) and values[name] < least
    ]


def listener_clashes(listeners: list[Mapping[str, object]]) -> list[str]:
    """Two of the host's own listeners ({variable, address, ports}) on one port of one
    address (or of a wildcard and any address): the second could not bind."""
    errors = []
    taken: list[tuple[str, int, str]] = []
    for listener in listeners:
        address = str(listener["address"])
        for port in listener["ports"]:
            for other_address, other_port, other in taken:
                overlap = address == other_address or {address, other_address} & {"0.0.0.0", "::"}
                if int(port) == other_port and overlap:
                    errors.append(
                        _problem(
                            str(listener["variable"]),
                            int(port),
                            f"port {port} on {address} is taken by {other} on {other_address}",
                            f"choose another {listener['variable']}",
                        )
                    )
            taken.append((address, int(port), str(listener["variable"])))
    return errors


def account_error(user: str, home: str, account: list[str] | None) -> str | None:
    """Why the host's ACCOUNT of USER (getent passwd's fields after the name: password,
    uid, gid, comment, home, shell; None when there is none) cannot be the service
    account. The kit runs vLLM as an account of its own, made as a system account with
    HOME/home and no login shell. Any other existing one (a person's login, www-data,
    nobody, a database's) would hand the model server that account's files and
    processes, and the kit would move its home and take its shell away."""
    if account is None:
        return None
    own_home = f"{home}/home"
    existing_home, shell = account[4], account[5]
    if existing_home == own_home and shell in NOLOGIN:
        return None
    what = (
        f"is an existing login account (shell {shell})"
        if shell not in NOLOGIN
        else f"is an existing account the kit did not create (home {existing_home}, not {own_home})"
    )
    return _problem(
        "vllm_user",
        user,
        what,
        "name an account that does not exist yet, such as vllm: the kit creates it as a "
        f"system account with home {own_home} and no login shell",
    )


def cluster_value_errors(values: Mapping[str, object]) -> list[str]:
    """The values a cluster's units, front door and filter are written with
    (socketwise_cluster, vllm_served_name, vllm_home, cluster_address,
    cluster_peer_sources), as unit_value_errors says them."""
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
    sources = values.get("cluster_peer_sources", [])
    for source in sources if isinstance(sources, list) else [sources]:
        try:
            parsed = ipaddress.ip_address(str(source))
        except ValueError:
            parsed = None
        if parsed is None or parsed.is_unspecified or not (parsed.is_private or parsed.is_loopback):
            errors.append(
                _problem(
                    "cluster_peer_sources",
                    source,
                    "is not a private address",
                    "list the other addresses members' cluster traffic comes from, such as "
                    "10.0.0.5, one by one (no networks or wildcards)",
                )
            )
    return errors + address_errors({"cluster_address": values.get("cluster_address")})


CLUSTER_PORTS = ("cluster_port", "cluster_rpc_port", "cluster_master_port")


def address_errors(values: Mapping[str, object]) -> list[str]:
    """The front door on the public address, the instances on a loopback one, the metrics
    listener on a named (not wildcard) one, each port in 1-65535 (those given in `values`;
    a fleet front door has only the public address and its port)."""
    errors = []
    rules = [
        ("door_listen_address", lambda a: True, "give one such as 127.0.0.1 or 0.0.0.0"),
        (
            "door_backend_address",
            lambda a: a.is_loopback,
            "give a loopback address such as 127.0.0.1: only the front door may be reachable",
        ),
        (
            "door_metrics_address",
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
        if isinstance(parsed, ipaddress.IPv6Address) and parsed.scope_id is not None:
            # HAProxy's server lines and vLLM's --host take no zone: a deploy would run
            # to its readiness wait and fail there without naming the variable.
            errors.append(
                _problem(variable, address, "has a zone (%...), which no door or engine takes", fix)
            )
            continue
        if not allowed(parsed):
            errors.append(_problem(variable, address, "is not allowed here", fix))
    exempt = values.get("door_client_limit_exempt", [])
    for network in exempt if isinstance(exempt, list) else [exempt]:
        try:
            ipaddress.ip_network(str(network), strict=False)
        except ValueError:
            fix = "list IP addresses or CIDR networks such as 10.0.0.5 or 10.0.0.0/24"
            errors.append(_problem("door_client_limit_exempt", network, "is not one", fix))
    sources = values.get("door_metrics_sources", [])
    for source in sources if isinstance(sources, list) else [sources]:
        try:
            unspecified = ipaddress.ip_address(str(source)).is_unspecified
        except ValueError:
            unspecified = True
        if unspecified:
            fix = "list the addresses a monitor's scrapes come from, such as 10.0.0.5, one by one"
            errors.append(_problem("door_metrics_sources", source, "is not one", fix))
    ports = (
        "door_metrics_port",
        "node_exporter_port",
        "fleet_door_port",
    ) + CLUSTER_PORTS
    for variable in ports:
        port = values.get(variable, 1)
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= MAX_PORT:
            errors.append(_problem(variable, port, "is not a port", f"give 1-{MAX_PORT}"))
    return errors


def secret_errors(values: Mapping[str, object]) -> list[str]:
    """What is wrong with the API keys and the Hugging Face token, naming the variable but
    never the value; a scrape token (credentials_metrics_token, read from its file) that
    is an API key; and, given where the door listens (credentials_door_listen), a public
    front door without a key that was not asked for."""
    errors = []
    for variable in (
        "credentials_api_key",
        "credentials_api_key_previous",
        "vllm_service_hf_token",
    ):
        secret = values.get(variable) or ""
        if secret and not (isinstance(secret, str) and _SECRET.fullmatch(secret)):
            errors.append(
                f"{variable}: is shorter than 16 characters or holds others than letters, "
                "digits and . _ ~ + / = -; generate one with `openssl rand -hex 32`"
            )
    token = values.get("credentials_metrics_token")
    if token and token in (
        values.get("credentials_api_key"),
        values.get("credentials_api_key_previous"),
    ):
        errors.append(
            "credentials_metrics_token_file: holds an API key; the monitors would hold a key "
            "that gets completions: write another token there (`openssl rand -hex 32`)"
        )
    if values.get("credentials_api_key_previous") and not values.get("credentials_api_key"):
        errors.append(
            "credentials_api_key_previous: is set but credentials_api_key is empty; a "
            "rotation gives the new key as credentials_api_key and the one it replaces here"
        )
    if "credentials_door_listen" not in values:
        return errors
    listen = str(values["credentials_door_listen"])
    try:
        public = not ipaddress.ip_address(listen).is_loopback
    except ValueError:
        public = True
    if (
        public
        and not values.get("credentials_api_key")
        and not values.get("credentials_allow_anonymous")
    ):
        errors.append(
            f"credentials_api_key: is empty and the front door listens on {listen}, which "
            "is not a loopback address; set credentials_api_key (with Ansible Vault) or "
            "credentials_api_key_file, or credentials_allow_anonymous: true on purpose"
        )
    return errors
