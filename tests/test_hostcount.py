"""`socketwise sweep --hosts` without a lab: which hosts form the measured cluster, the rows
of a step from llama.cpp's timings, and the report's series against the number of hosts."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from socketwise.measure import hostcount, rundir, runner
from socketwise.report.analysis import analyse
from socketwise.report.render import write

from .playbooks import BIN, REPO

INVENTORY = """all:
  children:
    rack:
      hosts:
        w1: {ansible_host: 10.0.0.2}
        head: {ansible_host: 10.0.0.1}
        w2: {ansible_host: 10.0.0.3}
    big:
      hosts: {head: , w1: , w2: }
      vars: {socketwise_cluster: big, socketwise_cluster_head: head}
    other:
      hosts:
        single: {ansible_host: 10.0.0.9}
"""


def test_the_cluster_is_its_head_then_its_workers_in_inventory_order(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(INVENTORY)
    cluster = hostcount.cluster_of(inventory)
    assert cluster == {"name": "big", "head": "head", "members": ["head", "w1", "w2"]}
    assert hostcount.counts_for(cluster, [3, 1, 2, 1]) == [1, 2, 3]
    with pytest.raises(hostcount.HostCountError, match="has 3 hosts .*give counts from 1 to 3"):
        hostcount.counts_for(cluster, [1, 4])


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ("socketwise_cluster_head: head", "no head"),
        ("socketwise_cluster: big", "has none"),
    ],
)
def test_an_inventory_without_one_headed_cluster_is_refused(tmp_path, change, words):
    replaced = {
        "no head": INVENTORY.replace(change, "socketwise_cluster_head: nobody"),
        "has none": INVENTORY.replace(change + ", ", ""),
    }[words]
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(replaced)
    with pytest.raises(hostcount.HostCountError, match=words):
        hostcount.cluster_of(inventory)


def test_a_step_is_summed_from_llama_cpps_own_timings():
    answered = [
        {"status": 200, "seconds": 0.5, "prompt_n": 64, "prompt_ms": 10.0,
         "predicted_n": 16, "predicted_ms": 400.0},
        {"status": 200, "seconds": 1.0, "prompt_n": 64, "prompt_ms": 30.0,
         "predicted_n": 16, "predicted_ms": 800.0},
        {"status": 503, "seconds": 0.01},
    ]  # fmt: skip
    summary, point = hostcount.rows("lab1", 2, 1, answered, wall=2.0)
    assert point == {
        "hosts": 2, "concurrency": 1, "requests": 2, "prompt_tokens": 128, "output_tokens": 32,
        "prefill_tok_s": 3200.0, "decode_tok_s": 26.67, "output_tok_s": 16.0,
    }  # fmt: skip
    assert summary["layout"] == "pp2" and summary["failed"] == 1 and summary["completed"] == 2
    # TTFT: the request's time less llama.cpp's generation time.
    assert summary["ttft_p50_ms"] == 150.0 and summary["tpot_p50_ms"] == 37.5


def test_the_report_shows_prefill_and_decode_against_the_hosts(tmp_path):
    series = []
    summary = []
    for hosts, prefill, decode in ((1, 1000.0, 50.0), (2, 1800.0, 48.0), (3, 2500.0, 45.0)):
        for concurrency in (1, 4):
            series.append({"hosts": hosts, "concurrency": concurrency, "requests": 10,
                           "prompt_tokens": 640, "output_tokens": 160,
                           "prefill_tok_s": prefill / concurrency, "decode_tok_s": decode,
                           "output_tok_s": decode * concurrency})  # fmt: skip
            summary.append({"host": "head", "layout": f"pp{hosts}", "concurrency": concurrency,
                            "output_tok_s": decode * concurrency, "completed": 10,
                            "failed": 0})  # fmt: skip
    hostcount.write(tmp_path, summary, series)
    cluster = analyse(tmp_path)["cluster"]
    assert cluster["hosts"] == [1, 2, 3]
    assert cluster["by_concurrency"]["4"]["prefill_tok_s"] == {"1": 250.0, "2": 450.0, "3": 625.0}
    # The field notes' finding, read off the lowest concurrency.
    assert cluster["change"] == {"prefill_tok_s": 2.5, "decode_tok_s": 0.9, "output_tok_s": 0.9}
    assert cluster["summary"] == (
        "from 1 to 3 host(s) at concurrency 1: prefill 1000 -> 2500 tok/s (2.50x), "
        "decode 50 -> 45 tok/s (0.90x)"
    )
    markdown, _ = write(tmp_path)
    text = markdown.read_text()
    assert "## Cluster: prefill and decode against the number of hosts" in text
    assert "| 2 | 1800 | 48 | 48 |" in text
    assert (tmp_path / "plots" / "cluster-hosts.png").stat().st_size > 0


def test_a_run_without_a_cluster_has_none_and_a_bad_cluster_csv_is_named(tmp_path):
    row = {"host": "h", "layout": "sn", "concurrency": 1, "output_tok_s": 5}
    rundir.write_csv(tmp_path / rundir.SUMMARY, rundir.SUMMARY_COLUMNS, [row])
    assert analyse(tmp_path)["cluster"] is None
    (tmp_path / rundir.CLUSTER).write_text(",".join(rundir.CLUSTER_COLUMNS) + "\n1,1,x,,,,,1\n")
    with pytest.raises(rundir.RunDirError, match="cluster.csv: line 2: requests 'x'"):
        analyse(tmp_path)


def test_sweep_hosts_refuses_a_count_the_cluster_has_not_before_deploying(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(INVENTORY)
    done = subprocess.run(
        [str(BIN / "socketwise"), "sweep", "-i", str(inventory), "--hosts", "1,5",
         "--run-dir", str(tmp_path / "run")],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--hosts 1,5: cluster big has 3 hosts (head, w1, w2)" in done.stderr
    assert not Path(tmp_path / "run").exists()


def test_sweep_hosts_refuses_a_missing_key_file_before_deploying(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(INVENTORY)
    done = subprocess.run(
        [str(BIN / "socketwise"), "sweep", "-i", str(inventory), "--hosts", "1",
         "--api-key-file", str(tmp_path / "nokey"), "--run-dir", str(tmp_path / "run")],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"{tmp_path / 'nokey'}: no such file (the front door's key)" in done.stderr
    assert not Path(tmp_path / "run").exists()


def test_the_vocabulary_of_a_vllm_cluster_comes_from_its_checkpoint(tmp_path):
    # vLLM's /v1/models says nothing of the vocabulary; the prompts' token ids must stay
    # inside it, so the sweep reads the checkpoint the cluster was deployed from.
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 612}))
    model = {"path": str(tmp_path), "layers": 4, "gb": 0.01}
    assert hostcount.vocabulary("http://127.0.0.1:9/v1", "", model) == 612
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(hostcount.HostCountError, match="config.json gives no vocab_size"):
        hostcount.vocabulary("http://127.0.0.1:9/v1", "", model)


def test_a_command_reads_an_unchanged_inventory_once_and_each_part_gets_its_own_copy(
    tmp_path, monkeypatch
):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(INVENTORY)
    runs = []
    run = subprocess.run

    def counted(argv, *args, **kwargs):
        runs.append(argv)
        return run(argv, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", counted)
    first = runner.read_inventory(inventory)
    first["all"]["children"].append("changed by its reader")
    # Asked again by another part of the command, by a path that names the same file.
    again = runner.read_inventory(tmp_path / "." / "hosts.yml")
    assert len(runs) == 1
    assert "changed by its reader" not in again["all"]["children"]
    assert set(again["_meta"]["hostvars"]) == {"head", "w1", "w2", "single"}
    # A limit is a listing of its own, read once too.
    limited = runner.read_inventory(inventory, "other")
    runner.read_inventory(inventory, "other")
    assert len(runs) == 2
    assert set(limited["_meta"]["hostvars"]) == {"single"}
    # Changed (a group_vars file the command wrote), it is read again, as it is now.
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "other.yml").write_text("written: 1\n")
    changed = runner.read_inventory(inventory)
    assert len(runs) == 3
    assert changed["_meta"]["hostvars"]["single"]["written"] == 1
