"""The filters `socketwise_fleet_servers`, where the fleet front door reaches each host, and
`socketwise_fleet_sources`, the addresses a host's door sees the fleet door come from."""

import ipaddress

WILDCARDS = ("0.0.0.0", "::")


def _address(found, host, default_listen):
    """A door's own address: its listen address, or its ansible_host when that is a wildcard."""
    listen = str(found.get("vllm_service_listen_address", default_listen))
    return str(found.get("ansible_host", host)) if listen in WILDCARDS else listen


def socketwise_fleet_servers(hosts, hostvars, default_listen):
    """[{name, address, port, tls, cert}] for every serving host: its own front door's address
    (its ansible_host when that binds a wildcard), the plan's port (plan_port, else 8000,
    for a host this run did not plan) and whether it speaks TLS."""
    servers = []
    for host in hosts:
        found = hostvars[host]
        plan = found.get("socketwise_plan")
        servers.append(
            {
                "name": host,
                "address": _address(found, host, default_listen),
                "port": int(plan["endpoint_port"] if plan else found.get("plan_port", 8000)),
                "tls": bool(found.get("vllm_service_tls_cert")),
                # On the controller: play 1 checks it against vllm_service_fleet_ca_file.
                "cert": str(found.get("vllm_service_tls_cert") or ""),
            }
        )
    return servers


def socketwise_fleet_sources(doors, hostvars, default_listen):
    """The addresses of the fleet doors DOORS (hosts of socketwise_frontdoor), which a host's
    door exempts from its per-client limits: the fleet door carries every client. The fleet
    door connects from its listen address when it has one (fleet-haproxy.cfg.j2's `source`);
    a name is left out (HAProxy would resolve it once, at start): list that door's address
    in vllm_service_client_limit_exempt instead."""
    sources = []
    for door in doors:
        address = _address(hostvars[door], door, default_listen)
        try:
            ipaddress.ip_address(address)
        except ValueError:
            continue
        sources.append(address)
    return sources


class FilterModule:
    def filters(self):
        return {
            "socketwise_fleet_servers": socketwise_fleet_servers,
            "socketwise_fleet_sources": socketwise_fleet_sources,
        }
