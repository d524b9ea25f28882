"""Redis restarted without persistence mid-job: every record, queue, lease and journal is gone.

A Redis of the test's own that keeps nothing on disk (tests/emulators.py ``RedisServer``), two
real worker processes, moto over HTTP. What must hold: the workers stop the job's tasks (their
leases and the job are gone), nothing finalizes it, so no manifest is written and nothing at the
destination looks committed; nothing of the job is made again in the empty Redis; the user who
followed it (``submit --wait``) gets one line saying it is lost and how to run it again, and
``jobs status`` one line too; the sync run again adopts what the lost job had uploaded and ends
verified. (With persistence, the job resumes: tests/test_hosts.py.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from bridge.workers.testing import ServiceProcess, tenant_env
from tests.emulators import RedisServer
from tests.helpers import has_record

pytestmark = pytest.mark.timeout(300)

FILES = 240


def _data_puts(moto, bucket: str, since: int = 0) -> list[str]:
    """Keys of the data objects PUT (whole, answered 200) under out/, from line ``since`` of moto's log."""
    import re
    line = re.compile(rf'"PUT /{re.escape(bucket)}/out/(?P<key>[^ ?]+) HTTP/1\.1" 200')
    text = "\n".join(moto.log_path.read_text(errors="replace").splitlines()[since:])
    return [m["key"] for m in line.finditer(text) if not m["key"].startswith("_bridge/")]


def _log_length(moto) -> int:
    return len(moto.log_path.read_text(errors="replace").splitlines())


@pytest.fixture
def lone_redis():
    server = RedisServer()
    server.start()
    yield server
    server.stop()


def test_redis_restarted_without_persistence_loses_the_job_clearly_and_commits_nothing(
        lone_redis, emulator_env, emulator_for, tmp_path, tmp_path_factory):
    moto = emulator_for("s3")
    bucket = f"loss-{uuid.uuid4().hex[:8]}"
    moto.create_bucket(bucket)
    src = tmp_path / "src"
    for n in range(FILES):
        path = src / f"d{n % 3}" / f"f{n:04d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(32 * 1024))
    namespace = f"loss-{uuid.uuid4().hex[:8]}"
    env = {**emulator_env, "BRIDGE_BROKER_URL": lone_redis.url(0), "BRIDGE_NAMESPACE": namespace,
           "BRIDGE_LEASE": "3s", "BRIDGE_SWEEP": "0.5s", "BRIDGE_METRICS_PORT": "0",
           "MCBRIDGE_STATE_DIR": str(tmp_path / "state"),
           **tenant_env(tmp_path_factory.mktemp("tenant"), local_roots=[str(tmp_path)])}
    workers = [ServiceProcess.worker({**env, "MCBRIDGE_CONCURRENCY": "4"}, f"w{n}", tmp_path, concurrency=1)
               for n in (1, 2)]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.wait_ready()
        import redis as redislib
        client = redislib.Redis.from_url(lone_redis.url(0), decode_responses=True)
        dst = f"s3://{bucket}/out/"
        follower = subprocess.Popen([sys.executable, "-m", "bridge", "submit", "sync", f"{src}/", dst,
                                     "--bwlimit", "768KiB", "--wait"],
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        job_id = None
        deadline = time.monotonic() + 120
        while True:   # mid-job: some files sent, most not
            assert time.monotonic() < deadline, "the job never got going"
            assert follower.poll() is None, follower.communicate()
            ids = client.zrange(f"{namespace}:jobs", 0, -1)
            if ids:
                job_id = ids[0]
                done = int(client.hget(f"{namespace}:job:{job_id}", "files_done") or 0)
                if done >= 20:
                    break
            time.sleep(0.05)
        assert done < FILES - 40, "the job was nearly done before the restart: no test"

        lone_redis.restart(down=1.0)

        out, err = follower.communicate(timeout=120)
        assert follower.returncode == 1, (out, err)
        last = err.strip().splitlines()[-1]
        assert f"job {job_id} is lost" in last and "nothing of it was committed" in last, err
        assert f"mcbridge submit sync {src}/ {dst}" in last, last

        # the workers stop: no object written for a while, and none committed
        mark, quiet_since = len(_data_puts(moto, bucket)), time.monotonic()
        while time.monotonic() - quiet_since < 4:
            now = len(_data_puts(moto, bucket))
            if now != mark:
                mark, quiet_since = now, time.monotonic()
            assert time.monotonic() - quiet_since < 60
            time.sleep(0.2)
        uploaded = set(_data_puts(moto, bucket))
        assert 0 < len(uploaded) < FILES
        assert not has_record(dst, env), "a lost job left a manifest"
        listing = moto.client().list_objects_v2(Bucket=bucket, Prefix="out/_bridge/")
        assert not [o["Key"] for o in listing.get("Contents", []) if "manifest" in o["Key"]], listing
        # nothing of the job made again in the empty Redis (a record of counters nobody reads)
        assert client.keys(f"{namespace}:job:{job_id}*") == [], client.keys(f"{namespace}:job:{job_id}*")
        assert client.hlen(f"{namespace}:running") == 0

        status = subprocess.run([sys.executable, "-m", "bridge", "jobs", "status", job_id], env=env,
                                capture_output=True, text=True, timeout=60)
        assert status.returncode != 0 and "Traceback" not in status.stderr
        assert len(status.stderr.strip().splitlines()) == 1 and "Redis lost it" in status.stderr, status.stderr

        # run again: what the lost job uploaded is adopted, not sent again
        mark = _log_length(moto)
        again = subprocess.run([sys.executable, "-m", "bridge", "submit", "sync", f"{src}/", dst, "--wait"],
                               env=env, capture_output=True, text=True, timeout=240)
        assert again.returncode == 0, again.stderr
        resent = set(_data_puts(moto, bucket, mark))
        assert not resent & uploaded, sorted(resent & uploaded)[:5]
        assert len(resent) + len(uploaded) == FILES
        assert has_record(dst, env)
        print(f"lost with {len(uploaded)} of {FILES} files uploaded; the rerun adopted them and sent {len(resent)}")
    finally:
        for worker in workers:
            worker.stop()
