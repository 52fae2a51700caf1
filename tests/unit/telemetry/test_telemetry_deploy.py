"""The observability deployment files: the dashboard asks only for metrics that exist, Prometheus finds the workers."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from workers.telemetry import render_metrics
from workers.telemetry.metrics import STEP_KINDS

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "agent-runner.json"


LABELS = {"agent_id", "kind", "status", "action", "outcome", "sweep", "le"}
"""Every label of the runner's metrics (see workers/telemetry/metrics.py), and `le` of histograms."""


def _exposed() -> set[str]:
    """Sample names of this project's metrics, from the families in the metrics text."""
    text = render_metrics()[0].decode()
    names: set[str] = set()
    for name, kind in re.findall(r"^# TYPE (agent_runner_\w+) (\w+)$", text, flags=re.MULTILINE):
        if kind == "histogram":
            names.update(f"{name}{suffix}" for suffix in ("_bucket", "_count", "_sum"))
        elif kind == "counter":
            names.add(name)
    return names


def _targets(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]


def test_the_dashboard_queries_only_metrics_and_labels_the_runner_exposes() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    names = _exposed()
    assert {"agent_runner_steps_total", "agent_runner_queue_delay_seconds_bucket"} <= names
    expressions = _targets(dashboard)
    assert expressions
    for expr in expressions:
        used = set(re.findall(r"\bagent_runner_\w+", expr))
        assert used and used <= names, expr
        for group in re.findall(r"by \(([^)]*)\)", expr):
            assert {label.strip() for label in group.split(",")} <= LABELS, expr
    variable_queries = [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    assert variable_queries == ["label_values(agent_runner_steps_total, agent_id)"]


def test_the_dashboard_shows_what_an_operator_watches() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    titles = [p["title"] for p in dashboard["panels"]]
    for wanted in (
        "Steps per second",
        "Step latency p50 / p99",
        "Turns ended by status",
        "Retries scheduled and lease takeovers",
        "Queue delay p50 / p99",
        "Lease takeovers (range)",
    ):
        assert wanted in titles
    exprs = " ".join(_targets(dashboard))
    assert "histogram_quantile(0.99" in exprs and "histogram_quantile(0.5" in exprs
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    kinds_panel = next(p for p in dashboard["panels"] if p["title"] == "Steps per second by kind")
    assert all(kind in kinds_panel["description"] for kind in STEP_KINDS)


def test_prometheus_scrapes_the_workers_on_the_port_they_serve() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    worker = jobs["agent-runner-worker"]["dns_sd_configs"][0]
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    port = compose["x-app"]["environment"]["AGENT_RUNNER_METRICS_PORT"]
    assert port == "${AGENT_RUNNER_METRICS_PORT:-9464}"
    assert worker["names"] == ["worker"] and worker["port"] == 9464
    assert "worker" in compose["services"]


def test_the_observability_services_mount_files_that_exist() -> None:
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    for name in ("prometheus", "grafana", "jaeger"):
        assert services[name]["profiles"] == ["observability"]
        for volume in services[name].get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), volume
    provisioning = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "dashboards" / "agent-runner.yaml").read_text()
    )
    assert provisioning["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def test_kubernetes_workers_expose_and_announce_the_metrics_port() -> None:
    deployment = yaml.safe_load((DEPLOY / "k8s" / "worker-deployment.yaml").read_text())
    template = deployment["spec"]["template"]
    config = yaml.safe_load((DEPLOY / "k8s" / "configmap.yaml").read_text())["data"]
    assert template["metadata"]["annotations"]["prometheus.io/port"] == config["AGENT_RUNNER_METRICS_PORT"]
    (container,) = template["spec"]["containers"]
    assert container["ports"] == [{"name": "metrics", "containerPort": int(config["AGENT_RUNNER_METRICS_PORT"])}]
