"""The cache directory opened so that nothing planted in it is followed.

Below the cache's root every name is opened relative to a descriptor of its verified parent
(``dir_fd``) with ``O_NOFOLLOW``: a symbolic link at any level (``objects/ab``, ``fills/<key>``,
``locks/<key>.lock``, ``pins``, ``quota.lock``, an entry) is refused, never followed, so no
write, create, rename or unlink can land outside the cache, and swapping a name for a link
after it was checked changes nothing for a descriptor already open.

The root itself (the path the user configured; links in that path are the user's own) must be
a directory nobody else can write:

- private cache: owned by the user, not writable by everyone;
- group cache: a setgid directory (``chmod 2770``) whose group is one of the user's groups,
  not writable by everyone. Its members share entries; each member's umask must leave the group
  write permission (002 or 007) so the others can fill, evict and lock.

Whatever the cache holds must be owned by the user or, in a group cache, belong to the
cache's group (setgid gives it to every name made inside); anything else, a link, or a
directory writable by everyone is refused with one line naming it.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bridge.errors import UsageError

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK   # O_NONBLOCK: a planted FIFO cannot hang an open
DIR_MODE = 0o775    # the umask takes what a private cache does not want; never writable by everyone
FILE_MODE = 0o664


class UnsafeCache(UsageError):
    """The cache directory holds a link, something owned by another user, or a directory anyone
    can write: refused before anything is read or written through it."""


def _kind(mode: int) -> str:
    return "a symbolic link" if stat.S_ISLNK(mode) else "a directory" if stat.S_ISDIR(mode) else \
        "a regular file" if stat.S_ISREG(mode) else "a special file"


class Root:
    """A verified cache root and the checks every name below it passes."""

    def __init__(self, path: Path):
        self.path = path
        try:
            path.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise UnsafeCache(f"cannot use the cache directory {path}: {exc.strerror}") from exc
        st = os.fstat(self.fd)
        self.uid = os.geteuid()
        groups = {os.getegid(), *os.getgroups()}
        shared = bool(st.st_mode & stat.S_ISGID) and bool(st.st_mode & stat.S_IWGRP) and st.st_gid in groups
        self.group = st.st_gid if shared else None
        try:
            if st.st_mode & stat.S_IWOTH:
                raise UnsafeCache(f"refusing the cache directory {path}: it is writable by everyone "
                                  f"(chmod o-w; for a cache shared by a group see the README's cache section)")
            if st.st_uid != self.uid and self.group is None:
                raise UnsafeCache(f"refusing the cache directory {path}: it belongs to uid {st.st_uid} (you are "
                                  f"uid {self.uid}) and is no group cache (a setgid directory of one of your groups)")
        except UnsafeCache:
            os.close(self.fd)
            raise

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    # -- checks ------------------------------------------------------------------------------
    def check(self, st: os.stat_result, shown: Path, want_dir: bool | None = None) -> None:
        """Refuse a link, a name owned outside the user (and the group cache's group), a
        directory writable by everyone, or a file where a directory belongs (and back)."""
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeCache(f"refusing the cache: {shown} is a symbolic link (the cache never follows links; "
                              f"remove it)")
        if st.st_uid != self.uid and (self.group is None or st.st_gid != self.group):
            whose = f"uid {st.st_uid}" + (f" and group {st.st_gid}, not the cache's group {self.group}"
                                          if self.group is not None else "")
            raise UnsafeCache(f"refusing the cache: {shown} belongs to {whose} (you are uid {self.uid}); "
                              f"a cache shared by users must be a group cache (see the README's cache section)")
        if want_dir is not None and stat.S_ISDIR(st.st_mode) != want_dir or \
                want_dir is False and not stat.S_ISREG(st.st_mode):
            raise UnsafeCache(f"refusing the cache: {shown} is {_kind(st.st_mode)}, "
                              f"expected {'a directory' if want_dir else 'a regular file'}")
        if stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IWOTH:
            raise UnsafeCache(f"refusing the cache: {shown} is writable by everyone (chmod o-w)")

    def lstat(self, dir_fd: int, name: str, shown: Path, want_dir: bool | None = None) -> os.stat_result | None:
        """The checked status of ``name`` in ``dir_fd`` (never through a link), or None if absent."""
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        self.check(st, shown, want_dir)
        return st

    # -- opening -----------------------------------------------------------------------------
    def opendir(self, dir_fd: int, name: str, shown: Path, create: bool = False) -> int:
        """A descriptor of the directory ``name`` in ``dir_fd``, made first when ``create``."""
        if create:
            try:
                os.mkdir(name, DIR_MODE, dir_fd=dir_fd)
            except FileExistsError:
                pass
        try:
            fd = os.open(name, _DIR, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                self.lstat(dir_fd, name, shown, want_dir=True)   # names what is there instead
            raise
        try:
            self.check(os.fstat(fd), shown, want_dir=True)
        except UnsafeCache:
            os.close(fd)
            raise
        return fd

    @contextmanager
    def directory(self, dir_fd: int, name: str, shown: Path, create: bool = False) -> Iterator[int]:
        fd = self.opendir(dir_fd, name, shown, create)
        try:
            yield fd
        finally:
            os.close(fd)

    def open(self, dir_fd: int, name: str, shown: Path, flags: int, mode: int = FILE_MODE) -> int:
        """``os.open`` of a regular file ``name`` in ``dir_fd``, never through a link."""
        try:
            fd = os.open(name, flags | _NOFOLLOW, mode, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                self.lstat(dir_fd, name, shown)
            raise
        try:
            self.check(os.fstat(fd), shown, want_dir=False)
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def read(self, dir_fd: int, name: str, shown: Path) -> bytes:
        fd = self.open(dir_fd, name, shown, os.O_RDONLY)
        with os.fdopen(fd, "rb") as f:
            return f.read()

    def write_atomic(self, dir_fd: int, name: str, shown: Path, data: bytes, durable: bool = True) -> None:
        """Write ``name`` through a new temporary name renamed over it (a rename replaces a link
        itself, never what it points at)."""
        tmp = f"{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        fd = self.open(dir_fd, tmp, shown, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            unlink(dir_fd, tmp)
            raise

    def scan(self, dir_fd: int, shown: Path) -> Iterator[tuple[str, os.stat_result]]:
        """(name, checked status) of each name in ``dir_fd``."""
        with os.scandir(dir_fd) as it:
            names = [entry.name for entry in it]
        for name in names:
            st = self.lstat(dir_fd, name, shown / name)
            if st is not None:
                yield name, st

    def check_tree(self, dir_fd: int, shown: Path) -> None:
        """Check everything under ``dir_fd`` (a fill's directory, before it is resumed)."""
        for name, st in list(self.scan(dir_fd, shown)):
            if stat.S_ISDIR(st.st_mode):
                with self.directory(dir_fd, name, shown / name) as sub:
                    self.check_tree(sub, shown / name)
            elif not stat.S_ISREG(st.st_mode):
                raise UnsafeCache(f"refusing the cache: {shown / name} is {_kind(st.st_mode)}")


def unlink(dir_fd: int, name: str) -> bool:
    """Remove ``name`` (a link is removed itself); whether it was there."""
    try:
        os.unlink(name, dir_fd=dir_fd)
        return True
    except FileNotFoundError:
        return False


def fd_path(fd: int, fallback: Path) -> str:
    """A path naming the directory open as ``fd`` itself, whatever its name points at later
    (Linux's /proc/self/fd), for code that takes paths (the engine's local store, lfs)."""
    proc = f"/proc/self/fd/{fd}"
    return proc if os.path.isdir(proc) else str(fallback)
