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


class JobMeterLog:
    """``Meter(ahead=JobMeterLog(client, key))``: counts added to the hash ``key`` as they come."""

    def __init__(self, client, key: str):
        self.client, self.key = client, key
        self._warned = False

    def __call__(self, fields: dict[str, int]) -> bool:
        metrics.metered(fields)
        try:
            if len(fields) == 1:
                (name, value), = fields.items()
                self.client.hincrby(self.key, name, value)
            else:
                pipe = self.client.pipeline(transaction=False)
                for name, value in fields.items():
                    pipe.hincrby(self.key, name, value)
                pipe.execute()
            return True
        except RedisError as exc:   # kept by the meter, handed over when the task ends
            if not self._warned:
                self._warned = True
                log.warning("%s: requests counted in this process until Redis answers again: %s", self.key, exc)
            return False
