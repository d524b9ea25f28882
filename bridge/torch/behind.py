"""Save now, upload behind: a DCP save lands in a folder of a staging folder all ranks share (fast
local disk, Lustre) and returns; a thread of this process uploads it with ``mcbridge cp``'s
pipeline and commits bridge's record at the checkpoint's URL once every part is uploaded and
its checksum matched what the store says it stored. Only then are the policies covering the
folder told (``bridge.replicator.announce``).

A journal in the staging folder names each save not committed yet::

    <staging>/.mcbridge-pending/<checkpoint key>.json   {"folder": ..., "url": ..., "saved": ...}

written (and made durable) before the save returns, removed once the record is written. A
process killed in between leaves it: the next ``BridgeWriter(url, behind=<staging>)`` made on the
coordinator (rank 0, or a process with no process group), or ``resume_pending(<staging>)``,
uploads what it names again; the copy's own journal (bridge/journal.py) skips the parts already
uploaded. One process at a time uploads an entry (an advisory lock on its journal file), so two
processes starting at once do not both send it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bridge import ops, replicator
from bridge.config import Settings, load_settings
from bridge import manifest as manifests
from bridge.errors import BridgeError, ObjectNotFound
from bridge.stores import get_store
from bridge.urls import Location, parse

PENDING = ".mcbridge-pending"
METADATA = ".metadata"


def staging_key(root: Location) -> str:
    """A short name for the checkpoint at ``root`` (its last folder and a hash of its URL)."""
    name = root.key.rstrip("/").rpartition("/")[2] or root.bucket or "checkpoint"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:60]
    return f"{safe}-{hashlib.sha256(str(root).encode()).hexdigest()[:10]}"


def uncommit(store, root: Location) -> None:
    """An earlier checkpoint at ``root`` no longer looks complete: its record goes (commit
    markers first), then its ``.metadata``."""
    if manifests.committed(store, root):
        manifests.remove(store, root)
    try:
        store.delete(root.join(METADATA))
    except ObjectNotFound:
        pass


def staged_folder(staging: Path, root: Location) -> Path:
    """Where the checkpoint for ``root`` lands in the staging folder."""
    return staging / staging_key(root)


def _journal_path(folder: Path) -> Path:
    return folder.parent / PENDING / f"{folder.name}.json"


def _write_durably(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class Upload:
    """One checkpoint on its way: its thread, and how it ended (``error``: None when committed)."""
    url: str
    folder: Path
    thread: threading.Thread | None = None
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    report: dict | None = None


_ACTIVE: dict[str, Upload] = {}   # by journal path, in this process
_LOCK = threading.Lock()


def submit(folder: Path, root: Location, settings: Settings) -> Upload:
    """Journal the save staged in ``folder`` for ``root`` (durably, before the save returns),
    then upload and commit it on a thread of this process."""
    journal = _journal_path(folder)
    _write_durably(journal, json.dumps({"folder": str(folder), "url": str(root), "saved": time.time()}).encode())
    return _start(journal, settings)


def _start(journal: Path, settings: Settings) -> Upload:
    doc = json.loads(journal.read_text())
    key = str(journal)
    with _LOCK:
        running = _ACTIVE.get(key)
        if running is not None and not running.done.is_set():
            return running
        upload = _ACTIVE[key] = Upload(doc["url"], Path(doc["folder"]))
        upload.thread = threading.Thread(target=_run, args=(upload, journal, settings),
                                         name=f"mcbridge-behind-{journal.stem[:20]}")
        upload.thread.start()
    return upload


def _run(upload: Upload, journal: Path, settings: Settings) -> None:
    try:
        with open(journal, "rb") as held:
            try:
                fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                upload.error = BridgeError(f"{upload.url}: another process is uploading it")
                return
            root = parse(upload.url).as_prefix()
            uncommit(get_store(root, settings), root)   # an earlier checkpoint there stops looking complete
            upload.report = ops.copy(f"{upload.folder.as_posix()}/", str(root), settings)
            replicator.announce(str(root), settings)
            journal.unlink()
    except BaseException as exc:   # kept for wait(); the journal stays for the next start
        upload.error = exc
    finally:
        upload.done.set()


def resume_pending(staging: str | os.PathLike, settings: Settings | None = None, *,
                   wait: bool = True) -> list[str]:
    """Upload and commit every save the journal of ``staging`` names (a process killed before
    committing left it); with ``wait``, until they are committed (raising the first failure).
    Returns their URLs. Ranks other than 0 of a process group leave it to rank 0."""
    if not _coordinator():
        return []
    settings = settings or load_settings()
    folder = Path(staging).absolute() / PENDING
    journals = sorted(p for p in folder.glob("*.json")) if folder.is_dir() else []
    started = [_start(p, settings) for p in journals]
    if wait:
        _wait(started)
    return [u.url for u in started]


def wait(timeout: float | None = None) -> list[dict]:
    """Until every upload this process started is committed; their copy reports. The first
    failure is raised (its journal stays: the next start resumes it)."""
    with _LOCK:
        running = list(_ACTIVE.values())
    return _wait(running, timeout)


def pending(staging: str | os.PathLike) -> list[str]:
    """The URLs of the saves in ``staging`` not committed yet (journaled)."""
    folder = Path(staging).absolute() / PENDING
    if not folder.is_dir():
        return []
    return sorted(json.loads(p.read_text())["url"] for p in folder.glob("*.json"))


def _wait(uploads: list[Upload], timeout: float | None = None) -> list[dict]:
    deadline = None if timeout is None else time.monotonic() + timeout
    for upload in uploads:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not upload.done.wait(left):
            raise BridgeError(f"{upload.url}: still uploading after {timeout} s")
    for upload in uploads:
        if upload.error is not None:
            if isinstance(upload.error, BridgeError):
                raise upload.error
            raise BridgeError(f"{upload.url}: the upload behind failed: {upload.error!r}") from upload.error
    return [u.report for u in uploads if u.report is not None]


def _coordinator() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:
        return True
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
