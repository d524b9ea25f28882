"""Whole-file locks with flock(2), shared by processes of one node and, where the filesystem
makes flock coherent across clients (Lustre mounted with ``-o flock``, NFSv4), by nodes.

The kernel releases a lock when its holder dies, kill -9 included: a dead filler never leaves a
cache entry locked. A lock file may be removed (eviction does, holding it): whoever had opened it
before then finds, once it holds the lock, that the name now points at another file or none, and
opens it again, so two holders can never each believe they have the one lock.

A lock file is opened relative to its directory's descriptor (``dir_fd``) and never through a
link (``O_NOFOLLOW``): ``O_CREAT`` through a planted link would create the link's target.
"""

from __future__ import annotations

import errno
import fcntl
import os
from contextlib import contextmanager
from collections.abc import Callable, Iterator

from bridge.errors import BridgeError

# What flock answers on a filesystem that does not do it: Lustre without -o flock (ENOSYS),
# some FUSE and NFS setups (ENOLCK, EOPNOTSUPP).
_UNSUPPORTED = {errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL}


class LockUnsupported(BridgeError):
    pass


def _open(path: str, dir_fd: int | None) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o664, dir_fd=dir_fd)


def acquire(path: str, *, blocking: bool = True, dir_fd: int | None = None,
            opener: Callable[[], int] | None = None) -> int | None:
    """An fd holding an exclusive lock on ``path`` (in ``dir_fd``; created if absent), or None
    when ``blocking`` is False and someone else holds it. ``opener`` opens it instead (and
    checks what it opened)."""
    while True:
        fd = opener() if opener else _open(path, dir_fd)
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
            same = os.fstat(fd).st_ino == os.stat(path, dir_fd=dir_fd, follow_symlinks=False).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)   # removed or replaced while we waited: lock the file the name holds now


def release(fd: int) -> None:
    os.close(fd)   # closing the last descriptor of the open file drops its flock


@contextmanager
def held(path: str, *, dir_fd: int | None = None, opener: Callable[[], int] | None = None) -> Iterator[None]:
    fd = acquire(path, dir_fd=dir_fd, opener=opener)
    try:
        yield
    finally:
        release(fd)


def remove_held(path: str, *, dir_fd: int | None = None) -> None:
    """Remove a lock file whose lock the caller holds (see the module's note)."""
    try:
        os.unlink(path, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
