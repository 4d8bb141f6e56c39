"""`socketwise sweep`: deploy each layout, measure it, collect a run directory, report.

For each layout asked for, on every host of the inventory: deploy it (deploy.yml),
wait until it serves (deploy.yml's own readiness check), run the profiles through
playbooks/bench.yml, fetch the results; at the end put the hosts back to their
configured layout (deploy.yml with no override). Playbooks run through ansible-runner.

Rates are calibrated to the host: the first layout is driven flat out once and the
rate sweep is placed at fractions of the request rate it sustained, so the same
sweep is meaningful on a 2-core lab host and on a 128-core server.
"""

from __future__ import annotations

import functools
import json
import math
import shutil
import tarfile
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from socketwise.measure.rundir import (
    BASELINE,
    POWER_COLUMNS,
    SUMMARY_COLUMNS,
    power_rows,
    write_csv,
)
from socketwise.measure.runner import SweepError, read_inventory, run_playbook
from socketwise.plan.fleet import serving_hosts

# The benchmark role's per-step task, whose loop items mark the sweep's progress.
STEP_TASK = "Run step"
STEP_EVENTS = ("runner_item_on_ok", "runner_item_on_failed")
# The load generators `--tool` selects, as the manifest discloses them.
TOOLS = {
    "vllm": "vllm.benchmarks.serve (random dataset, --ignore-eos)",
    "guidellm": "guidellm run 0.8.1 (synthetic data, /v1/completions, ignore_eos; "
    "open loop at evenly spaced arrivals)",
}
# Hosts of this inventory group generate load for the others and serve nothing.
LOADGEN_GROUP = "socketwise_loadgen"
# Layout names of a sweep -> the deploy.yml variables that select them. `baseline` is
# plain vLLM as a user would start it, on the same host, load and front door: one
# instance with vLLM's own defaults (its automatic thread binding, no unit placement, no
# preloads) and the kit's kernel tuning put back, with only the KV size it needs to start.
LAYOUTS = {
    BASELINE: {
        "plan_layout": "sn",
        "vllm_service_placement": "vllm",
        "host_tuning_state": "absent",
    },
    "sn": {"plan_layout": "sn"},
    "tp": {"plan_layout": "tp"},
    "dp": {"plan_layout": "dp", "plan_dp_mode": "instances"},
    "dp-vllm": {"plan_layout": "dp", "plan_dp_mode": "vllm"},
    # DP whose door balances by prompt prefix (plan_balance prefix), against `dp`'s leastconn.
    "dp-prefix": {"plan_layout": "dp", "plan_dp_mode": "instances", "plan_balance": "prefix"},
}
# The prompts a step sends: vLLM's random ones, or prefix_repetition's (a few shared
# beginnings, every prompt one of them and its own end: benchrun.dataset_args), where a
# door that keeps a prefix on one instance finds it cached there.
DATASETS = ("random", "prefix")


# Requests the first step after each deploy sends before it measures (vLLM's benchmark
# leaves them out of its figures).
WARMUP_REQUESTS = 4
# A TPOT p50 below this is no decoder's pace (10,000 tokens a second a request): the
# request's tokens reached the client in one chunk, as they do when vLLM's front end falls
# behind the engine (or a proxy holds them back), and time per token cannot be read.
ONE_CHUNK_TPOT_MS = 0.1


@dataclass
class Profile:
    """The load: the field notes' light and medium points and a calibrated rate sweep."""

    concurrencies: list[int] = field(default_factory=lambda: [1, 4])
    # Fractions of the flat-out request rate of the first layout.
    rate_fractions: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.75, 1.0, 1.5])
    input_len: int = 256
    output_len: int = 128
    step_seconds: float = 300.0
    min_prompts: int = 8
    calibration_prompts: int = 32
    repetitions: int = 1
    # Seed of the benchmark's random prompts, from which each step's own is drawn
    # (prompt_seed): the same step seed, the same requests.
    seed: int = 0
    # One of DATASETS: random prompts, or prompts sharing a few beginnings.
    dataset: str = "random"

    def shape(self) -> dict:
        """What every step's prompts are: their lengths and dataset."""
        return {"input_len": self.input_len, "output_len": self.output_len,
                "dataset": self.dataset}  # fmt: skip

    def steps(self, max_rate: float) -> list[dict]:
        shape = self.shape()
        steps = []
        for repetition in range(self.repetitions):
            suffix = f"-{repetition + 1}" if self.repetitions > 1 else ""
            for concurrency in self.concurrencies:
                prompts = self.closed_prompts(concurrency, max_rate)
                steps.append(
                    {"name": f"c{concurrency}{suffix}", "concurrency": concurrency,
                     "num_prompts": prompts, **shape}
                )  # fmt: skip
            for fraction in self.rate_fractions:
                step = self.rate_step(round(max_rate * fraction, 2))
                steps.append({**step, "name": step["name"] + suffix})
        return steps

    def closed_prompts(self, concurrency: int, max_rate: float) -> int:
        """Requests of a closed-loop step: about step_seconds of load at most, and at least
        min_prompts per request in flight. The flat-out run kept calibration_prompts in
        flight at max_rate req/s, and a request's share of the throughput does not shrink
        as fewer are in flight, so `concurrency` of them deliver at least max_rate x
        concurrency / calibration_prompts req/s."""
        in_flight = min(concurrency, self.calibration_prompts)
        sized = math.ceil(self.step_seconds * max_rate * in_flight / self.calibration_prompts)
        return max(self.min_prompts * concurrency, sized)

    def rate_step(self, rate: float) -> dict:
        """An open-loop step of about step_seconds at `rate` req/s."""
        prompts = max(self.min_prompts, math.ceil(rate * self.step_seconds))
        return {"name": f"r{rate:g}", "rate": rate, "num_prompts": prompts, **self.shape()}


def served_hosts(inventory: Path) -> list[str]:
    """The inventory's hosts that serve (`serving_hosts`: not its load generators, fleet
    doors or monitors), by name."""
    groups = read_inventory(inventory)
    members = {
        name: group.get("hosts", [])
        for name, group in groups.items()
        if isinstance(group, dict) and name != "_meta"
    }
    every = set(groups.get("_meta", {}).get("hostvars", {}))
    every |= {host for hosts in members.values() for host in hosts}
    return serving_hosts(members | {"all": sorted(every)})


def _bench(
    inventory: Path,
    layout: str,
    steps: list[dict],
    run_dir: Path,
    batch: str,
    seed: int,
    tool: str = "vllm",
    on_event: Callable[[dict], bool] | None = None,
    prepare_loadgen: bool = True,
    variables: dict | None = None,
    limit: str | None = None,
) -> dict:
    """Run `steps` on every host; unpack each into run_dir/hosts/HOST/LAYOUT/BATCH.

    PREPARE_LOADGEN false skips the install checks of the load generators, of a host
    that loads itself, of the runner and of sysbench: the batches after a run's first find
    them installed by it (about 20 s of Ansible a batch with a load generator, 6.5 s on a
    lab host that loads itself).
    VARIABLES select the layout (default LAYOUTS[layout]); LIMIT, the hosts (with their
    load generators).

    A host's run comes in two archives, the served host's (HOST.tar.gz: idle baseline,
    per-step power, CPU and /metrics, journal, placement) and the load generator's
    (HOST.load.tar.gz: per-step benchmark results); both unpack into one directory.
    """
    with tempfile.TemporaryDirectory(prefix="socketwise-fetch-") as fetched:
        run_playbook(
            "playbooks/bench.yml",
            inventory,
            {
                **(LAYOUTS[layout] if variables is None else variables),
                "benchmark_steps": steps,
                "benchmark_fetch_dir": fetched,
                "benchmark_seed": seed,
                "benchmark_tool": tool,
                "benchmark_prepare_loadgen": prepare_loadgen,
            },  # fmt: skip
            run_dir / "artifacts",
            on_event,
            limit,
        )
        unpacked = {}
        for archive in sorted(Path(fetched).glob("*.tar.gz")):
            host = archive.name.removesuffix(".tar.gz").removesuffix(".load")
            target = run_dir / "hosts" / host / layout / batch
            if host not in unpacked and target.exists():
                shutil.rmtree(target)
            with tarfile.open(archive) as tar:
                tar.extractall(target, filter="data")
            unpacked[host] = target
        return unpacked


def summary_rows(host: str, layout: str, results: Path) -> list[dict]:
    """summary.csv rows from one host's unpacked results of one layout."""
    rows = []
    steps = [(json.loads(p.read_text()), p.parent) for p in results.glob("*/step.json")]
    for step, step_dir in sorted(steps, key=lambda pair: pair[0].get("started", 0)):
        bench_file = step_dir / "bench.json"
        if step["name"].startswith("max") or not bench_file.exists():
            continue
        bench = json.loads(bench_file.read_text())
        rows.append(
            {
                "host": host,
                "layout": layout,
                "rate": step.get("rate"),
                "concurrency": step.get("concurrency"),
                "output_tok_s": round(bench["output_throughput"], 3),
                "ttft_p50_ms": round(bench["median_ttft_ms"], 2),
                "ttft_p99_ms": round(bench["p99_ttft_ms"], 2),
                "itl_p50_ms": round(bench["median_itl_ms"], 2),
                "itl_p99_ms": round(bench["p99_itl_ms"], 2),
                "completed": bench["completed"],
                "failed": bench.get("failed", 0),
                "tpot_p50_ms": None
                if bench.get("median_tpot_ms") is None
                or bench["median_tpot_ms"] < ONE_CHUNK_TPOT_MS
                else round(bench["median_tpot_ms"], 2),
            }
        )
    return rows


def step_power_rows(host: str, layout: str, results: Path) -> list[dict]:
    """power.csv rows (mean watts per step, and the idle baseline) of one layout's results."""
    rows = []
    idle = results / "idle.json"
    if idle.exists():
        rows += power_rows(host, "idle", None, None, json.loads(idle.read_text())["power"])
    for step_file in sorted(results.glob("*/step.json")):
        step = json.loads(step_file.read_text())
        if step["name"].startswith("max"):
            continue
        load = (step.get("rate"), step.get("concurrency"))
        rows += power_rows(host, layout, *load, step.get("power") or {})
    return rows


def prompt_seed(seed: int, run: int, layout: str, batch: str, step: str) -> int:
    """The seed of one step's random prompts: its own in a run (RUN, the run's start),
    so no step sends again the prompts an earlier one drew (a model with a small
    vocabulary still gives some prompts the same start). vLLM keeps a prompt's KV cache after it
    is answered (prefix caching, on by default), and the same prompts again skip their
    prefill: with one seed for every step, each repetition and each round on a server
    left running measured half its prompts' prefill (docs/measurements.md)."""
    return zlib.crc32(f"{seed}/{run}/{layout}/{batch}/{step}".encode())


class Sweep:
    """One experiment: deploys layouts on demand, runs step batches, keeps the rows.

    LAYOUTS names the layouts it may deploy (default the sweep's own); LIMIT keeps every
    deploy and batch to those hosts (a served host and its load generators).
    """

    def __init__(
        self,
        inventory: Path,
        run_dir: Path,
        profile: Profile,
        planned_steps: int,
        tool: str = "vllm",
        layouts: dict[str, dict] | None = None,
        limit: str | None = None,
    ):
        self.inventory, self.run_dir, self.profile, self.tool = inventory, run_dir, profile, tool
        self.layouts, self.limit = LAYOUTS if layouts is None else layouts, limit
        self.deployed: str | None = None
        # Mixed into every step's prompt seed: a server left running from an earlier run
        # (a layout deployed again without a change is not restarted) keeps its prompts.
        self.run = time.time_ns()
        self.loadgen_prepared = False
        self.summary: list[dict] = []
        self.power: list[dict] = []
        self.flat_out: dict[str, float] = {}
        # Progress counts steps on every served host; the ETA moves with each one.
        self.hosts = 1 if limit else len(served_hosts(inventory))
        if not self.hosts:
            raise SweepError(
                f"{inventory}: no host to measure (none listed, or all in group "
                f"{LOADGEN_GROUP}): give the inventory that lists the hosts to sweep"
            )
        self.started, self.steps_done = time.monotonic(), 0
        self.steps_planned = planned_steps * self.hosts

    def measure(
        self, layout: str, steps: list[dict], batch: str, fresh: bool = False
    ) -> dict[str, dict[str, dict]]:
        """Run `steps` on `layout` (deploying it first if needed): {host: {step: bench}}.

        Every deploy restarts the layout's servers (vllm_service_fresh_start), changed or
        not, so none starts its steps with the prompts of an earlier run in its prefix
        cache; FRESH restarts a layout already deployed (a round that begins on the layout
        the last one ended on, the steps after a flat-out run)."""
        # Another name for the variables deployed (a calibration's choice) needs no deploy.
        if fresh or self.deployed is None or self.layouts[self.deployed] != self.layouts[layout]:
            self._say(f"{layout}: {'restarting' if self.deployed == layout else 'deploying'}")
            artifacts = self.run_dir / "artifacts" / layout
            variables = self.layouts[layout] | {"vllm_service_fresh_start": True}
            run_playbook("deploy.yml", self.inventory, variables, artifacts, limit=self.limit)
            self.deployed = layout
            # A server just started answers its first requests slower: its first step
            # sends some first, left out of its figures.
            steps = [{**steps[0], "warmups": WARMUP_REQUESTS}, *steps[1:]]
        seeds = functools.partial(prompt_seed, self.profile.seed, self.run, layout, batch)
        steps = [{**step, "seed": seeds(step["name"])} for step in steps]
        self._say(f"{layout}: {batch}, {len(steps)} step(s): {[s['name'] for s in steps]}")
        found: dict[str, dict[str, dict]] = {}
        unpacked = _bench(
            self.inventory, layout, steps, self.run_dir, batch, self.profile.seed, self.tool,
            lambda event: self._on_event(layout, event), not self.loadgen_prepared,
            self.layouts[layout], self.limit,
        )  # fmt: skip
        self.loadgen_prepared = True
        for host, results in unpacked.items():
            self.summary += summary_rows(host, layout, results)
            self.power += step_power_rows(host, layout, results)
            found[host] = {
                path.parent.name: json.loads(path.read_text())
                for path in results.glob("*/bench.json")
            }
            flat = found[host].get("max")
            if flat:
                rate = flat["request_throughput"]
                self.flat_out[layout] = min(self.flat_out.get(layout, rate), rate)
        return found

    def _on_event(self, layout: str, event: dict) -> bool:
        """ansible-runner's event stream: one line per finished step, with the ETA."""
        data = event.get("event_data", {})
        if event.get("event") in STEP_EVENTS and data.get("task") == STEP_TASK:
            self.steps_done += 1
            result = data.get("res", {})
            name = result.get("_ansible_item_label") or result.get("item", {}).get("name")
            outcome = "failed" if event["event"] == "runner_item_on_failed" else "done"
            self._say(f"{layout}: {data.get('host')} {name} {outcome}")
        return True

    def drive_flat_out(self, layout: str) -> dict:
        """The batch `calibration`: LAYOUT driven flat out once, whose request rate places
        the rate steps and sizes the closed-loop ones (manifest.json's `calibration`)."""
        self.measure(layout, [_flat_out_step(self.profile)], "calibration")
        return {"layout": layout, "max_request_rate": self.flat_out[layout]}

    def skip(self, layout: str, steps: int, why: str) -> None:
        """Take `steps` planned steps of `layout` off the plan (and the ETA), saying why."""
        self.steps_planned -= steps * self.hosts
        self._say(f"{layout}: {steps} step(s) not needed: {why}")

    def _say(self, message: str) -> None:
        done, planned = self.steps_done, max(self.steps_planned, self.steps_done)
        elapsed = time.monotonic() - self.started
        eta = f"ETA {elapsed / done * (planned - done) / 60:.1f} min" if done else "ETA unknown"
        print(f"[sweep] step {done}/{planned}, {eta}: {message}", flush=True)

    def throughput(self, layout: str, rate: float) -> float:
        """Median output tok/s of `layout` at `rate` over hosts and repetitions."""
        values = sorted(
            r["output_tok_s"] for r in self.summary if r["layout"] == layout and r["rate"] == rate
        )
        return values[len(values) // 2] if values else 0.0


def _flat_out_step(profile: Profile) -> dict:
    return {"name": "max", "rate": "inf", "num_prompts": profile.calibration_prompts,
            **profile.shape()}  # fmt: skip


def run_fixed(experiment: Sweep, layouts: list[str]) -> dict:
    """Calibrate on the first layout, then every layout at the same calibrated steps;
    returns the calibration."""
    calibration = experiment.drive_flat_out(layouts[0])
    steps = experiment.profile.steps(calibration["max_request_rate"])
    for layout in layouts:
        # The first starts again after its flat-out run, as every other one starts.
        experiment.measure(layout, steps, "sweep", fresh=layout == layouts[0])
    return calibration


def run_adaptive(experiment: Sweep, layouts: list[str], rounds: int) -> dict:
    """Bracket each layout (synchronous and flat out), then bisect the SN/DP crossover.

    The flat-out rate is where a layout saturates. DP can only overtake SN above the
    rate SN sustains comfortably, so the search starts between half of SN's flat-out
    rate and the highest flat-out rate of any layout, and each round measures the
    midpoint. A round starts on the layout that is deployed (SN is bracketed last, so
    the first round starts there). Where SN delivered what was offered, within 3 %, DP
    cannot be 3 % ahead (no layout delivers more than the arrivals, which are the same
    for both), so the round needs no redeploy; otherwise the other layout is measured too.
    """
    profile = experiment.profile
    bracket = [
        {"name": "c1", "concurrency": 1, "num_prompts": profile.min_prompts,
         **profile.shape()},
        _flat_out_step(profile),
    ]  # fmt: skip
    # The search is between the kit's layouts; the baseline is bracketed, not bisected.
    kit = [x for x in layouts if x != BASELINE]
    first, second = kit[0] if kit else None, next((x for x in kit[1:] if x.startswith("dp")), None)
    for layout in [x for x in layouts if x != first] + ([first] if first else []):
        experiment.measure(layout, bracket, "bracket")
    search: dict = {"saturation_rate": dict(experiment.flat_out), "rounds": []}
    if second is None:
        return search
    low = round(experiment.flat_out[first] / 2, 2)
    high = round(max(experiment.flat_out[x] for x in kit), 2)
    for number in range(1, rounds + 1):
        rate = round((low + high) / 2, 2)
        step = profile.rate_step(rate)
        order = [second, first] if experiment.deployed == second else [first, second]
        measured = []
        for layout in order:
            experiment.measure(layout, [step], f"round-{number}")
            measured.append(layout)
            delivered = experiment.throughput(first, rate) / offered(step)
            if measured == [first] and delivered * 1.03 >= 1:
                why = f"{first} delivered {delivered:.1%} of the most any layout can at {rate:g}"
                experiment.skip(second, 1, f"{why} req/s, so {second} cannot lead it by 3 %")
                break
        ahead = second in measured and (
            experiment.throughput(second, rate) > 1.03 * experiment.throughput(first, rate)
        )
        search["rounds"].append(
            {"rate": rate, "second_ahead": ahead, "low": low, "high": high, "measured": measured}
        )
        low, high = (low, rate) if ahead else (rate, high)
    search["crossover_between"] = [low, high]
    return search


def offered(step: dict) -> float:
    """The most output tok/s any layout can deliver in an open-loop step: every request's
    tokens over the time its last request is sent, at least (N - 1) / rate after the first
    (vLLM's benchmark sends it at N / rate, GuideLLM's evenly spaced arrivals at (N - 1) /
    rate)."""
    prompts = step["num_prompts"]
    return prompts * step["output_len"] * step["rate"] / max(1, prompts - 1)


def check_tool(tool: str) -> None:
    if tool not in TOOLS:
        raise SweepError(f"unknown load generator {tool!r}; choose {' or '.join(TOOLS)}")


def base_manifest(
    inventory: Path, layouts: list[str], mode: str, profile: Profile, tool: str
) -> dict:
    """What a run directory's manifest.json says of any layout sweep: the load, its tool
    and shape, the baseline, the measured boundary and the warm-up."""
    return {
        "schema": 1,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "inventory": str(inventory),
        "layouts": layouts,
        "mode": mode,
        "profile": asdict(profile),
        "load_generator": TOOLS[tool],
        "load_shape": {
            "concurrency": "closed loop: that many requests in flight",
            "rate": f"open loop: {'Poisson' if tool == 'vllm' else 'evenly spaced'} arrivals "
            "at that many requests per second",
        },
        "baseline": "plain vLLM: one instance with vLLM's own defaults (automatic thread "
        "binding, no placement, preloads or kernel tuning), the plan's KV size, dtype and "
        "front door"
        if BASELINE in layouts
        else None,
        "measured_boundary": "HTTP client on the load generator (a host of the group "
        f"{LOADGEN_GROUP}, or else the served host on its reserved cores when the plan has "
        "any) to the planned endpoint: network, tokenisation, queueing, prefill and decode; "
        "power and CPU are the served host's",
        "warm_up": "deploy.yml's readiness completion; after every deploy the first step "
        f"sends {WARMUP_REQUESTS} warm-up requests that are not measured (vLLM's benchmark; "
        "GuideLLM sends none); every layout's servers are restarted before its steps "
        "(vllm_service_fresh_start), so none starts with another run's or round's prompts "
        "in its prefix cache, nor the flat-out run's",
        "hosts": {},
    }


def sweep(
    inventory: Path,
    layouts: list[str],
    run_dir: Path,
    profile: Profile,
    restore: bool = True,
    mode: str = "fixed",
    rounds: int = 2,
    tool: str = "vllm",
    known: dict[str, dict] | None = None,
) -> Path:
    """KNOWN names the layouts LAYOUTS may be taken from (default the sweep's own)."""
    known = LAYOUTS if known is None else known
    unknown = [name for name in layouts if name not in known]
    if unknown:
        raise SweepError(f"unknown layout(s) {unknown}; choose from {', '.join(known)}")
    if mode not in ("fixed", "adaptive"):
        raise SweepError(f"unknown mode {mode!r}; choose fixed or adaptive")
    check_tool(tool)
    per_layout = len(profile.steps(1.0)) if mode == "fixed" else 2 + rounds
    experiment = Sweep(
        inventory, run_dir, profile, 1 + per_layout * len(layouts), tool, layouts=known
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    manifest = base_manifest(inventory, layouts, mode, profile, tool)
    if mode == "fixed":
        manifest["calibration"] = run_fixed(experiment, layouts)
    else:
        manifest["adaptive"] = run_adaptive(experiment, layouts, rounds)
    if restore:
        print("[sweep] restoring the configured layout", flush=True)
        run_playbook("deploy.yml", inventory, {}, run_dir / "artifacts" / "restored")
    finish(run_dir, manifest, experiment.summary, experiment.power)
    return run_dir


def finish(run_dir: Path, manifest: dict, summary: list[dict], power: list[dict]) -> None:
    """Write the run directory's summary.csv, power.csv and manifest.json."""
    _collect_hosts(run_dir, manifest)
    manifest["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    write_csv(run_dir / "summary.csv", SUMMARY_COLUMNS, summary)
    if power:
        write_csv(run_dir / "power.csv", POWER_COLUMNS, power)
    (run_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def _collect_hosts(run_dir: Path, manifest: dict) -> None:
    """Per host: model, versions, build, weight bytes and bandwidth, from the deploy artifacts.

    `build` (class, install method, wheelhouse hash or image and digest, dtype, and the
    platform and kernels the server really loaded) is the deploy's own record, so a host
    that fell back to another platform than its class's shows it.
    """
    for summary_file in sorted((run_dir / "artifacts").glob("*/*/deploy-summary.json")):
        deployed = json.loads(summary_file.read_text())
        host = summary_file.parent.name
        entry = manifest["hosts"].setdefault(host, {})
        entry.update(
            {
                "model": deployed["model"],
                "served_model_name": deployed["served_model_name"],
                "dtype": deployed["dtype"],
                "vllm_version": deployed["versions"]["vllm"],
                "build": deployed["build"],
                "model_bytes": int(deployed["plan"]["model_gb"] * 2**30),
            }
        )
        entry.setdefault("layouts", {})[summary_file.parent.parent.name] = deployed["plan"]
    for spec_file in sorted((run_dir / "hosts").glob("*/*/*/spec.json")):
        spec = json.loads(spec_file.read_text())
        entry = manifest["hosts"].setdefault(spec_file.parents[2].name, {})
        entry["load_generator_host"] = spec.get("loadgen")
        entry["load_generator_tool"] = spec.get("tool")
    for bandwidth_file in sorted((run_dir / "hosts").glob("*/*/*/bandwidth.json")):
        node_gbps = json.loads(bandwidth_file.read_text())
        entry = manifest["hosts"].setdefault(bandwidth_file.parents[2].name, {})
        entry["bandwidth_per_node_gbps"] = node_gbps
        entry["bandwidth_gbps"] = min(node_gbps.values())
