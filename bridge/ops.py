"""What the CLI (and the workers) call: copy, sync, verify, list. Each returns a JSON-able summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bridge.config import Settings
from bridge.engine import JobContext, Plan, ThreadExecutor, plan_copy, prepare
from bridge.errors import TransferFailed
from bridge.journal import FileJournal, default_state_dir
from bridge.progress import Progress
from bridge.stores import get_store
from bridge.urls import parse


def journal_for(plan: Plan, state_dir: Path | None) -> FileJournal:
    return FileJournal((state_dir or default_state_dir()) / "journal" / f"{plan.key}.jsonl")


def plan_summary(plan: Plan) -> dict[str, Any]:
    return {"source": plan.source, "destination": plan.destination, "files": len(plan.files),
            "bytes": plan.bytes, "units": plan.unit_count(),
            "multipart_files": sum(1 for f in plan.files if f.part_size),
            "deletions": len(plan.deletions),
            "plan": [{"path": f.rel, "size": f.size, "parts": f.parts if f.part_size else 1,
                      "part_size": f.part_size} for f in plan.files]}


def execute(plan: Plan, settings: Settings, progress: Progress | None = None,
            state_dir: Path | None = None, final_extra: dict | None = None) -> dict[str, Any]:
    progress = progress or Progress()
    journal = journal_for(plan, state_dir)
    ctx = JobContext(plan, settings, journal, progress)
    progress.plan(plan.bytes, plan.unit_count())
    prepare(ctx)
    outcome = ThreadExecutor(settings.transfer.concurrency).run(
        ctx, plan.units(), {"op": "finalize", **(final_extra or {})})
    summary = {"source": plan.source, "destination": plan.destination, "files": len(plan.files),
               "bytes": plan.bytes, "ok": outcome.ok, "errors": outcome.errors, **progress.snapshot()}
    if not outcome.ok:
        journal.close()
        first = outcome.errors[0] if outcome.errors else "stopped"
        more = f" (and {len(outcome.errors) - 1} more)" if len(outcome.errors) > 1 else ""
        raise TransferFailed(f"copy did not complete: {first}{more}; run it again to resume")
    summary["manifest"] = outcome.results.get("manifest")
    journal.clear()
    journal.close()
    journal.path.unlink(missing_ok=True)
    return summary


def copy(source: str, destination: str, settings: Settings, *, chunk_size: int | None = None,
         progress: Progress | None = None, state_dir: Path | None = None, dry_run: bool = False) -> dict:
    plan = plan_copy(source, destination, settings, chunk_size)
    if dry_run:
        return {"dry_run": True, **plan_summary(plan)}
    return execute(plan, settings, progress, state_dir)


def ls(url: str, settings: Settings) -> list[dict[str, Any]]:
    loc = parse(url)
    store = get_store(loc, settings)
    store.check_bucket(loc)
    if not loc.is_prefix:
        from bridge.errors import ObjectNotFound
        try:
            info = store.info(loc)
            return [{"path": info.location.name, "size": info.size}]
        except ObjectNotFound:
            loc = loc.as_prefix()
    rows = [{"path": rel, "size": info.size} for rel, info in store.walk(loc)]
    if not rows and not (loc.is_local and Path(loc.local_path).is_dir()):
        from bridge.errors import ObjectNotFound
        raise ObjectNotFound(f"{loc}: nothing there")
    return sorted(rows, key=lambda r: r["path"])
