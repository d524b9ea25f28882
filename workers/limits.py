"""A service job's bandwidth limit: one budget in Redis that every worker of the job draws from.

The rate is the job record's ``bwlimit`` field once ``mcbridge jobs limit`` has set it (0: none),
else what the job was submitted with (``--bwlimit``, or the profile's ``transfer.bwlimit`` in the
worker's settings). Each worker re-reads it every ``REFRESH`` seconds, so all of a job's workers
follow a change within seconds. The bucket itself (bridge/bwlimit.py explains the arithmetic)
is ``mcbridge:job:<id>:bw``, updated by one Lua script so that reservations from many processes
never interleave; its clock is Redis's, so the workers' clocks need not agree.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from redis.exceptions import RedisError

from bridge.bwlimit import Limiter
from bridge.workers.keys import Keys

log = logging.getLogger(__name__)

REFRESH = 1.0
RATE_FIELD = "bwlimit"

# KEYS[1]: the bucket; ARGV: bytes wanted, rate. Returns the seconds to wait, as a string (Redis
# would truncate a Lua number to an integer). A changed rate re-times what is reserved but not due.
_RESERVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local n, rate = tonumber(ARGV[1]), tonumber(ARGV[2])
local tat = tonumber(redis.call('HGET', KEYS[1], 'tat') or '0')
local old = tonumber(redis.call('HGET', KEYS[1], 'rate') or ARGV[2])
if tat > now and old ~= rate then tat = now + (tat - now) * old / rate end
local start = math.max(tat, now)
redis.call('HSET', KEYS[1], 'tat', tostring(start + n / rate), 'rate', ARGV[2])
redis.call('EXPIRE', KEYS[1], 86400)
return tostring(start - now)
"""


class RedisBucket:
    """The job's bucket, shared through Redis; the rate read from ``rate_of`` at most every REFRESH s."""

    def __init__(self, client, key: str, rate_of: Callable[[], int | None], refresh: float = REFRESH):
        self._script = client.register_script(_RESERVE)
        self._key, self._rate_of, self._refresh = key, rate_of, refresh
        self._rate: int | None = None
        self._read = float("-inf")
        self._lock = threading.Lock()

    @property
    def rate(self) -> int | None:
        if time.monotonic() - self._read >= self._refresh and self._lock.acquire(blocking=False):
            try:
                self._rate = self._rate_of()
                self._read = time.monotonic()
            except RedisError as exc:
                log.warning("bandwidth limit not re-read (%s); keeping %s", exc, self._rate)
            finally:
                self._lock.release()
        return self._rate

    def reserve(self, nbytes: int) -> float:
        rate = self.rate
        if not rate:
            return 0.0
        try:
            return float(self._script(keys=[self._key], args=[nbytes, rate]))
        except RedisError as exc:
            # Without the shared budget, pace this worker alone at the job's rate: never faster.
            log.warning("bandwidth budget unreachable (%s); pacing this worker on its own", exc)
            return nbytes / rate


def job_limiter(client, keys: Keys, job_id: str, submitted: int | None) -> Limiter:
    def rate_of() -> int | None:
        raw = client.hget(keys.job(job_id), RATE_FIELD)
        return (int(raw) or None) if raw is not None else submitted

    return Limiter(RedisBucket(client, keys.job(job_id, "bw"), rate_of))


def set_limit(client, keys: Keys, job_id: str, rate: int | None) -> None:
    """A new limit for a job (None: none); its workers follow within REFRESH seconds."""
    client.hset(keys.job(job_id), RATE_FIELD, rate or 0)
