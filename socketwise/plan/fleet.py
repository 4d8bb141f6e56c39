"""A fleet's plans side by side: per hardware class and host, what runs where and what
a deploy would change against what is deployed.

Plain Python with no Ansible import; `playbooks/plan.yml` prints `lines(summary(...))`
and writes the summary as `fleet-plan.json`.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..facts.files import format_cpulist

# Hosts of these groups serve nothing: load generators, fleet front doors and monitors.
NOT_SERVING = ("socketwise_loadgen", "socketwise_frontdoor", "socketwise_monitor")


def serving_hosts(groups: Mapping[str, Iterable[str]]) -> list[str]:
    """The hosts that serve a model, in the inventory's order: every host of `all` in none
    of the NOT_SERVING groups. The one place the kit decides it: the plays that plan, tune,
    serve and roll out, the fleet door's servers, the monitor's targets and calibrate read
    it (through the filter `socketwise.kit.serving_hosts` in Ansible)."""
    idle = set().union(*(groups.get(name) or () for name in NOT_SERVING))
    return [host for host in groups.get("all") or () if host not in idle]


# The vllm role's vllm_builtin_model_size when an inventory gives none (its defaults/main.yml).
BUILTIN_SIZE = "tiny"


def served_name(values: Mapping[str, object]) -> str:
    """The name a host serves its model under (vLLM's --served-model-name, llama-server's
    alias): vllm_served_model_name when given, else the last part of vllm_model_hf_id or
    vllm_model_path, else the built-in model's directory (tiny-llama, tiny-llama-SIZE).
    The one place the kit decides it: the vllm role publishes it as vllm_served_name, and
    the fleet door routes each request by it, for a host this run served or not."""
    given = str(values.get("vllm_served_model_name") or "")
    if given:
        return given
    source = str(values.get("vllm_model_hf_id") or values.get("vllm_model_path") or "")
    if source:
        return posixpath.basename(source)
    size = str(values.get("vllm_builtin_model_size") or BUILTIN_SIZE)
    return "tiny-llama" + ("" if size == BUILTIN_SIZE else f"-{size}")


def host_model(found: Mapping[str, object]) -> str:
    """The model a host serves from its variables FOUND (Ansible's hostvars of it): the
    vllm_served_name this run published, else served_name() of its inventory values. The
    fleet door routes by it, the monitor labels the host's series with it."""
    return str(found.get("vllm_served_name") or served_name(found))


# What HAProxy takes in a backend's name; a model's other characters (its '/') become '_'.
_BACKEND_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")


def model_backends(servers: list[Mapping[str, object]]) -> list[dict]:
    """The fleet door's backends, one per served model in the order the models first come
    among SERVERS (the fleet_servers filter's, each with its `model`): [{model, backend,
    servers}]. A fleet of one model has the one backend `fleet` it always had (a rollout's
    drain and the monitor know it by that name); more are each `fleet-` and the model's
    name, numbered where two names would read the same."""
    models: dict[str, list] = {}
    for server in servers:
        models.setdefault(str(server["model"]), []).append(server)
    if len(models) == 1:
        return [{"model": model, "backend": "fleet", "servers": found}
                for model, found in models.items()]  # fmt: skip
    backends, taken = [], set()
    for model, found in models.items():
        backend = plain = "fleet-" + _BACKEND_UNSAFE.sub("_", model)
        number = len(backends) + 1
        while backend in taken:
            backend, number = f"{plain}-{number}", number + 1
        taken.add(backend)
        backends.append({"model": model, "backend": backend, "servers": found})
    return backends


def shape(plan: dict) -> dict:
    """What hosts of one class share: layout, instances with their ports, ranks, KV
    sizes and placement, the front door's port."""
    return {
        "layout": plan["layout"],
        "dp_mode": plan["dp_mode"],
        "endpoint_port": plan["endpoint_port"],
        "balance": plan["load_balancer"]["balance"],
        "instances": [
            {
                "name": i["name"],
                "port": i["port"],
                "tp": i["tp"],
                "data_parallel": i["data_parallel"],
                "kvcache_gb": i["kvcache_gb"],
                "nodes": i["membind"],
                "threads": i["omp_threads_bind"],
            }
            for i in plan["instances"]
        ],
    }


def changes(deployed: dict | None, planned: dict) -> list[str]:
    """What serving `planned` would change on a host that serves `deployed` (its last
    deploy's plan, None when nothing was deployed); [] when nothing would."""
    if deployed is None:
        return ["new: nothing deployed yet"]
    found = []
    before_class = (deployed.get("hardware_class") or {}).get("id")
    after_class = planned["hardware_class"]["id"]
    if before_class != after_class:
        found.append(f"hardware class {before_class or 'unknown'} -> {after_class}")
    old, new = shape(deployed), shape(planned)
    # How DP runs only means something between two DP plans.
    keys = (
        ("layout", "dp_mode", "endpoint_port", "balance")
        if old["dp_mode"] and new["dp_mode"]
        else ("layout", "endpoint_port", "balance")
    )
    for key in keys:
        if old[key] != new[key]:
            found.append(f"{key} {old[key]} -> {new[key]}")
    names = [[i["name"] for i in s["instances"]] for s in (old, new)]
    if names[0] != names[1]:
        found.append(f"instances {', '.join(names[0])} -> {', '.join(names[1])}")
        return found
    for before, after in zip(old["instances"], new["instances"], strict=True):
        for key in ("port", "tp", "data_parallel", "kvcache_gb", "nodes", "threads"):
            if before[key] != after[key]:
                found.append(f"{after['name']}: {key} {before[key]} -> {after[key]}")
    return found


def deployed_plan(artifacts_dir: str | Path, host: str) -> dict | None:
    """The plan of `host`'s last deploy from its deploy-summary.json; None when it has
    none (or it cannot be read: the dry run then treats the host as new)."""
    path = Path(artifacts_dir) / host / "deploy-summary.json"
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("plan")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return None


def summary(entries: list[dict]) -> dict:
    """`entries`: [{"host", "plan", "deployed"}] -> {"classes": [...]}, one item per
    hardware class in order of first appearance, each with its hosts' plans and changes.
    `same_shape` is false when hosts of one class were given different requests."""
    classes: dict[str, dict] = {}
    for entry in entries:
        described = entry["plan"]["hardware_class"]
        found = classes.setdefault(described["id"], {**described, "hosts": []})
        found["hosts"].append(
            {
                "host": entry["host"],
                "shape": shape(entry["plan"]),
                "reason": entry["plan"]["reason"],
                "changes": changes(entry.get("deployed"), entry["plan"]),
            }
        )
    for found in classes.values():
        shapes = [host["shape"] for host in found["hosts"]]
        found["same_shape"] = all(s == shapes[0] for s in shapes)
    return {"classes": list(classes.values())}


def _instance_line(instance: dict) -> str:
    ranks = f"TP{instance['tp']}" if instance["tp"] > 1 else "1 rank"
    if instance["data_parallel"] > 1:
        ranks = f"DP{instance['data_parallel']}"
    nodes = format_cpulist(instance["nodes"])
    ranks_cpus = [rank.split(",") for rank in instance["threads"].split("|")]
    cpus = " | ".join(format_cpulist(int(cpu) for cpu in rank) for rank in ranks_cpus)
    return (
        f"{instance['name']} :{instance['port']} {ranks} on node(s) {nodes}, "
        f"cores {cpus}, KV {instance['kvcache_gb']} GB"
    )


def lines(fleet: dict) -> list[str]:
    """The summary as a person reads it: per class, then per host."""
    out = []
    for found in fleet["classes"]:
        nodes = found["nodes"]
        cores = sorted({node["cores"] for node in nodes})
        out.append(
            f"class {found['id']} ({len(found['hosts'])} host(s)): {found['cpu_model']}, "
            f"{found['sockets']} socket(s), {len(nodes)} NUMA node(s) of "
            f"{'/'.join(map(str, cores))} cores, {found['memory_gb']} GB, build {found['isa']}"
        )
        if not found["same_shape"]:
            out.append("  warning: hosts of this class are planned differently (variables differ)")
        for host in found["hosts"]:
            layout = host["shape"]
            mode = f" ({layout['dp_mode']})" if layout["dp_mode"] else ""
            out.append(
                f"  {host['host']}: {layout['layout'].upper()}{mode}, front door :"
                f"{layout['endpoint_port']}, build {found['isa']}"
            )
            out += [f"    {_instance_line(instance)}" for instance in layout["instances"]]
            out.append(f"    would change: {'; '.join(host['changes']) or 'nothing'}")
    return out
