"""Which hosts rollout.yml's own plays reach, with no server: its plays after the checks
(check.yml, deploy's first play, needs real hosts), run on the controller with their own
host patterns, batches and the play that leaves clusters out, each other play's tasks
replaced by one line saying which host it reached."""

import re
import sys

import pytest
import yaml

from .playbooks import REPO, run_playbook

LEAVE_OUT = "Choose the hosts to roll, leaving clusters to deploy.yml"
BATCHES = "Roll out the new release, batch by batch"
INVENTORY = {
    "all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
        "hosts": {
            "single-01": {},
            # A second model (a fleet of many models), on two hosts among the others.
            "single-02": {"vllm_served_model_name": "big"},
            "head-01": {"socketwise_cluster": "c1", "socketwise_cluster_head": "head-01"},
            "worker-01": {"socketwise_cluster": "c1", "socketwise_cluster_head": "head-01"},
            # More single hosts, after a cluster's: the batches keep the inventory's order.
            **{f"single-0{n}": {} for n in range(3, 8)},
            "single-08": {"vllm_model_hf_id": "org/big"},
        },
        "children": {
            "socketwise_frontdoor": {"hosts": {"lb-01": {}}},
            "socketwise_loadgen": {"hosts": {"load-01": {}}},
            "socketwise_monitor": {"hosts": {"mon-01": {}}},
        },
    }
}


SINGLES = [host for host in INVENTORY["all"]["hosts"] if host.startswith("single-")]


def stand_in(play: dict) -> dict:
    """PLAY as rollout.yml has it, its tasks replaced by one that names the host reached
    and, on the fleet front door, one that names the servers the role's own variable lists."""
    if play["name"] == LEAVE_OUT:
        return play
    keys = ("name", "hosts", "serial", "max_fail_percentage")
    kept = {key: play[key] for key in keys if key in play} | {"gather_facts": False}
    says = "reached {{ inventory_hostname }} in {{ ansible_play_name }}"
    tasks = [{"ansible.builtin.debug": {"msg": says}}]
    if play["hosts"] == "socketwise_frontdoor":
        role_vars = yaml.safe_load((REPO / "roles/fleet_door/vars/main.yml").read_text())
        kept["vars"] = {"__fleet_door_hosts": role_vars["__fleet_door_hosts"]}
        lists = "fleet servers {{ __fleet_door_hosts | sort | join(',') }}"
        tasks.append({"ansible.builtin.debug": {"msg": lists}})
    return kept | {"tasks": tasks}


@pytest.fixture(scope="module")
def rollout(tmp_path_factory):
    plays = yaml.safe_load((REPO / "playbooks" / "rollout.yml").read_text())
    own = [stand_in(play) for play in plays if "ansible.builtin.import_playbook" not in play]
    assert own[0]["name"] == LEAVE_OUT, "clusters leave before any play of the rollout's own"
    where = tmp_path_factory.mktemp("rollout")
    (where / "rollout.yml").write_text(yaml.safe_dump(own, sort_keys=False))
    (where / "hosts.yml").write_text(yaml.safe_dump(INVENTORY))
    done = run_playbook(str(where / "rollout.yml"), "-i", str(where / "hosts.yml"))
    assert done.returncode == 0, done.output[-3000:]
    return done


def reached(output: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for host, play in re.findall(r"reached (\S+) in (.+?)\"?$", output, re.MULTILINE):
        found.setdefault(play, set()).add(host)
    return found


def test_each_cluster_member_is_left_out_with_one_line(rollout):
    for host in ("head-01", "worker-01"):
        line = (
            f"{host}: member of cluster c1: rollout.yml leaves clusters out; "
            "deploy.yml rolls a cluster out"
        )
        assert rollout.output.count(line) == 1, rollout.output[-3000:]
        assert rollout.recap(host)["failed"] == 0
    assert "single-01: member of cluster" not in rollout.output


def test_the_record_and_the_batches_reach_only_hosts_outside_clusters(rollout):
    # Not the fleet door, the load generator or the monitor either: they serve nothing
    # (a monitor host in a batch had no plan to roll, and failed the rollout).
    plays = reached(rollout.output)
    assert plays["Start the rollout's record"] == set(SINGLES)
    assert plays[BATCHES] == set(SINGLES)
    # Batches of one (rollout_batch's default): one per host outside a cluster, none
    # spent on (or diluted by) a cluster member.
    assert rollout.output.count(f"PLAY [{BATCHES}]") == len(SINGLES)


def test_the_batches_follow_the_inventorys_order_one_models_hosts_at_a_time(rollout):
    # rollout_batch: 1 rolls the inventory's first serving host first (a canary is the
    # host the operator lists first), whichever host's check came back first; the hosts
    # of its model all go before the next model's (single-02 and single-08 serve "big").
    batches = re.findall(rf"reached (\S+) in {re.escape(BATCHES)}", rollout.output)
    big = ["single-02", "single-08"]
    assert batches == [host for host in SINGLES if host not in big] + big


def test_the_fleet_front_door_still_lists_every_serving_host(rollout):
    fleet = "Keep the fleet front door over every serving host"
    assert reached(rollout.output)[fleet] == {"lb-01"}
    servers = ",".join(sorted([*SINGLES, "head-01", "worker-01"]))
    assert f"fleet servers {servers}" in rollout.output


def test_a_hosts_record_has_every_key_the_reference_names_read_from_vllm_services_outputs(
    tmp_path,
):
    """The rollout role's record (roles/rollout/tasks/record.yml) of a rolled host, from
    what vllm_service's entry points publish: every key docs/reference/rollout-summary.md
    names, each value read from its output."""
    published = {
        "release_serving": {"id": "sn-new"},
        "vllm_service_restart_seconds": {"sn": 12.5},
        "vllm_service_restart_log": [{"instance": "sn", "left": 1.0, "back": 2.0}],
        "vllm_service_completions": {"results": [{"json": {"usage": {"completion_tokens": 8}}}]},
        "vllm_service_affinity": {"problems": ["sn: cores 0-1, planned 0"]},
    }
    rolled = {
        "__rollout_entry": {"host": "localhost", "started": "2026-12-04T00:00:00+00:00"},
        "__rollout_steps": [{"step": "install", "started": 1.0, "seconds": 2.0}],
        "__rollout_needed": True,
        "__rollout_before": {"id": "sn-old"},
    }
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {"socketwise_artifacts_dir": str(tmp_path)},
            "tasks": [
                {"ansible.builtin.file": {"path": str(tmp_path / "rollout"), "state": "directory"}},
                {"ansible.builtin.set_fact": published | rolled},
                {"ansible.builtin.include_role": {"name": "rollout", "tasks_from": "record"}},
            ],
        }
    ]
    (tmp_path / "record.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    done = run_playbook(str(tmp_path / "record.yml"), "-i", "inventories/local/hosts.yml")
    assert done.returncode == 0, done.output[-3000:]
    summary = yaml.safe_load((tmp_path / "rollout-summary.json").read_text())
    [host] = summary["hosts"]
    reference = (REPO / "docs/reference/rollout-summary.md").read_text()
    for key in [*host, *host["gate"]]:
        assert f'"{key}"' in reference, f"{key} is not in the rollout-summary reference"
    assert set(host) == {"host", "started", "ended", "changed", "batch", "release_before",
                         "release_after", "steps", "gate", "rolled_back", "failed_step",
                         "reason"}  # fmt: skip
    assert (host["release_before"], host["release_after"]) == ("sn-old", "sn-new")
    assert host["gate"] == {
        "restart_to_ready_seconds": {"sn": 12.5},
        "completion_tokens": [8],
        "placement_problems": ["sn: cores 0-1, planned 0"],
        "instance_restarts": [{"instance": "sn", "left": 1.0, "back": 2.0}],
        "bench": None,
    }
    assert (host["changed"], host["rolled_back"], host["reason"]) == (True, False, "rolled out")
