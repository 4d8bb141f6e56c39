"""Hardware classes of the fixture machines: what a fleet groups its servers by."""

import copy
import re

import pytest

from socketwise.facts.topology import detect
from socketwise.plan.hwclass import BuildRefused, build, hardware_class, isa_class
from socketwise.plan.planner import PlanError, PlanRequest, plan

from .machines import build_machine


@pytest.fixture
def topo(tmp_path):
    def load(name: str) -> dict:
        return detect(build_machine(name, tmp_path / name))

    return load


@pytest.mark.parametrize(
    ("name", "isa"),
    [("r730", "avx2"), ("offline", "avx2"), ("vm", "avx512"), ("snc", "amx"), ("gpu", "amx"),
     ("epyc2s", "zen"), ("epyc-nps4", "zen"), ("milan", "avx2"), ("nonuma", "avx2")],
)  # fmt: skip
def test_the_isa_class_follows_the_cpu(topo, name, isa):
    assert isa_class(topo(name)) == isa
    assert hardware_class(topo(name))["id"].split("-")[-2] == isa
    built = plan(topo(name), PlanRequest(layout="sn"))["build"]
    assert (built["class"], built["detected"], built["dtype"]) == (isa, isa, "bfloat16")
    assert built["reason"].startswith(f"{isa}: detected from ")


@pytest.mark.parametrize(
    ("name", "native"),
    [("r730", False), ("milan", False), ("vm", False), ("snc", True), ("epyc2s", True)],
)
def test_the_reason_says_whether_bf16_is_native(topo, name, native):
    reason = build(topo(name))["reason"]
    assert ("bfloat16, native" in reason) == native
    assert ("converted in software" in reason) == (not native)


def test_a_zen_host_runs_zentorch_and_an_intel_one_its_own_kernels(topo):
    assert "ZenTorch" in build(topo("epyc2s"))["reason"]
    assert "AMX" in build(topo("snc"))["reason"]
    assert "_C_AVX2" in build(topo("r730"))["reason"]


@pytest.mark.parametrize(
    ("name", "override"),
    [("snc", "avx512"), ("snc", "avx2"), ("epyc2s", "avx512"), ("epyc2s", "avx2"),
     ("vm", "avx2")],
)  # fmt: skip
def test_a_class_can_be_lowered_to_one_the_cpu_runs(topo, name, override):
    built = build(topo(name), override)
    assert built["class"] == override and built["detected"] == isa_class(topo(name))
    assert "overridden" in built["reason"]


@pytest.mark.parametrize(
    ("name", "override", "words"),
    [
        ("snc", "zen", "needs an AMD CPU with AVX-512 (Zen 4 or Zen 5); Intel(R) Xeon(R) "
         "Platinum 8480+ does not qualify: use amx (detected)"),
        ("milan", "zen", "AMD EPYC 7763 64-Core Processor does not qualify: use avx2"),
        ("r730", "avx512", "needs AVX-512; Intel(R) Xeon(R) CPU E5-2680 v4"),
        ("epyc2s", "amx", "needs AMX"),
        ("vm", "sse4", "unknown build class 'sse4'; one of avx2, avx512, amx, zen"),
    ],
)  # fmt: skip
def test_an_override_the_cpu_cannot_run_is_refused(topo, name, override, words):
    with pytest.raises(BuildRefused, match=re.escape(words)):
        build(topo(name), override)
    with pytest.raises(PlanError) as refused:
        plan(topo(name), PlanRequest(layout="sn", build_class=override))
    assert refused.value.field == "build_class" and words in str(refused.value)


def test_a_cpu_below_avx2_gets_no_plan(topo):
    facts = topo("r730")
    facts["isa"]["avx2"] = False
    with pytest.raises(PlanError, match="has no AVX2, the floor of vLLM's x86 CPU builds"):
        plan(facts, PlanRequest(layout="sn"))


def test_a_cpu_below_avx2_has_no_build_class(topo):
    facts = topo("r730")
    facts["isa"]["avx2"] = False
    assert isa_class(facts) == "none"


def test_the_class_reads_as_the_server_it_describes(topo):
    described = hardware_class(topo("epyc-nps4"))
    assert described["id"].startswith("amd-2s8n-128c-768g-zen-")
    assert described["cpu_model"] == "AMD EPYC 9554 64-Core Processor"
    assert described["nodes"] == [{"cores": 16, "memory_gb": 96}] * 8
    assert (described["sockets"], described["smt"], described["memory_gb"]) == (2, True, 768)


def test_identical_servers_share_a_class_despite_a_few_reserved_megabytes(topo):
    one, other = topo("r730"), copy.deepcopy(topo("r730"))
    other["nodes"][1]["memory_mb"] -= 300  # firmware kept a little more on this one
    other["memory_mb"] -= 300
    assert hardware_class(one) == hardware_class(other)


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t["nodes"][1]["cores"].pop(),  # a core fewer on one node
        lambda t: t["nodes"][0].update(memory_mb=t["nodes"][0]["memory_mb"] * 2),  # more DIMMs
        lambda t: t["cpu"].update(model_name="Intel(R) Xeon(R) CPU E5-2690 v4 @ 2.60GHz"),
        lambda t: t.update(smt=False),
    ],
    ids=["cores", "memory", "cpu-model", "smt"],
)
def test_what_the_planner_reads_splits_classes(topo, change):
    other = copy.deepcopy(topo("r730"))
    change(other)
    assert hardware_class(other)["id"] != hardware_class(topo("r730"))["id"]


def test_the_plan_names_the_class_and_same_class_means_same_shape(topo):
    request = PlanRequest(layout="auto", model_gb=16, concurrency=8)
    one, other = topo("snc"), copy.deepcopy(topo("snc"))
    other["nodes"][2]["memory_mb"] -= 200
    first, second = plan(one, request), plan(other, request)
    assert first["hardware_class"] == second["hardware_class"] == hardware_class(one)
    assert first["layout"] == second["layout"] == "dp"
    assert [(i["port"], i["tp"], i["kvcache_gb"]) for i in first["instances"]] == [
        (i["port"], i["tp"], i["kvcache_gb"]) for i in second["instances"]
    ]
