"""A job's meter in Redis (``<job>:meter``), counted as each request leaves a worker.

A task's ``bridge.meter.Meter`` is given a ``JobMeterLog`` as its ``ahead``: each request's count
(and its body's bytes) is added to the job's hash before the request is sent, each answer's bytes
when it comes. So a worker killed with SIGKILL has had every request it sent counted, those in
flight included, and the job's spend is priced from every run of its tasks: what crossed the
wire, not what the runs that lived to report sent. A request the kill cut half-way is counted
whole: it left, and a store may bill it. One round trip per request and per answer that carries
bytes (50-150 us to a Redis on loopback): a part is MiBs against it, a small file's PUT some ms.

When Redis does not take a count, the meter keeps it and the task hands it over when it ends
(workers/executor.py ``_metered``), as it did before counts went ahead; a worker killed then
loses only those.
"""

from __future__ import annotations

import logging

from redis.exceptions import RedisError

from bridge.workers import metrics

log = logging.getLogger(__name__)


# Counters added to a hash of a job's only while its record is there: a job that Redis lost
# (restarted without persistence, flushed) is not made again as counters no reader can use and
# no expiry reaches. One round trip, as the HINCRBY it replaces.
_COUNT = """
-- KEYS: the job's record, a hash of counters;  ARGV: name, delta pairs
if redis.call('HEXISTS', KEYS[1], 'state') == 0 then return 0 end
for i = 1, #ARGV, 2 do redis.call('HINCRBY', KEYS[2], ARGV[i], ARGV[i + 1]) end
return 1
"""


def count(client, record_key: str, key: str, fields: dict[str, int]) -> bool:
    """Add ``fields`` to the hash ``key`` if the job's record ``record_key`` is there (False if not)."""
    script = client.register_script(_COUNT)   # no round trip: its SHA-1, sent with EVALSHA
    return bool(script(keys=[record_key, key], args=[x for item in fields.items() for x in item]))


class JobMeterLog:
    """``Meter(ahead=JobMeterLog(client, record_key, key))``: counts added to the hash ``key`` as
    they come, while the job's record ``record_key`` is there."""

    def __init__(self, client, record_key: str, key: str):
        self.client, self.record_key, self.key = client, record_key, key
        self._warned = False

    def __call__(self, fields: dict[str, int]) -> bool:
        metrics.metered(fields)
        try:
            count(self.client, self.record_key, self.key, fields)
            return True
        except RedisError as exc:   # kept by the meter, handed over when the task ends
            if not self._warned:
                self._warned = True
                log.warning("%s: requests counted in this process until Redis answers again: %s", self.key, exc)
            return False
