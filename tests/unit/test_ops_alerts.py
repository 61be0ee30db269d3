"""The Prometheus alert rules (docker/prometheus/alerts.yml): valid for ``promtool check rules``, each one
fired and kept silent by the unit tests beside them (``promtool test rules alerts.test.yml``), built only on
metrics the daemon exports, loaded by the shipped Prometheus configuration and listed in docs/operations.md.

promtool comes with Debian's ``prometheus`` package; ``make test`` installs it when missing (``make
tools``), and so does this test when it runs as root on a machine with apt-get.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import yaml

from tests.unit.test_ops_dashboard import DOCKER, METRIC_NAME, exported_series

PROMETHEUS = DOCKER / "prometheus"
RULES = PROMETHEUS / "alerts.yml"
RULE_TESTS = PROMETHEUS / "alerts.test.yml"
OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
JOB = "ticdc-applier"
NOT_OURS = {"up"}  # Prometheus's own series for every target


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "prometheus"], check=True, env=env
        )
        found = shutil.which("promtool")
    assert found, "promtool is missing: run `make tools` (apt-get install prometheus)"
    return found


def _rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def test_promtool_checks_the_rules_and_the_configuration_that_loads_them() -> None:
    promtool = _promtool()
    rules = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in rules.stdout
    config = subprocess.run(
        [promtool, "check", "config", str(PROMETHEUS / "prometheus.yml")], capture_output=True, text=True
    )
    assert config.returncode == 0, config.stdout + config.stderr
    assert "SUCCESS: 1 rule files found" in config.stdout


def test_promtool_unit_tests_fire_and_silence_every_alert() -> None:
    run = subprocess.run([_promtool(), "test", "rules", str(RULE_TESTS)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    tested = {
        case["alertname"]
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test["alert_rule_test"]
        if case.get("exp_alerts")
    }
    assert tested == {rule["alert"] for rule in _rules()}


def test_every_rule_names_metrics_the_daemon_exports() -> None:
    exported = exported_series()
    for rule in _rules():
        named = set(METRIC_NAME.findall(rule["expr"]))
        has_up = re.search(r"\bup\{", rule["expr"])
        assert named or has_up, f"{rule['alert']}: {rule['expr']!r} names no metric"
        unknown = sorted(named - exported)
        assert not unknown, f"{rule['alert']}: {unknown} not exported by the daemon"
        # Series other exporters have too (up, process_*) are the applier's only in its job.
        for other in set(re.findall(r"\b(up|process_[a-z_]+)\b", rule["expr"])):
            assert re.search(rf'\b{other}\{{job="{JOB}"\}}', rule["expr"]), (rule["alert"], other)
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert {"summary", "description"} <= set(rule["annotations"])
    assert NOT_OURS.isdisjoint(exported)


def test_the_shipped_prometheus_loads_the_rules_and_scrapes_the_job_they_name() -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    assert [job["job_name"] for job in config["scrape_configs"]] == [JOB]
    assert all("changefeed" in sc["labels"] for sc in config["scrape_configs"][0]["static_configs"])
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    mounts = dict(v.split(":")[:2] for v in compose["services"]["prometheus"]["volumes"])
    assert mounts["./prometheus/alerts.yml"] == "/etc/prometheus/alerts.yml"  # beside prometheus.yml


def test_operations_doc_lists_every_alert() -> None:
    text = OPERATIONS.read_text()
    for rule in _rules():
        assert f"`{rule['alert']}`" in text, rule["alert"]
