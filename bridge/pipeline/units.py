"""Stage 4, units: what one unit of a copy does (bridge.pipeline.plan lists the kinds): a whole
file, a batch of small files, one part, a file's completion, the files a route carries, a
deletion. Each takes the job's context (bridge.pipeline.execute.JobContext) and is idempotent:
finished work is found in the journal (and, for parts, in the store's own list of an unfinished
upload) and is not sent again."""

from __future__ import annotations

import contextlib
import contextvars
import copy
import hashlib
import math
from typing import Any, Awaitable, Callable, NamedTuple

from bridge import carry as carrying
from bridge import verdicts
from bridge import jobs
from bridge import manifest as manifests
from bridge import routes
from bridge.config import Settings
from bridge.errors import BridgeError, IntegrityError, ObjectNotFound
from bridge.hashing import FileHash, combine_parts, crc32c, crc_hex, rehash_parts, sha256_tree
from bridge.stores.base import MiB, ObjectInfo, PartRecord


BATCH_IN_FLIGHT = 64 * MiB   # a batch's bytes in flight at once, at most (batch_connections)
# Parts bound for a local destination are received and written this much at a time: the piece is
# still in the CPU's cache (L2) when it is written. Receiving a whole 8 MiB part first and writing
# it then cost 2-3x the system time in a probe (bench/README.md).
PIECE = 256 * 1024
# Threads that write a batch's files into a local destination beside the batch's event loop
# (_read_into_files): the file system's calls release the GIL, so the writes and the requests
# overlap; but each call's return waits for the GIL, so more threads take turns more than they
# overlap. 2,000 x 16 KiB with sync from rclone serve s3 (bench/notes/speed.md), six rotated
# rounds: on a machine at rest 2 took a median 2.21 s against 2.36 s with 4, faster in all six;
# at a load of 10-15 (other benches) 4 had taken 3.79 s against 4.39 s with 2 and 3.99 s with 8.
FILE_WRITERS = 2


def _metadata(h: FileHash) -> dict[str, str]:
    return {"bridge_crc32c": h.crc32c, **({"bridge_sha256": h.sha256} if h.sha256 else {})}


def _put(ctx: jobs.Context, unit: dict) -> dict:
    done = ctx.journal.get(f"file:{unit['rel']}")
    if ctx.matches(done, unit):
        ctx.progress.skipped(unit["size"], unit["rel"])
        return done
    ctx.progress.throttle(unit["size"])
    return _write(ctx, unit, ctx.dst.body(ctx.src.read(ctx.src_loc(unit["rel"]))))


def _batch(ctx: jobs.Context, unit: dict) -> dict:
    """Small whole files through ``Store.read_many`` (to a local destination), ``Store.put_many``
    (from a local source), or both (between two stores: what has arrived sent while the rest
    is read, _relay_files): each written and journaled as it arrives, as ``_put`` does one.
    Files already journaled are skipped; those that fail are the unit's error (the first, and
    how many more), the rest of the batch written all the same."""
    todo = []
    keys = [f"file:{rel}" for rel, *_rest in unit["files"]]
    records = ctx.journal.get_many(keys)   # the whole batch in one query (one round trip for the service's)
    for (rel, size, *more), done in zip(unit["files"], records):   # more: its source_id, then what it carries
        one = {"rel": rel, "size": size, **({"source_id": more[0]} if more else {}),
               **({"carry": more[1]} if len(more) > 1 else {})}
        if ctx.matches(done, one):
            ctx.progress.skipped(size, rel)
        else:
            todo.append(one)
    connections = batch_connections(ctx.settings, max((one["size"] for one in todo), default=0))
    if ctx.src.reads_many and ctx.dst_root.is_local:
        failures = _read_into_files(ctx, todo, connections)
    elif ctx.src_root.is_local:
        failures = _send_files(ctx, todo, len(todo), lambda k: k, {}, connections)
    else:
        failures = _relay_files(ctx, todo, connections)
    if failures:
        first = failures[min(failures)]
        if len(failures) == 1:
            raise first
        error = copy.copy(first)   # its type kept: a fatal error still stops the job
        error.args = (f"{first} (and {len(failures) - 1} more files of its batch of {len(unit['files'])})",)
        raise error
    return {}


def _send_files(ctx: jobs.Context, todo: list[dict], count: int, index: Callable[[int], int],
                read: dict[int, bytes], connections: int,
                ready: Callable[[int], Awaitable[None]] | None = None) -> dict[int, BaseException]:
    """``count`` files through the destination's ``put_many``: the k-th is ``todo[index(k)]``, its
    body from ``read`` when it was read already, else read here; what was sent journaled in one
    transaction. ``ready(k)``: awaited in the sending event loop before the k-th is asked for
    (a relayed batch's file may not have arrived yet). Failures by todo index; a k that
    ``index`` finds never read (_NotRead) is left out (its read's failure is the reader's)."""
    hashes: dict[int, FileHash] = {}
    md5s: dict[int, str | None] = {}
    which: dict[int, int] = {}   # k -> its todo index, once asked for

    def body(k: int) -> tuple:
        i = which[k] = index(k)
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
        i = which[k]
        _record(ctx, todo[i], hashes.pop(i), verdicts.md5_evidence(committed, md5s.pop(i)), journaled)

    try:
        unsent = ctx.dst.put_many(count, body, sent, connections=connections, ready=ready)
    finally:
        ctx.journal.put_many(journaled)
    return {which.get(k, k): exc for k, exc in unsent.items() if not isinstance(exc, _NotRead)}


class _SendingEnded(Exception):
    """A relayed batch's sending failed as a whole: its reader stops."""


class _NotRead(BridgeError):
    """A relayed batch's k-th send when fewer files than that were read (the others failed)."""


class _Arrivals:
    """A relayed batch's files in the order they arrive: put by the reader's thread, taken by the
    sender, which waits for the k-th either on its event loop (``ready``: the loop's other
    requests go on meanwhile) or on its thread (``index``: a store whose put_many has no loop)."""

    def __init__(self) -> None:
        import threading
        self.cond = threading.Condition()
        self.order: list[int] = []   # todo indices, as they arrived
        self.bodies: dict[int, bytes] = {}
        self.ended: dict[int, BaseException] | BaseException | None = None   # the read's failures, or what stopped it
        self.waiting: list[tuple[int, Any, Any]] = []   # (k, its loop, its future)

    def arrive(self, i: int, data: bytes) -> None:
        with self.cond:
            self.bodies[i] = data
            self.order.append(i)
            self._wake()

    def end(self, result: dict[int, BaseException] | BaseException) -> None:
        with self.cond:
            self.ended = result
            self._wake()

    def _wake(self) -> None:
        self.cond.notify_all()
        still = []
        for k, loop, future in self.waiting:
            if future.cancelled():   # its lane was stopped (the sending ended): nobody waits
                continue
            if k < len(self.order) or self.ended is not None:
                with contextlib.suppress(RuntimeError):   # its loop closed since: nobody waits either
                    loop.call_soon_threadsafe(_resolve, future)
            else:
                still.append((k, loop, future))
        self.waiting = still

    def _settled(self, k: int) -> int:
        if k < len(self.order):
            return self.order[k]
        if isinstance(self.ended, BaseException):
            raise self.ended
        raise _NotRead(f"file {k + 1} of a relayed batch: not read")

    async def ready(self, k: int) -> None:
        import asyncio
        with self.cond:
            if k < len(self.order) or self.ended is not None:
                self._settled(k)
                return
            loop = asyncio.get_running_loop()
            future = loop.create_future()
            self.waiting.append((k, loop, future))
        await future
        with self.cond:
            self._settled(k)

    def index(self, k: int) -> int:
        with self.cond:
            self.cond.wait_for(lambda: k < len(self.order) or self.ended is not None)
            return self._settled(k)


def _resolve(future) -> None:
    if not future.done():
        future.set_result(None)


def _relay_files(ctx: jobs.Context, todo: list[dict], connections: int) -> dict[int, BaseException]:
    """A batch from a store to a store, read and sent at once: a thread of its own reads the
    whole batch (``read_many``, ``connections`` requests in flight), and one ``put_many`` sends
    each file as it arrives, ``connections`` requests in flight, so that a host's link carries the
    batch's downloads and uploads together. Read whole first and sent then, each direction of
    the link had waited on the other; sent in groups of ``connections``, the uploads waited for
    a group to arrive and each group for its slowest upload (bench/notes/hosts.md). What waits
    to be sent is at most the batch, as it was when the batch was read whole. Failures by index,
    the reads' and the sends'; when the sending fails as a whole the reader stops at its next
    file, and when the reading does, the sending stops at its next file."""
    import threading
    arrivals = _Arrivals()
    stop = threading.Event()

    def received(k: int, data: bytes) -> None:
        if stop.is_set():
            raise _SendingEnded()   # not a BridgeError: it ends read_many's run, not one file
        arrivals.arrive(k, data)

    def reading() -> None:
        try:
            arrivals.end(ctx.src.read_many([ctx.src_loc(one["rel"]) for one in todo], received,
                                           connections=connections))
        except BaseException as exc:   # raised in the sender, where its next file would have come
            arrivals.end(exc)

    reader = threading.Thread(target=contextvars.copy_context().run, args=(reading,), daemon=True,
                              name="bridge-relay")
    reader.start()
    try:
        failures = _send_files(ctx, todo, len(todo), arrivals.index, arrivals.bodies, connections,
                               ready=arrivals.ready)
    finally:
        stop.set()
        reader.join()
    if isinstance(arrivals.ended, BaseException):
        raise arrivals.ended
    failures.update(arrivals.ended or {})
    return failures


def _read_into_files(ctx: jobs.Context, todo: list[dict], connections: int) -> dict[int, BridgeError]:
    """A batch's files through the source's ``read_many`` into the local destination: each body
    handed, as it arrives, to one of FILE_WRITERS threads that hashes, writes and records it,
    while the batch's event loop goes on receiving. Written by the loop itself, each file's
    creation, extended attributes and rename (system calls of 100-200 us each on ext4) held up
    the batch's requests in flight. At most ``connections`` bodies wait for a writer (the loop
    waits for one to finish beyond that), so the batch holds at most twice its bytes in flight.
    Failures by index, as ``read_many`` gives them, a write's BridgeError among them; any other
    exception from a write ends the batch, as it did when the loop wrote the files."""
    import threading
    from bridge.meter import Pool   # its tasks run in the loop task's context: meter, stop, breaker
    writing: dict[int, object] = {}
    waiting = threading.BoundedSemaphore(max(1, connections))
    broken: list[BaseException] = []

    def written(done) -> None:
        waiting.release()
        exc = None if done.cancelled() else done.exception()
        if exc is not None and not isinstance(exc, BridgeError):
            broken.append(exc)

    with Pool(FILE_WRITERS, thread_name_prefix="bridge-write") as writers:
        def each(i: int, data: bytes) -> None:
            if broken:
                raise broken[0]
            waiting.acquire()
            writing[i] = writers.submit(_write, ctx, todo[i], ctx.dst.body(data))
            writing[i].add_done_callback(written)

        try:
            # a bandwidth limit is taken before each request goes, so that the answers, not only
            # the writes, follow it (bridge.bwlimit: in the batch's event loop it waits without blocking)
            failures = ctx.src.read_many([ctx.src_loc(one["rel"]) for one in todo], each, connections=connections,
                                         pace=lambda i: ctx.progress.throttle(todo[i]["size"]))
        except BaseException:
            for pending in writing.values():   # what has not begun is not written; the rest ends first
                pending.cancel()
            raise
    if broken:
        raise broken[0]
    for i, done in writing.items():
        exc = done.exception()
        if isinstance(exc, BridgeError):
            failures[i] = exc
    return failures


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


def _write(ctx: jobs.Context, unit: dict, data) -> dict:
    h = _hashed(ctx, unit, data)
    durability = {"durable": False} if ctx.defer_sync else {}
    # a SHA-256 taken of these bytes (not carried) is the one a store that signs its payload signs
    committed = ctx.dst.put(ctx.dst_loc(unit["rel"]), data, crc32c=h.crc32c, metadata=_metadata(h),
                            attrs=ctx.attrs(unit["rel"]), sha256=None if "carry" in unit else h.sha256 or None,
                            **durability)
    return _record(ctx, unit, h, verdicts.md5_evidence(committed, _md5(ctx, data)))


def _md5(ctx: jobs.Context, data) -> str | None:
    """The MD5 of a one-request upload's bytes where the destination's ETag is the only proof
    it may give that it stored them (verdicts.wants_md5)."""
    if not verdicts.wants_md5(ctx.dst_root, ctx.settings.transfer.store_checksums):
        return None
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _hashed(ctx: jobs.Context, unit: dict, data) -> FileHash:
    if len(data) != unit["size"]:
        raise IntegrityError(f"{ctx.src_loc(unit['rel'])}: read {len(data)} bytes, planned {unit['size']}: "
                             f"the source changed during the copy")
    carried = unit.get("carry")
    if carried is None:
        return FileHash.of(data)
    crc = crc_hex(crc32c(data))
    _check_carried(ctx, unit, crc, carried["crc32c"])
    return FileHash(len(data), crc, carried["sha256"])


def _check_carried(ctx: jobs.Context, unit: dict, crc: str, recorded: str, part: int = 0) -> None:
    """The bytes read are the ones the source's record hashed (bridge.carry), by CRC32C."""
    if crc != recorded:
        what = f"part {part}" if part else "its bytes"
        raise IntegrityError(f"{ctx.src_loc(unit['rel'])}: {what} read with CRC32C {crc}, the source's manifest "
                             f"says {recorded}: the source is damaged or changed since it was recorded")


def _record(ctx: jobs.Context, unit: dict, h: FileHash, committed: ObjectInfo, batch: list | None = None) -> dict:
    entry = manifests.entry_from_hash(unit["rel"], h, committed=committed)
    if "carry" in unit:
        entry.computed, entry.carried = ["crc32c"], carrying.provenance(unit["carry"])
    entry = entry.to_dict()
    ctx.written(unit, entry, h.size, batch)
    ctx.progress.moved(h.size)
    ctx.progress.file_finished(unit["rel"], h.size)
    return entry


def _part(ctx: jobs.Context, unit: dict) -> dict:
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
            streamed = None
            if ctx.dst.streams_parts and not ctx.src_root.is_local:
                data, streamed = _pipe_part(ctx, rel, dst, upload_id, number, offset, length)
            else:
                data = ctx.dst.body(ctx.src.read(ctx.src_loc(rel), offset, length))
            if len(data) != length:
                raise IntegrityError(f"{ctx.src_loc(rel)}: short read at {offset}: the source changed")
            crc = streamed.crc32c if streamed is not None else crc_hex(crc32c(data))
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
            elif streamed is not None:
                sha = streamed.sha256
            else:   # taken from these bytes: a store that signs the payload's hash signs this one
                sha = taken = hashlib.sha256(data).hexdigest()
            record = streamed.record if streamed is not None else \
                ctx.dst.upload_part(dst, upload_id, number, offset, data, crc, sha256=taken)
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


class _Piped(NamedTuple):
    record: PartRecord
    crc32c: str
    sha256: str


class _SourceRestarted(Exception):
    """The source's read began again (a retried request) or ended while its bytes were being sent."""


def _pipe_part(ctx: jobs.Context, rel: str, dst, upload_id: str, number: int, offset: int,
               length: int) -> tuple[bytearray, _Piped | None]:
    """Bytes [offset, offset+length) of ``rel`` from a store into a part of the destination's
    upload, each piece sent on as it arrives (``Store.upload_part_stream``): the part's download
    and upload overlap, where reading it whole before sending it had used one direction of a
    host's link at a time (bench/notes/hosts.md). A thread of its own reads the source into a
    buffer of the part's size; the upload sends from that buffer what has arrived, hashing it
    (CRC32C, SHA-256) as it goes. Returns the part's bytes, and how it was stored; None for the
    second when the stream did not finish (the source's read began again, or the upload failed),
    in which case the caller sends the bytes, read whole by then, as any part is sent."""
    import queue
    import threading
    from bridge.errors import JobCancelled
    src = ctx.src_loc(rel)
    data = bytearray(length)
    arrived: queue.SimpleQueue = queue.SimpleQueue()   # (position, size) of each piece, None at the end
    outcome: dict = {}

    def read() -> None:
        def each(pos: int, view: memoryview) -> None:
            if pos + len(view) > length:
                raise IntegrityError(f"{src}: short read at {offset}: the source changed")
            data[pos:pos + len(view)] = view
            arrived.put((pos, len(view)))
        try:
            outcome["read"] = ctx.src.read_through(src, offset, length, bytearray(PIECE), each)
        except BaseException as exc:   # raised by the part's own thread, below
            outcome["error"] = exc
        finally:
            arrived.put(None)

    reader = threading.Thread(target=contextvars.copy_context().run, args=(read,), daemon=True,
                              name="bridge-pipe")
    reader.start()
    crc, digest, sent = 0, hashlib.sha256(), 0

    def pieces():
        nonlocal crc, sent
        view = memoryview(data)
        while sent < length:
            got = arrived.get()
            if got is None or got[0] != sent:
                raise _SourceRestarted(f"{src}: the read of part {number} began again")
            piece = view[got[0]:got[0] + got[1]]
            crc, sent = crc32c(piece, crc), sent + got[1]
            digest.update(piece)
            yield piece

    record = None
    try:
        record = ctx.dst.upload_part_stream(dst, upload_id, number, length, pieces(), lambda: crc_hex(crc))
    except JobCancelled:
        raise
    except (BridgeError, _SourceRestarted):
        record = None   # sent again whole below, with the upload's own retries
    finally:
        reader.join()
    if "error" in outcome:
        raise outcome["error"]
    if outcome["read"] != length:
        raise IntegrityError(f"{src}: short read at {offset}: the source changed")
    if record is None or sent != length:
        return data, None
    return data, _Piped(record, crc_hex(crc), digest.hexdigest())


def _receive_part(ctx: jobs.Context, rel: str, upload_id: str, offset: int, length: int,
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


def _complete(ctx: jobs.Context, unit: dict) -> dict:
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
    verdicts.completed(ctx.dst, dst, reported, crc, ctx.settings.transfer.store_checksums)
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
    ctx.progress.file_finished(rel, size)
    return entry


def _route(ctx: jobs.Context, unit: dict) -> dict:
    """Files carried by the plan's route (bridge/routes); those it cannot carry go direct."""
    todo = []
    for rel in unit["files"]:
        f = ctx.plan.files.find(rel)
        if ctx.matches(ctx.journal.get(f"file:{rel}"), {"rel": rel, "size": f.size, "source_id": f.source_id}):
            ctx.progress.skipped(f.size, rel)
        else:
            todo.append(f)
    fallen, unproven = {}, {}
    ids = {f.rel: f.source_id for f in todo}
    sizes = {f.rel: f.size for f in todo}
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
        ctx.progress.file_finished(rel, sizes.get(rel, 0), ctx.plan.route)
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


def _delete(ctx: jobs.Context, unit: dict) -> dict:
    """One deletion (units planned before deletions went in groups)."""
    return {"deleted": _deletes(ctx, {"rels": [unit["rel"]]})["deleted"][0]}


def _deletes(ctx: jobs.Context, unit: dict) -> dict:
    """Deletions, as many as one request removes at the destination (one already gone, after a
    re-run of a killed job, counts as deleted)."""
    rels = unit["rels"]
    ctx.dst.delete_many([ctx.dst_loc(rel) for rel in rels])
    for rel in rels:
        ctx.progress.deleted(rel)
    return {"deleted": rels}


OPS = {"put": _put, "batch": _batch, "part": _part, "complete": _complete, "delete": _delete, "deletes": _deletes,
       "route": _route}
