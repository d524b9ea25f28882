"""Broker state that steers a worker is signed: a real Redis, real `mcbridge worker` processes, moto.

Every field of a job record that decides what a worker reads, writes, deletes or spends is
covered by the job's signature: the spec, the policy a run was started for (its mode,
retention, checkpoints glob) and the window it keeps, the budget and the estimate admitted
against it. Each test changes one of them in Redis by hand, as anyone who can reach the broker
can, and finds the worker refusing it before a byte moves or anything is deleted, with the
refusal in the audit stream.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from datetime import datetime, timezone

import pytest

from bridge.workers.auth import Keyring, Refused
from bridge.workers.redisbudgets import Budgets
from bridge.workers.testing import purge_namespace, tenant_env
from tests.emulators import unique_name
from tests.test_service_policies import Clock, _beat, _put_checkpoint
from tests.test_service_security import Secured, bucket_requests, keys_of

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def signed(redis_url, moto, tmp_path, tmp_path_factory):
    """One tenant allowed every bucket, a source and a destination bucket; no worker yet (each
    test starts the workers it needs, on the queues it needs)."""
    src, dst = unique_name(), unique_name()
    moto.create_bucket(src)
    moto.create_bucket(dst)
    for i in range(3):
        moto.client().put_object(Bucket=src, Key=f"team-a/in/{i}.bin", Body=os.urandom(3000 + i))
    namespace = f"mcbt-{uuid.uuid4().hex[:10]}"
    env = {**os.environ, **moto.env(), "BRIDGE_BROKER_URL": redis_url, "BRIDGE_NAMESPACE": namespace,
           "BRIDGE_LEASE": "3s", "BRIDGE_SWEEP": "0.5s", "BRIDGE_METRICS_PORT": "0",
           "MCBRIDGE_STATE_DIR": str(tmp_path / "state"), "AWS_EC2_METADATA_DISABLED": "true",
           **tenant_env(tmp_path_factory.mktemp("keys"), tenant="team-a")}
    env.pop("MCBRIDGE_CONFIG", None)
    harness = Secured(env, tmp_path, moto, src, dst, tmp_path, tmp_path)
    yield harness
    harness.close()
    purge_namespace(redis_url, namespace)


def _wait_for(what, check, harness, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.name}\n{p.log_tail(25)}" for p in harness.processes)
            raise AssertionError(f"{what}: not seen in {timeout}s\n{logs}")
        time.sleep(0.2)


def _queued_children(s, count: int):
    """The policy run, once it is running and its ``count`` children are queued."""
    runs = [r for r in s.jobs.list(50) if r.policy and not r.parent]
    if runs and runs[0].state == "running" and len(runs[0].children) == count and \
            all(s.jobs.state(child) == "queued" for child in runs[0].children):
        return runs[0]
    return None


def _over_budget(s, dst_prefix: str) -> str:
    """A copy submitted against a budget it does not fit: its id, held awaiting approval."""
    assert s.cli("budgets", "set", "team", "0.0000001").returncode == 0
    r = s.cli("submit", "cp", f"s3://{s.src}/team-a/in/", f"s3://{s.dst}/{dst_prefix}", "--budget", "team")
    assert r.returncode == 3, r.stdout + r.stderr
    job_id = r.stdout.strip()
    assert s.jobs.get(job_id).state == "awaiting-approval"
    return job_id



def _fire_with_children_held(s, policy_file):
    """The policy's 02:00 run sent by beat to a worker of the control queue only: the run is
    planned and its two children queued, and none of them runs until a data worker starts."""
    s.worker("control", concurrency=1, queues=["bridge"]).wait_ready()
    clock = Clock(datetime(2026, 3, 1, 2, 0, 5, tzinfo=timezone.utc))
    beat = _beat(s.env, policy_file, clock)
    beat.schedule["mcbridge-policy:golden"].last_run_at = datetime(2026, 2, 28, 2, 0, 30, tzinfo=timezone.utc)
    assert beat.tick() == 0, "the policy was not due"
    return _wait_for("a policy run with its children queued", lambda: _queued_children(s, 2), s)


def test_a_policy_spec_rewritten_in_redis_is_refused_and_nothing_at_the_destination_is_deleted(signed, tmp_path):
    s = signed
    for name in ("step-300", "step-400"):
        _put_checkpoint(s.moto, s.src, name)
    # what the destination holds beside the policy's checkpoints: none of it is the policy's to remove
    others = ("datasets", "eval-results", "step-100", "step-200")
    for folder in others:
        s.moto.client().put_object(Bucket=s.dst, Key=f"dr/{folder}/part-0.bin", Body=b"not the policy's")
    policy_file = tmp_path / "policies.yaml"
    policy_file.write_text(f"""\
policies:
  golden:
    source: s3://{s.src}/golden/
    destinations: [s3://{s.dst}/dr/]
    checkpoints: "step-*"
    mode: append-only
    verify: store
    schedule: {{cron: "0 2 * * *"}}
""")
    # The control queue only: the run is planned and its children queued, and none of them runs
    # until the record has been rewritten below.
    run = _fire_with_children_held(s, policy_file)
    key = s.keys.job(run.id)
    spec = json.loads(s.redis.hget(key, "policy_spec"))
    assert spec["mode"] == "append-only"
    s.redis.hset(key, "policy_spec", json.dumps({**spec, "mode": "mirror", "checkpoints": "*", "keep_last": 1}))

    s.worker("data", concurrency=2).wait_ready()
    ended = _wait_for("the run's end", lambda: (r := s.jobs.get(run.id)) and r.state in ("succeeded", "failed") and r, s)
    # nothing removed: the children, signed for what the policy asked, copied; the run's retention was refused
    present = {k.split("/")[1] for k in keys_of(s.moto, s.dst, "dr/")}
    assert present >= {*others, "step-300", "step-400"}, present
    assert all(s.jobs.get(c).state == "succeeded" for c in run.children)
    assert ended.state == "failed" and ended.errors[0].startswith("refused: "), ended.errors
    refused = s.audit(decision="refused", job=run.id)
    assert "signature does not match" in refused["reason"], refused


def test_a_child_marked_verified_by_hand_removes_nothing_where_its_checkpoint_never_landed(signed, tmp_path):
    """A child's state and verify summary are its record's word. One that never ran, made to look
    succeeded and verified in Redis (and admitted, as a child that ran and failed is: its mark
    made here with the tenant's key), does not let retention remove a destination's older
    checkpoint: the newest must have bridge's commit record at every destination."""
    s = signed
    other = unique_name()
    s.moto.create_bucket(other)
    _put_checkpoint(s.moto, s.src, "step-400")
    for bucket in (s.dst, other):
        s.moto.client().put_object(Bucket=bucket, Key="dr/step-100/part-0.bin", Body=b"the last good copy")
    policy_file = tmp_path / "policies.yaml"
    policy_file.write_text(f"""\
policies:
  golden:
    source: s3://{s.src}/golden/
    destinations: [s3://{s.dst}/dr/, s3://{other}/dr/]
    checkpoints: "step-*"
    keep_last: 1
    mode: mirror
    verify: store
    schedule: {{cron: "0 2 * * *"}}
""")
    run = _fire_with_children_held(s, policy_file)
    first, second = run.children
    forged = s.jobs.get(second)
    assert forged.spec["destinations"] == [f"s3://{other}/dr/step-400/"]
    from bridge.workers.auth import digest, job_document
    from bridge.workers.gate import Gate
    from bridge.workers.settings import WorkerSettings
    gate = Gate(WorkerSettings.from_env(s.env), s.redis, s.keys)
    s.redis.set(s.keys.admitted(second), gate.mark("team-a", digest(job_document(forged.auth, forged.spec,
                                                                                  forged.steering))))
    s.redis.hset(s.keys.job(second), mapping={"state": "succeeded", "verify": json.dumps({"ok": True}),
                                              "finished": time.time()})
    s.redis.hset(s.keys.job(run.id), "children_pending", 1)

    s.worker("data", concurrency=2).wait_ready()
    ended = _wait_for("the run's end", lambda: (r := s.jobs.get(run.id)) and r.state in ("succeeded", "failed") and r, s)
    assert s.jobs.get(first).state == "succeeded"
    assert keys_of(s.moto, other, "dr/") == ["dr/step-100/part-0.bin"]    # the only copy there, kept
    assert "dr/step-100/part-0.bin" in keys_of(s.moto, s.dst, "dr/")
    assert ended.state == "failed"
    assert any("no commit record" in e for e in ended.errors), ended.errors


def test_a_job_set_to_queued_by_hand_is_refused_before_any_byte_or_spend(signed):
    s = signed
    s.worker("w1", concurrency=2).wait_ready()
    job_id = _over_budget(s, "team-a/held/")
    mark = s.moto.log_path.stat().st_size
    # past its budget's admission: queued by hand, and its plan task pushed by hand
    s.redis.hset(s.keys.job(job_id), "state", "queued")
    s.push("bridge.plan", [job_id], queue=s.jobs.get(job_id).queue)
    refused = s.audit(decision="refused", job=job_id)
    assert "never admitted against budget 'team'" in refused["reason"], refused
    record = _wait_for("the job's end", lambda: (r := s.jobs.get(job_id)) and r.state == "failed" and r, s)
    assert record.errors[0].startswith("refused: ")
    assert bucket_requests(s.moto, {s.src, s.dst}, mark) == []
    budgets = Budgets(s.redis, s.keys)
    assert budgets.spent("team") == 0 and budgets.reserved("team") == 0
    assert keys_of(s.moto, s.dst) == []


def test_a_forged_admission_estimate_is_detected_and_nothing_runs(signed):
    s = signed
    s.worker("w1", concurrency=2).wait_ready()
    job_id = _over_budget(s, "team-a/forged/")
    signed_estimate = s.jobs.get(job_id).auth["estimate"]
    assert signed_estimate == pytest.approx(s.jobs.get(job_id).estimate_usd) and signed_estimate > 0
    # the record's estimate rewritten to nothing, then approved: the approval reserves what the record says
    s.redis.hset(s.keys.job(job_id), "estimate_usd", "0.0")
    mark = s.moto.log_path.stat().st_size
    r = s.cli("jobs", "approve", job_id)
    assert r.returncode == 0, r.stdout + r.stderr
    refused = s.audit(decision="refused", job=job_id)
    assert "not the estimate it was signed with" in refused["reason"], refused
    record = _wait_for("the job's end", lambda: (r := s.jobs.get(job_id)) and r.state == "failed" and r, s)
    assert record.errors[0].startswith("refused: ")
    assert bucket_requests(s.moto, {s.src, s.dst}, mark) == []
    assert keys_of(s.moto, s.dst) == []
    assert Budgets(s.redis, s.keys).spent("team") == 0

    # the same job, its estimate left alone: approved, it runs and is charged
    job_id = _over_budget(s, "team-a/approved/")
    r = s.cli("jobs", "approve", job_id)
    assert r.returncode == 0, r.stdout + r.stderr
    record = _wait_for("the job's end", lambda: (r := s.jobs.get(job_id)) and r.state in ("succeeded", "failed") and r, s)
    assert record.state == "succeeded", record.errors
    assert len(keys_of(s.moto, s.dst, "team-a/approved/")) == 4   # three files and the manifest


def test_an_estimate_its_submitter_signed_too_low_is_priced_again_by_the_worker_before_any_byte(signed):
    """The submitter's own key signs whatever estimate it made: a tenant that signs a tiny one is
    admitted against its budget, and the worker, pricing the plan itself, refuses it once the
    difference does not fit the budget, before a single task is sent."""
    s = signed
    s.worker("w1", concurrency=2).wait_ready()
    assert s.cli("budgets", "set", "team", "0.0000001").returncode == 0
    spec = {"kind": "copy", "source": f"s3://{s.src}/team-a/in/", "destinations": [f"s3://{s.dst}/team-a/cheap/"],
            "verify": "store"}
    auth = s.keyring.sign_job("team-a", "cheap1", spec, budget="team", ttl=3600, estimate=1e-12)
    s.write_record("cheap1", spec, auth=auth, state="awaiting-approval")
    s.redis.hset(s.keys.job("cheap1"), mapping={"budget": "team", "estimate_usd": "1e-12", "queue": "bridge.s3"})
    budgets = Budgets(s.redis, s.keys)
    assert budgets.admit("cheap1", s.keys.job("cheap1"), "team", 1e-12) == (True, "awaiting-approval")
    mark = s.moto.log_path.stat().st_size
    s.push("bridge.plan", ["cheap1"], queue="bridge.s3")
    refused = s.audit(decision="refused", job="cheap1")
    assert "not the 0.000000000 USD it was admitted for, and budget 'team' has no room" in refused["reason"], refused
    record = _wait_for("the job's end", lambda: (r := s.jobs.get("cheap1")) and r.state == "failed" and r, s)
    assert record.errors[0].startswith("refused: ")
    # its source was listed to be planned; no object was read or written
    sent = bucket_requests(s.moto, {s.src, s.dst}, mark)
    assert not [line for line in sent if "/team-a/in/" in line.split("?")[0] or '"PUT ' in line], sent
    assert keys_of(s.moto, s.dst) == []
    assert budgets.spent("team") < 0.0000001
    assert not budgets.holds("cheap1") and budgets.reserved("team") == 0   # what it held is free again

    # the same tenant's honest estimate of a job that fits: priced alike, it runs
    assert s.cli("budgets", "set", "team", "1").returncode == 0
    r = s.cli("submit", "cp", f"s3://{s.src}/team-a/in/", f"s3://{s.dst}/team-a/fair/", "--budget", "team", "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(keys_of(s.moto, s.dst, "team-a/fair/")) == 4


def test_an_admission_mark_written_by_hand_admits_nothing(redis_url, tmp_path):
    """``<ns>:admitted:<job>`` says a worker admitted the job. The job's digest is no secret (anyone
    can hash the record's signed document), so the mark is a MAC of it with the tenant's key."""
    from bridge.workers.auth import digest, job_document
    from bridge.workers.gate import Gate
    from bridge.workers.jobrecords import Jobs
    from bridge.workers.keys import Keys
    from bridge.workers.settings import WorkerSettings
    from bridge.workers.specs import JobSpec
    from bridge.workers.keys import redis_client
    namespace = f"mcbt-{uuid.uuid4().hex[:10]}"
    ws = WorkerSettings.from_env({"BRIDGE_BROKER_URL": redis_url, "BRIDGE_NAMESPACE": namespace,
                                  **tenant_env(tmp_path / "keys", tenant="team-a")})
    client, keys = redis_client(redis_url), Keys(namespace)
    gate, jobs = Gate(ws, client, keys), Jobs(client, keys, 3600)
    try:
        spec = JobSpec(kind="copy", source="s3://corpus/a/", destinations=["s3://out/a/"])
        job_id = Jobs.new_id()
        jobs.create(spec, queue="bridge.s3", job_id=job_id,
                    auth=gate.keyring.sign_job("team-a", job_id, spec.to_dict(), budget=None, ttl=600))
        record = jobs.get(job_id)
        client.set(keys.admitted(job_id), digest(job_document(record.auth, record.spec)))
        with pytest.raises(Refused, match="was never admitted by a worker"):
            gate.check(record)
        client.delete(keys.admitted(job_id))
        who = gate.admit(record)
        assert gate.check(record) == who and client.get(keys.admitted(job_id)) != who.digest
    finally:
        purge_namespace(redis_url, namespace)


def test_the_job_signature_covers_the_estimate_and_the_fields_that_steer_it():
    ring = Keyring({"a": bytes(range(32))}, "a")
    spec = {"kind": "replicate", "source": "s3://corpus/golden/", "destinations": ["gs://dr/golden/"]}
    policy = json.dumps({"source": "s3://corpus/golden/", "destinations": ["gs://dr/golden/"], "mode": "append-only"})
    fields = {"policy": "golden", "policy_spec": policy, "checkpoints": '["step-1"]'}
    auth = ring.sign_job("a", "j1", spec, budget="golden", ttl=60, estimate=0.25, fields=fields)
    assert auth["estimate"] == 0.25 and sorted(auth["fields"]) == sorted(fields)
    assert len(ring.check_job("j1", spec, auth, fields)) == 64
    # a field as a worker reads it from the record: changed, missing, or one the signature does not name
    for changed in ({**fields, "policy_spec": policy.replace("append-only", "mirror")},
                    {**fields, "checkpoints": '["step-1","step-0"]'}, {"policy": "golden", "policy_spec": policy}):
        with pytest.raises(Refused, match="signature does not match"):
            ring.check_job("j1", spec, auth, changed)
    for forged in ({**auth, "estimate": 0.0}, {k: v for k, v in auth.items() if k != "estimate"},
                   {**auth, "fields": ["policy"]}):
        with pytest.raises(Refused, match="signature does not match"):
            ring.check_job("j1", spec, forged, fields)
    # a job signed without a policy, given one in its record by hand
    plain = ring.sign_job("a", "j2", spec, budget=None, ttl=60)
    ring.check_job("j2", spec, plain, {})
    with pytest.raises(Refused, match="holds policy_spec, which its signature does not cover"):
        ring.check_job("j2", spec, plain, {"policy_spec": policy})
    with pytest.raises(Refused, match="malformed"):
        ring.check_job("j1", spec, {**auth, "estimate": "0.25"}, fields)
