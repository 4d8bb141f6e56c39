"""The filters `socketwise.kit.fleet_servers`, where the fleet front door reaches each host,
`socketwise.kit.fleet_sources`, the addresses a host's door sees the fleet door come from,
`socketwise.kit.fleet_trusting`, the hosts whose door takes the fleet door's certificate,
`socketwise.kit.serving_hosts`, the hosts that serve (`groups | socketwise.kit.serving_hosts`),
`socketwise.kit.served_name`, the name a host serves its model under,
`socketwise.kit.fleet_models`, the fleet door's backend for each model, and
`socketwise.kit.by_model`, hosts in a rollout's order (one model's at a time)."""

import ipaddress

from ansible_collections.socketwise.kit.plugins.module_utils.lazy import core_filter

# The core is imported inside each filter, never when the file loads: Ansible loads every
# filter file of the collection in each task's process (docs/development/architecture.md).

WILDCARDS = ("0.0.0.0", "::")


def _address(found, host, default_listen):
    """A door's own address: its listen address, or its ansible_host when that is a wildcard."""
    listen = str(found.get("door_listen_address", default_listen))
    return str(found.get("ansible_host", host)) if listen in WILDCARDS else listen


def _switch(value):
    """A switch as the host's own role reads it (socketwise.common.typed); one that does
    not convert is off here, and refused by that host's first play."""
    from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.common.typed import (
        NotConverted,
        convert,
    )

    try:
        return bool(convert(value, "bool"))
    except NotConverted:
        return False


def socketwise_fleet_servers(hosts, hostvars, default_listen):
    """[{name, address, port, tls, kit, cert, model}] for every serving host: its own front
    door's address (its ansible_host when that binds a wildcard), the plan's port (plan_port,
    else 8000, for a host this run did not plan), whether it speaks TLS and whether with the
    certificate the kit's CA issued it (credentials_tls without a credentials_tls_cert), and
    the model it serves (vllm_served_name as this run published it, else from its variables)."""
    from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.plan.fleet import (
        host_model,
    )

    servers = []
    for host in hosts:
        found = hostvars[host]
        plan = found.get("socketwise_plan")
        cert = str(found.get("credentials_tls_cert") or "")
        kit = not cert and _switch(found.get("credentials_tls", False))
        servers.append(
            {
                "name": host,
                "address": _address(found, host, default_listen),
                "port": int(plan["endpoint_port"] if plan else found.get("plan_port", 8000)),
                "tls": bool(cert) or kit,
                "kit": kit,
                # On the controller: play 1 checks it against credentials_fleet_ca_file.
                "cert": cert,
                "model": host_model(found),
            }
        )
    return servers


def socketwise_by_model(hosts, hostvars):
    """HOSTS grouped by the model each serves, the models in the order they first come and
    each model's hosts in HOSTS' order: a rollout's batches take one model's hosts at a
    time, so the other models keep every host while they roll."""
    from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.plan.fleet import (
        host_model,
    )

    grouped = {}
    for host in hosts:
        grouped.setdefault(host_model(hostvars[host]), []).append(host)
    return [host for same in grouped.values() for host in same]


def socketwise_fleet_sources(doors, hostvars, default_listen):
    """The addresses of the fleet doors DOORS (hosts of socketwise_frontdoor), which a host's
    door exempts from its per-client limits: the fleet door carries every client. The fleet
    door connects from its listen address when it has one (fleet-haproxy.cfg.j2's `source`);
    a name is left out (HAProxy would resolve it once, at start): list that door's address
    in door_client_limit_exempt instead."""
    sources = []
    for door in doors:
        address = _address(hostvars[door], door, default_listen)
        try:
            ipaddress.ip_address(address)
        except ValueError:
            continue
        sources.append(address)
    return sources


def socketwise_fleet_trusting(hosts, hostvars):
    """The HOSTS whose door takes the fleet door's client certificate by now: this run
    gave it the certificate's CA (fleet-client-ca.yml's copy, not skipped), or it had the
    CA when the first play looked (preflight.yml). A host this run has not reached (the
    first fleet play of rollout.yml, a --limit) counts only by the second."""
    trusting = []
    for host in hosts:
        found = hostvars[host]
        copied = found.get("credentials_fleet_client_ca_copy") or {}
        looked = (found.get("__vllm_service_fleet_client_ca_found") or {}).get("stat") or {}
        if (copied and not copied.get("skipped")) or looked.get("exists"):
            trusting.append(host)
    return trusting


class FilterModule:
    def filters(self):
        return {
            "fleet_servers": socketwise_fleet_servers,
            "fleet_sources": socketwise_fleet_sources,
            "by_model": socketwise_by_model,
            "fleet_trusting": socketwise_fleet_trusting,
            "serving_hosts": core_filter("plan.fleet", "serving_hosts"),
            "served_name": core_filter("plan.fleet", "served_name"),
            "fleet_models": core_filter("plan.fleet", "model_backends"),
        }
