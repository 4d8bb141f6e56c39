"""No traceback from the CLI, whatever the input: a malformed file or flag ends in exit 2 and
one line that names the file, line or key. Hypothesis mutates real inputs (the R730
topology and run directory) and the commands must either work (exit 0) or refuse (exit 2)."""

from __future__ import annotations

import contextlib
import copy
import csv
import io
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from socketwise.cli import main
from socketwise.facts.topology import detect

from .machines import build_machine

FIXTURE = Path(__file__).parent / "fixtures" / "r730-sweep"
PROPERTY = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,  # the same examples on every CI run
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# Values a hand-edited or truncated file holds where a number or a list was expected.
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.sampled_from([[], {}, [[]], [None], ["x"], [-1]]),
)
CELLS = st.sampled_from(["", "x", "-1", "0", "nan", "inf", "1e999", "3.5", "idle", " ", "1,2"])


def cli(*args: str) -> tuple[int, str, str]:
    """Run `socketwise ARGS` in this process; an exception escaping it fails the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exit_:  # argparse's own refusals
            code = exit_.code
    return code, out.getvalue(), err.getvalue()


def assert_works_or_refuses(code: int, out: str, err: str) -> None:
    assert code in (0, 2), (code, err)
    if code == 0:
        json.loads(out)
    else:
        # One line; argparse's own refusals put their usage lines before it.
        lines = [line for line in err.splitlines() if not line.startswith(("usage:", " "))]
        assert len(lines) == 1 and lines[0].startswith("socketwise "), err


def _paths(node, prefix=()):
    children = node.items() if isinstance(node, dict) else enumerate(node)
    for key, child in children:
        yield (*prefix, key)
        if isinstance(child, dict | list):
            yield from _paths(child, (*prefix, key))


@st.composite
def broken_json(draw, document) -> bytes:
    """The document with one to three values replaced or removed, then maybe a byte that is
    not UTF-8, or cut short."""
    doc = copy.deepcopy(document)
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(doc))
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        if draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(JUNK)
    data = json.dumps(doc).encode()
    damage = draw(st.sampled_from(["none", "none", "latin1", "cut"]))
    at = draw(st.integers(0, max(len(data) - 1, 0)))
    if damage == "latin1":
        data = data[:at] + b"\xff" + data[at:]
    elif damage == "cut":
        data = data[:at]
    return data


@st.composite
def broken_csv(draw, text: str) -> bytes:
    """The CSV with cells changed, dropped or added, a blank row with an extra cell, a column
    renamed, or a byte that is not UTF-8."""
    rows = list(csv.reader(io.StringIO(text)))
    for _ in range(draw(st.integers(1, 3))):
        row = draw(st.integers(0, len(rows) - 1))
        op = draw(st.sampled_from(["cell", "cell", "drop", "add", "blank", "rename"]))
        if op == "cell" and rows[row]:
            rows[row][draw(st.integers(0, len(rows[row]) - 1))] = draw(CELLS)
        elif op == "drop" and rows[row]:
            rows[row].pop(draw(st.integers(0, len(rows[row]) - 1)))
        elif op == "add":
            rows[row].append(draw(CELLS))
        elif op == "blank":
            rows.insert(row + 1, [""] * (len(rows[0]) + 1))
        elif op == "rename" and rows[0]:
            rows[0][draw(st.integers(0, len(rows[0]) - 1))] = draw(CELLS)
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    data = out.getvalue().encode()
    if draw(st.integers(0, 4)) == 0:
        at = draw(st.integers(0, len(data)))
        data = data[:at] + b"\xfe" + data[at:]
    return data


@pytest.fixture(scope="module")
def r730_topology(tmp_path_factory) -> dict:
    return detect(build_machine("r730", tmp_path_factory.mktemp("r730")))


@PROPERTY
@given(data=st.data(), layout=st.sampled_from(["auto", "sn", "tp", "dp"]))
def test_plan_of_any_topology_file_works_or_refuses(r730_topology, tmp_path, data, layout):
    path = tmp_path / "topology.json"
    path.write_bytes(data.draw(broken_json(r730_topology)))
    assert_works_or_refuses(
        *cli("plan", "--topology", str(path), "--layout", layout, "--model-gb", "8")
    )


@pytest.mark.parametrize("name", ["summary.csv", "power.csv"])
@PROPERTY
@given(data=st.data())
def test_report_of_any_csv_works_or_refuses(tmp_path, name, data):
    run = tmp_path / "run"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(FIXTURE, run)
    (run / name).write_bytes(data.draw(broken_csv((FIXTURE / name).read_text())))
    assert_works_or_refuses(*cli("report", str(run), "--json"))


@PROPERTY
@given(data=st.data())
def test_report_of_any_manifest_works_or_refuses(tmp_path, data):
    run = tmp_path / "run"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(FIXTURE, run)
    manifest = json.loads((FIXTURE / "manifest.json").read_text())
    (run / "manifest.json").write_bytes(data.draw(broken_json(manifest)))
    assert_works_or_refuses(*cli("report", str(run), "--json"))


# The malformed inputs found by hand, each with the words its one line must hold.
TOPOLOGY_CASES = {
    "not-utf8": (b'{"schema": 1, "nodes": \xff}', "cannot read topology file"),
    "node-id-text": ({"id": "zero"}, "nodes[0].id is 'zero', not a node number"),
    "gpus-null": ({"gpus": None}, "gpus must be a list of objects"),
    "empty-core": ({"cores": [[]]}, "nodes[0].cores[0] must be a non-empty list"),
}


@pytest.mark.parametrize("case", TOPOLOGY_CASES, ids=list(TOPOLOGY_CASES))
def test_each_malformed_topology_is_named_in_one_line(r730_topology, tmp_path, case):
    change, words = TOPOLOGY_CASES[case]
    path = tmp_path / "t.json"
    if isinstance(change, bytes):
        path.write_bytes(change)
    else:
        doc = copy.deepcopy(r730_topology)
        (doc if "gpus" in change else doc["nodes"][0]).update(change)
        path.write_text(json.dumps(doc))
    code, _, err = cli("plan", "--topology", str(path))
    assert code == 2 and words in err and str(path) in err and err.count("\n") == 1, err


SUMMARY_HEADER = FIXTURE.joinpath("summary.csv").read_text().splitlines()[0]
RUN_CASES = {
    "one-cell": ("summary.csv", f"{SUMMARY_HEADER}\nr730\n", "line 2: 1 cells under a header"),
    "blank-row-extra-cell": (
        "summary.csv",
        f"{SUMMARY_HEADER}\n{',' * 11}\n",
        "line 2: 12 cells under a header of 11",
    ),
    "power-without-source": (
        "power.csv",
        "host,layout,rate,concurrency,watts,source\nr730,idle,,,147\n",
        "power.csv: line 2: 5 cells under a header of 6",
    ),
    "summary-not-utf8": ("summary.csv", b"host,layout\n\xff\n", "summary.csv: not UTF-8"),
    "manifest-not-utf8": ("manifest.json", b'{"schema": 1, \xff}', "manifest.json: not UTF-8"),
}


@pytest.mark.parametrize("case", RUN_CASES, ids=list(RUN_CASES))
def test_each_malformed_run_file_is_named_in_one_line(tmp_path, case):
    name, content, words = RUN_CASES[case]
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    target = run / name
    target.write_bytes(content if isinstance(content, bytes) else content.encode())
    code, _, err = cli("report", str(run), "--json")
    assert code == 2 and words in err and err.count("\n") == 1, err


def test_an_unwritable_report_path_is_refused_in_one_line(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    (run / "report.md").mkdir()  # where the report must go, something it cannot replace
    code, _, err = cli("report", str(run))
    assert code == 2 and "cannot write the report" in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--concurrencies", "1,x"], "--concurrencies '1,x': give a comma list"),
        (["--rate-fractions", "-1"], "--rate-fractions '-1'"),
        (["--step-seconds", "nan"], "--step-seconds nan"),
        (["--repetitions", "0"], "--repetitions 0"),
        (["--dataset", "sharegpt"], "--dataset 'sharegpt': choose random or prefix"),
        (["--dataset", "prefix", "--tool", "guidellm"], "--dataset prefix needs --tool vllm"),
    ],
)
def test_sweep_flags_no_run_can_use_are_refused_before_anything_runs(tmp_path, flags, words):
    code, _, err = cli("sweep", "--run-dir", str(tmp_path / "run"), *flags)
    assert code == 2 and words in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "hosts",
    [None, "socketwise_loadgen:\n  hosts:\n    gen1: {ansible_host: 127.0.0.99}\n"],
    ids=["no hosts file", "only load generators"],
)
def test_a_sweep_of_an_inventory_with_no_host_to_measure_is_refused_in_one_line(tmp_path, hosts):
    inventory = tmp_path / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "group_vars" / "lab.yml").write_text("---\nplan_kv_gb: 1\n")
    if hosts:
        (inventory / "hosts.yml").write_text(hosts)
    code, _, err = cli("sweep", "-i", str(inventory), "--run-dir", str(tmp_path / "run"))
    assert code == 2 and f"{inventory}: no host to measure" in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()
