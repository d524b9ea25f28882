"""Issue 46, the rest: the audit's text view of a job that spent money, metering that survives a
SIGKILLed worker, submit refusing a bad environment as cp does, and the residue of bad inputs.

Jobs run on real `mcbridge worker` processes over a real Redis and moto (the ``service`` fixture
of tests/test_workers_service.py); bad inputs run the real CLI in a subprocess and read its exit
and its one line.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bridge.money import usd
from tests.test_workers_service import service  # noqa: F401  (the fixture: a namespace, workers, the CLI)

pytestmark = pytest.mark.timeout(300)
MiB = 1024 * 1024


def mcbridge(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bridge", *args], env=env if env is not None else os.environ,
                          capture_output=True, text=True, timeout=timeout)


def one_error_line(result: subprocess.CompletedProcess) -> str:
    """The one line a refused command printed: exit 2, nothing on stdout, no traceback."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mcbridge: error: "), result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    return lines[0]


# -- jobs audit, as people read it, once a job has spent money ---------------------------------------

def test_the_audit_text_shows_what_an_ended_job_spent(service, emulator_for, make_root, tmp_path):  # noqa: F811
    emulator_for("s3")
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"{i}.bin").write_bytes(os.urandom(3000 + i))
    dst = make_root("s3")
    service.worker("w1", concurrency=1).wait_ready()
    job_id = service.submit("cp", f"{src}/", dst)
    record = service.wait(job_id)
    assert record.state == "succeeded", record.errors
    assert record.spent_usd and record.spent_usd > 0   # its PUTs are priced

    as_json = service.cli("jobs", "audit", "--job", job_id, "--json")
    assert as_json.returncode == 0, as_json.stderr
    ended = next(e for e in json.loads(as_json.stdout) if e["decision"] == "ended")
    text = service.cli("jobs", "audit", "--job", job_id)
    assert text.returncode == 0, text.stderr
    line = next(line for line in text.stdout.splitlines() if " ended " in line)
    assert "succeeded: " in line and f", {usd(float(ended['spent_usd']))}" in line, line
    assert usd(float(ended["spent_usd"])) == usd(record.spent_usd)
