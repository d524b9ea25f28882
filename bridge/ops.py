"""What the CLI (and the workers) call to copy, sync and list: each plans, decides the route,
prices and runs the job through the pipeline's stages (bridge.pipeline) and returns a JSON-able
summary."""

from __future__ import annotations

import collections
import collections.abc
import concurrent.futures as cf
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bridge import filters as filtering
from bridge import manifest as manifests
from bridge import meter
from bridge import guards, routes
from bridge.config import Settings
from bridge.contracts import FilePlan
from bridge.errors import ObjectNotFound
from bridge.filters import Filters
from bridge.listing import listing_to, wildcard_source, with_filters
from bridge.meter import Pool
from bridge.progress import Progress
from bridge.stores import get_store
from bridge.stores.base import ObjectInfo, is_reserved
from bridge.urls import parse
from bridge.pipeline.execute import execute
from bridge.pipeline.plan import Entries, FileList, Plan, plan_copy
from bridge.pipeline.syncplan import plan_sync



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
            "usage": plan.usage().to_dict(),
            "plan": PlanRows(plan.files)}


def _within_budget(plan: Plan, settings: Settings, max_cost: float | None, what: str) -> None:
    """Refuse a plan estimated above ``max_cost`` dollars, before any data request."""
    if max_cost is not None:
        from bridge import pricing
        pricing.check_budget(plan.usage(), settings, max_cost, what)


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
                adopted.append(found.entry)
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


def copy(source: str, destination: str, settings: Settings, *, chunk_size: int | None = None,
         progress: Progress | None = None, state_dir: Path | None = None, dry_run: bool = False,
         max_cost: float | None = None, route: str | None = None, adopt: str = "off",
         filters: Filters | None = None, verb: str = "copy") -> dict:
    """Copy SOURCE to DESTINATION (``verb`` names the command in a refusal: copy, migrate)."""
    source, filters = wildcard_source(source, filters, settings)   # s3://b/p/*.tar
    decided = routes.decide(parse(source), parse(destination), settings, route)   # before any request
    with meter.metering(meter.current() or meter.Meter()):   # the listing counts as what ran, too
        plan = plan_copy(source, destination, settings, chunk_size, filters=filters, listed=listing_to(progress))
        adopt_existing(plan, settings, adopt)
        plan.route, plan.route_why = decided
        _within_budget(plan, settings, max_cost, verb)
        if dry_run:
            return with_filters({"dry_run": True, **plan_summary(plan)}, filters)
        skipped = len(plan.adopted)
        dst_root = parse(plan.destination)
        dst_store = get_store(dst_root, settings)
        if not plan.files and skipped and _recorded(plan.adopted, dst_store, dst_root):
            summary = _nothing_to_do(plan, dst_store, dst_root, progress)   # every file there, and recorded
        else:
            summary = execute(plan, settings, progress, state_dir)
        return with_filters({**summary, "skipped": skipped}, filters)


def _recorded(adopted: Entries, store, root) -> bool:
    """Whether the destination's record already holds every adopted file as it was found (path,
    size, CRC32C): committing them again would add a commit that changes nothing. Both in path
    order, merged."""
    record = manifests.open_record(store, root)
    if record is None:
        return False
    entries = record.entries()
    current = next(entries, None)
    for found in adopted:
        while current is not None and current.path < found["path"]:
            current = next(entries, None)
        if current is None or (current.path, current.size, current.crc32c) != (found["path"], found["size"],
                                                                                found["crc32c"]):
            return False
    return True


def _nothing_to_do(plan: Plan, store, root, progress: Progress | None) -> dict[str, Any]:
    """The summary of a job with nothing to send under a record that stands: no job, no commit."""
    return {"source": plan.source, "destination": plan.destination, "files": 0, "bytes": 0, "ok": True,
            "errors": [], **(progress or Progress()).snapshot(), "route": routes.report(plan, {}, 0),
            "manifest": manifests.log_folder(store, root)}


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


def _row(rel: str, info) -> dict[str, Any]:
    return {"path": rel, "size": info.size, "modified": info.modified, "storage_class": info.storage_class,
            "identity": dict(info.identity)}


def sync(source: str, destination: str, settings: Settings, *, delete: bool = False,
         chunk_size: int | None = None, progress: Progress | None = None, state_dir: Path | None = None,
         dry_run: bool = False, max_cost: float | None = None, route: str | None = None,
         adopt: str = "checksum", filters: Filters | None = None, max_delete: int | None = None,
         force: bool = False) -> dict[str, Any]:
    """``delete``: remove at the destination what the source no longer has, within the guards of
    bridge.guards (``max_delete`` objects at most; else at most half of what is there, unless
    ``force``), checked before anything is copied or deleted. A dry run says whether a run
    would be refused (``refused``) and is not refused itself."""
    source, filters = wildcard_source(source, filters, settings)   # s3://b/p/*.tar
    decided = routes.decide(parse(source), parse(destination), settings, route)   # before any request
    with meter.metering(meter.current() or meter.Meter()):   # the listing counts as what ran, too
        plan, counts = plan_sync(source, destination, settings, delete=delete, chunk_size=chunk_size, adopt=adopt,
                                 filters=filters, progress=progress)
        plan.route, plan.route_why = decided
        refused = guards.sync_deletions(len(plan.deletions), plan.listed["destination"], plan.destination,
                                        max_delete=max_delete, force=force)
        _within_budget(plan, settings, max_cost, "sync")
        if dry_run:
            return with_filters({"dry_run": True, **plan_summary(plan), "delete": plan.deletions, "reasons": counts,
                                 "present": plan.listed["destination"], "refused": refused}, filters)
        if refused is not None:
            raise guards.DeletionRefused(refused)
        dst_root = parse(plan.destination)
        dst_store = get_store(dst_root, settings)
        if not plan.files and not plan.deletions and not plan.adopted and manifests.committed(dst_store, dst_root):
            summary = _nothing_to_do(plan, dst_store, dst_root, progress)
        else:
            summary = execute(plan, settings, progress, state_dir)
    return with_filters({**summary, "reasons": counts, "sent": Names(plan.files.rels, len(plan.files)),
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
            return [plan.usage()]
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
        out.append(plan.usage())
    return out
