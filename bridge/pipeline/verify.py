"""Verify: every committed copy under a URL checked against its record, by size and the
checksums the store reports, or with ``deep`` by reading the bytes again."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bridge import verdicts
from bridge import manifest as manifests
from bridge.config import Settings
from bridge.errors import BridgeError, InvalidOption, ManifestError
from bridge.filters import Filters
from bridge.listing import with_filters
from bridge.manifest import FileEntry
from bridge.meter import Pool
from bridge.progress import Progress
from bridge.spill import Rows
from bridge.stores import get_store
from bridge.stores.base import ObjectInfo, is_reserved
from bridge.urls import Location, parse
from bridge.pipeline.plan import BATCH_BYTES, BATCH_FILES, spill_dir
from bridge.pipeline.units import BATCH_IN_FLIGHT, batch_connections


LISTED = 10_000   # names listed per kind of problem in a report (all are counted)


def verify(url: str, settings: Settings, *, deep: bool = False, sha256: bool = False,
           filters: Filters | None = None, progress: Progress | None = None) -> dict[str, Any]:
    """Check every committed copy under ``url`` against its record: sizes and store-reported
    checksums, or with ``deep`` a full re-read. ``url`` may be a copy's root, or any prefix above
    copies (a bucket, a replication policy's destination): each committed prefix beneath it is
    checked against its own record, and an object under none of them is extra. Lists missing,
    extra, mismatched and unproven files (an entry whose note begins manifest.UNPROVEN, which a
    cheap check does not pass: only ``deep`` reads it), paths relative to ``url``; streams both
    sides in path order.
    ``filters``: only the files they select (a record's entry by its recorded size). ``sha256``
    (with ``deep``): the plain whole-file SHA-256 is computed too, and checked where recorded."""
    if sha256 and not deep:
        raise InvalidOption("verify --sha256 re-reads every object: give --deep with it")
    root = parse(url).as_prefix()
    store = get_store(root, settings)
    store.check_bucket(root)
    tree = _Tree(store, root, spill_dir(settings))
    prefixes = tree.prefixes
    if not prefixes:
        kept = f" (with the records kept under {settings.transfer.manifest_dir})" if root.is_local and \
            settings.transfer.manifest_dir else " (records kept outside the data need --manifest-dir DIR)" \
            if root.is_local else ""
        raise ManifestError(f"no manifest at or under {root}{kept}: the copy there is incomplete, or was not made "
                            f"by mcbridge")
    report: dict[str, Any] = {"url": str(root), "ok": True, "deep": deep, "checked": 0, "bytes": 0,
                              "missing": [], "extra": [], "mismatched": [], "rehashed": [], "unproven": [],
                              "shard_sets": [], "counts": {"missing": 0, "extra": 0, "mismatched": 0, "rehashed": 0,
                                                           "unproven": 0, "proven": 0}, "copies": []}
    active = filters if filters is not None and filters.active else None
    if progress is not None:
        progress.begin("verifying")
    with Pool(settings.transfer.concurrency) as pool, contextlib.closing(tree):
        for prefix in prefixes:
            report["copies"].append(_verify_copy(store, root, prefix, prefixes, tree.walk(prefix), deep, pool, report,
                                                 active, progress, sha256, settings=settings))
        if "" not in prefixes:
            # Objects under no committed prefix: uncommitted (a copy in progress, or not bridge's).
            for rel, info in tree.walk(""):
                if not any(rel.startswith(p) for p in prefixes) and (active is None or active.selects(rel, info)):
                    _note(report, "extra", rel)
    report["ok"] = not any(report["counts"][k] for k in ("missing", "extra", "mismatched", "unproven")) \
        and all(s["ok"] for s in report["shard_sets"])
    report["hints"] = hints(report["counts"])
    return with_filters(report, filters)


def hints(counts: dict[str, int]) -> list[str]:
    """What to run about what a check found: extra objects are what a plain sync never touches
    (it sends and repairs; it removes only with --delete), the one failure it cannot close."""
    found = []
    extra = counts.get("extra", 0)
    if extra:
        found.append(f"{extra:,} extra object{'s' if extra != 1 else ''} at the destination: sync --delete from its "
                     f"source removes {'them' if extra != 1 else 'it'} (or mcbridge rm)")
    if counts.get("missing", 0) or counts.get("mismatched", 0):
        found.append("missing or mismatched objects: sync from the source sends and repairs them")
    return found


_INFO_FIELDS = tuple(f.name for f in dataclasses.fields(ObjectInfo))[1:]   # all but its location, in order


class _Tree:
    """One listing of everything under ``root``, read once: the prefixes holding a record, found
    in it, and its data objects, kept on disk (bridge.spill) and replayed per prefix in path
    order. A verify of ten million objects lists them once and holds one page in memory."""

    def __init__(self, store, root, where: Path):
        self.rows = Rows(2, where)
        apart = manifests.record_home(store, root) != root     # records kept outside the data
        found: set[str] = set()
        import pickle   # only for a listing of committed prefixes: not on every start-up
        for info in store.list(root):
            rel = info.location.relative_to(root)
            head = None if apart else manifests.record_head(rel)
            if head is not None:
                found.add(head)
            elif rel and not is_reserved(rel):
                # As a flat tuple: a third of the bytes, and a quarter of the time, of the dataclass
                loc = info.location
                self.rows.append((rel, pickle.dumps((loc.scheme, loc.bucket, loc.key,
                                                     *(getattr(info, name) for name in _INFO_FIELDS)),
                                                    pickle.HIGHEST_PROTOCOL)))
        self.prefixes = manifests.committed_prefixes(store, root) if apart else sorted(found)

    def walk(self, prefix: str):
        """(path relative to ``prefix``, info) of each data object under it, in path order."""
        import pickle
        for rel, blob in self.rows.from_key(prefix):
            if not rel.startswith(prefix):
                return
            scheme, bucket, key, *values = pickle.loads(blob)
            yield rel[len(prefix):], ObjectInfo(Location(scheme, bucket, key), *values)

    def close(self) -> None:
        self.rows.close()


def _note(report: dict, kind: str, row: Any) -> None:
    report["counts"][kind] += 1
    if len(report[kind]) < LISTED:
        report[kind].append(row)


def _verify_copy(store, root, prefix: str, prefixes: list[str], listing, deep: bool, pool: cf.ThreadPoolExecutor,
                 report: dict, filters: Filters | None = None, progress: Progress | None = None,
                 sha256: bool = False, *, settings: Settings) -> dict[str, Any]:
    """One committed prefix: a merge of its listing and its record, both in path order. An object
    under a deeper committed prefix belongs to that one, unless this record names it too. A deep
    check of small whole objects on a store that ``reads_many`` reads them in batches, as a copy
    does (``verdicts.judge_many``: many requests in flight from one thread), one batch at a time."""
    at = root.join(prefix.rstrip("/")).as_prefix() if prefix else root   # a local join takes no trailing /
    record = manifests.open_record(store, at)
    deeper = [p[len(prefix):] for p in prefixes if p != prefix and p.startswith(prefix)]
    before = dict(report["counts"])
    checked = size = 0
    window: list[tuple[list[str], cf.Future]] = []   # in path order: one path's judge, or a batch's
    in_batches = deep and store.reads_many
    batch: list[tuple[str, ObjectInfo, Any]] = []
    batch_bytes = 0
    last_batch: list[cf.Future] = []

    reading: dict[str, FileEntry] = {}   # unproven entries a deep check reads: proven when equal
    proven: list[FileEntry] = []

    def drain(limit: int) -> None:
        while len(window) > limit:
            paths, fut = window.pop(0)
            verdicts = fut.result()
            for path, verdict in zip(paths, verdicts if isinstance(verdicts, list) else [verdicts]):
                if path in reading:
                    entry = reading.pop(path)
                    if not verdict.problem:
                        proven.append(entry)
                if verdict.problem:
                    _note(report, "mismatched", {"path": prefix + path, "reason": verdict.problem})
                elif verdict.rehashed:
                    _note(report, "rehashed", {"path": prefix + path, "reason": verdict.rehashed})
                elif getattr(verdict, "unproven", ""):
                    _note(report, "unproven", {"path": prefix + path, "reason": verdict.unproven})

    def send_batch() -> None:
        nonlocal batch, batch_bytes
        if not batch:
            return
        if last_batch:   # one at a time, each one event loop's connections (as a copy's batches)
            cf.wait(last_batch)
        items, batch, batch_bytes = batch, [], 0
        connections = batch_connections(settings, max(entry.size for _path, _info, entry in items))
        fut = pool.submit(verdicts.judge_many, store, [(info, entry) for _path, info, entry in items], connections)
        if progress is not None:
            def checked(_f, sizes=[entry.size for _path, _info, entry in items]) -> None:
                for n in sizes:
                    progress.checked(n)
            fut.add_done_callback(checked)
        last_batch[:] = [fut]
        window.append(([path for path, _info, _entry in items], fut))
        drain(4 * pool._max_workers)

    indexes: list[FileEntry] = []   # shard-set indexes the record holds as files (bridge/packing/index.py)
    entries = record.entries() if record else iter(())
    if filters is not None:   # paths as the filters see them: relative to the URL verified
        entries = (e for e in entries if filters.selects(prefix + e.path, _Recorded(e.size)))
        listing = ((rel, info) for rel, info in listing if filters.selects(prefix + rel, info))
    if record is not None:
        from bridge.packing import index
        entries = index.noting_indexes(entries, indexes)
    entry, obj = next(entries, None), next(listing, None)
    while entry is not None or obj is not None:
        if obj is None or (entry is not None and entry.path < obj[0]):
            _note(report, "missing", prefix + entry.path)
            checked, size = checked + 1, size + entry.size
            entry = next(entries, None)
        elif entry is None or obj[0] < entry.path:
            if not any(obj[0].startswith(d) for d in deeper):
                _note(report, "extra", prefix + obj[0])
            obj = next(listing, None)
        else:
            checked, size = checked + 1, size + entry.size
            if progress is not None:
                progress.plan_checks(1, entry.size)
            if deep and entry.unproven:
                reading[entry.path] = proven_by_reading(entry, obj[1])
            if not deep and verdicts.proven_by_listing(obj[1], entry) and not entry.unproven:
                # Most objects: passed here, where a pool's hand-off cost more than the check
                # (about half of a 10,000-object verify's time went to futures and wake-ups).
                if progress is not None:
                    progress.checked(entry.size)
            # small whole objects: at least four of them in flight within a batch's byte bound
            elif in_batches and obj[1].size == entry.size <= BATCH_IN_FLIGHT // 4 and verdicts.judged_whole(entry):
                batch.append((entry.path, obj[1], entry))
                batch_bytes += entry.size
                if len(batch) >= BATCH_FILES or batch_bytes >= BATCH_BYTES:
                    send_batch()
            else:
                send_batch()   # what is waiting goes first: the report keeps path order
                fut = pool.submit(_judge, store, obj[1], entry, deep, sha256)
                if progress is not None:
                    fut.add_done_callback(lambda _f, n=entry.size: progress.checked(n))
                window.append(([entry.path], fut))
                drain(4 * pool._max_workers)
            entry, obj = next(entries, None), next(listing, None)
    send_batch()
    drain(0)
    if proven:
        # What a deep read proved is recorded, so that the cheap verify of that version passes
        # from then on instead of reading it at every run.
        try:
            manifests.append(store, at, record.source, record.destination, proven)
            report["counts"]["proven"] += len(proven)
        except BridgeError as exc:   # read-only credentials: the objects are proven, not recorded so
            report["not_recorded"] = f"{len(proven)} files proven by reading, not recorded at {at}: {exc}"
    shard_sets = []
    named = (record.extra if record else {}).get("shard_sets", {})
    for shard_prefix, index_entry in sorted(index.recorded_sets(store, at, named, indexes).items() if record else ()):
        problems = list(index.check(store, at, index_entry, deep=deep))
        shard_sets.append({"prefix": prefix + shard_prefix, "index": index_entry.get("index"), "ok": not problems,
                           "problems": problems})
    report["shard_sets"].extend(shard_sets)
    report["checked"] += checked
    report["bytes"] += size
    found = {k: report["counts"][k] - before[k] for k in before}
    return {"prefix": prefix, "url": str(at), "files": checked, "bytes": size,
            "ok": not (found["missing"] or found["extra"] or found["mismatched"] or found["unproven"])
            and all(s["ok"] for s in shard_sets), **found}


def proven_by_reading(entry: FileEntry, info: ObjectInfo) -> FileEntry:
    """``entry``, once a deep read found the object listed as ``info`` equal to it: the version
    read is the one recorded, and its note says how it was proven (manifest.READ_BACK)."""
    how = entry.note[len(manifests.UNPROVEN):].strip()
    when = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return dataclasses.replace(entry, identity=dict(info.identity),
                               note=f"{manifests.READ_BACK} by verify --deep at {when}; {how}")


@dataclasses.dataclass(frozen=True)
class _Unproven:
    """A verdict that finds nothing wrong with an object whose entry nothing proved (its note
    begins manifest.UNPROVEN): a copy the clouds made that no checksum both stores computed
    vouches for. Only reading it proves it: ``verify --deep``."""
    unproven: str
    problem: None = None
    rehashed: None = None



def _judge(store, info, entry, deep: bool, sha256: bool):
    verdict = verdicts.judge(store, info, entry, deep, sha256)
    if deep or verdict.problem or verdict.rehashed or not entry.unproven:
        return verdict   # a problem, or bytes read and found equal, says more than the note
    return _Unproven(entry.note[len(manifests.UNPROVEN):].strip() + " (verify --deep reads it)")


class _Recorded:
    """A record's entry as the filters see an object: its recorded size, no time."""

    def __init__(self, size: int):
        self.size, self.modified = size, None
