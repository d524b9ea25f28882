"""PyTorch Distributed Checkpoint (DCP) through bridge: ``BridgeWriter`` and ``BridgeReader``, a
``torch.distributed.checkpoint`` storage writer and reader for s3://, gs://, az:// and local paths.

    import torch.distributed.checkpoint as dcp
    from bridge.torch import BridgeWriter, BridgeReader
    dcp.save(state, storage_writer=BridgeWriter("s3://ckpt/run-7/step-1000/"))
    dcp.load(state, storage_reader=BridgeReader("s3://ckpt/run-7/step-1000/"))

A save, as torch's ``FileSystemWriter`` makes it (the same files, ``__<rank>_<n>.distcp`` and
``.metadata``, the same serialisation, read by its reader and by ``FsspecReader``), with the
bytes moved by bridge's data plane:

1. each rank serialises its items into a folder of its own (torch's own writer, a temporary
   folder), then copies the folder to the checkpoint's URL through the copy pipeline
   (bridge/pipeline: parts in parallel, each part's CRC32C and SHA-256 taken as it passes and
   checked against what the store says it stored, a killed upload resumed from its journal),
   without the commit: the entries of what it wrote go back to the coordinator in its write
   results;
2. the coordinator, in ``finish``, writes DCP's ``.metadata`` the same way, and then, last, one
   commit of bridge's record (``_bridge/log/``, as ``mcbridge cp`` writes it) naming every file of
   the checkpoint: ``mcbridge verify`` checks it and bridge/evidence.py calls the checkpoint
   committed. The save returns once that record is written;
3. replication policies covering the checkpoint's folder are told (``bridge.replicator.announce``).

A save over an existing checkpoint first removes that checkpoint's record and ``.metadata`` (the
coordinator, before any rank writes): a save cut short never leaves a folder that looks complete.

With ``behind=FOLDER`` the save lands in a folder of FOLDER (fast local or Lustre storage that all
ranks share) and returns; bridge uploads it in the background and commits once the upload is
verified (bridge/torch/behind.py).

``BridgeReader`` reads ``.metadata`` whole and checks it against the record (a checkpoint with no
record is refused as not committed, unless ``committed_only=False``), then each item by a ranged
read (not checked: a range has no checksum of its own in the record), or with ``cache=True``
through the node-local cache (bridge/cache/: whole files, one download shared by the ranks of a
node, each checked against the record's size and CRC32C before it is read).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.futures import Future

from bridge import jobs
from bridge import manifest as manifests
from bridge import replicator
from bridge import routes
from bridge.config import Settings, load_settings
from bridge.errors import BridgeError, IntegrityError, ManifestError, ObjectNotFound
from bridge.hashing import crc32c, crc_hex
from bridge.pipeline.commit import journaled_entries
from bridge.pipeline.execute import JobContext, journal_for
from bridge.pipeline.plan import plan_copy
from bridge.stores import get_store
from bridge.torch import behind as uploads
from bridge.urls import Location, parse

METADATA = uploads.METADATA


def checkpoint_root(url: str | os.PathLike) -> Location:
    """The checkpoint's folder as a prefix; a URL bridge cannot parse is one BadURL line."""
    return parse(str(url)).as_prefix()


def is_checkpoint_url(checkpoint_id: str | os.PathLike) -> bool:
    try:
        checkpoint_root(checkpoint_id)
    except BridgeError:
        return False
    return True


# -- the upload of one folder, without its commit --------------------------------------------------

def _entries_of_journal(ctx: jobs.Context, unit: dict) -> dict:
    """The last unit of an upload whose commit is someone else's: what it wrote, durable first."""
    ctx.settle()
    entries = [json.loads(e.text) if isinstance(e, manifests.RawEntry) else e.to_dict()
               for e in journaled_entries(ctx.journal)]
    return {"entries": entries}


class _Uncommitted(JobContext):
    """A copy whose ``finalize`` hands back the entries instead of committing them."""

    ops = {**JobContext.ops, "finalize": _entries_of_journal}


def upload_uncommitted(folder: Path, root: Location, settings: Settings) -> list[dict]:
    """Every file of the local ``folder`` copied under ``root`` through the copy pipeline
    (parts, per-part checksums, a journal a re-run resumes from), and their entries, uncommitted."""
    source, destination = f"{folder.as_posix()}/", str(root)
    plan = plan_copy(source, destination, settings)
    plan.route, plan.route_why = routes.decide(parse(source), root, settings)
    journal = journal_for(plan, settings)
    ctx = _Uncommitted(plan, settings, journal)
    results = jobs.run(ctx, plan.units(), journal, settings.transfer.concurrency, f"the upload of {folder.name}")
    return results["entries"]


@dataclass(frozen=True)
class RankFiles:
    """What one rank wrote, sent with its write results to the coordinator (DCP gathers the
    results of every rank for ``finish``): the record's entries of its files."""
    rank: int
    entries: tuple[dict, ...]


class _AtURL:
    """What DCP asks of a writer or reader about where it is (``root``: the checkpoint's folder).
    Listed before torch's class among the bases."""

    root: Location

    @property
    def checkpoint_id(self) -> str:
        return str(self.root)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return is_checkpoint_url(checkpoint_id)


def _scratch(settings: Settings, prefix: str) -> Path:
    """A new folder of this process's own under the state folder (``dcp/``, named with the
    process id); those of processes no longer running (a rank killed mid-save) go first."""
    base = Path(settings.transfer.state_dir) / "dcp"
    base.mkdir(parents=True, exist_ok=True)
    for old in base.iterdir():
        pid = old.name.split("-")[1] if old.name.count("-") >= 2 else ""
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=base))


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- the writer ------------------------------------------------------------------------------------

class BridgeWriter(_AtURL, FileSystemWriter):
    """A DCP storage writer to ``url`` (s3://, gs://, az:// or a local folder), committed by
    bridge's record when the save returns (see the module's text).

    Args:
        url: the checkpoint's folder.
        settings: bridge's settings (endpoints, credentials, concurrency); ``load_settings()``
            when not given.
        behind: a folder all ranks share (local, Lustre): the save lands there and returns, and
            the upload runs in the background, committed when verified (bridge/torch/behind.py).
            Uploads a crash left pending are resumed when a writer with the same folder is made.
        thread_count: torch's serialisation threads per rank (files per rank).
    """

    def __init__(self, url: str | os.PathLike, *, settings: Settings | None = None,
                 behind: str | os.PathLike | None = None, thread_count: int = 1, **kwargs: Any) -> None:
        self.settings = settings or load_settings()
        self.root = checkpoint_root(url)
        self.behind = Path(behind).absolute() if behind is not None else None
        self._rank_folder: Path | None = None
        super().__init__(self._staging_path(), thread_count=thread_count,
                         sync_files=self.behind is not None, overwrite=True, **kwargs)
        if self.behind is not None:
            uploads.resume_pending(self.behind, self.settings, wait=False)

    def _staging_path(self) -> Path:
        """Where this rank's files land before they go: behind, the checkpoint's folder in the
        shared staging folder; otherwise a placeholder until the save's own scratch folder."""
        if self.behind is not None:
            return uploads.staged_folder(self.behind, self.root)
        return Path(tempfile.gettempdir())

    # what DCP asks of a storage writer ----------------------------------------------------------
    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id:
            self.root = checkpoint_root(checkpoint_id)
        super().reset(None)
        self.path = self._staging_path()

    def prepare_local_plan(self, plan):
        if self.behind is None:
            self.path = self._rank_folder = _scratch(self.settings, f"rank{self.rank or 0}-")
        else:
            Path(self.path).mkdir(parents=True, exist_ok=True)
        return plan   # (torch's check for an earlier .metadata looks at the staging folder: not asked)

    def prepare_global_plan(self, plans):
        # The coordinator, before any rank writes: an earlier checkpoint here stops looking complete.
        if self.behind is None:
            uploads.uncommit(get_store(self.root, self.settings), self.root)
        return super().prepare_global_plan(plans)

    def write_data(self, plan, planner) -> Future:
        written = super().write_data(plan, planner)
        if self.behind is not None:
            return written
        results = written.value()
        try:
            entries = upload_uncommitted(self._rank_folder, self.root, self.settings)
        finally:
            shutil.rmtree(self._rank_folder, ignore_errors=True)
        out: Future = Future()
        out.set_result([*results, RankFiles(self.rank or 0, tuple(entries))])
        return out

    def finish(self, metadata, results) -> None:
        ranks = [r for rank in results for r in rank if isinstance(r, RankFiles)]
        results = [[r for r in rank if not isinstance(r, RankFiles)] for rank in results]
        if self.behind is not None:
            super().finish(metadata, results)   # .metadata in the staging folder, then the upload
            uploads.submit(Path(self.path), self.root, self.settings)
            return
        self.path = _scratch(self.settings, "metadata-")
        try:
            super().finish(metadata, results)
            entries = upload_uncommitted(Path(self.path), self.root, self.settings)
        finally:
            shutil.rmtree(self.path, ignore_errors=True)
        commit_checkpoint(self.root, [e for r in ranks for e in r.entries] + entries, self.settings)


def commit_checkpoint(root: Location, entries: list[dict], settings: Settings) -> str:
    """The checkpoint's record, written last (``bridge.jobs.commit``, as ``cp`` commits), once
    every file it names is uploaded; then the policies covering its folder are told."""
    rels = [e["path"] for e in entries]
    if len(set(rels)) != len(rels):
        raise BridgeError(f"{root}: two ranks wrote the same file ({sorted(r for r in rels if rels.count(r) > 1)[0]})")
    store = get_store(root, settings)
    where = jobs.commit(store, root, str(root), str(root), sorted(entries, key=lambda e: e["path"]))
    replicator.announce(str(root), settings)
    return where


_UNREAD = object()


# -- the reader ------------------------------------------------------------------------------------

class _Source:
    """A file of the checkpoint as ``read_data`` opens it: a ranged read per item from the store,
    or a local file the cache holds."""

    def __init__(self, store, loc: Location, cached: Path | None):
        self.store, self.loc = store, loc
        self.file = open(cached, "rb") if cached is not None else None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self.file is not None:
            self.file.close()


class _Files:
    """What ``FileSystemReader.read_data`` uses of its file system: ``concat_path`` and
    ``create_stream(path, "rb")``, over a store and, when given, the node-local cache."""

    def __init__(self, reader: BridgeReader):
        self.reader = reader

    def concat_path(self, root: Location, rel: str) -> Location:
        return root.join(rel)

    def create_stream(self, loc: Location, mode: str) -> _Source:
        reader = self.reader
        cached = None
        if reader.cache is not None:
            cached = reader.cache.fetch(str(loc))
            reader.check_whole(loc, cached)
        return _Source(reader.store, loc, cached)


class BridgeReader(_AtURL, FileSystemReader):
    """A DCP storage reader of ``url`` (s3://, gs://, az:// or a local folder).

    Args:
        url: the checkpoint's folder.
        settings: bridge's settings; ``load_settings()`` when not given.
        cache: True reads whole files through the node-local cache of the settings
            (``cache.dir``; bridge/cache/), a path through a cache in that folder: the ranks of a
            node then share one download of each file. False (the default): ranged reads.
        committed_only: refuse a checkpoint without bridge's record (one a save did not finish).
    """

    def __init__(self, url: str | os.PathLike, *, settings: Settings | None = None,
                 cache: bool | str | os.PathLike = False, committed_only: bool = True) -> None:
        super().__init__(tempfile.gettempdir())
        self.settings = settings or load_settings()
        self.committed_only = committed_only
        self.cache = None
        if cache:
            from bridge.cache import Cache
            self.cache = Cache(self.settings, None if cache is True else cache)
        self.fs = _Files(self)
        self._at(url)

    def _at(self, url: str | os.PathLike) -> None:
        self.root = self.path = checkpoint_root(url)
        self.store = get_store(self.root, self.settings)
        self._record = _UNREAD

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        super().reset(None)
        self._at(checkpoint_id or str(self.root))   # a new load reads the record as it is now

    def read_metadata(self, *args: Any, **kwargs: Any):
        import pickle
        from torch.distributed.checkpoint.metadata import StorageMeta
        loc = self.root.join(METADATA)
        entry = self._recorded(METADATA)   # first: a save cut short is named as such
        try:
            data = self.store.read(loc)
        except ObjectNotFound:
            raise ManifestError(f"{self.root}: no {METADATA}: not a DCP checkpoint, or its save did not finish") from None
        if entry is not None and (entry.size != len(data) or entry.crc32c != crc_hex(crc32c(data))):
            raise IntegrityError(f"{loc}: {len(data)} bytes with CRC32C {crc_hex(crc32c(data))}, the record says "
                                 f"{entry.size} bytes with {entry.crc32c}: changed since the save committed")
        metadata = pickle.loads(data)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def check_whole(self, loc: Location, path: Path) -> None:
        """A whole file read (the cache's copy) against the record's entry, by size and CRC32C."""
        from bridge.cache.core import file_hashes
        entry = self._recorded(loc.relative_to(self.root))
        if entry is None:
            return
        size, crc, _ = file_hashes(path, sha=False)
        if (size, crc) != (entry.size, entry.crc32c):
            raise IntegrityError(f"{loc}: {size} bytes with CRC32C {crc} in the cache, the record says {entry.size} "
                                 f"bytes with {entry.crc32c}: changed since the save committed")

    def _recorded(self, rel: str):
        """The record's entry of ``rel`` (the record read once per load); None with
        ``committed_only=False`` and no record."""
        if self._record is _UNREAD:
            self._record = manifests.read(self.store, self.root)
        record = self._record
        if record is None:
            if self.committed_only:
                raise ManifestError(f"{self.root} is not committed (no bridge record): its save did not finish; "
                                    f"give committed_only=False to read it all the same")
            return None
        entry = record.files.get(rel)
        if entry is None and self.committed_only:
            raise ManifestError(f"{self.root}: its record does not name {rel}")
        return entry

    def _slice_file(self, source: _Source, sinfo) -> io.IOBase:
        if source.file is not None:
            return super()._slice_file(source.file, sinfo)
        data = source.store.read(source.loc, sinfo.offset, sinfo.length)
        if len(data) != sinfo.length:
            raise IntegrityError(f"{source.loc}: {len(data)} bytes at {sinfo.offset}, .metadata says {sinfo.length}")
        return io.BytesIO(data)


__all__ = ["BridgeReader", "BridgeWriter", "RankFiles", "commit_checkpoint", "upload_uncommitted"]
