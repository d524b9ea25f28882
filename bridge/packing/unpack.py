"""Restoring a tree from shards, refusing anything unsafe before a single file is written.

Phase 1 lists every member of every shard: from the index when there is one (and every file's
bytes are then checked against its SHA-256, and every tar shard against its own), else from the
tar headers or the Parquet ``path`` column of each ``*.tar`` / ``*.parquet`` under the source.
Members that are absolute, climb out with ``..``, are links, devices or FIFOs, appear twice, are
both a file and a directory, or (for a local target) would land outside it through a symlink
already there, stop the whole unpack with one error naming them. Phase 2 extracts, shards in
parallel, by byte ranges; an index-less Parquet shard is read row group by row group.

Resume: every restored file is journaled (path, size, hashes, and the SHA-256 the index gave),
and every shard once its own SHA-256 was checked. A re-run after a kill skips journaled files
whose size and indexed SHA-256 still match (a shard wholly done is not read at all), removes the
temporaries a killed writer left in the folders it writes to, and, at commit, aborts unfinished
uploads to the files it restored: the tree ends exact, with no stray file.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import os
import tarfile
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bridge.meter import Pool
from bridge import jobs
from bridge import names
from bridge.config import Settings
from bridge.errors import IntegrityError, MissingBackend, ObjectNotFound
from bridge.journal import Journal, job_key, journal_at
from bridge.manifest import FileEntry
from bridge.packing import index as indexes
from bridge.packing import layout
from bridge.packing.layout import UnsafeMember
from bridge.packing.rangefile import RangeFile
from bridge.packing.reading import open_set
from bridge.packing.sink import StreamingUpload, put_whole, stream_part_size
from bridge.packing.writer import format_for_shard
from bridge.progress import Progress
from bridge.stores import Store, get_store
from bridge.stores.base import MiB
from bridge.urls import Location, parse

STREAM_OVER = 16 * MiB      # members bigger than this go out as multipart uploads
LIST_PROBLEMS = 5


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
    members: list[Member]

    def unit(self) -> dict[str, Any]:
        return {"op": "shard", "name": self.name, "loc": str(self.loc), "format": self.format, "size": self.size,
                "sha256": self.sha256, "members": [dict(vars(m)) for m in self.members]}  # asdict: 10x slower

    @classmethod
    def from_unit(cls, unit: dict[str, Any]) -> Shard:
        return cls(unit["name"], parse(unit["loc"]), unit["format"], unit["size"], unit["sha256"],
                   [Member(**m) for m in unit["members"]])


@dataclass
class UnpackPlan:
    """What an unpack will do, found and checked before anything is written: the shards, each
    with every member it restores."""
    source: str
    destination: str
    prefix: str | None
    index: str | None                 # the shard set's index; None: members from the shards themselves
    shards: list[dict[str, Any]] = field(default_factory=list)   # shard units
    key: str = ""

    @property
    def bytes(self) -> int:
        return sum(m["size"] for s in self.shards for m in s["members"] if m["size"] > 0)

    def paths(self) -> list[str]:
        return [m["path"] for s in self.shards for m in s["members"]]

    def units(self) -> list[dict[str, Any]]:
        return list(self.shards)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> UnpackPlan:
        return cls(**d)

    def usage(self, settings: Settings):
        """What the unpack will read, write and request at each store (``bridge.estimate``)."""
        from bridge import estimate
        dst = get_store(parse(self.destination), settings)
        return estimate.unpack_usage(self, window=_window(parse(self.source)), stream_over=STREAM_OVER,
                                     part_size=stream_part_size(dst, STREAM_OVER, settings.transfer.chunk_size))

    def summary(self) -> dict[str, Any]:
        return {"source": self.source, "destination": self.destination, "shards": len(self.shards),
                "files": len(self.paths()), "bytes": self.bytes, "verified": self.index is not None,
                "index": self.index}


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, shard: str, name: str, reason: str) -> None:
        self.items.append(f"{shard}: member {name!r} {reason}")

    def raise_if_any(self, source: str) -> None:
        if self.items:
            more = f" (and {len(self.items) - LIST_PROBLEMS} more)" if len(self.items) > LIST_PROBLEMS else ""
            raise UnsafeMember(f"refusing to unpack {source}: {'; '.join(self.items[:LIST_PROBLEMS])}{more}; "
                               f"nothing was written")


# -- phase 1: what is there, and is all of it safe ------------------------------------------------------

def _window(loc: Location) -> int:
    return 1 * MiB if loc.is_local else 8 * MiB


def _from_index(store: Store, shard_set: indexes.ShardSet, problems: _Problems) -> list[Shard]:
    shards = []
    for s in shard_set.shards:
        members = []
        for e in indexes.read_list(store, shard_set, s):
            path, problem = layout.normalize_member(e["path"])
            if problem:
                problems.add(s["name"], e["path"], problem)
            members.append(Member(path, e["length"], e["offset"], e["sha256"], e.get("row_group"), e.get("row")))
        shards.append(Shard(s["name"], shard_set.root.join(s["name"]), shard_set.shard_format, s["size"],
                            s["sha256"], members))
    return shards


def _tar_members(store: Store, loc: Location, size: int, name: str, retries: int,
                 problems: _Problems) -> list[Member]:
    """Member headers only: tarfile seeks over the data on a ranged view of the shard."""
    members = []
    view = RangeFile(store, loc, size, window=_window(loc), retries=retries)
    try:
        with tarfile.open(fileobj=view, mode="r:") as archive:
            for info in archive:
                path, problem = layout.normalize_member(info.name)
                kind = _unsafe_kind(info)
                if kind or problem:
                    problems.add(name, info.name, kind or problem)
                elif info.isreg():
                    members.append(Member(path, info.size, info.offset_data, None))
    except tarfile.TarError as exc:
        raise IntegrityError(f"{loc}: not a readable tar archive ({exc})") from exc
    return members


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


def _parquet_file(store: Store, loc: Location, size: int, retries: int):
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise MissingBackend("Parquet shards need the 'pack' extra: pip install 'cloud-artifact-bridge[pack]'") from exc
    source = loc.local_path if loc.is_local else RangeFile(store, loc, size, window=256 * 1024, retries=retries)
    try:
        return pq.ParquetFile(source)
    except Exception as exc:   # pyarrow raises ArrowInvalid and OSError subclasses alike
        raise IntegrityError(f"{loc}: not a readable Parquet file ({exc})") from exc


def _parquet_members(store: Store, loc: Location, size: int, name: str, retries: int,
                     problems: _Problems) -> list[Member]:
    pf = _parquet_file(store, loc, size, retries)
    if not {"path", "data"} <= set(pf.schema_arrow.names):
        raise IntegrityError(f"{loc}: a Parquet shard needs 'path' and 'data' columns")
    members = []
    for group in range(pf.num_row_groups):
        table = pf.read_row_group(group, columns=["path"])
        for row, raw in enumerate(table.column("path").to_pylist()):
            path, problem = layout.normalize_member(raw or "")
            if problem:
                problems.add(name, raw, problem)
            members.append(Member(path, -1, None, None, group, row))
    return members


def _without_index(store: Store, src: Location, retries: int, problems: _Problems) -> list[Shard]:
    if src.is_prefix:
        found = [(rel, info) for rel, info in store.walk(src) if format_for_shard(rel)]
        root = src
    else:
        info = store.info(src)
        found, root = [(src.name, info)], Location(src.scheme, src.bucket, src.key[:-len(src.name)])
    if not found:
        raise ObjectNotFound(f"{src}: no shard-set index and no .tar or .parquet shards there")
    shards = []
    for rel, info in sorted(found, key=lambda f: f[0]):
        fmt = format_for_shard(rel)
        reader = _tar_members if fmt == "tar" else _parquet_members
        members = reader(store, root.join(rel), info.size, rel, retries, problems)
        shards.append(Shard(rel, root.join(rel), fmt, info.size, None, members))
    return shards


def _check_tree(shards: list[Shard], dst_root: Location, problems: _Problems) -> None:
    owner: dict[str, str] = {}
    for shard in shards:
        for m in shard.members:
            if m.path in owner:
                problems.add(shard.name, m.path, f"appears twice (also in {owner[m.path]})")
            owner[m.path] = shard.name
    for path, shard in owner.items():
        head = path
        while "/" in head:
            head = head.rpartition("/")[0]
            if head in owner:
                problems.add(shard, path, f"needs {head!r} to be a directory, but it is also a file")
                break
    for path, shard in owner.items():
        problem = names.local_problem(path) if dst_root.is_local else \
            names.cloud_problem(dst_root.key + path, dst_root.scheme)
        if problem:
            problems.add(shard, path, problem)
    if dst_root.is_local:
        _check_local_target(owner, dst_root, problems)


def _check_local_target(owner: dict[str, str], dst_root: Location, problems: _Problems) -> None:
    target = os.path.realpath(dst_root.local_path)
    seen: dict[str, bool] = {}
    for path, shard in owner.items():
        parent = path.rpartition("/")[0]
        if parent not in seen:
            real = os.path.realpath(os.path.join(target, parent))
            seen[parent] = real == target or real.startswith(target + os.sep)
        if not seen[parent]:
            problems.add(shard, path, "would be written outside the target through a symlink in it")
        elif os.path.isdir(os.path.join(target, path)):
            problems.add(shard, path, "would replace a directory in the target")


# -- phase 2: extract ---------------------------------------------------------------------------------

class _Extractor:
    def __init__(self, src: Store, dst: Store, dst_root: Location, settings: Settings, progress: Progress,
                 journal: Journal):
        self.src, self.dst, self.dst_root, self.progress = src, dst, dst_root, progress
        self.journal = journal
        self.retries = settings.transfer.retries
        self.part_size = stream_part_size(dst, STREAM_OVER, settings.transfer.chunk_size)
        concurrency = settings.transfer.concurrency
        # remote targets take one request per file: keep several in flight for each shard reader
        self._puts = None if dst_root.is_local else Pool(concurrency, thread_name_prefix="bridge-put")
        self._slots = threading.BoundedSemaphore(2 * concurrency)

    def close(self) -> None:
        if self._puts:
            self._puts.shutdown(cancel_futures=True)

    def done(self, m: Member) -> FileEntry | None:
        """The entry of a member a killed run already restored, if it is this same member."""
        rec = self.journal.get(f"file:{m.path}")
        if not rec or (m.size >= 0 and rec["size"] != m.size) or rec.get("member_sha256") != m.sha256:
            return None
        return FileEntry.from_dict(rec)

    def restored(self, m: Member, entry: FileEntry) -> FileEntry:
        self.journal.put(f"file:{m.path}", {**entry.to_dict(), "member_sha256": m.sha256})
        return entry

    def shard(self, shard: Shard) -> list[FileEntry]:
        if self.journal.get(f"shard:{shard.name}"):
            entries = [self.done(m) for m in shard.members]
            if all(entries):
                for e in entries:
                    self.progress.skipped(e.size)
                return entries
        if shard.members and shard.members[0].offset is None:
            entries = self._parquet_rows(shard)
            self.journal.put(f"shard:{shard.name}", True)
            return entries
        view = RangeFile(self.src, shard.loc, shard.size, window=_window(shard.loc), retries=self.retries,
                         progress=self.progress)
        pending: list[cf.Future] = []
        try:
            for m in sorted(shard.members, key=lambda m: m.offset):
                if (entry := self.done(m)) is not None:
                    self.progress.skipped(entry.size)
                    pending.append(_done(entry))
                    continue
                view.seek(m.offset)
                if m.size > STREAM_OVER:
                    pending.append(_done(self._stream(view, shard, m)))
                    continue
                data = view.read(m.size)
                sha = hashlib.sha256(data).hexdigest()
                self._check(shard, m, sha)
                pending.append(self._put(m, data, sha))
            entries = [f.result() for f in pending]
        finally:
            for f in pending:
                f.cancel()
        if shard.sha256:
            view.hash_rest()   # reads what a resumed run skipped too: the shard is checked whole
            if view.sha256 != shard.sha256:
                raise IntegrityError(f"{shard.loc}: shard does not match its SHA-256 in the index")
        self.journal.put(f"shard:{shard.name}", True)
        return entries

    def _check(self, shard: Shard, m: Member, sha: str) -> None:
        if m.sha256 and sha != m.sha256:
            raise IntegrityError(f"{shard.loc}: {m.path} does not match its SHA-256 in the index")

    def _put(self, m: Member, data: bytes, sha: str) -> cf.Future:
        if self._puts is None:
            return _done(self._put_now(m, data, sha))
        self._slots.acquire()
        future = self._puts.submit(self._put_now, m, data, sha)
        future.add_done_callback(lambda _f: self._slots.release())
        return future

    def _put_now(self, m: Member, data: bytes, sha: str) -> FileEntry:
        w = put_whole(self.dst, self.dst_root.join(m.path), data, retries=self.retries, progress=self.progress,
                      sha256=sha)
        self.progress.file_finished()
        return self.restored(m, FileEntry(m.path, w.size, w.crc32c, w.sha256, **w.committed))

    def _stream(self, view: RangeFile, shard: Shard, m: Member) -> FileEntry:
        sink = StreamingUpload(self.dst, self.dst_root.join(m.path), part_size=self.part_size,
                               retries=self.retries, progress=self.progress)
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
        return self.restored(m, FileEntry(m.path, w.size, w.crc32c, w.sha256, w.part_size, w.parts,
                                          **w.committed))

    def _parquet_rows(self, shard: Shard) -> list[FileEntry]:
        pf = _parquet_file(self.src, shard.loc, shard.size, self.retries)
        where = {(m.row_group, m.row): m for m in shard.members}
        has_sha = "sha256" in pf.schema_arrow.names
        pending = []
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
                entry = self.done(m)
                if entry is not None and entry.sha256 == sha and entry.size == len(data):
                    self.progress.skipped(entry.size)
                    pending.append(_done(entry))
                    continue
                pending.append(self._put(m, data, sha))
        return [f.result() for f in pending]


def _folder(loc: Location) -> Location:
    return Location(loc.scheme, loc.bucket, loc.key.rpartition("/")[0] + "/")


def _done(value: Any) -> cf.Future:
    future: cf.Future = cf.Future()
    future.set_result(value)
    return future


# -- the job ---------------------------------------------------------------------------------------

def plan_unpack(source: str, destination: str, settings: Settings, prefix: str | None = None) -> UnpackPlan:
    """Phase 1: every member of every shard, each one checked; one error naming the unsafe ones."""
    src = parse(source)
    store = get_store(src, settings)
    store.check_bucket(src)
    dst_root = parse(destination).as_prefix()
    get_store(dst_root, settings).check_bucket(dst_root)
    problems = _Problems()
    shard_set = None
    if src.key.endswith(".index.json"):
        _store, shard_set = open_set(source, settings, prefix)
    elif src.is_prefix or not format_for_shard(src.key):
        shard_set = indexes.find(store, src.as_prefix(), prefix)
    retries = settings.transfer.retries
    shards = _from_index(store, shard_set, problems) if shard_set else _without_index(store, src, retries, problems)
    _check_tree(shards, dst_root, problems)
    problems.raise_if_any(source)
    return UnpackPlan(source, str(dst_root), prefix,
                      str(shard_set.root.join(shard_set.name)) if shard_set else None,
                      [s.unit() for s in shards], job_key("unpack", source, str(dst_root), prefix))


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
    return {"files": len(ctx.extractor.shard(Shard.from_unit(unit)))}


def _finalize(ctx: UnpackContext, unit: dict[str, Any]) -> dict[str, Any]:
    entries = []
    for path in ctx.plan.paths():
        rec = ctx.journal.get(f"file:{path}")
        if rec is None:
            raise ObjectNotFound(f"{ctx.dst_root.join(path)} was not restored; run the unpack again")
        entries.append(FileEntry.from_dict(rec))
    where = jobs.commit(ctx.dst, ctx.dst_root, ctx.plan.source, ctx.plan.destination, entries)
    return {"manifest": where, "files": len(entries), "bytes": sum(e.size for e in entries)}


UnpackContext.ops = {"shard": _shard, "finalize": _finalize}


def unpack(source: str, destination: str, settings: Settings, *, prefix: str | None = None,
           progress: Progress | None = None, state_dir: Path | None = None, dry_run: bool = False) -> dict[str, Any]:
    """Restore the tree packed at ``source`` into ``destination``; return a JSON-able summary."""
    progress = progress or Progress()
    plan = plan_unpack(source, destination, settings, prefix)
    if dry_run:
        return {"dry_run": True, **plan.summary(), "usage": plan.usage(settings).to_dict(),
                "plan": [{"shard": s["name"], "files": len(s["members"]), "size": s["size"]} for s in plan.shards]}
    progress.plan(plan.bytes, len(plan.shards) + 1)
    journal = journal_at(state_dir or Path(settings.transfer.state_dir), plan.key)
    ctx = UnpackContext(plan, settings, journal, progress)
    concurrency = max(1, min(settings.transfer.concurrency, len(plan.shards)))
    results = jobs.run(ctx, plan.units(), journal, concurrency, "unpack")
    return {"source": source, "destination": plan.destination, "shards": len(plan.shards), "files": results["files"],
            "bytes": results["bytes"], "verified": plan.index is not None, "index": plan.index,
            "manifest": results["manifest"], **progress.snapshot()}
