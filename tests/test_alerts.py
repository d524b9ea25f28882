"""The alert rules (deploy/prometheus/alerts.yml), checked and unit-tested by Debian's promtool:
each alert fires on its series and stays quiet on a healthy one (deploy/prometheus/tests.yml)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

PROMETHEUS = Path(__file__).resolve().parent.parent / "deploy" / "prometheus"


@pytest.fixture(scope="module")
def promtool() -> str:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.skip("promtool not found: apt-get install prometheus (scripts/test.sh installs it)")
    return binary


def test_promtool_checks_the_rules(promtool):
    result = subprocess.run([promtool, "check", "rules", "alerts.yml"], cwd=PROMETHEUS, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 8 rules found" in result.stdout


def test_each_alert_fires_on_its_series_and_stays_quiet_on_a_healthy_one(promtool):
    result = subprocess.run([promtool, "test", "rules", "tests.yml"], cwd=PROMETHEUS, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    # every alert of the rules file has a test that expects it to fire, and one that expects quiet
    rules = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    alerts = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    cases = [case for test in yaml.safe_load((PROMETHEUS / "tests.yml").read_text())["tests"]
             for case in test["alert_rule_test"]]
    fired = {case["alertname"] for case in cases if case["exp_alerts"]}
    assert fired == alerts
    # quiet: at an earlier time, or beside healthy series in the same test (each test's input has
    # series the expected alerts do not name)
    for test in yaml.safe_load((PROMETHEUS / "tests.yml").read_text())["tests"]:
        firing = [alert for case in test["alert_rule_test"] for alert in case["exp_alerts"]]
        quiet = [case for case in test["alert_rule_test"] if not case["exp_alerts"]]
        assert quiet or len(test["input_series"]) > 2 * len(firing), test["name"]


def test_a_broken_expectation_fails(promtool, tmp_path):
    """promtool test rules fails when an alert's expectation is wrong (what the test above relies on)."""
    shutil.copy(PROMETHEUS / "alerts.yml", tmp_path / "alerts.yml")
    tests = yaml.safe_load((PROMETHEUS / "tests.yml").read_text())
    case = next(c for t in tests["tests"] for c in t["alert_rule_test"] if c["alertname"] == "BridgeBudgetExhausted")
    case["exp_alerts"] = []
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests))
    result = subprocess.run([promtool, "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0 and "BridgeBudgetExhausted" in result.stdout + result.stderr


def test_promtool_checks_the_compose_stacks_prometheus_config(promtool, tmp_path):
    """deploy/prometheus/prometheus.yml as the container reads it, its rule file where it is mounted
    (here a copy in a temporary folder)."""
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    shutil.copy(PROMETHEUS / "alerts.yml", tmp_path / "alerts.yml")
    config["rule_files"] = [str(tmp_path / "alerts.yml")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    result = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 8 rules found" in result.stdout
