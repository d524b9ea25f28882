"""Following a job and a long command as a person does: ``jobs watch`` in a pseudo-terminal
(pexpect) shows one bar line with bytes, files, rate and ETA in IEC units, cut to the terminal's
width instead of wrapping; on a stderr that is no terminal it prints a progress line every
``--stats`` interval and the summary at the end. A local ``cp``'s bar fits an 80-column terminal
the same way. Nothing waits on a clock: a bandwidth limit keeps each job running long enough
for the screens it is read from."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import pytest

from tests.emulators import unique_name
from tests.helpers import NO_CONFIG
from tests.test_workers_service import service  # noqa: F401  (the fixture)

pexpect = pytest.importorskip("pexpect")
pytestmark = pytest.mark.timeout(240)

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def spawn(args: list[str], env: dict[str, str], columns: int):
    full = {**env, "COLUMNS": str(columns), "LINES": "30", "TERM": "xterm"}
    child = pexpect.spawn(sys.executable, ["-m", "bridge", *args], env=full, encoding="utf-8", timeout=180,
                          dimensions=(30, columns))
    child.logfile_read = io.StringIO()
    return child


def screen_lines(child) -> list[str]:
    """Every line the terminal showed, redrawn ones included: the output without control
    sequences, cut at each carriage return and line feed."""
    child.expect(pexpect.EOF)
    child.close()
    return [line for line in re.split(r"[\r\n]", ANSI.sub("", child.logfile_read.getvalue())) if line.strip()]


def files(root, count: int, size: int):
    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (root / f"part-{i}.bin").write_bytes(os.urandom(size))
    return root


def test_jobs_watch_shows_bytes_files_rate_and_eta_on_a_terminal_and_lines_elsewhere(service, moto, tmp_path):  # noqa: F811
    out = unique_name()
    moto.create_bucket(out)
    data = files(tmp_path / "data", 6, 512 * 1024)
    service.worker("w1", concurrency=1).wait_ready()
    job_id = service.submit("cp", f"{data}/", f"s3://{out}/run/", "--bwlimit", "256KiB")

    # the same job followed three times at once: in a 100-column terminal, in a 50-column one,
    # and with stderr a pipe
    wide, narrow = spawn(["jobs", "watch", job_id], service.env, 100), spawn(["jobs", "watch", job_id], service.env, 50)
    piped = subprocess.Popen([sys.executable, "-m", "bridge", "jobs", "watch", job_id, "--stats", "0.5s"],
                             env=service.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wide.expect(r"running: [\d.]+ (B|KiB|MiB) of 3\.0 MiB \(\d+%\), \d/6 files, [\d.]+ (B|KiB)/s, ETA [\d.]+s")
    for child, columns in ((wide, 100), (narrow, 50)):
        lines = screen_lines(child)
        assert child.exitstatus == 0, lines
        bars = [line for line in lines if "running:" in line]
        drawn = [line for line in lines if not line.startswith(f"job {job_id} succeeded")]   # the live lines
        assert bars and all("━" in line for line in drawn), drawn   # each with its bar: none wrapped onto a next
        assert max(map(len, drawn)) <= columns, [line for line in drawn if len(line) > columns]
        assert not any(re.search(r"\d (MB|kB)\b", line) for line in lines), lines   # IEC units, as everywhere
        assert f"job {job_id} succeeded: 6 files, 3.0 MiB" in "".join(lines[-2:]), lines
    assert all(line.rstrip().endswith("…") for line in bars), bars  # 50 columns: cut at the edge, not wrapped

    stdout, stderr = piped.communicate(timeout=120)
    assert piped.returncode == 0, stderr
    progress = re.findall(rf"job {job_id}: running: [\d.]+ (?:B|KiB|MiB) of 3\.0 MiB \(\d+%\), \d/6 files, "
                          rf"[\d.]+ (?:B|KiB)/s", stderr)
    assert progress, stderr
    assert "━" not in stderr and "\x1b" not in stderr and "\r" not in stderr   # lines, not a bar
    assert stdout.startswith(f"job {job_id} succeeded: 6 files, 3.0 MiB"), stdout


def test_a_long_copy_keeps_its_bar_on_one_line_of_an_80_column_terminal(tmp_path):
    src = files(tmp_path / "src", 4, 1024 * 1024)
    env = {**os.environ, "MCBRIDGE_STATE_DIR": str(tmp_path / "state"), "XDG_CONFIG_HOME": NO_CONFIG,
           "MCBRIDGE_BWLIMIT": "1MiB"}
    env.pop("MCBRIDGE_CONFIG", None)
    child = spawn(["cp", f"{src}/", f"{tmp_path}/dst/"], env, 80)
    child.expect(r"copying: [\d.]+ (B|KiB|MiB) of 4\.0 MiB")
    lines = screen_lines(child)
    assert child.exitstatus == 0, lines
    drawn = [line for line in lines if not line.startswith("copied ")]   # the live lines, then the summary
    assert any("copying:" in line for line in drawn) and all("━" in line for line in drawn), drawn   # none wrapped
    assert max(map(len, drawn)) <= 80, [line for line in drawn if len(line) > 80]
