"""The `socketwise plan` command: one host's plan (`planner`), or, with several
`--topology` files or `--layout pp`, one model over several hosts (`cluster`).

A thin door: it reads the topology files or detects the host, turns the flags into a
request, and prints the plan as JSON, or one line naming the flag at fault.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..facts import topology
from . import modelfile
from .cluster import ClusterRequest, plan_hosts
from .nodes import PlanError, read_topology
from .planner import PlanRequest, plan

_FLAGS = {
    "layout": "--layout",
    "ranks": "--ranks",
    "model_gb": "--model-gb",
    "reserve_cores": "--reserve-cores",
    "kv_gb": "--kv-gb",
    "concurrency": "--concurrency",
    "crossover": "--crossover",
    "dp_mode": "--dp-mode",
    "topology": "--topology/--root",
    "port": "--port",
    "build_class": "--build-class",
    "device": "--device",
    "gpu_memory_gb": "--gpu-memory-gb",
    "expert_gb": "--expert-gb",
    "dense_layers": "--gguf",
    "gguf": "--gguf",
    "layers": "--model-layers",
    "engine": "--engine",
    "stages": "--stages",
    "master_port": "--master-port",
    "rpc_port": "--rpc-port",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="plan where vLLM ranks run on a host (JSON on stdout)",
        description="Plan the vLLM layout for one host from its topology facts.",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--topology",
        type=Path,
        action="append",
        help="topology JSON (from `socketwise topology`); several, one per host with the "
        "head first, plan a cluster (its file names name the hosts)",
    )
    source.add_argument("--root", default=None, help="detect from this root instead (default /)")
    parser.add_argument(
        "--layout", default="auto", help="sn, tp, dp, pp, hybrid or auto (default auto)"
    )
    parser.add_argument("--ranks", type=int, help="TP or DP ranks (default: one per node)")
    parser.add_argument("--model-gb", type=float, default=0.0, help="weight size in GB")
    parser.add_argument("--reserve-cores", type=int, help="cores per node left to the OS")
    parser.add_argument("--kv-gb", type=int, help="KV cache per rank in GB (default: sized)")
    parser.add_argument("--concurrency", type=float, help="expected concurrent requests")
    parser.add_argument("--crossover", type=float, help="measured SN/DP crossover (concurrency)")
    parser.add_argument(
        "--dp-mode", default="instances", help="instances (behind a LB, default) or vllm"
    )
    parser.add_argument(
        "--split-nodes", action="store_true", help="allow several TP ranks on one node"
    )
    parser.add_argument("--port", type=int, default=8000, help="public port (default 8000)")
    parser.add_argument(
        "--build-class", help="avx2, avx512, amx or zen instead of the detected class"
    )
    parser.add_argument(
        "--device", default="cpu", help="cpu (default) or gpu: what serves the model"
    )
    parser.add_argument(
        "--gpu-memory-gb", type=float, help="each GPU's memory where the topology has none"
    )
    parser.add_argument(
        "--expert-gb", type=float, help="hybrid: the routed experts' share of --model-gb"
    )
    parser.add_argument(
        "--gguf",
        type=Path,
        help="read --model-gb, --model-layers and --expert-gb from this GGUF file",
    )
    cluster = parser.add_argument_group("clusters (several --topology, or --layout pp)")
    cluster.add_argument(
        "--model-layers",
        type=int,
        help="the model's layer count (where hosts split its layers; hybrid)",
    )
    cluster.add_argument("--engine", default="vllm", help="vllm (default) or llamacpp")
    cluster.add_argument("--stages", type=int, help="hosts the pipeline uses (default all)")
    cluster.add_argument("--master-port", type=int, default=29501, help="vLLM's, on the head")
    cluster.add_argument("--rpc-port", type=int, default=50052, help="llama.cpp's first RPC port")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.layout == "pp" or len(args.topology or []) > 1:
        if args.device != "cpu" or args.gpu_memory_gb is not None:
            print(
                "socketwise plan: error: --device: a plan over several hosts runs on their "
                "CPUs; plan GPU hosts one at a time",
                file=sys.stderr,
            )
            return 2
        return _run_cluster(args)
    try:
        topo = _load_topology(args)
        model = _read_gguf(args.gguf) if args.gguf else {}
        result = plan(
            topo,
            PlanRequest(
                layout=args.layout,
                ranks=args.ranks,
                model_gb=args.model_gb or model.get("gb", 0.0),
                reserve_cores=args.reserve_cores,
                kv_gb=args.kv_gb,
                concurrency=args.concurrency,
                crossover=args.crossover,
                dp_mode=args.dp_mode,
                split_nodes=args.split_nodes,
                port=args.port,
                build_class=args.build_class,
                device=args.device,
                gpu_memory_gb=args.gpu_memory_gb,
                expert_gb=args.expert_gb if args.expert_gb is not None else model.get("expert_gb"),
                layers=args.model_layers or model.get("layers"),
                dense_layers=model.get("dense_layers", 0),
            ),
        )
    except PlanError as exc:
        source = args.topology[0] if exc.field == "topology" and args.topology else None
        flag = f"--topology {source}" if source else _FLAGS.get(exc.field, exc.field)
        print(f"socketwise plan: error: {flag}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0


def _run_cluster(args: argparse.Namespace) -> int:
    files = args.topology or []
    source = None
    try:
        if not files:
            raise PlanError("topology", "a cluster plan reads one --topology file per host")
        hosts = []
        for source in files:
            hosts.append((source.stem, read_topology(source)))
        source = None
        result = plan_hosts(
            hosts,
            ClusterRequest(
                model_gb=args.model_gb,
                layers=args.model_layers,
                engine=args.engine,
                stages=args.stages,
                port=args.port,
                master_port=args.master_port,
                rpc_port=args.rpc_port,
                reserve_cores=args.reserve_cores,
                kv_gb=args.kv_gb,
                build_class=args.build_class,
            ),
            args.layout,
        )
    except PlanError as exc:
        flag = f"--topology {source}" if source else _FLAGS.get(exc.field, exc.field)
        print(f"socketwise plan: error: {flag}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0


def _read_gguf(path: Path) -> dict:
    """A GGUF file's size, layers and experts (the hybrid layout's figures)."""
    try:
        return modelfile.describe(path)
    except (modelfile.GgufError, OSError) as exc:
        raise PlanError("gguf", str(exc)) from exc


def _load_topology(args: argparse.Namespace) -> dict:
    if args.topology is None:
        try:
            return topology.detect_here(args.root or "/")
        except topology.TopologyError as exc:
            raise PlanError("topology", str(exc)) from exc
    return read_topology(args.topology[0])
