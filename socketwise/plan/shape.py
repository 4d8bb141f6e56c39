"""What every plan shares, on CPUs, GPUs or both: the request, the ports its instances
take, the KV cache's floor, and the plan document around placed instances.

Plain Python with no Ansible import, below the planners (`planner` for CPUs, `gpu` and
`hybrid` for GPUs, `cluster` for several hosts), which all build on it and never on each
other's internals.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .hwclass import hardware_class
from .nodes import Node, PlanError

# The front door's port where nothing else is asked for (`vllm_service_port`).
DEFAULT_PORT = 8000
MAX_PORT = 65535
# The least KV cache (GiB) an instance is planned with, on any device.
MIN_KV_GB = 1


@dataclass(frozen=True)
class PlanRequest:
    layout: str = "auto"
    ranks: int | None = None
    model_gb: float = 0.0
    reserve_cores: int | None = None
    kv_gb: int | None = None
    concurrency: float | None = None
    crossover: float | None = None
    dp_mode: str = "instances"
    # How the host's door spreads requests over its instances: leastconn, or prefix (the
    # same leading prompt to the same instance, within a load bound; templates/prefix.j2).
    balance: str = "leastconn"
    split_nodes: bool = False
    port: int = DEFAULT_PORT
    build_class: str | None = None
    device: str = "cpu"
    gpu_memory_gb: float | None = None
    # A mixture of experts (the hybrid layout): the routed experts' share of model_gb, the
    # layer count, and the layers before the first that has experts.
    expert_gb: float | None = None
    layers: int | None = None
    dense_layers: int = 0
    # What a calibration measured for this class, model and build and the deploy kept
    # (calibrated.vet): planner names (reserve_cores, crossover, dtype) and `source`.
    measured: dict | None = None
    # The plan's instance is a unit of its own with vLLM's front end (False for a
    # cluster's pipeline stage): SN may keep a core for that front end on a small node.
    own_front_end: bool = True

    @classmethod
    def from_values(cls, **values: object) -> PlanRequest:
        """Build a request from loosely typed values (Ansible extra vars arrive as strings)."""
        kinds = {"ranks": int, "reserve_cores": int, "kv_gb": int, "port": int}
        kinds |= {"model_gb": float, "concurrency": float, "crossover": float}
        kinds |= {"gpu_memory_gb": float, "expert_gb": float, "layers": int, "dense_layers": int}
        converted: dict[str, object] = {}
        for name, value in values.items():
            if name == "split_nodes":
                value = str(value).lower() in ("1", "true", "yes", "on")
            elif name == "measured" and value:
                # A plain copy of Ansible's mapping: the plan records its request.
                value = {str(key): item for key, item in dict(value).items()}  # type: ignore[call-overload]
            elif value is not None and value != "" and name in kinds:
                try:
                    value = kinds[name](value)
                except (TypeError, ValueError) as exc:
                    raise PlanError(name, f"{value!r} is not a number") from exc
            elif value == "":
                continue  # an extra var left empty: the request's default
            converted[name] = value
        return cls(**converted)


def instance_port(port: int, position: int) -> int:
    """The port of the instance at POSITION (0 for the first) behind a front door on PORT:
    the ports after the door's, on the host's private address."""
    return port + 1 + position


def kv_cache_gb(asked: float | None, room: float, default: float, per: str, room_is: str) -> int:
    """The KV cache (GiB) of each PER (a rank, a GPU) on any device, decided here alone: ASKED
    (the request's kv_gb), a whole number from MIN_KV_GB up to ROOM (what the device leaves
    it: ROOM_IS says what), else DEFAULT (the device's rule: three quarters of a CPU node's
    room, all of a GPU's, a tenth of a hybrid plan's GPU), at least MIN_KV_GB."""
    if asked is None:
        return max(MIN_KV_GB, math.floor(default))
    if asked < MIN_KV_GB or not float(asked).is_integer():
        raise PlanError(
            "kv_gb", f"KV cache {asked:g} GB must be a whole number of GB, at least {MIN_KV_GB}"
        )
    if asked > room:
        raise PlanError(
            "kv_gb",
            f"KV cache {asked:g} GB per {per} exceeds the {room:.1f} GB {room_is}",
            [f"kv {math.floor(room)} GB"],
        )
    return int(asked)


def threads_bind(ranks: list[dict]) -> str:
    """VLLM_CPU_OMP_THREADS_BIND: each rank's CPUs as a comma list, `|` between ranks."""
    return "|".join(",".join(map(str, rank["cpus"])) for rank in ranks)


def refuse_ranks_with_auto(request: PlanRequest) -> None:
    """`auto` chooses the ranks (or GPUs) itself: ranks given with it would be ignored."""
    if request.ranks is not None:
        raise PlanError(
            "ranks",
            f"layout auto chooses the rank count itself, so {request.ranks} ranks would be "
            "ignored: drop the ranks, or choose the layout",
            [f"layout tp ranks {request.ranks}", f"layout dp ranks {request.ranks}"],
        )


def finish_plan(
    topo: dict,
    request: PlanRequest,
    build_of_host: dict,
    layout: str,
    dp_mode: str | None,
    reason: str,
    instances: list[dict],
    node_uses: list[dict],
) -> dict:
    """The plan document around placed instances, on CPUs or GPUs alike: every instance
    behind the front door on the public port, the host's class and build."""
    port = request.port
    highest = max(i["port"] for i in instances)
    if highest > MAX_PORT:
        raise PlanError(
            "port",
            f"port {port} leaves no room for the {len(instances)} backend(s) on the ports "
            f"after it (up to {highest}, above {MAX_PORT})",
            [f"port {MAX_PORT - len(instances)}"],
        )
    # Prefix affinity means something between two instances or more; one is leastconn.
    load_balancer = {
        "port": port,
        "balance": request.balance if len(instances) > 1 else "leastconn",
        "backends": [i["port"] for i in instances],
    }
    return {
        "device": request.device,
        "layout": layout,
        "dp_mode": dp_mode,
        "reason": reason,
        "endpoint_port": port,
        "model_gb": request.model_gb,
        "instances": instances,
        "load_balancer": load_balancer,
        "nodes": node_uses,
        "request": asdict(request),
        "hardware_class": hardware_class(topo),
        "build": build_of_host | {"device": build_device(topo, instances)},
    }


# What a build runs on, by the vendor of the GPUs it serves on (`build.device`).
GPU_BUILDS = {"nvidia": "cuda", "amd": "rocm", "intel": "xpu"}


def build_device(topo: dict, instances: list[dict]) -> str:
    """`cpu`, or the GPU build the instances' GPUs need (`cuda` for NVIDIA's)."""
    used = {pci for instance in instances for pci in instance.get("gpus", [])}
    vendors = sorted({g.get("vendor") for g in topo.get("gpus", []) if g["pci"] in used})
    return GPU_BUILDS.get(vendors[0], "cpu") if vendors else "cpu"


def node_use(node: Node, placed: list[dict]) -> dict:
    """Which CPUs of a serving node infer and which are left to the OS (IRQs go there)."""
    inference = sorted(core[0] for r in placed if r["node"] == node.id for core in r["cores"])
    serving = {cpu for r in placed if r["node"] == node.id for core in r["cores"] for cpu in core}
    reserved = sorted(cpu for core in node.cores for cpu in core if cpu not in serving)
    return {"node": node.id, "inference_cpus": inference, "reserved_cpus": reserved}
