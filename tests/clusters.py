"""A cluster of lab machines for the cluster lab modules, in a lab of their own (`cluster`,
beside the other test worker's lab): its inventory (cluster1 heads cluster `a`),
deploy.yml on some of its machines, and what a user reads from it: a completion through
the front door and the front door's view of the head."""

from __future__ import annotations

import http.client
import json
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from socketwise.lab import machines as lab
from socketwise.lab.common import api_key_path, default_inventory_dir

from . import frontdoor
from .labs import fresh_lab, named_lab, run_on
from .playbooks import REPO, PlaybookRun, run_playbook

LAB = "cluster"
HEAD, PORT, API_PORT, RPC_PORT = f"{LAB}1", 8000, 8001, 50052
HEAD_UNIT, LB_UNIT = "socketwise-llamacpp.service", "socketwise-cluster-lb.service"
RPC_UNIT = "socketwise-rpc-node0.service"
GREEDY = {"model": "tiny-llama", "prompt": "socketwise says hello", "max_tokens": 12,
          "temperature": 0}  # fmt: skip
# A host outside the cluster: the lab's machines share one network, so a test plays one
# by binding its socket to an address no member has. Its processes are no member's local
# users, whom every member's table also resets (the lab's machines share one ruleset):
# the test knocks as the engines' group (`knock`'s GROUP) to see the members' filter of
# sources alone.
STRANGER = "127.0.0.250"
# A monitor host of the inventory's, which no deploy reaches: the metrics doors take its
# address and the lab's extra source (127.0.0.1) alone.
WATCHER, WATCHER_ADDRESS = "watcher", "127.0.0.249"
# A local user's group that is not the engines' (nogroup).
NOBODY = 65534


def knock(address: str, port: int, source: str, group: int | None = None) -> str:
    """ "connected", or the error's name, for a TCP connection to ADDRESS:PORT made from
    SOURCE, then closed; by a process of GROUP when given (the lab's machines share the
    controller's users and groups: a member's engines group is a number here too), else by
    the test's own (root's)."""
    if group is not None:
        code = "import os, sys; os.setegid(int(sys.argv[1])); from tests.clusters import knock; "
        code += "print(knock(sys.argv[2], int(sys.argv[3]), sys.argv[4]))"
        argv = [sys.executable, "-c", code, str(group), address, str(port), source]
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=True)
        return done.stdout.strip()
    with socket.socket() as probe:
        probe.bind((source, 0))
        probe.settimeout(3)
        try:
            probe.connect((address, port))
        except OSError as error:
            return type(error).__name__
        return "connected"


def engines_group(cluster: Cluster, host: str) -> int:
    """The number of HOST's engines group, which alone reaches engine ports from there."""
    return int(cluster.on(host, "getent group socketwise-engines").split(":")[2])


# The head engine's API: a Unix socket, no TCP port (the cluster role's __cluster_api_socket).
API_SOCKET = "/run/socketwise-cluster/api.sock"
# POST /invocations (vLLM's route outside its key check) on that socket, with no key, as
# the user and groups setpriv is given: the HTTP status, or the error's name.
INVOKE = (
    "import http.client, json, socket, sys\n"
    "class C(http.client.HTTPConnection):\n"
    "    def connect(self):\n"
    "        self.sock = socket.socket(socket.AF_UNIX); self.sock.connect(sys.argv[1])\n"
    "c = C('localhost', timeout=60)\n"
    "try:\n"
    "    c.request('POST', '/invocations', json.dumps({'prompt': 'hi', 'max_tokens': 1}),\n"
    "              {'Content-Type': 'application/json'}); print(c.getresponse().status)\n"
    "except OSError as error:\n"
    "    print(type(error).__name__)\n"
)


# setpriv's options for a local user that is not the door: no group but nogroup.
NOT_THE_DOOR = ("--reuid=nobody", "--regid=nogroup", "--clear-groups")


def invoke_api(cluster: Cluster, host: str, *who: str) -> str:
    """What a keyless POST /invocations on HOST's engine socket gives a process run as
    WHO (setpriv's options; none: root)."""
    argv = (
        ["setpriv", *who, "python3", "-c", INVOKE, API_SOCKET]
        if who
        else ["python3", "-c", INVOKE, API_SOCKET]
    )
    return cluster.on(host, shlex.join(argv))


def table(host: str) -> str:
    """The nftables table the cluster role names for HOST."""
    return f"socketwise_cluster_{host}"


def controller_tables() -> list[str]:
    """The kit's tables in the network namespace the lab's machines share: each member's
    cluster table and, monitored, its metrics door's."""
    listed = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=True)
    lines = listed.stdout.splitlines()
    return [line.split()[-1] for line in lines if re.search("socketwise_(cluster|metrics)_", line)]


def tables_of(hosts: list[str]) -> list[str]:
    """The kit's tables of HOSTS left in the shared network namespace."""
    return [t for t in controller_tables() if t.rsplit("_", 1)[-1] in hosts]


@dataclass
class Cluster:
    machines: dict[str, lab.Machine]
    work: Path
    key: str
    engine: str = "llamacpp"
    extra_vars: str = ""  # more YAML lines of cluster `a`'s vars
    # Whether the inventory has a monitor host (WATCHER, outside the lab: no deploy
    # reaches it), so that every member serves its metrics door.
    monitored: bool = False

    def inventory(self, members: list[str]) -> Path:
        """The lab inventory with MEMBERS in cluster `a`, headed by cluster1."""
        committed = REPO / "inventories" / "lab" / "group_vars" / "lab.yml"
        inventory = self.work / "inventory"
        (inventory / "group_vars").mkdir(parents=True, exist_ok=True)
        (inventory / "group_vars" / "lab.yml").write_text(committed.read_text())
        hosts = (default_inventory_dir() / "hosts.yml").read_text() + (
            "    cluster_a:\n      hosts:\n"
            + "".join(f"        {name}:\n" for name in members)
            + "      vars:\n        socketwise_cluster: a\n"
            f"        socketwise_cluster_head: {HEAD}\n        socketwise_engine: {self.engine}\n"
            + self.extra_vars
        )
        if self.monitored:
            hosts += f"    socketwise_monitor:\n      hosts:\n        {WATCHER}:\n"
            hosts += f"          ansible_host: {WATCHER_ADDRESS}\n"
        (inventory / "hosts.yml").write_text(hosts)
        return inventory / "hosts.yml"

    def deploy(self, members: list[str], *extra: str) -> PlaybookRun:
        """deploy.yml on MEMBERS, which form cluster `a` (other lab machines are left out
        with --limit)."""
        return run_playbook(
            "deploy.yml", "-i", str(self.inventory(members)), "--limit", ",".join(members),
            *extra, env={"SOCKETWISE_ARTIFACTS": str(self.work / "artifacts")},
        )  # fmt: skip

    def deployed(self, members: list[str], *extra: str) -> PlaybookRun:
        """deploy.yml on MEMBERS, which must succeed."""
        done = self.deploy(members, *extra)
        assert done.returncode == 0, done.output[-4000:]
        return done

    def on(self, host: str, command: str) -> str:
        return run_on(self.machines[host], command)

    def summary(self) -> dict:
        return json.loads((self.work / "artifacts" / HEAD / "cluster-summary.json").read_text())

    def listening(self, host: str, pids: set[str]) -> list[tuple[str, int]]:
        """(address, port) of every TCP socket that one of the processes PIDS listens on."""
        found = []
        for line in self.on(host, "ss -Htlnp").splitlines():
            if set(re.findall(r"pid=(\d+)", line)) & pids:
                address, port = line.split()[3].rsplit(":", 1)
                found.append((address.strip("[]").removeprefix("::ffff:"), int(port)))
        return sorted(found)

    def address(self, host: str) -> str:
        return self.machines[host].address

    def cluster_address(self, host: str) -> str:
        """HOST's address on the cluster's network (the lab's backend address, 127.1.N.K)."""
        return self.address(host).replace("127.0.", "127.1.")

    def removed(self, members: list[str]) -> None:
        """deploy.yml with vllm_service_state=absent on MEMBERS: it succeeds, no socketwise
        unit is left on any of them, and the head's front door is gone."""
        done = self.deploy(members, "-e", "vllm_service_state=absent")
        assert done.returncode == 0, done.output[-3000:]
        for host in members:
            assert self.on(host, "ls /etc/systemd/system | grep -c '^socketwise-' || true") == "0"
        assert not frontdoor.answers(self.address(HEAD), PORT)

    def completion(self, body: dict | None = None) -> tuple[int, dict]:
        """(status, answer) of one completion through the front door; 0 when it broke off."""
        try:
            status, raw = frontdoor.call(
                self.address(HEAD), PORT, "/v1/completions", self.key, body or GREEDY
            )
        except (OSError, http.client.HTTPException) as exc:
            return 0, {"error": str(exc)}
        return status, (json.loads(raw) if status == 200 else {"raw": raw[:200]})

    def door_status(self) -> str:
        """The front door's own view of the head (its runtime API): UP, DOWN, ..."""
        reader = (
            "import socket; s = socket.socket(socket.AF_UNIX); "
            "s.connect('/run/socketwise-cluster-lb/admin.sock'); s.sendall(b'show stat\\n'); "
            "print(b''.join(iter(lambda: s.recv(65536), b'')).decode())"
        )
        lines = self.on(HEAD, f'python3 -c "{reader}"').splitlines()
        header = lines[0].lstrip("# ").split(",")
        rows = [dict(zip(header, line.split(","), strict=False)) for line in lines[1:] if line]
        return next(r["status"] for r in rows if r["pxname"] == "cluster" and r["svname"] == "head")

    def wait_for(self, what: str, check, timeout: float = 90) -> float:
        """Seconds until check() is true; fails with WHAT after TIMEOUT."""
        started = time.monotonic()
        while not check():
            assert time.monotonic() - started < timeout, f"not within {timeout} s: {what}"
            time.sleep(1)
        return time.monotonic() - started


# Debian's nftables.service on a member, with a configuration that removes the member's
# table alone and a stop that does the same: its own flush ruleset would also remove the
# tables of the other members and of the other test worker's lab, which share this one
# network. What systemd runs after it (the kit's drop-in) is the host's own.
NFTABLES_CONF = "table inet {table}\ndelete table inet {table}\n"
NFTABLES_STOP = "[Service]\nExecStop=\nExecStop=/usr/sbin/nft -f /etc/nftables.conf\n"


def assert_filter_survives_the_firewall_service(cluster: Cluster, host: str, port: int) -> None:
    """HOST's firewall service started, reloaded and stopped, each removing HOST's table:
    the table is back within seconds each time and PORT, an engine port HOST listens on at
    its cluster address, resets a local process outside the engines' group."""
    address, engines = cluster.cluster_address(host), engines_group(cluster, HEAD)
    cluster.on(host, "cp -a /etc/nftables.conf /root/nftables.conf.kept")
    cluster.on(host, "mkdir -p /run/systemd/system/nftables.service.d")
    cluster.on(host, f"printf '{NFTABLES_STOP}' > /run/systemd/system/nftables.service.d/lab.conf")
    conf = NFTABLES_CONF.format(table=table(host))
    cluster.on(host, f"printf '{conf}' > /etc/nftables.conf && systemctl daemon-reload")
    try:
        for action in ("start", "reload", "stop"):
            cluster.on(host, f"systemctl {action} nftables.service")
            cluster.wait_for(
                f"{host}'s table back after nftables.service {action}",
                lambda: table(host) in tables_of([host]),
                timeout=15,
            )
            assert knock(address, port, STRANGER, engines) == "ConnectionRefusedError", action
    finally:
        cluster.on(
            host, "systemctl stop nftables.service; mv /root/nftables.conf.kept /etc/nftables.conf"
        )
        cluster.on(host, "rm -r /run/systemd/system/nftables.service.d; systemctl daemon-reload")


@contextmanager
def lab_cluster(tmp_path_factory, preinstalled: bool = False, **options) -> Iterator[Cluster]:
    """Three fresh lab machines as one Cluster (OPTIONS: engine, extra_vars, monitored), booted with
    CAP_NET_ADMIN for the cluster's nftables tables."""
    with (
        named_lab(LAB),
        fresh_lab(machines=3, preinstalled=preinstalled, net_admin=True) as machines,
    ):
        yield Cluster(
            {m.name: m for m in machines},
            tmp_path_factory.mktemp("cluster"),
            api_key_path().read_text().strip(),
            **options,
        )
