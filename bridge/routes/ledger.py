"""What bridge created at a transfer service for one job, written in the state dir before each
create call and completed with the names the service gave, so that a run killed mid-job (SIGKILL,
a lost machine) leaves a record its re-run finds.

One JSON file per job, ``<state_dir>/native/<key>.json``, keyed by route, source and destination;
each write replaces the whole file atomically (a temporary, fsync, rename), so a kill leaves the
previous record or the next, never half of one. It holds names only (a transfer job's name and its
transfer manifest's location, task, location and execution ARNs), never a credential, and the ``fingerprint`` of the objects the
remote job was made for: a re-run adopts a remote job only when it was made for the same objects
(names, sizes and source versions), and otherwise cancels it and deletes what bridge created.
The record is removed once what it names is gone.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from bridge.config import Settings
from bridge.journal import job_key


def fingerprint(transfer) -> str:
    """The objects a remote job copies: names, sizes and source versions."""
    parts = [transfer.route, str(transfer.src_root), str(transfer.dst_root), transfer.filtered]
    for rel, info in sorted(transfer.objects, key=lambda o: o[0]):
        parts.append(json.dumps([rel, info.size, info.identity], sort_keys=True, default=str))
    return job_key(*parts)


class Ledger:
    def __init__(self, settings: Settings, transfer):
        key = job_key("native", transfer.route, transfer.source, str(transfer.dst_root))
        self.path = Path(settings.transfer.state_dir) / "native" / f"{key}.json"
        self.fingerprint = fingerprint(transfer)
        self._record: dict[str, Any] | None = None

    def load(self) -> dict[str, Any] | None:
        """The record a killed run left, or None (a record cut short by a crash is unreadable
        only if the file system broke the rename's promise: it is then ignored)."""
        try:
            self._record = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            self._record = None
        return self._record

    def matches(self, record: dict[str, Any]) -> bool:
        return record.get("fingerprint") == self.fingerprint

    def get(self, field: str) -> Any:
        """A field of the record held ("" when it has none)."""
        return (self._record or {}).get(field, "")

    def begin(self, **fields: Any) -> None:
        """A new record: what is about to be created."""
        self._record = {"fingerprint": self.fingerprint}
        self.note(**fields)

    def note(self, **fields: Any) -> None:
        """Add to the record (a name the service gave, what is about to be created next)."""
        self._record = {**(self._record or {"fingerprint": self.fingerprint}), **fields}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, json.dumps(self._record, sort_keys=True).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)

    def drop(self) -> None:
        """Forget the record, and any half-written one a run killed while noting left beside it."""
        self._record = None
        self.path.unlink(missing_ok=True)
        for stale in self.path.parent.glob(f"{self.path.stem}.*.tmp"):
            stale.unlink(missing_ok=True)
