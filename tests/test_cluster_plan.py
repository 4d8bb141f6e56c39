"""Cluster plans over 2-4 fixture hosts: layers split by usable memory, each host's stage
on its NUMA nodes, llama.cpp's RPC servers one per node, and every refusal in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
from ansible.plugins.filter.core import comment

from socketwise.facts.topology import detect
from socketwise.plan.cluster import ClusterRequest, plan_cluster, plan_hosts
from socketwise.plan.nodes import PlanError
from socketwise.serve.limits import stage_limits
from socketwise.serve.unitvalues import quote

from .machines import build_machine
from .playbooks import REPO


@pytest.fixture
def hosts(tmp_path):
    """hosts("r730", "milan") -> [("r730", topology), ("milan", topology)]; a name seen
    twice gets a number (two servers of one kind)."""

    def load(*names: str) -> list[tuple[str, dict]]:
        loaded = []
        for i, name in enumerate(names):
            label = name if names.count(name) == 1 else f"{name}-{i + 1}"
            loaded.append((label, detect(build_machine(name, tmp_path / label))))
        return loaded

    return load


def test_two_even_hosts_split_the_layers_evenly_and_shard_a_big_share_over_both_nodes(hosts):
    # 150 GB over two R730s: 75 GB each does not fit one 64 GB node, so TP-2 inside each.
    plan = plan_cluster(hosts("r730", "r730"), ClusterRequest(model_gb=150, layers=32))
    assert plan["engine_settings"] == {"tp": 2, "layer_partition": "16,16", "master_port": 29501}
    head, worker = plan["hosts"]
    assert (head["role"], head["layers"], head["ports"]) == (
        "head",
        {"first": 0, "count": 16},
        {"front_door": 8000, "master": 29501, "rpc": []},
    )
    assert (worker["role"], worker["layers"], worker["ports"]) == (
        "worker",
        {"first": 16, "count": 16},
        {"rpc": []},
    )
    # Socket 0 holds the even CPUs, socket 1 the odd ones: one rank on each, 12 cores each.
    stage = worker["stage"]
    assert stage["membind"] == [0, 1]
    assert stage["omp_threads_bind"].split("|") == [
        ",".join(str(c) for c in range(0, 24, 2)),
        ",".join(str(c) for c in range(1, 24, 2)),
    ]
    assert worker["weights_gb"] == 75.0


def test_uneven_hosts_get_layers_in_proportion_to_their_usable_memory(hosts):
    # R730: 2 x 64 GB; Milan: 2 x 256 GB. Usable (less 10 % OS reserve) 115.2 against 460.8.
    plan = plan_cluster(hosts("r730", "milan"), ClusterRequest(model_gb=150, layers=61))
    counts = [h["layers"]["count"] for h in plan["hosts"]]
    assert counts == [12, 49] and sum(counts) == 61
    assert plan["engine_settings"]["layer_partition"] == "12,49"
    assert [h["usable_gb"] for h in plan["hosts"]] == [115.2, 460.8]
    # Each share fits one node of its host: one stage on one node, no TP.
    assert plan["engine_settings"]["tp"] == 1
    assert all(len(h["stage"]["membind"]) == 1 for h in plan["hosts"])
    assert plan["reason"] == "pp over 2 host(s), layers by usable memory: r730 12, milan 49"


def test_three_and_four_hosts_each_take_a_stage_in_order(hosts):
    plan = plan_cluster(hosts("vm", "vm", "vm", "vm"), ClusterRequest(model_gb=100, layers=30))
    assert [h["rank"] for h in plan["hosts"]] == [0, 1, 2, 3]
    assert [h["layers"]["count"] for h in plan["hosts"]] == [8, 8, 7, 7]
    assert [h["layers"]["first"] for h in plan["hosts"]] == [0, 8, 16, 23]
    three = plan_cluster(
        hosts("vm", "vm", "vm", "vm"), ClusterRequest(model_gb=60, layers=30, stages=3)
    )
    assert [h["host"] for h in three["hosts"]] == ["vm-1", "vm-2", "vm-3"]


def test_llamacpp_puts_one_rpc_server_per_node_with_a_thread_per_physical_core(hosts):
    # Zen 4 head with 2 nodes, Zen 4 worker in NPS4 mode with 8: different node counts.
    plan = plan_cluster(
        hosts("epyc2s", "epyc-nps4"), ClusterRequest(model_gb=600, layers=61, engine="llamacpp")
    )
    head, worker = plan["hosts"]
    servers = worker["rpc_servers"]
    assert [s["node"] for s in servers] == list(range(8))
    assert [s["port"] for s in servers] == list(range(50052, 50060))
    # 16 cores a node, 2 left to the OS: 14 threads, the server's default would be half the
    # host's hardware threads for each of them.
    assert {s["threads"] for s in servers} == {14} and all(len(s["cpus"]) == 14 for s in servers)
    assert len({c for s in servers for c in s["cpus"]}) == 8 * 14
    settings = plan["engine_settings"]
    assert settings["rpc"] == [f"epyc-nps4:{port}" for port in range(50052, 50060)]
    # llama-server counts the output layer as one more, on the last server.
    assert settings["tensor_split"] == [s["layers"] for s in servers[:-1]] + [
        servers[-1]["layers"] + 1
    ]
    # llama-server keeps the first layers on its own CPU: the rest go to the RPC servers.
    assert settings["n_gpu_layers"] == 61 + 1 - head["layers"]["count"]
    assert head["layers"]["count"] + sum(settings["tensor_split"]) == 61 + 1
    # One node of 384 GB on the head against 8 of 96: a third of the usable memory, 20.3
    # layers, and the layer left over by the rounding (5.08 on each RPC server).
    assert head["layers"]["count"] == 21 and head["stage"]["membind"] == [0]
    assert settings["tensor_split"] == [5] * 7 + [6]


@pytest.mark.parametrize(
    ("names", "request_values", "field", "words"),
    [
        (("vm", "vm"), {"stages": 3}, "stages", "3 stages for 2 host(s)"),
        (("vm", "vm"), {"model_gb": 80}, "model_gb", "does not fit even the whole cluster"),
        # 57.6 GB usable on the two: 1.6 GB left, less than 1 GB of cache on each host.
        (("vm", "vm"), {"model_gb": 56}, "model_gb", "less 1 GB of cache per host"),
        (("r730", "epyc2s"), {}, "build_class", "different build classes (r730 avx2, epyc2s zen)"),
        # The class it suggests is one every CPU of the cluster runs: AVX2 on a Zen too.
        (("epyc2s", "r730"), {}, "build_class", "such as avx2 where every CPU runs it"),
        (("vm", "vm"), {"master_port": 8000}, "port", "ports clash on the head vm-1"),
        (("vm", "vm"), {"engine": "mpi"}, "engine", "unknown engine 'mpi'"),
        (("vm", "vm"), {"layers": 1}, "stages", "2 stages for a model of 1 layers"),
        (("epyc2s", "epyc-nps4"), {"model_gb": 1000}, "model_gb", "every stage runs TP-6"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_in_one_line_naming_the_fix(
    hosts, names, request_values, field, words
):
    values = {"model_gb": 10, "layers": 32} | request_values
    with pytest.raises(PlanError) as refused:
        plan_cluster(hosts(*names), ClusterRequest(**values))
    assert refused.value.field == field
    assert words in str(refused.value) and "\n" not in str(refused.value)


def test_a_cluster_needs_its_head():
    with pytest.raises(PlanError, match="a cluster needs its head"):
        plan_cluster([], ClusterRequest(model_gb=10, layers=32))


def test_auto_pipelines_only_a_model_no_single_host_holds(hosts):
    small = plan_hosts(hosts("r730", "milan"), ClusterRequest(model_gb=8, layers=32), "auto")
    assert (small["layout"], small["host"]) == ("sn", "r730")
    assert small["reason"].startswith("auto: model 8 GB fits one host (r730), so it serves alone")
    # 300 GB: more than the R730 holds, and more than one Milan node; the Milan holds it
    # sharded over both of its nodes, so it still serves alone there.
    mid = plan_hosts(hosts("r730", "milan"), ClusterRequest(model_gb=300, layers=32), "auto")
    assert (mid["layout"], mid["host"]) == ("tp", "milan")
    big = plan_hosts(hosts("r730", "milan"), ClusterRequest(model_gb=500, layers=32), "auto")
    assert big["layout"] == "pp" and big["reason"].startswith(
        "auto: model 500 GB fits no single host, so it is pipelined over 2 of them"
    )


def test_auto_needs_the_layer_count_only_where_it_splits_the_layers(hosts):
    two = hosts("r730", "milan")
    small = plan_hosts(two, ClusterRequest(model_gb=8), "auto")
    assert (small["layout"], small["host"]) == ("sn", "r730")
    with pytest.raises(PlanError) as refused:
        plan_hosts(two, ClusterRequest(model_gb=500), "auto")
    assert refused.value.field == "layers"
    message = str(refused.value)
    assert message.startswith("no host serves the model alone (r730: model 500 GB fits no node")
    assert "; milan: model 500 GB fits no node" in message and "\n" not in message
    assert message.endswith(
        "so auto pipelines it over the hosts, which splits its layers between them: give the "
        "model's layer count (its num_hidden_layers)"
    )
    with pytest.raises(PlanError, match="a pipeline splits the layers over the hosts"):
        plan_hosts(two, ClusterRequest(model_gb=8), "pp")


def socketwise(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "socketwise.cli", *args], capture_output=True, text=True
    )


def test_cli_plans_a_cluster_from_one_topology_file_per_host(hosts, tmp_path):
    files = []
    for name, topo in hosts("r730", "milan"):
        files += ["--topology", str(tmp_path / f"{name}.json")]
        Path(files[-1]).write_text(json.dumps(topo))
    done = socketwise("plan", *files, "--layout", "pp", "--model-gb", "150", "--model-layers", "61")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert [h["host"] for h in plan["hosts"]] == ["r730", "milan"]
    refused = socketwise("plan", *files, "--layout", "pp", "--model-gb", "150")
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "socketwise plan: error: --model-layers: give the model's layer count "
        "(its num_hidden_layers): a pipeline splits the layers over the hosts"
    )
    # auto: a model one host holds needs no layer count; one that must be split does.
    alone = socketwise("plan", *files, "--model-gb", "8")
    assert alone.returncode == 0, alone.stderr
    assert (json.loads(alone.stdout)["layout"], json.loads(alone.stdout)["host"]) == ("sn", "r730")
    refused = socketwise("plan", *files, "--model-gb", "500")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith(
        "socketwise plan: error: --model-layers: no host serves the model alone (r730: "
    )
    assert "splits its layers between them: give the model's layer count" in refused.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    refused = socketwise("plan", *files, "--topology", str(bad), "--model-layers", "61")
    assert refused.returncode == 2 and f"{bad}: malformed topology" in refused.stderr


def _stage_unit(plan: dict, host: str, **values) -> str:
    """templates/vllm-pp.service.j2 as the cluster role renders it on HOST."""
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(REPO / "templates"), keep_trailing_newline=True,
        trim_blocks=True,
    )  # fmt: skip
    environment.filters.update(
        comment=comment,
        **{"socketwise.kit.systemd_quote": quote},
        dirname=os.path.dirname,
        basename=os.path.basename,
    )
    me = next(entry for entry in plan["hosts"] if entry["host"] == host)
    addresses = {entry["host"]: f"10.0.0.{entry['rank'] + 1}" for entry in plan["hosts"]}
    variables = {
        "ansible_managed": "Ansible managed", "socketwise_cluster": "r1",
        "socketwise_cluster_plan": plan, "socketwise_build": plan["build"],
        "socketwise_cluster_address": addresses[host], "__cluster_me": me,
        "__cluster_is_head": me["rank"] == 0,
        "__cluster_api_socket": "/run/socketwise-cluster/api.sock",
        "__cluster_master": f"10.0.0.1:{plan['engine_settings']['master_port']}",
        "__cluster_master_address": "10.0.0.1", "__cluster_plan_id": "0123456789ab",
        "__cluster_member_addresses": list(addresses.values()),
        "__cluster_dir": "/etc/socketwise/cluster",
        "vllm_service_engine_group": "socketwise-engines",
        # Where the vllm role's prepare published the install, and how units run it.
        "vllm_paths": {"home": "/opt/socketwise", "venv": "/opt/socketwise/venvs/abc"},
        "vllm_engine": {"method": "venv", "user": "vllm", "hf_id": "", "container_cgroups": True},
        "vllm_model": "/opt/socketwise/models/tiny llama 50%", "vllm_served_name": "tiny-llama",
        "vllm_service_engine": {"dtype": "", "environment": {}, "extra_args": []},
        "vllm_service_typed": {"vllm_service_max_model_len": None},
        "door_backend_address": "127.0.0.1", "__cluster_stage_limits": stage_limits(me),
        # The filter's unit is tests/test_unit_security.py's: this unit does not require it.
        "__cluster_filtering": False, "__cluster_hosts_file": "/etc/socketwise/cluster/hosts",
        "__cluster_unit_allow": ["localhost", *addresses.values()],
    }  # fmt: skip
    return environment.get_template("vllm-pp.service.j2").render(variables | values)


def test_each_stage_unit_carries_its_rank_split_and_placement_and_passes_systemd(hosts, tmp_path):
    plan = plan_cluster(hosts("r730", "r730"), ClusterRequest(model_gb=150, layers=32))
    hostile = '50% of $HOME "quoted"'
    for host, role in (("r730-1", "head"), ("r730-2", "follower")):
        engine = {"dtype": "", "environment": {}, "extra_args": ["--note", hostile]}
        text = _stage_unit(plan, host, vllm_service_engine=engine)
        unit = tmp_path / "socketwise-pp-vllm.service"
        unit.write_text(text)
        done = subprocess.run(
            ["systemd-analyze", "verify", f"{unit}:socketwise-pp-vllm.service"],
            capture_output=True, text=True,
        )  # fmt: skip
        # The venv does not exist on the controller; nothing else may be wrong.
        assert [line for line in done.stderr.splitlines()
                if line.strip() and "/opt/socketwise/venvs/abc" not in line] == []  # fmt: skip
        entry = next(e for e in plan["hosts"] if e["host"] == host)
        assert f"--role {role} \\" in text and "--plan-id 0123456789ab" in text
        assert f"--node-rank {entry['rank']} \\" in text
        assert "VLLM_PP_LAYER_PARTITION=16,16" in text and "--tensor-parallel-size 2" in text
        assert f"CPUAffinity={' '.join(map(str, entry['stage']['cpus_allowed']))}" in text
        assert "IPAddressDeny=any\nIPAddressAllow=localhost 10.0.0.1 10.0.0.2" in text
        # The model path and every argument reach vLLM as single words.
        assert '--model "/opt/socketwise/models/tiny llama 50%%" \\' in text
        assert (role == "head") == ("EnvironmentFile=/etc/socketwise/cluster/vllm.env" in text)
        assert (role == "follower") == ("--headless" in text)
