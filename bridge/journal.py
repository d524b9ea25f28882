"""What a job has finished, so that a run killed at any moment continues where it stopped.

The in-process journal is an SQLite database in WAL mode beside the job's other state, one row
per record: a job of ten million files keeps its records on disk, not in this process. Each
``put`` (and each ``put_many``) is one transaction, committed before it returns: a SIGKILL loses
nothing that was put, and a transaction cut by the kill is rolled back when the journal is
opened again. (``synchronous=NORMAL``: a power loss may take back the last transactions, never
leave a half one; files the journal names were made durable before they were journaled.)

``items(prefix)`` yields (key, value) in key order, a page at a time: keys are stored as their
UTF-8 bytes (``key_bytes``), which SQLite compares as memcmp does: code-point order, as Python
compares str. The Celery executor
keeps the same records in Redis (``workers/redisjournal.py``), behind the same interface.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

PAGE = 1000   # records read per query by items()
WAL_PAGES = 256   # the write-ahead log is folded into the database every 256 pages (1 MiB)


class Journal(Protocol):
    def get(self, key: str) -> Any | None: ...
    def put(self, key: str, value: Any) -> None: ...
    def get_many(self, keys: list[str]) -> list[Any | None]: ...
    def put_many(self, records: list[tuple[str, Any]]) -> None: ...
    def items(self, prefix: str) -> Iterator[tuple[str, Any]]: ...
    def raw_items(self, prefix: str) -> Iterator[tuple[str, str]]: ...
    def clear(self) -> None: ...


def job_key(*parts: object) -> str:
    return hashlib.sha256("\x00".join(map(str, parts)).encode()).hexdigest()[:20]


def key_bytes(key: str) -> bytes:
    """A key as stored: UTF-8, lone surrogates too (a local file name that is not UTF-8 reaches
    here through surrogateescape). Byte order of this encoding is code-point order, str's."""
    return key.encode("utf-8", "surrogatepass")


def prefix_end(prefix: bytes) -> bytes | None:
    """The least byte string after every one that starts with ``prefix`` (None: no bound)."""
    prefix = prefix.rstrip(b"\xff")
    return prefix[:-1] + bytes([prefix[-1] + 1]) if prefix else None


def journal_at(state_dir: Path | str, key: str) -> FileJournal:
    """The journal of the job ``key`` in a state dir."""
    return FileJournal(journal_at_path(state_dir, key))


def journal_at_path(state_dir: Path | str, key: str) -> Path:
    """Where ``journal_at`` keeps the journal of the job ``key`` (opening it makes it)."""
    return Path(state_dir) / "journal" / f"{key}.db"


_ENCODER = json.JSONEncoder(separators=(",", ":"))   # json.dumps(value, separators=...), made once


class Encoded(str):
    """A record's value already encoded as JSON text (compact): stored as it is, not encoded again
    (an adopted object's entry is encoded once, where it was judged)."""
    __slots__ = ()


def _made_once():
    """``_ENCODER.encode`` without making the C encoder again at each call (what
    ``JSONEncoder.encode`` does): a quarter less time a record, once per file a job writes or
    adopts. No check for circular containers: the values are records bridge builds (a cycle
    would end in RecursionError, not a loop). Where the C accelerator is missing,
    ``_ENCODER.encode`` as it is."""
    from json import encoder as c
    if c.c_make_encoder is None:
        return _ENCODER.encode
    made = c.c_make_encoder(None, _ENCODER.default, c.encode_basestring_ascii, None, ":", ",", False, False, True)
    join = "".join

    def encode(value: Any) -> str:
        if isinstance(value, (dict, list)):
            return join(made(value, 0))
        return _ENCODER.encode(value)   # (a bare str, number ...: as the encoder writes it)
    return encode


_encode = _made_once()


def encode(value: Any) -> str:
    """A record's value as the journals store it: compact JSON, or the ``Encoded`` text given
    (the same text as ``json.dumps(value, separators=(",", ":"))``: tests/test_journal.py)."""
    return value if type(value) is Encoded else _encode(value)


_dumps = encode


class FileJournal:
    """The journal of one in-process job at ``path`` (an SQLite file; its ``-wal`` and ``-shm``
    beside it while it is open). One connection, used under a lock by the job's threads."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = self._open()
        self._adopt_lines(path.with_suffix(".jsonl"))

    def _open(self) -> sqlite3.Connection:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)   # created private, as the old file was
        os.close(fd)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(f"PRAGMA wal_autocheckpoint={WAL_PAGES}")
        db.execute("CREATE TABLE IF NOT EXISTS records (k BLOB PRIMARY KEY, v TEXT NOT NULL) WITHOUT ROWID")
        return db

    def _adopt_lines(self, old: Path) -> None:
        """A journal an earlier version left as JSON lines (a cut last line ignored), taken over."""
        if old == self.path or not old.exists():
            return
        records = []
        with open(old, "rb") as f:
            for line in f:
                if not line.endswith(b"\n"):
                    break
                rec = json.loads(line)
                records.append((rec["k"], rec["v"]))
        self.put_many(records)
        old.unlink()

    def get(self, key: str) -> Any | None:
        with self._lock:
            row = self._db.execute("SELECT v FROM records WHERE k = ?", (key_bytes(key),)).fetchone()
        return None if row is None else json.loads(row[0])

    def get_many(self, keys: list[str]) -> list[Any | None]:
        """The records of ``keys`` (None where there is none), in their order: one query for up
        to 500 keys, where a batch of small files asked one each."""
        found: dict[bytes, str] = {}
        wanted = [key_bytes(k) for k in keys]
        for start in range(0, len(wanted), 500):
            chunk = wanted[start:start + 500]
            marks = ",".join("?" * len(chunk))
            with self._lock:
                found.update(self._db.execute(f"SELECT k, v FROM records WHERE k IN ({marks})", chunk).fetchall())
        return [None if (raw := found.get(k)) is None else json.loads(raw) for k in wanted]

    def put(self, key: str, value: Any) -> None:
        raw = _dumps(value)
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO records (k, v) VALUES (?, ?)", (key_bytes(key), raw))

    def put_many(self, records: list[tuple[str, Any]]) -> None:
        """Several records in one transaction: all of them are there after a kill, or none."""
        if not records:
            return
        rows = [(key_bytes(k), _dumps(v)) for k, v in records]
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.executemany("INSERT OR REPLACE INTO records (k, v) VALUES (?, ?)", rows)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def items(self, prefix: str) -> Iterator[tuple[str, Any]]:
        """(key, value) of every record whose key starts with ``prefix``, in key order, read a
        page at a time (records put meanwhile may or may not be seen)."""
        for key, raw in self.raw_items(prefix):
            yield key, json.loads(raw)

    def raw_items(self, prefix: str) -> Iterator[tuple[str, str]]:
        """``items``, each value as the JSON text stored."""
        start = key_bytes(prefix)
        end = prefix_end(start)
        after, first = start, True
        while True:
            query = "SELECT k, v FROM records WHERE k " + (">=" if first else ">") + " ?"
            args: tuple = (after,)
            if end is not None:
                query += " AND k < ?"
                args += (end,)
            with self._lock:
                rows = self._db.execute(query + f" ORDER BY k LIMIT {PAGE}", args).fetchall()
            for key, raw in rows:
                yield key.decode("utf-8", "surrogatepass"), raw
            if len(rows) < PAGE:
                return
            after, first = rows[-1][0], False

    def count(self, prefix: str) -> int:
        start = key_bytes(prefix)
        end = prefix_end(start)
        with self._lock:
            if end is None:
                return self._db.execute("SELECT count(*) FROM records WHERE k >= ?", (start,)).fetchone()[0]
            return self._db.execute("SELECT count(*) FROM records WHERE k >= ? AND k < ?",
                                    (start, end)).fetchone()[0]

    def clear(self) -> None:
        with self._lock:
            self._db.execute("DELETE FROM records")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def reopen(self) -> None:
        """Connected again after ``close``: a process forked while none was open makes its own
        connection, sharing none of SQLite's state with this one (bridge.pipeline.forkrun)."""
        with self._lock:
            self._db = self._open()

    def remove(self) -> None:
        """Closed and gone, with the files SQLite keeps beside it."""
        self.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
