"""What the CLI (and the workers) call: copy, sync, verify, list. Each returns a JSON-able summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bridge import meter
from bridge.meter import Pool
from bridge.config import Settings
import contextlib
import gc

from bridge import bwlimit
from bridge import manifest as manifests
from bridge import check
from bridge import estimate
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
    ctx.meter = meter.current() or ctx.meter
    _quiet_gc()
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
            "route": route, "manifest": results["manifest"], "metered": ctx.meter.to_dict()}


def _within_budget(plan: Plan, settings: Settings, max_cost: float | None, what: str) -> None:
    """Refuse a plan estimated above ``max_cost`` dollars, before any data request."""
    if max_cost is not None:
        from bridge import costing, estimate
        costing.check_budget(estimate.of_plan(plan), settings, max_cost, what)


def copy(source: str, destination: str, settings: Settings, *, chunk_size: int | None = None,
         progress: Progress | None = None, state_dir: Path | None = None, dry_run: bool = False,
         max_cost: float | None = None, route: str | None = None) -> dict:
    with meter.metering(meter.current() or meter.Meter()):   # the listing counts as what ran, too
        plan = routes.choose(plan_copy(source, destination, settings, chunk_size), settings, route)
        _within_budget(plan, settings, max_cost, "copy")
        if dry_run:
            return {"dry_run": True, **plan_summary(plan)}
        return execute(plan, settings, progress, state_dir)


def ls(url: str, settings: Settings) -> list[dict[str, Any]]:
    loc = parse(url)
    store = get_store(loc, settings)
    store.check_bucket(loc)
    if not loc.is_prefix:
        try:
            info = store.info(loc)
            return [{"path": info.location.name, "size": info.size}]
        except ObjectNotFound:
            loc = loc.as_prefix()
    rows = [{"path": rel, "size": info.size} for rel, info in store.walk(loc)]
    if not rows and not (loc.is_local and Path(loc.local_path).is_dir()):
        raise ObjectNotFound(f"{loc}: nothing there")
    return sorted(rows, key=lambda r: r["path"])


def verify(url: str, settings: Settings, *, deep: bool = False) -> dict[str, Any]:
    """Check every object under ``url`` against its manifest: sizes and store-reported checksums,
    or with ``deep`` a full re-read. Lists missing, extra and mismatched files."""
    root = parse(url).as_prefix()
    store = get_store(root, settings)
    store.check_bucket(root)
    manifest = manifests.read(store, root)
    if manifest is None:
        raise ManifestError(f"no manifest at {root.join(manifests.MANIFEST)}: the copy there is "
                            f"incomplete, or was not made by mcbridge")
    present = dict(store.walk(root))
    missing = sorted(p for p in manifest.files if p not in present)
    extra = sorted(p for p in present if p not in manifest.files)
    mismatched, rehashed = [], []
    with Pool(settings.transfer.concurrency) as pool:
        checks = {path: pool.submit(check.judge, store, present[path], entry, deep)
                  for path, entry in sorted(manifest.files.items()) if path in present}
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
    return {"url": str(root), "ok": ok, "deep": deep, "checked": len(manifest.files),
            "bytes": manifest.totals()["bytes"], "missing": missing, "extra": extra,
            "mismatched": mismatched, "rehashed": rehashed, "shard_sets": shard_sets}


def _source_crc32c(store, info) -> str:
    crc = reported_crc32c(store, info) if store.features.checksums or info.metadata else None
    if crc is None:
        crc, _ = rehash(store, info.location, info.size, sha=False)
    return crc


def plan_sync(source: str, destination: str, settings: Settings, *, delete: bool = False,
              chunk_size: int | None = None) -> tuple[Plan, dict[str, list[str]]]:
    """Only what is new, changed (by size and CRC32C, never by time) or no longer matches the
    destination's manifest; with ``delete``, what the source no longer has."""
    src_root, dst_root, objects, single = resolve(source, destination, settings)
    check_route(src_root, dst_root, objects, single)
    src_store, dst_store = get_store(src_root, settings), get_store(dst_root, settings)
    check_chunk_size(chunk_size, dst_store)
    manifest = manifests.read(dst_store, dst_root) or manifests.read(dst_store, dst_root, manifests.PREVIOUS)
    entries = manifest.files if manifest else {}
    present = dict(dst_store.walk(dst_root))
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

    with Pool(settings.transfer.concurrency) as pool:
        verdicts = list(pool.map(lambda item: judge(*item), objects))
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
    plan.key = job_key("sync", plan.source, plan.destination, chunk_size, delete)
    batching(plan, src_root, dst_root, settings)
    return plan, reasons


def sync(source: str, destination: str, settings: Settings, *, delete: bool = False,
         chunk_size: int | None = None, progress: Progress | None = None, state_dir: Path | None = None,
         dry_run: bool = False, max_cost: float | None = None, route: str | None = None) -> dict[str, Any]:
    with meter.metering(meter.current() or meter.Meter()):   # the listing counts as what ran, too
        plan, reasons = plan_sync(source, destination, settings, delete=delete, chunk_size=chunk_size)
        routes.choose(plan, settings, route)
        _within_budget(plan, settings, max_cost, "sync")
        counts = {k: len(v) for k, v in reasons.items()}
        if dry_run:
            return {"dry_run": True, **plan_summary(plan), "delete": plan.deletions, "reasons": counts}
        summary = execute(plan, settings, progress, state_dir)
    return {**summary, "reasons": counts, "sent": [f.rel for f in plan.files], "deleted": plan.deletions}


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
               pack: dict[str, Any] | None = None, route: str | None = None) -> list[Any]:
    """What a job of ``kind`` (copy, sync, replicate, pack, unpack) would read, write and request,
    by planning it here with these settings (a service job is priced before it is queued); a copy
    or sync by the route its workers will choose (or ``route``), as they choose it."""
    if kind == "pack":
        from bridge.packing import job as packing
        return [packing.plan_pack(source, destinations[0], settings, **(pack or {})).usage()]
    if kind == "unpack":
        from bridge.packing import unpack
        return [unpack.plan_unpack(source, destinations[0], settings, (pack or {}).get("prefix")).usage(settings)]
    out = []
    for dst in destinations:
        if kind == "copy":
            plan = plan_copy(source, dst, settings, settings.transfer.chunk_size)
        else:
            plan, _ = plan_sync(source, dst, settings, delete=delete, chunk_size=settings.transfer.chunk_size)
        routes.choose(plan, settings, route)
        out.append(estimate.usage(plan, plan.route or "direct"))
    return out
