"""Stage 2, plan: a copy's listing made into a ``Plan`` of files (``FileList``, kept on disk when
long), each with its part size from the destination's limits, and the units it runs as.

A unit is small and JSON-serialisable:

    {"op": "put",      "rel": "a/b.txt", "size": 12}                       a whole small file
    {"op": "batch",    "name": "batch:a/b.txt", "files": [["a/b.txt", 12], …], "slots": 8}
                                                                            small files, one request each,
                                                                            from one thread (Store.reads_many)
    {"op": "part",     "rel": "ckpt.bin", "size": …, "part_size": …, "number": 3}   one part
    {"op": "complete", "rel": "ckpt.bin", "size": …, "part_size": …}        after its last part
    {"op": "finalize"}                                                      the manifest, last

A plan whose route is not ``direct`` asks its route for its units (bridge.routes). The units run
in bridge.pipeline.units; bridge.pipeline.syncplan plans a sync.
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import json
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge import carry as carrying
from bridge import routes
from bridge.config import Settings
from bridge.contracts import FilePlan
from bridge.errors import InvalidOption
from bridge.filters import Filters
from bridge.journal import Encoded, encode, job_key, key_bytes
from bridge.manifest import FileEntry
from bridge.listing import checked_listing, resolve
from bridge.pipeline.parts import Part
from bridge.policies.cost import usage as counting
from bridge.spill import Rows
from bridge.stores import Store, get_store
from bridge.stores.base import DELETES_PER_REQUEST, MiB, ObjectInfo
from bridge.urls import Location, parse


DEFAULT_PART_SIZE = 8 * MiB  # x concurrency 8: ~64 MiB of parts in flight
# To a local destination a part is only a range read in one request and written as it arrives
# (no part limits, no part held in memory), so a big file goes in about this many parts, of
# 8-64 MiB: fewer requests, journal records and writebacks started per GiB. A 1 GiB download
# from S3 took ~12% less time in 32 MiB parts than in 8 MiB ones (bench/README.md).
LOCAL_PARTS = 32
LOCAL_MAX_PART = 64 * MiB

# Small whole files go in batches where each side sends many requests from one thread
# (Store.reads_many, Store.writes_many) or is local: one event loop keeps many requests in
# flight, where a thread per request spends its time passing the GIL around.
BATCH_FILES = 256
BATCH_BYTES = 64 * MiB

# A plan's files past this many are kept on disk (bridge.spill), not in memory.
SPILL_FILES = 10_000


_compact = json.JSONEncoder(separators=(",", ":")).encode


def _row(f: FilePlan) -> tuple:
    more = _compact({"attrs": f.attrs, "storage_class": f.storage_class, "carry": f.carry}) \
        if f.attrs is not None or f.storage_class or f.carry else ""
    return (key_bytes(f.rel), f.size, f.part_size, _compact(f.source_id) if f.source_id else "",
            f.first_part, f.last_part, more)


def _from_row(row: tuple) -> FilePlan:
    rel, size, part_size, source_id, first, last, more = row
    extra = json.loads(more) if more else {}
    return FilePlan(rel.decode("utf-8", "surrogatepass"), size, part_size, json.loads(source_id) if source_id else {},
                    first, last, extra.get("attrs"), extra.get("storage_class", ""), extra.get("carry"))


class FileList:
    """A plan's files in the order they were added, with running totals. Up to ``SPILL_FILES``
    are held in memory; past that, all of them go to an SQLite file of their own under ``where``
    (the state dir; bridge.spill), read back a page at a time: planning and running a job of ten
    million files holds a few thousand of them at once. ``find(rel)`` looks one up."""

    def __init__(self, files: Iterable[FilePlan] = (), where: Path | str | None = None):
        self.where = where
        self._held: list[FilePlan] = []
        self._rows: Rows | None = None
        self._by_rel: dict[str, FilePlan] | None = None
        self.bytes = 0
        self.multipart = 0   # files sent in parts
        for f in files:
            self.append(f)

    def append(self, f: FilePlan) -> None:
        self.bytes += f.size
        self.multipart += 1 if f.part_size else 0
        if self._rows is not None:
            self._rows.append(_row(f))
            return
        self._held.append(f)
        self._by_rel = None
        if len(self._held) > SPILL_FILES:
            self._rows = Rows(7, self.where)
            for held in self._held:
                self._rows.append(_row(held))
            self._held = []

    def extend(self, files: Iterable[FilePlan]) -> None:
        for f in files:
            self.append(f)

    def __iter__(self) -> Iterator[FilePlan]:
        if self._rows is None:
            return iter(self._held)
        return map(_from_row, self._rows)

    def shapes(self) -> Iterator[FilePlan]:
        """The files without their source identities (``source_id`` left empty), faster to read
        back: for counting units and requests, and listing a plan."""
        if self._rows is None:
            return iter(self._held)
        return (FilePlan(rel.decode("utf-8", "surrogatepass"), size, part_size, {}, first, last)
                for rel, size, part_size, first, last in self._rows.columns_of((0, 1, 2, 4, 5)))

    def rels(self) -> Iterator[str]:
        """The files' names alone, in order (a scope check reads no more of them)."""
        if self._rows is None:
            return (f.rel for f in self._held)
        return (rel.decode("utf-8", "surrogatepass") for rel, in self._rows.columns_of((0,)))

    def __len__(self) -> int:
        return len(self._held) if self._rows is None else len(self._rows)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __getitem__(self, i: int) -> FilePlan:
        if self._rows is None:
            return self._held[i]
        if i < 0:
            i += len(self)
        for n, f in enumerate(self):
            if n == i:
                return f
        raise IndexError(i)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (FileList, list)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __repr__(self) -> str:
        return f"FileList({len(self)} files, {self.bytes} bytes)"

    def find(self, rel: str) -> FilePlan | None:
        if self._rows is not None:
            row = self._rows.find(key_bytes(rel))
            return None if row is None else _from_row(row)
        if self._by_rel is None:
            self._by_rel = {f.rel: f for f in reversed(self._held)}
        return self._by_rel.get(rel)

    @property
    def spilled(self) -> bool:
        """Whether the files are on disk (an SQLite connection a forked process may not share)."""
        return self._rows is not None

    def copy_to(self, path: Path | str) -> None:
        """A spilled list's rows written to ``path``, for a forked process to read (``reading``)."""
        self._rows.copy_to(path)

    def reading(self, path: Path | str) -> FileList:
        """This list as ``copy_to`` left it at ``path``, read through a connection of this process."""
        copy = FileList(where=self.where)
        copy.bytes, copy.multipart = self.bytes, self.multipart
        copy._rows = Rows.reading(path, 7, len(self))
        return copy

    def close(self) -> None:
        if self._rows is not None:
            self._rows.close()


class Entries:
    """Manifest entries (``FileEntry.to_dict``'s form) in the order added: a plan's adopted
    objects. Each is held as its JSON text, encoded once where it is added (a ``FileEntry`` or
    its dict) and journaled as that text (``encoded``): a sync that adopted 20,000 objects spent
    a fifth of its time encoding, decoding and encoding each entry again. Up to ``SPILL_FILES``
    are held in memory; past that, all of them go to an SQLite file of their own under
    ``where`` (bridge.spill), so that a sync that adopts the ten million objects of another
    tool's copy holds a few thousand at once."""

    def __init__(self, entries: Iterable[dict] = (), where: Path | str | None = None):
        self.where = where
        self._held: list[tuple[str, str]] = []   # (path, JSON text)
        self._rows: Rows | None = None
        for entry in entries:
            self.append(entry)

    def append(self, entry: dict | FileEntry) -> None:
        if isinstance(entry, FileEntry):
            self.append_encoded(entry.path, entry.text())
        else:
            self.append_encoded(entry["path"], encode(entry))

    def append_encoded(self, path: str, text: str) -> None:
        """An entry already encoded (``encoded``'s text, as another process's plan gave it)."""
        row = (path, text)
        if self._rows is not None:
            self._rows.append(row)
            return
        self._held.append(row)
        if len(self._held) > SPILL_FILES:
            self._rows = Rows(2, self.where)
            for held in self._held:
                self._rows.append(held)
            self._held = []

    def blocks(self) -> Iterator | None:
        """The entries laid out as a commit's shards (``manifest.Block``) where they are held so
        (bridge.pipeline.forkplan ``PartEntries``); None here."""
        return None

    def encoded(self) -> Iterator[tuple[str, Encoded]]:
        """(path, the entry's JSON text) of each, in order: the text as encoded when added."""
        for path, text in (self._held if self._rows is None else self._rows):
            yield path, Encoded(text)

    def __iter__(self) -> Iterator[dict]:
        return (json.loads(text) for _path, text in (self._held if self._rows is None else self._rows))

    def __len__(self) -> int:
        return len(self._held) if self._rows is None else len(self._rows)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __repr__(self) -> str:
        return f"Entries({len(self)})"

    def close(self) -> None:
        if self._rows is not None:
            self._rows.close()

@dataclass
class Plan:
    source: str           # URL of the source root (prefix) or object
    destination: str      # URL of the destination root (prefix)
    single: str | None    # when one object is copied: its source URL
    # A plain list, or a FileList (which keeps a long one on disk); a list becomes a FileList.
    files: FileList = field(default_factory=FileList)
    deletions: list[str] = field(default_factory=list)
    key: str = ""
    route: str = "direct"  # bridge.routes: how the files' bytes go, and why
    route_why: str = ""
    # Files whose parts ran in several tasks: completed among the finals, before the manifest.
    completions: list[str] = field(default_factory=list)
    batch: int = 0        # > 0: whole files travel in "batch" units of up to this many
    slots: int = 1        # how much of the job's concurrency one batch unit takes
    # Manifest entries of objects found already at the destination, equal to their source
    # (bridge/adopt.py): never sent; journaled before the units run (``journal_adopted``) and so
    # committed with the files the job writes.
    adopted: Entries = field(default_factory=Entries)

    def __post_init__(self) -> None:
        if not isinstance(self.files, FileList):
            self.files = FileList(self.files)
        if not isinstance(self.adopted, Entries):
            self.adopted = Entries(self.adopted)
        self._counted: tuple | None = None

    @property
    def bytes(self) -> int:
        return self.files.bytes

    def units(self) -> Iterator[dict[str, Any]]:
        """The units that can start at once, made as they are taken; ``complete`` and
        ``finalize`` follow from results."""
        if self.route != "direct":
            yield from routes.get(self.route).units(self)
            return
        per_unit = self.deletes_per_unit()
        for start in range(0, len(self.deletions), per_unit):
            yield {"op": "deletes", "rels": self.deletions[start:start + per_unit]}
        yield from self.direct_units(self.files)

    def direct_units(self, files: Iterable[FilePlan]) -> Iterator[dict[str, Any]]:
        """The units that copy ``files`` through this process: one put, parts, or batches of
        whole files. Each carries what its file's records need (``source_id``), so that a
        running job keeps no table of its files."""
        batch: list[list] = []
        held = 0
        for f in files:
            if f.part_size:
                whole = f.whole
                for n in f.part_numbers():
                    yield {"op": "part", "rel": f.rel, "size": f.size, "part_size": f.part_size, "number": n,
                           "source_id": f.source_id, "whole": whole,
                           **({"carry": {"crc32c": f.carry["parts"][n - 1], "sha256": f.carry["part_sha256"][n - 1]}}
                              if f.carry else {})}
            elif self.batch:
                batch.append([f.rel, f.size, f.source_id, *([f.carry] if f.carry else [])])
                held += f.size
                if len(batch) >= self.batch or held >= BATCH_BYTES:
                    yield self._batch_unit(batch)
                    batch, held = [], 0
            else:
                yield {"op": "put", "rel": f.rel, "size": f.size, "source_id": f.source_id,
                       **({"carry": f.carry} if f.carry else {})}
        if batch:
            yield self._batch_unit(batch)

    def _batch_unit(self, files: list[list]) -> dict[str, Any]:
        # named after its first file, so that its failure stops only itself (jobs._group)
        return {"op": "batch", "name": f"batch:{files[0][0]}", "files": files, "slots": self.slots}

    def deletes_per_unit(self) -> int:
        """The destination's deletions a unit takes: as many as one request removes there
        (``DELETES_PER_REQUEST``), so that deletions one at a time still run side by side."""
        return DELETES_PER_REQUEST.get(self.destination.split("://", 1)[0], 1)

    def unit_count(self) -> int:
        if self.route != "direct":
            return routes.get(self.route).unit_count(self)
        key = (len(self.files), self.batch, len(self.completions), len(self.deletions))
        if self._counted is None or self._counted[0] != key:
            self._counted = (key, self._count_direct())
        return self._counted[1]

    def _count_direct(self) -> int:
        """What ``direct_units`` would yield, and the completions that follow, counted in one
        pass over the files without making the units."""
        units = len(self.completions) + math.ceil(len(self.deletions) / self.deletes_per_unit()) + 1
        batch = held = 0
        for f in self.files.shapes():
            if f.part_size:
                parts = f.part_numbers()
                units += len(parts) + (1 if len(parts) == f.parts else 0)
            elif self.batch:
                batch += 1
                held += f.size
                if batch >= self.batch or held >= BATCH_BYTES:
                    units += 1
                    batch = held = 0
            else:
                units += 1
        return units + (1 if batch else 0)

    def usage(self, route: str | None = None, *, shard_size: int = 256 * MiB,
              shard_format: str = "tar") -> counting.Usage:
        """What this plan will read, write and request at each store, on ``route`` (its own
        route when None; one that ``bridge.policies.cost.usage`` does not model counts as
        direct). ``shard_size``/``shard_format``: the shards the ``pack`` route would cut."""
        if route is None:
            route = self.route if self.route in counting.ROUTES else "direct"
        return counting.count_copy(self, route, shard_size=shard_size, shard_format=shard_format)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "destination": self.destination, "single": self.single,
                "files": [_file_dict(f) for f in self.files], "deletions": list(self.deletions), "key": self.key,
                "route": self.route, "route_why": self.route_why, "completions": list(self.completions),
                "batch": self.batch, "slots": self.slots, "adopted": list(self.adopted)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        return cls(d["source"], d["destination"], d["single"], [FilePlan(**f) for f in d["files"]],
                   list(d.get("deletions", [])), d.get("key", ""), d.get("route", "direct"),
                   d.get("route_why", ""), list(d.get("completions", [])), d.get("batch", 0), d.get("slots", 1),
                   list(d.get("adopted", [])))


def _file_dict(f: FilePlan) -> dict[str, Any]:
    """``asdict(f)`` in a tenth of the time (a plan of millions of files is written as JSON)."""
    d = dict(f.__dict__)
    d["source_id"] = dict(f.source_id)
    if f.attrs is not None:
        d["attrs"] = copy.deepcopy(f.attrs)
    return d

def part_size_for(size: int, store: Store, requested: int | None) -> int:
    """Part size for ``size`` bytes on ``store``: the request (or the default), raised to the
    store's minimum and to what keeps the part count under its limit; 0 for one request."""
    f = store.features
    chosen = requested or DEFAULT_PART_SIZE
    if requested is None and store.scheme == "file":
        chosen = min(max(chosen, size // LOCAL_PARTS), LOCAL_MAX_PART)
    if size <= chosen or not f.multipart:
        return 0
    chosen = max(chosen, f.min_part_size, math.ceil(size / f.max_parts))
    chosen = math.ceil(chosen / MiB) * MiB if chosen > MiB else chosen
    if chosen > f.max_part_size:
        raise InvalidOption(f"{size} bytes cannot be split into at most {f.max_parts} parts of at most "
                            f"{f.max_part_size} bytes on {store.scheme}://")
    return chosen

def check_chunk_size(chunk_size: int | None, store: Store) -> None:
    """A requested part size the destination can never take is bad input, whatever the files."""
    if chunk_size is not None and chunk_size > store.features.max_part_size:
        raise InvalidOption(f"--chunk-size {chunk_size} is over the {store.scheme}:// limit of "
                            f"{store.features.max_part_size} bytes per part")

def plan_copy(source: str, destination: str, settings: Settings, chunk_size: int | None = None,
              archived_ok: bool = False, filters: Filters | None = None,
              listed: Callable[[int], None] | None = None, part: Part | None = None) -> Plan:
    """``archived_ok``: plan sources that need a restore too (to price them: mcbridge plan).
    ``part``: only the paths of one part of the source prefix (bridge.pipeline.parts), listed by
    themselves; the plan's roots and key are the whole job's."""
    early = _early_carrier(source, settings) if part is None else None
    if part is None:
        src_root, dst_root, objects, single = resolve(source, destination, settings, filters, listed)
    else:
        src_root, dst_root, objects, single = part_roots(source, destination, settings, part, filters, listed)
    checked = checked_listing(src_root, dst_root, objects, single, archived_ok)
    dst_store = get_store(dst_root, settings)
    check_chunk_size(chunk_size, dst_store)
    files = FileList(where=spill_dir(settings))
    if early is not None and single is None and early[0] == src_root:
        carrier = early[1].result()
    else:
        carrier = carrier_for(src_root, single, settings) if part is None or part.record else None
    for rel, info in checked:
        files.append(file_plan(rel, info, dst_store, chunk_size, carrier))
    plan = Plan(str(src_root) if single is None else single, str(dst_root), single, files)
    # Not the file list: a re-run after the source gained or lost files is the same job, and
    # finds its finished files and parts by path, size and source identity (JobContext.matches).
    plan.key = job_key("copy", plan.source, plan.destination, chunk_size,
                       *((filters.key(),) if filters is not None and filters.active else ()))
    batching(plan, src_root, dst_root, settings)
    return plan

def part_roots(source: str, destination: str, settings: Settings, part: Part, filters: Filters | None = None,
               listed: Callable[[int], None] | None = None):
    """``resolve``'s answer for one part of a prefix: (source root, destination root, the part's
    listing that ``filters`` select, None). The job was split from the top level of a prefix:
    both roots are prefixes."""
    src_root, dst_root = parse(source).as_prefix(), parse(destination).as_prefix()
    return src_root, dst_root, part_listing(get_store(src_root, settings), src_root, part, filters, listed), None


def part_listing(store: Store, root: Location, part: Part, filters: Filters | None = None,
                 listed: Callable[[int], None] | None = None) -> Iterator[tuple[str, ObjectInfo]]:
    """A part's listing, as ``bridge.filters.walk`` gives a whole prefix's: what ``filters`` select."""
    objects = part.walk(store, root, listed)
    if filters is None or not filters.active:
        return objects
    return ((rel, info) for rel, info in objects if filters.selects(rel, info))


def batching(plan: Plan, src_root: Location, dst_root: Location, settings: Settings) -> None:
    """Batches of small files where they pay, each side overlapping many requests from one
    thread or local: reads from a store that ``reads_many`` to local files, local files to a
    store that ``writes_many``, and from one such store to the other (the batch read whole
    first, then sent: a remote read inside the sending thread would serialise the requests).
    A batch takes the job's whole concurrency (its connections), so one runs at a time beside
    nothing else of this job: one event loop, not several contending for the GIL."""
    src_many = src_root.is_local or get_store(src_root, settings).reads_many
    dst_many = dst_root.is_local or get_store(dst_root, settings).writes_many
    if src_many and dst_many and not (src_root.is_local and dst_root.is_local):
        plan.batch, plan.slots = BATCH_FILES, settings.transfer.concurrency

def spill_dir(settings: Settings) -> Path:
    """Where a long plan's files go (FileList): beside the journals, in the state dir."""
    return Path(settings.transfer.state_dir) / "spill"

def file_plan(rel: str, info: ObjectInfo, dst_store: Store, chunk_size: int | None,
              carrier: carrying.Carrier | None = None) -> FilePlan:
    part_size = part_size_for(info.size, dst_store, chunk_size)
    carry = carrier.lookup(rel, info) if carrier is not None else None
    if carry is not None and chunk_size is None and part_size and carry["part_size"] != part_size \
            and _takes_part_size(info.size, dst_store, carry["part_size"]):
        part_size = carry["part_size"]   # the source's parts: their SHA-256s carry over
    if carry is not None and not carrying.fits(carry, part_size):
        carry = None
    return FilePlan(rel, info.size, part_size, dict(info.identity),
                    attrs=None if info.attrs is None else info.attrs.to_dict(), storage_class=info.storage_class,
                    carry=carry)

def _takes_part_size(size: int, store: Store, part_size: int) -> bool:
    f = store.features
    return (f.multipart and f.min_part_size <= part_size <= f.max_part_size and part_size < size
            and math.ceil(size / part_size) <= f.max_parts)

def carrier_for(src_root: Location, single: str | None, settings: Settings) -> carrying.Carrier | None:
    """The source record's hashes, for a copy of a prefix (bridge.carry)."""
    if single is not None:
        return None
    return carrying.Carrier(get_store(src_root, settings), src_root, settings.transfer.sha256)

def _early_carrier(source: str, settings: Settings) -> tuple[Location, cf.Future] | None:
    """For a source named as a remote prefix: its record looked for (``carrier_for``) on a
    thread of its own, while ``resolve`` reads the first page of the listing, instead of after
    it (over HTTPS, 2,000 objects: the record's LIST was 25 ms of a 1.4 s copy, each round trip
    waiting for the other). What it raises is raised when the plan takes it."""
    root = parse(source)
    if not root.is_prefix or root.is_local:
        return None
    from bridge.meter import Pool   # the thread meters into the job's meter, as the listing does
    pool = Pool(1, thread_name_prefix="mcbridge-record")
    try:
        return root, pool.submit(carrier_for, root, None, settings)
    finally:
        pool.shutdown(wait=False)
