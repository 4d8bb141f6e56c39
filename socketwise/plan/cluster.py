"""Cluster plans: several hosts serving one model as one endpoint, pipeline parallel.

Plain Python with no Ansible import; `socketwise plan --topology A --topology B --layout pp`
is its door. Rules (docs/guides/clusters.md):

- The head (the first host) runs the front door and the engine's API; the model's layers
  are split over the hosts in order, in proportion to each one's usable memory (every
  NUMA node with CPUs, less the OS reserve), as llama.cpp splits them over its devices;
  each host gets at least one layer.
- `vllm` engine: one pipeline stage per host (vLLM's --nnodes/--node-rank, the split as
  VLLM_PP_LAYER_PARTITION). Inside a host a stage runs on one NUMA node, or tensor
  parallel over the fewest nodes that hold its share when one does not; vLLM needs the
  same TP on every stage, so every host gets the largest any needs.
- `llamacpp` engine: the head's llama-server keeps its share on its own node, and every
  other host runs one ggml-rpc-server per NUMA node with CPUs, bound to it, with one
  thread per physical core of the node (the planned thread count, not the server's
  default of half the hardware threads); the layers are split over the head and those
  servers by usable memory.
- One build for the whole cluster: hosts of different build classes are refused, as are
  more stages than hosts, a model the cluster cannot hold, and ports that clash.
- `hybrid` layout (`llamacpp` only): a cluster of one host whose llama-server keeps a
  mixture of experts' dense weights on a GPU and the experts it cannot hold in system
  memory (socketwise.plan.hybrid plans it); the cluster's units, door and checks serve it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .hwclass import BUILD_CLASSES, BuildRefused, build
from .nodes import Node, PlanError, cpu_nodes, os_reserve_gb, reserve_for
from .planner import plan
from .shape import DEFAULT_PORT, GPU_BUILDS, MAX_PORT, MIN_KV_GB, PlanRequest

ENGINES = ("vllm", "llamacpp")
LAYOUTS = ("pp", "hybrid")


@dataclass(frozen=True)
class ClusterRequest:
    model_gb: float
    layers: int | None = None  # num_hidden_layers: needed where the layers are split
    engine: str = "vllm"
    stages: int | None = None  # hosts used, in order (default: all)
    port: int = DEFAULT_PORT  # the front door, on the head
    master_port: int = 29501  # vLLM's rendezvous (torch.distributed), on the head
    rpc_port: int = 50052  # llama.cpp: the first ggml-rpc-server's port on each worker
    reserve_cores: int | None = None
    kv_gb: int | None = None
    build_class: str | None = None
    layout: str = "pp"
    # hybrid: the experts' share of model_gb, the layers before the first that has
    # experts (a GGUF says both), GPU memory where the topology has none, and the build
    # to run (None: the GPU's, `cpu`: the CPU build, which offloads nothing).
    expert_gb: float | None = None
    dense_layers: int = 0
    gpu_memory_gb: float | None = None
    build_device: str | None = None


def _usable_gb(node: Node) -> float:
    return max(0.0, node.gb - os_reserve_gb(node.gb))


def _split_layers(layers: int, weights: list[float]) -> list[int]:
    """LAYERS over the shares in proportion to WEIGHTS, each at least one (largest
    remainder; ties to the earlier share)."""
    total = sum(weights)
    exact = [layers * w / total for w in weights]
    counts = [max(1, int(x)) for x in exact]
    while sum(counts) > layers:
        i = max(range(len(counts)), key=lambda k: (counts[k] - exact[k], counts[k]))
        counts[i] -= 1
    while sum(counts) < layers:
        i = max(range(len(counts)), key=lambda k: (exact[k] - counts[k], -k))
        counts[i] += 1
    return counts


def _first_layers(counts: list[int]) -> list[int]:
    return [sum(counts[:i]) for i in range(len(counts))]


def _check(hosts: list[tuple[str, dict]], request: ClusterRequest) -> int:
    """Refuse what no cluster plan can hold; the number of stages."""
    if request.engine not in ENGINES:
        raise PlanError(
            "engine", f"unknown engine {request.engine!r}", [f"engine {e}" for e in ENGINES]
        )
    names = [name for name, _ in hosts]
    if len(set(names)) != len(names):
        raise PlanError("topology", f"hosts {names} repeat a name: give each host once")
    if request.layers is None:
        raise PlanError(
            "layers",
            "give the model's layer count (its num_hidden_layers): a pipeline splits the "
            "layers over the hosts",
        )
    if not isinstance(request.layers, int) or request.layers < 1:
        raise PlanError(
            "layers",
            f"layers {request.layers!r} must be the model's layer count (num_hidden_layers)",
        )
    stages = len(hosts) if request.stages is None else request.stages
    if stages < 1 or stages > len(hosts):
        raise PlanError(
            "stages",
            f"{stages} stages for {len(hosts)} host(s): a pipeline has one stage per host",
            [f"stages {k}" for k in range(1, len(hosts) + 1)],
        )
    if stages > request.layers:
        raise PlanError(
            "stages", f"{stages} stages for a model of {request.layers} layers: at most one each"
        )
    ports = {"port": request.port, "master_port": request.master_port, "rpc_port": request.rpc_port}
    for flag, value in ports.items():
        if not 1 <= value <= MAX_PORT:
            raise PlanError(flag, f"{flag.replace('_', ' ')} {value} is not in 1-{MAX_PORT}")
    return stages


def _one_build(hosts: list[tuple[str, dict]], request: ClusterRequest) -> dict:
    builds = {}
    for name, topo in hosts:
        try:
            builds[name] = build(topo, request.build_class)
        except BuildRefused as exc:
            raise PlanError("build_class", f"{name}: {exc}") from exc
    classes = {name: b["class"] for name, b in builds.items()}
    if len(set(classes.values())) > 1:
        listed = ", ".join(f"{name} {cls}" for name, cls in classes.items())
        lowest = min(classes.values(), key=BUILD_CLASSES.index)
        raise PlanError(
            "build_class",
            f"hosts of different build classes ({listed}): one cluster runs one build; set the "
            f"same build class on every host of the cluster (vllm_build_class), such as {lowest} "
            "where every CPU runs it",
        )
    return next(iter(builds.values()))


def _host_request(
    request: ClusterRequest, layout: str, weights_gb: float, ranks=None
) -> PlanRequest:
    return PlanRequest(
        layout=layout, ranks=ranks, model_gb=weights_gb, reserve_cores=request.reserve_cores,
        kv_gb=request.kv_gb, port=request.port, build_class=request.build_class,
        own_front_end=False,
    )  # fmt: skip


def _vllm_stages(hosts, counts, request: ClusterRequest) -> tuple[int, list[dict]]:
    """Each host's stage (its COUNTS layers): SN where its share fits one node, else the TP
    every host can run."""
    shares = [request.model_gb * c / request.layers for c in counts]
    needed = []
    for (name, topo), share in zip(hosts, shares, strict=True):
        try:
            needed.append(plan(topo, _host_request(request, "auto", share))["instances"][0]["tp"])
        except PlanError as exc:
            raise PlanError(
                "model_gb", f"{name}: its share, {share:.1f} GB of weights, does not fit: {exc}"
            ) from exc
    tp = max(needed)
    placed = []
    layout, ranks = ("tp", tp) if tp > 1 else ("sn", 1)
    for (name, topo), share, count in zip(hosts, shares, counts, strict=True):
        try:
            instance = plan(topo, _host_request(request, layout, share, ranks))["instances"][0]
        except PlanError as exc:
            raise PlanError(
                "model_gb",
                f"{name}: every stage runs TP-{tp} (vLLM needs one TP for all), which this host "
                f"cannot: {exc}",
            ) from exc
        placed.append({"layers": count, "stage": _stage(instance), "rpc_servers": []})
    return tp, placed


def _stage(instance: dict) -> dict:
    keep = ("ranks", "omp_threads_bind", "membind", "cpus_allowed", "kvcache_gb")
    return {key: instance[key] for key in keep}


def _devices(hosts: list[tuple[str, dict]], request: ClusterRequest) -> list[dict]:
    """llama.cpp's devices in its order: the head's llama-server on the head's serving node,
    then one ggml-rpc-server per NUMA node with CPUs of every other host."""
    head_name, head_topo = hosts[0]
    head = plan(head_topo, _host_request(request, "sn", 0.0))["instances"][0]
    head_node = head["ranks"][0]["node"]
    node = next(n for n in cpu_nodes(head_topo) if n.id == head_node)
    devices = [{"host": head_name, "node": head_node, "gb": _usable_gb(node), "stage": head}]
    for name, topo in hosts[1:]:
        for index, node in enumerate(sorted(cpu_nodes(topo), key=lambda n: n.id)):
            cores = node.cores[: len(node.cores) - reserve_for(node, request.reserve_cores)]
            cpus = [core[0] for core in cores]
            devices.append(
                {"host": name, "node": node.id, "gb": _usable_gb(node), "cpus": cpus,
                 "port": request.rpc_port + index}
            )  # fmt: skip
    return devices


def _llamacpp_hosts(hosts, request: ClusterRequest) -> tuple[list[dict], dict]:
    devices = _devices(hosts, request)
    counts = _split_layers(request.layers, [d["gb"] for d in devices])
    for device, count in zip(devices, counts, strict=True):
        weights = request.model_gb * count / request.layers
        if device["gb"] - weights < MIN_KV_GB:
            raise PlanError(
                "model_gb",
                f"{device['host']}: node {device['node']} would hold {weights:.1f} GB of weights "
                f"in {device['gb']:.1f} GB usable, less than {MIN_KV_GB} GB left for its cache",
            )
        device["layers"] = count
    head = devices[0]
    workers = devices[1:]
    by_host: dict[str, list[dict]] = {}
    for device in workers:
        by_host.setdefault(device["host"], []).append(device)
    planned = [
        {"layers": head["layers"], "stage": _stage(head["stage"]), "rpc_servers": []},
        *[
            {
                "layers": sum(d["layers"] for d in by_host[name]),
                "stage": None,
                "rpc_servers": [
                    {
                        "node": d["node"],
                        "cpus": d["cpus"],
                        "threads": len(d["cpus"]),
                        "port": d["port"],
                        "layers": d["layers"],
                    }
                    for d in by_host[name]
                ],
            }
            for name, _ in hosts[1:]
        ],
    ]
    # llama-server keeps the first layers (and the input embedding) on its own CPU and
    # puts the rest on the RPC devices in --rpc order, split by --tensor-split. It counts
    # the output layer as one more (n_gpu_layers = L + 1 - the head's), so the last RPC
    # server's share is one more too: with whole counts the split falls exactly on them
    # (llama-model.cpp compares count/total with count/total, the same float).
    split = [d["layers"] for d in workers]
    if split:
        split[-1] += 1
    llama = {
        "n_gpu_layers": request.layers + 1 - head["layers"],
        "tensor_split": split,
        "rpc": [f"{d['host']}:{d['port']}" for d in workers],
    }
    return planned, llama


def plan_hosts(hosts: list[tuple[str, dict]], request: ClusterRequest, layout: str) -> dict:
    """`pp`: plan_cluster. `auto`: the first host the model fits alone serves it alone (its
    own plan, with `host`; the layer count is not needed), else pipeline parallel over the
    hosts (which needs it)."""
    if layout == "pp":
        return plan_cluster(hosts, request)
    if layout != "auto":
        raise PlanError(
            "layout",
            f"layout {layout} plans one host: give one topology",
            ["layout pp", "layout auto"],
        )
    refused = []
    for name, topo in hosts:
        try:
            alone = plan(topo, _host_request(request, "auto", request.model_gb))
        except PlanError as exc:
            refused.append(f"{name}: {exc}")
            continue
        alone["host"] = name
        alone["reason"] = (
            f"auto: model {request.model_gb:g} GB fits one host ({name}), so it serves alone, "
            f"no pipeline across hosts; {alone['reason']}"
        )
        return alone
    if request.layers is None:
        raise PlanError(
            "layers",
            f"no host serves the model alone ({'; '.join(refused)}), so auto pipelines it "
            "over the hosts, which splits its layers between them: give the model's layer "
            "count (its num_hidden_layers)",
        )
    clustered = plan_cluster(hosts, request)
    clustered["reason"] = (
        f"auto: model {request.model_gb:g} GB fits no single host, so it is pipelined over "
        f"{len(clustered['hosts'])} of them; {clustered['reason']}"
    )
    return clustered


def plan_cluster(hosts: list[tuple[str, dict]], request: ClusterRequest) -> dict:
    """Plan HOSTS ([(name, topology)], the head first) serving one model pipeline parallel,
    or (layout `hybrid`) one host serving a mixture of experts on its GPU and CPUs.
    Raises PlanError, naming the host where one is at fault."""
    if not hosts:
        raise PlanError("topology", "a cluster needs its head: give at least one host")
    if request.layout not in LAYOUTS:
        raise PlanError(
            "layout", f"unknown layout {request.layout!r}", [f"layout {x}" for x in LAYOUTS]
        )
    stages = _check(hosts, request)
    if request.layout == "hybrid":
        return _hybrid_host(hosts, request)
    if request.build_device not in (None, "cpu"):
        raise PlanError(
            "build_device", f"a {request.layout} cluster runs on CPUs, not {request.build_device}"
        )
    hosts = hosts[:stages]
    built = _one_build(hosts, request) | {"device": "cpu"}
    usable = [sum(_usable_gb(n) for n in cpu_nodes(topo)) for _, topo in hosts]
    total = sum(usable)
    if total - request.model_gb < MIN_KV_GB * stages:
        raise PlanError(
            "model_gb",
            f"model of {request.model_gb:g} GB does not fit even the whole cluster: "
            f"{', '.join(f'{n} {u:.0f} GB' for (n, _), u in zip(hosts, usable, strict=True))} "
            f"usable ({total:.0f} GB in all), less {MIN_KV_GB} GB of cache per host",
        )
    # The head's engine serves its API on a Unix socket: the front door's port and vLLM's
    # rendezvous are its only TCP ports.
    if request.engine == "vllm" and request.master_port == request.port:
        raise PlanError(
            "port",
            f"ports clash on the head {hosts[0][0]}: the front door {request.port} and vLLM's "
            f"master port {request.master_port} must differ",
            [f"master port {request.port + 1}"],
        )
    if request.engine == "vllm":
        counts = _split_layers(request.layers, usable)
        tp, placed = _vllm_stages(hosts, counts, request)
        engine = {"tp": tp, "layer_partition": ",".join(map(str, counts)),
                  "master_port": request.master_port}  # fmt: skip
    else:
        placed, engine = _llamacpp_hosts(hosts, request)
    highest = max((s["port"] for p in placed for s in p["rpc_servers"]), default=0)
    if highest > MAX_PORT:
        raise PlanError("rpc_port", f"RPC ports from {request.rpc_port} run past {MAX_PORT}")
    firsts = _first_layers([p["layers"] for p in placed])
    plans = []
    for rank, ((name, _), entry, first) in enumerate(zip(hosts, placed, firsts, strict=True)):
        ports = {"front_door": request.port} if rank == 0 else {}
        if request.engine == "vllm" and rank == 0:
            ports["master"] = request.master_port
        plans.append(
            {"host": name, "rank": rank, "role": "head" if rank == 0 else "worker",
             "layers": {"first": first, "count": entry["layers"]},
             "weights_gb": round(request.model_gb * entry["layers"] / request.layers, 3),
             "usable_gb": round(usable[rank], 1), "stage": entry["stage"],
             "rpc_servers": entry["rpc_servers"],
             "ports": ports | {"rpc": [s["port"] for s in entry["rpc_servers"]]}}
        )  # fmt: skip
    split = ", ".join(f"{p['host']} {p['layers']['count']}" for p in plans)
    return {
        "device": "cpu",
        "layout": "pp",
        "engine": request.engine,
        "reason": f"pp over {stages} host(s), layers by usable memory: {split}",
        "endpoint_port": request.port,
        "model_gb": request.model_gb,
        "model_layers": request.layers,
        "head": hosts[0][0],
        "engine_settings": engine,
        "hosts": plans,
        "build": built,
        "request": asdict(request),
    }


def _hybrid_host(hosts: list[tuple[str, dict]], request: ClusterRequest) -> dict:
    """The hybrid plan of the one host, in a cluster plan's shape: the head alone, its
    stage the hybrid server's CPUs and nodes, the llama-server flags in engine_settings."""
    if request.engine != "llamacpp" or len(hosts) != 1:
        raise PlanError(
            "layout",
            "a hybrid server is one host running llama.cpp: "
            + ("set the engine to llamacpp" if request.engine != "llamacpp"
               else f"give one host, not {len(hosts)} ({', '.join(n for n, _ in hosts)})"),
        )  # fmt: skip
    name, topo = hosts[0]
    planned = plan(
        topo,
        PlanRequest(
            layout="hybrid", model_gb=request.model_gb, reserve_cores=request.reserve_cores,
            kv_gb=request.kv_gb, port=request.port, build_class=request.build_class,
            gpu_memory_gb=request.gpu_memory_gb, expert_gb=request.expert_gb,
            layers=request.layers, dense_layers=request.dense_layers,
        ),
    )  # fmt: skip
    (instance,) = planned["instances"]
    hybrid = planned["hybrid"]
    built = dict(planned["build"])
    reason = planned["reason"]
    if request.build_device not in (None, built["device"]):
        if request.build_device != "cpu":
            raise PlanError(
                "build_device",
                f"build {request.build_device!r} for GPU {hybrid['gpu']}, which needs "
                f"{built['device']}: leave it unset, or cpu to run without offloading",
                [f"build device {built['device']}", "build device cpu"],
            )
        built["device"] = "cpu"
        reason += "; CPU build: the flags are the plan's, but nothing is offloaded"
    elif built["device"] not in ("cpu", GPU_BUILDS["nvidia"]):
        raise PlanError(
            "build_device",
            f"GPU {hybrid['gpu']} needs a {built['device']} build of llama.cpp, which the kit "
            "does not make: serve on an NVIDIA GPU (cuda), or cpu to run without offloading",
            ["build device cpu"],
        )
    head = {
        "host": name, "rank": 0, "role": "head", "layers": {"first": 0, "count": request.layers},
        "weights_gb": request.model_gb,
        "usable_gb": round(sum(_usable_gb(n) for n in cpu_nodes(topo)), 1),
        "stage": _stage(instance), "rpc_servers": [],
        "ports": {"front_door": request.port, "rpc": []},
    }  # fmt: skip
    engine = {
        "n_gpu_layers": "all",
        "n_cpu_moe": hybrid["n_cpu_moe"],
        "numa": hybrid["numa"],
        "threads": hybrid["threads"],
        "gpus": instance["gpus"],
        "cuda_visible_devices": instance["cuda_visible_devices"],
        "gpu_minors": instance["gpu_minors"],
        "tensor_split": [],
        "rpc": [],
    }
    return {
        "device": "gpu",
        "layout": "hybrid",
        "engine": "llamacpp",
        "reason": reason,
        "endpoint_port": request.port,
        "model_gb": request.model_gb,
        "model_layers": request.layers,
        "head": name,
        "engine_settings": engine,
        "hosts": [head],
        "hybrid": hybrid,
        # The host's own plan's: its one instance (behind the door) and the nodes it uses,
        # which the host tuning reads as it reads any host's plan.
        "instances": planned["instances"],
        "nodes": planned["nodes"],
        "build": built,
        "request": asdict(request),
    }
