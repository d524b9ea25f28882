"""What the CLI (and the workers) call: copy, sync, verify, list. Each returns a JSON-able summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bridge.config import Settings
import concurrent.futures as cf
import contextlib
import gc

from bridge import bwlimit
from bridge import manifest as manifests
from bridge import check
from bridge import estimate
from bridge import filters as filtering
from bridge.filters import Filters
from bridge import routes
from bridge.check import mismatch, reported_crc32c
from bridge.hashing import rehash
from bridge import jobs
from bridge.engine import (FilePlan, JobContext, Plan, batching, check_chunk_size, check_route, file_plan,
                           part_size_for, plan_copy, resolve)
from bridge.errors import JobCancelled, ManifestError, ObjectNotFound
from bridge.journal import job_key
from bridge.journal import FileJournal
from bridge.progress import Progress
from bridge.stores import get_store
from bridge.urls import parse


def journal_for(plan: Plan, settings: Settings, state_dir: Path | None = None) -> FileJournal:
    base = state_dir or Path(settings.transfer.state_dir)
    return FileJournal(base / "journal" / f"{plan.key}.jsonl")


def _quiet_gc() -> None:
    """The SDKs leave ~10^6 long-lived objects (service models, clients) that the cyclic GC
    would walk again and again during a transfer: a profile showed it as the largest single CPU
    cost of a cloud-to-cloud copy. Freeze them out of its reach once the stores exist."""
    gc.collect()
    gc.freeze()


def plan_summary(plan: Plan) -> dict[str, Any]:
    return {"source": plan.source, "destination": plan.destination, "files": len(plan.files),
            "bytes": plan.bytes, "units": plan.unit_count(),
            "multipart_files": sum(1 for f in plan.files if f.part_size),
            "deletions": len(plan.deletions), "route": {"name": plan.route, "why": plan.route_why},
            "usage": estimate.of_plan(plan).to_dict(),
            "plan": [{"path": f.rel, "size": f.size, "parts": f.parts if f.part_size else 1,
                      "part_size": f.part_size} for f in plan.files]}


def execute(plan: Plan, settings: Settings, progress: Progress | None = None,
            state_dir: Path | None = None) -> dict[str, Any]:
    progress = progress or Progress()
    if progress.limiter is None and settings.transfer.bwlimit:
        progress.limiter = bwlimit.local(settings.transfer.bwlimit)
    journal = journal_for(plan, settings, state_dir)
    ctx = JobContext(plan, settings, journal, progress)
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
    route = routes.report(plan, ctx.fallbacks, progress.bytes_through)
    if ctx.remote:
        route["remote"] = ctx.remote
    return {"source": plan.source, "destination": plan.destination, "files": len(plan.files),
            "bytes": plan.bytes, "ok": True, "errors": [], **progress.snapshot(),
            "route": route, "manifest": results["manifest"]}


def _within_budget(plan: Plan, settings: Settings, max_cost: float | None, what: str) -> None:
    """Refuse a plan estimated above ``max_cost`` dollars, before any data request."""
    if max_cost is not None:
        from bridge import costing, estimate
        costing.check_budget(estimate.of_plan(plan), settings, max_cost, what)


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
         max_cost: float | None = None, route: str | None = None, filters: Filters | None = None) -> dict:
    plan = routes.choose(plan_copy(source, destination, settings, chunk_size, filters, listing_to(progress)),
                         settings, route)
    _within_budget(plan, settings, max_cost, "copy")
    if dry_run:
        return _filtered({"dry_run": True, **plan_summary(plan)}, filters)
    return _filtered(execute(plan, settings, progress, state_dir), filters)


def ls(url: str, settings: Settings, *, recursive: bool = True, filters: Filters | None = None,
       progress: Progress | None = None) -> list[dict[str, Any]]:
    """The objects under ``url`` (or the one object it names), sorted by path: with
    ``recursive``, every one; else those directly under it and its folders (rows with
    ``dir: True``, their size the total under them). Each row: path, size, modified (epoch
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
    rows: list[dict[str, Any]] = []
    folders: dict[str, dict[str, Any]] = {}
    seen = False
    for rel, info in filtering.walk(store, loc, filters, listing_to(progress)):
        seen = True
        head, sep, _ = rel.partition("/")
        if recursive or not sep:
            rows.append(_row(rel, info))
            continue
        folder = folders.setdefault(head, {"path": head + "/", "dir": True, "size": 0, "files": 0,
                                           "modified": None, "storage_class": None, "identity": {}})
        folder["size"] += info.size
        folder["files"] += 1
        if info.modified is not None and (folder["modified"] is None or info.modified > folder["modified"]):
            folder["modified"] = info.modified
    if not seen and not (loc.is_local and Path(loc.local_path).is_dir()):
        if not (filters is not None and filters.active and next(iter(store.walk(loc)), None) is not None):
            raise ObjectNotFound(f"{loc}: nothing there")
    return sorted(rows + list(folders.values()), key=lambda r: r["path"])


def _row(rel: str, info) -> dict[str, Any]:
    return {"path": rel, "size": info.size, "modified": info.modified, "storage_class": info.storage_class,
            "identity": dict(info.identity)}


def verify(url: str, settings: Settings, *, deep: bool = False, filters: Filters | None = None,
           progress: Progress | None = None) -> dict[str, Any]:
    """Check every object under ``url`` against its manifest: sizes and store-reported checksums,
    or with ``deep`` a full re-read. Lists missing, extra and mismatched files. ``filters``:
    only the files they select (a manifest entry by its recorded size)."""
    root = parse(url).as_prefix()
    store = get_store(root, settings)
    store.check_bucket(root)
    manifest = manifests.read(store, root)
    if manifest is None:
        raise ManifestError(f"no manifest at {root.join(manifests.MANIFEST)}: the copy there is "
                            f"incomplete, or was not made by mcbridge")
    present = dict(filtering.walk(store, root, filters, listing_to(progress)))
    entries = manifest.files
    if filters is not None and filters.active:
        entries = {p: e for p, e in entries.items() if p in present or filters.selects(p, _Recorded(e.size))}
    missing = sorted(p for p in entries if p not in present)
    extra = sorted(p for p in present if p not in manifest.files)
    mismatched, rehashed = [], []
    if progress is not None:
        progress.begin("verifying")
        progress.plan_checks(sum(1 for p in entries if p in present),
                             sum(present[p].size for p in entries if p in present))
    with cf.ThreadPoolExecutor(settings.transfer.concurrency) as pool:
        checks = {path: pool.submit(check.judge, store, present[path], entry, deep)
                  for path, entry in sorted(entries.items()) if path in present}
        if progress is not None:
            for path, fut in checks.items():
                fut.add_done_callback(lambda _f, n=present[path].size: progress.checked(n))
        for path, fut in checks.items():
            verdict = fut.result()
            if verdict.problem:
                mismatched.append({"path": path, "reason": verdict.problem})
            elif verdict.rehashed:
                rehashed.append({"path": path, "reason": verdict.rehashed})
    shard_sets = []
    for prefix, entry in sorted(manifest.extra.get("shard_sets", {}).items()):
        from bridge.packing import index  # only manifests of packed corpora name shard sets
        problems = list(index.check(store, root, entry, deep=deep))
        shard_sets.append({"prefix": prefix, "index": entry.get("index"), "ok": not problems,
                           "problems": problems})
    ok = not (missing or extra or mismatched) and all(s["ok"] for s in shard_sets)
    return _filtered({"url": str(root), "ok": ok, "deep": deep, "checked": len(entries),
                      "bytes": sum(e.size for e in entries.values()), "missing": missing, "extra": extra,
                      "mismatched": mismatched, "rehashed": rehashed, "shard_sets": shard_sets}, filters)


class _Recorded:
    """A manifest entry as the filters see an object: its recorded size, no time."""

    def __init__(self, size: int):
        self.size, self.modified = size, None


def _source_crc32c(store, info) -> str:
    crc = reported_crc32c(store, info) if store.features.checksums or info.metadata else None
    if crc is None:
        crc, _ = rehash(store, info.location, info.size, sha=False)
    return crc


def plan_sync(source: str, destination: str, settings: Settings, *, delete: bool = False,
              chunk_size: int | None = None, filters: Filters | None = None,
              progress: Progress | None = None) -> tuple[Plan, dict[str, list[str]]]:
    """Only what is new, changed (by size and CRC32C, never by time) or no longer matches the
    destination's manifest; with ``delete``, what the source no longer has. ``filters`` apply
    to both sides, as in rclone: a file they leave out is neither sent nor deleted."""
    src_root, dst_root, objects, single = resolve(source, destination, settings, filters, listing_to(progress))
    check_route(src_root, dst_root, objects, single)
    src_store, dst_store = get_store(src_root, settings), get_store(dst_root, settings)
    check_chunk_size(chunk_size, dst_store)
    manifest = manifests.read(dst_store, dst_root) or manifests.read(dst_store, dst_root, manifests.PREVIOUS)
    entries = manifest.files if manifest else {}
    present = dict(filtering.walk(dst_store, dst_root, filters, progress.saw if progress else None))
    if progress is not None:
        progress.begin("planning")
        progress.plan_checks(len(objects), 0)
    reasons: dict[str, list[str]] = {"new": [], "changed": [], "repaired": [], "unchanged": []}

    def judge(rel: str, info) -> str:
        entry, there = entries.get(rel), present.get(rel)
        if there is None or entry is None:
            return "new"
        if entry.size != info.size or _source_crc32c(src_store, info) != entry.crc32c:
            return "changed"
        if mismatch(dst_store, there, entry) is not None:
            return "repaired"
        return "unchanged"

    def judged(item) -> str:
        verdict = judge(*item)
        if progress is not None:
            progress.checked()
        return verdict

    with cf.ThreadPoolExecutor(settings.transfer.concurrency) as pool:
        verdicts = list(pool.map(judged, objects))
    files = []
    for (rel, info), verdict in zip(objects, verdicts):
        reasons[verdict].append(rel)
        if verdict != "unchanged":
            files.append(file_plan(rel, info, dst_store, chunk_size))
    deletions = []
    if delete and single is None:
        wanted = {rel for rel, _ in objects}
        deletions = sorted(p for p in set(present) | set(entries) if p not in wanted and p in present)
        reasons["deleted"] = deletions
    plan = Plan(str(src_root) if single is None else single, str(dst_root), single, files, deletions)
    # As for copy, not the file list: what a killed sync finished is found again by path.
    plan.key = job_key("sync", plan.source, plan.destination, chunk_size, delete,
                       *((filters.key(),) if filters is not None and filters.active else ()))
    batching(plan, src_root, dst_root, settings)
    return plan, reasons


def sync(source: str, destination: str, settings: Settings, *, delete: bool = False,
         chunk_size: int | None = None, progress: Progress | None = None, state_dir: Path | None = None,
         dry_run: bool = False, max_cost: float | None = None, route: str | None = None,
         filters: Filters | None = None) -> dict[str, Any]:
    plan, reasons = plan_sync(source, destination, settings, delete=delete, chunk_size=chunk_size,
                              filters=filters, progress=progress)
    routes.choose(plan, settings, route)
    _within_budget(plan, settings, max_cost, "sync")
    counts = {k: len(v) for k, v in reasons.items()}
    if dry_run:
        return _filtered({"dry_run": True, **plan_summary(plan), "delete": plan.deletions, "reasons": counts},
                         filters)
    summary = execute(plan, settings, progress, state_dir)
    return _filtered({**summary, "reasons": counts, "sent": [f.rel for f in plan.files],
                      "deleted": plan.deletions}, filters)


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
        return [unpack.plan_unpack(source, destinations[0], settings, (pack or {}).get("prefix")).usage(settings)]
    out = []
    for dst in destinations:
        if kind == "copy":
            plan = plan_copy(source, dst, settings, settings.transfer.chunk_size, filters)
        else:
            plan, _ = plan_sync(source, dst, settings, delete=delete, chunk_size=settings.transfer.chunk_size,
                                filters=filters)
        routes.choose(plan, settings, route)
        out.append(estimate.usage(plan, plan.route or "direct"))
    return out
