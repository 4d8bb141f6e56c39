"""`socketwise calibrate`: measure the choices the planner takes from rules, per hardware
class, and write the winners where the planner reads them.

For each hardware class of the inventory (`playbooks/plan.yml` surveys the hosts; nothing
on them changes), on the first of its hosts, taken out of the fleet front door first:

1. **Choices, against plain vLLM.** Interleaved rounds over plain vLLM (the sweep's
   `baseline`) and SN keeping K = 0, 1, 2 cores of each node for vLLM's front end (those
   the node has beside one core to serve), and on an AVX2 class SN in the dtype the rule
   did not pick; the order reverses every round. Each variant's steps are repeated in
   its round (--repetitions), the round's figure their median. Each round's figures, at
   each closed-loop concurrency, are compared with the same round's plain vLLM on output
   tok/s, TTFT p50 and TPOT p50: the variant whose ratios reach BAR most often wins
   (choose). K is chosen among the K variants (in the rule's dtype); the dtype against
   the K variant of the rule's K.
2. **The SN/DP crossover.** The sweep's adaptive search between the chosen SN and DP (DP
   with the rule's reserve, as the planner places it): brackets, then bisection rounds.
   Its bracket's midpoint is a request rate; `plan_crossover` is in concurrent requests,
   so it becomes rate x latency (Little's law, with SN's measured TTFT and TPOT there).
3. **Written** into the class's inventory group (calibrated.write_group_vars), then the
   host is deployed with no override (it serves the measured choice) and put back.

The run directory is a sweep's (summary.csv, manifest.json with the adaptive search, the
per-host results) plus `calibration.json`: per class, the variants' medians and per-round
ratios against plain vLLM, the choices, the record and where it was written.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from socketwise.measure import hostcount
from socketwise.measure.rundir import BASELINE
from socketwise.measure.runner import SweepError, read_inventory, run_playbook
from socketwise.measure.sweep import (
    LAYOUTS,
    LOADGEN_GROUP,
    TOOLS,
    Profile,
    Sweep,
    base_manifest,
    check_tool,
    finish,
    run_adaptive,
)
from socketwise.measure.sweepcli import numbers, positive, report_at_end
from socketwise.plan import calibrated
from socketwise.plan.fleet import serving_hosts
from socketwise.plan.nodes import default_reserve_cores

# Cores kept for the front end that a calibration tries, where the node has them.
RESERVES = (0, 1, 2)
# The figures a choice is judged on, each with whether more is better.
METRICS = (("output_tok_s", True), ("ttft_p50_ms", False), ("tpot_p50_ms", False))
# A round's figure is as good as plain vLLM's from this ratio up: the most a round may
# fall behind and the kit still count as never losing to plain vLLM.
BAR = 0.95
# Groups whose hosts serve nothing (group_of_class leaves them out of a class's group).
CALIBRATION_JSON = "calibration.json"
# The crossover search's layouts: the chosen SN, and DP.
SEARCH = ("sn", "dp")


class CalibrateError(RuntimeError):
    pass


@dataclass
class Target:
    """One hardware class: where it is measured and where its decisions go."""

    class_id: str
    host: str
    hosts: list[str]
    group: str
    node_cores: int
    isa: str
    rule_dtype: str
    vars_file: Path
    # The cores DP's ranks get with the rule's reserve: DP-2 needs two.
    dp_cores: int
    # The host and the inventory's load generators: what every deploy and batch reaches.
    limit: str


def _group_hosts(listing: dict) -> dict[str, set[str]]:
    """Every group of an `ansible-inventory --list` with its hosts, children's included."""
    return {
        name: {
            host
            for group in hostcount.groups_in_order(listing, name)
            for host in listing.get(group, {}).get("hosts", [])
        }
        for name in listing
        if name != "_meta"
    }


def targets(inventory: Path, survey_dir: Path, limit: str | None) -> list[Target]:
    """The classes the survey found, each with its group, measured on the first of its
    hosts (the first LIMIT names; a class LIMIT names none of is left alone). Refuses
    before anything changes."""
    fleet = json.loads((survey_dir / "fleet-plan.json").read_text())
    chosen = None
    if limit is not None:
        chosen = _group_hosts(read_inventory(inventory, limit)).get("all", set())
        if not chosen:
            raise CalibrateError(f"--limit {limit}: names no host of {inventory}")
    groups = _group_hosts(read_inventory(inventory))
    serving = set(serving_hosts(groups))
    folder = inventory if inventory.is_dir() else inventory.parent
    found = []
    for described in fleet["classes"]:
        hosts = sorted(h["host"] for h in described["hosts"] if h["host"] in serving)
        measured = [h for h in hosts if chosen is None or h in chosen]
        if not measured:
            continue
        try:
            group = calibrated.group_of_class(set(hosts), groups, serving, described["id"])
        except calibrated.CalibrationError as exc:
            raise CalibrateError(str(exc)) from None
        # What the calibration will write, the group's file must leave to it: refused
        # now, before anything is measured, rather than after.
        vars_file = folder / "group_vars" / f"{group}.yml"
        written = {"plan_reserve_cores", "plan_crossover", calibrated.RECORD}
        written |= {"vllm_service_dtype"} if described["isa"] == "avx2" else set()
        try:
            calibrated.outside_block(vars_file, written)
        except calibrated.CalibrationError as exc:
            raise CalibrateError(f"hardware class {described['id']}: {exc}") from None
        plan = json.loads((survey_dir / measured[0] / "plan.json").read_text())
        cores = [n["cores"] for n in described["nodes"] if n["cores"]]
        found.append(
            Target(
                class_id=described["id"], host=measured[0], hosts=hosts, group=group,
                node_cores=min(cores), isa=described["isa"], rule_dtype=plan["build"]["dtype"],
                vars_file=vars_file,
                dp_cores=sum(c - default_reserve_cores(c) for c in cores),
                limit=",".join([measured[0], *sorted(groups.get(LOADGEN_GROUP, set()))]),
            )
        )  # fmt: skip
    return found


def variants(target: Target) -> dict[str, dict]:
    """The layouts a class's choices are measured on: plain vLLM, SN with each reserve the
    node allows, and on AVX2 SN in the other dtype. Every variable the planner could take
    from an earlier calibration is given, so none of them leaks in."""
    rule = {"plan_reserve_cores": None, "plan_crossover": None, "vllm_service_dtype": ""}
    found = {BASELINE: {**LAYOUTS[BASELINE], **rule}}
    for kept in RESERVES:
        if kept < target.node_cores:
            found[f"sn-k{kept}"] = {**rule, "plan_layout": "sn", "plan_reserve_cores": kept}
    if target.isa == "avx2":
        other = "float32" if target.rule_dtype == "bfloat16" else "bfloat16"
        found[f"sn-{other}"] = {**rule, "plan_layout": "sn", "vllm_service_dtype": other}
    return found


def medians(rows: list[dict], layout: str) -> dict[int, dict[str, float]]:
    """{concurrency: {metric: median over the rows}} of one layout's closed-loop rows:
    over the rounds, or over one round's repetitions."""
    by_load: dict[int, dict[str, list[float]]] = {}
    for row in rows:
        if row["layout"] == layout and row["concurrency"] is not None:
            load = by_load.setdefault(int(row["concurrency"]), {})
            for metric, _ in METRICS:
                if row[metric] is not None:
                    load.setdefault(metric, []).append(float(row[metric]))
    return {c: {m: statistics.median(v) for m, v in ms.items()} for c, ms in by_load.items()}


def ratio(mine: float, plain: float, more_is_better: bool) -> float | None:
    """How much better than plain vLLM: above 1 is better, whichever way the metric runs.

    None where the figure tells nothing: plain vLLM's throughput is 0, or a latency is 0
    or missing on either side (a TPOT p50 where a request's tokens came in one chunk is
    missing: sweep.ONE_CHUNK_TPOT_MS). A throughput of 0 of the variant's own is its
    worst: 0.
    """
    if more_is_better:
        return round(mine / plain, 3) if plain else None
    return round(plain / mine, 3) if mine and plain else None


def ratios(figures: dict, layout: str) -> dict[int, dict[str, float | None]]:
    plain = figures[BASELINE]
    return {
        c: {m: ratio(figures[layout][c].get(m, 0), plain[c].get(m, 0), up) for m, up in METRICS}
        for c in sorted(figures[layout])
        if c in plain
    }


def told(against: dict[int, dict[str, float | None]]) -> list[float]:
    """The ratios that tell something."""
    return [r for by_metric in against.values() for r in by_metric.values() if r is not None]


def worst(against: dict[int, dict[str, float | None]]) -> float:
    """The lowest ratio that tells something; 0 when none does."""
    return min(told(against), default=0.0)


def per_round(rounds: list[dict], layout: str) -> list[dict]:
    """Each round's ratios against plain vLLM."""
    return [{str(c): m for c, m in ratios(figures, layout).items()} for figures in rounds]


def at_bar(rounds: list[dict], layout: str) -> float:
    """The share of a layout's per-round ratios (each round, load and figure that tells
    something) at BAR or above."""
    each = [r for against in per_round(rounds, layout) for r in told(against)]
    return round(sum(r >= BAR for r in each) / len(each), 3) if each else 0.0


def choose(target: Target, figures: dict, rounds: list[dict]) -> dict:
    """The reserve (and dtype) whose rounds reach BAR of plain vLLM most often.

    FIGURES are the medians over ROUNDS. Each round's figures are judged against the
    same round's plain vLLM, so a round where the whole machine ran slower counts
    against neither side, and one bad round costs a variant some of its figures instead
    of setting its worst median alone. A tie goes to the higher worst median ratio, then
    to fewer cores kept.
    """
    scored = {
        name: (at_bar(rounds, name), worst(ratios(figures, name)))
        for name in figures
        if name != BASELINE
    }
    reserves = [name for name in scored if name.startswith("sn-k")]
    best = max(reserves, key=lambda name: (*scored[name], -int(name.removeprefix("sn-k"))))
    chosen = {"plan_reserve_cores": int(best.removeprefix("sn-k"))}
    dtypes = [name for name in scored if not name.startswith("sn-k")]
    if dtypes:
        rule_k = f"sn-k{default_reserve_cores(target.node_cores)}"
        (other,) = dtypes
        won = scored[other] > scored.get(rule_k, scored[best])
        chosen["vllm_service_dtype"] = other.removeprefix("sn-") if won else target.rule_dtype
    return {
        "decided": chosen,
        "at_bar": {name: share for name, (share, _) in scored.items()},
        "worst_ratio": {name: low for name, (_, low) in scored.items()},
    }


def crossover_concurrency(experiment: Sweep, layout: str, rate: float) -> float | None:
    """Little's law at the bracket's midpoint: concurrency = rate x SN's latency there
    (TTFT p50 + TPOT p50 for each later token), from SN's rate step nearest it."""
    rows = [r for r in experiment.summary if r["layout"] == layout and r["rate"] is not None]
    rows = [r for r in rows if r["rate"] != "inf" and r["tpot_p50_ms"] is not None]
    if not rows:
        return None
    near = min(rows, key=lambda r: abs(float(r["rate"]) - rate))
    output_len = experiment.profile.output_len
    latency_s = (near["ttft_p50_ms"] + near["tpot_p50_ms"] * (output_len - 1)) / 1000
    return round(max(1.0, rate * latency_s), 1)


def calibrate_class(
    inventory: Path, run_dir: Path, target: Target, profile: Profile, options: dict
) -> dict:
    """Measure one class on its host; returns its entry of calibration.json."""
    layouts = variants(target)
    rounds, search_rounds = options["rounds"], options["search_rounds"]
    names = list(layouts)
    closed_steps = len(profile.concurrencies) * profile.repetitions
    planned = 1 + rounds * len(names) * closed_steps + 4 + 2 * search_rounds
    experiment = Sweep(inventory, run_dir, profile, planned, options["tool"], layouts, target.limit)
    # The first variant driven flat out sizes the closed-loop steps of all (the sweep's
    # calibration): about step_seconds each, however fast the host. Each round repeats
    # them: within one start of a variant, plain vLLM's steps scatter by a third where the
    # kit's agree within a tenth (docs/measurements.md), and a round's figure is then
    # their median rather than one draw.
    calibration = experiment.drive_flat_out(names[0])
    closed = [s for s in profile.steps(calibration["max_request_rate"]) if "concurrency" in s]
    by_round = []
    for number in range(1, rounds + 1):
        first = len(experiment.summary)
        for index, name in enumerate(names if number % 2 else names[::-1]):
            # A round begins on the layout the flat-out run or the last round ended on:
            # restarted, so it starts with an empty prefix cache as the others do.
            experiment.measure(name, closed, f"round-{number}", fresh=index == 0)
        by_round.append({name: medians(experiment.summary[first:], name) for name in names})
    figures = {name: medians(experiment.summary, name) for name in names}
    choice = choose(target, figures, by_round)
    decided = dict(choice["decided"])
    dtype = decided.get("vllm_service_dtype", "")
    layouts["sn"] = {"plan_layout": "sn", "plan_crossover": None, "vllm_service_dtype": dtype,
                     "plan_reserve_cores": decided["plan_reserve_cores"]}  # fmt: skip
    layouts["dp"] = {"plan_layout": "dp", "plan_dp_mode": "instances", "plan_crossover": None,
                     "vllm_service_dtype": dtype, "plan_reserve_cores": None}  # fmt: skip
    # DP-2 needs two cores beside the rule's reserve; without them the rule's crossover
    # never leads to DP here and nothing is searched.
    search = run_adaptive(experiment, list(SEARCH), search_rounds) if target.dp_cores >= 2 else {}
    low, high = search.get("crossover_between") or (None, None)
    crossover = None if low is None else crossover_concurrency(experiment, "sn", (low + high) / 2)
    if crossover is not None:
        decided["plan_crossover"] = crossover
    return {
        "target": {**asdict(target), "vars_file": str(target.vars_file)},
        "experiment": experiment,
        "search": search,
        "calibration": calibration,
        "decided": decided,
        "figures": {
            "medians": {n: {str(c): m for c, m in f.items()} for n, f in figures.items()},
            "ratios_to_plain": {
                n: {str(c): m for c, m in ratios(figures, n).items()}
                for n in names
                if n != BASELINE
            },
            "per_round_ratios": {n: per_round(by_round, n) for n in names if n != BASELINE},
            "at_bar": choice["at_bar"],
            "worst_ratio": choice["worst_ratio"],
            "saturation_rate": search.get("saturation_rate"),
            "crossover_rate_between": search.get("crossover_between"),
        },
    }


def _record(run_dir: Path, target: Target, measured: dict) -> dict:
    """socketwise_calibration: the build and model the kit's variants ran, and what decided."""
    kept = measured["decided"]["plan_reserve_cores"]
    summary = run_dir / "artifacts" / f"sn-k{kept}" / target.host / "deploy-summary.json"
    deployed = json.loads(summary.read_text())
    figures = measured["figures"]
    return {
        "run": run_dir.name,
        "date": time.strftime("%Y-%m-%d"),
        "hardware_class": target.class_id,
        "host": target.host,
        "model": deployed["model"],
        "model_revision": deployed.get("model_revision") or "",
        "vllm_spec": deployed["versions"]["vllm_spec"],
        "decided": measured["decided"],
        "figures": {
            key: figures[key]
            for key in ("ratios_to_plain", "at_bar", "worst_ratio", "crossover_rate_between")
        },  # fmt: skip
    }


def _say(message: str) -> None:
    print(f"[calibrate] {message}", flush=True)


def _shown(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _lines(target: Target, measured: dict) -> list[str]:
    """What was measured and chosen, as a person reads it."""
    out = [f"{target.class_id} on {target.host} (group {target.group}):"]
    for name, by_load in measured["figures"]["ratios_to_plain"].items():
        rounds = measured["figures"]["per_round_ratios"][name]
        for load, by_metric in by_load.items():
            each = []
            for metric, value in by_metric.items():
                seen = ", ".join(_shown(r[load][metric]) for r in rounds if load in r)
                each.append(f"{metric} {_shown(value)} (rounds {seen})")
            out.append(f"  {name} c{load} vs plain vLLM: {'; '.join(each)}")
    for name, share in measured["figures"]["at_bar"].items():
        out.append(
            f"  {name}: {share:.0%} of the rounds' figures at {BAR}x of plain vLLM or above,"
            f" worst median {_shown(measured['figures']['worst_ratio'][name])}"
        )
    decided = ", ".join(f"{k}={v}" for k, v in measured["decided"].items())
    out.append(f"  chosen: {decided}")
    if "plan_crossover" not in measured["decided"]:
        out.append("  no SN/DP crossover measured (DP does not fit this class): the rule stays")
    return out


def calibrate(
    inventory: Path, run_dir: Path, profile: Profile, options: dict, limit: str | None = None
) -> dict:
    """Survey, then measure, write and restore each class in turn; returns calibration.json."""
    check_tool(options["tool"])
    run_dir.mkdir(parents=True, exist_ok=True)
    survey = run_dir / "artifacts" / "survey"
    _say("surveying the hosts (playbooks/plan.yml; nothing on them changes)")
    # Every host: a class's group must hold exactly its hosts, the unlimited ones too.
    run_playbook("playbooks/plan.yml", inventory, {}, survey)
    found = targets(inventory, survey, limit)
    if not found:
        raise CalibrateError(f"{inventory}: no serving host to calibrate" +
                             (f" in --limit {limit}" if limit else ""))  # fmt: skip
    doors = _group_hosts(read_inventory(inventory)).get("socketwise_frontdoor")
    names = [*dict.fromkeys(name for target in found for name in variants(target)), *SEARCH]
    manifest = base_manifest(inventory, names, "calibrate", profile, options["tool"])
    result: dict = {"run": run_dir.name, "classes": []}
    summary: list[dict] = []
    power: list[dict] = []
    for target in found:
        _say(f"{target.class_id}: measuring on {target.host}, writing to {target.vars_file}")
        drain = {"socketwise_drain_hosts": [target.host]}
        if doors:
            run_playbook("playbooks/drain.yml", inventory, drain | {"socketwise_drain": True},
                    run_dir / "artifacts" / "drain")  # fmt: skip
        restored = False
        try:
            measured = calibrate_class(inventory, run_dir, target, profile, options)
            experiment = measured.pop("experiment")
            summary += experiment.summary
            power += experiment.power
            record = _record(run_dir, target, measured)
            backup = calibrated.write_group_vars(target.vars_file, record)
            _say(f"{target.class_id}: wrote {target.vars_file}" +
                 (f" (the file before: {backup})" if backup else ""))  # fmt: skip
            _say(f"{target.class_id}: deploying {target.host} with the measured choice")
            run_playbook(
                "deploy.yml", inventory, {}, run_dir / "artifacts" / "restored", limit=target.limit
            )
            restored = True
        finally:
            if not restored:
                _say(f"{target.host}: putting back its configured layout")
                run_playbook("deploy.yml", inventory, {}, run_dir / "artifacts" / "restored",
                        limit=target.limit)  # fmt: skip
            if doors:
                run_playbook("playbooks/drain.yml", inventory, drain | {"socketwise_drain": False},
                        run_dir / "artifacts" / "drain")  # fmt: skip
        served = run_dir / "artifacts" / "restored" / target.host / "deploy-summary.json"
        plan = json.loads(served.read_text())["plan"]
        for line in _lines(target, measured):
            _say(line)
        _say(f"  {target.host} now serves {plan['layout'].upper()}: {plan['reason']}")
        if len(found) == 1:
            manifest["calibration"] = measured["calibration"]
            if measured["search"]:
                manifest["adaptive"] = measured["search"]
        result["classes"].append(
            {
                **measured,
                "record": record,
                "written": str(target.vars_file),
                "backup": str(backup) if backup else None,
                "served": {"layout": plan["layout"], "reason": plan["reason"]},
            }  # fmt: skip
        )
    finish(run_dir, manifest, summary, power)
    (run_dir / CALIBRATION_JSON).write_text(json.dumps(result, indent=2, default=str) + "\n")
    return result


def register(
    subparsers: argparse._SubParsersAction, write_report: Callable[[Path], Iterable[Path]]
) -> None:
    """Add `calibrate`; `write_report(run_dir)` (the report stage, handed in by the CLI as
    to `sweep`) draws the run at the end."""
    parser = subparsers.add_parser(
        "calibrate",
        help="measure the planner's rule-made choices per hardware class and write the winners",
        description="On one host of each hardware class (out of the fleet front door while "
        "measured): plain vLLM against SN keeping 0, 1 or 2 cores for vLLM's front end (and "
        "on AVX2 the other dtype) in interleaved rounds, then the SN/DP crossover; the "
        "choices go to the class's group_vars, and the host is deployed with them.",
    )
    parser.add_argument("-i", "--inventory", type=Path, default=Path("inventories/lab"))
    parser.add_argument(
        "--limit",
        help="an Ansible pattern: measure only the classes it names a host of, each on the "
        "first such host (the survey still reads every host)",
    )
    parser.add_argument("--run-dir", type=Path, help="default runs/calibrate-<time>")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--repetitions", type=int, default=2,
                        help="each variant's steps in a round, its figure their median "
                        "(default 2)")  # fmt: skip
    parser.add_argument("--search-rounds", type=int, default=2,
                        help="bisection rounds of the SN/DP crossover (default 2)")  # fmt: skip
    parser.add_argument("--concurrencies", default="1,4", help="closed-loop points")
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--step-seconds", type=float, default=30.0,
                        help="seconds of load a step: a crossover search's rate step, and at "
                        "most about a closed-loop step")  # fmt: skip
    parser.add_argument("--tool", default="vllm", help=f"load generator: {' or '.join(TOOLS)}")
    parser.set_defaults(func=functools.partial(_run, write_report=write_report))


def _run(args: argparse.Namespace, write_report: Callable[[Path], Iterable[Path]]) -> int:
    run_dir = args.run_dir or Path("runs") / time.strftime("calibrate-%Y%m%d-%H%M%S")
    try:
        for flag, value in (
            ("--rounds", args.rounds),
            ("--repetitions", args.repetitions),
            ("--search-rounds", args.search_rounds),
            ("--input-len", args.input_len),
            ("--output-len", args.output_len),
            ("--step-seconds", args.step_seconds),
        ):
            positive(flag, value)
        profile = Profile(
            concurrencies=numbers("--concurrencies", args.concurrencies, int),
            rate_fractions=[], input_len=args.input_len, output_len=args.output_len,
            step_seconds=args.step_seconds, repetitions=args.repetitions,
        )  # fmt: skip
        options = {"rounds": args.rounds, "search_rounds": args.search_rounds, "tool": args.tool}
        calibrate(args.inventory, run_dir, profile, options, args.limit)
    except (CalibrateError, SweepError, hostcount.HostCountError,
            calibrated.CalibrationError) as exc:  # fmt: skip
        print(f"socketwise calibrate: error: {exc}", file=sys.stderr)
        return 2
    return report_at_end("calibrate", run_dir, write_report)
