"""Sync planning: a sync's plan, from the source's listing, the destination's listing and its
record merged in path order; only what is new, changed or no longer matches is planned."""

from __future__ import annotations

import collections
import concurrent.futures as cf
import contextlib
from typing import Any

from bridge import filters as filtering
from bridge import manifest as manifests
from bridge import meter
from bridge.verdicts import mismatch, reported_crc32c
from bridge.config import Settings
from bridge.filters import Filters
from bridge.hashing import rehash
from bridge.journal import job_key
from bridge.listing import checked_listing, listing_to, resolve
from bridge.meter import Pool
from bridge.progress import Progress
from bridge.stores import get_store
from bridge.stores.base import identity_changed
from bridge.stores.local import answered_here
from bridge.pipeline.parts import Part
from bridge.pipeline.plan import (Entries, FileList, Plan, batching, carrier_for, check_chunk_size, file_plan,
                                   part_listing, part_roots, spill_dir)


def _source_differs(store, info, entry) -> bool:
    """Whether a source object of the recorded size, whose identity does not show it to be the
    version the record names, holds other bytes than the record's CRC32C. From the checksum the
    store reports, where it reports one. Else, where the record names the version copied: the
    recorded ETag is the same content (S3: the MD5 of the bytes, or of the parts' MD5s; a
    rewrite of the same bytes changes only the object's time), and another version of a remote
    object is taken as changed unread: reading it to hash it costs the egress that copying it
    costs, and a changed one would be read twice. A local file, or an object under a record that
    names no version (written before records did), is read and hashed."""
    crc = reported_crc32c(store, info) if store.features.checksums or info.metadata else None
    if crc is None and entry.source_id and info.identity:
        etag = info.identity.get("etag")
        if etag and etag == entry.source_id.get("etag"):
            return False
        if not info.location.is_local:
            return True
    if crc is None:
        crc, _ = rehash(store, info.location, info.size, sha=False)
    return crc != entry.crc32c


def plan_sync(source: str, destination: str, settings: Settings, *, delete: bool = False,
              chunk_size: int | None = None, adopt: str = "checksum", filters: Filters | None = None,
              progress: Progress | None = None, part: Part | None = None) -> tuple[Plan, dict[str, int]]:
    """Only what is new, changed or no longer matches the destination's record; with ``delete``,
    what the source no longer has. The source's listing, the destination's listing and its record
    are merged in path order (none is held whole), and an object costs no request of its own
    while both listings show the versions the record names: the source's ``source_id`` and the
    destination's ``identity``. Where they differ (or an older record lacks them), the source's
    CRC32C (never its time) and the destination's checksums decide, at one request or read each;
    a new version of a remote source that reports no CRC32C is sent unread, unless its ETag is
    the recorded one (``_source_differs``).
    An object there that the record does not name (or with no record at all) is adopted when equal
    to its source (bridge/adopt.py; ``adopt``: checksum, deep or off). ``filters`` apply to both
    sides, as in rclone: a file they leave out is neither sent nor deleted. ``part``: only the
    paths of one part of the prefixes (bridge.pipeline.parts), on both sides and in the record.
    A large local folder is planned by parts in processes of their own (bridge.pipeline.forkplan)."""
    if part is None:
        from bridge.pipeline.forkplan import plan_sync_split
        split = plan_sync_split(plan_sync, source, destination, settings, delete=delete, chunk_size=chunk_size, adopt=adopt,
                                filters=filters, progress=progress)
        if split is not None:
            return split
    if part is None:
        src_root, dst_root, objects, single = resolve(source, destination, settings, filters, listing_to(progress))
    else:
        src_root, dst_root, objects, single = part_roots(source, destination, settings, part, filters,
                                                         listing_to(progress))
    objects = checked_listing(src_root, dst_root, objects, single)   # checked as the merge reads it
    src_store, dst_store = get_store(src_root, settings), get_store(dst_root, settings)
    check_chunk_size(chunk_size, dst_store)
    record = manifests.open_record(dst_store, dst_root)
    carrier = carrier_for(src_root, single, settings) if part is None or part.record else None
    counts = {"new": 0, "changed": 0, "repaired": 0, "unchanged": 0, "adopted": 0}
    adopted = Entries(where=spill_dir(settings))   # on disk past a few thousand
    if progress is not None:
        progress.begin("planning")

    def judge(info, entry, there) -> str:
        if entry.size != info.size:
            return "changed"
        if not (entry.source_id and info.identity and not identity_changed(entry.source_id, info.identity)):
            if _source_differs(src_store, info, entry):
                return "changed"
        if entry.identity and there.identity and not identity_changed(entry.identity, there.identity):
            return "unchanged"   # the very version committed (and checked then)
        return "repaired" if mismatch(dst_store, there, entry) is not None else "unchanged"

    def adoption(rel: str, info, there, known=None):
        # (the usual case, for less; without a prefetch the merge's loop asked it already)
        text = adopting.quick(rel, info, there, known) if prefetch is not None else None
        if text is not None:
            return ("adopted", text) if text else "changed"
        found = adopting.compare(src_store, info, dst_store, there, rel, deep=adopt == "deep", known=known)
        return ("adopted", found.entry) if found.equal else "changed"

    from bridge import adopt as adopting
    # small local files onto a destination that reports their checksums: hashed by processes of
    # their own, a batch at a time (bridge/adopt.py Prefetch); verdicts wait in a longer window
    # (not where no process can be forked: a part's, a Celery worker's)
    prefetch = adopting.Prefetch() if (adopt == "checksum" and src_root.is_local and not dst_root.is_local
                                       and adopting._can_fork()) else None
    window_size = 4 * settings.transfer.concurrency + (3 * prefetch.BATCH if prefetch is not None else 0)

    files = FileList(where=spill_dir(settings))
    deletions: list[str] = []
    window: collections.deque[tuple[str, Any, Any]] = collections.deque()
    # what planning asked of the stores, for the estimate (bridge.policies.cost.usage): listings' lengths and
    # the record's documents and shards read
    listed = {"source": 0, "destination": 0,
              "record_reads": sum(1 + len(s.doc.get("file_shards", [])) for s in record.sources) if record else 0}

    def settle(limit: int) -> None:
        while len(window) > limit:
            rel, info, verdict = window.popleft()
            if isinstance(verdict, cf.Future):
                verdict = verdict.result()
            elif isinstance(verdict, _Prefetched):
                verdict = adoption(rel, info, verdict.there, prefetch.get(verdict.ticket))
            if isinstance(verdict, tuple):    # adopted: its entry is committed, nothing sent
                verdict, entry = verdict
                if isinstance(entry, str):   # (quick's text)
                    adopted.append_encoded(rel, entry)
                else:
                    adopted.append(entry)
            counts[verdict] += 1
            if progress is not None:
                progress.checked()
                progress.judged(rel, verdict, info.size)
            if verdict not in ("unchanged", "adopted"):
                files.append(file_plan(rel, info, dst_store, chunk_size, carrier))

    with Pool(settings.transfer.concurrency) as pool, _closing(prefetch):
        # each listing made by a thread of its own, ahead of the merge: a page is fetched while
        # the objects of the last are judged, not between. The record is decoded here, its
        # shards read ahead (Record.entries): a third thread of Python work beside these cost a
        # no-op sync of 20,000 files more CPU in turns for the GIL than it saved (bench/notes/adopt-pack.md)
        entries = iter(()) if record is None else record.entries() if part is None else \
            (e for e in record.entries() if part.holds(e.path))
        present = filtering.walk(dst_store, dst_root, filters, progress.saw if progress else None) if part is None \
            else part_listing(dst_store, dst_root, part, filters, progress.saw if progress else None)
        # A part's process has a core of its own at most (as many processes as cores): there a walk
        # of a local filesystem, which waits on nothing, is read in the merge's thread, where a
        # thread ahead would only take turns with it for the GIL and the core (bench/notes/adopt-pack.md)
        inline = part is not None and src_root.is_local and answered_here(src_root.local_path)
        for rel, info, entry, there in _merged(objects if inline else meter.ahead(objects), entries,
                                               meter.ahead(present), listed):
            if info is None:
                if delete and single is None and there is not None:
                    deletions.append(rel)
                continue
            if entry is None and there is not None and adopt != "off":
                if prefetch is None and (text := adopting.quick(rel, info, there)) is not None:
                    window.append((rel, info, ("adopted", text) if text else "changed"))   # the usual case
                elif adopting.offline(info, there):   # decided here: no request, a small file
                    ticket = None
                    if prefetch is not None and info.size == there.size:
                        ticket = prefetch.add(info)
                    window.append((rel, info, _Prefetched(there, ticket) if ticket is not None
                                   else adoption(rel, info, there)))
                else:
                    window.append((rel, info, pool.submit(adoption, rel, info, there)))
            elif entry is None or there is None:
                window.append((rel, info, "new"))
            elif (entry.size == info.size and entry.source_id and info.identity
                  and not identity_changed(entry.source_id, info.identity) and entry.identity and there.identity
                  and not identity_changed(entry.identity, there.identity)):
                window.append((rel, info, "unchanged"))   # the common case, decided without a thread
            else:
                window.append((rel, info, pool.submit(judge, info, entry, there)))
            settle(window_size)
        settle(0)
    if delete and single is None:
        counts["deleted"] = len(deletions)
    plan = Plan(str(src_root) if single is None else single, str(dst_root), single, files, deletions)
    plan.listed = listed
    plan.adopted = adopted
    # As for copy, not the file list: what a killed sync finished is found again by path.
    plan.key = job_key("sync", plan.source, plan.destination, chunk_size, delete,
                       *((filters.key(),) if filters is not None and filters.active else ()))
    batching(plan, src_root, dst_root, settings)
    return plan, counts


class _Prefetched:
    """A verdict that waits for a file's digests from adoption's processes (bridge/adopt.py)."""
    __slots__ = ("there", "ticket")

    def __init__(self, there, ticket) -> None:
        self.there, self.ticket = there, ticket


@contextlib.contextmanager
def _closing(prefetch):
    """Adoption's processes ended with the plan: after their last batch, or at once on an error."""
    try:
        yield
    except BaseException:
        if prefetch is not None:
            prefetch.close(done=False)
        raise
    if prefetch is not None:
        prefetch.close()


def _merged(objects, entries, present, listed: dict[str, int]):
    """(path, source info, record entry, destination info) for every path any of the three
    sorted streams has, in path order; None where one lacks it. Counts into ``listed`` how many
    objects each listing gave."""
    src, ent, dst = next(objects, None), next(entries, None), next(present, None)
    while src is not None or ent is not None or dst is not None:
        path = src[0] if src is not None else None   # the least of the three (a comparison each, not min())
        if ent is not None and (path is None or ent.path < path):
            path = ent.path
        if dst is not None and (path is None or dst[0] < path):
            path = dst[0]
        row_src = src[1] if src is not None and src[0] == path else None
        row_ent = ent if ent is not None and ent.path == path else None
        row_dst = dst[1] if dst is not None and dst[0] == path else None
        if row_src is not None:
            src = next(objects, None)
            listed["source"] += 1
        if row_ent is not None:
            ent = next(entries, None)
        if row_dst is not None:
            dst = next(present, None)
            listed["destination"] += 1
        yield path, row_src, row_ent, row_dst
