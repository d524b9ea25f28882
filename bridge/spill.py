"""A long sequence of rows kept on disk: a job's plan of ten million files is not held in memory.

``Rows`` appends tuples of SQL values (str, int, None) in order and yields them back in that
order, a page at a time; ``find(key)`` looks a row up by its first column (an index made the
first time it is asked). Its SQLite file is removed from its folder as soon as it is opened: only
the open connection holds it, so a killed process leaves nothing behind and the space goes back
when the rows are closed or collected.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import threading
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

PAGE = 2000     # rows read per query, and written per transaction


class Rows:
    def __init__(self, columns: int, where: Path | str | None = None):
        self.columns = columns
        folder = Path(where) if where else Path(tempfile.gettempdir())
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"rows-{uuid.uuid4().hex}.sqlite"
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            os.unlink(path)
        except OSError:
            pass
        self._db.execute("PRAGMA journal_mode=OFF")
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.execute("PRAGMA cache_size=-8192")          # KiB: 8 MiB of pages at most
        self._db.execute("PRAGMA temp_store=FILE")
        names = ", ".join(f"c{i}" for i in range(columns))
        self._db.execute(f"CREATE TABLE rows (seq INTEGER PRIMARY KEY, {names})")
        self._insert = f"INSERT INTO rows ({names}) VALUES ({', '.join('?' * columns)})"
        self._pending: list[tuple] = []
        self._count = 0
        self._indexed = False
        self._lock = threading.Lock()

    def append(self, row: tuple) -> None:
        self._pending.append(row)
        self._count += 1
        if len(self._pending) >= PAGE:
            self._flush()

    def _flush(self) -> None:
        with self._lock:
            if not self._pending:
                return
            self._db.execute("BEGIN")
            self._db.executemany(self._insert, self._pending)
            self._db.execute("COMMIT")
            self._pending = []

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[tuple]:
        return self.columns_of(range(self.columns))

    def columns_of(self, columns: Iterable[int]) -> Iterator[tuple]:
        """The rows in order, only the given columns of each."""
        self._flush()
        select = (f"SELECT seq, {', '.join(f'c{i}' for i in columns)} FROM rows WHERE seq > ? "
                  f"ORDER BY seq LIMIT {PAGE}")
        after = 0
        while True:
            with self._lock:
                page = self._db.execute(select, (after,)).fetchall()
            for row in page:
                yield row[1:]
            if len(page) < PAGE:
                return
            after = page[-1][0]

    def range(self, after: int, count: int) -> Iterator[tuple]:
        """``count`` rows from the one after the ``after``-th (rows are numbered from 1 as appended)."""
        self._flush()
        names = ", ".join(f"c{i}" for i in range(self.columns))
        end = after + count
        while after < end:
            with self._lock:
                page = self._db.execute(f"SELECT seq, {names} FROM rows WHERE seq > ? AND seq <= ? ORDER BY seq "
                                        f"LIMIT {PAGE}", (after, end)).fetchall()
            for row in page:
                yield row[1:]
            if len(page) < PAGE:
                return
            after = page[-1][0]

    def ordered_by(self, *columns: int) -> Iterator[tuple]:
        """Every row, sorted by these columns (SQLite sorts on disk past its cache): one query
        read as it is consumed, so nothing may be appended meanwhile."""
        self._flush()
        names = ", ".join(f"c{i}" for i in range(self.columns))
        order = ", ".join(f"c{i}" for i in columns)
        yield from self._db.execute(f"SELECT {names} FROM rows ORDER BY {order}, seq")

    def _index(self) -> None:
        if not self._indexed:
            self._db.execute("CREATE INDEX rows_c0 ON rows (c0)")
            self._indexed = True

    def find(self, key) -> tuple | None:
        """The first row whose first column is ``key``."""
        self._flush()
        with self._lock:
            self._index()
            row = self._db.execute(f"SELECT {', '.join(f'c{i}' for i in range(self.columns))} FROM rows "
                                   f"WHERE c0 = ? ORDER BY seq LIMIT 1", (key,)).fetchone()
        return row

    def from_key(self, key) -> Iterator[tuple]:
        """For rows appended in the order of their first column (a sorted listing): the rows in
        order from the first whose first column is at least ``key``."""
        self._flush()
        with self._lock:
            self._index()
            first = self._db.execute("SELECT min(seq) FROM rows WHERE c0 >= ?", (key,)).fetchone()[0]
        if first is not None:
            yield from self.range(first - 1, self._count - first + 1)

    def copy_to(self, path: Path | str) -> None:
        """The rows, with the index ``find`` reads, written to a new SQLite file at ``path`` that
        another process opens for itself (``reading``): a connection must not cross a fork."""
        self._flush()
        with self._lock:
            self._index()
            target = sqlite3.connect(path)
            try:
                self._db.backup(target)
            finally:
                target.close()

    @classmethod
    def reading(cls, path: Path | str, columns: int, count: int) -> Rows:
        """The rows ``copy_to`` wrote at ``path``, read-only, through a connection of this process."""
        rows = cls.__new__(cls)
        rows.columns, rows._count, rows._pending, rows._indexed = columns, count, [], True
        rows._insert = ""
        rows._lock = threading.Lock()
        rows._db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False)
        return rows

    def close(self) -> None:
        with self._lock:
            self._db.close()
