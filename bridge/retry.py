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
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

from bridge.errors import RETRYABLE, BridgeError

T = TypeVar("T")

BASE = 0.5   # seconds before the first retry, at most
CAP = 20.0   # no single wait is longer

_observer: contextvars.ContextVar[Callable[[BaseException], None] | None] = \
    contextvars.ContextVar("bridge_retry_observer", default=None)


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


def call_with_retries(fn: Callable[[], T], retries: int, *, recovered: Callable[[], bool] | None = None,
                      sleep: Callable[[float], None] = time.sleep) -> T | None:
    """``fn()``, sent again on a retryable error at most ``retries`` times with jittered backoff.

    With ``recovered``: once an attempt has failed in a way that leaves its effect unknown (a
    retryable error), a later failure of any kind first asks ``recovered()``; True means the
    work is done and the call returns None."""
    unknown = False
    for attempt in range(max(0, retries) + 1):
        try:
            return fn()
        except BridgeError as exc:
            retryable = isinstance(exc, RETRYABLE)
            unknown = unknown or retryable
            if recovered is not None and unknown and recovered():
                return None
            if not retryable or attempt >= retries:
                raise
            observer = _observer.get()
            if observer is not None:
                observer(exc)
            sleep(backoff(attempt))
    raise AssertionError("unreachable")


async def acall_with_retries(fn: Callable[[], Awaitable[T]], retries: int) -> T:
    """``call_with_retries`` for a coroutine (a store sending many requests from one event
    loop): the same bound, backoff and observer; the wait does not block the other requests."""
    import asyncio   # only where a store runs an event loop: not on every start-up
    for attempt in range(max(0, retries) + 1):
        try:
            return await fn()
        except BridgeError as exc:
            if not isinstance(exc, RETRYABLE) or attempt >= retries:
                raise
            observer = _observer.get()
            if observer is not None:
                observer(exc)
            await asyncio.sleep(backoff(attempt))
    raise AssertionError("unreachable")
