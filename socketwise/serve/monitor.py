"""What a monitor host's Prometheus scrapes, from the inventory and the plans: every engine,
node exporter and front door of the serving hosts, each through its host's metrics door
(templates/metrics-door.j2), with the kit's labels.

Monitoring reads the plan; it is not a second record of what runs where. Each host comes
as a dict of its inventory values: `host`, `address` and `port` (its metrics door), and
`plan` (socketwise_plan, absent on a fleet door), `hardware_class`, `cluster` and `model`
(the name it serves under) where it has them. The result is Prometheus' `static_configs`,
one list per job.
"""

from __future__ import annotations

# The jobs a monitor's Prometheus scrapes, and the paths of a metrics door.
ENGINES, NODES, DOORS = "socketwise-engines", "socketwise-nodes", "socketwise-doors"
NODE_PATH, DOOR_PATH = "/metrics/node", "/metrics/door"


def engine_path(instance: str) -> str:
    """The metrics door's path of one engine's /metrics."""
    return f"/metrics/{instance}"


def _target(host: dict, path: str, instance: str, labels: dict[str, str]) -> dict:
    # Prometheus' own `instance` label would be the metrics door's address, the same for
    # every engine of a host: host/engine reads better, and tells them apart.
    return {
        "targets": [f"{_bracketed(str(host['address']))}:{int(host['port'])}"],
        "labels": {"__metrics_path__": path, "instance": instance, **labels},
    }


def _bracketed(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def _labels(host: dict, layout: str) -> dict[str, str]:
    return {
        "host": str(host["host"]),
        "layout": layout,
        "hardware_class": str(host.get("hardware_class") or ""),
        "cluster": str(host.get("cluster") or ""),
        # A fleet of many models: the dashboard and `socketwise status` tell them apart.
        "model": str(host.get("model") or ""),
    }


def cluster_host_plan(cluster_plan: dict | None, host: str, engine: str) -> dict | None:
    """What a monitor scrapes on HOST, a member of a cluster planned as CLUSTER_PLAN, in a
    host plan's shape: the head's engine (named ENGINE, `vllm` or `llamacpp`: its /metrics
    covers the whole pipeline) and nothing else; the node exporter and door come with every
    host. None when the plan leaves HOST out (or this run planned no cluster)."""
    if not cluster_plan or host not in [member["host"] for member in cluster_plan["hosts"]]:
        return None
    head = host == cluster_plan["head"]
    return {"layout": cluster_plan["layout"], "instances": [{"name": engine}] if head else []}


def scrape_targets(serving: list[dict], doors: list[dict]) -> dict[str, list[dict]]:
    """{job: static_configs}: one engine target per planned instance (labelled with its
    `socketwise_instance`), one node exporter and one front door per serving host, and
    the front door of every fleet door in DOORS (layout `fleet`)."""
    jobs: dict[str, list[dict]] = {ENGINES: [], NODES: [], DOORS: []}
    for host in serving:
        plan = host["plan"]
        labels = _labels(host, str(plan["layout"]))
        for instance in plan["instances"]:
            name = str(instance["name"])
            jobs[ENGINES].append(
                _target(
                    host,
                    engine_path(name),
                    f"{host['host']}/{name}",
                    labels | {"socketwise_instance": name},
                )
            )
        jobs[NODES].append(_target(host, NODE_PATH, str(host["host"]), labels))
        jobs[DOORS].append(_target(host, DOOR_PATH, str(host["host"]), labels))
    for door in doors:
        jobs[DOORS].append(_target(door, DOOR_PATH, str(door["host"]), _labels(door, "fleet")))
    return jobs


def retention_bytes(filesystem_bytes: int, share: float, floor: int = 1 << 30) -> int:
    """Prometheus' --storage.tsdb.retention.size: SHARE of the data directory's filesystem,
    at least FLOOR (1 GiB), so a small disk still keeps hours, not nothing."""
    if not 0 < share <= 1:
        raise ValueError(f"share {share}: give a fraction in (0, 1]")
    return max(int(filesystem_bytes * share), floor)


_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def duration_seconds(duration: str) -> float:
    """Seconds in a Prometheus duration of one unit ("15s", "5m", "500ms", "15d")."""
    text = str(duration)
    for unit in sorted(_UNITS, key=len, reverse=True):
        number = text.removesuffix(unit)
        if number != text and number.isdigit():
            return int(number) * _UNITS[unit]
    raise ValueError(f"{duration!r}: not a Prometheus duration; give a number and a unit (15s, 5m)")
