"""The Ansible module and filter are doors into the same code the CLI runs."""

import json
from pathlib import Path

from socketwise.facts.topology import detect
from socketwise.plan.planner import PlanRequest, plan

from .machines import build_machine
from .playbooks import PlaybookRun
from .playbooks import run_playbook as run


def run_playbook(tmp_path: Path, *extra: str) -> PlaybookRun:
    return run(
        "playbooks/plan.yml",
        *("-i", "inventories/local", "-e", f"socketwise_artifacts_dir={tmp_path / 'artifacts'}"),
        *extra,
    )


def test_playbook_saves_the_same_topology_and_plan_as_the_python_code(tmp_path):
    # GPUs with captured nvidia-smi answers, one placed by its local CPUs.
    root = build_machine("pcie-4gpu", tmp_path / "pcie-4gpu")
    result = run_playbook(
        tmp_path, "-e", f"topology_root={root}", "-e", "plan_layout=tp", "-e", "plan_model_gb=8"
    )
    assert result.returncode == 0, result.output
    saved = tmp_path / "artifacts" / "localhost"
    topology = json.loads((saved / "topology.json").read_text())
    assert topology == detect(root)
    assert json.loads((saved / "plan.json").read_text()) == plan(
        topology, PlanRequest(layout="tp", model_gb=8)
    )
    assert "localhost: tp - layout tp requested" in result.output


def test_playbook_stops_with_one_line_naming_host_and_variable(tmp_path):
    root = build_machine("r730", tmp_path / "r730")
    result = run_playbook(
        tmp_path, "-e", f"topology_root={root}", "-e", "plan_layout=tp", "-e", "plan_ranks=3"
    )
    assert result.returncode != 0
    assert "localhost: plan_ranks=3: TP with 3 ranks does not fit 2 NUMA node(s)" in result.output
    assert not (tmp_path / "artifacts").exists(), "nothing is written after a refused plan"


def test_extra_vars_given_as_strings_plan_like_numbers(tmp_path):
    root = build_machine("r730", tmp_path / "r730")
    result = run_playbook(
        tmp_path,
        *("-e", f"topology_root={root}", "-e", "plan_layout=dp", "-e", "plan_ranks=4"),
        *("-e", "plan_kv_gb=20", "-e", "plan_model_gb=8.5"),
    )
    assert result.returncode == 0, result.output
    saved = json.loads((tmp_path / "artifacts" / "localhost" / "plan.json").read_text())
    assert [i["kvcache_gb"] for i in saved["instances"]] == [20] * 4
    assert saved["model_gb"] == 8.5
