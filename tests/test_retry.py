"""The one retry layer: transient errors are retried with bounded, jittered backoff; permission
errors, a skewed clock and checksum mismatches fail at once; a call whose effect is unknown asks
whether it already happened. Over real HTTP, tests/test_faults.py drives the same layer."""

from __future__ import annotations

import pytest

from bridge import retry
from bridge.errors import (ClockSkewed, EndpointUnreachable, IntegrityError, ObjectNotFound,
                           PermissionDenied, TransientError)
from bridge.retry import backoff, call_with_retries, max_total_wait


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
    with retry.reporting(retried.append):
        assert call_with_retries(fn, 5, sleep=slept.append) == "done"
    assert len(calls) == 3 and len(retried) == 2 and len(slept) == 2


def test_retries_are_bounded():
    fn, calls = flaky([TransientError(str(i)) for i in range(10)])
    slept = []
    with pytest.raises(TransientError):
        call_with_retries(fn, 4, sleep=slept.append)
    assert len(calls) == 5  # the first send and four retries
    assert sum(slept) <= max_total_wait(4)


@pytest.mark.parametrize("error", [PermissionDenied("403"), ClockSkewed("skewed"), IntegrityError("bad digest"),
                                   ValueError("bug")])
def test_permanent_errors_are_not_retried(error):
    fn, calls = flaky([error])
    with pytest.raises(type(error)):
        call_with_retries(fn, 5, sleep=lambda s: None)
    assert len(calls) == 1


def test_backoff_is_jittered_and_capped():
    values = [backoff(10) for _ in range(200)]
    assert all(0 <= v <= retry.CAP for v in values) and len(set(values)) > 100
    assert all(backoff(0) <= retry.BASE for _ in range(50))
    assert max_total_wait(5) == 15.5  # the bound the README states for the default of 5 retries


def test_a_lost_answer_is_recognised_by_the_next_attempts_failure():
    # The first completion succeeded but its answer was lost; the retry finds the upload gone.
    fn, calls = flaky([TransientError("cut"), ObjectNotFound("NoSuchUpload")])
    asked = []
    result = call_with_retries(fn, 5, recovered=lambda: asked.append(1) or len(asked) > 1, sleep=lambda s: None)
    assert result is None and len(calls) == 2 and len(asked) == 2


def test_recovery_is_not_asked_when_nothing_was_uncertain():
    fn, calls = flaky([ObjectNotFound("NoSuchUpload")])
    asked = []
    with pytest.raises(ObjectNotFound):
        call_with_retries(fn, 5, recovered=lambda: asked.append(1) or True, sleep=lambda s: None)
    assert len(calls) == 1 and not asked


def test_an_unrecognised_result_is_still_an_error():
    fn, calls = flaky([TransientError("cut"), ObjectNotFound("NoSuchUpload")])
    with pytest.raises(ObjectNotFound):
        call_with_retries(fn, 5, recovered=lambda: False, sleep=lambda s: None)
    assert len(calls) == 2
