"""A seekable, read-only file object over any stored object, fetched by ranged reads: what
``tarfile`` and ``pyarrow`` read shards through, and what deep checks of a shard set hash."""

from __future__ import annotations

import hashlib
import io

from bridge.errors import IntegrityError
from bridge.progress import Progress
from bridge.retry import reported
from bridge.stores.base import MiB, Store
from bridge.urls import Location


class RangeFile(io.RawIOBase):
    """A read-only, seekable view of one stored object, fetched by ranged reads of at least
    ``window`` bytes. When reads go front to back, it also hashes the whole object on the way
    (``sha256`` is then set once the last byte has been fetched)."""

    def __init__(self, store: Store, loc: Location, size: int, *, window: int = 8 * MiB,
                 progress: Progress | None = None):
        super().__init__()
        self.store, self.loc, self.size, self.window = store, loc, size, window
        self.progress = progress
        self.requests = 0
        self._pos = 0
        self._buf = b""
        self._buf_start = 0
        self._hasher = hashlib.sha256()
        self._hashed = 0
        self.sha256: str | None = None if size else self._hasher.hexdigest()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def _fetch(self, start: int, length: int) -> bytes:
        data = reported(lambda: self.store.read(self.loc, start, length),
                        (lambda _e: self.progress.retried()) if self.progress else None)
        self.requests += 1
        if len(data) != length:
            raise IntegrityError(f"{self.loc}: short read at {start}: the object changed while being read")
        if start == self._hashed:
            self._hasher.update(data)
            self._hashed += length
            if self._hashed == self.size:
                self.sha256 = self._hasher.hexdigest()
        return data

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.size - self._pos
        n = max(0, min(n, self.size - self._pos))
        if not n:
            return b""
        end_buf = self._buf_start + len(self._buf)
        if self._buf_start <= self._pos and self._pos + n <= end_buf:
            out = self._buf[self._pos - self._buf_start:self._pos - self._buf_start + n]
        else:
            # keep what is buffered past pos; fetch only what is missing, contiguously
            keep = self._buf[self._pos - self._buf_start:] if self._buf_start <= self._pos < end_buf else b""
            start = self._pos + len(keep)
            length = min(max(n - len(keep), self.window), self.size - start)
            self._buf = keep + self._fetch(start, length)
            self._buf_start = self._pos
            out = self._buf[:n]
        self._pos += len(out)
        return out

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def hash_rest(self) -> None:
        """Fetch whatever was never read (padding, skipped headers) so ``sha256`` covers it all."""
        while self._hashed < self.size:
            length = min(self.window, self.size - self._hashed)
            self._fetch(self._hashed, length)
