"""The front door's rules, proven in seconds without a lab: Ansible's template module renders
the three HAProxy configurations (a host's, the fleet's, a cluster head's, all including
templates/frontdoor-rules.j2) from the vllm_service role's own defaults and variables; a
real HAProxy runs each, in front of a local HTTP server that records what reaches it; and
every request asserts the status the client sees AND whether the server saw it. A refused
request is answered by HAProxy alone: it never reaches an instance.

What stays in the lab (tests/test_deploy_lab.py): that the deployed unit really gives
HAProxy the key, a real completion through the door, the instances absent from the public
address, vLLM's own key check behind the door, TLS.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import socketserver
import ssl
import stat
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from .frontdoor import REFUSED_PATHS, self_signed
from .playbooks import REPO, render_all, run_playbook

pytestmark = pytest.mark.skipif(
    shutil.which("haproxy") is None, reason="needs Debian's haproxy (scripts/setup installs it)"
)

ADDRESS = "127.0.0.1"
KEY = "sk-frontdoor-" + uuid.uuid4().hex
# The key being replaced during a rotation: accepted beside KEY.
PREVIOUS = "sk-previous-" + uuid.uuid4().hex
# The monitors' scrape token (scrape-keys), another than the clients' keys.
SCRAPE = "scrape-" + uuid.uuid4().hex
# An address no monitor scrapes from.
STRANGER = "127.0.0.3"
# The host's backend credential (vLLM's own key): what a host's or cluster head's door
# sends an instance in place of the client's key.
BACKEND = "backend" + uuid.uuid4().hex
# Small, so a body at the limit is cheap to send; the rule is the same at 4 MiB.
MAX_BODY = 2048
INSTANCE = "vllm-sn"
# A host's door balancing by prompt prefix, over three instances on sockets of their own.
PREFIX_INSTANCES = ("vllm-dp0", "vllm-dp1", "vllm-dp2")
# The model every host serves, and another that a fleet of two models' third host serves.
MODEL = "tiny-llama"
BIG_MODEL = "org/tiny-llama-0.5g"
# That fleet door's request buffer (fleet_door_buffer_bytes: the least it takes).
BUFFER = 16384
# The prompt's leading bytes the doors balancing by prefix hash (door_prefix_bytes).
PREFIX_BYTES = 64
# Where the host doors reach INSTANCE (its Unix socket, in the test's directory).
ENGINE_SOCKET = "engine.sock"
# A second instance of a host's door, whose engine died (SickEngine).
SICK = "vllm-dp-1"
# The second instance of a host's door that a rolling restart drains one instance of.
SECOND = "vllm-dp-2"
OPENAI_ROUTES = [
    ("GET", "/v1/models"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
]
# Spellings of allowed routes, and ways around the allow list, beyond the lab's list: each
# must be refused before it reaches an instance.
MORE_REFUSED = [
    "//v1/completions",
    "/v1//completions",
    "/v1/./completions",
    "/v1/completions/",
    "/v1/completions/..",
    "/v1/Completions",
    "/V1/MODELS",
    "/v1/completions%2F..%2F..%2Fmetrics",
    "/%2e%2e/metrics",
    "/v1/models;x",
    "/v1/completions%00",
    "/v1/embeddings",
    "/health/../metrics",
    "/health/",
    "/HEALTH",
    "/healt%68",
    "/",
    # llama-server's own routes (a llama.cpp cluster's head).
    "/slots",
    "/props",
    "http://127.0.0.1/metrics",
    "http://127.0.0.1/v1/completions/../../tokenize",
]
# A host's door, the fleet's, a cluster head's, each in plain HTTP and over TLS: one set
# of rules.
PLAIN_DOORS = ("host", "fleet", "cluster")
TLS_DOORS = ("host-tls", "fleet-tls", "cluster-tls")
DOORS = PLAIN_DOORS + TLS_DOORS
# The metrics doors of cluster members: a llama.cpp head's (its public door is
# cluster-llamacpp), and a member's that is not the head, its only listener.
CLUSTER_METRICS = ("cluster-llamacpp", "cluster-member")
# Second listeners of the doors above, each started with its door: the host's metrics door
# and the llama.cpp head's.
SECOND_LISTENERS = ("metrics", "cluster-llamacpp-metrics", "engine-gone-metrics")
# Doors a test starts itself, to see what they do before their first health checks.
STARTED_BY_TESTS = ("fleet-dead",)
# A host's door with small per-client limits, and a client address exempt from them.
LIMITS = {"connections": 3, "rate": 2}
EXEMPT = "127.0.0.2"


# --- the recording server ----------------------------------------------------------------


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    # The instance whose Unix socket it came in on (a door balancing by prefix's), if any.
    instance: str = ""


# A listen backlog as deep as an API server's (uvicorn's is 2048), not socketserver's 5: a
# door opening its instance's 8 connections and a check at once found a backlog of 5 full
# ("can't connect to destination unix socket") and answered 503.
BACKLOG = 128


class Recorder(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = BACKLOG

    def __init__(self) -> None:
        super().__init__((ADDRESS, 0), _Handler)
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        # Held requests (X-Delay) being answered now, and the most at once since `most`
        # was last set.
        self.in_flight = self.most = 0

    def probed(self, probe: str) -> list[Seen]:
        """The requests that carried this probe header (health checks carry none)."""
        with self.lock:
            return [seen for seen in self.seen if seen.headers.get("x-probe") == probe]

    def handle_error(self, request: object, client_address: object) -> None:
        # HAProxy's health checks close their connections without waiting: not an error.
        pass


class EngineSocket(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """The recorder where a host's door reaches its instance: on the instance's Unix socket.
    What it is sent is the recorder's."""

    daemon_threads = True
    request_queue_size = BACKLOG

    def __init__(self, path: Path, recorder: Recorder, instance: str = "") -> None:
        super().__init__(str(path), _Handler)
        self.seen, self.lock, self.recorder = recorder.seen, recorder.lock, recorder
        self.instance = instance

    def handle_error(self, request: object, client_address: object) -> None:
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Recorder

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {name.lower(): value for name, value in self.headers.items()}
        # The held requests count (the doors' health checks, which maxconn leaves out, not).
        held = float(headers.get("x-delay", 0))
        counted = getattr(self.server, "recorder", self.server)
        with self.server.lock:
            counted.in_flight += held > 0
            counted.most = max(counted.most, counted.in_flight)
        time.sleep(held)  # a request still in flight
        with self.server.lock:
            counted.in_flight -= held > 0
        with self.server.lock:
            where = getattr(self.server, "instance", "")
            self.server.seen.append(Seen(self.command, self.path, headers, body, where))
        answer = json.dumps({"object": "list", "data": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(answer)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_OPTIONS = _answer

    def log_message(self, *args: object) -> None:
        pass


# A busy host's door answers /health late: the check waits in its capped backend's queue,
# behind the requests it serves (haproxy.cfg.j2's timeout check).
BUSY_HEALTH_SECONDS = 3.0


class HostDoor(ThreadingHTTPServer):
    """Another host's door, as the fleet door sees it: /health answers HEALTH after
    HEALTH_SECONDS, every other request STATUS at once, after reading it whole; `answered`
    counts the clients' requests (the doors' checks carry no X-Probe). A door whose
    instances all left it (a restart) answers 503; a busy one answers /health late."""

    daemon_threads = True
    request_queue_size = BACKLOG

    def __init__(self, status: int, health_seconds: float = 0.0, health: int = 200) -> None:
        super().__init__((ADDRESS, 0), _HostDoor)
        self.status, self.health_seconds, self.health = status, health_seconds, health
        self.answered = 0

    def handle_error(self, request: object, client_address: object) -> None:
        # A check HAProxy gave up on closed its connection: not an error.
        pass


class SickEngine(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """An instance whose API server is up and whose engine died, on its Unix socket: vLLM
    answers 500 to every request, /health too (HEALTH: 200 for a cluster head whose
    pipeline lost a worker). Answered as HostDoor answers."""

    daemon_threads = True
    request_queue_size = BACKLOG
    status, health_seconds = 500, 0.0

    def __init__(self, path: Path, health: int = 500) -> None:
        super().__init__(str(path), _HostDoor)
        self.health, self.answered = health, 0

    def handle_error(self, request: object, client_address: object) -> None:
        pass


class _HostDoor(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: HostDoor | SickEngine

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.answered += "X-Probe" in self.headers  # a client's, not a check
        if self.path == "/health":
            time.sleep(self.server.health_seconds)
        self.send_response(self.server.health if self.path == "/health" else self.server.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


# --- rendering and running the doors -----------------------------------------------------


# Ports below the kernel's ephemeral range (32768 on): an outgoing connection of another
# test never takes one between the check here and HAProxy's bind, as it could a port the
# kernel once handed out. Each is given once, and each of the run's workers (which start
# their doors at the same time) has its own 1,500: HAProxy binds with SO_REUSEPORT, so two
# workers' doors given one port would both bind it and share its connections.
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) % 6
_PORTS = iter(range(20000 + 1500 * _WORKER + random.randrange(1000), 21500 + 1500 * _WORKER))


def free_port() -> int:
    """A port free on ADDRESS now, never given before."""
    for port in _PORTS:
        with socket.socket() as probe:
            try:
                probe.bind((ADDRESS, port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port left in this worker's range")


@dataclass
class Door:
    name: str
    port: int
    tls: bool = False


def own_listener(directory: Path, name: str, plan: dict, port: int) -> dict:
    """Task vars that give one more rendering of haproxy.cfg.j2 its own port, metrics port
    and runtime socket."""
    return {
        "door_metrics_port": free_port(),
        "door_host_paths": {"socket": str(directory / f"{name}.sock")},
        "socketwise_plan": plan | {"load_balancer": {"port": port, "balance": "leastconn"}},
    }


def over_instances(directory: Path, name: str, port: int, sockets: dict[str, str]) -> dict:
    """Task vars of a host's door of its own over instances named as SOCKETS' keys, each
    reached on its socket file in DIRECTORY."""
    plan = {
        "instances": [
            {"name": instance, "port": free_port(), "max_connections": 8} for instance in sockets
        ]
    }
    return own_listener(directory, name, plan, port) | {
        "__vllm_service_engine_sockets": {
            instance: str(directory / socket_file) for instance, socket_file in sockets.items()
        }
    }


def cluster_door(port: int, engine_socket: Path, engine: str = "vllm", head: bool = True) -> dict:
    """The door role's door_cluster, as roles/cluster/vars/main.yml gives it: a head's
    public door on PORT over its engine at ENGINE_SOCKET (llama-server takes 4 at once), or
    a member's metrics door alone."""
    return {
        "head": head,
        "name": "c1",
        "port": port,
        "cpus": [],
        "engine": {
            "name": engine,
            "socket": str(engine_socket),
            "served_name": "tiny-llama",
            "check_interval": 2,
            "max_connections": 4 if engine == "llamacpp" else 0,
            "metrics_key": engine == "llamacpp",
        },
        "client_ca": "",
        "secrets_dir": "",
    }


# Fleet doors that verify the hosts' doors: with the CA that signed the host's TLS door's
# certificate (credentials(): it signed itself), and with another; and one over a host's
# TLS door that knows none of the fleet door's client keys (HOST_ONLY_KEY alone).
VERIFYING = ("fleet-verified", "fleet-other-ca", "fleet-mtls")
CAS = ("credentials/crt", "other-ca.crt", "credentials/crt")
HOSTS_OF = {
    "fleet-verified": "host-tls",
    "fleet-other-ca": "host-tls",
    "fleet-mtls": "host-own-keys",
}
HOST_ONLY_KEY = "sk-host-only-" + uuid.uuid4().hex
# Where the role's fleet-credentials.yml makes the fleet door's client certificate and CA.
KIT = "kit-credentials"
# Where its door-certificate.yml makes the kit's door CA and issues the host door's
# certificate of credentials_tls (for localhost, the play's host, and ADDRESS).
DOOR_KIT = "door-credentials"
KIT_ISSUED = ("fleet-kit", "fleet-kit-misnamed")


def verifying_fleet(directory: Path, name: str, ports: dict[str, int], ca: str) -> dict:
    """Task vars of a fleet door over a host's TLS door, with credentials_fleet_ca_file
    set and its copy (fleet.yml's) at DIRECTORY/CA."""
    return {
        "fleet_door_port": ports[name],
        "__fleet_door_socket": str(directory / f"{name}.sock"),
        "__fleet_door_servers": [
            {
                "name": "host1",
                "address": ADDRESS,
                "port": ports[HOSTS_OF[name]],
                "tls": True,
                "model": MODEL,
            }  # fmt: skip
        ],
        "credentials_fleet_ca_file": "ca.crt",
        "__fleet_door_ca": str(directory / ca),
    }


def render(
    directory: Path,
    backend_port: int,
    refusing_port: int,
    busy_port: int,
    dying_port: int,
    big_port: int,
    moved_port: int,
) -> dict[str, Door]:
    """The configurations as the roles render them: templates/*.j2 through Ansible's
    template module, with the role's defaults/main.yml and vars/main.yml and its filters;
    only the addresses, ports, key and plan are the test's. Written to DIRECTORY/NAME.cfg."""
    others = ("anonymous", "limited", "cluster-limited", "rotating", "rotating-tls", "metrics")
    others += ("host-own-keys", "queued")
    others += ("host-pinned", "host-renewed")
    others += ("fleet-retry", "fleet-moved", "fleet-busy", "fleet-models", "fleet-prefix")
    others += STARTED_BY_TESTS
    others += ("host-prefix",)
    others += ("engine-gone", "engine-sick", "host-drain", "cluster-broken")
    others += ("host-kit", *KIT_ISSUED)
    others += VERIFYING + CLUSTER_METRICS + SECOND_LISTENERS
    ports = {name: free_port() for name in (*DOORS, *others)}
    plan = {
        "load_balancer": {"port": ports["host"], "balance": "leastconn"},
        "instances": [{"name": INSTANCE, "port": backend_port, "max_connections": 8}],
    }
    values = {
        "door_listen_address": ADDRESS,
        "door_backend_address": ADDRESS,
        "__vllm_service_engine_sockets": {INSTANCE: str(directory / ENGINE_SOCKET)},
        "door_metrics_address": ADDRESS,
        "door_metrics_port": ports["metrics"],
        # A monitor scrapes from ADDRESS; the node exporter is the test's server too.
        "__door_monitored": True,
        "__door_metrics_sources": [ADDRESS],
        # As the node_exporter role's check publishes it.
        "node_exporter_service": {"port": backend_port, "unit": "socketwise-node-exporter.service"},
        "fleet_door_port": ports["fleet"],
        "credentials_api_key": KEY,
        # As the credentials role's check publishes them, from the key variables, and what
        # its fleet-client-ca publishes.
        "credentials_client_key": "{{ __credentials_api_key }}",
        "credentials_client_keys": "{{ __credentials_client_keys }}",
        "credentials_door": "{{ __credentials_door }}",
        "credentials_fleet_client_pins": "{{ __credentials_fleet_client_pins }}",
        "door_max_body_bytes": MAX_BODY,
        "socketwise_plan": plan,
        "door_host_paths": {"socket": str(directory / "host.sock")},
        # What vllm_service gives the door role's host entry point.
        "door_host": "{{ __vllm_service_door_host }}",
        "__fleet_door_socket": str(directory / "fleet.sock"),
        "__fleet_door_servers": [
            {
                "name": "host1",
                "address": ADDRESS,
                "port": backend_port,
                "tls": False,
                "model": MODEL,
            },
            # A host whose name does not resolve when the door starts: the door serves.
            {
                "name": "host2",
                "address": "host2.invalid",
                "port": backend_port,
                "tls": False,
                "model": MODEL,
            },  # fmt: skip
        ],
        # What roles/cluster/vars/main.yml gives the door role's cluster entry point on a
        # head (__cluster_door).
        "door_cluster": cluster_door(ports["cluster"], directory / ENGINE_SOCKET),
        "door_cluster_paths": {"socket": str(directory / "cluster.sock")},
    }
    (directory / "values.json").write_text(json.dumps(values))
    role = REPO / "roles/vllm_service"
    credentials = REPO / "roles/credentials"
    # Any certificate path turns TLS on; the unit hands the PEM over as a credential.
    tls = {"credentials_tls_cert": "tls.crt"}
    # A TLS door behind a fleet door: it takes the fleet door's client certificate.
    fleet_client = tls | {
        "__credentials_takes_fleet_client": True,
        "credentials_dir": str(directory / KIT),
        "__vllm_service_fleet_client_ca": str(directory / KIT / "fleet-client-ca.pem"),
    }
    # The same with an operator's own CA, which signed another client certificate too.
    operator = operator_credentials(directory)
    fleet_client_of_operator = fleet_client | {
        "credentials_dir": str(operator),
        "__vllm_service_fleet_client_ca": str(operator / "fleet-client-ca.pem"),
    }
    # The kit's own pair two days before it expires: the play renews it, and the host's
    # door takes the CAs fleet-client-ca.yml gives it (the new and the replaced).
    renewed = operator_credentials(directory, RENEWED, "socketwise fleet client CA")
    fleet_client_renewed = fleet_client | {
        "credentials_dir": str(renewed),
        "__vllm_service_fleet_client_ca": str(renewed / "host-ca.pem"),
    }
    # A head's door: the door role's door_cluster above.
    cluster: dict = {}

    def fleet_over(
        name: str, models: dict[str, str] | None = None, **hosts: int
    ) -> tuple[str, dict]:
        """A fleet door of its own over plain HTTP host doors, {host name: port}, each serving
        MODEL or what MODELS gives it."""
        servers = [
            {"name": h, "address": ADDRESS, "port": p, "tls": False,
             "model": (models or {}).get(h, MODEL)}
            for h, p in hosts.items()
        ]  # fmt: skip
        return "fleet-haproxy.cfg.j2", {
            "fleet_door_port": ports[name],
            "__fleet_door_socket": str(directory / f"{name}.sock"),
            "__fleet_door_servers": servers,
        }

    prefixed = over_instances(
        directory,
        "host-prefix",
        ports["host-prefix"],
        {name: f"{name}.sock" for name in PREFIX_INSTANCES},
    )
    prefixed["socketwise_plan"]["load_balancer"]["balance"] = "prefix"
    prefixed["door_prefix_bytes"] = PREFIX_BYTES
    fleet_prefix = fleet_over("fleet-prefix", host1=backend_port, big=big_port)
    models_template, models_vars = fleet_over(
        "fleet-models", {"big": BIG_MODEL}, host1=backend_port, host2=backend_port, big=big_port
    )
    tasks = {
        "host": ("haproxy.cfg.j2", {}),
        "host-tls": (
            "haproxy.cfg.j2",
            own_listener(directory, "host-tls", plan, ports["host-tls"]) | fleet_client,
        ),
        "host-own-keys": (
            "haproxy.cfg.j2",
            own_listener(directory, "host-own-keys", plan, ports["host-own-keys"]) | fleet_client,
        ),
        # credentials_tls: the certificate the role's task issued (start() gives the door).
        "host-kit": (
            "haproxy.cfg.j2",
            own_listener(directory, "host-kit", plan, ports["host-kit"]) | fleet_client,
        ),
        # Fleet doors over it (fleet_door_verify's default), under the name its
        # certificate carries and under another host's.
        **{
            name: (
                "fleet-haproxy.cfg.j2",
                {
                    "fleet_door_port": ports[name],
                    "__fleet_door_socket": str(directory / f"{name}.sock"),
                    "__fleet_door_servers": [
                        {
                            "name": server,
                            "address": ADDRESS,
                            "port": ports["host-kit"],
                            "tls": True,
                            "kit": True,
                            "model": MODEL,
                        }
                    ],  # fmt: skip
                    "__fleet_door_ca": str(directory / DOOR_KIT / "door-ca.pem"),
                },
            )
            for name, server in zip(KIT_ISSUED, ("localhost", "host1"), strict=True)
        },
        "host-pinned": (
            "haproxy.cfg.j2",
            own_listener(directory, "host-pinned", plan, ports["host-pinned"])
            | fleet_client_of_operator,
        ),
        "host-renewed": (
            "haproxy.cfg.j2",
            own_listener(directory, "host-renewed", plan, ports["host-renewed"])
            | fleet_client_renewed,
        ),
        # allow_anonymous: no key, so no key check.
        "anonymous": (
            "haproxy.cfg.j2",
            own_listener(directory, "anonymous", plan, ports["anonymous"])
            | {"credentials_api_key": ""},
        ),
        "limited": (
            "haproxy.cfg.j2",
            own_listener(directory, "limited", plan, ports["limited"])
            | {
                "door_client_max_connections": LIMITS["connections"],
                "door_client_max_rate": LIMITS["rate"],
                "door_client_limit_exempt": [EXEMPT],
            },
        ),
        # A host's door whose instance takes one request at a time, and a queue of 1 s.
        "queued": (
            "haproxy.cfg.j2",
            own_listener(
                directory,
                "queued",
                {"instances": [{"name": INSTANCE, "port": backend_port, "max_connections": 1}]},
                ports["queued"],
            )
            | {"door_queue_timeout": 1},
        ),
        # A host's door whose one engine is gone: nothing listens on its port.
        "engine-gone": (
            "haproxy.cfg.j2",
            own_listener(
                directory,
                "engine-gone",
                {"instances": [{"name": INSTANCE, "port": free_port(), "max_connections": 8}]},
                ports["engine-gone"],
            )
            | {
                "door_metrics_port": ports["engine-gone-metrics"],
                "__vllm_service_engine_sockets": {INSTANCE: str(directory / "gone.sock")},
            },
        ),
        # A host's door over two instances, one of them sick (SickEngine on sick.sock).
        "engine-sick": (
            "haproxy.cfg.j2",
            over_instances(
                directory,
                "engine-sick",
                ports["engine-sick"],
                {INSTANCE: ENGINE_SOCKET, SICK: "sick.sock"},
            ),
        ),
        # A host's door over two instances that serve, one of which door: drain takes out
        # and undrain puts back, as a rolling restart does.
        "host-drain": (
            "haproxy.cfg.j2",
            over_instances(
                directory,
                "host-drain",
                ports["host-drain"],
                {INSTANCE: ENGINE_SOCKET, SECOND: ENGINE_SOCKET},
            ),
        ),
        # A host's door balancing by prompt prefix (plan_balance prefix) over three instances.
        "host-prefix": ("haproxy.cfg.j2", prefixed),
        # A fleet door balancing by prompt prefix over two hosts (fleet_door_balance prefix).
        "fleet-prefix": (
            fleet_prefix[0],
            fleet_prefix[1] | {"fleet_door_balance": "prefix", "door_prefix_bytes": PREFIX_BYTES},
        ),
        # Reloaded with new keys (test_a_reload_takes_new_keys...).
        "rotating": (
            "haproxy.cfg.j2",
            own_listener(directory, "rotating", plan, ports["rotating"]),
        ),
        # Reloaded with a renewed certificate (test_a_reload_takes_a_renewed_certificate...).
        "rotating-tls": (
            "haproxy.cfg.j2",
            own_listener(directory, "rotating-tls", plan, ports["rotating-tls"]) | tls,
        ),
        "fleet": ("fleet-haproxy.cfg.j2", {}),
        # Over a host whose door answers 503 (its instances restarting) and one that serves.
        "fleet-retry": fleet_over("fleet-retry", restarting=refusing_port, host1=backend_port),
        # Over a host moved to another model (its door answers 404) and one that serves.
        "fleet-moved": fleet_over("fleet-moved", moved=moved_port, host1=backend_port),
        # Over one host whose door is busy: its /health answers late.
        "fleet-busy": fleet_over("fleet-busy", busy=busy_port),
        # A fleet of two models: two hosts serve MODEL (one of which playbooks/drain.yml takes
        # out and back), a third BIG_MODEL. It reads a model within its first 16 KiB.
        "fleet-models": (
            models_template,
            models_vars | {"fleet_door_buffer_bytes": BUFFER, "door_max_body_bytes": 4 * BUFFER},
        ),
        # Over a host that dies once the door has it in (the test stops it) and one that serves.
        "fleet-dead": fleet_over("fleet-dead", dying=dying_port, host1=backend_port),
        "fleet-tls": (
            "fleet-haproxy.cfg.j2",
            {
                "fleet_door_port": ports["fleet-tls"],
                "__fleet_door_socket": str(directory / "fleet-tls.sock"),
            }
            | tls,
        ),
        # Over the host's TLS door, verifying its certificate with the CA given (the
        # self-signed certificate is its own CA) or with another.
        **{
            name: ("fleet-haproxy.cfg.j2", verifying_fleet(directory, name, ports, ca))
            for name, ca in zip(VERIFYING, CAS, strict=True)
        },
        "cluster": ("cluster-haproxy.cfg.j2", cluster),
        # Over a head whose pipeline lost a worker (SickEngine with /health 200).
        "cluster-broken": (
            "cluster-haproxy.cfg.j2",
            cluster
            | {
                "door_cluster": cluster_door(ports["cluster-broken"], directory / "broken.sock"),
                "door_cluster_paths": {"socket": str(directory / "cluster-broken.sock")},
            },
        ),
        # A head's door with the host's per-client limits, and the same exempt address.
        "cluster-limited": (
            "cluster-haproxy.cfg.j2",
            cluster
            | {
                "door_cluster": cluster_door(ports["cluster-limited"], directory / ENGINE_SOCKET),
                "door_cluster_paths": {"socket": str(directory / "cluster-limited.sock")},
                "door_client_max_connections": LIMITS["connections"],
                "door_client_max_rate": LIMITS["rate"],
                "door_client_limit_exempt": [EXEMPT],
            },
        ),
        "cluster-tls": (
            "cluster-haproxy.cfg.j2",
            cluster
            | {
                "door_cluster": cluster_door(ports["cluster-tls"], directory / ENGINE_SOCKET)
                | {"client_ca": str(directory / KIT / "fleet-client-ca.pem")},
                "door_cluster_paths": {"socket": str(directory / "cluster-tls.sock")},
            }
            | fleet_client,
        ),
        # A llama.cpp head (llama-server asks its key on /metrics too), and a member that
        # is not the head: its metrics door alone.
        "cluster-llamacpp": (
            "cluster-haproxy.cfg.j2",
            cluster
            | {
                "door_cluster": cluster_door(
                    ports["cluster-llamacpp"], directory / ENGINE_SOCKET, engine="llamacpp"
                ),
                "door_cluster_paths": {"socket": str(directory / "cluster-llamacpp.sock")},
                "door_metrics_port": ports["cluster-llamacpp-metrics"],
            },
        ),
        "cluster-member": (
            "cluster-haproxy.cfg.j2",
            {
                "door_cluster": cluster_door(0, directory / ENGINE_SOCKET, head=False),
                "door_metrics_port": ports["cluster-member"],
                "door_cluster_paths": {"socket": str(directory / "cluster-member.sock")},
            },
        ),
    }
    # Every fleet door and cluster head has a metrics door too, on a port of its own.
    for name, (template, task_vars) in list(tasks.items()):
        if "fleet" in template or "cluster" in template:
            tasks[name] = (template, {"door_metrics_port": free_port()} | task_vars)
    play = [
        {
            "name": "Render the front doors",
            "hosts": "localhost",
            "gather_facts": False,
            "vars_files": [
                str(REPO / "roles/door/defaults/main.yml"),
                str(REPO / "roles/door/vars/main.yml"),
                str(role / "defaults/main.yml"),
                str(role / "vars/main.yml"),
                str(credentials / "defaults/main.yml"),
                str(credentials / "vars/main.yml"),
                str(REPO / "roles/fleet_door/defaults/main.yml"),
                str(REPO / "roles/fleet_door/vars/main.yml"),
                str(directory / "values.json"),
            ],
            "tasks": [
                {
                    "name": "Make the fleet door's client certificate",
                    "ansible.builtin.include_tasks": str(
                        credentials / "tasks/fleet-credentials.yml"
                    ),
                    "vars": {"credentials_dir": str(directory / KIT)},
                },
                # A kit's pair in its last 30 days is renewed; an operator's is kept as it is.
                *(
                    {
                        "name": f"Renew the fleet door's client certificate in {where}",
                        "ansible.builtin.include_tasks": str(
                            credentials / "tasks/fleet-credentials.yml"
                        ),
                        "vars": {"credentials_dir": str(directory / where)},
                    }
                    for where in (RENEWED, OPERATOR)
                ),
                {
                    "name": "Write the CAs the host's door takes, as fleet-client-ca.yml does",
                    "ansible.builtin.copy": {
                        "content": "{{ __credentials_fleet_client_ca_text }}",
                        "dest": str(directory / RENEWED / "host-ca.pem"),
                        "mode": "0644",
                    },
                    "vars": {"credentials_dir": str(directory / RENEWED)},
                },
                {
                    "name": "Issue the door's certificate from the kit's CA",
                    "ansible.builtin.include_tasks": str(
                        credentials / "tasks/door-certificate.yml"
                    ),
                    "vars": {
                        "credentials_dir": str(directory / DOOR_KIT),
                        "credentials_tls": True,
                        "credentials_door_addresses": [ADDRESS],
                    },
                },
                # The fleet's one host (localhost here) was given that CA this run
                # (fleet-client-ca.yml's copy): it takes the certificate by now.
                {
                    "name": "Give the host the certificate's CA",
                    "ansible.builtin.set_fact": {
                        "credentials_fleet_client_ca_copy": {"changed": False}
                    },
                },
            ]
            + render_all(
                [
                    (str(REPO / "templates" / template), str(directory / f"{name}.cfg"), task_vars)
                    for name, (template, task_vars) in tasks.items()
                ]
            ),
        }
    ]
    (directory / "render.yml").write_text(json.dumps(play))
    run = run_playbook(
        str(directory / "render.yml"),
        *("-i", "inventories/local"),
    )
    assert run.returncode == 0, run.output[-3000:]
    tls_doors = (
        *TLS_DOORS,
        "host-own-keys",
        "host-pinned",
        "host-renewed",
        "rotating-tls",
        "host-kit",
    )
    doors = {name: Door(name, ports[name], name in tls_doors) for name in tasks}
    return doors | {name: Door(name, ports[name]) for name in SECOND_LISTENERS}


# An operator's own CA in the credentials directory, as the security guide allows.
OPERATOR = "operator-credentials"
# A pair of the kit's own that the render play renews.
RENEWED = "renewed-credentials"


def operator_credentials(directory: Path, name: str = OPERATOR, ca: str = "operator CA") -> Path:
    """An operator's CA and the fleet door's client certificate it signed, named as the
    role names its own (fleet-client-ca.pem, fleet-client.pem), and another client
    certificate the same CA signed for another name (another-client.pem), in NAME; each
    lasts two days. CA names the CA (the kit's own name: a pair the kit made)."""
    where = directory / name
    where.mkdir()

    def run(*argv: str) -> None:
        subprocess.run(argv, check=True, capture_output=True, cwd=where)

    run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
        "-nodes", "-days", "2", "-subj", f"/CN={ca}", "-keyout", "ca.key",
        "-out", "fleet-client-ca.pem", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign")  # fmt: skip
    (where / "ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, subject in (("fleet-client", "socketwise fleet door"), ("another-client", "x")):
        run("openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-nodes", "-subj", f"/CN={subject}", "-keyout", f"{name}.key",
            "-out", f"{name}.csr")  # fmt: skip
        run("openssl", "x509", "-req", "-in", f"{name}.csr", "-CA", "fleet-client-ca.pem",
            "-CAkey", "ca.key", "-CAcreateserial", "-days", "2", "-extfile", "ext",
            "-out", f"{name}.crt")  # fmt: skip
        (where / f"{name}.pem").write_text(
            (where / f"{name}.crt").read_text() + (where / f"{name}.key").read_text()
        )
    return where


def credentials(directory: Path) -> Path:
    """What the unit copies for the door at each start and reload: frontdoor.pem
    (certificate and key) and, to a fleet door, fleet-client.pem (the kit's), in the
    directory $SOCKETWISE_DOOR_FILES names."""
    given = directory / "credentials"
    given.mkdir()
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"]
        + ["-nodes", "-days", "1"]
        + ["-subj", f"/CN={ADDRESS}", "-keyout", str(given / "key"), "-out", str(given / "crt")],
        check=True,
        capture_output=True,
    )
    (given / "frontdoor.pem").write_text((given / "crt").read_text() + (given / "key").read_text())
    shutil.copy(directory / KIT / "fleet-client.pem", given / "fleet-client.pem")
    return given


def own_files(given: Path, door: str) -> Path:
    """DOOR's own copy of the certificates, which a test may renew."""
    own = given.parent / f"{door}-files"
    shutil.copytree(given, own, dirs_exist_ok=True)
    return own


def kit_issued(directory: Path, given: Path) -> Path:
    """The certificates with frontdoor.pem the one door-certificate.yml issued."""
    own = own_files(given, "host-kit")
    shutil.copy(directory / DOOR_KIT / "doors" / "localhost.pem", own / "frontdoor.pem")
    return own


def served_certificate(door: Door) -> str:
    """The PEM certificate DOOR shows a new TLS connection."""
    return ssl.get_server_certificate((ADDRESS, door.port))


def write_keys(path: Path, *keys: str) -> Path:
    """client-keys as secrets.yml writes it: a key a line."""
    path.write_text("".join(f"{key}\n" for key in keys))
    return path


def start(door: Door, directory: Path, given: Path) -> subprocess.Popen:
    """HAProxy as socketwise-lb.service runs it: the configuration checked first, the
    backend credential in its environment (the unit's EnvironmentFile, frontdoor.env), the
    client keys in the file SOCKETWISE_CLIENT_KEYS names (the unit's copy of client-keys),
    the scrape token in SOCKETWISE_SCRAPE_KEYS's (scrape-keys'), the certificates in
    SOCKETWISE_DOOR_FILES (the unit's copies); in the foreground, master and worker (a
    SIGUSR2 reloads it, as the unit's ExecReload does)."""
    return start_all([door], directory, given)[door.name]


def start_all(doors: list[Door], directory: Path, given: Path) -> dict[str, subprocess.Popen]:
    """start() for each of DOORS, side by side: every configuration checked, then every
    HAProxy started, then each awaited until it listens."""
    environments = {}
    for door in doors:
        own = (HOST_ONLY_KEY,) if door.name in ("host-own-keys", "host-pinned") else (KEY, PREVIOUS)
        keys = write_keys(directory / f"{door.name}-client-keys", *own)
        environments[door.name] = dict(
            os.environ,
            SOCKETWISE_BACKEND_KEY=BACKEND,
            SOCKETWISE_CLIENT_KEYS=str(keys),
            SOCKETWISE_SCRAPE_KEYS=str(write_keys(directory / f"{door.name}-scrape-keys", SCRAPE)),
            SOCKETWISE_DOOR_FILES=str(
                own_files(given, "rotating-tls") if door.name == "rotating-tls"
                else kit_issued(directory, given) if door.name == "host-kit"
                else given
            ),
        )  # fmt: skip
    config = {door.name: str(directory / f"{door.name}.cfg") for door in doors}
    checks = {
        name: subprocess.Popen(
            ["haproxy", "-c", "-q", "-f", config[name]], env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        for name, env in environments.items()
    }  # fmt: skip
    for name, check in checks.items():
        output = check.communicate()[0]
        assert check.returncode == 0, f"{config[name]}: {output}"
    processes = {
        door.name: subprocess.Popen(
            ["haproxy", "-W", "-db", "-f", config[door.name]],
            env=environments[door.name],
            stdout=(directory / f"{door.name}.log").open("w"),
            stderr=subprocess.STDOUT,
        )
        for door in doors
    }
    for door in doors:
        process, log = processes[door.name], directory / f"{door.name}.log"
        deadline = time.monotonic() + 10
        while True:
            assert process.poll() is None, log.read_text()
            try:
                socket.create_connection((ADDRESS, door.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    for each in processes.values():
                        each.kill()
                    raise AssertionError(
                        f"{door.name}: HAProxy did not listen on {door.port}: {log.read_text()}"
                    ) from None
                time.sleep(0.05)
    return processes


@dataclass
class FrontDoors:
    doors: dict[str, Door]
    server: Recorder
    directory: Path
    processes: dict[str, subprocess.Popen]
    refusing: HostDoor
    busy: HostDoor
    dying: HostDoor
    # The host of the fleet of two models that serves BIG_MODEL.
    big: HostDoor
    # A host that serves another model than its fleet door knows: it answers 404.
    moved: HostDoor
    sick: SickEngine
    broken: SickEngine
    # When the doors started (time.monotonic()).
    started: float
    # A client stalled in its headers on the host's door since then.
    stalled: Stalled

    def log(self, door: str) -> str:
        """What the door's HAProxy wrote: its access log (the journal, on a host)."""
        return (self.directory / f"{door}.log").read_text()


@pytest.fixture(scope="module")
def front(tmp_path_factory) -> Iterator[FrontDoors]:
    directory = tmp_path_factory.mktemp("frontdoor")
    server, refusing, busy = Recorder(), HostDoor(503), HostDoor(200, BUSY_HEALTH_SECONDS)
    dying, big, moved = HostDoor(200), HostDoor(200), HostDoor(404)
    hosts = (server, refusing, busy, dying, big, moved)
    for serving in hosts:
        threading.Thread(target=serving.serve_forever, daemon=True).start()
    ports = tuple(serving.server_address[1] for serving in hosts)
    doors = render(directory, *ports)
    engine = EngineSocket(directory / ENGINE_SOCKET, server)
    prefixed = [EngineSocket(directory / f"{name}.sock", server, name) for name in PREFIX_INSTANCES]
    sick = SickEngine(directory / "sick.sock")
    broken = SickEngine(directory / "broken.sock", health=200)
    for serving in (engine, sick, broken, *prefixed):
        threading.Thread(target=serving.serve_forever, daemon=True).start()
    given = credentials(directory)
    self_signed(directory, "another CA", "other-ca")
    processes = {}
    started = [d for d in doors.values() if d.name not in SECOND_LISTENERS + STARTED_BY_TESTS]
    try:
        # The hosts' doors listen before a fleet door's first check of them: a host whose
        # first check failed would be out of the fleet door for its next 2 s.
        for fleet in (False, True):
            wave = [d for d in started if d.name.startswith("fleet") == fleet]
            processes |= start_all(wave, directory, given)
        yield FrontDoors(
            doors,
            server,
            directory,
            processes,
            refusing,
            busy,
            dying,
            big,
            moved,
            sick,
            broken,
            time.monotonic(),
            Stalled(doors["host"].port),
        )
    finally:
        for process in processes.values():
            process.terminate()
            process.wait(timeout=10)
        for serving in (*hosts, engine, sick, broken, *prefixed):
            serving.shutdown()
            serving.server_close()


# --- the client --------------------------------------------------------------------------


@dataclass
class Outcome:
    status: int
    reached: list[Seen]
    # What the client got in the answer's body.
    answer: bytes = b""


def send(
    front: FrontDoors,
    door: str,
    method: str,
    path: str,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
    chunked: bool = False,
    source: str = ADDRESS,
    cert: Path | None = None,
) -> Outcome:
    """One request with the path exactly as given, from the address SOURCE (over TLS
    presenting CERT, a PEM of certificate and key, when given); what the client got and
    which requests of it reached the server."""
    probe = uuid.uuid4().hex
    to = front.doors[door]
    if to.tls:
        # The lab's certificate is self-signed: this checks the rules, not the certificate.
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        if cert:
            context.load_cert_chain(cert)
        connection = http.client.HTTPSConnection(
            ADDRESS, to.port, timeout=10, context=context, source_address=(source, 0)
        )
    else:
        connection = http.client.HTTPConnection(
            ADDRESS, to.port, timeout=10, source_address=(source, 0)
        )
    try:
        connection.putrequest(method, path, skip_accept_encoding=True)
        connection.putheader("X-Probe", probe)
        for name, value in (headers or {}).items():
            connection.putheader(name, value)
        if chunked:
            connection.putheader("Transfer-Encoding", "chunked")
            connection.endheaders()
            connection.send(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body or b""), body or b""))
        else:
            if body is not None:
                connection.putheader("Content-Length", str(len(body)))
            connection.endheaders(body)
        response = connection.getresponse()
        answer = response.read()
        status = response.status
    finally:
        connection.close()
    return Outcome(status, front.server.probed(probe), answer)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


COMPLETION = json.dumps({"model": MODEL, "prompt": "Hello", "max_tokens": 6}).encode()


def route_request(method: str) -> bytes | None:
    return COMPLETION if method == "POST" else None


# --- the rules ---------------------------------------------------------------------------


def sent_on(door: str, key: str) -> str:
    """The Authorization an instance behind DOOR gets for a client's KEY: a host's or a
    cluster head's door sends the backend credential (vLLM checks it); the fleet door
    passes the client's key on to a host's door, which checks it again."""
    return f"Bearer {key if door.startswith('fleet') else BACKEND}"


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize(("method", "route"), OPENAI_ROUTES)
def test_openai_routes_with_the_key_reach_the_instance_unchanged(front, door, method, route):
    body = route_request(method)
    for path in (route, f"{route}?stream=false"):
        outcome = send(front, door, method, path, bearer(KEY), body)
        assert outcome.status == 200, path
        [seen] = outcome.reached
        # The instance gets the path and the body as sent, with the backend's key.
        assert (seen.method, seen.path) == (method, path)
        assert seen.headers["authorization"] == sent_on(door, KEY)
        assert seen.body == (body or b"")


def test_the_host_door_sends_an_instance_no_more_than_its_planned_connections(front):
    """The plan's max_connections (8 for the test's instance) is the most requests the
    instance has at once: twice as many sent together wait their turn in the door's queue
    (not in vLLM's, where they would take KV cache and preempt each other) and are all
    served."""
    cap, statuses = 8, []
    with front.server.lock:
        front.server.most = 0

    def one() -> None:
        held = bearer(KEY) | {"X-Delay": "1"}
        statuses.append(send(front, "host", "POST", "/v1/completions", held, COMPLETION).status)

    threads = [threading.Thread(target=one) for _ in range(2 * cap)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == [200] * 2 * cap
    assert front.server.most == cap


def test_a_client_that_stalls_before_its_headers_end_is_answered_408_in_ten_seconds(front):
    # A slow client (or many: slowloris) holds a connection only for the door's 10 s to
    # send its request's headers, not for the whole request timeout. (The client stalled
    # when the doors started, and waited beside the other tests.)
    answer, waited = front.stalled.answered()
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert 9 <= waited < 15, waited


class Stalled(threading.Thread):
    """A client that sends part of a request's headers to the door on PORT and waits for
    its answer: what came, and how many seconds after the stall."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.client = socket.create_connection((ADDRESS, port), timeout=20)
        self.client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: door\r\n")
        self.started = time.monotonic()
        self.answer, self.waited = b"", -1.0
        self.start()

    def run(self) -> None:
        with self.client:
            self.answer = self.client.recv(4096)
            self.waited = time.monotonic() - self.started

    def answered(self) -> tuple[bytes, float]:
        self.join(timeout=30)
        return self.answer, self.waited


def test_the_host_door_takes_an_instance_whose_engine_died_out_of_its_rotation(front):
    # vLLM's API server outlives its engine and answers 500, to /health as well: the
    # door's checks (every 2 s, out after two) leave every completion to the other one.
    time.sleep(max(0.0, 6 - (time.monotonic() - front.started)))
    answered = front.sick.answered
    for _ in range(6):
        outcome = send(front, "engine-sick", "POST", "/v1/completions", bearer(KEY), COMPLETION)
        assert outcome.status == 200 and len(outcome.reached) == 1, outcome
    assert front.sick.answered == answered


def test_a_cluster_door_takes_out_a_head_whose_pipeline_fails_though_its_health_is_ok(front):
    # A worker of the pipeline is gone: the head's /health still says ok, a completion
    # fails. The door checks with a completion, so it answers 503 itself (a fleet door
    # then tries another host) and sends the head nothing.
    time.sleep(max(0.0, 6 - (time.monotonic() - front.started)))
    answered = front.broken.answered
    outcome = send(front, "cluster-broken", "POST", "/v1/completions", bearer(KEY), COMPLETION)
    assert outcome.status == 503, outcome
    assert front.broken.answered == answered


@pytest.mark.parametrize("door", DOORS)
def test_the_previous_key_passes_too_during_a_rotation(front, door):
    outcome = send(front, door, "POST", "/v1/completions", bearer(PREVIOUS), COMPLETION)
    assert outcome.status == 200
    assert [seen.headers["authorization"] for seen in outcome.reached] == [sent_on(door, PREVIOUS)]


def held_request(front: FrontDoors, door: str) -> tuple[threading.Thread, list[Outcome]]:
    """A request DOOR's server holds for 2 s, under way: its thread, and the list its
    outcome is added to when it ends."""
    outcomes: list[Outcome] = []
    slow = threading.Thread(
        target=lambda: outcomes.append(
            send(front, door, "GET", "/v1/models", bearer(KEY) | {"X-Delay": "2"})
        )
    )
    slow.start()
    time.sleep(0.5)  # it reached the server and waits there
    return slow, outcomes


def test_a_reload_takes_new_keys_and_keeps_the_connections_in_flight(front):
    """A rotation's end: the file gets the new key and loses the previous one; SIGUSR2 (the
    unit's ExecReload) loads it, and a request in flight is answered."""
    new = "sk-new-" + uuid.uuid4().hex
    assert send(front, "rotating", "GET", "/v1/models", bearer(new)).status == 401
    slow, in_flight = held_request(front, "rotating")
    write_keys(front.directory / "rotating-client-keys", new, KEY)
    front.processes["rotating"].send_signal(signal.SIGUSR2)
    deadline = time.monotonic() + 10
    while send(front, "rotating", "GET", "/v1/models", bearer(new)).status != 200:
        assert time.monotonic() < deadline, front.log("rotating")[-2000:]
        time.sleep(0.1)
    assert send(front, "rotating", "GET", "/v1/models", bearer(KEY)).status == 200
    assert send(front, "rotating", "GET", "/v1/models", bearer(PREVIOUS)).status == 401
    # The old worker finished the request it held.
    slow.join(timeout=10)
    assert [outcome.status for outcome in in_flight] == [200]


def test_a_reload_takes_a_renewed_certificate_and_keeps_the_requests_in_flight(front):
    """A renewal: the door's copy of frontdoor.pem is replaced (the unit's ExecReload
    copies it from root's file) and SIGUSR2 loads it; new connections get the new
    certificate, and a request in flight is answered."""
    door = front.doors["rotating-tls"]
    before = served_certificate(door)
    slow, in_flight = held_request(front, "rotating-tls")
    files = front.directory / "rotating-tls-files"
    cert, key = self_signed(front.directory, "renewed", "renewed")
    (files / "frontdoor.pem").write_text(cert.read_text() + key.read_text())
    front.processes["rotating-tls"].send_signal(signal.SIGUSR2)
    deadline = time.monotonic() + 10
    while served_certificate(door) == before:
        assert time.monotonic() < deadline, front.log("rotating-tls")[-2000:]
        time.sleep(0.1)
    assert served_certificate(door) == cert.read_text()
    slow.join(timeout=10)
    assert [outcome.status for outcome in in_flight] == [200]


# The tasks that stop a host's serving (a door's restart, the instances' restart for a new
# secret) or write one file for the whole fleet: never on two hosts at once.
ONE_HOST_AT_A_TIME = [
    ("roles/vllm_service/tasks/present.yml", "Start the front door"),
    (
        "roles/vllm_service/tasks/present.yml",
        "Restart the running instances for their new secret, one host at a time",
    ),
    ("roles/door/tasks/start.yml", "Start the door"),
    (
        "roles/rollout/tasks/record.yml",
        "Write rollout-summary.json from every host's record so far",
    ),
]


def test_the_deploy_restarts_one_hosts_door_at_a_time(tmp_path):
    """The roles' own tasks that restart a host's door or its instances (or write one file
    from every host's record), each with its action replaced by one that records when it
    runs on each host: on three hosts at once (forks), a task's runs never overlap, so no
    two hosts' doors or instances are down together."""
    record = tmp_path / "runs"
    play_tasks = []
    for number, (path, name) in enumerate(ONE_HOST_AT_A_TIME):
        [task] = [t for t in yaml.safe_load((REPO / path).read_text()) if t["name"] == name]
        # Its own keywords (throttle, run_once and the like), less what the test replaces.
        kept = {k: v for k, v in task.items() if k in ("name", "throttle", "run_once", "serial")}
        play_tasks.append(kept | {"ansible.builtin.shell": (
            f"echo {number} start $(date +%s.%N) >> {record}; sleep 0.3; "
            f"echo {number} end $(date +%s.%N) >> {record}"
        )})  # fmt: skip
    local = {
        "ansible_connection": "local",
        "ansible_python_interpreter": "{{ ansible_playbook_python }}",
    }
    hosts = {f"door{n}": local for n in range(3)}
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(json.dumps({"all": {"hosts": hosts}}))
    play = [{"name": "Doors", "hosts": "all", "gather_facts": False, "tasks": play_tasks}]
    playbook = tmp_path / "doors.yml"
    playbook.write_text(json.dumps(play))
    done = run_playbook(str(playbook), "-i", str(inventory), "--forks", "3")
    assert done.returncode == 0, done.output[-3000:]
    runs = [line.split() for line in record.read_text().splitlines()]
    for number, (path, name) in enumerate(ONE_HOST_AT_A_TIME):
        events = sorted((float(t), kind) for n, kind, t in runs if n == str(number))
        assert [kind for _, kind in events] == ["start", "end"] * 3, f"{path}: {name}"


def fleet_status(front: FrontDoors, door: str, backend: str | None = None) -> dict[str, str]:
    """{server: status} of a door's BACKEND (every backend's servers when None: a fleet
    door's `fleet`, or its backend per model), from its runtime API socket: UP, MAINT or
    DOWN (a check that failed once leaves UP as UP, not "UP 1/2")."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as admin:
        admin.connect(str(front.directory / f"{door}.sock"))
        admin.sendall(b"show stat\n")
        answer = b"".join(iter(lambda: admin.recv(65536), b"")).decode()
    rows = list(csv.reader(answer.lstrip("# ").splitlines()))
    column = {name: i for i, name in enumerate(rows[0])}
    return {
        row[column["svname"]]: row[column["status"]].split()[0]
        for row in rows[1:]
        if row
        and (row[0] == backend or backend is None)
        and row[column["svname"]] not in ("FRONTEND", "BACKEND")
    }


def test_drain_takes_a_host_out_of_the_fleet_door_and_puts_it_back(front, tmp_path):
    """playbooks/drain.yml, which `socketwise calibrate` runs around the host it measures,
    through fleet_door's drain entry point (the rollout's drain and undrain too), on
    a real fleet door: out, the door holds the host in maintenance (no request reaches it)
    while its neighbour stays up; back, the door has it up again before the playbook ends."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        json.dumps({"all": {"children": {"socketwise_frontdoor": {"hosts": {"door": local}}}}})
    )
    socket_path = str(front.directory / "fleet-models.sock")

    def drain(out: bool) -> None:
        given = {"socketwise_drain_hosts": ["host1"], "socketwise_drain": out,
                 "__fleet_door_socket": socket_path}  # fmt: skip
        done = run_playbook("playbooks/drain.yml", "-i", str(inventory), "-e", json.dumps(given))
        assert done.returncode == 0, done.output[-3000:]

    # A fleet of two models: the door has a backend for each, and finds the host in its own.
    assert fleet_status(front, "fleet-models") == {"host1": "UP", "host2": "UP", "big": "UP"}
    try:
        drain(True)
        assert fleet_status(front, "fleet-models") == {"host1": "MAINT", "host2": "UP", "big": "UP"}
        drain(False)
        assert fleet_status(front, "fleet-models") == {"host1": "UP", "host2": "UP", "big": "UP"}
    finally:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as admin:
            admin.connect(socket_path)
            admin.sendall(f"set server fleet-{MODEL}/host1 state ready\n".encode())


def test_a_rolling_restart_takes_one_instance_out_of_the_hosts_door_and_puts_it_back(
    front, tmp_path
):
    """The door role's drain and undrain, as a rollout's rolling restart runs them around
    each instance (roles/vllm_service/tasks/restart-one.yml), on a real host's door: out,
    the door holds that instance in maintenance while the other stays up; back, the door
    has it up again before the play ends."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(json.dumps({"all": {"hosts": {"door": local}}}))
    socket_path = str(front.directory / "host-drain.sock")
    step = {"socket": socket_path, "backend": "vllm_instances", "servers": [INSTANCE]}
    playbook = tmp_path / "drain.yml"
    play = {"hosts": "door", "gather_facts": False, "tasks": [{
        "ansible.builtin.include_role": {"name": "socketwise.kit.door", "tasks_from": "{{ step }}"},
        "vars": {"door_drain": step},
    }]}  # fmt: skip
    playbook.write_text(json.dumps([play]))

    def run(entry_point: str) -> None:
        done = run_playbook(str(playbook), "-i", str(inventory), "-e", f"step={entry_point}")
        assert done.returncode == 0, done.output[-3000:]

    both_up = {INSTANCE: "UP", SECOND: "UP"}
    assert fleet_status(front, "host-drain", "vllm_instances") == both_up
    try:
        run("drain")
        assert fleet_status(front, "host-drain", "vllm_instances") == {
            INSTANCE: "MAINT",
            SECOND: "UP",
        }
        run("undrain")
        assert fleet_status(front, "host-drain", "vllm_instances") == both_up
    finally:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as admin:
            admin.connect(socket_path)
            admin.sendall(f"set server vllm_instances/{INSTANCE} state ready\n".encode())


def test_a_request_waits_in_the_doors_queue_no_longer_than_its_queue_timeout(front):
    """door_queue_timeout: a request the door cannot send on yet (its instance holds its
    max_connections) waits that long in the door's queue, then gets 503, which a fleet
    door retries on another host; not the whole request timeout."""
    held: list[int] = []
    first = threading.Thread(target=lambda: held.append(
        send(front, "queued", "POST", "/v1/completions", bearer(KEY) | {"X-Delay": "2.5"},
             COMPLETION).status
    ))  # fmt: skip
    first.start()
    time.sleep(0.5)  # it holds the instance's one connection
    second = send(front, "queued", "POST", "/v1/completions", bearer(KEY), COMPLETION)
    first.join()
    assert (second.status, held) == (503, [200])


def test_a_doors_runtime_socket_is_root_s_alone(front):
    """Through its runtime API socket a door's servers are drained, disabled or set down:
    the host's, the fleet's and a cluster head's door each make theirs root's alone."""
    for door in ("host", "fleet", "cluster"):
        mode = (front.directory / f"{door}.sock").stat().st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600, (door, oct(mode))


@pytest.mark.parametrize("door", DOORS)
def test_health_needs_no_key(front, door):
    outcome = send(front, door, "GET", "/health")
    assert outcome.status == 200
    assert [seen.path for seen in outcome.reached] == ["/health"]


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize(("method", "route"), OPENAI_ROUTES)
def test_a_missing_or_wrong_key_is_refused_before_the_instance(front, door, method, route):
    wrong = [
        {},
        bearer(KEY[:-1]),
        bearer(KEY + "x"),
        bearer(f"{KEY} {KEY}"),
        bearer(f"{KEY}\n{PREVIOUS}"[:40]),
        bearer(PREVIOUS[1:]),
        bearer(BACKEND),
        bearer(""),
        {"Authorization": KEY},
        {"Authorization": "Basic " + base64.b64encode(f"user:{KEY}".encode()).decode()},
        {"X-Api-Key": KEY},
    ]
    for headers in wrong:
        outcome = send(front, door, method, route, headers, route_request(method))
        assert (outcome.status, outcome.reached) == (401, []), headers


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("path", REFUSED_PATHS + MORE_REFUSED)
def test_every_other_route_and_spelling_is_refused_with_the_key(front, door, path):
    for method, body in (("GET", None), ("POST", b"{}")):
        outcome = send(front, door, method, path, bearer(KEY), body)
        assert (outcome.status, outcome.reached) == (403, []), method


@pytest.mark.parametrize("door", DOORS)
def test_a_body_over_the_limit_is_refused_on_its_declared_length(front, door):
    at_limit = send(front, door, "POST", "/v1/completions", bearer(KEY), b"x" * MAX_BODY)
    assert at_limit.status == 200
    assert [len(seen.body) for seen in at_limit.reached] == [MAX_BODY]
    # Declared and not sent: HAProxy answers from the headers alone.
    over = send(
        front,
        door,
        "POST",
        "/v1/completions",
        bearer(KEY) | {"Content-Length": str(MAX_BODY + 1)},
    )
    assert (over.status, over.reached) == (413, [])


@pytest.mark.parametrize("door", DOORS)
def test_a_chunked_body_is_refused(front, door):
    # Without a length it could not be held to the limit, however small it is.
    outcome = send(front, door, "POST", "/v1/completions", bearer(KEY), COMPLETION, True)
    assert (outcome.status, outcome.reached) == (400, [])


def test_an_anonymous_door_passes_openai_routes_without_a_key_and_refuses_the_rest(front):
    for method, route in OPENAI_ROUTES:
        outcome = send(front, "anonymous", method, route, body=route_request(method))
        assert outcome.status == 200 and len(outcome.reached) == 1, route
    for path in REFUSED_PATHS + MORE_REFUSED:
        outcome = send(front, "anonymous", "GET", path)
        assert (outcome.status, outcome.reached) == (403, []), path


def test_the_metrics_door_serves_each_engine_the_node_and_itself_to_the_scrape_token(front):
    for path in (f"/metrics/{INSTANCE}", "/metrics/node"):
        outcome = send(front, "metrics", "GET", path, bearer(SCRAPE))
        assert outcome.status == 200, path
        # The engine (or node exporter) is asked for its own /metrics, and never sees the
        # scrape token.
        [seen] = outcome.reached
        assert seen.path == "/metrics" and "authorization" not in seen.headers, path
    # The door's own figures, from HAProxy's exporter.
    body = urllib.request.urlopen(
        urllib.request.Request(
            f"http://{ADDRESS}:{front.doors['metrics'].port}/metrics/door", headers=bearer(SCRAPE)
        ),
        timeout=10,
    ).read()
    assert b"haproxy_backend_active_servers" in body
    for path in ("/metrics", "/metrics/", "/metrics/vllm-other", "/v1/models", "/health"):
        outcome = send(front, "metrics", "GET", path, bearer(SCRAPE))
        assert (outcome.status, outcome.reached) == (403, []), path


def test_a_scrape_of_an_engine_that_is_gone_fails_at_once(front):
    # Its next scrape fails and the next evaluation fires SocketwiseEngineDown: the door
    # does not retry the refused connection (1 s a retry) and delay the alert.
    started = time.monotonic()
    outcome = send(front, "engine-gone-metrics", "GET", f"/metrics/{INSTANCE}", bearer(SCRAPE))
    took = time.monotonic() - started
    assert (outcome.status, outcome.reached) == (503, []) and took < 1, took


def test_the_metrics_door_refuses_a_scrape_without_the_token(front):
    for headers in ({}, bearer(KEY), bearer(SCRAPE[:-1]), {"Authorization": f"Basic {SCRAPE}"}):
        for path in (f"/metrics/{INSTANCE}", "/metrics/node", "/metrics/door"):
            outcome = send(front, "metrics", "GET", path, headers)
            assert (outcome.status, outcome.reached) == (401, []), (path, headers)


def test_the_metrics_door_closes_a_connection_from_another_address(front):
    # The door takes scrapes from ADDRESS (the monitors' sources) alone.
    with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
        send(front, "metrics", "GET", f"/metrics/{INSTANCE}", bearer(SCRAPE), source=STRANGER)


def test_a_cluster_heads_metrics_door_asks_llama_server_with_its_key(front):
    outcome = send(front, "cluster-llamacpp-metrics", "GET", "/metrics/llamacpp", bearer(SCRAPE))
    assert outcome.status == 200
    # llama-server with an API key asks it on /metrics too: the door sends the backend
    # credential, never the scrape token.
    [seen] = outcome.reached
    assert (seen.path, seen.headers["authorization"]) == ("/metrics", f"Bearer {BACKEND}")
    assert (
        send(front, "cluster-llamacpp-metrics", "GET", "/metrics/node", bearer(SCRAPE)).status
        == 200
    )
    assert send(front, "cluster-llamacpp-metrics", "GET", "/metrics/llamacpp").status == 401


def test_a_cluster_member_that_is_not_the_head_serves_its_node_alone(front):
    outcome = send(front, "cluster-member", "GET", "/metrics/node", bearer(SCRAPE))
    assert outcome.status == 200 and outcome.reached[0].path == "/metrics"
    assert "authorization" not in outcome.reached[0].headers
    for path in ("/metrics/vllm", "/metrics/llamacpp", "/v1/completions", "/health"):
        outcome = send(front, "cluster-member", "GET", path, bearer(SCRAPE))
        assert (outcome.status, outcome.reached) == (403, []), path
    assert send(front, "cluster-member", "GET", "/metrics/node", bearer(KEY)).status == 401
    with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
        send(front, "cluster-member", "GET", "/metrics/node", bearer(SCRAPE), source=STRANGER)


@pytest.mark.parametrize("door", TLS_DOORS)
def test_a_tls_door_answers_no_plain_http(front, door):
    connection = http.client.HTTPConnection(ADDRESS, front.doors[door].port, timeout=10)
    try:
        with pytest.raises(OSError):
            connection.request("GET", "/health")
            connection.getresponse()
    finally:
        connection.close()


def curl(
    front: FrontDoors, door: str, *args: str, stdin: tuple[float, int] | None = None
) -> tuple[str, list[Seen]]:
    """curl (built with nghttp2) against DOOR: '<status> <HTTP version>' as curl saw them,
    and the requests of it that reached the server. STDIN: (seconds, bytes) written to
    curl's standard input after that long."""
    probe = uuid.uuid4().hex
    to = front.doors[door]
    scheme = "https" if to.tls else "http"
    run = subprocess.Popen(
        ["curl", "-sk", "-o", "/dev/null", "-w", "%{http_code} %{http_version}", "--noproxy", "*"]
        + ["-H", f"X-Probe: {probe}", *args[:-1], f"{scheme}://{ADDRESS}:{to.port}{args[-1]}"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    if stdin is not None:
        time.sleep(stdin[0])
        with contextlib.suppress(BrokenPipeError):
            run.stdin.write(b"x" * stdin[1])
    with contextlib.suppress(BrokenPipeError):
        run.stdin.close()
    out = run.stdout.read()
    run.wait(timeout=30)
    return out.decode(), front.server.probed(probe)


@pytest.mark.parametrize("door", PLAIN_DOORS)
def test_plain_http_is_http_1_1_only(front, door):
    # HTTP/2 without TLS (h2c, prior knowledge) is not spoken: nothing reaches the server.
    answer, reached = curl(front, door, "--http2-prior-knowledge", "/health")
    assert not answer.endswith(" 2") and reached == [], answer
    # An upgrade request is answered in HTTP/1.1.
    assert curl(front, door, "--http2", "/health")[0] == "200 1.1"


@pytest.mark.parametrize("door", TLS_DOORS)
def test_http_2_over_tls_keeps_every_rule(front, door):
    key = ["-H", f"Authorization: Bearer {KEY}"]
    assert curl(front, door, "--http2", *key, "/v1/models")[0] == "200 2"
    assert curl(front, door, "--http2", "/v1/models")[0] == "401 2"
    assert curl(front, door, "--http2", *key, "/metrics")[0] == "403 2"
    post = ["--http2", *key, "-H", "Content-Type: application/json", "--data-binary"]
    answer, reached = curl(front, door, *post, COMPLETION.decode(), "/v1/completions")
    assert answer == "200 2" and [seen.body for seen in reached] == [COMPLETION]
    # Refused while curl still sends the body: HAProxy answers and cancels the stream,
    # which curl reports as a failed transfer; the door's log has the status.
    # DATA frames with no declared length could not be held to the body limit.
    nolength = [*post, COMPLETION.decode(), "-H", "Content-Length:"]
    assert refused_h2(front, door, nolength) == "411"
    assert refused_h2(front, door, [*post, "x" * (MAX_BODY + 1)]) == "413"


# A body of DATA frames with no content-length, as curl sends its standard input on
# HTTP/2, four times the body limit: sent at once, and sent after the headers (a rule that
# looks only at what came with them would let it through).
UNDECLARED = MAX_BODY * 4


@pytest.mark.parametrize("door", TLS_DOORS)
@pytest.mark.parametrize("delay", [0, 0.5], ids=["with-the-headers", "after-the-headers"])
def test_http_2_refuses_a_body_without_a_length_on_every_method(front, door, delay):
    key = ["-H", f"Authorization: Bearer {KEY}"]
    put = ["--http2", *key, "-X", "PUT", "-T", "-"]
    assert refused_h2(front, door, put, "PUT", stdin=(delay, UNDECLARED)) == "411"
    # /health takes no body, key or not.
    health = ["--http2", "-X", "GET", "-T", "-"]
    assert refused_h2(front, door, health, "GET", "/health", stdin=(delay, UNDECLARED)) == "400"
    # A request without a body is not held up: its answer comes at once.
    started = time.monotonic()
    assert curl(front, door, "--http2", "/health")[0] == "200 2"
    assert time.monotonic() - started < 5


def refused_h2(
    front: FrontDoors,
    door: str,
    args: list[str],
    method: str = "POST",
    path: str = "/v1/completions",
    stdin: tuple[float, int] | None = None,
) -> str:
    """The status the door logged for a METHOD to PATH it refused, checking that nothing
    of it reached the server. STDIN: (seconds, bytes) curl reads from its standard input
    after that long, for -T -."""
    probe = uuid.uuid4().hex
    assert curl(front, door, *args, f"{path}?p={probe}", stdin=stdin)[1] == []
    [(status, request)] = logged(front, door, probe)
    assert request == f"{method} {path}?p={probe}"
    return status


@pytest.mark.parametrize("door", DOORS)
def test_health_is_get_or_head_without_a_body(front, door):
    assert send(front, door, "HEAD", "/health").status == 200
    for method in ("POST", "PUT", "DELETE", "OPTIONS"):
        outcome = send(front, door, method, "/health", body=b"")
        assert (outcome.status, outcome.reached) == (405, []), method
    outcome = send(front, door, "GET", "/health", body=b"hello")
    assert (outcome.status, outcome.reached) == (400, [])


@pytest.mark.parametrize("door", DOORS)
def test_a_post_must_declare_its_length(front, door):
    outcome = send(front, door, "POST", "/v1/completions", bearer(KEY))
    assert (outcome.status, outcome.reached) == (411, [])


@pytest.mark.parametrize("door", DOORS)
def test_the_access_log_records_refusals_without_the_key(front, door):
    probe = uuid.uuid4().hex
    assert send(front, door, "GET", f"/v1/models?p={probe}", bearer(KEY[:-1])).status == 401
    assert send(front, door, "GET", f"/admin-{probe}", bearer(KEY)).status == 403
    assert send(front, door, "GET", f"/v1/models?q={probe}", bearer(KEY)).status == 200
    # Each request has a line with its status. HAProxy writes a line when the stream
    # ends, from whichever of its threads served it: not always in the order sent.
    assert sorted(logged(front, door, probe, 3)) == [
        ("200", f"GET /v1/models?q={probe}"),
        ("401", f"GET /v1/models?p={probe}"),
        ("403", f"GET /admin-{probe}"),
    ]
    assert KEY[:16] not in front.log(door) and "Bearer" not in front.log(door)


def logged(front: FrontDoors, door: str, probe: str, count: int = 1) -> list[tuple[str, str]]:
    """(status, 'METHOD PATH') of the access log's lines about PROBE, once COUNT are there.
    A line: 'CLIENT [DATE] FRONTEND BACKEND/SERVER TIMES STATUS BYTES ... "METHOD URI VERSION"'."""
    deadline = time.monotonic() + 10
    while True:
        lines = [line for line in front.log(door).splitlines() if probe in line]
        if len(lines) >= count or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    found = []
    for line in lines:
        before, request = line.split('"')[:2]
        method, uri = request.split()[:2]
        found.append(
            (before.split()[5], f"{method} {urlsplit(uri)._replace(scheme='', netloc='').geturl()}")
        )
    return found


@pytest.mark.parametrize("door", ["limited", "cluster-limited"])
def test_a_client_past_its_request_rate_gets_429_and_no_other_client_does(front, door):
    limit = LIMITS["rate"] * 10  # requests in 10 s
    statuses = [send(front, door, "GET", "/health", source="127.0.0.3") for _ in range(limit)]
    assert [outcome.status for outcome in statuses] == [200] * limit
    over = send(front, door, "GET", "/health", source="127.0.0.3")
    assert (over.status, over.reached) == (429, [])
    # The key does not lift the limit; another client is not held to this one's count.
    assert send(front, door, "GET", "/v1/models", bearer(KEY), source="127.0.0.3").status == 429
    assert send(front, door, "GET", "/health", source="127.0.0.4").status == 200
    # The exempt address (a fleet door's) has no limit.
    for _ in range(limit + 5):
        assert send(front, door, "GET", "/health", source=EXEMPT).status == 200


def test_a_client_past_its_open_connections_gets_429(front):
    source, port = "127.0.0.5", front.doors["limited"].port
    held = []
    for _ in range(LIMITS["connections"]):
        held.append(
            socket.create_connection((ADDRESS, port), timeout=10, source_address=(source, 0))
        )
    try:
        time.sleep(0.2)  # HAProxy accepts them
        over = send(front, "limited", "GET", "/health", source=source)
        assert (over.status, over.reached) == (429, [])
        for _ in range(LIMITS["connections"]):
            assert send(front, "limited", "GET", "/health", source=EXEMPT).status == 200
    finally:
        for connection in held:
            connection.close()
    deadline = time.monotonic() + 10
    while send(front, "limited", "GET", "/health", source=source).status != 200:
        assert time.monotonic() < deadline, "the limit stayed after the connections closed"
        time.sleep(0.2)


def test_a_fleet_door_given_the_hosts_ca_passes_only_a_door_it_signed(front):
    # The host's TLS door's certificate verifies: the completion passes both doors.
    verified = send(front, "fleet-verified", "POST", "/v1/completions", bearer(KEY), COMPLETION)
    assert verified.status == 200 and len(verified.reached) == 1, verified
    # Another CA: the fleet door refuses the host's certificate, and nothing reaches it.
    other = send(front, "fleet-other-ca", "POST", "/v1/completions", bearer(KEY), COMPLETION)
    assert (other.status, other.reached) == (503, []), other
    assert "fleet/host1 is DOWN, reason: Layer6 invalid response" in front.log("fleet-other-ca")


def test_a_fleet_door_verifies_a_kit_issued_host_door_by_the_hosts_name(front):
    """credentials_tls's certificate, issued by the role's own task from the kit's CA: a
    fleet door verifies by default, passes the host's door under the name the certificate
    carries, and refuses the same door under another host's name (its certificate in
    that host's place) before anything reaches it."""
    named = send(front, "fleet-kit", "POST", "/v1/completions", bearer(KEY), COMPLETION)
    assert named.status == 200 and len(named.reached) == 1, named
    misnamed = send(front, "fleet-kit-misnamed", "POST", "/v1/completions", bearer(KEY), COMPLETION)
    assert (misnamed.status, misnamed.reached) == (503, []), misnamed
    assert "fleet/host1 is DOWN, reason: Layer6 invalid response" in front.log("fleet-kit-misnamed")


def test_a_fleet_door_reaches_a_tls_host_door_with_its_certificate_not_the_clients_key(front):
    kit = front.directory / KIT
    # The host's door knows none of the fleet door's client keys: what passes it is the
    # fleet door's client certificate, made by the role on the controller.
    through = send(front, "fleet-mtls", "POST", "/v1/completions", bearer(KEY), COMPLETION)
    assert through.status == 200 and len(through.reached) == 1, through
    assert through.reached[0].headers["authorization"] == f"Bearer {BACKEND}"
    direct = send(front, "host-own-keys", "POST", "/v1/completions", bearer(KEY), COMPLETION)
    assert (direct.status, direct.reached) == (401, []), direct
    # A client of the host's door still needs its key, or the fleet door's certificate.
    for door in ("host-tls", "cluster-tls"):
        bare = send(front, door, "POST", "/v1/completions", None, COMPLETION)
        assert (bare.status, bare.reached) == (401, []), (door, bare)
        shown = send(
            front, door, "POST", "/v1/completions", None, COMPLETION,
            cert=kit / "fleet-client.pem",
        )  # fmt: skip
        assert shown.status == 200 and len(shown.reached) == 1, (door, shown)
    # A certificate another CA signed does not pass the handshake.
    other = front.directory / "other-client.pem"
    other.write_text(
        "".join((front.directory / f"other-ca.{kind}").read_text() for kind in ("crt", "key"))
    )
    with pytest.raises(ssl.SSLError):
        send(front, "host-tls", "POST", "/v1/completions", None, COMPLETION, cert=other)
    # The CA's key is not kept: nothing else can be signed with it.
    assert sorted(p.name for p in kit.iterdir()) == ["fleet-client-ca.pem", "fleet-client.pem"]
    assert (kit / "fleet-client.pem").stat().st_mode & 0o777 == 0o600


def test_a_host_door_takes_the_fleet_doors_certificate_alone_not_another_of_its_ca(front):
    """With an operator's own CA, which may sign other certificates: the host's door takes
    the fleet door's certificate (its fingerprint is pinned) in place of a key, and
    refuses another the same CA signed, before the instance."""
    operator = front.directory / OPERATOR
    for shown, status in (("fleet-client.pem", 200), ("another-client.pem", 401)):
        outcome = send(
            front, "host-pinned", "POST", "/v1/completions", None, COMPLETION,
            cert=operator / shown,
        )  # fmt: skip
        assert (outcome.status, len(outcome.reached)) == (status, int(status == 200)), shown


def test_a_renewed_fleet_certificate_and_the_one_it_replaced_both_pass_the_host_door(front):
    """The kit's pair two days before it expires: the deploy renews it (a new CA and
    certificate, a year long); a host's door takes the new certificate and the replaced
    one, which the fleet door shows until its own play, and still refuses another
    certificate the old CA signed. An operator's own pair is never renewed."""
    renewed = front.directory / RENEWED
    for shown, status in (
        ("fleet-client.pem", 200),
        ("fleet-client-previous.pem", 200),
        ("another-client.pem", 401),
    ):
        outcome = send(
            front, "host-renewed", "POST", "/v1/completions", None, COMPLETION,
            cert=renewed / shown,
        )  # fmt: skip
        assert (outcome.status, len(outcome.reached)) == (status, int(status == 200)), shown
    lasts = subprocess.run(
        ["openssl", "x509", "-in", str(renewed / "fleet-client.pem"), "-noout", "-checkend",
         str(300 * 86400)], capture_output=True,
    )  # fmt: skip
    assert lasts.returncode == 0
    assert (renewed / "fleet-client.pem").stat().st_mode & 0o777 == 0o600
    operator = sorted(p.name for p in (front.directory / OPERATOR).iterdir())
    assert "fleet-client-previous.pem" not in operator, operator


def test_a_fleet_door_over_tls_hosts_alone_sends_the_clients_key_no_further(front):
    # fleet-mtls's every host door is TLS: the key is dropped once checked. The plain
    # fleet door's hosts check it again, so it goes on there.
    # (The metrics door, after the fleet door's backend, drops the scrape token on both.)
    config = (front.directory / "fleet-mtls.cfg").read_text().split("frontend metrics")[0]
    assert "http-request del-header Authorization" in config
    plain = (front.directory / "fleet.cfg").read_text().split("frontend metrics")[0]
    assert "del-header Authorization" not in plain


def test_the_fleet_door_keeps_a_busy_host_whose_health_answers_late(front):
    # Two of the fleet door's checks (every 2 s) have had their time: a host whose /health
    # took 3 s, behind its own door's queue, still serves; it was not taken out as down.
    time.sleep(max(0.0, 10 - (time.monotonic() - front.started)))
    outcome = send(front, "fleet-busy", "POST", "/v1/completions", bearer(KEY), COMPLETION)
    assert outcome.status == 200, outcome
    assert front.busy.answered == 1


def test_the_fleet_door_sends_a_completion_a_dead_host_would_have_had_to_another(front):
    # A host that dies between two checks refuses the connection: each completion sent to
    # it before the checks take it out (two of them, 2 s apart) is retried on the host that
    # serves, and after they have, none is sent there; the client never sees an error.
    process = start(front.doors["fleet-dead"], front.directory, front.directory / "credentials")
    try:
        time.sleep(0.5)  # the door's first checks have found both hosts serving
        front.dying.shutdown()
        front.dying.server_close()
        for _ in range(8):
            outcome = send(front, "fleet-dead", "POST", "/v1/completions", bearer(KEY), COMPLETION)
            assert outcome.status == 200 and len(outcome.reached) == 1, outcome
        # leastconn takes idle hosts in turns: some went to the dead host first. The
        # access log's fifth connection count is the request's retries (+ when the last
        # went to another server).
        retries = re.compile(r" \d+/\d+/\d+/\d+/\+?[1-9]\d* \d+/\d+ \"POST")
        assert retries.search(front.log("fleet-dead")), front.log("fleet-dead")
        deadline = time.monotonic() + 10
        while "fleet/dying is DOWN" not in front.log("fleet-dead"):
            assert time.monotonic() < deadline, front.log("fleet-dead")
            time.sleep(0.2)
        for _ in range(4):
            outcome = send(front, "fleet-dead", "POST", "/v1/completions", bearer(KEY), COMPLETION)
            assert outcome.status == 200 and len(outcome.reached) == 1, outcome
        # HAProxy may write a request's line just after its answer: wait for all four.
        deadline = time.monotonic() + 5
        while (after := front.log("fleet-dead").split("is DOWN", 1)[1]).count('"POST') < 4:
            assert time.monotonic() < deadline, after
            time.sleep(0.1)
        assert not retries.search(after), after
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_the_fleet_door_sends_a_completion_a_host_refuses_with_503_to_another(front):
    # A host whose instances left its door for a restart answers 503 until the fleet
    # door's checks mark it down: a completion sent there in between is retried on the
    # other host, its body too, and the client never sees the 503.
    for _ in range(6):
        outcome = send(front, "fleet-retry", "POST", "/v1/completions", bearer(KEY), COMPLETION)
        assert outcome.status == 200 and len(outcome.reached) == 1, outcome
        assert outcome.reached[0].body == COMPLETION
    assert front.refusing.answered > 0


def test_the_fleet_door_sends_a_completion_a_host_answers_404_to_another(front):
    # A host a deploy moves to another model answers 404 for the model it served from its
    # instances' restart until the fleet door takes its new model at the run's end: a
    # completion sent there in between is retried on a host that still serves it.
    for _ in range(6):
        outcome = send(front, "fleet-moved", "POST", "/v1/completions", bearer(KEY), COMPLETION)
        assert outcome.status == 200 and len(outcome.reached) == 1, outcome
    assert front.moved.answered > 0


# --- a fleet of many models ---------------------------------------------------------------


def completion_of(model: str | None, before: int = 0) -> bytes:
    """A chat completion's body as common clients send it (the OpenAI client: `messages`
    first), with BEFORE bytes of conversation ahead of `model` (left out when None). Its one
    message names the other model in a nested `model` field, which routes nothing."""
    other = BIG_MODEL if model == MODEL else MODEL
    body: dict = {"messages": [{"role": "user", "content": "x" * before, "model": other}]}
    return json.dumps(body | ({"model": model} if model is not None else {})).encode()


def test_the_fleet_door_sends_each_model_to_the_hosts_that_serve_it(front):
    # Two models behind one endpoint: a completion for each reaches a host serving it alone,
    # its body unchanged, wherever `model` lies within the door's buffer (first or after
    # 12 KB of conversation); a `model` nested in a message routes nothing.
    for before in (0, 12000):
        answered = front.big.answered
        body = completion_of(MODEL, before)
        outcome = send(front, "fleet-models", "POST", "/v1/chat/completions", bearer(KEY), body)
        assert outcome.status == 200 and len(outcome.reached) == 1, outcome.status
        assert outcome.reached[0].body == body and front.big.answered == answered
        outcome = send(
            front, "fleet-models", "POST", "/v1/chat/completions", bearer(KEY),
            completion_of(BIG_MODEL, before),
        )  # fmt: skip
        assert outcome.status == 200 and outcome.reached == [], outcome.status
        assert front.big.answered == answered + 1
    outcome = send(front, "fleet-models", "POST", "/v1/completions", bearer(KEY), COMPLETION)
    assert outcome.status == 200 and len(outcome.reached) == 1


def refused_by_the_fleet(front: FrontDoors, body: bytes, status: int) -> dict:
    """BODY's completion through the fleet of two models: answered STATUS by the door, no
    host reached; the answer's OpenAI-style error."""
    answered = front.big.answered
    outcome = send(front, "fleet-models", "POST", "/v1/chat/completions", bearer(KEY), body)
    assert (outcome.status, outcome.reached, front.big.answered) == (status, [], answered)
    error = json.loads(outcome.answer)["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "model", error
    return error


def test_a_model_the_fleet_does_not_serve_gets_404_naming_those_it_does(front):
    error = refused_by_the_fleet(front, completion_of("tiny-llama-7b"), 404)
    assert error["code"] == "model_not_found"
    assert "`tiny-llama-7b`" in error["message"], error
    assert f"serves {MODEL}, {BIG_MODEL}" in error["message"], error
    # A name that would break the answer's JSON is escaped in it.
    error = refused_by_the_fleet(front, completion_of('x"}, "y'), 404)
    assert '`x"}, "y`' in error["message"], error


def test_a_completion_without_a_model_or_with_it_past_the_buffer_is_refused(front):
    # No model at all: 400, naming the models. A model the door could not read (behind more
    # conversation than its buffer holds): 413, saying how to send it; never a guess.
    error = refused_by_the_fleet(front, completion_of(None), 400)
    assert error["code"] == "model_required" and f"serves {MODEL}, {BIG_MODEL}" in error["message"]
    error = refused_by_the_fleet(front, completion_of(MODEL, BUFFER), 413)
    assert error["code"] == "model_not_read", error
    assert (
        f"first {BUFFER} bytes" in error["message"]
        and "fleet_door_buffer_bytes" in error["message"]
    )
    # The same conversation with its model first passes (the body limit is the door's).
    body = json.dumps({"model": MODEL} | json.loads(completion_of(None, BUFFER))).encode()
    outcome = send(front, "fleet-models", "POST", "/v1/chat/completions", bearer(KEY), body)
    assert outcome.status == 200 and outcome.reached[0].body == body


def test_the_fleet_door_lists_every_model_it_serves_behind_the_key(front):
    answered = front.big.answered
    outcome = send(front, "fleet-models", "GET", "/v1/models", bearer(KEY))
    assert (outcome.status, outcome.reached, front.big.answered) == (200, [], answered)
    listed = json.loads(outcome.answer)
    assert listed["object"] == "list"
    assert [(m["id"], m["object"]) for m in listed["data"]] == [
        (MODEL, "model"), (BIG_MODEL, "model")
    ]  # fmt: skip
    assert send(front, "fleet-models", "GET", "/v1/models").status == 401
    assert (
        send(front, "fleet-models", "POST", "/v1/chat/completions", body=COMPLETION).status == 401
    )


# --- prefix affinity ----------------------------------------------------------------------


def prompted(prompt: str) -> bytes:
    return json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 4}).encode()


def chatted(messages: list[dict]) -> bytes:
    return json.dumps({"model": MODEL, "messages": messages}).encode()


def instance_of(front: FrontDoors, body: bytes, held: float = 0) -> str:
    """The instance of the door balancing by prefix that BODY's completion reached. After
    an answer HAProxy counts the request on its instance a moment longer: the next one,
    sent at once, could find that instance over the load bound (one in flight is more than
    half again the average of none) and go to the next. A sequential request waits it out."""
    headers = bearer(KEY) | ({"X-Delay": str(held)} if held else {})
    outcome = send(front, "host-prefix", "POST", "/v1/completions", headers, body)
    assert outcome.status == 200 and len(outcome.reached) == 1, outcome
    if not held:
        time.sleep(0.02)
    return outcome.reached[0].instance


def usual_instance(front: FrontDoors, body: bytes) -> str:
    """The instance most of three of BODY's completions reached (one the load bound sent
    on is outvoted)."""
    reached = [instance_of(front, body) for _ in range(3)]
    return max(set(reached), key=reached.count)


# Prompts that share nothing within the door's PREFIX_BYTES.
DISTINCT = [f"{n:02d} " + "x" * PREFIX_BYTES for n in range(24)]


def test_a_door_balancing_by_prefix_keeps_a_prompts_prefix_on_one_instance(front):
    # Completions about one document (its first PREFIX_BYTES the same, each question its
    # own) reach one instance; a conversation growing turn by turn stays on its instance;
    # prompts with other beginnings spread over all three.
    document = "D" * PREFIX_BYTES
    assert len({instance_of(front, prompted(f"{document} question {n}")) for n in range(8)}) == 1
    system = {"role": "system", "content": "You answer in one line."}
    turns: list[dict] = [system, {"role": "user", "content": "What is NUMA?"}]
    seen = set()
    for n in range(5):
        seen.add(instance_of(front, chatted(turns)))
        turns += [
            {"role": "assistant", "content": f"answer {n}"},
            {"role": "user", "content": "and?"},
        ]
    assert len(seen) == 1, seen
    # Two conversations under one system prompt are two keys: they spread too.
    opened = {
        instance_of(front, chatted([system, {"role": "user", "content": p}])) for p in DISTINCT
    }
    assert opened == set(PREFIX_INSTANCES)
    assert {instance_of(front, prompted(prompt)) for prompt in DISTINCT} == set(PREFIX_INSTANCES)


def test_a_hot_prefix_spreads_once_its_instance_holds_more_than_its_share(front):
    # Nine requests of one prefix at once, each held a second: its instance takes its share
    # and more (half again the average), the rest go to the next instances, none waits
    # behind a full one while the others idle.
    reached: list[str] = []

    def one() -> None:
        reached.append(instance_of(front, prompted("H" * PREFIX_BYTES), held=1))

    threads = [threading.Thread(target=one) for _ in range(9)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    counts = sorted((reached.count(name) for name in set(reached)), reverse=True)
    assert len(reached) == 9 and len(counts) > 1 and counts[0] < 9, counts


def test_an_instance_leaving_moves_only_the_prefixes_it_had(front):
    # Consistent hashing: with one instance out (a rolling restart drains it), the prefixes
    # of the other two stay where they were, cached; only the leaving one's move.
    before = {prompt: usual_instance(front, prompted(prompt)) for prompt in DISTINCT}
    gone = before[DISTINCT[0]]
    admin_socket = str(front.directory / "host-prefix.sock")

    def state(value: str) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as admin:
            admin.connect(admin_socket)
            admin.sendall(f"set server vllm_instances/{gone} state {value}\n".encode())
            admin.recv(4096)

    state("maint")
    try:
        after = {prompt: usual_instance(front, prompted(prompt)) for prompt in DISTINCT}
    finally:
        state("ready")
    assert gone not in after.values()
    assert {p: i for p, i in after.items() if before[p] != gone} == {
        p: i for p, i in before.items() if i != gone
    }


def test_the_fleet_door_balancing_by_prefix_keeps_a_prefix_on_one_host(front):
    def host_of(prompt: str) -> str:
        answered = front.big.answered
        outcome = send(
            front, "fleet-prefix", "POST", "/v1/completions", bearer(KEY), prompted(prompt)
        )
        assert outcome.status == 200, outcome
        return "host1" if outcome.reached else "big" if front.big.answered > answered else "none"

    assert len({host_of("F" * PREFIX_BYTES + f" {n}") for n in range(6)}) == 1
    assert {host_of(prompt) for prompt in DISTINCT} == {"host1", "big"}
