"""Running a replication policy once, in this process: the I/O half of policies/replication.py.

For each checkpoint in the policy's window and each destination: a sync (only what is new or
changed; in mirror mode files the source no longer has are removed), then a verify. The runs
are planned and priced first, all of them, so that ``max_cost_usd`` refuses before any data
request. Then retention asks the policy what may be removed, which is nothing unless the newest
checkpoint was verified at every destination; a removed checkpoint loses its manifest first, so
a removal cut short never leaves a prefix that looks complete.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from bridge import manifest as manifests
from bridge import routes
from bridge import ops
from bridge.config import Settings
from bridge.engine import Plan
from bridge.errors import BridgeError, ObjectNotFound
from bridge.journal import job_key
from bridge.stores import get_store
from bridge.urls import parse
from bridge.policies import replication as rules
from bridge.policies.replication import NamedPolicy


def folders(url: str, settings: Settings) -> set[str]:
    root = parse(url).as_prefix()
    store = get_store(root, settings)
    store.check_bucket(root)
    return {rel.split("/", 1)[0] for rel, _info in store.walk(root) if "/" in rel}


def filtered(plan: Plan, include: list[str], exclude: list[str]) -> Plan:
    """``plan`` without the files the patterns leave out: they are neither sent nor removed at
    the destination. A plan of its own, with a key of its own."""
    if not (include or exclude):
        return plan
    files = [f for f in plan.files if rules.selected(include, exclude, f.rel)]
    deletions = [rel for rel in plan.deletions if rules.selected(include, exclude, rel)]
    out = replace(plan, files=files, deletions=deletions)
    out.key = job_key("replicate", plan.source, plan.destination, *(f"{f.rel}:{f.size}" for f in files),
                      *deletions)
    return out


def plan_checkpoint(policy: rules.Policy, src: str, dst: str, settings: Settings) -> Plan:
    plan, _reasons = ops.plan_sync(src, dst, settings, delete=policy.mode == "mirror",
                                   chunk_size=settings.transfer.chunk_size)
    # The route the service's workers would take for the same sync: one decision for both.
    return routes.choose(filtered(plan, policy.include, policy.exclude), settings)


def remove_checkpoint(url: str, settings: Settings) -> int:
    """Remove everything under ``url``, its manifest first."""
    root = parse(url).as_prefix()
    store = get_store(root, settings)
    try:
        store.delete(root.join(manifests.MANIFEST))
    except ObjectNotFound:
        pass
    removed = 0
    for info in list(store.list(root)):
        try:
            store.delete(info.location)
            removed += 1
        except ObjectNotFound:
            pass
    return removed


def prepare(policy: rules.Policy, settings: Settings) -> tuple[list[str], dict[tuple[str, str], Plan], dict[str, str]]:
    """The checkpoints the policy keeps now, the sync plan of each (destination, checkpoint),
    and the destinations that cannot be reached (with why). Lists; moves nothing."""
    kept = rules.window(policy, folders(policy.source, settings))
    plans: dict[tuple[str, str], Plan] = {}
    unreachable: dict[str, str] = {}
    for dst in policy.destinations:
        try:
            get_store(parse(dst), settings).check_bucket(parse(dst))
            for ckpt in kept:
                plans[(dst, ckpt)] = plan_checkpoint(policy, f"{policy.source}{ckpt}/", f"{dst}{ckpt}/", settings)
        except BridgeError as exc:
            unreachable[dst] = str(exc)
    return kept, plans, unreachable


def retain(policy: rules.Policy, kept: list[str], verified: dict[str, dict[str, bool]],
           settings: Settings) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Apply retention (policies/replication.py decides what goes); (removed per destination,
    destinations that could not be listed)."""
    present, errors = {}, {}
    for dst in policy.destinations:
        try:
            present[dst] = folders(dst, settings)
        except BridgeError as exc:
            errors[dst] = str(exc)
    removed = rules.removals(policy, kept, present, verified) if not errors else {}
    for dst, old in removed.items():
        for ckpt in old:
            remove_checkpoint(f"{dst}{ckpt}/", settings)
    return removed, errors


def run_once(named: NamedPolicy, settings: Settings, *, max_cost: float | None = None) -> dict[str, Any]:
    """Replicate the policy's window of checkpoints to every destination, verify, apply retention."""
    policy = named.policy
    started = time.monotonic()
    kept, plans, unreachable = prepare(policy, settings)
    report: dict[str, Any] = {"policy": named.name, "source": policy.source, "checkpoints": kept,
                              "destinations": {}, "removed": {}}
    for dst in policy.destinations:
        report["destinations"][dst] = {"checkpoints": {}, "error": unreachable.get(dst), "last_proven_equal": None}

    limits = [x for x in (max_cost, policy.max_cost_usd) if x is not None]
    if limits:
        from bridge import costing, estimate
        usages = [estimate.usage(plan, "direct") for plan in plans.values()]
        report["estimate_usd"] = costing.check_budget(usages, settings, min(limits), f"policy {named.name}")

    verified: dict[str, dict[str, bool]] = {dst: {} for dst in policy.destinations}
    for (dst, ckpt), plan in plans.items():
        state = report["destinations"][dst]
        row = state["checkpoints"][ckpt] = {"sent": len(plan.files), "bytes": plan.bytes,
                                            "deleted": len(plan.deletions), "verified": False, "error": None}
        try:
            ops.execute(plan, settings)
            if policy.verify != "none":
                check = ops.verify(f"{dst}{ckpt}/", settings, deep=policy.verify == "deep")
                row["verified"] = check["ok"]
                if not check["ok"]:
                    row["error"] = (f"verify found {len(check['missing'])} missing, {len(check['extra'])} extra, "
                                    f"{len(check['mismatched'])} mismatched")
        except BridgeError as exc:
            row["error"] = str(exc)
        verified[dst][ckpt] = row["verified"]

    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    for dst, state in report["destinations"].items():
        if kept and all(verified[dst].get(c) for c in kept):
            state["last_proven_equal"] = now

    removed, unlisted = retain(policy, kept, verified, settings)
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
        errors.append(f"no checkpoint under {policy.source} matches {policy.checkpoints!r}")
    report.update(verified_copies=copies, copies_needed=policy.copies_needed, errors=errors,
                  ok=bool(kept) and copies >= policy.copies_needed,
                  elapsed_s=round(time.monotonic() - started, 3))
    return report
