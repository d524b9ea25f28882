"""Routes on which a cloud's own transfer service moves the bytes, and bridge plans, follows,
cancels and commits:

    sts        GCP Storage Transfer Service (bridge/routes/sts.py): s3:// or az:// (or an HTTP
               URL list) -> gs://
    datasync   AWS DataSync (bridge/routes/datasync.py): gs:// or az:// -> s3://, and
               s3:// -> gs:// or az:// (agentless object-storage locations)

Each route runs the same steps: ``plan`` checks that the route serves the job (RouteUnavailable
before any request otherwise, so another route can take it), the route creates the remote job
(a refusal there is RouteFailed with ``moved_data=False``), the route starts the job and ``follow`` polls it, feeding
bridge's Progress and cancelling the remote job when the bridge job is cancelled (Ctrl-C,
SIGTERM, or ``stop``); ``commit`` then writes the manifest from what the stores computed of each
object (the bytes never passed through bridge: ``computed`` is empty, see bridge/manifest.py): an
object is proven when a checksum the source's store computed equals the destination store's
(``store_proof``), else its entry is marked unproven and says why.

What a route creates at the service is recorded in the state dir before it is created
(bridge/routes/ledger.py): a re-run of a copy killed mid-job adopts the remote job it left (or
cancels it and deletes what bridge created), and a job that ends, however, deletes them.

Source credentials go into the remote job's spec and nowhere else: summaries name the remote
job and operation, never the spec, and every error line passes through bridge.redact.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from bridge import jobs
from bridge.config import Settings
from bridge.listing import checked_listing, resolve
from bridge.errors import IntegrityError, JobCancelled, ObjectNotFound, RouteUnavailable
from bridge.manifest import UNPROVEN, FileEntry
from bridge.progress import Progress
from bridge.stores import get_store
from bridge.stores.base import ObjectInfo, Store
from bridge.urls import Location, parse

STORE_SCHEMES = ("file", "s3", "gs", "az")
CANCEL_POLLS = 60     # polls to wait for a cancelled remote job to stop, at most


@dataclass
class Transfer:
    """What a native route copies: every object under ``src_root`` (or one, ``single``) to the
    same relative name under ``dst_root``."""

    route: str
    src_root: Location
    dst_root: Location
    objects: list[tuple[str, ObjectInfo]]
    single: str | None
    origin: str = ""      # what the user named, when the source is no store (a URL list)
    filtered: bool = False  # name each object in the remote job (one object, or some of a prefix)
    unproven: dict[str, str] = field(default_factory=dict)   # once committed: entries nothing proved, why

    @property
    def source(self) -> str:
        return self.origin or self.single or str(self.src_root)

    @property
    def bytes(self) -> int:
        return sum(info.size for _, info in self.objects)


def plan(route: str, source: str, destination: str, settings: Settings, pairs: set[tuple[str, str]]) -> Transfer:
    """The objects a native route would copy; RouteUnavailable when it cannot serve the job."""
    src, dst = parse(source), parse(destination)
    if (src.scheme, dst.scheme) not in pairs:
        served = ", ".join(f"{a}->{b}" for a, b in sorted(pairs))
        raise RouteUnavailable(f"route {route} does not serve {src.scheme}->{dst.scheme} (it serves {served})")
    src_root, dst_root, objects, single = resolve(source, destination, settings)
    objects = list(checked_listing(src_root, dst_root, objects, single))   # one remote job names them all
    if single is not None and objects[0][0] != objects[0][1].location.name:
        raise RouteUnavailable(f"route {route} keeps object names: it cannot write {single} as {destination}")
    return Transfer(route, src_root, dst_root, objects, single, filtered=single is not None)


# -- following a remote job ---------------------------------------------------------------------

@dataclass
class Remote:
    """A remote job's state as bridge reads it. ``state``: running, done, failed or cancelled."""

    state: str
    files_done: int = 0
    bytes_done: int = 0
    error: str = ""


@contextlib.contextmanager
def sigterm_cancels() -> Iterator[None]:
    """While a remote job runs in the foreground, SIGTERM cancels it as Ctrl-C does (a worker is
    stopped with SIGTERM). Only the main thread can take signals; elsewhere ``stop`` does it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def cancelled(_signum, _frame):
        raise JobCancelled("terminated (SIGTERM)")

    previous = signal.signal(signal.SIGTERM, cancelled)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def follow(what: str, poll: Callable[[], Remote], cancel: Callable[[], None], *, interval: float,
           progress: Progress, stop: threading.Event | None = None, count_files: bool = True) -> Remote:
    """Poll a remote job until it ends, feeding ``progress``. When the bridge job is cancelled
    (KeyboardInterrupt, SIGTERM, ``stop`` set) the remote job is cancelled too, bridge waits
    until the service says it stopped, and JobCancelled is raised."""
    stop = stop or threading.Event()
    seen = Remote("running")
    try:
        with sigterm_cancels():
            while True:
                status = poll()
                _advance(progress, seen, status, count_files)
                seen = status
                if status.state != "running":
                    return status
                if stop.wait(interval):
                    raise JobCancelled("cancelled")
    except (KeyboardInterrupt, JobCancelled) as exc:
        why = str(exc) or "interrupted"
        with sigterm_cancels():   # a second SIGTERM must not cut the cancel short
            seen = stop_remote(poll, cancel, interval)
        raise JobCancelled(f"{why}: {what} was cancelled at the service (it reports {seen.state}, "
                           f"{seen.files_done} objects copied); no manifest was written") from None


def stop_remote(poll: Callable[[], Remote], cancel: Callable[[], None], interval: float) -> Remote:
    """Cancel a remote job and wait (CANCEL_POLLS polls at most) until the service says it stopped."""
    cancel()
    seen = poll()
    for _ in range(CANCEL_POLLS):
        if seen.state != "running":
            break
        time.sleep(min(interval, 1.0))
        seen = poll()
    return seen


def _advance(progress: Progress, before: Remote, now: Remote, count_files: bool) -> None:
    if now.bytes_done > before.bytes_done:
        progress.moved(now.bytes_done - before.bytes_done, through=0)   # the service moved them
    for _ in range(max(0, now.files_done - before.files_done) if count_files else 0):
        progress.file_finished()


# -- committing ---------------------------------------------------------------------------------

def store_proof(where: Location, src: Location, src_sums: dict[str, str], dst_sums: dict[str, str]) -> str:
    """The checksum both stores computed (``adopt.reported``'s names) that proves the copy at
    ``where`` equal to its source, strongest first; "" when none is common. IntegrityError when a
    common one differs, except an S3 ETag's MD5, which is an MD5 only for a one-request upload
    without SSE-KMS or SSE-C (an object encrypted so merely proves nothing)."""
    from bridge.adopt import ORDER
    s3 = "s3" in (where.scheme, src.scheme)
    agreed = ""
    for name in ORDER:
        if name not in src_sums or name not in dst_sums:
            continue
        if src_sums[name] == dst_sums[name]:
            agreed = agreed or name
        elif not (name == "md5" and s3):
            raise IntegrityError(f"{where}: {name.upper()} {dst_sums[name]} computed by the destination's store, "
                                 f"{src_sums[name]} by the source's")
    return agreed


def store_sums(store: Store | None, info: ObjectInfo) -> dict[str, str]:
    """The checksums a store computed of an object (never its metadata, nor an Azure blob's
    Content-MD5: see bridge/adopt.py; ``store`` None: ``info`` is a HEAD's, none to ask); a URL
    list's object: the MD5 the list names, which Storage Transfer checks each download against."""
    from bridge.adopt import reported
    if info.location.scheme in ("http", "https"):
        return dict(info.checksums)
    return reported(store, info, ask=store is not None)


def as_stored(store: Store | None, info: ObjectInfo) -> ObjectInfo:
    """``info`` with what a HEAD tells of the object where a listing leaves its checksums and
    metadata out (S3's listings do)."""
    if store is None or "crc32c" not in store.features.checksums or "crc32c" in info.checksums:
        return info
    return store.info(info.location)


def why_unproven(src_sums: dict[str, str], dst_sums: dict[str, str]) -> str:
    def names(sums: dict[str, str]) -> str:
        return ", ".join(sums) or "none"
    if names(src_sums) == "none":
        return "the source's store computed no checksum of it (an Azure blob's Content-MD5 and metadata are a client's)"
    if names(dst_sums) == "none":
        return "the destination's store computed no checksum of it (Azure computes none for a block blob)"
    return f"no checksum is computed by both stores (source: {names(src_sums)}; destination: {names(dst_sums)})"


def reported_entry(transfer: Transfer, rel: str, src_store: Store | None, src_info: ObjectInfo,
                   written: ObjectInfo) -> FileEntry:
    """The manifest entry of an object the service wrote, from what both stores computed of it.
    Proven when a checksum both stores computed agrees (one that differs fails the copy);
    otherwise the note begins ``unproven:`` and says why (verify reports it so). ``reported``
    holds only what the destination's store computed. The CRC32C is the destination's, else the
    source store's, else, for an unproven entry, the one bridge keeps in the source's metadata
    (a claim: ``verify --deep`` then reads the copy against it)."""
    where = transfer.dst_root.join(rel)
    if written.size != src_info.size:
        raise IntegrityError(f"{where}: {written.size} bytes, the source has {src_info.size}")
    stored = as_stored(src_store, src_info)   # source_id stays the listing's, as sync compares it
    src_sums, dst_sums = store_sums(src_store, stored), store_sums(None, written)
    proven_by = store_proof(where, src_info.location, src_sums, dst_sums)
    claimed = stored.metadata.get("bridge_crc32c", "")
    crc = dst_sums.get("crc32c") or src_sums.get("crc32c") or ("" if proven_by else claimed)
    if not proven_by and claimed and dst_sums.get("crc32c") not in (None, claimed):
        raise IntegrityError(f"{where}: CRC32C {dst_sums['crc32c']} computed by the destination's store, "
                             f"{claimed} recorded by bridge in the source's metadata")
    if not crc:
        raise IntegrityError(f"{where}: neither store reports a CRC32C of it, so bridge cannot commit it "
                             f"without reading it; copy it with --route direct")
    moved = f"copied by the {transfer.route} route: its bytes never passed through bridge"
    if proven_by:
        note = f"{moved}; {proven_by.upper()} computed by both stores is equal (verify --deep reads them)"
    else:
        note = f"{UNPROVEN} {moved}, and {why_unproven(src_sums, dst_sums)}"
    return FileEntry(rel, written.size, crc, "", computed=[], reported=dict(dst_sums), identity=dict(written.identity),
                     source_id=dict(src_info.identity), note=note)


def commit(transfer: Transfer, settings: Settings,
           written: Callable[[Store, Location], ObjectInfo] | None = None) -> str:
    """Commit the objects the service copied into the destination's record (bridge/jobs.py
    ``commit``); returns the commit's URL."""
    # A URL list is no store: what it says of each object (size, MD5) is in ``objects``.
    src_store = get_store(transfer.src_root, settings) if transfer.src_root.scheme in STORE_SCHEMES else None
    dst_store = get_store(transfer.dst_root, settings)
    root = transfer.dst_root.as_prefix()
    look = written or (lambda store, loc: store.info(loc))
    entries = []
    for rel, src_info in transfer.objects:
        try:
            info = look(dst_store, root.join(rel))
        except ObjectNotFound:
            raise IntegrityError(f"{root.join(rel)}: the {transfer.route} route reported success but the "
                                 f"object is not there") from None
        entries.append(reported_entry(transfer, rel, src_store, src_info, info))
    transfer.unproven = {e.path: e.note for e in entries if e.unproven}
    return jobs.commit(dst_store, root, transfer.source, str(root), entries)


def one_line(text: str, limit: int = 600) -> str:
    """A service's error text as one line of bounded length, secrets masked."""
    from bridge.redact import redact
    flat = " ".join(redact(text).split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


def summary(transfer: Transfer, progress: Progress, manifest: str, remote: dict) -> dict:
    """What --json prints and a job record keeps: the remote job's names, never its spec."""
    return {"source": transfer.source, "destination": str(transfer.dst_root), "files": len(transfer.objects),
            "bytes": transfer.bytes, "ok": True, "errors": [], "manifest": manifest, **progress.snapshot(),
            "route": {"name": transfer.route, "why": "called directly", "fallbacks": {},
                      "bytes_through_bridge": progress.bytes_through, "remote": remote,
                      **({"unproven": dict(sorted(transfer.unproven.items()))} if transfer.unproven else {})}}


