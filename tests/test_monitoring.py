"""Monitoring (k8s/monitoring): what holds without promtool.

`make k8s-check` runs promtool on the same files: the rules parse, their unit tests
(rules_test.yaml) pass, every dashboard query parses. Here: every metric and label the rules, the
dashboard and the GPU overlay's KEDA triggers use exists (in service/metrics.py, or in
kube-state-metrics for readiness); the
PrometheusRule carries exactly the rules of rules.yaml; the dashboard is well-formed and shows
every metric; the constants the rules hard-code agree with the settings and manifests they stand
for; every alert has unit tests that fire and that do not.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from service.metrics import LATENCY_BUCKETS, Metrics
from tests.helpers import render

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "k8s" / "monitoring"
BASE = ROOT / "k8s" / "base"
# Labels that scraping adds to every series (job, instance; the Prometheus Operator the rest).
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "endpoint", "container"}
# The kube-state-metrics series that rules and dashboard read, with their own labels.
KUBE_STATE_METRICS = {
    "kube_pod_status_ready": {"namespace", "pod", "uid", "condition"},
    "kube_pod_status_phase": {"namespace", "pod", "uid", "phase"},
    "kube_deployment_spec_replicas": {"namespace", "deployment"},
    "kube_deployment_status_replicas_available": {"namespace", "deployment"},
}
# Grafana's own variables; any other $name must be one of the dashboard's.
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range"}
# The kubectl apply limit on its last-applied annotation, which holds the whole ConfigMap.
LAST_APPLIED_LIMIT = 262_144

METRIC = re.compile(r"\b(?:inference|kube)_[a-z0-9_]+\b")
SELECTOR = re.compile(r"\b((?:inference|kube)_[a-z0-9_]+)\s*\{([^}]*)\}")
MATCHER = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)\s*\"")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")
LABEL_VALUES = re.compile(r"label_values\((.+),\s*\w+\s*\)")


def load_rules() -> dict:
    return yaml.safe_load((MONITORING / "rules.yaml").read_text())


def alerts() -> dict[str, dict]:
    return {r["alert"]: r for g in load_rules()["groups"] for r in g["rules"] if "alert" in r}


def load_dashboard() -> dict:
    return json.loads((MONITORING / "dashboard.json").read_text())


def panels(dashboard: dict) -> list[dict]:
    """Every panel, those inside (collapsed) rows included; rows themselves too."""
    out, todo = [], list(dashboard["panels"])
    while todo:
        panel = todo.pop(0)
        out.append(panel)
        todo.extend(panel.get("panels", []))
    return out


def queries() -> dict[str, str]:
    """Where -> PromQL, for every alert, panel query and query variable's selector."""
    out = {f"rules.yaml {name}": rule["expr"] for name, rule in alerts().items()}
    dashboard = load_dashboard()
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            out[f"dashboard.json panel {panel['title']!r} {target['refId']}"] = target["expr"]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            m = LABEL_VALUES.fullmatch(var["query"]["query"])
            assert m, f"variable {var['name']}: expected label_values(<selector>, <label>)"
            out[f"dashboard.json variable {var['name']}"] = m.group(1)
    for doc in render("k8s/overlays/gpu"):
        if doc["kind"] == "ScaledObject":
            for trigger in doc["spec"]["triggers"]:
                if trigger["type"] == "prometheus":
                    out[f"ScaledObject trigger {trigger['name']}"] = trigger["metadata"]["query"]
    return out


@pytest.fixture(scope="module")
def series_labels() -> dict[str, set[str]]:
    """Series name -> label names, from the service's own registry: one child per labelled metric
    makes every family show its series (`_total`, `_bucket` with `le`, ...) and their labels."""
    metrics = Metrics()
    for collector in vars(metrics).values():
        # prometheus_client keeps a metric's label names only in this attribute.
        if isinstance(collector, MetricWrapperBase) and collector._labelnames:
            collector.labels(*collector._labelnames)
    out: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        assert family.samples, f"{family.name}: not an attribute of Metrics, its series are unknown"
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


# -- names ----------------------------------------------------------------------------------------


def test_every_metric_used_exists(series_labels: dict[str, set[str]]) -> None:
    missing = [
        f"{where}: {name}"
        for where, expr in queries().items()
        for name in METRIC.findall(expr)
        if name not in series_labels and name not in KUBE_STATE_METRICS
    ]
    assert not missing, "unknown metrics (service/metrics.py names them):\n" + "\n".join(missing)


def test_every_label_used_exists(series_labels: dict[str, set[str]]) -> None:
    known = {**{k: v | TARGET_LABELS for k, v in series_labels.items()}, **KUBE_STATE_METRICS}
    wrong = []
    for where, expr in queries().items():
        for name, body in SELECTOR.findall(expr):
            labels = known.get(name, set()) | {"job", "instance"}
            wrong += [f"{where}: {name}{{{label}}}" for label in MATCHER.findall(body) if label not in labels]
        in_expr = set().union(*(known.get(name, set()) for name in METRIC.findall(expr)), TARGET_LABELS)
        for group in GROUPING.findall(expr):
            wrong += [f"{where}: ({label})" for label in re.findall(r"\w+", group) if label not in in_expr]
    assert not wrong, "labels no series of the expression has:\n" + "\n".join(wrong)


def test_dashboard_shows_every_service_metric() -> None:
    text = json.dumps(load_dashboard())
    unseen = [f.name for f in Metrics().registry.collect() if not re.search(rf"\b{f.name}(_\w+)?\b", text)]
    assert not unseen, f"metrics the dashboard does not show: {unseen}"


# -- the two rule files ---------------------------------------------------------------------------


def test_prometheusrule_carries_the_rules_of_rules_yaml() -> None:
    resource = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    assert (resource["apiVersion"], resource["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert resource["spec"] == load_rules(), "regenerate: python .ci/k8s_check.py --write-prometheusrule"


def test_kustomization_renders_rule_and_dashboard() -> None:
    docs = {d["kind"]: d for d in render("k8s/monitoring")}
    assert set(docs) == {"PrometheusRule", "ConfigMap"}
    assert docs["PrometheusRule"]["spec"] == load_rules()
    config_map = docs["ConfigMap"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1", "the Grafana sidecar's label"
    (text,) = config_map["data"].values()
    assert json.loads(text) == load_dashboard()
    assert len(json.dumps(config_map)) < LAST_APPLIED_LIMIT, "too big for kubectl apply's annotation"


# -- alerts ---------------------------------------------------------------------------------------


def test_alerts_are_complete() -> None:
    assert len(alerts()) >= 6
    for name, rule in alerts().items():
        assert name.startswith("TransformerServe"), name
        assert re.fullmatch(r"\d+m", rule.get("for", "")), f"{name}: `for` in minutes"
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name


def test_every_alert_has_tests_that_fire_and_that_do_not() -> None:
    tests = yaml.safe_load((MONITORING / "rules_test.yaml").read_text())
    assert tests["rule_files"] == ["rules.yaml"]
    cases = [case for test in tests["tests"] for case in test.get("alert_rule_test", [])]
    for name in alerts():
        mine = [case for case in cases if case["alertname"] == name]
        assert any(case["exp_alerts"] for case in mine), f"{name}: no case where it fires"
        assert any(not case["exp_alerts"] for case in mine), f"{name}: no case where it must not fire"
    assert {case["alertname"] for case in cases} <= set(alerts()), "tests for alerts that do not exist"


def test_queue_bound_is_serve_max_queue() -> None:
    m = re.search(
        r"inference_queue_depth\{[^}]*\}\s*>\s*([\d.]+)\s*\*\s*(\d+)", alerts()["TransformerServeQueueNearFull"]["expr"]
    )
    assert m, "QueueNearFull compares the depth with <share> * <bound>"
    share, bound = float(m.group(1)), int(m.group(2))
    assert 0 < share < 1
    for overlay in ("cpu", "gpu"):
        (config,) = [d for d in render(f"k8s/overlays/{overlay}") if d["kind"] == "ConfigMap"]
        assert int(config["data"]["SERVE_MAX_QUEUE"]) == bound, f"{overlay}: SERVE_MAX_QUEUE is not {bound}"


def test_scaler_targets_sit_below_the_refusal_bounds() -> None:
    """KEDA's per-pod targets must be reached before a pod refuses work: requests in flight below
    SERVE_MAX_IN_FLIGHT, queue depth below where TransformerServeQueueNearFull fires."""
    docs = render("k8s/overlays/gpu")
    (config,) = [d for d in docs if d["kind"] == "ConfigMap"]
    (scaled,) = [d for d in docs if d["kind"] == "ScaledObject"]
    targets = {t["name"]: float(t["metadata"]["threshold"]) for t in scaled["spec"]["triggers"] if "name" in t}
    near_full = re.search(
        r"inference_queue_depth\{[^}]*\}\s*>\s*([\d.]+)\s*\*\s*(\d+)", alerts()["TransformerServeQueueNearFull"]["expr"]
    )
    assert near_full
    assert 0 < targets["in_flight"] < int(config["data"]["SERVE_MAX_IN_FLIGHT"])
    assert 0 < targets["queue_depth"] < float(near_full.group(1)) * int(near_full.group(2))


def test_latency_threshold_is_a_bucket_bound() -> None:
    m = re.search(r"\)\s*>\s*([\d.]+)\s*$", alerts()["TransformerServeHighLatencyP99"]["expr"].strip())
    assert m, "HighLatencyP99 ends with `> <seconds>`"
    assert float(m.group(1)) in LATENCY_BUCKETS, "between two bucket bounds histogram_quantile only interpolates"


def test_rules_select_the_objects_of_k8s_base() -> None:
    service = yaml.safe_load((BASE / "service.yaml").read_text())["metadata"]["name"]
    deployment = yaml.safe_load((BASE / "deployment.yaml").read_text())["metadata"]["name"]
    for name, rule in alerts().items():
        expr = rule["expr"]
        for metric, body in SELECTOR.findall(expr):
            if metric.startswith("inference_"):
                assert f'job="{service}"' in body, f'{name}: {metric} without job="{service}" (the Service)'
        for value in re.findall(r'deployment="([^"]*)"', expr):
            assert value == deployment, name
        for value in re.findall(r'pod=~"([^"]*)"', expr):
            assert re.fullmatch(value, f"{deployment}-6b7f9c5d4-x2x4q"), f"{name}: pods of {deployment}"


def test_servicemonitor_keeps_the_route_in_endpoint() -> None:
    """The operator's `endpoint` target label (the port name) must not hide the route label."""
    monitor = yaml.safe_load((BASE / "servicemonitor.yaml").read_text())
    for endpoint in monitor["spec"]["endpoints"]:
        relabel = endpoint.get("metricRelabelings", [])
        assert {
            "sourceLabels": ["exported_endpoint"],
            "regex": "(.+)",
            "targetLabel": "endpoint",
            "replacement": "$1",
            "action": "replace",
        } in relabel
        assert {"regex": "exported_endpoint", "action": "labeldrop"} in relabel


# -- dashboard ------------------------------------------------------------------------------------


def test_dashboard_is_well_formed() -> None:
    dashboard = load_dashboard()
    assert dashboard["uid"] and dashboard["title"]
    names = {v["name"] for v in dashboard["templating"]["list"]}
    assert "datasource" in names
    all_panels = panels(dashboard)
    ids = [p["id"] for p in all_panels]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    shown = [p for p in all_panels if p["type"] != "row"]
    assert shown
    for panel in shown:
        assert panel.get("title"), f"panel {panel['id']} has no title"
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        targets = panel.get("targets", [])
        assert targets, f"{panel['title']}: no query"
        assert len({t["refId"] for t in targets}) == len(targets), panel["title"]
        for target in targets:
            assert target.get("expr", "").strip(), f"{panel['title']} {target['refId']}: empty query"
            used = {a or b or c for a, b, c in VARIABLE.findall(target["expr"])}
            assert used <= names | GRAFANA_BUILTINS, f"{panel['title']}: undefined {used - names - GRAFANA_BUILTINS}"
