"""What a job reports as sent after one of its workers is SIGKILLed: real Redis, real worker
processes, moto. The task runs again on another worker, finds the parts the dead one finished in
the journal, and must still count them as sent by this job (its spend is priced from it)."""

from __future__ import annotations

import json
import time

import pytest

from tests.test_workers_service import MiB, service, sub_plan, write_tree  # noqa: F401  fixture

pytestmark = pytest.mark.timeout(240)


def test_a_job_whose_worker_was_killed_counts_every_byte_the_store_took(service, emulator_for, make_root,
                                                                       tmp_path):
    emulator_for("s3")
    src = tmp_path / "src"
    big = {f"ckpt/shard-{i}.bin": 30 * MiB for i in range(2)}
    write_tree(src, big, small=0)
    total = sum(big.values())
    dst = make_root("s3")
    w1 = service.worker("w1", concurrency=1, threads=2)
    w1.wait_ready()
    job_id = service.submit("cp", f"{src}/", dst, "--chunk-size", "5MiB")

    deadline = time.monotonic() + 60
    while True:   # kill w1 as soon as it has journaled parts: some of them not yet reported
        assert time.monotonic() < deadline, "w1 never sent a part"
        running = [json.loads(raw) for raw in service.redis.hgetall(service.keys.running).values()]
        keys = [sub_plan(ref)["key"] for ref in running if ref["task"] == "bridge.transfer"]
        if any(service.redis.hlen(f"{service.keys.journal(key)}:part") for key in keys):
            break
        time.sleep(0.01)
    w1.kill()
    service.worker("w2", concurrency=1, threads=2).wait_ready()
    record = service.wait(job_id, timeout=180)
    assert record.state == "succeeded", record.errors
    c = record.counters
    assert c.get("requeued", 0) >= 1
    # nothing was at the destination before: every byte is sent by this job, and counted once
    assert c["bytes_done"] == total and c["bytes_done"] - c.get("bytes_skipped", 0) == total, c
