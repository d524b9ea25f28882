"""What the CLI (and the workers) call: copy, sync, verify, list. Each returns a JSON-able summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bridge import meter
from bridge.meter import Pool
from bridge.config import Settings
import collections.abc
from collections.abc import Callable, Iterator
import concurrent.futures as cf
import contextlib
import dataclasses
from datetime import datetime, timezone
import gc

from bridge import bwlimit
from bridge import manifest as manifests
from bridge import check
from bridge import estimate
from bridge import filters as filtering
from bridge.filters import Filters
from bridge import routes
from bridge.check import mismatch, reported_crc32c
from bridge.stores.base import ObjectInfo, identity_changed, is_reserved
from bridge.hashing import rehash
from bridge import jobs
from bridge.engine import (BATCH_BYTES, BATCH_FILES, BATCH_IN_FLIGHT, Entries, FileList, FilePlan, JobContext, Plan,
                           batch_connections, batching, carrier_for, check_chunk_size, checked_listing, file_plan,
                           part_size_for, plan_copy, resolve, spill_dir)
from bridge.errors import BridgeError, InvalidOption, JobCancelled, ManifestError, ObjectNotFound
from bridge.manifest import FileEntry
from bridge.journal import job_key
from bridge.journal import FileJournal, journal_at
from bridge.progress import Progress
from bridge.spill import Rows
from bridge.stores import get_store
from bridge.urls import Location, parse


def journal_for(plan: Plan, settings: Settings, state_dir: Path | None = None) -> FileJournal:
    base = state_dir or Path(settings.transfer.state_dir)
    return journal_at(base, plan.key)


def _quiet_gc() -> None:
    """The SDKs leave ~10^6 long-lived objects (service models, clients) that the cyclic GC
    would walk again and again during a transfer: a profile showed it as the largest single CPU
    cost of a cloud-to-cloud copy. Freeze them out of its reach once the stores exist."""
    gc.collect()
    gc.freeze()


class PlanRows:
    """A dry run's row per file, made as they are read: the plan of a job of millions of files
    is printed without a list of them in memory (``bridge.cli`` streams it)."""

    def __init__(self, files):
        self.files = files

    def __iter__(self):
        for f in self.files.shapes():
            yield {"path": f.rel, "size": f.size, "parts": f.parts if f.part_size else 1, "part_size": f.part_size}

    def __len__(self) -> int:
        return len(self.files)


def plan_summary(plan: Plan) -> dict[str, Any]:
    return {"source": plan.source, "destination": plan.destination, "files": len(plan.files),
            "bytes": plan.bytes, "units": plan.unit_count(),
            "multipart_files": plan.files.multipart,
            "deletions": len(plan.deletions), "adopted": len(plan.adopted),
            "route": {"name": plan.route, "why": plan.route_why},
            "usage": estimate.of_plan(plan).to_dict(),
            "plan": PlanRows(plan.files)}


def execute(plan: Plan, settings: Settings, progress: Progress | None = None,
            state_dir: Path | None = None) -> dict[str, Any]:
    progress = progress or Progress()
    if progress.limiter is None and settings.transfer.bwlimit:
        progress.limiter = bwlimit.local(settings.transfer.bwlimit)
    journal = journal_for(plan, settings, state_dir)
    ctx = JobContext(plan, settings, journal, progress)
    ctx.meter = meter.current() or ctx.meter
    _quiet_gc()
    progress.begin("copying")
    progress.plan(plan.bytes, plan.unit_count())
    # A route whose service moves the bytes cancels its remote job on SIGTERM as on Ctrl-C.
    remote = getattr(routes.REGISTRY.get(plan.route), "remote", False)
    if remote:
        from bridge.routes.delegated import sigterm_cancels
    try:
        with (sigterm_cancels() if remote else contextlib.nullcontext()):
            results = jobs.run(ctx, plan.units(), journal, settings.transfer.concurrency, "copy")
    except (KeyboardInterrupt, JobCancelled) as exc:
        if not ctx.cancel_note:
            raise
        raise JobCancelled(f"{str(exc) or 'interrupted'}; {ctx.cancel_note}") from None
    route = routes.report(plan, ctx.fallbacks, progress.bytes_through, ctx.unproven)
    if ctx.remote:
        route["remote"] = ctx.remote
    return {"source": plan.source, "destination": plan.destination, "files": len(plan.files),
            "bytes": plan.bytes, "ok": True, "errors": [], **progress.snapshot(),
            "route": route, "manifest": results["manifest"], "metered": ctx.meter.to_dict()}


def _within_budget(plan: Plan, settings: Settings, max_cost: float | None, what: str) -> None:
    """Refuse a plan estimated above ``max_cost`` dollars, before any data request."""
    if max_cost is not None:
        from bridge import costing, estimate
        costing.check_budget(estimate.of_plan(plan), settings, max_cost, what)


def adopt_existing(plan: Plan, settings: Settings, mode: str) -> None:
    """``cp --skip-existing``/``--checksum``: files whose destination object is already equal to
    the source (bridge/adopt.py) leave the plan and are committed as adopted. The plan's files and
    the destination's listing are merged in path order, a bounded window of them judged at once:
    neither the listing nor the verdicts are held whole."""
    if mode == "off" or not plan.files:
        return
    src_root = parse(plan.source) if plan.single is None else parse(plan.single, empty_segments=True)
    dst_root = parse(plan.destination)
    src_store, dst_store = get_store(src_root, settings), get_store(dst_root, settings)
    from bridge import adopt as adopting   # only where something may be adopted: not on every start-up
    deep = mode == "deep"
    kept, adopted = FileList(where=plan.files.where), Entries(where=plan.files.where)
    window: list[tuple[FilePlan, Any]] = []   # (file, None | its Adoption | a future of it)

    def settle(limit: int) -> None:
        while len(window) > limit:
            f, judged = window.pop(0)
            found = judged.result() if isinstance(judged, cf.Future) else judged
            if found is not None and found.equal:
                adopted.append(found.entry.to_dict())
            else:
                kept.append(f)

    # The source's listing again, beside the plan's files, for what each reports (its checksums):
    # one request a thousand objects, where asking each object would cost a request of its own.
    sources = iter(src_store.walk(src_root)) if plan.single is None else iter(())
    present = iter(dst_store.walk(dst_root))
    src, there = next(sources, None), next(present, None)
    with Pool(settings.transfer.concurrency) as pool:
        for f in plan.files:   # in path order, as the listings are
            while there is not None and there[0] < f.rel:
                there = next(present, None)
            while src is not None and src[0] < f.rel:
                src = next(sources, None)
            if there is None or there[0] != f.rel:
                window.append((f, None))
            else:
                info = src[1] if src is not None and src[0] == f.rel else None
                if info is None:   # a single object, or one the listing no longer shows
                    info = src_store.info(src_root if plan.single else src_root.join(f.rel))
                if info.size != f.size:   # changed since it was planned: sent as planned
                    window.append((f, None))
                elif adopting.offline(info, there[1]):   # decided here: no request, a small local file
                    window.append((f, adopting.compare(src_store, info, dst_store, there[1], f.rel, deep=deep)))
                else:
                    window.append((f, pool.submit(adopting.compare, src_store, info, dst_store, there[1], f.rel,
                                                  deep=deep)))
            settle(4 * settings.transfer.concurrency)
        settle(0)
    plan.files.close()
    plan.files, plan.adopted = kept, adopted


def listing_to(progress: Progress | None):
    """The ``listed`` callback of a listing that ``progress`` follows (None: nobody does)."""
    if progress is None:
        return None
    progress.begin("listing")
    return progress.saw


def _filtered(summary: dict[str, Any], filters: Filters | None) -> dict[str, Any]:
    if filters is not None and filters.active:
        summary["filters"] = filters.to_dict()
    return summary


def copy(source: str, destination: str, settings: Settings, *, chunk_size: int | None = None,
         progress: Progress | None = None, state_dir: Path | None = None, dry_run: bool = False,
         max_cost: float | None = None, route: str | None = None, adopt: str = "off",
         filters: Filters | None = None) -> dict:
    routes.refuse_forced(source, destination, settings, route)
    with meter.metering(meter.current() or meter.Meter()):   # the listing counts as what ran, too
        plan = plan_copy(source, destination, settings, chunk_size, filters=filters, listed=listing_to(progress))
        adopt_existing(plan, settings, adopt)
        plan = routes.choose(plan, settings, route)
        _within_budget(plan, settings, max_cost, "copy")
        if dry_run:
            return _filtered({"dry_run": True, **plan_summary(plan)}, filters)
        return _filtered(execute(plan, settings, progress, state_dir), filters)


def ls(url: str, settings: Settings, *, recursive: bool = True, filters: Filters | None = None,
       progress: Progress | None = None) -> list[dict[str, Any]]:
    """The objects under ``url`` (or the one object it names), sorted by path: with
    ``recursive``, every one; else those directly under it and its folders (rows with
    ``dir: True`` and no size), from one level of the store's listing. Each row: path, size, modified (epoch
    seconds or None), storage class, and the version's identity (ETag, generation ...)."""
    loc = parse(url)
    store = get_store(loc, settings)
    store.check_bucket(loc)
    if not loc.is_prefix:
        try:
            info = store.info(loc)
            return [_row(info.location.name, info)]
        except ObjectNotFound:
            loc = loc.as_prefix()
    if recursive:
        rows = [_row(rel, info) for rel, info in filtering.walk(store, loc, filters, listing_to(progress))]
    else:
        rows = _one_level(store, loc.as_prefix(), filters, progress)
    seen = bool(rows)
    if not seen and not (loc.is_local and Path(loc.local_path).is_dir()):
        if not (filters is not None and filters.active and next(iter(store.walk(loc)), None) is not None):
            raise ObjectNotFound(f"{loc}: nothing there")
    return sorted(rows, key=lambda r: r["path"])


def _one_level(store, loc, filters: Filters | None, progress: Progress | None) -> list[dict[str, Any]]:
    """The objects directly under ``loc`` and its folders, from one level of the store's listing
    (a delimiter: nothing deeper is listed). A folder's row has no size (``du`` adds one up);
    filters select the objects, and the folders they could select something in."""
    active = filters if filters is not None and filters.active else None
    listed = listing_to(progress)
    rows = []
    for found in store.list_level(loc):
        if isinstance(found, ObjectInfo):
            rel = found.location.relative_to(loc)
            if rel and not is_reserved(rel) and (active is None or active.selects(rel, found)):
                rows.append(_row(rel, found))
        else:
            rel = found.as_prefix().relative_to(loc)
            if rel.strip("/") and not is_reserved(rel.rstrip("/")) and (active is None or active.selects_folder(rel)):
                rows.append({"path": rel, "dir": True, "size": None, "modified": None, "storage_class": None,
                             "identity": {}})
    if listed is not None:
        listed(len(rows))
    return rows


LISTED = 10_000   # names listed per kind of problem in a report (all are counted)


def _row(rel: str, info) -> dict[str, Any]:
    return {"path": rel, "size": info.size, "modified": info.modified, "storage_class": info.storage_class,
            "identity": dict(info.identity)}


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
    return _filtered(report, filters)


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
    does (``check.judge_many``: many requests in flight from one thread), one batch at a time."""
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
        fut = pool.submit(check.judge_many, store, [(info, entry) for _path, info, entry in items], connections)
        if progress is not None:
            def checked(_f, sizes=[entry.size for _path, _info, entry in items]) -> None:
                for n in sizes:
                    progress.checked(n)
            fut.add_done_callback(checked)
        last_batch[:] = [fut]
        window.append(([path for path, _info, _entry in items], fut))
        drain(4 * pool._max_workers)

    entries = record.entries() if record else iter(())
    if filters is not None:   # paths as the filters see them: relative to the URL verified
        entries = (e for e in entries if filters.selects(prefix + e.path, _Recorded(e.size)))
        listing = ((rel, info) for rel, info in listing if filters.selects(prefix + rel, info))
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
            if not deep and check.proven_by_listing(obj[1], entry) and not entry.unproven:
                # Most objects: passed here, where a pool's hand-off cost more than the check
                # (about half of a 10,000-object verify's time went to futures and wake-ups).
                if progress is not None:
                    progress.checked(entry.size)
            # small whole objects: at least four of them in flight within a batch's byte bound
            elif in_batches and obj[1].size == entry.size <= BATCH_IN_FLIGHT // 4 and check.judged_whole(entry):
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
    for shard_prefix, index_entry in sorted((record.extra if record else {}).get("shard_sets", {}).items()):
        from bridge.packing import index  # only records of packed corpora name shard sets
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
    verdict = check.judge(store, info, entry, deep, sha256)
    if deep or verdict.problem or verdict.rehashed or not entry.unproven:
        return verdict   # a problem, or bytes read and found equal, says more than the note
    return _Unproven(entry.note[len(manifests.UNPROVEN):].strip() + " (verify --deep reads it)")


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


class _Recorded:
    """A record's entry as the filters see an object: its recorded size, no time."""

    def __init__(self, size: int):
        self.size, self.modified = size, None


def plan_sync(source: str, destination: str, settings: Settings, *, delete: bool = False,
              chunk_size: int | None = None, adopt: str = "checksum", filters: Filters | None = None,
              progress: Progress | None = None) -> tuple[Plan, dict[str, int]]:
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
    sides, as in rclone: a file they leave out is neither sent nor deleted."""
    src_root, dst_root, objects, single = resolve(source, destination, settings, filters, listing_to(progress))
    objects = checked_listing(src_root, dst_root, objects, single)   # checked as the merge reads it
    src_store, dst_store = get_store(src_root, settings), get_store(dst_root, settings)
    check_chunk_size(chunk_size, dst_store)
    record = manifests.open_record(dst_store, dst_root)
    carrier = carrier_for(src_root, single, settings)
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

    def adoption(rel: str, info, there):
        from bridge import adopt as adopting
        found = adopting.compare(src_store, info, dst_store, there, rel, deep=adopt == "deep")
        return ("adopted", found.entry.to_dict()) if found.equal else "changed"

    files = FileList(where=spill_dir(settings))
    deletions: list[str] = []
    window: list[tuple[str, Any, Any]] = []
    # what planning asked of the stores, for the estimate (bridge.estimate): listings' lengths and
    # the record's documents and shards read
    listed = {"source": 0, "destination": 0,
              "record_reads": sum(1 + len(s.doc.get("file_shards", [])) for s in record.sources) if record else 0}

    def settle(limit: int) -> None:
        while len(window) > limit:
            rel, info, verdict = window.pop(0)
            if isinstance(verdict, cf.Future):
                verdict = verdict.result()
            if isinstance(verdict, tuple):    # adopted: its entry is committed, nothing sent
                verdict, entry = verdict
                adopted.append(entry)
            counts[verdict] += 1
            if progress is not None:
                progress.checked()
            if verdict not in ("unchanged", "adopted"):
                files.append(file_plan(rel, info, dst_store, chunk_size, carrier))

    with Pool(settings.transfer.concurrency) as pool:
        # each stream read by a thread of its own, ahead of the merge: a listing page is fetched
        # (and the record read) while the objects of the last are judged, not between
        for rel, info, entry, there in _merged(meter.ahead(objects),
                                               meter.ahead(record.entries()) if record else iter(()),
                                               meter.ahead(filtering.walk(dst_store, dst_root, filters,
                                                                          progress.saw if progress else None)),
                                               listed):
            if info is None:
                if delete and single is None and there is not None:
                    deletions.append(rel)
                continue
            if entry is None and there is not None and adopt != "off":
                from bridge import adopt as adopting
                if adopting.offline(info, there):   # decided here: no request, a small file
                    window.append((rel, info, adoption(rel, info, there)))
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
            settle(4 * settings.transfer.concurrency)
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


def _merged(objects, entries, present, listed: dict[str, int]):
    """(path, source info, record entry, destination info) for every path any of the three
    sorted streams has, in path order; None where one lacks it. Counts into ``listed`` how many
    objects each listing gave."""
    src, ent, dst = next(objects, None), next(entries, None), next(present, None)
    while src is not None or ent is not None or dst is not None:
        path = min(p for p in (src and src[0], ent and ent.path, dst and dst[0]) if p is not None)
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


def sync(source: str, destination: str, settings: Settings, *, delete: bool = False,
         chunk_size: int | None = None, progress: Progress | None = None, state_dir: Path | None = None,
         dry_run: bool = False, max_cost: float | None = None, route: str | None = None,
         adopt: str = "checksum", filters: Filters | None = None) -> dict[str, Any]:
    routes.refuse_forced(source, destination, settings, route)
    with meter.metering(meter.current() or meter.Meter()):   # the listing counts as what ran, too
        plan, counts = plan_sync(source, destination, settings, delete=delete, chunk_size=chunk_size, adopt=adopt,
                                 filters=filters, progress=progress)
        routes.choose(plan, settings, route)
        _within_budget(plan, settings, max_cost, "sync")
        if dry_run:
            return _filtered({"dry_run": True, **plan_summary(plan), "delete": plan.deletions, "reasons": counts},
                             filters)
        dst_root = parse(plan.destination)
        dst_store = get_store(dst_root, settings)
        if not plan.files and not plan.deletions and not plan.adopted and manifests.committed(dst_store, dst_root):
            # Nothing to send or delete under a record that stands: no job, no new commit.
            summary = {"source": plan.source, "destination": plan.destination, "files": 0, "bytes": 0, "ok": True,
                       "errors": [], **(progress or Progress()).snapshot(),
                       "route": routes.report(plan, {}, 0), "manifest": manifests.log_folder(dst_store, dst_root)}
        else:
            summary = execute(plan, settings, progress, state_dir)
    return _filtered({**summary, "reasons": counts, "sent": Names(plan.files.rels, len(plan.files)),
                      "deleted": plan.deletions, "adopted": Adopted(plan.adopted)}, filters)


class Names(collections.abc.Sequence):
    """The paths a sync sent, read from its plan (on disk past a few thousand) each time they are
    iterated: the summary of a sync of millions of files holds none of them (the CLI writes them
    as it reads them: bridge.cli.console). Compares equal to a list of the same paths."""

    def __init__(self, rels: Callable[[], Iterator[str]], count: int):
        self._rels, self._count = rels, count

    def __iter__(self) -> Iterator[str]:
        return self._rels()

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i):
        return list(self)[i]

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, (list, tuple, Names)) else NotImplemented

    def __repr__(self) -> str:
        return repr(list(self))


class Adopted(collections.abc.Mapping):
    """What a sync adopted, path -> the checksum that proved it (``Entries`` read as iterated)."""

    def __init__(self, entries: Entries):
        self._entries = entries

    def __iter__(self) -> Iterator[str]:
        return (e["path"] for e in self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, path: str) -> str:
        for e in self._entries:
            if e["path"] == path:
                return e["adopted"]
        raise KeyError(path)

    def items(self) -> Iterator[tuple[str, str]]:   # type: ignore[override]  (one pass, not a lookup per key)
        return ((e["path"], e["adopted"]) for e in self._entries)

    def values(self) -> Iterator[str]:   # type: ignore[override]
        return (e["adopted"] for e in self._entries)

    def __repr__(self) -> str:
        return repr(dict(self.items()))


def uploads(url: str, settings: Settings, *, abort: bool = False) -> list[dict[str, Any]]:
    """Unfinished multipart uploads under ``url`` (left by copies that were killed and never run
    again); with ``abort``, remove them."""
    root = parse(url).as_prefix()
    store = get_store(root, settings)
    store.check_bucket(root)
    rows = []
    for loc, upload_id in list(store.list_uploads(root)):
        if abort:
            store.abort_upload(loc, upload_id)
        rows.append({"object": str(loc), "upload_id": upload_id, "aborted": abort})
    return rows


def job_usages(kind: str, source: str, destinations: list[str], settings: Settings, *, delete: bool = False,
               pack: dict[str, Any] | None = None, route: str | None = None,
               filters: Filters | None = None) -> list[Any]:
    """What a job of ``kind`` (copy, sync, replicate, pack, unpack) would read, write and request,
    by planning it here with these settings (a service job is priced before it is queued); a copy
    or sync by the route its workers will choose (or ``route``), as they choose it."""
    if kind == "pack":
        from bridge.packing import job as packing
        return [packing.plan_pack(source, destinations[0], settings, filters=filters, **(pack or {})).usage()]
    if kind == "unpack":
        from bridge.packing import unpack
        plan = unpack.plan_unpack(source, destinations[0], settings, (pack or {}).get("prefix"))
        try:
            return [plan.usage(settings)]
        finally:
            plan.close()
    out = []
    for dst in destinations:
        if kind == "copy":
            plan = plan_copy(source, dst, settings, settings.transfer.chunk_size, filters=filters)
        else:
            plan, _ = plan_sync(source, dst, settings, delete=delete, chunk_size=settings.transfer.chunk_size,
                                filters=filters)
        routes.choose(plan, settings, route)
        out.append(estimate.usage(plan, plan.route or "direct"))
    return out
