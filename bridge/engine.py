"""The transfer engine.

A copy is planned into small JSON-serialisable units:

    {"op": "put",      "rel": "a/b.txt", "size": 12}                       a whole small file
    {"op": "batch",    "name": "batch:a/b.txt", "files": [["a/b.txt", 12], …], "slots": 8}
                                                                            small files, one request each,
                                                                            from one thread (Store.reads_many)
    {"op": "part",     "rel": "ckpt.bin", "size": …, "part_size": …, "number": 3}   one part
    {"op": "complete", "rel": "ckpt.bin", "size": …, "part_size": …}        after its last part
    {"op": "finalize"}                                                      the manifest, last

``JobContext`` (a ``bridge.jobs.Context``) runs one unit; an executor decides where units run
(``bridge.jobs.ThreadExecutor`` here, ``workers/`` on Celery), and finalize commits through
``bridge.jobs.commit``. Every unit is idempotent: finished work is found in the journal (and, for parts, in the store's
own list of an unfinished upload) and is not sent again.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import copy
import hashlib
import json
import math
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any

from bridge import attributes
from bridge import carry as carrying
from bridge import check
from bridge import jobs
from bridge import manifest as manifests
from bridge import routes
from bridge.config import Settings
from bridge.contracts import FilePlan
from bridge.errors import BridgeError, IntegrityError, InvalidOption, ObjectNotFound
from bridge.filters import Filters
from bridge.hashing import (NO_WHOLE_SHA256, FileHash, OrderedSha256, combine_parts, crc32c, crc_hex, rehash_parts,
                            sha256_tree)
from bridge.journal import Journal, job_key, key_bytes
from bridge.listing import checked_listing, parent as _parent, resolve  # noqa: F401  (ops and packing import them from here)
from bridge.jobs import FATAL, Outcome, ThreadExecutor, describe  # noqa: F401  (their old home)
from bridge.manifest import FileEntry, RawEntry
from bridge.progress import Progress
from bridge.spill import Rows
from bridge.stores import Store, get_store
from bridge.stores.base import MiB, ObjectInfo
from bridge.urls import Location, parse

DEFAULT_PART_SIZE = 8 * MiB  # x concurrency 8: ~64 MiB of parts in flight
# To a local destination a part is only a range read in one request and written as it arrives
# (no part limits, no part held in memory), so a big file goes in about this many parts, of
# 8-64 MiB: fewer requests, journal records and writebacks started per GiB. A 1 GiB download
# from S3 took ~12% less time in 32 MiB parts than in 8 MiB ones (bench/README.md).
LOCAL_PARTS = 32
LOCAL_MAX_PART = 64 * MiB
# Whole files written to a local destination are made durable together (one syncfs) after this
# many files or bytes, and only then journaled as written.
SETTLE_FILES = 512
SETTLE_BYTES = 256 * MiB
# Small whole files go in batches where each side sends many requests from one thread
# (Store.reads_many, Store.writes_many) or is local: one event loop keeps many requests in
# flight, where a thread per request spends its time passing the GIL around.
BATCH_FILES = 256
BATCH_BYTES = 64 * MiB
BATCH_IN_FLIGHT = 64 * MiB   # a batch's bytes in flight at once, at most (batch_connections)
# Parts bound for a local destination are received and written this much at a time: the piece is
# still in the CPU's cache (L2) when it is written. Receiving a whole 8 MiB part first and writing
# it then cost 2-3x the system time in a probe (bench/README.md).
PIECE = 256 * 1024


# -- planning ------------------------------------------------------------------------------

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

    def close(self) -> None:
        if self._rows is not None:
            self._rows.close()


class Entries:
    """Manifest entries (``FileEntry.to_dict``'s form) in the order added: a plan's adopted
    objects. Up to ``SPILL_FILES`` are held in memory; past that, all of them go to an SQLite file
    of their own under ``where`` as their JSON text (bridge.spill), so that a sync that adopts the
    ten million objects of another tool's copy holds a few thousand at once."""

    def __init__(self, entries: Iterable[dict] = (), where: Path | str | None = None):
        self.where = where
        self._held: list[dict] = []
        self._rows: Rows | None = None
        for entry in entries:
            self.append(entry)

    def append(self, entry: dict) -> None:
        if self._rows is not None:
            self._rows.append((json.dumps(entry, separators=(",", ":")),))
            return
        self._held.append(entry)
        if len(self._held) > SPILL_FILES:
            self._rows = Rows(1, self.where)
            for held in self._held:
                self._rows.append((json.dumps(held, separators=(",", ":")),))
            self._held = []

    def __iter__(self) -> Iterator[dict]:
        if self._rows is None:
            return iter(self._held)
        return (json.loads(text) for text, in self._rows)

    def __len__(self) -> int:
        return len(self._held) if self._rows is None else len(self._rows)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __repr__(self) -> str:
        return f"Entries({len(self)})"

    def close(self) -> None:
        if self._rows is not None:
            self._rows.close()


def journal_adopted(journal: Journal, adopted: Iterable[dict]) -> None:
    """Adopted objects' entries into the job's journal as files it holds (``file:<path>``), a page
    at a time, where the journal has no record of the path yet (a file a killed run of the job
    wrote keeps the record of what it wrote): the commit then names them with what the job
    wrote, read from the journal as those are (in process, and the service's finalize alike)."""
    page: list[tuple[str, dict]] = []

    def flush() -> None:
        held = journal.get_many([key for key, _ in page])
        journal.put_many([record for record, there in zip(page, held) if there is None])
        page.clear()

    for entry in adopted:
        page.append((f"file:{entry['path']}", entry))
        if len(page) >= 2000:
            flush()
    if page:
        flush()


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
        for rel in self.deletions:
            yield {"op": "delete", "rel": rel}
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
        units = len(self.completions) + len(self.deletions) + 1
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
              listed: Callable[[int], None] | None = None) -> Plan:
    """``archived_ok``: plan sources that need a restore too (to price them: mcbridge plan)."""
    early = _early_carrier(source, settings)
    src_root, dst_root, objects, single = resolve(source, destination, settings, filters, listed)
    checked = checked_listing(src_root, dst_root, objects, single, archived_ok)
    dst_store = get_store(dst_root, settings)
    check_chunk_size(chunk_size, dst_store)
    files = FileList(where=spill_dir(settings))
    if early is not None and single is None and early[0] == src_root:
        carrier = early[1].result()
    else:
        carrier = carrier_for(src_root, single, settings)
    for rel, info in checked:
        files.append(file_plan(rel, info, dst_store, chunk_size, carrier))
    plan = Plan(str(src_root) if single is None else single, str(dst_root), single, files)
    # Not the file list: a re-run after the source gained or lost files is the same job, and
    # finds its finished files and parts by path, size and source identity (JobContext.matches).
    plan.key = job_key("copy", plan.source, plan.destination, chunk_size,
                       *((filters.key(),) if filters is not None and filters.active else ()))
    batching(plan, src_root, dst_root, settings)
    return plan


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


# -- running ---------------------------------------------------------------------------------

class JobContext(jobs.Context):
    """What units of one copy share in one process: stores, journal, progress, per-file state."""

    def __init__(self, plan: Plan, settings: Settings, journal: Journal, progress: Progress | None = None):
        self.plan = plan
        self.settings = settings
        self.journal = journal
        self.progress = progress or Progress()
        self.src_root = parse(plan.source) if plan.single is None else _parent(parse(plan.single, empty_segments=True))
        self.dst_root = parse(plan.destination)
        self.src = get_store(self.src_root, settings)
        self.dst = get_store(self.dst_root, settings)
        self._lock = threading.Lock()
        self._file_locks: dict[str, threading.Lock] = {}
        self._hashers: dict[str, OrderedSha256] = {}
        self._buffers = threading.local()
        self._uploads: dict[str, tuple[str, dict]] = {}
        self._upload_failed: dict[str, BridgeError] = {}
        # Per-file state is kept for the files in flight only (units carry the rest): parts
        # still to finish of each file this process completes when its last part is done.
        self._parts_left: dict[str, int] = {}
        # A local destination's whole files skip their two fsyncs each (file, folder): they are
        # settled in batches, and journaled only once durable (settle), so the journal never
        # names a file a power loss could take back, and the manifest never follows one.
        self.defer_sync = self.dst_root.is_local
        self._unsettled: list[tuple[Location, str, dict]] = []
        self._unsettled_bytes = 0
        self._settling = threading.Lock()
        # Full batches settle on a thread of their own while the job goes on (settle_behind).
        self._settler: cf.ThreadPoolExecutor | None = None
        self._behind: collections.deque[cf.Future] = collections.deque()
        self.fallbacks: dict[str, str] = {}      # file -> why its route could not carry it
        self.unproven: dict[str, str] = {}       # file -> why nothing proved the copy its route made
        self.route_down: str | None = None       # why the job's route is not tried again
        self.cancelled = threading.Event()       # set when the job is interrupted: remote routes cancel
        self.remote: dict | None = None          # what a remote route's service calls its job
        self.cancel_note = ""                    # what a remote route says of the job it cancelled

    def source_id(self, unit: dict) -> dict:
        """The identity of the unit's source file as planned: carried by the unit, or (a unit
        made by hand, a header's completion) looked up in the plan."""
        if "source_id" in unit:
            return unit["source_id"]
        planned = self.plan.files.find(unit["rel"])
        return planned.source_id if planned else {}

    def matches(self, rec: dict | None, unit: dict) -> bool:
        """Whether a journaled record was made for this version of the unit's source file."""
        return bool(rec) and rec.get("size") == unit["size"] and rec.get("source_id", {}) == self.source_id(unit)

    def src_loc(self, rel: str) -> Location:
        return parse(self.plan.single, empty_segments=True) if self.plan.single else self.src_root.join(rel)

    def dst_loc(self, rel: str) -> Location:
        return self.dst_root.join(rel)

    def _file_lock(self, rel: str) -> threading.Lock:
        with self._lock:
            return self._file_locks.setdefault(rel, threading.Lock())

    def part_buffer(self, size: int) -> bytearray:
        """This thread's buffer of at least ``size`` bytes, kept for its next part (a fresh one
        per part cost page faults and zeroing: bench/README.md)."""
        buf = getattr(self._buffers, "buf", None)
        if buf is None or len(buf) < size:
            buf = self._buffers.buf = bytearray(size)
        return buf

    def hasher(self, rel: str, carried: bool = False) -> OrderedSha256:
        """The file's whole SHA-256 fed in part order, when asked for (``transfer.sha256``) and
        not carried from the source's record; otherwise one that takes nothing: each part is
        hashed on its own, in parallel."""
        if not self.settings.transfer.sha256 or carried:
            return NO_WHOLE_SHA256
        with self._lock:
            if rel not in self._hashers:   # parts waiting their turn: at most one per thread
                self._hashers[rel] = OrderedSha256(max_pending=self.settings.transfer.concurrency)
            return self._hashers[rel]

    def upload(self, unit: dict) -> tuple[str, dict]:
        """The upload id for a file, continuing a journaled one the store still holds."""
        rel = unit["rel"]
        with self._file_lock(rel):
            if rel in self._uploads:
                return self._uploads[rel]
            if rel in self._upload_failed:   # the file's other parts waited here: not asked again
                raise self._upload_failed[rel]
            loc = self.dst_loc(rel)
            rec = self.journal.get(f"upload:{rel}")
            held = None
            if self.matches(rec, unit) and rec["part_size"] == unit["part_size"]:
                held = self.dst.list_parts(loc, rec["id"])
            if held is None:
                if rec:
                    self.dst.abort_upload(loc, rec["id"])
                try:
                    upload_id = self.dst.begin_upload(loc, unit["size"], self.attrs(rel))
                except BridgeError as exc:
                    self._upload_failed[rel] = exc
                    raise
                self.journal.put(f"upload:{rel}", {"id": upload_id, "size": unit["size"],
                                                   "part_size": unit["part_size"],
                                                   "source_id": self.source_id(unit)})
                held = {}
            else:
                upload_id = rec["id"]
            self._uploads[rel] = (upload_id, held)
            return self._uploads[rel]

    def attrs(self, rel: str, known: attributes.Attrs | None = None) -> attributes.Attrs | None:
        """The headers and user metadata the destination object gets (bridge.attributes.for_copy):
        the source's (``known``, or from the plan, or asked of the source store), with the
        settings' overrides. None: nothing to write."""
        objects = self.settings.objects
        if objects.metadata == "off" and not (objects.content_type or objects.set_metadata):
            return None
        source = known
        if objects.metadata == "on" and source is None:
            planned = self.plan.files.find(rel)
            if planned is not None and planned.attrs is not None:
                source = attributes.Attrs.from_dict(planned.attrs)
            else:
                size = planned.size if planned else 0
                source = self.src.attributes(ObjectInfo(self.src_loc(rel), size))
        return attributes.for_copy(source, objects)

    def journaled(self, unit: dict, entry: dict) -> dict:
        return {**entry, "source_id": self.source_id(unit)}

    def finished(self, rel: str) -> None:
        """A multipart file is complete: what this process held for it goes."""
        with self._lock:
            self._uploads.pop(rel, None)
            self._hashers.pop(rel, None)
            self._file_locks.pop(rel, None)
            self._parts_left.pop(rel, None)

    def written(self, unit: dict, entry: dict, size: int, batch: list | None = None) -> None:
        """Journal a whole file as written: at once, into ``batch`` (which its caller journals in
        one transaction when the batch is done), or at the next settle where it waits for one."""
        rel = unit["rel"]
        record = self.journaled(unit, entry)
        if not self.defer_sync:
            if batch is not None:
                batch.append((f"file:{rel}", record))
            else:
                self.journal.put(f"file:{rel}", record)
            return
        with self._lock:
            self._unsettled.append((self.dst_loc(rel), f"file:{rel}", record))
            self._unsettled_bytes += size
            full = len(self._unsettled) >= SETTLE_FILES or self._unsettled_bytes >= SETTLE_BYTES
        if full:
            self.settle_behind()

    def settle_behind(self) -> None:
        """Settle the files written so far on the settling thread, while the job goes on: a
        syncfs takes tens of milliseconds, for which the thread that filled the batch (an event
        loop with eight downloads in flight) stood still. At most two batches wait there; a
        third waits here for the oldest, whose error, if any, is raised here."""
        with self._lock:
            batch, self._unsettled, self._unsettled_bytes = self._unsettled, [], 0
            if not batch:
                return
            if self._settler is None:
                self._settler = cf.ThreadPoolExecutor(1, thread_name_prefix="mcbridge-settle")
            self._behind.append(self._settler.submit(self._settle, batch))
            oldest = self._behind.popleft() if len(self._behind) > 2 else None
        if oldest is not None:
            oldest.result()

    def settle(self) -> None:
        """Make every file written so far durable, then journal it: the batches settling behind
        are waited for, then the rest is settled here. A failure journals none of a batch: a
        re-run writes its files again."""
        with self._settling:
            while True:
                with self._lock:
                    behind = self._behind.popleft() if self._behind else None
                if behind is None:
                    break
                behind.result()
            with self._lock:
                batch, self._unsettled, self._unsettled_bytes = self._unsettled, [], 0
                settler, self._settler = self._settler, None
            if settler is not None:
                settler.shutdown(wait=False)   # idle now; a later batch starts another
            if batch:
                self._settle(batch)

    def _settle(self, batch: list[tuple[Location, str, dict]]) -> None:
        self.dst.settle([loc for loc, _key, _record in batch])
        self.journal.put_many([(key, record) for _loc, key, record in batch])

    def parts_finished(self, rel: str) -> bool:
        with self._lock:
            if rel not in self._parts_left:
                return False   # its parts run in several tasks: completed at commit
            self._parts_left[rel] -= 1
            if self._parts_left[rel]:
                return False
            del self._parts_left[rel]
            return True

    def before_submit(self, unit: dict) -> None:
        if unit["op"] == "part":   # in submission order, before any part can wait on it
            rel = unit["rel"]
            if "whole" in unit:
                whole = unit["whole"]
            else:   # a unit made by hand
                planned = self.plan.files.find(rel)
                whole = bool(planned and planned.part_size and planned.whole)
            if whole:
                with self._lock:   # a file this process completes: counted when its first part goes
                    self._parts_left.setdefault(rel, math.ceil(unit["size"] / unit["part_size"]))
            self.hasher(rel, "carry" in unit).expect(unit["number"])

    def followups(self, unit: dict) -> list[dict]:
        if unit["op"] == "part" and self.parts_finished(unit["rel"]):
            return [{"op": "complete", "rel": unit["rel"], "size": unit["size"], "part_size": unit["part_size"],
                     "source_id": self.source_id(unit)}]
        if unit["op"] == "route":   # the files a route handed back go the direct way
            with self._lock:
                back = [rel for rel in unit["files"] if rel in self.fallbacks]
            fallen = [self.plan.files.find(rel) for rel in back]
            units = list(self.plan.direct_units(fallen))
            self.progress.plan(0, len(units) + sum(1 for f in fallen if f.part_size))
            return units
        return []

    def finals(self) -> list[dict]:
        completions = [self.plan.files.find(rel) for rel in self.plan.completions]
        return [*({"op": "complete", "rel": f.rel, "size": f.size, "part_size": f.part_size,
                   "source_id": f.source_id} for f in completions),
                {"op": "finalize"}]

    def prepare(self) -> None:
        """Temporaries a killed run left beside the files. (The prefix's committed entries stay:
        a file rewritten before this job commits no longer matches its entry, and a new one is
        extra, so ``verify`` fails until the commit.)"""
        if self.dst_root.is_local:
            self.dst.clean_temporaries(self._folders())
        journal_adopted(self.journal, self.plan.adopted)

    def _folders(self) -> Iterator[Location]:
        """The folders the plan's files go to, each once (or, past a few thousand, now and then
        again: a second look costs a listdir, a table of every folder would cost memory)."""
        seen: set[str] = set()
        for f in self.plan.files:
            folder = f.rel.rpartition("/")[0]
            if folder not in seen:
                if len(seen) >= SETTLE_FILES * 8:
                    seen.clear()
                seen.add(folder)
                yield _parent(self.dst_loc(f.rel))


def _metadata(h: FileHash) -> dict[str, str]:
    return {"bridge_crc32c": h.crc32c, **({"bridge_sha256": h.sha256} if h.sha256 else {})}


def _put(ctx: JobContext, unit: dict) -> dict:
    done = ctx.journal.get(f"file:{unit['rel']}")
    if ctx.matches(done, unit):
        ctx.progress.skipped(unit["size"])
        return done
    ctx.progress.throttle(unit["size"])
    return _write(ctx, unit, ctx.dst.body(ctx.src.read(ctx.src_loc(unit["rel"]))))


def _batch(ctx: JobContext, unit: dict) -> dict:
    """Small whole files through ``Store.read_many`` (to a local destination), ``Store.put_many``
    (from a local source), or both (between two stores: the batch's bytes read first, at most
    BATCH_BYTES, then sent): each written and journaled as it arrives, as ``_put`` does one.
    Files already journaled are skipped; those that fail are the unit's error (the first, and
    how many more), the rest of the batch written all the same."""
    todo = []
    keys = [f"file:{rel}" for rel, *_rest in unit["files"]]
    records = ctx.journal.get_many(keys)   # the whole batch in one query (one round trip for the service's)
    for (rel, size, *more), done in zip(unit["files"], records):   # more: its source_id, then what it carries
        one = {"rel": rel, "size": size, **({"source_id": more[0]} if more else {}),
               **({"carry": more[1]} if len(more) > 1 else {})}
        if ctx.matches(done, one):
            ctx.progress.skipped(size)
        else:
            todo.append(one)
    connections = batch_connections(ctx.settings, max((one["size"] for one in todo), default=0))
    if ctx.src.reads_many and ctx.dst_root.is_local:
        def each(i: int, data: bytes) -> None:
            _write(ctx, todo[i], ctx.dst.body(data))

        # a bandwidth limit is taken before each request goes, so that the answers, not only
        # the writes, follow it (bridge.bwlimit: in the batch's event loop it waits without blocking)
        failures = ctx.src.read_many([ctx.src_loc(one["rel"]) for one in todo], each, connections=connections,
                                     pace=lambda i: ctx.progress.throttle(todo[i]["size"]))
    else:
        read: dict[int, bytes] = {}
        failures = {}
        if not ctx.src_root.is_local:   # from a store to a store: the batch's bytes first
            failures = ctx.src.read_many([ctx.src_loc(one["rel"]) for one in todo], read.__setitem__,
                                         connections=connections)
        going = [i for i in range(len(todo)) if i not in failures]
        hashes: dict[int, FileHash] = {}
        md5s: dict[int, str | None] = {}

        def body(k: int) -> tuple:
            i = going[k]
            rel = todo[i]["rel"]
            ctx.progress.throttle(todo[i]["size"])   # a bandwidth limit paces what goes out
            data = ctx.dst.body(read.pop(i) if i in read else ctx.src.read(ctx.src_loc(rel)))
            hashes[i] = _hashed(ctx, todo[i], data)
            md5s[i] = _md5(ctx, data)
            return (ctx.dst_loc(rel), data, hashes[i].crc32c, _metadata(hashes[i]), ctx.attrs(rel),
                    None if "carry" in todo[i] else hashes[i].sha256)

        # What was sent is journaled in one transaction when the batch is done (one per file
        # cost a SQLite commit each); a kill before that only sends those files again.
        journaled: list[tuple[str, dict]] = []

        def sent(k: int, committed: ObjectInfo) -> None:
            i = going[k]
            _record(ctx, todo[i], hashes.pop(i), check.md5_evidence(committed, md5s.pop(i)), journaled)

        try:
            unsent = ctx.dst.put_many(len(going), body, sent, connections=connections)
        finally:
            ctx.journal.put_many(journaled)
        failures.update((going[k], exc) for k, exc in unsent.items())
    if failures:
        first = failures[min(failures)]
        if len(failures) == 1:
            raise first
        error = copy.copy(first)   # its type kept: a fatal error still stops the job
        error.args = (f"{first} (and {len(failures) - 1} more files of its batch of {len(unit['files'])})",)
        raise error
    return {}


def batch_connections(settings: Settings, biggest: int) -> int:
    """Requests a batch keeps in flight: ``transfer.small_files_in_flight``, as many as keep at
    most ``BATCH_IN_FLIGHT`` bytes of files of up to ``biggest`` bytes in flight, and never fewer
    than ``transfer.concurrency`` (a batch takes the job's whole concurrency: it runs alone)."""
    t = settings.transfer
    return max(t.concurrency, min(t.small_files_in_flight, BATCH_IN_FLIGHT // max(biggest, 1)))


def pool_batch_connections(settings: Settings) -> int:
    """Requests in flight per batch where batches run on every thread of a pool at once (a
    pack's reads, an unpack's puts): ``transfer.small_files_in_flight`` in all."""
    t = settings.transfer
    return max(1, t.small_files_in_flight // t.concurrency)


def _write(ctx: JobContext, unit: dict, data) -> dict:
    h = _hashed(ctx, unit, data)
    durability = {"durable": False} if ctx.defer_sync else {}
    # a SHA-256 taken of these bytes (not carried) is the one a store that signs its payload signs
    committed = ctx.dst.put(ctx.dst_loc(unit["rel"]), data, crc32c=h.crc32c, metadata=_metadata(h),
                            attrs=ctx.attrs(unit["rel"]), sha256=None if "carry" in unit else h.sha256 or None,
                            **durability)
    return _record(ctx, unit, h, check.md5_evidence(committed, _md5(ctx, data)))


def _md5(ctx: JobContext, data) -> str | None:
    """The MD5 of a one-request upload's bytes where the destination's ETag is the only proof
    it may give that it stored them (check.wants_md5)."""
    if not check.wants_md5(ctx.dst_root, ctx.settings.transfer.store_checksums):
        return None
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _hashed(ctx: JobContext, unit: dict, data) -> FileHash:
    if len(data) != unit["size"]:
        raise IntegrityError(f"{ctx.src_loc(unit['rel'])}: read {len(data)} bytes, planned {unit['size']}: "
                             f"the source changed during the copy")
    carried = unit.get("carry")
    if carried is None:
        return FileHash.of(data)
    crc = crc_hex(crc32c(data))
    _check_carried(ctx, unit, crc, carried["crc32c"])
    return FileHash(len(data), crc, carried["sha256"])


def _check_carried(ctx: JobContext, unit: dict, crc: str, recorded: str, part: int = 0) -> None:
    """The bytes read are the ones the source's record hashed (bridge.carry), by CRC32C."""
    if crc != recorded:
        what = f"part {part}" if part else "its bytes"
        raise IntegrityError(f"{ctx.src_loc(unit['rel'])}: {what} read with CRC32C {crc}, the source's manifest "
                             f"says {recorded}: the source is damaged or changed since it was recorded")


def _record(ctx: JobContext, unit: dict, h: FileHash, committed: ObjectInfo, batch: list | None = None) -> dict:
    entry = manifests.entry_from_hash(unit["rel"], h, committed=committed)
    if "carry" in unit:
        entry.computed, entry.carried = ["crc32c"], carrying.provenance(unit["carry"])
    entry = entry.to_dict()
    ctx.written(unit, entry, h.size, batch)
    ctx.progress.moved(h.size)
    ctx.progress.file_finished()
    return entry


def _part(ctx: JobContext, unit: dict) -> dict:
    rel, number, part_size = unit["rel"], unit["number"], unit["part_size"]
    if ctx.matches(ctx.journal.get(f"file:{rel}"), unit):
        length = min(part_size, unit["size"] - (number - 1) * part_size)
        ctx.progress.skipped(length)
        return {"skipped": True}
    hasher = ctx.hasher(rel, "carry" in unit)
    try:
        upload_id, held = ctx.upload(unit)
        offset = (number - 1) * part_size
        length = min(part_size, unit["size"] - offset)
        known = ctx.journal.get(f"part:{rel}:{number}")
        stored = held.get(number)
        # A part journaled without its own SHA-256 was hashed into its file's (a local
        # destination, below): finished all the same, the file is hashed again from disk then.
        finished = bool(known and (known.get("sha256") or ctx.dst_root.is_local) and known["size"] == length
                        and stored and stored.size == length and stored.crc32c in ("", known["crc32c"]))
        if finished and not ctx.src_root.is_local:
            # Reading it again from a cloud source would pay its egress twice: the journal has
            # its CRC32C and SHA-256, and the file's whole SHA-256 comes from elsewhere (_complete).
            hasher.feed(number, None)
            ctx.progress.skipped(length)
            return known
        ctx.progress.throttle(length)
        dst = ctx.dst_loc(rel)
        if ctx.dst_root.is_local:
            # Written piece by piece as it arrives, then hashed into the file's SHA-256 from the
            # page cache when its turn comes: a part that finished before the parts ahead of it
            # holds no memory, and its thread goes on to the next. The part's own SHA-256 is
            # taken as it arrives when the whole file's is not asked for (the default) or carried;
            # with it, not: when the file's does not come about (a resume, parts in other
            # processes), _complete hashes the file and its parts from disk.
            carried = unit.get("carry")
            crc, sha = _receive_part(ctx, rel, upload_id, offset, length,
                                     not ctx.settings.transfer.sha256 and carried is None)
            if carried is not None:
                _check_carried(ctx, unit, crc, carried["crc32c"], number)
                sha = carried["sha256"]
            region = ctx.dst.written_region(dst, upload_id, offset, length)
            if finished and known["crc32c"] == crc:
                hasher.feed(number, region)
                ctx.progress.skipped(length)
                if sha and not known.get("sha256"):
                    known = {**known, "sha256": sha}
                    ctx.journal.put(f"part:{rel}:{number}", known)
                return known
            record = ctx.dst.record_part(dst, upload_id, number, offset, length, crc)
            hasher.feed(number, region)
        else:
            data = ctx.dst.body(ctx.src.read(ctx.src_loc(rel), offset, length))
            if len(data) != length:
                raise IntegrityError(f"{ctx.src_loc(rel)}: short read at {offset}: the source changed")
            crc = crc_hex(crc32c(data))
            if finished and known["crc32c"] == crc:
                hasher.feed(number, data)
                ctx.progress.skipped(length)
                return known
            # Each part's own SHA-256 lets a cloud destination's resume and verify go without the
            # whole file's.
            hasher.feed(number, data)
            if "carry" in unit:
                _check_carried(ctx, unit, crc, unit["carry"]["crc32c"], number)
                sha, taken = unit["carry"]["sha256"], None
            else:   # taken from these bytes: a store that signs the payload's hash signs this one
                sha = taken = hashlib.sha256(data).hexdigest()
            record = ctx.dst.upload_part(dst, upload_id, number, offset, data, crc, sha256=taken)
        if record.crc32c != crc:
            raise IntegrityError(f"{dst}: part {number} stored with CRC32C {record.crc32c}, "
                                 f"sent {crc}")
        done = {**record.to_dict(), "sha256": sha}
        ctx.journal.put(f"part:{rel}:{number}", done)
        ctx.progress.moved(length)
        return done
    except BaseException as exc:
        hasher.fail(exc)
        raise


def _receive_part(ctx: JobContext, rel: str, upload_id: str, offset: int, length: int,
                  sha: bool) -> tuple[str, str]:
    """Bytes [offset, offset+length) of ``rel`` from the source into the local destination's
    partial file, a piece at a time through this thread's buffer; their CRC32C, and with ``sha``
    their SHA-256 ("" without)."""
    src = ctx.src_loc(rel)
    short = f"{src}: short read at {offset}: the source changed"

    def fill(write) -> tuple[str, str]:
        crc, at, digest = 0, 0, None

        def each(pos: int, view: memoryview) -> None:
            nonlocal crc, at, digest
            if pos == 0:      # a retried request hands its pieces over again
                crc, at, digest = 0, 0, hashlib.sha256() if sha else None
            if pos != at or pos + len(view) > length:
                raise IntegrityError(short)
            write(pos, view)
            crc, at = crc32c(view, crc), pos + len(view)
            if digest is not None:
                digest.update(view)

        if ctx.src.read_through(src, offset, length, ctx.part_buffer(PIECE), each) != length or at != length:
            raise IntegrityError(short)
        return crc_hex(crc), digest.hexdigest() if digest is not None else ""

    return ctx.dst.write_part(ctx.dst_loc(rel), upload_id, offset, fill)


def _complete(ctx: JobContext, unit: dict) -> dict:
    rel, size, part_size = unit["rel"], unit["size"], unit["part_size"]
    done = ctx.journal.get(f"file:{rel}")
    if ctx.matches(done, unit):
        ctx.finished(rel)
        return done
    from bridge.stores.base import PartRecord
    count = math.ceil(size / part_size)
    parts, part_sha256 = [], []
    for n in range(1, count + 1):
        rec = ctx.journal.get(f"part:{rel}:{n}")
        if rec is None:
            raise BridgeError(f"{ctx.dst_loc(rel)}: part {n} of {count} is missing; run the copy again")
        parts.append(PartRecord.from_dict(rec))
        part_sha256.append(rec.get("sha256", ""))
    crc = crc_hex(combine_parts([(int(p.crc32c, 16), p.size) for p in parts]))
    # The whole-file SHA-256, when asked for, exists when every part passed here in order; a
    # resume that skipped finished parts takes it from a local destination (no egress), or leaves
    # it out. Without it the record is the parts' SHA-256s, their tree digest and the CRC32C.
    asked = ctx.settings.transfer.sha256
    planned = ctx.plan.files.find(rel)
    carried = planned.carry if planned is not None else None
    if carried is not None:   # the whole object's CRC32C end to end, then the source's SHA-256s
        _check_carried(ctx, unit, crc, carried["crc32c"])
        if carried["sha256_tree"] and all(part_sha256) \
                and sha256_tree(part_sha256, part_size) != carried["sha256_tree"]:
            raise IntegrityError(f"{ctx.src_loc(rel)}: the source's manifest records a sha256-tree its own part "
                                 f"SHA-256s do not give: the record is damaged")
    whole = (carried["sha256"] or None) if carried is not None else ctx.hasher(rel).whole(count)
    h = FileHash(size, crc, whole or "")
    upload_id, _held = ctx.upload(unit)
    dst = ctx.dst_loc(rel)
    reported = ctx.dst.complete_upload(dst, upload_id, parts, crc32c=crc, metadata=_metadata(h),
                                       attrs=ctx.attrs(rel))
    check.completed(ctx.dst, dst, reported, crc, ctx.settings.transfer.store_checksums)
    note = ""
    if dst.is_local and (whole is None if asked else not all(part_sha256)):
        again, whole, part_sha256 = rehash_parts(ctx.dst, dst, size, part_size, whole=asked)
        if again != crc:
            raise IntegrityError(f"{dst}: CRC32C {again} on disk after completing, expected {crc}")
        h = FileHash(size, crc, whole)
    elif asked and whole is None:
        note = "sha256 left out: a resumed copy did not read finished parts again; part_sha256 covers every byte"
    # The completion's answer names the version written (S3's ETag, an answer read back): the
    # entry records that, as a one-request put does, without asking again.
    committed = reported if reported.identity and reported.size == size else manifests.committed_info(ctx.dst, dst, h)
    entry = manifests.entry_from_hash(rel, h, part_size, [p.crc32c for p in parts], committed)
    if all(part_sha256):
        entry.part_sha256 = part_sha256
        entry.sha256_tree = sha256_tree(part_sha256, part_size)
    if carried is not None:
        entry.computed, entry.carried = ["crc32c"], carrying.provenance(carried)
    elif not h.sha256:
        entry.computed = ["crc32c", "part_sha256", "sha256_tree"] if entry.sha256_tree else ["crc32c"]
        entry.note = note
    entry = entry.to_dict()
    ctx.journal.put(f"file:{rel}", ctx.journaled(unit, entry))
    ctx.finished(rel)
    ctx.progress.file_finished()
    return entry


def _route(ctx: JobContext, unit: dict) -> dict:
    """Files carried by the plan's route (bridge/routes); those it cannot carry go direct."""
    todo = []
    for rel in unit["files"]:
        f = ctx.plan.files.find(rel)
        if ctx.matches(ctx.journal.get(f"file:{rel}"), {"rel": rel, "size": f.size, "source_id": f.source_id}):
            ctx.progress.skipped(f.size)
        else:
            todo.append(f)
    fallen, unproven = {}, {}
    ids = {f.rel: f.source_id for f in todo}
    results = iter(()) if ctx.route_down else routes.get(ctx.plan.route).run(ctx, todo)
    for rel, result in results:
        if isinstance(result, routes.Fallback):
            fallen[rel] = str(result)
            if result.job_wide:
                ctx.route_down = str(result)
            continue
        ctx.journal.put(f"file:{rel}", ctx.journaled({"rel": rel, "source_id": ids.get(rel, {})}, result.to_dict()))
        if result.unproven:
            unproven[rel] = result.note
        ctx.progress.file_finished()
    for f in todo:
        if f.rel not in fallen and ctx.route_down and not ctx.matches(
                ctx.journal.get(f"file:{f.rel}"), {"rel": f.rel, "size": f.size, "source_id": f.source_id}):
            fallen[f.rel] = ctx.route_down
    with ctx._lock:
        ctx.fallbacks.update(fallen)
        ctx.unproven.update(unproven)
    if fallen:
        ctx.progress.fell_back(len(fallen))
    return {"route": ctx.plan.route, "fallback": sorted(fallen), "unproven": sorted(unproven)}


def _delete(ctx: JobContext, unit: dict) -> dict:
    try:
        ctx.dst.delete(ctx.dst_loc(unit["rel"]))
    except ObjectNotFound:
        pass  # already gone: a re-run after a kill
    return {"deleted": unit["rel"]}


def journaled_entries(journal: Journal, counted: list[int] | None = None) -> Iterator[FileEntry | RawEntry]:
    """The entries of the files a job's journal holds as written, sorted by path (the journal's
    key order), read as they are consumed; ``counted[0]`` counts them. A record in the form
    ``JobContext.written`` gives it is committed as its text (``RawEntry``), any other decoded."""
    for _key, raw in journal.raw_items("file:"):
        if counted is not None:
            counted[0] += 1
        yield RawEntry.of(raw) or FileEntry.from_dict(json.loads(raw))


def _finalize(ctx: JobContext, unit: dict) -> dict:
    ctx.settle()  # every file durable before the manifest, the commit marker, names it
    counted = [0]
    # (objects adopted, found already at the destination and equal to their source, are in the
    # journal beside what the job wrote: journal_adopted)
    where = jobs.commit(ctx.dst, ctx.dst_root, ctx.plan.source, ctx.plan.destination,
                        journaled_entries(ctx.journal, counted), removed=ctx.plan.deletions)
    return {"manifest": where, "files": counted[0]}


OPS = {"put": _put, "batch": _batch, "part": _part, "complete": _complete, "delete": _delete, "finalize": _finalize,
       "route": _route}
JobContext.ops = OPS


def run_unit(ctx: JobContext, unit: dict) -> dict:
    return ctx.run_unit(unit)


def followups(ctx: JobContext, unit: dict) -> list[dict]:
    return ctx.followups(unit)


def prepare(ctx: JobContext) -> None:
    """Before any byte moves (see ``JobContext.prepare``)."""
    ctx.prepare()
