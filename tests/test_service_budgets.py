"""Monthly budgets in the service: real Redis, a real worker, moto. A job that would pass its
budget waits in awaiting-approval, moves nothing until approved, and is charged when it ends."""

from __future__ import annotations

import json
import time

import pytest

from tests.emulators import unique_name
from tests.test_budgets import object_requests
from tests.test_workers_service import service  # noqa: F401  (the fixture: a namespace, workers, the CLI)
from workers.budgets import Budgets

pytestmark = pytest.mark.timeout(240)


def test_a_job_over_its_monthly_budget_waits_for_approval_and_is_charged(service, moto):  # noqa: F811
    src, dst = unique_name(), unique_name()
    moto.create_bucket(src)
    moto.create_bucket(dst)
    for i in range(20):
        moto.client().put_object(Bucket=src, Key=f"train/{i:03d}.bin", Body=bytes([i]) * 4000)
    budgets = Budgets(service.redis, service.keys)

    r = service.cli("budgets", "set", "golden", "0.00001")
    assert r.returncode == 0, r.stderr
    service.worker("w1", concurrency=1).wait_ready()

    mark = moto.log_path.stat().st_size
    r = service.cli("submit", "cp", f"s3://{src}/train/", f"s3://{dst}/copy/", "--budget", "golden")
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip()
    assert "awaits approval" in r.stderr and f"mcbridge jobs approve {job_id}" in r.stderr
    record = service.jobs.get(job_id)
    assert record.state == "awaiting-approval" and record.budget == "golden"
    assert record.estimate_usd > 0.00001

    # held: the worker is up but nothing was queued, so no object was read or written
    status = json.loads(service.cli("jobs", "status", job_id, "--json").stdout)
    assert status["state"] == "awaiting-approval" and status["estimate_usd"] == pytest.approx(record.estimate_usd)
    assert object_requests(moto, {src, dst}, mark) == []
    assert budgets.spent("golden") == 0

    r = service.cli("jobs", "approve", job_id)
    assert r.returncode == 0 and "approved" in r.stdout, r.stderr
    done = service.wait(job_id)
    assert done.state == "succeeded", done.errors
    # the worker that ended the job charges it right after (exactly once: it won the transition)
    deadline = time.monotonic() + 30
    while done.spent_usd is None and time.monotonic() < deadline:
        time.sleep(0.1)
        done = service.jobs.get(job_id)
    assert moto.client().list_objects_v2(Bucket=dst, Prefix="copy/")["KeyCount"] == 21   # 20 files, the manifest
    # everything planned was moved: the whole estimate is charged, to the job and to the month
    assert done.spent_usd == pytest.approx(done.estimate_usd, rel=1e-3)
    assert budgets.spent("golden") == pytest.approx(done.estimate_usd, rel=1e-3)
    listed = json.loads(service.cli("budgets", "list", "--json").stdout)
    assert listed["budgets"]["golden"]["spent_usd"] == pytest.approx(done.estimate_usd, rel=1e-3)

    again = service.cli("jobs", "approve", job_id)
    assert again.returncode == 1 and "not awaiting approval" in again.stderr

    # within budget: queued at once
    budgets.set("roomy", 100)
    r = service.cli("submit", "cp", f"s3://{src}/train/", f"s3://{dst}/copy2/", "--budget", "roomy", "--wait")
    assert r.returncode == 0, r.stderr
    assert "awaits approval" not in r.stderr


def test_a_job_awaiting_approval_can_be_cancelled(service, moto):  # noqa: F811
    src = unique_name()
    moto.create_bucket(src)
    moto.client().put_object(Bucket=src, Key="a/x.bin", Body=b"x" * 1000)
    Budgets(service.redis, service.keys).set("tight", 0)
    r = service.cli("submit", "cp", f"s3://{src}/a/", f"s3://{src}/b/", "--budget", "tight")
    job_id = r.stdout.strip()
    assert service.jobs.get(job_id).state == "awaiting-approval"
    r = service.cli("jobs", "cancel", job_id)
    assert r.returncode == 0, r.stderr
    assert service.jobs.get(job_id).state == "cancelled"
    assert service.cli("jobs", "approve", job_id).returncode == 1
