"""Values that reach a vLLM unit: refused when they cannot be made safe (a newline would
start a new unit line), otherwise quoted so they stand for themselves. The lab test in
test_deploy_lab.py loads such a unit into a real systemd and reads back what it parsed."""

from __future__ import annotations

import posixpath
import shlex
import subprocess
from pathlib import Path

import jinja2
import pytest
from ansible.plugins.filter.core import comment

from socketwise.common.typed import declared_types, typed
from socketwise.plan.planner import PlanRequest, plan
from socketwise.serve.limits import instance_limits
from socketwise.serve.tlsvalues import certificate_sha256, fleet_ca_errors
from socketwise.serve.unitvalues import (
    OWNED_FLAGS,
    account_error,
    listener_clashes,
    quote,
    secret_errors,
    served_name_errors,
    unit_value_errors,
)

from .frontdoor import self_signed

REPO = Path(__file__).resolve().parent.parent
# What a user may legitimately pass, with every character that means something to systemd.
HOSTILE_ARG = '50% of $HOME "quoted" back\\slash'
HOSTILE_ENV = 'a b %h ${HOME} "q"'
SAFE = {
    "vllm_service_extra_args": ["--max-num-seqs", "5"],
    "vllm_service_environment": {"VLLM_PLUGINS": "zentorch"},
    "vllm_model": "/opt/socketwise/models/tiny-llama",
    "vllm_served_name": "tiny-llama",
    "vllm_user": "vllm",
    "vllm_home": "/opt/socketwise",
    "vllm_venv": "/opt/socketwise/vllm",
    "door_listen_address": "127.0.0.11",
    "door_backend_address": "127.1.0.11",
    "door_metrics_address": "127.1.0.11",
    "door_metrics_port": 9180,
}


def render_vllm_unit(**values: object) -> str:
    """templates/vllm.service.j2 as the role renders it, for an SN plan of a 2-core host:
    its numbers and switches converted as the role's vars/main.yml converts them."""
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(REPO / "templates"),
        keep_trailing_newline=True,
        trim_blocks=True,  # as Ansible renders templates
    )
    # Ansible's own filters the template uses, besides the role's.
    environment.filters.update(
        comment=comment,
        **{"socketwise.kit.systemd_quote": quote},
        dirname=posixpath.dirname,
        basename=posixpath.basename,
    )
    topology = {
        "schema": 1,
        "nodes": [{"id": 0, "cores": [[0], [1]], "memory_mb": 24000}],
        "isa": {"avx2": True},
    }
    sn = plan(topology, PlanRequest(layout="sn"))
    variables = SAFE | {
        "ansible_managed": "Ansible managed",
        "socketwise_plan": sn,
        "socketwise_build": sn["build"],
        "instance": sn["instances"][0],
        "vllm_model_hf_id": "",
        "__vllm_service_dtype": sn["build"]["dtype"],
        "__vllm_service_preload": "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
        "__vllm_service_container": False,
        "__vllm_service_placed": True,
        "__vllm_service_secrets_dir": "/etc/socketwise/secrets",
        "__vllm_service_limits": instance_limits(sn, sn["instances"][0]),
        "__vllm_service_engine_sockets": {"vllm-sn": "/run/socketwise-vllm-sn/api.sock"},
        "vllm_service_engine_group": "socketwise-engines",
    }
    # The vllm role's prepare publishes where it installs (vllm_paths) and how the units run
    # it (vllm_engine), from the same values.
    merged = variables | values
    variables["vllm_paths"] = {"home": merged["vllm_home"], "venv": merged["vllm_venv"]}
    variables["vllm_engine"] = {
        "method": "image" if merged["__vllm_service_container"] else "venv",
        "user": merged["vllm_user"],
        "hf_id": merged["vllm_model_hf_id"],
        "container_cgroups": values.pop("vllm_container_cgroups", True),
    }
    numbers = {
        "vllm_service_max_model_len": None,
        "vllm_service_restart_sec": 10,
        "vllm_service_ready_timeout": 600,
        "vllm_service_start_limit_burst": 5,
    }
    given = {name: values.pop(name, default) for name, default in numbers.items()}
    variables["__vllm_service_typed"] = typed(given, declared_types())
    # What the door role publishes (door_settings) of the address behind the doors.
    merged = variables | values
    variables["door_settings"] = {"backend_address": merged["door_backend_address"]}
    return environment.get_template("vllm.service.j2").render(variables | values)


def test_quote_makes_one_literal_systemd_word():
    assert quote("%h") == '"%%h"'
    assert quote("$HOME") == '"$$HOME"'
    assert quote("$HOME", command_line=False) == '"$HOME"'
    assert quote('a "b" \\c') == '"a \\"b\\" \\\\c"'
    with pytest.raises(ValueError, match="control character"):
        quote("--x\nUser=root")


def test_safe_values_pass_and_each_unsafe_one_is_named_with_its_fix():
    assert unit_value_errors(SAFE) == []
    bad = SAFE | {
        "vllm_service_extra_args": ["--x\nUser=root"],
        "vllm_service_environment": {"MY VAR": "1", "OK": "line\nbreak"},
        "vllm_user": "root",
        "vllm_home": "/opt/my dir",
        "vllm_served_name": "tiny llama",
        "vllm_service_dtype": "bfloat16 --enforce-eager",
        "door_listen_address": "0.0.0.0\nUser=root",
    }
    errors = unit_value_errors(bad)
    assert errors[0].startswith("vllm_service_extra_args[0]='--x\\nUser=root': holds a newline")
    variables = [error.split("=", 1)[0] for error in errors]
    assert variables == [
        "vllm_service_extra_args[0]",
        "vllm_service_environment.MY VAR",
        "vllm_service_environment.OK",
        "vllm_user",
        "vllm_home",
        "vllm_served_model_name",
        "vllm_service_dtype",
        "door_listen_address",
    ]
    assert all("; " in error for error in errors), "every refusal says what to do instead"


def test_numbers_given_as_strings_render_as_the_numbers_they_spell():
    # -e vllm_service_start_limit_burst=3 gives "3": as a string, "3" * 610 was a
    # 610-digit StartLimitIntervalSec and the crash-loop cap was gone.
    text = render_vllm_unit(
        vllm_service_start_limit_burst="3",
        vllm_service_restart_sec="5",
        vllm_service_ready_timeout="600",
        vllm_service_max_model_len="4096",
    )
    assert "\nStartLimitBurst=3\n" in text
    assert "\nStartLimitIntervalSec=1815\n" in text
    assert "\nRestartSec=5\n" in text
    assert "--max-model-len 4096 " in text


def test_a_doors_start_limit_is_its_own_and_the_engines_stays_theirs():
    # A door's unit holds at door_start_limit_burst failed starts a minute (given with -e as
    # a string), whatever the engines' vllm_service_start_limit_burst says.
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(REPO / "templates"), keep_trailing_newline=True,
        trim_blocks=True,
    )  # fmt: skip
    environment.filters.update(comment=comment, dirname=posixpath.dirname,
                               basename=posixpath.basename)  # fmt: skip
    door = {"name": "socketwise-lb.service", "port": 8000, "cpus": [], "public": True,
            "config": "/etc/socketwise/haproxy.cfg", "socket": "/run/socketwise-lb/admin.sock",
            "secrets_dir": "/etc/socketwise/secrets", "metrics": False, "engines": True,
            "tls": False}  # fmt: skip
    text = environment.get_template("socketwise-lb.service.j2").render(
        ansible_managed="Ansible managed",
        door_unit=door,
        __door_typed=typed({"door_start_limit_burst": "3"}, declared_types()),
        __door_limits={"memory_max": "2G", "tasks_max": 512},
        vllm_service_engine_group="socketwise-engines",
    )
    assert "\nStartLimitBurst=3\nStartLimitIntervalSec=60\n" in text
    assert "\nStartLimitBurst=7\n" in render_vllm_unit(vllm_service_start_limit_burst="7")


@pytest.mark.parametrize(
    "arg",
    ["--host", "--host=0.0.0.0", "--hos", "--served_model_name", "--api-key=x", "-tp", "--port"],
)
def test_extra_args_may_not_set_a_flag_the_kit_owns(arg):
    (error,) = unit_value_errors(SAFE | {"vllm_service_extra_args": ["--max-num-seqs", "4", arg]})
    assert error.startswith(f"vllm_service_extra_args[2]={arg!r}: sets --"), error
    assert (
        "which the kit sets itself; " in error and "remove it from vllm_service_extra_args" in error
    )
    if arg.startswith(("--hos", "--port")):
        assert "Unix socket" in error, error


def test_other_extra_args_pass():
    for args in (["--enforce-eager"], ["--max-num-seqs", "4"], ["--no-such-flag"], ["--h"]):
        assert unit_value_errors(SAFE | {"vllm_service_extra_args": args}) == [], args
    assert "--host" in OWNED_FLAGS and "--model" in OWNED_FLAGS


@pytest.mark.parametrize(
    "name", ["VLLM_API_KEY", "HF_TOKEN", "MY_SECRET", "DB_PASSWORD", "AWS_ACCESS_KEY_ID"]
)
def test_environment_that_looks_like_a_secret_is_refused_with_the_secret_variables(name):
    (error,) = unit_value_errors(SAFE | {"vllm_service_environment": {name: "x" * 20}})
    assert error.startswith(f"vllm_service_environment.{name}=")
    assert "looks like a secret" in error and "credentials_api_key" in error
    assert "x" * 20 not in error, "the value is never shown"


def test_environment_the_unit_sets_itself_is_refused():
    (error,) = unit_value_errors(SAFE | {"vllm_service_environment": {"LD_PRELOAD": "/x.so"}})
    assert "is set by the kit itself" in error


@pytest.mark.parametrize(
    "home",
    # A leading "//" too, which Python's normpath keeps (POSIX leaves its meaning open).
    ["/opt/socketwise/", "/opt//socketwise", "/opt/socketwise/../x", "/opt/./socketwise",
     "//opt/socketwise"],
)  # fmt: skip
def test_a_path_that_is_not_normalized_is_refused_with_its_normal_form(home):
    (error,) = unit_value_errors(SAFE | {"vllm_home": home})
    assert error.startswith(f"vllm_home={home!r}: is not a normalized path"), error


@pytest.mark.parametrize("home", ["/opt", "/", "/etc/socketwise", "/usr/local/sw", "/tmp/sw"])
def test_a_home_in_the_system_s_own_trees_is_refused(home):
    (error,) = unit_value_errors(SAFE | {"vllm_home": home})
    assert error.startswith(f"vllm_home={home!r}: is "), error


def test_an_existing_account_is_accepted_only_as_the_kit_made_it():
    own = ["x", "998", "998", "", "/opt/socketwise/home", "/usr/sbin/nologin"]
    assert account_error("vllm", "/opt/socketwise", None) is None
    assert account_error("vllm", "/opt/socketwise", own) is None
    www = ["x", "33", "33", "www-data", "/var/www", "/usr/sbin/nologin"]
    error = account_error("www-data", "/opt/socketwise", www)
    assert error.startswith("vllm_user='www-data': is an existing account the kit did not create")
    alice = ["x", "1000", "1000", "", "/opt/socketwise/home", "/bin/bash"]
    assert "is an existing login account (shell /bin/bash)" in account_error(
        "alice", "/opt/socketwise", alice
    )


def test_two_of_the_host_s_own_listeners_on_one_port_are_refused():
    plan = [
        {"variable": "plan_port", "address": "127.0.0.1", "ports": [8001, 8002]},
        {"variable": "plan_port", "address": "0.0.0.0", "ports": [8000]},
    ]
    metrics = {"variable": "door_metrics_port", "address": "127.0.0.1", "ports": [9180]}
    assert listener_clashes([*plan, metrics]) == []
    # The front door's wildcard takes 8000 on every address; another address is free.
    for port, address in ((8000, "127.0.0.1"), (8002, "127.0.0.1")):
        (error,) = listener_clashes([*plan, metrics | {"ports": [port]}])
        assert error.startswith(f"door_metrics_port={port}: port {port} on {address} is")
    assert (
        listener_clashes([{**plan[0], "address": "127.0.0.2"}, {**metrics, "ports": [8001]}]) == []
    )


def test_only_the_front_door_may_listen_on_a_public_address():
    bad = SAFE | {
        "door_backend_address": "0.0.0.0",
        "door_metrics_address": "::",
        "door_metrics_port": 65536,
        "vllm_model_hf_id": "org/name; rm -rf /",
    }
    errors = unit_value_errors(bad)
    assert [error.split("=", 1)[0] for error in errors] == [
        "vllm_model_hf_id",
        "door_backend_address",
        "door_metrics_address",
        "door_metrics_port",
    ]
    assert "give a loopback address such as 127.0.0.1" in errors[1]
    assert unit_value_errors(SAFE | {"door_backend_address": "10.0.0.5"}) != []
    assert unit_value_errors(SAFE | {"vllm_model_hf_id": "microsoft/Phi-4-mini-instruct"}) == []


def test_the_per_client_limits_take_counts_and_addresses_only():
    ok = SAFE | {
        "door_client_max_connections": 0,
        "door_client_max_rate": 100,
        "door_client_limit_exempt": ["10.0.0.5", "10.1.0.0/16", "fd00::1"],
    }
    assert unit_value_errors(ok) == []
    errors = unit_value_errors(
        ok
        | {
            "door_client_max_rate": -1,
            "door_client_limit_exempt": ["10.0.0.5", "fleet.example", "10.0.0.5 10.0.0.6"],
        }
    )
    assert errors == [
        "door_client_max_rate=-1: is less than 0; give 0 or more",
        "door_client_limit_exempt='fleet.example': is not one; list IP addresses or "
        "CIDR networks such as 10.0.0.5 or 10.0.0.0/24",
        "door_client_limit_exempt='10.0.0.5 10.0.0.6': is not one; list IP addresses "
        "or CIDR networks such as 10.0.0.5 or 10.0.0.0/24",
    ]


KEY = "s3cret-" + "k" * 25


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"credentials_door_listen": "0.0.0.0"}, "credentials_api_key: is empty"),
        ({"credentials_door_listen": "10.1.2.3"}, "credentials_api_key: is empty"),
        ({"credentials_api_key": "abc12"}, "credentials_api_key: is shorter than 16"),
        ({"credentials_api_key": KEY + '"\n'}, "credentials_api_key: is shorter than 16"),
        (
            {"credentials_api_key": KEY, "vllm_service_hf_token": "hf token"},
            "vllm_service_hf_token",
        ),
        (
            {"credentials_api_key": KEY, "credentials_api_key_previous": KEY[:-1] + "\n"},
            "credentials_api_key_previous: is shorter than 16",
        ),
        (
            {"credentials_door_listen": "127.0.0.1", "credentials_api_key_previous": KEY},
            "credentials_api_key_previous: is set but credentials_api_key is empty",
        ),
    ],
    ids=[
        "wildcard",
        "public-ip",
        "short",
        "quote-newline",
        "hf-token-space",
        "previous-newline",
        "previous-alone",
    ],  # fmt: skip
)
def test_a_public_front_door_needs_a_well_formed_key_and_errors_never_show_it(values, problem):
    errors = secret_errors({"credentials_door_listen": "0.0.0.0"} | values)
    assert len(errors) == 1 and errors[0].startswith(problem), errors
    for variable in (
        "credentials_api_key",
        "credentials_api_key_previous",
        "vllm_service_hf_token",
    ):
        secret = values.get(variable)
        assert not secret or secret.strip() not in errors[0]


def test_a_key_or_loopback_or_anonymous_on_purpose_is_accepted():
    assert secret_errors({"credentials_door_listen": "0.0.0.0", "credentials_api_key": KEY}) == []
    assert secret_errors({"credentials_door_listen": "127.0.0.11"}) == []
    # vllm_service's check of the Hugging Face token alone: no door, no key asked for.
    assert secret_errors({"vllm_service_hf_token": "hf_" + "t" * 20}) == []
    assert (
        secret_errors({"credentials_door_listen": "0.0.0.0", "credentials_allow_anonymous": True})
        == []
    )


def test_the_unit_with_hostile_but_legal_values_passes_systemd_analyze_verify(tmp_path):
    text = render_vllm_unit(
        vllm_service_extra_args=["--note", HOSTILE_ARG],
        vllm_service_environment={"PROBE": HOSTILE_ENV},
    )
    assert "\nUser=vllm\n" in text and "User=root" not in text
    # The venv's python does not exist on the controller; nothing else may be wrong.
    assert _verify_problems(tmp_path, text, "/opt/socketwise/vllm/bin/python") == []


def _verify_problems(tmp_path: Path, text: str, missing: str) -> list[str]:
    """What `systemd-analyze verify` finds wrong with a unit, but the missing MISSING."""
    unit = tmp_path / "socketwise-vllm-sn.service"
    unit.write_text(text)
    done = subprocess.run(
        ["systemd-analyze", "verify", f"{unit}:socketwise-vllm-sn.service"],
        capture_output=True,
        text=True,
    )
    return [line for line in done.stderr.splitlines() if line.strip() and missing not in line]


def _secrets_as_environment(unit: str, secrets: dict[str, str], tmp_path: Path) -> dict:
    """The environment the unit's container command gives the server when Podman has
    mounted SECRETS under /run/secrets (here a directory of the test's own)."""
    line = next(word for word in unit.splitlines() if word.strip().startswith("/bin/sh -c"))
    argv = shlex.split(line.replace("$$", "$").rstrip(" \\"))
    assert argv[:2] == ["/bin/sh", "-c"] and "/run/secrets/" in argv[2]
    mounted = tmp_path / "run-secrets"
    mounted.mkdir()
    for name, value in secrets.items():
        (mounted / name).write_text(value)
    script = argv[2].replace("/run/secrets/", f"{mounted}/")
    done = subprocess.run(
        ["/bin/sh", "-c", script, argv[3], "env", "-0"], capture_output=True, check=True
    )
    return dict(entry.split("=", 1) for entry in done.stdout.decode().split("\0") if entry)


@pytest.mark.parametrize("cgroups", [True, False], ids=["real-host", "nspawn"])
def test_the_image_method_unit_runs_podman_with_the_plans_placement_and_no_secret(
    tmp_path, cgroups
):
    key = "k" * 32
    text = render_vllm_unit(
        __vllm_service_container=True,
        __vllm_service_container_name="socketwise-vllm-sn",
        __vllm_service_container_uid="998",
        __vllm_service_container_user="998:998",
        __vllm_service_container_env=["VLLM_CPU_OMP_THREADS_BIND", "HOME"],
        __vllm_service_image_tag="localhost/socketwise-vllm:zen-0123456789ab",
        __vllm_service_podman_secrets=[
            {"name": "socketwise-vllm-api-key", "env": "VLLM_API_KEY", "value": key}
        ],
        vllm_container_cgroups=cgroups,
        vllm_service_environment={"PROBE": HOSTILE_ENV},
    )
    assert "/usr/bin/podman run --rm --replace --name socketwise-vllm-sn" in text
    assert "\nUser=" not in text and "--user 998:998" in text
    # The unit's placement holds either way; real hosts get the container's cgroup too.
    assert "CPUAffinity=0 1" in text and "NUMAMask=0" in text
    assert ("--cpuset-cpus=0,1" in text and "--cpuset-mems=0" in text) is cgroups
    assert ("--cgroups=disabled" in text) is not cgroups
    # The key is a file only the server's uid reads (a type=env secret shows in `podman
    # inspect`), which the shell before the server turns into its environment.
    secret = "socketwise-vllm-api-key,type=mount,target=VLLM_API_KEY,uid=998,mode=0400"
    assert f"--secret {secret}" in text
    assert _secrets_as_environment(text, {"VLLM_API_KEY": key}, tmp_path)["VLLM_API_KEY"] == key
    assert key not in text and "EnvironmentFile" not in text
    # The venv's preloads are the container's, not Podman's.
    assert "Environment=LD_PRELOAD" not in text and "--env LD_PRELOAD=" in text
    assert '--env "PROBE"' in text and "--read-only" in text and "--cap-drop=all" in text
    assert _verify_problems(tmp_path, text, "/usr/bin/podman") == []


@pytest.mark.parametrize("container", [False, True], ids=["venv", "image"])
def test_plain_vllm_runs_without_the_plans_placement_but_with_its_kv_size(tmp_path, container):
    # vllm_service_placement: vllm, the sweep's baseline: vLLM's own defaults.
    image = {
        "__vllm_service_container_name": "socketwise-vllm-sn",
        "__vllm_service_container_uid": "998",
        "__vllm_service_container_user": "998:998",
        "__vllm_service_container_env": ["VLLM_CPU_KVCACHE_SPACE", "HOME"],
        "__vllm_service_image_tag": "localhost/socketwise-vllm:zen-0123456789ab",
        "__vllm_service_podman_secrets": [],
        "vllm_container_cgroups": True,
    }
    text = render_vllm_unit(
        __vllm_service_placed=False, __vllm_service_container=container, **image
    )
    for placement in ("CPUAffinity=", "NUMAPolicy=", "NUMAMask=", "VLLM_CPU_OMP_THREADS_BIND",
                      "LD_PRELOAD", "--cpuset-"):  # fmt: skip
        assert placement not in text
    assert "Environment=VLLM_CPU_KVCACHE_SPACE=1" in text
    # The same server, model, dtype and API socket as the kit's own layouts.
    assert "--dtype bfloat16" in text and "--uds /run/socketwise-vllm-sn/api.sock" in text
    assert _verify_problems(tmp_path, text, "/usr/bin/podman" if container else "/opt/") == []
    placed = render_vllm_unit(__vllm_service_container=container, **image)
    assert "CPUAffinity=0 1" in placed and "Environment=VLLM_CPU_OMP_THREADS_BIND=0,1" in placed


def _signed(directory: Path, name: str, ca: str) -> str:
    """A door's certificate for NAME, signed by the CA DIRECTORY/CA.crt (its key beside)."""
    key, request, cert = (str(directory / f"{name}.{kind}") for kind in ("key", "csr", "crt"))
    signer = [str(directory / f"{ca}.{kind}") for kind in ("crt", "key")]
    for argv in (
        ["req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", key],
        ["x509", "-req", "-in", request, "-CA", signer[0], "-CAkey", signer[1], "-days", "2"],
    ):
        out = request if argv[0] == "req" else cert
        subprocess.run(["openssl", *argv, "-out", out], check=True, capture_output=True)
    return cert


def test_a_fleet_ca_must_have_signed_every_host_s_door(tmp_path):
    for ca in ("ca", "other"):
        self_signed(tmp_path, f"{ca} CA", ca)
    servers = [
        {"name": "edge-01", "tls": True, "cert": _signed(tmp_path, "edge-01", "ca")},
        {"name": "edge-02", "tls": True, "cert": _signed(tmp_path, "edge-02", "ca")},
    ]
    ca = str(tmp_path / "ca.crt")
    assert fleet_ca_errors(ca, servers) == []
    stranger = {"name": "edge-03", "tls": True, "cert": _signed(tmp_path, "edge-03", "other")}
    (error,) = fleet_ca_errors(ca, [*servers, stranger])
    assert error.startswith(
        f"credentials_fleet_ca_file={ca}: edge-03's credentials_tls_cert={stranger['cert']} "
        "does not verify with it (error 20 at 0 depth lookup: unable to get local issuer"
    ), error
    (error,) = fleet_ca_errors(ca, [{"name": "edge-04", "tls": False, "cert": ""}])
    assert "edge-04 serves plain HTTP" in error
    (error,) = fleet_ca_errors(str(tmp_path / "edge-01.key"), servers)
    assert "not a PEM CA certificate" in error
    (error,) = fleet_ca_errors(str(tmp_path / "missing.crt"), servers)
    assert "not a PEM CA certificate" in error
    # A door the kit's CA issued is verified with that CA, beside the operator's or alone.
    kit = {"name": "edge-05", "tls": True, "kit": True, "cert": ""}
    assert fleet_ca_errors(ca, [*servers, kit]) == []
    assert fleet_ca_errors("", [kit, {"name": "edge-06", "tls": False, "cert": ""}]) == []


def test_a_host_door_of_the_operators_own_certificate_needs_the_ca_that_verifies_it(tmp_path):
    """The fleet door verifies by default: without credentials_fleet_ca_file, a host with
    its own certificate is refused in one line naming both ways out."""
    own = {"name": "edge-01", "tls": True, "cert": "/pki/edge-01.crt"}
    (error,) = fleet_ca_errors("", [own, {"name": "edge-02", "tls": False, "cert": ""}])
    assert error == (
        "edge-01 serves TLS with its own credentials_tls_cert=/pki/edge-01.crt and the fleet "
        "door verifies it: give the CA that signed it in credentials_fleet_ca_file, or set "
        "fleet_door_verify: false to take it unverified"
    )
    assert fleet_ca_errors("", [own], verify=False) == []


def test_a_certificates_pin_is_openssls_sha256_fingerprint_and_never_reads_the_key(tmp_path):
    cert, key = self_signed(tmp_path, "fleet door")
    pem = tmp_path / "fleet-client.pem"
    pem.write_text(cert.read_text() + key.read_text())
    printed = subprocess.run(
        ["openssl", "x509", "-in", str(cert), "-noout", "-fingerprint", "-sha256"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert certificate_sha256(str(pem)) == printed.split("=", 1)[1].strip().replace(":", "")
    # Not made yet (a check-mode run before the first deploy), or only a key: no pin.
    assert certificate_sha256(str(tmp_path / "missing.pem")) == ""
    assert certificate_sha256(str(key)) == ""


def test_a_key_of_15_characters_is_refused_and_one_of_16_taken():
    """The refusal says 16 characters at least: a key one shorter is refused, for each
    secret it names."""
    for variable in ("credentials_api_key", "vllm_service_hf_token"):
        short = secret_errors({variable: "k" * 15})
        assert len(short) == 1 and short[0].startswith(f"{variable}: is shorter than 16"), short
        assert secret_errors({variable: "k" * 16}) == []


def test_a_scrape_token_that_is_the_previous_key_is_refused_during_a_rotation():
    """While a rotation keeps the previous key, it still gets completions: a monitor that
    holds it as its scrape token holds a key."""
    previous = "p" * 32
    errors = secret_errors(
        {"credentials_api_key": KEY, "credentials_api_key_previous": previous,
         "credentials_metrics_token": previous}
    )  # fmt: skip
    assert len(errors) == 1 and errors[0].startswith("credentials_metrics_token_file: holds"), (
        errors
    )
    assert previous not in errors[0]


def test_the_prompt_bytes_a_door_balancing_by_prefix_hashes_fit_its_buffer():
    for good in (16, 512, 8192):
        assert unit_value_errors({"door_prefix_bytes": good}) == []
    for bad in (15, 8193, 0):
        (error,) = unit_value_errors({"door_prefix_bytes": bad})
        assert error.startswith(f"door_prefix_bytes={bad}: is not 16-8192 bytes; give 16-8192")


def test_the_fleet_doors_buffer_is_held_to_what_its_memory_takes():
    # 16 KiB (HAProxy's own) to 128 KiB: at the door's 4,096 connections, about twice the
    # buffer each, more would outgrow its MemoryMax.
    for good in (16384, 65536, 131072):
        assert unit_value_errors({"fleet_door_buffer_bytes": good}) == []
    for bad in (16383, 131073, True, "65536"):
        (error,) = unit_value_errors({"fleet_door_buffer_bytes": bad})
        assert error.startswith(f"fleet_door_buffer_bytes={bad!r}: is not 16384-131072 bytes; give")


def test_a_model_name_the_fleet_door_cannot_route_by_is_named_with_its_host():
    servers = [{"name": "edge-01", "model": "tiny-llama"}, {"name": "edge-02", "model": "my model"},
               {"name": "edge-03", "model": "org/Qwen2.5:7b"}]  # fmt: skip
    assert served_name_errors(servers) == [
        "edge-02: vllm_served_model_name='my model': is not a model name; "
        "use letters, digits and . _ : / - only"
    ]
