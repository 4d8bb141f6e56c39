"""deploy.yml's first play (playbooks/check.yml) refuses a bad value before anything on a
host changes, with one line naming the host, the variable, the value and the fix; and
takes a number given with -e (a string) as the number it spells.

Run as a user runs it, against a host planned from a saved topology file and reached
as the controller itself (ansible_connection: local): each refused run stops in the
play's first step, before the topology is read or the controller builds anything, so
nothing on any host can have changed. The one value that only fails when vLLM starts
is the deploy lab's (test_deploy_lab.py: a failed start goes back to the release that
served).
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterable
from pathlib import Path

import pytest
import yaml

from socketwise.common.typed import declared_types

from . import frontdoor
from .playbooks import PlaybookRun, run_playbook

REPO = Path(__file__).resolve().parent.parent
HOST = "edge-01"
KEY = "0123456789abcdef" * 2
# What a run printed of one host that stopped: its line, the tasks it ran, its lines.
HostStop = tuple[str, set[str], str]


def local_host() -> dict:
    """A host reached as the controller itself, planned from a saved topology file."""
    return {
        "ansible_connection": "local",
        "ansible_python_interpreter": "{{ ansible_playbook_python }}",
        "socketwise_topology_file": str(REPO / "inventories/example-fleet/topologies/r730-01.json"),
        "credentials_api_key": KEY,
    }


@pytest.fixture
def inventory(tmp_path) -> Path:
    hosts = {"all": {"hosts": {HOST: local_host()}}}
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(hosts))
    return path


def check(inventory: Path, *extra: dict | str) -> PlaybookRun:
    arguments = []
    for value in extra:
        if isinstance(value, str) and value.startswith("--"):
            arguments.append(value)
        else:
            arguments += ["-e", json.dumps(value) if isinstance(value, dict) else value]
    return run_playbook("playbooks/check.yml", "-i", str(inventory), *arguments)


def refusal(run: PlaybookRun) -> str:
    """The one line the play stopped with."""
    assert run.returncode != 0, run.output[-3000:]
    lines = re.findall(r'"msg": "(.*?)"\}?$', run.output, re.MULTILINE)
    assert lines, run.output[-3000:]
    return lines[-1]


def each_hosts_stop(run: PlaybookRun, hosts: Iterable[str]) -> dict[str, HostStop]:
    """{host: (the line it stopped with, the tasks it ran, what the run printed of it)} of a
    run over several hosts, each refused on its own."""
    seen: dict[str, HostStop] = {}
    task = ""
    for line in run.output.splitlines():
        header = re.match(r"TASK \[(.*)\]", line)
        if header:
            task = header.group(1)
            continue
        # A task delegated to the controller names the host as "HOST -> localhost".
        said = re.match(r"\w+: \[([^\]\s]+)", line)
        if said and said.group(1) in hosts:
            host = said.group(1)
            stopped, ran, printed = seen.get(host, ("", set(), ""))
            found = re.search(r'"msg": "(.*?)"\}?$', line)
            stopped = found.group(1) if line.startswith(("fatal", "failed")) and found else stopped
            seen[host] = (stopped, ran | {task}, printed + line + "\n")
    return seen


# (id, what the user passed, the start of the line that refuses it)
REFUSED = [
    (
        "extra-args-host",
        {"vllm_service_extra_args": ["--host", "0.0.0.0"]},
        "vllm_service_extra_args[0]='--host': sets --host, which the kit sets itself; "
        "remove it from vllm_service_extra_args (an instance serves only on the Unix socket "
        "the kit gives it, which its door alone opens)",
    ),
    (
        "renamed",
        {"vllm_service_release_bench": {"output_tok_s": 1.0}},
        "vllm_service_release_bench is now release_bench (a host's releases are the release "
        "role's): set release_bench instead",
    ),
    (
        "renamed-monitor-token",
        {"monitor_metrics_token_file": "/etc/socketwise/scrape-token"},
        "monitor_metrics_token_file is now credentials_metrics_token_file (the monitors send "
        "the token the metrics doors take, read from that one file): set "
        "credentials_metrics_token_file instead",
    ),
    (
        "renamed-fleet-port",
        {"vllm_service_fleet_port": 8001},
        "vllm_service_fleet_port is now fleet_door_port (the fleet front door is the fleet_door "
        "role's): set fleet_door_port instead",
    ),
    (
        "renamed-node-exporter-port",
        {"vllm_service_node_exporter_port": 9101},
        "vllm_service_node_exporter_port is now node_exporter_port (the node exporter is the "
        "node_exporter role's): set node_exporter_port instead",
    ),
    (
        "renamed-api-key",
        {"vllm_service_api_key": KEY, "vllm_service_tls": True},
        "vllm_service_api_key is now credentials_api_key (the keys, tokens and certificates are "
        "the credentials role's): set credentials_api_key instead; vllm_service_tls is now "
        "credentials_tls (the keys, tokens and certificates are the credentials role's): set "
        "credentials_tls instead",
    ),
    (
        "renamed-door",
        {"vllm_service_listen_address": "127.0.0.1", "vllm_service_request_timeout": 900},
        "vllm_service_listen_address is now door_listen_address (the doors' addresses, limits "
        "and timeouts are the door role's): set door_listen_address instead; "
        "vllm_service_request_timeout is now door_request_timeout (the doors' addresses, "
        "limits and timeouts are the door role's): set door_request_timeout instead",
    ),
    (
        "node-exporter-port",
        {"node_exporter_port": 70000},
        "node_exporter_port=70000: is not a port; give 1-65535",
    ),
    (
        "extra-args-api-key",
        {"vllm_service_extra_args": ["--api-key=abc"]},
        "vllm_service_extra_args[0]='--api-key=abc': sets --api-key",
    ),
    (
        "secret-in-environment",
        {"vllm_service_environment": {"VLLM_API_KEY": "s3cret-s3cret-s3cret"}},
        "vllm_service_environment.VLLM_API_KEY='VLLM_API_KEY': looks like a secret",
    ),
    (
        "home-trailing-slash",
        {"vllm_home": "/opt/socketwise/"},
        "vllm_home='/opt/socketwise/': is not a normalized path; write it as '/opt/socketwise'",
    ),
    (
        "home-dotdot",
        {"vllm_home": "/opt/socketwise/../etc"},
        "vllm_home='/opt/socketwise/../etc': is not a normalized path",
    ),
    (
        # An existing system account of the controller (Debian's base-passwd has it).
        "system-account",
        {"vllm_user": "www-data"},
        "vllm_user='www-data': is an existing account the kit did not create (home /var/www",
    ),
    ("root-user", {"vllm_user": "root"}, "vllm_user='root': is root or not a user name"),
    (
        "unit-injection",
        # A newline would start a unit line of its own: the service would run as root.
        {"vllm_service_extra_args": ["--x\nUser=root"]},
        "vllm_service_extra_args[0]='--x\\\\nUser=root': holds a newline",
    ),
    (
        "env-name-space",
        {"vllm_service_environment": {"MY VAR": "1"}},
        "vllm_service_environment.MY VAR='MY VAR': is not an environment variable",
    ),
    (
        "anonymous-public",
        # Open to the network with no key: refused unless asked for on purpose.
        {"door_listen_address": "0.0.0.0", "credentials_api_key": ""},
        "credentials_api_key: is empty and the front door listens on 0.0.0.0",
    ),
    (
        "public-backend",
        {"door_backend_address": "0.0.0.0"},
        "door_backend_address='0.0.0.0': is not allowed here; give a loopback address",
    ),
    (
        # A zone: HAProxy's server lines and vLLM's --host take none (a deploy waited ten
        # minutes for a door that never came up).
        "backend-zone",
        {"door_backend_address": "::1%lo"},
        "door_backend_address='::1%lo': has a zone (%...), which no door or engine takes",
    ),
    (
        # The certificate's variable misspelled: the door would serve plain HTTP with the
        # key in cleartext on the host.
        "tls-key-alone",
        {"credentials_tls_key": "/etc/hostname"},
        "credentials_tls_key is set but credentials_tls_cert is empty; give both PEM files",
    ),
    (
        # The kit would issue its own certificate and leave the key given unused.
        "tls-key-with-kit-tls",
        {"credentials_tls": True, "credentials_tls_key": "/etc/hostname"},
        "credentials_tls_key is set but credentials_tls_cert is empty; give both PEM files",
    ),
    (
        "tls-name",
        {"credentials_tls": True, "credentials_tls_names": ["door.example", "bad name"]},
        "'bad name' is neither an IP address nor a DNS name; fix it in credentials_tls_names",
    ),
    (
        "tls-cert-missing",
        {"credentials_tls_cert": "/nonexistent/door.pem", "credentials_tls_key": "/etc/hostname"},
        "credentials_tls_cert=/nonexistent/door.pem: no such file on the controller; give the PEM "
        "certificate's path",
    ),
    (
        "tls-key-missing",
        {"credentials_tls_cert": "/etc/hostname", "credentials_tls_key": "/nonexistent/door.key"},
        "credentials_tls_key=/nonexistent/door.key: no such file on the controller",
    ),
    (
        "key-file-missing",
        {"credentials_api_key": "", "credentials_api_key_file": "/nonexistent/api-key"},
        "credentials_api_key_file=/nonexistent/api-key: no such file on the controller; write "
        "the key there",
    ),
    (
        "model-len",
        {"vllm_service_max_model_len": 0},
        "vllm_service_max_model_len=0: is not a number of tokens",
    ),
    (
        # Given as -e gives it, a string: converted, then too small (a burst of 0 would
        # let a crashing unit restart forever).
        "start-burst-zero",
        {"vllm_service_start_limit_burst": "0"},
        "vllm_service_start_limit_burst=0: is less than 1; give 1 or more",
    ),
    (
        "request-timeout-zero",
        {"door_request_timeout": 0},
        "door_request_timeout=0: is less than 1",
    ),
    (
        "gate-tolerance",
        {"rollout_gate_tolerance": "1.5"},
        "rollout_gate_tolerance='1.5' is not a fraction between 0 and 1",
    ),
]


@pytest.fixture(scope="module")
def refused(tmp_path_factory) -> tuple[dict[str, HostStop], str]:
    """One run of the play over a host per case of REFUSED, each given its bad value as
    its own variables (the play refuses each host on its own, as it does a fleet's): {case:
    (the line its host stopped with, the tasks that host ran, what the run printed of it)},
    and all the run printed. One run in place of one each: a run's start is most of its
    time."""
    hosts = {f"{HOST}-{case}": local_host() | given for case, given, _ in REFUSED}
    inventory = tmp_path_factory.mktemp("refused") / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    run = run_playbook("playbooks/check.yml", "-i", str(inventory), "--forks", "8")
    assert run.returncode != 0, run.output[-3000:]
    stops = each_hosts_stop(run, hosts)
    return {host.removeprefix(f"{HOST}-"): stop for host, stop in stops.items()}, run.output


@pytest.mark.parametrize(
    ("case", "words"), [(c[0], c[2]) for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_a_bad_value_stops_the_first_play_in_its_first_step(refused, case, words):
    stops, output = refused
    stopped, ran, printed = stops[case]
    assert stopped.startswith(f"{HOST}-{case}: {words}"), printed[-3000:]
    # Nothing ran after the value checks: not the topology, not the controller's builds.
    assert not [task for task in ran if task.startswith("topology")], sorted(ran)
    # The API key every host was given shows nowhere, a refused key variable's line included.
    assert KEY not in output


def test_a_build_class_the_cpu_cannot_run_stops_before_anything_is_built(inventory):
    # The topology file's host has AVX2 only; AMX needs Sapphire Rapids.
    run = check(inventory, "vllm_build_class=amx")
    assert refusal(run).startswith(f"{HOST}: vllm_build_class=amx: build class amx needs")
    assert "Build and pack the offline wheelhouse" not in run.output


def test_a_certificate_and_key_that_do_not_belong_together_are_refused(inventory, tmp_path):
    cert, _ = frontdoor.self_signed(tmp_path, "edge-01", "one")
    _, key = frontdoor.self_signed(tmp_path, "edge-01", "two")
    run = check(inventory, {"credentials_tls_cert": str(cert), "credentials_tls_key": str(key)})
    assert refusal(run).startswith(
        f"{HOST}: credentials_tls_cert={cert}, credentials_tls_key={key}: the pair cannot "
        "serve TLS (KEY_VALUES_MISMATCH)"
    ), refusal(run)
    assert (tmp_path / "two.key").read_text().splitlines()[1] not in run.output
    matching = {
        "credentials_tls_cert": str(cert),
        "credentials_tls_key": str(tmp_path / "one.key"),
    }
    # The pair that belongs together passes, and the run goes on to the next refusal.
    run = check(inventory, matching | {"vllm_user": "root"})
    assert refusal(run).startswith(f"{HOST}: vllm_user='root'")


def test_the_fleet_front_door_passes_the_same_checks(inventory, tmp_path):
    hosts = yaml.safe_load(inventory.read_text())
    hosts["all"]["children"] = {
        "socketwise_frontdoor": {"hosts": {"lb-01": dict(hosts["all"]["hosts"][HOST])}}
    }
    inventory.write_text(yaml.safe_dump(hosts))
    ca, _ = frontdoor.self_signed(tmp_path, "fleet CA", "ca")
    for given, words in (
        (
            "fleet_door_port=70000 fleet_door_buffer_bytes=1048576",
            "fleet_door_port=70000: is not a port; give 1-65535 | "
            "fleet_door_buffer_bytes=1048576: is not 16384-131072 bytes",
        ),
        ("credentials_api_key=", "credentials_api_key: is empty and the front door listens"),
        # The CA verifies hosts' TLS doors: this host's door serves plain HTTP.
        (f"credentials_fleet_ca_file={ca}", f"credentials_fleet_ca_file={ca}: {HOST} serves"),
        # The fleet door verifies a host's own certificate, and was given no CA for it.
        (
            {"credentials_tls_cert": str(ca), "credentials_tls_key": str(tmp_path / "ca.key")},
            f"{HOST} serves TLS with its own credentials_tls_cert={ca} and the fleet door "
            "verifies it: give the CA that signed it in credentials_fleet_ca_file",
        ),
    ):
        run = check(inventory, given, "--limit=lb-01")
        assert refusal(run).startswith(f"lb-01: {words}"), refusal(run)
    # The door routes by each host's model name, here its model directory's (which the
    # host's own units take, quoted): one its rules cannot hold is refused, by host.
    hosts["all"]["hosts"][HOST]["vllm_model_path"] = "/srv/models/tiny llama"
    inventory.write_text(yaml.safe_dump(hosts))
    run = check(inventory, {}, "--limit=lb-01")
    assert refusal(run).startswith(
        f"lb-01: {HOST}: vllm_served_model_name='tiny llama': is not a model name"
    ), refusal(run)


def test_a_secret_never_shows_in_its_refusal(inventory):
    secret = "s3cret-" + "z" * 20
    run = check(inventory, {"vllm_service_environment": {"HF_TOKEN": secret}})
    assert "looks like a secret" in refusal(run)
    assert secret not in run.output


PUBLISHED_PLAY = """
- name: Check the values as play 1 does, then write what the role publishes
  hosts: all
  gather_facts: false
  # check.yml's play has the vllm role's defaults too: it imports that role later.
  vars_files:
    - {repo}/playbooks/vars/socketwise.yml
    - {repo}/roles/vllm/defaults/main.yml
  tasks:
    - name: Check the values
      ansible.builtin.import_role:
        name: vllm_service
        tasks_from: values
    - name: Check the doors' values
      ansible.builtin.import_role:
        name: door
        tasks_from: check
    - name: Check the keys, token and certificate, as check.yml does
      ansible.builtin.import_role:
        name: credentials
        tasks_from: check
      vars:
        credentials_door_listen: "{{ door_settings.listen_address }}"
        credentials_door_addresses: "{{ door_settings.addresses }}"
    - name: Write what other roles read
      ansible.builtin.copy:
        content: "{{ published | to_json }}"
        dest: "{{ published_out }}/{{ inventory_hostname }}.json"
        mode: "0600"
"""


def published(
    inventory: Path, tmp_path: Path, given: dict, expression: str, *arguments: str
) -> object:
    """EXPRESSION (Jinja) as play 1 publishes it on HOST once vllm_service's values and
    the credentials role's check ran."""
    return publish(inventory, tmp_path, given, expression, *arguments)[HOST]


def published_each(tmp_path: Path, cases: dict[str, dict], expression: str) -> dict:
    """{case: EXPRESSION as play 1 publishes it} over a host per case, each given its
    case's values as its own variables, in one run: a run's start is most of its time."""
    hosts = {f"{HOST}-{case}": local_host() | given for case, given in cases.items()}
    inventory = tmp_path / "published-hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    done = publish(inventory, tmp_path, {}, expression, "--forks", "8")
    return {case: done[f"{HOST}-{case}"] for case in cases}


def publish(
    inventory: Path, tmp_path: Path, given: dict, expression: str, *arguments: str
) -> dict[str, object]:
    play = tmp_path / "published.yml"
    play.write_text(PUBLISHED_PLAY.replace("{repo}", str(REPO)))
    out = tmp_path / "published"
    out.mkdir(exist_ok=True)
    extra = given | {"published": expression, "published_out": str(out)}
    run = run_playbook(str(play), "-i", str(inventory), "-e", json.dumps(extra), *arguments)
    assert run.returncode == 0, run.output[-3000:]
    assert KEY not in run.output
    return {path.stem: json.loads(path.read_text()) for path in out.glob("*.json")}


# (id, what the user passed, the key clients send, every key a door takes)
KEYS = [
    ("key", {}, KEY, [KEY]),
    ("rotation", {"credentials_api_key_previous": KEY[::-1]}, KEY, [KEY, KEY[::-1]]),
    ("anonymous-loopback", {"credentials_api_key": "", "door_listen_address": "127.0.0.1"}, "", []),
    ("key-files", {"credentials_api_key": "", "api_key_from_files": True}, KEY, [KEY, KEY[::-1]]),
]


@pytest.fixture(scope="module")
def decided_keys(tmp_path_factory) -> dict:
    """What play 1 decided of the keys for each case of KEYS, in one run."""
    directory = tmp_path_factory.mktemp("keys")
    (directory / "key").write_text(KEY + "\n")
    (directory / "previous").write_text(KEY[::-1] + "\n")
    files = {
        "credentials_api_key_file": str(directory / "key"),
        "credentials_api_key_previous_file": str(directory / "previous"),
    }
    cases = {}
    for case, given, _, _ in KEYS:
        given = dict(given)
        cases[case] = given | (files if given.pop("api_key_from_files", False) else {})
    decided = "{{ {'key': credentials_client_key, 'keys': credentials_client_keys} }}"
    return published_each(directory, cases, decided)


@pytest.mark.parametrize(
    ("case", "key", "keys"), [(c[0], c[2], c[3]) for c in KEYS], ids=[c[0] for c in KEYS]
)
def test_the_first_play_decides_the_keys_every_door_takes(decided_keys, case, key, keys):
    """The one place the client keys are decided (credentials: check): the key clients
    send, and every key a door takes, from the values or the files on the controller."""
    assert decided_keys[case] == {"key": key, "keys": keys}


def test_a_tls_door_is_verified_with_the_ca_that_signed_it(tmp_path):
    """credentials_door.ca_file, which the benchmark's load generator verifies the door
    with: none for plain HTTP; the kit's CA for the kit's certificate; the operator's CA
    for the operator's certificate, or the client's system CAs without one."""
    kit = {"credentials_tls": True, "credentials_dir": str(tmp_path / "kit")}
    cert, key = frontdoor.self_signed(tmp_path, HOST)
    own = {"credentials_tls_cert": str(cert), "credentials_tls_key": str(key)}
    ca = {"credentials_fleet_ca_file": str(cert)}
    cases = {"plain": {}, "kit": kit, "own": own, "own-ca": own | ca}
    assert published_each(tmp_path, cases, "{{ credentials_door.ca_file }}") == {
        "plain": "",
        "kit": str(tmp_path / "kit/door-ca.pem"),
        "own": "",
        "own-ca": str(cert),
    }


def test_a_tls_door_takes_the_fleet_doors_certificate_only_behind_a_fleet_door(inventory, tmp_path):
    """credentials_door.takes_fleet_client, which decides whether a host's door trusts the
    fleet door's client certificate in place of a key: a TLS door behind a fleet door does;
    a plain door, or a TLS door with no fleet door in the inventory, takes none."""
    fleet = yaml.safe_load(inventory.read_text())
    fleet["all"]["children"] = {"socketwise_frontdoor": {"hosts": {"door-01": {}}}}
    behind = tmp_path / "fleet.yml"
    behind.write_text(yaml.safe_dump(fleet))
    takes = "{{ credentials_door.takes_fleet_client }}"
    kit = {"credentials_tls": True, "credentials_dir": str(tmp_path / "kit")}
    # The fleet door's host is only named: play 1 runs on the serving host alone.
    assert published(behind, tmp_path, kit, takes, "--limit", HOST) is True
    assert published(behind, tmp_path, {}, takes, "--limit", HOST) is False
    assert published(inventory, tmp_path, kit, takes) is False


def test_a_number_that_does_not_convert_names_the_variable_and_the_value(inventory):
    run = check(inventory, "vllm_service_restart_sec=ten")
    assert run.returncode != 0
    assert "argument 'vllm_service_restart_sec' is of type str and we were unable to" in run.output
    assert "'ten'" in run.output
    assert "TASK [topology" not in run.output


def test_numbers_given_with_e_are_taken_as_the_numbers_they_spell(inventory):
    # Each was refused or broke a later play when it stayed a string: a valid metrics port
    # was "not a port". The run stops later, at a model the
    # controller does not have: every value check before it passed.
    run = check(
        inventory,
        "door_metrics_port=9181",
        "node_exporter_port=9101",
        "vllm_service_start_limit_burst=3",
        "vllm_service_restart_sec=5",
        "vllm_service_ready_timeout=600",
        "credentials_allow_anonymous=no",
        "vllm_service_max_model_len=4096",
        "vllm_model_path=/nonexistent/model",
    )
    assert refusal(run).startswith(f"{HOST}: vllm_model_path=/nonexistent/model: no model there")


def test_every_number_and_switch_is_read_through_its_role_s_conversion():
    """A role that reads an int, float or bool argument bare gets the string -e gave: every
    such variable a role converts (its __ROLE_typed_input) is read as __ROLE_typed.NAME in
    every task and template, never bare."""
    types = declared_types()
    converted: dict[str, str] = {}
    for vars_file in sorted(REPO.glob("roles/*/vars/main.yml")):
        role = vars_file.parent.parent.name
        for name in (yaml.safe_load(vars_file.read_text()) or {}).get(f"__{role}_typed_input", {}):
            assert name in types, f"{role}: {name} has no int, float or bool argument spec"
            converted[name] = f"__{role}_typed"
    assert {"vllm_service_start_limit_burst", "cluster_ctx_size"} <= converted.keys()
    readers = [*REPO.glob("roles/*/tasks/*.yml"), *REPO.glob("templates/*.j2")]
    readers += [p for p in REPO.glob("roles/*/vars/main.yml")]
    bare = []
    for path in readers:
        text = path.read_text()
        for name, typed in converted.items():
            for match in re.finditer(rf"(?<![\w.'\"]){name}(?![\w=:'\"])", text):
                line = text.count("\n", 0, match.start()) + 1
                # A YAML key that sets it, a variable's name given as a string, a task's
                # name or a comment: words, not reads.
                words = rf"\s*(- )?((variable: )?{name}(:|$)|name: |#)"
                if not re.match(words, text.splitlines()[line - 1]):
                    bare.append(f"{path.relative_to(REPO)}:{line}: {name} (read {typed}.{name})")
    assert bare == []


def test_a_monitor_and_its_hosts_are_refused_in_one_line_before_anything_changes(
    inventory, tmp_path
):
    hosts = yaml.safe_load(inventory.read_text())
    hosts["all"]["children"] = {
        "socketwise_monitor": {"hosts": {"mon-01": dict(hosts["all"]["hosts"][HOST])}}
    }
    inventory.write_text(yaml.safe_dump(hosts))
    # A monitored host needs the scrape token.
    run = check(inventory, f"--limit={HOST}")
    assert refusal(run).startswith(
        f"{HOST}: credentials_metrics_token_file is empty, but the inventory has monitor hosts "
        "(mon-01)"
    ), refusal(run)
    token = tmp_path / "scrape-token"
    token.write_text("scrape-" + "t" * 24 + "\n")
    given = {"credentials_metrics_token_file": str(token)}
    held = socket.create_server(("127.0.0.1", 0))
    port = held.getsockname()[1]
    # A monitor host per bad value, all refused in one run, each on its own.
    monitors = {
        "mon-interval": (
            {"monitor_scrape_interval": "15"},
            "monitor_scrape_interval=15: not a Prometheus duration",
        ),
        "mon-listen": (
            {"monitor_listen_address": "0.0.0.0"},
            "monitor_listen_address=0.0.0.0: give one IP",
        ),
        "mon-share": (
            {"monitor_retention_share": 2},
            "monitor_retention_share=2.0: give a fraction",
        ),
        "mon-webhook": (
            {"monitor_alert_webhook_url": "ftp://x"},
            "monitor_alert_webhook_url=ftp://x: give an http:// or https:// URL",
        ),
        "mon-sources": ({"door_metrics_sources": ["0.0.0.0"]}, "door_metrics_sources='0.0.0.0'"),
        # A Prometheus of the host's own (this test's listener) holds the port.
        "mon-port": (
            {"monitor_prometheus_port": port},
            f"monitor_prometheus_port={port}: port {port} on 127.0.0.1 is held by",
        ),
    }
    hosts["all"]["children"] = {
        "socketwise_monitor": {
            "hosts": {name: local_host() | given | bad for name, (bad, _) in monitors.items()}
        }
    }
    inventory.write_text(yaml.safe_dump(hosts))
    run = check(inventory, "--limit=socketwise_monitor", "--forks=6")
    stops = each_hosts_stop(run, monitors)
    for name, (_, words) in monitors.items():
        stopped, ran, printed = stops[name]
        assert stopped.startswith(f"{name}: {words}"), printed[-3000:]
        assert not [task for task in ran if task.startswith("topology")], sorted(ran)
    held.close()
    # The API key as the scrape token: a monitor would hold a key that gets completions.
    token.write_text(KEY + "\n")
    run = check(inventory, given, f"--limit={HOST}")
    assert refusal(run).startswith(f"{HOST}: credentials_metrics_token_file: holds an API key"), (
        refusal(run)
    )
    assert KEY not in refusal(run)
