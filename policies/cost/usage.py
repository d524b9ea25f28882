"""What a plan will read, write and request at each store, before anything runs: the counting
half of cost (bridge.policies.cost prices what is counted here; nothing here knows a price).

A plan reports its usage through one method, ``plan.usage(route=...)``, for every job kind: the
copy and sync plan (bridge.pipeline.plan.Plan) with ``count_copy``, the pack plan with
``count_pack``, the unpack plan with ``count_unpack``. Each gives a ``Usage``: per store (source
and destination) the bytes read and written and the requests by kind, plus the bytes that pass
through bridge itself. What ran (``ran``, ``pack_ran``: from two looks at a job's journal) and
what a meter counted (``metered``) come out in the same shape. Pure functions over the plan's
data: the plans are duck-typed here, so this module sits below the plan that calls it.

Request kinds are bridge's, mapped to each provider's price classes by the price tables:

    GET       a read of object bytes (a whole small object, or one range/part)
    HEAD      a metadata read (object or bucket properties)
    LIST      one page of a listing
    PUT       a whole object written in one request
    BEGIN     starting a multipart upload (S3 CreateMultipartUpload; free elsewhere)
    PART      one part (S3 UploadPart, GCS part object, Azure Put Block)
    COMPLETE  finishing one (S3 CompleteMultipartUpload, GCS compose, Azure Put Block List)
    COPY      a server-side copy of an object or part (CopyObject, rewrite, Copy Blob/Put Block From URL)
    DELETE    a removal

The counts follow what the stores' code sends (bridge/stores/*.py) for ``direct`` and ``pack``;
for the other routes (server, from-url, sts, datasync) they follow what those services are
documented to send.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from bridge.manifest import SHARD_ENTRIES
from bridge.routes import NAMES as ROUTES
from bridge.urls import Location, parse

Plan = Any   # bridge.pipeline.plan.Plan, read by its fields (it imports this module)

LIST_PAGE = {"s3": 1000, "gs": 1000, "az": 5000, "file": 10**9}
GCS_COMPOSE_FAN_IN = 32
S3_COPY_LIMIT = 5 * 1024**3          # CopyObject takes up to 5 GiB; above, UploadPartCopy
AZ_SYNC_COPY_LIMIT = 256 * 1024**2   # Copy Blob From URL is synchronous up to 256 MiB
# S3's DeleteObjects takes up to 1,000 keys, an Azure Blob Batch 256 deletions; elsewhere one a request
DELETES_PER_REQUEST = {"s3": 1000, "az": 256}
TAR_BLOCK = 512


@dataclass
class StoreUsage:
    url: str                               # the root this side reads or writes
    bytes_read: int = 0
    bytes_written: int = 0
    requests: Counter = field(default_factory=Counter)

    @property
    def scheme(self) -> str:
        return parse(self.url).scheme

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "bytes_read": self.bytes_read, "bytes_written": self.bytes_written,
                "requests": dict(sorted(self.requests.items()))}


@dataclass
class Usage:
    route: str
    source: StoreUsage
    destination: StoreUsage
    files: int
    payload: int                 # data bytes that go from the source to the destination
    through_bridge: int          # of which pass through this process
    objects_written: int

    @property
    def request_count(self) -> int:
        return sum(self.source.requests.values()) + sum(self.destination.requests.values())

    def to_dict(self) -> dict[str, Any]:
        return {"route": self.route, "files": self.files, "payload_bytes": self.payload,
                "through_bridge_bytes": self.through_bridge, "objects_written": self.objects_written,
                "source": self.source.to_dict(), "destination": self.destination.to_dict()}


def _pages(scheme: str, count: int) -> int:
    return max(1, math.ceil(count / LIST_PAGE.get(scheme, 1000)))


def _source_listing(plan: Plan, side: StoreUsage) -> None:
    side.requests["HEAD"] += 1                       # check_bucket
    listed = getattr(plan, "listed", None)
    if plan.single:
        side.requests["HEAD"] += 1                   # info of the one object
    else:
        side.requests["LIST"] += _pages(side.scheme, listed["source"] if listed else len(plan.files))


def _sync_reads(plan: Plan, side: StoreUsage) -> None:
    """What planning a sync asked of the destination: its listing's pages, its record's listing
    and documents (``bridge.pipeline.syncplan.plan_sync`` notes the counts on the plan)."""
    listed = getattr(plan, "listed", None)
    if listed:
        side.requests["LIST"] += _pages(side.scheme, listed["destination"]) + 1
        side.requests["GET"] += listed["record_reads"]


def _destination_commit(side: StoreUsage, deletions: int, entries: int = 1) -> None:
    """check_bucket, leftover uploads listed and the record's log listed (commit), the commit's
    document written (and its shards past SHARD_ENTRIES entries), and the deletions of a sync."""
    side.requests["HEAD"] += 1
    side.requests["LIST"] += 2
    side.requests["PUT"] += 1 + (math.ceil(entries / SHARD_ENTRIES) if entries > SHARD_ENTRIES else 0)
    side.requests["DELETE"] += math.ceil(deletions / DELETES_PER_REQUEST.get(side.scheme, 1))


def _upload(side: StoreUsage, size: int, part_size: int) -> None:
    """The requests of writing one object through bridge, as each store's code sends them."""
    side.bytes_written += size
    if not part_size:
        side.requests["PUT"] += 1
        return
    parts = math.ceil(size / part_size)
    side.requests["PART"] += parts
    scheme = side.scheme
    if scheme == "s3":
        side.requests["BEGIN"] += 1
        side.requests["COMPLETE"] += 1
        side.requests["HEAD"] += 1                   # the whole-object CRC32C read back
    elif scheme == "gs":
        composes = math.ceil((parts - 1) / (GCS_COMPOSE_FAN_IN - 1)) if parts > 1 else 1
        side.requests["COMPLETE"] += composes
        side.requests["DELETE"] += parts + composes - 1   # part objects and intermediate composites
    elif scheme == "az":
        side.requests["COMPLETE"] += 1
    else:
        side.requests["COMPLETE"] += 1


def _read(side: StoreUsage, size: int, part_size: int) -> None:
    side.bytes_read += size
    side.requests["GET"] += math.ceil(size / part_size) if part_size else 1


def count_copy(plan: Plan, route: str, *, shard_size: int = 256 * 1024**2, shard_format: str = "tar",
               shard_part_size: int = 16 * 1024**2) -> Usage:
    """What copy plan ``plan`` reads, writes and requests at each store when run by ``route``
    (``Plan.usage`` asks this)."""
    if route not in ROUTES:
        raise ValueError(f"unknown route {route!r}")
    src = StoreUsage(_root(plan.source if not plan.single else plan.single))
    dst = StoreUsage(plan.destination)
    _source_listing(plan, src)
    _sync_reads(plan, dst)
    payload = plan.bytes
    written = len(plan.files)
    through = 0
    if route == "direct":
        whole = whole_bytes = 0   # files of one request: counted together (a plan may hold millions)
        for f in _shapes(plan):
            if f.part_size:
                _read(src, f.size, f.part_size)
                _upload(dst, f.size, f.part_size)
            else:
                whole += 1
                whole_bytes += f.size
        src.bytes_read += whole_bytes
        dst.bytes_written += whole_bytes
        if whole:
            src.requests["GET"] += whole
            dst.requests["PUT"] += whole
        through = payload
        listed = getattr(plan, "listed", None)
        if listed and listed["record_reads"] and not plan.files and not plan.deletions:
            dst.requests["HEAD"] += 1     # check_bucket; nothing to do under a record that stands:
            dst.requests["LIST"] += 1     # the record's listing, and no commit
        else:
            _destination_commit(dst, len(plan.deletions), len(plan.files))
    elif route == "pack":
        for f in _shapes(plan):
            _read(src, f.size, 0 if f.size <= shard_part_size else shard_part_size)
        shards = shard_sizes((f.size for f in _shapes(plan)), shard_size, shard_format)
        for size in shards:
            _upload(dst, size, shard_part_size if size > shard_part_size else 0)
        dst.requests["PUT"] += 1 + len(shards)       # the index and its per-shard files
        written = len(shards)
        through = payload
        _destination_commit(dst, 0)
    elif route == "server":
        for f in _shapes(plan):
            src.bytes_read += f.size
            dst.bytes_written += f.size
            if dst.scheme == "s3" and f.size > S3_COPY_LIMIT or dst.scheme == "az" and f.size > AZ_SYNC_COPY_LIMIT:
                dst.requests["BEGIN"] += 1 if dst.scheme == "s3" else 0
                dst.requests["COPY"] += f.parts if f.part_size else math.ceil(f.size / S3_COPY_LIMIT)
                dst.requests["COMPLETE"] += 1
            else:
                dst.requests["COPY"] += 1
        _destination_commit(dst, len(plan.deletions))
    elif route == "from-url":
        for f in _shapes(plan):
            # Put Blob/Put Block From URL: Azure reads each range from a signed source URL
            src.bytes_read += f.size
            src.requests["GET"] += f.parts if f.part_size else 1
            dst.bytes_written += f.size
            dst.requests["COPY"] += f.parts if f.part_size else 1
            dst.requests["COMPLETE"] += 1 if f.part_size else 0
        _destination_commit(dst, len(plan.deletions))
    elif route in ("sts", "datasync"):
        # The service lists both sides, reads each object whole and writes it; DataSync's
        # verification (ONLY_FILES_TRANSFERRED) reads back what it wrote.
        dst.requests["LIST"] += _pages(dst.scheme, len(plan.files))
        for f in _shapes(plan):
            src.requests["HEAD"] += 1
            _read(src, f.size, 0)
            if route == "sts":
                _upload(dst, f.size, 0)              # one (resumable) object write per object
            else:
                _upload(dst, f.size, f.part_size)    # DataSync writes large objects in parts
                dst.requests["HEAD"] += 1
        _destination_commit(dst, len(plan.deletions))
    return Usage(route, src, dst, len(plan.files), payload, through, written)


def _shapes(plan: Plan):
    """The plan's files as counting needs them (sizes and parts; bridge.pipeline.plan.FileList.shapes)."""
    shapes = getattr(plan.files, "shapes", None)
    return shapes() if shapes is not None else iter(plan.files)


def shard_sizes(sizes: Iterable[int], shard_size: int, shard_format: str = "tar") -> list[int]:
    """Sizes of the shards that packing files of these sizes in order would cut (tar: each member
    a 512-byte header and its data padded to 512, two zero blocks at the end; parquet: the data
    and about 128 bytes of columns per file)."""
    shards: list[int] = []
    current, count = 0, 0
    end = 2 * TAR_BLOCK if shard_format == "tar" else 1024
    for size in sizes:
        member = (TAR_BLOCK + math.ceil(size / TAR_BLOCK) * TAR_BLOCK) if shard_format == "tar" else size + 128
        if count and current + member + end > shard_size:
            shards.append(current + end)
            current, count = 0, 0
        current += member
        count += 1
    if count or not shards:
        shards.append(current + end)
    return shards


def count_pack(pack_plan: Any) -> Usage:
    """Usage of a real pack plan (bridge.packing.job.PackPlan, whose ``usage`` asks this):
    exact shard sizes for tar."""
    src = StoreUsage(_root(pack_plan.source_root))
    dst = StoreUsage(pack_plan.destination)
    files = pack_plan.files
    src.requests["HEAD"] += 1
    src.requests["LIST"] += _pages(src.scheme, files)
    for shard in pack_plan.shards:   # each shard's file list read in turn (a long one is on disk)
        for _rel, size in shard.files:
            _read(src, size, 0 if size <= pack_plan.part_size else pack_plan.part_size)
    for shard in pack_plan.shards:
        _upload(dst, shard.size, pack_plan.part_size if shard.size > pack_plan.part_size else 0)
    dst.requests["PUT"] += 1 + len(pack_plan.shards)
    _destination_commit(dst, 0)
    return Usage("pack", src, dst, files, pack_plan.bytes, pack_plan.bytes, len(pack_plan.shards))


def count_unpack(unpack_plan: Any, *, window: int, stream_over: int, part_size: int) -> Usage:
    """Usage of an unpack plan (bridge.packing.unpack.UnpackPlan, whose ``usage`` asks this):
    each shard read front to back
    in ranged reads of ``window`` bytes, each member written whole or, above ``stream_over``
    bytes, in parts of ``part_size``. Listing the shards was done by planning it."""
    src = StoreUsage(_root(unpack_plan.source))
    dst = StoreUsage(unpack_plan.destination)
    for shard in unpack_plan.shards:
        src.bytes_read += shard["size"]
        src.requests["GET"] += math.ceil(shard["size"] / window) if shard["size"] else 0
    files = payload = 0
    for size in unpack_plan.sizes():   # read from the plan's table on disk, a shard at a time
        files += 1
        if size >= 0:   # an index-less Parquet member's size is known once read
            _upload(dst, size, part_size if size > stream_over else 0)
            payload += size
    dst.requests["HEAD"] += 1                  # check_bucket
    _destination_commit(dst, 0)
    return Usage("unpack", src, dst, files, payload, payload, files)


def _root(url: str) -> str:
    loc = parse(url)
    return str(loc if loc.is_prefix else Location(loc.scheme, loc.bucket, loc.key.rpartition("/")[0] + "/"))


# -- what actually ran ----------------------------------------------------------------------

def ran(plan: Plan, before: set[str], after: set[str], deletions: int = 0) -> Usage:
    """The data requests and bytes of the units that finished between two looks at the journal
    (``bridge.pricing.journal_marks`` before and after a run): each sent object or part read once
    at the source and written once at the destination, by the same counts as ``count_copy``.
    Listing and the manifest are counted by ``listing`` and ``commit``."""
    new = after - before
    src = StoreUsage(_root(plan.source if not plan.single else plan.single))
    dst = StoreUsage(plan.destination)
    moved = 0
    routed = {f.rel for f in carried(plan, before, after)}
    for f in plan.files:
        if f.rel in routed:
            continue
        if not f.part_size:
            if f"file:{f.rel}" in new:
                _read(src, f.size, 0)
                _upload(dst, f.size, 0)
                moved += f.size
            continue
        for n in f.part_numbers():   # a task may hold only some of a file's parts
            if f"part:{f.rel}:{n}" in new:
                length = min(f.part_size, f.size - (n - 1) * f.part_size)
                _read(src, length, 0)
                dst.bytes_written += length
                dst.requests["PART"] += 1
                moved += length
        if f"upload:{f.rel}" in new and dst.scheme == "s3":
            dst.requests["BEGIN"] += 1
        if f"file:{f.rel}" in new:
            finished = StoreUsage(plan.destination)
            _upload(finished, f.size, f.part_size)   # the completion's requests, not its parts again
            for kind in ("COMPLETE", "HEAD", "DELETE"):
                dst.requests[kind] += finished.requests[kind]
    dst.requests["DELETE"] += deletions
    done = sum(1 for f in plan.files if f"file:{f.rel}" in new and f.rel not in routed)
    return Usage("direct", src, dst, done, moved, moved, done)


def carried(plan: Plan, before: set[str], after: set[str]) -> list:
    """The files a plan's route (server, from-url, sts, datasync) finished between two looks at
    the journal: done whole, with no part of theirs sent by bridge (those fell back to direct)."""
    if getattr(plan, "route", "direct") in (None, "direct"):
        return []
    new = after - before
    return [f for f in plan.files if f"file:{f.rel}" in new
            and not any(k.startswith(f"part:{f.rel}:") for k in after)]


def ran_routed(plan: Plan, before: set[str], after: set[str]) -> Usage | None:
    """What the plan's route sent for the files it carried (``carried``), counted as ``usage``
    counts that route: its copies and reads, not the listing or the commit."""
    files = carried(plan, before, after)
    if not files:
        return None
    full = count_copy(dataclasses.replace(plan, files=files, deletions=[]), plan.route)
    base = count_copy(dataclasses.replace(plan, files=[], deletions=[]), plan.route)
    for side, fixed in ((full.source, base.source), (full.destination, base.destination)):
        side.requests.subtract(fixed.requests)
        side.requests = +side.requests                     # drop what is left at zero
    return full


def completions(plan: Plan) -> Usage:
    """The requests of the large files a job spread over several tasks: begun when it was
    planned, completed at its commit (``plan.completions``)."""
    src = StoreUsage(_root(plan.source if not plan.single else plan.single))
    dst = StoreUsage(plan.destination)
    sizes = {f.rel: f for f in plan.files}
    for rel in getattr(plan, "completions", []):
        f = sizes.get(rel)
        if f is None or not f.part_size:
            continue
        finished = StoreUsage(plan.destination)
        _upload(finished, f.size, f.part_size)
        for kind in ("BEGIN", "COMPLETE", "HEAD", "DELETE"):
            dst.requests[kind] += finished.requests[kind]
    dst.requests = +dst.requests
    return Usage("direct", src, dst, 0, 0, 0, 0)


def listing(plan: Plan) -> Usage:
    """The requests of planning a job: the source listed, the destination's bucket looked up."""
    src = StoreUsage(_root(plan.source if not plan.single else plan.single))
    dst = StoreUsage(plan.destination)
    _source_listing(plan, src)
    return Usage("direct", src, dst, 0, 0, 0, 0)


def commit(plan: Plan) -> Usage:
    """The requests of committing a job at its destination (the manifest and the look-ups
    around it; a sync's deletions are counted as they run)."""
    src = StoreUsage(_root(plan.source if not plan.single else plan.single))
    dst = StoreUsage(plan.destination)
    _destination_commit(dst, 0)
    return Usage("direct", src, dst, 0, 0, 0, 0)


def add(total: Usage | None, more: Usage) -> Usage:
    """Two usages of the same pair of stores, summed."""
    if total is None:
        return more
    for mine, theirs in ((total.source, more.source), (total.destination, more.destination)):
        mine.bytes_read += theirs.bytes_read
        mine.bytes_written += theirs.bytes_written
        mine.requests.update(theirs.requests)
    total.files += more.files
    total.payload += more.payload
    total.through_bridge += more.through_bridge
    total.objects_written += more.objects_written
    return total


def to_fields(u: Usage) -> dict[str, int]:
    """A usage as flat counters (for a Redis hash); ``from_fields`` reads them back. A route's
    usage (not direct) has its fields under ``ROUTE:``, so each is priced as that route."""
    prefix = "" if u.route in ("direct", "pack", "unpack") else f"{u.route}:"
    out = {"payload": u.payload, "files": u.files, "objects_written": u.objects_written}
    for name, side in (("source", u.source), ("destination", u.destination)):
        out[f"{name}.bytes_read"] = side.bytes_read
        out[f"{name}.bytes_written"] = side.bytes_written
        out.update({f"{name}.req.{kind}": n for kind, n in side.requests.items()})
    return {prefix + k: v for k, v in out.items() if v}


def from_fields(fields: dict[str, Any], source: str, destination: str) -> list[Usage]:
    """The usages in a hash of ``to_fields`` counters: one through this process, one per route."""
    grouped: dict[str, dict[str, Any]] = {}
    for key, value in fields.items():
        route, sep, rest = key.rpartition(":")
        grouped.setdefault(route if sep else "direct", {})[rest] = value
    out = []
    for route, counters in grouped.items():
        src, dst = StoreUsage(_root(source)), StoreUsage(destination)
        sides = {"source": src, "destination": dst}
        for key, value in counters.items():
            name, _, rest = key.partition(".")
            if name in sides:
                if rest.startswith("req."):
                    sides[name].requests[rest[4:]] += int(value)
                else:
                    setattr(sides[name], rest, int(value))
        payload = int(counters.get("payload", 0))
        through = payload if route == "direct" else 0
        out.append(Usage(route, src, dst, int(counters.get("files", 0)), payload, through,
                         int(counters.get("objects_written", 0))))
    return out


def pack_ran(pack_plan: Any, before: set[str], after: set[str]) -> Usage:
    """The reads and writes of the shards written between two looks at the journal, counted as
    ``count_pack`` counts them."""
    src = StoreUsage(_root(pack_plan.source_root))
    dst = StoreUsage(pack_plan.destination)
    new = after - before
    files = moved = written = 0
    for shard in pack_plan.shards:
        if f"shard:{shard.name}" not in new:
            continue
        for _rel, size in shard.files:
            _read(src, size, 0 if size <= pack_plan.part_size else pack_plan.part_size)
            files += 1
            moved += size
        _upload(dst, shard.size, pack_plan.part_size if shard.size > pack_plan.part_size else 0)
        written += 1
    return Usage("pack", src, dst, files, moved, moved, written)


def pack_listing(pack_plan: Any) -> Usage:
    src = StoreUsage(_root(pack_plan.source_root))
    src.requests["HEAD"] += 1
    src.requests["LIST"] += _pages(src.scheme, pack_plan.files)
    return Usage("pack", src, StoreUsage(pack_plan.destination), 0, 0, 0, 0)


def pack_commit(pack_plan: Any) -> Usage:
    """The index and its per-shard files, and the manifest with the look-ups around it."""
    dst = StoreUsage(pack_plan.destination)
    dst.requests["PUT"] += 1 + len(pack_plan.shards)
    _destination_commit(dst, 0)
    return Usage("pack", StoreUsage(_root(pack_plan.source_root)), dst, 0, 0, 0, 0)


def metered(meter: Any, source: str, destination: str, *, route: str = "direct", moved_remote: int = 0) -> list[Usage]:
    """What a job's meter (bridge/meter.py) counted, as usages to price: every request bridge
    sent to the source's and the destination's bucket, by kind, retries included; the payload is
    the object data received from the source (or, from local files, sent to the destination),
    re-reads included. ``moved_remote``: bytes a route's store or service moved without this
    process (priced as that route: its legs and service fee)."""
    src_root, dst_root = _root(source), destination
    src_loc, dst_loc = parse(src_root), parse(dst_root)
    src_key, dst_key = f"{src_loc.scheme}://{src_loc.bucket}", f"{dst_loc.scheme}://{dst_loc.bucket}"
    rows = meter.stores
    src, dst = StoreUsage(src_root), StoreUsage(dst_root)
    there = rows.get(dst_key)
    if there is not None and not dst_loc.is_local:
        dst.requests.update(there.requests)
        dst.bytes_written += there.bytes_sent
        dst.bytes_read += there.bytes_read
    here = rows.get(src_key)
    if here is not None and not src_loc.is_local and src_key != dst_key:
        src.requests.update(here.requests)
        src.bytes_read += here.bytes_read
    if src_loc.is_local:
        payload = dst.bytes_written
    elif src_key == dst_key:
        payload = dst.bytes_read
    else:
        payload = src.bytes_read
    out = [Usage("direct", src, dst, 0, payload, payload, 0)]
    if route not in ("direct", "pack", "unpack") and moved_remote > 0:
        out.append(Usage(route, StoreUsage(src_root), StoreUsage(dst_root), 0, moved_remote, 0, 0))
    return out


def not_ours(u: Usage) -> Usage:
    """A route's usage without the requests bridge itself sends for it (the meter counts those):
    a server-side copy's and a from-url copy's writes are bridge's requests; the reads Azure
    makes of a signed URL, and everything a transfer service does, are not."""
    if u.route == "server":
        u.source.requests.clear()
        u.destination.requests.clear()
    elif u.route == "from-url":
        u.destination.requests.clear()
    return u
