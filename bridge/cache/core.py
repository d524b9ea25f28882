"""The cache directory and what happens in it. Layout (``cache.dir``, ``MCBRIDGE_CACHE_DIR``)::

    objects/ab/<key>        a finished entry: the object's bytes, only ever put there by rename
    objects/ab/<key>.json   what the entry is (URL, identity, size, CRC32C, SHA-256); its mtime
                            is the entry's last use, which LRU eviction reads
    fills/<key>/            one fill at work: ``reserve`` (bytes it will take), the engine's
                            journal and partial file; resumed by the next filler after a kill
    locks/<key>.lock        held (flock) by whoever fills, evicts or verifies <key>
    pins/<url hash>.json    a pin: {"url", "until"} (until: epoch seconds, or null for ever)
    quota.lock              held while usage is counted and entries evicted
    stats.json              hits, misses, bytes filled, evictions, fill time (under stats.lock)

``key`` = SHA-256 of the URL and the object's identity (ETag and version id, generation,
last-modified, inode and times: bridge.stores.base.ObjectInfo.identity) as the store reports it
now: a rewritten object has a new key, and the old entry is never served for it.

A fill is one copy job of the engine (bridge/pipeline/: the same parallel ranged reads and
part files as ``mcbridge cp`` to a local path) into ``fills/<key>/``, then checked (size, the
CRC32C of the bytes on disk against the CRC32C the engine computed while reading, and against
the CRC32C the store reports where it reports one) and renamed into ``objects/``.

Every name below the root is opened relative to its parent's descriptor and never through a
link (bridge/cache/safedir.py): a link planted anywhere in the cache, or a name owned by another
user outside a group cache, is refused with one line. The engine writes a fill through
``/proc/self/fd/N``, the fill's directory as opened, so renaming a link into its place does not
move the fill's writes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import time
import weakref
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISDIR
from typing import Any

from bridge import filters as filtering
from bridge.filters import Filters
from bridge.cache import locks, safedir, striping
from bridge.cache.safedir import UnsafeCache
from bridge.config import Settings
from bridge import manifest as manifests
from bridge.contracts import FilePlan
from bridge.pipeline.plan import Plan, part_size_for
from bridge.errors import BridgeError, IntegrityError, InvalidOption, ObjectNotFound, TransferFailed
from bridge import hashing
from bridge.manifest import FileEntry
from bridge.progress import Progress
from bridge.stores import get_store
from bridge.stores.base import MiB, ObjectInfo, identity_changed
from bridge.urls import Location, parse

READ_SIZE = 8 * MiB
DATA = "data"
COUNTERS = ("hits", "misses", "waits", "fills", "bytes_filled", "fill_seconds", "evictions",
            "bytes_evicted", "corrupted", "bytes_hit")


STALE_FILL_AGE = 3600   # seconds: a dead filler's directory, untouched this long, is removed
SUBDIRS = ("objects", "fills", "locks", "pins")


class CacheFull(BridgeError):
    """An object cannot fit: what is pinned or being filled leaves no room under the quota."""


@dataclass(frozen=True)
class Entry:
    key: str
    url: str
    size: int
    last_used: float
    meta: dict[str, Any]


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def entry_key(url: str, identity: dict[str, str]) -> str:
    return _sha(json.dumps([url, sorted(identity.items())], separators=(",", ":")))


def url_hash(url: str) -> str:
    return _sha(url)[:32]


def store_crc32c(info: ObjectInfo) -> str | None:
    """The CRC32C the store vouches for: its own (S3 full-object, GCS), or the one bridge wrote
    into the object's metadata when it uploaded it (Azure keeps none of its own)."""
    return info.checksums.get("crc32c") or info.metadata.get("bridge_crc32c")


def source_location(url: str | Location) -> Location:
    """``parse(url)``, except that a cloud object's key may hold empty segments (``a//b``): the
    cache only reads such an object and never makes a local name of its key."""
    return url if isinstance(url, Location) else parse(url, empty_segments=True)


def file_hashes(path: Path | int, sha: bool = True) -> tuple[int, str, str]:
    """(size, crc32c, sha256) of a local file (a path, or an fd this call closes), read in
    bounded chunks; sha256 is "" without ``sha``."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        sums = hashing.digest(hashing.file_reader(f.fileno()), size,
                              ("crc32c", "sha256") if sha else ("crc32c",), name=f"cached file {path}", piece=READ_SIZE)
    return size, sums["crc32c"], sums.get("sha256", "")


def _close_folders(dirs: dict[str, int], safe: safedir.Root) -> None:
    for fd in dirs.values():
        os.close(fd)
    dirs.clear()
    safe.close()


class Cache:
    def __init__(self, settings: Settings, directory: str | os.PathLike | None = None):
        # A fill's record is the cache's own, inside its work folder (published or removed with
        # it): never in a manifest folder (--manifest-dir), where nothing would remove it.
        if settings.transfer.manifest_dir:
            settings = settings.model_copy(update={"transfer": settings.transfer.model_copy(
                update={"manifest_dir": None})})
        self.settings = settings
        self.conf = settings.cache
        root = directory or self.conf.dir
        if not root:
            raise InvalidOption("no cache directory: set MCBRIDGE_CACHE_DIR or cache.dir in the settings file")
        self.root = Path(root).expanduser().absolute()
        self._dirs: dict[str, int] = {}
        self.safe = safedir.Root(self.root)
        # Its folders are closed by close(), when the cache is collected, or at exit while the
        # interpreter is whole (a __del__ run late in shutdown found ``os`` gone and printed
        # "Exception ignored in Cache.__del__" after a script that filled it).
        self._release = weakref.finalize(self, _close_folders, self._dirs, self.safe)
        try:
            for sub in SUBDIRS:
                self._dirs[sub] = self.safe.opendir(self.safe.fd, sub, self.root / sub, create=True)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._release()

    # -- names ------------------------------------------------------------------------------
    def data_path(self, key: str) -> Path:
        return self.root / "objects" / key[:2] / key

    def meta_path(self, key: str) -> Path:
        return self.root / "objects" / key[:2] / f"{key}.json"

    def lock_path(self, key: str) -> str:
        return str(self.root / "locks" / f"{key}.lock")

    def fill_dir(self, key: str) -> Path:
        return self.root / "fills" / key

    def pin_path(self, url: str) -> Path:
        return self.root / "pins" / f"{url_hash(url)}.json"

    # -- descriptors: every name below the root is reached through them -----------------------
    def _objdir(self, key: str, create: bool = False):
        return self.safe.directory(self._dirs["objects"], key[:2], self.root / "objects" / key[:2], create)

    def _fill_fd(self, key: str, create: bool = False):
        return self.safe.directory(self._dirs["fills"], key, self.fill_dir(key), create)

    def _lock(self, key: str, *, blocking: bool = True) -> int | None:
        name, folder = f"{key}.lock", self._dirs["locks"]
        return locks.acquire(name, blocking=blocking, dir_fd=folder, opener=lambda: self.safe.open(
            folder, name, self.root / "locks" / name, os.O_RDWR | os.O_CREAT))

    def _root_lock(self, name: str):
        return locks.held(name, dir_fd=self.safe.fd, opener=lambda: self.safe.open(
            self.safe.fd, name, self.root / name, os.O_RDWR | os.O_CREAT))

    def _remove_fill(self, name: str) -> None:
        shutil.rmtree(name, dir_fd=self._dirs["fills"], ignore_errors=True)   # fd-relative: no link is followed

    # -- reading ------------------------------------------------------------------------------
    def locate(self, url: str | Location) -> tuple[Location, ObjectInfo, str]:
        """The object behind ``url`` as its store describes it now, and its entry's key."""
        loc = source_location(url)
        if loc.is_prefix:
            raise InvalidOption(f"{url} names a prefix or directory; the cache holds single objects "
                                f"(cache warm takes prefixes)")
        store = get_store(loc, self.settings)
        info = store.info(loc)
        sums = {f"checksum_{name}": value for name, value in info.checksums.items()}
        return loc, info, entry_key(str(loc), {**info.identity, **sums})

    def fetch(self, url: str, progress: Progress | None = None) -> Path:
        """The local path of ``url``'s current version, filled first if no entry holds it. When
        another process (or node) is filling it, waits for that fill and takes its result."""
        return self._get(url, progress)[0]

    def _get(self, url: str, progress: Progress | None = None) -> tuple[Path, str, int]:
        """(path, "hit" | "waited" | "filled", size)."""
        key, outcome, size = self._obtain(url, progress)
        return self.data_path(key), outcome, size

    def _obtain(self, url: str, progress: Progress | None = None) -> tuple[str, str, int]:
        """(key, "hit" | "waited" | "filled", size)."""
        loc, info, key = self.locate(url)
        if self._hit(key):
            self._count(hits=1, bytes_hit=info.size)
            return key, "hit", info.size
        fd = self._lock(key)
        try:
            if self._hit(key):
                self._count(hits=1, waits=1, bytes_hit=info.size)
                return key, "waited", info.size
            self._fill(key, loc, info, progress)
            return key, "filled", info.size
        finally:
            locks.release(fd)

    def _hit(self, key: str) -> bool:
        meta = f"{key}.json"
        try:
            with self._objdir(key) as folder:
                if self.safe.lstat(folder, key, self.data_path(key), want_dir=False) is None or \
                        self.safe.lstat(folder, meta, self.meta_path(key), want_dir=False) is None:
                    return False
                try:
                    os.utime(meta, dir_fd=folder, follow_symlinks=False)   # the entry's last use, for LRU
                except FileNotFoundError:
                    return False   # evicted between the two calls
                except PermissionError:
                    pass   # another user's entry in a shared cache: served, its recency left as it was
                return self.safe.lstat(folder, key, self.data_path(key), want_dir=False) is not None
        except FileNotFoundError:
            return False   # no entry in this shard yet

    def open(self, url: str):
        """An open binary file of ``url``'s bytes: once open, an eviction cannot take it away."""
        for _ in range(3):
            key, _outcome, _size = self._obtain(url)
            try:
                with self._objdir(key) as folder:
                    return os.fdopen(self.safe.open(folder, key, self.data_path(key), os.O_RDONLY), "rb")
            except FileNotFoundError:
                continue   # evicted between fetch and open: fill again
        raise BridgeError(f"{url}: evicted again and again before it could be opened; raise the cache quota")

    # -- filling --------------------------------------------------------------------------
    def _fill(self, key: str, loc: Location, info: ObjectInfo, progress: Progress | None) -> None:
        """Called holding the entry's lock. The copy is ``mcbridge cp``'s own (bridge.pipeline.execute: the
        engine's parallel ranged reads, journal and manifest), into the fill's directory, with
        the journal kept there: a filler killed mid-way leaves it, and the next one resumes it."""
        from bridge.pipeline import execute as executor
        started = time.monotonic()
        shown = self.fill_dir(key)
        fresh = self.safe.lstat(self._dirs["fills"], key, shown, want_dir=True) is None
        self._reserve(key, info.size)
        with self._fill_fd(key) as work_fd:
            if fresh:
                striping.stripe(str(shown), info.size, self.conf)
                self._same(key, work_fd)   # lfs takes a path: the name must still be this directory
            else:
                self.safe.check_tree(work_fd, shown)   # what a dead filler left, before resuming it
            work = Path(safedir.fd_path(work_fd, shown))
            local = get_store("file", self.settings)
            target = Location("file", "", str(work).lstrip("/") + "/")
            plan = Plan(str(loc), str(target), str(loc),
                        [FilePlan(DATA, info.size, part_size_for(info.size, local, self.settings.transfer.chunk_size),
                                  dict(info.identity))], key=f"cache-{key[:20]}")
            try:
                executor.execute(plan, self.settings, progress, state_dir=work)
            except TransferFailed as exc:
                raise TransferFailed(f"filling the cache from {loc} failed: {exc}") from exc
            manifest = manifests.read(local, target)
            done = manifest.files.get(DATA) if manifest else None
            try:
                self._check(work_fd, shown, loc, info, done)
            except IntegrityError:
                self._remove_fill(key)   # wrong bytes are not worth resuming
                raise
            meta = {"url": str(loc), "identity": info.identity, "size": info.size, "crc32c": done.crc32c,
                    "sha256": done.sha256, "store_crc32c": store_crc32c(info),
                    "filled_at": time.time(), "fill_seconds": round(time.monotonic() - started, 3)}
            self._publish(key, work_fd, meta)
        self._remove_fill(key)
        self._count(misses=1, fills=1, bytes_filled=info.size, fill_seconds=meta["fill_seconds"])

    def _same(self, key: str, work_fd: int) -> None:
        st = os.stat(key, dir_fd=self._dirs["fills"], follow_symlinks=False)
        if not os.path.samestat(st, os.fstat(work_fd)):
            self.safe.check(st, self.fill_dir(key), want_dir=True)
            raise UnsafeCache(f"refusing the cache: {self.fill_dir(key)} was replaced while it was being filled")

    def _check(self, work_fd: int, shown: Path, loc: Location, info: ObjectInfo, done: FileEntry | None) -> None:
        """Before publishing: the size, the CRC32C of the bytes on disk against the one computed
        while reading and the one the store reports, and the object still being that version."""
        if not done:
            raise TransferFailed(f"filling the cache from {loc}: the copy finished without a record of its file")
        size, on_disk, _ = file_hashes(self.safe.open(work_fd, DATA, shown / DATA, os.O_RDONLY), sha=False)
        if size != info.size:
            raise IntegrityError(f"{loc}: {size} bytes cached, the store says {info.size}")
        if on_disk != done.crc32c:
            raise IntegrityError(f"{loc}: CRC32C {on_disk} on disk, {done.crc32c} read from the store")
        reported = store_crc32c(info)
        if reported and reported != on_disk:
            raise IntegrityError(f"{loc}: CRC32C {on_disk} read, the store reports {reported}")
        now = get_store(loc, self.settings).info(loc)   # ranged reads could mix two versions
        if identity_changed(info.identity, now.identity) or now.size != info.size:
            raise IntegrityError(f"{loc} was rewritten while it was being cached; nothing was kept, ask again")

    def _publish(self, key: str, work_fd: int, meta: dict) -> None:
        with self._objdir(key, create=True) as folder:
            self.safe.write_atomic(folder, f"{key}.json", self.meta_path(key), json.dumps(meta).encode())
            os.replace(DATA, key, src_dir_fd=work_fd, dst_dir_fd=folder)
            os.fsync(folder)

    # -- quota ------------------------------------------------------------------------------
    def _reserve(self, key: str, size: int) -> None:
        """Make room for ``size`` more bytes (called holding ``key``'s lock) and record them as
        this fill's, so that fills running at once never count the same free space twice."""
        quota = self.conf.quota
        with self._root_lock("quota.lock"):
            live, dead = self._fills(exclude=key)
            if quota is not None:
                entries = self.entries()
                used = sum(e.size for e in entries) + live + sum(n for _, n in dead)
                if used + size > self.conf.high_watermark * quota:
                    used -= self._remove_fills(dead)   # a dead filler's bytes go before anyone's entry
                    target = self.conf.low_watermark * quota
                    if used + size > target:
                        used -= self._evict_lru(entries, used + size - target)
                if used + size > quota:
                    raise CacheFull(f"cache full: {size} bytes do not fit under the quota of {quota} bytes; "
                                    f"{used} bytes are pinned, in use or being filled ({self.root})")
            with self._fill_fd(key, create=True) as work:
                self.safe.write_atomic(work, "reserve", self.fill_dir(key) / "reserve", str(size).encode(),
                                       durable=False)

    def _reserved(self, work: int, shown: Path) -> int:
        try:
            return int(self.safe.read(work, "reserve", shown / "reserve") or 0)
        except (FileNotFoundError, ValueError):
            return 0   # being created right now: its filler waits for quota.lock, which we hold

    def _last_change(self, work: int, shown: Path) -> float:
        return max([os.fstat(work).st_mtime, *(st.st_mtime for _name, st in self.safe.scan(work, shown))])

    def _fills(self, exclude: str = "", *, sweep_all: bool = False) -> tuple[int, list[tuple[str, int]]]:
        """(bytes reserved by fills at work, [(name, bytes) of fills nobody runs]). A dead
        filler's directory is kept for the next reader of its object to resume, until it is older
        than STALE_FILL_AGE, room is needed, or ``sweep_all``."""
        live, dead = 0, []
        for name, _st in list(self.safe.scan(self._dirs["fills"], self.root / "fills")):
            if name == exclude:
                continue
            try:
                with self._fill_fd(name) as work:
                    reserved = self._reserved(work, self.fill_dir(name))
                    fd = self._lock(name, blocking=False)
                    if fd is None:
                        live += reserved
                        continue
                    try:
                        stale = sweep_all or time.time() - self._last_change(work, self.fill_dir(name)) > STALE_FILL_AGE
                    except BaseException:
                        locks.release(fd)
                        raise
            except FileNotFoundError:
                continue   # finished and removed meanwhile
            try:
                if stale:
                    self._remove_fill(name)
                else:
                    dead.append((name, reserved))
            finally:
                locks.release(fd)
        return live, dead

    def _remove_fills(self, dead: list[tuple[str, int]]) -> int:
        freed = 0
        for name, reserved in dead:
            fd = self._lock(name, blocking=False)
            if fd is None:
                continue   # its object's next reader has just taken it over
            try:
                self._remove_fill(name)
                freed += reserved
            finally:
                locks.release(fd)
        return freed

    def _evict_lru(self, entries: list[Entry], wanted: float) -> int:
        freed = 0
        pinned = self.pinned()
        for entry in sorted(entries, key=lambda e: e.last_used):
            if freed >= wanted:
                break
            if url_hash(entry.url) in pinned:
                continue
            if self._remove(entry.key):
                freed += entry.size
                self._count(evictions=1, bytes_evicted=entry.size)
        return freed

    def _remove(self, key: str, *, wait: bool = False) -> bool:
        """Remove an entry unless someone holds its lock (filling or verifying it)."""
        fd = self._lock(key, blocking=wait)
        if fd is None:
            return False
        try:
            try:
                with self._objdir(key) as folder:
                    existed = self.safe.lstat(folder, key, self.data_path(key), want_dir=False) is not None
                    self.safe.lstat(folder, f"{key}.json", self.meta_path(key), want_dir=False)
                    safedir.unlink(folder, key)
                    safedir.unlink(folder, f"{key}.json")
            except FileNotFoundError:
                existed = False
            locks.remove_held(f"{key}.lock", dir_fd=self._dirs["locks"])
            return existed
        finally:
            locks.release(fd)

    # -- entries, pins ----------------------------------------------------------------------
    def entries(self) -> list[Entry]:
        out = []
        objects = self._dirs["objects"]
        for shard, st in list(self.safe.scan(objects, self.root / "objects")):
            if not S_ISDIR(st.st_mode):
                continue
            shown = self.root / "objects" / shard
            with self.safe.directory(objects, shard, shown) as folder:
                for name, meta_st in list(self.safe.scan(folder, shown)):
                    if not name.endswith(".json"):
                        continue
                    key = name[:-len(".json")]
                    try:
                        meta = json.loads(self.safe.read(folder, name, shown / name))
                        if self.safe.lstat(folder, key, shown / key, want_dir=False) is None:
                            continue   # a meta whose data a killed publish never renamed: overwritten by the next fill
                        out.append(Entry(key, meta["url"], int(meta["size"]), meta_st.st_mtime, meta))
                    except (FileNotFoundError, ValueError, KeyError, TypeError):
                        continue
        return out

    def usage(self) -> int:
        return sum(e.size for e in self.entries())

    def pin(self, url: str, ttl: float | None = None) -> Path:
        path = self.fetch(url)
        canonical = str(source_location(url))
        until = time.time() + ttl if ttl else None
        self.safe.write_atomic(self._dirs["pins"], f"{url_hash(canonical)}.json", self.pin_path(canonical),
                               json.dumps({"url": canonical, "until": until}).encode())
        return path

    def unpin(self, url: str) -> bool:
        canonical = str(source_location(url))
        name = f"{url_hash(canonical)}.json"
        self.safe.lstat(self._dirs["pins"], name, self.pin_path(canonical), want_dir=False)
        return safedir.unlink(self._dirs["pins"], name)

    def pins(self) -> dict[str, dict]:
        """url hash -> pin record, for pins not expired (expired ones are removed)."""
        out, now = {}, time.time()
        folder = self._dirs["pins"]
        for name, _st in list(self.safe.scan(folder, self.root / "pins")):
            if not name.endswith(".json"):
                continue
            try:
                rec = json.loads(self.safe.read(folder, name, self.root / "pins" / name))
            except (FileNotFoundError, ValueError):
                continue
            if rec.get("until") is not None and rec["until"] < now:
                safedir.unlink(folder, name)
                continue
            out[name[:-len(".json")]] = rec
        return out

    def pinned(self) -> set[str]:
        return set(self.pins())

    def evict(self, url: str | None = None) -> list[str]:
        """Remove the entries of ``url`` (every version held), or every entry not pinned; an
        entry being filled or verified right now stays."""
        removed, pinned = [], self.pinned()
        target = str(source_location(url)) if url else None
        with self._root_lock("quota.lock"):
            if target is None:
                self._fills(sweep_all=True)   # and what killed fillers left
            for entry in self.entries():
                if target is not None and entry.url != target:
                    continue
                if target is None and url_hash(entry.url) in pinned:
                    continue
                if self._remove(entry.key):
                    removed.append(entry.url)
                    self._count(evictions=1, bytes_evicted=entry.size)
        return removed

    def verify(self) -> dict[str, Any]:
        """Rehash every entry; remove (and name) those whose bytes no longer match."""
        corrupted, checked = [], 0
        for entry in self.entries():
            fd = self._lock(entry.key, blocking=False)
            if fd is None:
                continue   # being filled or evicted right now
            try:
                with self._objdir(entry.key) as folder:
                    try:
                        data = self.safe.open(folder, entry.key, self.data_path(entry.key), os.O_RDONLY)
                    except FileNotFoundError:
                        continue
                    size, crc, sha = file_hashes(data, sha=bool(entry.meta.get("sha256")))
                    checked += 1
                    problem = None
                    if size != entry.size:
                        problem = f"{size} bytes, expected {entry.size}"
                    elif crc != entry.meta["crc32c"]:
                        problem = f"CRC32C {crc}, expected {entry.meta['crc32c']}"
                    elif entry.meta.get("sha256") and sha != entry.meta["sha256"]:
                        problem = f"SHA-256 {sha}, expected {entry.meta['sha256']}"
                    if problem:
                        safedir.unlink(folder, entry.key)
                        safedir.unlink(folder, f"{entry.key}.json")
                        corrupted.append({"url": entry.url, "path": str(self.data_path(entry.key)), "problem": problem})
            finally:
                locks.release(fd)
        if corrupted:
            self._count(corrupted=len(corrupted))
        return {"checked": checked, "corrupted": corrupted, "ok": not corrupted}

    # -- metrics ---------------------------------------------------------------------------
    def _count(self, **deltas: float) -> None:
        with self._root_lock("stats.lock"):
            stats = self._read_stats()
            for name, value in deltas.items():
                stats[name] = round(stats.get(name, 0) + value, 3)
            self.safe.write_atomic(self.safe.fd, "stats.json", self.root / "stats.json", json.dumps(stats).encode(),
                                   durable=False)   # counters: not worth an fsync per hit

    def _read_stats(self) -> dict[str, float]:
        try:
            stats = json.loads(self.safe.read(self.safe.fd, "stats.json", self.root / "stats.json"))
        except (FileNotFoundError, ValueError):
            stats = {}
        return {name: stats.get(name, 0) for name in COUNTERS}

    def stat(self) -> dict[str, Any]:
        entries = self.entries()
        pins = self.pins()
        used = sum(e.size for e in entries)
        return {"dir": str(self.root), "entries": len(entries), "bytes": used, "quota": self.conf.quota,
                "pinned": len([e for e in entries if url_hash(e.url) in pins]),
                "filling": len(list(self.safe.scan(self._dirs["fills"], self.root / "fills"))),
                "host": socket.gethostname(), **self._read_stats()}

    # -- many objects --------------------------------------------------------------------------
    def prefetch(self, urls: Iterable[str], lookahead: int | None = None) -> Iterator[tuple[str, Path]]:
        """(url, local path) in the order given, each filled while the reader is at most
        ``lookahead`` objects behind: what a data loader will ask for next is on its way."""
        for url, (path, _outcome, _size) in self._window(urls, lookahead):
            yield url, path

    def _window(self, urls: Iterable[str], lookahead: int | None) -> Iterator[tuple[str, tuple[Path, str, int]]]:
        ahead = lookahead or self.conf.lookahead
        pending = iter(urls)
        with ThreadPoolExecutor(ahead, thread_name_prefix="cache-prefetch") as pool:
            window = []
            for url in pending:
                window.append((url, pool.submit(self._get, url)))
                if len(window) >= ahead:
                    break
            try:
                while window:
                    url, fut = window.pop(0)
                    nxt = next(pending, None)
                    if nxt is not None:
                        window.append((nxt, pool.submit(self._get, nxt)))
                    yield url, fut.result()
            finally:
                for _, fut in window:
                    fut.cancel()


INDEX_SUFFIX = ".index.json"


def targets(target: str, settings: Settings, filters: Filters | None = None) -> list[str]:
    """The object URLs a warm target stands for, in the order a reader takes them: one object;
    every object under a prefix (trailing slash, or a name that is no object) that ``filters``
    select, by name; or the shards of a shard set, given by its index
    (``<root>/<prefix>.index.json``), in index order."""
    loc = parse(target)
    store = get_store(loc, settings)
    store.check_bucket(loc)
    if not loc.is_prefix and loc.key.endswith(INDEX_SUFFIX):
        from bridge.packing import index
        root = Location(loc.scheme, loc.bucket, loc.key.rpartition("/")[0] + "/" if "/" in loc.key else "")
        shard_set = index.read(store, root, loc.key[len(root.key):])
        return [str(root.join(shard["name"])) for shard in shard_set.shards]
    if not loc.is_prefix:
        try:
            store.info(loc)
            return [str(loc)]
        except ObjectNotFound:
            loc = loc.as_prefix()
    found = sorted(str(info.location) for _rel, info in filtering.walk(store, loc, filters))
    if not found and not (filters is not None and filters.active):
        raise ObjectNotFound(f"{target}: no such object, prefix or shard-set index")
    return found


_WARMED = {"hit": ("cached", "held already"), "waited": ("cached", "filled by another process meanwhile"),
           "filled": ("filled", None)}


def warm(items: Iterable[str], settings: Settings, lookahead: int | None = None,
         cache: Cache | None = None, filters: Filters | None = None,
         progress: Progress | None = None) -> dict[str, Any]:
    """Fill the cache with every object the targets stand for, in order with bounded lookahead;
    a line per object on ``progress``'s audit log (filled, or cached already)."""
    cache = cache or Cache(settings)
    urls = [url for item in items for url in targets(item, settings, filters)]
    tally = {"hit": 0, "waited": 0, "filled": 0}
    nbytes, filled = 0, 0
    for url, (_path, outcome, size) in cache._window(urls, lookahead):
        if progress is not None:
            event, why = _WARMED[outcome]
            progress.said(event, url, size, why=why)
        tally[outcome] += 1
        nbytes += size
        filled += size if outcome == "filled" else 0
    return {"dir": str(cache.root), "objects": len(urls), "bytes": nbytes, "hits": tally["hit"] + tally["waited"],
            "misses": tally["filled"], "bytes_filled": filled}
