"""One accounting object passed through every transfer call; the progress bar, ``--json``
summaries and job status all read from it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bridge.bwlimit import Limiter


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
    started: float = field(default_factory=time.monotonic)
    listeners: list[Callable[[Progress], None]] = field(default_factory=list)
    limiter: Limiter | None = None   # the job's bandwidth limit (bridge/bwlimit.py)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _changed(self) -> None:
        for listener in self.listeners:
            listener(self)

    def plan(self, nbytes: int, units: int) -> None:
        with self._lock:
            self.bytes_total += nbytes
            self.units_total += units
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

    def skipped(self, nbytes: int) -> None:
        """Bytes already at the destination (resume): counted as done, not as moved."""
        with self._lock:
            self.bytes_done += nbytes
            self.bytes_skipped += nbytes
        self._changed()

    def unit_finished(self, ok: bool = True) -> None:
        with self._lock:
            if ok:
                self.units_done += 1
            else:
                self.units_failed += 1
        self._changed()

    def file_finished(self) -> None:
        with self._lock:
            self.files_done += 1

    def fell_back(self, files: int) -> None:
        with self._lock:
            self.fallbacks += files

    def retried(self) -> None:
        with self._lock:
            self.retries += 1

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


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)
