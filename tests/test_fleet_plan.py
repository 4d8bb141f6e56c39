"""The fleet's dry run: a fleet of three hardware classes planned from saved topologies,
with no server reachable (inventories/example-fleet)."""

import json
import tempfile
from pathlib import Path

import pytest
import yaml

from socketwise.facts.topology import detect
from socketwise.plan import fleet
from socketwise.plan.planner import PlanRequest, plan

from .machines import build_machine
from .playbooks import REPO, kit_plugin, run_playbook

FLEET = REPO / "inventories" / "example-fleet"
# The fixture machine each saved topology was written from.
SAVED_FROM = {"r730": "r730", "epyc": "epyc-nps4", "spr": "snc"}


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """plan.yml on the example fleet twice: first with nothing deployed, then after
    r730-01 was deployed as SN and r730-02 as what is planned now."""
    artifacts = tmp_path_factory.mktemp("artifacts")
    first = run_playbook(
        "playbooks/plan.yml", "-i", str(FLEET), env={"SOCKETWISE_ARTIFACTS": str(artifacts)}
    )
    planned = json.loads((artifacts / "r730-02" / "plan.json").read_text())
    topo = json.loads((FLEET / "topologies" / "r730-01.json").read_text())
    deployed = {
        "r730-01": plan(topo, PlanRequest(layout="sn", model_gb=16)),
        "r730-02": planned,
    }
    for host, deployed_plan in deployed.items():
        (artifacts / host / "deploy-summary.json").write_text(json.dumps({"plan": deployed_plan}))
    second = run_playbook(
        "playbooks/plan.yml", "-i", str(FLEET), env={"SOCKETWISE_ARTIFACTS": str(artifacts)}
    )
    return first, second, artifacts


@pytest.mark.parametrize(
    "saved", sorted((FLEET / "topologies").glob("*.json")), ids=lambda p: p.stem
)
def test_the_saved_topologies_are_what_detection_reads_on_those_servers(saved, tmp_path):
    fixture = SAVED_FROM[saved.stem.split("-")[0]]
    assert json.loads(saved.read_text()) == detect(build_machine(fixture, tmp_path / fixture))


def test_the_dry_run_plans_every_class_without_reaching_a_server(dry_run):
    first, _, artifacts = dry_run
    assert first.returncode == 0, first.output[-3000:]
    for host in ("r730-01", "r730-02", "epyc-01", "epyc-02", "spr-01", "spr-02"):
        assert first.recap(host)["unreachable"] == 0
    # The fleet front door serves nothing, so it is not planned.
    assert not (artifacts / "lb-01").exists()
    summary = json.loads((artifacts / "fleet-plan.json").read_text())
    classes = {c["isa"]: c for c in summary["classes"]}
    assert sorted(classes) == ["amx", "avx2", "zen"]
    assert [h["host"] for h in classes["zen"]["hosts"]] == ["epyc-01", "epyc-02"]
    assert all(c["same_shape"] for c in summary["classes"])
    assert classes["avx2"]["hosts"][0]["shape"]["layout"] == "dp"  # concurrency 8 > crossover 6
    assert len(classes["zen"]["hosts"][0]["shape"]["instances"]) == 8  # one per NPS4 node
    assert classes["amx"]["hosts"][0]["shape"]["layout"] == "sn"


def test_the_dry_run_prints_class_host_layout_ports_build_and_changes(dry_run):
    first, _, _ = dry_run
    assert "class amd-2s8n-128c-768g-zen-" in first.output
    assert "8 NUMA node(s) of 16 cores, 768 GB, build zen" in first.output
    assert "r730-01: DP (instances), front door :8000, build avx2" in first.output
    assert (
        "vllm-dp1 :8002 1 rank on node(s) 1, cores 1,3,5,7,9,11,13,15,17,19,21,23" in first.output
    )
    assert "spr-02: SN, front door :8000, build amx" in first.output
    assert first.output.count("would change: new: nothing deployed yet") == 6


def test_the_dry_run_names_what_would_change_against_the_last_deploy(dry_run):
    _, second, artifacts = dry_run
    assert second.returncode == 0, second.output[-3000:]
    hosts = {
        h["host"]: h["changes"]
        for c in json.loads((artifacts / "fleet-plan.json").read_text())["classes"]
        for h in c["hosts"]
    }
    assert hosts["r730-01"] == ["layout sn -> dp", "instances vllm-sn -> vllm-dp0, vllm-dp1"]
    assert hosts["r730-02"] == []
    assert "r730-02: DP (instances)" in second.output
    assert "would change: nothing" in second.output


def test_a_bad_topology_file_stops_the_host_with_one_line(tmp_path):
    saved = tmp_path / "broken.json"
    saved.write_bytes(b"\xff not json")
    done = run_playbook(
        "playbooks/plan.yml", "-i", str(FLEET), "--limit", "spr-01",
        "-e", f"socketwise_topology_file={saved}", env={"SOCKETWISE_ARTIFACTS": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode != 0
    assert f"spr-01: socketwise_topology_file={saved}: cannot read topology file" in done.output


def test_a_topology_file_with_a_key_of_the_wrong_kind_stops_the_host_with_one_line(tmp_path):
    with tempfile.TemporaryDirectory() as root:
        topo = detect(build_machine("snc", Path(root) / "snc"))
    topo["isa"] = sorted(flag for flag, present in topo["isa"].items() if present)
    saved = tmp_path / "listed-isa.json"
    saved.write_text(json.dumps(topo))
    done = run_playbook(
        "playbooks/plan.yml", "-i", str(FLEET), "--limit", "spr-01",
        "-e", f"socketwise_topology_file={saved}", env={"SOCKETWISE_ARTIFACTS": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode != 0
    assert (
        f"spr-01: socketwise_topology_file={saved}: malformed topology: isa is [" in done.output
        and "not an object of flags" in done.output
    )


def test_a_change_of_cores_or_of_kv_cache_on_an_instance_is_named():
    with tempfile.TemporaryDirectory() as root:
        topo = detect(build_machine("r730", Path(root) / "r730"))
    before = plan(topo, PlanRequest(layout="dp", model_gb=16))
    after = plan(topo, PlanRequest(layout="dp", model_gb=16, reserve_cores=4))
    assert fleet.changes(before, after) == [
        "vllm-dp0: threads 0,2,4,6,8,10,12,14,16,18,20,22 -> 0,2,4,6,8,10,12,14,16,18",
        "vllm-dp1: threads 1,3,5,7,9,11,13,15,17,19,21,23 -> 1,3,5,7,9,11,13,15,17,19",
    ]
    assert fleet.changes(before, before) == []
    # A KV cache of another size alone is a change too: the instances restart for it.
    smaller = plan(topo, PlanRequest(layout="dp", model_gb=16, kv_gb=4))
    assert [line.split(" ", 2)[1] for line in fleet.changes(before, smaller)] == ["kvcache_gb"] * 2
    # So is the door's balance (a reload of the host's door).
    prefix = plan(topo, PlanRequest(layout="dp", model_gb=16, balance="prefix"))
    assert fleet.changes(before, prefix) == ["balance leastconn -> prefix"]


def fleet_filters():
    """plugins/filter/fleet.py, as Ansible loads it."""
    return kit_plugin("filter.fleet").FilterModule().filters()


def test_hosts_exempt_the_fleet_door_by_the_address_it_connects_from():
    hostvars = {
        # Binds its own address: the fleet door's `source`, so the one hosts see.
        "door1": {"ansible_host": "10.0.0.9", "door_listen_address": "10.0.0.5"},
        # Binds a wildcard: it connects from its ansible_host (the route's address).
        "door2": {"ansible_host": "10.0.0.6"},
        # A name would be resolved once when HAProxy starts: left to the user's list.
        "door3": {"ansible_host": "fleet.example"},
        "gen1": {"ansible_host": "fd00::7", "door_listen_address": "::"},
    }
    sources = fleet_filters()["fleet_sources"]
    assert sources(["door1", "door2", "door3", "gen1"], hostvars, "0.0.0.0") == [
        "10.0.0.5",
        "10.0.0.6",
        "fd00::7",
    ]


def test_the_fleet_door_counts_a_host_as_taking_its_certificate_once_it_has_the_ca():
    hostvars = {
        # Given the CA in this run (fleet-client-ca.yml's copy, changed or not).
        "copied": {"credentials_fleet_client_ca_copy": {"changed": True}},
        # Had it when the first play looked, not reached since.
        "had": {
            "credentials_fleet_client_ca_copy": {"skipped": True},
            "__vllm_service_fleet_client_ca_found": {"stat": {"exists": True}},
        },
        # Not yet: rollout.yml's first fleet play comes before any host's.
        "lacks": {"__vllm_service_fleet_client_ca_found": {"stat": {"exists": False}}},
        # Never looked at (outside a --limit).
        "unseen": {},
    }
    trusting = fleet_filters()["fleet_trusting"]
    assert trusting(list(hostvars), hostvars) == ["copied", "had"]


def test_the_hosts_that_serve_are_all_but_load_generators_fleet_doors_and_monitors():
    groups = {
        "all": ["b", "door", "a", "mon", "gen", "c"],
        "socketwise_frontdoor": ["door"],
        "socketwise_monitor": ["mon"],
        "socketwise_loadgen": ["gen"],
        "ungrouped": ["b"],
    }
    # In the inventory's order: rollout.yml's batches follow it.
    assert fleet.serving_hosts(groups) == ["b", "a", "c"]
    assert fleet.serving_hosts({"all": ["a"]}) == ["a"]


def test_each_host_is_named_by_the_model_it_serves_as_the_vllm_role_names_it():
    # The fleet door routes by the name each host's units serve under, this run's
    # vllm_served_name where the host was served, else the same rule from its variables.
    hostvars = {
        "given": {"vllm_served_model_name": "chat", "vllm_model_hf_id": "org/Other-1B"},
        "hub": {"vllm_model_hf_id": "Qwen/Qwen2.5-0.5B-Instruct"},
        "disk": {"vllm_model_path": "/srv/models/llama-3-8b"},
        # The Hugging Face id wins over a path, as the vllm role serves it.
        "both": {"vllm_model_hf_id": "org/Hub-1B", "vllm_model_path": "/srv/models/local"},
        "builtin": {},
        "bigger": {"vllm_builtin_model_size": "0.5g"},
        "served": {"vllm_served_name": "as-published", "vllm_model_path": "/srv/x"},
    }
    servers = fleet_filters()["fleet_servers"](list(hostvars), hostvars, "0.0.0.0")
    assert [server["model"] for server in servers] == [
        "chat", "Qwen2.5-0.5B-Instruct", "llama-3-8b", "Hub-1B", "tiny-llama", "tiny-llama-0.5g",
        "as-published",
    ]  # fmt: skip
    # The role's own default size is the one the rule takes for a host that gives none.
    defaults = yaml.safe_load((REPO / "roles/vllm/defaults/main.yml").read_text())
    assert defaults["vllm_builtin_model_size"] == fleet.BUILTIN_SIZE
    assert fleet.served_name({"vllm_builtin_model_size": defaults["vllm_builtin_model_size"]}) == (
        "tiny-llama"
    )


def test_the_fleet_door_has_a_backend_per_model_and_fleet_alone_for_one():
    def server(name, model):
        return {"name": name, "model": model}

    one = fleet.model_backends([server("a", "tiny-llama"), server("b", "tiny-llama")])
    assert [(b["model"], b["backend"], [s["name"] for s in b["servers"]]) for b in one] == [
        ("tiny-llama", "fleet", ["a", "b"])
    ]
    # In the order models first come; '/' is no character of a backend's name, and two
    # names that would read the same get apart.
    many = fleet.model_backends(
        [server("a", "org/chat"), server("b", "big"), server("c", "org/chat"),
         server("d", "org_chat")]
    )  # fmt: skip
    assert [(b["model"], b["backend"], [s["name"] for s in b["servers"]]) for b in many] == [
        ("org/chat", "fleet-org_chat", ["a", "c"]),
        ("big", "fleet-big", ["b"]),
        ("org_chat", "fleet-org_chat-3", ["d"]),
    ]
    # A numbered name that another model's name already reads as is numbered on.
    clash = fleet.model_backends([server("a", "a_b-3"), server("b", "a/b"), server("c", "a_b")])
    assert [b["backend"] for b in clash] == ["fleet-a_b-3", "fleet-a_b", "fleet-a_b-4"]


def test_the_dry_run_plans_the_build_class_a_host_asks_for(tmp_path):
    # spr-02's CPU runs amx; asked for avx2 (a wheel set the fleet already has), it is planned
    # so, as the deploy would build it. Its CPU cannot run zen: refused, naming the variable.
    env = {"SOCKETWISE_ARTIFACTS": str(tmp_path)}
    limit = ("-i", str(FLEET), "--limit", "spr-02")
    asked = run_playbook("playbooks/plan.yml", *limit, "-e", "vllm_build_class=avx2", env=env)
    assert asked.returncode == 0, asked.output[-3000:]
    assert json.loads((tmp_path / "spr-02" / "plan.json").read_text())["build"]["class"] == "avx2"
    refused = run_playbook("playbooks/plan.yml", *limit, "-e", "vllm_build_class=zen", env=env)
    assert refused.returncode != 0
    assert "spr-02: vllm_build_class=zen: " in refused.output
