"""The metric names a PromQL expression queries (socketwise.common.promql), and the fleet
dashboard's queries read with it: every expression selects a metric, and the set of metrics
the dashboard needs is written out here, so that an edit to the dashboard shows up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from socketwise.common.promql import (
    dashboard_expressions,
    metric_names,
    rule_expressions,
)

DASHBOARD = (
    Path(__file__).resolve().parents[1] / "roles/monitor/files/grafana/socketwise-fleet.json"
)
ENGINE_FILTER = 'model=~"$model", host=~"$host", socketwise_instance=~"$socketwise_instance"'

# What the dashboard queries, from the three jobs' exporters: vLLM (socketwise-engines),
# node exporter (socketwise-nodes), HAProxy (socketwise-doors), and Prometheus itself.
DASHBOARD_METRICS = {
    "ALERTS",
    "up",
    "node_cpu_seconds_total",
    "node_memory_MemAvailable_bytes",
    "node_memory_MemTotal_bytes",
    "haproxy_backend_active_servers",
    "haproxy_frontend_http_responses_total",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:num_preemptions_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
}


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            "histogram_quantile(0.99, sum by (le, host) (rate("
            'vllm:time_to_first_token_seconds_bucket{job="socketwise-engines"}[5m])))',
            {"vllm:time_to_first_token_seconds_bucket"},
        ),
        ('count(up{job="x"} == 1)', {"up"}),
        ('ALERTS{alertstate="firing"}', {"ALERTS"}),
        ("up", {"up"}),
        (
            "rate(vllm:prefix_cache_hits_total[5m]) / rate(vllm:prefix_cache_queries_total[5m])",
            {"vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"},
        ),
        # A label value, single or double quoted, that looks like a metric is not one.
        ('up{job="vllm:num_requests_running"}', {"up"}),
        ("up{job='node_cpu_seconds_total', mode=~\"idle|node_load1\"}", {"up"}),
        ('label_replace(up, "dst", "node_load1", "src", "(.*)")', {"up"}),
        # A `}` or `,` inside a label value does not end the block.
        ('up{job="a}b,c", instance!="x"} > 0', {"up"}),
        # Label names in grouping and matching clauses, before or after the operand.
        ("sum(rate(node_cpu_seconds_total[5m])) by (host, mode)", {"node_cpu_seconds_total"}),
        ("sum without (instance, cpu) (node_cpu_seconds_total)", {"node_cpu_seconds_total"}),
        (
            "node_memory_MemAvailable_bytes / on (host) group_left (layout) "
            "node_memory_MemTotal_bytes",
            {"node_memory_MemAvailable_bytes", "node_memory_MemTotal_bytes"},
        ),
        ("a * ignoring(code) group_right b", {"a", "b"}),
        # Keywords in any case, numbers, durations, offsets, subqueries and `@` modifiers.
        ("SUM BY (host) (up) > bool 1e3 and Inf", {"up"}),
        ("up offset 1h30m unless up offset -5m", {"up"}),
        ("max_over_time(rate(x_total[5m])[1h:1m]) @ start() > 0x1F", {"x_total"}),
        ("topk(5, quantile_over_time(0.9, latency_seconds[10m]))", {"latency_seconds"}),
        ('count_values("version", build_info)', {"build_info"}),
        ("time() - process_start_time_seconds", {"process_start_time_seconds"}),
        ("vector(1) + scalar(sum(up))", {"up"}),
        # A selector that names its metric only inside the label block.
        ('{__name__="up", job="x"}', {"up"}),
        ('{__name__=~"vllm:.*"}', set()),
        ("1 + 2", set()),
    ],
)
def test_metric_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_dashboard_expressions_reads_collapsed_rows() -> None:
    dashboard = {
        "panels": [
            {"type": "stat", "targets": [{"refId": "A", "expr": "up"}]},
            {
                "type": "row",
                "collapsed": True,
                "panels": [{"targets": [{"refId": "A", "expr": "a"}, {"refId": "B"}]}],
            },
        ]
    }
    assert dashboard_expressions(dashboard) == ["up", "a"]


def test_rule_expressions() -> None:
    rules = {
        "groups": [
            {"name": "g", "rules": [{"record": "r", "expr": "sum(a)"}]},
            {"name": "h", "rules": [{"alert": "Down", "expr": "up == 0", "for": "5m"}]},
        ]
    }
    assert rule_expressions(rules) == ["sum(a)", "up == 0"]


def _load_dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _all_panels(panels: list[dict]) -> list[dict]:
    return [p for panel in panels for p in [panel, *_all_panels(panel.get("panels") or [])]]


def test_dashboard_queries_the_expected_metrics() -> None:
    dashboard = _load_dashboard()
    expressions = dashboard_expressions(dashboard)
    assert expressions
    for expr in expressions:
        assert metric_names(expr), f"selects no metric: {expr}"
    assert set().union(*map(metric_names, expressions)) == DASHBOARD_METRICS


def test_dashboard_panels() -> None:
    dashboard = _load_dashboard()
    assert (dashboard["uid"], dashboard["title"], dashboard["schemaVersion"]) == (
        "socketwise-fleet",
        "socketwise fleet",
        39,
    )
    panels = _all_panels(dashboard["panels"])
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {sorted(ids)}"
    assert [p["title"] for p in panels if p["type"] == "row"] == [
        "Fleet overview",
        "Per host",
        "Per engine",
    ]
    occupied: dict[tuple[int, int], str] = {}
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in occupied, f"{panel['title']} overlaps {occupied[x, y]}"
                occupied[x, y] = panel["title"]
        if panel["type"] != "row":
            assert panel["type"] in ("stat", "timeseries")
            refs = [target["refId"] for target in panel["targets"]]
            assert len(refs) == len(set(refs)) and all(t["expr"] for t in panel["targets"])


def test_dashboard_engine_panels_follow_the_variables() -> None:
    """Below the "Per engine" row, every query selects the chosen hosts and engines."""
    panels = _load_dashboard()["panels"]
    start = next(i for i, p in enumerate(panels) if p.get("title") == "Per engine")
    engine_exprs = dashboard_expressions({"panels": panels[start:]})
    assert engine_exprs
    for expr in engine_exprs:
        selectors = expr.count("vllm:")
        assert expr.count(ENGINE_FILTER) == selectors, expr
    variables = {v["name"]: v for v in _load_dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("model", "host", "socketwise_instance"):
        assert variables[name]["multi"] and variables[name]["includeAll"]


def test_the_dashboard_shows_the_models_chosen_and_their_hosts() -> None:
    """A fleet of many models: every series the dashboard reads but the alerts is of the
    chosen models (the targets' `model` label), and the host list is theirs."""
    dashboard = _load_dashboard()
    for expr in dashboard_expressions(dashboard):
        for name in metric_names(expr) - {"ALERTS"}:
            at = [i for i in range(len(expr)) if expr.startswith(name, i)]
            for start in at:
                selector = expr[start + len(name) :].split("}", 1)[0]
                assert selector.startswith("{") and 'model=~"$model"' in selector, expr
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["model"]["query"] == 'label_values(up{job="socketwise-engines"}, model)'
    assert 'model=~"$model"' in variables["host"]["query"]
