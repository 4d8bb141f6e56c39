"""Every unit the kit renders, scored by systemd's own sandbox review, without a lab.

Ansible's template module renders each unit kind in one run, from the roles' own
defaults, variables and filters, for plans the planners make of fixture hosts: a single
host's vLLM (SN, two DP instances, TP-2, two TP-4 replicas on GPUs, plain vLLM without the
plan's placement, and the image method on a real host and on an nspawn one), a vLLM
pipeline's head and follower, a llama.cpp cluster's head and RPC server, a hybrid MoE
llama-server on a GPU host, a host's and a cluster head's front door, and the fleet's.
Each must pass `systemd-analyze verify`, score at most 2.0 in `systemd-analyze security
--offline=true` (4.0 for the image method's, whose Podman runs as root; the scores are
printed: run pytest with -s), and carry the MemoryMax= and
TasksMax= that the sizing rule of docs/guides/security.md gives for its plan, worked out
here from the plan's numbers.

What stays in the lab: that the units start and serve under that sandbox and those limits
(tests/test_deploy_lab.py for the venv units, molecule/image for Podman's).
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

import pytest
import yaml

from socketwise.facts.topology import detect
from socketwise.plan.cluster import ClusterRequest, plan_cluster
from socketwise.plan.planner import PlanRequest, plan

from .machines import build_machine
from .playbooks import REPO, WRITE_RENDERED, render_task, run_playbook

pytestmark = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="needs systemd-analyze (systemd 252 or later)"
)

TEMPLATES = REPO / "templates"
ROLES = REPO / "roles"
# systemd-analyze security's overall exposure: the image method's units at most the
# first, every other unit at most the second.
MOST_EXPOSED = 4.0
LEAST_EXPOSED = 2.0
# The cluster's members and their private addresses.
MEMBERS = {"head": "10.0.0.1", "follower": "10.0.0.2"}
# A hybrid MoE server: the hybrid study's 2x EPYC 9554 with one 48 GB GPU, alone in its
# cluster, serving DeepSeek-R1 at Q4_K_M (404 GB, 392 of them routed experts in layers 3-60).
HYBRID_HOST = ("gpu", "10.0.0.3")
DEEPSEEK = {"model_gb": 404, "layers": 61, "expert_gb": 392, "dense_layers": 3}
EPHEMERAL = (32768, 60999)
# The port_filter role's templates: the cluster's filter of engine ports and the unit that
# loads it, with its fixed cap; a monitored host's filter of its metrics door; and the
# drop-in that has the host's nftables.service load them again after it flushes.
FIREWALL = [
    ("port-filter.nft.j2", "firewall.nft"),
    ("socketwise-port-filter.service.j2", "socketwise-cluster-firewall.service"),
]
FIREWALL_CAP = ("256M", "16")
METRICS_FIREWALL = [
    ("port-filter.nft.j2", "metrics-firewall.nft"),
    ("socketwise-port-filter.service.j2", "socketwise-metrics-firewall.service"),
]
NFTABLES_DROPIN = ("nftables-socketwise.conf.j2", "nftables-socketwise.conf")
# The node exporter's unit, with its fixed cap.
EXPORTER = "socketwise-node-exporter.service"
EXPORTER_CAP = ("256M", "64")
# What a door's unit copies from root's files for HAProxy, at each start and reload.
DOOR_COPIES = ("client-keys", "scrape-keys", "frontdoor.pem", "fleet-client.pem")
# A door given a certificate (its path on the controller: the unit reads the host's copy).
TLS = {"credentials_tls_cert": "/controller/door.pem"}
# llama.cpp's cluster model, as socketwise.plan.modelfile.describe reports a GGUF: 32 layers
# of 8 KV heads of 128, f16 keys and values.
GGUF = {"path": "/var/cache/socketwise/models/m.gguf", "layers": 32, "gb": 40.0}
GGUF_KV_BYTES_PER_TOKEN = 32 * 8 * (128 + 128) * 2
# A lab machine: 2 cores, one node, the built-in tiny Llama (4M parameters, 16 MB).
LAB_TOPOLOGY = {
    "schema": 1,
    "nodes": [{"id": 0, "cores": [[0], [1]], "memory_mb": 24000}],
    "isa": {"avx2": True},
}
TINY_MODEL_GB = 0.016
# vLLM on CPU: about 3 GB of RSS serving the tiny model (docs/guides/security.md).
VLLM_IDLE_GIB = 3


@dataclass
class Limits:
    """MemoryMax= (GiB) and TasksMax= by the rule of docs/guides/security.md: twice the
    weights, the KV cache and 2 GiB per process; a thread per bound CPU and, per process,
    512 tasks and 4 per CPU it may use."""

    weights_gb: float
    cache_gb: float
    processes: int
    threads: int
    cpus: int

    @property
    def memory_gib(self) -> int:
        return math.ceil(2 * self.weights_gb + self.cache_gb + 2 * self.processes)

    @property
    def tasks(self) -> int:
        return self.threads + self.processes * (512 + 4 * self.cpus)


def vllm(weights_per_rank: float, placement: dict, cpus: int) -> Limits:
    """A vLLM instance or stage: its API server, engine core and a worker per rank."""
    ranks = placement["ranks"]
    return Limits(
        weights_per_rank * len(ranks),
        placement["kvcache_gb"] * len(ranks),
        2 + len(ranks),
        sum(len(rank["cpus"]) for rank in ranks),
        cpus,
    )


def llamacpp(cluster: dict, layers: int, threads: int, cpus: int) -> Limits:
    defaults = yaml.safe_load((ROLES / "cluster/defaults/main.yml").read_text())
    tokens = defaults["cluster_ctx_size"] * defaults["cluster_parallel"]
    share = layers / cluster["model_layers"]
    kv = GGUF_KV_BYTES_PER_TOKEN * tokens * share / 2**30
    return Limits(cluster["model_gb"] * share, kv, 1, threads, cpus)


def logical_cpus(topology: dict) -> int:
    return sum(len(core) for node in topology["nodes"] for core in node["cores"])


@dataclass
class Rendered:
    units: dict[str, Path]
    expected: dict[str, Limits | tuple[str, str] | None]  # None: a front door's fixed cap
    directory: Path


def _task_vars(tasks_file: str, name: str) -> dict:
    """The vars: of the task NAME in a role's tasks file: the test renders with them too."""
    tasks = yaml.safe_load((REPO / tasks_file).read_text())
    # A block's tasks too.
    tasks += [inner for task in tasks for inner in task.get("block", [])]
    return next(task for task in tasks if task.get("name") == name).get("vars", {})


def _task(dest: str, template: str, host: str, task_vars: dict, loop: dict | None = None):
    rendering = render_task(
        f"Render {template} on {host} as {dest}",
        str(TEMPLATES / template),
        "{{ __test_dir }}/" + dest,
        task_vars,
    )
    return rendering | {"when": f"inventory_hostname == '{host}'"} | (loop or {})


def dgx_with_minors_reversed(directory: Path) -> dict:
    """The 8-GPU fixture, its driver having numbered the GPUs against bus order (7 to 0):
    CUDA's numbers and the device nodes then differ."""
    topology = detect(build_machine("dgx-h100", directory / "dgx-h100"))
    for gpu in topology["gpus"]:
        gpu["minor"] = 7 - gpu["minor"]
    return topology


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Rendered:
    """Every unit kind through Ansible's template engine in one run, as the roles render
    them: the vllm, door, vllm_service, fleet_door and cluster roles' defaults/main.yml and
    vars/main.yml, their filters, and the vars of the role's own task where it has any. The
    test gives the plans, the facts earlier plays publish, and the addresses."""
    directory = tmp_path_factory.mktemp("units")
    r730 = detect(build_machine("r730", directory / "r730"))
    vm = detect(build_machine("vm", directory / "vm"))
    members = [(name, vm) for name in MEMBERS]
    plans = {
        "sn": plan(r730, PlanRequest(layout="sn", model_gb=8)),
        "dp": plan(r730, PlanRequest(layout="dp", model_gb=8)),
        "tp": plan(r730, PlanRequest(layout="tp", model_gb=8)),
        "lab": plan(LAB_TOPOLOGY, PlanRequest(layout="sn", model_gb=TINY_MODEL_GB)),
        # 200 GB on an 8-GPU H100 server: two TP-4 replicas, one on each node's GPUs.
        "gpu": plan(dgx_with_minors_reversed(directory), PlanRequest(device="gpu", model_gb=200)),
    }
    pp = plan_cluster(members, ClusterRequest(model_gb=20, layers=32))
    llama = plan_cluster(
        members, ClusterRequest(model_gb=GGUF["gb"], layers=GGUF["layers"], engine="llamacpp")
    )
    gpu_host = detect(build_machine("hybrid-9554", directory / "hybrid-9554"))
    hybrid = plan_cluster(
        [(HYBRID_HOST[0], gpu_host)],
        ClusterRequest(engine="llamacpp", layout="hybrid", **DEEPSEEK),
    )
    sn = plans["sn"]
    values = {
        "__test_dir": str(directory),
        "socketwise_plan": sn,
        "socketwise_build": sn["build"],
        "vllm_model": "/opt/socketwise/models/tiny-llama-0123456789ab",
        "vllm_served_name": "tiny-llama",
        "credentials_api_key": "sk-" + "k" * 32,
        "credentials_client_key": "sk-" + "k" * 32,
        "credentials_client_keys": ["sk-" + "k" * 32],
        # As the credentials role's check publishes it in play 1.
        "credentials_door": "{{ __credentials_door }}",
        # Facts of the vllm role's prepare and main tasks.
        "vllm_build": {"id": "0123456789ab"},
        "vllm_paths": {"home": "{{ vllm_home }}", "venv": "{{ vllm_venv }}"},
        "vllm_engine": {
            "method": "{{ vllm_install_method }}",
            "user": "{{ vllm_user }}",
            "hf_id": "{{ vllm_model_hf_id }}",
            "container_cgroups": "{{ vllm_container_cgroups | bool }}",
        },
        "vllm_user_uid": 998,
        "__vllm_service_engine_group_made": {"gid": ENGINE_GID},
        "__cluster_engine_group_made": {"gid": ENGINE_GID},
        "vllm_image": {"tag": "localhost/socketwise-vllm:avx2-0123456789ab"},
        # Facts of the cluster role's check and llamacpp tasks.
        "socketwise_cluster": "c1",
        "socketwise_cluster_head": "head",
        "__cluster_build": {"id": "fedcba987654"},
        "__cluster_model_info": GGUF | {"kv_bytes_per_token": GGUF_KV_BYTES_PER_TOKEN},
        # What check.yml read on the members: root may load nftables, and the kernel's
        # ephemeral port range.
        "port_filter_nftables": True,
        "__cluster_ephemeral": list(EPHEMERAL),
    }
    (directory / "values.json").write_text(json.dumps(values))
    addresses = {
        name: {"socketwise_cluster_address": a} for name, a in [*MEMBERS.items(), HYBRID_HOST]
    }
    local = {
        "ansible_connection": "local",
        "ansible_python_interpreter": "{{ ansible_playbook_python }}",
    }
    inventory = {"all": {"hosts": {"single": {}} | addresses, "vars": local}}
    (directory / "inventory.yml").write_text(json.dumps(inventory))

    expected: dict[str, Limits | tuple[str, str] | None] = {}
    tasks = []
    # (prefix, plan, extra vars, the CPUs its processes may use, or None: the plan's)
    image = {"vllm_install_method": "image"}
    nspawn = image | {"vllm_container_cgroups": False}
    # preflight.yml's answer on a host whose root holds CAP_NET_ADMIN.
    net_admin = {"__vllm_service_port_owners": {"net_admin": True}}
    singles = [
        ("", "sn", {}, None),
        ("private-", "sn", net_admin, None),
        ("gpu-private-", "gpu", net_admin, None),
        ("image-private-", "sn", image | net_admin, None),
        ("private-hub-", "sn", net_admin | {"vllm_model_hf_id": "org/model"}, None),
        ("", "dp", {}, None),
        ("", "tp", {}, None),
        ("lab-", "lab", {}, None),
        ("gpu-", "gpu", {}, None),
        ("plain-", "sn", {"vllm_service_placement": "vllm"}, logical_cpus(r730)),
        ("image-", "sn", image, None),
        ("image-nspawn-", "sn", nspawn, None),
        ("image-nspawn-hub-", "sn", nspawn | {"vllm_model_hf_id": "org/model"}, None),
    ]
    for prefix, layout, extra, cpus in singles:
        planned = plans[layout]
        tasks.append(
            _task(
                f"{prefix}socketwise-{{{{ instance.name }}}}.service",
                "vllm.service.j2",
                "single",
                {"socketwise_plan": planned} | extra,
                {"loop": planned["instances"], "loop_control": {"loop_var": "instance"}},
            )
        )
        for instance in planned["instances"]:
            weights = planned["model_gb"] / instance["tp"]
            allowed = cpus or len(instance["cpus_allowed"])
            expected[f"{prefix}socketwise-{instance['name']}.service"] = vllm(
                weights, instance, allowed
            )
    # The port_filter role's variables as the cluster and a monitored host give them.
    cluster_filter = _task_vars(
        "roles/cluster/tasks/main.yml", "Keep this host's engine ports to the members"
    ) | {"socketwise_cluster_plan": pp}
    for host in MEMBERS:
        name = f"{host}-socketwise-pp-vllm.service"
        tasks.append(_task(name, "vllm-pp.service.j2", host, {"socketwise_cluster_plan": pp}))
        for template, dest in FIREWALL:
            tasks.append(_task(f"{host}-{dest}", template, host, cluster_filter))
        expected[f"{host}-{FIREWALL[1][1]}"] = FIREWALL_CAP
        entry = next(e for e in pp["hosts"] if e["host"] == host)
        stage = entry["stage"]
        weights = entry["weights_gb"] / len(stage["ranks"])
        expected[name] = vllm(weights, stage, len(stage["cpus_allowed"]))
    engine = {"socketwise_engine": "llamacpp", "socketwise_cluster_plan": llama}
    head = next(e for e in llama["hosts"] if e["host"] == "head")
    name = "head-socketwise-llamacpp.service"
    tasks.append(_task(name, "llamacpp-server.service.j2", "head", engine))
    cpus = len(head["stage"]["cpus_allowed"])
    expected[name] = llamacpp(llama, head["layers"]["count"], cpus, cpus)
    tasks.append(
        _task(
            "follower-socketwise-rpc-node{{ server.node }}.service",
            "llamacpp-rpc.service.j2",
            "follower",
            engine,
            {"loop": "{{ __cluster_me.rpc_servers }}", "loop_control": {"loop_var": "server"}},
        )
    )
    follower = next(e for e in llama["hosts"] if e["host"] == "follower")
    for server in follower["rpc_servers"]:
        expected[f"follower-socketwise-rpc-node{server['node']}.service"] = llamacpp(
            llama, server["layers"], server["threads"], len(server["cpus"])
        )
    name = "gpu-socketwise-llamacpp.service"
    tasks.append(
        _task(name, "llamacpp-server.service.j2", HYBRID_HOST[0], engine | {
            "socketwise_cluster_plan": hybrid, "socketwise_cluster_head": HYBRID_HOST[0]})
    )  # fmt: skip
    cpus = len(hybrid["hybrid"]["cpus_allowed"])
    expected[name] = llamacpp(hybrid, DEEPSEEK["layers"], cpus, cpus)
    # The door role's host entry point, given what vllm_service gives it.
    host_door = _task_vars("roles/door/tasks/host.yml", "Render the host's door's unit") | (
        _task_vars(
            "roles/vllm_service/tasks/render.yml", "Render the host's door over the instances"
        )
    )
    # The door role's cluster entry point, given what the cluster role gives it on the head
    # (its front door) and on a member (its metrics door).
    cluster_door = _task_vars("roles/door/tasks/cluster.yml", "Render the cluster's door's unit")
    cluster_lb = cluster_door | _task_vars(
        "roles/cluster/tasks/frontdoor.yml", "Render the front door's configuration and unit"
    )
    metrics_door = cluster_door | _task_vars(
        "roles/cluster/tasks/metrics.yml", "Render the metrics door's configuration and unit"
    )
    # The head's metrics door, which its follower's address (a monitor's) may reach.
    monitored = {"door_metrics_address": MEMBERS["head"],
                 "__door_metrics_sources": [MEMBERS["follower"]]}  # fmt: skip
    metrics_filter = (
        _task_vars(
            "roles/door/tasks/metrics.yml",
            "Keep the metrics door to the monitor hosts in the kernel too",
        )
        | monitored
    )
    for template, dest in METRICS_FIREWALL:
        tasks.append(_task(f"head-{dest}", template, "head", metrics_filter))
    tasks.append(_task(NFTABLES_DROPIN[1], NFTABLES_DROPIN[0], "head", metrics_filter))
    expected[f"head-{METRICS_FIREWALL[1][1]}"] = FIREWALL_CAP
    # A monitored host's node exporter, on the address the door role gives it.
    exporter = _task_vars(
        "roles/door/tasks/metrics.yml", "Serve the node exporter on the backend address"
    )
    tasks.append(_task(EXPORTER, "socketwise-node-exporter.service.j2", "single", exporter))
    expected[EXPORTER] = EXPORTER_CAP
    tasks += [
        _task("socketwise-lb.service", "socketwise-lb.service.j2", "single", host_door),
        _task("socketwise-fleet.service", "socketwise-fleet.service.j2", "single", {}),
        # TLS doors, the fleet's showing hosts' TLS doors its client certificate.
        _task("tls-socketwise-lb.service", "socketwise-lb.service.j2", "single", TLS | host_door),
        _task("tls-socketwise-fleet.service", "socketwise-fleet.service.j2", "single",
              TLS | {"__fleet_door_client": True}),
        _task("head-socketwise-cluster-lb.service", "socketwise-lb.service.j2", "head",
              {"socketwise_cluster_plan": pp} | cluster_lb),
        # A monitored head's, and a monitored member's metrics door alone.
        _task("monitored-head-socketwise-cluster-lb.service", "socketwise-lb.service.j2", "head",
              {"socketwise_cluster_plan": pp} | cluster_lb | {"__door_monitored": True}),
        _task("follower-socketwise-cluster-lb.service", "socketwise-lb.service.j2", "follower",
              {"socketwise_cluster_plan": pp} | metrics_door),
    ]  # fmt: skip
    expected |= dict.fromkeys(
        ["socketwise-lb.service", "socketwise-fleet.service", "head-socketwise-cluster-lb.service",
         "tls-socketwise-lb.service", "tls-socketwise-fleet.service",
         "monitored-head-socketwise-cluster-lb.service", "follower-socketwise-cluster-lb.service"]
    )  # fmt: skip

    play = {
        "name": "Render every unit kind",
        "hosts": "all",
        "gather_facts": False,
        "vars_files": [
            str(ROLES / role / kind / "main.yml")
            for role in (
                "vllm",
                "door",
                "vllm_service",
                "credentials",
                "fleet_door",
                "cluster",
                "port_filter",
                "node_exporter",
            )
            for kind in ("defaults", "vars")
        ]
        + [str(directory / "values.json")],
        "tasks": [*tasks, WRITE_RENDERED],
    }
    (directory / "render.yml").write_text(json.dumps([play]))
    run = run_playbook(
        str(directory / "render.yml"),
        *("-i", str(directory / "inventory.yml")),
    )
    assert run.returncode == 0, run.output[-4000:]
    units = {path.name: path for path in sorted(directory.glob("*.service"))}
    assert sorted(units) == sorted(expected)
    return Rendered(units, expected, directory)


def exposure(unit: Path) -> float:
    """`systemd-analyze security`'s overall exposure of the unit file (0 safest, 10 worst)."""
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
    )
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", done.stdout)
    assert found, f"{unit.name}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return float(found.group(1))


def setting(unit: Path, key: str) -> str:
    values = re.findall(rf"^{key}=(.*)$", unit.read_text(), re.MULTILINE)
    assert len(values) == 1, f"{unit.name}: {key}= {values}"
    return values[0]


def test_every_unit_scores_at_most_2_in_systemds_sandbox_review_and_an_image_unit_4(rendered):
    scores = {name: exposure(unit) for name, unit in rendered.units.items()}
    print("\nsystemd-analyze security --offline=true (0 safest, 10 worst):")
    for name, score in scores.items():
        print(f"  {score:4.1f}  {name}")
    # Podman runs as root and sandboxes the server itself: systemd sees less of it.
    most = {name: MOST_EXPOSED if name.startswith("image-") else LEAST_EXPOSED for name in scores}
    assert {name: s for name, s in scores.items() if s > most[name]} == {}


# What the sandbox of every unit promises, per directive, as `systemd-analyze security
# --json` names each: set, never weakened (a total score under the bar hides one).
CAPABILITIES_DROPPED = tuple(
    f"CapabilityBoundingSet_{cap}"
    for cap in (
        "CAP_AUDIT", "CAP_BLOCK_SUSPEND", "CAP_BPF", "CAP_IPC_LOCK", "CAP_LEASE",
        "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE_BROADCAST_RAW)", "CAP_SYSLOG",
        "CAP_SYS_BOOT", "CAP_SYS_CHROOT", "CAP_SYS_MODULE", "CAP_SYS_PACCT", "CAP_SYS_PTRACE",
        "CAP_SYS_RAWIO", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_WAKE_ALARM",
    )
)  # fmt: skip
EVERY_UNIT = (
    *CAPABILITIES_DROPPED,
    "AmbientCapabilities", "Delegate", "KeyringMode", "LockPersonality", "NoNewPrivileges",
    "NotifyAccess", "ProtectClock", "ProtectHostname", "ProtectKernelLogs",
    "ProtectKernelModules", "ProtectKernelTunables", "RestrictAddressFamilies_AF_PACKET",
    "RestrictAddressFamilies_OTHER", "RestrictNamespaces_cgroup", "RestrictNamespaces_ipc",
    "RestrictNamespaces_net", "RestrictNamespaces_user", "RestrictNamespaces_uts",
    "RestrictRealtime", "SystemCallArchitectures", "SystemCallFilter_clock",
    "SystemCallFilter_cpu_emulation", "SystemCallFilter_debug", "SystemCallFilter_module",
    "SystemCallFilter_obsolete", "SystemCallFilter_raw_io", "SystemCallFilter_reboot",
    "SystemCallFilter_swap",
)  # fmt: skip
# Every unit but the image method's (Podman runs as root and mounts): templates/hardening.j2.
EVERY_UNPRIVILEGED = tuple(
    f"CapabilityBoundingSet_{cap}"
    for cap in (
        "CAP_CHOWN_FSETID_SETFCAP", "CAP_DAC_FOWNER_IPC_OWNER", "CAP_KILL", "CAP_MAC",
        "CAP_MKNOD", "CAP_SET_UID_GID_PCAP", "CAP_SYS_ADMIN", "CAP_SYS_NICE_RESOURCE",
    )
) + (
    "ProtectControlGroups", "ProtectProc", "RestrictNamespaces_mnt", "RestrictNamespaces_pid",
    "RestrictSUIDSGID", "SystemCallFilter_mount", "SystemCallFilter_privileged",
)  # fmt: skip
# Every server (not the filters' oneshot units, which load nftables as root before any).
EVERY_SERVER = (
    "ProtectSystem", "ProtectHome", "PrivateTmp", "CapabilityBoundingSet_CAP_NET_ADMIN",
)  # fmt: skip
# Every server that is not Podman: its own user, and no IPC objects left behind.
EVERY_UNPRIVILEGED_SERVER = ("UserOrDynamicUser", "RemoveIPC")


def assessed(unit: Path) -> dict[str, dict]:
    """`systemd-analyze security --offline=true --json=short`: each directive's entry."""
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--json=short", "--no-pager", str(unit)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return {entry["json_field"]: entry for entry in json.loads(done.stdout)}


def test_every_directive_of_the_sandbox_holds_in_every_unit_it_promises(rendered):
    """Each directive the kit promises, assessed by systemd one at a time: weakening any one
    (ProtectSystem=strict to full, a capability kept, a namespace allowed) fails here even
    where the unit's total score stays under its bar."""
    weak = {}
    for name, unit in rendered.units.items():
        entries = assessed(unit)
        image = name.startswith("image-")
        server = "firewall" not in name
        promised = EVERY_UNIT + (() if image else EVERY_UNPRIVILEGED)
        promised += (EVERY_SERVER if server else ()) + (
            EVERY_UNPRIVILEGED_SERVER if server and not image else ()
        )
        # A GPU's server opens its planned devices (DeviceAllow=); every other, none.
        if server and not image and not setting_values(unit, "DeviceAllow"):
            promised += ("PrivateDevices",)
        missing = [field for field in promised if not entries[field]["set"]]
        # Files a unit makes are never other users': its last UMask= wins (an engine
        # that serves its API on a socket takes 0007: the door's group opens it).
        umask = int(setting_values(unit, "UMask")[-1], 8)
        api_socket = re.search(r"--uds |--host \S+\.sock ", unit.read_text())
        if umask & 0o007 != 0o007 or (umask & 0o070 != 0o070 and not api_socket):
            missing.append(f"UMask={umask:04o}")
        if server and "strict" not in entries["ProtectSystem"]["description"]:
            missing.append(f"ProtectSystem: {entries['ProtectSystem']['description']}")
        if missing:
            weak[name] = missing
    assert weak == {}


def test_every_server_comes_back_after_a_crash_and_a_door_or_instance_stops_at_its_limit(
    rendered,
):
    """A door that fails comes back, held at 5 starts a minute; an instance, at 5 starts in
    its limit's window (a long one: it loads a model); a cluster's stages come back
    always (a worker returns by itself, the head waits for it)."""
    wrong = {}
    for name, unit in rendered.units.items():
        if "firewall" in name:
            continue
        stage = any(kind in name for kind in ("pp-vllm", "rpc-node", "llamacpp"))
        restart = setting_values(unit, "Restart")
        if name == EXPORTER:
            # It comes back too, within systemd's own start limit (5 in 10 s).
            if restart != ["on-failure"] or setting_values(unit, "StartLimitBurst"):
                wrong[name] = restart
            continue
        interval = int(setting_values(unit, "StartLimitIntervalSec")[-1])
        burst = setting_values(unit, "StartLimitBurst")
        if stage:
            held = restart == ["always"]
        elif name.endswith(("-lb.service", "-fleet.service")):
            held = (restart, interval, burst) == (["on-failure"], 60, ["5"])
        else:
            held = restart == ["on-failure"] and interval > 60 and burst == ["5"]
        if not held:
            wrong[name] = (restart, interval, burst)
    assert wrong == {}


def test_an_engine_stops_by_its_main_process_and_a_local_model_never_asks_the_hub(rendered):
    """vLLM stops cleanly on a SIGTERM to its main process alone (KillMode=mixed: the
    group would log EngineDeadError tracebacks, and KillMode=process would leave its
    workers to the SIGKILL); an engine serving a model from the host's disk is told the
    Hugging Face Hub is not there (HF_HUB_OFFLINE), one that fetches its model is not."""
    engines = {n: u for n, u in rendered.units.items() if "socketwise-vllm" in n or "pp-vllm" in n}
    assert len(engines) > 10
    wrong = {}
    for name, unit in engines.items():
        offline = "HF_HUB_OFFLINE=1" in setting_values(unit, "Environment")
        if setting_values(unit, "KillMode") != ["mixed"] or offline == ("hub" in name):
            wrong[name] = (setting_values(unit, "KillMode"), offline)
    assert wrong == {}


def setting_values(unit: Path, key: str) -> list[str]:
    return re.findall(rf"^{key}=(.*)$", unit.read_text(), re.MULTILINE)


def test_every_unit_passes_systemd_analyze_verify(rendered, tmp_path):
    # A cluster's servers require the filter's unit: systemd finds it where a deploy puts
    # it first, here a directory of its own before systemd's.
    firewall = FIREWALL[1][1]
    (tmp_path / firewall).write_bytes(rendered.units[f"head-{firewall}"].read_bytes())
    env = os.environ | {"SYSTEMD_UNIT_PATH": f"{tmp_path}:"}
    for name, unit in rendered.units.items():
        done = subprocess.run(
            ["systemd-analyze", "verify", f"{unit}:{name}"], capture_output=True, text=True, env=env
        )
        # The installs (venv, llama.cpp build) are not on this machine; nothing else may be
        # wrong.
        problems = [
            line
            for line in done.stderr.splitlines()
            if line.strip() and "/opt/socketwise/" not in line
        ]
        assert problems == [], name


def test_every_unit_is_limited_as_its_plan_says(rendered):
    print("\nMemoryMax / TasksMax:")
    for name, unit in rendered.units.items():
        memory, tasks = setting(unit, "MemoryMax"), setting(unit, "TasksMax")
        print(f"  {memory:>5} {tasks:>6}  {name}")
        rule = rendered.expected[name]
        if rule is None:
            # HAProxy holds no model: a fixed cap.
            assert (memory, tasks) == ("2G", "512"), name
        elif isinstance(rule, tuple):
            assert (memory, tasks) == rule, name
        else:
            assert (memory, tasks) == (f"{rule.memory_gib}G", str(rule.tasks)), name


def test_the_smallest_plan_leaves_vllm_room_to_run(rendered):
    # The lab's tiny model on 2 cores: its KV cache and vLLM's idle RSS, with room to spare.
    unit = rendered.units["lab-socketwise-vllm-sn.service"]
    memory = int(setting(unit, "MemoryMax").removesuffix("G"))
    kv = int(re.search(r"^Environment=VLLM_CPU_KVCACHE_SPACE=(\d+)$", unit.read_text(), re.M)[1])
    assert memory >= kv + VLLM_IDLE_GIB + 2, (memory, kv)


def test_the_image_methods_container_gets_the_same_limits(rendered):
    # A real host's container runs in its own cgroup: Podman gives it the unit's limits.
    for name in ("image-socketwise-vllm-sn.service", "image-nspawn-socketwise-vllm-sn.service"):
        unit = rendered.units[name]
        text = unit.read_text()
        memory, tasks = setting(unit, "MemoryMax"), setting(unit, "TasksMax")
        own_cgroup = f"--memory={memory} \\" in text and f"--pids-limit={tasks} \\" in text
        assert own_cgroup is ("--cgroups=disabled" not in text), name
        # Podman's storage and run state stay writable, the rest of the system does not.
        assert "ProtectSystem=strict" in text and "ReadWritePaths=/var/lib/containers /run" in text


# A member's engine ports as the test's new network namespace serves them: the head's
# rendezvous, a port from the ephemeral range (gloo's, vLLM's queues), and one the filter
# leaves to the host (the front door's).
SERVE_AND_KNOCK = r"""
import json, os, socket, sys
head, follower, stranger, ports = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
engines, others = int(os.environ["ENGINE_GID"]), [int(g) for g in os.environ["OTHER_GIDS"].split()]
listeners = []
for port in ports:
    listener = socket.socket()
    listener.bind((head, int(port)))
    listener.listen()
    listeners.append(listener)
seen = {}
for gid in (engines, *others):
    for source in (follower, head, stranger):
        for port in ports:
            # The group the socket was made with is the one nftables matches (meta skgid).
            os.setegid(gid)
            knock = socket.socket()
            os.setegid(0)
            knock.bind((source, 0))
            knock.settimeout(2)
            key = f"{source} {port}" + ("" if gid == engines else f" gid {gid}")
            try:
                knock.connect((head, int(port)))
                seen[key] = "connected"
            except OSError as error:
                seen[key] = type(error).__name__
            knock.close()
print(json.dumps(seen))
"""
# The engines' group on the rendered hosts (the cluster role's fact), another local user's
# group, and root's.
ENGINE_GID = 997
OTHER_GIDS = (4242, 0)


def test_a_door_copies_only_the_keys_its_role_writes(rendered):
    """A host's door copies the client keys and the monitors' scrape token (secrets.yml
    writes both); a cluster head's door only the client keys unless a host monitors it
    (its role writes scrape-keys only then: a copy of a missing file would stop the door
    from starting); a monitored member that is not the head only the scrape token, and
    reads no backend credential (its metrics door sends none)."""
    copied = {
        name: re.findall(r"^ExecStartPre=\+/usr/bin/install -m 0400 (\S+)", unit.read_text(), re.M)
        for name, unit in rendered.units.items()
        if name.endswith(("lb.service", "fleet.service"))
    }
    assert [Path(p).name for p in copied["socketwise-lb.service"]] == ["client-keys", "scrape-keys"]
    assert [Path(p).name for p in copied["socketwise-fleet.service"]] == [
        "client-keys", "scrape-keys"
    ]  # fmt: skip
    assert [Path(p).name for p in copied["head-socketwise-cluster-lb.service"]] == ["client-keys"]
    assert [Path(p).name for p in copied["monitored-head-socketwise-cluster-lb.service"]] == [
        "client-keys", "scrape-keys"
    ]  # fmt: skip
    assert [Path(p).name for p in copied["follower-socketwise-cluster-lb.service"]] == [
        "scrape-keys"
    ]
    follower = rendered.units["follower-socketwise-cluster-lb.service"].read_text()
    assert "EnvironmentFile" not in follower and "LoadCredential" not in follower


# The user a door's runtime directory belongs to (systemd's dynamic user, here nobody).
DOOR_USER = 65534


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, as systemd runs the + commands")
def test_no_door_hands_root_owned_files_to_its_user_through_a_link(rendered, tmp_path):
    """Each door's root commands (ExecStartPre=+, ExecReload=+) run in order on a copy of
    its directories, the runtime one owned by the door's user. Before and after each copy
    the door (its user owns that directory) puts a link to a root-owned file in place of
    the key file: that file stays as it was and root's, and without the link the copy
    becomes the door's."""
    doors = [name for name in rendered.units if name.endswith(("lb.service", "fleet.service"))]
    assert len(doors) >= 5
    for name in doors:
        text = rendered.units[name].read_text()
        for key in ("ExecStartPre", "ExecReload"):
            commands = [shlex.split(c[1:]) for c in re.findall(rf"^{key}=(\+.*)$", text, re.M)]
            if not commands:
                continue
            places = {}  # the unit's directory: the test's copy of it
            for argv in commands:
                for word in argv[1:]:
                    path = Path(word.split("=", 1)[-1])
                    if path.is_absolute() and path.name in DOOR_COPIES:
                        places.setdefault(
                            str(path.parent), tmp_path / name / key / str(len(places))
                        )
            for attack in (False, True):
                for place in places.values():
                    shutil.rmtree(place, ignore_errors=True)
                    place.mkdir(parents=True)
                    for file in DOOR_COPIES:
                        (place / file).write_text("sk-key\n")
                # The directory whose owner the copies take: the runtime one.
                [reference] = {
                    w.split("=", 1)[1] for a in commands for w in a if "--reference=" in w
                }
                os.chown(places[reference], DOOR_USER, DOOR_USER)
                victim = tmp_path / "victim"
                victim.write_text("root's\n")
                for argv in commands:
                    for directory, place in places.items():
                        argv = [w.replace(directory, str(place)) for w in argv]
                    copied = Path(argv[-1])
                    if attack and argv[0].endswith("install"):
                        # A link left in the file's place before the copy too.
                        copied.unlink()
                        copied.symlink_to(victim)
                    subprocess.run(argv, check=True, capture_output=True)
                    assert victim.read_text() == "root's\n", (name, argv)
                    if attack and argv[0].endswith("install"):
                        copied.unlink()
                        copied.symlink_to(victim)
                    if not attack and argv[0].endswith("chown"):
                        assert copied.stat().st_uid == DOOR_USER, (name, argv)
                assert victim.stat().st_uid == 0, (name, key)


def test_an_instance_has_a_network_of_its_own_where_systemd_can_make_one(rendered):
    """Where root holds CAP_NET_ADMIN, a venv's instance that downloads nothing has its
    engines' sockets in a network namespace of its own; without the capability, in an
    image (Podman sets up the container's network) or fetching its model at start, they
    stay on the host's loopback."""
    private = {
        name: "PrivateNetwork=yes" in unit.read_text()
        for name, unit in rendered.units.items()
        if re.search(r"socketwise-vllm-\w+\.service$", name)
    }
    assert {name for name, on in private.items() if on} == {
        "private-socketwise-vllm-sn.service",
        "gpu-private-socketwise-vllm-dp0.service",
        "gpu-private-socketwise-vllm-dp1.service",
    }, private


# Stand-ins on this machine for the engine's user and the doors' group; the door's and a
# stranger's uid (no account needs them).
ENGINE_USER, ENGINE_GROUP, DOOR_GID, OTHER_UID = "nobody", "daemon", 1, 65533


def _connects(path: Path, *who: str) -> str:
    """What a connect() to the socket PATH gives a process run as WHO (setpriv's options)."""
    probe = (
        "import socket, sys\n"
        "try:\n    socket.socket(socket.AF_UNIX).connect(sys.argv[1]); print('connected')\n"
        "except OSError as error:\n    print(type(error).__name__)"
    )
    argv = ["setpriv", *who, sys.executable, "-c", probe, str(path)]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other users")
def test_an_engines_api_socket_opens_to_its_door_alone(rendered):
    """Every single-host instance, and a cluster head's engine (vLLM's head stage,
    llama-server, a hybrid server), serves its API on a Unix socket (no TCP port) in its
    runtime directory; the server's group is the one the host's door holds. Done as
    systemd does it (the directory made with its mode, owned by the unit's user and group,
    then vLLM binding the socket as the server's user and group under its umask;
    stand-ins for the user and group): the door's process may connect, another user's is
    refused."""
    group = setting(rendered.units["socketwise-lb.service"], "SupplementaryGroups")
    head_door = rendered.units["head-socketwise-cluster-lb.service"]
    assert setting(head_door, "SupplementaryGroups") == group
    heads = ["head-socketwise-pp-vllm.service", "head-socketwise-llamacpp.service",
             "gpu-socketwise-llamacpp.service"]  # fmt: skip
    engines = [n for n in rendered.units if re.search(r"socketwise-vllm-\w+\.service$", n)]
    assert len(engines) >= 8, engines
    engines += heads
    # Where the stand-in users reach (pytest's own directory is root's alone).
    place = Path(tempfile.mkdtemp(prefix="engines-"))
    place.chmod(0o755)
    try:
        for name in engines:
            unit = rendered.units[name]
            text = unit.read_text()
            # vLLM's --uds; llama-server's --host ending in .sock.
            [uds] = re.findall(r"^\s+--(?:uds (\S+)|host (\S+\.sock)) \\$", text, re.M)
            uds = "".join(uds)
            assert not re.search(r"^\s+--(host|port) (?!\S+\.sock)", text, re.M), name
            runtime = setting(unit, "RuntimeDirectory")
            assert Path(uds).parent == Path("/run") / runtime, name
            assert setting(unit, "Group") == group, name
            image = "podman run" in text
            if image:
                [umask] = re.findall(r"--umask=(\d+)", text)
                assert f"--volume /run/{runtime}:/run/{runtime} \\" in text, name
                # The server runs as the account's uid and the group's gid (the test's 997).
                assert re.search(r"--user \d+:997 \\", text), name
            else:
                # The unit's last UMask= (after hardening.j2's) is the one systemd takes.
                umask = re.findall(r"^UMask=(.*)$", text, re.M)[-1]
            # The unit's user owns the directory (root, Podman's, for an image), its group too.
            directory = place / name / runtime
            directory.parent.mkdir(mode=0o755)
            directory.mkdir()
            directory.chmod(int(setting(unit, "RuntimeDirectoryMode"), 8))
            shutil.chown(directory, "root" if image else ENGINE_USER, ENGINE_GROUP)
            socket_path = directory / Path(uds).name
            bind = (
                f"import os, socket; os.umask(0o{umask}); "
                f"socket.socket(socket.AF_UNIX).bind({str(socket_path)!r})"
            )
            subprocess.run(
                ["setpriv", f"--reuid={ENGINE_USER}", f"--regid={ENGINE_GROUP}", "--clear-groups",
                 sys.executable, "-c", bind],
                check=True, capture_output=True,
            )  # fmt: skip
            as_door = (f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", f"--groups={DOOR_GID}")
            as_other = (f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups")
            # Refused when nothing listens, not denied: the door may open the socket.
            assert _connects(socket_path, *as_door) == "ConnectionRefusedError", name
            assert _connects(socket_path, *as_other) == "PermissionError", name
    finally:
        shutil.rmtree(place)


def test_a_tls_doors_reload_copies_its_certificates(rendered):
    """systemd hands a credential over only at start: a renewed certificate would take a
    restart, which stops the door. A TLS door's reload copies each certificate it serves
    or shows where HAProxy reads it, so a renewal takes a reload."""
    for name, certificates in (
        ("tls-socketwise-lb.service", ["frontdoor.pem"]),
        ("tls-socketwise-fleet.service", ["frontdoor.pem", "fleet-client.pem"]),
    ):
        text = rendered.units[name].read_text()
        assert "LoadCredential" not in text, name
        where = re.search(r"^Environment=SOCKETWISE_DOOR_FILES=(\S+)$", text, re.M).group(1)
        for phase in ("ExecStartPre", "ExecReload"):
            copied = re.findall(rf"^{phase}=\+/usr/bin/install -m 0400 \S+ (\S+)$", text, re.M)
            for certificate in certificates:
                assert f"{where}/{certificate}" in copied, (name, phase, certificate)


NEEDS_NFT = pytest.mark.skipif(
    shutil.which("nft") is None or shutil.which("unshare") is None, reason="needs nft and unshare"
)


STRANGER = "10.0.0.99"


def load_and_knock(rendered, rules: str, unit: str, table: str, ports: list[str]) -> dict:
    """The rendered nftables file RULES, loaded twice as its UNIT loads it, in a network
    namespace of the test's own holding the members' addresses and a stranger's; then a
    connection to each of PORTS on the head from each address, then the unit's stop.
    {"tables": the count of TABLE after the loads, "seen": {"<source> <port>": what the
    connection did}, "after_stop": the count of TABLE after the stop}."""
    text = rendered.units[unit].read_text()
    stop = re.search(r"^ExecStop=(.*)$", text, re.MULTILINE).group(1)
    script = f"""
set -e
ip link set lo up
for a in {MEMBERS["head"]} {MEMBERS["follower"]} {STRANGER}; do ip addr add $a/32 dev lo; done
nft -f {rendered.directory / rules}
nft -f {rendered.directory / rules}
echo "$(nft list tables | grep -c {table})"
ENGINE_GID={ENGINE_GID} OTHER_GIDS="{" ".join(map(str, OTHER_GIDS))}" \
  {sys.executable} -c '{SERVE_AND_KNOCK}' {" ".join([*MEMBERS.values(), STRANGER, *ports])}
{stop}
echo "$(nft list tables | grep -c {table} || true)"
"""
    done = subprocess.run(["unshare", "--net", "sh", "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    tables, seen, after_stop = done.stdout.splitlines()
    return {"tables": int(tables), "seen": json.loads(seen), "after_stop": int(after_stop)}


def test_the_node_exporter_listens_on_the_backend_address_alone(rendered):
    """Reachable only through the metrics door (its scrape token, the monitors' addresses):
    on the backend address (loopback) and its port, reading the kit's marks."""
    unit = rendered.units[EXPORTER]
    argv = shlex.split(setting(unit, "ExecStart"))
    assert argv[0] == "/usr/bin/prometheus-node-exporter"
    assert sorted(argv[1:]) == [
        "--collector.textfile.directory=/var/lib/socketwise/metrics",
        "--web.listen-address=127.0.0.1:9100",
    ]


@NEEDS_NFT
def test_the_metrics_filter_lets_only_the_monitors_reach_the_metrics_door(rendered):
    """The table of a host whose monitor is at the follower's address: the monitor connects
    to the metrics door (9180), the stranger and the host's own address are reset; another
    port stays open. Loading it again keeps one table, and the unit's stop removes it."""
    found = load_and_knock(rendered, "head-metrics-firewall.nft",
                           "head-socketwise-metrics-firewall.service", "socketwise_metrics_head",
                           ["9180", "8000"])  # fmt: skip
    seen = found["seen"]
    assert (found["tables"], found["after_stop"]) == (1, 0)
    assert seen[f"{MEMBERS['follower']} 9180"] == "connected", seen
    assert seen[f"{MEMBERS['head']} 9180"] == "ConnectionRefusedError", seen
    assert seen[f"{STRANGER} 9180"] == "ConnectionRefusedError", seen
    assert seen[f"{STRANGER} 8000"] == "connected", seen


@NEEDS_NFT
def test_the_cluster_filter_lets_only_members_reach_the_engine_ports(rendered):
    """The head's table: a new connection to an engine port from a member connects, from
    the stranger it is reset; the host's other ports stay as they were. Loading it again
    keeps one table, and the unit's stop removes it."""
    ports = ["29501", str(EPHEMERAL[0] + 1234), "8000"]
    found = load_and_knock(rendered, "head-firewall.nft",
                           "head-socketwise-cluster-firewall.service", "socketwise_cluster_head",
                           ports)  # fmt: skip
    seen = found["seen"]
    assert (found["tables"], found["after_stop"]) == (1, 0)
    for port in ports:
        assert seen[f"{MEMBERS['follower']} {port}"] == "connected", seen
        assert seen[f"{MEMBERS['head']} {port}"] == "connected", seen
    assert seen[f"{STRANGER} 29501"] == "ConnectionRefusedError", seen
    assert seen[f"{STRANGER} {ports[1]}"] == "ConnectionRefusedError", seen
    assert seen[f"{STRANGER} 8000"] == "connected", seen
    # On the host itself, a process of another group (a local user, root too) is reset at
    # the engine ports from any address; the host's other ports stay open to it.
    for gid in OTHER_GIDS:
        for source in MEMBERS.values():
            for port in ports[:2]:
                assert seen[f"{source} {port} gid {gid}"] == "ConnectionRefusedError", seen
            assert seen[f"{source} 8000 gid {gid}"] == "connected", seen


# The host's firewall service as Debian ships it: it flushes the whole ruleset when it
# starts and reloads (/etc/nftables.conf begins with flush ruleset) and when it stops.
NFTABLES_SERVICE = Path("/lib/systemd/system/nftables.service")
NFTABLES_CONF = """flush ruleset
table inet filter {
	chain input {
		type filter hook input priority filter;
	}
}
"""


def exec_lines(text: str, key: str) -> list[str]:
    """A unit's KEY= command lines in order, systemd's prefixes (-, +, @, !) dropped."""
    return [line.lstrip("-+@!:") for line in re.findall(rf"^{key}=(.+)$", text, re.MULTILINE)]


def as_shell(command: str, units: dict[str, str], conf: Path) -> list[str]:
    """COMMAND as the test's network namespace runs it: nft as it is (Debian's configuration
    at CONF), a systemctl call as systemd would run it on the loaded UNITS ({name: text})
    that match its patterns: a reload runs ExecReload=, a restart ExecStop= then ExecStart=."""
    argv = shlex.split(command)
    if Path(argv[0]).name != "systemctl":
        return [command.replace("/etc/nftables.conf", str(conf))]
    verb, *patterns = [word for word in argv[1:] if not word.startswith("-")]
    matched = [text for name, text in units.items() if any(fnmatch(name, p) for p in patterns)]
    if verb in ("reload", "try-reload-or-restart", "reload-or-restart"):
        return [line for text in matched for line in exec_lines(text, "ExecReload")]
    assert verb in ("restart", "try-restart"), command
    return [
        line
        for text in matched
        for line in exec_lines(text, "ExecStop") + exec_lines(text, "ExecStart")
    ]


@NEEDS_NFT
@pytest.mark.skipif(not NFTABLES_SERVICE.exists(), reason="needs Debian's nftables.service")
def test_the_filters_come_back_after_the_hosts_nftables_service_flushes_the_ruleset(
    rendered, tmp_path
):
    """The head's two tables loaded by their units, then what the host's nftables.service
    runs on start, on reload and on stop, with the kit's drop-in after its own commands as
    systemd orders them: after each, both tables are back and the stranger is reset again
    on the rendezvous and the metrics door. Without the drop-in the flush leaves both ports
    open (the test shows that first)."""
    service = NFTABLES_SERVICE.read_text()
    dropin = (rendered.directory / NFTABLES_DROPIN[1]).read_text()
    conf = tmp_path / "nftables.conf"
    conf.write_text(NFTABLES_CONF)
    units = {
        name.removeprefix("head-"): rendered.units[name].read_text()
        for name in (
            "head-socketwise-cluster-firewall.service",
            "head-socketwise-metrics-firewall.service",
        )
    }
    # The rules files where the units read them: the namespace's own /etc/socketwise.
    rules = {"/etc/socketwise/cluster/firewall.nft": "head-firewall.nft",
             "/etc/socketwise/metrics-firewall.nft": "head-metrics-firewall.nft"}  # fmt: skip
    for path in rules:
        assert any(path in text for text in units.values()), path

    def shell(lines: list[str]) -> str:
        for path, name in rules.items():
            lines = [line.replace(path, str(rendered.directory / name)) for line in lines]
        return "\n".join(lines)

    addresses = " ".join([*MEMBERS.values(), STRANGER])
    other = OTHER_GIDS[0]
    knock = (
        f"ENGINE_GID={ENGINE_GID} OTHER_GIDS={other} "
        f"{sys.executable} -c '{SERVE_AND_KNOCK}' {addresses} 29501 9180"
    )
    tables = "echo \"$(nft list tables | grep -c 'socketwise_' || true)\""
    actions = {
        "flushed": exec_lines(service, "ExecReload"),
        "start": exec_lines(service, "ExecStart") + exec_lines(dropin, "ExecStartPost"),
        "reload": exec_lines(service, "ExecReload") + exec_lines(dropin, "ExecReload"),
        "stop": exec_lines(service, "ExecStop") + exec_lines(dropin, "ExecStopPost"),
    }
    loaded = [line for text in units.values() for line in exec_lines(text, "ExecStart")]
    script = ["set -e", "ip link set lo up",
              *(f"ip addr add {a}/32 dev lo" for a in [*MEMBERS.values(), STRANGER])]  # fmt: skip
    for action, commands in actions.items():
        steps = [line for command in commands for line in as_shell(command, units, conf)]
        script += [shell(loaded), shell(steps), f"echo {action}", tables, knock]
    done = subprocess.run(
        ["unshare", "--net", "sh", "-c", "\n".join(script)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    seen = {out[i]: (int(out[i + 1]), json.loads(out[i + 2])) for i in range(0, len(out), 3)}
    count, open_door = seen.pop("flushed")
    assert count == 0 and open_door[f"{STRANGER} 29501"] == "connected", open_door
    assert open_door[f"{MEMBERS['follower']} 29501 gid {other}"] == "connected", open_door
    for action, (count, knocks) in seen.items():
        assert count == 2, action
        assert knocks[f"{STRANGER} 29501"] == "ConnectionRefusedError", (action, knocks)
        assert knocks[f"{STRANGER} 9180"] == "ConnectionRefusedError", (action, knocks)
        assert knocks[f"{MEMBERS['follower']} 29501"] == "connected", (action, knocks)
        assert knocks[f"{MEMBERS['follower']} 9180"] == "connected", (action, knocks)
        # A local user of another group, at the rendezvous: reset again too.
        assert knocks[f"{MEMBERS['follower']} 29501 gid {other}"] == "ConnectionRefusedError", (
            action, knocks,
        )  # fmt: skip


@NEEDS_NFT
def test_a_deploy_finds_a_table_missing_or_changed(rendered):
    """The port_filter role's own comparison (its task's command), in a network namespace
    of the test's own: the head's table as its file loads it is the same; with a rule
    added by hand it is different; deleted, missing. The deploy reloads the table on the
    last two."""
    tasks = yaml.safe_load((ROLES / "port_filter/tasks/main.yml").read_text())
    [compare] = [t for t in tasks if t["name"] == "Compare the loaded table with its rules"]
    argv = compare["ansible.builtin.command"]["argv"]
    rules, table = rendered.directory / "head-firewall.nft", "socketwise_cluster_head"
    command = shlex.join([*argv[:-2], str(rules), table])
    script = f"""
set -e
nft -f {rules}
{command}
nft add rule inet {table} input tcp dport 22 accept
{command}
nft delete table inet {table}
{command}
"""
    done = subprocess.run(["unshare", "--net", "sh", "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["same", "different", "missing"]


@pytest.mark.skipif(not NFTABLES_SERVICE.exists(), reason="needs Debian's nftables.service")
def test_the_nftables_drop_in_passes_systemd_analyze_verify(rendered, tmp_path):
    (tmp_path / "nftables.service").write_text(NFTABLES_SERVICE.read_text())
    (tmp_path / "nftables.service.d").mkdir()
    (tmp_path / "nftables.service.d/socketwise.conf").write_text(
        (rendered.directory / NFTABLES_DROPIN[1]).read_text()
    )
    env = os.environ | {"SYSTEMD_UNIT_PATH": f"{tmp_path}:"}
    done = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / "nftables.service")],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr


def test_a_hybrid_server_opens_only_its_gpu_and_runs_the_plans_flags(rendered):
    unit = rendered.units["gpu-socketwise-llamacpp.service"]
    text = unit.read_text()
    # The GPU's nodes instead of PrivateDevices, which would hide them; every unit not on
    # GPUs keeps PrivateDevices (but the image method's: Podman gives its container a /dev).
    assert re.findall(r"^DeviceAllow=(.*)$", text, re.MULTILINE) == [
        "/dev/nvidiactl rw", "/dev/nvidia-uvm rw", "/dev/nvidia-uvm-tools rw", "/dev/nvidia0 rw"
    ]  # fmt: skip
    assert "PrivateDevices=" not in text and setting(unit, "DevicePolicy") == "closed"
    others = [
        name for name, u in rendered.units.items()
        if "PrivateDevices=yes" not in u.read_text() and not name.startswith("image-")
    ]  # fmt: skip
    assert others == [name for name in rendered.units if name.startswith("gpu-")]
    assert "Environment=CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0" in text
    # 57 layers' experts in system memory, more than node 0 holds: spread over both nodes,
    # memory interleaved, threads on the planned cores of both.
    for flag in ("--n-gpu-layers all", "--n-cpu-moe 57", "--numa numactl", "--threads 124"):
        assert f"    {flag} \\" in text, flag
    assert (setting(unit, "NUMAPolicy"), setting(unit, "NUMAMask")) == ("interleave", "0,1")
    cpus = [*range(62), *range(64, 126)]  # each node's 64 cores less 2, no SMT sibling
    assert setting(unit, "CPUAffinity") == " ".join(map(str, cpus))
    # Alone in its cluster: no filter of engine ports to require, no RPC server to wait for.
    assert "Requires=" not in text and "--rpc" not in text and "ExecStartPre" not in text


def test_a_vllm_instance_on_gpus_opens_only_its_gpus_and_binds_to_their_node(rendered):
    for replica, node in ((0, 0), (1, 1)):
        unit = rendered.units[f"gpu-socketwise-vllm-dp{replica}.service"]
        text = unit.read_text()
        mine = [4 * node + i for i in range(4)]
        # The device nodes are the driver's minors; CUDA numbers the GPUs in bus order.
        found = re.findall(r"^DeviceAllow=/dev/nvidia(\d+) rw$", text, re.MULTILINE)
        assert found == [str(7 - i) for i in mine] and "PrivateDevices=" not in text
        assert f"Environment=CUDA_VISIBLE_DEVICES={','.join(map(str, mine))}" in text
        assert "Environment=CUDA_DEVICE_ORDER=PCI_BUS_ID" in text
        # Its GPUs' node: its memory, and 13 of its cores per GPU (its 56 less the reserve).
        assert (setting(unit, "NUMAPolicy"), setting(unit, "NUMAMask")) == ("bind", str(node))
        assert len(setting(unit, "CPUAffinity").split()) == 4 * 13
        assert "--tensor-parallel-size 4 \\" in text and "--dtype auto \\" in text
        # Nothing of vLLM's CPU runner: its KV size, thread binding and preloads.
        for cpu_only in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "LD_PRELOAD"):
            assert cpu_only not in text, cpu_only
