"""Leases: a dead worker's tasks run again within seconds; a slow one is never run twice at once.

Redis hands an unacknowledged task to another worker only after the visibility timeout: an hour
by default, twelve here. Too long to wait for a dead worker; and any timeout shorter than the
slowest task would start a second copy of a task that is merely slow. So the timeout stays long,
and liveness is decided by leases instead:

- A task starts by taking its lease, ``<ns>:lease:<task id>``, a key with a TTL (``lease``, 30 s),
  and registering how to queue it again in ``<ns>:running``. One Lua script does both, and first
  checks that the task is not done already: a duplicate delivery finds ``done`` or ``busy`` and
  returns without touching anything.
- While the task runs, a heartbeat thread renews the lease every third of its TTL. A slow task
  keeps its lease however long it takes; nobody else may take it.
- A worker killed with SIGKILL stops renewing. Every worker runs a sweeper (one at a time, under
  a lock) that every ``sweep`` seconds looks for registered tasks whose lease has expired and
  queues them again; the sweeper also requeues messages a dead worker had received but not yet
  started (``workers/broker.py``). So a dead worker's tasks are queued again at most
  lease + sweep after its last heartbeat.
- A task that finishes marks itself done and, in the same script, decrements its job's pending
  count; the task that brings it to zero hands the finalize step over through ``<ns>:running``
  too, so that it is queued even if that worker dies right after. That worker then takes the
  finalize's lease and runs it itself (the planner does the same with a job's first transfer,
  leased before the plan is marked done): the registration is what makes it safe not to send it.
- Fencing. A holder that cannot renew (its Redis link is down, Redis is away) stops by itself
  once ``FENCE`` of the TTL has passed since the last renewal it sent, before the lease can lapse
  in Redis: no new unit, and its requests stop at their next piece (``Lease.fences``). So the
  worker that takes the task over after the lease lapsed is the only one writing its units. A
  holder whose link comes back finds the lease held by another or the task done, and a lease
  that lapsed is taken again only while the task is neither done nor queued again: it never
  resumes a task another worker ran. What a fenced holder had already finished is in the journal
  or is sent again (the same bytes to the same names); it never completes the task, so it never
  counts it twice nor hands its job's finalize over twice.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from bridge.workers.keys import Keys

log = logging.getLogger(__name__)

_ACQUIRE = """
-- KEYS: done set, lease, running;  ARGV: task id, token, ttl ms, record
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return 'done' end
if not redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', ARGV[3]) then return 'busy' end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[4])
return 'ok'
"""

_RENEW = """
-- KEYS: lease, done set, running;  ARGV: token, ttl ms, task id.
-- 1 renewed, 2 taken again after expiring (nobody else had it), 0 lost
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if holder then return 0 end
-- Expired: ours again only while nobody ran it meanwhile (it is not done) and its registration
-- is still this holder's (the sweeper has not queued it again).
if redis.call('SISMEMBER', KEYS[2], ARGV[3]) == 1 then return 0 end
local entry = redis.call('HGET', KEYS[3], ARGV[3])
if not entry or not string.find(entry, ARGV[1], 1, true) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 2
"""

_COMPLETE = """
-- KEYS: done set, pending, running, lease, the job's record;  ARGV: task id, token, counts (0/1),
-- next id, next record. Returns the tasks still pending, -1 if this task was already done, -3 if
-- its job is gone (a counted task: its count of pending tasks; another: its record): Redis lost
-- its data, and nothing of the job is made again, nothing handed over.
local entry = redis.call('HGET', KEYS[3], ARGV[1])
if entry and string.find(entry, ARGV[2], 1, true) then redis.call('HDEL', KEYS[3], ARGV[1]) end
if redis.call('GET', KEYS[4]) == ARGV[2] then redis.call('DEL', KEYS[4]) end
if ARGV[3] == '1' and redis.call('EXISTS', KEYS[2]) == 0 then return -3 end
if ARGV[3] == '0' and redis.call('HEXISTS', KEYS[5], 'state') == 0 then return -3 end
local added = redis.call('SADD', KEYS[1], ARGV[1])
if added == 0 then return -1 end
if ARGV[3] == '0' then return tonumber(redis.call('GET', KEYS[2]) or '-2') end
local left = redis.call('DECR', KEYS[2])
if left == 0 and ARGV[4] ~= '' then redis.call('HSET', KEYS[3], ARGV[4], ARGV[5]) end
return left
"""

_RELEASE = """
-- KEYS: lease, running;  ARGV: task id, token
if redis.call('GET', KEYS[1]) == ARGV[2] then redis.call('DEL', KEYS[1]) end
local entry = redis.call('HGET', KEYS[2], ARGV[1])
if entry and string.find(entry, ARGV[2], 1, true) then redis.call('HDEL', KEYS[2], ARGV[1]) end
return 1
"""

_CLAIM = """
-- KEYS: running, lease;  ARGV: task id, the record the sweeper saw
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
return 1
"""


@dataclass
class TaskRef:
    """How to queue a task again: what Celery needs to send it, and where it came from."""

    id: str
    task: str
    args: list[Any]
    queue: str
    job: str
    tag: str | None = None        # the broker's delivery tag, to drop the dead delivery
    worker: str = ""
    since: float = field(default_factory=time.time)
    token: str = ""

    def encode(self) -> str:
        return json.dumps(self.__dict__, separators=(",", ":"), sort_keys=True)

    @classmethod
    def decode(cls, raw: str) -> TaskRef:
        return cls(**json.loads(raw))


def new_token() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


class Leases:
    """The lease scripts of one deployment, bound to one Redis client."""

    def __init__(self, client, keys: Keys, ttl: float):
        self.r = client
        self.keys = keys
        self.ttl = ttl
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._complete = client.register_script(_COMPLETE)
        self._release = client.register_script(_RELEASE)
        self._claim = client.register_script(_CLAIM)

    @property
    def ttl_ms(self) -> int:
        return max(1, int(self.ttl * 1000))

    def lease(self, ref: TaskRef) -> Lease:
        return Lease(self, ref)


FENCE = 2 / 3   # of the TTL without a renewal, after which a holder stops by itself


class Lease:
    """One task's lease. ``acquire()``, then ``with lease.heartbeat():`` around the work, then
    ``complete()``; ``lost`` is set if another delivery took over, or if no renewal got through
    for ``FENCE`` of the TTL (it may lapse: another may take it). ``fences``: more events set
    with ``lost`` (a step's request stopper)."""

    def __init__(self, leases: Leases, ref: TaskRef):
        self.leases = leases
        self.ref = ref
        self.ref.token = self.ref.token or new_token()
        self.lost = threading.Event()
        self.fences: list[threading.Event] = []
        self.renewals = 0
        self.renewed = time.monotonic()   # when the last renewal that got through was sent

    def lose(self, why: str) -> None:
        if not self.lost.is_set():
            log.warning("task %s: %s; stopping", self.ref.id, why)
        self.lost.set()
        for event in self.fences:
            event.set()

    @property
    def _keys(self) -> Keys:
        return self.leases.keys

    def acquire(self) -> str:
        """'ok' (it is ours), 'busy' (another live delivery runs it) or 'done'."""
        k = self._keys
        self.ref.since = time.time()
        self.renewed = time.monotonic()
        return self.leases._acquire(
            keys=[k.job(self.ref.job, "done"), k.lease(self.ref.id), k.running],
            args=[self.ref.id, self.ref.token, self.leases.ttl_ms, self.ref.encode()])

    def renew(self) -> bool:
        sent = time.monotonic()
        k = self._keys
        result = self.leases._renew(keys=[k.lease(self.ref.id), k.job(self.ref.job, "done"), k.running],
                                    args=[self.ref.token, self.leases.ttl_ms, self.ref.id])
        if result == 2:
            log.warning("lease of task %s had expired (Redis unreachable?); taken again", self.ref.id)
        if result == 0:
            self.lose("another worker took over its lease, or ran it")
            return False
        self.renewed = max(self.renewed, sent)
        self.renewals += 1
        return True

    def fenced(self) -> bool:
        """Whether no renewal got through for ``FENCE`` of the TTL (the lease may lapse soon)."""
        return time.monotonic() - self.renewed >= self.leases.ttl * FENCE

    @contextmanager
    def heartbeat(self) -> Iterator[Lease]:
        stop = threading.Event()
        interval = self.leases.ttl / 3

        def beat() -> None:
            from redis.exceptions import RedisError
            while not stop.wait(interval) and not self.lost.is_set():
                try:
                    if not self.renew():
                        return
                except RedisError as exc:  # Redis away: keep trying; renew() notices a lost lease
                    log.warning("task %s: could not renew its lease: %s", self.ref.id, exc)

        def fence() -> None:   # apart from beat(), which a renewal sent into a dead link holds up
            while not stop.wait(min(0.2, interval / 5)):
                if self.fenced():
                    self.lose(f"no lease renewal got through for {time.monotonic() - self.renewed:.1f}s "
                              f"(Redis unreachable?): its lease may lapse and the task run elsewhere")
                    return

        if time.monotonic() - self.renewed >= interval:
            # Taken a while ago (a planner's first slice, leased before it sent the rest): renewed
            # now, or found lost, before its fence can count the wait against it.
            from redis.exceptions import RedisError
            try:
                self.renew()
            except RedisError as exc:
                log.warning("task %s: could not renew its lease: %s", self.ref.id, exc)
        threads = [threading.Thread(target=beat, name=f"lease-{self.ref.id}", daemon=True),
                   threading.Thread(target=fence, name=f"fence-{self.ref.id}", daemon=True)]
        for thread in threads:
            thread.start()
        try:
            yield self
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=5)

    def complete(self, counts: bool, then: TaskRef | None = None) -> int:
        """Mark the task done. For a counted task, the job's pending tasks left (and when that
        reaches 0, ``then`` is handed over); -1 if it was done already; -3 if the job's count is
        gone (Redis lost its data: the task is not marked, nothing is handed over)."""
        k = self._keys
        job = self.ref.job
        return int(self.leases._complete(
            keys=[k.job(job, "done"), k.job(job, "pending"), k.running, k.lease(self.ref.id), k.job(job)],
            args=[self.ref.id, self.ref.token, "1" if counts else "0", then.id if then else "",
                  then.encode() if then else ""]))

    def release(self) -> None:
        """Give the lease up without finishing (the task will be run again)."""
        k = self._keys
        self.leases._release(keys=[k.lease(self.ref.id), k.running], args=[self.ref.id, self.ref.token])


class Sweeper:
    """Queues again the tasks of dead workers. Runs in every worker; one sweeps at a time."""

    def __init__(self, leases: Leases, publish: Callable[[TaskRef], None],
                 unacked: Any | None = None, on_requeue: Callable[[TaskRef], None] | None = None):
        self.leases = leases
        self.publish = publish
        self.unacked = unacked          # bridge.workers.broker.Unacked, or None
        self.on_requeue = on_requeue

    def sweep(self, lock_ttl: float | None = None) -> list[str]:
        r, k = self.leases.r, self.leases.keys
        token = new_token()
        lock_ms = int((lock_ttl or self.leases.ttl) * 1000)
        if not r.set(k.sweeper, token, nx=True, px=lock_ms):
            return []
        try:
            requeued = self._expired_leases()
            if self.unacked is not None:
                requeued += self.unacked.requeue_unleased(self.leases, self.requeue, grace=self.leases.ttl,
                                                          skip=set(requeued))
            return requeued
        finally:
            if r.get(k.sweeper) == token:
                r.delete(k.sweeper)

    def requeue(self, ref: TaskRef, why: str) -> None:
        self.publish(ref)
        log.warning("task %s (%s of job %s) %s; queued again on %s", ref.id, ref.task, ref.job or "-", why,
                    ref.queue)
        if self.on_requeue:
            self.on_requeue(ref)

    def _expired_leases(self) -> list[str]:
        r, k = self.leases.r, self.leases.keys
        now = time.time()
        requeued: list[str] = []
        for task_id, raw in list(r.hscan_iter(k.running)):
            if r.exists(k.lease(task_id)):
                continue
            ref = TaskRef.decode(raw)
            if now - ref.since < self.leases.ttl:
                continue  # a hand-over just made: give its own sender the time to send it
            # Send first, then drop the registration (unless the new delivery has already
            # replaced it): a sweeper dying in between costs one duplicate delivery, which finds
            # the task done or busy; never a lost task.
            self.requeue(ref, f"lost its worker {ref.worker}" if ref.token else "was handed over")
            if self.unacked is not None and ref.tag:
                self.unacked.drop(ref.tag)
            self.leases._claim(keys=[k.running, k.lease(task_id)], args=[task_id, raw])
            requeued.append(task_id)
        return requeued
