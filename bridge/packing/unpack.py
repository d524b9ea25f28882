"""Restoring a tree from shards, refusing anything unsafe before a single file is written.

Phase 1 lists every member of every shard: from the index when there is one (and every file's
bytes are then checked against its SHA-256, and every tar shard against its own), else from the
tar headers or the Parquet ``path`` column of each ``*.tar`` / ``*.parquet`` under the source.
Members that are absolute, climb out with ``..``, are links, devices or FIFOs, appear twice, are
both a file and a directory, or (for a local target) would land outside it through a symlink
already there, stop the whole unpack with one error naming them. Phase 2 extracts, shards in
parallel, by byte ranges; an index-less Parquet shard is read row group by row group.

Memory stays flat however many members a set has: the plan keeps each shard's members in a table
on disk (``bridge.spill``) and reads one shard's when its unit is made; the checks for duplicates
and for a path that is both a file and a directory walk the members sorted on disk; the commit
streams the journal's records in path order. A plan as JSON (the service's header) names the
shards, not their members; each shard's task carries its own.

Resume: every restored file is journaled (path, size, hashes, and the SHA-256 the index gave),
and every shard once its own SHA-256 was checked. A re-run after a kill skips journaled files
whose size and indexed SHA-256 still match (a shard wholly done is not read at all), removes the
temporaries a killed writer left in the folders it writes to, and, at commit, aborts unfinished
uploads to the files it restored: the tree ends exact, with no stray file.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import hashlib
import os
import tarfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from bridge.meter import Pool
from bridge import jobs
from bridge import names
from bridge.config import Settings
from bridge.pipeline.units import pool_batch_connections
from bridge.errors import IntegrityError, MissingBackend, ObjectNotFound
from bridge.registry import install_hint
from bridge.journal import Journal, job_key, journal_at
from bridge.manifest import FileEntry
from bridge.packing import index as indexes
from bridge.packing import layout
from bridge.packing.layout import UnsafeMember
from bridge.packing.rangefile import RangeFile
from bridge.packing.reading import open_set
from bridge.packing.sink import StreamingUpload, Written, put_whole, put_wholes, stream_part_size
from bridge.policies.cost import usage as counting
from bridge.packing.writer import format_for_shard
from bridge.progress import Progress
from bridge.spill import Rows
from bridge.stores import Store, get_store
from bridge.stores.base import MiB
from bridge.urls import Location, parse

STREAM_OVER = 16 * MiB      # members bigger than this go out as multipart uploads
SETTLE_FILES = 512          # a local target's members are made durable together after this many
SETTLE_BYTES = 256 * MiB    # ... or bytes, then journaled
PUT_BATCH_FILES = 64        # a remote target's small members go out together, up to this many
PUT_BATCH_BYTES = 1 * MiB   # ... or bytes (see _Extractor._queue)
LIST_PROBLEMS = 5
MEMBER_FIELDS = ("path", "size", "offset", "sha256", "row_group", "row")


@dataclass
class Member:
    path: str                  # where it restores to, normalized
    size: int
    offset: int | None         # of its bytes in the shard; None: read through pyarrow
    sha256: str | None         # None: the shard came without an index
    row_group: int | None = None
    row: int | None = None


@dataclass
class Shard:
    name: str
    loc: Location
    format: str
    size: int
    sha256: str | None
    members: list[Member] | Callable[[], Iterator[Member]]   # a list, or read anew at each call

    def each(self) -> Iterator[Member]:
        return iter(self.members) if isinstance(self.members, list) else self.members()

    @property
    def token(self) -> str:
        """What a restored member's record names its shard by: a record made from another shard
        of the same name (a set packed again) is not taken for this one's."""
        return f"{self.name}:{self.size}:{self.sha256 or ''}"

    def unit(self) -> dict[str, Any]:
        return {"op": "shard", "name": self.name, "loc": str(self.loc), "format": self.format, "size": self.size,
                "sha256": self.sha256, "members": [dict(vars(m)) for m in self.members]}  # asdict: 10x slower

    @classmethod
    def from_unit(cls, unit: dict[str, Any]) -> Shard:
        return cls(unit["name"], parse(unit["loc"]), unit["format"], unit["size"], unit["sha256"],
                   [Member(**m) for m in unit["members"]])


def _token(shard: dict[str, Any]) -> str:
    return f"{shard['name']}:{shard['size']}:{shard['sha256'] or ''}"


class MemberTable:
    """Every member of a plan, shard after shard, in a table on disk (``bridge.spill.Rows``): a
    set of ten million files is not held in this process. A shard's members are the rows from its
    ``after`` on, ``files`` of them."""

    def __init__(self, where: Path):
        self.rows = Rows(len(MEMBER_FIELDS), where)

    def add(self, m: Member) -> None:
        self.rows.append((m.path.encode("utf-8", "surrogatepass"), m.size, m.offset, m.sha256, m.row_group, m.row))

    def __len__(self) -> int:
        return len(self.rows)

    def of(self, after: int, count: int) -> Iterator[dict[str, Any]]:
        for path, *rest in self.rows.range(after, count):
            yield {"path": path.decode("utf-8", "surrogatepass"), **dict(zip(MEMBER_FIELDS[1:], rest))}

    def close(self) -> None:
        self.rows.close()


@dataclass
class UnpackPlan:
    """What an unpack will do, found and checked before anything is written: the shards, each
    with the count, bytes and place in ``table`` of the members it restores (or, in a task's
    slice of a plan, the members themselves)."""
    source: str
    destination: str
    prefix: str | None
    index: str | None                 # the shard set's index; None: members from the shards themselves
    shards: list[dict[str, Any]] = field(default_factory=list)   # shard units, without members
    key: str = ""
    table: MemberTable | None = field(default=None, repr=False, compare=False)
    part_size: int = 0                # a streamed member's parts at the destination (its store's)

    @property
    def bytes(self) -> int:
        return sum(s["bytes"] for s in self.shards)

    @property
    def files(self) -> int:
        return sum(s["files"] for s in self.shards)

    def members(self, shard: dict[str, Any]) -> Iterable[dict[str, Any]]:
        if "members" in shard:
            return shard["members"]
        if self.table is None:
            raise ValueError(f"the plan holds no members of {shard['name']}: it was read without them")
        return self.table.of(shard["after"], shard["files"])

    def paths(self) -> Iterator[str]:
        return (m["path"] for s in self.shards for m in self.members(s))

    def sizes(self) -> Iterator[int]:
        return (m["size"] for s in self.shards for m in self.members(s))

    def units(self) -> Iterator[dict[str, Any]]:
        """One unit per shard; its members are read from the plan's table as the unit runs."""
        return ({"op": "shard", **s} for s in self.shards)

    def shard(self, unit: dict[str, Any]) -> Shard:
        """The shard of a unit: its members from the unit (a task's slice), else from the table."""
        if "members" in unit:
            return Shard.from_unit(unit)
        return Shard(unit["name"], parse(unit["loc"]), unit["format"], unit["size"], unit["sha256"],
                     lambda: (Member(**m) for m in self.members(unit)))

    @staticmethod
    def _shard_fields(shard: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in shard.items() if k not in ("members", "after")}

    def task(self, shard: dict[str, Any]) -> dict[str, Any]:
        """A task's slice: this plan with one shard, its members in it (JSON)."""
        return {**self.to_dict(), "shards": [{**self._shard_fields(shard), "members": list(self.members(shard))}]}

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON, without the members (a slice's shard keeps its own)."""
        return {"source": self.source, "destination": self.destination, "prefix": self.prefix, "index": self.index,
                "shards": [dict(s) if "members" in s else self._shard_fields(s) for s in self.shards],
                "key": self.key, "part_size": self.part_size}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> UnpackPlan:
        return cls(d["source"], d["destination"], d["prefix"], d["index"], list(d["shards"]), d["key"],
                   part_size=d.get("part_size", 0))

    def close(self) -> None:
        if self.table is not None:
            self.table.close()

    def usage(self, route: str | None = None):
        """What the unpack will read, write and request at each store (the one route of an
        unpack plan: ``unpack``; bridge.policies.cost.usage counts it), members above
        STREAM_OVER written in parts of ``part_size``."""
        if route not in (None, "unpack"):
            raise ValueError(f"an unpack plan runs by route unpack, not {route!r}")
        return counting.count_unpack(self, window=_window(parse(self.source)), stream_over=STREAM_OVER,
                                     part_size=self.part_size)

    def summary(self) -> dict[str, Any]:
        return {"source": self.source, "destination": self.destination, "shards": len(self.shards),
                "files": self.files, "bytes": self.bytes, "verified": self.index is not None,
                "index": self.index}


class _Problems:
    """The first few problems, word for word, and how many there were."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.count = 0

    def add(self, shard: str, name: str, reason: str) -> None:
        self.count += 1
        if len(self.items) < LIST_PROBLEMS:
            self.items.append(f"{shard}: member {name!r} {reason}")

    def raise_if_any(self, source: str) -> None:
        if self.count:
            more = f" (and {self.count - LIST_PROBLEMS} more)" if self.count > LIST_PROBLEMS else ""
            raise UnsafeMember(f"refusing to unpack {source}: {'; '.join(self.items)}{more}; nothing was written")


# -- phase 1: what is there, and is all of it safe ------------------------------------------------------

def _window(loc: Location) -> int:
    return 1 * MiB if loc.is_local else 8 * MiB


def _from_index(store: Store, shard_set: indexes.ShardSet, problems: _Problems) -> Iterator[Shard]:
    for s in shard_set.shards:
        def members(s=s) -> Iterator[Member]:
            for e in indexes.iter_list(store, shard_set, s):
                path, problem = layout.normalize_member(e["path"])
                if problem:
                    problems.add(s["name"], e["path"], problem)
                yield Member(path, e["length"], e["offset"], e["sha256"], e.get("row_group"), e.get("row"))
        yield Shard(s["name"], shard_set.root.join(s["name"]), shard_set.shard_format, s["size"], s["sha256"], members)


def _tar_members(store: Store, loc: Location, size: int, name: str,
                 problems: _Problems) -> Iterator[Member]:
    """Member headers only, as they are read: tarfile seeks over the data on a ranged view of
    the shard (and forgets each header: members are not kept)."""
    view = RangeFile(store, loc, size, window=_window(loc))
    try:
        with tarfile.open(fileobj=view, mode="r:") as archive:
            while (info := archive.next()) is not None:
                archive.members = []
                path, problem = layout.normalize_member(info.name)
                kind = _unsafe_kind(info)
                if kind or problem:
                    problems.add(name, info.name, kind or problem)
                elif info.isreg():
                    yield Member(path, info.size, info.offset_data, None)
    except tarfile.TarError as exc:
        raise IntegrityError(f"{loc}: not a readable tar archive ({exc})") from exc


def _unsafe_kind(info: tarfile.TarInfo) -> str | None:
    if info.issym() or info.islnk():
        return f"is a link (to {info.linkname!r})"
    if info.ischr() or info.isblk():
        return "is a device"
    if info.isfifo():
        return "is a FIFO"
    if not (info.isreg() or info.isdir()):
        return f"has an unsupported type {info.type!r}"
    return None


def _parquet_file(store: Store, loc: Location, size: int):
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise MissingBackend(f"Parquet shards need the 'pack' extra: {install_hint('pack')}") from exc
    source = loc.local_path if loc.is_local else RangeFile(store, loc, size, window=256 * 1024)
    try:
        return pq.ParquetFile(source)
    except Exception as exc:   # pyarrow raises ArrowInvalid and OSError subclasses alike
        raise IntegrityError(f"{loc}: not a readable Parquet file ({exc})") from exc


def _parquet_members(store: Store, loc: Location, size: int, name: str,
                     problems: _Problems) -> Iterator[Member]:
    pf = _parquet_file(store, loc, size)
    if not {"path", "data"} <= set(pf.schema_arrow.names):
        raise IntegrityError(f"{loc}: a Parquet shard needs 'path' and 'data' columns")
    for group in range(pf.num_row_groups):
        table = pf.read_row_group(group, columns=["path"])
        for row, raw in enumerate(table.column("path").to_pylist()):
            path, problem = layout.normalize_member(raw or "")
            if problem:
                problems.add(name, raw, problem)
            yield Member(path, -1, None, None, group, row)


def _without_index(store: Store, src: Location, problems: _Problems) -> Iterator[Shard]:
    if src.is_prefix:
        found = [(rel, info.size) for rel, info in store.walk(src) if format_for_shard(rel)]
        root = src
    else:
        info = store.info(src)
        found, root = [(src.name, info.size)], Location(src.scheme, src.bucket, src.key[:-len(src.name)])
    if not found:
        raise ObjectNotFound(f"{src}: no shard-set index and no .tar or .parquet shards there")
    for rel, size in sorted(found):
        fmt = format_for_shard(rel)
        reader = _tar_members if fmt == "tar" else _parquet_members
        yield Shard(rel, root.join(rel), fmt, size, None,
                    lambda reader=reader, rel=rel, size=size: reader(store, root.join(rel), size, rel, problems))


def _tree_key(path: str) -> bytes:
    """A member's path as sorted for the tree check: "/" as the least byte, so that everything
    under ``a/`` sorts right after ``a`` (a name holds no NUL: normalize_member refuses one)."""
    return path.encode("utf-8", "surrogatepass").replace(b"/", b"\x00")


class _TreeCheck:
    """Collects (path, shard) as the plan is read, then checks the tree they make, sorted on
    disk: no path twice, none both a file and a directory, each a name the target takes, and in
    a local target none written through a symlink or over a directory."""

    def __init__(self, where: Path):
        self.rows = Rows(2, where)

    def add(self, shard: str, path: str) -> None:
        self.rows.append((_tree_key(path), shard))

    def check(self, dst_root: Location, problems: _Problems) -> None:
        target = os.path.realpath(dst_root.local_path) if dst_root.is_local else None
        inside: dict[str, bool] = {}          # per folder: one entry a folder, not a file
        files: list[tuple[bytes, str]] = []   # the files that are ancestors of the path at hand
        last: tuple[bytes, str] | None = None
        try:
            for key, shard in self.rows.ordered_by(0):
                path = key.replace(b"\x00", b"/").decode("utf-8", "surrogatepass")
                if last is not None and key == last[0]:
                    problems.add(shard, path, f"appears twice (also in {last[1]})")
                    continue
                last = (key, shard)
                while files and not key.startswith(files[-1][0] + b"\x00"):
                    files.pop()
                if files:
                    head = files[-1][0].replace(b"\x00", b"/").decode("utf-8", "surrogatepass")
                    problems.add(shard, path, f"needs {head!r} to be a directory, but it is also a file")
                files.append((key, shard))
                problem = names.local_problem(path) if target is not None else \
                    names.cloud_problem(dst_root.key + path, dst_root.scheme)
                if problem:
                    problems.add(shard, path, problem)
                if target is not None:
                    _check_local_target(path, shard, target, inside, problems)
        finally:
            self.rows.close()


def _check_local_target(path: str, shard: str, target: str, inside: dict[str, bool], problems: _Problems) -> None:
    parent = path.rpartition("/")[0]
    if parent not in inside:
        real = os.path.realpath(os.path.join(target, parent))
        inside[parent] = real == target or real.startswith(target + os.sep)
    if not inside[parent]:
        problems.add(shard, path, "would be written outside the target through a symlink in it")
    elif os.path.isdir(os.path.join(target, path)):
        problems.add(shard, path, "would replace a directory in the target")


# -- phase 2: extract ---------------------------------------------------------------------------------

class _Extractor:
    def __init__(self, src: Store, dst: Store, dst_root: Location, settings: Settings, progress: Progress,
                 journal: Journal):
        self.src, self.dst, self.dst_root, self.progress = src, dst, dst_root, progress
        self.journal = journal
        self.part_size = stream_part_size(dst, STREAM_OVER, settings.transfer.chunk_size)
        concurrency = settings.transfer.concurrency
        # remote targets take one request per file: keep several in flight for each shard reader
        self._puts = None if dst_root.is_local else Pool(concurrency, thread_name_prefix="bridge-put")
        self._slots = threading.BoundedSemaphore(2 * concurrency)
        # ... and where the store keeps several requests in flight from one thread (the object
        # stores' direct paths), a pool task puts a batch of members, so many requests: a small
        # object's time is mostly the endpoint's round trip. small_files_in_flight in all, with
        # every put thread on a batch (as a pack's reads: packing.writer._read_batch).
        self._batched = self._puts is not None and dst.writes_many
        self._connections = pool_batch_connections(settings)
        # A local target's small members skip their two fsyncs each (file, folder): they are made
        # durable together (one syncfs, as a copy's are: bridge.pipeline.execute), and journaled only then,
        # so the journal never names a file a power loss could take back.
        self.defer_sync = dst_root.is_local
        self._unsettled: list[tuple[Location, str, dict]] = []
        self._unsettled_bytes = 0
        self._lock = threading.Lock()
        self._settling = threading.Lock()

    def close(self) -> None:
        if self._puts:
            self._puts.shutdown(cancel_futures=True)

    def done(self, shard: Shard, m: Member) -> FileEntry | None:
        """The entry of a member a killed run already restored, if it is this same member of
        this same shard."""
        rec = self.journal.get(f"file:{m.path}")
        if not rec or (m.size >= 0 and rec["size"] != m.size) or rec.get("member_sha256") != m.sha256 \
                or rec.get("shard") != shard.token:
            return None
        return FileEntry.from_dict(rec)

    def restored(self, shard: Shard, m: Member, entry: FileEntry, *, settled: bool = True) -> FileEntry:
        record = {**entry.to_dict(), "member_sha256": m.sha256, "shard": shard.token}
        if self.progress.auditing():
            self.progress.said("unpacked", m.path, entry.size, why=f"from {shard.loc.name}")
        if settled:
            self.journal.put(f"file:{m.path}", record)
            return entry
        with self._lock:
            self._unsettled.append((self.dst_root.join(m.path), f"file:{m.path}", record))
            self._unsettled_bytes += entry.size
            full = len(self._unsettled) >= SETTLE_FILES or self._unsettled_bytes >= SETTLE_BYTES
        if full:
            self.settle()
        return entry

    def settle(self) -> None:
        """Make the members written since the last settle durable, then journal them; a failure
        journals none of them (the re-run writes them again)."""
        with self._settling:
            with self._lock:
                batch, self._unsettled, self._unsettled_bytes = self._unsettled, [], 0
            if batch:
                self.dst.settle([loc for loc, _key, _record in batch])
                self.journal.put_many([(key, record) for _loc, key, record in batch])

    def shard(self, shard: Shard) -> int:
        """Restore one shard's members (read as they are reached: a shard of a million members
        is not held); its record, written once every member has its own, is what the commit
        takes as proof that all of them were restored. Returns how many there were."""
        if self.journal.get(f"shard:{shard.name}") == shard.token:
            entries = [self.done(shard, m) for m in shard.each()]
            if all(entries):
                for e in entries:
                    self.progress.skipped(e.size)
                return len(entries)
        first = next(shard.each(), None)
        if first is not None and first.offset is None:
            count = self._parquet_rows(shard)
            self._shard_done(shard)
            return count
        in_order = all(a.offset <= b.offset for a, b in _pairs(shard.each()))
        members = shard.each() if in_order else iter(sorted(shard.each(), key=lambda m: m.offset))
        view = RangeFile(self.src, shard.loc, shard.size, window=_window(shard.loc),
                         progress=self.progress)
        pending: collections.deque[cf.Future] = collections.deque()
        batch = _Batch()
        count = 0
        try:
            for m in members:
                count += 1
                while pending and pending[0].done():
                    pending.popleft().result()
                if (entry := self.done(shard, m)) is not None:
                    self.progress.skipped(entry.size)
                    continue
                view.seek(m.offset)
                if m.size > STREAM_OVER:
                    self._stream(view, shard, m)
                    continue
                data = view.read(m.size)
                sha = hashlib.sha256(data).hexdigest()
                self._check(shard, m, sha)
                self._queue(shard, m, data, sha, pending, batch)
            self._flush(shard, pending, batch)
            while pending:
                pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()
        if shard.sha256:
            view.hash_rest()   # reads what a resumed run skipped too: the shard is checked whole
            if view.sha256 != shard.sha256:
                raise IntegrityError(f"{shard.loc}: shard does not match its SHA-256 in the index")
        self._shard_done(shard)
        return count

    def _shard_done(self, shard: Shard) -> None:
        self.settle()
        # with the members' records a journal may still buffer, in one write: never before them
        self.journal.put_many([(f"shard:{shard.name}", shard.token)])

    def _check(self, shard: Shard, m: Member, sha: str) -> None:
        if m.sha256 and sha != m.sha256:
            raise IntegrityError(f"{shard.loc}: {m.path} does not match its SHA-256 in the index")

    def _queue(self, shard: Shard, m: Member, data: bytes, sha: str, pending, batch: _Batch) -> None:
        """A small member on its way: put now (a local target), sent to the put pool alone, or
        added to ``batch``, which goes to the pool once full (``_batched``)."""
        if not self._batched:
            pending.append(self._put(shard, m, data, sha))
            return
        batch.items.append((m, data, sha))
        batch.bytes += len(data)
        if len(batch.items) >= PUT_BATCH_FILES or batch.bytes >= PUT_BATCH_BYTES:
            self._flush(shard, pending, batch)

    def _flush(self, shard: Shard, pending, batch: _Batch) -> None:
        if not batch.items:
            return
        items, batch.items, batch.bytes = batch.items, [], 0
        pending.append(self._submit(self._put_batch_now, shard, items))

    def _put_batch_now(self, shard: Shard, items: list[tuple[Member, bytes, str]]) -> None:
        def stored(i: int, w: Written) -> None:
            m = items[i][0]
            self.progress.file_finished()
            self.restored(shard, m, FileEntry(m.path, w.size, w.crc32c, w.sha256, **w.committed))

        put_wholes(self.dst, [(self.dst_root.join(m.path), data, sha) for m, data, sha in items], stored,
                   connections=self._connections, progress=self.progress)

    def _put(self, shard: Shard, m: Member, data: bytes, sha: str) -> cf.Future:
        if self._puts is None:
            return _done(self._put_now(shard, m, data, sha))
        return self._submit(self._put_now, shard, m, data, sha)

    def _submit(self, fn, *args) -> cf.Future:
        """``fn(*args)`` on the put pool, at most ``_slots`` of them queued or running at once."""
        self._slots.acquire()
        future = self._puts.submit(fn, *args)
        future.add_done_callback(lambda _f: self._slots.release())
        return future

    def _put_now(self, shard: Shard, m: Member, data: bytes, sha: str) -> FileEntry:
        w = put_whole(self.dst, self.dst_root.join(m.path), data, progress=self.progress,
                      sha256=sha, durable=not self.defer_sync)
        self.progress.file_finished()
        return self.restored(shard, m, FileEntry(m.path, w.size, w.crc32c, w.sha256, **w.committed),
                             settled=not self.defer_sync)

    def _stream(self, view: RangeFile, shard: Shard, m: Member) -> FileEntry:
        sink = StreamingUpload(self.dst, self.dst_root.join(m.path), part_size=self.part_size,
                               progress=self.progress)
        try:
            left = m.size
            while left:
                chunk = view.read(min(left, self.part_size))
                sink.write(chunk)
                left -= len(chunk)
            if m.sha256 and sink.hexdigest() != m.sha256:
                raise IntegrityError(f"{shard.loc}: {m.path} does not match its SHA-256 in the index")
            w = sink.close()
        except BaseException:
            sink.abort()
            raise
        self.progress.file_finished()
        return self.restored(shard, m, FileEntry(m.path, w.size, w.crc32c, w.sha256, w.part_size, w.parts,
                                          **w.committed))

    def _parquet_rows(self, shard: Shard) -> int:
        pf = _parquet_file(self.src, shard.loc, shard.size)
        where = {(m.row_group, m.row): m for m in shard.each()}
        has_sha = "sha256" in pf.schema_arrow.names
        pending: list[cf.Future] = []
        batch = _Batch()
        for group in range(pf.num_row_groups):
            columns = ["data", "sha256"] if has_sha else ["data"]
            table = pf.read_row_group(group, columns=columns)
            datas = table.column("data").to_pylist()
            shas = table.column("sha256").to_pylist() if has_sha else [None] * len(datas)
            for row, (data, stored) in enumerate(zip(datas, shas, strict=True)):
                m = where[(group, row)]
                sha = hashlib.sha256(data).hexdigest()
                if stored and stored != sha:
                    raise IntegrityError(f"{shard.loc}: {m.path} does not match its sha256 column")
                entry = self.done(shard, m)
                if entry is not None and entry.sha256 == sha and entry.size == len(data):
                    self.progress.skipped(entry.size)
                    continue
                self._queue(shard, m, data, sha, pending, batch)
        self._flush(shard, pending, batch)
        for f in pending:
            f.result()
        return len(where)


@dataclass
class _Batch:
    """Small members waiting to go to a remote target together (``_Extractor._queue``)."""

    items: list[tuple[Member, bytes, str]] = field(default_factory=list)
    bytes: int = 0


def _folder(loc: Location) -> Location:
    return Location(loc.scheme, loc.bucket, loc.key.rpartition("/")[0] + "/")


def _done(value: Any) -> cf.Future:
    future: cf.Future = cf.Future()
    future.set_result(value)
    return future


def _pairs(items: Iterator[Member]) -> Iterator[tuple[Member, Member]]:
    last = next(items, None)
    for item in items:
        yield last, item
        last = item


# -- the job ---------------------------------------------------------------------------------------

def plan_unpack(source: str, destination: str, settings: Settings, prefix: str | None = None) -> UnpackPlan:
    """Phase 1: every member of every shard, each one checked; one error naming the unsafe ones.
    The members go to a table on disk as each shard's list is read."""
    from bridge.pipeline.plan import spill_dir
    src = parse(source)
    store = get_store(src, settings)
    store.check_bucket(src)
    dst_root = parse(destination).as_prefix()
    dst_store = get_store(dst_root, settings)
    dst_store.check_bucket(dst_root)
    problems = _Problems()
    shard_set = None
    if src.key.endswith(".index.json"):
        _store, shard_set = open_set(source, settings, prefix)
    elif src.is_prefix or not format_for_shard(src.key):
        shard_set = indexes.find(store, src.as_prefix(), prefix)
    found = _from_index(store, shard_set, problems) if shard_set else _without_index(store, src, problems)
    where = spill_dir(settings)
    plan = UnpackPlan(source, str(dst_root), prefix, str(shard_set.root.join(shard_set.name)) if shard_set else None,
                      key=job_key("unpack", source, str(dst_root), prefix), table=MemberTable(where),
                      part_size=stream_part_size(dst_store, STREAM_OVER, settings.transfer.chunk_size))
    tree = _TreeCheck(where)
    try:
        for shard in found:   # each shard's members are read once, into the table
            unit = {"name": shard.name, "loc": str(shard.loc), "format": shard.format, "size": shard.size,
                    "sha256": shard.sha256, "after": len(plan.table), "files": 0, "bytes": 0, "streamed": []}
            for m in shard.each():
                plan.table.add(m)
                tree.add(shard.name, m.path)
                unit["files"] += 1
                unit["bytes"] += max(m.size, 0)
                if m.size > STREAM_OVER:
                    unit["streamed"].append(m.path)
            plan.shards.append(unit)
        tree.check(dst_root, problems)
        problems.raise_if_any(source)
    except BaseException:
        plan.close()
        raise
    return plan


class UnpackContext(jobs.Context):
    """What the units of one unpack share in one process."""

    def __init__(self, plan: UnpackPlan, settings: Settings, journal: Journal, progress: Progress | None = None):
        self.plan, self.settings, self.journal = plan, settings, journal
        self.progress = progress or Progress()
        self.src_root = parse(plan.source)
        self.dst_root = parse(plan.destination)
        self.src = get_store(self.src_root, settings)
        self.dst = get_store(self.dst_root, settings)
        self.extractor = _Extractor(self.src, self.dst, self.dst_root, settings, self.progress, journal)

    def prepare(self) -> None:
        self.dst.clean_temporaries({_folder(self.dst_root.join(path)) for path in self.plan.paths()})

    def close(self) -> None:
        self.extractor.close()


def _shard(ctx: UnpackContext, unit: dict[str, Any]) -> dict[str, Any]:
    return {"files": ctx.extractor.shard(ctx.plan.shard(unit))}


def restored_entries(journal: Journal, plan: UnpackPlan) -> Iterator[FileEntry]:
    """The entries of every member of the plan, in path order, from the journal: each shard's
    record says all its members were restored (it is written after theirs), and a member's record
    names its shard, so a record left by an earlier run of another shard set is not taken. Reads
    the shard records first: a shard not restored stops the commit before it begins."""
    tokens = {}
    for shard in plan.shards:
        if journal.get(f"shard:{shard['name']}") != _token(shard):
            raise ObjectNotFound(f"{plan.source}: shard {shard['name']} was not restored; run the unpack again")
        tokens[_token(shard)] = shard

    def entries() -> Iterator[FileEntry]:
        seen = dict.fromkeys(tokens, 0)
        for _key, rec in journal.items("file:"):
            token = rec.get("shard")
            if token in seen:
                seen[token] += 1
                yield FileEntry.from_dict(rec)
        short = [tokens[t]["name"] for t, n in seen.items() if n != tokens[t]["files"]]
        if short:
            raise ObjectNotFound(f"{plan.source}: the journal does not hold every member of {', '.join(short[:5])}; "
                                 f"run the unpack again")
    return entries()


def _finalize(ctx: UnpackContext, unit: dict[str, Any]) -> dict[str, Any]:
    counted = {"files": 0, "bytes": 0}

    def tally(entries: Iterator[FileEntry]) -> Iterator[FileEntry]:
        for e in entries:
            counted["files"] += 1
            counted["bytes"] += e.size
            yield e

    where = jobs.commit(ctx.dst, ctx.dst_root, ctx.plan.source, ctx.plan.destination,
                        tally(restored_entries(ctx.journal, ctx.plan)))
    return {"manifest": where, **counted}


UnpackContext.ops = {"shard": _shard, "finalize": _finalize}


def unpack(source: str, destination: str, settings: Settings, *, prefix: str | None = None,
           progress: Progress | None = None, state_dir: Path | None = None, dry_run: bool = False) -> dict[str, Any]:
    """Restore the tree packed at ``source`` into ``destination``; return a JSON-able summary."""
    progress = progress or Progress()
    plan = plan_unpack(source, destination, settings, prefix)
    try:
        if dry_run:
            return {"dry_run": True, **plan.summary(), "usage": plan.usage().to_dict(),
                    "plan": [{"shard": s["name"], "files": s["files"], "size": s["size"]} for s in plan.shards]}
        progress.plan(plan.bytes, len(plan.shards) + 1)
        journal = journal_at(state_dir or Path(settings.transfer.state_dir), plan.key)
        ctx = UnpackContext(plan, settings, journal, progress)
        concurrency = max(1, min(settings.transfer.concurrency, len(plan.shards)))
        results = jobs.run(ctx, plan.units(), journal, concurrency, "unpack")
    finally:
        plan.close()
    return {"source": source, "destination": plan.destination, "shards": len(plan.shards), "files": results["files"],
            "bytes": results["bytes"], "verified": plan.index is not None, "index": plan.index,
            "manifest": results["manifest"], **progress.snapshot()}
