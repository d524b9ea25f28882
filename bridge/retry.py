"""Retries decided by error type: only TransientError subclasses are retried, with bounded,
jittered exponential backoff. Permission errors and checksum mismatches fail at once."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from bridge.errors import RETRYABLE

T = TypeVar("T")


def backoff(attempt: int, base: float = 0.25, cap: float = 20.0) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2**attempt)]."""
    return random.uniform(0, min(cap, base * (2 ** attempt)))


def call_with_retries(fn: Callable[[], T], attempts: int, *, on_retry: Callable[[BaseException], None]
                      | None = None, sleep: Callable[[float], None] = time.sleep) -> T:
    for attempt in range(max(1, attempts)):
        try:
            return fn()
        except RETRYABLE as exc:
            if attempt == attempts - 1:
                raise
            if on_retry:
                on_retry(exc)
            sleep(backoff(attempt))
    raise AssertionError("unreachable")
