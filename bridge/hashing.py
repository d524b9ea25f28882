"""Hashes as small values, CRC32C that combines across parts, the tree digest over part SHA-256s,
SHA-256 fed in part order (the plain whole-file digest, when asked for), and ``digest``: the one
loop that reads bytes in bounded pieces and feeds every hash asked for (adoption, hashsum, the
cache, the local store and re-reading a stored object all use it)."""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import hmac
import mmap
import os
import threading
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from bridge.errors import ObjectNotFound, TransferFailed

if TYPE_CHECKING:
    from bridge.stores.base import Store
    from bridge.urls import Location

_POLY = 0x82F63B78  # CRC32C (Castagnoli), reflected


def _crc32c_module():
    """The crc32c package's C extension (hardware CRC32C; takes any buffer, bytearray included),
    loaded without the package's ``__init__``: that one imports importlib.metadata and asks it
    for the package's version, a search of every folder on sys.path that cost ~30 ms of each
    short job's start. Registered under its own name, so that ``import crc32c`` elsewhere (gcsfs)
    finds the same module; the package itself where the extension is not where expected."""
    import importlib.machinery
    import importlib.util
    import sys
    name = "crc32c._crc32c"
    if name in sys.modules:
        return sys.modules[name]
    package = importlib.util.find_spec("crc32c")
    for folder in (package.submodule_search_locations or []) if package else []:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(folder, "_crc32c" + suffix)
            if os.path.exists(path):
                spec = importlib.util.spec_from_file_location(name, path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                sys.modules[name] = module
                return module
    import crc32c
    return crc32c


_crc32c = _crc32c_module()


def hmac_sha256(key: bytes, msg: bytes) -> bytes:
    """HMAC-SHA256 of a short message (a request's string to sign), computed holding the GIL.
    ``hmac.digest`` lets go of the GIL for every call, however short, and takes it back behind
    the other threads: signed in an event loop with files being written beside it, each request
    waited up to the interpreter's switch interval (5 ms a call against 3 us at rest, measured
    with one other busy thread). ``hmac.new`` keeps the GIL for messages under 2 KiB."""
    return hmac.new(key, msg, hashlib.sha256).digest()


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    return _crc32c.crc32c(data, value)


def crc_hex(value: int) -> str:
    return f"{value:08x}"


def _gf2_times(mat: tuple[int, ...], vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _gf2_square(mat: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(_gf2_times(mat, mat[n]) for n in range(32))


@lru_cache(maxsize=64)
def _shift_operator(length: int) -> tuple[int, ...]:
    """The GF(2) matrix that advances a CRC register over ``length`` zero bytes."""
    odd = (_POLY,) + tuple(1 << n for n in range(31))  # one zero bit
    even = _gf2_square(odd)          # two zero bits
    odd = _gf2_square(even)          # four zero bits
    result: tuple[int, ...] | None = None
    while True:
        even = _gf2_square(odd)      # first pass: one zero byte
        if length & 1:
            result = even if result is None else tuple(_gf2_times(even, result[n]) for n in range(32))
        length >>= 1
        if not length:
            break
        odd = _gf2_square(even)
        if length & 1:
            result = odd if result is None else tuple(_gf2_times(odd, result[n]) for n in range(32))
        length >>= 1
        if not length:
            break
    assert result is not None
    return result


def crc32c_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC32C of A+B from crc(A), crc(B) and len(B), as zlib's crc32_combine does."""
    if len2 == 0:
        return crc1
    return _gf2_times(_shift_operator(len2), crc1) ^ crc2


def combine_parts(parts: list[tuple[int, int]]) -> int:
    """Whole-object CRC32C from (crc, length) of consecutive parts."""
    total = 0
    for crc, length in parts:
        total = crc32c_combine(total, crc, length)
    return total


TREE = "sha256-tree"   # the name of the tree digest, as the manifest and the README give it
_TREE_PREFIX = b"mcbridge-sha256-tree-v1\n"


def sha256_tree(part_sha256: list[str], part_size: int) -> str:
    """The content identity of a file copied in parts, computable from the parts in parallel:
    SHA-256 of ``"mcbridge-sha256-tree-v1\\n"``, the part size as 8 bytes big-endian, then each
    part's raw 32-byte SHA-256 in order (parts are consecutive ``part_size`` byte ranges, the last
    one shorter). Equal bytes cut at another part size have another tree digest: the part size is
    part of the name the manifest records (``sha256-tree`` with its ``part_size``)."""
    digest = hashlib.sha256(_TREE_PREFIX + part_size.to_bytes(8, "big"))
    for part in part_sha256:
        digest.update(bytes.fromhex(part))
    return digest.hexdigest()


@dataclass(frozen=True)
class FileHash:
    size: int
    crc32c: str   # 8 lowercase hex digits
    sha256: str   # 64 lowercase hex digits

    @classmethod
    def of(cls, data: bytes) -> FileHash:
        return cls(len(data), crc_hex(crc32c(data)), hashlib.sha256(data).hexdigest())


class FileRegion:
    """Bytes already written to a local file, read back when their turn to be hashed comes: a
    part waiting for the parts before it then holds no memory."""

    CHUNK = 1024 * 1024

    def __init__(self, path: str, offset: int, length: int):
        self.path, self.offset, self.length = path, offset, length

    def update(self, digest) -> None:
        """Feed the region to ``digest`` straight from the page cache (a read-only mapping,
        populated in one go: no copy, no fault per page), or by reads where it cannot be mapped."""
        if not self.length:
            return
        start = self.offset - self.offset % mmap.ALLOCATIONGRANULARITY
        with open(self.path, "rb", buffering=0) as f:
            if os.fstat(f.fileno()).st_size < self.offset + self.length:
                raise TransferFailed(f"{self.path}: shorter than {self.offset + self.length} bytes: the "
                                     f"part at {self.offset} could not be read back to hash")
            try:
                mapped = mmap.mmap(f.fileno(), self.offset + self.length - start, prot=mmap.PROT_READ,
                                   flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), offset=start)
            except (OSError, ValueError):
                self._read(f, digest)
                return
            with mapped, memoryview(mapped) as view:
                digest.update(view[self.offset - start:])

    def _read(self, f, digest) -> None:
        buf = bytearray(min(self.CHUNK, self.length))
        view, done = memoryview(buf), 0
        f.seek(self.offset)
        while done < self.length:
            n = f.readinto(view[:min(len(buf), self.length - done)])
            if not n:
                raise TransferFailed(f"{self.path}: {done} of {self.length} bytes at {self.offset} "
                                     f"could be read back to hash")
            digest.update(view[:n])
            done += n


class NoWholeSha256:
    """Stands in for OrderedSha256 when the plain whole-file SHA-256 is not asked for: parts are
    hashed each on its own (in parallel) and nothing waits for the parts before it."""

    def expect(self, number: int) -> None:
        pass

    def feed(self, number: int, data) -> bool:
        return False

    def fail(self, exc: BaseException) -> None:
        pass

    def whole(self, parts: int) -> str | None:
        return None


NO_WHOLE_SHA256 = NoWholeSha256()


class OrderedSha256:
    """SHA-256 of a file whose parts arrive on several threads, in part order.

    A part that arrives before its turn is left here (``feed`` returns at once, its thread goes
    on to the next download) and hashed by whichever thread hashes the part before it; at most
    ``max_pending`` parts wait so in memory (then a feeding thread waits its turn: memory stays
    bounded). A part already written to a file (a FileRegion, which holds no memory) waits its
    turn when it is ``max_ahead`` or more parts after the next one to hash: its thread starts no
    other download until the hash has caught up. On a machine whose cores are all busy, the
    downloads otherwise take the CPU the one hashing thread needs, and the file's last parts are
    hashed after every byte has arrived. A 1 GiB download from S3 on this 2-core machine, median
    of 6: 1.89 s without the window, 1.77-1.81 s with one of 2-4 parts (bench/README.md).
    Threads run parts in order (a FIFO pool), so the next part is always running when a later
    one waits for it.
    The digest is only ever updated outside the lock, by one thread at a time. Parts are only
    waited for if this process will run them (``expect``): when the one before runs elsewhere
    (another worker) or was not read (a resumed copy skipped it), there is no whole-file digest
    here and nobody waits.
    """

    def __init__(self, next_part: int = 1, max_pending: int = 8, max_ahead: int = 4):
        self._hash = hashlib.sha256()
        self._next = next_part
        self._cond = threading.Condition()
        self._failed: BaseException | None = None
        self._gap = next_part != 1   # a part not fed: the digest is not the file's
        self._expected: set[int] = set()
        self._pending: dict[int, bytes | bytearray | memoryview | FileRegion] = {}
        self._held = 0               # pending parts held in memory (not FileRegions)
        self._max_pending = max(1, max_pending)
        self._max_ahead = max(1, max_ahead)
        self._hashing = False        # a thread is hashing (outside the lock)

    def expect(self, number: int) -> None:
        """Part ``number`` will be fed by this process (called before it is started)."""
        with self._cond:
            self._expected.add(number)

    def _stalled(self) -> bool:
        """The next part will never be fed here: no whole-file digest (frees what waits)."""
        if not self._gap and not self._hashing and self._next not in self._expected:
            self._drop()
        return self._gap

    def _drop(self) -> None:
        self._gap = True
        self._pending.clear()
        self._held = 0

    def feed(self, number: int, data: bytes | bytearray | memoryview | FileRegion | None) -> bool:
        """Part ``number``'s bytes, hashed after the parts before it (here or later, by another
        thread: ``data`` must not change afterwards); ``None``: the part was not read (a resumed
        copy skipped it), which leaves no whole-file digest. Returns whether the part is taken
        into the whole-file digest (as far as is known now: see ``whole``)."""
        with self._cond:
            while (number != self._next and self._failed is None
                   and (number - self._next >= self._max_ahead if isinstance(data, FileRegion)
                        else self._held >= self._max_pending)
                   and not self._stalled()):
                self._cond.wait(timeout=1.0)
            if self._failed is not None:
                raise TransferFailed(f"part {number} not hashed: an earlier part of this file failed "
                                     f"({self._failed})") from self._failed
            if data is None:
                self._drop()
            if number != self._next and not self._gap:
                self._stalled()
            if self._gap:
                if number == self._next:
                    self._next += 1
                self._cond.notify_all()
                return False
            self._pending[number] = data
            self._held += not isinstance(data, FileRegion)
            if self._hashing or number != self._next:
                return True   # the thread hashing now, or the one feeding the next part, takes it
            self._hashing = True
        self._drain()
        return True

    def _drain(self) -> None:
        """Hash the pending parts that are next in turn, one after the other."""
        while True:
            with self._cond:
                data = None if self._gap or self._failed else self._pending.get(self._next)
                if data is None:
                    self._hashing = False
                    self._cond.notify_all()
                    return
            try:   # outside the lock: others leave their parts meanwhile
                if isinstance(data, FileRegion):
                    data.update(self._hash)
                else:
                    self._hash.update(data)
            except BaseException as exc:
                with self._cond:
                    self._hashing = False
                self.fail(exc)
                raise
            with self._cond:
                if self._pending.pop(self._next, None) is not None:   # (gone if the file failed meanwhile)
                    self._held -= not isinstance(data, FileRegion)
                self._next += 1
                self._cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        with self._cond:
            self._failed = exc
            self._pending.clear()
            self._held = 0
            self._cond.notify_all()

    def whole(self, parts: int) -> str | None:
        """The file's SHA-256 when all ``parts`` were fed here and hashed in order, else None;
        waits for the parts still being hashed."""
        with self._cond:
            while self._hashing and self._failed is None:
                self._cond.wait(timeout=1.0)
            return None if self._gap or self._next != parts + 1 else self._hash.hexdigest()


# Re-reading a stored object to hash it: used by verify, by sync's repair and by a store's own
# read-back check, so it lives below both the stores and check.
READ_SIZE = 16 * 1024 * 1024

Read = Callable[[int, int], "bytes | bytearray | memoryview"]   # (offset, length) -> those bytes


class ShortRead(ObjectNotFound):
    """The bytes ended before the size they were listed with: the object was removed, cut short
    or rewritten while it was being read."""


class _Crc:
    """CRC32C or CRC32 behind hashlib's ``update`` / ``hexdigest``, so that ``digest`` feeds
    every algorithm the same way."""

    def __init__(self, step: Callable[[bytes | bytearray | memoryview, int], int]):
        self._step, self._value = step, 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self._value = self._step(data, self._value)

    def hexdigest(self) -> str:
        return crc_hex(self._value)


def _hasher(name: str):
    if name == "crc32c":
        return _Crc(crc32c)
    if name == "crc32":
        return _Crc(zlib.crc32)
    return hashlib.new(name)   # md5, sha256, ...: hashlib's names


def digest_bytes(data: bytes, algorithm: str) -> str:
    """``digest``'s hex of bytes in memory, for one algorithm."""
    if algorithm == "crc32c":
        return crc_hex(crc32c(data))
    if algorithm == "crc32":
        return crc_hex(zlib.crc32(data))
    made = _MAKERS.get(algorithm)
    return (made(data) if made else hashlib.new(algorithm, data)).hexdigest()


_MAKERS = {"md5": hashlib.md5, "sha256": hashlib.sha256}   # hashlib.new's lookup costs more than 8 KiB's MD5


def read_small(path: str, size: int) -> bytes | None:
    """A small local file's bytes in one ``os.read``, when it holds exactly ``size`` of them;
    None otherwise, or on any error (the store's read then says what is wrong, as for any file).
    Python's buffered ``open`` cost more than hashing 8 KiB: adopting 20,000 files spent a tenth
    of its time opening them."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        data = os.read(fd, size + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) == size else None


def small_files(files: list[tuple[str, int]]) -> list[tuple[str, str, str] | None]:
    """(CRC32C, MD5, SHA-256) of each small local file (path, listed size), each read once
    (``read_small``); None for one that cannot be read as listed. What a process of adoption's
    pool (bridge/adopt.py ``Prefetch``) runs."""
    out: list[tuple[str, str, str] | None] = []
    for path, size in files:
        data = read_small(path, size)
        out.append(None if data is None else
                   (crc_hex(crc32c(data)), hashlib.md5(data).hexdigest(), hashlib.sha256(data).hexdigest()))
    return out


def digest(read: Read, size: int, algorithms: Iterable[str], *, name: str = "",
           piece: int = READ_SIZE) -> dict[str, str]:
    """``{algorithm: hex}`` of the ``size`` bytes ``read(offset, length)`` gives, in one pass of
    reads of at most ``piece`` bytes (memory stays bounded, however big the object); an
    algorithm is ``crc32c``, ``crc32`` or one of hashlib's names. A read that comes back empty
    before ``size`` raises ShortRead (``name`` says what was read): a hash of fewer bytes would
    be the hash of another object."""
    hashers = {algorithm: _hasher(algorithm) for algorithm in dict.fromkeys(algorithms)}
    offset = 0
    while offset < size:
        data = read(offset, min(piece, size - offset))
        if not data:
            raise ShortRead(f"{name or 'the object'}: read {offset} bytes of {size}")
        for hasher in hashers.values():
            hasher.update(data)
        offset += len(data)
    return {algorithm: hasher.hexdigest() for algorithm, hasher in hashers.items()}


def reader(store: Store, loc: Location) -> Read:
    """``digest``'s ``read`` for an object in a store: ranged reads of ``loc``."""
    return lambda offset, length: store.read(loc, offset, length)


def file_reader(fd: int) -> Read:
    """``digest``'s ``read`` for an open local file: positional reads into one buffer, reused
    from read to read (``digest`` is done with a piece before it asks for the next; a new
    buffer per piece cost a 256 MiB file's CRC32C a third more time)."""
    buf = bytearray()

    def read(offset: int, length: int) -> memoryview:
        if len(buf) < length:
            buf.extend(bytes(length - len(buf)))
        n = os.preadv(fd, [memoryview(buf)[:length]], offset)
        return memoryview(buf)[:n]
    return read


def rehash(store: Store, loc: Location, size: int, sha: bool = True) -> tuple[str, str]:
    """(crc32c, sha256) of an object, read in bounded ranges; sha256 is "" without ``sha``."""
    sums = digest(reader(store, loc), size, ("crc32c", "sha256") if sha else ("crc32c",), name=str(loc))
    return sums["crc32c"], sums.get("sha256", "")


def _rehash_range(store: Store, loc: Location, offset: int, length: int, size: int, whole=None) -> tuple[int, str]:
    """(crc32c, sha256) of bytes [offset, offset+length) of an object, fed to ``whole`` too."""
    crc, part, end = 0, hashlib.sha256(), offset + length
    while offset < end:
        data = store.read(loc, offset, min(READ_SIZE, end - offset))
        if not data:
            raise ObjectNotFound(f"{loc}: read {offset} bytes of {size}")
        crc = crc32c(data, crc)
        part.update(data)
        if whole is not None:
            whole.update(data)
        offset += len(data)
    return crc, part.hexdigest()


PART_READERS = 8   # parts re-read at once by deep checks, across the process
# Shared by every object re-read in parallel (verify checks several files at once): at most
# PART_READERS reads of READ_SIZE in memory from them, however many files are being checked.
_PART_READS = threading.BoundedSemaphore(PART_READERS)


def _rehash_part(store: Store, loc: Location, offset: int, length: int, size: int) -> tuple[int, str]:
    with _PART_READS:
        return _rehash_range(store, loc, offset, length, size)


def rehash_parts(store: Store, loc: Location, size: int, part_size: int,
                 whole: bool = True) -> tuple[str, str, list[str]]:
    """(crc32c, sha256, [sha256 of each part]) of an object read in bounded ranges. With
    ``whole``, in one pass in order (one SHA-256 stream cannot be split); without it, the parts
    are read and hashed in parallel, the CRC32C combined from theirs, and sha256 is ""."""
    ranges = [(offset, min(part_size, size - offset)) for offset in range(0, size, part_size)]
    if not ranges:
        return crc_hex(0), hashlib.sha256().hexdigest() if whole else "", []
    if whole:
        digest = hashlib.sha256()
        done = [_rehash_range(store, loc, offset, length, size, digest) for offset, length in ranges]
        sha = digest.hexdigest()
    else:
        workers = min(PART_READERS, len(ranges))
        if workers == 1:
            done = [_rehash_range(store, loc, *ranges[0], size)]
        else:
            with cf.ThreadPoolExecutor(workers, thread_name_prefix="rehash") as pool:
                done = list(pool.map(lambda r: _rehash_part(store, loc, *r, size), ranges))
        sha = ""
    crc = combine_parts([(c, length) for (c, _), (_, length) in zip(done, ranges)])
    return crc_hex(crc), sha, [p for _, p in done]
