"""A submitter queues the plan task without Celery (workers/broker.py ``direct_publisher``): the
message must be the one ``app.send_task`` puts in Redis, so that any worker takes it as its own;
and beat's signatures, made on first use (workers/auth.py), still pickle as beat's schedule file
keeps them. Against a real Redis."""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import sys
import uuid
from pathlib import Path

from bridge.workers.broker import direct_publisher
from bridge.workers.keys import redis_client
from bridge.workers.leases import TaskRef
from bridge.workers.testing import purge_namespace
from tests.test_workers_service import service  # noqa: F401  (the fixture: workers, Redis, one tenant)

# What differs between two sends of the same task by design: fresh ids, and who sent it.
VOLATILE = {("properties", "reply_to"), ("properties", "delivery_tag"), ("headers", "origin")}


def _comparable(raw: bytes) -> dict:
    message = json.loads(raw)
    for part, field in VOLATILE:
        message[part].pop(field)
    message["body"] = json.loads(base64.b64decode(message["body"]))
    return message


def test_the_direct_message_is_the_one_celery_sends(redis_url):
    from bridge.workers.app import app, configure
    from bridge.workers.settings import WorkerSettings
    namespace = f"mcbt-{uuid.uuid4().hex[:10]}"
    ws = WorkerSettings.from_env({"BRIDGE_BROKER_URL": redis_url, "BRIDGE_NAMESPACE": namespace})
    configure(ws)
    client = redis_client(redis_url)
    try:
        ref = TaskRef("abc123.plan", "bridge.plan", ["abc123"], "bridge.s3", "abc123")
        # a connection of these settings: the app's pool may hold one an earlier test of this
        # process made for another namespace (configure changes the settings, not that pool)
        with app.connection_for_write() as conn:
            app.send_task(ref.task, args=ref.args, task_id=ref.id, queue=ref.queue, connection=conn)
        direct_publisher(client, ws.key_prefix)(ref)
        queued = client.lrange(f"{namespace}:bridge.s3", 0, -1)
        assert len(queued) == 2, queued
        direct, celery = (_comparable(raw) for raw in queued)   # LPUSH: the newest first
        assert direct == celery
        assert direct["body"][0] == ["abc123"] and direct["headers"]["task"] == "bridge.plan"
    finally:
        purge_namespace(redis_url, namespace)


def test_a_submit_imports_no_celery_and_its_job_runs(service, make_root, tmp_path):
    """The submitter's process never imports Celery, kombu or pydantic (its spec is checked
    without it: ~0.15 s of each submit's start); a worker runs the job it queued."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("hello")
    dst = make_root("local")
    probe = ("import runpy, sys\n"
             "sys.argv = ['mcbridge', 'submit', 'cp', sys.argv[1], sys.argv[2], '--wait', '--json']\n"
             "try:\n"
             "    runpy.run_module('bridge', run_name='__main__')\n"
             "finally:\n"
             "    print('IMPORTED', sorted(m for m in ('celery', 'kombu', 'pydantic') if m in sys.modules), file=sys.stderr)\n")
    service.worker("w1").wait_ready()
    result = subprocess.run([sys.executable, "-c", probe, f"{src}/", dst], env=service.env,
                            capture_output=True, text=True, timeout=120)
    assert "IMPORTED []" in result.stderr, result.stderr
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["state"] == "succeeded"
    assert (Path(dst) / "a.txt").read_text() == "hello"


def test_beat_signatures_pickle_across_processes(tmp_path):
    """An entry pickled by one beat (the class made on first use) loads in a fresh process,
    before anything there has asked for the class."""
    from bridge.workers import auth
    blob = pickle.dumps(auth.BeatSignature("bridge.scheduled", "nightly", {"kind": "copy"}))
    out = subprocess.run([sys.executable, "-c",
                          "import pickle, sys; s = pickle.loads(sys.stdin.buffer.read()); "
                          "print(type(s).__module__, type(s).__qualname__, s._func_params['args'])"],
                         input=blob, capture_output=True, timeout=60, env={**os.environ})
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode().split(None, 2) == ["bridge.workers.auth", "BeatSignature",
                                                  "('bridge.scheduled', 'nightly', {'kind': 'copy'})\n"]
    assert pickle.loads(blob) == auth.BeatSignature("bridge.scheduled", "nightly", {"kind": "copy"})
