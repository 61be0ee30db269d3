"""The Grafana dashboard (docker/grafana/dashboards/ticdc-applier.json) shows only what the daemon
exports: a renamed or removed metric would otherwise leave an empty panel nobody notices. The
provisioning that compose mounts points at the dashboard's folder and the Prometheus service.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from applier.ops.metrics import MetricsObserver

DOCKER = Path(__file__).resolve().parents[2] / "docker"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "ticdc-applier.json"
METRIC_NAME = re.compile(r"\b((?:applier|process)_[a-z0-9_]+)\b")
SERIES_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count", ""),
    "info": ("_info",),
}
# What the dashboard's panels are for (issue list of the operators' view); each must have a panel.
PANEL_METRICS = (
    "applier_lag_seconds",
    "applier_rows_applied_total",
    "applier_window_rows_bucket",
    "applier_downstream_retries_total",
    "applier_partition_cached_bytes",
    "applier_partition_resolved_ts",
)


def exported_series() -> set[str]:
    """Every series name a scrape of the daemon can show, including a labelled family's that has no
    sample yet (its TYPE line is there, its samples come with the first label values)."""
    text = MetricsObserver().render().decode()
    names = set()
    for family in text_string_to_metric_families(text):
        suffixes = SERIES_SUFFIXES.get(family.type, ("",))
        names.update(family.name + s for s in suffixes)
        names.update(s.name for s in family.samples)
    return names


def expressions(dashboard: dict) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]


def test_every_expression_names_metrics_the_daemon_exports() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = exported_series()
    exprs = expressions(dashboard)
    assert exprs
    for title, expr in exprs:
        named = METRIC_NAME.findall(expr)
        assert named, f"panel {title!r}: {expr!r} names no metric"
        unknown = sorted(set(named) - exported)
        assert not unknown, f"panel {title!r}: {unknown} not exported by the daemon"
    shown = {name for _, expr in exprs for name in METRIC_NAME.findall(expr)}
    assert set(PANEL_METRICS) <= shown


def test_the_check_is_not_vacuous() -> None:
    exported = exported_series()
    assert "applier_rows_applied_total" in exported and "applier_batch_seconds_bucket" in exported
    assert "applier_rows_applied" not in exported and "applier_no_such_metric" not in exported


def test_panels_are_well_formed_and_use_the_templated_data_source() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "ticdc-applier"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "instance"} <= variables
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert 'instance=~"$instance"' in target["expr"], (panel["title"], target["expr"])


def test_compose_provisions_prometheus_and_the_dashboard() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    mounts = dict(v.split(":")[:2] for v in services["grafana"]["volumes"])
    provider = yaml.safe_load((DOCKER / "grafana/provisioning/dashboards/applier.yaml").read_text())
    # The provider reads the folder compose mounts the repository's dashboards at.
    assert mounts["./grafana/dashboards"] == provider["providers"][0]["options"]["path"]
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    source = yaml.safe_load((DOCKER / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    assert source["datasources"][0]["url"] == "http://prometheus:9090" and "prometheus" in services
    prometheus_mounts = dict(v.split(":")[:2] for v in services["prometheus"]["volumes"])
    assert prometheus_mounts["./prometheus/prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    scrape = yaml.safe_load((DOCKER / "prometheus/prometheus.yml").read_text())
    targets = scrape["scrape_configs"][0]["static_configs"][0]["targets"]
    port = services["applier"]["environment"]["APPLIER_HTTP_LISTEN"].rsplit(":", 1)[1]
    assert f"applier:{port}" in targets
