"""Writing one shard: the steps are fixed here; a format only encodes.

``ShardWriter.write`` opens a streaming upload for the shard's predictable name, reads each
file of the shard (ahead of time, in batches on a shared pool), hashes it, hands
it to the format's encoder, closes the upload, and writes the shard's file list. Formats are
found through ``FORMATS`` (module, class, the extra that installs them); each declares its limits
so a plan can refuse what it cannot hold before anything is written.
"""

from __future__ import annotations

import abc
import collections
import concurrent.futures as cf
import hashlib
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from bridge import registry
from bridge.errors import BridgeError, IntegrityError, InvalidOption
from bridge.packing import layout
from bridge.packing.sink import PARTS_IN_FLIGHT, StreamingUpload
from bridge.progress import Progress
from bridge.retry import reported, reporting
from bridge.stores.base import MiB, Store
from bridge.urls import Location

READ_AHEAD_BYTES = 16 * MiB   # read ahead of each shard writer
READ_AHEAD_BATCHES = 64       # ... and at most this many batches (a shard of tiny files is not read whole)
READ_BATCH_FILES = 64         # small files read and hashed together, one pool task
READ_BATCH_BYTES = 1 * MiB
# A run of local files waited on its storage (not on the CPU) when it took more than this a file
# and this rate's time for its bytes: 64 files of 8 KiB are read from the page cache and hashed
# in about 2 ms (30 us a file); opening a file on a network or parallel filesystem is a round
# trip (NFS, a Lustre metadata server: hundreds of microseconds and up), and a cold disk seeks.
SLOW_READ_FILE = 100e-6
SLOW_READ_RATE = 200 * MiB
SLOW_READS = 3   # runs in a row that waited on their storage before the reads go wide


class ShardEncoder(abc.ABC):
    """Turns a shard's files, in order, into bytes on ``sink``; records where each one landed."""

    def __init__(self, sink: StreamingUpload):
        self.sink = sink
        self.placements: list = []   # one per file, in order, since the last lines(): where it landed

    @abc.abstractmethod
    def add(self, rel: str, data: bytes, sha256: str) -> None: ...

    def add_many(self, files: list[tuple[str, int]], read: list[tuple[bytes, str]]) -> None:
        """A run of small files: (rel, size) and their (bytes, sha256), in order."""
        for (rel, _size), (data, sha) in zip(files, read, strict=True):
            self.add(rel, data, sha)

    def add_stream(self, rel: str, size: int, chunks: Iterable[bytes]) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    def finish(self) -> None: ...

    def lines(self, placed: collections.deque[tuple[str, str]]) -> bytes:
        """The shard list's lines of the files placed since the last call (taken, in order, from
        ``placed``: (rel, sha256) of the files added and not yet listed)."""
        if not self.placements:
            return b""
        placements, self.placements = self.placements, []
        return self.format_lines([placed.popleft() for _ in placements], placements)

    def format_lines(self, placed: list[tuple[str, str]], placements: list) -> bytes:
        """One JSON line per file: its path, its placement's fields (a dict), its SHA-256."""
        return b"".join([json.dumps({"path": rel, **placement, "sha256": sha}, separators=(",", ":"),
                                    ensure_ascii=False).encode() + b"\n"
                         for (rel, sha), placement in zip(placed, placements, strict=True)])


class ShardFormat(abc.ABC):
    """A shard format: its extension, its limits and its size arithmetic, and an encoder."""

    name: ClassVar[str]
    extension: ClassVar[str]
    max_file_size: ClassVar[int]          # larger files are refused at planning
    streams_large_files: ClassVar[bool]   # whether add_stream works (files bigger than a part)
    exact_sizes: ClassVar[bool]           # whether shard_size() is exact, not an estimate

    def __init__(self, options: dict[str, Any]):
        self.options = options

    @abc.abstractmethod
    def file_size(self, rel: str, size: int) -> int:
        """Bytes one file adds to a shard."""

    @abc.abstractmethod
    def shard_size(self, files_bytes: int) -> int:
        """A shard's size from the sum of ``file_size`` of its files."""

    def memory_per_writer(self, part_size: int) -> int:
        return (PARTS_IN_FLIGHT + 1) * part_size + READ_AHEAD_BYTES   # sent, and filling: sink.StreamingUpload

    @abc.abstractmethod
    def encoder(self, sink: StreamingUpload) -> ShardEncoder: ...


@dataclass(frozen=True)
class FormatEntry:
    target: str   # "module:Class"
    extra: str    # the pip extra that installs what it needs ("" when nothing)


FORMATS: dict[str, FormatEntry] = {
    "tar": FormatEntry("bridge.packing.tarfmt:TarFormat", ""),
    "parquet": FormatEntry("bridge.packing.parquetfmt:ParquetFormat", "pack"),
}


def get_format(name: str, options: dict[str, Any] | None = None) -> ShardFormat:
    entry = FORMATS.get(name)
    if entry is None:
        raise InvalidOption(f"unknown shard format {name!r}: use one of {', '.join(sorted(FORMATS))}")
    return registry.load(entry.target, entry.extra, f"--format {name}")(options or {})


def format_for_shard(name: str) -> str | None:
    for fmt in FORMATS:
        if name.endswith("." + fmt):
            return fmt
    return None


# -- reading the files of one shard -------------------------------------------------------------

Batch = list[tuple[str, int]]


def _read_batch(store: Store, root: Location, batch: Batch, progress: Progress,
                connections: int) -> tuple[list[tuple[bytes, str]], float]:
    """Read and hash a run of small files; with the seconds it took. Hashing and I/O release the
    GIL, so batches on a pool overlap with the encoder of the same shard. A store that keeps
    several requests in flight from one thread (``reads_many``: the object stores' direct paths)
    reads the run with ``connections`` of them: a small object's time is mostly the endpoint's
    round trip."""
    started = time.monotonic()
    if not store.reads_many:
        out = []
        sha256 = hashlib.sha256
        with reporting(lambda _e: progress.retried()):
            read = store.read_listed(root, batch)
        for (rel, size), data in zip(batch, read, strict=True):
            if len(data) != size:
                raise IntegrityError(f"{root.join(rel)}: read {len(data)} bytes, listed {size}: the source "
                                     f"changed during packing")
            out.append((data, sha256(data).hexdigest()))
        return out, time.monotonic() - started
    got: list[tuple[bytes, str] | None] = [None] * len(batch)

    def each(i: int, data: bytes) -> None:
        rel, size = batch[i]
        if len(data) != size:
            raise IntegrityError(f"{root.join(rel)}: read {len(data)} bytes, listed {size}: the source "
                                 f"changed during packing")
        got[i] = (data, hashlib.sha256(data).hexdigest())

    failures = store.read_many([root.join(rel) for rel, _size in batch], each, connections=connections)
    if failures:
        raise failures[min(failures)]
    return got, time.monotonic() - started   # type: ignore[return-value]   (every index filled, or failed)


def waits_on_storage(seconds: float, files: int, nbytes: int) -> bool:
    """Whether a run of ``files`` local files (``nbytes``) read in ``seconds`` waited on its
    storage (a cold disk, a parallel or network filesystem: reads in parallel then overlap their
    waits) rather than took CPU (the page cache: reads in parallel then only contend for the
    GIL). Above SLOW_READ_FILE a file plus SLOW_READ_RATE's time for its bytes, it waited."""
    return seconds > files * SLOW_READ_FILE + nbytes / SLOW_READ_RATE


def _batches(files: list[tuple[str, int]], stream_over: int) -> Iterator[tuple[Batch, bool]]:
    """Consecutive small files in runs of at most READ_BATCH_FILES / READ_BATCH_BYTES;
    a file over ``stream_over`` is a run of its own, flagged to be streamed."""
    batch: Batch = []
    nbytes = 0
    for rel, size in files:
        if size > stream_over:
            if batch:
                yield batch, False
                batch, nbytes = [], 0
            yield [(rel, size)], True
            continue
        batch.append((rel, size))
        nbytes += size
        if len(batch) >= READ_BATCH_FILES or nbytes >= READ_BATCH_BYTES:
            yield batch, False
            batch, nbytes = [], 0
    if batch:
        yield batch, False


def source_batches(store: Store, root: Location, files: list[tuple[str, int]], *, stream_over: int,
                   pool: cf.Executor, progress: Progress, connections: int, first: cf.Executor | None = None,
                   local: bool = False) -> Iterator[tuple[Batch, list[tuple[bytes, str]] | None]]:
    """Runs of files in order with their (bytes, sha256), read ahead on ``pool`` within a bounded
    window of READ_AHEAD_BYTES; a file over ``stream_over`` comes alone, with None: the writer
    streams it in ranges. ``connections``: requests in flight per batch (``_read_batch``).
    ``first``: a pool of one thread that reads the runs one after another until SLOW_READS of
    them in a row waited on their storage (``waits_on_storage``), and ``pool`` from then on:
    local files in the page cache are read faster by one thread than by eight (which take turns
    holding the GIL for each system call), files on a slow or remote filesystem faster by eight.
    ``local``: the same, the runs read here, in the caller's thread, instead of by ``first``: for
    a writer that is alone (one shard at a time), whose reads handed over from another thread
    took turns with it for the GIL at every system call (a pack of 20,000 x 8 KiB in one shard:
    1.885 s by median against 1.935 s, CPU 1.69 s against 1.74 s, twelve alternated runs). With
    several writers at once one thread reading for all costs less: five writers each reading
    its own took 2.05 s against 1.90 s. (In a row: a run read in the page cache now and then
    takes 50-90 ms, not 2, waiting for the GIL that the encoder and the part senders hold.)"""
    window: collections.deque = collections.deque()
    ahead = 0
    todo = _batches(files, stream_over)
    reading = first or pool
    slow = 0   # runs in a row that waited on their storage
    try:
        while local:
            item = next(todo, None)
            if item is None:
                return
            batch, stream = item
            if stream:
                yield batch, None
                continue
            read, seconds = _read_batch(store, root, batch, progress, connections)
            slow = slow + 1 if waits_on_storage(seconds, len(batch), sum(size for _rel, size in batch)) else 0
            if slow >= SLOW_READS:
                local, reading = False, pool
            yield batch, read
        while True:
            while ahead < READ_AHEAD_BYTES and len(window) < READ_AHEAD_BATCHES:   # tiny files: by count too
                item = next(todo, None)
                if item is None:
                    break
                batch, stream = item
                future = None if stream else reading.submit(_read_batch, store, root, batch, progress,
                                                             connections)
                nbytes = 0 if stream else sum(size for _rel, size in batch)
                window.append((batch, future, nbytes))
                ahead += nbytes
            if not window:
                return
            batch, future, nbytes = window.popleft()
            ahead -= nbytes
            if future is None:
                yield batch, None
                continue
            read, seconds = future.result()
            if reading is not pool:
                slow = slow + 1 if waits_on_storage(seconds, len(batch), nbytes) else 0
                if slow >= SLOW_READS:
                    reading = pool   # (the runs already queued stay with the first reader)
            yield batch, read
    finally:
        for _batch, future, _n in window:
            if future:
                future.cancel()


def ranged_chunks(store: Store, loc: Location, size: int, chunk: int, progress: Progress,
                  hasher) -> Iterator[bytes]:
    for offset in range(0, size, chunk):
        length = min(chunk, size - offset)
        data = reported(lambda offset=offset, length=length: store.read(loc, offset, length),
                        lambda _e: progress.retried())
        if len(data) != length:
            raise IntegrityError(f"{loc}: short read at {offset}: the source changed during packing")
        hasher.update(data)
        yield data


# -- one shard -------------------------------------------------------------------------------------

class ShardWriter:
    """Writes one planned shard and its file list; returns the shard's index record."""

    def __init__(self, fmt: ShardFormat, *, src: Store, src_root: Location, dst: Store, dst_root: Location,
                 prefix: str, part_size: int, progress: Progress, read_pool: cf.Executor,
                 read_connections: int, first_read_pool: cf.Executor | None = None,
                 local_reads: bool = False):
        self.fmt, self.src, self.src_root, self.dst, self.dst_root = fmt, src, src_root, dst, dst_root
        self.prefix, self.part_size = prefix, part_size
        self.progress, self.read_pool, self.read_connections = progress, read_pool, read_connections
        self.first_read_pool = first_read_pool   # (source_batches' ``first``)
        self.local_reads = local_reads           # (source_batches' ``local``)

    def write(self, name: str, files: Iterable[tuple[str, int]]) -> dict[str, Any]:
        """The shard, and its file list streamed beside it: each file's line is written as soon
        as the format places it (a shard of a million files holds no list of their entries).
        ``files``: [rel, size] pairs in pack order, a list or a plan's table on disk read anew
        at each pass (bridge.packing.job.MemberSlice)."""
        count = nbytes = 0
        first = last = ""
        for rel, size in files:   # the plan checked these; a hand-made unit may not have been
            if size > self.fmt.max_file_size:
                raise InvalidOption(f"{rel}: {size} bytes is over the {self.fmt.name} limit of "
                                    f"{self.fmt.max_file_size} bytes per file")
            first = first or rel
            last, count, nbytes = rel, count + 1, nbytes + size
        sink = StreamingUpload(self.dst, self.dst_root.join(name), part_size=self.part_size,
                               progress=self.progress)
        list_rel = layout.list_name(self.prefix, name)
        listing = StreamingUpload(self.dst, self.dst_root.join(list_rel), part_size=self.part_size)
        try:
            encoder = self.fmt.encoder(sink)
            self._encode(encoder, files, listing, name)
            written = sink.close()
            listed = listing.close()
        except BaseException:
            sink.abort()
            listing.abort()
            raise
        listing_record = {"name": list_rel, "size": listed.size, "sha256": listed.sha256, "crc32c": listed.crc32c,
                          "committed": listed.committed,
                          "upload": {"part_size": listed.part_size, "parts": listed.parts}}
        return {"name": name, "size": written.size, "sha256": written.sha256, "crc32c": written.crc32c,
                "files": count, "bytes": nbytes, "first": first, "last": last,
                "list": listing_record, "part_size": written.part_size, "parts": written.parts,
                "committed": written.committed}

    def _encode(self, encoder: ShardEncoder, files: list[tuple[str, int]], listing: StreamingUpload,
                name: str) -> None:
        stream_over = self.part_size if self.fmt.streams_large_files else self.fmt.max_file_size
        placed: collections.deque[tuple[str, str]] = collections.deque()   # (rel, sha) the format has not placed yet
        auditing = self.progress.auditing()   # a line per file packed, at -v
        for batch, read in source_batches(self.src, self.src_root, files, stream_over=stream_over,
                                          pool=self.read_pool, first=self.first_read_pool,
                                          local=self.local_reads,
                                          progress=self.progress,
                                          connections=self.read_connections):
            if read is None:
                (rel, size), = batch
                hasher = hashlib.sha256()
                encoder.add_stream(rel, size, ranged_chunks(self.src, self.src_root.join(rel), size,
                                                            self.part_size, self.progress, hasher))
                placed.append((rel, hasher.hexdigest()))
            else:
                encoder.add_many(batch, read)
                placed.extend([(rel, sha) for (rel, _size), (_data, sha) in zip(batch, read)])
            lines = encoder.lines(placed)   # in file order; a Parquet row group's at its flush
            if lines:
                listing.write(lines)
            self.progress.files_finished(len(batch))
            if auditing:
                for rel, size in batch:
                    self.progress.said("packed", rel, size, why=f"into {name}")
        encoder.finish()
        listing.write(encoder.lines(placed))
        if placed:
            raise BridgeError(f"internal error: {len(placed)} files of the shard were never placed")
