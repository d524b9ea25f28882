"""Running a replication policy once, in this process: the I/O half of policies/replication.py.

For each checkpoint in the policy's window and each destination: a sync (only what is new or
changed; in mirror mode files the source no longer has are removed), then a verify. The runs
are planned and priced first, all of them, so that ``max_cost_usd`` refuses before any data
request. Then retention asks the policy what may be removed: nothing unless the newest
checkpoint was verified at every destination, and an older one only once ``keep_last`` newer
ones are verified at its destination and committed by evidence; a removed checkpoint loses its
manifest first, so a removal cut short never leaves a prefix that looks complete.

Only committed checkpoints are in the window (``survey``: the source listed once, what each
checkpoint's files say of it read by bridge/evidence.py, each folder's readiness decided by
policies/replication.py). A checkpoint's copy commits only what was listed (``copy_checkpoint``):
right before its manifest the source is listed again, and a file sent that was rewritten, or any
file of the checkpoint added, removed, resized or rewritten since readiness was decided on it
(a writer that put its marker first), fails that checkpoint for this run, with no manifest
written; the next run sends it again. ``watch`` lists the source every ``watch.interval`` and
runs the policy when a checkpoint commits, or when the source of one it verified changed since
(said as ``event: changed``; a run's ``revisited`` says the same from this machine's record).
A commit announced on this machine (``announce``: a DCP save through bridge.torch, a publish) runs
the policy whose source covers it at once, without waiting for the next listing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from bridge import manifest as manifests
from bridge import bwlimit, evidence, guards, jobs, meter, routes
from bridge.config import Settings
from bridge.pipeline import syncplan
from bridge.pipeline.execute import JobContext, journal_for
from bridge.pipeline.plan import FileList, Plan
from bridge.errors import BridgeError, ObjectNotFound, TransferFailed
from bridge.filters import Filters
from bridge.journal import job_key
from bridge.progress import Progress
from bridge.stores import get_store
from bridge.stores.base import ObjectInfo, identity_changed, is_reserved, merged
from bridge.urls import parse
from bridge.policies import replication as rules
from bridge.policies.replication import NamedPolicy
from bridge.pipeline import verify as verifying


def folders(url: str, settings: Settings) -> set[str]:
    root = parse(url).as_prefix()
    store = get_store(root, settings)
    store.check_bucket(root)
    return {rel.split("/", 1)[0] for rel, _info in store.walk(root) if "/" in rel}


def listing(url: str, settings: Settings) -> dict[str, dict[str, ObjectInfo]]:
    """The folders directly under ``url``, each with its files (paths inside it, ``_bridge/``
    included: a bridge copy's manifest says it is complete). One listing of the source."""
    root = parse(url).as_prefix()
    store = get_store(root, settings)
    store.check_bucket(root)
    out: dict[str, dict[str, ObjectInfo]] = {}
    for info in store.list(root):
        folder, _, inner = info.location.relative_to(root).partition("/")
        if inner and folder != "_bridge":
            out.setdefault(folder, {})[inner] = info
    home = manifests.record_home(store, root)
    if home != root:   # local checkpoints whose records are kept in the manifest folder (--manifest-dir)
        for info in store.list(home):
            folder, _, inner = info.location.relative_to(home).partition("/")
            if folder in out and inner.startswith("_bridge/"):
                out[folder][inner] = info
    return out


POSIX_QUIET_S = 2.0   # a local file that moved within this is still being written


def survey(policy: rules.Policy, settings: Settings, now: float | None = None,
           found: dict[str, dict[str, ObjectInfo]] | None = None) -> dict[str, rules.Readiness]:
    """Each checkpoint at the source, committed or waiting and why (policies/replication.py
    ``assess``), from the source listed once (or ``found``, that listing) and what its files say
    of themselves (bridge/evidence.py: DCP ``.metadata``, safetensors headers, Orbax metadata,
    bridge records at the folder or above, each read once per version). On a local source, files
    written within the quiet period are looked at again once it has passed."""
    root = parse(policy.source).as_prefix()
    if found is None:
        found = listing(policy.source, settings)
    store = get_store(root, settings)
    names = rules.checkpoints(policy, found)
    above = evidence.records_above(store, root)
    facts = {name: evidence.gather(store, root, name, found[name], above) for name in names}
    if root.is_local:
        moved = evidence.unsettled(store, root, {n: found[n] for n in names}, POSIX_QUIET_S)
        facts = {n: replace(ev, unsettled=moved.get(n, {})) for n, ev in facts.items()}
    files = {name: {rel: rules.SourceFile(i.size, rules.modified_at(i.identity)) for rel, i in found[name].items()}
             for name in names}
    return rules.assess(policy, files, time.time() if now is None else now, atomic_rename=root.is_local,
                        evidence=facts)


class SourceChanged(TransferFailed):
    """A source file was rewritten (another identity or size) while its checkpoint was copied."""


class ConsistentCopy(JobContext):
    """A checkpoint's copy that commits only what was listed: right before the manifest, the
    source is listed again and compared with the plan's files and, given ``listed`` (the listing
    its readiness was decided on), with the whole checkpoint: a file sent that is gone or another
    version, or any file of the checkpoint added, removed, resized or rewritten since, fails the
    copy, nothing committed (the destination's old manifest stays set aside). ``selects``: the
    files of the checkpoint the policy replicates (others may come and go)."""

    def __init__(self, *args, listed: Mapping[str, ObjectInfo] | None = None,
                 selects: Callable[[str], bool] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.listed, self.selects = listed, selects or (lambda _rel: True)

    def run_unit(self, unit: dict) -> dict:
        if unit["op"] == "finalize":
            changed = self.changed_sources()
            if changed:
                raise SourceChanged(f"source changed while it was copied: {', '.join(changed[:3])}"
                                    f"{f' and {len(changed) - 3} more' if len(changed) > 3 else ''}; "
                                    f"nothing committed, the next run copies it again")
        return super().run_unit(unit)

    def changed_sources(self) -> list[str]:
        """The files sent that are gone or another version now, then the checkpoint's other
        changes since it was listed (``changed_around``): one listing of the source, no request
        per file (one HEAD for a plan of a single object)."""
        if self.plan.single:
            try:
                seen = [(f.rel, self.src.info(self.src_loc(f.rel))) for f in self.plan.files]
            except ObjectNotFound:
                seen = []
        else:
            seen = list(self.src.walk(self.src_root))
        sent = ((f.rel, f) for f in self.plan.files)
        changed = []
        for rel, now, f in merged(seen, sent):
            if f is not None:
                changed += _change(rel, f.size, f.source_id, now)
        if self.listed is not None and not self.plan.single:
            named = {c.split(" ", 1)[0] for c in changed}
            changed += [c for c in self.changed_around(dict(seen)) if c.split(" ", 1)[0] not in named]
        return changed

    def changed_around(self, now: Mapping[str, ObjectInfo]) -> list[str]:
        """The checkpoint's files (those the policy replicates) added, removed, resized or
        rewritten between the listing readiness was decided on and now: a writer that put its
        marker first and its shards after, or one still at work on a file already sent."""
        was = {rel: info for rel, info in (self.listed or {}).items() if not is_reserved(rel) and self.selects(rel)}
        now = {rel: info for rel, info in now.items() if self.selects(rel)}
        out = []
        for rel in sorted(was.keys() | now.keys()):
            before = was.get(rel)
            out += [f"{rel} (added)"] if before is None else _change(rel, before.size, before.identity, now.get(rel))
        return out


def _change(rel: str, size: int, identity: Mapping[str, str], now: ObjectInfo | None) -> list[str]:
    """How the file ``rel``, once of ``size`` and ``identity``, changed by ``now`` ([] : not)."""
    if now is None:
        return [f"{rel} (gone)"]
    if now.size != size:
        return [f"{rel} (size {size} -> {now.size})"]
    return [f"{rel} (rewritten)"] if identity_changed(identity, now.identity) else []


def copy_checkpoint(plan: Plan, settings: Settings, progress: Progress | None = None, *,
                    listed: Mapping[str, ObjectInfo] | None = None,
                    selects: Callable[[str], bool] | None = None) -> dict:
    """``bridge.pipeline.execute.execute`` for one checkpoint, with ``ConsistentCopy``'s check before the commit
    (``listed``, ``selects``: see there). ``progress``: the run's, whose total already counts
    this plan's bytes."""
    if progress is None:
        progress = Progress()
        progress.plan(plan.bytes, 0)
    if progress.limiter is None and settings.transfer.bwlimit:
        progress.limiter = bwlimit.local(settings.transfer.bwlimit)
    journal = journal_for(plan, settings)
    ctx = ConsistentCopy(plan, settings, journal, progress, listed=listed, selects=selects)
    progress.plan(0, plan.unit_count())
    return jobs.run(ctx, plan.units(), journal, settings.transfer.concurrency, "copy")


def filtered(plan: Plan, include: list[str], exclude: list[str]) -> Plan:
    """``plan`` without the files the patterns leave out: they are neither sent nor removed at
    the destination. A plan of its own, with a key of its own."""
    if not (include or exclude):
        return plan
    files = FileList((f for f in plan.files if rules.selected(include, exclude, f.rel)), where=plan.files.where)
    deletions = [rel for rel in plan.deletions if rules.selected(include, exclude, rel)]
    out = replace(plan, files=files, deletions=deletions)
    out.key = job_key("replicate", plan.source, plan.destination, *(f"{f.rel}:{f.size}" for f in files),
                      *deletions)
    return out


def placed(policy: rules.Policy, dst: str, settings: Settings) -> Settings:
    """The settings a destination's copies run with: its placement (class, encryption) and the
    policy's digest (``sha256``) applied."""
    from bridge.attributes import with_objects
    if policy.sha256 and not settings.transfer.sha256:
        settings = settings.model_copy(update={"transfer": settings.transfer.model_copy(update={"sha256": True})})
    return with_objects(settings, dst, **policy.placement_of(dst))


def plan_checkpoint(policy: rules.Policy, src: str, dst: str, settings: Settings,
                    filters: Filters | None = None) -> Plan:
    settings = placed(policy, dst, settings)
    plan, _reasons = syncplan.plan_sync(src, dst, settings, delete=policy.mode == "mirror",
                                   chunk_size=settings.transfer.chunk_size, filters=filters)
    present = plan.listed["destination"]
    plan = filtered(plan, policy.include, policy.exclude)
    # a mirror's deletions within the guard sync --delete has (max_delete, else half of what is there)
    guards.refuse_sync_deletions(len(plan.deletions), present, plan.destination, max_delete=policy.max_delete)
    # The route the service's workers would take for the same sync: one decision for both.
    return routes.choose(plan, settings)


def remove_checkpoint(url: str, settings: Settings) -> int:
    """Remove everything under ``url``, its record's commit markers first."""
    root = parse(url).as_prefix()
    store = get_store(root, settings)
    manifests.remove(store, root)
    removed = 0
    for info in list(store.list(root)):
        try:
            store.delete(info.location)
            removed += 1
        except ObjectNotFound:
            pass
    return removed


def prepare(policy: rules.Policy, settings: Settings, readiness: dict[str, rules.Readiness] | None = None,
            filters: Filters | None = None, progress: Progress | None = None,
            ) -> tuple[list[str], dict[tuple[str, str], Plan], dict[str, str]]:
    """The committed checkpoints the policy keeps now, the sync plan of each (destination,
    checkpoint), and the destinations that cannot be reached (with why). Lists; moves nothing."""
    if readiness is None:
        readiness = survey(policy, settings)
    kept = rules.window(policy, rules.committed(readiness))
    plans: dict[tuple[str, str], Plan] = {}
    unreachable: dict[str, str] = {}
    for dst in policy.destinations:
        try:
            get_store(parse(dst), settings).check_bucket(parse(dst))
            for ckpt in kept:
                if progress is not None:
                    progress.begin(f"planning {ckpt}")
                plans[(dst, ckpt)] = plan_checkpoint(policy, f"{policy.source}{ckpt}/", f"{dst}{ckpt}/", settings,
                                                     filters)
        except BridgeError as exc:
            unreachable[dst] = str(exc)
    return kept, plans, unreachable


def retain(policy: rules.Policy, kept: list[str], verified: dict[str, dict[str, bool]],
           settings: Settings, readiness: dict[str, rules.Readiness] | None = None,
           ) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Apply retention (policies/replication.py decides what goes: only checkpoints committed
    by evidence at the source count as good copies, by ``readiness`` or, without it, by the
    source surveyed now); (removed per destination, destinations that could not be listed)."""
    if readiness is None and policy.mode == "mirror":
        readiness = survey(policy, settings)
    present, errors = {}, {}
    for dst in policy.destinations:
        try:
            present[dst] = folders(dst, settings)
        except BridgeError as exc:
            errors[dst] = str(exc)
    removed = rules.removals(policy, kept, present, verified, readiness) if not errors else {}
    for dst, old in removed.items():
        for ckpt in old:
            remove_checkpoint(f"{dst}{ckpt}/", settings)
    return removed, errors


def iso(when: float | None) -> str | None:
    return None if when is None else datetime.fromtimestamp(when, timezone.utc).isoformat(timespec="seconds")


def fingerprint(files: Mapping[str, ObjectInfo]) -> str:
    """One checkpoint's source as listed (each file's path, size and version): another value
    means the source changed."""
    import hashlib
    text = "\n".join(f"{rel}\t{info.size}\t{sorted(info.identity.items())}"
                     for rel, info in sorted(files.items()) if not is_reserved(rel))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def run_once(named: NamedPolicy, settings: Settings, *, max_cost: float | None = None,
             readiness: dict[str, rules.Readiness] | None = None, filters: Filters | None = None,
             progress: Progress | None = None, found: dict[str, dict[str, ObjectInfo]] | None = None,
             ) -> dict[str, Any]:
    """Replicate the policy's window of committed checkpoints to every destination, verify,
    apply retention. ``commit_to_verified_s``: from a checkpoint's commit to its verify here.
    ``filters`` narrow the policy's include/exclude further; ``progress`` follows the run.
    ``readiness`` and ``found``: the survey and the source listing it was made from, when the
    caller has them (``watch``). ``revisited``: checkpoints this machine had verified whose
    source changed since, copied and verified again."""
    policy = named.policy
    started = time.monotonic()
    if found is None or readiness is None:
        if progress is not None:
            progress.begin(f"listing {policy.source}")
        found = listing(policy.source, settings)
        readiness = survey(policy, settings, found=found)
    kept, plans, unreachable = prepare(policy, settings, readiness, filters, progress)
    if progress is not None:
        progress.plan(sum(plan.bytes for plan in plans.values()), 0)
    prints = {c: fingerprint(found.get(c, {})) for c in kept}
    report: dict[str, Any] = {"policy": named.name, "source": policy.source, "checkpoints": kept,
                              "waiting": rules.waiting(readiness), "trusted": rules.trusted(readiness),
                              "held_back": rules.held_back(policy, kept, readiness),
                              "revisited": revisited(named.name, settings, prints),
                              "committed_at": {c: iso(readiness[c].committed_at) for c in kept},
                              "destinations": {}, "removed": {}}
    for dst in policy.destinations:
        report["destinations"][dst] = {"checkpoints": {}, "error": unreachable.get(dst), "last_proven_equal": None,
                                       "commit_to_verified_s": None}

    limits = [x for x in (max_cost, policy.max_cost_usd) if x is not None]
    if limits:
        from bridge import pricing
        usages = [plan.usage() for plan in plans.values()]   # as they will run
        report["estimate_usd"] = pricing.check_budget(usages, settings, min(limits), f"policy {named.name}")
    meters = {dst: meter.Meter() for dst in policy.destinations}

    verified: dict[str, dict[str, bool]] = {dst: {} for dst in policy.destinations}
    for (dst, ckpt), plan in plans.items():
        state = report["destinations"][dst]
        row = state["checkpoints"][ckpt] = {"sent": len(plan.files), "bytes": plan.bytes,
                                            "deleted": len(plan.deletions), "verified": False, "error": None,
                                            "commit_to_verified_s": None}
        try:
            if progress is not None:
                progress.begin(f"copying {ckpt}" + (f" to {dst}" if len(policy.destinations) > 1 else ""))
            with meter.metering(meters[dst]):
                copy_checkpoint(plan, placed(policy, dst, settings), progress, listed=found.get(ckpt),
                                selects=lambda rel: rules.wants(policy, rel))
                check = verifying.verify(f"{dst}{ckpt}/", settings, deep=policy.verify == "deep",
                                   sha256=policy.sha256 and policy.verify == "deep", filters=filters,
                                   progress=progress) if policy.verify != "none" else None
            if check is not None:
                row["verified"] = check["ok"]
                if not check["ok"]:
                    row["error"] = (f"verify found {len(check['missing'])} missing, {len(check['extra'])} extra, "
                                    f"{len(check['mismatched'])} mismatched")
        except BridgeError as exc:
            row["error"] = str(exc)
        verified[dst][ckpt] = row["verified"]
        commit = readiness[ckpt].committed_at
        if row["verified"] and (plan.files or plan.deletions) and commit is not None:
            row["commit_to_verified_s"] = round(max(0.0, time.time() - commit), 1)
            if ckpt == kept[-1]:
                state["commit_to_verified_s"] = row["commit_to_verified_s"]

    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    for dst, state in report["destinations"].items():
        if kept and all(verified[dst].get(c) for c in kept):
            state["last_proven_equal"] = now

    removed, unlisted = retain(policy, kept, verified, settings, readiness)
    report["removed"] = removed
    for dst, problem in unlisted.items():
        report["destinations"][dst]["error"] = report["destinations"][dst]["error"] or problem

    newest = kept[-1] if kept else None

    def copied(dst: str) -> bool:
        row = report["destinations"][dst]["checkpoints"].get(newest)
        # with verify none a copy counts once it ran without error: nothing more is known
        return row is not None and row["error"] is None and (row["verified"] or policy.verify == "none")

    copies = sum(1 for dst in policy.destinations if copied(dst))
    errors = [f"{dst}: {state['error']}" for dst, state in report["destinations"].items() if state["error"]] + \
             [f"{dst}{ckpt}/: {row['error']}" for dst, state in report["destinations"].items()
              for ckpt, row in state["checkpoints"].items() if row["error"]]
    if not kept:
        pending = f" ({len(report['waiting'])} not committed yet)" if report["waiting"] else ""
        errors.append(f"no committed checkpoint under {policy.source} matches {policy.checkpoints!r}{pending}")
    report.update(verified_copies=copies, copies_needed=policy.copies_needed, errors=errors,
                  ok=bool(kept) and copies >= policy.copies_needed,
                  elapsed_s=round(time.monotonic() - started, 3))
    for dst, state in report["destinations"].items():
        state["metered"] = meters[dst].to_dict()
        state["spent_usd"] = _priced(meters[dst], policy.source, dst, settings)
    record(named, report, readiness, settings, prints)
    return report


def _priced(metered: meter.Meter, source: str, destination: str, settings: Settings) -> float | None:
    if not metered.stores:
        return 0.0
    from bridge import pricing
    try:
        return pricing.spend(metered, source, destination, settings)
    except (BridgeError, ValueError):
        return None   # where a bucket is could not be found out: said as "not priced"


# -- what an in-process run leaves for `mcbridge policy status` ----------------------------------

def state_path(name: str, settings: Settings):
    from pathlib import Path
    return Path(settings.transfer.state_dir) / "policies" / f"{job_key('policy', name)}.json"


def recorded(name: str, settings: Settings) -> dict[str, dict[str, Any]]:
    """Per destination, the last in-process run of policy ``name`` on this machine (``record``)."""
    import json
    try:
        return json.loads(state_path(name, settings).read_text()).get("destinations", {})
    except (OSError, ValueError):
        return {}


def revisited(name: str, settings: Settings, prints: Mapping[str, str]) -> dict[str, str]:
    """The checkpoints of ``prints`` that this machine's last run verified somewhere from a
    source listed otherwise than now: each with where it had been verified."""
    out = {}
    for dst, row in recorded(name, settings).items():
        for ckpt, was in (row.get("sources") or {}).items():
            if ckpt in prints and was != prints[ckpt] and row.get("checkpoints", {}).get(ckpt):
                out.setdefault(ckpt, f"changed at the source after it was verified at {dst}: copied and verified again")
    return out


def record(named: NamedPolicy, report: dict[str, Any], readiness: dict[str, rules.Readiness],
           settings: Settings, prints: Mapping[str, str] | None = None) -> None:
    """Write what this run proved per destination beside the journals, in the service's shape
    (workers/replicas.py), so that ``policy status`` tells an in-process run from none."""
    import json
    import os
    from bridge.redact import redact
    policy = named.policy
    path = state_path(named.name, settings)
    before = recorded(named.name, settings)
    now = time.time()
    kept = report["checkpoints"]
    month = time.strftime("%Y-%m", time.gmtime(now))
    rows = {}
    for dst, state in report["destinations"].items():
        prev = before.get(dst, {})
        verified = {c: row["verified"] for c, row in state["checkpoints"].items()}
        proven = [c for c in kept if verified.get(c)]
        if prev.get("newest_verified") and prev["newest_verified"] not in report["removed"].get(dst, []):
            proven.append(prev["newest_verified"])
        newest = max(proven, key=rules.natural_key) if proven else None
        lag = rules.lag(policy, set(rules.committed(readiness)), [newest] if newest else [])
        spent = state.get("spent_usd") or 0.0
        month_usd = (prev.get("month_usd", 0.0) if prev.get("month") == month else 0.0) + spent
        errors = [e for e in [state["error"]] + [row["error"] for row in state["checkpoints"].values()] if e]
        rows[dst] = {"last_run": iso(now), "job": "in-process", "ok": bool(kept) and all(verified.get(c) for c in kept),
                     "checkpoints": verified, "newest_verified": newest,
                     "verified_at": iso(now) if newest in verified and verified[newest] else prev.get("verified_at"),
                     "newest_source": lag["newest_source"], "lag_checkpoints": lag["lag_checkpoints"],
                     "commit_to_verified_s": state.get("commit_to_verified_s") or prev.get("commit_to_verified_s"),
                     "removed": report["removed"].get(dst, []), "spent_usd": spent, "month": month,
                     "month_usd": month_usd, "errors": [redact(e) for e in errors][:5],
                     "sources": {c: (prints or {}).get(c) for c in kept if verified.get(c)}}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"policy": named.name, "destinations": rows}))
        os.replace(tmp, path)
    except OSError:
        pass   # the run's report says what happened; only its record for policy status is missing


def watch(chosen: list[NamedPolicy], settings: Settings, emit: Callable[[dict[str, Any]], None],
          stop: threading.Event, *, max_cost: float | None = None, filters: Filters | None = None) -> None:
    """Until ``stop``: list each policy's source every ``watch.interval`` (one listing; what each
    checkpoint's own files say, read once per version) and run the policy when its window of
    committed checkpoints moved, its last run did not prove it, or the source of a checkpoint
    it proved changed since (said first, as ``event: changed``). ``emit`` gets each run's report
    (``event: run``) and each change of what waits (``event: waiting``)."""
    done: dict[str, tuple[tuple[str, ...], bool, dict[str, str]]] = {}
    waited: dict[str, dict[str, str]] = {}
    due = dict.fromkeys((p.name for p in chosen), 0.0)
    heard = [f"{time.time_ns():020d}"]   # commits announced from now on (announce) wake the policy covering them
    while not stop.is_set():
        for named in chosen:
            if time.monotonic() < due[named.name] or stop.is_set():
                continue
            due[named.name] = time.monotonic() + named.policy.watch.interval_s
            try:
                found = listing(named.policy.source, settings)
                readiness = survey(named.policy, settings, found=found)
            except BridgeError as exc:
                emit({"event": "error", "policy": named.name, "error": f"source not listed: {exc}"})
                continue
            kept = tuple(rules.window(named.policy, rules.committed(readiness)))
            prints = {c: fingerprint(found.get(c, {})) for c in kept}
            pending = rules.waiting(readiness)
            if pending != waited.get(named.name):
                waited[named.name] = pending
                emit({"event": "waiting", "policy": named.name, "waiting": pending})
            last = done.get(named.name)
            if not kept or (last is not None and last[:2] == (kept, True) and last[2] == prints):
                continue
            if last is not None and last[:2] == (kept, True):
                moved = sorted((c for c in kept if last[2].get(c) != prints[c]), key=rules.natural_key)
                emit({"event": "changed", "policy": named.name, "checkpoints": moved,
                      "why": "changed at the source after it was verified: verifying again"})
            try:
                report = run_once(named, settings, max_cost=max_cost, readiness=readiness, filters=filters,
                                  found=found)
            except BridgeError as exc:   # refused (over budget): said, and tried again next tick
                done[named.name] = (kept, False, prints)
                emit({"event": "error", "policy": named.name, "error": str(exc)})
                continue
            done[named.name] = (kept, report["ok"], prints)
            emit({"event": "run", **report})
        for name, urls in _wait_or_announced(chosen, settings, due, stop, heard).items():
            emit({"event": "announced", "policy": name, "committed": urls})


# -- replication starts at commit ------------------------------------------------------------------

ANNOUNCE_POLL_S = 0.25      # how often a watch between its listings looks for announced commits
ANNOUNCE_KEEP_S = 3600.0    # an announcement older than this is removed by the next one


def _announce_dir(settings: Settings):
    from pathlib import Path
    return Path(settings.transfer.state_dir) / "announced"


def announce(url: str, settings: Settings) -> None:
    """Say that a checkpoint was committed at ``url`` (a DCP save through bridge.torch, a
    publish): a watch on this machine (the same state folder) whose policy's source covers it runs
    that policy at once instead of at its next listing. One small file per commit, named by the
    time, which every watch reads and none removes (old ones go with a later announcement)."""
    import json
    import os
    folder = _announce_dir(settings)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        name = f"{time.time_ns():020d}-{os.getpid()}-{os.urandom(4).hex()}.json"
        tmp = folder / f".{name}.tmp"
        tmp.write_text(json.dumps({"url": url, "at": time.time()}))
        os.replace(tmp, folder / name)
        cutoff = f"{int((time.time() - ANNOUNCE_KEEP_S) * 1e9):020d}"
        for old in folder.glob("*.json"):
            if old.name < cutoff:
                old.unlink(missing_ok=True)
    except OSError:
        pass   # the watch finds the commit at its next listing all the same


def announced(settings: Settings, after: str) -> tuple[list[str], str]:
    """The URLs announced after the name ``after``, and the newest name read."""
    import json
    folder = _announce_dir(settings)
    try:
        names = sorted(p.name for p in folder.glob("*.json") if p.name > after)
    except OSError:
        return [], after
    urls = []
    for name in names:
        try:
            urls.append(json.loads((folder / name).read_text())["url"])
        except (OSError, ValueError, KeyError):
            continue
    return urls, (names[-1] if names else after)


def covers(policy: rules.Policy, url: str) -> bool:
    """Whether ``url`` (a checkpoint's folder) lies under the policy's source."""
    try:
        source, at = str(parse(policy.source).as_prefix()), str(parse(url).as_prefix())
    except BridgeError:
        return False
    return at.startswith(source) and at != source


def _wait_or_announced(chosen: list[NamedPolicy], settings: Settings, due: dict[str, float],
                       stop: threading.Event, heard: list[str]) -> dict[str, list[str]]:
    """Until the next policy is due, or a commit under a policy's source is announced (that policy
    is then due at once: returned with the URLs announced under it), or ``stop``."""
    while not stop.is_set():
        left = min(due.values()) - time.monotonic()
        if left <= 0:
            break
        stop.wait(min(left, ANNOUNCE_POLL_S))
        urls, heard[0] = announced(settings, heard[0])
        woken = {named.name: [u for u in urls if covers(named.policy, u)] for named in chosen}
        woken = {name: found for name, found in woken.items() if found}
        for name in woken:
            due[name] = 0.0
        if woken:
            return woken
    return {}
