"""`socketwise sweep --hosts 1,2,3`: one cluster measured at each number of hosts.

The field notes' cluster study found that prompt processing got faster with more nodes
and token generation did not. This measures exactly that on any cluster of the
inventory (hosts sharing a `socketwise_cluster`, docs/guides/clusters.md): for each count N it
deploys the cluster on its head and the first N-1 workers (deploy.yml with --limit, so
the plan splits the layers over those N), then drives its front door closed loop at
each concurrency of the profile from the controller. Per request it records prefill and
decode: on llama.cpp its own timings (`prompt_n`/`prompt_ms`, `predicted_n`/
`predicted_ms`); on vLLM, which reports none, the streamed answer's clock (the first
token's arrival ends prefill, the last ends decode) with the usage vLLM counts. At the
end the whole cluster is deployed again.

Rows go into the run directory's summary.csv as layouts `pp1`, `pp2`, ... (so the usual
report compares them) and into cluster.csv (rundir.CLUSTER), the series the report
shows against the number of hosts. The load is stdlib HTTP /v1/completions
(streamed on vLLM) with random token prompts of the profile's length and `ignore_eos`,
so every request generates exactly the profile's output length: TTFT is the request's
time less its generation time.
"""

from __future__ import annotations

import http.client
import json
import random
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from urllib.parse import urlsplit

from socketwise.common import paths
from socketwise.measure.rundir import CLUSTER, CLUSTER_COLUMNS, SUMMARY_COLUMNS, write_csv
from socketwise.measure.runner import read_inventory, run_playbook

WARMUP_REQUESTS = 4
LAYOUT = "pp{}"


class HostCountError(RuntimeError):
    pass


def cluster_of(inventory: Path) -> dict:
    """{"name", "head", "members"} of the inventory's one cluster, the head first."""
    listing = read_inventory(inventory)
    hostvars = listing.get("_meta", {}).get("hostvars", {})
    order = []
    for group in groups_in_order(listing, "all"):
        order += [h for h in listing.get(group, {}).get("hosts", []) if h not in order]
    clusters: dict[str, list[str]] = {}
    for host in order:
        name = hostvars.get(host, {}).get("socketwise_cluster")
        if name is not None:
            clusters.setdefault(str(name), []).append(host)
    if len(clusters) != 1:
        found = ", ".join(f"{n} ({len(m)} hosts)" for n, m in clusters.items()) or "none"
        raise HostCountError(
            f"{inventory}: --hosts measures one cluster, and the inventory has {found}; "
            "give an inventory whose hosts share one socketwise_cluster"
        )
    ((name, members),) = clusters.items()
    head = hostvars[members[0]].get("socketwise_cluster_head")
    if head not in members:
        raise HostCountError(
            f"{inventory}: cluster {name} has no head {head!r}; set socketwise_cluster_head "
            f"to one of {', '.join(members)}"
        )
    return {"name": name, "head": head, "members": [head] + [m for m in members if m != head]}


def groups_in_order(listing: dict, group: str) -> list[str]:
    """GROUP, then its children's groups, depth first, as the listing orders them."""
    ordered = [group]
    for child in listing.get(group, {}).get("children", []):
        ordered += groups_in_order(listing, child)
    return ordered


def key_file_of(inventory: Path, head: str) -> Path | None:
    """The head's credentials_api_key_file as its inventory resolves it (a path, never the
    key), or None when it has none."""
    shown = subprocess.run(
        [str(Path(sys.executable).parent / "ansible"), head, "-i", str(inventory),
         "-m", "ansible.builtin.debug", "-a", "var=credentials_api_key_file"],
        capture_output=True, text=True, check=False, cwd=paths.repo_root(),
    )  # fmt: skip
    if shown.returncode != 0 or "=>" not in shown.stdout:
        raise HostCountError(f"cannot read {head}'s variables from {inventory}: {shown.stdout}")
    value = json.loads(shown.stdout.split("=>", 1)[1]).get("credentials_api_key_file", "")
    if not value or "VARIABLE IS NOT DEFINED" in value:
        return None
    return Path(value)


def counts_for(cluster: dict, counts: list[int]) -> list[int]:
    too_many = [n for n in counts if n > len(cluster["members"])]
    if too_many:
        raise HostCountError(
            f"--hosts {','.join(map(str, counts))}: cluster {cluster['name']} has "
            f"{len(cluster['members'])} hosts ({', '.join(cluster['members'])}); "
            f"give counts from 1 to {len(cluster['members'])}"
        )
    return sorted(set(counts))


def vocabulary(endpoint: str, key: str, model: dict | None = None) -> int:
    """The served model's vocabulary size: the checkpoint's config on the controller when
    MODEL (cluster-summary.json's) has one (vLLM), else llama-server's /v1/models."""
    checkpoint = (model or {}).get("path")
    config = Path(checkpoint or ".") / "config.json"
    if checkpoint and config.is_file():
        try:
            return int(json.loads(config.read_text())["vocab_size"])
        except (KeyError, TypeError, ValueError) as exc:
            raise HostCountError(f"{config} gives no vocab_size ({exc!r})") from exc
    parts = urlsplit(endpoint)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        connection.request(
            "GET", parts.path + "/models", headers={"Authorization": f"Bearer {key}"}
        )
        models = json.loads(connection.getresponse().read())
    finally:
        connection.close()
    try:
        return int(models["data"][0]["meta"]["n_vocab"])
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise HostCountError(f"{endpoint}/models gives no vocabulary size ({exc!r})") from exc


def _request(endpoint: str, key: str, body: dict, stream: bool = False) -> dict:
    """One completion: {status, seconds} and, when it answered, its prefill and decode
    (`prompt_n`, `prompt_ms`, `predicted_n`, `predicted_ms`): llama.cpp's own timings, or
    with STREAM the streamed answer's clock and usage."""
    parts = urlsplit(endpoint)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    if stream:
        body = body | {"stream": True, "stream_options": {"include_usage": True}}
    started = time.monotonic()
    first, usage, timings = None, {}, {}
    try:
        connection.request("POST", parts.path + "/completions", json.dumps(body), headers)
        response = connection.getresponse()
        status = response.status
        if status == 200 and stream:
            for line in iter(response.readline, b""):
                if not line.startswith(b"data: {"):
                    continue
                chunk = json.loads(line[6:])
                if first is None and any(c.get("text") for c in chunk.get("choices") or []):
                    first = time.monotonic()
                usage = chunk.get("usage") or usage
        elif status == 200:
            timings = json.loads(response.read()).get("timings", {})
        else:
            response.read()
    except (OSError, http.client.HTTPException, ValueError):
        status = 0
    finally:
        connection.close()
    ended = time.monotonic()
    result = {"status": status, "seconds": ended - started}
    if status == 200 and stream and first is not None and usage:
        timings = {"prompt_n": usage.get("prompt_tokens"), "prompt_ms": 1000 * (first - started),
                   "predicted_n": usage.get("completion_tokens"),
                   "predicted_ms": 1000 * (ended - first)}  # fmt: skip
    if status == 200:
        result.update(
            {k: timings.get(k) for k in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms")}
        )
    return result


class Load:
    """Closed loop: `concurrency` clients, each sending its next request when the last
    answered, for `seconds` (at least one request each)."""

    def __init__(self, endpoint: str, key: str, model: str, vocab: int, profile, seed: int,
                 stream: bool = False):  # fmt: skip
        self.endpoint, self.key, self.model, self.vocab = endpoint, key, model, vocab
        self.profile, self.random, self.stream = profile, random.Random(seed), stream
        self.lock = threading.Lock()

    def body(self) -> dict:
        with self.lock:
            prompt = [self.random.randrange(4, self.vocab) for _ in range(self.profile.input_len)]
        return {"model": self.model, "prompt": prompt, "max_tokens": self.profile.output_len,
                "ignore_eos": True, "temperature": 0, "cache_prompt": False}  # fmt: skip

    def warm_up(self) -> None:
        for _ in range(WARMUP_REQUESTS):
            _request(self.endpoint, self.key, self.body(), self.stream)

    def run(self, concurrency: int, seconds: float) -> tuple[list[dict], float]:
        results: list[dict] = []
        deadline = time.monotonic() + seconds

        def client() -> None:
            while True:
                done = _request(self.endpoint, self.key, self.body(), self.stream)
                with self.lock:
                    results.append(done)
                if time.monotonic() > deadline:
                    return

        started = time.monotonic()
        clients = [threading.Thread(target=client) for _ in range(concurrency)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join()
        return results, time.monotonic() - started


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def rows(head: str, hosts: int, concurrency: int, results: list[dict], wall: float):
    """(summary.csv row, cluster.csv row) of one step."""
    ok = [r for r in results if r["status"] == 200 and r.get("predicted_n")]
    ttft = [1000 * r["seconds"] - r["predicted_ms"] for r in ok]
    per_token = [r["predicted_ms"] / r["predicted_n"] for r in ok]
    prompt, output = sum(r["prompt_n"] for r in ok), sum(r["predicted_n"] for r in ok)
    prompt_ms = sum(r["prompt_ms"] for r in ok)
    predicted_ms = sum(r["predicted_ms"] for r in ok)
    summary = {
        "host": head, "layout": LAYOUT.format(hosts), "rate": None, "concurrency": concurrency,
        "output_tok_s": round(output / wall, 3),
        "ttft_p50_ms": _round(_percentile(ttft, 0.5)),
        "ttft_p99_ms": _round(_percentile(ttft, 0.99)),
        "itl_p50_ms": _round(_percentile(per_token, 0.5)),
        "itl_p99_ms": _round(_percentile(per_token, 0.99)),
        "completed": len(ok), "failed": len(results) - len(ok),
        "tpot_p50_ms": _round(_percentile(per_token, 0.5)),
    }  # fmt: skip
    cluster = {
        "hosts": hosts, "concurrency": concurrency, "requests": len(ok),
        "prompt_tokens": prompt, "output_tokens": output,
        # llama.cpp's own rates: tokens over the time it spent on each phase.
        "prefill_tok_s": round(1000 * prompt / prompt_ms, 2) if prompt_ms else None,
        "decode_tok_s": round(1000 * output / predicted_ms, 2) if predicted_ms else None,
        "output_tok_s": summary["output_tok_s"],
    }  # fmt: skip
    return summary, cluster


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def measure(deploy, endpoint_of, cluster: dict, counts: list[int], profile, say) -> tuple:
    """For each count: deploy (deploy(limit)), then every concurrency of the profile.
    endpoint_of() gives (endpoint URL, key, served name, vocabulary size, stream) after a
    deploy (stream: time the streamed answer, for an engine that reports no timings)."""
    summary, series = [], []
    for hosts in counts:
        members = cluster["members"][:hosts]
        say(f"{LAYOUT.format(hosts)}: deploying on {', '.join(members)}")
        deploy(",".join(members), LAYOUT.format(hosts))
        endpoint, key, model, vocab, stream = endpoint_of(LAYOUT.format(hosts))
        load = Load(endpoint, key, model, vocab, profile, profile.seed, stream)
        load.warm_up()
        for repetition in range(profile.repetitions):
            for concurrency in profile.concurrencies:
                results, wall = load.run(concurrency, profile.step_seconds)
                step, point = rows(cluster["head"], hosts, concurrency, results, wall)
                summary.append(step)
                series.append(point)
                say(
                    f"{LAYOUT.format(hosts)}: c{concurrency} (round {repetition + 1}) "
                    f"prefill {point['prefill_tok_s']} tok/s, decode {point['decode_tok_s']} "
                    f"tok/s, {point['requests']} requests"
                )
    return summary, series


def write(run_dir: Path, summary: list[dict], series: list[dict]) -> None:
    write_csv(run_dir / "summary.csv", SUMMARY_COLUMNS, summary)
    write_csv(run_dir / CLUSTER, CLUSTER_COLUMNS, series)


def sweep_hosts(
    inventory: Path,
    counts: list[int],
    run_dir: Path,
    profile,
    api_key_file: Path | None,
    restore: bool = True,
) -> Path:
    """`socketwise sweep --hosts`: the inventory's one cluster at each number of hosts (PROFILE a
    sweep's), each measured as `measure` does, into RUN_DIR."""
    cluster = cluster_of(inventory)
    counts = counts_for(cluster, counts)
    key_file = api_key_file or key_file_of(inventory, cluster["head"])
    if key_file and not key_file.is_file():
        raise HostCountError(
            f"{key_file}: no such file (the front door's key); give --api-key-file"
        )
    key = key_file.read_text().strip() if key_file else ""
    run_dir.mkdir(parents=True, exist_ok=True)
    layouts = [LAYOUT.format(n) for n in counts]
    manifest: dict = {
        "schema": 1,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "inventory": str(inventory),
        "layouts": layouts,
        "mode": "hosts",
        "profile": asdict(profile),
        "cluster": cluster | {"counts": counts},
        "load_generator": "socketwise's closed-loop client on the controller (/v1/completions, "
        "streamed on vLLM, random token prompts of input_len, ignore_eos)",
        "load_shape": {"concurrency": "closed loop: that many requests in flight"},
        "measured_boundary": "HTTP client on the controller to the cluster's front door on its "
        "head; prefill and decode rates are llama.cpp's own timings of each request, on vLLM "
        "the streamed answer's first and last token as the client sees them",
        "warm_up": f"deploy.yml's readiness completion, then {WARMUP_REQUESTS} "
        "unmeasured requests after every deploy",
        "hosts": {},
    }
    started = time.monotonic()

    def say(message: str) -> None:
        print(f"[sweep] {time.monotonic() - started:.0f} s: {message}", flush=True)

    def deploy(limit: str, layout: str) -> None:
        run_playbook("deploy.yml", inventory, {}, run_dir / "artifacts" / layout, limit=limit)

    def endpoint_of(layout: str) -> tuple[str, str, str, int, bool]:
        deployed = json.loads(
            (run_dir / "artifacts" / layout / cluster["head"] / "cluster-summary.json").read_text()
        )
        entry = manifest["hosts"].setdefault(cluster["head"], {})
        entry.update(model=deployed["model"], served_model_name=deployed["served_name"],
                     build=deployed["build"])  # fmt: skip
        entry.setdefault("layouts", {})[layout] = deployed["plan"]
        vocab = vocabulary(deployed["endpoint"], key, deployed["model"])
        return (deployed["endpoint"], key, deployed["served_name"], vocab,
                deployed["engine"] == "vllm")  # fmt: skip

    summary, series = measure(deploy, endpoint_of, cluster, counts, profile, say)
    if restore:
        # Its members alone: the sweep changed no other host (a monitor, a fleet door).
        say("restoring the whole cluster")
        deploy(",".join(cluster["members"]), "restored")
    manifest["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    write(run_dir, summary, series)
    (run_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return run_dir
