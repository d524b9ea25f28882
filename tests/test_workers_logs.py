"""A worker's log at its default level: bridge's own lines, one per job event naming the job,
and the warnings of everything else; the SDKs' per-request lines (azure-core logs each request's
headers at INFO) and Celery's per-task lines are not there."""

from __future__ import annotations

import pytest

from tests.emulators import unique_name
from tests.test_workers_service import service  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(300)


def test_a_worker_log_for_a_1000_file_job_is_under_100_lines(service, azurite, tmp_path):  # noqa: F811
    src = tmp_path / "src"
    for i in range(1000):
        (src / f"d{i // 100}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i // 100}/{i:04d}.bin").write_bytes(bytes([i % 256]) * (100 + i))
    container = unique_name()
    azurite.create_bucket(container)
    worker = service.worker("w1", concurrency=2)   # the default --loglevel of the tests' workers: INFO
    worker.wait_ready()
    job_id = service.submit("cp", f"{src}/", f"az://{container}/many/", "--verify", "store")
    assert service.wait(job_id, timeout=240).state == "succeeded"
    worker.stop()
    lines = worker.log_path.read_text(errors="replace").splitlines()
    print(f"worker log: {len(lines)} lines")
    assert len(lines) < 100, "\n".join(lines[:150])
    events = [line for line in lines if job_id in line]
    assert any("running" in line for line in events) and any("succeeded" in line for line in events), events
    assert not [line for line in lines if "Request URL" in line or "Response status" in line]
