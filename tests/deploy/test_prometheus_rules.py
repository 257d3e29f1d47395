"""deploy/prometheus/alerts.yml: valid rules, a runbook on every alert, and a promtool unit
test per alert that fires on the fault series and one that stays silent on normal ones."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml
from support.prometheus import ALERT_TESTS, ALERTS, alert_rules, require


def test_promtool_check_rules_accepts_the_alerts() -> None:
    promtool = require("promtool")
    result = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_every_alert_has_severity_summary_and_a_runbook() -> None:
    rules = alert_rules()
    assert len({r["alert"] for r in rules}) == len(rules), "alert names must be unique"
    for rule in rules:
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        annotations = rule["annotations"]
        for key in ("summary", "description", "runbook"):
            assert annotations.get(key, "").strip(), f"{rule['alert']} lacks {key}"


def test_every_alert_has_a_firing_and_a_silent_unit_test() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for case in yaml.safe_load(ALERT_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    names = {r["alert"] for r in alert_rules()}
    assert names - firing == set(), "alerts without a test where they fire"
    assert names - silent == set(), "alerts without a test where they stay silent"


def test_promtool_unit_tests_pass(tmp_path: Path) -> None:
    promtool = require("promtool")
    # promtool compares annotations verbatim; the templates are checked above, so the unit
    # tests run against the same rules without them.
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(rules))
    (tmp_path / "alerts_test.yml").write_text(ALERT_TESTS.read_text())
    result = subprocess.run(
        [promtool, "test", "rules", str(tmp_path / "alerts_test.yml")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
