"""Ansible door into socketwise.serve.monitor: the filters `socketwise.kit.scrape_targets`, what
a monitor's Prometheus scrapes (from the inventory and this run's plans), and
`socketwise.kit.retention_bytes`, how much of its disk it may fill, and
`socketwise.kit.duration_seconds`, a Prometheus duration in seconds."""

from ansible_collections.socketwise.kit.plugins.module_utils.lazy import core_filter

# The core is imported inside each filter, never when the file loads: Ansible loads every
# filter file of the collection in each task's process (docs/development/architecture.md).


def _door(found, host):
    return {
        "host": host,
        "address": str(found.get("door_metrics_address", "127.0.0.1")),
        "port": int(found.get("door_metrics_port", 9180)),
    }


def socketwise_scrape_targets(serving, doors, hostvars):
    """{job: static_configs} for the serving hosts SERVING that this run planned (a cluster
    member by its cluster's plan) and the fleet doors DOORS."""
    from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.plan.fleet import (
        host_model,
    )
    from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.serve.monitor import (
        cluster_host_plan,
        scrape_targets,
    )

    hosts = []
    for host in serving:
        found = hostvars[host]
        build = found.get("socketwise_build") or {}
        if found.get("socketwise_cluster"):
            plan = cluster_host_plan(
                found.get("socketwise_cluster_plan"), host, found.get("socketwise_engine", "vllm")
            )
        else:
            plan = found.get("socketwise_plan")
        if not plan:
            continue
        labels = {
            "hardware_class": build.get("class"),
            "cluster": found.get("socketwise_cluster"),
            "model": host_model(found),
        }
        hosts.append(_door(found, host) | {"plan": plan} | labels)
    return scrape_targets(hosts, [_door(hostvars[door], door) for door in doors])


def socketwise_retention_bytes(filesystem_bytes, share):
    from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.serve.monitor import (
        retention_bytes,
    )

    return retention_bytes(int(filesystem_bytes), float(share))


class FilterModule:
    def filters(self):
        return {
            "duration_seconds": core_filter("serve.monitor", "duration_seconds"),
            "scrape_targets": socketwise_scrape_targets,
            "retention_bytes": socketwise_retention_bytes,
        }
