"""What each kind of job plans, runs and commits, in terms of bridge's own units.

    Files   copy and sync (bridge.pipeline): put / part / complete / delete units; a task is one
            multipart file, a run of a large file's parts (the file completed at commit), or a
            batch of small files and deletions
    Shards  pack, and migrate --pack (bridge.packing.job): one task per shard; the index, then
            the manifest, last (a migrate job is listed as one; specs.RUNS_AS)
    Restore unpack (bridge.packing.unpack): one task per shard; the manifest, last

Each kind turns a spec into a header (what finalize needs, without the file lists) and sub-plans
(one per task, JSON), runs one sub-plan's units on bridge.jobs.ThreadExecutor (the executor of
an in-process job), commits the header at the end through the kind's own finals (the last of
which is bridge.jobs.commit), and names the unfinished uploads a cancelled job leaves. The executor (workers/executor.py) does the
rest the same way for every kind. A replication has no work of its own: it starts one sync per
destination.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from bridge.workers.specs import JobSpec, runs_as


@dataclass
class Planned:
    key: str                     # the plan's key: the journal's name
    header: dict[str, Any]       # enough for commit() and leftovers()
    subs: Iterable[dict[str, Any]]   # one per task, made as they are taken
    totals: dict[str, int]       # bytes_total, files_total, units_total
    usage: dict[str, int] = dataclasses.field(default_factory=dict)  # requests planning sent (bridge.policies.cost.usage.to_fields)
    estimate: list[Any] = dataclasses.field(default_factory=list)   # what the whole job will send (bridge.policies.cost.usage.Usage)


@dataclass
class Ran:
    errors: list[str]
    units: int                   # units this task was given (the most it can count as done)


DELETES_PER_TASK = 500

# What a task of small files is expected to cost, to size it by time rather than by a count of
# files: a request's round trip and bookkeeping per file, and the bytes at one process's pace.
# Conservative on purpose: a task that ends early costs only its few milliseconds of set-up.
FILE_SECONDS = 0.0015
TASK_RATE = 40 * 1024 * 1024      # bytes per second of one task
TASKS_PER_SLOT = 3                # a job of few files still gives each of several pool processes this many
MIN_TASK_SECONDS = 0.5            # ... but none smaller: its set-up would show
# The share rule (share_bytes) cuts no task of small files below this: a task's own costs (its
# delivery, lease and journal round trips) would show, and a listing part much smaller than the
# others (the top level's few files beside a folder's checkpoint) would go one file a task.
MIN_SHARE_BYTES = 1024 * 1024


def expected_seconds(files: int, nbytes: int) -> float:
    """How long a task of ``files`` small files of ``nbytes`` in all is expected to take."""
    return files * FILE_SECONDS + nbytes / TASK_RATE


def task_seconds(plan, slots: int, longest: float) -> float:
    """How long each task of a plan's small files should take: the job spread over ``slots``
    pool processes, ``TASKS_PER_SLOT`` each (so that one finishing late does not hold the job:
    the others share what is left), between ``MIN_TASK_SECONDS`` and ``longest``. One pool
    process runs its tasks one after another, so a late one holds up nothing that others could
    take, and every boundary between two tasks drains the lanes of the one and sets up the next:
    it gets tasks of up to ``longest``."""
    small = len(plan.files) - plan.files.multipart
    whole = expected_seconds(small, plan.bytes)   # plan.bytes counts multipart files too: an upper bound
    per_slot = TASKS_PER_SLOT if slots > 1 else 1
    return max(MIN_TASK_SECONDS, min(longest, whole / (max(1, slots) * per_slot)))


def share_bytes(plan, slots: int, parts: int = 1) -> int | None:
    """At most this many bytes of small files in one task: the job's bytes spread over ``slots``
    pool processes, ``TASKS_PER_SLOT`` each; None with one process. The time estimate
    (``task_seconds``) sizes tasks at one process's pace on this machine and knows nothing of the
    links: where they are slow, the few larger files of a corpus (those under the part size) went
    in one task that one host carried alone at the end, the others idle (bench/notes/hosts.md).
    A share of the bytes holds whatever the links' rate: no task carries much more than a
    3 x ``slots``-th of the job, and the rule alone makes at most about that many tasks more.
    ``plan`` may be one of a job's ``parts`` (its listing split by sub-prefix), the job's bytes
    then taken as ``parts`` times its own. Never below MIN_SHARE_BYTES."""
    if slots <= 1 or not plan.bytes:
        return None
    return max(MIN_SHARE_BYTES, -(-plan.bytes * max(1, parts) // (slots * TASKS_PER_SLOT)))


def fan_out(plan, batch_files: int, batch_bytes: int, file_task_bytes: int | None = None,
            seconds: float | None = None) -> Iterator:
    """Sub-plans, one per task, made as they are taken (a plan of millions of files is never
    held as sub-plans at once): each multipart file alone (largest first, so the long tasks start
    early), or, when it is bigger than ``file_task_bytes``, its parts in runs of about that many
    bytes, one task each (the file is then completed at commit: ``split``); then small files in
    tasks of about ``seconds`` each (``expected_seconds``; a task ends with the file that reaches it), at most ``batch_files`` files and
    ``batch_bytes`` bytes; then deletions in batches. Each keeps the plan's batching
    (``Plan.batch``), so a task sends its small files as an in-process copy does."""
    from bridge.pipeline.plan import Plan

    def sub(files=(), deletions=()) -> Plan:
        return Plan(plan.source, plan.destination, plan.single, list(files), list(deletions), plan.key,
                    route=plan.route, route_why=plan.route_why, batch=plan.batch, slots=plan.slots)

    if plan.route != "direct" and not _per_file(plan.route):
        # A route that runs one remote job for all its files (bridge/routes/delegated.py): one task.
        yield sub(plan.files, plan.deletions)
        return
    big = sorted((f for f in plan.files.shapes() if f.part_size), key=lambda f: -f.size) if plan.files.multipart else []
    for shape in big:
        f = plan.files.find(shape.rel) or shape
        per = _parts_per_task(f, file_task_bytes)
        for first in range(1, f.parts + 1, per):
            yield sub([dataclasses.replace(f, first_part=first, last_part=min(first + per - 1, f.parts))])
    batch: list = []
    size = 0
    for f in plan.files:
        if f.part_size:
            continue
        if batch and (len(batch) >= batch_files or size + f.size > batch_bytes
                      or (seconds is not None and expected_seconds(len(batch), size) >= seconds)):
            yield sub(batch)
            batch, size = [], 0
        batch.append(f)
        size += f.size
    if batch:
        yield sub(batch)
    for start in range(0, len(plan.deletions), DELETES_PER_TASK):
        yield sub(deletions=plan.deletions[start:start + DELETES_PER_TASK])


def _per_file(route: str) -> bool:
    """Whether a route carries files one by one (then they fan out like direct files)."""
    from bridge import routes
    return type(routes.get(route)).units is routes.Route.units


def _parts_per_task(f, file_task_bytes: int | None) -> int:
    return f.parts if not file_task_bytes else max(1, file_task_bytes // f.part_size)


def split(plan, file_task_bytes: int | None) -> list:
    """The multipart files whose parts ``fan_out`` spreads over several tasks."""
    if not getattr(plan.files, "multipart", True):   # none: no pass over a corpus of small files
        return []
    return [f for f in plan.files if f.part_size and f.parts > _parts_per_task(f, file_task_bytes)]


def _run(ctx, units: Iterator[dict], concurrency: int, count: int) -> Ran:
    """One task's units, on bridge's own executor (the one an in-process job uses)."""
    from bridge.jobs import ThreadExecutor
    try:
        outcome = ThreadExecutor(concurrency).run(ctx, units, final=None)
    finally:
        ctx.close()
        flush = getattr(ctx.journal, "flush", None)   # before the task says it is done
        if flush is not None:
            flush()
    return Ran(outcome.errors, count)


@contextlib.contextmanager
def _cancels_remote(ctx, units: Callable, interval: float = 0.5) -> Iterator[None]:
    """While a task's route follows a remote job (bridge/routes/delegated.py), ``jobs cancel`` (seen by the
    task's stop check, what ``units`` is bound to) cancels that job at its service."""
    from bridge import routes
    stop = getattr(units, "__self__", None)
    if not getattr(routes.REGISTRY.get(ctx.plan.route), "remote", False) or not callable(stop):
        yield
        return
    done = threading.Event()

    def watch() -> None:
        while not done.wait(interval):
            if stop():
                ctx.cancelled.set()
                return
    watcher = threading.Thread(target=watch, name="bridge-cancel-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


def _commit(ctx) -> str:
    """The kind's finals (its last one commits through bridge.jobs.commit), unless a finalize
    already ran to the end (the journal says where it committed): a finalize task delivered
    twice commits once."""
    try:
        done = ctx.journal.get("committed")
        if done:
            return done
        results: dict = {}
        for unit in ctx.finals():
            results.update(ctx.run_unit(unit) or {})
        where = str(results.get("manifest", ""))
        ctx.journal.put("committed", where)
        return where
    finally:
        ctx.close()


def _parsed(sub: dict, parse: Callable[[dict], Any]) -> Any:
    """``parse(sub)``, once for the task that holds ``sub`` (its marks, run and usage all read it)."""
    cached = getattr(_last, "parsed", None)
    if cached is None or cached[0] is not sub:
        cached = _last.parsed = (sub, parse(sub))
    return cached[1]


_last = threading.local()


class Files:
    """copy and sync."""

    def __init__(self, batch_files: int, batch_bytes: int, file_task_bytes: int | None = None,
                 task_seconds: float | None = None):
        self.batch_files, self.batch_bytes, self.file_task_bytes = batch_files, batch_bytes, file_task_bytes
        self.task_seconds = task_seconds

    def plan(self, spec: JobSpec, settings, journal_for: Callable[[str], Any],
             check: Callable[[Any], None] = lambda plan: None, slots: int = 1) -> Planned:
        """``slots``: the pool processes that will run the job's tasks (they size its tasks);
        ``check`` is given the plan's names (workers/gate.py ``Names``), before anything is written."""
        from bridge.pipeline.commit import journal_adopted
        from bridge.pipeline.execute import JobContext, prepare
        from bridge.pipeline.plan import Plan
        plan, present = self._listed(spec, settings)
        from bridge import guards
        if spec.kind == "sync":   # the CLI's guard on mass deletion (sync --delete), before any task is
            # planned: the job fails with its one line and nothing is copied or deleted
            guards.refuse_sync_deletions(len(plan.deletions), present, plan.destination,
                                         max_delete=spec.max_delete, force=bool(spec.force_delete))
        from bridge import routes
        routes.choose(plan, settings, spec.route)
        from bridge.workers.gate import Names
        check(Names.of(plan))   # every file it reads and writes, and the route: before anything is written
        # A route carries a file whole: its parts are not spread over tasks.
        task_bytes = self.file_task_bytes if plan.route == "direct" else None
        spread = split(plan, task_bytes)
        # The header holds neither the small files nor the deletions (the tasks' signed sub-plans
        # do): the commit reads the journal for the one and the sub-plans for the other.
        header = Plan(plan.source, plan.destination, plan.single, spread, [], plan.key,
                      completions=[f.rel for f in spread], route=plan.route, route_why=plan.route_why)
        ctx = JobContext(header, settings, journal_for(plan.key))
        prepare(ctx)
        # objects adopted (found at the destination, equal to their source): journaled here, so
        # that the finalize commits them with what the tasks write; neither header nor slice holds them
        journal_adopted(ctx.journal, plan.adopted)
        for f in spread:   # begun here, once: its tasks all continue this one upload
            ctx.upload({"rel": f.rel, "size": f.size, "part_size": f.part_size})
        seconds = task_seconds(plan, slots, self.task_seconds) if self.task_seconds else None
        share = share_bytes(plan, slots) if self.task_seconds else None
        batch_bytes = min(self.batch_bytes, share) if share else self.batch_bytes
        subs = (sub.to_dict() for sub in fan_out(plan, self.batch_files, batch_bytes, task_bytes, seconds))
        from bridge.policies.cost import usage as counting
        return Planned(plan.key, {**header.to_dict(), "deleting": len(plan.deletions)}, subs,
                       {"bytes_total": plan.bytes, "files_total": len(plan.files), "units_total": plan.unit_count()},
                       counting.to_fields(counting.listing(plan)), [plan.usage()])

    def _listed(self, spec: JobSpec, settings, part=None) -> tuple[Any, int]:
        """(the plan of the job's files, or of one ``part`` of them (bridge.pipeline.parts), before
        any route is chosen; the objects a sync listed at the destination)."""
        from bridge import ops
        from bridge.pipeline import syncplan
        from bridge.pipeline.plan import plan_copy
        chunk = settings.transfer.chunk_size
        filters = spec.selection()
        if spec.kind == "copy":
            plan = plan_copy(spec.source, spec.destination, settings, chunk, filters=filters, part=part)
            ops.adopt_existing(plan, settings, spec.adopt or "off")   # (cp --skip-existing)
            return plan, 0
        plan, _reasons = syncplan.plan_sync(spec.source, spec.destination, settings, delete=spec.deletes,
                                            chunk_size=chunk, filters=filters, adopt=spec.adopt or "checksum",
                                            part=part)
        present = plan.listed["destination"]
        if spec.include or spec.exclude:
            from bridge.replicator import filtered
            plan = filtered(plan, spec.include or [], spec.exclude or [])
        return plan, present

    # -- a listing fanned out by sub-prefix (bridge.pipeline.parts) ----------------------------
    def parts(self, spec: JobSpec, settings, count: int) -> list | None:
        """The job's source prefix split into at most ``count`` parts by its top-level
        sub-prefixes (and, for a sync that deletes, the destination's too: what only the
        destination has is found by the part that holds its folder); None when it is not split:
        one object, a wildcard, a flat prefix, a route that carries all the files in one remote
        job, a copy that adopts."""
        import os
        from bridge import filters as filtering
        from bridge import routes
        from bridge.errors import BridgeError
        from bridge.pipeline import parts as splitting
        from bridge.stores import get_store
        from bridge.urls import parse
        if spec.kind not in ("copy", "sync") or (spec.kind == "copy" and (spec.adopt or "off") != "off"):
            return None
        src, dst = parse(spec.source), parse(spec.destination)
        if filtering.split_wildcard(src.key) is not None:
            return None
        if not src.is_prefix and not (src.is_local and os.path.isdir(src.local_path)):
            return None   # perhaps one object: resolve decides, on the one-lister path
        src, dst = src.as_prefix(), dst.as_prefix()
        route = routes.decide(src, dst, settings, spec.route)[0]
        if route != routes.DIRECT and not _per_file(route):
            return None   # one remote job carries all the files: one task, one lister
        try:
            found = splitting.top_level(get_store(src, settings), src)
            there = splitting.top_level(get_store(dst, settings), dst) if spec.kind == "sync" and spec.deletes \
                else (set(), 0, False)
        except BridgeError:
            return None   # the one-lister path says what is wrong, as it always has
        if found is None or there is None:
            return None
        subs = found[0] | there[0]
        if len(found[0]) < 2:
            return None
        return [p.to_dict() for p in splitting.split(subs, bool(found[1] or there[1]), count, record=found[2])]

    def plan_key(self, spec: JobSpec, settings) -> str:
        """The key of the plan ``plan_part`` makes for any part of the job (its journal's name),
        known before any part is listed: as bridge.pipeline's plan_copy and plan_sync make it."""
        from bridge.journal import job_key
        from bridge.urls import parse
        filters = spec.selection()
        more = (filters.key(),) if filters is not None and filters.active else ()
        src, dst = str(parse(spec.source).as_prefix()), str(parse(spec.destination).as_prefix())
        chunk = settings.transfer.chunk_size
        if spec.kind == "copy":
            return job_key("copy", src, dst, chunk, *more)
        return job_key("sync", src, dst, chunk, spec.deletes, *more)

    def plan_part(self, spec: JobSpec, settings, part: dict, journal, check: Callable[[Any], None],
                  slots: int = 1, parts: int = 1) -> dict[str, Any]:
        """One part's plan: its sub-plans (``subs``, made as they are taken) and what the job's
        dispatch sums over its parts (the header's source, destination and key, the files whose
        parts are spread over tasks, the totals, the listing's usage and the estimate, and for a
        sync the deletions and the objects listed at the destination). Objects adopted are
        journaled here; nothing is written at the destination: uploads are begun, and the
        destination prepared, by the dispatch once the deletion guard has counted every part."""
        from bridge import routes
        from bridge.pipeline.commit import journal_adopted
        from bridge.pipeline.parts import Part
        from bridge.pipeline.plan import _file_dict
        from bridge.policies.cost import usage as counting
        from bridge.workers.gate import Names
        plan, present = self._listed(spec, settings, Part.from_dict(part))
        routes.choose(plan, settings, spec.route)
        check(Names.of(plan))   # every file it reads and writes, before anything is written
        task_bytes = self.file_task_bytes if plan.route == "direct" else None   # a route carries a file whole
        spread = split(plan, task_bytes)
        journal_adopted(journal, plan.adopted)
        seconds = task_seconds(plan, slots, self.task_seconds) if self.task_seconds else None
        # A task of small files holds at most its share of the job's bytes, as ``plan``'s do: the
        # job's bytes taken as this part's times the job's ``parts``, which the split made alike.
        # Without it a part's small files went in one task, and at four hosts the last parts'
        # tasks ran on while other hosts idled (bench/notes/hosts.md).
        share = share_bytes(plan, slots, parts) if self.task_seconds else None
        batch_bytes = min(self.batch_bytes, share) if share else self.batch_bytes
        return {"source": plan.source, "destination": plan.destination, "key": plan.key, "route": plan.route,
                "route_why": plan.route_why, "spread": [_file_dict(f) for f in spread],
                "totals": {"bytes_total": plan.bytes, "files_total": len(plan.files),
                           "units_total": plan.unit_count()},
                "usage": counting.to_fields(counting.listing(plan)), "estimate": counting.to_fields(plan.usage()),
                "deletions": len(plan.deletions), "present": present,
                # its largest file sent in parts: the dispatch sends such parts' tasks first
                "longest": max((f.size for f in plan.files.shapes() if f.part_size), default=0)
                if plan.files.multipart else 0,
                "subs": (sub.to_dict() for sub in fan_out(plan, self.batch_files, batch_bytes, task_bytes,
                                                          seconds))}

    def dispatch(self, spec: JobSpec, settings, parts: list[dict], journal) -> tuple[dict, list]:
        """The job's header from its parts' plans (``plan_part``), once every part is listed: the
        deletion guard over the whole job's deletions (DeletionRefused: nothing was written), the
        destination prepared and the spread files' uploads begun, as ``plan`` does. (The header,
        the estimate's usages.)"""
        from bridge import guards
        from bridge.pipeline.execute import JobContext, prepare
        from bridge.pipeline.plan import Plan
        from bridge.policies.cost import usage as counting
        from bridge.contracts import FilePlan
        first = parts[0]
        if any((p["source"], p["destination"], p["key"]) != (first["source"], first["destination"], first["key"])
               for p in parts):
            raise ValueError("the parts of one job planned different roots")
        deleting = sum(p["deletions"] for p in parts)
        if spec.kind == "sync":
            guards.refuse_sync_deletions(deleting, sum(p["present"] for p in parts), first["destination"],
                                         max_delete=spec.max_delete, force=bool(spec.force_delete))
        spread = [FilePlan(**f) for p in parts for f in p["spread"]]
        header = Plan(first["source"], first["destination"], None, spread, [], first["key"],
                      completions=[f.rel for f in spread], route=first["route"], route_why=first["route_why"])
        ctx = JobContext(header, settings, journal)
        prepare(ctx)
        for f in spread:   # begun here, once: its tasks all continue this one upload
            ctx.upload({"rel": f.rel, "size": f.size, "part_size": f.part_size})
        from collections import Counter
        estimate: Counter = Counter()
        for p in parts:
            estimate.update(p["estimate"])
        return {**header.to_dict(), "deleting": deleting}, counting.from_fields(estimate, first["source"],
                                                                                first["destination"])

    def marks(self, sub: dict, journal) -> set[str]:
        """What the journal holds of a sub-plan's files (compared before and after a run)."""
        from bridge import pricing
        from bridge.pipeline.plan import Plan
        return pricing.journal_marks(_parsed(sub, Plan.from_dict), journal)

    def fresh(self, sub: dict) -> bool:
        """Whether a sub-plan's files have no record in a journal that held none of its plan's
        files when the plan was made: a slice without multipart files (the planner begins the
        uploads of the files whose parts it spreads over tasks, and journals them)."""
        from bridge.pipeline.plan import Plan
        return not _parsed(sub, Plan.from_dict).files.multipart

    def used(self, sub: dict, before: set[str], after: set[str]) -> dict[str, int]:
        """The requests and bytes of the units that finished in one run of a sub-plan."""
        from bridge.policies.cost import usage as counting
        from bridge.pipeline.plan import Plan
        plan = _parsed(sub, Plan.from_dict)
        fields = counting.to_fields(counting.ran(plan, before, after, deletions=len(plan.deletions)))
        routed = counting.ran_routed(plan, before, after)
        return {**fields, **(counting.to_fields(routed) if routed else {})}

    def committed(self, header: dict) -> dict[str, int]:
        from bridge.policies.cost import usage as counting
        from bridge.pipeline.plan import Plan
        header_plan = Plan.from_dict(header)
        return counting.to_fields(counting.add(counting.commit(header_plan), counting.completions(header_plan)))

    def run(self, sub: dict, settings, journal, progress, units: Callable[[Iterator[dict]], Iterator[dict]]) -> Ran:
        from bridge.pipeline.execute import JobContext
        from bridge.pipeline.plan import Plan
        plan = _parsed(sub, Plan.from_dict)
        ctx = JobContext(plan, settings, journal, progress)
        with _cancels_remote(ctx, units):
            return _run(ctx, units(plan.units()), settings.transfer.concurrency, plan.unit_count() - 1)

    def commit(self, header: dict, settings, journal, progress=None, removed: Iterable[str] = ()) -> str:
        """``removed``: the paths the job's tasks deleted (from their sub-plans), in order."""
        from bridge.pipeline.execute import JobContext
        from bridge.pipeline.plan import Plan
        plan = Plan.from_dict(header)
        plan.deletions = removed   # read once, by the commit
        return _commit(JobContext(plan, settings, journal, progress))

    def leftovers(self, header: dict, settings, journal) -> Iterator[tuple[Any, Any, str]]:
        """(store, location, upload id) of the uploads the job began."""
        from bridge.stores import get_store
        from bridge.urls import parse
        root = parse(header["destination"])
        store = get_store(root, settings)
        for key, upload in journal.items("upload:"):
            yield store, root.join(key[len("upload:"):]), upload["id"]


class Shards:
    """pack: a shard set (WebDataset tar or Parquet) with its index."""

    def plan(self, spec: JobSpec, settings, journal_for: Callable[[str], Any],
             check: Callable[[dict], None] = lambda plan: None, slots: int = 1) -> Planned:
        from bridge.packing import job as packing
        options = {"row_group_size": spec.row_group_size} if spec.row_group_size else {}
        plan = packing.plan_pack(spec.source, spec.destination, settings, fmt=spec.shard_format or "tar",
                                 prefix=spec.shard_prefix or "shard",
                                 shard_size=spec.shard_size or packing.DEFAULT_SHARD_SIZE,
                                 max_count=spec.max_count, options=options, filters=spec.selection())
        check(plan.to_dict())
        header = dataclasses.replace(plan, shards=[dataclasses.replace(s, files=[]) for s in plan.shards])
        packing.prepare(packing.PackContext(header, settings, journal_for(plan.key)))
        subs = [dataclasses.replace(plan, shards=[shard]).to_dict() for shard in plan.shards]
        from bridge.policies.cost import usage as counting
        return Planned(plan.key, header.to_dict(), subs, {"bytes_total": plan.shard_bytes, "files_total": plan.files,
                                                          "units_total": len(plan.shards) + 2},
                       counting.to_fields(counting.pack_listing(plan)), [plan.usage()])

    def marks(self, sub: dict, journal) -> set[str]:
        from bridge import pricing
        from bridge.packing import job as packing
        return pricing.pack_marks(packing.PackPlan.from_dict(sub), journal)

    def used(self, sub: dict, before: set[str], after: set[str]) -> dict[str, int]:
        from bridge.policies.cost import usage as counting
        from bridge.packing import job as packing
        return counting.to_fields(counting.pack_ran(packing.PackPlan.from_dict(sub), before, after))

    def committed(self, header: dict) -> dict[str, int]:
        from bridge.policies.cost import usage as counting
        from bridge.packing import job as packing
        return counting.to_fields(counting.pack_commit(packing.PackPlan.from_dict(header)))

    def run(self, sub: dict, settings, journal, progress, units: Callable[[Iterator[dict]], Iterator[dict]]) -> Ran:
        from bridge.packing import job as packing
        plan = packing.PackPlan.from_dict(sub)
        ctx = packing.PackContext(plan, settings, journal, progress)
        return _run(ctx, units(iter(plan.units())), ctx.writers(), len(plan.shards))

    def commit(self, header: dict, settings, journal, progress=None, removed: Iterable[str] = ()) -> str:
        from bridge.packing import job as packing
        return _commit(packing.PackContext(packing.PackPlan.from_dict(header), settings, journal, progress))

    def leftovers(self, header: dict, settings, journal) -> Iterator[tuple[Any, Any, str]]:
        from bridge.stores import get_store
        from bridge.urls import parse
        root = parse(header["destination"]).as_prefix()
        store = get_store(root, settings)
        shards = {str(root.join(s["name"])) for s in header["shards"]}
        for loc, upload_id in list(store.list_uploads(root)):
            if str(loc) in shards:
                yield store, loc, upload_id


class Restore:
    """unpack: a shard set restored into a tree, one task per shard; the manifest, last."""

    def plan(self, spec: JobSpec, settings, journal_for: Callable[[str], Any],
             check: Callable[[dict], None] = lambda plan: None, slots: int = 1) -> Planned:
        from bridge.packing import unpack
        plan = unpack.plan_unpack(spec.source, spec.destination, settings, spec.shard_prefix)
        check(plan.to_dict())
        unpack.UnpackContext(plan, settings, journal_for(plan.key)).prepare()

        def subs() -> Iterator[dict]:   # each shard's members, read from the plan's table as its task is queued
            try:
                for shard in plan.shards:
                    yield plan.task(shard)
            finally:
                plan.close()
        # the header names the shards, not their members: the commit reads the members' entries
        # from the journal, each shard's record vouching for all of its own
        return Planned(plan.key, plan.to_dict(), subs(), {"bytes_total": plan.bytes, "files_total": plan.files,
                                                          "units_total": len(plan.shards) + 1})

    def run(self, sub: dict, settings, journal, progress, units: Callable[[Iterator[dict]], Iterator[dict]]) -> Ran:
        from bridge.packing import unpack
        plan = unpack.UnpackPlan.from_dict(sub)
        ctx = unpack.UnpackContext(plan, settings, journal, progress)
        return _run(ctx, units(iter(plan.units())), 1, len(plan.shards))

    def commit(self, header: dict, settings, journal, progress=None, removed: Iterable[str] = ()) -> str:
        from bridge.packing import unpack
        return _commit(unpack.UnpackContext(unpack.UnpackPlan.from_dict(header), settings, journal, progress))

    def leftovers(self, header: dict, settings, journal) -> Iterator[tuple[Any, Any, str]]:
        from bridge.stores import get_store
        from bridge.urls import parse
        root = parse(header["destination"]).as_prefix()
        store = get_store(root, settings)
        # only members over STREAM_OVER go out as multipart uploads: the header names them
        targets = {str(root.join(path)) for s in header["shards"]
                   for path in s.get("streamed", [m["path"] for m in s.get("members", [])])}
        for loc, upload_id in list(store.list_uploads(root)):
            if str(loc) in targets:
                yield store, loc, upload_id


def kind_for(spec: JobSpec, batch_files: int, batch_bytes: int,
             file_task_bytes: int | None = None, task_seconds: float | None = None) -> Files | Shards | Restore:
    """The kind that plans, runs and commits ``spec`` (a replication has none: see the executor)."""
    kinds = {"copy": lambda: Files(batch_files, batch_bytes, file_task_bytes, task_seconds),
             "sync": lambda: Files(batch_files, batch_bytes, file_task_bytes, task_seconds),
             "pack": Shards, "unpack": Restore}
    return kinds[runs_as(spec.kind)]()
