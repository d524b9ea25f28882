"""Monthly budgets in the service: real Redis, a real worker, moto. A job that would pass its
budget waits in awaiting-approval, moves nothing until approved, and is charged when it ends."""

from __future__ import annotations

import json
import re
import time
from collections import Counter

import pytest

from tests.emulators import unique_name
from tests.test_budgets import object_requests
from tests.test_workers_service import service  # noqa: F401  (the fixture: a namespace, workers, the CLI)
from bridge.workers.redisbudgets import Budgets

pytestmark = pytest.mark.timeout(240)
_LINE = re.compile(r'"(?:\x1b\[[0-9;]*m)*(?P<method>[A-Z]+) /(?P<bucket>[^/?\s]+)[^"]* HTTP/1\.1')


def bucket_requests(moto, buckets: set[str], since: int) -> list[str]:
    """Every request moto logged for ``buckets`` after byte offset ``since``."""
    text = moto.log_path.read_bytes()[since:].decode(errors="replace")
    return [m.group(0) for m in _LINE.finditer(text) if m["bucket"] in buckets]


def test_a_job_over_its_monthly_budget_waits_for_approval_and_is_charged(service, moto):  # noqa: F811
    src, dst = unique_name(), unique_name()
    moto.create_bucket(src)
    moto.create_bucket(dst)
    for i in range(20):
        moto.client().put_object(Bucket=src, Key=f"train/{i:03d}.bin", Body=bytes([i]) * 4000)
    moto.client().put_object(Bucket=src, Key="train/weights.bin", Body=b"w" * (9 * 1024 * 1024))  # 2 parts
    budgets = Budgets(service.redis, service.keys)

    r = service.cli("budgets", "set", "golden", "0.00001")
    assert r.returncode == 0, r.stderr
    service.worker("w1", concurrency=1).wait_ready()

    mark = moto.log_path.stat().st_size
    r = service.cli("submit", "cp", f"s3://{src}/train/", f"s3://{dst}/copy/", "--budget", "golden")
    assert r.returncode == 3, r.stderr   # held: neither queued nor failed
    job_id = r.stdout.strip()
    assert "awaits approval" in r.stderr and f"mcbridge jobs approve {job_id}" in r.stderr
    assert "queued" not in r.stderr
    record = service.jobs.get(job_id)
    assert record.state == "awaiting-approval" and record.budget == "golden"
    assert record.estimate_usd > 0.00001

    # held: the worker is up but nothing was queued, so no object was read or written
    status = json.loads(service.cli("jobs", "status", job_id, "--json").stdout)
    assert status["state"] == "awaiting-approval" and status["estimate_usd"] == pytest.approx(record.estimate_usd)
    assert object_requests(moto, {src, dst}, mark) == []
    assert budgets.spent("golden") == 0

    mark = moto.log_path.stat().st_size
    r = service.cli("jobs", "approve", job_id)
    assert r.returncode == 0 and "approved" in r.stdout, r.stderr
    done = service.wait(job_id)
    assert done.state == "succeeded", done.errors
    # the worker that ended the job charges it right after (exactly once: it won the transition)
    deadline = time.monotonic() + 30
    while done.spent_usd is None and time.monotonic() < deadline:
        time.sleep(0.1)
        done = service.jobs.get(job_id)
    ran = bucket_requests(moto, {src, dst}, mark)
    assert moto.client().list_objects_v2(Bucket=dst, Prefix="copy/")["KeyCount"] == 22   # 21 files, the manifest
    # spent is what the worker's meter counted (the listing, each file, both parts, the commit,
    # the verify, the bucket's region looked up), every request moto logged for the job's buckets,
    # priced with the price table: requests by class, and the bytes read out of S3 to this site
    metered = done.metered
    assert sum(sum(row["requests"].values()) for row in metered.values()) == len(ran)
    from tests.test_meter import request_usd
    kinds = sum((Counter(row["requests"]) for row in metered.values()), Counter())
    # one account: the store copied inside itself (CopyObject, UploadPartCopy), no byte left it
    assert done.route["name"] == "server" and kinds["COPY"] >= 21
    assert done.spent_usd == pytest.approx(request_usd("s3", kinds), rel=1e-9)
    assert budgets.spent("golden") == pytest.approx(done.spent_usd)
    listed = json.loads(service.cli("budgets", "list", "--json").stdout)
    assert listed["budgets"]["golden"]["spent_usd"] == pytest.approx(done.spent_usd, rel=1e-3)
    # estimate and meter side by side
    text = service.cli("jobs", "status", job_id).stdout
    assert f"metered {len(ran)} requests" in text and "estimated $" in text, text

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
    r = service.cli("submit", "cp", f"s3://{src}/a/", f"s3://{src}/b/", "--budget", "tight", "--json")
    assert r.returncode == 3, r.stderr
    job_id = json.loads(r.stdout)["id"]
    assert json.loads(r.stdout)["state"] == "awaiting-approval"
    assert service.jobs.get(job_id).state == "awaiting-approval"
    r = service.cli("jobs", "cancel", job_id)
    assert r.returncode == 0, r.stderr
    assert service.jobs.get(job_id).state == "cancelled"
    assert service.cli("jobs", "approve", job_id).returncode == 1


def _priced(service, job_id: str):
    """The job's record once the worker that ended it has priced it (right after the state moves)."""
    deadline = time.monotonic() + 30
    record = service.jobs.get(job_id)
    while record.spent_usd is None and time.monotonic() < deadline:
        time.sleep(0.1)
        record = service.jobs.get(job_id)
    return record


def test_spend_is_priced_from_what_ran_a_cut_short_job_costs_less(service, moto):  # noqa: F811
    """A pack job is charged what its meter counted. A copy whose source lost half its files after
    it was priced sends only the rest and is charged for those: the estimate scaled by bytes moved
    over bytes planned (6 of 6 at the worker) would charge it all."""
    src, dst = unique_name(), unique_name()
    moto.create_bucket(src)
    moto.create_bucket(dst)
    for i in range(12):
        moto.client().put_object(Bucket=src, Key=f"c/{i:02d}.bin", Body=bytes([i]) * 3000)
    budgets = Budgets(service.redis, service.keys)
    budgets.set("team", 100)
    service.worker("w1", concurrency=1).wait_ready()

    r = service.cli("submit", "pack", f"s3://{src}/c/", f"s3://{dst}/shards/", "--shard-size", "16KiB",
                    "--budget", "team", "--wait", "--json")
    assert r.returncode == 0, r.stderr
    packed = _priced(service, json.loads(r.stdout)["id"])
    # what its meter counted, priced: the requests by class, and the bytes read out of S3 to this site
    from tests.test_meter import request_usd
    kinds = sum((Counter(row["requests"]) for row in packed.metered.values()), Counter())
    read = packed.metered[f"s3://{src}"]["bytes_read"]
    assert read >= 12 * 3000
    assert packed.spent_usd == pytest.approx(request_usd("s3", kinds) + read / 2**30 * 0.09, rel=1e-9)

    # priced with all 12 files; then 6 of them vanish before the worker reads them
    from bridge.workers.app import configure, service as make_service
    from bridge.workers.settings import WorkerSettings
    configure(WorkerSettings.from_env(service.env))
    svc = make_service()
    from bridge.pricing import total_cost
    from bridge.ops import job_usages
    from bridge.config import load_settings
    settings = load_settings(environ=service.env)
    estimate = total_cost(job_usages("copy", f"s3://{src}/c/", [f"s3://{dst}/copy/"], settings), settings)
    for i in range(6):
        moto.client().delete_object(Bucket=src, Key=f"c/{i:02d}.bin")
    from bridge.workers.specs import parse_spec
    job_id = svc.submit(parse_spec({"kind": "copy", "source": f"s3://{src}/c/", "destinations": [f"s3://{dst}/copy/"]}),
                        budget="team", estimate=estimate)
    done = _priced(service, service.wait(job_id).id)
    assert done.state == "succeeded" and done.counters["files_total"] == 6
    kinds = sum((Counter(row["requests"]) for row in done.metered.values()), Counter())
    assert kinds["COPY"] == 6   # the six files still there, copied inside the account: nothing else
    assert 0 < done.spent_usd == pytest.approx(request_usd("s3", kinds), rel=1e-9)
    assert done.spent_usd < estimate


def test_ten_submits_at_once_against_a_budget_for_three_admit_exactly_three(service, moto):  # noqa: F811
    """Admission reserves each admitted job's estimate atomically (a Lua script): ten ``submit``
    processes started together against a budget that fits three estimates admit three; the seven
    others await approval (exit 3, never "queued"). The three run and are charged; what they
    held is then released, and the seven stay held until someone approves them."""
    import subprocess
    import sys
    from bridge.config import load_settings
    from bridge.pricing import total_cost
    from bridge.ops import job_usages
    src, dst = unique_name(), unique_name()
    moto.create_bucket(src)
    moto.create_bucket(dst)
    for i in range(3):
        moto.client().put_object(Bucket=src, Key=f"d/{i}.bin", Body=bytes([i]) * 5000)
    settings = load_settings(environ=service.env)
    each = total_cost(job_usages("copy", f"s3://{src}/d/", [f"s3://{dst}/c0/"], settings), settings)
    assert each > 0
    budgets = Budgets(service.redis, service.keys)
    budgets.set("three", each * 3.5)

    procs = [subprocess.Popen([sys.executable, "-m", "bridge", "submit", "cp", f"s3://{src}/d/", f"s3://{dst}/c{n}/",
                               "--budget", "three", "--json"], env=service.env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for n in range(10)]
    results = [(p.wait(timeout=180), *p.communicate()) for p in procs]
    admitted = [json.loads(out)["id"] for code, out, _err in results if code == 0]
    held = [json.loads(out)["id"] for code, out, _err in results if code == 3]
    assert len(admitted) == 3 and len(held) == 7, [(code, err[-300:]) for code, _out, err in results]
    for code, _out, err in results:
        if code == 3:
            assert "awaits approval" in err and "queued" not in err
    assert {service.jobs.state(j) for j in admitted} == {"queued"}
    assert {service.jobs.state(j) for j in held} == {"awaiting-approval"}
    assert budgets.reserved("three") == pytest.approx(3 * each)
    assert budgets.spent("three") == 0

    service.worker("w1", concurrency=1).wait_ready()
    for job_id in admitted:
        assert service.wait(job_id).state == "succeeded"
    done = [_priced(service, j) for j in admitted]
    deadline = time.monotonic() + 30
    while budgets.reserved("three") > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert budgets.reserved("three") == 0
    assert budgets.spent("three") == pytest.approx(sum(r.spent_usd for r in done))
    assert {service.jobs.state(j) for j in held} == {"awaiting-approval"}
    listed = json.loads(service.cli("budgets", "list", "--json").stdout)["budgets"]["three"]
    assert listed["reserved_usd"] == 0 and listed["spent_usd"] > 0

    # cancelling a held job frees nothing it did not hold; approving one reserves and runs it
    assert service.cli("jobs", "cancel", held[0]).returncode == 0
    r = service.cli("jobs", "approve", held[1])
    assert r.returncode == 0, r.stderr
    assert service.wait(held[1]).state == "succeeded"
    assert _priced(service, held[1]).spent_usd > 0
