"""Packing as a job: a plan of JSON-serialisable units, run on a thread pool here or by workers.

    {"op": "shard", "number": 3, "name": "shard-000003.tar", "size": …, "files": [[rel, size], …]}
    {"op": "index"}       after every shard: the shard set's index, then stale shards removed
    {"op": "finalize"}    the commit in _bridge/log/, last

Shards are cut from the sorted listing before anything is read (WebDataset samples whole, at
most ``shard_size`` bytes and ``max_count`` files each, unless one sample alone is bigger), so the
units are independent and run in parallel. Each finished shard is journaled; a run that is
stopped and started again skips shards that are already stored.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import itertools
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from bridge.meter import Pool
from bridge.filters import Filters
from bridge import jobs
from bridge.config import Settings
from bridge.listing import resolve
from bridge.pipeline.plan import spill_dir
from bridge.pipeline.units import pool_batch_connections
from bridge.errors import BridgeError, InvalidOption, ObjectNotFound
from bridge.journal import Journal, job_key, journal_at
from bridge.manifest import FileEntry
from bridge.packing import index as indexes
from bridge.packing import layout
from bridge.packing.sink import put_whole, stream_part_size
from bridge.packing.writer import FORMATS, ShardFormat, ShardWriter, get_format
from bridge.policies.cost import usage as counting
from bridge.progress import Progress
from bridge.spill import Rows
from bridge.stores import Store, get_store
from bridge.stores.base import RESERVED, GiB, MiB
from bridge.urls import Location, parse

DEFAULT_SHARD_SIZE = 256 * MiB
DEFAULT_MEMORY = 1 * GiB


# A pack plan past this many files keeps them on disk (bridge.spill) while it sorts and cuts them.
# Held in memory, 50,000 names and sizes are a few MB; spilling 20,000 to SQLite and reading
# each shard's back cost about 0.1 s of CPU before the first byte went up (2026-12-06).
SPILL_FILES = 50_000
CHECK_RUN = 4096   # files whose names are checked at once (_check_files)


class MemberSlice:
    """One shard's [rel, size] in pack order, kept in its plan's table of members (bridge.spill)
    and read when its unit is made: a plan of millions of files holds none of them."""

    def __init__(self, rows: Rows, after: int, count: int, nbytes: int):
        self.rows, self.after, self.count, self.bytes = rows, after, count, nbytes

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[list[Any]]:
        for rel, size in self.rows.range(self.after, self.count):
            yield [rel.decode("utf-8", "surrogatepass"), size]

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, (list, MemberSlice)) else NotImplemented

    def __repr__(self) -> str:
        return f"MemberSlice({self.count} files, {self.bytes} bytes)"


@dataclass
class ShardPlan:
    number: int
    name: str
    size: int                         # exact for tar, an estimate for parquet
    files: list[list[Any]] | MemberSlice  # [rel, size], in pack order

    @property
    def bytes(self) -> int:
        known = getattr(self.files, "bytes", None)
        return known if known is not None else sum(size for _rel, size in self.files)

    def unit(self) -> dict[str, Any]:
        """The shard's unit in this process: its files as planned, a table slice read as it is
        written (``to_dict`` is the JSON, every file listed, for a task on the service)."""
        return {"op": "shard", "number": self.number, "name": self.name, "size": self.size, "files": self.files}

    def to_dict(self) -> dict[str, Any]:
        return {"number": self.number, "name": self.name, "size": self.size, "files": list(self.files)}


@dataclass
class PackPlan:
    source: str                       # what was asked for: a prefix, or one object
    source_root: str                  # the prefix that shard member paths are relative to
    destination: str
    format: str
    prefix: str
    shard_size: int
    max_count: int | None
    part_size: int
    options: dict[str, Any] = field(default_factory=dict)   # format options, e.g. row_group_size
    shards: list[ShardPlan] = field(default_factory=list)
    key: str = ""

    @property
    def files(self) -> int:
        return sum(len(s.files) for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    @property
    def shard_bytes(self) -> int:
        return sum(s.size for s in self.shards)

    def units(self) -> Iterator[dict[str, Any]]:
        """One unit per shard, its file list read as the unit is made."""
        return (s.unit() for s in self.shards)

    def usage(self, route: str | None = None):
        """What packing will read, write and request at each store (the one route of a pack
        plan: ``pack``; bridge.policies.cost.usage counts it)."""
        if route not in (None, "pack"):
            raise ValueError(f"a pack plan runs by route pack, not {route!r}")
        return counting.count_pack(self)

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self) if f.name != "shards"},
                "options": dict(self.options), "shards": [s.to_dict() for s in self.shards]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PackPlan:
        return cls(**{**d, "shards": [ShardPlan(**s) for s in d["shards"]]})

    def summary(self) -> dict[str, Any]:
        return {"source": self.source, "destination": self.destination, "format": self.format,
                "prefix": self.prefix, "files": self.files, "bytes": self.bytes, "shards": len(self.shards),
                "shard_bytes": self.shard_bytes, "index": layout.index_name(self.prefix)}


# -- planning ----------------------------------------------------------------------------------------

def plan_pack(source: str, destination: str, settings: Settings, *, fmt: str = "tar", prefix: str = "shard",
              shard_size: int = DEFAULT_SHARD_SIZE, max_count: int | None = None,
              options: dict[str, Any] | None = None, filters: Filters | None = None) -> PackPlan:
    """Cut the source tree (the files ``filters`` select) into shards; refuse, before anything
    is written, what cannot work."""
    layout.check_prefix(prefix)
    shard_format = get_format(fmt, options)
    sized = _local_sizes(source, destination, settings, filters)
    if sized is not None:
        src_root, dst_root, files = sized
        single = None
    else:
        src_root, dst_root, objects, single = resolve(source, destination, settings, filters)
        files = ((rel, info.size) for rel, info in objects)
    dst_store = get_store(dst_root, settings)
    if shard_size <= 0:
        raise InvalidOption("--shard-size must be positive")
    if shard_size > dst_store.features.max_object_size:
        raise InvalidOption(f"--shard-size {shard_size} is over the {dst_store.scheme}:// object limit of "
                            f"{dst_store.features.max_object_size} bytes")
    if max_count is not None and max_count < 1:
        raise InvalidOption("--max-count must be at least 1")
    if single is None and dst_root.is_within(src_root):
        raise InvalidOption(f"the destination {dst_root} is inside the source {src_root}: the shards "
                            f"would be packed into themselves")
    members = _Members(spill_dir(settings))
    files = iter(files)
    while chunk := list(itertools.islice(files, CHECK_RUN)):
        _check_files(chunk, shard_format)
        members.add_many(chunk)
    plan = PackPlan(str(src_root) if single is None else single, str(src_root), str(dst_root), fmt, prefix,
                    shard_size, max_count, stream_part_size(dst_store, shard_size, settings.transfer.chunk_size),
                    dict(options or {}))
    # The job's key names every file, as job_key would of them all, hashed as they pass.
    key = hashlib.sha256("\x00".join(map(str, ("pack", plan.source, plan.destination, fmt, prefix, shard_size,
                                                max_count, sorted(plan.options.items())))).encode())

    plan.shards = _cut(members.in_pack_order(), key, shard_format, prefix, shard_size, max_count,
                       members.cut_table())
    plan.key = key.hexdigest()[:20]
    return plan


def _local_sizes(source: str, destination: str, settings: Settings, filters: Filters | None):
    """For a local folder packed whole (no filters): (source root, destination root, its files'
    (path, size) in no set order) from ``LocalStore.sizes``, which makes no ``ObjectInfo`` a
    file (the plan sorts them itself: ``_Members``); None otherwise (``resolve`` lists them).
    The destination's bucket is checked as ``resolve`` checks it."""
    import os
    src = parse(source)
    if not src.is_local or (filters is not None and filters.active) or not os.path.isdir(src.local_path):
        return None
    from bridge.pipeline.forkplan import sizes_split
    src, dst = src.as_prefix(), parse(destination).as_prefix()
    get_store(dst, settings).check_bucket(dst)
    store = get_store(src, settings)
    return src, dst, sizes_split(store, src, settings) or store.sizes(src)


class _Members:
    """The files of a pack plan as listed, given back in pack order: sorted in memory, or past
    SPILL_FILES by SQLite on disk (by sample key, then path: code-point order, as str sorts)."""

    def __init__(self, where: Path):
        self.where = where
        self.held: list[tuple[str, int]] | None = []
        self.rows: Rows | None = None

    def add_many(self, files: list[tuple[str, int]]) -> None:
        """(rel, size) of a run of files."""
        if self.held is not None:
            self.held += files
            if len(self.held) <= SPILL_FILES:
                return
            files, self.held = self.held, None
            self.rows = Rows(3, self.where)
        for one in files:
            self._spill(*one)

    def _spill(self, rel: str, size: int) -> None:
        self.rows.append((layout.sample_key(rel).encode("utf-8", "surrogatepass"),
                          rel.encode("utf-8", "surrogatepass"), size))

    def in_pack_order(self) -> Iterator[tuple[str, str, int]]:
        """(sample key, rel, size) in pack order (layout.pack_order: by sample key, then path)."""
        if self.held is not None:
            rels = [rel for rel, _size in self.held]
            ordered = list(zip(layout.sample_keys(rels), rels, [size for _rel, size in self.held]))
            ordered.sort()   # (rel is unique: no two tuples get as far as their sizes)
            return iter(ordered)
        return ((key.decode("utf-8", "surrogatepass"), rel.decode("utf-8", "surrogatepass"), size)
                for key, rel, size in self.rows.ordered_by(0, 1))

    def cut_table(self) -> Rows | None:
        """Where the shards' file lists go: none (lists in memory) for a short plan."""
        return None if self.rows is None else Rows(2, self.where)


def _check_files(files: list[tuple[str, int]], fmt: ShardFormat) -> None:
    """``_check_file`` of a run of files, their names searched at once (joined, each between
    slashes) for anything that could need a closer look: a backslash, a NUL, an empty, "." or
    ".." segment, a drive's colon, bridge's reserved folder's name as a segment. Any of these
    in any name, or a size over the format's limit, and each file is checked on its own, which
    says which one is refused and why."""
    if not files:
        return
    joined = "/\x00/".join([rel for rel, _size in files])
    wrapped = f"/{joined}/"
    if ("\\" in joined or joined.count("\x00") != len(files) - 1 or ":/" in joined or "//" in wrapped
            or "/./" in wrapped or "/../" in wrapped or f"/{RESERVED}/" in wrapped
            or max([size for _rel, size in files]) > fmt.max_file_size):
        for rel, size in files:
            _check_file(rel, size, fmt)


def _check_file(rel: str, size: int, fmt: ShardFormat) -> None:
    path, problem = layout.normalize_member(rel)
    if problem or path != rel:
        raise InvalidOption(f"cannot pack {rel!r}: the name {problem or 'is not a plain relative path'}; "
                            f"unpacking it would not restore it safely")
    if size > fmt.max_file_size:
        raise InvalidOption(f"cannot pack {rel!r}: {size} bytes is over the {fmt.name} limit of "
                            f"{fmt.max_file_size} bytes per file; use --format tar")


def _cut(files: Iterable[tuple[str, str, int]], key: Any, fmt: ShardFormat, prefix: str, shard_size: int,
         max_count: int | None, table: Rows | None = None) -> list[ShardPlan]:
    """Shards of whole samples (the files of one sample key, consecutive in pack order), from
    (sample key, rel, size) in pack order, in one pass; ``key``: a hash that takes each file's
    name and size as they pass (the job's key). With ``table``, each shard's files are appended
    to it as the shard closes and the shard keeps only where they are (MemberSlice)."""
    shards: list[ShardPlan] = []
    current: list[list[Any]] = []
    current_bytes = 0
    stored = 0

    def close() -> None:
        nonlocal current, current_bytes, stored
        if current:
            number = len(shards)
            files: list[list[Any]] | MemberSlice = current
            if table is not None:
                for rel, size in current:
                    table.append((rel.encode("utf-8", "surrogatepass"), size))
                files = MemberSlice(table, stored, len(current), sum(size for _rel, size in current))
                stored += len(current)
            shards.append(ShardPlan(number, layout.shard_name(prefix, number, fmt.extension),
                                    fmt.shard_size(current_bytes), files))
        current, current_bytes = [], 0

    def place(group: list[list[Any]], group_bytes: int) -> None:
        nonlocal current_bytes
        too_big = whole(current_bytes + group_bytes) > shard_size
        too_many = max_count is not None and len(current) + len(group) > max_count
        if current and (too_big or too_many):
            close()
        current.extend(group)
        current_bytes += group_bytes

    file_size, whole = fmt.file_size, fmt.shard_size
    group: list[list[Any]] = []
    group_bytes = 0
    last = None
    names: list[str] = []
    for sample, rel, size in files:
        if sample != last:
            if group:
                place(group, group_bytes)
            group, group_bytes, last = [], 0, sample
        group.append([rel, size])
        group_bytes += file_size(rel, size)
        names.append(f"\x00{rel}:{size}")
        if len(names) >= 4096:
            key.update("".join(names).encode())
            names.clear()
    key.update("".join(names).encode())
    if group:
        place(group, group_bytes)
    close()
    return shards


# -- running ----------------------------------------------------------------------------------------

class PackContext(jobs.Context):
    """What the units of one packing job share in one process."""

    def __init__(self, plan: PackPlan, settings: Settings, journal: Journal, progress: Progress | None = None):
        self.plan, self.settings, self.journal = plan, settings, journal
        self.progress = progress or Progress()
        self.fmt = get_format(plan.format, plan.options)
        self.src_root = parse(plan.source_root)
        self.dst_root = parse(plan.destination)
        self.src = get_store(self.src_root, settings)
        self.dst = get_store(self.dst_root, settings)
        self._read_pool: cf.ThreadPoolExecutor | None = None
        self._first_reader: cf.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self.shards_at_once = 0   # shard writers this process runs at once (execute); 0: not known

    def read_pool(self) -> cf.ThreadPoolExecutor:
        """Reads (and per-file hashes) run ahead of the shard writers on one shared pool."""
        with self._lock:
            if self._read_pool is None:
                self._read_pool = Pool(self.settings.transfer.concurrency,
                                                        thread_name_prefix="bridge-read")
            return self._read_pool

    def first_reader(self) -> cf.ThreadPoolExecutor | None:
        """For a local source, the one thread that reads ahead of the shard writers until a run
        of files turns out to wait on its storage (bridge.packing.writer.source_batches); None
        for an object store, whose reads wait on the network from the first."""
        if self.src.scheme != "file":
            return None
        with self._lock:
            if self._first_reader is None:
                self._first_reader = Pool(1, thread_name_prefix="bridge-read-first")
            return self._first_reader

    def writers(self, memory: int = DEFAULT_MEMORY) -> int:
        """Shards written at once: the concurrency setting, within a memory budget."""
        per_writer = self.fmt.memory_per_writer(self.plan.part_size)
        return max(1, min(self.settings.transfer.concurrency, len(self.plan.shards) or 1,
                          memory // per_writer))

    def close(self) -> None:
        for pool in (self._first_reader, self._read_pool):
            if pool is not None:
                pool.shutdown(cancel_futures=True)

    def prepare(self) -> None:
        """The old index stops vouching for the root before any shard is rewritten (the shards it
        names no longer match the committed entries until the new commit)."""
        if self.journal.get("index") is None:
            try:
                self.dst.delete(self.dst_root.join(layout.index_name(self.plan.prefix)))
            except ObjectNotFound:
                pass

    def finals(self) -> list[dict]:
        return [{"op": "index"}, {"op": "finalize"}]


def _shard(ctx: PackContext, unit: dict[str, Any]) -> dict[str, Any]:
    name = unit["name"]
    done = ctx.journal.get(f"shard:{name}")
    if done and _stored(ctx.dst, ctx.dst_root.join(name), done["size"]):
        ctx.progress.skipped(unit["size"])
        for _ in unit["files"]:
            ctx.progress.file_finished()
        return done
    alone = ctx.src.scheme == "file" and ctx.shards_at_once == 1   # reads its files itself (source_batches)
    writer = ShardWriter(ctx.fmt, src=ctx.src, src_root=ctx.src_root, dst=ctx.dst, dst_root=ctx.dst_root,
                         prefix=ctx.plan.prefix, part_size=ctx.plan.part_size,
                         progress=ctx.progress, read_pool=ctx.read_pool(),
                         read_connections=pool_batch_connections(ctx.settings),
                         first_read_pool=None if alone else ctx.first_reader(), local_reads=alone)
    record = writer.write(name, unit["files"])   # [rel, size] pairs, not copied
    if ctx.fmt.exact_sizes and record["size"] != unit["size"]:
        raise BridgeError(f"internal error: {name} has {record['size']} bytes, planned {unit['size']}")
    ctx.journal.put(f"shard:{name}", record)
    return record


def _stored(store: Store, loc: Location, size: int) -> bool:
    try:
        return store.info(loc).size == size
    except ObjectNotFound:
        return False


def _records(ctx: PackContext) -> list[dict[str, Any]]:
    records = []
    for shard in ctx.plan.shards:
        record = ctx.journal.get(f"shard:{shard.name}")
        if record is None:
            raise BridgeError(f"{ctx.dst_root.join(shard.name)} was not written; run the job again")
        records.append(record)
    return records


def _index(ctx: PackContext, unit: dict[str, Any]) -> dict[str, Any]:
    """Write the index (the shard set's commit marker), then remove shards of an older, larger set
    under the same prefix, which the new index no longer names."""
    plan = ctx.plan
    doc = indexes.build(shard_format=plan.format, prefix=plan.prefix, source=plan.source,
                        shard_size=plan.shard_size, max_count=plan.max_count, records=_records(ctx))
    body = indexes.dumps(doc)
    name = layout.index_name(plan.prefix)
    written = put_whole(ctx.dst, ctx.dst_root.join(name), body)
    stale = _remove_stale(ctx)
    pointer = indexes.pointer(name, body, doc)
    ctx.journal.put("index", {"name": name, "size": written.size, "crc32c": written.crc32c,
                              "sha256": written.sha256, "stale": stale, "pointer": pointer,
                              "committed": written.committed})
    return {"index": str(ctx.dst_root.join(name)), "pointer": pointer, "stale": stale}


def _remove_stale(ctx: PackContext) -> list[str]:
    """Shards (and their lists) numbered past the new set, or in the other format. Bridge numbers
    shards from 0 without gaps, so probing names finds them without listing the root."""
    removed: list[str] = []
    for ext in FORMATS:   # format names are their extensions
        number = len(ctx.plan.shards) if ext == ctx.fmt.extension else 0
        while number < layout.MAX_SHARDS:
            name = layout.shard_name(ctx.plan.prefix, number, ext)
            gone = [rel for rel in (name, layout.list_name(ctx.plan.prefix, name))
                    if _delete_if_there(ctx.dst, ctx.dst_root.join(rel))]
            if not gone:
                break
            removed += gone
            number += 1
    return removed


def _delete_if_there(store: Store, loc: Location) -> bool:
    try:
        store.info(loc)
    except ObjectNotFound:
        return False
    store.delete(loc)
    return True


def _finalize(ctx: PackContext, unit: dict[str, Any]) -> dict[str, Any]:
    records, index = _records(ctx), ctx.journal.get("index")
    entries = []
    for r in records:
        entries.append(FileEntry(r["name"], r["size"], r["crc32c"], r["sha256"], r["part_size"], r["parts"],
                                 **r.get("committed", {})))
        listing = r["list"]
        upload = listing.get("upload", {})   # a list over one part goes up in parts, as shards do
        entries.append(FileEntry(listing["name"], listing["size"], listing["crc32c"], listing["sha256"],
                                 upload.get("part_size", 0), upload.get("parts", []), **listing.get("committed", {})))
    entries.append(FileEntry(index["name"], index["size"], index["crc32c"], index["sha256"],
                             **index.get("committed", {})))
    where = jobs.commit(ctx.dst, ctx.dst_root, ctx.plan.source, ctx.plan.destination, entries,
                        removed=index["stale"], extra={"shard_sets": {ctx.plan.prefix: index["pointer"]}})
    return {"manifest": where}


OPS = {"shard": _shard, "index": _index, "finalize": _finalize}
PackContext.ops = OPS


def run_unit(ctx: PackContext, unit: dict[str, Any]) -> dict[str, Any]:
    return ctx.run_unit(unit)


def prepare(ctx: PackContext) -> None:
    ctx.prepare()


# -- the in-process run -------------------------------------------------------------------------------

def execute(plan: PackPlan, settings: Settings, progress: Progress | None = None,
            state_dir: Path | None = None, memory: int = DEFAULT_MEMORY) -> dict[str, Any]:
    progress = progress or Progress()
    if progress.limiter is None and settings.transfer.bwlimit:
        from bridge.bwlimit import local
        progress.limiter = local(settings.transfer.bwlimit)
    journal = journal_at(state_dir or Path(settings.transfer.state_dir), plan.key)
    ctx = PackContext(plan, settings, journal, progress)
    progress.plan(plan.shard_bytes, len(plan.shards) + 2)
    ctx.shards_at_once = ctx.writers(memory)
    results = jobs.run(ctx, plan.units(), journal, ctx.shards_at_once, "packing")
    return {**plan.summary(), "ok": True, "index": results["index"], "stale_removed": len(results["stale"]),
            "manifest": results["manifest"], **progress.snapshot()}


def pack(source: str, destination: str, settings: Settings, *, fmt: str = "tar", prefix: str = "shard",
         shard_size: int = DEFAULT_SHARD_SIZE, max_count: int | None = None,
         options: dict[str, Any] | None = None, progress: Progress | None = None,
         state_dir: Path | None = None, dry_run: bool = False, memory: int = DEFAULT_MEMORY,
         max_cost: float | None = None, filters: Filters | None = None) -> dict[str, Any]:
    """Pack the tree at ``source`` into a shard set at ``destination``; return a JSON-able summary.
    With ``max_cost``, refuse (before any data request) a job estimated above that many dollars."""
    plan = plan_pack(source, destination, settings, fmt=fmt, prefix=prefix, shard_size=shard_size,
                     max_count=max_count, options=options, filters=filters)
    if max_cost is not None:
        from bridge import pricing
        pricing.check_budget(plan.usage(), settings, max_cost, "pack")
    if dry_run:
        return {"dry_run": True, **plan.summary(), "usage": plan.usage().to_dict(),
                "plan": [{"shard": s.name, "files": len(s.files), "size": s.size} for s in plan.shards]}
    return execute(plan, settings, progress, state_dir, memory)


