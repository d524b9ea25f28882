"""Stage 5, executor: ``JobContext`` (a ``bridge.jobs.Context``) is what the units of one copy
share in one process, and ``execute`` runs a plan's units on a thread pool (``bridge.jobs.run``;
``workers/`` runs the same units on Celery), ending in the commit (bridge.pipeline.commit)."""

from __future__ import annotations

import collections
import concurrent.futures as cf
import contextlib
import gc
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bridge import attributes
from bridge import bwlimit
from bridge import jobs
from bridge import manifest as manifests
from bridge import meter
from bridge import routes
from bridge.config import Settings
from bridge.errors import BridgeError, JobCancelled
from bridge.hashing import NO_WHOLE_SHA256, OrderedSha256
from bridge.journal import FileJournal, Journal, journal_at, journal_at_path
from bridge.listing import parent as _parent
from bridge.progress import Progress
from bridge.stores import get_store
from bridge.stores.base import MiB, ObjectInfo
from bridge.urls import Location, parse
from bridge.pipeline.commit import finalize, journal_adopted
from bridge.pipeline.plan import Plan
from bridge.pipeline.units import OPS


# Whole files written to a local destination are made durable together (one syncfs) after this
# many files or bytes, and only then journaled as written.
SETTLE_FILES = 512
SETTLE_BYTES = 256 * MiB


class JobContext(jobs.Context):
    """What units of one copy share in one process: stores, journal, progress, per-file state."""

    ops = {**OPS, "finalize": finalize}

    def __init__(self, plan: Plan, settings: Settings, journal: Journal, progress: Progress | None = None):
        self.plan = plan
        self.settings = settings
        self.journal = journal
        self.progress = progress or Progress()
        self.src_root = parse(plan.source) if plan.single is None else _parent(parse(plan.single, empty_segments=True))
        self.dst_root = parse(plan.destination)
        self.src = get_store(self.src_root, settings)
        self.dst = get_store(self.dst_root, settings)
        self._lock = threading.Lock()
        self._file_locks: dict[str, threading.Lock] = {}
        self._hashers: dict[str, OrderedSha256] = {}
        self._buffers = threading.local()
        self._uploads: dict[str, tuple[str, dict]] = {}
        self._upload_failed: dict[str, BridgeError] = {}
        # Per-file state is kept for the files in flight only (units carry the rest): parts
        # still to finish of each file this process completes when its last part is done.
        self._parts_left: dict[str, int] = {}
        # A local destination's whole files skip their two fsyncs each (file, folder): they are
        # settled in batches, and journaled only once durable (settle), so the journal never
        # names a file a power loss could take back, and the manifest never follows one.
        self.defer_sync = self.dst_root.is_local
        self._unsettled: list[tuple[Location, str, dict]] = []
        self._unsettled_bytes = 0
        self._settling = threading.Lock()
        # Full batches settle on a thread of their own while the job goes on (settle_behind).
        self._settler: cf.ThreadPoolExecutor | None = None
        self._behind: collections.deque[cf.Future] = collections.deque()
        self.fallbacks: dict[str, str] = {}      # file -> why its route could not carry it
        self.unproven: dict[str, str] = {}       # file -> why nothing proved the copy its route made
        self.route_down: str | None = None       # why the job's route is not tried again
        self.cancelled = threading.Event()       # set when the job is interrupted: remote routes cancel
        self.remote: dict | None = None          # what a remote route's service calls its job
        self.cancel_note = ""                    # what a remote route says of the job it cancelled

    def source_id(self, unit: dict) -> dict:
        """The identity of the unit's source file as planned: carried by the unit, or (a unit
        made by hand, a header's completion) looked up in the plan."""
        if "source_id" in unit:
            return unit["source_id"]
        planned = self.plan.files.find(unit["rel"])
        return planned.source_id if planned else {}

    def matches(self, rec: dict | None, unit: dict) -> bool:
        """Whether a journaled record was made for this version of the unit's source file."""
        return bool(rec) and rec.get("size") == unit["size"] and rec.get("source_id", {}) == self.source_id(unit)

    def src_loc(self, rel: str) -> Location:
        return parse(self.plan.single, empty_segments=True) if self.plan.single else self.src_root.join(rel)

    def dst_loc(self, rel: str) -> Location:
        return self.dst_root.join(rel)

    def _file_lock(self, rel: str) -> threading.Lock:
        with self._lock:
            return self._file_locks.setdefault(rel, threading.Lock())

    def part_buffer(self, size: int) -> bytearray:
        """This thread's buffer of at least ``size`` bytes, kept for its next part (a fresh one
        per part cost page faults and zeroing: bench/README.md)."""
        buf = getattr(self._buffers, "buf", None)
        if buf is None or len(buf) < size:
            buf = self._buffers.buf = bytearray(size)
        return buf

    def hasher(self, rel: str, carried: bool = False) -> OrderedSha256:
        """The file's whole SHA-256 fed in part order, when asked for (``transfer.sha256``) and
        not carried from the source's record; otherwise one that takes nothing: each part is
        hashed on its own, in parallel."""
        if not self.settings.transfer.sha256 or carried:
            return NO_WHOLE_SHA256
        with self._lock:
            if rel not in self._hashers:   # parts waiting their turn: at most one per thread
                self._hashers[rel] = OrderedSha256(max_pending=self.settings.transfer.concurrency)
            return self._hashers[rel]

    def upload(self, unit: dict) -> tuple[str, dict]:
        """The upload id for a file, continuing a journaled one the store still holds."""
        rel = unit["rel"]
        with self._file_lock(rel):
            if rel in self._uploads:
                return self._uploads[rel]
            if rel in self._upload_failed:   # the file's other parts waited here: not asked again
                raise self._upload_failed[rel]
            loc = self.dst_loc(rel)
            rec = self.journal.get(f"upload:{rel}")
            held = None
            if self.matches(rec, unit) and rec["part_size"] == unit["part_size"]:
                held = self.dst.list_parts(loc, rec["id"])
            if held is None:
                if rec:
                    self.dst.abort_upload(loc, rec["id"])
                try:
                    upload_id = self.dst.begin_upload(loc, unit["size"], self.attrs(rel))
                except BridgeError as exc:
                    self._upload_failed[rel] = exc
                    raise
                self.journal.put(f"upload:{rel}", {"id": upload_id, "size": unit["size"],
                                                   "part_size": unit["part_size"],
                                                   "source_id": self.source_id(unit)})
                held = {}
            else:
                upload_id = rec["id"]
            self._uploads[rel] = (upload_id, held)
            return self._uploads[rel]

    def attrs(self, rel: str, known: attributes.Attrs | None = None) -> attributes.Attrs | None:
        """The headers and user metadata the destination object gets (bridge.attributes.for_copy):
        the source's (``known``, or from the plan, or asked of the source store), with the
        settings' overrides. None: nothing to write."""
        objects = self.settings.objects
        if objects.metadata == "off" and not (objects.content_type or objects.set_metadata):
            return None
        source = known
        if objects.metadata == "on" and source is None:
            planned = self.plan.files.find(rel)
            if planned is not None and planned.attrs is not None:
                source = attributes.Attrs.from_dict(planned.attrs)
            else:
                size = planned.size if planned else 0
                source = self.src.attributes(ObjectInfo(self.src_loc(rel), size))
        return attributes.for_copy(source, objects)

    def journaled(self, unit: dict, entry: dict) -> dict:
        return {**entry, "source_id": self.source_id(unit)}

    def finished(self, rel: str) -> None:
        """A multipart file is complete: what this process held for it goes."""
        with self._lock:
            self._uploads.pop(rel, None)
            self._hashers.pop(rel, None)
            self._file_locks.pop(rel, None)
            self._parts_left.pop(rel, None)

    def written(self, unit: dict, entry: dict, size: int, batch: list | None = None) -> None:
        """Journal a whole file as written: at once, into ``batch`` (which its caller journals in
        one transaction when the batch is done), or at the next settle where it waits for one."""
        rel = unit["rel"]
        record = self.journaled(unit, entry)
        if not self.defer_sync:
            if batch is not None:
                batch.append((f"file:{rel}", record))
            else:
                self.journal.put(f"file:{rel}", record)
            return
        with self._lock:
            self._unsettled.append((self.dst_loc(rel), f"file:{rel}", record))
            self._unsettled_bytes += size
            full = len(self._unsettled) >= SETTLE_FILES or self._unsettled_bytes >= SETTLE_BYTES
        if full:
            self.settle_behind()

    def settle_behind(self) -> None:
        """Settle the files written so far on the settling thread, while the job goes on: a
        syncfs takes tens of milliseconds, for which the thread that filled the batch (an event
        loop with eight downloads in flight) stood still. At most two batches wait there; a
        third waits here for the oldest, whose error, if any, is raised here."""
        with self._lock:
            batch, self._unsettled, self._unsettled_bytes = self._unsettled, [], 0
            if not batch:
                return
            if self._settler is None:
                self._settler = cf.ThreadPoolExecutor(1, thread_name_prefix="mcbridge-settle")
            self._behind.append(self._settler.submit(self._settle, batch))
            oldest = self._behind.popleft() if len(self._behind) > 2 else None
        if oldest is not None:
            oldest.result()

    def settle(self) -> None:
        """Make every file written so far durable, then journal it: the batches settling behind
        are waited for, then the rest is settled here. A failure journals none of a batch: a
        re-run writes its files again."""
        with self._settling:
            while True:
                with self._lock:
                    behind = self._behind.popleft() if self._behind else None
                if behind is None:
                    break
                behind.result()
            with self._lock:
                batch, self._unsettled, self._unsettled_bytes = self._unsettled, [], 0
                settler, self._settler = self._settler, None
            if settler is not None:
                settler.shutdown(wait=False)   # idle now; a later batch starts another
            if batch:
                self._settle(batch)

    def _settle(self, batch: list[tuple[Location, str, dict]]) -> None:
        self.dst.settle([loc for loc, _key, _record in batch])
        self.journal.put_many([(key, record) for _loc, key, record in batch])

    def parts_finished(self, rel: str) -> bool:
        with self._lock:
            if rel not in self._parts_left:
                return False   # its parts run in several tasks: completed at commit
            self._parts_left[rel] -= 1
            if self._parts_left[rel]:
                return False
            del self._parts_left[rel]
            return True

    def before_submit(self, unit: dict) -> None:
        if unit["op"] == "part":   # in submission order, before any part can wait on it
            rel = unit["rel"]
            if "whole" in unit:
                whole = unit["whole"]
            else:   # a unit made by hand
                planned = self.plan.files.find(rel)
                whole = bool(planned and planned.part_size and planned.whole)
            if whole:
                with self._lock:   # a file this process completes: counted when its first part goes
                    self._parts_left.setdefault(rel, math.ceil(unit["size"] / unit["part_size"]))
            self.hasher(rel, "carry" in unit).expect(unit["number"])

    def followups(self, unit: dict) -> list[dict]:
        if unit["op"] == "part" and self.parts_finished(unit["rel"]):
            return [{"op": "complete", "rel": unit["rel"], "size": unit["size"], "part_size": unit["part_size"],
                     "source_id": self.source_id(unit)}]
        if unit["op"] == "route":   # the files a route handed back go the direct way
            with self._lock:
                back = [rel for rel in unit["files"] if rel in self.fallbacks]
            fallen = [self.plan.files.find(rel) for rel in back]
            units = list(self.plan.direct_units(fallen))
            self.progress.plan(0, len(units) + sum(1 for f in fallen if f.part_size))
            return units
        return []

    def finals(self) -> list[dict]:
        completions = [self.plan.files.find(rel) for rel in self.plan.completions]
        return [*({"op": "complete", "rel": f.rel, "size": f.size, "part_size": f.part_size,
                   "source_id": f.source_id} for f in completions),
                {"op": "finalize"}]

    def prepare(self) -> None:
        """Temporaries a killed run left beside the files. (The prefix's committed entries stay:
        a file rewritten before this job commits no longer matches its entry, and a new one is
        extra, so ``verify`` fails until the commit.)"""
        if self.dst_root.is_local:
            self.dst.clean_temporaries(self._folders())
        journal_adopted(self.journal, self.plan.adopted)

    def _folders(self) -> Iterator[Location]:
        """The folders the plan's files go to, each once (or, past a few thousand, now and then
        again: a second look costs a listdir, a table of every folder would cost memory)."""
        seen: set[str] = set()
        for f in self.plan.files:
            folder = f.rel.rpartition("/")[0]
            if folder not in seen:
                if len(seen) >= SETTLE_FILES * 8:
                    seen.clear()
                seen.add(folder)
                yield _parent(self.dst_loc(f.rel))


def journal_for(plan: Plan, settings: Settings, state_dir: Path | None = None) -> FileJournal:
    base = state_dir or Path(settings.transfer.state_dir)
    return journal_at(base, plan.key)


def journal_path(plan: Plan, settings: Settings, state_dir: Path | None = None) -> Path:
    """Where ``journal_for`` keeps the job's journal (there only while a run of it is unfinished)."""
    return journal_at_path(state_dir or Path(settings.transfer.state_dir), plan.key)


def _commit_adopted(plan: Plan, settings: Settings, progress: Progress) -> dict[str, Any]:
    """A job whose plan only adopts (nothing to send, nothing to delete) and that no killed run
    left a journal for: its entries committed as the plan holds them, in path order and as the
    text they were encoded to once, without a journal to write and read back (a fifth of
    adopting 20,000 files). Nothing is sent, so a run stopped before the commit has nothing to
    resume: the next one judges the objects again. A journal left by a killed run keeps the
    journal's way, so that what that run wrote is committed as it recorded it."""
    dst_root = parse(plan.destination)
    dst = get_store(dst_root, settings)
    manifests.record_home(dst, dst_root)   # a record that cannot be kept where asked: refused first
    progress.begin("copying")
    progress.plan(plan.bytes, plan.unit_count())

    metered = meter.current() or meter.Meter()   # (the summary's: what the commit asked of the store)
    # (laid-out shards only where a commit would have shards: fewer entries go inline in its document)
    blocks = plan.adopted.blocks() if len(plan.adopted) > manifests.SHARD_ENTRIES else None
    with meter.metering(metered):
        if blocks is not None:   # laid out as shards by the parts' processes
            where = jobs.commit_blocks(dst, dst_root, plan.source, plan.destination, blocks)
        else:
            where = jobs.commit(dst, dst_root, plan.source, plan.destination,
                                (manifests.entry_of(text) for _path, text in plan.adopted.encoded()))
    progress.unit_finished(True)
    return {"source": plan.source, "destination": plan.destination, "files": 0, "bytes": 0, "ok": True,
            "errors": [], **progress.snapshot(), "route": routes.report(plan, {}, 0, {}), "manifest": where,
            "metered": metered.to_dict()}


def _quiet_gc() -> None:
    """The SDKs leave ~10^6 long-lived objects (service models, clients) that the cyclic GC
    would walk again and again during a transfer: a profile showed it as the largest single CPU
    cost of a cloud-to-cloud copy. Freeze them out of its reach once the stores exist."""
    gc.collect()
    gc.freeze()


def execute(plan: Plan, settings: Settings, progress: Progress | None = None,
            state_dir: Path | None = None) -> dict[str, Any]:
    progress = progress or Progress()
    if progress.limiter is None and settings.transfer.bwlimit:
        progress.limiter = bwlimit.local(settings.transfer.bwlimit)
    if not plan.files and not plan.deletions and plan.adopted and \
            not journal_path(plan, settings, state_dir).exists():
        return _commit_adopted(plan, settings, progress)
    journal = journal_for(plan, settings, state_dir)
    ctx = JobContext(plan, settings, journal, progress)
    ctx.meter = meter.current() or ctx.meter
    _quiet_gc()
    progress.begin("copying")
    progress.plan(plan.bytes, plan.unit_count())
    # A route whose service moves the bytes cancels its remote job on SIGTERM as on Ctrl-C.
    remote = getattr(routes.REGISTRY.get(plan.route), "remote", False)
    if remote:
        from bridge.routes.delegated import sigterm_cancels
    from bridge.pipeline import forkrun   # small files' batches in processes of their own, where they pay
    processes = 0 if remote else forkrun.forkable(plan, settings, progress)
    try:
        with (sigterm_cancels() if remote else contextlib.nullcontext()):
            results = jobs.run(ctx, plan.units(), journal, settings.transfer.concurrency, "copy",
                               forkrun.ForkedExecutor(processes) if processes else None)
    except (KeyboardInterrupt, JobCancelled) as exc:
        if not ctx.cancel_note:
            raise
        raise JobCancelled(f"{str(exc) or 'interrupted'}; {ctx.cancel_note}") from None
    route = routes.report(plan, ctx.fallbacks, progress.bytes_through, ctx.unproven)
    if ctx.remote:
        route["remote"] = ctx.remote
    return {"source": plan.source, "destination": plan.destination, "files": len(plan.files),
            "bytes": plan.bytes, "ok": True, "errors": [], **progress.snapshot(),
            "route": route, "manifest": results["manifest"], "metered": ctx.meter.to_dict()}


def run_unit(ctx: JobContext, unit: dict) -> dict:
    return ctx.run_unit(unit)


def followups(ctx: JobContext, unit: dict) -> list[dict]:
    return ctx.followups(unit)


def prepare(ctx: JobContext) -> None:
    """Before any byte moves (see ``JobContext.prepare``)."""
    ctx.prepare()
