"""What a job has finished, so that a run killed at any moment continues where it stopped.

The in-process journal is an append-only JSON-lines file, one record per finished unit, written
with a single ``write`` on an O_APPEND descriptor: a SIGKILL leaves at most a cut last line, which
is ignored. The Celery executor keeps the same records in Redis (``workers/``).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any, Protocol


class Journal(Protocol):
    def get(self, key: str) -> Any | None: ...
    def put(self, key: str, value: Any) -> None: ...
    def put_many(self, records: list[tuple[str, Any]]) -> None: ...
    def items(self, prefix: str) -> dict[str, Any]: ...
    def clear(self) -> None: ...


def job_key(*parts: object) -> str:
    return hashlib.sha256("\x00".join(map(str, parts)).encode()).hexdigest()[:20]


class FileJournal:
    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self._records: dict[str, Any] = {}
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            with open(path, "rb") as f:
                for line in f:
                    if not line.endswith(b"\n"):
                        break  # cut short by a kill
                    rec = json.loads(line)
                    self._records[rec["k"]] = rec["v"]
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def get(self, key: str) -> Any | None:
        with self._lock:
            return self._records.get(key)

    def put(self, key: str, value: Any) -> None:
        line = (json.dumps({"k": key, "v": value}, separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)
            self._records[key] = value

    def put_many(self, records: list[tuple[str, Any]]) -> None:
        """Several records in one write (a kill still leaves at most a cut last line)."""
        if not records:
            return
        data = "".join(json.dumps({"k": k, "v": v}, separators=(",", ":")) + "\n" for k, v in records).encode()
        with self._lock:
            view, done = memoryview(data), 0
            while done < len(data):
                done += os.write(self._fd, view[done:])
            self._records.update(records)

    def items(self, prefix: str) -> dict[str, Any]:
        with self._lock:
            return {k: v for k, v in self._records.items() if k.startswith(prefix)}

    def clear(self) -> None:
        with self._lock:
            os.close(self._fd)
            self.path.unlink(missing_ok=True)
            self._records.clear()
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def close(self) -> None:
        os.close(self._fd)
