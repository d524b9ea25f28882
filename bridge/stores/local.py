"""Local and Lustre/POSIX paths. Whole files are written to a temporary name and renamed into
place; multipart uploads write parts at their offsets into one partial file, recording each
finished part in a sidecar so that a killed copy can continue."""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import json
import os
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from bridge import attributes
from bridge.attributes import Attrs, MetadataError
from bridge.config import Settings
from bridge.errors import BridgeError, ObjectNotFound, PermissionDenied
from bridge.hashing import FileRegion, ShortRead, digest, file_reader
from bridge.names import NAME_MAX, PARTIAL, TEMPORARY, check_local_path, local_join
from bridge.stores.base import RESERVED, GiB, Features, ObjectInfo, PartRecord, Store
from bridge.urls import Location

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
OLD_TEMP_AGE = 3600   # seconds: a temporary named without its writer is stale after this
SHORT_NAME = 16       # hex digits of a long name's digest, in the names of its temporary files
SIDECAR = ".parts"    # beside a partial file: its finished parts, one JSON line each

# One lock per partial file, held by whichever thread is writing a piece into it. ext4 and most
# filesystems take the file's inode lock for every buffered write; when the threads of a
# multipart download write into one file at once, the kernel's lock spins while its holder runs,
# on the cores the hashing and the source need. Taking turns here, the waiting threads sleep
# instead. 8 threads writing 1 GiB in 256 KiB pieces into one file on this 2-core VM: system
# time 0.5 s without it (3.2 s in one run of three), 0.3 s with it. In a 1 GiB download from S3
# the gain ranged from none to 0.5-1.0 s of system time from one hour to the next
# (bench/README.md). Writes to other files are not held up. The entry goes when the last thread
# writing that file lets go of it.
_WRITERS: weakref.WeakValueDictionary[str, threading.Lock] = weakref.WeakValueDictionary()
_WRITERS_GUARD = threading.Lock()


def _writer_lock(path: str) -> threading.Lock:
    with _WRITERS_GUARD:
        lock = _WRITERS.get(path)
        if lock is None:
            lock = _WRITERS[path] = threading.Lock()
        return lock


@functools.cache
def _host() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def _beside(path: str, suffix: str) -> str:
    """A name for bridge's own file beside ``path``: ``path`` + ``suffix`` while that fits in
    one path segment (NAME_MAX bytes), else a short digest of the name + ``suffix`` in the same
    folder, so that every name the pre-flight check lets through (up to NAME_MAX bytes itself)
    can be written through its temporary or partial file."""
    folder, _, name = path.rpartition("/")
    if len(os.fsencode(name)) + len(os.fsencode(suffix)) <= NAME_MAX:
        return path + suffix
    return f"{folder}/{hashlib.sha256(os.fsencode(name)).hexdigest()[:SHORT_NAME]}{suffix}"


def _temporary(path: str) -> str:
    """``path`` + TEMPORARY + writer pid . host . random: a later run tells a dead writer's
    leftovers (a killed run: removed) from a live one's (a concurrent run: kept)."""
    return _beside(path, f"{TEMPORARY}{os.getpid()}.{_host()}.{os.urandom(4).hex()}")


def _stale(dirpath: str, name: str) -> bool:
    fields = name.rpartition(TEMPORARY)[2].split(".")
    if len(fields) == 3 and fields[0].isdigit():
        if fields[1] != _host():
            return False   # another machine's writer (a shared filesystem): it may be alive
        try:
            os.kill(int(fields[0]), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False   # alive, another user's
        return False
    try:   # named by a bridge from before writers were recorded
        return time.time() - os.stat(os.path.join(dirpath, name)).st_mtime > OLD_TEMP_AGE
    except FileNotFoundError:
        return False


@contextmanager
def _translate(loc: Location):
    try:
        yield
    except OSError as exc:
        raise _bridge_error(loc, exc) from exc


def _bridge_error(loc: Location, exc: OSError) -> BridgeError:
    if isinstance(exc, FileNotFoundError):
        return ObjectNotFound(f"{loc}: no such file or directory")
    if isinstance(exc, PermissionError):
        return PermissionDenied(f"{loc}: permission denied")
    if isinstance(exc, IsADirectoryError):
        return BridgeError(f"{loc}: is a directory")
    if isinstance(exc, NotADirectoryError):
        return BridgeError(f"{loc}: a parent is a file, not a directory")
    if exc.errno == errno.ENOSPC:
        return BridgeError(f"{loc}: no space left on device")
    return BridgeError(f"{loc}: {exc.strerror or exc}")


def _pread_all(fd: int, offset: int, length: int, until_eof: bool) -> bytes:
    """``length`` bytes at ``offset`` (fewer at the end of the file); with ``until_eof``, on to
    the end of the file however long it has grown. A short read is not taken for the end: the
    end is a read that returns nothing."""
    pieces, got = [], 0
    while until_eof or got < length:
        data = os.pread(fd, max(length - got, 0) + (64 * 1024 if until_eof else 0), offset + got)
        if not data:
            break
        pieces.append(data)
        got += len(data)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _sorted_files(folder: str) -> Iterator[ObjectInfo]:
    """The regular files under ``folder`` in the order of their full paths (Store.walk's
    contract): each folder's entries sorted by name, a subfolder as its name and "/" (so "a-b"
    and "a.b" come before the folder "a", and "a0" after it), one folder's names held at a
    time. Links to files are followed; links to folders are not (as os.walk does)."""
    key = folder.strip("/")
    for _rel, info in _walk_files(folder, "", key + "/" if key else ""):
        yield info


def _walk_files(folder: str, rel: str, key: str, walking: bool = False,
                top: bool = True) -> Iterator[tuple[str, ObjectInfo]]:
    """(relative path, info) of the files under ``folder``, as _sorted_files lists them:
    ``rel`` is the folder's path relative to the walk's root and ``key`` its location key (both
    "" or ending in "/"), each file's built from them as the folders are entered. ``walking``:
    as Store.walk keeps them, bridge's reserved folder skipped at every depth and a file of its
    name at the ``top`` (``is_reserved``)."""
    with os.scandir(folder) as it:
        entries = sorted(((entry.name + "/" if _is_folder(entry) else entry.name), entry) for entry in it)
    listed = ObjectInfo.listed
    for name, entry in entries:
        if name.endswith("/"):
            if walking and name == RESERVED + "/":
                continue
            try:
                yield from _walk_files(entry.path, rel + name, key + name, walking, False)
            except (FileNotFoundError, NotADirectoryError, PermissionError):
                continue   # gone or closed since it was listed, as os.walk skips it
        elif (PARTIAL not in name and TEMPORARY not in name and not (walking and top and name == RESERVED)
              and entry.is_file()):
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue
            yield rel + name, listed(Location("file", "", key + name), st.st_size, _identity(st), st.st_mtime)


def filesystem_type(path: str, mounts: str = "/proc/mounts") -> str | None:
    """The type of the filesystem ``path`` lives on: the longest mount point that holds it."""
    real = os.path.realpath(path)
    best, kind = "", None
    try:
        with open(mounts) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


# Filesystems whose folders and inodes this machine's kernel reads from its own disks or memory:
# a walk of one is work for the CPU, not waiting. Any other (Lustre, NFS, GPFS, CephFS, a FUSE
# mount of a bucket...) or one not known answers a stat from a server.
LOCAL_FILESYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "ramfs", "zfs", "f2fs", "overlay",
                               "vfat", "exfat", "ntfs", "ntfs3", "reiserfs", "jfs", "squashfs", "iso9660",
                               "devtmpfs"})


def answered_here(path: str, mounts: str = "/proc/mounts") -> bool:
    """Whether a walk of ``path`` is answered by this machine's kernel from a local filesystem
    (``LOCAL_FILESYSTEMS``), rather than by a server; False where the type is not known."""
    return filesystem_type(path, mounts) in LOCAL_FILESYSTEMS


def _is_folder(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir() and not entry.is_symlink()
    except OSError:
        return False


class LocalStore(Store):
    scheme = "file"
    features = Features(min_part_size=1, max_part_size=64 * GiB, max_parts=1_000_000,
                        max_object_size=2**63 - 1, max_copy_size=2**63 - 1)

    def __init__(self, settings: Settings):
        self.settings = settings
        self._folders: set[str] = set()   # made (or found) by this store: no makedirs per file

    def list(self, prefix: Location) -> Iterator[ObjectInfo]:
        root = prefix.local_path
        if not os.path.isdir(root):
            if os.path.isfile(root.rstrip("/")):
                yield self.info(Location("file", "", prefix.key.rstrip("/")))
            return
        with _translate(prefix):
            yield from _sorted_files(root.rstrip("/") or "/")

    def walk(self, prefix: Location) -> Iterator[tuple[str, ObjectInfo]]:
        """Store.walk of a folder, in the same order with the same infos, each file's relative
        path built as the folders are entered (not cut from its location) and bridge's folders
        skipped whole: a third less time a file, which every local source of a copy, a pack or an
        adoption pays (tests/test_local_walk.py compares the two)."""
        root = prefix.as_prefix()
        folder = root.local_path.rstrip("/") or "/"
        if not os.path.isdir(folder):
            yield from super().walk(prefix)
            return
        with _translate(root):
            yield from _walk_files(folder, "", root.key, walking=True)

    def sizes(self, prefix: Location, only: Collection[str] | None = None,
              top_files: bool = True) -> Iterator[tuple[str, int]]:
        """(relative path, size) of the files ``walk`` lists under the folder ``prefix``, in no
        set order and without an ``ObjectInfo`` a file: for a plan that sorts its files itself
        and needs only their names and sizes (a pack's, bridge.packing.job), 20,000 files in
        about 0.07 s where the walk took 0.15-0.2 s. The same files (tests/test_local_walk.py):
        links to files followed, links to folders not, bridge's reserved folder skipped at every
        depth and a file of its name at the top, partial and temporary files left out. A share
        of them (bridge.pipeline.forkplan.sizes_split): with ``only``, of the top-level folders
        those it names ("name/") alone; without ``top_files``, none of the files at the top."""
        root = prefix.as_prefix()
        folders = [(root.local_path.rstrip("/") or "/", "")]
        with _translate(root):
            while folders:
                folder, rel = folders.pop()
                try:
                    found = os.scandir(folder)
                except (FileNotFoundError, NotADirectoryError, PermissionError):
                    if not rel:
                        raise
                    continue   # gone or closed since it was listed, as the walk skips it
                with found:
                    for entry in found:
                        name = entry.name
                        if _is_folder(entry):
                            if name != RESERVED and (rel or only is None or name + "/" in only):
                                folders.append((entry.path, rel + name + "/"))
                        elif (PARTIAL not in name and TEMPORARY not in name and (rel or (top_files and name != RESERVED))
                              and entry.is_file()):
                            try:
                                size = entry.stat().st_size
                            except FileNotFoundError:
                                continue
                            yield rel + name, size

    def list_level(self, prefix: Location) -> Iterator[ObjectInfo | Location]:
        """One scandir of the folder: its files, and its folders (not followed into)."""
        root = prefix.local_path.rstrip("/") or "/"
        if not os.path.isdir(root):
            yield from self.list(prefix)
            return
        with _translate(prefix), os.scandir(root) as it:
            entries = list(it)
        for entry in entries:
            if _is_folder(entry):
                yield Location("file", "", entry.path.lstrip("/") + "/")
            elif PARTIAL not in entry.name and TEMPORARY not in entry.name and entry.is_file():
                info = _entry_info(entry)
                if info is not None:
                    yield info

    def info(self, loc: Location) -> ObjectInfo:
        with _translate(loc):
            st = os.stat(loc.local_path)
        if not os.path.isfile(loc.local_path):
            raise ObjectNotFound(f"{loc}: not a regular file")
        return ObjectInfo(loc, st.st_size, identity=_identity(st), modified=st.st_mtime)

    def read(self, loc: Location, offset: int = 0, length: int | None = None) -> bytes:
        """By the descriptor (open, fstat, pread to the end, close): a file object's buffering,
        seek and size probes cost four times the CPU of reading a small file (0.60 s against
        0.15 s for 20,000 x 8 KiB, 2026-12-06), which a pack of small files pays per file."""
        try:   # (not _translate: a generator's context costs as much as the read of 8 KiB)
            fd = os.open(loc.local_path, os.O_RDONLY)
            try:
                if length is None:
                    return _pread_all(fd, offset, max(os.fstat(fd).st_size - offset, 0), True)
                return _pread_all(fd, offset, max(length, 0), False)
            finally:
                os.close(fd)
        except OSError as exc:
            raise _bridge_error(loc, exc) from exc

    def read_listed(self, root: Location, files: list[tuple[str, int]]) -> list[bytes]:
        """Each file by its path (open, one pread of its listed size and a byte more, close): no
        Location, fstat or loop per file unless a read comes up short. A pack of 20,000 x 8 KiB
        read through read() of each took 1.76-1.79 s of user CPU, 1.54-1.57 s so
        (bench/notes/adopt-pack.md). A name that is not a plain relative path is refused, as
        Location.join refuses it."""
        base = root.as_prefix().key
        out = []
        for rel, size in files:
            path = "/" + local_join(base, rel)
            try:
                fd = os.open(path, _READ)
                try:
                    data = os.pread(fd, size + 1, 0)
                    if len(data) < size:   # (a filesystem that answers in pieces: on to the end)
                        data += _pread_all(fd, len(data), 0, True)
                finally:
                    os.close(fd)
            except OSError as exc:
                raise _bridge_error(root.join(rel), exc) from exc
            out.append(data)
        return out

    def read_through(self, loc: Location, offset: int, length: int, buf: bytearray, each) -> int:
        """Read into ``buf`` a piece at a time (Store.read_through): a part of a big local file
        copied to another holds no more memory than the buffer, whatever the part's size."""
        with _translate(loc):
            fd = os.open(loc.local_path, os.O_RDONLY)
        try:
            view, pos = memoryview(buf), 0
            while pos < length:
                with _translate(loc):   # (not around each: the destination's errors are its own)
                    got = os.preadv(fd, [view[:min(len(view), length - pos)]], offset + pos)
                if not got:
                    break   # shorter than planned: the caller says so
                each(pos, view[:got])
                pos += got
            return pos
        finally:
            os.close(fd)

    def attributes(self, info: ObjectInfo) -> Attrs:
        """From the file's ``user.`` extended attributes (as rclone's local backend keeps
        metadata), its Content-Type guessed from its name when none is recorded."""
        path = info.location.local_path
        values: dict[str, bytes] = {}
        try:
            for name in os.listxattr(path):
                if name.startswith(attributes.XATTR):
                    values[name] = os.getxattr(path, name)
        except OSError as exc:
            if exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENODATA):
                with _translate(info.location):
                    raise
        return attributes.from_xattrs(values, info.location.name)

    def put(self, loc: Location, data: bytes, *, crc32c: str, metadata: dict[str, str],
            attrs: Attrs | None = None, durable: bool = True, sha256: str | None = None) -> ObjectInfo:
        """Write through a temporary name renamed into place. ``durable=False`` leaves the
        fsyncs of the file and of its folder to a later ``settle`` covering many files (one
        syncfs instead of two fsyncs each): the caller must settle before it records the file
        as written or commits anything naming it."""
        path = loc.local_path
        check_local_path(path)
        tmp = _temporary(path)
        folder = os.path.dirname(path)
        with _translate(loc):
            if folder not in self._folders:
                os.makedirs(folder, exist_ok=True)
                self._folders.add(folder)
            try:
                try:
                    fd = os.open(tmp, _CREATE, 0o666)
                except FileNotFoundError:   # removed since this store made it
                    os.makedirs(folder, exist_ok=True)
                    fd = os.open(tmp, _CREATE, 0o666)
                try:
                    _set_xattrs(fd, loc, attrs)
                    view, pos = memoryview(data), 0
                    while pos < len(view):
                        pos += os.write(fd, view[pos:])
                    if durable:
                        os.fsync(fd)  # the bytes are on disk before the name points at them
                finally:
                    os.close(fd)
                os.replace(tmp, path)
            except BaseException:
                _unlink_quietly(tmp)
                raise
            if durable:
                _fsync_dir(folder)  # and the rename itself survives a power loss
            return ObjectInfo(loc, len(data), identity=_identity(os.stat(path)))

    def settle(self, locations: Iterable[Location]) -> None:
        """Make files written with ``put(durable=False)`` durable, names included: one syncfs per
        filesystem they are on where the system has it (Linux), else an fsync of each file and
        of each folder."""
        paths = [loc.local_path for loc in locations]
        if not paths:
            return
        folders = {os.path.dirname(p) or "." for p in paths}
        with _translate(Location("file", "", next(iter(folders)).lstrip("/") + "/")):
            if _SYNCFS is not None:
                devices: dict[int, str] = {}
                for folder in folders:
                    devices.setdefault(os.stat(folder).st_dev, folder)
                for folder in devices.values():
                    _syncfs(folder)
                return
            for p in paths:
                _fsync_path(p, os.O_RDONLY)
            for folder in folders:
                _fsync_dir(folder)

    def copy_object(self, src: Location, dst: Location, *, size: int, attrs: Attrs | None = None) -> ObjectInfo:
        """copy_file_range: the kernel copies (or, on filesystems that share extents, such as
        XFS and Btrfs, reflinks) without the bytes entering this process; where it cannot
        (another filesystem, an old kernel) the bytes are copied by read and write."""
        path = dst.local_path
        check_local_path(path)
        tmp = _temporary(path)
        with _translate(dst):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            try:
                with open(src.local_path, "rb") as fin, open(tmp, "wb") as fout:
                    _set_xattrs(fout.fileno(), dst, attrs if attrs is not None
                                else self.attributes(ObjectInfo(src, size)))
                    _copy_range(fin.fileno(), fout.fileno(), size)
                    fout.flush()
                    os.fsync(fout.fileno())
                os.replace(tmp, path)
            except BaseException:
                _unlink_quietly(tmp)
                raise
            _fsync_dir(os.path.dirname(path))
            st = os.stat(path)
        if st.st_size != size:
            raise BridgeError(f"{src}: copied {st.st_size} bytes, planned {size}: the source changed")
        return ObjectInfo(dst, size, identity=_identity(st))

    def delete(self, loc: Location) -> None:
        check_local_path(loc.local_path)
        with _translate(loc):
            os.unlink(loc.local_path)

    def make_bucket(self, loc: Location) -> None:
        """A local 'bucket' is a folder: made with its parents; one already there is refused."""
        path = loc.local_path.rstrip("/") or "/"
        if os.path.lexists(path):
            from bridge.errors import BridgeError
            raise BridgeError(f"{path} already exists")
        with _translate(loc):
            os.makedirs(path)

    def check_bucket(self, loc: Location) -> None:
        return None  # local parents are created on demand

    # -- multipart: parts pwrite'd into one partial file -----------------------------------
    def _partial(self, loc: Location, upload_id: str) -> str:
        """``file.<upload id>.bridge-partial``, its sidecar that + ".parts"; for a name too long
        for that, a digest of the name stands for it, and the sidecar's first line names the
        file (``list_uploads`` reads it there)."""
        check_local_path(loc.local_path)  # every multipart write goes through here
        path = _beside(loc.local_path, f".{upload_id}{PARTIAL}{SIDECAR}")
        return path[: -len(SIDECAR)]

    def begin_upload(self, loc: Location, size: int, attrs: Attrs | None = None) -> str:
        upload_id = uuid.uuid4().hex[:12]
        path = self._partial(loc, upload_id)
        with _translate(loc):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.truncate(size)
            with open(path + SIDECAR, "w") as f:
                if not path.startswith(loc.local_path + "."):
                    f.write(json.dumps({"target": loc.name}) + "\n")
        return upload_id

    def upload_part(self, loc: Location, upload_id: str, number: int, offset: int, data: bytes,
                    crc32c: str, *, sha256: str | None = None) -> PartRecord:
        self.write_part(loc, upload_id, offset, lambda write: write(0, memoryview(data)))
        return self.record_part(loc, upload_id, number, offset, len(data), crc32c)

    def write_part(self, loc: Location, upload_id: str, offset: int, fill: Callable[[Callable], Any]) -> Any:
        """A part's bytes put into the partial file as ``fill(write)`` produces them:
        ``write(pos, view)`` puts ``view`` at ``offset + pos`` (so a part can be written piece by
        piece as it is received, and a retried request write its pieces again). Returns what
        ``fill`` returns. The part is not finished until ``record_part``."""
        path = self._partial(loc, upload_id)
        with _translate(loc):
            fd = os.open(path, os.O_WRONLY)

        written, lock = [0], _writer_lock(path)

        def write(pos: int, view: memoryview) -> None:
            with _translate(loc), lock:   # (only the file's errors: fill's own, the source's, pass as they are)
                done = 0
                while done < len(view):
                    done += os.pwrite(fd, view[done:], offset + pos + done)
            written[0] = max(written[0], pos + len(view))

        try:
            result = fill(write)
            _start_writeback(fd, offset, written[0])
            return result
        finally:
            os.close(fd)

    def record_part(self, loc: Location, upload_id: str, number: int, offset: int, size: int,
                    crc32c: str) -> PartRecord:
        """Part ``number``, written (write_part), recorded as finished in the upload's list."""
        record = PartRecord(number, size, crc32c, str(offset))
        with _translate(loc):
            with open(self._partial(loc, upload_id) + SIDECAR, "a") as f:  # O_APPEND: one line per write, safe across threads
                f.write(json.dumps(record.to_dict()) + "\n")
        return record

    def written_region(self, loc: Location, upload_id: str, offset: int, length: int) -> FileRegion:
        """A part written by upload_part, to be read back (hashed) from the partial file."""
        return FileRegion(self._partial(loc, upload_id), offset, length)

    def list_parts(self, loc: Location, upload_id: str) -> dict[int, PartRecord] | None:
        path = self._partial(loc, upload_id) + SIDECAR
        if not os.path.exists(path):
            return None
        parts: dict[int, PartRecord] = {}
        with open(path) as f:
            for line in f:
                if line.endswith("\n"):  # a line cut short by a kill is not a finished part
                    fields = json.loads(line)
                    if "target" in fields:
                        continue   # the header naming a long name's file
                    rec = PartRecord.from_dict(fields)
                    parts[rec.number] = rec
        return parts

    def complete_upload(self, loc: Location, upload_id: str, parts: list[PartRecord], *,
                        crc32c: str, metadata: dict[str, str], attrs: Attrs | None = None) -> ObjectInfo:
        """The partial file takes its name (and ``attrs`` as extended attributes); a file reports
        no checksum of its own."""
        path = self._partial(loc, upload_id)
        with _translate(loc):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                # Completed before (a run killed before it journaled so): the file in place is
                # the one this upload made if its size and CRC32C are those of the parts.
                if not _holds(loc.local_path, sum(p.size for p in parts), crc32c):
                    raise
            else:
                try:
                    _set_xattrs(fd, loc, attrs)
                    os.fsync(fd)  # every part's pwrite, before the file takes its final name
                finally:
                    os.close(fd)
                os.replace(path, loc.local_path)
                _fsync_dir(os.path.dirname(loc.local_path))
            _unlink_quietly(path + SIDECAR)
            st = os.stat(loc.local_path)
        return ObjectInfo(loc, st.st_size, identity=_identity(st))

    def abort_upload(self, loc: Location, upload_id: str) -> None:
        path = self._partial(loc, upload_id)
        _unlink_quietly(path)
        _unlink_quietly(path + SIDECAR)

    def clean_temporaries(self, folders: Iterable[Location]) -> int:
        """Remove the temporaries of whole-file writes whose writer died (a killed run) in these
        folders (not below them: a job cleans where it writes, not a whole tree); those of live
        writers stay. Returns how many went."""
        removed = 0
        for folder in folders:
            dirpath = folder.local_path.rstrip("/") or "/"
            try:
                names = os.listdir(dirpath)
            except (FileNotFoundError, NotADirectoryError):
                continue
            for name in names:
                if TEMPORARY in name and _stale(dirpath, name):
                    _unlink_quietly(os.path.join(dirpath, name))
                    removed += 1
        return removed

    def list_uploads(self, prefix: Location) -> Iterator[tuple[Location, str]]:
        root = prefix.local_path
        for dirpath, _dirs, filenames in os.walk(root):
            for name in filenames:
                if name.endswith(PARTIAL):
                    stem = name[: -len(PARTIAL)]
                    target, _, upload_id = stem.rpartition(".")
                    target = _long_target(os.path.join(dirpath, name)) or target
                    yield Location("file", "", os.path.join(dirpath, target).lstrip("/")), upload_id


def _long_target(partial: str) -> str | None:
    """The name a partial file stands for, from its sidecar's header (a name too long to carry
    it in the partial file's own name); None if it has none."""
    try:
        with open(partial + SIDECAR) as f:
            first = f.readline()
    except FileNotFoundError:
        return None
    if not first.endswith("\n"):
        return None
    try:
        header = json.loads(first)
    except ValueError:
        return None
    target = header.get("target") if isinstance(header, dict) else None
    return target if isinstance(target, str) and target and "/" not in target else None


def _set_xattrs(fd: int, loc: Location, attrs: Attrs | None) -> None:
    """``attrs`` as the file's ``user.`` extended attributes; a Content-Type that its name
    gives anyway is not written. A filesystem without them is an error when there is anything to
    keep (``--no-metadata`` keeps nothing)."""
    if attrs is None:
        return
    redundant = attrs.content_type is not None and attrs.content_type == attributes.guess_content_type(loc.name)
    for name, value in attributes.to_xattrs(attrs, content_type=not redundant).items():
        try:
            os.setxattr(fd, name, value)
        except OSError as exc:
            if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
                raise MetadataError(f"{loc}: this filesystem keeps no extended attributes, so the object's "
                                    f"headers and metadata ({name}) cannot be kept (--no-metadata drops them)") from exc
            raise MetadataError(f"{loc}: cannot keep {name} as an extended attribute: {exc.strerror}") from exc


def _copy_range(fd_in: int, fd_out: int, size: int) -> None:
    done = 0
    try:
        while done < size:
            n = os.copy_file_range(fd_in, fd_out, size - done)
            if n == 0:
                break
            done += n
        return
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM) or done:
            raise
    while chunk := os.read(fd_in, 8 * 1024 * 1024):
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd_out, view):]


def _fsync_dir(path: str) -> None:
    _fsync_path(path or ".", os.O_RDONLY | os.O_DIRECTORY)


def _fsync_path(path: str, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _load_syncfs():
    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (AttributeError, OSError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    return fn


_SYNCFS = _load_syncfs()


def _load_sync_file_range():
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint], ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _load_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """Start writing [offset, offset+length) of ``fd`` to disk without waiting for it
    (sync_file_range(2), Linux): the fsync before the file takes its name then waits only for
    the last parts, not for the whole file (0.36 s for 1 GiB here). Only a head start: the fsync
    is what makes the file durable, so where this is missing or fails nothing else changes."""
    if _SYNC_FILE_RANGE is not None and length:
        _SYNC_FILE_RANGE(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


def _syncfs(folder: str) -> None:
    """syncfs(2): every dirty page and name of the filesystem holding ``folder``, to disk; since
    Linux 5.8 it reports a writeback error any file there met."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _SYNCFS(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), folder)
    finally:
        os.close(fd)


def _entry_info(entry: os.DirEntry) -> ObjectInfo | None:
    """A listed file's info; None when it is gone since the folder was read."""
    try:
        st = entry.stat()
    except FileNotFoundError:
        return None
    return ObjectInfo.listed(Location("file", "", entry.path.lstrip("/")), st.st_size, _identity(st), st.st_mtime)


def _identity(st: os.stat_result) -> dict[str, str]:
    """The inode and its times. Writing a file changes its ctime, which, unlike the mtime,
    os.utime cannot set back: a rewrite in place that restores the mtime still shows."""
    return {"inode": str(st.st_ino), "size": str(st.st_size), "mtime_ns": str(st.st_mtime_ns),
            "ctime_ns": str(st.st_ctime_ns)}


def _holds(path: str, size: int, crc: str) -> bool:
    try:
        with open(path, "rb", buffering=0) as f:
            if os.fstat(f.fileno()).st_size != size:
                return False
            return digest(file_reader(f.fileno()), size, ("crc32c",), name=path)["crc32c"] == crc
    except (FileNotFoundError, ShortRead):   # gone, or cut short while read: not the upload's file
        return False


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
