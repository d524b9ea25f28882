"""Replication policies on the service: Celery beat's own scheduler, driven by a given clock,
sends a policy when its cron is due; a real worker runs it as one sync per destination and
checkpoint, applies retention, and records lag and spend per destination (Redis, mcbridge
policy status, mcbridge jobs, Prometheus). No test waits for real cron time."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery
from celery.beat import Scheduler

from bridge.policies.replication import load
from tests import dcpfake
from tests.emulators import free_port, unique_name
from tests.test_workers_service import metric_total, service  # noqa: F401  (the fixture)
from bridge.workers import replicas
from bridge.workers.redisbudgets import Budgets
from bridge.workers.settings import WorkerSettings, celery_config

pytestmark = pytest.mark.timeout(300)


class Clock:
    def __init__(self, at: datetime):
        self.at = at

    def __call__(self) -> datetime:
        return self.at


def _beat(env: dict[str, str], policy_file, clock: Clock) -> Scheduler:
    """Celery beat's scheduler with the policy file's entries, on this test's broker namespace,
    its clock the given one. ``tick()`` sends what is due, as beat does."""
    ws = WorkerSettings.from_env(env)
    from bridge.workers.app import configure
    configure(ws)   # beat signs with these settings' key
    app = Celery("beat-under-test")
    app.conf.update(celery_config(ws))
    scheduler = Scheduler(app, lazy=True)
    scheduler.merge_inplace(replicas.beat_entries(load(policy_file), ws.control_queue, app, nowfun=clock))
    return scheduler


def _put_checkpoint(moto, bucket: str, name: str) -> None:
    """Shards and a DCP .metadata naming them: committed by evidence, which retention counts."""
    shards = {}
    for i in range(2):
        body = f"{name}:{i}".encode() * 700
        moto.client().put_object(Bucket=bucket, Key=f"golden/{name}/shard-{i}.bin", Body=body)
        shards[f"shard-{i}.bin"] = [len(body)]
    moto.client().put_object(Bucket=bucket, Key=f"golden/{name}/notes.tmp", Body=b"scratch")
    moto.client().put_object(Bucket=bucket, Key=f"golden/{name}/.metadata", Body=dcpfake.metadata(shards))


def _checkpoints(service, url: str) -> set[str]:
    r = service.cli("ls", url, "--json")
    if r.returncode == 1 and "nothing there" in r.stderr:
        return set()
    assert r.returncode == 0, r.stderr
    return {row["path"].split("/", 1)[0] for row in json.loads(r.stdout) if "/" in row["path"]}


def _run(service, beat: Scheduler, clock: Clock, at: datetime):
    """Tick at ``at``: exactly one policy run is sent; wait for its job to end."""
    seen = {r.id for r in service.jobs.list(500)}
    clock.at = at
    assert beat.tick() == 0, "the policy was not due"
    deadline = time.monotonic() + 150
    while True:
        runs = [r for r in service.jobs.list(500) if r.policy and not r.parent and r.id not in seen]
        # ended, and priced: the worker that ended it prices it right after the state moves
        if runs and runs[0].state in ("succeeded", "failed") and runs[0].spent_usd is not None:
            return runs[0]
        assert time.monotonic() < deadline, f"no policy run ended\n{service.processes[0].log_tail()}"
        time.sleep(0.2)


def test_beat_runs_a_policy_on_its_cron_with_retention_lag_and_spend(service, moto, fake_gcs, azurite, tmp_path):  # noqa: F811
    src, gbucket, container = unique_name(), unique_name(), unique_name()
    moto.create_bucket(src)
    fake_gcs.create_bucket(gbucket)
    azurite.create_bucket(container)
    for name in ("step-20", "step-100", "step-300", "step-1000"):
        _put_checkpoint(moto, src, name)
    gs, az = f"gs://{gbucket}/dr/", f"az://{container}/dr/"
    policy_file = tmp_path / "policies.yaml"
    policy_file.write_text(f"""\
policies:
  golden:
    source: s3://{src}/golden/
    destinations: [{gs}, {az}]
    checkpoints: "step-*"
    keep_last: 2
    mode: mirror
    exclude: ["*.tmp"]
    verify: store
    max_cost_usd: 1
    schedule: {{cron: "0 2 * * *"}}
""")
    Budgets(service.redis, service.keys).set("golden", 3)
    port = free_port()
    service.worker("w1", concurrency=2, metrics_port=port).wait_ready()

    # beat's due-check under a given clock: not at 01:59, due at 02:00
    clock = Clock(datetime(2026, 3, 1, 1, 59, tzinfo=timezone.utc))
    beat = _beat(service.env, policy_file, clock)
    entry = beat.schedule["mcbridge-policy:golden"]
    entry.last_run_at = datetime(2026, 2, 28, 2, 0, 30, tzinfo=timezone.utc)
    assert entry.is_due()[0] is False
    assert beat.tick() > 0 and service.jobs.list() == []       # nothing sent before 02:00

    run = _run(service, beat, clock, datetime(2026, 3, 1, 2, 0, 5, tzinfo=timezone.utc))
    assert run.state == "succeeded", run.errors
    assert run.schedule == "golden" and run.kind == "replicate" and len(run.children) == 4   # 2 destinations x 2
    for dst in (gs, az):
        assert _checkpoints(service, dst) == {"step-300", "step-1000"}
        assert run.replicas[dst]["newest_verified"] == "step-1000" and run.replicas[dst]["lag_checkpoints"] == 0
    # exclude held: the scratch file stayed at the source
    assert "notes.tmp" not in service.cli("ls", f"{gs}step-1000/").stdout
    # spend from what ran, per job, summed per destination and charged to the policy's budget
    children = [service.jobs.get(c) for c in run.children]
    assert all(c.spent_usd and c.spent_usd > 0 for c in children)
    assert run.spent_usd == pytest.approx(sum(c.spent_usd for c in children))
    assert Budgets(service.redis, service.keys).spent("golden") == pytest.approx(run.spent_usd)

    # a fifth checkpoint; the next day's 02:00 moves the window and step-300 leaves both clouds
    _put_checkpoint(moto, src, "step-2000")
    status = json.loads(service.cli("policy", "status", str(policy_file), "--json").stdout)
    [golden] = status["policies"]
    rows = {row["destination"]: row for row in golden["destinations"]}
    assert rows[gs]["lag_checkpoints"] == 1 and rows[gs]["newest_source"] == "step-2000"   # the source, listed now
    assert golden["budget_usd"] == 3 and golden["spent_usd"] == pytest.approx(run.spent_usd, rel=1e-3)

    run2 = _run(service, beat, clock, datetime(2026, 3, 2, 2, 0, 5, tzinfo=timezone.utc))
    assert run2.state == "succeeded", run2.errors
    for dst in (gs, az):
        assert _checkpoints(service, dst) == {"step-1000", "step-2000"}
        assert run2.replicas[dst]["removed"] == ["step-300"]

    # one destination failing (its container gone): nothing is removed anywhere
    _put_checkpoint(moto, src, "step-3000")
    azurite.client().delete_container(container)
    run3 = _run(service, beat, clock, datetime(2026, 3, 3, 2, 0, 5, tzinfo=timezone.utc))
    assert run3.state == "failed" and run3.replicas[gs]["removed"] == [] and run3.replicas[az]["removed"] == []
    assert _checkpoints(service, gs) == {"step-1000", "step-2000", "step-3000"}
    assert run3.replicas[az]["lag_checkpoints"] == 1 and run3.replicas[az]["newest_verified"] == "step-2000"

    text = service.cli("policy", "status", str(policy_file))
    assert text.returncode == 0, text.stderr
    assert f"{az}: last run" in text.stdout and "1 checkpoint behind step-3000" in text.stdout
    assert f"{gs}: last run" in text.stdout and "up to date" in text.stdout
    listed = service.cli("jobs", "list")
    assert f"{az}: lag 1" in listed.stdout, listed.stdout

    assert metric_total(port, "bridge_replica_lag_checkpoints") == 1           # gs 0, az 1
    # a newest checkpoint newly verified: step-1000 at both, step-2000 at both, step-3000 at gs only
    assert metric_total(port, "bridge_replica_commit_to_verified_seconds_count") == 5
    assert metric_total(port, "bridge_replica_spend_usd_total") == pytest.approx(
        Budgets(service.redis, service.keys).spent("golden"), rel=1e-6)


def test_a_policy_over_its_max_cost_fails_without_sending(service, moto, fake_gcs, tmp_path):  # noqa: F811
    src, gbucket = unique_name(), unique_name()
    moto.create_bucket(src)
    fake_gcs.create_bucket(gbucket)
    _put_checkpoint(moto, src, "step-1")
    policy_file = tmp_path / "p.yaml"
    policy_file.write_text(f"policies:\n  golden:\n    source: s3://{src}/golden/\n"
                           f"    destinations: [gs://{gbucket}/dr/]\n    max_cost_usd: 0\n"
                           f"    schedule: {{every: 1h}}\n")
    service.worker("w1", concurrency=1).wait_ready()
    clock = Clock(datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc))
    beat = _beat(service.env, policy_file, clock)
    beat.schedule["mcbridge-policy:golden"].last_run_at = clock.at - timedelta(hours=2)
    run = _run(service, beat, clock, clock.at)
    assert run.state == "failed" and run.children == []
    assert "policy golden refused: estimated $" in run.errors[0] and "nothing was sent" in run.errors[0]
    assert _checkpoints(service, f"gs://{gbucket}/") == set()


def test_a_policy_run_past_its_monthly_budget_waits_for_approval(service, moto, fake_gcs, tmp_path):  # noqa: F811
    src, gbucket = unique_name(), unique_name()
    moto.create_bucket(src)
    fake_gcs.create_bucket(gbucket)
    _put_checkpoint(moto, src, "step-1")
    policy_file = tmp_path / "p.yaml"
    policy_file.write_text(f"policies:\n  golden:\n    source: s3://{src}/golden/\n"
                           f"    destinations: [gs://{gbucket}/dr/]\n    schedule: {{cron: \"*/5 * * * *\"}}\n")
    Budgets(service.redis, service.keys).set("golden", 0)
    service.worker("w1", concurrency=1).wait_ready()
    clock = Clock(datetime(2026, 3, 1, 12, 1, tzinfo=timezone.utc))
    beat = _beat(service.env, policy_file, clock)
    beat.schedule["mcbridge-policy:golden"].last_run_at = datetime(2026, 3, 1, 11, 55, 30, tzinfo=timezone.utc)
    clock.at = datetime(2026, 3, 1, 12, 0, 10, tzinfo=timezone.utc)
    assert beat.tick() == 0
    deadline = time.monotonic() + 60
    while not (held := [r for r in service.jobs.list() if r.policy and r.state == "awaiting-approval"]):
        assert time.monotonic() < deadline, service.processes[0].log_tail()
        time.sleep(0.2)
    [run] = held
    assert run.estimate_usd > 0 and run.children == [] and _checkpoints(service, f"gs://{gbucket}/") == set()

    r = service.cli("jobs", "approve", run.id)
    assert r.returncode == 0, r.stderr
    done = service.wait(run.id)
    deadline = time.monotonic() + 30
    while done.spent_usd is None and time.monotonic() < deadline:
        time.sleep(0.1)
        done = service.jobs.get(run.id)
    assert done.state == "succeeded", done.errors
    assert _checkpoints(service, f"gs://{gbucket}/dr/") == {"step-1"}
    assert Budgets(service.redis, service.keys).spent("golden") == pytest.approx(done.spent_usd) and done.spent_usd > 0


def test_mcbridge_beat_reads_the_policy_file_and_its_runs_land(service, moto, tmp_path):  # noqa: F811
    """The real beat process (mcbridge beat --policies): a policy every 2 s reaches a local site."""
    from bridge.workers.testing import ServiceProcess
    src = unique_name()
    moto.create_bucket(src)
    _put_checkpoint(moto, src, "step-7")
    site = tmp_path / "dr"
    site.mkdir()
    policy_file = tmp_path / "p.yaml"
    policy_file.write_text(f"policies:\n  golden:\n    source: s3://{src}/golden/\n    destinations: [{site}/]\n"
                           f"    schedule: {{every: 2s}}\n")
    service.worker("w1", concurrency=1).wait_ready()
    beat = ServiceProcess(["beat", "--policies", str(policy_file), "--schedule-db", str(tmp_path / "beat-db"),
                           "--loglevel", "INFO"], service.env, "beat", tmp_path)
    service.processes.append(beat)
    beat.start()
    deadline = time.monotonic() + 90
    while not [r for r in service.jobs.list() if r.policy == "golden" and not r.parent and r.state == "succeeded"]:
        assert time.monotonic() < deadline, f"{beat.log_tail()}\n{service.processes[0].log_tail()}"
        time.sleep(0.2)
    assert sorted(p.name for p in (site / "step-7").iterdir()) == [".metadata", "_bridge", "notes.tmp", "shard-0.bin",
                                                                    "shard-1.bin"]
    assert "policy golden: every 2s" in beat.log_path.read_text()


def test_policy_status_reads_a_run_made_in_process(service, moto, fake_gcs, tmp_path):  # noqa: F811
    """``replicate --once`` runs in the CLI's process, not on the service: policy status then says
    when it ran, what it verified and what it spent (metered), not "never run"."""
    src, gbucket = unique_name(), unique_name()
    moto.create_bucket(src)
    fake_gcs.create_bucket(gbucket)
    for name in ("step-1", "step-2"):
        _put_checkpoint(moto, src, name)
    gs = f"gs://{gbucket}/dr/"
    policy_file = tmp_path / "policies.yaml"
    policy_file.write_text(f"""\
policies:
  golden:
    source: s3://{src}/golden/
    destinations: [{gs}]
    checkpoints: "step-*"
    keep_last: 1
    exclude: ["*.tmp"]
    verify: store
""")
    before = service.cli("policy", "status", str(policy_file))
    assert before.returncode == 0 and "never run" in before.stdout, before.stderr

    r = service.cli("replicate", "--policy", str(policy_file), "--once", "--json")
    assert r.returncode == 0, r.stderr
    ran = json.loads(r.stdout)["policies"][0]["destinations"][gs]
    assert ran["metered"] and ran["spent_usd"] > 0

    text = service.cli("policy", "status", str(policy_file))
    assert text.returncode == 0, text.stderr
    assert "never run" not in text.stdout and f"{gs}: last run" in text.stdout and "(in-process, ok)" in text.stdout
    assert "step-2 verified" in text.stdout and "up to date" in text.stdout
    status = json.loads(service.cli("policy", "status", str(policy_file), "--json").stdout)
    [row] = status["policies"][0]["destinations"]
    assert row["job"] == "in-process" and row["lag_checkpoints"] == 0 and row["newest_verified"] == "step-2"
    assert row["spent_usd"] == pytest.approx(ran["spent_usd"], rel=1e-3)


def test_a_policy_run_says_it_verified_again_a_checkpoint_whose_source_changed(service, moto, fake_gcs,  # noqa: F811
                                                                                 tmp_path):
    """A shard rewritten at the source after its checkpoint was verified at a destination: the
    next run copies and verifies it again, and its record says so, as --watch does in process."""
    src, gbucket = unique_name(), unique_name()
    moto.create_bucket(src)
    fake_gcs.create_bucket(gbucket)
    _put_checkpoint(moto, src, "step-1")
    gs = f"gs://{gbucket}/dr/"
    policy_file = tmp_path / "policies.yaml"
    policy_file.write_text(f"policies:\n  golden:\n    source: s3://{src}/golden/\n    destinations: [{gs}]\n"
                           f"    checkpoints: \"step-*\"\n    schedule: {{cron: \"0 2 * * *\"}}\n")
    service.worker("w1").wait_ready()
    clock = Clock(datetime(2026, 3, 1, 1, 59, tzinfo=timezone.utc))
    beat = _beat(service.env, policy_file, clock)
    beat.schedule["mcbridge-policy:golden"].last_run_at = datetime(2026, 2, 28, 2, 0, 30, tzinfo=timezone.utc)
    beat.tick()
    first = _run(service, beat, clock, datetime(2026, 3, 1, 2, 0, 5, tzinfo=timezone.utc))
    assert first.state == "succeeded" and first.replicas[gs]["revisited"] == {}, first.errors
    body = b"rewritten after it was verified" * 50
    moto.client().put_object(Bucket=src, Key="golden/step-1/shard-0.bin", Body=body)   # the same length
    shards = {"shard-0.bin": [len(body)], "shard-1.bin": [len("step-1:1".encode() * 700)]}
    moto.client().put_object(Bucket=src, Key="golden/step-1/.metadata", Body=dcpfake.metadata(shards))
    second = _run(service, beat, clock, datetime(2026, 3, 2, 2, 0, 5, tzinfo=timezone.utc))
    assert second.state == "succeeded", second.errors
    assert second.replicas[gs]["revisited"] == {
        "step-1": f"changed at the source after it was verified at {gs}: copied and verified again"}
    assert service.cli("cat", f"{gs}step-1/shard-0.bin").stdout.encode() == body
    third = _run(service, beat, clock, datetime(2026, 3, 3, 2, 0, 5, tzinfo=timezone.utc))
    assert third.replicas[gs]["revisited"] == {}      # unchanged since: nothing to say
