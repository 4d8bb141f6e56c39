"""One model served by several lab machines with vLLM pipeline parallel: deploy.yml with
a `socketwise_cluster` group and `socketwise_engine: vllm`, on two machines and then three
(the third when asked: THIRD_HOST).

One lab of three machines for the module; the stages build on each other (two hosts, then
cluster3 joins, then a follower dies). What is asserted is what a user of a cluster sees: a
real completion through the head's front door, the same greedy answer whatever the number
of hosts, every stage on its planned CPUs with its planned layers, the rendezvous on the
cluster's address and nothing but the front door on a public one, a filter that comes
back when the host's firewall service removes it, the key only in its root-only files,
and a cluster that heals by itself when a host's stage dies.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from socketwise.facts.files import parse_cpulist
from socketwise.lab.common import scrape_token_path
from socketwise.measure import hostcount
from socketwise.measure.sweep import Profile

from . import frontdoor
from .clusters import (
    API_PORT,
    GREEDY,
    HEAD,
    NOBODY,
    NOT_THE_DOOR,
    PORT,
    STRANGER,
    Cluster,
    assert_filter_survives_the_firewall_service,
    engines_group,
    invoke_api,
    knock,
    lab_cluster,
    table,
    tables_of,
)
from .labs import asked, unless_asked
from .playbooks import PlaybookRun

pytestmark = pytest.mark.lab
# The third host's stages (its deploy, the host-count sweep, a dead follower's healing):
# about 6 minutes of the controller's two cores on a slow one. Run them before a change to
# the cluster's plan, its rendezvous or the sweep over hosts.
ASK_THIRD_HOST = "SOCKETWISE_CLUSTER_THIRD_HOST"
THIRD_HOST = unless_asked("the vLLM cluster's third host", ASK_THIRD_HOST)

STAGE_UNIT = "socketwise-pp-vllm.service"
MASTER_PORT = 29501
# float32: the tiny model's random logits are close, and bf16 rounds a 2,1,1 split
# differently from a 2,2 one (a greedy answer then changes at its third token). Torch
# compiles with its eager backend: the compile warm-up that pipeline parallel needs on
# CPU runs, without inductor's code generation (45 s instead of 65 s to serve three
# stages on the controller); the tests are about the kit, not vLLM's kernels.
COMPILE = json.dumps(["--compilation-config", json.dumps({"mode": 1, "backend": "eager"})])
LAB_VARS = f"        vllm_service_dtype: float32\n        vllm_service_extra_args: {COMPILE}\n"


def show(cluster: Cluster, host: str, prop: str) -> str:
    return cluster.on(host, f"systemctl show -p {prop} --value {STAGE_UNIT}")


def stage_unit(cluster: Cluster, host: str) -> str:
    """The stage's unit file on HOST as the deploy wrote it."""
    return cluster.on(host, f"cat /etc/systemd/system/{STAGE_UNIT}")


def stage_pids(cluster: Cluster, host: str) -> list[str]:
    """The stage's main process and every process under it."""
    tree = cluster.on(
        host, f"pid={show(cluster, host, 'MainPID')}; echo $pid; "
        "pgrep -P $pid; for c in $(pgrep -P $pid); do pgrep -P $c; done; true"
    )  # fmt: skip
    return sorted(set(tree.split()))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    # A monitor host in the inventory: every member serves a metrics door.
    with lab_cluster(
        tmp_path_factory, preinstalled=True, engine="vllm", extra_vars=LAB_VARS, monitored=True
    ) as built:
        yield built


@pytest.fixture(scope="module")
def two_hosts(cluster: Cluster) -> PlaybookRun:
    return cluster.deployed(["cluster1", "cluster2"])


def test_the_image_method_is_refused_before_any_host_changes(cluster: Cluster):
    cluster.extra_vars = LAB_VARS + "        vllm_install_method: image\n"
    try:
        done = cluster.deploy(["cluster1", "cluster2"])
    finally:
        cluster.extra_vars = LAB_VARS
    assert done.returncode != 0
    assert "cluster1: vllm_install_method=image: a cluster runs vLLM from the venv; set " \
        "vllm_install_method to venv" in done.output  # fmt: skip
    for host in ("cluster1", "cluster2"):
        assert cluster.on(host, "ls /etc/systemd/system | grep -c '^socketwise-' || true") == "0"


def test_two_hosts_serve_one_model_through_the_front_door(cluster: Cluster, two_hosts):
    status, answer = cluster.completion()
    assert status == 200, answer
    assert answer["usage"]["completion_tokens"] == GREEDY["max_tokens"]
    summary = cluster.summary()
    assert summary["engine"] == "vllm"
    plan = summary["plan"]
    assert [(h["host"], h["rank"]) for h in plan["hosts"]] == [("cluster1", 0), ("cluster2", 1)]
    assert plan["engine_settings"]["layer_partition"] == "2,2"
    # The follower holds its link to the head's rendezvous.
    rendezvous = f"{cluster.cluster_address(HEAD)}:{MASTER_PORT}"
    assert summary["connections"][f"cluster2 -> {rendezvous}"]
    # The rendezvous's own end: every connection it holds comes from a member (in the lab
    # through 127.0.0.1, the shared network's source address), which the deploy checked.
    held = summary["connections"][f"{rendezvous} (the rendezvous)"]
    members = {"127.0.0.1"} | {cluster.cluster_address(h) for h in ("cluster1", "cluster2")}
    assert held and {line.split()[-1].rsplit(":", 1)[0] for line in held} <= members, held
    argv = {h: summary["hosts"][h][0]["argv"] for h in ("cluster1", "cluster2")}
    assert "--headless" not in argv["cluster1"] and "--headless" in argv["cluster2"]
    assert argv["cluster2"][argv["cluster2"].index("--node-rank") + 1] == "1"


def test_every_stage_runs_where_planned(cluster: Cluster, two_hosts):
    plan = cluster.summary()["plan"]
    for entry in plan["hosts"]:
        host, stage = entry["host"], entry["stage"]
        env = show(cluster, host, "Environment")
        assert f"VLLM_PP_LAYER_PARTITION={plan['engine_settings']['layer_partition']}" in env
        assert f"VLLM_CPU_OMP_THREADS_BIND={stage['omp_threads_bind']}" in env
        allowed = set()
        for pid in stage_pids(cluster, host):
            lines = cluster.on(host, f"cat /proc/{pid}/task/*/status | grep Cpus_allowed_list")
            allowed |= {line.split()[-1] for line in lines.splitlines()}
        planned = stage["cpus_allowed"]
        assert allowed, host
        assert all(set(parse_cpulist(cpus)) <= set(planned) for cpus in allowed), (
            host, allowed, planned
        )  # fmt: skip


def test_only_the_front_door_is_public_and_the_key_stays_in_its_files(cluster: Cluster, two_hosts):
    assert frontdoor.answers(cluster.address(HEAD), PORT)
    assert not frontdoor.answers(cluster.address(HEAD), API_PORT)
    status, _ = frontdoor.call(cluster.address(HEAD), PORT, "/v1/completions", None, GREEDY)
    assert status == 401
    # vLLM answers /invocations with no key (its key check misses it): on the head's API
    # socket, which a local user outside the engines' group cannot open; root can.
    assert invoke_api(cluster, HEAD, *NOT_THE_DOOR) == "PermissionError"
    assert invoke_api(cluster, HEAD) == "200"
    # vLLM's own rendezvous would listen on every address; the kit's is on the head's
    # cluster address, and no process of any stage listens anywhere public.
    head_address = cluster.cluster_address(HEAD)
    listening = cluster.on(HEAD, f"ss -Htln '( sport = :{MASTER_PORT} )'").split()
    assert f"{head_address}:{MASTER_PORT}" in listening, listening
    for host in ("cluster1", "cluster2"):
        pids = set(stage_pids(cluster, host))
        for line in cluster.on(host, "ss -Htlnp").splitlines():
            if set(re.findall(r"pid=(\d+)", line)) & pids:
                address = line.split()[3].rsplit(":", 1)[0]
                assert address.startswith(("127.", "[::ffff:127.")), (host, line)
        unit = stage_unit(cluster, host)
        assert "IPAddressDeny=any" in unit
        assert frontdoor.key_places_on_host(cluster.machines[host], cluster.key) == [], host


def test_the_heads_metrics_door_serves_vllms_figures_for_the_pipeline(cluster: Cluster, two_hosts):
    # Stage 0's API server reports for every stage; a headless follower has no /metrics.
    token = scrape_token_path().read_text().strip()
    status, body = frontdoor.scrape(cluster.cluster_address(HEAD), "/metrics/vllm", token)
    assert status == 200 and "vllm:num_requests_running" in body, body[:300]
    follower = cluster.cluster_address("cluster2")
    status, body = frontdoor.scrape(follower, "/metrics/node", token)
    assert status == 200 and "node_memory_MemAvailable_bytes" in body
    assert frontdoor.scrape(follower, "/metrics/vllm", token)[0] == 403


def test_only_members_reach_the_engine_ports(cluster: Cluster, two_hosts):
    engines = engines_group(cluster, "cluster2")
    assert engines_group(cluster, HEAD) == engines
    for host in ("cluster1", "cluster2"):
        # A table of the host's own in the one network the lab's machines share.
        assert f"table inet {table(host)}" in cluster.on(host, "nft list tables"), host
        # Every socket a stage listens on (the head's API is a Unix socket): the
        # rendezvous, vLLM's queues and gloo, on ports vLLM and gloo take from the kernel.
        # Each is on the host's cluster address and resets a host outside the cluster.
        address = cluster.cluster_address(host)
        engine = cluster.listening(host, set(stage_pids(cluster, host)))
        assert engine and API_PORT not in {port for _, port in engine}, (host, engine)
        assert {a for a, _ in engine} == {address}, (host, engine)
        refused = {port: knock(address, port, STRANGER, engines) for _, port in engine}
        assert set(refused.values()) == {"ConnectionRefusedError"}, (host, refused)
    # A member's engine still reaches the rendezvous (and the stages, their gloo:
    # completions pass); a local process of any other group is reset.
    head, member = cluster.cluster_address(HEAD), cluster.cluster_address("cluster2")
    assert knock(head, MASTER_PORT, member, engines) == "connected"
    assert knock(head, MASTER_PORT, member, NOBODY) == "ConnectionRefusedError"


def test_the_filter_comes_back_when_the_hosts_firewall_service_flushes_it(
    cluster: Cluster, two_hosts
):
    (_, port), *_ = sorted(cluster.listening("cluster2", set(stage_pids(cluster, "cluster2"))))
    assert_filter_survives_the_firewall_service(cluster, "cluster2", port)


def test_a_second_deploy_changes_and_restarts_nothing(cluster: Cluster, two_hosts):
    hosts = ["cluster1", "cluster2"]
    started = {h: show(cluster, h, "ExecMainPID") for h in hosts}
    # The stage's unit before, so a failure says what a second deploy rendered otherwise
    # (the unit holds no secret: they come from its EnvironmentFile).
    before = {h: stage_unit(cluster, h) for h in hosts}
    done = cluster.deploy(hosts)
    assert done.returncode == 0, done.output[-3000:]
    for host in hosts:
        after = stage_unit(cluster, host).splitlines()
        changed = difflib.unified_diff(before[host].splitlines(), after, lineterm="")
        said = f"{host}: {done.changed_tasks(host)}\n" + "\n".join(changed)
        assert done.recap(host)["changed"] == 0, said
    assert {h: show(cluster, h, "ExecMainPID") for h in hosts} == started


# vLLM refuses the argument: every stage exits at its start and no completion comes.
UNKNOWN_FLAG = "--no-such-flag"
RELEASE = "/var/lib/socketwise/cluster-release"


def test_a_failed_deploy_goes_back_to_the_clusters_last_release_and_serves(
    cluster: Cluster, two_hosts
):
    hosts = ["cluster1", "cluster2"]
    _, before = cluster.completion()
    release = {h: cluster.on(h, f"cat {RELEASE}/id") for h in hosts}
    units = {h: stage_unit(cluster, h) for h in hosts}
    started = {h: show(cluster, h, "ExecMainPID") for h in hosts}
    bad = {
        "vllm_service_extra_args": [*json.loads(COMPILE), UNKNOWN_FLAG],
        "cluster_ready_timeout": 20,
    }
    done = cluster.deploy(hosts, "-e", json.dumps(bad))
    assert done.returncode != 0, done.output[-3000:]
    # One line on each member, naming the member that failed, its step and why, and the
    # release each went back to; the head's serves again through the front door.
    failed = f"cluster a's deploy failed on {HEAD} at 'Check that one came': {HEAD}: no completion"
    for host in hosts:
        [line] = [s for s in done.output.splitlines() if f'"msg": "{host}: {failed}' in s]
        back = f"back on release {release[host]}" + (", serving" if host == HEAD else "")
        assert line.rstrip('"}').endswith(back), line
    # Every stage runs the release's unit again (started anew), the release is the same,
    # and the answer is the one the cluster gave before.
    for host in hosts:
        assert stage_unit(cluster, host) == units[host], host
        assert UNKNOWN_FLAG not in stage_unit(cluster, host)
        assert show(cluster, host, "ActiveState") == "active", host
        assert show(cluster, host, "ExecMainPID") != started[host], host
        assert cluster.on(host, f"cat {RELEASE}/id") == release[host], host
    status, after = cluster.completion()
    assert status == 200 and after["choices"][0]["text"] == before["choices"][0]["text"]
    # Root's alone: the release holds the cluster's secrets.
    assert cluster.on(HEAD, f"stat -c %a {RELEASE}") == "700"


@THIRD_HOST
def test_three_hosts_give_the_same_answer(cluster: Cluster, two_hosts):
    _, on_two = cluster.completion()
    cluster.deployed(["cluster1", "cluster2", "cluster3"])
    summary = cluster.summary()
    assert [(h["host"], h["layers"]["count"]) for h in summary["plan"]["hosts"]] == [
        ("cluster1", 2), ("cluster2", 1), ("cluster3", 1)
    ]  # fmt: skip
    assert "VLLM_PP_LAYER_PARTITION=2,1,1" in show(cluster, "cluster3", "Environment")
    # Each follower's link and the rendezvous's end.
    assert all(summary["connections"].values()) and len(summary["connections"]) == 3
    status, on_three = cluster.completion()
    assert status == 200, on_three
    # The same weights split another way: the greedy answer does not change (float32).
    assert on_three["choices"][0]["text"] == on_two["choices"][0]["text"]


@THIRD_HOST
def test_the_host_count_sweep_measures_prefill_and_decode_on_vllm(cluster: Cluster, two_hosts):
    # What `sweep --hosts` does at each count once the cluster is deployed (its deploys are
    # the same deploy.yml runs as above, proven for llama.cpp by test_cluster_lab): vLLM
    # reports no timings, so the streamed answer's clock splits prefill from decode.
    summary = cluster.summary()
    profile = Profile(concurrencies=[2], input_len=64, output_len=16, step_seconds=5)
    vocab = hostcount.vocabulary(summary["endpoint"], cluster.key, summary["model"])
    assert (
        vocab
        == json.loads((Path(summary["model"]["path"]) / "config.json").read_text())["vocab_size"]
    )
    load = hostcount.Load(summary["endpoint"], cluster.key, summary["served_name"], vocab,
                          profile, seed=0, stream=True)  # fmt: skip
    results, wall = load.run(2, profile.step_seconds)
    step, point = hostcount.rows(HEAD, 3, 2, results, wall)
    assert step["failed"] == 0 and step["completed"] >= 2, results
    assert all(r["predicted_n"] == 16 and r["prompt_n"] == 64 for r in results)
    assert point["prefill_tok_s"] > 0 and point["decode_tok_s"] > 0
    assert 0 < step["ttft_p50_ms"] < 1000 * max(r["seconds"] for r in results)
    print(point)


@THIRD_HOST
def test_a_dead_follower_takes_the_endpoint_down_and_the_cluster_heals(cluster: Cluster, two_hosts):
    cluster.wait_for("front door marks the head UP", lambda: cluster.door_status() == "UP")
    restarts = {h: int(show(cluster, h, "NRestarts")) for h in ("cluster1", "cluster2")}
    _, before = cluster.completion()
    cluster.on("cluster3", f"systemctl kill --signal=SIGKILL {STAGE_UNIT}")
    down = cluster.wait_for(
        "front door marks the head DOWN", lambda: cluster.door_status().startswith("DOWN")
    )
    # Nobody touches the cluster: the head sees the follower leave its rendezvous and
    # stops, cluster2 sees the head's rendezvous go and stops, systemd starts all three, and
    # they find each other again.
    back = cluster.wait_for(
        "endpoint serves again", lambda: cluster.completion()[0] == 200, timeout=420
    )
    after = {h: int(show(cluster, h, "NRestarts")) for h in ("cluster1", "cluster2")}
    assert all(after[h] > restarts[h] for h in after), (restarts, after)
    status, answer = cluster.completion()
    assert status == 200 and answer["choices"][0]["text"] == before["choices"][0]["text"]
    log = cluster.on(HEAD, f"journalctl -u {STAGE_UNIT} --no-pager")
    assert "a follower left the store" in log
    print(f"down after {down:.0f} s, serving again {back:.0f} s later")


def test_removing_the_cluster_stops_and_removes_every_stage(cluster: Cluster, two_hosts):
    # The members of the last deploy: cluster3 only where its stages ran.
    members = ["cluster1", "cluster2", "cluster3"][: 3 if asked(ASK_THIRD_HOST) else 2]
    cluster.removed(members)
    for host in members:
        assert cluster.on(host, "pgrep -c -f '[V]LLM::|[s]ocketwise-vllm-rank' || true") == "0"
    listening = cluster.on(HEAD, f"ss -Htln '( sport = :{MASTER_PORT} )'")
    assert listening == ""
    # Each member's filter went with its units, its rules and the stage's hosts file with
    # the cluster's directory.
    assert tables_of(members) == []
    for host in members:
        assert cluster.on(host, "ls /etc/socketwise/cluster 2>/dev/null || true") == "", host
        assert cluster.on(host, f"ls -d {RELEASE} 2>/dev/null || true") == "", host
