"""One accounting object passed through every transfer call; the progress bar, ``--json``
summaries and job status all read from it, and (``audit``) the per-object log: one line per
object copied, skipped or deleted on the ``bridge.audit`` logger, each with its name, size, route
and retries (``-v``, ``--log-file``; ``-vv`` adds the files a sync found unchanged). The fields
ride on the record as ``record.audit`` for a JSON formatter (bridge.logs)."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


class Throttle(Protocol):
    """A job's bandwidth limit as progress uses it (``bridge.bwlimit.Limiter`` is the one):
    named here because bwlimit, above, prints with this module's ``human_bytes``."""

    def take(self, nbytes: int) -> None: ...


@dataclass
class Progress:
    bytes_total: int = 0
    bytes_done: int = 0
    bytes_skipped: int = 0
    bytes_through: int = 0   # data bytes that passed through this process (not those a store copied)
    fallbacks: int = 0       # files the job's route could not carry, sent direct (bridge/routes)
    units_total: int = 0
    units_done: int = 0
    units_failed: int = 0
    files_done: int = 0
    retries: int = 0
    # What the job is doing now and how far that is, for work that moves no bytes: listing
    # ("listing", objects seen), planning a sync (files judged), verifying (files and bytes checked).
    phase: str = ""
    listed: int = 0
    checks_total: int = 0
    checks_done: int = 0
    check_bytes_total: int = 0
    check_bytes_done: int = 0
    started: float = field(default_factory=time.monotonic)
    listeners: list[Callable[[Progress], None]] = field(default_factory=list)
    limiter: Throttle | None = None   # the job's bandwidth limit (bridge/bwlimit.py)
    # One log line per object (bridge.audit): asked for by whoever shows them (the CLI with -v or
    # --log-file), not by default: a worker's log holds job events, not every object.
    audit: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # retries of a file's finished units (its parts) not yet said, until the unit that
    # finishes the file says them
    _pending: dict[str, int] = field(default_factory=dict, repr=False)

    def _changed(self) -> None:
        for listener in self.listeners:
            listener(self)

    def plan(self, nbytes: int, units: int) -> None:
        with self._lock:
            self.bytes_total += nbytes
            self.units_total += units
        self._changed()

    def begin(self, phase: str) -> None:
        """The job moves on to ``phase`` (listing, planning, copying, verifying ...)."""
        with self._lock:
            self.phase = phase
        self._changed()

    def saw(self, objects: int) -> None:
        """``objects`` more listed."""
        with self._lock:
            self.listed += objects
        self._changed()

    def plan_checks(self, files: int, nbytes: int) -> None:
        """Files (and their bytes) that will be checked or judged, moving nothing."""
        with self._lock:
            self.checks_total += files
            self.check_bytes_total += nbytes
        self._changed()

    def checked(self, nbytes: int = 0) -> None:
        with self._lock:
            self.checks_done += 1
            self.check_bytes_done += nbytes
        self._changed()

    def throttle(self, nbytes: int) -> None:
        """Wait until the job's bandwidth limit lets ``nbytes`` more through."""
        if self.limiter is not None:
            self.limiter.take(nbytes)

    def moved(self, nbytes: int, through: int | None = None) -> None:
        """``nbytes`` more are at the destination; ``through`` of them (all, unless a route had
        the stores move them) passed through this process."""
        with self._lock:
            self.bytes_done += nbytes
            self.bytes_through += nbytes if through is None else through
        self._changed()

    def skipped(self, nbytes: int, rel: str | None = None) -> None:
        """Bytes already at the destination (resume): counted as done, not as moved; ``rel``
        names a whole file found already written."""
        with self._lock:
            self.bytes_done += nbytes
            self.bytes_skipped += nbytes
        self._changed()
        if rel is not None:
            self.said("skipped", rel, nbytes, why="already there from an earlier run")

    def unit_finished(self, ok: bool = True) -> None:
        with self._lock:
            if ok:
                self.units_done += 1
            else:
                self.units_failed += 1
        self._changed()

    def file_finished(self, rel: str | None = None, size: int = 0, route: str = "direct") -> None:
        with self._lock:
            self.files_done += 1
        if rel is not None:
            self.said("copied", rel, size, route=route)

    def files_finished(self, count: int) -> None:
        """``count`` more files done, said by no name (a run of a shard's files)."""
        with self._lock:
            self.files_done += count

    def deleted(self, rel: str) -> None:
        self.said("deleted", rel, None)

    def judged(self, rel: str, verdict: str, size: int) -> None:
        """A sync's verdict on a file it does not send: adopted (equal already, committed
        without copying) at -v, unchanged at -vv. (Asked of every file a sync judges: nothing
        to do unless an audit is asked for; such a file ran no unit, so no retries wait for it.)"""
        if not self.audit:
            return
        if verdict == "adopted":
            self.said("adopted", rel, size, why="equal already: committed without copying")
        elif verdict == "unchanged":
            self.said("unchanged", rel, size, level=logging.DEBUG)

    @contextlib.contextmanager
    def unit(self, unit: dict):
        """While one unit runs: the retries its requests take (in this thread, or in tasks and
        threads started with its context) are its own, said on the line of the object it
        finishes; those of a unit that finishes none (a part) wait for the one that does; those
        of a unit of several files (a batch, a route's) are the unit's, said on each line."""
        counter = [0, "files" in unit, []]   # retries, shared by several files, their lines held
        token = _UNIT_RETRIES.set(counter)
        try:
            yield
        finally:
            _UNIT_RETRIES.reset(token)
            rel = unit.get("rel")
            if counter[0] and rel is not None:
                with self._lock:
                    self._pending[rel] = self._pending.get(rel, 0) + counter[0]
            # a batch's lines wait for its end: a file answered before another's retry would
            # otherwise say fewer retries than its batch took
            for event, held, size, route, why, level, earlier in counter[2]:
                self._say(event, held, size, route, why, level, counter[0] + earlier, True)

    def _retries_of(self, rel: str) -> tuple[int, bool]:
        """The retries to say on ``rel``'s line, and whether they are its unit's, shared with
        the other files of a batch (one request may carry several of them)."""
        counter = _UNIT_RETRIES.get()
        here, shared = (counter[0], counter[1]) if counter is not None else (0, False)
        if counter is not None and not shared:
            counter[0] = 0   # said: not carried to the file's later lines
        with self._lock:
            return here + self._pending.pop(rel, 0), shared

    def auditing(self, level: int = logging.INFO) -> bool:
        """Whether ``said`` writes anything: asked once before a loop over many objects."""
        return self.audit and AUDIT.isEnabledFor(level)

    def said(self, event: str, rel: str, size: int | None, *, route: str | None = None, why: str | None = None,
             level: int = logging.INFO) -> None:
        """One object's line on the audit log (when ``audit``): what happened to it, its size, the
        route that carried it and the retries it took."""
        retries, shared = self._retries_of(rel)
        if not self.audit or not AUDIT.isEnabledFor(level):
            return
        counter = _UNIT_RETRIES.get()
        if shared and counter is not None:
            counter[2].append((event, rel, size, route, why, level, retries - counter[0]))
            return
        self._say(event, rel, size, route, why, level, retries, shared)

    @staticmethod
    def _say(event: str, rel: str, size: int | None, route: str | None, why: str | None, level: int,
             retries: int, shared: bool) -> None:
        fields = {"event": event, "path": rel, "size": size, "route": route, "retries": retries, "why": why,
                  **({"retries_of": "batch"} if shared else {})}
        counted = plural(retries, "retry", "retries") + (" in its batch" if shared and retries else "")
        detail = ", ".join(part for part in (
            None if size is None else f"{size:,} B",
            None if route is None else f"route {route}",
            counted if route is not None or retries else None, why) if part)
        AUDIT.log(level, "%s %s%s", event, rel, f" ({detail})" if detail else "",
                  extra={"audit": {k: v for k, v in fields.items() if v is not None}})

    def add(self, counts: dict[str, int]) -> None:
        """Counts made elsewhere (a process running part of the job: bridge.pipeline.forkrun)
        added to these: ``bytes_done``, ``files_done``, ``units_done``, ``retries`` ..."""
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)
        self._changed()

    def fell_back(self, files: int) -> None:
        with self._lock:
            self.fallbacks += files

    def retried(self) -> None:
        with self._lock:
            self.retries += 1
            counter = _UNIT_RETRIES.get()
            if counter is not None:
                counter[0] += 1

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def rate(self) -> float:
        moved = self.bytes_done - self.bytes_skipped
        return moved / self.elapsed if self.elapsed > 0 else 0.0

    def snapshot(self) -> dict:
        return {"bytes_total": self.bytes_total, "bytes_done": self.bytes_done,
                "bytes_skipped": self.bytes_skipped, "bytes_through": self.bytes_through,
                "fallbacks": self.fallbacks,
                "units_total": self.units_total,
                "units_done": self.units_done, "units_failed": self.units_failed,
                "files_done": self.files_done, "retries": self.retries,
                "elapsed_s": round(self.elapsed, 3), "rate_bytes_per_s": round(self.rate)}


AUDIT = logging.getLogger("bridge.audit")
# the retries of the unit running in this context (Progress.unit)
_UNIT_RETRIES: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("bridge_unit_retries", default=None)


def plural(n: int, noun: str, many: str | None = None) -> str:
    """'1 file', '2 files', '1 entry', '3 entries' (``many``: the plural when not noun + 's')."""
    return f"{n} {noun if n == 1 else (many or noun + 's')}"


def human_duration(seconds: float) -> str:
    """12.3 -> '12.3s', 75 -> '1m15s', 3725 -> '1h02m05s'."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    s = int(seconds)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s"


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (IEC units, as everywhere bridge prints a size)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)
