"""Bandwidth limits: the bucket's arithmetic, a copy held to its rate, a limit changed while a
copy runs (SIGUSR2 in process, ``mcbridge jobs limit`` for a service job).

No test here times the machine: a rate shows as bytes per second at a proxy between bridge and
the store (a loaded machine only spreads them out), a bucket's waits as arithmetic on a clock that
stands still, a lane's turn as the order in which lanes wait and resume, and a raised limit as a
job ending long (30 s and more) before the old rate could have moved what was left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bridge import ops
from bridge.bwlimit import Limiter, TokenBucket
from bridge.config import parse_rate
from bridge.errors import InvalidOption
from tests.helpers import NO_CONFIG, mcbridge, settings_for
from tests.test_workers_service import service  # noqa: F401  (the fixture)

MiB = 1024 * 1024


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_rates_parse_with_units_and_off_means_unlimited():
    assert parse_rate("50MiB") == 50 * MiB
    assert parse_rate("50MiB/s") == 50 * MiB
    assert parse_rate("1.5M") == 1_500_000
    assert parse_rate("0") is None and parse_rate("off") is None and parse_rate(None) is None
    with pytest.raises(InvalidOption, match="invalid bandwidth limit 'fast'"):
        parse_rate("fast")


def test_the_bucket_lets_bytes_through_at_its_rate_and_retimes_a_changed_rate():
    clock = FakeClock()
    bucket = TokenBucket(10 * MiB, clock=clock)
    limiter = Limiter(bucket, sleep=clock.sleep)
    limiter.take(1 * MiB)            # the first slice goes at once
    assert clock.now == 100.0
    limiter.take(40 * MiB)           # 40 more slices: each waits for the one before it
    assert clock.now == pytest.approx(100.0 + 40 / 10)
    # Reserved ahead (as other threads would have): 2 s of backlog at 10 MiB/s is 0.5 s at 40.
    assert bucket.reserve(20 * MiB) == pytest.approx(0.1)
    bucket.set_rate(40 * MiB)
    assert bucket.reserve(1) == pytest.approx((0.1 + 2.0) / 4)
    bucket.set_rate(None)
    before = clock.now
    limiter.take(500 * MiB)          # unlimited: no waiting at all
    assert clock.now == before


def test_a_route_gives_jobs_a_default_limit_and_bad_values_are_one_line():
    from bridge.workers.executor import route_bwlimit
    from bridge.workers.settings import WorkerSettings
    ws = WorkerSettings.from_env({"BRIDGE_ROUTE_BWLIMITS": "s3=200MiB, az://archive=50MiB, gs=0"})
    assert route_bwlimit(ws, "az://archive/x/") == 50 * MiB
    assert route_bwlimit(ws, "az://other/x/") is None
    assert route_bwlimit(ws, "s3://any/") == 200 * MiB
    assert route_bwlimit(ws, "gs://bucket/") is None
    with pytest.raises(InvalidOption, match=r"^BRIDGE_ROUTE_BWLIMITS='s3=fast': invalid bandwidth limit 'fast'"):
        WorkerSettings.from_env({"BRIDGE_ROUTE_BWLIMITS": "s3=fast"})


def _most_in_one_second(pieces: list[tuple[float, int]]) -> int:
    """The most bytes the proxy carried within any one second, from its (time, bytes) pieces."""
    pieces = sorted(pieces)
    most, first, window = 0, 0, 0
    for t, n in pieces:
        window += n
        while pieces[first][0] < t - 1.0:
            window -= pieces[first][1]
            first += 1
        most = max(most, window)
    return most


def test_a_copy_limited_to_8_mib_per_second_sends_no_more_than_that_in_any_second(moto, tmp_path):
    """48 MiB in 8 MiB parts, one at a time, to S3 at 8 MiB/s: a proxy in front of the store
    records when each piece crossed. No second carries more than the limit allows: the bucket's
    burst of one slice, the part whose bytes were due, and one more second's worth for the proxy's
    own thread having been held up on a loaded machine. Unlimited, the 48 MiB cross in about one
    second. (With more parts in flight, each part's bytes are reserved before it is read and the
    parts go together once all are due: a burst this bound would not cover.)"""
    from tests.emulators import unique_name
    from tests.latencyproxy import LatencyProxy
    bucket = unique_name()
    moto.create_bucket(bucket)
    src = tmp_path / "src" / "ckpt.bin"
    src.parent.mkdir()
    src.write_bytes(os.urandom(48 * MiB))
    env = {**moto.env(), "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}
    with LatencyProxy(moto.port, 0.002) as proxy:
        limited = settings_for({**env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}"},
                               bwlimit="8MiB", concurrency=1, chunk_size=8 * MiB)
        summary = ops.copy(str(src), f"s3://{bucket}/c/", limited)
        pieces = list(proxy.carried["up"])
    assert summary["ok"] and summary["files"] == 1
    assert ops.copy(f"s3://{bucket}/c/", f"{tmp_path}/back/", settings_for(env))["ok"]
    assert (tmp_path / "back" / "ckpt.bin").read_bytes() == src.read_bytes()
    assert sum(n for _t, n in pieces) >= 48 * MiB          # the proxy saw the whole copy go by
    most = _most_in_one_second(pieces)
    assert most <= 2 * 8 * MiB + 8 * MiB + MiB, f"{most / MiB:.1f} MiB crossed in one second at 8 MiB/s"


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_sigusr2_rereads_the_limit_file_of_a_running_copy(tmp_path):
    """48 MiB at 1 MiB/s would take 48 s; the file says 0 (none) and a SIGUSR2 makes it finish."""
    src = tmp_path / "ckpt.bin"
    src.write_bytes(os.urandom(48 * MiB))
    rate_file = tmp_path / "bwlimit"
    rate_file.write_text("1MiB\n")
    env = {**os.environ, "MCBRIDGE_STATE_DIR": str(tmp_path / "state"), "XDG_CONFIG_HOME": NO_CONFIG}
    proc = subprocess.Popen([sys.executable, "-m", "bridge", "cp", str(src), f"{tmp_path}/dst/", "-q",
                             "--chunk-size", "4MiB", "--bwlimit-file", str(rate_file)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # The partial file appears once the copy runs, so the handler is in place by then.
        _wait_for(lambda: any(p.name.endswith(".bridge-partial") for p in (tmp_path / "dst").glob("*"))
                  if (tmp_path / "dst").exists() else False, 60, "the copy to start")
        assert proc.poll() is None
        rate_file.write_text("0\n")
        proc.send_signal(signal.SIGUSR2)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert (tmp_path / "dst" / "ckpt.bin").read_bytes() == src.read_bytes()


def test_bwlimit_flags_refuse_bad_values_on_one_line(tmp_path):
    src = tmp_path / "a.txt"
    src.write_text("a")
    result = mcbridge("cp", str(src), f"{tmp_path}/dst/", "--bwlimit", "fast", env=dict(os.environ),
                      state_dir=tmp_path / "state")
    assert result.returncode == 2
    assert result.stderr.strip() == ("mcbridge: error: invalid bandwidth limit 'fast': use bytes per second "
                                     "with an optional unit, e.g. 50MiB (or 0/off for none)")
    missing = mcbridge("cp", str(src), f"{tmp_path}/dst/", "--bwlimit-file", str(tmp_path / "nope"),
                       env=dict(os.environ), state_dir=tmp_path / "state")
    assert missing.returncode == 2 and "--bwlimit-file" in missing.stderr and "Traceback" not in missing.stderr


def test_a_service_job_whose_limit_is_raised_midway_finishes_sooner(service, tmp_path):  # noqa: F811
    """Two 32 MiB files (one task each, on two workers of one thread sharing one budget) at
    1 MiB/s would take a minute; raised to 64 MiB/s once bytes move, the job ends long before the
    old rate could have moved what was left (more than 30 s of it: a bound that a loaded machine
    does not reach, while a raise that did not reach the workers' budget fails it)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("a.bin", "b.bin"):
        (src / name).write_bytes(os.urandom(32 * MiB))
    total, rate, part = 64 * MiB, 1 * MiB, 4 * MiB
    for name in ("w1", "w2"):
        service.worker(name, concurrency=1, threads=1)
    for worker in service.processes:
        worker.wait_ready()
    job_id = service.submit("cp", f"{src}/", f"{tmp_path}/dst/", "--chunk-size", "4MiB", "--bwlimit", "1MiB")
    _wait_for(lambda: (service.jobs.get(job_id) and
                       service.jobs.get(job_id).counters.get("bytes_done", 0) > 0), 90, "bytes to move")
    time.sleep(1)
    record = service.jobs.get(job_id)
    assert record.state == "running"
    limited_for = time.time() - record.started
    done_then = record.counters.get("bytes_done", 0)
    # Shared by both workers, the budget lets through at most rate x time (plus what the threads
    # reserved ahead: one 4 MiB part each) — not twice that, as two budgets would.
    assert done_then <= rate * limited_for + 2 * part, (done_then, limited_for)
    result = service.cli("jobs", "limit", job_id, "64MiB")
    assert result.returncode == 0, result.stderr
    assert "64.0 MiB/s" in result.stdout
    record = service.wait(job_id, timeout=120)
    assert record.state == "succeeded", record.errors
    # At 1 MiB/s what was left (less the parts the two threads may have had reserved) needs this
    # long at least: a job that ends sooner had its limit raised.
    old_rate_needs = (total - done_then - 2 * part) / rate
    assert old_rate_needs > 30, (done_then, limited_for)
    took_after = record.elapsed - limited_for
    assert took_after < old_rate_needs, \
        (f"raised after {limited_for:.1f}s with {done_then / MiB:.0f} MiB done; the rest took "
         f"{took_after:.1f}s, which 1 MiB/s could have done ({old_rate_needs:.1f}s)")
    for name in ("a.bin", "b.bin"):
        assert (tmp_path / "dst" / name).read_bytes() == (src / name).read_bytes()
    done = service.cli("jobs", "limit", job_id, "1MiB")
    assert done.returncode == 1 and "succeeded" in done.stderr


def test_in_a_batch_lane_a_throttle_waits_for_its_turn_without_stopping_the_event_loop():
    """A batch's requests share one event loop (bridge.stores.streams): in a lane, ``take``
    reserves and records when its bytes are due instead of sleeping, and ``settle`` waits for that
    time while the loop's other lanes go on; outside a lane, ``take`` sleeps as before. The
    bucket's clock stands still, so each lane's wait is its place in line (0, 0.5 and 1 s at
    2 MiB/s), whatever the machine's load; that the lanes wait side by side shows in the order of
    events (both owing lanes wait before either resumes), not in a time."""
    import asyncio

    from bridge import bwlimit
    slept: list[float] = []
    limiter = Limiter(TokenBucket(2 * MiB, clock=FakeClock()), sleep=slept.append)
    events: list[tuple[str, int]] = []
    late: list[int] = []

    async def lane(n: int) -> None:
        bwlimit.lane()
        limiter.take(MiB)                    # back at once: the time it is due recorded
        due = bwlimit._due.get()[0]
        events.append(("waits" if due else "owes nothing", n))
        await bwlimit.settle()
        if time.monotonic() < due:
            late.append(n)                   # resumed before its bytes were due
        events.append(("resumed", n))

    async def three() -> None:
        await asyncio.gather(*(lane(n) for n in range(3)))

    asyncio.run(three())
    assert slept == []                                # no lane slept in the loop
    assert late == []
    assert events == [("owes nothing", 0), ("resumed", 0),
                      ("waits", 1), ("waits", 2),     # lane 2 ran while lane 1 waited
                      ("resumed", 1), ("resumed", 2)]
    limiter.take(2 * MiB)                             # outside a lane, the caller sleeps its turn
    assert slept == [pytest.approx(1.5), pytest.approx(2.0)]   # behind the lanes' 3 MiB, a slice each


@pytest.mark.parametrize("way", ["down", "up"])
def test_a_limited_batch_of_small_objects_crosses_the_wire_at_the_limit_not_in_a_burst(moto, tmp_path, way):
    """Small objects go in batches with many requests in flight on one event loop. Under a
    bandwidth limit, a download's requests wait for their turn before they go (before, they all
    went at once and the answers crossed the wire at its speed, the limit only pacing the writes
    to disk: 12 MiB in the first second of a 3 MiB/s copy), and an upload's bodies go when due.
    A proxy records when each piece crossed: no second carries much more than the limit (the
    bound leaves room for the bucket's burst of one slice and for the proxy's own thread having
    been held up a second on a loaded machine)."""
    from tests.emulators import unique_name
    from tests.latencyproxy import LatencyProxy
    bucket = unique_name()
    moto.create_bucket(bucket)
    src = tmp_path / "src"
    src.mkdir()
    for i in range(48):   # 12 MiB
        (src / f"{i:02d}.bin").write_bytes(os.urandom(256 * 1024))
    env = {**moto.env(), "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}
    if way == "down":
        assert ops.copy(f"{src}/", f"s3://{bucket}/x/", settings_for(env))["ok"]
    with LatencyProxy(moto.port, 0.002) as proxy:
        limited = settings_for({**env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}"}, bwlimit="3MiB")
        if way == "down":
            assert ops.copy(f"s3://{bucket}/x/", f"{tmp_path}/back/", limited)["ok"]
        else:
            assert ops.copy(f"{src}/", f"s3://{bucket}/y/", limited)["ok"]
        pieces = list(proxy.carried[way])
    if way == "up":
        assert ops.copy(f"s3://{bucket}/y/", f"{tmp_path}/back/", settings_for(env))["ok"]
    for i in range(48):
        assert (tmp_path / "back" / f"{i:02d}.bin").read_bytes() == (src / f"{i:02d}.bin").read_bytes()
    assert sum(n for _t, n in pieces) >= 12 * MiB          # the proxy saw the whole copy go by
    most = _most_in_one_second(pieces)
    assert most <= 2 * 3 * MiB + MiB + 256 * 1024, f"{most / MiB:.1f} MiB crossed in one second at 3 MiB/s"
