"""`socketwise status`: the fleet at a glance, from its monitor's Prometheus.

One row per engine the monitor scrapes (job socketwise-engines): host, engine, layout,
whether it answers, requests running and waiting, output tok/s and TTFT p50/p99 over the
last minutes, KV cache use, and the alerts firing on it. `--json` prints the same for
scripts; `--watch` redraws it. Prometheus comes from `--prometheus URL`, or from the
inventory's monitor host (`-i INVENTORY`: its monitor_listen_address and
monitor_prometheus_port, as Ansible renders them).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ENGINES = 'job="socketwise-engines"'
# The engine's key in every query's result.
KEY = ("host", "socketwise_instance")
MONITOR_GROUP = "socketwise_monitor"
TIMEOUT = 10


class StatusError(Exception):
    """What keeps status from answering, in one line with the fix."""


def _queries(window: str) -> dict[str, str]:
    by = f"sum by ({', '.join(KEY)})"
    buckets = f"vllm:time_to_first_token_seconds_bucket{{{ENGINES}}}[{window}]"
    ttft = f"sum by (le, {', '.join(KEY)}) (rate({buckets}))"
    return {
        "up": f"up{{{ENGINES}}}",
        "running": f"{by} (vllm:num_requests_running{{{ENGINES}}})",
        "waiting": f"{by} (vllm:num_requests_waiting{{{ENGINES}}})",
        "kv_cache_usage": f"max by ({', '.join(KEY)}) (vllm:kv_cache_usage_perc{{{ENGINES}}})",
        "output_tok_s": f"{by} (rate(vllm:generation_tokens_total{{{ENGINES}}}[{window}]))",
        "ttft_p50_s": f"histogram_quantile(0.5, {ttft})",
        "ttft_p99_s": f"histogram_quantile(0.99, {ttft})",
    }


def _get(url: str) -> dict:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
            answer = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        raise StatusError(
            f"Prometheus at {url.split('/api/')[0]} did not answer ({reason}); if it listens on "
            "the monitor's loopback address, open a tunnel (ssh -L 9090:127.0.0.1:9090 MONITOR) "
            "and give --prometheus http://127.0.0.1:9090"
        ) from error
    if answer.get("status") != "success":
        raise StatusError(f"Prometheus refused {url}: {answer.get('error', answer)}")
    return answer["data"]


def _number(value: str) -> float | None:
    number = float(value)
    return None if math.isnan(number) or math.isinf(number) else number


def collect(prometheus: str, window: str = "5m") -> dict:
    """{"prometheus", "time", "engines": [...], "alerts": [...]}: every engine the monitor
    scrapes with its figures (None where Prometheus has none yet) and the alerts firing
    on it; `alerts`: every firing alert of the fleet."""
    base = prometheus.rstrip("/")
    rows: dict[tuple[str, str], dict] = {}
    for field, query in _queries(window).items():
        data = _get(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': query})}")
        for sample in data["result"]:
            labels = sample["metric"]
            key = (labels.get("host", ""), labels.get("socketwise_instance", ""))
            if field == "up":
                rows[key] = {
                    "host": key[0],
                    "socketwise_instance": key[1],
                    "layout": labels.get("layout", ""),
                    "model": labels.get("model", ""),
                    "hardware_class": labels.get("hardware_class", ""),
                    "up": sample["value"][1] == "1",
                    "running": None,
                    "waiting": None,
                    "output_tok_s": None,
                    "kv_cache_usage": None,
                    "ttft_p50_s": None,
                    "ttft_p99_s": None,
                    "alerts": [],
                }
            elif key in rows:
                rows[key][field] = _number(sample["value"][1])
    alerts = []
    for alert in _get(f"{base}/api/v1/alerts")["alerts"]:
        if alert.get("state") != "firing":
            continue
        labels = alert["labels"]
        alerts.append(
            {
                "alertname": labels.get("alertname", ""),
                "severity": labels.get("severity", ""),
                "host": labels.get("host", ""),
                "socketwise_instance": labels.get("socketwise_instance", ""),
                "summary": alert.get("annotations", {}).get("summary", ""),
                "active_at": alert.get("activeAt", ""),
            }
        )
        # On its engine, or on every engine of its host when it names none.
        for key, row in rows.items():
            if labels.get("host") == key[0] and labels.get("socketwise_instance", key[1]) == key[1]:
                row["alerts"].append(labels.get("alertname", ""))
    return {
        "prometheus": base,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "window": window,
        "engines": [rows[key] for key in sorted(rows)],
        "alerts": alerts,
    }


def _figure(value: float | None, form: str) -> str:
    return "-" if value is None else form.format(value)


def table(status: dict) -> str:
    """The status as a text table, one row per engine, then the fleet's firing alerts."""
    header = ("HOST", "ENGINE", "MODEL", "LAYOUT", "UP", "RUN", "WAIT", "OUT TOK/S", "KV")
    header += ("TTFT P50", "TTFT P99", "ALERTS")
    rows = [header]
    for engine in status["engines"]:
        rows.append(
            (
                engine["host"],
                engine["socketwise_instance"],
                engine["model"] or "-",
                engine["layout"],
                "up" if engine["up"] else "DOWN",
                _figure(engine["running"], "{:.0f}"),
                _figure(engine["waiting"], "{:.0f}"),
                _figure(engine["output_tok_s"], "{:.1f}"),
                _figure(engine["kv_cache_usage"] and engine["kv_cache_usage"] * 100, "{:.0f}%"),
                _figure(engine["ttft_p50_s"] and engine["ttft_p50_s"] * 1000, "{:.0f} ms"),
                _figure(engine["ttft_p99_s"] and engine["ttft_p99_s"] * 1000, "{:.0f} ms"),
                ",".join(engine["alerts"]) or "-",
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    if not status["engines"]:
        lines.append("(the monitor scrapes no engine yet)")
    lines.append(
        f"\n{len(status['alerts'])} alert(s) firing"
        + "".join(
            f"\n  {a['severity'] or '-'} {a['alertname']}: {a['summary'] or a['host']}"
            for a in status["alerts"]
        )
    )
    lines.append(f"(Prometheus {status['prometheus']}, rates over {status['window']})")
    return "\n".join(lines)


def monitor_url(inventory: str) -> str:
    """The Prometheus of the inventory's first monitor host, as Ansible renders its
    monitor_listen_address and monitor_prometheus_port."""
    ansible = shutil.which("ansible", path=str(Path(sys.executable).parent) + os.pathsep
                           + os.environ.get("PATH", ""))  # fmt: skip
    if ansible is None:
        raise StatusError("ansible is not installed here; give --prometheus URL instead")
    listed = subprocess.run(
        [str(Path(ansible).with_name("ansible-inventory")), "-i", inventory, "--list"],
        capture_output=True, text=True,
    )  # fmt: skip
    if listed.returncode != 0:
        raise StatusError(f"-i {inventory}: ansible-inventory failed: {listed.stderr.strip()}")
    groups = json.loads(listed.stdout)
    monitors = groups.get(MONITOR_GROUP, {}).get("hosts", [])
    if not monitors:
        raise StatusError(
            f"-i {inventory}: no host in the group {MONITOR_GROUP}, so nothing watches the fleet; "
            "add one and run deploy.yml (docs/guides/monitoring.md), or give --prometheus URL"
        )
    # The arguments as JSON: as key=value, Ansible 2.19 reads the message's second
    # expression as a value of its own and fails the task.
    message = ("{{ monitor_listen_address | default('127.0.0.1') }} "
               "{{ monitor_prometheus_port | default(9090) }}")  # fmt: skip
    shown = subprocess.run(
        [ansible, "-i", inventory, monitors[0], "-m", "ansible.builtin.debug", "-a",
         json.dumps({"msg": message})],
        capture_output=True, text=True,
        env=os.environ | {"ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "json"},
    )  # fmt: skip
    try:
        result = json.loads(shown.stdout)["plays"][0]["tasks"][0]["hosts"][monitors[0]]
        address, port = result["msg"].split()
    except (ValueError, KeyError, IndexError) as error:
        raise StatusError(
            f"-i {inventory}: could not read {monitors[0]}'s monitor_listen_address "
            f"({shown.stderr.strip() or shown.stdout.strip()[:200]})"
        ) from error
    return f"http://{f'[{address}]' if ':' in address else address}:{port}"


def _run(args: argparse.Namespace) -> int:
    try:
        prometheus = args.prometheus or monitor_url(args.inventory)
        while True:
            status = collect(prometheus, args.window)
            if args.json:
                print(json.dumps(status, indent=2), flush=True)
            else:
                if args.watch:
                    print("\033[2J\033[H", end="")
                print(table(status), flush=True)
            if not args.watch:
                return 0
            time.sleep(args.watch)
    except StatusError as error:
        print(f"socketwise status: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status",
        help="the fleet at a glance, from its monitor's Prometheus",
        description=__doc__.split("\n\n")[1],
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prometheus", metavar="URL", help="the monitor's Prometheus")
    source.add_argument(
        "-i", "--inventory", metavar="INVENTORY", help="find the Prometheus of its monitor host"
    )
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.add_argument(
        "--watch", type=float, nargs="?", const=5.0, default=None, metavar="SECONDS",
        help="redraw every SECONDS (5 when not given) until interrupted",
    )  # fmt: skip
    parser.add_argument(
        "--window", default="5m", help="the window of rates and TTFT quantiles (default 5m)"
    )
    parser.set_defaults(func=_run)
