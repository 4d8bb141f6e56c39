"""Fleet rollout on a lab of its own (`rollout`, beside the other test worker's lab): two
serving machines behind a fleet front door (a third), changed under an open-loop load of
completions through that front door.

One deployment for the module (rollout1 with one instance, rollout2 with two replicas);
each stage builds on the last: a rollout that changes nothing (in a ramp of batches), a
rolling update to a new release (a new model revision and a changed vLLM argument), a
vLLM killed under load, rollout2 turned to serving the tiny model under another name (two
models behind the one fleet door from then on), a rollout whose first host cannot become
healthy (the second is never reached, the other model's load loses nothing), a canary
whose new release the benchmark gate finds slower (when asked: GATE), and a client key
rotation under a load of both models. The lab inventory gets `--enforce-eager` here: the
tiny model then restarts in about 20 s instead of 60 s (torch compile), which the
rollout's logic does not depend on.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import itertools
import json
import re
import secrets
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from socketwise.common import paths, promql
from socketwise.lab import machines as lab
from socketwise.lab.common import api_key_path, scrape_token_path

from . import frontdoor
from .labs import eager_inventory, fresh_lab, named_lab, run_on, unless_asked
from .playbooks import REPO, PlaybookRun, run_playbook

# Its own lab (tests/conftest.py's LAB_OF): the suite's two workers run it beside another.
LAB = "rollout"
pytestmark = pytest.mark.lab

# SN_HOST serves one instance, DP_HOST two replicas.
SERVING = SN_HOST, DP_HOST = (f"{LAB}1", f"{LAB}2")
DOOR = f"{LAB}3"
UNITS = "/etc/systemd/system/socketwise-*.service"
VLLM_UNIT = "socketwise-vllm-sn.service"
# Each machine's front door.
DOOR_UNITS = {SN_HOST: "socketwise-lb.service", DP_HOST: "socketwise-lb.service"} | {
    DOOR: "socketwise-fleet.service"
}
REPLICAS = ("vllm-dp0", "vllm-dp1")
# The benchmark gate's tolerance in the canary stage. The lab's hosts share two cores,
# and the gate's own benchmark spends seconds importing vLLM on them, so the gate is
# proven without the load, against a release that serves one request at a time (on
# 2026-11-25 it gave 0.56 of the previous release's output, which a tolerance of 0.5 let
# through).
GATE_TOLERANCE = 0.25
FLEET_PORT = 8000
# The load of the stages that restart engines, printed as a share of the fleet door's
# flat-out rate, measured once after the deploy (FLAT_OUT_CLIENTS completions always
# waiting, for FLAT_OUT_SECONDS). Not half, as on servers: the lab's machines share two
# cores, and vLLM's worker polls for its next step for a second after each one, so with
# requests less than about a second apart the serving engine keeps the cores busy and the
# one a rollout restarts, pinned to the same cores, starves (the fleet guide; 0.91 req/s,
# 5 % of flat out, starved it). What each request of the load asks for.
LOAD_RATE = 0.5
# How long a request of the load may take before it counts as failed. Not a latency
# target: in the suite this lab shares the two cores with another lab's, and an engine
# of this one, starved while the other's benchmark runs flat out, was seen to answer
# nothing for 47 s (its door marked it down, then up again, the request still in it), so
# a request it held took over a minute, and was answered.
LOAD_TIMEOUT = 300
FLAT_OUT_CLIENTS = 16
FLAT_OUT_SECONDS = 20
# Requests of the new key's client served before it stops (the key-rotation stage): a
# few, so both hosts' doors are seen passing the new key.
SWITCHED_SERVED = 6
# The model each serving host's engines answer as: the tiny model under two names from the
# two-model stage on (before it, both hosts serve SN_MODEL).
MODELS = SN_MODEL, DP_MODEL = ("tiny-llama", "tiny-chat")
LOAD_REQUEST = {"model": SN_MODEL, "prompt": "socketwise rolls out", "max_tokens": 32}


# The monitor (Prometheus and Alertmanager) runs on the fleet door's machine, scraping
# every SCRAPE_INTERVAL; Alertmanager sends to a webhook of this module at once.
MONITOR = DOOR
SCRAPE_INTERVAL = 5
PROMETHEUS_PORT = 9090
MONITOR_VARS = {
    "monitor_scrape_interval": f"{SCRAPE_INTERVAL}s",
    "monitor_group_wait": "1s",
    "monitor_group_interval": "5s",
}
DASHBOARD = REPO / "roles/monitor/files/grafana/socketwise-fleet.json"


class Webhook(http.server.ThreadingHTTPServer):
    """Alertmanager's receiver: every notification it posts, as (time.monotonic(), body)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _WebhookHandler)
        self.received: list[tuple[float, dict]] = []
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/alerts"

    def alerts(self, name: str, host: str, status: str) -> list[float]:
        """When notifications carrying alert NAME of HOST in STATUS arrived."""
        return [
            at
            for at, body in list(self.received)
            for alert in body.get("alerts", [])
            if alert["labels"].get("alertname") == name
            and alert["labels"].get("host") == host
            and alert["status"] == status
        ]


class _WebhookHandler(http.server.BaseHTTPRequestHandler):
    server: Webhook

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.received.append((time.monotonic(), body))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@dataclass
class Fleet:
    machines: dict[str, lab.Machine]
    inventory: Path
    artifacts: Path
    work: Path
    webhook: Webhook | None = None
    # The fleet door's measured flat-out rate (requests/s).
    flat_out: float = 0.0
    deploy_output: str = ""

    def prometheus(self, path: str, **query: str) -> dict:
        """The monitor's Prometheus API (on its machine's private address): the answer's data."""
        url = f"{self.prometheus_url}/api/v1/{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        with urllib.request.urlopen(url, timeout=10) as answer:
            return json.loads(answer.read())["data"]

    @property
    def prometheus_url(self) -> str:
        private = self.machines[MONITOR].address.replace("127.0.", "127.1.", 1)
        return f"http://{private}:{PROMETHEUS_PORT}"

    def firing(self, name: str) -> list[dict]:
        """Every alert NAME firing now (its labels, activeAt...)."""
        return [
            alert
            for alert in self.prometheus("alerts")["alerts"]
            if alert["labels"]["alertname"] == name and alert["state"] == "firing"
        ]

    def run(self, playbook: str, *extra: str) -> tuple[PlaybookRun, float]:
        started = time.monotonic()
        done = run_playbook(
            playbook, "-i", str(self.inventory), *extra,
            env={"SOCKETWISE_ARTIFACTS": str(self.artifacts)},
        )  # fmt: skip
        return done, time.monotonic() - started

    def on(self, host: str, command: str) -> str:
        return run_on(self.machines[host], command)

    def summary(self) -> dict[str, dict]:
        hosts = json.loads((self.artifacts / "rollout-summary.json").read_text())["hosts"]
        return {entry["host"]: entry for entry in hosts}

    def footprint(self, host: str) -> dict[str, str]:
        """What a rollout must not touch on a host it has not reached."""
        return {
            "release": self.on(host, "readlink /opt/socketwise/releases/current"),
            "files": self.on(
                host, f"sha256sum {UNITS} /etc/socketwise/haproxy.cfg"
            ),
            "started": self.on(
                host, "systemctl show -p Id -p ExecMainStartTimestampMonotonic 'socketwise-*'"
            ),
        }  # fmt: skip

    def door_log(self, host: str, since: float, requests: int = 0) -> str:
        """What HOST's door (DOOR_UNITS) logged since SINCE (epoch seconds), one line a
        request; with REQUESTS, once that many lines of completions are in (HAProxy may
        write a request's line just after its answer), 10 s at most."""
        deadline = time.monotonic() + 10
        while True:
            lines = self.on(
                host, f"journalctl -o short-unix --since @{int(since)} -u {DOOR_UNITS[host]}"
            ).splitlines()  # fmt: skip
            log = "\n".join(
                line for line in lines if line[:1].isdigit() and float(line.split()[0]) >= since
            )
            if log.count('"POST /v1/completions ') >= requests or time.monotonic() > deadline:
                return log
            time.sleep(0.5)

    def main_pid(self, host: str, unit: str) -> str:
        """The unit's main process: the same after a reload, another after a restart."""
        return self.on(host, f"systemctl show -p MainPID --value {unit}").strip()

    def started_at(self, host: str, unit: str) -> float:
        """When the unit's main process started, in epoch seconds (systemd's own record)."""
        shown = self.on(host, f"systemctl show -p ExecMainStartTimestamp --timestamp=us+utc {unit}")
        # ExecMainStartTimestamp=Thu 2026-11-26 23:43:19.031919 UTC: microseconds, as the
        # rollout summary's own times have.
        stamp = shown.strip().split("=", 1)[1]
        return (
            datetime.strptime(stamp, "%a %Y-%m-%d %H:%M:%S.%f %Z").replace(tzinfo=UTC).timestamp()
        )

    def fleet_servers(self) -> dict[str, dict[str, str]]:
        """The fleet front door's own view (runtime API): per host, status and sessions."""
        reader = (
            "import socket; s = socket.socket(socket.AF_UNIX); "
            "s.connect('/run/socketwise-fleet/admin.sock'); s.sendall(b'show stat\\n'); "
            "print(b''.join(iter(lambda: s.recv(65536), b'')).decode())"
        )
        lines = self.on(DOOR, f'python3 -c "{reader}"').splitlines()
        header = lines[0].lstrip("# ").split(",")
        rows = [dict(zip(header, line.split(","), strict=False)) for line in lines[1:] if line]
        # One backend `fleet`, or one per model (`fleet-MODEL`): a host is in one of them.
        return {
            r["svname"]: r
            for r in rows
            if r.get("pxname", "").startswith("fleet") and r["svname"] in SERVING
        }


def flat_out(fleet: Fleet) -> float:
    """Completions a second through the fleet front door with FLAT_OUT_CLIENTS always
    waiting for one (a closed loop)."""
    address, key = fleet.machines[DOOR].address, api_key_path().read_text().strip()
    done: list[int] = []
    until = time.monotonic() + FLAT_OUT_SECONDS

    def client() -> None:
        while time.monotonic() < until:
            done.append(
                frontdoor.call(address, FLEET_PORT, "/v1/completions", key, LOAD_REQUEST)[0]
            )

    threads = [threading.Thread(target=client) for _ in range(FLAT_OUT_CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return done.count(200) / FLAT_OUT_SECONDS


class Load:
    """Open-loop load through the fleet front door for as long as it takes: a completion
    every 1/rate seconds (LOAD_RATE unless given), each on a thread of its
    own (a slow answer never delays the next send), from before a change starts until
    after it ends, or until SERVED requests were served when given. The requests ask for
    MODELS in turn. A request fails when the front door answers other than 200, or not at
    all."""

    def __init__(
        self,
        fleet: Fleet,
        key: str | None = None,
        rate: float = LOAD_RATE,
        served: int = 0,
        models: tuple[str, ...] = (SN_MODEL,),
    ):
        self.address = fleet.machines[DOOR].address
        self.key = key or api_key_path().read_text().strip()
        self.rate = rate
        self.share = rate / fleet.flat_out
        self.sends: list[float] = []
        # (sent, answered, status) of each request, as time.monotonic() seconds (status 0:
        # no answer).
        self.answered: list[tuple[float, float, int]] = []
        self.requests: list[threading.Thread] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.served = served
        self.models = models
        self.launcher = threading.Thread(target=self._launch, daemon=True)
        self.launcher.start()

    def _launch(self) -> None:
        while not self.stopping.is_set():
            self.sends.append(time.time())
            model = self.models[len(self.sends) % len(self.models)]
            request = threading.Thread(
                target=self._request, args=(time.monotonic(), model), daemon=True
            )
            request.start()
            self.requests.append(request)
            self.stopping.wait(1 / self.rate)

    def _request(self, sent: float, model: str) -> None:
        try:
            status, _ = frontdoor.call(
                self.address, FLEET_PORT, "/v1/completions", self.key,
                LOAD_REQUEST | {"model": model}, timeout=LOAD_TIMEOUT,
            )  # fmt: skip
        except (OSError, http.client.HTTPException):
            status = 0
        with self.lock:
            self.answered.append((sent, time.monotonic(), status))
            if self.served and sum(s == 200 for _, _, s in self.answered) >= self.served:
                self.stopping.set()

    def finish(self) -> dict:
        """sent, completed, failed, `windows`: when the load ran, as epoch seconds (one
        window, from its first send until it was stopped), and `failures`: (sent, answered,
        status) of each failed request, as time.monotonic() seconds (status 0: no answer);
        `statuses`: each request's status, in the order they were sent; `slowest`: the
        seconds the longest request took."""
        stopped = time.time()
        self.stopping.set()
        self.launcher.join()
        for request in self.requests:
            request.join(timeout=LOAD_TIMEOUT + 30)
        assert len(self.answered) == len(self.sends), "a request of the load never returned"
        completed = sum(status == 200 for _, _, status in self.answered)
        return {
            "models": self.models,
            "rate": self.rate,
            "share": self.share,
            "sent": len(self.sends),
            "completed": completed,
            "failed": len(self.sends) - completed,
            "windows": [(self.sends[0], stopped)],
            "failures": [
                (sent, answered, status)
                for sent, answered, status in self.answered
                if status != 200
            ],
            "statuses": [status for _, _, status in sorted(self.answered)],
            "slowest": max((answered - sent for sent, answered, _ in self.answered), default=0),
        }


def failed_story(fleet: Fleet, load: dict) -> str:
    """What a load's failed requests were, and what the doors logged while it ran besides
    their 200s: for an assertion's message."""
    started = time.monotonic() - (time.time() - load["windows"][0][0])
    failures = [
        f"status {status} sent at +{sent - started:.1f} s, answered at +{answered - started:.1f} s"
        for sent, answered, status in load["failures"]
    ]
    logs = [
        f"--- {host} {unit}\n"
        + fleet.on(
            host,
            f"journalctl -o short-unix --since @{load['windows'][0][0]:.0f} -u {unit} "
            "| grep -v -e ' 200 ' -e 'Proxy .* stopped' | tail -40",
        )  # fmt: skip
        for host, unit in DOOR_UNITS.items()
    ]
    return "\n".join(
        [
            told(load),
            f"(+0 s is {load['windows'][0][0]:.1f} in the logs' time)",
            *failures,
            *logs,
            *engines_story(fleet, load),
        ]
    )


# Each serving host's engines: their state, the state of each of their processes'
# threads and what they logged (an engine that stops answering is seen from inside).
ENGINES_STORY = (
    "for unit in $(systemctl list-units --plain --no-legend 'socketwise-vllm-*' | cut -d' ' -f1); "
    'do echo "--- $unit"; '
    "systemctl show -p ActiveState -p NRestarts $unit | paste -sd' '; "
    "main=$(systemctl show -p MainPID --value $unit); "
    "ps -L -o pid,tid,stat,pcpu,wchan:22,comm --pid $main --ppid $main "
    "| awk 'NR == 1 || $4 > 0.5 || $3 !~ /S/'; "
    "journalctl -o short-unix --since @{since} -u $unit | grep -v -e ' 200 OK' | tail -15; done"
)


def engines_story(fleet: Fleet, load: dict) -> list[str]:
    since = f"{load['windows'][0][0]:.0f}"
    return [
        f"=== {host}\n" + fleet.on(host, ENGINES_STORY.format(since=since)) + python_stacks(host)
        for host in SERVING
    ]


def python_stacks(host: str) -> str:
    """Each Python thread's stack in HOST's engines (py-spy, from here: the lab's machines
    are this kernel's processes), for an engine that stops answering."""
    spy = Path(sys.executable).with_name("py-spy")
    stacks = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if f"/{host}/payload/system.slice/socketwise-vllm-" in (proc / "cgroup").read_text():
                done = subprocess.run([spy, "dump", "--pid", proc.name], capture_output=True,
                                      text=True, timeout=60)  # fmt: skip
                stacks.append(done.stdout + done.stderr)
    return "\n".join(stacks)


def told(load: dict) -> str:
    """A load's rate, its share of flat out, its requests sent, answered and failed, and the
    longest one took."""
    return (
        f"load of {', '.join(load['models'])} at {load['rate']} req/s "
        f"({load['share']:.1%} of flat out) sent {load['sent']}, "
        f"answered {load['completed']}, failed {load['failed']}, slowest {load['slowest']:.1f} s"
    )


def covered(windows: list[tuple[float, float]], until: float) -> bool:
    """Whether the load's sending windows leave no gap from the first one to `until`."""
    reached = windows[0][1]
    for start, end in windows[1:]:
        if start > reached:
            return False
        reached = max(reached, end)
    return reached >= until


def under_load(
    fleet: Fleet, playbook: str, *extra: str, models: tuple[str, ...] = (SN_MODEL,)
) -> tuple[PlaybookRun, float, dict]:
    """PLAYBOOK while the load of MODELS runs (sending before the playbook starts): the
    run, its seconds and the load's outcome."""
    load = Load(fleet, models=models)
    time.sleep(5)
    try:
        done, seconds = fleet.run(playbook, *extra)
    finally:
        result = load.finish()
    return done, seconds, result


def rollout_under_load(
    fleet: Fleet, what: str, *extra: str, models: tuple[str, ...] = (SN_MODEL,)
) -> tuple[PlaybookRun, float, dict]:
    """rollout.yml while the load of MODELS runs (sending before the rollout starts)."""
    done, seconds, result = under_load(fleet, "rollout.yml", *extra, models=models)
    print(f"\n{what} under load: {seconds:.0f} s; {told(result)}")
    return done, seconds, result


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("fleet")
    # CAP_NET_ADMIN: each monitored host loads its metrics door's nftables table.
    with (
        named_lab(LAB),
        fresh_lab(machines=3, frontdoor=1, preinstalled=True, net_admin=True) as machines,
    ):
        inventory = eager_inventory(work / "inventory")
        (inventory / "host_vars").mkdir()
        (inventory / "host_vars" / f"{DP_HOST}.yml").write_text("plan_layout: dp\n")
        # The serving hosts' doors speak TLS with the certificates the kit's CA issues them,
        # and the fleet door verifies them (fleet_door_verify's default).
        (inventory / "tls.yml").write_text(
            json.dumps({"all": {"children": {"tls_doors": {"hosts": dict.fromkeys(SERVING, {})}}}})
        )
        (inventory / "group_vars" / "tls_doors.yml").write_text("credentials_tls: true\n")
        # The fleet door's machine is the monitor too.
        (inventory / "monitor.yml").write_text(
            json.dumps({"all": {"children": {"socketwise_monitor": {"hosts": {MONITOR: {}}}}}})
        )
        webhook = Webhook()
        (inventory / "host_vars" / f"{MONITOR}.yml").write_text(
            json.dumps(MONITOR_VARS | {"monitor_alert_webhook_url": webhook.url})
        )
        built = Fleet({m.name: m for m in machines}, inventory, work / "artifacts", work, webhook)
        done, seconds = built.run("deploy.yml")
        assert done.returncode == 0, done.output[-4000:]
        built.deploy_output = done.output
        print(f"\ndeploy of 2 hosts, the fleet front door and its monitor: {seconds:.0f} s")
        measured = flat_out(built)
        assert measured > 0, "the fleet front door served nothing flat out"
        built.flat_out = measured
        print(
            f"\nfleet door flat out: {measured:.2f} req/s ({FLAT_OUT_CLIENTS} clients); the load: "
            f"{LOAD_RATE} req/s ({LOAD_RATE / measured:.1%})"
        )
        yield built


@pytest.fixture(scope="module")
def noop(fleet) -> tuple[PlaybookRun, float, dict, dict, dict]:
    """A rollout with nothing to change, in a ramp of batches: one host, then up to two."""
    before = {host: fleet.footprint(host) for host in SERVING}
    done, seconds = fleet.run("rollout.yml", "-e", '{"rollout_batch": [1, 2]}')
    print(f"\nno-op rollout of 2 hosts: {seconds:.0f} s")
    after = {host: fleet.footprint(host) for host in SERVING}
    return done, seconds, before, after, fleet.summary()


@pytest.fixture(scope="module")
def new_secret(fleet, noop) -> tuple[PlaybookRun, dict, dict[str, float], dict[str, float]]:
    """deploy.yml with a new Hugging Face token, a secret in every instance's vllm.env,
    under load. The token then stays in the inventory, so later stages change no secret."""
    token = f"hf_{secrets.token_hex(16)}"
    # What an earlier version left on the fleet door: the client key in frontdoor.env.
    stale = "/etc/socketwise/secrets/frontdoor.env"
    fleet.on(DOOR, f"umask 077; echo SOCKETWISE_API_KEY=an-old-key > {stale}")
    done, seconds, result = under_load(fleet, "deploy.yml", "-e", f"vllm_service_hf_token={token}")
    with (fleet.inventory / "group_vars" / "lab.yml").open("a") as group_vars:
        group_vars.write(f"vllm_service_hf_token: {token}\n")
    instances = {SN_HOST: [VLLM_UNIT], DP_HOST: [f"socketwise-{r}.service" for r in REPLICAS]}
    started = {
        host: min(fleet.started_at(host, unit) for unit in units)
        for host, units in instances.items()
    }
    # When each host's instances served again: vLLM's last "Available routes are:" (its
    # HTTP server starting, the engine ready) in their journals since the restart.
    serving = {}
    for host, units in instances.items():
        lines = fleet.on(
            host, f"journalctl -o short-unix --since @{started[host]:.0f} "
            + " ".join(f"-u {unit}" for unit in units) + " | grep 'Available routes are'"
        ).splitlines()  # fmt: skip
        serving[host] = float(lines[-1].split()[0])
    print(
        f"\nnew secret on 2 hosts under load: {seconds:.0f} s; {told(result)}; "
        f"restarted at {started}, serving at {serving}"
    )
    return done, result, started, serving


def test_a_new_secret_restarts_the_hosts_one_after_another(fleet, new_secret):
    done, load, started, serving = new_secret
    assert done.returncode == 0, done.output[-3000:]
    # Each host's instances left its front door before their restart: their requests in
    # flight finished, and the fleet door sent the rest to the other host.
    assert load["sent"] > 0 and load["failed"] == 0, failed_story(fleet, load)
    # In inventory order: SN_HOST's instance restarted and served again before any of
    # DP_HOST's replicas stopped, so the fleet door always had a host.
    assert started[SN_HOST] < serving[SN_HOST] < started[DP_HOST] < serving[DP_HOST], (
        started, serving
    )  # fmt: skip


def test_the_fleet_door_keeps_no_key_an_earlier_version_left(fleet, new_secret):
    # The hosts' doors are TLS: the fleet door holds its client certificate for them.
    assert fleet.on(DOOR, "ls /etc/socketwise/secrets").split() == [
        "client-keys", "fleet-client.pem", "scrape-keys", "scrape-token"
    ]  # fmt: skip


@pytest.fixture(scope="module")
def rolled(fleet, noop, new_secret) -> tuple[PlaybookRun, float, dict, dict, set[str]]:
    """Every host to a new model revision with a changed vLLM argument, under load."""
    revision = fleet.work / "revision-2" / "tiny-llama"
    shutil.copytree(paths.cache_dir() / "models" / "tiny-llama", revision)
    (revision / "REVISION").write_text("2: the same weights, a new revision of the repository\n")
    # In the lab group's own file: its vllm_service_extra_args would win over all.yml's.
    (fleet.inventory / "group_vars" / "lab.yml").write_text(
        (REPO / "inventories" / "lab" / "group_vars" / "lab.yml").read_text()
        + f'vllm_model_path: "{revision}"\n'
        + 'vllm_service_extra_args: ["--enforce-eager", "--max-num-seqs", "64"]\n'
    )
    # The monitor's view meanwhile: the hosts it saw marked in rollout.
    marked: set[str] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError, ValueError):
                alerts = fleet.firing("SocketwiseOperationInProgress")
                marked.update(alert["labels"]["host"] for alert in alerts)
            stop.wait(2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        done, seconds, result = rollout_under_load(fleet, "rolling update of 2 hosts")
    finally:
        stop.set()
        watcher.join()
    return done, seconds, result, fleet.summary(), marked


@pytest.fixture(scope="module")
def failed_rollout(fleet, two_models) -> tuple[PlaybookRun, dict, dict, dict]:
    """SN_HOST's new release cannot start; DP_HOST is never reached. The load asks for
    DP_HOST's model alone: a rollout of one model's hosts loses none of another's, while
    SN_MODEL has no host. SN_HOST's host_vars that asked for it go afterwards: the
    inventory says again what both hosts serve."""
    args = ["--enforce-eager", "--max-num-seqs", "64", "--no-such-flag"]
    host_vars = fleet.inventory / "host_vars" / f"{SN_HOST}.yml"
    host_vars.write_text(f"vllm_service_extra_args: {json.dumps(args)}\n")
    untouched = fleet.footprint(DP_HOST)
    before = fleet.on(SN_HOST, "readlink /opt/socketwise/releases/current")
    try:
        done, _, result = rollout_under_load(
            fleet, f"rollout stopped at {SN_HOST}", models=(DP_MODEL,)
        )
    finally:
        host_vars.unlink()
    return done, result, {DP_HOST: untouched, SN_HOST: before}, fleet.summary()


# The benchmark gate's lab proof (its arithmetic has fast tests in tests/test_gate.py):
# the canary's rollout, benchmark and rollback, about 5 minutes on a slow controller.
# Run it before a change to the gate, the benchmark role or the rollout's steps.
GATE = unless_asked("the rollout's benchmark gate on a canary", "SOCKETWISE_ROLLOUT_GATE")


@pytest.fixture(scope="module")
def gated_canary(fleet, failed_rollout) -> tuple[PlaybookRun, dict, str]:
    """SN_HOST alone, with the benchmark gate, to a release that serves one request at a
    time (the gate's benchmark sends two at once): it must fail the gate and go back."""
    args = ["--enforce-eager", "--max-num-seqs", "1"]
    (fleet.inventory / "host_vars" / f"{SN_HOST}.yml").write_text(
        f"vllm_service_extra_args: {json.dumps(args)}\n"
    )
    before = fleet.on(SN_HOST, "readlink /opt/socketwise/releases/current")
    try:
        done, seconds = fleet.run(
            "rollout.yml", "--limit", SN_HOST, "-e", f"rollout_gate_tolerance={GATE_TOLERANCE}"
        )
    finally:
        (fleet.inventory / "host_vars" / f"{SN_HOST}.yml").unlink()
    print(f"\ngated canary of {SN_HOST}, refused and rolled back: {seconds:.0f} s")
    return done, fleet.summary(), before


def test_a_rollout_that_changes_nothing_touches_nothing(noop):
    done, _, before, after, summary = noop
    assert done.returncode == 0, done.output[-3000:]
    for host in SERVING:
        assert done.recap(host)["changed"] == 0, (host, done.changed_tasks(host))
        assert after[host] == before[host], host
        assert summary[host]["reason"] == "nothing to change"
    assert done.recap(DOOR)["changed"] == 0
    # rollout_batch [1, 2]: SN_HOST alone, then the rest (DP_HOST).
    assert {host: summary[host]["batch"] for host in SERVING} == {
        SN_HOST: [SN_HOST], DP_HOST: [DP_HOST]
    }  # fmt: skip


def test_the_fleet_front_door_serves_through_every_host_with_the_key_checks(fleet, noop):
    key = api_key_path().read_text().strip()
    door = fleet.machines[DOOR].address
    assert frontdoor.completion_tokens(door, FLEET_PORT, key) > 0
    assert frontdoor.call(door, FLEET_PORT, "/v1/completions", None, frontdoor.COMPLETION)[0] == 401
    assert frontdoor.call(door, FLEET_PORT, "/metrics", key)[0] == 403
    assert {h: s["status"] for h, s in fleet.fleet_servers().items()} == dict.fromkeys(
        SERVING, "UP"
    )
    # The runtime API socket is root's alone.
    assert fleet.on(DOOR, "stat -c %a /run/socketwise-fleet") == "700"


def test_the_fleet_door_verifies_each_hosts_door_which_takes_its_certificate_alone(
    fleet, noop, tmp_path
):
    """The kit's CA issued each serving host's door certificate (credentials_tls): the
    fleet door verifies each by its host's name (it served through both above), a client
    verifies it against the kit's CA by the host's address and not as another host, and a
    host's door takes the fleet door's own certificate in place of the key, not another
    the kit's CA signed under the same name."""
    key = api_key_path().read_text().strip()
    credentials = fleet.inventory / "credentials"
    ca = credentials / "door-ca.pem"
    config = fleet.on(DOOR, "cat /etc/socketwise/fleet-haproxy.cfg")
    impostor = tmp_path / "impostor.pem"
    signer = ["-CA", str(ca), "-CAkey", str(credentials / "door-ca.key")]
    subprocess.run(
        ["bash", "-c", f"""set -e; cd {tmp_path}
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
  -subj '/CN=socketwise fleet door' -keyout k -out csr 2>/dev/null
printf 'extendedKeyUsage=clientAuth\n' > ext
openssl x509 -req -in csr {' '.join(signer)} -days 1 -extfile ext -out c 2>/dev/null
cat c k > {impostor}"""],
        check=True,
    )  # fmt: skip
    for host, other in zip(SERVING, reversed(SERVING), strict=True):
        address = fleet.machines[host].address
        assert re.search(
            rf"server {host} \S+ .* ssl verify required ca-file \S+ verifyhost {host} ", config
        ), config
        assert frontdoor.call(address, FLEET_PORT, "/v1/models", key, ca=ca)[0] == 200, host
        with (
            pytest.raises(ssl.SSLCertVerificationError),
            socket.create_connection((address, FLEET_PORT), timeout=10) as raw,
        ):
            ssl.create_default_context(cafile=ca).wrap_socket(raw, server_hostname=other)
        fleet_door = frontdoor.call(
            address, FLEET_PORT, "/v1/completions", None, frontdoor.COMPLETION, ca=ca,
            cert=credentials / "fleet-client.pem",
        )  # fmt: skip
        assert fleet_door[0] == 200, (host, fleet_door)
        # The host's door checks the certificate against the fleet door's client CA: the
        # impostor does not pass the handshake.
        with pytest.raises(ssl.SSLError):
            frontdoor.call(
                address, FLEET_PORT, "/v1/completions", None, frontdoor.COMPLETION, ca=ca,
                cert=impostor,
            )  # fmt: skip


def test_each_engine_is_reached_by_its_door_alone_its_own_sockets_in_its_own_network(fleet, noop):
    # These hosts' root holds CAP_NET_ADMIN: each instance's unit has a network namespace
    # of its own, so its engines' rendezvous, queues and gloo are on a loopback nothing
    # else on the host shares, and its API is a Unix socket only the door's group opens.
    for host in SERVING:
        summary = json.loads((fleet.artifacts / host / "deploy-summary.json").read_text())
        assert summary["front_door"]["engines_network"] == "private", host
        host_network = fleet.on(host, "readlink /proc/1/ns/net")
        for instance, socket_path in summary["front_door"]["engine_sockets"].items():
            unit = f"socketwise-{instance}.service"
            pid = fleet.on(host, f"systemctl show -p MainPID --value {unit}")
            assert fleet.on(host, f"readlink /proc/{pid}/ns/net") != host_network, unit
            # No TCP listener of the unit's in the host's namespace (the lab's machines
            # share one: the engines' sockets would show here, on the backend address).
            pids = [
                line.split()[0]
                for line in fleet.on(host, "ps -e -o pid=,unit=").splitlines()
                if line.split()[1:] == [unit]
            ]
            assert pids, unit
            listening = fleet.on(host, "ss -Hlntp")
            assert not any(f"pid={p}," in listening for p in pids), (unit, listening)
            refused = fleet.on(
                host,
                "setpriv --reuid=nobody --regid=nogroup --clear-groups python3 -c "
                f"'import socket; socket.socket(socket.AF_UNIX).connect(\"{socket_path}\")' "
                "2>&1 | tail -1",
            )
            assert "PermissionError" in refused, (unit, refused)


def test_calibrate_s_drain_takes_a_host_out_of_the_fleet_door_and_back_losing_no_request(
    fleet, noop
):
    """playbooks/drain.yml, which `socketwise calibrate` runs around the host it measures,
    under load through the fleet door: the drained host gets no request while it is out,
    the other host serves them all, and it is back up when the playbook returns."""

    def drain(out: bool) -> None:
        variables = {"socketwise_drain": out, "socketwise_drain_hosts": [SN_HOST]}
        done, _ = fleet.run("playbooks/drain.yml", "-e", json.dumps(variables))
        assert done.returncode == 0, done.output[-3000:]

    load = Load(fleet)
    time.sleep(3)
    try:
        drain(True)
        out = fleet.fleet_servers()[SN_HOST]
        # LOAD_RATE a second: a few requests, every one of them to the other host.
        time.sleep(8)
        still_out = fleet.fleet_servers()[SN_HOST]
        drain(False)
        back = fleet.fleet_servers()[SN_HOST]
        time.sleep(8)
        serving = fleet.fleet_servers()[SN_HOST]
    finally:
        result = load.finish()
    assert out["status"] == still_out["status"] == "MAINT", (out, still_out)
    assert still_out["stot"] == out["stot"], "a request reached the drained host"
    # Back in the pool (HAProxy shows "UP 1/2" while its checks count up again), and
    # taking requests.
    assert back["status"].startswith("UP"), back
    assert int(serving["stot"]) > int(back["stot"]), (back, serving)
    assert result["failed"] == 0 and result["completed"] == result["sent"], failed_story(
        fleet, result
    )


def scraped(fleet: Fleet) -> dict[str, dict[str, dict]]:
    """{job: {instance label: target}} of the monitor's active targets, once every one was
    scraped at least once."""
    deadline = time.monotonic() + 6 * SCRAPE_INTERVAL
    while True:
        targets = fleet.prometheus("targets", state="active")["activeTargets"]
        if all(t["health"] != "unknown" for t in targets) or time.monotonic() > deadline:
            break
        time.sleep(1)
    jobs: dict[str, dict[str, dict]] = {}
    for target in targets:
        jobs.setdefault(target["labels"]["job"], {})[target["labels"]["instance"]] = target
    return jobs


def test_the_monitor_scrapes_every_engine_node_and_door_with_all_targets_up(fleet, noop):
    jobs = scraped(fleet)
    assert {job: sorted(targets) for job, targets in jobs.items()} == {
        "socketwise-engines": [f"{SN_HOST}/vllm-sn", *(f"{DP_HOST}/{r}" for r in REPLICAS)],
        "socketwise-nodes": list(SERVING),
        "socketwise-doors": [*SERVING, DOOR],
    }
    problems = {
        name: target["lastError"]
        for targets in jobs.values()
        for name, target in targets.items()
        if target["health"] != "up"
    }
    assert problems == {}
    # Each engine carries the kit's labels, from its host's plan.
    engine = jobs["socketwise-engines"][f"{DP_HOST}/vllm-dp1"]["labels"]
    assert engine["host"] == DP_HOST and engine["socketwise_instance"] == "vllm-dp1"
    assert engine["layout"] == "dp" and engine["hardware_class"]
    assert jobs["socketwise-engines"][f"{SN_HOST}/vllm-sn"]["labels"]["layout"] == "sn"
    assert jobs["socketwise-doors"][DOOR]["labels"]["layout"] == "fleet"


def test_the_metrics_door_asks_for_the_scrape_token_and_takes_only_the_monitor(fleet, noop):
    token = scrape_token_path().read_text().strip()
    door = fleet.machines[SN_HOST].address.replace("127.0.", "127.1.", 1)
    for path in ("/metrics/vllm-sn", "/metrics/node", "/metrics/door"):
        assert frontdoor.scrape(door, path, token)[0] == 200, path
        for wrong in (None, api_key_path().read_text().strip(), token[:-1]):
            assert frontdoor.scrape(door, path, wrong)[0] == 401, (path, wrong)
    # From an address no monitor scrapes from, the kernel resets the connection before
    # HAProxy sees it (HAProxy's own filter would accept, then close): the host's table.
    with pytest.raises(ConnectionRefusedError):
        frontdoor.scrape(door, "/metrics/vllm-sn", token, source="127.0.0.99")
    assert f"table inet socketwise_metrics_{SN_HOST}" in fleet.on(SN_HOST, "nft list tables")
    # The public doors keep refusing /metrics, with the token too.
    key = api_key_path().read_text().strip()
    sn = fleet.machines[SN_HOST].address
    assert frontdoor.call(sn, FLEET_PORT, "/metrics", key, tls=True)[0] == 403


def test_every_metric_the_dashboard_and_the_alerts_read_is_one_the_fleet_exposes(fleet, noop):
    scraped(fleet)
    exposed = set(fleet.prometheus("label/__name__/values"))
    rules = fleet.on(MONITOR, "cat /etc/socketwise/monitor/alerts.yml")
    expressions = promql.rule_expressions(yaml.safe_load(rules)) + promql.dashboard_expressions(
        json.loads(DASHBOARD.read_text())
    )
    wanted = set().union(*(promql.metric_names(e) for e in expressions))
    # ALERTS exists while an alert does; the operation mark while a rollout runs.
    assert wanted - exposed - {"ALERTS", "socketwise_operation_in_progress"} == set()


def test_the_scrape_token_is_in_no_argv_unit_journal_output_or_artifact(fleet, noop):
    token = scrape_token_path().read_text().strip()
    for host in fleet.machines:
        assert frontdoor.key_places_on_host(fleet.machines[host], token) == [], host
    assert frontdoor.files_holding(fleet.artifacts, token) == []
    assert token not in fleet.deploy_output


def test_a_rolling_update_under_load_loses_no_request(fleet, rolled):
    done, seconds, load, summary, _ = rolled
    assert done.returncode == 0, done.output[-3000:]
    assert load["failed"] == 0 and load["completed"] == load["sent"], failed_story(fleet, load)
    # The load ran, without a gap, from before the first drain to the last step's end.
    steps = [step for entry in summary.values() for step in entry["steps"]]
    first_drain = min(step["started"] for step in steps if step["step"] == "drain")
    last_end = max(step["started"] + step["seconds"] for step in steps)
    assert load["windows"][0][0] <= first_drain, (load["windows"], first_drain)
    assert covered(load["windows"], last_end), (load["windows"], last_end)
    for host in SERVING:
        entry = summary[host]
        assert entry["changed"] and not entry["rolled_back"], entry
        assert entry["release_after"] != entry["release_before"]
        assert [s["step"] for s in entry["steps"]] == [
            "install", "drain", "activate", "gate", "undrain", "record"
        ]  # fmt: skip
        assert entry["gate"]["placement_problems"] == []
        assert all(t > 0 for t in entry["gate"]["completion_tokens"])


def test_the_monitor_sees_each_host_marked_while_the_rollout_rolls_it(fleet, rolled):
    assert rolled[4] == set(SERVING)
    # The marks are gone with the rollout.
    for host in SERVING:
        assert fleet.on(host, "ls /var/lib/socketwise/metrics") == "", host


def test_a_host_with_two_replicas_restarts_them_one_at_a_time(fleet, rolled):
    restarts = rolled[3][DP_HOST]["gate"]["instance_restarts"]
    assert [r["instance"] for r in restarts] == list(REPLICAS)
    first, second = restarts
    assert second["left"] >= first["back"], restarts
    # systemd's own record agrees: the second replica's process started only after the
    # first was serving and back in the host's front door.
    first_started, second_started = (
        fleet.started_at(DP_HOST, f"socketwise-{name}.service") for name in REPLICAS
    )
    assert first["left"] <= first_started < first["back"] <= second_started, restarts


def test_the_new_release_runs_the_new_model_revision_and_argument(fleet, noop, rolled):
    release = json.loads(fleet.on(SN_HOST, "cat /opt/socketwise/releases/current/release.json"))
    previous = json.loads(fleet.on(SN_HOST, "cat /opt/socketwise/releases/previous/release.json"))
    assert release["model"] != previous["model"] and release["model_revision"]
    # Each argument is one quoted word on a line of the unit.
    unit = f"/etc/systemd/system/{VLLM_UNIT}"
    assert '"64"' in fleet.on(SN_HOST, f"grep -A1 -F '\"--max-num-seqs\"' {unit}")
    # ... and the instance runs it: it was restarted since the no-op rollout.
    assert fleet.footprint(SN_HOST)["started"] != noop[3][SN_HOST]["started"]
    # The release before stays, with what it ran, until the next one is proven.
    fleet.on(SN_HOST, f"test -d {previous['venv']} && test -d {previous['model']}")


def engine_down(fleet: Fleet) -> float | None:
    """When the monitor's SocketwiseEngineDown for SN_HOST's engine fired (the evaluation
    that found it, in seconds since the epoch), or None while it does not fire."""
    for alert in fleet.firing("SocketwiseEngineDown"):
        labels = alert["labels"]
        if labels.get("host") == SN_HOST and labels.get("socketwise_instance") == "vllm-sn":
            return datetime.fromisoformat(alert["activeAt"]).timestamp()
    return None


def socketwise_status(fleet: Fleet) -> dict:
    """`socketwise status --json` against the monitor's Prometheus."""
    done = subprocess.run(
        [sys.executable, "-m", "socketwise.cli", "status", "--prometheus", fleet.prometheus_url,
         "--json"],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_killed_vllm_costs_at_most_the_requests_sent_before_it_is_marked_down(fleet, rolled):
    """...and the monitor's engine-down alert fires within two scrape intervals, reaches the
    webhook, shows in `socketwise status`, and resolves once the engine is back."""
    load = Load(fleet)
    fired = status = None
    try:
        time.sleep(20)
        assert not engine_down(fleet)
        in_flight = int(fleet.fleet_servers()[SN_HOST]["scur"])
        killing = time.monotonic()
        # The host's clock at the kill (the lab's machines share this one's): the alert's
        # time is Prometheus', not when this loop happens to look.
        main_pid = f"$(systemctl show -p MainPID --value {VLLM_UNIT})"
        killed_at = float(fleet.on(SN_HOST, f"date +%s.%N; kill -9 {main_pid}"))
        went_down = back = None
        while time.monotonic() - killing < 300:
            state = fleet.fleet_servers()[SN_HOST]["status"]
            if went_down is None and state.startswith("DOWN"):
                went_down = time.monotonic()
            if fired is None and (active_at := engine_down(fleet)):
                fired = active_at - killed_at
                status = socketwise_status(fleet)
            if went_down and state == "UP" and fired is not None:
                back = round(time.monotonic() - killing)
                break
            time.sleep(1)
    finally:
        result = load.finish()
    print(
        f"\nkill -9 of {SN_HOST}'s vLLM under load: {in_flight} request(s) in flight, "
        f"marked down after {went_down and round(went_down - killing, 1)} s, "
        f"{result['failed']} failed of {result['sent']}, back in the fleet after {back} s; "
        f"SocketwiseEngineDown firing after {fired and round(fired, 1)} s"
    )
    # Its next scrape fails, and the next evaluation fires: two intervals at most.
    assert fired is not None and fired <= 2 * SCRAPE_INTERVAL + 0.5, fired
    # socketwise status, while it fired: the engine down with its alert, the others up and
    # serving the load.
    rows = {(e["host"], e["socketwise_instance"]): e for e in status["engines"]}
    assert set(rows) == {(SN_HOST, "vllm-sn"), *((DP_HOST, r) for r in REPLICAS)}
    assert not rows[SN_HOST, "vllm-sn"]["up"]
    assert "SocketwiseEngineDown" in rows[SN_HOST, "vllm-sn"]["alerts"]
    assert all(rows[DP_HOST, r]["up"] and rows[DP_HOST, r]["running"] is not None for r in REPLICAS)
    assert any(a["alertname"] == "SocketwiseEngineDown" for a in status["alerts"])
    # Alertmanager delivered it, then its end once the engine answered again (the
    # rollouts before restarted this engine too: only what came after the kill counts).
    deadline = time.monotonic() + 60

    def since_kill(status: str) -> list[float]:
        return [at for at in fleet.webhook.alerts("SocketwiseEngineDown", SN_HOST, status)
                if at > killing]  # fmt: skip

    while not since_kill("resolved"):
        assert time.monotonic() < deadline, fleet.webhook.received[-5:]
        time.sleep(1)
    assert since_kill("firing") and min(since_kill("firing")) < min(since_kill("resolved"))
    assert not engine_down(fleet)
    print(
        f"webhook: firing after {min(since_kill('firing')) - killing:.1f} s, "
        f"resolved after {min(since_kill('resolved')) - killing:.1f} s"
    )
    assert back is not None, f"{SN_HOST} never came back in the fleet front door"
    assert (
        int(fleet.on(SN_HOST, "systemctl show -p NRestarts --value socketwise-vllm-sn.service"))
        >= 1
    )
    # What the dead engine held fails, and what reached its host until the fleet door's
    # checks marked it down (the engine's own processes keep its socket open until systemd
    # ends them); every request after that goes to the other host.
    late = [
        (round(sent - killing, 1), round(answered - killing, 1))
        for sent, answered, _ in result["failures"]
        if sent > went_down or answered < killing
    ]
    assert not late, (
        f"failed requests sent after {SN_HOST} was marked down (s after the kill): {late}"
    )


@pytest.fixture(scope="module")
def two_models(fleet, rolled) -> tuple[PlaybookRun, float, dict, str, str]:
    """DP_HOST serves the tiny model as DP_MODEL from here on, SN_HOST as SN_MODEL: one
    deploy.yml, under the load (of SN_MODEL). Returns the run, its seconds, the load, SN_HOST's
    instance's start before it, and what DP_HOST's door logged meanwhile."""
    with (fleet.inventory / "host_vars" / f"{DP_HOST}.yml").open("a") as host_vars:
        host_vars.write(f"vllm_served_model_name: {DP_MODEL}\n")
    before = fleet.footprint(SN_HOST)["started"]
    done, seconds, result = under_load(fleet, "deploy.yml")
    print(
        f"\n{DP_HOST} to {DP_MODEL} beside {SN_HOST}'s {SN_MODEL}: {seconds:.0f} s; {told(result)}"
    )
    return done, seconds, result, before, fleet.door_log(DP_HOST, result["windows"][0][0])


def test_a_host_moved_to_another_model_loses_no_request_of_the_one_it_served(fleet, two_models):
    done, _, load, sn_started, dp_door = two_models
    assert done.returncode == 0, done.output[-3000:]
    # From its first replica's restart, DP_HOST answered 404 for SN_MODEL until the fleet
    # door took its new model at the run's end: the fleet door sent those requests on to
    # SN_HOST, whose model and release stayed as they were (its instance ran on).
    assert re.search(r" 404 .*\"POST /v1/completions ", dp_door), dp_door[-3000:]
    assert load["sent"] > 0 and load["failed"] == 0, failed_story(fleet, load)
    assert fleet.footprint(SN_HOST)["started"] == sn_started


def test_one_fleet_door_sends_each_model_to_the_hosts_that_serve_it(fleet, two_models):
    key, door = api_key_path().read_text().strip(), fleet.machines[DOOR].address
    since = time.time()
    for model in MODELS * 3:
        assert frontdoor.completion_tokens(door, FLEET_PORT, key, model=model) > 0, model
    # The fleet door's log names the backend and host of each completion (httplog).
    log = fleet.door_log(DOOR, since, requests=6)
    routed = re.findall(r" (fleet\S*)/(\S+) .* \"POST /v1/completions ", log)
    assert len(routed) == 6 and set(routed) == {
        (f"fleet-{SN_MODEL}", SN_HOST), (f"fleet-{DP_MODEL}", DP_HOST)
    }, log  # fmt: skip
    # /v1/models: the fleet's models, answered by the fleet door behind the key.
    status, body = frontdoor.call(door, FLEET_PORT, "/v1/models", key)
    assert status == 200 and {m["id"] for m in json.loads(body)["data"]} == set(MODELS), body
    assert frontdoor.call(door, FLEET_PORT, "/v1/models")[0] == 401


def test_a_model_the_fleet_does_not_serve_gets_404_and_reaches_no_host(fleet, two_models):
    key, door = api_key_path().read_text().strip(), fleet.machines[DOOR].address
    before = {host: int(row["stot"]) for host, row in fleet.fleet_servers().items()}
    since = time.time()
    status, body = frontdoor.call(
        door, FLEET_PORT, "/v1/completions", key, LOAD_REQUEST | {"model": "tiny-llama-2"}
    )  # fmt: skip
    assert status == 404, body
    error = json.loads(body)["error"]
    assert error["code"] == "model_not_found" and all(m in error["message"] for m in MODELS)
    assert {host: int(row["stot"]) for host, row in fleet.fleet_servers().items()} == before
    log = fleet.door_log(DOOR, since, requests=1)
    assert re.search(r" \S+/<NOSRV> .* 404 .*\"POST /v1/completions ", log), log


def test_the_monitor_and_status_name_each_engines_model(fleet, two_models):
    # Prometheus reloaded with the new labels at the deploy's end: its next scrapes carry
    # them, and `socketwise status` shows them.
    wanted = {(SN_HOST, "vllm-sn"): SN_MODEL} | {(DP_HOST, r): DP_MODEL for r in REPLICAS}
    deadline = time.monotonic() + 6 * SCRAPE_INTERVAL
    while True:
        status = socketwise_status(fleet)
        models = {(e["host"], e["socketwise_instance"]): e["model"] for e in status["engines"]}
        if models == wanted or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert models == wanted


def test_a_host_that_cannot_become_healthy_is_rolled_back_and_the_rest_untouched(
    fleet, failed_rollout
):
    done, load, before, summary = failed_rollout
    assert done.returncode != 0
    assert f"{SN_HOST}: rollout failed at step activate" in done.output
    assert "unrecognized arguments: --no-such-flag" in done.output
    assert load["failed"] == 0, failed_story(fleet, load)
    assert summary[SN_HOST]["rolled_back"] and summary[SN_HOST]["failed_step"] == "activate"
    assert (
        summary[SN_HOST]["release_after"] == summary[SN_HOST]["release_before"] == before[SN_HOST]
    )
    assert DP_HOST not in summary
    assert fleet.footprint(DP_HOST) == before[DP_HOST]
    key = api_key_path().read_text().strip()
    sn = fleet.machines[SN_HOST].address
    assert frontdoor.completion_tokens(sn, FLEET_PORT, key, tls=True) > 0
    # Serving there: UP, or UP with a check just missed on the busy lab ("UP 1/2").
    assert fleet.fleet_servers()[SN_HOST]["status"].startswith("UP")


@GATE
def test_the_benchmark_gate_stops_a_slower_release_and_the_host_goes_back(fleet, gated_canary):
    done, summary, before = gated_canary
    entry = summary[SN_HOST]
    bench = entry["gate"]["bench"]
    print(f"\n{SN_HOST} gate: before {bench['before']}, after {bench['after']}")
    assert done.returncode != 0
    assert f"{SN_HOST}: rollout failed at step gate" in done.output
    assert f"outside rollout_gate_tolerance={GATE_TOLERANCE}" in done.output
    # The serving release had no figures (deploy.yml measures none): it was measured
    # first, drained, with the same benchmark.
    assert [s["step"] for s in entry["steps"]] == [
        "install", "drain", "baseline", "activate", "gate", "rollback"
    ]  # fmt: skip
    assert bench["tolerance"] == GATE_TOLERANCE
    for figures in (bench["before"], bench["after"]):
        assert figures["completed"] == 16 and figures["failed"] == 0
    # One request at a time shows as lower output tok/s, a longer TTFT p99 or both (which,
    # depends on the machine); the gate names each figure outside the tolerance.
    before_figures, after_figures = bench["before"], bench["after"]
    outside = {
        "output": after_figures["output_tok_s"]
        < before_figures["output_tok_s"] * (1 - GATE_TOLERANCE),
        "TTFT p99": after_figures["ttft_p99_ms"]
        > before_figures["ttft_p99_ms"] * (1 + GATE_TOLERANCE),
    }
    assert any(outside.values()), bench
    named = {
        figure for figure in outside for problem in bench["problems"] if problem.startswith(figure)
    }
    assert named == {figure for figure, out in outside.items() if out}, bench
    assert entry["rolled_back"] and entry["release_after"] == entry["release_before"] == before
    key = api_key_path().read_text().strip()
    sn = fleet.machines[SN_HOST].address
    assert frontdoor.completion_tokens(sn, FLEET_PORT, key, tls=True) > 0
    assert fleet.fleet_servers()[SN_HOST]["status"].startswith("UP")


@pytest.fixture(scope="module")
def rotated(fleet, failed_rollout) -> tuple[PlaybookRun, dict, dict, dict, str, dict]:
    """The client key rotated with rollout.yml: a new key, the lab's as the previous one.
    The load sends the previous key throughout, asking for both models in turn; a second
    client sends the new one (and SN_MODEL) from before the rollout starts, twice a second
    to see the switch closely, until SWITCHED_SERVED of its requests were served: the fleet
    door refuses it cheaply until then, but once served, at five times LOAD_RATE, it would
    keep every engine's worker polling (the fleet guide), and an engine beside the other
    lab's benchmark answered nothing for minutes (its door marked it down, a request of the
    load in it)."""
    new = fleet.work / "new-api-key"
    new.write_text(secrets.token_hex(24) + "\n")
    new.chmod(0o600)
    before = {host: fleet.footprint(host)["started"] for host in SERVING}
    doors = {host: fleet.main_pid(host, unit) for host, unit in DOOR_UNITS.items()}
    switched = Load(fleet, new.read_text().strip(), rate=2, served=SWITCHED_SERVED)
    try:
        done, seconds, load = rollout_under_load(
            fleet,
            "client key rotation",
            *("-e", f"credentials_api_key_file={new}"),
            *("-e", f"credentials_api_key_previous_file={api_key_path()}"),
            models=MODELS,
        )
    finally:
        early = switched.finish()
    # The fleet door takes the new key with a reload in the playbook's last play, which
    # ends soon after: the load may stop before a request of its lands after the reload.
    # The new key's client then asks until it is served (10 s at most).
    deadline, door = time.monotonic() + 10, fleet.machines[DOOR].address
    while True:
        status = frontdoor.call(door, FLEET_PORT, "/v1/completions", new.read_text().strip(),
                                LOAD_REQUEST)[0]  # fmt: skip
        early["statuses"].append(status)
        if status == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    started = {"started": before, "doors": doors}
    return done, load, early, started, new.read_text().strip(), fleet.summary()


def test_a_key_rotation_under_load_reloads_the_doors_and_loses_no_request(fleet, rotated):
    done, load, early, before, new, summary = rotated
    assert done.returncode == 0, done.output[-3000:]
    # Each model has one host: a host drained for the rotation would leave its model
    # unserved. The doors take a key with a reload, and each host stayed in the fleet door.
    assert load["sent"] > 0 and load["failed"] == 0, failed_story(fleet, load)
    for host in SERVING:
        steps = [step["step"] for step in summary[host]["steps"]]
        assert steps == ["install", "activate", "gate", "record"], (host, steps)
    # Nothing restarted: every instance and door runs since before (the doors reloaded).
    for host in SERVING:
        assert fleet.footprint(host)["started"] == before["started"][host], host
    assert {host: fleet.main_pid(host, unit) for host, unit in DOOR_UNITS.items()} == before[
        "doors"
    ]
    # The new key's client: refused by the fleet door until every host took the key, then
    # served (by the end of the rollout, or just after); never refused again once served (a
    # host refusing what the fleet door passes).
    statuses = early["statuses"]
    assert set(statuses) <= {200, 401} and statuses[-1] == 200, statuses
    first = statuses.index(200)
    assert statuses[first:] == [200] * (len(statuses) - first), statuses
    print(
        f"\nnew-key client: {first} refused by the fleet door, then {len(statuses) - first} served"
    )
    # Both keys pass every door now (the hosts' and the fleet's, all on port 8000), another
    # does not.
    old = api_key_path().read_text().strip()
    models = {SN_HOST: [SN_MODEL], DP_HOST: [DP_MODEL], DOOR: list(MODELS)}
    for host in DOOR_UNITS:
        address = fleet.machines[host].address
        tls = host in SERVING
        for key, model in itertools.product((new, old), models[host]):
            assert frontdoor.completion_tokens(address, FLEET_PORT, key, tls, model) > 0, host
        assert frontdoor.call(address, FLEET_PORT, "/v1/models", new[:-1], tls=tls)[0] == 401, host
