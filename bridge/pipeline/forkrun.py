"""A copy of many small files run by several processes at once, a batch at a time each.

Small files travel in batches, each on one event loop that keeps the job's requests in flight
(bridge.pipeline.units ``batch``), one batch at a time: a second loop in the same process would
take turns with the first for its GIL. Between the loop, the file writers (hashing, a temporary
name, attributes, the journal's record) and the settling of what was written, one process spent
about a core's worth of Python on 2,000 x 16 KiB while the second core waited (bench/notes/speed.md).
Here the batches go to forked processes, each running them one at a time as the one process
did, with its own stores (its own connections), its own connection to the job's journal (SQLite
in WAL mode takes their transactions in turn) and its own settling: a file is journaled by the
process that wrote it, once it is durable. The finals (the uploads to complete, the manifest)
run here, after every process has ended, from the journal, exactly as after the thread pool.

When: every unit of the plan is such a batch (no file sent in parts, no deletion, the direct
route), there are two or more of them, no bandwidth limit is set (one limiter cannot span
processes), on Linux outside a daemonic process (``adopt._can_fork``), and
``transfer.processes`` allows two or more. The batches are handed out one at a time as each
process asks, so a slow one holds back no other, and each keeps its share of the job's small
files in flight (``transfer.small_files_in_flight`` in all, never fewer than ``concurrency``
each, as a batch always has). What a process counts (bytes, files, units,
retries) reaches this process's ``Progress`` as it goes, its requests this job's meter when it
ends; -v's per-file lines are written by the process that moved the file. A plan of more files
than it holds in memory keeps them in an SQLite file whose connection may not cross a fork: it
is copied (SQLite's backup, with its index) to a file each process opens for itself. A failed
batch fails the job as it would in one process (the others run on; an authentication or bucket
error stops handing out batches; a store that stopped answering, by one process's breaker, ends
the other processes at once, as the breaker ends every unit of one process); a process that dies without a word
fails the job, naming its exit code; ^C here ends them all, and the journal keeps what they
finished.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterable
from typing import Any

from bridge import jobs
from bridge import meter
from bridge.errors import BridgeError
from bridge.journal import FileJournal
from bridge.progress import Progress
from bridge.redact import redact
from bridge.pipeline.forkplan import forked_child, processes_for
from bridge.pipeline.plan import Plan, spill_dir

COUNTERS = ("bytes_done", "bytes_skipped", "bytes_through", "fallbacks", "units_done", "units_failed",
            "files_done", "retries")
FLUSH_SECONDS = 0.1


def forkable(plan: Plan, settings, progress: Progress) -> int:
    """How many processes run this plan's batches (0: it runs on the thread pool here)."""
    from bridge.adopt import _can_fork
    processes = processes_for(settings)
    if processes < 2 or plan.route != "direct" or not plan.batch or plan.deletions or plan.files.multipart:
        return 0
    limiter = progress.limiter
    if limiter is not None and not getattr(limiter, "never_limits", False):
        return 0
    if settings.transfer.bwlimit or not _can_fork():
        return 0
    batches = plan.unit_count() - 1   # the finalize unit aside: every other unit is a batch
    if batches < 2:
        return 0
    return min(processes, batches)


class ForkedExecutor:
    """``jobs.ThreadExecutor``'s ``run`` for a plan of batches only (``forkable``): the units in
    ``processes`` forked processes, then the finals here."""

    def __init__(self, processes: int):
        self.processes = processes

    def run(self, ctx, units: Iterable[dict], final: dict | list[dict] | None) -> jobs.Outcome:
        import multiprocessing
        from multiprocessing.connection import wait
        mp = multiprocessing.get_context("fork")
        pending = iter(units)
        errors: list[str] = []
        failed: set[str | None] = set()
        stopped = False
        tripped = ""
        children, links = [], {}
        spoke: set = set()   # the processes that said how they ended
        ended_by_us: set = set()   # ended here (terminated): a store they use stopped answering
        ended: set = set()
        shared = None
        if ctx.plan.files.spilled:   # a file of its own, for the processes to open (FileList.reading)
            folder = spill_dir(ctx.settings)
            folder.mkdir(parents=True, exist_ok=True)
            shared = folder / f"files-{uuid.uuid4().hex}.sqlite"
            ctx.plan.files.copy_to(shared)
        ctx.journal.close()   # no connection open across the fork: each process opens its own
        try:
            for n in range(self.processes):
                here, there = mp.Pipe()
                child = mp.Process(target=_child, args=(there, ctx, shared, self.processes), daemon=True,
                                   name=f"mcbridge-batches-{n}")
                child.start()
                there.close()
                children.append(child)
                links[here] = child
            running: dict[Any, dict | None] = {link: None for link in links}
            for link in links:
                stopped = self._hand(link, pending, failed, stopped, running)
            while len(ended) < len(links):
                for link in wait([link for link in links if link not in ended]):
                    try:
                        message = link.recv()
                    except EOFError:   # it ended: after its last word, or without it
                        ended.add(link)
                        links[link].join()
                        if link not in spoke and link not in ended_by_us:
                            code = links[link].exitcode
                            errors.append(f"a process running the small files' batches ended with exit code "
                                          f"{code} before it was done; run it again to resume")
                            stopped = True
                        continue
                    kind = message[0]
                    if kind == "progress":
                        ctx.progress.add(message[1])
                    elif kind == "done":
                        running[link] = None
                        stopped = self._hand(link, pending, failed, stopped, running)
                    elif kind == "failed":
                        unit, text, fatal, down = running[link], message[1], message[2], message[3]
                        running[link] = None
                        group = jobs._group(unit) if unit is not None else None
                        if group not in failed:
                            errors.append(text)
                        failed.add(group)
                        stopped = stopped or fatal or bool(down)
                        if down and not tripped:
                            # a store stopped answering: in one process the breaker stops every
                            # unit at once; here the others may wait on requests that never end
                            tripped = down
                            for other, child in links.items():
                                if other is not link and other not in ended and child.exitcode is None:
                                    ended_by_us.add(other)
                                    child.terminate()
                        stopped = self._hand(link, pending, failed, stopped, running)
                    elif kind == "end":
                        spoke.add(link)
                        _, settle_errors, fields, reason = message
                        errors.extend(settle_errors)
                        ctx.meter.add(meter.Meter.from_fields(fields))
                        tripped = tripped or reason
            for child in children:
                child.join()
        except BaseException:
            ctx.journal.reopen()
            cancelled = getattr(ctx, "cancelled", None)
            if cancelled is not None:
                cancelled.set()
            for child in children:
                if child.exitcode is None:
                    child.terminate()
            for child in children:
                child.join()
            raise
        finally:
            if shared is not None:
                shared.unlink(missing_ok=True)
        ctx.journal.reopen()   # what the processes journaled, for the finals
        if tripped:
            return jobs.Outcome(False, [tripped], {})
        if errors or stopped:
            return jobs.Outcome(False, errors or ["stopped"], {})
        results: dict[str, Any] = {}
        for unit in [final] if isinstance(final, dict) else final or []:
            results.update(ctx.run_unit(unit))
            ctx.progress.unit_finished(True)
        return jobs.Outcome(True, [], results)

    @staticmethod
    def _hand(link, pending, failed: set, stopped: bool, running: dict) -> bool:
        """The next unit to the process at ``link``, or None (no more: it settles and ends)."""
        unit = None
        while not stopped:
            unit = next(pending, None)
            if unit is None or jobs._group(unit) not in failed:
                break
        if stopped:
            unit = None
        running[link] = unit
        try:
            link.send(unit)
        except OSError:   # it died meanwhile: its pipe's end says so (and its exit code), next
            pass
        return stopped


class _Relay:
    """A process's counts, sent to the parent's ``Progress`` at most every FLUSH_SECONDS."""

    def __init__(self, link, progress: Progress):
        self.link, self.progress = link, progress
        self.sent = dict.fromkeys(COUNTERS, 0)
        self.last = time.monotonic()

    def __call__(self, _progress: Progress) -> None:
        now = time.monotonic()
        if now - self.last >= FLUSH_SECONDS:
            self.last = now
            self.flush()

    def flush(self) -> None:
        now = {name: getattr(self.progress, name) for name in COUNTERS}
        delta = {name: value - self.sent[name] for name, value in now.items() if value != self.sent[name]}
        if delta:
            self.sent = now
            self.link.send(("progress", delta))


def _child(link, ctx, shared, processes: int) -> None:
    """A process of batches: the units it is handed run one at a time, as the thread pool runs
    a batch (alone), until it is handed None; then what it wrote is settled and journaled. A
    parent gone (its end of the pipe closed) ends it at once: what it journaled stays."""
    try:
        _batches(link, ctx, shared, processes)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        os._exit(1)


def _batches(link, ctx, shared, processes: int) -> None:
    from bridge.stores import get_store
    forked_child()
    # the job's small files in flight, shared: each process keeps its part of them
    t = ctx.settings.transfer
    share = -(-t.small_files_in_flight // processes)
    ctx.settings = ctx.settings.model_copy(update={"transfer": t.model_copy(update={"small_files_in_flight": share})})
    ctx.src, ctx.dst = get_store(ctx.src_root, ctx.settings), get_store(ctx.dst_root, ctx.settings)
    ctx.journal = FileJournal(ctx.journal.path)   # a connection of its own
    if shared is not None:
        ctx.plan.files = ctx.plan.files.reading(shared)
    parent = ctx.progress
    ctx.progress = Progress(audit=parent.audit)
    relay = _Relay(link, ctx.progress)
    ctx.progress.listeners.append(relay)
    counted = meter.Meter()
    ctx.meter = counted
    settle_errors: list[str] = []
    with meter.metering(counted):
        while True:
            unit = link.recv()
            if unit is None:
                break
            try:
                ctx.run_unit(unit)
            except BaseException as exc:   # said to the parent, which fails the job as the pool would
                ctx.progress.unit_finished(False)
                relay.flush()
                fatal = isinstance(exc, jobs.FATAL) or not isinstance(exc, BridgeError)
                breaker = ctx.__dict__.get("_breaker")
                down = redact(breaker.reason) if breaker is not None and breaker.tripped.is_set() else ""
                link.send(("failed", jobs.describe(exc), fatal, down))
                continue
            ctx.progress.unit_finished(True)
            link.send(("done",))
        try:
            ctx.settle()
        except BridgeError as exc:
            settle_errors.append(jobs.describe(exc))
    relay.flush()
    breaker = ctx.__dict__.get("_breaker")
    reason = redact(breaker.reason) if breaker is not None and breaker.tripped.is_set() else ""
    link.send(("end", settle_errors, counted.to_fields(), reason))
    ctx.journal.close()
    link.close()
