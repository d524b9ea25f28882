"""A replication policy's own RPO, and its lag over time: real Redis, a real worker running the
policy's runs (moto), the worker's Prometheus endpoint, Debian's promtool, ``policy status`` and
the status page as ``mcbridge status serve`` serves it.

- ``rpo:`` is checked in the policy file (one line naming the field); the worker exports it per
  policy and destination (bridge_replica_rpo_seconds); the alert rule fires on a policy's own RPO,
  and on the 4 h default only where a policy sets none (promtool test rules).
- ``policy status`` and the status page say "within RPO" or "past its RPO of 2s" per destination.
- Each run's end leaves one lag sample per destination (a capped Redis list): two runs, two
  points on the status page's lag chart."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from bridge.policies.replication import DEFAULT_RPO, PolicyError, parse, seconds
from bridge.workers.keys import Keys
from bridge.workers.replicas import LAG_SAMPLES, PolicyState
from tests.emulators import free_port
from tests.test_followups_guards import first_run, policy_places
from tests.test_service_policies import _put_checkpoint, _run
from tests.test_status_page import fetch, status_server
from tests.test_workers_service import metric_total, service  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(300)
PROMETHEUS = Path(__file__).resolve().parent.parent / "deploy" / "prometheus"


def test_rpo_is_checked_in_the_policy_file_on_one_line():
    text = ("policies:\n  golden:\n    source: s3://src-bucket/golden/\n    destinations: [s3://dst-bucket/dr/]\n"
            "    rpo: {rpo}\n")
    assert parse(text.format(rpo="30m"))[0].policy.rpo_s == 1800
    assert parse(text.format(rpo="1d"))[0].policy.rpo_s == 86400
    for bad, why in (("soon", "rpo 'soon': use a number and s, m, h or d, e.g. 10m"),
                     ("0m", "rpo '0m' is no time at all; give e.g. 30m or 4h")):
        with pytest.raises(PolicyError) as refused:
            parse(text.format(rpo=bad))
        assert refused.value.problems == [f"policies.yaml:5: policies.golden.rpo: {why}"]


def test_the_alert_falls_back_to_the_same_default_rpo_the_page_says():
    rule = next(r for g in yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"] for r in g["rules"]
                if r["alert"] == "BridgeReplicaPastRPO")
    assert "bridge_replica_rpo_seconds" in rule["expr"]
    assert f"+ {int(seconds(DEFAULT_RPO)) // 3600} * 3600" in rule["expr"]


def test_promtool_fires_on_a_policys_own_rpo_and_on_the_default_elsewhere(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not found: apt-get install prometheus (scripts/test.sh installs it)")
    shutil.copy(PROMETHEUS / "alerts.yml", tmp_path / "alerts.yml")
    series = [("tight", "gs://dr/", "0x300", "-60x300", "120x300"),   # rpo 2m, behind
              ("tight", "az://dr/", "0x300", "0x300", "120x300"),     # rpo 2m, verified
              ("loose", "gs://dr/", "0x300", "-60x300", None)]        # no rpo: the 4 h default
    inputs = []
    for policy, dst, committed, verified, rpo in series:
        labels = f'namespace="t",instance="w1",policy="{policy}",destination="{dst}"'
        inputs.append({"series": f"bridge_replica_committed_timestamp_seconds{{{labels}}}", "values": committed})
        inputs.append({"series": f"bridge_replica_verified_commit_timestamp_seconds{{{labels}}}", "values": verified})
        if rpo:
            inputs.append({"series": f"bridge_replica_rpo_seconds{{{labels}}}", "values": rpo})

    def fired(*which: str) -> list[dict]:
        return [{"exp_labels": {"severity": "critical", "namespace": "t", "policy": p, "destination": "gs://dr/"}}
                for p in which]
    cases = [{"eval_time": "1m", "alertname": "BridgeReplicaPastRPO", "exp_alerts": []},
             {"eval_time": "3m", "alertname": "BridgeReplicaPastRPO", "exp_alerts": fired("tight")},
             {"eval_time": "3h", "alertname": "BridgeReplicaPastRPO", "exp_alerts": fired("tight")},
             {"eval_time": "4h1m", "alertname": "BridgeReplicaPastRPO", "exp_alerts": fired("tight", "loose")}]
    ago = {"3m": "3m 0s", "3h": "3h 0m 0s", "4h1m": "4h 1m 0s"}
    for case in cases:
        for alert in case["exp_alerts"]:
            alert["exp_annotations"] = {
                "summary": f"policy {alert['exp_labels']['policy']}: newest checkpoint not verified at gs://dr/ "
                           f"within the RPO",
                "description": f"Committed {ago[case['eval_time']]} ago and not verified there yet "
                               f"(mcbridge policy status)."}
    (tmp_path / "tests.yml").write_text(yaml.safe_dump({
        "rule_files": ["alerts.yml"], "evaluation_interval": "1m",
        "tests": [{"name": "own rpo", "interval": "1m", "input_series": inputs, "alert_rule_test": cases}]}))
    result = subprocess.run([promtool, "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rpo_per_destination_and_lag_over_time_from_the_services_runs(service, moto, tmp_path):  # noqa: F811
    src, [dst, dst2], policy_file = policy_places(moto, tmp_path, 2, "    rpo: 2s\n"
                                                                     "    schedule: {cron: \"0 2 * * *\"}\n")
    port = free_port()
    service.worker("w1", metrics_port=port).wait_ready()
    beat, clock, first = first_run(service, policy_file)
    assert first.state == "succeeded", first.errors
    assert metric_total(port, "bridge_replica_rpo_seconds") == 2 * 2   # 2 s at each of the two destinations

    text = service.cli("policy", "status", str(policy_file))
    assert text.returncode == 0, text.stderr
    for url in (dst, dst2):
        line = next(x for x in text.stdout.splitlines() if x.strip().startswith(f"{url}: last run"))
        assert "up to date; within RPO;" in line, line

    # a newer checkpoint at the source, older than the RPO and verified nowhere: past it
    _put_checkpoint(moto, src, "step-2")
    newest = max(o["LastModified"].timestamp() for o in moto.client().list_objects_v2(
        Bucket=src, Prefix="golden/step-2/")["Contents"])
    while time.time() - newest <= 2.5:
        time.sleep(0.2)
    text = service.cli("policy", "status", str(policy_file))
    for url in (dst, dst2):
        line = next(x for x in text.stdout.splitlines() if x.strip().startswith(f"{url}: last run"))
        assert "1 checkpoint behind step-2; past its RPO of 2s;" in line, line

    second = _run(service, beat, clock, datetime(2026, 3, 2, 2, 0, 5, tzinfo=timezone.utc))
    assert second.state == "succeeded", second.errors
    state = PolicyState(service.redis, Keys(service.env["BRIDGE_NAMESPACE"]))
    for url in (dst, dst2):
        history = state.lag_history("golden", url)
        assert [(s["lag"], s["job"]) for s in history] == [(0, first.id), (0, second.id)]
        assert history[0]["at"] <= history[1]["at"]

    token_file = tmp_path / "status-token"
    server, url = status_server(service, tmp_path, "--policies", str(policy_file), "--token-file", str(token_file))
    try:
        status, _headers, page = fetch(url, token=token_file.read_text().strip())
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert status == 200
    block = page[page.index('<div class="policy" id="policy-golden">'):]
    rows = re.findall(r'<tr[^>]*><td><code>([^<]+)</code></td>(.*?)</tr>', block, re.S)
    assert {name for name, _ in rows} == {dst, dst2}
    assert all('<td class="rpo">within RPO</td>' in cells for _, cells in rows), rows
    chart = re.search(r'<svg class="lag-history".*?</svg>', block, re.S).group(0)
    series = dict(re.findall(r'<g class="lag-series" aria-label="([^"]+)">(.*?)</g>', chart, re.S))
    assert set(series) == {dst, dst2}
    for drawn in series.values():
        assert drawn.count('<circle class="lag-point"') == 2 and "<polyline" in drawn


def test_the_lag_history_is_capped(redis_url):
    import uuid
    from bridge.workers.keys import redis_client
    from bridge.workers.testing import purge_namespace
    namespace = f"mcbt-{uuid.uuid4().hex[:10]}"
    state = PolicyState(redis_client(redis_url), Keys(namespace))
    try:
        for i in range(LAG_SAMPLES + 5):
            state.record_lag("golden", "s3://dst-bucket/dr/", float(i), i % 3, f"job-{i}")
        history = state.lag_history("golden", "s3://dst-bucket/dr/")
        assert len(history) == LAG_SAMPLES
        assert history[0]["job"] == "job-5" and history[-1]["job"] == f"job-{LAG_SAMPLES + 4}"
    finally:
        purge_namespace(redis_url, namespace)
