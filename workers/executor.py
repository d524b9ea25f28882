"""The Celery executor: a job is planned once, its units fan out as tasks, a finalize step writes
the manifest when every task is done. Tasks are thin (workers/tasks.py); this is what they do.

    submit ──> bridge.plan ──> bridge.transfer x N ──(pending reaches 0)──> bridge.finalize
               plan, prepare,   one multipart file, a batch   manifest (and index), verify,
               fan out          of small files, or a shard,   succeeded / failed
                                on a thread pool in one
                                process

A multipart file up to ``file_task_bytes`` is one task, its parts on that task's thread pool,
its SHA-256 fed in part order there. A bigger one is begun by the planner and its parts go out in
runs of about ``file_task_bytes``, a task each, on any workers; the job's finalize completes it
(its manifest entry then holds a SHA-256 per part and, for a local destination, the whole
file's, read back from the disk). Small files go in tasks sized by their expected time
(workers/kinds.py ``task_seconds``: the job spread over the pool processes of the live workers
of its queue, three tasks each when there are several, none longer than ``task_seconds``), each sending its files as an
in-process copy does (batch units, many requests in flight from one thread). A pool process keeps
what tasks share warm: its Redis client, its settings and stores (bridge.stores.get_store's
cache), their clients and connections; the pool does not recycle its processes.
Every finished unit is in the Redis journal (its records sent together, at the latest when the
task ends), so a task run again after its worker died redoes only the units that were in flight.
The plan's sub-plans go to Redis a few MiB at a time as they are made, and out again a page at a
time; the commit streams the journal's file records in key order (workers/redisjournal.py). What a unit is depends on the kind of job (workers/kinds.py);
the units themselves are bridge's own, the same ones its in-process executors run.

A cancelled job's tasks stop at their next unit (their requests at their next piece); a plan or
transfer busy inside one call that never looks (and sends no request) is ended with its pool
process a few seconds after the cancel, what it would have handed over handed over first
(``Service._watch_cancel``).

A task carries its job id and its slice of the plan; the worker loads settings (and the
credentials in them) for the job's profile from its own environment. The planner runs the first
slice itself, unsent, then each slice it still holds (up to ``HOLD_BYTES`` of them) that no other
worker has taken from the queue; the worker that finishes a job's last slice runs its finalize.
So a job of one task is one delivery, and no slice its planner runs is checked twice
(``Service._leased``).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from bridge import meter
from bridge.errors import BridgeError
from bridge.workers import metrics
from bridge.workers.auth import Refused, canonical
from bridge.workers.redisbudgets import Budgets
from bridge.workers.gate import Admitted, Gate
from bridge.workers.jobrecords import ACTIVE, Jobs, JobRecord
from bridge.workers.redisjournal import RedisJournal
from bridge.workers.keys import Keys
from bridge.workers.leases import Lease, Leases, TaskRef
from bridge.workers.metering import JobMeterLog
from bridge.redact import redact
from bridge.workers.settings import WorkerSettings
from bridge.workers.specs import JobSpec, parse_spec

log = logging.getLogger(__name__)

PLAN, TRANSFER, FINALIZE, SCHEDULED = "bridge.plan", "bridge.transfer", "bridge.finalize", "bridge.scheduled"
LIST = "bridge.list"   # one part of a job's listing, fanned out by sub-prefix (``Service._fan_out``)

# Records a part of a job's listing, once, while its lister holds its lease; the part that brings
# the count of parts still to list to 0 dispatches the job.
_LISTED = """
-- KEYS: parts hash, parts still to list, lease;  ARGV: part index, record, token
-- Returns the parts still to list; -1 if this part was recorded already; -2 if the lease is not ours.
if redis.call('GET', KEYS[3]) ~= ARGV[3] then return -2 end
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return -1 end
return redis.call('DECR', KEYS[2])
"""


def route(ws: WorkerSettings, spec: JobSpec, destination: str | None = None) -> str:
    """The queue a job's tasks go to: its own, else the first route matching its destination
    (scheme://bucket, then scheme), else <prefix>.<scheme>. A replication's parent only starts
    its children, on the control queue."""
    if spec.queue:
        return spec.queue
    if spec.kind == "replicate" and destination is None:
        return ws.control_queue
    from bridge.urls import parse
    loc = parse(destination or spec.destination)
    for match in (f"{loc.scheme}://{loc.bucket}", loc.scheme):
        if match in ws.routes:
            return ws.routes[match]
    return f"{ws.queue_prefix}.{'local' if loc.is_local else loc.scheme}"


def route_bwlimit(ws: WorkerSettings, destination: str) -> int | None:
    """The deployment's default bandwidth limit for jobs to ``destination`` (scheme://bucket, then
    scheme), or None."""
    from bridge.urls import parse
    loc = parse(destination)
    for match in (f"{loc.scheme}://{loc.bucket}", loc.scheme):
        if match in ws.route_bwlimits:
            return ws.route_bwlimits[match] or None
    return None


class ProgressSink:
    """Moves a task's ``Progress`` into its job record and the metrics, as deltas, at most every
    ``interval`` seconds while it runs and once at the end."""

    NAMES = ("bytes_done", "bytes_skipped", "units_done", "units_failed", "files_done", "retries",
             "bytes_through", "fallbacks")

    def __init__(self, jobs: Jobs, job_id: str, queue: str, interval: float = 0.5, route: str = "direct",
                 task: str | None = None, tenant: str = "", destination: str = ""):
        self.jobs, self.job_id, self.queue, self.interval, self.route = jobs, job_id, queue, interval, route
        self.task = task
        self.tenant, self.destination = tenant, destination   # the throughput metrics' labels
        self.sent = dict.fromkeys(self.NAMES, 0)
        self.last = time.monotonic()
        self.lock = threading.Lock()

    def __call__(self, progress) -> None:
        if time.monotonic() - self.last >= self.interval and self.lock.acquire(blocking=False):
            try:
                self._flush(progress)
            finally:
                self.lock.release()

    def close(self, progress, max_units: int) -> None:
        with self.lock:
            self._flush(progress, max_units)

    def _flush(self, progress, max_units: int | None = None) -> None:
        now = {name: getattr(progress, name) for name in self.NAMES}
        if max_units is not None:
            # ThreadExecutor counts its final unit even when there is none (final=None).
            now["units_done"] = min(now["units_done"], max_units)
        delta = {name: now[name] - self.sent[name] for name in self.NAMES}
        self.sent, self.last = now, time.monotonic()
        from redis.exceptions import RedisError
        try:
            self.jobs.add_progress(self.job_id, delta, task=self.task)
        except RedisError as exc:  # progress is best effort; the journal is what counts
            log.warning("job %s: progress not recorded: %s", self.job_id, exc)
        metrics.transfer(self.queue, moved=delta["bytes_done"] - delta["bytes_skipped"],
                         skipped=delta["bytes_skipped"], done=delta["units_done"],
                         failed=delta["units_failed"], retries=delta["retries"])
        metrics.routed(self.queue, self.route, moved=delta["bytes_done"] - delta["bytes_skipped"],
                       through=delta["bytes_through"], tenant=self.tenant, destination=self.destination)


class StopCheck:
    """Whether a task should stop handing out units: its lease was taken over, or its job was
    cancelled. The job's state is read at most every ``interval`` seconds."""

    def __init__(self, jobs: Jobs, job_id: str, lease: Lease, interval: float = 0.5):
        self.jobs, self.job_id, self.lease, self.interval = jobs, job_id, lease, interval
        self.checked = 0.0
        self.cancelled = False

    def __call__(self) -> bool:
        if self.lease.lost.is_set() or self.cancelled:
            return True
        if time.monotonic() - self.checked >= self.interval:
            self.checked = time.monotonic()
            self.cancelled = self.jobs.state(self.job_id) in ("cancelled", None)
        return self.cancelled

    def units(self, units: Iterator[dict]) -> Iterator[dict]:
        for unit in units:
            if self():
                return
            yield unit


def _settle_gc() -> None:
    """After a step's first run in a process: what it made and keeps (stores, their clients and
    the SDK's models, settings, the price tables) lives as long as the process, and the cyclic
    collector walked it on every full collection (0.4 s of a second job's plan and tasks on a
    loaded machine, measured with gc.callbacks). Frozen out of its reach, as an in-process copy does
    (bridge.ops); what the step left to collect is collected first."""
    gc.collect()
    gc.freeze()


@dataclass(frozen=True)
class Planned:
    """A transfer task's slice as its planner made it: the plan, the text signed, the signature."""
    id: str
    sub: dict
    text: str
    sig: str


def _longest_first(parts: list[dict]) -> list[str]:
    """The task lists of a job listed by parts, in the order their tasks are sent: the parts
    holding the largest files sent in parts first, the rest in their order. Each part's list
    begins with its own such files (kinds.fan_out), so the long tasks start early wherever the
    listing found them: sent last, the corpus's two 24 MiB files ran alone at the end on two
    hosts while the others idled (bench/notes/hosts.md)."""
    ordered = sorted((p for p in parts if p["list"]), key=lambda p: -int(p.get("longest") or 0))
    return [p["list"] for p in ordered]


def _task_entry(raw: bytes | str) -> tuple[str, str, str]:
    """(task id, sub-plan text, signature) of an entry of a job's list of tasks, which
    ``Service._make_plan`` writes as ``[id,TEXT,sig]``: TEXT cut out as it is, not decoded."""
    raw = raw.decode() if isinstance(raw, bytes) else raw
    task_id, end = _DECODER.raw_decode(raw, 1)
    tail = raw.rfind(',"')
    if raw[end:end + 2] == ",{" and raw.endswith('"]') and tail > end:
        return task_id, raw[end + 1:tail], json.loads(raw[tail + 1:-1])
    task_id, sub, sig = json.loads(raw)   # not as _make_plan writes it: read whole
    return task_id, canonical(sub).decode(), sig


_DECODER = json.JSONDecoder()


class Recorded:
    """A task's journal that keeps the keys of the records put through it: what the task's run
    finished, known without reading the journal back."""

    def __init__(self, journal):
        self.journal = journal
        self.keys: set[str] = set()

    def put(self, key: str, value: Any) -> None:
        self.journal.put(key, value)
        self.keys.add(key)

    def put_many(self, records: list[tuple[str, Any]]) -> None:
        records = list(records)
        self.journal.put_many(records)
        self.keys.update(key for key, _ in records)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.journal, name)


def _describe(exc: BaseException) -> str:
    return redact(str(exc) if isinstance(exc, BridgeError) else f"internal error: {type(exc).__name__}: {exc}")


class Service:
    """What the tasks of one process share: settings, Redis, job records, leases, a sender."""

    def __init__(self, ws: WorkerSettings, client, send: Callable[[TaskRef], None]):
        self.ws = ws
        self.r = client
        self.keys = Keys(ws.namespace)
        self.jobs = Jobs(client, self.keys, ws.job_ttl)
        self.leases = Leases(client, self.keys, ws.lease)
        self.send = send
        self.gate = Gate(ws, client, self.keys)
        self._settings: dict[tuple, Any] = {}
        self._lock = threading.Lock()
        self._settled: set[str] = set()   # the steps that have run in this process (_settle_gc)

    # -- submission ------------------------------------------------------------------------
    def route(self, spec: JobSpec, destination: str | None = None) -> str:
        return route(self.ws, spec, destination)

    def submit(self, spec: JobSpec, *, schedule: str | None = None, parent: str | None = None,
               job_id: str | None = None, budget: str | None = None, estimate: float | None = None,
               extra: dict[str, Any] | None = None, tenant: str | None = None,
               scope_budget: str | None = None) -> str:
        """Sign and queue a job. One charged to a monthly ``budget`` is created awaiting approval and
        admitted by ``Budgets.admit`` (its estimate reserved, atomically) when it fits; otherwise
        it waits there. ``tenant``: whom it is signed for (default: this process's BRIDGE_TENANT;
        workers sign the jobs they start for the tenant that asked); ``scope_budget``: the budget
        signed into it when not ``budget`` (a replication's children, charged through their parent).
        ``extra``: more fields of the record, written before anything runs. The signature covers
        them and the estimate admitted (workers/auth.py), and a worker checks both (workers/gate.py)."""
        queue = self.route(spec)
        keyring = self.gate.keyring
        job_id = job_id or Jobs.new_id()
        auth = keyring.sign_job(tenant or keyring.signer(), job_id, spec.to_dict(), budget=budget or scope_budget,
                                ttl=self.ws.signature_ttl, fields=extra,
                                estimate=None if budget is None else float(estimate or 0.0))
        job_id = self.jobs.create(spec, queue=queue, job_id=job_id, schedule=schedule, parent=parent,
                                  state="queued" if budget is None else "awaiting-approval", auth=auth)
        if budget is not None:
            self.jobs.update(job_id, budget=budget, estimate_usd=repr(float(estimate or 0.0)))
        if extra:
            self.jobs.update(job_id, **extra)
        if budget is not None:
            admitted, _ = Budgets(self.r, self.keys).admit(job_id, self.keys.job(job_id), budget, estimate or 0.0)
            if not admitted:
                log.info("job %s awaits approval: over budget %s", job_id, budget)
                return job_id
        log.info("job %s queued on %s", job_id, queue)
        self.send(TaskRef(f"{job_id}.plan", PLAN, [job_id], queue, job_id))
        return job_id

    def approve(self, job_id: str) -> tuple[bool, str | None]:
        """Queue a job that waited for approval: (approved now?, the state it was or is in). A
        budgeted job's estimate is reserved as it is queued."""
        record = self.jobs.get(job_id)
        if record is None:
            return False, None
        if record.budget:
            moved, state = Budgets(self.r, self.keys).admit(job_id, self.keys.job(job_id), record.budget,
                                                           record.estimate_usd or 0.0, force=True)
        else:
            moved, state = self.jobs.transition(job_id, "queued", ("awaiting-approval",)), record.state
        if not moved:
            return False, self.jobs.state(job_id)
        log.info("job %s approved: queued on %s", job_id, record.queue)
        self.send(TaskRef(f"{job_id}.plan", PLAN, [job_id], record.queue, job_id))
        return True, "awaiting-approval"

    def fire(self, name: str, spec: dict, fire_id: str, auth: Any = None) -> dict:
        """A schedule is due (sent by beat, signed): start its job unless its last one is still going."""
        if not self.r.set(self.keys.once(fire_id), "1", nx=True, ex=86400):
            return {"skipped": "duplicate delivery"}
        try:
            tenant = self.gate.message(SCHEDULED, name, spec, auth)
        except Refused as exc:
            self.gate.audit.record("refused", task=fire_id, schedule=name, reason=str(exc))
            return {"refused": str(exc)}
        last = self.r.hget(self.keys.schedule(name), "job")
        if last and self.jobs.state(last) in ACTIVE:
            log.info("schedule %s: job %s from its last run is still %s; not starting another", name, last,
                     self.jobs.state(last))
            return {"skipped": "previous run active", "job": last}
        job_id = self.submit(parse_spec(spec), schedule=name, tenant=tenant)
        self.r.hset(self.keys.schedule(name), mapping={"job": job_id, "fired": time.time()})
        log.info("schedule %s: started job %s", name, job_id)
        return {"job": job_id}

    def fire_policy(self, name: str, policy: dict, fire_id: str, auth: Any = None) -> dict:
        """A replication policy is due (sent by beat, signed): see workers/replicas.py."""
        from bridge.workers import replicas
        return replicas.fire(self, name, policy, fire_id, auth)

    # -- running a task --------------------------------------------------------------------
    def run(self, ref: TaskRef) -> dict:
        """One delivery of a leased task: take the lease, do the step, mark it done."""
        lease = self.leases.lease(ref)
        got = lease.acquire()
        if got == "ok" and not self.r.hexists(self.keys.job(ref.job), "state"):
            # its job is gone (expired, or Redis lost its data): nothing of it is made again
            lease.release()
            got = "no such job"
        if got != "ok":
            metrics.task(ref.task, got)
            log.info("task %s (%s): %s; nothing to do", ref.id, ref.task, got)
            return {"skipped": got}
        return self._leased(lease)

    def _leased(self, lease: Lease, planned: Planned | None = None) -> dict:
        """Run a task whose lease this process holds, then what it hands to this process:

        - a plan hands over its first transfer task, leased before the plan is marked done and
          never sent, then the slices it still holds in memory (``_make_plan``), each one this
          process can lease (a worker that took it from the queue first keeps it): they run from
          the plan made and checked here;
        - the transfer that finishes a job's last one runs its finalize step itself, its lease
          taken where the finalize would have been sent.

        Each next step is registered in ``<ns>:running`` (by its lease, or as the hand-over)
        before the one before it is marked done, so a worker that dies between them loses
        neither: the sweeper queues it again. The outcome is the first step's, with those of
        the steps run after it (``then``)."""
        first: dict | None = None
        then: list[dict] = []
        held: list[Planned] = []
        while lease is not None:
            try:
                outcome, after = self._step(lease, planned)
            finally:
                if lease.ref.task not in self._settled:
                    self._settled.add(lease.ref.task)
                    _settle_gc()
            if first is None:
                first = outcome
            else:
                then.append(outcome)
            if after is not None and len(after) == 3:   # the plan's: (lease, its slice, the slices held)
                after, held = (after[0], after[1]), after[2]
            while after is None and held and "lost" not in outcome:
                nxt, held = held[0], held[1:]
                taken = self.leases.lease(self._transfer_ref(lease.ref, nxt))
                if taken.acquire() == "ok":
                    after = (taken, nxt)
            lease, planned = after if after is not None else (None, None)
        return {**first, "then": then} if then else first

    @staticmethod
    def _transfer_ref(ref: TaskRef, planned: Planned) -> TaskRef:
        """The task of a slice planned here, as it is sent (and sent again by the sweeper)."""
        return TaskRef(planned.id, TRANSFER, [ref.job, planned.text, planned.sig], ref.queue, ref.job,
                       worker=ref.worker)

    def _step(self, lease: Lease, planned: Planned | None) -> tuple[dict, tuple | None]:
        """One step under its lease; its outcome, and what this process runs next: (lease,
        slice) or, after a plan, (lease, slice, the slices held after it); None: nothing."""
        ref = lease.ref
        step = {PLAN: self._plan, LIST: self._list, TRANSFER: self._transfer, FINALIZE: self._finalize}[ref.task]
        outcome: dict[str, Any]
        attempts = self.r.hincrby(self.keys.job(ref.job, "attempts"), ref.id, 1)
        # every request this task sends, counted in the job's meter as it leaves (workers/metering.py)
        metered = meter.Meter(ahead=JobMeterLog(self.r, self.keys.job(ref.job), self.keys.job(ref.job, "meter")))
        started = time.perf_counter()
        cancelled, returned = threading.Event(), threading.Event()
        extra = {"cancelled": cancelled} if ref.task in (TRANSFER, LIST) else {}
        lease.fences.append(cancelled)   # a lease lost or fenced stops the step's requests too
        if ref.task in (PLAN, LIST, TRANSFER):   # a finalize of a cancelled job is its discard: never ended
            threading.Thread(target=self._watch_cancel, args=(lease, cancelled, returned, metered), daemon=True,
                             name=f"cancel-watch-{ref.id}").start()
        with lease.heartbeat(), meter.metering(metered):
            try:
                if attempts > self.ws.max_attempts:
                    raise BridgeError(f"task {ref.id} was started {attempts - 1} times without finishing (its "
                                      f"worker died each time: out of memory?); giving up on it")
                outcome = step(lease, *ref.args, **extra) if planned is None else \
                    step(lease, ref.job, planned=planned, **extra)
            except Exception as exc:
                log.exception("task %s (%s of job %s) failed", ref.id, ref.task, ref.job)
                outcome = {"error": _describe(exc)}
                if lease.lost.is_set():
                    pass   # no longer this delivery's task: what it failed at is the new holder's to do
                elif ref.task == TRANSFER:
                    self.jobs.add_errors(ref.job, [outcome["error"]])
                else:
                    self._end(ref.job, "failed", [outcome["error"]])
            finally:
                returned.set()
                self._metered(ref.job, metered)
        here = outcome.pop("here", None)   # the plan's first transfer, its lease held, and the rest held (_plan)
        if lease.lost.is_set():   # a first transfer leased here runs again once its lease expires
            metrics.task(ref.task, "lost")
            return {"lost": True}, None
        counted = ref.task == TRANSFER
        then = TaskRef(f"{ref.job}.finalize", FINALIZE, [ref.job], ref.queue, ref.job, worker=ref.worker) \
            if counted else None
        left = lease.complete(counted, then)
        if counted and left >= 0:   # with the time it took, and how much of it its units ran
            self.jobs.add_progress(ref.job, {"tasks_done": 1, "task_ms": int((time.perf_counter() - started) * 1000),
                                             "moving_ms": outcome.get("moving_ms", 0)})
        metrics.task(ref.task, "error" if "error" in outcome else "ok")
        if counted and left == 0:
            final = self.leases.lease(then)
            if final.acquire() == "ok":   # registered in place of the hand-over: run here, not sent
                return outcome, (final, None)
            self.send(then)
        return outcome, here

    # -- steps -----------------------------------------------------------------------------
    def settings_for(self, spec: JobSpec):
        """The worker's own settings for the job's profile (cached per process)."""
        from bridge.config import load_settings
        key = (spec.profile, json.dumps(spec.settings_overrides(), sort_keys=True))
        with self._lock:
            if key not in self._settings:
                self._settings[key] = load_settings(spec.settings_overrides(), profile=spec.profile)
            return self._settings[key]

    def journal(self, plan_key: str) -> RedisJournal:
        return RedisJournal(self.r, self.keys.journal(plan_key), self.ws.journal_ttl)

    def _record(self, job_id: str) -> tuple[JobRecord | None, JobSpec | None]:
        record = self.jobs.get(job_id)
        return record, (JobSpec.from_dict(record.spec) if record else None)

    def _refuse(self, record: JobRecord, reason: str, task: str) -> dict:
        """A job's task that the gate refused: nothing of it runs, and the job fails saying why."""
        spec = record.spec if isinstance(record.spec, dict) else {}
        self.gate.audit.record("refused", job=record.id, tenant=record.tenant, task=task, kind=record.kind,
                               source=spec.get("source"), destinations=spec.get("destinations"), reason=reason)
        self.jobs.add_errors(record.id, [f"refused: {reason}"])
        if self.jobs.finish(record.id, "failed"):
            metrics.job_finished(record.kind, "failed", record.elapsed)
            if record.parent:
                self._child_ended(record.parent)
        return {"refused": reason}

    def _admitted(self, job_id: str, task: str, *, first: bool = False) -> tuple[JobRecord | None, Admitted | None, dict]:
        """The job's record and who it runs for, when the gate lets this task of it run; else why not."""
        record = self.jobs.get(job_id)
        if record is None:
            return None, None, {"skipped": "no such job"}
        try:
            who = self.gate.admit(record) if first else self.gate.check(record)
        except Refused as exc:
            return record, None, self._refuse(record, str(exc), task)
        return record, who, {}

    def _plan(self, lease: Lease, job_id: str) -> dict:
        record = self.jobs.get(job_id)
        if record is None or record.state not in ("queued", "planning", "running"):
            if record is not None and record.state == "cancelled" and not record.plan_key:
                # cancelled before it was planned: nothing ran
                self._charge(record, JobSpec.from_dict(record.spec), "cancelled")
            return {"skipped": record.state if record else "no such job"}
        first = record.state == "queued"
        record, who, refused = self._admitted(job_id, lease.ref.id, first=True)
        if who is None:
            return refused
        if first:
            self.gate.audit.record("admitted", job=job_id, tenant=who.tenant, digest=who.digest, kind=record.kind,
                                   source=record.spec.get("source"), destinations=record.spec.get("destinations"),
                                   budget=who.budget, parent=record.parent, task=lease.ref.id)
        spec = JobSpec.from_dict(record.spec)
        if record.state == "queued":
            self.jobs.transition(job_id, "planning", ("queued",))
            self.r.hsetnx(self.keys.job(job_id), "started", time.time())
        if spec.kind == "replicate":
            return self._start_children(record, spec, who)
        planning = time.perf_counter()
        held: list[Planned] = []
        if not self.r.hexists(self.keys.job(job_id), "plan"):
            try:   # listed by parts, on any workers, when the source splits by sub-prefix
                fanned = self._fan_out(job_id, spec, who, record.queue)
            except Refused as exc:
                return self._refuse(record, str(exc), lease.ref.id)
            except BridgeError as exc:
                self._end(job_id, "failed", [_describe(exc)])
                return {"error": _describe(exc)}
            if fanned is not None:
                return fanned
            # Not planned yet, or its planner died before writing the plan (which it writes
            # last): the tasks that planner pushed go, and the job is planned again.
            self.r.delete(self.keys.job(job_id, "tasks"))
            try:
                count, held = self._make_plan(job_id, spec, who, record.queue)
            except Refused as exc:
                return self._refuse(record, str(exc), lease.ref.id)
            except BridgeError as exc:
                self._end(job_id, "failed", [_describe(exc)])
                return {"error": _describe(exc)}
        else:
            count = int(self.r.hget(self.keys.job(job_id), "tasks_total") or 0)
        return self._start(lease, job_id, spec, who, count, held, time.perf_counter() - planning)

    def _start(self, lease: Lease, job_id: str, spec: JobSpec, who: Admitted, count: int, held: list[Planned],
               planned_in: float) -> dict:
        """A planned job's tasks sent (the first held one run here), or its finalize when it has none."""
        self.jobs.transition(job_id, "running", ("planning",))
        record = self.jobs.get(job_id)
        if record is not None and record.state == "cancelled":   # while it was planned: no task was sent
            self._discard(record, spec, who, lease.ref.id)
            return {"cancelled": True}
        if record is None or record.state != "running":
            return {"skipped": record.state if record else "no such job"}
        self.jobs.add_progress(job_id, {"plan_ms": int(planned_in * 1000)})
        finalize = TaskRef(f"{job_id}.finalize", FINALIZE, [job_id], record.queue, job_id)
        # The first task, planned here, is this process's next: its lease taken now, before the
        # plan is marked done, so that it is registered to be sent again should this worker die
        # (workers/leases.py), and not sent to the broker, whose delivery would come back to a
        # worker that checks again the slice this one planned and checked. The others are sent;
        # those this process still holds it runs next, unless another worker has taken them.
        here = None
        if held:
            here = self.leases.lease(self._transfer_ref(lease.ref, held[0]))
            if here.acquire() != "ok":
                here = None
        sent = 0
        for task_id, text, sig in self._tasks(job_id, texts=True):
            if lease.lost.is_set():
                break
            if here is None or task_id != here.ref.id:
                self.send(TaskRef(task_id, TRANSFER, [job_id, text, sig], record.queue, job_id))
            sent += 1
        if not count:  # nothing to move: straight to the manifest, handed over so it is not lost
            self.r.hset(self.keys.running, finalize.id, finalize.encode())
            self.send(finalize)
        log.info("job %s running: %d tasks on %s%s", job_id, sent, record.queue,
                 f", the first here and {len(held) - 1} more held" if here is not None else "")
        return {"tasks": sent, **({"here": (here, held[0], held[1:])} if here is not None else {})}

    # -- a listing fanned out by sub-prefix ---------------------------------------------------
    def _fan_out(self, job_id: str, spec: JobSpec, who: Admitted, queue: str) -> dict | None:
        """A job whose source splits by its top-level sub-prefixes (workers/kinds.py ``Files.parts``)
        is listed by parts: a ``bridge.list`` task each, signed like a transfer's slice and run by
        any worker, leased and fenced like one; the part that finishes the listing dispatches the
        job (``_dispatch``). None: not split (a flat prefix, one object ...): the planner lists it.
        A planner run again after its first died sends the same parts again (duplicates find them
        leased or done)."""
        key = self.keys.job(job_id)
        raw = self.r.hget(key, "list_parts")
        if raw is None:
            kind = self.kind(spec)
            if not hasattr(kind, "parts") or self.ws.list_parts <= 0:
                return None
            settings = self.settings_for(spec)
            parts = kind.parts(spec, settings, self.ws.list_parts * self.slots(queue))
            if parts is None:
                return None
            plan_key = kind.plan_key(spec, settings)
            self._fresh(job_id, self.journal(plan_key))   # before any part writes to it
            signed = []
            for index, part in enumerate(parts):
                task_id = f"{job_id}.l{index}"
                text, sig = self.gate.keyring.task_text(who.tenant, who.digest, task_id, part)
                signed.append([task_id, text, sig])
            pipe = self.r.pipeline()   # one transaction: the job is split when its parts are there
            pipe.set(self.keys.job(job_id, "listing"), len(signed))
            pipe.hset(key, mapping={"list_parts": json.dumps(signed), "list_key": plan_key,
                                    "list_started": time.time()})
            pipe.execute()
            raw = self.r.hget(key, "list_parts")
        signed = json.loads(raw)
        for index, (task_id, text, sig) in enumerate(signed):
            self.send(TaskRef(task_id, LIST, [job_id, index, text, sig], queue, job_id))
        log.info("job %s: its listing split in %d parts by sub-prefix, a task each on %s", job_id, len(signed), queue)
        return {"lists": len(signed)}

    def _list(self, lease: Lease, job_id: str, index: int, text: str, sig: str, *,
              cancelled: threading.Event | None = None) -> dict:
        """One part of a job's listing (``_fan_out``): listed and, for a sync, compared with the
        destination's same part and its record; its slices signed and pushed to a list of this
        attempt's own (a list an earlier attempt left is never read); then recorded, once and only
        while this lease is held, with what the dispatch sums. The part that brings the parts still
        to list to 0 dispatches the job; a run again of that part after its worker died finds its
        part recorded and dispatches again (``_dispatch`` is idempotent)."""
        record = self.jobs.get(job_id)
        # running: its dispatch began, perhaps in this part's earlier attempt, whose worker died
        if record is None or record.state not in ("planning", "running", "cancelled"):
            return {"skipped": record.state if record else "no such job"}
        record, who, refused = self._admitted(job_id, lease.ref.id)
        if who is None:
            return refused
        try:   # the planner's part, before any request; its index is the one its id was signed with
            if lease.ref.id != f"{job_id}.l{index}":
                raise Refused(f"task {lease.ref.id}: not part {index} of job {job_id}'s listing")
            part = self.gate.keyring.check_task(who.tenant, who.digest, lease.ref.id, text, sig)
        except Refused as exc:
            return self._refuse(record, str(exc), lease.ref.id)
        spec = JobSpec.from_dict(record.spec)
        parts_key, listing_key = self.keys.job(job_id, "parts"), self.keys.job(job_id, "listing")
        recorded = self.r.hexists(parts_key, str(index))
        count = 0
        if not recorded and record.state == "running":
            return {"skipped": "running"}   # not this part's: listed and dispatched by others
        if not recorded:
            outcome: dict[str, Any] = {"count": 0, "cancelled": True}
            if record.state == "planning":
                try:
                    outcome = self._list_part(lease, job_id, index, spec, who, part, record.queue, cancelled)
                except Refused as exc:
                    return self._refuse(record, str(exc), lease.ref.id)
                if outcome is None and lease.lost.is_set():   # another attempt lists it
                    return {"lost": True}
                # cancelled on the way: recorded as such, so that the last part still ends the job
                outcome = outcome or {"count": 0, "cancelled": True}
            count = outcome["count"]
            left = int(self.r.register_script(_LISTED)(
                keys=[parts_key, listing_key, self.keys.lease(lease.ref.id)],
                args=[str(index), json.dumps(outcome), lease.ref.token]))
            if left == -2:
                lease.lose("its lease was taken over before its part was recorded")
                return {"lost": True}
        else:
            left = int(self.r.get(listing_key) or -1)
        if left != 0:
            return {"listed": index, "tasks": count}
        return {"listed": index, "tasks": count, **self._dispatch(lease, job_id, who)}

    def _list_part(self, lease: Lease, job_id: str, index: int, spec: JobSpec, who: Admitted, part: dict,
                   queue: str, cancelled: threading.Event | None) -> dict | None:
        """List and plan one part, its slices pushed to this attempt's list; what the part
        records (None: stopped, its lease lost or its job cancelled)."""
        key, signed = self.r.hmget(self.keys.job(job_id), "list_key", "list_parts")
        journal = self.journal(key)
        listing = self.kind(spec).plan_part(spec, self.settings_for(spec), part, journal,
                                            check=lambda plan: self.gate.plan(who, spec.kind, plan),
                                            slots=self.slots(queue), parts=len(json.loads(signed or "[]")))
        journal.flush()   # the adopted objects' records, before any task may read the journal
        tasks = self.keys.job(job_id, "tasks", str(index), lease.ref.token.rsplit(":", 1)[-1])
        self.r.delete(tasks)
        keyring = self.gate.keyring
        count, chunk, held = 0, [], 0

        def push() -> None:
            pipe = self.r.pipeline(transaction=False)
            pipe.rpush(tasks, *chunk)
            pipe.expire(tasks, int(self.ws.journal_ttl))
            pipe.execute()

        for sub in listing.pop("subs"):
            if lease.lost.is_set() or (cancelled is not None and cancelled.is_set()):
                return None
            task_id = f"{job_id}.l{index}.t{count}"
            text, sig = keyring.task_text(who.tenant, who.digest, task_id, sub)
            raw = f"[{json.dumps(task_id)},{text},{json.dumps(sig)}]"   # what _tasks reads: [id, sub, sig]
            chunk.append(raw)
            held += len(raw)
            count += 1
            if held >= self.PUSH_BYTES or len(chunk) >= 1000:
                push()
                chunk, held = [], 0
        if chunk:
            push()
        if lease.lost.is_set() or (cancelled is not None and cancelled.is_set()):
            return None
        return {**listing, "count": count, "list": tasks if count else None, "worker": lease.ref.worker or ""}

    def _dispatch(self, lease: Lease, job_id: str, who: Admitted) -> dict:
        """Every part of a job's listing is recorded: the header from their sums, the deletion
        guard counting the whole job's deletions before anything is written or deleted, the
        header and the pending count written in one transaction (as ``_make_plan`` does), then
        the tasks sent (``_start``). Run again, it finds the plan written and sends them again."""
        record, spec = self._record(job_id)
        if record is None:
            return {"skipped": "no such job"}
        if record.state == "cancelled":   # during the listing: nothing was sent, nothing begun
            self._discard(record, spec, who, lease.ref.id)
            return {"cancelled": True}
        if record.state not in ("planning", "running"):
            return {"skipped": record.state}
        key = self.keys.job(job_id)
        if record.state == "planning" and not self.r.hexists(key, "plan"):
            parts = [json.loads(v) for _, v in sorted(self.r.hgetall(self.keys.job(job_id, "parts")).items(),
                                                      key=lambda item: int(item[0]))]
            if any(p.get("cancelled") for p in parts):
                return {"skipped": "a part found the job cancelled"}
            kind = self.kind(spec)
            plan_key = self.r.hget(key, "list_key")
            journal = self.journal(plan_key)
            try:
                if any(p["key"] != plan_key for p in parts):
                    raise BridgeError(f"internal error: job {job_id}'s parts planned another journal than its split named")
                header, estimate = kind.dispatch(spec, self.settings_for(spec), parts, journal)
                self.gate.plan(who, spec.kind, header)
            except Refused as exc:
                return self._refuse(record, str(exc), lease.ref.id)
            except BridgeError as exc:
                self._end(job_id, "failed", [_describe(exc)])
                return {"error": _describe(exc)}
            count = sum(p["count"] for p in parts)
            totals: dict[str, int] = {}
            usage: dict[str, int] = {}
            for p in parts:
                for name, value in p["totals"].items():
                    totals[name] = totals.get(name, 0) + value
                for name, value in p["usage"].items():
                    usage[name] = usage.get(name, 0) + value
            plan_sig = self.gate.keyring.sign_task(who.tenant, who.digest, f"{job_id}.plan", header)
            pipe = self.r.pipeline()   # one transaction: the job is planned when its plan is there
            pipe.set(self.keys.job(job_id, "pending"), count)
            pipe.hset(key, mapping={"plan_key": plan_key, "plan": json.dumps(header), "plan_sig": plan_sig,
                                    **totals, "tasks_total": count,
                                    "task_lists": json.dumps(_longest_first(parts)),
                                    "listed_by": json.dumps(sorted({p["worker"] for p in parts}))})
            pipe.execute()
            self._used(job_id, usage)
            self.gate.priced(who, job_id, self._estimate(job_id, spec, estimate))   # before any task is sent
        if not self.r.hexists(key, "plan"):
            return {"skipped": record.state}
        # (run again after its worker died while it sent them: they are sent again, and each
        # one already run or running finds itself done or leased)
        count = int(self.r.hget(key, "tasks_total") or 0)
        started = float(self.r.hget(key, "started") or self.r.hget(key, "list_started") or time.time())
        return self._start(lease, job_id, spec, who, count, [], time.time() - started)

    PAGE = 200                  # sub-plans read from Redis at a time
    PUSH_BYTES = 4 * 1024 * 1024  # sub-plans written to Redis at a time, at most
    HOLD_BYTES = 4 * 1024 * 1024  # sub-plans (as text) the planner keeps to run itself, at most

    def _tasks(self, job_id: str, texts: bool = False) -> Iterator[tuple[str, Any, str]]:
        """The job's signed sub-plans, (task id, sub-plan, signature), a page at a time;
        ``texts``: each sub-plan as the text its signature covers, not read (a transfer task
        carries that text, and its worker checks the signature over it before it reads it)."""
        lists = self.r.hget(self.keys.job(job_id), "task_lists")   # a job listed by parts: one list each
        for key in json.loads(lists) if lists else [self.keys.job(job_id, "tasks")]:
            start = 0
            while True:
                page = self.r.lrange(key, start, start + self.PAGE - 1)
                for raw in page:
                    yield _task_entry(raw) if texts else tuple(json.loads(raw))
                if len(page) < self.PAGE:
                    break
                start += self.PAGE

    def slots(self, queue: str) -> int:
        """The pool processes of the live workers that consume ``queue`` (at least 1)."""
        total = 0
        for name in self.r.scan_iter(match=self.keys.workers_pattern, count=100):
            raw = self.r.get(name)
            try:
                presence = json.loads(raw) if raw else {}
            except ValueError:
                continue
            if queue in presence.get("queues", []):
                total += int(presence.get("concurrency") or 1)
        return max(1, total)

    def kind(self, spec: JobSpec):
        from bridge.workers.kinds import kind_for
        return kind_for(spec, self.ws.batch_files, self.ws.batch_bytes, self.ws.file_task_bytes, self.ws.task_seconds)

    def _make_plan(self, job_id: str, spec: JobSpec, who: Admitted, queue: str) -> int:
        """Plan the job (every file it will read or write checked against its tenant's scope
        before anything is written), sign each task's slice of the plan and push it to the job's
        list of tasks, a few MiB at a time, as the slices are made; the plan's header and the
        count of its tasks last, in one transaction (``_plan`` plans again a job without them).
        The number of tasks, and the first of them as planned here, with those after it while
        their texts come to at most ``HOLD_BYTES`` (this process runs them next: ``_leased``)."""
        def journal_for(key: str) -> RedisJournal:   # the plan's, looked at before the plan writes to it
            journal = self.journal(key)
            self._fresh(job_id, journal)
            return journal
        planned = self.kind(spec).plan(spec, self.settings_for(spec), journal_for,
                                       check=lambda plan: self.gate.plan(who, spec.kind, plan),
                                       slots=self.slots(queue))
        keyring = self.gate.keyring
        key = self.keys.job(job_id, "tasks")
        count, chunk, held, kept, holding = 0, [], 0, [], 0
        for sub in planned.subs:
            task_id = f"{job_id}.t{count}"
            text, sig = keyring.task_text(who.tenant, who.digest, task_id, sub)
            if holding <= self.HOLD_BYTES and (not kept or holding + len(text) <= self.HOLD_BYTES):
                kept.append(Planned(task_id, sub, text, sig))
                holding += len(text)
            else:
                holding = self.HOLD_BYTES + 1   # full: the slices after it are only sent
            raw = f"[{json.dumps(task_id)},{text},{json.dumps(sig)}]"   # what _tasks reads: [id, sub, sig]
            chunk.append(raw)
            held += len(raw)
            count += 1
            if held >= self.PUSH_BYTES or len(chunk) >= 1000:
                self.r.rpush(key, *chunk)
                chunk, held = [], 0
        if chunk:
            self.r.rpush(key, *chunk)
        plan_sig = keyring.sign_task(who.tenant, who.digest, f"{job_id}.plan", planned.header)
        pipe = self.r.pipeline()  # one transaction: the job is planned when its plan is there
        pipe.set(self.keys.job(job_id, "pending"), count)
        route = {"name": planned.header["route"], "why": planned.header["route_why"]} \
            if "route" in planned.header else None
        pipe.hset(self.keys.job(job_id), mapping={"plan_key": planned.key, "plan": json.dumps(planned.header),
                                                  "plan_sig": plan_sig,
                                                  **planned.totals, "tasks_total": count,
                                                  **({"route": json.dumps(route)} if route else {})})
        pipe.execute()
        self._used(job_id, planned.usage)
        self.gate.priced(who, job_id, self._estimate(job_id, spec, planned.estimate))   # before any task is sent
        return count, kept

    def _removed(self, record: JobRecord, who: Admitted) -> Iterator[str]:
        """The paths the job's tasks deleted, in order, from their sub-plans as the planner
        signed them (the plan's header does not hold them: a sync may delete millions)."""
        for task_id, sub, sig in self._tasks(record.id):
            if sub.get("deletions"):
                self.gate.keyring.check_task(who.tenant, who.digest, task_id, sub, sig)
                yield from sub["deletions"]

    def _estimate(self, job_id: str, spec: JobSpec, estimate: list) -> float | None:
        """The job's estimate, priced here, where it runs (its spend is priced here too): shown
        beside the meter, and held against its budget (``Gate.priced``). None: not priced."""
        if not estimate:
            return None
        from bridge import pricing
        try:
            usd = pricing.total_cost(estimate, self.settings_for(spec))
        except (BridgeError, ValueError) as exc:
            log.warning("job %s: estimate not priced: %s", job_id, exc)
            return None
        requests = sum(u.request_count for u in estimate)
        self.jobs.update(job_id, estimate_usd=repr(usd), estimate_requests=requests)
        return usd

    def _metered(self, job_id: str, metered: meter.Meter | None) -> None:
        """Move what a task sent so far (bridge/meter.py) into the job's meter, ``<job>:meter``."""
        fields = metered.drain() if metered is not None else {}
        if not fields:
            return
        from redis.exceptions import RedisError
        from bridge.workers.metering import count
        try:
            count(self.r, self.keys.job(job_id), self.keys.job(job_id, "meter"), fields)
        except RedisError as exc:
            log.warning("job %s: requests not metered: %s", job_id, exc)

    def job_meter(self, job_id: str) -> meter.Meter | None:
        fields = self.r.hgetall(self.keys.job(job_id, "meter"))
        return meter.Meter.from_fields(fields) if fields else None

    def _used(self, job_id: str, fields: dict[str, int]) -> None:
        """Add requests and bytes that ran to the job's usage (what it is charged from)."""
        if not fields:
            return
        from bridge.workers.metering import count
        count(self.r, self.keys.job(job_id), self.keys.job(job_id, "usage"), fields)

    FRESH = "~fresh"   # a field of <job>:seen: its journal held none of its plan's files when it was planned

    def _marks(self, job_id: str, task_id: str, kind, sub: dict, journal) -> tuple[set[str], set[str] | None]:
        """(what the journal held of a task's units before its first attempt, what it holds of
        them now when this is not that attempt): a task run again after its worker died is
        charged for the units that worker finished, and never for what an earlier job with the
        same plan left. A first attempt at a slice of small files of a job whose journal was
        empty when it was planned reads nothing: it was empty for them (``Files.fresh``)."""
        key = self.keys.job(job_id, "seen")
        pipe = self.r.pipeline(transaction=False)
        pipe.hget(key, task_id)
        pipe.hget(key, self.FRESH)
        seen, fresh = pipe.execute()
        if seen is None:
            marks = set() if fresh and getattr(kind, "fresh", None) and kind.fresh(sub) else kind.marks(sub, journal)
            if self.r.hsetnx(key, task_id, json.dumps(sorted(marks))):
                self.r.expire(key, int(self.ws.journal_ttl))
                return marks, None
            seen = self.r.hget(key, task_id)
        return set(json.loads(seen or "[]")), kind.marks(sub, journal)

    def _fresh(self, job_id: str, journal: RedisJournal) -> None:
        """Record, before the plan writes to it, that the job's journal holds none of its files."""
        if journal.empty():
            key = self.keys.job(job_id, "seen")
            pipe = self.r.pipeline(transaction=False)
            pipe.hset(key, self.FRESH, "1")
            pipe.expire(key, int(self.ws.journal_ttl))
            pipe.execute()

    def _header(self, job_id: str) -> dict:
        return json.loads(self.r.hget(self.keys.job(job_id), "plan") or "null")

    def _signed_header(self, record: JobRecord, who: Admitted) -> dict | None:
        """The plan's header as its planner signed it (the manifest, verify and clean-up work from
        it), every place it names in scope; Refused otherwise. None: not planned."""
        header = self._header(record.id)
        if header is None:
            return None
        self.gate.keyring.check_task(who.tenant, who.digest, f"{record.id}.plan", header,
                                     self.r.hget(self.keys.job(record.id), "plan_sig"))
        if record.plan_key != header.get("key"):
            raise Refused(f"job {record.id}: its journal is not the one its plan names")
        self.gate.plan(who, record.kind, header)
        return header

    def _transfer(self, lease: Lease, job_id: str, sub: dict | str | None = None, sig: str | None = None, *,
                  planned: Planned | None = None, cancelled: threading.Event | None = None) -> dict:
        """A slice of the plan: from a message, checked against its planner's signature and the
        tenant's scope; or ``planned`` by this process, whose plan was checked as it was made.
        ``cancelled``: set by the step's watcher (``_watch_cancel``) when the job is cancelled."""
        from bridge.progress import Progress
        record = self.jobs.get(job_id)
        if record is None or record.state in ("cancelled", "failed", "succeeded"):
            return {"skipped": record.state if record else "no such job"}
        record, who, refused = self._admitted(job_id, lease.ref.id)
        if who is None:
            return refused
        if planned is not None:
            sub = planned.sub
        else:
            try:   # the planner's slice, every file of it in scope, before any request
                sub = self.gate.keyring.check_task(who.tenant, who.digest, lease.ref.id, sub, sig)
                self.gate.plan(who, record.kind, sub)
            except Refused as exc:
                return self._refuse(record, str(exc), lease.ref.id)
        spec = JobSpec.from_dict(record.spec)
        from bridge.workers.limits import job_limiter
        submitted = self.settings_for(spec).transfer.bwlimit or route_bwlimit(self.ws, spec.destination)
        progress = Progress(limiter=job_limiter(self.r, self.keys, job_id, submitted))
        sink = ProgressSink(self.jobs, job_id, record.queue, route=sub.get("route") or "direct", task=lease.ref.id,
                            tenant=record.tenant or "", destination=metrics.store_of(spec.destination))
        progress.listeners.append(sink)
        stop = StopCheck(self.jobs, job_id, lease)
        kind, journal = self.kind(spec), self.journal(record.plan_key)
        before = start = None   # start: what the journal held as this attempt began, when an earlier one's worker died
        if hasattr(kind, "marks"):
            before, start = self._marks(job_id, lease.ref.id, kind, sub, journal)
        recorded = Recorded(journal)   # what this attempt finishes: its journal after it is start (or before) and that
        cancelled = cancelled or threading.Event()   # once set, no request is sent (bridge.retry.stopping)
        try:
            from bridge.retry import stopping
            moving = time.perf_counter()
            with stopping(cancelled):
                ran = kind.run(sub, self.settings_for(spec), recorded, progress, stop.units)
            moving = time.perf_counter() - moving
        finally:
            if before is not None:  # what finished in this run, whatever happened next
                self._used(job_id, kind.used(sub, before, (before if start is None else start) | recorded.keys))
        sink.close(progress, max_units=ran.units)
        if start is not None and not lease.lost.is_set():
            self._recount(job_id, lease.ref.id, progress, kind.used(sub, before, start))
        if lease.lost.is_set():
            log.info("job %s: task %s stopped: its lease was lost or fenced", job_id, lease.ref.id)
        elif cancelled.is_set():
            log.info("job %s: task %s stopped: the job was cancelled", job_id, lease.ref.id)
        elif ran.errors and not lease.lost.is_set():
            self.jobs.add_errors(job_id, ran.errors)
        return {"ok": not ran.errors, "errors": len(ran.errors), "stopped": stop(),
                "bytes": progress.bytes_done - progress.bytes_skipped, "moving_ms": int(moving * 1000)}

    CANCEL_POLL = 0.2    # seconds between looks at a running task's job state
    CANCEL_GRACE = 5.0   # seconds a cancelled job's step may go on without a request before its process is ended

    def _watch_cancel(self, lease: Lease, cancelled: threading.Event, returned: threading.Event,
                      metered: meter.Meter) -> None:
        """While a plan or transfer step runs: set ``cancelled`` as soon as its job is cancelled
        (or its lease lost); the step stops at its next unit, its requests at their next piece.
        A step busy inside one long call (a listing through a costly glob, any CPU-bound step)
        never looks: if, after its job's cancel, it has neither returned nor sent a request
        (``metered``) for ``CANCEL_GRACE`` seconds, its process is ended (``_end_busy``). One
        still sending is stopping: a remote transfer cancelled and polled until it stops, its
        uploads aborted."""
        from redis.exceptions import RedisError
        job_id = lease.ref.job
        while not returned.is_set():
            try:
                if lease.lost.is_set():
                    cancelled.set()
                    return   # another delivery runs it: this one stops at its next unit
                if self.jobs.state(job_id) in ("cancelled", None):
                    cancelled.set()
                    break
            except RedisError as exc:
                log.warning("job %s: state not read: %s", job_id, exc)
            returned.wait(self.CANCEL_POLL)
        else:
            return
        quiet_since, sent = time.monotonic(), metered.request_count
        while not returned.wait(self.CANCEL_POLL):
            if metered.request_count != sent:
                quiet_since, sent = time.monotonic(), metered.request_count
            elif time.monotonic() - quiet_since >= self.CANCEL_GRACE:
                self._end_busy(lease, returned)
                return

    def _end_busy(self, lease: Lease, returned: threading.Event) -> None:
        """End this pool process, whose step did not stop after its job's cancel, once it has
        handed over what the step would have: a transfer counts as done, and when it was its
        job's last the finalize is sent (a cancelled job's finalize aborts its uploads and ends
        its record, so nothing partial is committed); a plan is marked done, and when it had not
        written its plan yet (so no task of it was sent) its finalize is sent too. Celery's pool
        starts a new process, and the task's message, given back when this one dies, finds the
        task done. A pool without child processes (threads, solo) cannot end one task alone: it
        is only logged."""
        from billiard.process import current_process
        ref = lease.ref
        if not current_process().name.startswith("ForkPoolWorker"):
            log.warning("job %s: task %s is still busy (no request for %.0fs) after the job was cancelled; a %s "
                        "pool cannot end it alone", ref.job, ref.id, self.CANCEL_GRACE, current_process().name)
            return
        if returned.is_set():
            return   # it returned as the grace ran out: its own hand-over is under way
        log.warning("job %s: task %s has not stopped since the job's cancel and sent no request for %.0fs (busy "
                    "inside one call): ending its pool process %d", ref.job, ref.id, self.CANCEL_GRACE, os.getpid())
        finalize = TaskRef(f"{ref.job}.finalize", FINALIZE, [ref.job], ref.queue, ref.job, worker=ref.worker)
        try:
            if ref.task == TRANSFER:
                if lease.complete(True, finalize) == 0:
                    self.send(finalize)
            else:
                planned = self.r.hexists(self.keys.job(ref.job), "plan")
                lease.complete(False)
                if not planned:
                    self.send(finalize)
        finally:
            os.kill(os.getpid(), signal.SIGKILL)

    def _recount(self, job_id: str, task: str, progress, earlier: dict[str, int]) -> None:
        """A task run again after its worker died found that worker's finished units in the
        journal and counted them as skipped, while the dead worker reported only what it had
        flushed before the kill: the job's counters get this task's true share instead, every
        byte the store took from this job counted as sent once (``earlier``: the usage of the
        units the earlier attempts finished)."""
        moved_before = sum(v for k, v in earlier.items() if k.endswith("destination.bytes_written"))
        true = {"bytes_done": progress.bytes_done, "bytes_skipped": max(0, progress.bytes_skipped - moved_before)}
        got = self.jobs.reported(job_id, task)
        self.jobs.add_progress(job_id, {k: v - got.get(k, 0) for k, v in true.items()}, task=task)

    def _finalize(self, lease: Lease, job_id: str) -> dict:
        record, who, refused = self._admitted(job_id, lease.ref.id)
        if who is None:
            return refused
        spec = JobSpec.from_dict(record.spec)
        if record.state == "cancelled":
            result = self._discard(record, spec, who, lease.ref.id)
            log.info("job %s cancelled: its tasks have stopped, nothing committed", job_id)
            return result
        if record.state not in ("running", "verifying"):
            return {"skipped": record.state}
        started = time.perf_counter()
        if record.counters.get("error_count"):
            self._end(job_id, "failed")
            return {"failed": record.counters["error_count"]}
        if not self.jobs.transition(job_id, "verifying", ("running", "verifying")):
            record, spec = self._record(job_id)
            if record and record.state == "cancelled":
                return self._discard(record, spec, who, lease.ref.id)
            return {"skipped": record.state if record else "no such job"}
        settings = self.settings_for(spec)
        try:   # the header the manifest and verify work from
            header = self._signed_header(record, who)
        except Refused as exc:
            return self._refuse(record, str(exc), lease.ref.id)
        kind = self.kind(spec)
        from bridge.progress import Progress
        committing = Progress()   # counts the files completed at commit (their parts ran in several tasks)
        removed = self._removed(record, who) if header.get("deleting") else ()
        manifest_url = kind.commit(header, settings, self.journal(record.plan_key), committing, removed=removed)
        if committing.files_done:
            self.jobs.add_progress(job_id, {"files_done": committing.files_done})
        if hasattr(kind, "committed"):
            self._used(job_id, kind.committed(header))
        self.jobs.update(job_id, manifest=manifest_url)
        self.jobs.add_progress(job_id, {"units_done": record.counters.get("units_total", 1)
                                        - record.counters.get("units_done", 0)})
        verifying = time.perf_counter()
        problems, summary = self._verify(spec, header["destination"], settings)
        self.jobs.update(job_id, verify=summary)
        done = time.perf_counter()
        self.jobs.add_progress(job_id, {"finalize_ms": int((done - started) * 1000),
                                        "verify_ms": int((done - verifying) * 1000)})
        if problems:
            self._end(job_id, "failed", problems)
            return {"failed": problems[:5]}
        self._end(job_id, "succeeded")
        self.journal(record.plan_key).clear()
        return {"manifest": manifest_url}

    def _verify(self, spec: JobSpec, destination: str, settings) -> tuple[list[str], dict]:
        """Problems found at the destination against its manifest (extra files count only when
        the job deletes them), and a summary for the record."""
        if spec.verify == "none":
            return [], {"mode": "none"}
        from bridge.pipeline import verify as verifying
        report = verifying.verify(destination, settings, deep=spec.verify == "deep")
        problems = [f"missing at the destination: {p}" for p in report["missing"]]
        problems += [f"does not match its manifest: {m['path']}: {m['reason']}" for m in report["mismatched"]]
        if spec.deletes:
            problems += [f"at the destination but not in the source: {p}" for p in report["extra"]]
        # A copy the clouds made that nothing proved is no failure of the job, and no proof
        # either: the summary is not ok, so nothing (retention, a replica's lag) counts it verified.
        unproven = report["counts"]["unproven"]
        summary = {"mode": spec.verify, "checked": report["checked"], "bytes": report["bytes"],
                   "missing": len(report["missing"]), "extra": len(report["extra"]),
                   "mismatched": len(report["mismatched"]), "unproven": unproven, "ok": not problems and not unproven,
                   "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        return problems, summary

    def _discard(self, record: JobRecord, spec: JobSpec, who: Admitted, task: str) -> dict:
        """A cancelled job leaves no manifest and no unfinished uploads behind; what it ran
        before it stopped is charged."""
        try:
            header = self._signed_header(record, who)
        except Refused as exc:
            self.gate.audit.record("refused", job=record.id, tenant=record.tenant, task=task, reason=str(exc))
            return {"refused": str(exc)}
        self._charge(record, spec, "cancelled")
        try:
            if not record.plan_key or header is None:
                return {"cancelled": True}
            journal = self.journal(record.plan_key)
            try:
                for store, loc, upload_id in self.kind(spec).leftovers(header, self.settings_for(spec), journal):
                    try:
                        store.abort_upload(loc, upload_id)
                    except BridgeError as exc:
                        log.info("job %s: upload to %s not aborted: %s", record.id, loc, exc)
            finally:
                journal.clear()
            return {"cancelled": True}
        finally:
            # The end: its last task has stopped and its uploads are aborted (`jobs cancel`
            # returns on this, so nothing of the job is left at the destination by then).
            self.r.hsetnx(self.keys.job(record.id), "finished", time.time())
            self.jobs.announce_end(record.id)

    def _end(self, job_id: str, state: str, errors: list[str] | None = None) -> None:
        if errors:
            self.jobs.add_errors(job_id, errors)
        # Its followers (submit --wait) are woken once it is priced: they read what it spent,
        # and no request of its own (a bucket's region, to price it) follows what they saw.
        if not self.jobs.finish(job_id, state, announce=False):
            return
        try:
            record, spec = self._record(job_id)
            if record is None:
                return
            metrics.job_finished(record.kind, state, record.elapsed)
            log.info("job %s %s in %.1fs", job_id, state, record.elapsed)
            self._charge(record, spec, state)
        finally:
            self.jobs.announce_end(job_id)
        spent = record.spent_usd
        c = record.counters
        self.gate.audit.record("ended", job=job_id, tenant=record.tenant, state=state, kind=record.kind,
                               source=spec.source, destinations=spec.destinations,
                               route=(record.route or {}).get("name"), bytes=c.get("bytes_done", 0) - c.get("bytes_skipped", 0),
                               files=c.get("files_done", 0), spent_usd=None if spent is None else f"{spent:.9f}",
                               parent=record.parent)
        if state == "succeeded" and spec.kind == "sync":
            self.jobs.record_sync(spec.source, spec.destination, job_id, verify=spec.verify, deletes=spec.deletes)
        if record.parent:
            self._child_ended(record.parent)

    def _charge(self, record: JobRecord, spec: JobSpec, state: str) -> None:
        """Price what the job ran, record it, and swap its budget reservation for it (once)."""
        self._metered(record.id, meter.current())   # this task's requests so far (the commit, the verify)
        spent = self._spent(record, spec, state)
        if spent is not None:
            self.jobs.update(record.id, spent_usd=repr(spent))
            record.spent_usd = spent
        if record.budget:
            Budgets(self.r, self.keys).settle(record.id, spent or 0.0)

    def _spent(self, record: JobRecord, spec: JobSpec, state: str) -> float | None:
        """What the job cost, from what ran: a parent's children summed; a job's own requests
        and bytes (``<job>:usage``: the listing, each file, part or shard that finished, the
        commit) priced by the same cost model as its estimate. A job recorded before usage was
        kept: its estimate, scaled by the bytes it moved."""
        if record.children:
            return sum((c.spent_usd or 0.0) for c in (self.jobs.get(child) for child in record.children) if c)
        metered = self.job_meter(record.id)
        fields = self.r.hgetall(self.keys.job(record.id, "usage"))
        if metered is not None:
            from bridge import pricing
            from bridge.policies.cost import usage as counting
            header = self._header(record.id) or {}
            source = header.get("source_root") or header.get("source") or spec.source
            destination = header.get("destination") or spec.destination
            # What a cloud's transfer service did on the job's behalf is no request of ours: the
            # route's share of the usage (counted from the files it carried) is priced beside the meter.
            remote = [counting.not_ours(u) for u in counting.from_fields(fields, source, destination)
                      if u.route not in ("direct", "pack", "unpack")]
            route = remote[0].route if remote else "direct"
            try:
                return pricing.spend(metered, source, destination, self.settings_for(spec), route=route,
                                     also=remote)
            except (BridgeError, ValueError) as exc:
                log.warning("job %s: not priced: %s", record.id, exc)
                return None
        if fields:
            from bridge import pricing
            from bridge.policies.cost import usage as counting
            header = self._header(record.id) or {}
            usages = counting.from_fields(fields, header.get("source_root") or header.get("source") or spec.source,
                                          header.get("destination") or spec.destination)
            try:
                return pricing.total_cost(usages, self.settings_for(spec))
            except (BridgeError, ValueError) as exc:
                log.warning("job %s: not priced: %s", record.id, exc)
                return None
        if record.estimate_usd is None:
            return None
        c = record.counters
        planned, moved = c.get("bytes_total", 0), c.get("bytes_done", 0) - c.get("bytes_skipped", 0)
        share = min(1.0, moved / planned) if planned else (1.0 if state == "succeeded" else 0.0)
        return record.estimate_usd * share

    # -- replication: one sync per destination, the parent ends with the last of them -----
    def _start_children(self, record: JobRecord, spec: JobSpec, who: Admitted) -> dict:
        """One sync per destination, each signed for the parent's tenant (and checked again when it runs)."""
        if record.policy:
            from bridge.workers import replicas
            return replicas.start_children(self, record, spec, who)
        children = [f"{record.id}-{n}" for n in range(1, len(spec.destinations) + 1)]
        if not self.r.hsetnx(self.keys.job(record.id), "children", json.dumps(children)):
            children = json.loads(self.r.hget(self.keys.job(record.id), "children"))
        self.r.hsetnx(self.keys.job(record.id), "children_pending", len(children))
        self.jobs.update(record.id, tasks_total=len(children))
        self.jobs.transition(record.id, "running", ("planning",))
        for child_id, destination in zip(children, spec.destinations):
            if self.jobs.state(child_id) in (None, "queued"):
                self.submit(spec.for_destination(destination), parent=record.id, job_id=child_id,
                            schedule=record.schedule, tenant=who.tenant, scope_budget=who.budget)
        return {"children": children}

    def _child_ended(self, parent_id: str) -> None:
        left = self.r.hincrby(self.keys.job(parent_id), "children_pending", -1)
        self.jobs.add_progress(parent_id, {"tasks_done": 1})
        if left > 0:
            return
        parent = self.jobs.get(parent_id)
        if parent is None:
            return
        if parent.policy:
            from bridge.workers import replicas
            return replicas.ended(self, parent)
        states = {child: self.jobs.state(child) for child in parent.children}
        failed = [f"{child}: {state}" for child, state in states.items() if state != "succeeded"]
        self._end(parent_id, "failed" if failed else "succeeded",
                  [f"destination job {f}" for f in failed] or None)
