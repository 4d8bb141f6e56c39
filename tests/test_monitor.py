"""What a monitor scrapes, from the plans (socketwise.serve.monitor), and how
`socketwise status` shows it (socketwise.measure.status). The lab proves both against a
real Prometheus (tests/test_rollout_lab.py)."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from socketwise.measure.status import collect, monitor_url, table
from socketwise.serve.monitor import duration_seconds, retention_bytes, scrape_targets

from .playbooks import REPO, kit_plugin, run_playbook

DP = {"layout": "dp", "instances": [{"name": "vllm-dp0"}, {"name": "vllm-dp1"}]}


def test_every_planned_engine_is_a_target_with_the_kits_labels():
    jobs = scrape_targets(
        [
            {
                "host": "h1",
                "address": "10.0.0.1",
                "port": 9180,
                "plan": DP,
                "hardware_class": "amx",
                "model": "tiny-llama",
            }
        ],
        [{"host": "lb", "address": "fd00::5", "port": "9181"}],
    )
    engines = jobs["socketwise-engines"]
    assert [e["labels"]["socketwise_instance"] for e in engines] == ["vllm-dp0", "vllm-dp1"]
    assert engines[1] == {
        "targets": ["10.0.0.1:9180"],
        "labels": {
            "__metrics_path__": "/metrics/vllm-dp1",
            "instance": "h1/vllm-dp1",
            "host": "h1",
            "layout": "dp",
            "hardware_class": "amx",
            "cluster": "",
            "model": "tiny-llama",
            "socketwise_instance": "vllm-dp1",
        },
    }
    [node] = jobs["socketwise-nodes"]
    assert node["labels"]["__metrics_path__"] == "/metrics/node"
    assert "socketwise_instance" not in node["labels"]
    doors = {d["labels"]["host"]: d for d in jobs["socketwise-doors"]}
    assert (
        doors["lb"]["targets"] == ["[fd00::5]:9181"] and doors["lb"]["labels"]["layout"] == "fleet"
    )
    assert doors["h1"]["labels"]["__metrics_path__"] == "/metrics/door"
    # A fleet of many models: each host's series carry its model, the fleet door's none.
    assert node["labels"]["model"] == doors["h1"]["labels"]["model"] == "tiny-llama"
    assert doors["lb"]["labels"]["model"] == ""


def test_a_cluster_is_scraped_at_its_heads_engine_and_every_members_node_and_door():
    """Through the monitor role's filter, from hostvars as deploy.yml leaves them: a vLLM
    follower or an RPC server has no /metrics, the head's engine speaks for the pipeline;
    a member the cluster's plan leaves out is not scraped."""
    plugin = kit_plugin("filter.monitor")
    plan = {"layout": "pp", "head": "c1", "hosts": [{"host": "c1"}, {"host": "c2"}]}
    member = {"socketwise_cluster": "a", "socketwise_engine": "llamacpp",
              "socketwise_cluster_plan": plan, "door_metrics_port": "9180"}  # fmt: skip
    hostvars = {
        name: member | {"door_metrics_address": address}
        for name, address in [("c1", "10.0.0.1"), ("c2", "10.0.0.2"), ("c3", "10.0.0.3")]
    }
    jobs = plugin.socketwise_scrape_targets(["c1", "c2", "c3"], [], hostvars)
    [engine] = jobs["socketwise-engines"]
    assert engine["targets"] == ["10.0.0.1:9180"]
    assert engine["labels"] | {"hardware_class": ""} == {
        "__metrics_path__": "/metrics/llamacpp",
        "instance": "c1/llamacpp",
        "host": "c1",
        "layout": "pp",
        "hardware_class": "",
        "cluster": "a",
        # As the vllm role names the built-in model it serves (no model variable given).
        "model": "tiny-llama",
        "socketwise_instance": "llamacpp",
    }
    for job in ("socketwise-nodes", "socketwise-doors"):
        assert [t["labels"]["host"] for t in jobs[job]] == ["c1", "c2"]
        assert {t["labels"]["cluster"] for t in jobs[job]} == {"a"}


def test_retention_is_a_share_of_the_disk_and_never_below_a_gib():
    assert retention_bytes(100 << 30, 0.5) == 50 << 30
    assert retention_bytes(1 << 30, 0.5) == 1 << 30
    with pytest.raises(ValueError, match="fraction"):
        retention_bytes(100 << 30, 1.5)


@pytest.mark.parametrize(
    ("given", "seconds"), [("15s", 15), ("5m", 300), ("500ms", 0.5), ("15d", 1296000)]
)
def test_prometheus_durations_read_as_seconds(given, seconds):
    assert duration_seconds(given) == seconds


@pytest.mark.parametrize("given", ["15", "s", "1.5m", "5 m", "-5s"])
def test_a_duration_prometheus_would_not_read_is_refused(given):
    with pytest.raises(ValueError, match="not a Prometheus duration"):
        duration_seconds(given)


def test_status_shows_a_down_engine_with_its_alert_and_dashes_for_missing_figures():
    engine = {
        "host": "h1", "socketwise_instance": "vllm-sn", "model": "", "layout": "sn", "up": False,
        "running": None, "waiting": None, "output_tok_s": None, "kv_cache_usage": None,
        "ttft_p50_s": None, "ttft_p99_s": None, "alerts": ["SocketwiseEngineDown"],
    }  # fmt: skip
    serving = engine | {
        "socketwise_instance": "vllm-dp0", "model": "chat", "layout": "dp", "up": True,
        "running": 3.0,
        "waiting": 0.0, "output_tok_s": 812.25, "kv_cache_usage": 0.42, "ttft_p50_s": 0.12,
        "ttft_p99_s": 0.9, "alerts": [],
    }  # fmt: skip
    alert = {
        "alertname": "SocketwiseEngineDown", "severity": "critical", "host": "h1",
        "socketwise_instance": "vllm-sn", "summary": "h1: engine vllm-sn does not answer",
    }  # fmt: skip
    shown = table(
        {"prometheus": "http://p:9090", "window": "5m", "engines": [engine, serving],
         "alerts": [alert]}
    )  # fmt: skip
    header, down, up = shown.splitlines()[:3]
    assert header.split()[:5] == ["HOST", "ENGINE", "MODEL", "LAYOUT", "UP"]
    assert down.split() == [
        "h1",
        "vllm-sn",
        "-",
        "sn",
        "DOWN",
        *["-"] * 5,
        "-",
        "SocketwiseEngineDown",
    ]
    assert up.split() == [
        "h1",
        "vllm-dp0",
        "chat",
        "dp",
        "up",
        "3",
        "0",
        "812.2",
        "42%",
        "120",
        "ms",
        "900",
        "ms",
        "-",
    ]
    assert "1 alert(s) firing\n  critical SocketwiseEngineDown: h1: engine vllm-sn" in shown


# Two hosts' engines and alerts as their monitor's Prometheus answers (the README says
# which is which).
STATUS = Path(__file__).parent / "fixtures" / "prometheus-status"


class _Prometheus(BaseHTTPRequestHandler):
    queries = json.loads((STATUS / "query.json").read_text())
    alerts = json.loads((STATUS / "alerts.json").read_text())

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/api/v1/alerts":
            answer = self.alerts
        elif url.path == "/api/v1/query":
            [query] = urllib.parse.parse_qs(url.query)["query"]
            known = [answer for reads, answer in self.queries.items() if reads in query]
            # Refused with 200, not Prometheus' 400, so status's error names the query.
            refused = {"status": "error", "errorType": "bad_data", "error": "no answer here"}
            answer = known[0] if len(known) == 1 else refused
        else:
            self.send_error(404)
            return
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def prometheus() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Prometheus)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_status_has_a_row_with_its_figures_for_every_engine_of_every_host(prometheus):
    engines = collect(prometheus)["engines"]
    h1 = {"host": "h1", "layout": "dp", "model": "tiny-llama", "hardware_class": "amx", "up": True}
    h2 = {"host": "h2", "layout": "dp", "model": "org/tiny-llama-0.5g", "hardware_class": "avx512"}
    assert [{k: v for k, v in e.items() if k != "alerts"} for e in engines] == [
        h1 | {"socketwise_instance": "vllm-dp0", "running": 3.0, "waiting": 0.0,
              "output_tok_s": 812.25, "kv_cache_usage": 0.42, "ttft_p50_s": 0.12,
              "ttft_p99_s": 0.9},
        h1 | {"socketwise_instance": "vllm-dp1", "running": 5.0, "waiting": 2.0,
              "output_tok_s": 640.5, "kv_cache_usage": 0.97, "ttft_p50_s": 0.2,
              "ttft_p99_s": 1.6},
        # Idle: Prometheus' TTFT quantiles are NaN without a request in the window.
        h2 | {"socketwise_instance": "vllm-dp0", "up": True, "running": 0.0, "waiting": 0.0,
              "output_tok_s": 0.0, "kv_cache_usage": 0.0, "ttft_p50_s": None,
              "ttft_p99_s": None},
        # Down: only its up sample, no figure.
        h2 | {"socketwise_instance": "vllm-dp1", "up": False, "running": None, "waiting": None,
              "output_tok_s": None, "kv_cache_usage": None, "ttft_p50_s": None,
              "ttft_p99_s": None},
    ]  # fmt: skip


def test_an_engines_alert_shows_on_its_row_and_a_hosts_alert_on_every_engine_of_that_host(
    prometheus,
):
    """SocketwiseNodeMemoryLow and SocketwiseOperationInProgress name a host and no
    engine; the other host's engines of the same names do not get them."""
    engines = collect(prometheus)["engines"]
    assert {(e["host"], e["socketwise_instance"]): sorted(e["alerts"]) for e in engines} == {
        ("h1", "vllm-dp0"): ["SocketwiseNodeMemoryLow"],
        ("h1", "vllm-dp1"): ["SocketwiseKVCacheHigh", "SocketwiseNodeMemoryLow"],
        ("h2", "vllm-dp0"): ["SocketwiseOperationInProgress"],
        ("h2", "vllm-dp1"): ["SocketwiseEngineDown", "SocketwiseOperationInProgress"],
    }


def test_status_lists_the_fleets_firing_alerts_and_not_a_pending_one(prometheus):
    """The pending SocketwiseQueueHigh on h1/vllm-dp0 is on no row and not in the list;
    the fleet door's alert is listed though no engine row is its host's."""
    alerts = collect(prometheus)["alerts"]
    assert [(a["alertname"], a["host"], a["socketwise_instance"]) for a in alerts] == [
        ("SocketwiseKVCacheHigh", "h1", "vllm-dp1"),
        ("SocketwiseNodeMemoryLow", "h1", ""),
        ("SocketwiseEngineDown", "h2", "vllm-dp1"),
        ("SocketwiseOperationInProgress", "h2", ""),
        ("SocketwiseFleetBackendDown", "lb", ""),
    ]
    assert alerts[1] == {
        "alertname": "SocketwiseNodeMemoryLow", "severity": "warning", "host": "h1",
        "socketwise_instance": "", "summary": "h1: 4.2% of its memory available",
        "active_at": "2026-01-01T00:02:00Z",
    }  # fmt: skip


def test_the_sweeps_monitor_reads_each_engine_on_its_socket(tmp_path):
    """The benchmark role's metrics URLs, as Ansible renders them: each engine's own
    /metrics on its Unix socket (the metrics door is the monitors'), which the monitor
    opens (socketwise.common.direct)."""
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars_files": [
                str(REPO / f"roles/{f}")
                for f in (
                    "door/defaults/main.yml",
                    "door/vars/main.yml",
                    "vllm_service/defaults/main.yml",
                    "vllm_service/vars/main.yml",
                    "benchmark/defaults/main.yml",
                    "benchmark/vars/main.yml",
                )
            ],  # fmt: skip
            "tasks": [{"ansible.builtin.debug": {"var": "__benchmark_metrics_urls"}}],
        }
    ]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    given = {
        "socketwise_plan": {
            "instances": [{"name": "vllm-dp0", "port": 8001}, {"name": "vllm-dp1", "port": 8002}]
        },
    }
    done = run_playbook(
        str(tmp_path / "play.yml"), "-i", "inventories/local", "-e", json.dumps(given)
    )
    assert done.returncode == 0, done.output[-2000:]
    shown = done.output.split('"__benchmark_metrics_urls": ', 1)[1].split("]", 1)[0] + "]"
    assert json.loads(shown) == [
        "http+unix://%2Frun%2Fsocketwise-vllm-dp0%2Fapi.sock/metrics",
        "http+unix://%2Frun%2Fsocketwise-vllm-dp1%2Fapi.sock/metrics",
    ]


class _Ready(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_the_monitors_readiness_wait_never_goes_through_a_proxy(tmp_path):
    """The role's own task, run with a proxy in the environment that answers nothing and
    one attempt: it reaches the local server directly."""
    tasks = yaml.safe_load((REPO / "roles/monitor/tasks/present.yml").read_text())
    [wait] = [t for t in tasks if t["name"] == "Wait until Prometheus and Alertmanager are ready"]
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ready)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    wait |= {"retries": 0, "loop": [url, url], "environment": {"http_proxy": "http://127.0.0.1:9"}}
    play = [{"name": "Wait", "hosts": "localhost", "gather_facts": False, "tasks": [wait]}]
    playbook = tmp_path / "wait.yml"
    playbook.write_text(json.dumps(play))
    try:
        done = run_playbook(str(playbook), "-i", "inventories/local")
    finally:
        server.shutdown()
    assert done.returncode == 0, done.output[-3000:]


def test_alertmanagers_webhook_url_stays_root_only_and_out_of_the_diff(tmp_path):
    """The role's own task writing Alertmanager's configuration, run with --diff as a user
    would: the file is root's alone (a webhook URL often carries a token) and the run's
    output never shows the URL."""
    tasks = yaml.safe_load((REPO / "roles/monitor/tasks/present.yml").read_text())
    [render] = [t for t in tasks if t["name"] == "Render Alertmanager's configuration"]
    dest = tmp_path / "alertmanager.yml"
    render["ansible.builtin.template"] |= {"dest": str(dest)}
    # amtool is the monitor host's, not the controller's.
    del render["ansible.builtin.template"]["validate"]
    url = "https://hooks.example/services/T0/B0/token-" + "x" * 24
    play = [{
        "name": "Render", "hosts": "localhost", "gather_facts": False,
        "vars_files": [str(REPO / "roles/monitor" / d / "main.yml") for d in ("defaults", "vars")],
        "tasks": [render],
    }]  # fmt: skip
    playbook = tmp_path / "render.yml"
    playbook.write_text(json.dumps(play))
    where = json.dumps(
        {"__monitor_templates": str(REPO / "templates"), "monitor_alert_webhook_url": url}
    )
    done = run_playbook(str(playbook), "-i", "inventories/local", "--diff", "-e", where)
    assert done.returncode == 0, done.output[-3000:]
    assert url in dest.read_text()
    assert dest.stat().st_mode & 0o777 == 0o600
    assert "token-" not in done.output


def test_status_finds_a_monitor_listening_on_an_ipv6_address(tmp_path):
    """`socketwise status -i INVENTORY` asks the first monitor's Prometheus where it
    listens: an IPv6 address goes in brackets, or the URL names no host. (Until
    2026-12-06 it failed for every monitor: Ansible 2.19 refused its question.)"""
    hosts = {"all": {"children": {"socketwise_monitor": {"hosts": {"mon-01": {
        "monitor_listen_address": "fd00::7", "monitor_prometheus_port": 9191}}}}}}  # fmt: skip
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump(hosts))
    assert monitor_url(str(inventory)) == "http://[fd00::7]:9191"
    # And where the monitor's role listens by default.
    del hosts["all"]["children"]["socketwise_monitor"]["hosts"]["mon-01"]["monitor_listen_address"]
    inventory.write_text(yaml.safe_dump(hosts))
    assert monitor_url(str(inventory)) == "http://127.0.0.1:9191"
