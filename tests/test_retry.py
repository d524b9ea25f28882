"""Retries by error type: transient errors are retried with bounded backoff; permission errors and
checksum mismatches fail at once."""

from __future__ import annotations

import pytest

from bridge.errors import (EndpointUnreachable, IntegrityError, PermissionDenied, TransientError)
from bridge.retry import backoff, call_with_retries


def flaky(failures: list[BaseException]):
    calls = []

    def fn():
        calls.append(1)
        if failures:
            raise failures.pop(0)
        return "done"
    return fn, calls


def test_transient_errors_are_retried_until_success():
    fn, calls = flaky([TransientError("503"), EndpointUnreachable("reset")])
    slept, retried = [], []
    assert call_with_retries(fn, 5, on_retry=retried.append, sleep=slept.append) == "done"
    assert len(calls) == 3 and len(retried) == 2 and len(slept) == 2


def test_retries_are_bounded():
    fn, calls = flaky([TransientError(str(i)) for i in range(10)])
    with pytest.raises(TransientError):
        call_with_retries(fn, 4, sleep=lambda s: None)
    assert len(calls) == 4


@pytest.mark.parametrize("error", [PermissionDenied("403"), IntegrityError("bad digest"), ValueError("bug")])
def test_permanent_errors_are_not_retried(error):
    fn, calls = flaky([error])
    with pytest.raises(type(error)):
        call_with_retries(fn, 5, sleep=lambda s: None)
    assert len(calls) == 1


def test_backoff_is_jittered_and_capped():
    values = [backoff(10) for _ in range(200)]
    assert all(0 <= v <= 20.0 for v in values) and len(set(values)) > 100
    assert all(backoff(0) <= 0.25 for _ in range(50))
