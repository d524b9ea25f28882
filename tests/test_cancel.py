"""Cancel stops the bytes: a 200 MiB copy on the service, limited to a rate at which 30% is
reached in seconds, cancelled there; ``jobs cancel`` returns once its workers have stopped, and
from then on a counting proxy in front of the store sees (nearly) nothing more: no object, no
manifest, no upload left, and the record ends when the last worker stopped."""

from __future__ import annotations

import calendar
import os
import time

import pytest

from tests.emulators import unique_name
from tests.faultproxy import FaultProxy
from tests.test_workers_service import service  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(300)
MiB = 1024 * 1024


def test_cancel_at_30_percent_of_a_200_mib_copy_to_s3_stops_the_bytes(service, moto, tmp_path):  # noqa: F811
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "model.bin", "wb") as f:
        for _ in range(25):
            f.write(os.urandom(8 * MiB))
    bucket = unique_name()
    moto.create_bucket(bucket)
    with FaultProxy(moto.endpoint) as proxy:
        service.env["AWS_ENDPOINT_URL"] = proxy.endpoint   # the workers reach S3 through the proxy
        service.worker("w1", concurrency=2, threads=4).wait_ready()
        job_id = service.submit("cp", f"{src}/", f"s3://{bucket}/c/", "--bwlimit", "16MiB", "--chunk-size", "8MiB")
        deadline = time.monotonic() + 120
        while True:
            record = service.jobs.get(job_id)
            done = record.counters.get("bytes_done", 0)
            if done >= 0.3 * 200 * MiB:
                break
            assert time.monotonic() < deadline and record.state in ("queued", "planning", "running"), record
            time.sleep(0.05)

        asked = time.time()
        r = service.cli("jobs", "cancel", job_id)
        assert r.returncode == 0 and "workers stopped" in r.stdout, r.stdout + r.stderr
        at_return = proxy.counts["bytes_up"] + proxy.counts["bytes_down"]
        time.sleep(3)   # whatever a worker still had in flight would arrive now
        after = proxy.counts["bytes_up"] + proxy.counts["bytes_down"] - at_return
        assert after < 2 * MiB, after
        print(f"cancel at {done / MiB:.0f} MiB done; {after} bytes at the proxy after the cancel returned; "
              f"{proxy.counts['bytes_up'] / MiB:.0f} MiB sent in all")

        record = service.jobs.get(job_id)
        assert record.state == "cancelled" and record.errors == []
        finished = calendar.timegm(time.strptime(record.to_dict()["finished"], "%Y-%m-%dT%H:%M:%SZ"))
        assert finished >= int(asked)   # the end is when its last task stopped, not when it was asked
        s3 = moto.client()
        assert s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0   # no object, no manifest
        assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads"), "an upload was left"
        text = service.cli("jobs", "status", job_id).stdout
        assert "cancelled" in text.splitlines()[0]
