"""A job on the Celery workers by the sts route: the remote job runs from a worker, the job's
record, `jobs status` and the worker's log say which route ran and never hold a credential."""

from __future__ import annotations

import json

from tests.doubles.sts import StorageTransferDouble
from tests.helpers import read_tree, settings_for
from tests.test_native_sts import FILES, SECRET, fill
from tests.test_workers_service import service  # noqa: F401  (the fixture)


def stored_value(redis, key) -> object:
    kind = redis.type(key)
    kind = kind.decode() if isinstance(kind, bytes) else kind
    return {"string": redis.get, "hash": redis.hgetall, "list": lambda k: redis.lrange(k, 0, -1),
            "set": redis.smembers, "zset": lambda k: redis.zrange(k, 0, -1, withscores=True),
            "stream": lambda k: redis.xrange(k)}.get(kind, lambda k: kind)(key)


def test_a_job_on_the_workers_by_sts_keeps_no_secret(service, make_root, moto, fake_gcs, azurite):  # noqa: F811
    with StorageTransferDouble(gcs_endpoint=fake_gcs.endpoint, s3_endpoint=moto.endpoint,
                               azure_endpoint=f"{azurite.endpoint}/{{account}}") as double:
        service.env.update(MCBRIDGE_STS_ENDPOINT=double.endpoint, MCBRIDGE_POLL_INTERVAL="0.05",
                           AWS_SECRET_ACCESS_KEY=SECRET)
        settings = settings_for(service.env)
        src, dst = make_root("s3"), make_root("gs")
        fill(src, settings, FILES)
        worker = service.worker("w1")
        worker.wait_ready()
        result = service.cli("submit", "cp", src, dst, "--route", "sts", "--wait", "--json")
        assert result.returncode == 0, result.stderr + result.stdout
        status = json.loads(result.stdout)
        assert status["state"] == "succeeded" and status["verify"]["ok"], status
        assert status["route"]["name"] == "sts" and status["route"]["bytes_through_bridge"] == 0
        assert double.server.calls(":run"), "the worker ran the transfer job"
        assert read_tree(dst, settings) == FILES
        text = service.cli("jobs", "status", status["id"]).stdout
        assert "route        sts:" in text
        stored = "".join(f"{key}={stored_value(service.redis, key)!r}" for key in service.redis.scan_iter(
            f"{service.env['BRIDGE_NAMESPACE']}*"))
        assert "sts" in stored
        for shown in (result.stdout, result.stderr, text, stored, worker.log_tail(400)):
            assert SECRET not in shown and "secretAccessKey" not in shown


def test_a_copy_on_the_workers_that_nothing_proved_is_not_called_verified(service, make_root, moto, fake_gcs,  # noqa: F811
                                                                        azurite):
    """Azure computes no checksum of a blob: an az -> gs copy by Storage Transfer has nothing
    both stores computed to prove it. The job copies, and its record says the copy is unproven,
    not verified, so nothing downstream (retention, a replica's lag) counts it."""
    with StorageTransferDouble(gcs_endpoint=fake_gcs.endpoint, s3_endpoint=moto.endpoint,
                               azure_endpoint=f"{azurite.endpoint}/{{account}}") as double:
        service.env.update(MCBRIDGE_STS_ENDPOINT=double.endpoint, MCBRIDGE_POLL_INTERVAL="0.05")
        settings = settings_for(service.env)
        src, dst = make_root("az"), make_root("gs")
        fill(src, settings, FILES)
        service.worker("w1").wait_ready()
        result = service.cli("submit", "cp", src, dst, "--route", "sts", "--wait", "--json")
        status = json.loads(result.stdout)
        assert status["state"] == "succeeded" and read_tree(dst, settings) == FILES, status
        assert status["verify"]["unproven"] == len(FILES) and not status["verify"]["ok"], status["verify"]
        text = service.cli("jobs", "status", status["id"]).stdout
        assert f"verified     NOT PROVEN (store): {len(FILES)} files" in text, text
        assert f"{len(FILES)} unproven (verify --deep reads them)" in text


def test_jobs_cancel_cancels_the_remote_job(service, make_root, moto, fake_gcs, azurite):  # noqa: F811
    import os
    import time
    from bridge.manifest import read as read_manifest
    from bridge.stores import get_store
    from bridge.urls import parse
    with StorageTransferDouble(gcs_endpoint=fake_gcs.endpoint, s3_endpoint=moto.endpoint,
                               azure_endpoint=f"{azurite.endpoint}/{{account}}", delay=0.3) as double:
        service.env.update(MCBRIDGE_STS_ENDPOINT=double.endpoint, MCBRIDGE_POLL_INTERVAL="0.05")
        settings = settings_for(service.env)
        files = {f"f{i:02d}": os.urandom(100) for i in range(20)}
        src, dst = make_root("s3"), make_root("gs")
        fill(src, settings, files)
        service.worker("w1").wait_ready()
        job_id = service.submit("cp", src, dst, "--route", "sts")
        deadline = time.monotonic() + 60
        while not any(r.objects_copied >= 2 for _m, r in double.operations.values()):
            assert time.monotonic() < deadline, "the transfer did not start"
            time.sleep(0.05)
        cancelled = service.cli("jobs", "cancel", job_id)
        assert cancelled.returncode == 0, cancelled.stderr
        assert service.wait(job_id).state == "cancelled"
        deadline = time.monotonic() + 30
        while not double.server.calls(":cancel"):
            assert time.monotonic() < deadline, "the remote operation was not cancelled"
            time.sleep(0.05)
        ((_meta, remote),) = double.operations.values()
        remote.finished.wait(10)
        assert remote.state == "cancelled" and remote.objects_copied < 20
        assert read_manifest(get_store(parse(dst), settings), parse(dst)) is None
