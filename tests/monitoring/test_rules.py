"""The alert rules shipped in roles/monitoring/files: promtool accepts them, its unit tests
(rules.test.yml: input series, the alerts expected at each time) pass, every alert has one, and
docs/operations.md says what each alert means and what to do."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.metrics import PROMTOOL_MISSING

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "roles" / "monitoring" / "files" / "lobes-fleet.rules.yml"
RULES_TEST = Path(__file__).with_name("rules.test.yml")
DASHBOARD = ROOT / "roles" / "monitoring" / "files" / "lobes-fleet-dashboard.json"
PROMTOOL = shutil.which("promtool")

needs_promtool = pytest.mark.skipif(PROMTOOL is None,
                                    reason=PROMTOOL_MISSING)


def _promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(PROMTOOL), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)


@needs_promtool
def test_promtool_check_rules_accepts_the_rules() -> None:
    done = _promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 7 rules found" in done.stdout


@needs_promtool
def test_promtool_test_rules_passes() -> None:
    done = _promtool("test", "rules", str(RULES_TEST))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_is_unit_tested() -> None:
    alerts = [rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"]
              for rule in group["rules"]]
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    tested = {case["alertname"] for test in tests for case in test["alert_rule_test"]
              if case.get("exp_alerts")}
    assert sorted(tested) == sorted(alerts)


def test_every_alert_has_a_runbook_in_operations_md() -> None:
    alerts = [rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"]
              for rule in group["rules"]]
    runbook = (ROOT / "docs" / "operations.md").read_text()
    assert [alert for alert in alerts if f"### {alert}\n" not in runbook] == []


def test_the_dashboard_is_a_grafana_dashboard_of_prometheus_queries() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert dashboard["uid"] and dashboard["schemaVersion"] >= 36
    assert len({panel["id"] for panel in panels}) == len(panels)
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}
        refs = [target["refId"] for target in panel["targets"]]
        assert refs and len(set(refs)) == len(refs)
        # Every query is per box and follows the dashboard's box variable.
        assert all('box=~"$box"' in target["expr"] and "by (" in target["expr"]
                   for target in panel["targets"]), panel["title"]
