"""The filter `socketwise_fleet_servers`: where the fleet front door reaches each host."""

WILDCARDS = ("0.0.0.0", "::")


def socketwise_fleet_servers(hosts, hostvars, default_listen):
    """[{name, address, port, tls}] for every serving host: its own front door's address
    (its ansible_host when that binds a wildcard), the plan's port (plan_port, else 8000,
    for a host this run did not plan) and whether it speaks TLS."""
    servers = []
    for host in hosts:
        found = hostvars[host]
        listen = str(found.get("vllm_service_listen_address", default_listen))
        plan = found.get("socketwise_plan")
        servers.append(
            {
                "name": host,
                "address": str(found.get("ansible_host", host)) if listen in WILDCARDS else listen,
                "port": int(plan["endpoint_port"] if plan else found.get("plan_port", 8000)),
                "tls": bool(found.get("vllm_service_tls_cert")),
            }
        )
    return servers


class FilterModule:
    def filters(self):
        return {"socketwise_fleet_servers": socketwise_fleet_servers}
