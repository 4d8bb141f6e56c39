"""The planner on the fixture machines: what a user would read in the plan."""

import json
import subprocess
import sys
from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from socketwise.facts.topology import detect
from socketwise.plan.nodes import read_topology
from socketwise.plan.planner import PlanError, PlanRequest, os_reserve_gb, plan

from .machines import MACHINES, build_machine

EVENS = list(range(0, 28, 2))
ODDS = list(range(1, 28, 2))


@pytest.fixture
def topo(tmp_path):
    def load(name: str) -> dict:
        return detect(build_machine(name, tmp_path / name))

    return load


def two_core_lab_host() -> dict:
    """The 2-core, one-node machine this project is developed and tested on."""
    return {
        "schema": 1,
        "nodes": [{"id": 0, "socket": 0, "cpus": [0, 1], "cores": [[0], [1]], "memory_mb": 24000}],
        "gpus": [],
        "isa": {"avx2": True},
    }


def binds(result: dict) -> list[str]:
    return [i["omp_threads_bind"] for i in result["instances"]]


def test_r730_sn_uses_twelve_even_cores_of_socket_0_like_the_field_notes(topo):
    result = plan(topo("r730"), PlanRequest(layout="sn", model_gb=8))
    (instance,) = result["instances"]
    assert instance["ranks"] == [{"node": 0, "cpus": EVENS[:12]}]
    assert instance["omp_threads_bind"] == ",".join(map(str, EVENS[:12]))
    assert instance["membind"] == [0]
    assert instance["tp"] == 1 and instance["port"] == 8001
    assert instance["cpus_allowed"] == EVENS[:12] + [24, 26, 52, 54]
    # The two highest cores of the socket and their siblings stay with the OS.
    assert result["nodes"] == [
        {"node": 0, "inference_cpus": EVENS[:12], "reserved_cpus": [24, 26, 52, 54]}
    ]


def test_r730_tp2_bind_string_is_the_one_from_the_field_notes(topo):
    result = plan(topo("r730"), PlanRequest(layout="tp", model_gb=8))
    (instance,) = result["instances"]
    assert instance["tp"] == 2
    assert instance["omp_threads_bind"] == (
        ",".join(map(str, EVENS[:12])) + "|" + ",".join(map(str, ODDS[:12]))
    )
    assert instance["membind"] == [0, 1]


def test_r730_dp_as_vllm_data_parallel_is_one_instance_with_two_ranks(topo):
    result = plan(topo("r730"), PlanRequest(layout="dp", dp_mode="vllm", model_gb=8))
    assert result["dp_mode"] == "vllm"
    (instance,) = result["instances"]
    assert instance["data_parallel"] == 2 and instance["tp"] == 1
    assert instance["omp_threads_bind"].count("|") == 1
    # One vLLM schedules for both engines: the front door lets twice one engine's share in.
    assert instance["max_connections"] == 256
    assert result["load_balancer"]["backends"] == [8001]


def test_prefix_affinity_is_the_doors_balance_over_two_instances_or_more_and_asked_for(topo):
    # plan_balance prefix: a DP host's door balances by prompt prefix; one instance (SN,
    # vLLM's own DP) has nothing to choose between and stays leastconn; the default is
    # leastconn; another name is refused naming the choices.
    dp = plan(topo("r730"), PlanRequest(layout="dp", model_gb=8, balance="prefix"))
    assert dp["load_balancer"]["balance"] == "prefix"
    for one in (PlanRequest(layout="sn", model_gb=8, balance="prefix"),
                PlanRequest(layout="dp", dp_mode="vllm", model_gb=8, balance="prefix"),
                PlanRequest(layout="dp", model_gb=8)):  # fmt: skip
        assert plan(topo("r730"), one)["load_balancer"]["balance"] == "leastconn"
    with pytest.raises(PlanError) as refused:
        plan(topo("r730"), PlanRequest(layout="dp", model_gb=8, balance="hash"))
    assert refused.value.field == "balance"
    assert refused.value.alternatives == ["balance leastconn", "balance prefix"]


def test_every_layout_serves_behind_the_front_door_on_the_public_port(topo):
    # The front door lets through what the instance's engines schedule at once:
    # vLLM's 128 sequences per rank of a TP group.
    for layout, connections in (("sn", 128), ("tp", 256)):
        result = plan(topo("r730"), PlanRequest(layout=layout, model_gb=8, port=9000))
        (instance,) = result["instances"]
        assert result["endpoint_port"] == result["load_balancer"]["port"] == 9000
        assert result["load_balancer"]["backends"] == [instance["port"]] == [9001]
        assert instance["max_connections"] == connections


def test_r730_dp_as_instances_gets_one_port_each_behind_the_load_balancer(topo):
    result = plan(topo("r730"), PlanRequest(layout="dp", model_gb=8, port=9000))
    assert result["dp_mode"] == "instances"
    assert [(i["name"], i["port"], i["membind"]) for i in result["instances"]] == [
        ("vllm-dp0", 9001, [0]),
        ("vllm-dp1", 9002, [1]),
    ]
    assert result["load_balancer"] == {
        "port": 9000,
        "balance": "leastconn",
        "backends": [9001, 9002],
    }
    assert result["endpoint_port"] == 9000


def test_kv_cache_follows_the_documented_formula(topo):
    # 64 GB node, 8 GB model: 0.75 * (64 - 6.4 - 8) = 37.2 -> 37
    result = plan(topo("r730"), PlanRequest(layout="sn", model_gb=8))
    assert result["instances"][0]["kvcache_gb"] == 37
    # TP-2 holds half the weights per rank: 0.75 * (64 - 6.4 - 4) = 40.2 -> 40
    result = plan(topo("r730"), PlanRequest(layout="tp", model_gb=8))
    assert result["instances"][0]["kvcache_gb"] == 40


def assert_fits(facts: dict, result: dict, model_gb: float) -> None:
    """No rank on a memory-only node or across nodes, one thread per physical core, no CPU
    shared, and every node's weights, KV caches and OS reserve within its memory."""
    nodes = {n["id"]: n for n in facts["nodes"]}
    used_cpus: list[int] = []
    weight_gb: dict[int, float] = {}
    kv_gb: dict[int, float] = {}
    for instance in result["instances"]:
        for rank in instance["ranks"]:
            node = nodes[rank["node"]]
            assert node["socket"] is not None, "a memory-only node got a rank"
            assert set(rank["cpus"]) <= set(node["cpus"]), "a rank straddles nodes"
            # One thread per physical core: no two threads on siblings of one core.
            cores_hit = [c for c in node["cores"] if set(c) & set(rank["cpus"])]
            assert len(cores_hit) == len(rank["cpus"])
            used_cpus += rank["cpus"]
            weight_gb[rank["node"]] = weight_gb.get(rank["node"], 0) + model_gb / instance["tp"]
            kv_gb[rank["node"]] = kv_gb.get(rank["node"], 0) + instance["kvcache_gb"]
    assert len(used_cpus) == len(set(used_cpus)), "two ranks share a CPU"
    for node_id, kv in kv_gb.items():
        node_gb = nodes[node_id]["memory_mb"] / 1024
        assert kv + weight_gb[node_id] + os_reserve_gb(node_gb) <= node_gb


@pytest.mark.parametrize("name", sorted(MACHINES))
@pytest.mark.parametrize("layout", ["sn", "tp", "dp", "auto"])
def test_plans_never_overcommit_a_node_or_share_a_core(topo, name, layout):
    # Every fixture machine holds a 4 GB model in every layout (split nodes let DP and TP
    # use one-node machines): a PlanError here is a refusal of a plan the host can hold.
    facts = topo(name)
    assert_fits(facts, plan(facts, PlanRequest(layout=layout, model_gb=4, split_nodes=True)), 4)


@pytest.fixture(scope="module")
def every_machine(tmp_path_factory) -> dict[str, dict]:
    return {
        name: detect(build_machine(name, tmp_path_factory.mktemp(name)))
        for name in sorted(MACHINES)
    }


@settings(max_examples=80, deadline=None, derandomize=True)
@given(
    name=st.sampled_from(sorted(MACHINES)),
    layout=st.sampled_from(["sn", "tp", "dp", "auto"]),
    model_gb=st.floats(min_value=0, max_value=2048),
)
def test_any_model_size_is_planned_within_the_nodes_or_refused_for_its_size(
    every_machine, name, layout, model_gb
):
    facts = every_machine[name]
    request = PlanRequest(layout=layout, model_gb=model_gb, split_nodes=True)
    try:
        result = plan(facts, request)
    except PlanError as refused:
        # The one refusal a valid request may meet: the model is too large for the host.
        assert refused.field == "model_gb", refused
        # ... and then a larger one is refused too.
        with pytest.raises(PlanError):
            plan(facts, PlanRequest(layout=layout, model_gb=2 * model_gb, split_nodes=True))
        return
    assert_fits(facts, result, model_gb)
    # A smaller model fits wherever this one did.
    plan(facts, PlanRequest(layout=layout, model_gb=model_gb / 2, split_nodes=True))


def test_smt_siblings_are_never_inference_threads(topo):
    result = plan(topo("epyc2s"), PlanRequest(layout="sn"))
    cpus = result["instances"][0]["ranks"][0]["cpus"]
    assert cpus == list(range(0, 62)), "62 of 64 cores, siblings 128+ excluded"


def test_sub_numa_clustering_keeps_tp2_inside_one_socket(topo):
    facts = topo("snc")
    socket_of = {n["id"]: n["socket"] for n in facts["nodes"]}
    result = plan(facts, PlanRequest(layout="tp", ranks=2, model_gb=8))
    nodes = [r["node"] for r in result["instances"][0]["ranks"]]
    assert len(set(nodes)) == 2
    assert len({socket_of[n] for n in nodes}) == 1
    dp = plan(facts, PlanRequest(layout="dp", model_gb=8))
    assert len(dp["instances"]) == 4


def test_memory_only_node_gets_no_rank(topo):
    facts = topo("cxl")
    memory_only = [n["id"] for n in facts["nodes"] if not n["cpus"]]
    assert memory_only
    result = plan(facts, PlanRequest(layout="dp", model_gb=8))
    assert len(result["instances"]) == 2
    assert not {r["node"] for i in result["instances"] for r in i["ranks"]} & set(memory_only)


def test_offline_cpus_are_never_planned(topo):
    facts = topo("offline")
    online = {c for n in facts["nodes"] for c in n["cpus"]}
    result = plan(facts, PlanRequest(layout="dp", model_gb=1))
    assert {c for i in result["instances"] for r in i["ranks"] for c in r["cpus"]} <= online


def test_dp_on_one_node_splits_its_cores_into_contiguous_disjoint_halves(topo):
    result = plan(topo("vm"), PlanRequest(layout="dp", model_gb=1))
    assert [i["ranks"][0]["cpus"] for i in result["instances"]] == [[0, 1, 2], [3, 4, 5]]


def test_dp_ranks_beyond_nodes_split_every_node(topo):
    result = plan(topo("r730"), PlanRequest(layout="dp", ranks=4, model_gb=8))
    cpus = [i["ranks"][0]["cpus"] for i in result["instances"]]
    assert cpus == [EVENS[:6], EVENS[6:12], ODDS[:6], ODDS[6:12]]


def test_sn_on_a_gpu_server_sits_on_the_node_the_gpus_hang_off(topo):
    facts = topo("gpu")
    gpu_nodes = {g["numa_node"] for g in facts["gpus"]}
    result = plan(facts, PlanRequest(layout="sn"))
    assert {r["node"] for r in result["instances"][0]["ranks"]} == gpu_nodes


def test_two_core_lab_host_runs_all_three_layouts_with_no_reserve():
    lab = two_core_lab_host()
    assert binds(plan(lab, PlanRequest(layout="sn"))) == ["0,1"]
    assert binds(plan(lab, PlanRequest(layout="tp", split_nodes=True))) == ["0|1"]
    assert binds(plan(lab, PlanRequest(layout="dp"))) == ["0", "1"]
    assert binds(plan(lab, PlanRequest(layout="dp", dp_mode="vllm"))) == ["0|1"]


def test_the_front_end_and_the_scheduler_take_the_kept_cores_as_documented(topo):
    r730 = topo("r730")
    # Node 0 keeps two cores, (24, 52) and (26, 54): the API server gets the first, the
    # engine core's scheduler the last, each with its SMT sibling.
    (sn,) = plan(r730, PlanRequest(layout="sn", model_gb=8))["instances"]
    assert (sn["frontend_cpus"], sn["engine_cpus"]) == ([24, 52], [26, 54])
    # Three kept: the API server the first two, the scheduler still the last alone.
    (kept3,) = plan(r730, PlanRequest(layout="sn", model_gb=8, reserve_cores=3))["instances"]
    assert (kept3["frontend_cpus"], kept3["engine_cpus"]) == ([22, 24, 50, 52], [26, 54])
    # One replica per node: each on its own node's kept cores.
    dp = plan(r730, PlanRequest(layout="dp", model_gb=8))["instances"]
    assert [(i["frontend_cpus"], i["engine_cpus"]) for i in dp] == [
        ([24, 52], [26, 54]),
        ([25, 53], [27, 55]),
    ]
    # vLLM's own DP runs its engine cores in one unit: they stay where they are, and the
    # API server takes every kept core of both nodes.
    (own,) = plan(r730, PlanRequest(layout="dp", model_gb=8, dp_mode="vllm"))["instances"]
    assert (own["frontend_cpus"], own["engine_cpus"]) == ([24, 25, 26, 27, 52, 53, 54, 55], [])


def _with_llc(host: dict, llc_kb: int) -> dict:
    return {**host, "nodes": [{**n, "llc_kb": llc_kb} for n in host["nodes"]]}


def test_sn_keeps_a_front_end_core_on_a_small_node_whose_cache_holds_the_weights():
    lab = _with_llc(two_core_lab_host(), 32768)
    tiny = plan(lab, PlanRequest(layout="sn", model_gb=0.007))
    assert binds(tiny) == ["0"]
    # One kept core: the API server's; the engine core's scheduler goes beside the worker.
    placed = tiny["instances"][0]
    assert (placed["frontend_cpus"], placed["engine_cpus"]) == ([1], [0])
    assert "7 MB of weights fit in the node's 32 MB last-level cache" in tiny["reason"]
    # Weights no cache holds: decode wants both cores' memory bandwidth.
    assert binds(plan(lab, PlanRequest(layout="sn", model_gb=1.0))) == ["0,1"]
    # A given reserve stands; DP-2 stays possible; an unknown cache keeps the rule.
    assert binds(plan(lab, PlanRequest(layout="sn", model_gb=0.007, reserve_cores=0))) == ["0,1"]
    assert binds(plan(lab, PlanRequest(layout="dp", model_gb=0.007))) == ["0", "1"]
    assert binds(plan(two_core_lab_host(), PlanRequest(layout="sn", model_gb=0.007))) == ["0,1"]


def test_a_node_of_four_or_more_cores_keeps_the_rules_reserve_whatever_its_cache(topo):
    facts = _with_llc(topo("vm"), 2**20)
    ruled = plan(topo("vm"), PlanRequest(layout="sn", model_gb=0.007))
    assert binds(plan(facts, PlanRequest(layout="sn", model_gb=0.007))) == binds(ruled)
    # Four cores: the rule's own reserve, not the cache's.
    four = plan(_with_llc(synthetic([(4, 16)]), 2**20), PlanRequest(layout="sn", model_gb=0.007))
    assert binds(four) == binds(
        plan(synthetic([(4, 16)]), PlanRequest(layout="sn", model_gb=0.007))
    )
    assert "last-level cache" not in four["reason"]


def test_weights_exactly_the_cache_s_size_fit_it_and_the_reason_says_both_sizes():
    lab = _with_llc(two_core_lab_host(), 2**20)
    for model_gb in (0.75, 1.0):
        fitting = plan(lab, PlanRequest(layout="sn", model_gb=model_gb))
        assert binds(fitting) == ["0"], model_gb
    assert (
        "768 MB of weights fit in the node's 1024 MB last-level cache"
        in plan(lab, PlanRequest(layout="sn", model_gb=0.75))["reason"]
    )
    # A cluster's pipeline stage has no front end of its own: nothing to keep a core for.
    stage = plan(lab, PlanRequest(layout="sn", model_gb=0.75, own_front_end=False))
    assert binds(stage) == ["0,1"]


@pytest.mark.parametrize(
    ("model_gb", "concurrency", "crossover", "layout", "words"),
    [
        (8, 4, None, "sn", "at or below the SN/DP crossover 6 (default"),
        (8, None, None, "sn", "no expected concurrency"),
        (8, 8, None, "dp", "above the SN/DP crossover 6 (default"),
        (8, 8, 10, "sn", "crossover 10 (given in plan_crossover)"),
        (100, 1, None, "tp", "does not fit one NUMA node"),
    ],
)
def test_auto_follows_the_field_rules_and_says_which_fired(
    topo, model_gb, concurrency, crossover, layout, words
):
    result = plan(
        topo("r730"),
        PlanRequest(model_gb=model_gb, concurrency=concurrency, crossover=crossover),
    )
    assert result["layout"] == layout
    assert words in result["reason"]


@pytest.mark.parametrize(
    ("request_", "field", "words"),
    [
        (
            PlanRequest(layout="tp", ranks=3),
            "ranks",
            "plans that would work: TP ranks 1, TP ranks 2",
        ),
        (PlanRequest(layout="dp", ranks=3), "ranks", "DP ranks 4"),
        (PlanRequest(model_gb=200), "model_gb", "fits no node"),
        (PlanRequest(layout="sn", reserve_cores=14), "reserve_cores", ">= the 14 physical"),
        (PlanRequest(layout="sn", model_gb=8, kv_gb=60), "kv_gb", "kv 49 GB"),
        (PlanRequest(layout="mesh"), "layout", "layout sn, layout tp"),
    ],
)
def test_requests_the_host_cannot_hold_name_the_input_and_the_alternatives(
    topo, request_, field, words
):
    with pytest.raises(PlanError) as caught:
        plan(topo("r730"), request_)
    assert caught.value.field == field
    assert words in str(caught.value)


def test_malformed_topology_is_refused():
    with pytest.raises(PlanError, match="malformed topology"):
        plan({"schema": 1, "nodes": [{"id": 0}]}, PlanRequest())


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "socketwise.cli", *args], capture_output=True, text=True
    )


def test_cli_plans_from_a_topology_file_and_from_a_root(topo, tmp_path):
    facts_file = tmp_path / "r730.json"
    facts_file.write_text(json.dumps(topo("r730")))
    from_file = run_cli("plan", "--topology", str(facts_file), "--layout", "tp", "--model-gb", "8")
    assert from_file.returncode == 0, from_file.stderr
    from_root = run_cli(
        "plan", "--root", str(tmp_path / "r730"), "--layout", "tp", "--model-gb", "8"
    )
    assert json.loads(from_file.stdout) == json.loads(from_root.stdout)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--layout", "tp", "--ranks", "3"], "--ranks: TP with 3 ranks"),
        (["--layout", "weird"], "--layout: unknown layout 'weird'"),
    ],
)
def test_cli_bad_input_exits_nonzero_with_one_line(topo, tmp_path, args, words):
    facts_file = tmp_path / "r730.json"
    facts_file.write_text(json.dumps(topo("r730")))
    result = run_cli("plan", "--topology", str(facts_file), *args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and words in result.stderr


def test_cli_refuses_a_topology_file_that_is_not_json(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    result = run_cli("plan", "--topology", str(bad))
    assert result.returncode == 2
    assert "cannot read topology file" in result.stderr


def synthetic(nodes: list[tuple[int, int]], distances: list[list[int]] | None = None) -> dict:
    """A topology of (physical cores, GB) per node, no SMT, CPUs numbered node by node."""
    described, first = [], 0
    for index, (cores, gb) in enumerate(nodes):
        cpus = list(range(first, first + cores))
        first += cores
        row = (
            distances[index] if distances else [10 if i == index else 21 for i in range(len(nodes))]
        )
        described.append({"id": index, "socket": index, "cpus": cpus, "cores": [[c] for c in cpus],
                          "memory_mb": gb * 1024, "distances": row})  # fmt: skip
    return {"schema": 1, "nodes": described, "gpus": [], "isa": {"avx2": True}}


def test_auto_places_sn_on_a_node_the_model_fits_not_the_one_with_most_cores():
    # Node 0 has more cores but 16 GB cannot hold a 20 GB model; node 1 (64 GB) can.
    result = plan(synthetic([(16, 16), (8, 64)]), PlanRequest(layout="auto", model_gb=20))
    assert result["layout"] == "sn"
    assert [rank["node"] for rank in result["instances"][0]["ranks"]] == [1]


def test_nodes_whose_distances_are_unknown_count_as_local_and_ties_take_the_lowest_ids():
    nodes = synthetic([(8, 64)] * 4)
    for node in nodes["nodes"]:
        del node["distances"]
    result = plan(nodes, PlanRequest(layout="tp", ranks=2, model_gb=8))
    assert result["instances"][0]["membind"] == [0, 1]


def test_tp_takes_the_nodes_closest_to_each_other_by_the_distance_matrix():
    # A ring of four sockets: 0-2-1-3-0. Nodes 0 and 1 are two hops apart.
    ring = [[10, 32, 21, 21], [32, 10, 21, 21], [21, 21, 10, 32], [21, 21, 32, 10]]
    result = plan(synthetic([(8, 64)] * 4, ring), PlanRequest(layout="tp", ranks=2, model_gb=8))
    assert result["instances"][0]["membind"] == [0, 2]
    # Where the model needs two nodes, auto shards it over neighbours too.
    auto = plan(synthetic([(8, 16)] * 4, ring), PlanRequest(layout="auto", model_gb=20))
    assert auto["layout"] == "tp" and auto["instances"][0]["membind"] == [0, 2]


def test_dp_with_fewer_replicas_than_nodes_takes_the_first_nodes_in_id_order():
    # Replicas never talk to each other: unlike a TP group they take nodes in id order
    # (docs/concepts/plan.md), even on the ring above where nodes 0 and 1 are two hops apart.
    ring = [[10, 32, 21, 21], [32, 10, 21, 21], [21, 21, 10, 32], [21, 21, 32, 10]]
    result = plan(synthetic([(8, 64)] * 4, ring), PlanRequest(layout="dp", ranks=2, model_gb=8))
    assert [instance["membind"] for instance in result["instances"]] == [[0], [1]]
    assert [node["node"] for node in result["nodes"]] == [0, 1]


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (PlanRequest(layout="auto", ranks=4), "ranks"),
        (PlanRequest(layout="dp", port=65535), "port"),
        (PlanRequest(layout="sn", port=0), "port"),
        (PlanRequest(layout="auto", concurrency=-4, crossover=-9), "concurrency"),
        (PlanRequest(layout="auto", crossover=float("nan")), "crossover"),
        (PlanRequest(layout="sn", model_gb=float("inf")), "model_gb"),
        (PlanRequest(layout="dp", ranks=0), "ranks"),
    ],
    ids=[
        "auto-ignores-ranks",
        "dp-backend-ports",
        "port-0",
        "negative-load",
        "nan",
        "inf",
        "0-ranks",
    ],
)
def test_numbers_no_plan_can_use_are_refused_naming_the_input(topo, request_, field):
    with pytest.raises(PlanError) as refused:
        plan(topo("r730"), request_)
    assert refused.value.field == field


def test_ranks_given_with_auto_are_refused_with_the_layouts_that_take_them(topo):
    with pytest.raises(PlanError) as refused:
        plan(topo("r730"), PlanRequest(layout="auto", ranks=4))
    assert str(refused.value) == (
        "layout auto chooses the rank count itself, so 4 ranks would be ignored: drop the "
        "ranks, or choose the layout; plans that would work: layout tp ranks 4, layout dp ranks 4"
    )


# Keys a hand-edited topology gets wrong: each refused in one line naming the key path, the
# value as the file spells it and what it should be (once a traceback, or a plan from a
# document that contradicts itself).
BAD_TOPOLOGY = {
    "cpus-text": (
        lambda doc: doc["nodes"][0].update(cpus="0-27"),
        'nodes[0].cpus is "0-27", not a list of CPU numbers (such as [0, 1, 2, 3])',
    ),
    "sockets-null": (
        lambda doc: doc.update(sockets=None),
        "sockets is null, not a list of sockets (objects)",
    ),
    "isa-list": (
        lambda doc: doc.update(isa=["avx2"]),
        'isa is ["avx2"], not an object of flags (such as {"avx2": true})',
    ),
    "cpu-list": (
        lambda doc: doc.update(cpu=["GenuineIntel"]),
        'cpu is ["GenuineIntel"], not an object',
    ),
    "core-of-another-node": (
        lambda doc: doc["nodes"][0]["cores"].append([1]),
        "nodes[0].cores[14] is [1], with CPU 1 that nodes[0].cpus "
        "(0,2,4,6,8,10,12,14,16,18,20,22,24,26,28,30,32,34,36,38,40,42,44,46,48,50,52,54) "
        "does not have: a core lists only its node's CPUs",
    ),
}


def _broken(topo, case: str) -> dict:
    doc = topo("r730")
    BAD_TOPOLOGY[case][0](doc)
    return doc


@pytest.mark.parametrize("case", BAD_TOPOLOGY)
def test_a_topology_key_of_the_wrong_kind_is_refused_by_the_planner(topo, case):
    with pytest.raises(PlanError) as refused:
        plan(_broken(topo, case), PlanRequest(model_gb=8))
    assert refused.value.field == "topology"
    assert f"malformed topology: {BAD_TOPOLOGY[case][1]}" in str(refused.value)


@pytest.mark.parametrize("case", BAD_TOPOLOGY)
def test_a_topology_file_with_a_key_of_the_wrong_kind_is_refused_in_one_line(topo, tmp_path, case):
    path = tmp_path / "r730.json"
    path.write_text(json.dumps(_broken(topo, case)))
    with pytest.raises(PlanError, match="malformed topology"):
        read_topology(path)
    good = tmp_path / "milan.json"
    good.write_text(json.dumps(topo("milan")))
    expected = f"socketwise plan: error: --topology {path}: malformed topology: "
    # One host, and the same file as one of a cluster's hosts.
    for extra in ([], ["--topology", str(good), "--model-layers", "32"]):
        result = run_cli("plan", "--topology", str(path), *extra, "--model-gb", "8")
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.startswith(expected) and result.stderr.count("\n") == 1
        assert BAD_TOPOLOGY[case][1] in result.stderr


def test_a_topology_without_the_optional_keys_still_plans():
    # Hand-written documents may leave out cpus, sockets and cpu: only a key given is checked.
    minimal = {"schema": 1, "nodes": [{"id": 0, "cores": [[0], [1]], "memory_mb": 24000}]}
    minimal["isa"] = {"avx2": True}
    assert plan(minimal, PlanRequest(layout="sn"))["layout"] == "sn"


def test_the_highest_public_port_that_leaves_room_for_the_backends_plans_and_is_the_one_offered(
    topo,
):
    facts = topo("r730")
    sn = plan(facts, PlanRequest(layout="sn", model_gb=8, port=65534))
    assert sn["load_balancer"]["backends"] == [65535]
    with pytest.raises(PlanError) as refused:
        plan(facts, PlanRequest(layout="dp", model_gb=8, port=65534))
    assert refused.value.field == "port" and refused.value.alternatives == ["port 65533"]
    # The port offered is one that plans.
    dp = plan(facts, PlanRequest(layout="dp", model_gb=8, port=65533))
    assert dp["load_balancer"]["backends"] == [65534, 65535]


def test_a_model_that_leaves_exactly_one_gb_for_the_kv_cache_still_plans():
    # 10 GB node: 1 GB for the OS, 8 GB of weights, 1 GB left: the least a rank may have.
    result = plan(synthetic([(4, 10)]), PlanRequest(layout="sn", model_gb=8))
    assert result["instances"][0]["kvcache_gb"] == 1
    with pytest.raises(PlanError) as refused:
        plan(synthetic([(4, 10)]), PlanRequest(layout="sn", model_gb=8.5))
    assert refused.value.field == "model_gb"


def test_an_explicit_kv_cache_may_take_all_the_room_its_node_has_but_not_more():
    # 10 GB node, no weights: 10 - 1 GB for the OS = 9 GB.
    node = synthetic([(4, 10)])
    assert plan(node, PlanRequest(layout="sn", kv_gb=9))["instances"][0]["kvcache_gb"] == 9
    with pytest.raises(PlanError) as refused:
        plan(node, PlanRequest(layout="sn", kv_gb=10))
    assert refused.value.field == "kv_gb" and refused.value.alternatives == ["kv 9 GB"]
    assert str(refused.value) == (
        "KV cache 10 GB per rank exceeds the 9.0 GB its node has after weights and OS "
        "reserve; plans that would work: kv 9 GB"
    )


def test_a_model_that_leaves_exactly_the_least_kv_cache_still_fits_one_node():
    # 10 GB nodes: 1 GB for the OS, 8 GB of weights, 1 GB left: the least a rank needs.
    exact = plan(synthetic([(4, 10), (4, 10)]), PlanRequest(model_gb=8))
    assert (exact["layout"], exact["instances"][0]["kvcache_gb"]) == ("sn", 1)
    # The reason, whole: the rule's own words and nothing measured added to them.
    assert exact["reason"] == (
        "auto: model 8 GB fits one node and no expected concurrency given, so one instance "
        "on one node (SN); TP across nodes only pays when the model does not fit one"
    )


def test_tp_ranks_get_equal_cores_and_dp_replicas_all_of_their_nodes_on_unequal_nodes():
    # Nodes of 4 and 6 cores, each keeping one: 3 and 5 usable.
    host = synthetic([(4, 10), (6, 10)])
    # TP's ranks step together: the slower rank sets the pace, so both get 3 cores.
    assert binds(plan(host, PlanRequest(layout="tp", ranks=2))) == ["0,1,2|4,5,6"]
    # DP's replicas serve on their own: each takes what its node has.
    assert binds(plan(host, PlanRequest(layout="dp", ranks=2))) == ["0,1,2", "4,5,6,7,8"]


def test_ranks_beyond_the_node_count_say_what_would_allow_them(topo):
    with pytest.raises(PlanError) as refused:
        plan(topo("r730"), PlanRequest(layout="tp", ranks=3))
    assert str(refused.value) == (
        "TP with 3 ranks does not fit 2 NUMA node(s) with CPUs (nodes 0, 1; usable cores "
        "[12, 12]) (ranks beyond the node count need --split-nodes); plans that would work: "
        "TP ranks 1, TP ranks 2"
    )


def test_a_small_node_keeps_at_least_one_gb_for_the_os():
    # 5 GB node: the OS keeps 1 GB, not 10 % (0.5 GB), so 0.5 GB of weights leave 3.5 GB.
    node = synthetic([(4, 5)])
    with pytest.raises(PlanError) as refused:
        plan(node, PlanRequest(layout="sn", model_gb=0.5, kv_gb=4))
    assert refused.value.field == "kv_gb" and refused.value.alternatives == ["kv 3 GB"]
    assert plan(node, PlanRequest(layout="sn", model_gb=0.5))["instances"][0]["kvcache_gb"] == 2


@pytest.mark.parametrize(("cores", "kept"), [(8, 2), (7, 1), (4, 1), (3, 0)])
def test_a_node_keeps_the_documented_number_of_cores_for_the_os_by_its_size(cores, kept):
    result = plan(synthetic([(cores, 64)]), PlanRequest(layout="sn", model_gb=1))
    assert len(result["nodes"][0]["reserved_cpus"]) == kept
    assert len(result["instances"][0]["ranks"][0]["cpus"]) == cores - kept


@pytest.mark.parametrize(
    ("request_", "field", "words"),
    [
        (PlanRequest(layout="sn", kv_gb=0), "kv_gb", "at least 1"),
        (PlanRequest(layout="sn", kv_gb=2.5), "kv_gb", "whole number of GB"),  # type: ignore[arg-type]
        (PlanRequest(layout="sn", reserve_cores=-1), "reserve_cores", "is negative"),
        (PlanRequest(layout="sn", model_gb=-8), "model_gb", "must be a number >= 0"),
        (PlanRequest(layout="sn", ranks=2), "ranks", "SN runs one rank, not 2"),
    ],
    ids=["kv-0", "kv-fraction", "negative-reserve", "negative-model", "sn-2-ranks"],
)
def test_a_request_no_plan_can_meet_is_refused_naming_the_input_and_the_fix(
    topo, request_, field, words
):
    with pytest.raises(PlanError) as refused:
        plan(topo("r730"), request_)
    assert refused.value.field == field
    assert words in str(refused.value)


@pytest.mark.parametrize(
    ("cores", "shown"),
    [(6, ["TP ranks 10"]), (7, ["TP ranks 10", "... up to TP ranks 12"])],
    ids=["six-that-work", "seven-that-work"],
)
def test_a_refused_rank_count_lists_six_that_work_and_the_largest(cores, shown):
    # Split over two nodes, TP works with 1, 2 and any even count up to the usable cores.
    with pytest.raises(PlanError) as refused:
        plan(synthetic([(cores, 64)] * 2), PlanRequest(layout="tp", ranks=3, split_nodes=True))
    first = ["TP ranks 1", "TP ranks 2", "TP ranks 4", "TP ranks 6", "TP ranks 8"]
    assert refused.value.alternatives == first + shown


# Every number a request takes, as Ansible's extra vars give it (text), and its kind.
SPELLED = {"ranks": ("4", 4), "reserve_cores": ("2", 2), "kv_gb": ("12", 12)}
SPELLED |= {"port": ("9000", 9000)}
SPELLED |= {"model_gb": ("8.5", 8.5), "concurrency": ("6", 6.0), "crossover": ("4.5", 4.5)}
SPELLED |= {"gpu_memory_gb": ("80", 80.0), "expert_gb": ("30.5", 30.5), "layers": ("48", 48)}
SPELLED |= {"dense_layers": ("3", 3)}


@pytest.mark.parametrize("name", SPELLED)
def test_values_given_as_strings_plan_as_the_numbers_and_switches_they_spell(name):
    text, number = SPELLED[name]
    value = getattr(PlanRequest.from_values(**{name: text}), name)
    assert (value, type(value)) == (number, type(number))
    # Left empty (an unset extra var): the request's default.
    assert getattr(PlanRequest.from_values(**{name: ""}), name) == getattr(PlanRequest(), name)
    request = PlanRequest.from_values(layout="tp", split_nodes="false")
    assert (request.layout, request.split_nodes) == ("tp", False)
    for switch in ("1", "true", "True", "yes", "on"):
        assert PlanRequest.from_values(split_nodes=switch).split_nodes is True
    # An empty value leaves the rest as given.
    request = PlanRequest.from_values(kv_gb="", split_nodes="on", layout="dp")
    assert (request.kv_gb, request.split_nodes, request.layout) == (None, True, "dp")


def test_a_calibration_record_from_ansible_becomes_a_plain_mapping_the_plan_records():
    # Ansible hands the group's record over as a mapping of its own kind.
    record = MappingProxyType({"reserve_cores": 1, "source": "measured in run-1"})
    measured = PlanRequest.from_values(measured=record).measured
    assert type(measured) is dict and measured == dict(record)
    assert PlanRequest.from_values(measured={}).measured == {}
    for name, value in (("ranks", "two"), ("kv_gb", "2.5"), ("port", "80a")):
        with pytest.raises(PlanError) as refused:
            PlanRequest.from_values(**{name: value})
        assert refused.value.field == name
        assert f"{value!r} is not a number" in str(refused.value)
