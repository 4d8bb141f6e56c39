"""socketwise/benchrun.py without a server: how each load generator is driven, how
GuideLLM's result becomes the row a report reads, and how the served host's monitor
cuts its timeline into steps."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

from socketwise.lab import machines as lab
from socketwise.measure import benchrun, guidellm_sse, sweep
from socketwise.serve import doorcerts
from tests.shipped import host_python, ship
from tests.test_power import burn, two_sockets

FIXTURES = Path(__file__).parent / "fixtures" / "guidellm"
SPEC = {
    "tool": "guidellm",
    "python": "/opt/socketwise/guidellm/bin/python",
    "base_url": "http://127.0.0.11:8000/v1",
    "model": "tiny-llama",
    "tokenizer": "/opt/socketwise/tokenizers/tiny-llama",
    "seed": 7,
}


def option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.mark.parametrize(
    ("load", "profile"),
    [
        ({"concurrency": 4}, "kind=concurrent,streams=4"),
        ({"rate": 2.5}, "kind=constant,rate=2.5"),
        ({"rate": "inf"}, "kind=throughput,max_concurrency=20"),
    ],
)
def test_guidellm_gets_the_step_s_load_shape(tmp_path, load, profile):
    step = {"name": "s", "num_prompts": 20, "input_len": 256, "output_len": 128, **load}
    args = benchrun.guidellm_args(SPEC, step, tmp_path, benchrun.Auth(SPEC, tmp_path))
    assert args[:4] == [SPEC["python"], "-m", "socketwise.measure.guidellm_sse", "run"]
    assert option(args, "--profile") == profile
    assert option(args, "--constraint") == "kind=max_requests,count=20"
    assert option(args, "--data") == "kind=synthetic_text,prompt_tokens=256,output_tokens=128"
    # The completions endpoint, so prompts are exactly input_len tokens (no chat template).
    assert option(args, "--backend") == (
        "kind=openai_http,target=http://127.0.0.11:8000,model=tiny-llama,"
        "request_format=/v1/completions"
    )
    assert option(args, "--tokenizer") == "kind=hf_auto,model=/opt/socketwise/tokenizers/tiny-llama"
    assert option(args, "--seed") == "kind=static,value=7"
    assert option(args, "--output") == f"kind=json,path={tmp_path / 'guidellm.json'}"


def test_the_api_key_reaches_each_tool_but_never_its_command_line(tmp_path):
    key = "k3y-" + "x" * 28
    (tmp_path / "api-key").write_text(key + "\n")
    spec = SPEC | {"api_key_file": str(tmp_path / "api-key")}
    private = tmp_path / "private"
    private.mkdir()
    auth = benchrun.Auth(spec, private)
    step = {"name": "s", "num_prompts": 4, "input_len": 8, "output_len": 8, "concurrency": 1}
    vllm = benchrun.vllm_args(spec, step, tmp_path, auth)
    guidellm = benchrun.guidellm_args(spec, step, tmp_path, auth)
    assert not any(key in arg for arg in vllm + guidellm)
    # vLLM's benchmark sends OPENAI_API_KEY as the bearer token; GuideLLM merges the
    # scenario file's backend with --backend.
    assert auth.environment()["OPENAI_API_KEY"] == key
    scenario = Path(option(guidellm, "--config"))
    assert scenario.parent == private and scenario.stat().st_mode & 0o077 == 0
    assert json.loads(scenario.read_text()) == {"spec": {"backend": {"api_key": key}}}
    # Without a key file nothing is added.
    anonymous = benchrun.Auth(SPEC, private)
    assert "OPENAI_API_KEY" not in anonymous.environment()
    assert "--config" not in benchrun.guidellm_args(SPEC, step, tmp_path, anonymous)


def test_the_load_generators_reach_the_endpoint_around_the_host_s_proxy(tmp_path, monkeypatch):
    # Both tools honour the proxy variables: the key would go to the proxy, and a proxy that
    # cannot reach the endpoint fails the step. Hosts already exempted stay exempted.
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("no_proxy", "mirror.internal")
    monkeypatch.delenv("NO_PROXY", raising=False)
    environment = benchrun.Auth(SPEC, tmp_path).environment()
    assert environment["no_proxy"] == environment["NO_PROXY"] == "mirror.internal,127.0.0.11"
    assert environment["https_proxy"] == "http://127.0.0.1:9", "the outside is still proxied"
    assert benchrun.guidellm_env(benchrun.Auth(SPEC, tmp_path))["NO_PROXY"].endswith("127.0.0.11")


def test_both_tools_verify_a_tls_door_against_the_ca_that_signed_it(tmp_path):
    """The spec's ca_file reaches each tool as SSL_CERT_FILE, which the default TLS context
    of their HTTP clients loads (aiohttp and httpx build theirs as this one does): a
    kit-issued door verifies with it, and without it the same door is refused. No tool is
    told to take any certificate."""
    door = doorcerts.door(tmp_path / "credentials", "edge-01", ["127.0.0.1"])
    spec = SPEC | {"base_url": "https://127.0.0.1:8000/v1", "ca_file": door["ca"]}
    auth = benchrun.Auth(spec, tmp_path)
    step = {"name": "s", "num_prompts": 4, "input_len": 8, "output_len": 8, "concurrency": 1}
    assert "--insecure" not in benchrun.vllm_args(spec, step, tmp_path, auth)
    for environment in (auth.environment(), benchrun.guidellm_env(auth)):
        assert environment["SSL_CERT_FILE"] == door["ca"]
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(door["pem"])
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = (
            "import socket, ssl, sys;"
            "raw = socket.create_connection(('127.0.0.1', int(sys.argv[1])));"
            "ssl.create_default_context().wrap_socket(raw, server_hostname='127.0.0.1').close()"
        )
        for environment, verified in (
            (auth.environment(), True),
            (benchrun.Auth(SPEC, tmp_path).environment(), False),
        ):
            connecting = subprocess.Popen(
                [sys.executable, "-c", client, str(listener.getsockname()[1])],
                env=environment, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            connection, _ = listener.accept()
            try:
                server.wrap_socket(connection, server_side=True).close()
            except (ssl.SSLError, OSError):
                connection.close()
            _, said = connecting.communicate(timeout=30)
            assert (connecting.returncode == 0) == verified, said
            if not verified:
                assert "CERTIFICATE_VERIFY_FAILED" in said


def test_warm_up_requests_go_first_and_only_when_the_step_asks(tmp_path):
    auth = benchrun.Auth(SPEC, tmp_path)
    step = {"name": "gate", "num_prompts": 16, "input_len": 8, "output_len": 8, "concurrency": 2}
    assert (
        option(benchrun.vllm_args(SPEC, step | {"warmups": 4}, tmp_path, auth), "--num-warmups")
        == "4"
    )
    assert "--num-warmups" not in benchrun.vllm_args(SPEC, step, tmp_path, auth)


def test_guidellm_s_result_becomes_the_same_summary_row_as_vllm_s(tmp_path):
    step_dir = tmp_path / "c2"
    step_dir.mkdir()
    shutil.copy(FIXTURES / "concurrent-2.json", step_dir / "guidellm.json")
    assert benchrun.guidellm_result(step_dir, {"name": "c2", "concurrency": 2}) is None
    record = {"name": "c2", "concurrency": 2, "started": 1.0}
    (step_dir / "step.json").write_text(json.dumps(record))
    (row,) = sweep.summary_rows("lab1", "sn", tmp_path)
    assert row == {
        "host": "lab1", "layout": "sn", "rate": None, "concurrency": 2,
        "output_tok_s": 359.609, "ttft_p50_ms": 24.87, "ttft_p99_ms": 140.58,
        "itl_p50_ms": 4.2, "itl_p99_ms": 7.52, "completed": 16, "failed": 0,
        "tpot_p50_ms": None,
    }  # fmt: skip
    # The measured load's own window, not the tool's start-up, is what power is cut to.
    bench = json.loads((step_dir / "bench.json").read_text())
    assert benchrun.load_window(step_dir) == [bench["benchmark_started"], bench["benchmark_ended"]]
    assert bench["benchmark_ended"] - bench["benchmark_started"] == pytest.approx(1.424, abs=0.01)


def test_the_reasons_guidellm_gave_for_failed_requests_are_kept(tmp_path):
    report = json.loads((FIXTURES / "concurrent-2.json").read_text())
    (bench,) = report["benchmarks"]
    requests = bench["requests"]
    for kind, error in (("errored", "HTTPStatusError: 503"), ("incomplete", None)):
        failed = json.loads(json.dumps(requests["successful"].pop()))
        failed["info"]["error"] = error
        requests[kind] = [failed, failed] if error else [failed]
    (tmp_path / "guidellm.json").write_text(json.dumps(report))
    assert benchrun.guidellm_result(tmp_path, {"name": "c2", "concurrency": 2}) is None
    written = json.loads((tmp_path / "bench.json").read_text())
    assert written["failure_reasons"] == {"HTTPStatusError: 503": 2, "incomplete": 1}
    # A step with none says nothing of it.
    shutil.copy(FIXTURES / "concurrent-2.json", tmp_path / "guidellm.json")
    benchrun.guidellm_result(tmp_path, {"name": "c2", "concurrency": 2})
    assert "failure_reasons" not in json.loads((tmp_path / "bench.json").read_text())


@pytest.mark.parametrize("piece", [1, 5, 64, 10_000])
def test_guidellm_reads_every_event_whole_when_its_text_holds_a_unicode_line_break(piece):
    # vLLM writes these unescaped inside an event's JSON; GuideLLM's own reader (httpx's
    # aiter_lines) ended a line at each and failed the request on half an event.
    events = [
        json.dumps({"choices": [{"text": text}]}, ensure_ascii=False)
        for text in ("a\x85b", "\u2028", "c\u2029d\x0b")
    ]
    stream = "".join(f"data: {event}\r\n\r\n" for event in events) + "data: [DONE]"

    async def pieces():
        for start in range(0, len(stream), piece):
            yield stream[start : start + piece]

    async def read() -> list[str]:
        return [line async for line in guidellm_sse.event_stream_lines(pieces())]

    assert asyncio.run(read()) == [f"data: {event}" for event in events] + ["data: [DONE]"]


def test_a_guidellm_burst_is_refused_not_reported(tmp_path):
    shutil.copy(FIXTURES / "poisson-burst.json", tmp_path / "guidellm.json")
    assert benchrun.guidellm_result(tmp_path, {"name": "r4", "rate": 4.0}) == (
        "16 request(s) scheduled before the benchmark began (burst)"
    )
    assert not (tmp_path / "bench.json").exists()


def test_a_flat_out_step_releasing_every_request_at_the_start_is_no_burst(tmp_path):
    # Flat out, every request is due at the start: that is the step, not a scheduling fault.
    shutil.copy(FIXTURES / "poisson-burst.json", tmp_path / "guidellm.json")
    assert benchrun.guidellm_result(tmp_path, {"name": "max", "rate": "inf"}) is None
    assert json.loads((tmp_path / "bench.json").read_text())["completed"] > 0


def test_vllm_s_window_ends_when_its_result_was_saved(tmp_path):
    (tmp_path / "bench.json").write_text(json.dumps({"duration": 30.0}))
    saved = (tmp_path / "bench.json").stat().st_mtime
    assert benchrun.load_window(tmp_path) == [saved - 30.0, saved]


def monitor_with_timeline(tmp_path: Path) -> benchrun.Monitor:
    """A monitor over a fixture powercap whose samples say: 10 s idle at 50 W and 10 %
    CPU, 10 s of load at 150 W and 80 % CPU with 3 requests running, 10 s idle."""
    cap = two_sockets(tmp_path / "root")
    monitor = benchrun.Monitor({"out": str(tmp_path / "out"), "root": str(tmp_path / "root")})
    monitor.power.missing["ipmi"] = "not installed"
    idle = burn(cap, {"intel-rapl:0": 30.0, "intel-rapl:1": 20.0})
    busy = burn(cap, {"intel-rapl:0": 90.0, "intel-rapl:1": 60.0})
    jiffies = [0, 0]
    for second in range(31):
        if second:
            loaded = 10 < second <= 20
            (busy if loaded else idle)(1.0)
            jiffies = [jiffies[0] + (80 if loaded else 10), jiffies[1] + 100]
        monitor.samples.append(
            {
                "t": 1000.0 + second,
                "rapl": benchrun.power.read_counters(monitor.power.domains),
                "ipmi": None,
                "cpu": list(jiffies),
                "metrics": {"vllm:num_requests_running": 3.0 if 10 < second <= 20 else 0.0},
            }
        )
    return monitor


def test_the_monitor_gives_each_step_the_served_host_s_power_and_cpu(tmp_path):
    monitor = monitor_with_timeline(tmp_path)
    out = Path(monitor.spec["out"])
    out.mkdir()
    records = [
        {"name": "r1", "rate": 1.0, "started": 1008.0, "ended": 1022.5, "window": [1010, 1020]},
        {"name": "c1", "concurrency": 1, "started": 1000.0, "ended": 1010.0},
    ]
    (out / "steps.json").write_text(json.dumps(records))
    monitor.split()
    loaded = json.loads((out / "r1" / "step.json").read_text())
    # Package 1's counter wraps in the first second; the window still reads 150 W.
    assert loaded["power"]["sources"]["rapl"]["watts"] == 150.0
    assert loaded["cpu_utilisation"] == pytest.approx(0.8)
    assert loaded["power"]["sources"]["ipmi"] == {"missing": "not installed"}
    idle = json.loads((out / "c1" / "step.json").read_text())
    assert idle["power"]["sources"]["rapl"]["watts"] == 50.0
    assert idle["cpu_utilisation"] == pytest.approx(0.1)
    metrics = [json.loads(line) for line in (out / "r1" / "metrics.jsonl").read_text().splitlines()]
    assert [m["t"] for m in metrics] == [1000.0 + s for s in range(10, 21)]
    assert {m["vllm:num_requests_running"] for m in metrics[1:]} == {3.0}
    # A step shorter than the sampling interval still gets the nearest sample.
    (out / "steps.json").write_text(json.dumps([{"name": "s", "window": [1014.2, 1014.6],
                                                 "started": 1014.0, "ended": 1015.0}]))  # fmt: skip
    monitor.split()
    (short,) = (out / "s" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(short) == {"t": 1014.0, "vllm:num_requests_running": 3.0}


def test_the_monitor_runs_with_the_standard_library_and_stops_on_sigterm(tmp_path):
    two_sockets(tmp_path / "root")
    out = tmp_path / "out"
    spec = {"out": str(out), "root": str(tmp_path / "root"), "idle_seconds": 1,
            "sample_seconds": 0.2, "metrics_urls": []}  # fmt: skip
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    # Only the files the role ships, and no site-packages, as on a target host.
    shipped = ship("benchmark", "__benchmark_files", tmp_path / "bench")
    argv, env = host_python(
        shipped, "socketwise.measure.benchrun", "monitor", str(tmp_path / "spec.json")
    )
    process = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    deadline = time.monotonic() + 30
    while not (out / "idle.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    idle = json.loads((out / "idle.json").read_text())
    assert idle["seconds"] == 1 and "rapl" in idle["power"]["sources"]
    now = time.time()
    (out / "steps.json").write_text(
        json.dumps([{"name": "c1", "started": now - 0.5, "ended": now}])
    )
    time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0, process.stderr.read()
    assert json.loads((out / "c1" / "step.json").read_text())["power"]["seconds"] == 0.5
    assert (out / "placement.txt").exists() and (out / "journal.txt").exists()
    assert len((out / "monitor.jsonl").read_text().splitlines()) >= 5


def test_the_lab_inventory_puts_load_generators_in_their_group(tmp_path):
    machines = [
        lab.Machine(f"lab{i}", f"127.0.0.{10 + i}", tmp_path / f"lab{i}", tmp_path / "log")
        for i in (1, 2, 3)
    ]
    inventory = lab.write_inventory(machines, tmp_path, loadgen=1)
    # deploy.yml and the sweep serve on the others only.
    assert sweep.served_hosts(inventory) == ["lab1", "lab2"]
    assert sweep.served_hosts(lab.write_inventory(machines, tmp_path)) == ["lab1", "lab2", "lab3"]
    # Nor a fleet door or a monitor: a sweep counts the hosts it serves on.
    door = tmp_path / "door.yml"
    door.write_text(
        "all:\n  hosts:\n    lab1:\n  children:\n    socketwise_frontdoor:\n      hosts:\n"
        "        door1:\n    socketwise_monitor:\n      hosts:\n        mon1:\n"
    )
    assert sweep.served_hosts(door) == ["lab1"]


def test_a_step_s_own_seed_picks_its_prompts_with_either_tool(tmp_path):
    auth = benchrun.Auth(SPEC, tmp_path)
    step = {"name": "c1-2", "num_prompts": 8, "input_len": 8, "output_len": 8, "concurrency": 1}
    assert option(benchrun.vllm_args(SPEC, step, tmp_path, auth), "--seed") == "7"
    assert option(benchrun.vllm_args(SPEC, step | {"seed": 99}, tmp_path, auth), "--seed") == "99"
    guidellm = benchrun.guidellm_args(SPEC, step | {"seed": 99}, tmp_path, auth)
    assert option(guidellm, "--seed") == "kind=static,value=99"


def test_a_prefix_step_sends_prompts_that_share_a_few_beginnings(tmp_path):
    # The sweep's dataset `prefix`: vLLM's prefix_repetition, 4 beginnings of three
    # quarters of the prompt each and every prompt one of them and its own end; a random
    # step keeps vLLM's random prompts of input_len tokens.
    auth = benchrun.Auth(SPEC, tmp_path)
    step = {"name": "c2", "num_prompts": 8, "input_len": 256, "output_len": 64,
            "concurrency": 2}  # fmt: skip
    shared = benchrun.vllm_args(SPEC, step | {"dataset": "prefix"}, tmp_path, auth)
    assert option(shared, "--dataset-name") == "prefix_repetition"
    assert (option(shared, "--prefix-repetition-prefix-len"),
            option(shared, "--prefix-repetition-suffix-len")) == ("192", "64")  # fmt: skip
    assert option(shared, "--prefix-repetition-num-prefixes") == "4"
    assert option(shared, "--prefix-repetition-output-len") == "64"
    plain = benchrun.vllm_args(SPEC, step, tmp_path, auth)
    assert option(plain, "--dataset-name") == "random"
    assert option(plain, "--random-input-len") == "256"
    assert "--prefix-repetition-prefix-len" not in plain
