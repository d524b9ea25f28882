"""Whole-file locks with flock(2), shared by processes of one node and, where the filesystem
makes flock coherent across clients (Lustre mounted with ``-o flock``, NFSv4), by nodes.

The kernel releases a lock when its holder dies, kill -9 included: a dead filler never leaves a
cache entry locked. A lock file may be removed (eviction does, holding it): whoever had opened it
before then finds, once it holds the lock, that the name now points at another file or none, and
opens it again, so two holders can never each believe they have the one lock.
"""

from __future__ import annotations

import errno
import fcntl
import os
from contextlib import contextmanager
from collections.abc import Iterator

from bridge.errors import BridgeError

# What flock answers on a filesystem that does not do it: Lustre without -o flock (ENOSYS),
# some FUSE and NFS setups (ENOLCK, EOPNOTSUPP).
_UNSUPPORTED = {errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL}


class LockUnsupported(BridgeError):
    pass


def acquire(path: str, *, blocking: bool = True) -> int | None:
    """An fd holding an exclusive lock on ``path`` (created if absent), or None when ``blocking``
    is False and someone else holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return None
        except OSError as exc:
            os.close(fd)
            if exc.errno in _UNSUPPORTED:
                raise LockUnsupported(f"{path}: this filesystem does not support flock ({exc.strerror}); "
                                      f"mount Lustre with -o flock (localflock: one node only)") from exc
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)   # removed or replaced while we waited: lock the file the name holds now


def release(fd: int) -> None:
    os.close(fd)   # closing the last descriptor of the open file drops its flock


@contextmanager
def held(path: str) -> Iterator[None]:
    fd = acquire(path)
    try:
        yield
    finally:
        release(fd)


def remove_held(path: str) -> None:
    """Remove a lock file whose lock the caller holds (see the module's note)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
