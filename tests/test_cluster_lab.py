"""One model served by several lab machines with llama.cpp RPC: deploy.yml with a
`socketwise_cluster` group, on two machines and then three, behind the head's front door.

One lab of three machines for the module, and the stages build on each other: two hosts
(cluster1 the head, cluster2 a worker), then cluster3 joins, then workers fail. What is
asserted is what a user of a cluster sees: a real completion through the front door, the same greedy
answer whatever the number of hosts, every RPC server holding layers and running where
the plan put it with the planned thread count, nothing but the front door on a public
address, the key nowhere but its root-only files, and an endpoint that goes down with a
worker and comes back with it. Bad cluster input stops before any host changes. Last, one
machine serves a mixture of experts as a hybrid server (cluster_layout: hybrid), planned
from its topology with one fixture GPU added.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from socketwise.build import llamacpp
from socketwise.common.paths import cache_dir
from socketwise.facts.files import parse_cpulist
from socketwise.facts.topology import detect
from socketwise.lab.common import scrape_token_path
from socketwise.plan.hwclass import isa_class

from . import frontdoor
from .clusters import (
    API_PORT,
    GREEDY,
    HEAD,
    HEAD_UNIT,
    NOBODY,
    NOT_THE_DOOR,
    PORT,
    RPC_PORT,
    RPC_UNIT,
    STRANGER,
    WATCHER_ADDRESS,
    Cluster,
    assert_filter_survives_the_firewall_service,
    controller_tables,
    engines_group,
    invoke_api,
    knock,
    lab_cluster,
    table,
    tables_of,
)
from .labs import asked, left_out
from .playbooks import BIN, REPO, PlaybookRun, run_playbook

# The first deploy builds llama.cpp's two programs on the controller: about 20 minutes of
# its two cores, which a run beside the other labs cannot pay within CI's time. The module
# runs where that build is in the cache (`python -m socketwise.build.llamacpp CLASS` makes
# it, once per source and flags) or when SOCKETWISE_LLAMACPP_LAB=1 asks for the build;
# otherwise the run's summary (-ra) says it was left out and why.
CLASS = isa_class(detect())
BUILD = llamacpp.build_dir(CLASS)
ASK_BUILD = "SOCKETWISE_LLAMACPP_LAB"
pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(
        not llamacpp.is_complete(BUILD) and not asked(ASK_BUILD),
        reason=left_out(
            f"the llama.cpp cluster module, whose programs are not built in {BUILD} (build "
            f"them with `.venv/bin/python -m socketwise.build.llamacpp {CLASS}`, about 20 "
            "minutes on two cores)",
            ASK_BUILD,
        ),
    ),
]


# The cluster's readiness of its filters, alone: the port_filter role's check on each member.
FILTERED = """
- name: Check that the engine ports are kept to the members
  hosts: cluster_a
  gather_facts: false
  tasks:
    - name: Check the table
      ansible.builtin.include_role:
        name: port_filter
        tasks_from: loaded
      vars:
        port_filter_name: cluster
"""


def buffers_mib(cluster: Cluster) -> dict[str, float]:
    """{RPC endpoint: MiB of the model llama-server puts there}: the head's own command line
    (its unit's ExecStart) run once by hand with the log level that shows it, while the unit
    is stopped (an RPC server serves one client at a time), then the unit started again."""
    lines = cluster.on(HEAD, f"cat /etc/systemd/system/{HEAD_UNIT}").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ExecStart="))
    words = [lines[start].removeprefix("ExecStart=")]
    while words[-1].endswith("\\"):
        words[-1] = words[-1].removesuffix("\\")
        start += 1
        words.append(lines[start])
    command = " ".join(words)
    cluster.on(HEAD, f"systemctl stop {HEAD_UNIT}")
    try:
        # In the engines' group, which alone reaches the RPC servers from a member; on a
        # TCP port of its own (the unit's API socket goes with its runtime directory).
        log = cluster.on(
            HEAD, f"timeout 10 setpriv --regid={engines_group(cluster, HEAD)} --clear-groups "
            f"{command} --host 127.0.0.1 --port 18999 --log-verbosity 4 --log-colors off 2>&1 "
            "| grep 'model buffer size' || true"
        )  # fmt: skip
    finally:
        cluster.on(HEAD, f"systemctl start {HEAD_UNIT}")
        cluster.wait_for("serving again", lambda: cluster.completion()[0] == 200)
    found = {}
    for line in log.splitlines():
        match = re.search(r"RPC\d+\[([^\]]+)\] model buffer size = +([\d.]+) MiB", line)
        if match:
            found[match.group(1)] = float(match.group(2))
    return found


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    # A monitor host in the inventory: every member serves a metrics door.
    with lab_cluster(tmp_path_factory, monitored=True) as built:
        yield built


@pytest.fixture(scope="module")
def two_hosts(cluster: Cluster) -> PlaybookRun:
    return cluster.deployed(["cluster1", "cluster2"])


@pytest.fixture(scope="module")
def dense_answer(cluster: Cluster, two_hosts) -> str:
    """The greedy answer of the built-in model over two hosts, taken while they serve it."""
    status, answer = cluster.completion()
    assert status == 200, answer
    return answer["choices"][0]["text"]


def test_bad_cluster_input_stops_before_any_host_changes(cluster: Cluster):
    cluster3 = cluster.machines["cluster3"]
    before = cluster.on("cluster3", "ls /etc/systemd/system; ls /opt")
    alone = ["-e", "socketwise_cluster_head=cluster3"]  # a cluster of cluster3 alone
    cases = [
        (["-e", "socketwise_cluster_head=cluster9"],
         "socketwise_cluster_head=cluster9: cluster a has no such host"),
        ([*alone, "-e", "cluster_address=8.8.8.8"],
         "cluster_address='8.8.8.8': is not allowed here"),
        ([*alone, "-e", "socketwise_engine=sglang"],
         "socketwise_engine=sglang: not an engine; set socketwise_engine to vllm"),
        ([*alone, "-e", json.dumps({"socketwise_engine": "vllm",
                                    "vllm_service_extra_args": ["--enforce-eager"]})],
         "--enforce-eager breaks vLLM's pipeline parallel on CPU"),
        ([*alone, "-e", "cluster_rpc_port=70000"],
         "cluster_rpc_port=70000: rpc port 70000 is not in"),
    ]  # fmt: skip
    for extra, said in cases:
        done = cluster.deploy(["cluster3"], *extra)
        assert done.returncode != 0, extra
        assert said in done.output, (extra, done.output[-2000:])
    assert cluster.on("cluster3", "ls /etc/systemd/system; ls /opt") == before
    assert not frontdoor.answers(cluster3.address, PORT)


def test_two_hosts_serve_one_model_through_the_front_door(
    cluster: Cluster, two_hosts, dense_answer
):
    status, answer = cluster.completion()
    assert status == 200, answer
    assert answer["choices"][0]["text"] == dense_answer
    assert answer["usage"]["completion_tokens"] == GREEDY["max_tokens"]
    # The head keeps two layers, cluster2's RPC server the other two (and the output layer).
    plan = cluster.summary()["plan"]
    assert [(h["host"], h["layers"]["count"]) for h in plan["hosts"]] == [
        ("cluster1", 2),
        ("cluster2", 2),
    ]
    endpoint = f"{cluster.cluster_address('cluster2')}:{RPC_PORT}"
    assert cluster.summary()["rpc"] == [endpoint]
    # The head holds a connection to the worker's RPC server (the deploy's own check).
    assert cluster.summary()["connections"][endpoint]
    unit = cluster.on("cluster1", f"cat /etc/systemd/system/{HEAD_UNIT}")
    assert f"--rpc {endpoint}" in unit and "--n-gpu-layers 3" in unit


def test_every_server_runs_where_planned_with_the_planned_threads(cluster: Cluster, two_hosts):
    summary = cluster.summary()
    worker = summary["plan"]["hosts"][1]["rpc_servers"][0]
    (rpc,) = summary["hosts"]["cluster2"]
    assert rpc["unit"] == RPC_UNIT
    argv = rpc["argv"]
    # One thread per physical core of the node: the plan's count, given explicitly.
    assert argv[argv.index("--threads") + 1] == str(worker["threads"]) == "2"
    for process in rpc["processes"]:
        assert process["thread_cpus"] == worker["cpus"]
    (head,) = summary["hosts"]["cluster1"]
    for process in head["processes"]:
        assert process["thread_cpus"] == summary["plan"]["hosts"][0]["stage"]["cpus_allowed"]
    # Read again on the host, not from the kit's own report.
    pid = cluster.on("cluster2", f"systemctl show -p MainPID --value {RPC_UNIT}")
    allowed = cluster.on("cluster2", f"grep Cpus_allowed_list /proc/{pid}/task/*/status | sort -u")
    assert {line.split()[-1] for line in allowed.splitlines()} == {"0-1"}


def test_only_the_front_door_is_public_and_the_key_stays_in_its_files(cluster: Cluster, two_hosts):
    assert frontdoor.answers(cluster.address(HEAD), PORT)
    assert not frontdoor.answers(cluster.address(HEAD), API_PORT)
    assert not frontdoor.answers(cluster.address("cluster2"), RPC_PORT)
    status, _ = frontdoor.call(cluster.address(HEAD), PORT, "/v1/completions", None, GREEDY)
    assert status == 401
    status, _ = frontdoor.call(cluster.address(HEAD), PORT, "/slots", cluster.key)
    assert status == 403
    # The engine's API socket: a local user outside the engines' group cannot open it.
    assert invoke_api(cluster, HEAD, *NOT_THE_DOOR) == "PermissionError"
    assert invoke_api(cluster, HEAD).isdigit()
    for host in ("cluster1", "cluster2"):
        assert frontdoor.key_places_on_host(cluster.machines[host], cluster.key) == [], host


def test_the_metrics_doors_serve_the_heads_engine_and_every_members_node(
    cluster: Cluster, two_hosts
):
    """What a monitor host scrapes: llama-server's figures for the whole pipeline at the
    head's door (the door sends llama-server its key), each member's node exporter and
    door; the scrape token alone opens them, and from a monitor's address alone (the
    kernel resets anyone else)."""
    token = scrape_token_path().read_text().strip()
    head, worker = cluster.cluster_address(HEAD), cluster.cluster_address("cluster2")
    status, body = frontdoor.scrape(head, "/metrics/llamacpp", token)
    assert status == 200 and "llamacpp:prompt_tokens_total" in body, body[:300]
    for host, address in (("cluster1", head), ("cluster2", worker)):
        status, body = frontdoor.scrape(address, "/metrics/node", token)
        assert status == 200 and "node_memory_MemAvailable_bytes" in body, host
        status, body = frontdoor.scrape(address, "/metrics/door", token)
        assert status == 200 and "haproxy_process_" in body, host
        assert frontdoor.scrape(address, "/metrics/node", cluster.key)[0] == 401, host
        # The monitor's address is let in (its scrape is a 401 without the token).
        assert frontdoor.scrape(address, "/metrics/node", None, WATCHER_ADDRESS)[0] == 401
        # Anyone else is reset by the kernel, the host's metrics table.
        assert knock(address, frontdoor.METRICS_PORT, STRANGER) == "ConnectionRefusedError"
        assert f"socketwise_metrics_{host}" in controller_tables(), host
        # On the metrics address alone.
        assert not frontdoor.answers(cluster.address(host), frontdoor.METRICS_PORT), host
        assert frontdoor.key_places_on_host(cluster.machines[host], token) == [], host
    # A worker serves no engine: an RPC server has no /metrics.
    assert frontdoor.scrape(worker, "/metrics/llamacpp", token)[0] == 403
    assert token not in two_hosts.output


def test_only_members_reach_the_engine_ports(cluster: Cluster, two_hosts):
    # Each member loads a table of its own into the one network the lab's machines share.
    for host in ("cluster1", "cluster2"):
        assert f"table inet {table(host)}" in cluster.on(host, "nft list tables"), host
    worker, head = cluster.cluster_address("cluster2"), cluster.cluster_address(HEAD)
    rpc = {cluster.on("cluster2", f"systemctl show -p MainPID --value {RPC_UNIT}")}
    assert cluster.listening("cluster2", rpc) == [(worker, RPC_PORT)]
    # llama-server holds no TCP listener: its API is a Unix socket (test below).
    server = {cluster.on(HEAD, f"systemctl show -p MainPID --value {HEAD_UNIT}")}
    assert cluster.listening(HEAD, server) == []
    # The RPC server, which has no authentication, resets a host outside the cluster; a
    # member's engine still connects (the head holds its connection: the completions pass),
    # and on the head, a process of any other group than the engines' is reset.
    engines = engines_group(cluster, HEAD)
    assert engines_group(cluster, "cluster2") == engines
    assert knock(worker, RPC_PORT, STRANGER, engines) == "ConnectionRefusedError"
    assert knock(worker, RPC_PORT, head, engines) == "connected"
    assert knock(worker, RPC_PORT, head, NOBODY) == "ConnectionRefusedError"


def test_the_filter_comes_back_when_the_hosts_firewall_service_flushes_it(
    cluster: Cluster, two_hosts
):
    assert_filter_survives_the_firewall_service(cluster, "cluster2", RPC_PORT)


def test_a_second_deploy_loads_a_deleted_table_and_restarts_nothing(cluster: Cluster, two_hosts):
    started = cluster.on("cluster1", f"systemctl show -p ExecMainPID --value {HEAD_UNIT}")
    worker, engines = cluster.cluster_address("cluster2"), engines_group(cluster, HEAD)
    # What a flush of cluster2's host would leave: its table gone, its unit still active.
    cluster.on("cluster2", f"nft delete table inet {table('cluster2')}")
    assert knock(worker, RPC_PORT, STRANGER, engines) == "connected"
    readiness = cluster.work / "filtered.yml"
    readiness.write_text(FILTERED)
    checked = run_playbook(str(readiness), "-i", str(cluster.inventory(["cluster1", "cluster2"])))
    assert checked.returncode != 0, checked.output[-3000:]
    assert f"cluster2: the nftables table {table('cluster2')} is not loaded" in checked.output
    assert checked.recap("cluster1")["failed"] == 0
    done = cluster.deploy(["cluster1", "cluster2"])
    assert done.returncode == 0, done.output[-3000:]
    # The table loaded again, one change on cluster2 (its unit's reload); nothing else.
    assert done.recap("cluster1")["changed"] == 0, done.changed_tasks("cluster1")
    assert done.changed_tasks("cluster2") == ["port_filter : Load the table"]
    assert table("cluster2") in tables_of(["cluster2"])
    assert knock(worker, RPC_PORT, STRANGER, engines) == "ConnectionRefusedError"
    assert cluster.on("cluster1", f"systemctl show -p ExecMainPID --value {HEAD_UNIT}") == started


def test_three_hosts_give_the_same_answer(cluster: Cluster, two_hosts):
    _, on_two = cluster.completion()
    cluster.deployed(["cluster1", "cluster2", "cluster3"])
    summary = cluster.summary()
    assert [(h["host"], h["layers"]["count"]) for h in summary["plan"]["hosts"]] == [
        ("cluster1", 2), ("cluster2", 1), ("cluster3", 1)
    ]  # fmt: skip
    # One layer on each worker, the output layer with the last: neither holds both layers.
    assert all(summary["connections"][endpoint] for endpoint in summary["rpc"])
    held = buffers_mib(cluster)
    assert list(held) == summary["rpc"] and len(held) == 2
    assert 1 < held[summary["rpc"][1]] / held[summary["rpc"][0]] < 2, held
    status, on_three = cluster.completion()
    assert status == 200, on_three
    # The same weights split another way: the greedy answer does not change.
    assert on_three["choices"][0]["text"] == on_two["choices"][0]["text"]


def test_a_dead_worker_takes_the_endpoint_down_and_its_return_brings_it_back(
    cluster: Cluster, two_hosts
):
    # (HAProxy says "UP 1/2" while a check of the last deploy's restart still counts.)
    cluster.wait_for("front door marks the head UP", lambda: cluster.door_status() == "UP")
    cluster.on("cluster3", f"systemctl stop {RPC_UNIT}")
    down = cluster.wait_for(
        "front door marks the head DOWN", lambda: cluster.door_status().startswith("DOWN")
    )
    status, _ = cluster.completion()
    assert status == 503
    # The head waits for its worker instead of serving without it.
    assert cluster.on("cluster1", f"systemctl show -p SubState --value {HEAD_UNIT}") in (
        "start-pre", "auto-restart"
    )  # fmt: skip
    cluster.on("cluster3", f"systemctl start {RPC_UNIT}")
    back = cluster.wait_for("endpoint serves again", lambda: cluster.completion()[0] == 200)
    up = cluster.wait_for("front door marks it UP", lambda: cluster.door_status() == "UP")
    print(
        f"down after {down:.0f} s, serving again {back:.0f} s after the worker's start, "
        f"marked UP {up:.0f} s after that"
    )


def test_a_killed_worker_comes_back_by_itself(cluster: Cluster, two_hosts):
    restarts = int(cluster.on("cluster1", f"systemctl show -p NRestarts --value {HEAD_UNIT}"))
    cluster.on("cluster2", f"systemctl kill --signal=SIGKILL {RPC_UNIT}")
    # systemd starts the RPC server again; the head's next request finds its tensors gone,
    # llama-server aborts, and its unit loads the model onto the new server.
    cluster.wait_for(
        "head restarted",
        lambda: (
            cluster.completion()[0] == 200
            and int(cluster.on("cluster1", f"systemctl show -p NRestarts --value {HEAD_UNIT}"))
            > restarts
        ),
        timeout=120,
    )
    status, answer = cluster.completion()
    assert status == 200 and answer["usage"]["completion_tokens"] == GREEDY["max_tokens"]


def test_a_sweep_over_one_two_and_three_hosts_reports_prefill_and_decode(
    cluster: Cluster, two_hosts
):
    run_dir = cluster.work / "hosts-run"
    inventory = cluster.inventory(["cluster1", "cluster2", "cluster3"])
    done = subprocess.run(
        [str(BIN / "socketwise"), "sweep", "-i", str(inventory), "--hosts", "1,2,3",
         "--concurrencies", "1", "--step-seconds", "5", "--input-len", "64",
         "--output-len", "16", "--run-dir", str(run_dir)],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    decided = json.loads(
        subprocess.run(
            [str(BIN / "socketwise"), "report", "--json", str(run_dir)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout  # fmt: skip
    )["cluster"]
    assert decided["hosts"] == [1, 2, 3]
    series = decided["by_concurrency"]["1"]
    for metric in ("prefill_tok_s", "decode_tok_s", "output_tok_s"):
        assert set(series[metric]) == {"1", "2", "3"} and all(
            v > 0 for v in series[metric].values()
        )
    assert decided["change"]["prefill_tok_s"] > 0 and decided["change"]["decode_tok_s"] > 0
    # Each count was planned over that many hosts.
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["cluster"]["members"] == ["cluster1", "cluster2", "cluster3"]
    planned = manifest["hosts"][HEAD]["layouts"]
    assert [len(planned[f"pp{n}"]["hosts"]) for n in (1, 2, 3)] == [1, 2, 3]
    report = (run_dir / "report.md").read_text()
    assert "## Cluster: prefill and decode against the number of hosts" in report
    assert (run_dir / "plots" / "cluster-hosts.png").stat().st_size > 0
    # The sweep put the whole cluster back.
    restored = run_dir / "artifacts" / "restored" / HEAD / "cluster-summary.json"
    assert len(json.loads(restored.read_text())["plan"]["hosts"]) == 3
    assert cluster.completion()[0] == 200
    print(decided["summary"])


def test_the_head_s_front_door_serves_tls_from_the_inventory_pair(
    cluster: Cluster, two_hosts, tmp_path
):
    address = cluster.address(HEAD)
    cert, key = frontdoor.self_signed(tmp_path, address)
    serving = cluster.on(HEAD, f"systemctl show -p MainPID --value {HEAD_UNIT}")
    cluster.deployed(
        ["cluster1", "cluster2", "cluster3"],
        *("-e", f"credentials_tls_cert={cert}", "-e", f"credentials_tls_key={key}"),
    )
    # Only the front door restarted: llama-server kept serving, the same process.
    assert cluster.on(HEAD, f"systemctl show -p MainPID --value {HEAD_UNIT}") == serving
    # The single host's door's rules, over TLS: the key, the routes, no plain HTTP.
    assert frontdoor.completion_tokens(address, PORT, cluster.key, tls=True) > 0
    assert frontdoor.call(address, PORT, "/v1/models", tls=True)[0] == 401
    assert frontdoor.call(address, PORT, "/slots", cluster.key, tls=True)[0] == 403
    assert frontdoor.call(address, PORT, "/metrics", cluster.key, tls=True)[0] == 403
    with pytest.raises(OSError):
        frontdoor.call(address, PORT, "/health")
    assert cluster.on(HEAD, "stat -c '%a %U' /etc/socketwise/cluster/frontdoor.pem") == "600 root"


def test_removing_the_cluster_stops_and_removes_every_server(cluster: Cluster, two_hosts):
    members = ["cluster1", "cluster2", "cluster3"]
    cluster.removed(members)
    for host in members:
        assert cluster.on(host, "ls /etc/socketwise 2>/dev/null || true") == ""
    assert not frontdoor.answers(cluster.cluster_address("cluster2"), RPC_PORT)
    # Each member's filter went with its units.
    assert tables_of(members) == []


def test_a_hybrid_moe_server_runs_its_plan_on_one_host_through_the_front_door(
    cluster: Cluster, two_hosts, dense_answer
):
    """The lab has no GPU and the CPU build of llama.cpp offloads nothing: this proves the
    plan's flags, the unit and the placement, not the offload (scripts/gpu-check does that
    where a GPU is)."""
    # cluster1's topology as the deploys detected it, with one NVIDIA GPU on node 0 whose
    # memory nvidia-smi did not tell (the deploy gives it).
    topology = json.loads((cluster.work / "artifacts" / HEAD / "topology.json").read_text())
    home = next(node for node in topology["nodes"] if node["id"] == 0)
    gpu = {"pci": "0000:c1:00.0", "vendor": "nvidia", "numa_node": 0, "name": None,
           "local_cpus": sorted(c for core in home["cores"] for c in core),
           "memory_mb": None, "links": None}  # fmt: skip
    with_gpu = cluster.work / "cluster1-with-gpu.json"
    with_gpu.write_text(json.dumps(topology | {"gpus": [gpu]}))
    # The built-in model as a mixture of 4 experts a layer (0.035 of its 0.039 GB), which
    # answers as the dense model does.
    moe = cluster.work / "tiny-moe.gguf"
    subprocess.run(
        [sys.executable, "-m", "socketwise.build.ggufmodel",
         str(cache_dir() / "models" / "tiny-llama"), str(moe), "--experts", "4"],
        cwd=REPO, check=True, capture_output=True,
    )  # fmt: skip
    # 1.13 GB of GPU: 90 % of it less 1 GB of KV cache and the dense weights holds the
    # experts of one layer; the other three stay in system memory. The host is tuned as a
    # hybrid server's is, every knob left as it is: the lab's machines share the
    # controller's kernel.
    untouched = dict.fromkeys(
        ["host_tuning_numa_balancing", "host_tuning_thp", "host_tuning_thp_defrag",
         "host_tuning_irqbalance", "host_tuning_cpu_governor"]
    ) | {"socketwise_tune": True, "host_tuning_irq_affinity": False}  # fmt: skip
    cluster.deployed(
        [HEAD], "-e", "cluster_layout=hybrid", "-e", f"cluster_model_gguf={moe}",
        "-e", f"socketwise_topology_file={with_gpu}", "-e", "cluster_gpu_memory_gb=1.13",
        "-e", "cluster_build_device=cpu", "-e", json.dumps(untouched),
    )  # fmt: skip
    # The tuning was decided from the hybrid plan (its node's knobs) and left all alone.
    report = cluster.work / "artifacts" / HEAD / "tuning-report.json"
    knobs = {k["name"]: k for k in json.loads(report.read_text())["knobs"]}
    assert {"kernel.numa_balancing", "hugepages.node0.2048kB"} <= set(knobs)
    assert {k["status"] for k in knobs.values()} <= {"unmanaged", "unavailable"}, knobs
    summary = cluster.summary()
    plan = summary["plan"]
    hybrid = plan["hybrid"]
    assert (plan["layout"], plan["build"]["device"]) == ("hybrid", "cpu")
    assert (hybrid["gpu"], hybrid["n_cpu_moe"], hybrid["numa"]) == ("0000:c1:00.0", 3, "bind")
    assert hybrid["cpus_allowed"] == sorted(core[0] for core in home["cores"])
    # The server runs with the plan's flags, as its unit gives them.
    (server,) = summary["hosts"][HEAD]
    argv = " ".join(server["argv"])
    for flag in ("--n-gpu-layers all", "--n-cpu-moe 3", "--numa numactl",
                 f"--threads {hybrid['threads']}"):  # fmt: skip
        assert flag in argv, (flag, argv)
    unit = cluster.on(HEAD, f"cat /etc/systemd/system/{HEAD_UNIT}")
    assert "DeviceAllow=/dev/nvidia0 rw" in unit and "PrivateDevices=" not in unit
    assert "CUDA_VISIBLE_DEVICES=0" in unit
    # Through the front door, the same greedy answer as the dense model over two hosts.
    status, answer = cluster.completion()
    assert status == 200, answer
    assert answer["choices"][0]["text"] == dense_answer
    # Every thread on the planned cores, read on the host; its memory bound to node 0.
    pid = cluster.on(HEAD, f"systemctl show -p MainPID --value {HEAD_UNIT}")
    allowed = cluster.on(HEAD, f"grep Cpus_allowed_list /proc/{pid}/task/*/status | sort -u")
    assert {tuple(parse_cpulist(line.split()[-1])) for line in allowed.splitlines()} == {
        tuple(hybrid["cpus_allowed"])
    }
    assert int(cluster.on(HEAD, f"grep -c 'bind:0' /proc/{pid}/numa_maps || true")) > 0
    # Nothing but the front door public, and no filter of engine ports: it has none.
    assert not frontdoor.answers(cluster.address(HEAD), API_PORT)
    assert table(HEAD) not in controller_tables()
