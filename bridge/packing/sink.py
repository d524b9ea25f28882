"""Write one object as its bytes are produced, without staging it on disk.

Bytes collect in memory up to one part; the first full part starts a multipart upload and every
later full part goes out as soon as it fills, on threads of their own while the next one fills:
up to ``PARTS_IN_FLIGHT`` at once, so one shard is not held to one part's round trip at a time. A
writer holds at most ``PARTS_IN_FLIGHT`` parts being sent and the one filling, however big the
object grows. An object that ends smaller than one part is sent in a single request. Its size
is not known when the upload begins, so stores get 0 as their size hint.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from bridge.meter import Pool
from bridge import verdicts
from bridge.errors import BridgeError, InvalidOption
from bridge.hashing import FileHash, combine_parts, crc32c, crc_hex
from bridge.manifest import committed_info, provenance
from bridge.progress import Progress
from bridge.retry import reported
from bridge.stores.base import MiB, PartRecord, Store
from bridge.urls import Location

DEFAULT_PART_SIZE = 16 * MiB
PARTS_IN_FLIGHT = 3   # parts of one object being sent at once (memory: bridge.packing.writer)


def stream_part_size(store: Store, expected_size: int, requested: int | None = None) -> int:
    """A part size for an object of about ``expected_size`` bytes whose final size is unknown:
    the request (or 16 MiB), raised to the store's minimum and so that twice the expected size
    still fits in the store's part count."""
    f = store.features
    chosen = max(requested or DEFAULT_PART_SIZE, f.min_part_size, math.ceil(2 * expected_size / f.max_parts))
    if chosen > f.max_part_size:
        raise InvalidOption(f"{expected_size} bytes cannot be streamed in at most {f.max_parts} parts of at "
                            f"most {f.max_part_size} bytes on {store.scheme}://: lower --shard-size")
    return chosen


@dataclass
class Written:
    """What was stored: the whole object's size and hashes, and its parts (none: one request)."""

    size: int
    crc32c: str
    sha256: str
    part_size: int = 0
    parts: list[str] = field(default_factory=list)
    committed: dict = field(default_factory=dict)   # the manifest entry's reported hashes and identity


class StreamingUpload:
    """A write-only file that becomes the object at ``loc`` when closed. Not thread-safe: one
    writer per object."""

    def __init__(self, store: Store, loc: Location, *, part_size: int, progress: Progress | None = None):
        self.store, self.loc, self.part_size = store, loc, part_size
        self.progress = progress or Progress()
        self._chunks: list[bytes] = []   # written, not yet sent
        self._buffered = 0
        self._pos = 0
        self._sha = hashlib.sha256()
        self._upload_id: str | None = None
        self._parts: list[PartRecord] = []
        self._sent = 0
        self._done = False
        self._sender: cf.ThreadPoolExecutor | None = None   # parts go out while the next fills
        # The object's SHA-256 is taken a part at a time on a thread of its own, in order, beside
        # the writer's own work (which on two cores would otherwise wait for it).
        self._hasher: cf.ThreadPoolExecutor | None = None
        self._in_flight: collections.deque[tuple[cf.Future, cf.Future]] = collections.deque()   # in part order
        # Parts' buffers, sent and hashed, for the next parts: a part copied into memory already
        # in use, not into a new 16 MiB, whose every page the kernel would map and zero again.
        self._free: list[bytearray] = []
        self._buffers: collections.deque[bytearray] = collections.deque()   # those of the parts in flight

    def _retrying(self, fn):
        return reported(fn, lambda _e: self.progress.retried())  # the store retries each request

    def write(self, data: bytes | bytearray | memoryview) -> int:
        n = len(data)
        self._chunks.append(bytes(data))
        self._buffered += n
        self._pos += n
        if self._buffered >= self.part_size:
            self._send_full_parts()
        return n

    def _send_full_parts(self) -> None:
        """Each full part is copied from the chunks that make it into a part's buffer (one copy:
        a buffer of a part already sent when there is one); a chunk that crosses the part's end
        is split there."""
        chunks, size = self._chunks, self.part_size
        while self._buffered >= size:
            if len(self._in_flight) >= PARTS_IN_FLIGHT:
                self._collect_one()   # (its buffer is then free for this part)
            pieces, need = [], size
            while need:
                chunk = chunks[0]
                if len(chunk) <= need:
                    pieces.append(chunks.pop(0))
                    need -= len(chunk)
                else:
                    view = memoryview(chunk)
                    pieces.append(view[:need])
                    chunks[0] = view[need:]
                    need = 0
            if self._free:
                buf, at = self._free.pop(), 0
                for piece in pieces:
                    buf[at:at + len(piece)] = piece
                    at += len(piece)
            else:   # (joined, not zeroed first: a shard of few parts never reuses one)
                buf = bytearray().join(pieces)
            self._buffered -= size
            self._buffers.append(buf)
            self._send_part(buf)

    def tell(self) -> int:
        return self._pos

    def hexdigest(self) -> str:
        """SHA-256 of the bytes written so far."""
        if self._in_flight:
            self._in_flight[-1][1].result()   # the hasher takes parts in order
        sha = self._sha.copy()
        for chunk in self._chunks:
            sha.update(chunk)
        return sha.hexdigest()

    def _send_part(self, data: bytes) -> None:
        """Start sending one part once fewer than PARTS_IN_FLIGHT are on their way."""
        if len(self._in_flight) >= PARTS_IN_FLIGHT:
            self._collect_one()
        if self._upload_id is None:
            self._upload_id = self._retrying(lambda: self.store.begin_upload(self.loc, 0))
            self._sender = Pool(PARTS_IN_FLIGHT, thread_name_prefix="bridge-part")
            self._hasher = Pool(1, thread_name_prefix="bridge-hash")
        number, offset = len(self._parts) + len(self._in_flight) + 1, self._sent
        self._sent += len(data)
        self._in_flight.append((self._sender.submit(self._upload_part, number, offset, data),
                                self._hasher.submit(self._sha.update, data)))

    def _upload_part(self, number: int, offset: int, data: bytes) -> PartRecord:
        crc = crc_hex(crc32c(data))
        self.progress.throttle(len(data))
        record = self._retrying(lambda: self.store.upload_part(self.loc, self._upload_id, number, offset,
                                                               data, crc))
        if record.crc32c != crc:
            raise BridgeError(f"{self.loc}: part {number} stored with CRC32C {record.crc32c}, sent {crc}")
        self.progress.moved(len(data))
        return record

    def _collect_one(self) -> None:
        sending, hashing = self._in_flight.popleft()
        hashing.result()
        self._parts.append(sending.result())
        if self._buffers:   # (in part order; the last part, when short, is bytes of its own)
            self._free.append(self._buffers.popleft())

    def _collect(self) -> None:
        while self._in_flight:
            self._collect_one()

    def _stop_sender(self) -> None:
        if self._sender is not None:
            self._sender.shutdown(wait=True)
            self._hasher.shutdown(wait=True)
            self._sender = self._hasher = None

    def close(self) -> Written:
        """Finish the object; the store checks the whole object's CRC32C where it can."""
        if self._done:
            raise BridgeError(f"{self.loc}: upload already finished")
        self._done = True
        if self._upload_id is None:
            data = b"".join(self._chunks)
            self._sha.update(data)
            sha = self._sha.hexdigest()
            crc = crc_hex(crc32c(data))
            self.progress.throttle(len(data))
            committed = self._retrying(lambda: self.store.put(self.loc, data, crc32c=crc,
                                                              metadata=_metadata(crc, sha)))
            self.progress.moved(len(data))
            return Written(len(data), crc, sha, committed=provenance(committed))
        if self._buffered:
            self._send_part(b"".join(self._chunks))
        self._collect()
        self._stop_sender()
        sha = self._sha.hexdigest()
        crc = crc_hex(combine_parts([(int(p.crc32c, 16), p.size) for p in self._parts]))
        reported = self._retrying(lambda: self.store.complete_upload(self.loc, self._upload_id, self._parts,
                                                                     crc32c=crc, metadata=_metadata(crc, sha)))
        verdicts.completed(self.store, self.loc, reported, crc, self.store.settings.transfer.store_checksums)
        # The completion's answer names the version written (S3's ETag): the entry records that,
        # as a copy's does (bridge.pipeline.units), without a HEAD (a HEAD that made rclone serve
        # s3 hash the whole shard for its ETag cost 1.5 s of a 5.7 s pack, py-spy, 2026-12-06).
        if reported.identity and reported.size == self._pos:
            committed = reported
        else:
            committed = self._retrying(lambda: committed_info(self.store, self.loc, FileHash(self._pos, crc, sha)))
        return Written(self._pos, crc, sha, self.part_size, [p.crc32c for p in self._parts],
                       provenance(committed))

    def abort(self) -> None:
        """Drop what was sent; the error that led here is the one worth reporting."""
        self._done = True
        self._chunks.clear()
        self._in_flight.clear()
        self._stop_sender()   # the parts in flight end (or fail) before the upload is dropped
        if self._upload_id is not None:
            try:
                self.store.abort_upload(self.loc, self._upload_id)
            except BridgeError:
                pass  # finalize of a later run removes uploads left unfinished


def _metadata(crc: str, sha: str) -> dict[str, str]:
    return {"bridge_crc32c": crc, "bridge_sha256": sha}


def put_whole(store: Store, loc: Location, data: bytes, *, progress: Progress | None = None,
              sha256: str | None = None, durable: bool = True) -> Written:
    """One small object in one request, with the same metadata as streamed ones. ``durable=False``
    (a local store only) leaves its fsyncs to the caller's ``store.settle``."""
    sha, crc = sha256 or hashlib.sha256(data).hexdigest(), crc_hex(crc32c(data))
    deferred = {} if durable else {"durable": False}
    committed = reported(lambda: store.put(loc, data, crc32c=crc, metadata=_metadata(crc, sha), **deferred),
                         (lambda _e: progress.retried()) if progress else None)
    if progress:
        progress.moved(len(data))
    return Written(len(data), crc, sha, committed=provenance(committed))


def put_wholes(store: Store, items: list[tuple[Location, bytes, str]], each: Callable[[int, Written], None], *,
               connections: int, progress: Progress | None = None) -> None:
    """Small objects, (location, bytes, SHA-256 hex), each in one request with put_whole's
    metadata, ``connections`` of them in flight from this thread (``store.writes_many``: an
    object store's direct path, which retries each on its own); ``each(i, written)`` as each is
    stored, in any order. The first failure, in ``items``' order, is raised once the rest are done."""
    crcs: list[str] = [""] * len(items)

    def body(i: int) -> tuple:
        loc, data, sha = items[i]
        crc = crcs[i] = crc_hex(crc32c(data))
        return loc, data, crc, _metadata(crc, sha), None, sha

    def stored(i: int, committed) -> None:
        _loc, data, sha = items[i]
        if progress:
            progress.moved(len(data))
        each(i, Written(len(data), crcs[i], sha, committed=provenance(committed)))

    failures = store.put_many(len(items), body, stored, connections=connections)
    if failures:
        raise failures[min(failures)]
