"""One job model for every kind of transfer: units, one executor here, one commit path.

A job of any kind (copy and sync in ``bridge.pipeline``, pack in ``bridge.packing.job``, unpack in
``bridge.packing.unpack``) is planned into small JSON units, and gets a ``Context``: what its
units share in one process (stores, journal, progress). Then, the same for every kind:

    ctx.prepare()                  before any byte moves: the temporaries of a killed run removed
    ThreadExecutor.run(ctx, units, ctx.finals())
                                   units on a bounded thread pool; ``ctx.followups(unit)`` are the
                                   units a finished one makes ready (a file's ``complete`` after its
                                   last part); one failed unit stops the rest of its file or shard, a
                                   fatal error (credentials, missing bucket, a bug) stops the job;
                                   then ``ctx.settle()`` makes what they wrote durable
    the finals, in order           only when every unit succeeded: they end in ``commit``: one new
                                   commit in the prefix's log, written last, then leftovers
                                   (unfinished uploads to the objects just written) cleaned
    failure(what, errors)          the one error line a failed job raises

``run`` does all of that in this process, with the job's journal. The Celery executor
(``workers/executor.py``) runs the same units and the same finals, spread over tasks.

A new kind (a server-side or delegated copy, a cache fill) is: a plan whose units are JSON, a
``Context`` subclass whose ``ops`` map each unit's ``"op"`` to a function ``(ctx, unit) -> dict``,
and a finalize op that calls ``commit`` with the entries its journal holds. Every unit must be
idempotent (a re-run finds finished work in the journal and does not send it again); a unit that
belongs to one object carries its path as ``"rel"`` (or ``"name"``) so that its failure stops only
that object's other units. Its plan reports ``usage()`` (``bridge.policies.cost.usage``) for policies to price.
On the service it is one more class in ``workers/kinds.py`` (its plan cut into sub-plans, one per
task, and a header for the finals), one entry in ``kind_for``'s table and a ``kind`` in
``workers/specs.py``; the Celery executor itself does not change.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from bridge.meter import Pool
from bridge import manifest as manifests
from bridge import meter, retry
from bridge.errors import AuthError, BridgeError, BucketNotFound, ObjectNotFound, TransferFailed
from bridge.journal import FileJournal
from bridge.manifest import FileEntry
from bridge.progress import Progress
from bridge.redact import redact
from bridge.stores.base import Store
from bridge.urls import Location

FATAL = (AuthError, BucketNotFound)


class Context:
    """What the units of one job share in one process. A kind sets ``ops`` and overrides what
    it needs; ``run_unit`` is what every executor calls."""

    ops: ClassVar[dict[str, Callable[[Any, dict], dict]]] = {}
    progress: Progress

    def run_unit(self, unit: dict) -> dict:
        with retry.reporting(lambda _exc: self.progress.retried()), retry.guarding(self.breaker), \
                meter.metering(meter.current() or self.meter), self.progress.unit(unit):
            return self.ops[unit["op"]](self, unit)

    @property
    def meter(self) -> meter.Meter:
        """What the job's requests count in (bridge/meter.py), unless the thread that runs a
        unit meters into one of its own (a service task's)."""
        found = self.__dict__.get("_meter")
        if found is None:
            found = self.__dict__.setdefault("_meter", meter.current() or meter.Meter())
        return found

    @meter.setter
    def meter(self, value: meter.Meter) -> None:
        self.__dict__["_meter"] = value

    @property
    def breaker(self) -> retry.Breaker:
        """The job's breaker, shared by its units in this process: a store that stopped
        answering stops the job (bridge.retry.Breaker)."""
        breaker = self.__dict__.get("_breaker")
        if breaker is None:
            breaker = self.__dict__.setdefault("_breaker", retry.Breaker())
        return breaker

    def followups(self, unit: dict) -> list[dict]:
        """Units that become ready when ``unit`` has succeeded."""
        return []

    def before_submit(self, unit: dict) -> None:
        """Called in submission order, before ``unit`` can run (and before any later unit can)."""

    def prepare(self) -> None:
        """Before any byte moves."""

    def settle(self) -> None:
        """After the units, before the finals: make what they wrote durable (and journal it)."""

    def finals(self) -> list[dict]:
        """The units that run, in order, once every other unit has succeeded; the last commits."""
        return [{"op": "finalize"}]

    def close(self) -> None:
        """Release what the context holds (thread pools)."""


# -- the in-process executor -------------------------------------------------------------------

@dataclass
class Outcome:
    ok: bool
    errors: list[str]
    results: dict[str, Any]


class _Stopped(Exception):
    """A unit that was queued when the job stopped, and so never ran."""


def _group(unit: dict) -> str | None:
    return unit.get("rel", unit.get("name"))


class ThreadExecutor:
    """Runs units on a bounded FIFO thread pool, at most ``concurrency`` at a time, submitting a
    window of them so that memory stays at about concurrency x part size however big the job."""

    def __init__(self, concurrency: int):
        self.concurrency = concurrency

    def slots(self, unit: dict) -> int:
        """How much of the concurrency a unit takes: 1, or its "slots" (a batch of small files
        keeps that many requests in flight from its one thread, and so runs alone)."""
        return max(1, min(self.concurrency, int(unit.get("slots", 1))))

    def run(self, ctx: Context, units: Iterable[dict], final: dict | list[dict] | None) -> Outcome:
        errors: list[str] = []
        failed: set[str | None] = set()
        stop = threading.Event()
        pending: Iterator[dict] = iter(units)
        ready: list[dict] = []

        def guarded(unit: dict) -> dict:
            if stop.is_set():
                raise _Stopped
            return ctx.run_unit(unit)

        with Pool(self.concurrency, thread_name_prefix="bridge") as pool:
            running: dict[cf.Future, dict] = {}
            held: list[dict] = []   # the next unit, waiting for its slots (units start in order)

            def fill() -> None:
                while not stop.is_set():
                    if held:
                        unit = held.pop()
                    else:
                        unit = ready.pop(0) if ready else next(pending, None)
                        if unit is None:
                            return
                        if _group(unit) in failed:
                            continue
                    # A queue of up to one more round keeps the threads busy. A unit that takes
                    # several slots (a batch with its own connections) runs alone: it waits for
                    # the units before it to finish, and those after it wait for it.
                    alone = self.slots(unit) > 1 or any(self.slots(u) > 1 for u in running.values())
                    if running and (alone or len(running) >= self.concurrency * 2):
                        held.append(unit)
                        return
                    ctx.before_submit(unit)
                    running[pool.submit(guarded, unit)] = unit

            fill()
            try:
                while running:
                    done, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
                    for fut in done:
                        unit = running.pop(fut)
                        exc = fut.exception()
                        if isinstance(exc, _Stopped):
                            continue
                        if exc is None:
                            ctx.progress.unit_finished(True)
                            ready.extend(ctx.followups(unit))
                            continue
                        ctx.progress.unit_finished(False)
                        group = _group(unit)
                        if group not in failed:
                            errors.append(describe(exc))
                        failed.add(group)
                        if isinstance(exc, FATAL) or not isinstance(exc, BridgeError):
                            stop.set()
                    fill()
            except BaseException:
                # Ctrl-C or SIGTERM: a unit following a remote job (bridge/routes/delegated.py) cancels it
                # before the pool's shutdown waits for it.
                cancelled = getattr(ctx, "cancelled", None)
                if cancelled is not None:
                    cancelled.set()
                raise
        try:
            ctx.settle()  # before the manifest, and so that a re-run finds these files finished
        except BridgeError as exc:
            errors.append(describe(exc))
        breaker = getattr(ctx, "breaker", None)
        if breaker is not None and breaker.tripped.is_set():   # the one line that says why: the files' errors follow from it
            return Outcome(False, [redact(breaker.reason)], {})
        if errors or stop.is_set():
            return Outcome(False, errors, {})
        results: dict[str, Any] = {}
        for unit in [final] if isinstance(final, dict) else final or []:
            results.update(ctx.run_unit(unit))
            ctx.progress.unit_finished(True)
        return Outcome(True, [], results)


def describe(exc: BaseException) -> str:
    """A failed unit's error as recorded and reported: an SDK's text may quote a signed URL."""
    if isinstance(exc, BridgeError):
        return redact(str(exc))
    return redact(f"internal error: {type(exc).__name__}: {exc}")


def failure(what: str, errors: list[str]) -> TransferFailed:
    """The one line a failed job ends with: its first error, how many more, and what to do."""
    first = errors[0] if errors else "stopped"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return TransferFailed(f"{what} did not complete: {first}{more}; run it again to resume")


def run(ctx: Context, units: Iterable[dict], journal: FileJournal, concurrency: int, what: str,
        executor: Any = None) -> dict[str, Any]:
    """A whole job in this process: prepare, the units, the finals; the journal is removed once
    the job has committed, and kept (for the re-run to resume from) when it has not. The units
    run on a ``ThreadExecutor`` of ``concurrency`` threads, or on ``executor`` (one with its
    ``run``: bridge.pipeline.forkrun's processes)."""
    try:
        if getattr(ctx, "dst_root", None) is not None:   # a record that cannot be kept where asked: before any byte
            manifests.record_home(ctx.dst, ctx.dst_root)
        with retry.reporting(lambda _exc: ctx.progress.retried()), meter.metering(meter.current() or ctx.meter):
            ctx.prepare()
        outcome = (executor or ThreadExecutor(concurrency)).run(ctx, units, ctx.finals())
    except BaseException:
        ctx.close()
        journal.close()
        raise
    ctx.close()
    if not outcome.ok:
        journal.close()
        raise failure(what, outcome.errors)
    journal.remove()
    return outcome.results


# -- the one commit path ---------------------------------------------------------------------------

def commit(store: Store, root: Location, source: str, destination: str, entries: Iterable[FileEntry], *,
           removed: Iterable[str] = (), extra: dict[str, Any] | None = None) -> str:
    """The job's commit: one new commit in the prefix's log (``bridge.manifest``) holding its
    entries (a sized collection, or an iterator in path order), the paths it removed and the
    ``extra`` it merges, written last. Other jobs committing into the same prefix at the same
    time keep theirs. What follows is cleaning up, and a failure there leaves leftovers, not a
    failed job."""
    root = root.as_prefix()
    uploads, waiting = _uploads(store, root)
    written: set[str] = set()

    def noted(items: Iterable[FileEntry]) -> Iterator[FileEntry]:
        for entry in items:
            path = entry["path"] if isinstance(entry, dict) else entry.path   # a FileEntry or RawEntry
            if path in waiting:
                written.add(path)
            yield entry

    sized = hasattr(entries, "__len__")
    where = manifests.append(store, root, source, destination, list(noted(entries)) if sized else noted(entries),
                             removed=removed, extra=extra)
    _abort_written(store, root, uploads, written)
    return str(where)


def commit_blocks(store: Store, root: Location, source: str, destination: str,
                  blocks: Iterable[manifests.Block]) -> str:
    """``commit`` of entries laid out already as shards (``manifest.blocks_of``), in path order."""
    root = root.as_prefix()
    uploads, waiting = _uploads(store, root)
    written: set[str] = set()

    def noted(items: Iterable[manifests.Block]) -> Iterator[manifests.Block]:
        for block in items:
            if waiting:
                written.update(waiting.intersection(block.paths))
            yield block

    where = manifests.append_blocks(store, root, source, destination, noted(blocks))
    _abort_written(store, root, uploads, written)
    return str(where)


def _uploads(store: Store, root: Location) -> tuple[list, set[str]]:
    """The unfinished uploads under ``root``, and the paths they are to. Those to the objects a
    commit names are leftovers of runs that were killed and not resumed; uploads to other keys
    may belong to another job running now, and stay."""
    try:
        uploads = [] if store.commit_discards_uploads else list(store.list_uploads(root))
    except BridgeError:
        uploads = []
    return uploads, {loc.relative_to(root) for loc, _id in uploads}


def _abort_written(store: Store, root: Location, uploads: list, written: set[str]) -> None:
    try:
        for loc, upload_id in uploads:
            if loc.relative_to(root) in written:
                store.abort_upload(loc, upload_id)
    except BridgeError:
        pass  # `mcbridge uploads --abort` removes what is left
