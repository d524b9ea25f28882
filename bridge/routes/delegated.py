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
SIGTERM, or ``stop``); ``commit`` then writes the manifest from what the stores report of each
object (the bytes never passed through bridge: ``computed`` is empty, see bridge/manifest.py).

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
from dataclasses import dataclass

from bridge import jobs
from bridge.check import reported_crc32c
from bridge.config import Settings
from bridge.engine import check_route, resolve
from bridge.errors import IntegrityError, JobCancelled, ObjectNotFound, RouteUnavailable
from bridge.manifest import FileEntry
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
    objects = list(check_route(src_root, dst_root, objects, single))   # one remote job names them all
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

def reported_entry(transfer: Transfer, rel: str, src_store: Store | None, src_info: ObjectInfo,
                   written: ObjectInfo) -> FileEntry:
    """The manifest entry of an object the service wrote, from what both stores report of it.
    Hashes both stores report with one algorithm must agree; the CRC32C comes from the
    destination when it reports one, else from the source."""
    where = transfer.dst_root.join(rel)
    if written.size != src_info.size:
        raise IntegrityError(f"{where}: {written.size} bytes, the source has {src_info.size}")
    src_crc = reported_crc32c(src_store, src_info) if src_store else src_info.checksums.get("crc32c")
    dst_crc = written.checksums.get("crc32c")
    if src_crc and dst_crc and src_crc != dst_crc:
        raise IntegrityError(f"{where}: CRC32C {dst_crc}, the source reports {src_crc}")
    src_md5, dst_md5 = src_info.checksums.get("md5"), written.checksums.get("md5")
    if src_md5 and dst_md5 and src_md5 != dst_md5:
        raise IntegrityError(f"{where}: MD5 {dst_md5}, the source reports {src_md5}")
    crc = dst_crc or src_crc
    if not crc:
        raise IntegrityError(f"{where}: neither store reports a CRC32C of it, so bridge cannot commit it "
                             f"without reading it; copy it with --route direct")
    reported = dict(written.checksums)
    if not dst_crc:
        reported["source_crc32c"] = src_crc
    return FileEntry(rel, written.size, crc, "", computed=[], reported=reported, identity=dict(written.identity),
                     source_id=dict(src_info.identity), note=f"copied by the {transfer.route} route: its bytes never passed through bridge "
                          f"(verify --deep reads them)")


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
                      "bytes_through_bridge": progress.bytes_through, "remote": remote}}


