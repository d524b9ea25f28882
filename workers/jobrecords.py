"""Jobs as records in Redis: what was asked, where it stands, what went wrong.

A record is one hash, ``<ns>:job:<id>``. State moves only forward, by compare-and-set in Redis,
so a cancel and a finishing worker cannot both win (and each end is announced on
``<ns>:job:<id>:ended``, so whoever follows the job wakes then rather than at its next look)::

    awaiting-approval -> queued -> planning -> running -> verifying -> succeeded
       (over budget)   \\__________\\__________\\__________\\____> failed
       \\__________\\__________\\_____________> cancelled   (not once verifying: the copy is done)

Progress counters are incremented by the tasks as they go (HINCRBY); the rate is derived when the
record is read. Errors are redacted before they are stored, and so are the reports a job keeps
(``REPORTS``: per-destination rows of a policy run, the verify summary, the route), which quote
errors; only the first ``MAX_ERRORS`` errors are kept (with a count of all). A finished job's keys expire after ``job_ttl``.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from bridge.policies.cost.money import usd_number
from bridge.workers.auth import STEERING
from bridge.workers.keys import Keys
from bridge.redact import redact, redact_data
from bridge.workers.specs import JobSpec

STATES = ("awaiting-approval", "queued", "planning", "running", "verifying", "succeeded", "failed", "cancelled")
ACTIVE = ("awaiting-approval", "queued", "planning", "running", "verifying")
TERMINAL = ("succeeded", "failed", "cancelled")
CANCELLABLE = ("awaiting-approval", "queued", "planning", "running")
MAX_ERRORS = 50
REPORTS = ("replicas", "verify", "route")   # fields shown to people, never read back to run work

COUNTERS = ("bytes_total", "files_total", "units_total", "tasks_total", "tasks_done", "bytes_done",
            "bytes_skipped", "units_done", "units_failed", "files_done", "retries", "requeued",
            "error_count", "bytes_through", "fallbacks")
# Where a job's time went, in milliseconds: planning, its finalize (the commit and then the verify,
# ``verify_ms`` of it), and its transfer tasks in all (``task_ms``) and in their units
# (``moving_ms``); the rest of a task's time is its overhead.
TIMINGS = ("plan_ms", "finalize_ms", "verify_ms", "task_ms", "moving_ms")

_TRANSITION = """
local cur = redis.call('HGET', KEYS[1], 'state')
if not cur then return {0, ''} end
for i = 3, #ARGV do
  if ARGV[i] == cur then
    redis.call('HSET', KEYS[1], 'state', ARGV[1], 'updated', ARGV[2])
    return {1, cur}
  end
end
return {0, cur}
"""


def _usd(amount: float | None) -> float | None:
    """Dollars in a --json document as the text shows them (bridge.policies.cost.money)."""
    return None if amount is None else usd_number(amount)


def iso(ts: float | None) -> str | None:
    return None if ts is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


@dataclass
class JobRecord:
    id: str
    kind: str
    state: str
    spec: dict[str, Any]
    queue: str
    created: float
    updated: float
    started: float | None = None
    finished: float | None = None
    schedule: str | None = None
    parent: str | None = None
    children: list[str] = field(default_factory=list)
    plan_key: str | None = None
    manifest: str | None = None
    verify: dict[str, Any] | None = None
    counters: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    budget: str | None = None            # the monthly budget the job is charged to
    estimate_usd: float | None = None    # priced when it was submitted
    spent_usd: float | None = None       # priced when it ended, from what ran
    policy: str | None = None            # the replication policy that started it
    replicas: dict[str, Any] | None = None  # a policy run: per destination, what it left there
    route: dict[str, Any] | None = None     # copy and sync: the route's name and why (bridge/routes)
    estimate_requests: int | None = None    # the requests the estimate counts
    metered: dict[str, Any] | None = None   # what its tasks sent, per store (bridge/meter.py)
    auth: dict[str, Any] | None = None      # the tenant's signature over the spec (workers/auth.py)
    # the text of the record's fields that steer its workers (auth.STEERING, and those its
    # signature names), as read: what the signature is checked over and what runs
    steering: dict[str, str] = field(default_factory=dict)

    @property
    def tenant(self) -> str | None:
        return self.auth.get("tenant") if isinstance(self.auth, dict) else None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def elapsed(self) -> float:
        if self.started is None:
            return 0.0
        return (self.finished or time.time()) - self.started

    @property
    def rate(self) -> float:
        moved = self.counters.get("bytes_done", 0) - self.counters.get("bytes_skipped", 0)
        return moved / self.elapsed if self.elapsed > 0 else 0.0

    def timings(self) -> dict[str, float]:
        """Seconds spent planning, in the finalize (its verify apart too), in transfer tasks, in
        their units, and per task outside its units (Celery's delivery not counted: it is outside
        the task)."""
        c = self.counters
        tasks = c.get("tasks_done", 0)
        overhead = (c.get("task_ms", 0) - c.get("moving_ms", 0)) / tasks / 1000 if tasks else 0.0
        return {"plan_s": c.get("plan_ms", 0) / 1000, "finalize_s": c.get("finalize_ms", 0) / 1000,
                "verify_s": c.get("verify_ms", 0) / 1000,
                "tasks_s": c.get("task_ms", 0) / 1000, "moving_s": c.get("moving_ms", 0) / 1000,
                "per_task_overhead_s": round(overhead, 4)}

    def to_dict(self) -> dict[str, Any]:
        c = self.counters
        return {
            "id": self.id, "kind": self.kind, "state": self.state, "tenant": self.tenant, "spec": self.spec,
            "queue": self.queue,
            "schedule": self.schedule, "parent": self.parent, "children": self.children,
            "created": iso(self.created), "started": iso(self.started), "finished": iso(self.finished),
            "updated": iso(self.updated),
            "progress": {**{k: c.get(k, 0) for k in COUNTERS if k != "error_count"},
                         "elapsed_s": round(self.elapsed, 3), "rate_bytes_per_s": round(self.rate)},
            "timings": self.timings(),
            "errors": self.errors, "error_count": c.get("error_count", 0),
            "manifest": self.manifest, "verify": self.verify,
            "budget": self.budget, "estimate_usd": _usd(self.estimate_usd), "spent_usd": _usd(self.spent_usd),
            "estimate_requests": self.estimate_requests, "metered": self.metered,
            "policy": self.policy, "replicas": self.replicas,
            "route": {**self.route, "bytes_through_bridge": c.get("bytes_through", 0),
                      "fallbacks": c.get("fallbacks", 0)} if self.route else None,
        }


def _json_or_none(text: str | None) -> Any:
    """A field anyone with the broker could have written: anything but JSON is no value."""
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _steering(raw: dict[str, str], auth: Any) -> dict[str, str]:
    """The fields of a raw record that steer its workers (workers/auth.py ``STEERING``) and those
    its signature block names, as they are in Redis."""
    named = auth.get("fields") if isinstance(auth, dict) else None
    names = set(STEERING) | ({n for n in named if isinstance(n, str)} if isinstance(named, list) else set())
    return {name: raw[name] for name in names if name in raw}


class Jobs:
    """Job records of one deployment."""

    _ADD = """
-- KEYS: the record, what each task reported;  ARGV: task ('' for none), then name, delta pairs
if redis.call('HEXISTS', KEYS[1], 'state') == 0 then return 0 end
for i = 2, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
  if ARGV[1] ~= '' then redis.call('HINCRBY', KEYS[2], ARGV[1] .. ':' .. ARGV[i], ARGV[i + 1]) end
end
return 1
"""

    def __init__(self, client, keys: Keys, ttl: float):
        self.r = client
        self.keys = keys
        self.ttl = int(ttl)
        self._add = client.register_script(self._ADD)
        self._transition = client.register_script(_TRANSITION)

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex[:12]

    def create(self, spec: JobSpec, *, queue: str, job_id: str | None = None, schedule: str | None = None,
               parent: str | None = None, state: str = "queued", auth: dict[str, Any] | None = None) -> str:
        job_id = job_id or self.new_id()
        now = time.time()
        key = self.keys.job(job_id)
        if not self.r.hsetnx(key, "id", job_id):
            return job_id  # made already: a planner that ran twice
        fields = {"kind": spec.kind, "state": state, "spec": json.dumps(spec.to_dict()), "queue": queue,
                  "created": now, "updated": now}
        if schedule:
            fields["schedule"] = schedule
        if parent:
            fields["parent"] = parent
        if auth:
            fields["auth"] = json.dumps(auth)
        pipe = self.r.pipeline()
        pipe.hset(key, mapping=fields)
        pipe.zadd(self.keys.jobs, {job_id: now})
        pipe.execute()
        return job_id

    def get(self, job_id: str) -> JobRecord | None:
        pipe = self.r.pipeline(transaction=False)
        pipe.hgetall(self.keys.job(job_id))
        pipe.lrange(self.keys.job(job_id, "errors"), 0, -1)
        pipe.hgetall(self.keys.job(job_id, "meter"))
        raw, errors, metered = pipe.execute()
        if not raw.get("state"):
            return None
        record = self._record(raw, errors)
        if metered:
            from bridge.meter import Meter
            record.metered = Meter.from_fields(metered).to_dict()
        return record

    @staticmethod
    def _record(raw: dict[str, str], errors: list[str]) -> JobRecord:
        def num(name: str) -> float | None:
            return float(raw[name]) if raw.get(name) else None

        auth = _json_or_none(raw.get("auth"))

        return JobRecord(
            id=raw["id"], kind=raw["kind"], state=raw["state"], spec=json.loads(raw["spec"]),
            queue=raw.get("queue", ""), created=float(raw["created"]), updated=float(raw["updated"]),
            started=num("started"), finished=num("finished"), schedule=raw.get("schedule"),
            parent=raw.get("parent"), children=json.loads(raw.get("children", "[]")),
            plan_key=raw.get("plan_key"), manifest=raw.get("manifest"),
            verify=json.loads(raw["verify"]) if raw.get("verify") else None,
            counters={k: int(raw[k]) for k in (*COUNTERS, *TIMINGS) if raw.get(k)}, errors=errors,
            budget=raw.get("budget"), estimate_usd=num("estimate_usd"), spent_usd=num("spent_usd"),
            policy=raw.get("policy"), replicas=json.loads(raw["replicas"]) if raw.get("replicas") else None,
            route=json.loads(raw["route"]) if raw.get("route") else None,
            estimate_requests=int(raw["estimate_requests"]) if raw.get("estimate_requests") else None,
            auth=auth, steering=_steering(raw, auth))

    def state(self, job_id: str) -> str | None:
        return self.r.hget(self.keys.job(job_id), "state")

    def list(self, limit: int = 50, states: tuple[str, ...] | None = None) -> list[JobRecord]:
        self.r.zremrangebyscore(self.keys.jobs, "-inf", time.time() - self.ttl)
        out: list[JobRecord] = []
        ids = self.r.zrevrange(self.keys.jobs, 0, -1)
        for start in range(0, len(ids), 100):
            chunk = ids[start:start + 100]
            pipe = self.r.pipeline(transaction=False)
            for job_id in chunk:
                pipe.hgetall(self.keys.job(job_id))
                pipe.lrange(self.keys.job(job_id, "errors"), 0, 0)
            replies = pipe.execute()
            for job_id, raw, errors in zip(chunk, replies[::2], replies[1::2]):
                if not raw.get("state"):
                    self.r.zrem(self.keys.jobs, job_id)  # expired
                    continue
                if states and raw["state"] not in states:
                    continue
                out.append(self._record(raw, errors))
                if len(out) >= limit:
                    return out
        return out

    # -- changes ------------------------------------------------------------------------------
    def transition(self, job_id: str, to: str, allowed: tuple[str, ...]) -> bool:
        """Move to ``to`` if the state is one of ``allowed``; False when it is not (or no job)."""
        return self._move(job_id, to, allowed, announce=True)

    def _move(self, job_id: str, to: str, allowed: tuple[str, ...], *, announce: bool) -> bool:
        moved, _ = self._transition(keys=[self.keys.job(job_id)], args=[to, time.time(), *allowed])
        if moved and to in TERMINAL:
            self._expire(job_id)
            if announce:
                self.announce_end(job_id)
        return bool(moved)

    def finish(self, job_id: str, to: str, allowed: tuple[str, ...] = ACTIVE, *, ended: bool = True,
               announce: bool = True, **fields: Any) -> bool:
        """Move to a final state; ``ended``: its work has stopped now (a cancel of a running job
        is not: its end time is written when its last task has stopped); ``announce``: wake its
        followers now (else the caller calls ``announce_end`` once the record is complete)."""
        if fields:
            self.update(job_id, **fields)
        if not self._move(job_id, to, allowed, announce=False):
            return False
        if ended:
            self.r.hset(self.keys.job(job_id), "finished", time.time())
        if announce:
            self.announce_end(job_id)   # with its end time in the record already
        return True

    def announce_end(self, job_id: str) -> None:
        """Wake whoever follows the job (``following``): it ended, or its last task stopped.
        The record says so too (``announced``): a follower that looked between the end and this
        (the job priced in between) waits for it, not for its next look."""
        self.r.hset(self.keys.job(job_id), "announced", time.time())
        self.r.publish(self.keys.job(job_id, "ended"), "1")

    def announced(self, job_id: str) -> bool:
        return bool(self.r.hexists(self.keys.job(job_id), "announced"))

    @contextlib.contextmanager
    def following(self, job_id: str) -> Iterator[Callable[[float], None]]:
        """A ``wait(seconds)`` that returns as soon as the job's end is announced, else after
        ``seconds``: subscribed before the caller's first look at the record, so no end falls
        between a look and the wait after it."""
        pubsub = self.r.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(self.keys.job(job_id, "ended"))
        try:
            yield lambda seconds: pubsub.get_message(timeout=seconds)
        finally:
            pubsub.close()

    def _expire(self, job_id: str) -> None:
        pipe = self.r.pipeline(transaction=False)
        for key in (self.keys.job(job_id), self.keys.job(job_id, "errors"), self.keys.job(job_id, "done"),
                    self.keys.job(job_id, "pending"), self.keys.job(job_id, "attempts"),
                    self.keys.job(job_id, "usage"), self.keys.job(job_id, "seen"), self.keys.job(job_id, "meter"),
                    self.keys.job(job_id, "reported")):
            pipe.expire(key, self.ttl)
        pipe.delete(self.keys.job(job_id, "tasks"))
        # a job listed by parts: its parts' lists of tasks, and what each part recorded
        lists = self.r.hget(self.keys.job(job_id), "task_lists")
        for key in json.loads(lists) if lists else ():
            pipe.delete(key)
        for key in (self.keys.job(job_id, "parts"), self.keys.job(job_id, "listing")):
            pipe.expire(key, self.ttl)
        pipe.execute()

    def update(self, job_id: str, **fields: Any) -> None:
        fields = {k: redact_data(v) if k in REPORTS else v for k, v in fields.items()}
        encoded = {k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in fields.items()
                   if v is not None}
        if encoded:
            self.r.hset(self.keys.job(job_id), mapping=encoded)

    def add_progress(self, job_id: str, deltas: dict[str, int], task: str | None = None) -> None:
        """Add to the job's counters; with ``task``, also to what that task's attempts reported
        (``reported``: a task run again after its worker died corrects the job's counters)."""
        deltas = {k: v for k, v in deltas.items() if v}
        if not deltas:
            return
        # Only to a record that is there: one Redis lost (restarted without persistence, flushed)
        # is not made again, as a hash of counters no reader can use and no expiry reaches.
        args = [task or ""] + [x for name, delta in deltas.items() for x in (name, delta)]
        self._add(keys=[self.keys.job(job_id), self.keys.job(job_id, "reported")], args=args)

    def reported(self, job_id: str, task: str) -> dict[str, int]:
        """What the attempts of ``task`` added to the job's counters so far."""
        fields = self.r.hgetall(self.keys.job(job_id, "reported"))
        prefix = f"{task}:"
        return {k[len(prefix):]: int(v) for k, v in fields.items() if k.startswith(prefix)}

    def add_errors(self, job_id: str, errors: list[str]) -> None:
        if not errors:
            return
        key = self.keys.job(job_id, "errors")
        pipe = self.r.pipeline(transaction=False)
        pipe.rpush(key, *(redact(e) for e in errors))
        pipe.ltrim(key, 0, MAX_ERRORS - 1)
        pipe.hincrby(self.keys.job(job_id), "error_count", len(errors))
        pipe.execute()

    def cancel(self, job_id: str) -> tuple[bool, str | None]:
        """(cancelled now?, the state it was or is in)."""
        state = self.state(job_id)
        if state is None:
            return False, None
        if self.finish(job_id, "cancelled", CANCELLABLE, ended=state in ("awaiting-approval", "queued")):
            if state in ("awaiting-approval", "queued"):   # nothing ran: what it held is free at once
                from bridge.workers.redisbudgets import Budgets
                Budgets(self.r, self.keys).settle(job_id, 0.0)
            record = self.get(job_id)
            for child in record.children if record else []:
                self.cancel(child)
            return True, state
        return False, self.state(job_id)

    # -- replication ------------------------------------------------------------------------
    def record_sync(self, source: str, destination: str, job_id: str, *, verify: str, deletes: bool) -> None:
        """After a succeeded sync: when the destination was last synced, and how (``verify``,
        ``keeps_extra``). Only a sync that deletes what the source lacks and verifies the result
        proves the two equal (``proven_at``, ``job``); a weaker one (no ``--delete``, ``--verify
        none``) says what it did and keeps the last proof, which it does not renew."""
        field = f"{source} -> {destination}"
        now = iso(time.time())
        raw = self.r.hget(self.keys.replicas, field)
        record = {**(json.loads(raw) if raw else {}), "synced_at": now, "synced_job": job_id,
                  "verify": verify, "keeps_extra": not deletes}
        if deletes and verify != "none":
            record.update(proven_at=now, job=job_id)
        self.r.hset(self.keys.replicas, field, json.dumps(record))

    def proven(self, source: str, destinations: list[str]) -> dict[str, dict | None]:
        raw = self.r.hmget(self.keys.replicas, [f"{source} -> {d}" for d in destinations]) if destinations else []
        return {d: json.loads(v) if v else None for d, v in zip(destinations, raw)}
