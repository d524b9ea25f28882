"""The one retry layer: every request a store sends is tried again here, and nowhere else.

The SDKs' own retries are turned off (botocore ``total_max_attempts=1``, s3fs ``retries=1``,
gcsfs's retrying wrapper bypassed, azure-core ``retry_total=0``), so attempts never multiply. Each
store wraps one request (one listing page, one part, one manifest read) in ``call_with_retries``;
the engine, verify, sync and packing call the stores and do not retry again.

Bound: a request is sent at most ``1 + retries`` times (``transfer.retries``, default 5: six
sends). Before retry k (k = 0, 1, ...) it waits a uniformly random time in
[0, min(CAP, BASE * 2**k)] ("full jitter", so clients that failed together do not return
together). The waits of one request therefore total at most ``max_total_wait(retries)``:
15.5 s with the defaults (0.5 + 1 + 2 + 4 + 8), about half that on average.

A job's requests also pass its ``Breaker`` (``guarding``): when every request to one store has
failed for ``WINDOW`` seconds, at least ``FAILURES`` in a row the same retryable way (a
destination that went away), the job stops, its other requests at their next attempt or wait,
instead of spending each file's retries in turn.

Retries are decided by error type (``RETRYABLE``): throttling, 5xx, dropped connections and cut
bodies. Permission errors, a skewed clock and checksum mismatches fail at once.

A request that changes something may have taken effect even though its answer was lost. Such a
call passes ``recovered``: after an attempt whose outcome is unknown, it asks the store whether
the intended result is already there (a completed upload of the right size and CRC32C) and, if
so, stops retrying and succeeds.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

from bridge.errors import RETRYABLE, BridgeError, StoreDown

T = TypeVar("T")

BASE = 0.5   # seconds before the first retry, at most
CAP = 20.0   # no single wait is longer

WINDOW = 20.0   # seconds in which every request to a store failed, before its job stops ...
FAILURES = 8    # ... the last this many of them the same way, at least

_observer: contextvars.ContextVar[Callable[[BaseException], None] | None] = \
    contextvars.ContextVar("bridge_retry_observer", default=None)
# Told of every retry in this process, with the store it is sent to (``where``: its endpoint), so
# that a service's metrics can count retries per store without a store naming them.
retry_listeners: list[Callable[[str | None], None]] = []


@dataclass
class _Streak:
    """One store's failures since its last success."""
    since: float
    failures: int = 0
    kind: str = ""
    same: int = 0     # the last failures of this kind, in a row


class Breaker:
    """What stops a job whose store went away. Every request of the job tells it how it ended,
    under the name of the store it went to (``where``: its endpoint); a success clears that
    store's streak. When a store's streak is ``window`` seconds old and its last ``failures``
    failures were the same retryable error, the breaker trips: ``reason`` says so in one line,
    and every later attempt or wait of the job raises StoreDown at once."""

    def __init__(self, window: float = WINDOW, failures: int = FAILURES,
                 clock: Callable[[], float] = time.monotonic):
        self.window, self.failures, self._clock = window, failures, clock
        self._streaks: dict[str, _Streak] = {}
        self._lock = threading.Lock()
        self.tripped = threading.Event()
        self.reason = ""

    def check(self) -> None:
        if self.tripped.is_set():
            raise StoreDown(self.reason)

    def succeeded(self, where: str | None) -> None:
        if self._streaks:
            with self._lock:
                self._streaks.pop(_store(where), None)

    def failed(self, where: str | None, exc: BaseException) -> None:
        """A retryable failure of a request to ``where``."""
        now, store = self._clock(), _store(where)
        with self._lock:
            streak = self._streaks.setdefault(store, _Streak(now))
            kind = type(exc).__name__
            streak.failures += 1
            streak.same = streak.same + 1 if kind == streak.kind else 1
            streak.kind = kind
            if (streak.same >= self.failures and now - streak.since >= self.window
                    and not self.tripped.is_set()):
                self.reason = (f"stopped: every request to {store} failed for {now - streak.since:.0f} s "
                               f"({streak.failures} in a row, the last {streak.same} the same way): {exc}")
                self.tripped.set()

    def pause(self, seconds: float) -> None:
        """The wait before a retry, cut short if the breaker trips meanwhile."""
        self.tripped.wait(seconds)
        self.check()

    async def apause(self, seconds: float) -> None:
        import asyncio
        end = time.monotonic() + seconds
        while not self.tripped.is_set() and (left := end - time.monotonic()) > 0:
            await asyncio.sleep(min(left, 0.25))
        self.check()


def _store(where: str | None) -> str:
    """A store's name for the breaker and its message: the origin of its endpoint (scheme, host,
    port: never a path or query, where a signature could be)."""
    if not where:
        return "the store"
    parts = urlsplit(where)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else where


_breaker: contextvars.ContextVar[Breaker | None] = contextvars.ContextVar("bridge_retry_breaker", default=None)
_stop: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar("bridge_stop", default=None)


@contextlib.contextmanager
def stopping(event: threading.Event | None) -> Iterator[None]:
    """Once ``event`` is set (the job was cancelled), no request made in this thread (or what it
    starts with its context) is sent or tried again, and one being sent stops at its next piece
    (``check_stop``, called by the client layer: bridge/meter.py, bridge/stores/base.receive)."""
    token = _stop.set(event)
    try:
        yield
    finally:
        _stop.reset(token)


def check_stop() -> None:
    event = _stop.get()
    if event is not None and event.is_set():
        from bridge.errors import JobCancelled
        raise JobCancelled("cancelled: no request is sent after a cancel")


@contextlib.contextmanager
def guarding(breaker: Breaker | None) -> Iterator[None]:
    """Every request made in this thread (or task) while inside reports to ``breaker``."""
    token = _breaker.set(breaker)
    try:
        yield
    finally:
        _breaker.reset(token)


def backoff(attempt: int, base: float = BASE, cap: float = CAP) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2**attempt)]."""
    return random.uniform(0, min(cap, base * (2 ** attempt)))


def max_total_wait(retries: int, base: float = BASE, cap: float = CAP) -> float:
    """The longest that one request can spend waiting between its attempts."""
    return sum(min(cap, base * (2 ** k)) for k in range(retries))


@contextlib.contextmanager
def reporting(on_retry: Callable[[BaseException], None]) -> Iterator[None]:
    """Every retry made in this thread (or task) while inside is told to ``on_retry``: the job's
    progress counts them without every store call carrying it."""
    token = _observer.set(on_retry)
    try:
        yield
    finally:
        _observer.reset(token)


def reported(fn: Callable[[], T], on_retry: Callable[[BaseException], None] | None) -> T:
    """``fn()``, its stores' retries told to ``on_retry`` (for callers outside a job's units)."""
    if on_retry is None:
        return fn()
    with reporting(on_retry):
        return fn()


log = logging.getLogger("bridge.retry")


def _said_retry(exc: BaseException, attempt: int, retries: int, wait: float, where: str | None) -> None:
    """Every retry, with its reason, at INFO (``mcbridge -v`` shows it)."""
    if log.isEnabledFor(logging.INFO):
        log.info("retry %d of %d in %.1fs%s: %s: %s", attempt + 1, retries, wait,
                 f" ({where})" if where else "", type(exc).__name__, exc)


def call_with_retries(fn: Callable[[], T], retries: int, *, recovered: Callable[[], bool] | None = None,
                      sleep: Callable[[float], None] = time.sleep, where: str | None = None) -> T | None:
    """``fn()``, sent again on a retryable error at most ``retries`` times with jittered backoff.

    With ``recovered``: once an attempt has failed in a way that leaves its effect unknown (a
    retryable error), a later failure of any kind first asks ``recovered()``; True means the
    work is done and the call returns None. ``where`` names the store (its endpoint) to the
    job's breaker, if the call is made inside one (``guarding``)."""
    breaker = _breaker.get()
    unknown = False
    for attempt in range(max(0, retries) + 1):
        check_stop()
        if breaker is not None:
            breaker.check()
        try:
            result = fn()
        except BridgeError as exc:
            retryable = isinstance(exc, RETRYABLE)
            unknown = unknown or retryable
            if breaker is not None and retryable:
                breaker.failed(where, exc)
            if recovered is not None and unknown and recovered():
                return None
            if not retryable or attempt >= retries:
                raise
            observer = _observer.get()
            if observer is not None:
                observer(exc)
            for listener in retry_listeners:
                listener(where)
            wait = backoff(attempt)
            _said_retry(exc, attempt, retries, wait, where)
            if breaker is not None:
                breaker.pause(wait)
            else:
                sleep(wait)
            continue
        if breaker is not None:
            breaker.succeeded(where)
        return result
    raise AssertionError("unreachable")


async def acall_with_retries(fn: Callable[[], Awaitable[T]], retries: int, *, where: str | None = None) -> T:
    """``call_with_retries`` for a coroutine (a store sending many requests from one event
    loop): the same bound, backoff, observer and breaker; the wait does not block the other requests."""
    import asyncio   # only where a store runs an event loop: not on every start-up
    breaker = _breaker.get()
    for attempt in range(max(0, retries) + 1):
        check_stop()
        if breaker is not None:
            breaker.check()
        try:
            result = await fn()
        except BridgeError as exc:
            retryable = isinstance(exc, RETRYABLE)
            if breaker is not None and retryable:
                breaker.failed(where, exc)
            if not retryable or attempt >= retries:
                raise
            observer = _observer.get()
            if observer is not None:
                observer(exc)
            for listener in retry_listeners:
                listener(where)
            wait = backoff(attempt)
            _said_retry(exc, attempt, retries, wait, where)
            if breaker is not None:
                await breaker.apause(wait)
            else:
                await asyncio.sleep(wait)
            continue
        if breaker is not None:
            breaker.succeeded(where)
        return result
    raise AssertionError("unreachable")
