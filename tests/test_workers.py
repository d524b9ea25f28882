"""workers/ without worker processes: settings, specs, schedules, redaction, and the Redis parts
(journal, job records, leases, the sweeper) against a real Redis, in a namespace of their own.

Real workers, beat and emulators are in tests/test_workers_service.py.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import subprocess
import sys
import threading
import time
import uuid

import pytest

from bridge.errors import InvalidOption
from bridge.workers.settings import WorkerSettings, celery_config, describe, parse_routes
from bridge.workers.specs import FIELDS, JobSpec, parse_spec


@pytest.fixture
def namespace(redis_url):
    from bridge.workers.testing import purge_namespace
    ns = f"mcbt-{uuid.uuid4().hex[:10]}"
    yield ns
    purge_namespace(redis_url, ns)


@pytest.fixture
def ws(redis_url, namespace, tmp_path_factory) -> WorkerSettings:
    from bridge.workers.testing import tenant_env
    return WorkerSettings.from_env({"BRIDGE_BROKER_URL": redis_url, "BRIDGE_NAMESPACE": namespace,
                                    "BRIDGE_LEASE": "1s", "BRIDGE_SWEEP": "0.2s",
                                    **tenant_env(tmp_path_factory.mktemp("tenant"))})


@pytest.fixture
def client(ws):
    from bridge.workers.keys import redis_client
    return redis_client(ws.broker_url)


# -- settings ------------------------------------------------------------------------------

def test_defaults_recover_a_dead_worker_within_a_minute():
    ws = WorkerSettings.from_env({})
    assert ws.broker_url == "redis://localhost:6379/0"
    assert ws.recovery_bound <= 60
    assert ws.visibility_timeout > 10 * ws.lease  # redelivery by Redis is only the backstop


def test_celery_config_is_json_only_acks_late_and_prefixed():
    ws = WorkerSettings.from_env({"BRIDGE_NAMESPACE": "dep1", "BRIDGE_RESULT_BACKEND": "redis://r:1/2"})
    conf = celery_config(ws)
    assert conf["accept_content"] == ["json"] and conf["task_serializer"] == "json"
    assert conf["task_acks_late"] and conf["task_reject_on_worker_lost"]
    assert conf["worker_prefetch_multiplier"] == 1
    assert conf["broker_transport_options"]["visibility_timeout"] > ws.lease
    assert conf["broker_transport_options"]["global_keyprefix"] == "dep1:"
    assert conf["result_backend_transport_options"]["global_keyprefix"] == "dep1:"
    assert conf["result_backend"] == "redis://r:1/2" and conf["result_expires"] > 0


def test_every_setting_is_documented_with_its_variable():
    rows = describe()
    assert all(env.startswith("BRIDGE_") and doc for env, _default, doc in rows)
    assert len({env for env, _, _ in rows}) == len(rows)


@pytest.mark.parametrize("env, words", [
    ({"BRIDGE_LEASE": "soon"}, "BRIDGE_LEASE='soon'"),
    ({"BRIDGE_METRICS_PORT": "70000"}, "BRIDGE_METRICS_PORT"),
    ({"BRIDGE_NAMESPACE": "a b"}, "BRIDGE_NAMESPACE"),
    ({"BRIDGE_ROUTES": "s3"}, "MATCH=QUEUE"),
    ({"BRIDGE_LEASE": "13h"}, "longer than BRIDGE_LEASE"),
])
def test_bad_settings_are_one_line_naming_the_variable(env, words):
    with pytest.raises(InvalidOption) as info:
        WorkerSettings.from_env(env)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_routes_pick_the_most_specific_match():
    from bridge.workers.executor import route
    ws = WorkerSettings.from_env({"BRIDGE_ROUTES": "s3=bridge.aws, gs://models-eu=bridge.eu"})
    assert parse_routes("s3=q1") == {"s3": "q1"}
    spec = lambda dst, **kw: parse_spec({"kind": "copy", "source": "/data/x/", "destination": dst, **kw})
    assert route(ws, spec("s3://bucket/a/")) == "bridge.aws"
    assert route(ws, spec("gs://models-eu/a/")) == "bridge.eu"
    assert route(ws, spec("gs://other/a/")) == "bridge.gs"
    assert route(ws, spec("/mnt/lustre/a/")) == "bridge.local"
    assert route(ws, spec("az://c1-c/a/", queue="mine")) == "mine"
    assert "bridge.aws" in ws.default_queues() and ws.control_queue in ws.default_queues()


# -- specs ---------------------------------------------------------------------------------

def test_a_spec_carries_urls_and_options_never_credentials():
    spec = parse_spec({"kind": "sync", "source": "s3://corpus/train/", "destination": "gs://dr-b/train/",
                       "delete": True, "chunk_size": "16MiB", "profile": "prod"})
    assert spec.destinations == ["gs://dr-b/train/"] and spec.chunk_size == 16 * 2**20
    assert spec.settings_overrides() == {"transfer": {"chunk_size": 16 * 2**20}}
    assert set(spec.to_dict()) <= set(FIELDS)
    # deleting at a destination is asked for, by replicate as by sync
    assert not parse_spec({"kind": "replicate", "source": "s3://corpus/", "destinations": ["gs://a-b/", "az://c-d/"]}).deletes
    assert parse_spec({"kind": "replicate", "source": "s3://corpus/", "destinations": ["gs://a-b/"],
                       "delete": True}).deletes


@pytest.mark.parametrize("fields, words", [
    ({"kind": "copy", "source": "ftp://x/y", "destination": "s3://bkt/"}, "unknown scheme"),
    ({"kind": "copy", "source": "s3://bkt/a/", "destination": "s3://bkt/a/b/"}, "inside the source"),
    ({"kind": "copy", "source": "s3://bkt/a/", "destinations": ["gs://x-y/", "az://x-y/"]}, "one destination"),
    ({"kind": "copy", "source": "s3://bkt/a/", "destination": "gs://x-y/", "delete": True}, "not copy"),
    ({"kind": "move", "source": "s3://bkt/a/", "destination": "gs://x-y/"}, "kind"),
    ({"kind": "copy", "source": "s3://bkt/a/", "destination": "gs://x-y/", "password": "x"}, "unknown field"),
    ({"kind": "copy", "source": "s3://bkt/a/", "destination": "gs://x-y/", "chunk_size": "lots"}, "invalid size"),
])
def test_bad_specs_are_refused_on_one_line(fields, words):
    with pytest.raises(InvalidOption) as info:
        parse_spec(fields)
    assert words in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("fields, words", [
    ({"concurrency": 0}, "invalid job: concurrency: must be at least 1"),
    ({"concurrency": "many"}, "invalid job: concurrency: must be a whole number, not 'many'"),
    ({"profile": "a b"}, "invalid job: profile: 'a b' does not match"),
    ({"verify": "sometimes"}, "invalid job: verify: must be one of 'store', 'deep', 'none', not 'sometimes'"),
    ({"destinations": []}, "invalid job: destinations: must name at least one destination"),
    ({"destinations": ["gs://x-y/", "gs://x-y"]}, "invalid job: destinations: a destination is listed twice"),
    ({"destination": "gs://x-y/", "destinations": ["gs://x-y/"]}, "invalid job: give destination or destinations"),
    ({"source": None}, "invalid job: source: required"),
    ({"source": "given-as-none"}, "invalid job: source: required"),
    ({"kind": "given-as-none"}, "invalid job: kind: required"),
    ({"manifest_dir": "relative/dir"}, "invalid job: manifest_dir: 'relative/dir' does not match ^/"),
    ({"placement": {"gs://x-y/": "COLDLINE"}}, "invalid job: placement: must map each destination"),
])
def test_each_field_of_a_spec_is_checked_and_named(fields, words):
    base = {"kind": "copy", "source": "s3://bkt/a/"} if "destinations" in fields else \
        {"kind": "copy", "source": "s3://bkt/a/", "destination": "gs://x-y/"}
    data = {k: (None if v == "given-as-none" else v) for k, v in {**base, **fields}.items() if v is not None}
    with pytest.raises(InvalidOption) as info:
        parse_spec(data)
    assert str(info.value).startswith(words), str(info.value)


def test_a_spec_takes_values_as_yaml_and_the_command_line_give_them_and_does_not_change():
    spec = parse_spec({"kind": "sync", "source": "s3://bkt/a", "destination": "gs://x-y/b", "concurrency": "16",
                       "delete": "yes", "chunk_size": "8MiB", "bwlimit": "10MiB/s"})
    assert (spec.concurrency, spec.delete, spec.chunk_size, spec.bwlimit) == (16, True, 8 * 2**20, 10 * 2**20)
    assert spec.source == "s3://bkt/a" and spec.destinations == ["gs://x-y/b"]
    assert parse_spec(spec.to_dict()) == spec   # a job record's spec reads back as itself
    assert pickle.loads(pickle.dumps(spec)) == spec == copy.deepcopy(spec)
    with pytest.raises(AttributeError):
        spec.kind = "copy"
    spec.to_dict()["destinations"].append("az://c-d/")   # a copy: the spec keeps its own list
    assert spec.destinations == ["gs://x-y/b"]
    child = spec.replace(destinations=["az://c-d/b/"])
    assert child.destinations == ["az://c-d/b/"] and child.concurrency == 16 and spec.destinations == ["gs://x-y/b"]
    with pytest.raises(InvalidOption, match="destination s3://bkt/a/in/ is inside the source"):
        spec.replace(source="s3://bkt/a/", destinations=["s3://bkt/a/in/"])


# -- schedules -----------------------------------------------------------------------------

GOOD = """\
schedules:
  golden-nightly:
    cron: "0 2 * * *"
    kind: sync
    source: gs://models/golden/
    destination: s3://models-dr/golden/
    delete: true
  corpus-dr:
    every: 6h
    kind: replicate
    source: s3://corpus/train/
    destinations: [gs://corpus-dr/train/, az://corpus-dr/train/]
  paused:
    every: 1d
    enabled: false
    kind: copy
    source: /data/a/
    destination: s3://b-b/a/
"""


def test_a_schedules_file_becomes_beat_entries():
    from celery.schedules import crontab, schedule
    from bridge.workers.schedules import beat_entries, parse
    schedules = parse(GOOD)
    assert [s.name for s in schedules] == ["golden-nightly", "corpus-dr", "paused"]
    entries = beat_entries(schedules, "bridge")
    assert set(entries) == {"mcbridge:golden-nightly", "mcbridge:corpus-dr"}  # paused is disabled
    nightly = entries["mcbridge:golden-nightly"]
    assert isinstance(nightly["schedule"], crontab) and nightly["task"] == "bridge.scheduled"
    assert nightly["args"][1]["kind"] == "sync" and nightly["options"] == {"queue": "bridge"}
    assert isinstance(entries["mcbridge:corpus-dr"]["schedule"], schedule)
    assert entries["mcbridge:corpus-dr"]["schedule"].run_every.total_seconds() == 6 * 3600


@pytest.mark.parametrize("edit, expected", [
    (('"0 2 * * *"', '"0 25 * * *"'), "schedules.yaml:3: schedules.golden-nightly.cron: hour '25'"),
    (('"0 2 * * *"', '"0 2 * *"'), "schedules.yaml:3: schedules.golden-nightly.cron: '0 2 * *' has 4 fields"),
    (("kind: sync", "kind: sink"), "schedules.yaml:4: schedules.golden-nightly.kind: must be one of"),
    (("    delete: true", "    delete: true\n    verifyy: deep"), "schedules.yaml:8: schedules.golden-nightly.verifyy: unknown field"),
    (("every: 6h", "every: often"), "schedules.yaml:9: schedules.corpus-dr.every: 'often' is not a duration"),
    (("az://corpus-dr/train/", "ftp://corpus-dr/train/"), "schedules.yaml:12: schedules.corpus-dr.destinations"),
    (("    every: 6h\n", ""), "schedules.yaml:8: schedules.corpus-dr: give exactly one of cron"),
    (("  paused:", "  golden-nightly:"), "schedules.yaml:13: schedules.golden-nightly: defined twice"),
    (("    source: gs://models/golden/\n", ""), "schedules.yaml:2: schedules.golden-nightly.source: required"),
    (("    source: gs://models/golden/\n", "    source:\n"), "schedules.yaml:5: schedules.golden-nightly.source: required"),
    (("schedules:\n", "schedules:\n  - oops\n"), "schedules.yaml:3: not valid YAML"),
])
def test_a_bad_schedules_file_names_the_line_and_field(edit, expected):
    from bridge.workers.schedules import ScheduleError, parse
    with pytest.raises(ScheduleError) as info:
        parse(GOOD.replace(*edit, 1))
    assert any(line.startswith(expected) for line in info.value.problems), info.value.problems


def test_beat_check_validates_the_file(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(GOOD.replace('"0 2 * * *"', '"0 2 * * 9"'))
    bad = subprocess.run([sys.executable, "-m", "bridge", "beat", "--check", "--schedules", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and f"{path}:3: schedules.golden-nightly.cron: day-of-week '9'" in bad.stderr
    path.write_text(GOOD)
    good = subprocess.run([sys.executable, "-m", "bridge", "beat", "--check", "--schedules", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert good.returncode == 0 and "3 schedules OK" in good.stdout


# -- redaction ----------------------------------------------------------------------------

@pytest.mark.parametrize("text, secret", [
    ("cannot reach redis://:hunter2@10.0.0.1:6379/0", "hunter2"),
    ("DefaultEndpointsProtocol=https;AccountName=a;AccountKey=c2VjcmV0a2V5==;EndpointSuffix=x", "c2VjcmV0a2V5"),
    ("GET https://a.blob.core.windows.net/c/b?sv=2021&sig=AbCdEf%2B123&se=2030 failed", "AbCdEf%2B123"),
    ("https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIA123&X-Amz-Signature=deadbeef", "deadbeef"),
    ("aws_secret_access_key=wJalrXUtnFEMI/K7MDENG", "wJalrXUtnFEMI"),
    ('{"password": "pa55word"}', "pa55word"),
])
def test_secrets_are_redacted(text, secret):
    from bridge.redact import redact
    assert secret not in redact(text)
    assert "***" in redact(text)


def test_the_log_filter_redacts_messages_and_tracebacks():
    import logging
    from bridge.redact import RedactingFilter
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "connect %s", ("redis://:s3cr3t@h/0",), None)
    RedactingFilter().filter(record)
    assert "s3cr3t" not in record.getMessage()


# -- Redis: journal, job records ------------------------------------------------------------

def test_the_redis_journal_is_the_engines_journal(client, namespace):
    from bridge.workers.redisjournal import RedisJournal
    journal = RedisJournal(client, f"{namespace}:journal:k1", ttl=60)
    journal.put("file:a/b.txt", {"size": 3})
    journal.put("part:big.bin:1", {"crc32c": "00000001"})
    journal.put("part:big.bin:2", {"crc32c": "00000002"})
    journal.put_many([("file:c.txt", {"size": 4}), ("file:d.txt", {"size": 5}), ("part:big.bin:3", {"n": 3})])
    assert journal.get("file:a/b.txt") == {"size": 3} and journal.get("file:nope") is None
    assert journal.get("file:d.txt") == {"size": 5}
    assert [k for k, _v in journal.items("part:big.bin:")] == ["part:big.bin:1", "part:big.bin:2", "part:big.bin:3"]
    assert [k for k, _v in journal.items("file:")] == ["file:a/b.txt", "file:c.txt", "file:d.txt"]
    assert 0 < client.ttl(f"{namespace}:journal:k1:part") <= 60
    journal.clear()
    assert list(journal.items("part:")) == [] and not list(client.scan_iter(match=f"{namespace}:journal:*"))


def test_the_redis_journal_sends_finished_files_together_and_streams_them_in_key_order(client, namespace,
                                                                                      monkeypatch):
    from bridge.workers import redisjournal as journals
    monkeypatch.setattr(journals, "PAGE", 3)   # pages of the commit's reading
    journal = journals.RedisJournal(client, f"{namespace}:journal:k2", ttl=60)
    names = [f"d{i % 4}/f{i:03d}" for i in range(10)]
    for name in names:
        journal.put(f"file:{name}", {"size": len(name)})
    journal.put("upload:big", {"id": "u1"})   # an upload's id is sent at once
    assert client.hget(f"{namespace}:journal:k2:upload", "upload:big") is not None
    assert not client.exists(f"{namespace}:journal:k2:file")   # buffered, yet read back
    assert journal.get(f"file:{names[0]}") == {"size": len(names[0])}
    assert journal.present([f"file:{names[1]}", "file:nope"]) == {f"file:{names[1]}"}
    assert journal.get_many([f"file:{names[2]}", "file:nope"]) == [{"size": len(names[2])}, None]
    journal.flush()
    assert client.hlen(f"{namespace}:journal:k2:file") == 10
    assert [k for k, _v in journal.items("file:")] == [f"file:{n}" for n in sorted(names)]
    # a journal whose file records were written without their order (an older worker): sorted here
    client.delete(f"{namespace}:journal:k2:file:order")
    assert [k for k, _v in journal.items("file:")] == [f"file:{n}" for n in sorted(names)]
    journal.clear()
    assert not list(client.scan_iter(match=f"{namespace}:journal:k2*"))


def test_job_states_move_forward_only_and_cancel_wins_once(client, ws):
    from bridge.workers.jobrecords import Jobs
    from bridge.workers.keys import Keys
    jobs = Jobs(client, Keys(ws.namespace), ttl=3600)
    spec = parse_spec({"kind": "copy", "source": "s3://src-b/", "destination": "gs://dst-b/", "profile": "prod"})
    job_id = jobs.create(spec, queue="bridge.gs")
    record = jobs.get(job_id)
    assert record.state == "queued" and record.spec["profile"] == "prod" and record.queue == "bridge.gs"
    assert jobs.transition(job_id, "planning", ("queued",))
    assert not jobs.transition(job_id, "planning", ("queued",))
    assert jobs.transition(job_id, "running", ("planning",))
    jobs.add_progress(job_id, {"bytes_done": 10, "units_done": 2})
    jobs.add_errors(job_id, ["GET https://x/y?sig=SECRET failed"])
    assert jobs.cancel(job_id) == (True, "running")
    assert jobs.cancel(job_id) == (False, "cancelled")
    assert not jobs.finish(job_id, "succeeded")
    record = jobs.get(job_id)
    # a running job's end is when its last task stops (the finalize step writes it), not the cancel
    assert record.state == "cancelled" and record.finished is None and record.counters["bytes_done"] == 10
    assert "SECRET" not in json.dumps(record.to_dict())
    assert [r.id for r in jobs.list(states=("cancelled",))] == [job_id]
    assert 0 < client.ttl(Keys(ws.namespace).job(job_id)) <= 3600


def test_a_follower_wakes_when_the_job_ends_not_at_its_next_look(client, ws):
    """--wait blocks on the job's end announcement: its wait returns with the end, long before its
    timeout (a follower subscribed before it looked, so no end is missed between the two)."""
    from bridge.workers.jobrecords import Jobs
    from bridge.workers.keys import Keys
    jobs = Jobs(client, Keys(ws.namespace), ttl=3600)
    job_id = jobs.create(parse_spec({"kind": "copy", "source": "s3://a-b/", "destination": "gs://c-d/"}), queue="q")
    assert jobs.transition(job_id, "planning", ("queued",))
    with jobs.following(job_id) as wait:
        wait(0.05)   # its subscription confirmed
        assert wait(0.05) is None   # nothing to announce while it runs
        assert jobs.finish(job_id, "succeeded")
        woke = threading.Event()
        waiter = threading.Thread(target=lambda: (wait(3600), woke.set()), daemon=True)
        waiter.start()
        waiter.join(60)
        assert woke.is_set() and jobs.get(job_id).finished is not None


def _followed(follow, jobs, job_id: str, within: float = 60) -> dict:
    """What ``follow`` returned and whether the end was announced by then, from a thread given
    ``within`` seconds (a hang guard, not a timing)."""
    seen: dict = {}

    def run() -> None:
        seen["code"] = follow(jobs, job_id, quiet=True, interval=0.1)
        seen["announced"] = jobs.announced(job_id)

    follower = threading.Thread(target=run, daemon=True)
    follower.start()
    follower.join(within)
    assert not follower.is_alive(), f"the follower of {job_id} did not return within {within:.0f} s"
    return seen


def test_submit_wait_reports_a_job_once_its_worker_has_announced_its_end(client, ws):
    """A job is ended, then priced, then announced: a follower that looks in between waits for
    the announcement (the record complete, spent_usd in it) instead of reporting the bare end;
    one whose worker never announces is reported after END_GRACE. The first follower's grace is
    longer than the hang guard, so only the announcement can end it in time; that it returned
    after the announcement, not on the bare end, is read from Redis when it returns."""
    from bridge.workers.commands import job_control as commands
    from bridge.workers.jobrecords import Jobs
    from bridge.workers.keys import Keys
    jobs = Jobs(client, Keys(ws.namespace), ttl=3600)
    job_id = jobs.create(parse_spec({"kind": "copy", "source": "s3://a-b/", "destination": "gs://c-d/"}), queue="q")
    assert jobs.transition(job_id, "planning", ("queued",))
    assert jobs.finish(job_id, "succeeded", announce=False)   # ended; its worker prices it now

    def price_then_announce() -> None:
        time.sleep(0.7)
        jobs.update(job_id, spent_usd="0.25")
        jobs.announce_end(job_id)

    grace = commands.END_GRACE
    commands.END_GRACE = 120.0
    try:
        threading.Thread(target=price_then_announce, daemon=True).start()
        assert _followed(commands.follow, jobs, job_id) == {"code": 0, "announced": True}
    finally:
        commands.END_GRACE = grace
    assert jobs.get(job_id).spent_usd == 0.25

    silent = jobs.create(parse_spec({"kind": "copy", "source": "s3://a-b/", "destination": "gs://c-d/"}), queue="q")
    assert jobs.finish(silent, "failed", announce=False)   # its worker died before announcing
    commands.END_GRACE = 0.5
    try:
        assert _followed(commands.follow, jobs, silent) == {"code": 1, "announced": False}
    finally:
        commands.END_GRACE = grace


# -- Redis: leases and the sweeper -----------------------------------------------------------

def _lease_parts(client, ws):
    from bridge.workers.keys import Keys
    from bridge.workers.leases import Leases
    return Leases(client, Keys(ws.namespace), ws.lease)


def test_a_duplicate_delivery_finds_the_task_busy_then_done(client, ws):
    from bridge.workers.leases import TaskRef
    leases = _lease_parts(client, ws)
    client.set(leases.keys.job("j1", "pending"), 1)
    first = leases.lease(TaskRef("j1.t0", "bridge.transfer", ["j1", {}], "q", "j1"))
    second = leases.lease(TaskRef("j1.t0", "bridge.transfer", ["j1", {}], "q", "j1"))
    assert first.acquire() == "ok"
    assert second.acquire() == "busy"
    then = TaskRef("j1.finalize", "bridge.finalize", ["j1"], "q", "j1")
    assert first.complete(True, then) == 0
    assert second.acquire() == "done"
    assert second.complete(True, then) == -1  # counted once
    assert TaskRef.decode(client.hget(leases.keys.running, "j1.finalize")).task == "bridge.finalize"
    assert not client.hexists(leases.keys.running, "j1.t0")


def test_a_slow_task_keeps_its_lease_and_is_never_requeued(client, ws):
    from bridge.workers.leases import Sweeper, TaskRef
    leases = _lease_parts(client, ws)
    published: list[TaskRef] = []
    sweeper = Sweeper(leases, published.append)
    lease = leases.lease(TaskRef("j2.t0", "bridge.transfer", ["j2", {}], "q", "j2"))
    assert lease.acquire() == "ok"
    with lease.heartbeat():
        # "work" for 8 renewals (a heartbeat every lease/3: over two lease lifetimes), sweeping
        deadline = time.monotonic() + 60
        while lease.renewals < 8:
            assert time.monotonic() < deadline, f"{lease.renewals} renewals"
            sweeper.sweep()
            time.sleep(ws.sweep)
        sweeper.sweep()
    assert published == [] and not lease.lost.is_set()


def test_a_dead_holders_task_is_requeued_once_after_its_lease_expires(client, ws):
    from bridge.workers.leases import Sweeper, TaskRef
    leases = _lease_parts(client, ws)
    published: list[TaskRef] = []
    sweeper = Sweeper(leases, published.append)
    ref = TaskRef("j3.t0", "bridge.transfer", ["j3", {"files": []}], "bridge.s3", "j3", tag="tag-1", worker="w1@x")
    assert leases.lease(ref).acquire() == "ok"   # then the holder "dies": no heartbeat, no release
    # Held past the registration's own grace (a hand-over's, as long as a lease): while the lease
    # key lives, only the lease stands between the task and a requeue, and no sweep takes it.
    lease_key = leases.keys.lease("j3.t0")
    assert client.persist(lease_key)
    time.sleep(ws.lease)
    for _ in range(3):
        sweeper.sweep()
    assert published == [], "requeued while its lease was held"
    client.pexpire(lease_key, int(ws.lease * 1000))   # now it runs out, by Redis's clock
    died = time.monotonic()
    while not published:
        assert time.monotonic() - died < 60, "never requeued"
        sweeper.sweep()
        time.sleep(ws.sweep)
    assert not client.exists(lease_key)
    assert [(p.id, p.task, p.args, p.queue) for p in published] == [("j3.t0", "bridge.transfer", ["j3", {"files": []}], "bridge.s3")]
    sweeper.sweep()
    assert len(published) == 1 and not client.hexists(leases.keys.running, "j3.t0")
    # the requeued delivery runs it: nobody holds it, it is not done
    assert leases.lease(TaskRef("j3.t0", "bridge.transfer", ["j3", {}], "bridge.s3", "j3")).acquire() == "ok"


def test_a_holder_whose_lease_was_taken_over_learns_it(client, ws):
    from bridge.workers.leases import TaskRef
    leases = _lease_parts(client, ws)
    lease = leases.lease(TaskRef("j4.t0", "bridge.transfer", ["j4"], "q", "j4"))
    assert lease.acquire() == "ok"
    client.set(leases.keys.lease("j4.t0"), "someone-else")
    assert not lease.renew() and lease.lost.is_set()


def test_only_one_sweeper_sweeps_at_a_time(client, ws):
    from bridge.workers.leases import Sweeper, TaskRef
    leases = _lease_parts(client, ws)
    published: list[TaskRef] = []
    ref = TaskRef("j5.t0", "bridge.transfer", ["j5"], "q", "j5", since=time.time() - 60)
    client.hset(leases.keys.running, ref.id, ref.encode())
    barrier = threading.Barrier(4)

    def sweep() -> None:
        barrier.wait()
        Sweeper(leases, published.append).sweep()

    threads = [threading.Thread(target=sweep) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(published) == 1


def test_a_task_whose_worker_keeps_dying_fails_its_job_instead_of_looping(client, ws, tmp_path):
    from bridge.workers.executor import Service
    sent = []
    svc = Service(ws, client, sent.append)
    job_id = svc.submit(parse_spec({"kind": "copy", "source": f"{tmp_path}/", "destination": f"{tmp_path}-copy/"}))
    client.hset(svc.keys.job(job_id, "attempts"), f"{job_id}.plan", ws.max_attempts)
    outcome = svc.run(sent[0])
    assert "started 5 times without finishing" in outcome["error"]
    record = svc.jobs.get(job_id)
    assert record.state == "failed" and "giving up" in record.errors[0]


@pytest.fixture
def local_service(redis_url, namespace, tmp_path):
    """A Service of a worker that may read and write under tmp_path, its messages kept in a list
    instead of sent, and a tree of three files to copy. The lease is 4 s: at 1 s, a plan on a
    loaded machine outlived the lease a test took for a slice (and its own: fenced at 2/3 of it)."""
    from bridge.workers.executor import Service
    from bridge.workers.keys import redis_client
    from bridge.workers.testing import tenant_env
    ws = WorkerSettings.from_env({"BRIDGE_BROKER_URL": redis_url, "BRIDGE_NAMESPACE": namespace,
                                  "BRIDGE_LEASE": "4s", "BRIDGE_SWEEP": "0.2s", "BRIDGE_BATCH_FILES": "2",
                                  **tenant_env(tmp_path / "tenant", local_roots=[str(tmp_path)])})
    sent: list = []
    src = tmp_path / "src"
    for name in ("a", "b", "c"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(name.encode() * 1000)
    return Service(ws, redis_client(redis_url), sent.append), sent, src, tmp_path / "dst"


def _copy_job(svc, src, dst) -> str:
    return svc.submit(parse_spec({"kind": "copy", "source": f"{src}/", "destination": f"{dst}/", "verify": "deep"}))


def test_a_planner_runs_its_first_task_and_the_last_task_runs_finalize_without_sending_them(local_service):
    """The plan's first slice runs in the process that planned and checked it, never sent; a
    slice another worker took from the queue is left to it; the task that finishes a job's last
    slice runs its finalize. Only the other slices go out."""
    svc, sent, src, dst = local_service
    job_id = _copy_job(svc, src, dst)
    plan = sent.pop()
    from bridge.workers.leases import TaskRef
    t1 = svc.leases.lease(TaskRef(f"{job_id}.t1", "bridge.transfer", [job_id], "q", job_id))
    assert t1.acquire() == "ok"   # another worker took the second slice from the queue first
    outcome = svc.run(plan)
    assert [ref.id for ref in sent] == [f"{job_id}.t1"]   # the second slice of two (2 files a task)
    assert outcome["tasks"] == 2 and [o["ok"] for o in outcome["then"]] == [True]   # t0 only: t1 is taken
    assert svc.jobs.get(job_id).state == "running"
    t1.release()
    last = svc.run(sent.pop())
    assert last["ok"] and last["then"][0]["manifest"] and sent == []   # finalize ran here, not sent
    record = svc.jobs.get(job_id)
    assert record.state == "succeeded" and record.counters["tasks_done"] == 2
    assert {p.name: p.read_bytes() for p in dst.iterdir() if p.is_file()} == {n: n.encode() * 1000 for n in "abc"}
    assert not svc.r.hlen(svc.keys.running)   # nothing left registered to be sent again


def test_a_planner_runs_the_slices_it_holds_then_finalize_in_one_delivery(local_service):
    """With nobody else taking them, the planner runs every slice it holds (the first unsent,
    the others sent and found done when their messages come), then the finalize."""
    svc, sent, src, dst = local_service
    job_id = _copy_job(svc, src, dst)
    outcome = svc.run(sent.pop())
    assert [ref.id for ref in sent] == [f"{job_id}.t1"]
    assert [sorted(o) for o in outcome["then"]] == [["bytes", "errors", "moving_ms", "ok", "stopped"]] * 2 + \
        [["manifest"]]
    assert svc.jobs.get(job_id).state == "succeeded"
    assert svc.run(sent.pop()) == {"skipped": "done"}


def test_a_planner_holds_no_more_slices_than_hold_bytes_of_them(local_service, monkeypatch):
    """Past ``HOLD_BYTES`` of slices' text the planner keeps none: those are left to the queue."""
    svc, sent, src, dst = local_service
    monkeypatch.setattr(type(svc), "HOLD_BYTES", 1)   # the first slice is held whatever its size
    job_id = _copy_job(svc, src, dst)
    outcome = svc.run(sent.pop())
    assert [ref.id for ref in sent] == [f"{job_id}.t1"] and len(outcome["then"]) == 1
    assert svc.jobs.get(job_id).state == "running"
    assert svc.run(sent.pop())["then"][0]["manifest"]
    assert svc.jobs.get(job_id).state == "succeeded"


def test_a_first_task_leased_by_a_planner_that_died_is_sent_again_by_the_sweeper(local_service):
    """The planner leases its first slice before the plan is marked done: a planner that dies
    before running it leaves it registered, and the sweeper sends it once the lease expires. The
    delivery is checked as any message is, and runs."""
    from bridge.workers.leases import Sweeper
    svc, sent, src, dst = local_service
    job_id = _copy_job(svc, src, dst)
    lease = svc.leases.lease(sent.pop())
    assert lease.acquire() == "ok"
    outcome, after = svc._step(lease, None)   # the plan, and then the process "dies"
    assert outcome["tasks"] == 2 and after[0].ref.id == f"{job_id}.t0" and [p.id for p in after[2]] == [f"{job_id}.t1"]
    assert [ref.id for ref in sent] == [f"{job_id}.t1"]
    published: list = []
    sweeper, died = Sweeper(svc.leases, published.append), time.monotonic()
    while not published:
        assert time.monotonic() - died < 60, "never sent again"
        sweeper.sweep()
        time.sleep(svc.ws.sweep)
    assert [ref.id for ref in published] == [f"{job_id}.t0"]
    assert svc.run(published[0])["ok"]   # through the signature and scope checks of a message
    assert svc.run(sent.pop())["then"][0]["manifest"]
    assert svc.jobs.get(job_id).state == "succeeded"


def test_a_first_attempt_reads_the_journal_only_when_it_held_files_of_the_plan_before_it(client, ws):
    """What a task is charged for comes from the journal before and after its run. A job whose
    journal held none of its plan's files when it was planned: the first attempt at a slice of
    small files reads nothing before, and nothing after (it knows what it put). A journal left by
    an earlier job with the same plan is read, and what that job finished is not charged again."""
    from bridge.contracts import FilePlan
    from bridge.pipeline.plan import Plan
    from bridge.workers.executor import Recorded, Service
    from bridge.workers.kinds import Files
    svc = Service(ws, client, lambda ref: None)
    kind = Files(64, 2**30)
    small = Plan("/src/", "s3://b-b/", None, [FilePlan(f"f{i}", 10) for i in range(3)], [], "k1").to_dict()
    big = Plan("/src/", "s3://b-b/", None, [FilePlan("big", 100, 10)], [], "k1").to_dict()

    class Counting(Recorded):   # the journal's reads of presence, counted
        reads = 0

        def present(self, keys):
            Counting.reads += 1
            return self.journal.present(keys)

    fresh = Counting(svc.journal("k-fresh"))
    svc._fresh("j1", fresh.journal)
    fresh.put("file:f0", {"size": 10})   # one file put by this job's own earlier task (same slice twice below)
    assert svc._marks("j1", "j1.t0", kind, small, fresh) == (set(), None) and Counting.reads == 0
    assert svc._marks("j1", "j1.t1", kind, big, fresh) == (set(), None) and Counting.reads == 1   # multipart: read
    # the same task again (its worker died): what it found the first time, and what is there now
    assert svc._marks("j1", "j1.t0", kind, small, fresh) == (set(), {"file:f0"}) and Counting.reads == 2
    run = Recorded(fresh)
    run.put_many([("file:f1", {"size": 10}), ("file:f2", {"size": 10})])
    assert run.keys == {"file:f1", "file:f2"}
    assert kind.used(small, set(), run.keys)["destination.req.PUT"] == 2

    earlier = Counting(svc.journal("k-earlier"))
    earlier.put_many([("file:f0", {"size": 10})])   # left by an earlier job with the same plan
    svc._fresh("j2", earlier.journal)
    before, again = svc._marks("j2", "j2.t0", kind, small, earlier)
    assert before == {"file:f0"} and again is None and Counting.reads == 3
    assert kind.used(small, before, before | {"file:f1", "file:f2"})["destination.req.PUT"] == 2
    for journal in (fresh, earlier):
        journal.clear()


# -- fan-out -------------------------------------------------------------------------------

def test_fan_out_keeps_each_multipart_file_whole_and_batches_small_ones():
    from bridge.contracts import FilePlan
    from bridge.pipeline.plan import Plan
    from bridge.workers.kinds import fan_out
    files = [FilePlan(f"s/{i:03d}", 1000) for i in range(130)] + [FilePlan("big1", 100, 10), FilePlan("big2", 300, 10)]
    plan = Plan("s3://a-a/", "gs://b-b/", None, files, [f"old/{i}" for i in range(3)], "key1")
    subs = list(fan_out(plan, batch_files=64, batch_bytes=10**9))
    assert [s.files[0].rel for s in subs[:2]] == ["big2", "big1"] and all(len(s.files) == 1 for s in subs[:2])
    assert [len(s.files) for s in subs[2:5]] == [64, 64, 2]
    assert subs[5].deletions == ["old/0", "old/1", "old/2"] and not subs[5].files
    assert all(s.key == "key1" and s.destination == "gs://b-b/" for s in subs)
    assert sum(s.unit_count() - 1 for s in subs) == plan.unit_count() - 1
    assert [len(s.files) for s in list(fan_out(plan, 1000, 5000))[2:]][:3] == [5, 5, 5]


def test_small_files_go_in_tasks_sized_by_time_that_batch_as_an_in_process_copy_does():
    from bridge.contracts import FilePlan
    from bridge.pipeline.plan import Plan
    from bridge.workers.kinds import MIN_TASK_SECONDS, expected_seconds, fan_out, task_seconds
    plan = Plan("/src/", "s3://b-b/", None, [FilePlan(f"s/{i:05d}", 16384) for i in range(4000)], [], "k")
    plan.batch, plan.slots = 256, 8
    whole = expected_seconds(4000, plan.bytes)
    one, two = task_seconds(plan, 1, 10.0), task_seconds(plan, 2, 10.0)
    # one pool process: one task (nothing could take a share of a late one); several: three each
    assert one == pytest.approx(whole) and two == pytest.approx(whole / 6)
    assert task_seconds(plan, 1, 1.0) == 1.0 and task_seconds(plan, 1000, 10.0) == MIN_TASK_SECONDS
    # (and a job longer than ``longest`` still comes in several: 7.6 s expected, 1 s tasks)
    for slots, seconds, tasks in ((1, one, 1), (2, two, 6), (1, 1.0, 8)):
        subs = list(fan_out(plan, 5000, 2**40, seconds=seconds))
        assert len(subs) == tasks and sum(len(s.files) for s in subs) == 4000
        assert all(expected_seconds(len(s.files) - 1, s.bytes - 16384) < seconds for s in subs)
        # each task sends its files in batch units (many requests from one thread), as cp does
        assert all((s.batch, s.slots) == (256, 8) for s in subs)
        assert {u["op"] for u in subs[0].units()} == {"batch"}
    assert [len(s.files) for s in fan_out(plan, 1500, 2**40, seconds=100)] == [1500, 1500, 1000]


def test_a_task_of_small_files_carries_at_most_its_share_of_the_jobs_bytes():
    """The few larger files of a corpus (under the part size, so not spread by parts) each get a
    task of their own when several processes share the job, instead of one task at the end."""
    from bridge.contracts import FilePlan
    from bridge.pipeline.plan import Plan
    from bridge.workers.kinds import MIN_SHARE_BYTES, TASKS_PER_SLOT, fan_out, share_bytes, task_seconds
    kib, mib = 1024, 1024 * 1024
    files = [FilePlan(f"d/{i:04d}", 64 * kib) for i in range(800)] + [FilePlan("mid0", 8 * mib), FilePlan("mid1", 8 * mib)]
    plan = Plan("/src/", "az://b-b/", None, files, [], "k")
    assert share_bytes(plan, 1) is None
    share = share_bytes(plan, 8)
    assert share == -(-plan.bytes // (8 * TASKS_PER_SLOT))
    subs = list(fan_out(plan, 50, min(10**9, share), seconds=task_seconds(plan, 8, 10.0)))
    assert sum(len(s.files) for s in subs) == 802
    # each 8 MiB file alone, every other task within the share (the time estimate alone put
    # both in the last task: 16 MiB, a tenth of a second at this machine's pace)
    assert [[f.rel for f in s.files] for s in subs[-2:]] == [["mid0"], ["mid1"]]
    assert all(s.bytes <= share for s in subs if len(s.files) > 1)
    without = list(fan_out(plan, 50, 10**9, seconds=task_seconds(plan, 8, 10.0)))
    assert [f.rel for f in without[-1].files] == ["mid0", "mid1"]
    # the rule makes at most about TASKS_PER_SLOT x slots tasks (plus one per file over the share)
    assert len(subs) <= 8 * TASKS_PER_SLOT + 2
    # one of a job's 16 listing parts (a folder of 30 files): the job's bytes taken as 16 times
    # the part's, so its files go in two tasks, not one that a host carries alone at the end
    part = Plan("/src/", "az://b-b/", None, files[:30], [], "k")
    share = share_bytes(part, 8, 16)
    assert share == -(-part.bytes * 16 // (8 * TASKS_PER_SLOT))
    assert [len(s.files) for s in fan_out(part, 50, share, seconds=task_seconds(part, 8, 10.0))] == [20, 10]
    assert [len(s.files) for s in fan_out(part, 50, 10**9, seconds=task_seconds(part, 8, 10.0))] == [30]
    # but a part of a few small files beside a large one is not cut a file a task: the share
    # never goes below MIN_SHARE_BYTES
    few = Plan("/src/", "az://b-b/", None, files[:3], [], "k")
    assert share_bytes(few, 4, 2) == MIN_SHARE_BYTES
    assert [len(s.files) for s in fan_out(few, 50, share_bytes(few, 4, 2), seconds=task_seconds(few, 4, 10.0))] == [3]


def test_fan_out_spreads_the_parts_of_a_file_bigger_than_file_task_bytes_over_tasks():
    from bridge.contracts import FilePlan
    from bridge.pipeline.plan import Plan
    from bridge.workers.kinds import fan_out, split
    files = [FilePlan("big", 95, 10), FilePlan("mid", 30, 10), FilePlan("s", 5)]
    plan = Plan("s3://a-a/", "gs://b-b/", None, files, [], "key1")
    subs = list(fan_out(plan, batch_files=64, batch_bytes=10**9, file_task_bytes=40))
    ranges = [[(f.rel, list(f.part_numbers())) for f in s.files] for s in subs]
    assert ranges == [[("big", [1, 2, 3, 4])], [("big", [5, 6, 7, 8])], [("big", [9, 10])],
                      [("mid", [1, 2, 3])], [("s", [1])]]
    assert [f.rel for f in split(plan, 40)] == ["big"]
    # a task that holds some of a file's parts does not complete it; one that holds them all does
    assert [u["op"] for u in subs[0].units()] == ["part"] * 4 and subs[0].unit_count() == 4 + 1
    assert subs[3].unit_count() == 3 + 1 + 1
    # every part is in exactly one task
    assert sorted(n for s in subs[:3] for n in s.files[0].part_numbers()) == list(range(1, 11))
    assert Plan.from_dict(subs[1].to_dict()).files[0].part_numbers() == range(5, 9)


# -- commands -------------------------------------------------------------------------------

def test_help_does_not_import_celery_or_redis():
    code = ("import sys; from bridge import cli; cli._register_extensions(); "
            "print(sorted(m for m in ('celery', 'kombu', 'redis') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stderr


@pytest.mark.parametrize("args, words", [
    (["submit", "cp", "ftp://x/y", "s3://dst-b/"], "unknown scheme 'ftp'"),
    (["submit", "cp", "s3://src-b/a/", "s3://src-b/a/b/"], "inside the source"),
    (["submit", "sync", "s3://src-b/a/", "gs://dst-b/", "--chunk-size", "big"], "invalid size"),
    (["submit", "cp", "s3://src-b/a/", "gs://dst-b/", "--verify", "maybe"], "verify"),
    (["jobs", "status", "nosuchjob"], "no job 'nosuchjob'"),
])
def test_bad_input_is_refused_on_one_line_before_anything_is_queued(args, words, ws, client):
    env = {**os.environ, "BRIDGE_BROKER_URL": ws.broker_url, "BRIDGE_NAMESPACE": ws.namespace}
    result = subprocess.run([sys.executable, "-m", "bridge", *args], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mcbridge: error:") and words in lines[0], result.stderr
    assert not list(client.scan_iter(match=f"{ws.namespace}:*"))


def test_an_unreachable_broker_is_one_line_without_its_password():
    env = {**os.environ, "BRIDGE_BROKER_URL": "redis://:hunter2@127.0.0.1:1/0"}
    result = subprocess.run([sys.executable, "-m", "bridge", "submit", "cp", "s3://src-b/", "gs://dst-b/"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "cannot reach the broker" in result.stderr
    assert "hunter2" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_submit_dry_run_names_the_queue():
    result = subprocess.run([sys.executable, "-m", "bridge", "submit", "cp", "/data/x/", "az://dst-c/x/",
                             "--dry-run", "--json"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "BRIDGE_BROKER_URL": "redis://127.0.0.1:1/0"})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["queue"] == "bridge.az"
