"""Bandwidth limits: one token bucket per job, shared by every connection of the job.

Transfers call ``Progress.throttle(n)`` before moving n bytes (the engine before it reads a
file or a part, the shard writer before it sends a part); the job's ``Limiter`` makes the caller
wait until the bucket lets those bytes through. The limit is bytes per second across all of the
job's threads (and, in the service, across all of its workers); ``None`` means unlimited.

The bucket is a token bucket with a burst of one slice, kept as the time its budget is used up
to (a "theoretical arrival time", GCRA): reserving n bytes moves that time n / rate into the
future and tells the caller how long to wait. Callers take at most ``SLICE`` bytes at a time, so
threads share the budget evenly and a changed rate is felt within a slice or so. Where the state
lives is the bucket's business: ``TokenBucket`` keeps it in this process; the service keeps it in
Redis so that all workers of a job draw from one budget (workers/limits.py).

A batch of small objects sends its requests from one event loop (bridge.stores.streams), where
a sleep would stop every request of the batch, not the one waiting, and let the answers of those
already sent pile up at the wire's speed. In a lane of such a batch (``lane()``), a throttle
reserves its bytes and records when they are due instead of sleeping; the lane's next request
waits for that time (``settle()``, which ``Link.send`` awaits), while the loop's other lanes go
on. A batch's reads are reserved before their requests go (``read_many(..., pace=...)``), its
puts when their bodies are made, so what crosses the wire follows the limit either way.

A running ``mcbridge cp|sync|migrate|pack`` changes its limit on SIGUSR2 (``install_signal``):
with ``--bwlimit-file FILE`` it reads the new rate from FILE, otherwise it toggles the limit off
and back on, as rclone does.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path
from typing import Protocol

from bridge.config import parse_rate
from bridge.errors import InvalidOption

SLICE = 1024 * 1024

# In a lane of a batch's event loop: [the monotonic time this lane's throttled bytes are due]
_due: ContextVar[list[float] | None] = ContextVar("bridge_bwlimit_due", default=None)


class Bucket(Protocol):
    @property
    def rate(self) -> int | None: ...

    def reserve(self, nbytes: int) -> float:
        """Take ``nbytes`` from the budget; the seconds to wait before sending them."""


class TokenBucket:
    """The bucket of one process: thread-safe, the rate changeable at any time."""

    def __init__(self, rate: int | None = None, clock: Callable[[], float] = time.monotonic):
        self._rate = rate or None
        self._clock = clock
        self._tat = 0.0   # when the budget taken so far is used up
        self._lock = threading.Lock()

    @property
    def rate(self) -> int | None:
        return self._rate

    def reserve(self, nbytes: int) -> float:
        with self._lock:
            if not self._rate:
                return 0.0
            now = self._clock()
            start = max(self._tat, now)
            self._tat = start + nbytes / self._rate
            return start - now

    def set_rate(self, rate: int | None) -> None:
        """A new rate; bytes already reserved but not yet due are re-timed at it."""
        with self._lock:
            rate = rate or None
            now = self._clock()
            if rate and self._rate and self._tat > now:
                self._tat = now + (self._tat - now) * self._rate / rate
            elif not rate:
                self._tat = 0.0
            self._rate = rate


class Limiter:
    """What a job's transfers wait on. Unlimited costs one attribute read per call."""

    def __init__(self, bucket: Bucket, sleep: Callable[[float], None] = time.sleep):
        self.bucket = bucket
        self._sleep = sleep
        self.changeable = False   # whether a signal may set a limit while it runs (install_signal's file)

    @property
    def never_limits(self) -> bool:
        """No limit now, and none a signal could set (no ``--bwlimit-file``): a job may then be
        run by several processes, which one bucket could not pace."""
        return not self.bucket.rate and not self.changeable

    @property
    def rate(self) -> int | None:
        return self.bucket.rate

    def take(self, nbytes: int) -> None:
        """Back when the bucket lets ``nbytes`` through; in a lane (``lane()``), at once, the
        time they are due recorded for ``settle()``."""
        due = _due.get()
        while nbytes > 0 and self.bucket.rate:
            piece = min(nbytes, SLICE)
            nbytes -= piece
            wait = self.bucket.reserve(piece)
            if wait > 0:
                if due is None:
                    self._sleep(wait)
                else:   # each slice reserved after the one before: the last is due last
                    due[0] = max(due[0], time.monotonic() + wait)


def lane() -> None:
    """Called in an event loop's task (a lane of a batch: bridge.stores.streams.run_many): from
    here, a throttle in this task records when its bytes are due instead of sleeping."""
    _due.set([0.0])


async def settle() -> None:
    """In a lane: wait until what this lane's throttles reserved is due (the loop's other tasks
    run meanwhile). Anywhere else, and in a lane that owes nothing, back at once."""
    due = _due.get()
    if due is not None and due[0]:
        wait, due[0] = due[0] - time.monotonic(), 0.0
        if wait > 0:
            import asyncio
            await asyncio.sleep(wait)


def local(rate: int | None) -> Limiter:
    return Limiter(TokenBucket(rate))


def install_signal(limiter: Limiter, configured: int | None, rate_file: Path | None = None,
                   said: Callable[[str], None] | None = None) -> None:
    """On SIGUSR2: the rate in ``rate_file`` (re-read each time), or without a file, the limit
    toggled between off and ``configured``. Only for a process-local bucket, in the main thread.
    ``said`` hears one line for each signal: the limit now, or why it stayed."""
    bucket = limiter.bucket
    if not isinstance(bucket, TokenBucket) or threading.current_thread() is not threading.main_thread():
        return
    limiter.changeable = rate_file is not None
    remembered = {"rate": configured}
    tell = said or (lambda _line: None)

    def now() -> str:
        from bridge.progress import human_bytes
        return f"bandwidth limit {human_bytes(bucket.rate)}/s" if bucket.rate else "bandwidth limit off"

    def changed(_signum, _frame) -> None:
        if rate_file is not None:
            try:
                bucket.set_rate(parse_rate(rate_file.read_text()))
            except (OSError, InvalidOption) as exc:
                # a file being rewritten or a typo keeps the current limit
                tell(f"SIGUSR2: {rate_file} not read ({exc}); {now()} kept")
                return
            tell(f"SIGUSR2: {now()} (from {rate_file})")
            return
        if bucket.rate:
            remembered["rate"] = bucket.rate
            bucket.set_rate(None)
        elif remembered["rate"]:
            bucket.set_rate(remembered["rate"])
        else:
            tell("SIGUSR2: no bandwidth limit to switch on (give --bwlimit or transfer.bwlimit)")
            return
        tell(f"SIGUSR2: {now()}")

    signal.signal(signal.SIGUSR2, changed)
