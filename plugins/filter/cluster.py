"""Ansible doors into socketwise.plan.cluster and socketwise.serve.unitvalues for clusters:
who serves one (`socketwise.kit.cluster_members`, the head first), its plan, each host's servers
and RPC endpoints, and the values its units are written with."""

from ansible_collections.socketwise.kit.plugins.module_utils.lazy import core_filter

# The core is imported inside each filter, never when the file loads: Ansible loads every
# filter file of the collection in each task's process (docs/development/architecture.md).


def socketwise_cluster_members(hosts, hostvars, cluster, head):
    """The hosts (in inventory order) whose socketwise_cluster is CLUSTER, HEAD first."""
    members = [h for h in hosts if hostvars[h].get("socketwise_cluster") == cluster]
    return ([head] if head in members else []) + [h for h in members if h != head]


def socketwise_cluster_rpc(plan, hostvars):
    """Every worker's RPC servers in the plan's device order (llama-server's --rpc), as
    {"host", "port", "endpoint": "ADDRESS:PORT"} at each worker's cluster address (the fact
    socketwise_cluster_address its check published)."""
    return [
        {"host": entry["host"], "port": server["port"],
         "endpoint": f"{hostvars[entry['host']]['socketwise_cluster_address']}:{server['port']}"}
        for entry in plan["hosts"]
        if entry["role"] == "worker"
        for server in entry["rpc_servers"]
    ]  # fmt: skip


def socketwise_cluster_follower_link(host, master, port):
    """A vLLM follower's link to the head's rendezvous MASTER (ADDRESS:PORT), as a socket
    to read on HOST: {"host", "side": "dport", "port", "endpoint"}."""
    return {"host": host, "side": "dport", "port": port, "endpoint": f"{host} -> {master}"}


def socketwise_cluster_peers(lines):
    """The peer addresses of `ss -Htn state established` LINES (local and peer are the last
    two columns), as the kit lists addresses: no port, brackets, zone or IPv4-mapped
    prefix."""
    peers = []
    for line in lines:
        words = line.split()
        if len(words) < 2:
            continue
        address = words[-1].rsplit(":", 1)[0].strip("[]").split("%", 1)[0]
        peers.append(address.removeprefix("::ffff:") if "." in address else address)
    return peers


RPC_UNIT = "socketwise-rpc-node{}.service"
HEAD_UNIT = "socketwise-llamacpp.service"
STAGE_UNIT = "socketwise-pp-vllm.service"


def socketwise_cluster_units(entry, head, engine="llamacpp"):
    """This host's servers as {"unit", "cpus"} (and, for a vLLM stage, "ranks": the CPUs of
    each of its workers): the vllm engine runs one stage per host; llamacpp one RPC server
    per planned node, and on the head (HEAD) llama-server on its stage's CPUs."""
    if not entry:
        return []
    if engine == "vllm":
        stage = entry["stage"]
        ranks = [rank["cpus"] for rank in stage["ranks"]]
        return [{"unit": STAGE_UNIT, "cpus": stage["cpus_allowed"], "ranks": ranks}]
    units = [{"unit": RPC_UNIT.format(s["node"]), "cpus": s["cpus"]} for s in entry["rpc_servers"]]
    if head:
        units.append({"unit": HEAD_UNIT, "cpus": entry["stage"]["cpus_allowed"]})
    return units


def socketwise_cluster_plan(members, hostvars, **request):
    """{"plan": ..., "error": null} or {"plan": null, "error": ..., "field": ...}: errors
    are returned, so the role names the host and the variable in one line."""
    from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.plan.cluster import (
        ClusterRequest,
        plan_cluster,
    )
    from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.plan.planner import (
        PlanError,
    )

    try:
        hosts = [(name, hostvars[name]["socketwise_topology"]) for name in members]
        return {
            "plan": plan_cluster(hosts, ClusterRequest(**request)),
            "error": None,
            "field": None,
        }
    except PlanError as exc:
        return {"plan": None, "error": str(exc), "field": exc.field}


class FilterModule:
    def filters(self):
        return {
            "cluster_members": socketwise_cluster_members,
            "cluster_peers": socketwise_cluster_peers,
            "cluster_follower_link": socketwise_cluster_follower_link,
            "cluster_rpc": socketwise_cluster_rpc,
            "cluster_plan": socketwise_cluster_plan,
            "cluster_units": socketwise_cluster_units,
            "cluster_value_errors": core_filter("serve.unitvalues", "cluster_value_errors"),
        }
