"""``mcbridge policy status``: each policy's state as the service and this machine last ran it.
The policy group is the core's; this adds its ``status`` through the "policy commands" hook
(bridge.registry)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from bridge.policies.cost import money
from bridge.cli.options import ConfigOpt, JsonOpt, err, out, settings_from_flags
from bridge.cli.options import ProfileOpt as LocalProfileOpt
from bridge.policies.cost.money import usd
from bridge.workers.commands.connection import connect, service_settings


def policy_status(file: Annotated[Optional[Path], typer.Argument(
                      help="The policy file (default: $BRIDGE_POLICIES).")] = None,
                  name: Annotated[Optional[str], typer.Option("--name", help="Only this policy.")] = None,
                  as_json: JsonOpt = False, profile: LocalProfileOpt = None, config: ConfigOpt = None,
                  broker: Annotated[Optional[str], typer.Option(
                      "--broker", help="Redis URL of the service (default: $BRIDGE_BROKER_URL).")] = None) -> None:
    """Per policy and destination, as the service last ran it: last run, newest checkpoint
    verified there and when, lag behind the source (listed now), and this month's spend
    against the policy's budget."""
    from bridge.errors import InvalidOption
    from bridge.policies.cost.budgets import month
    ws = service_settings(broker)
    path = file or (Path(ws.policies) if ws.policies else None)
    if path is None:
        raise InvalidOption("give the policy file (or set BRIDGE_POLICIES)")
    from bridge.policies.replication import rpo_words
    report = policy_report(ws, path, name, settings_from_flags(profile, config))
    if as_json:
        out.print_json(json.dumps({"month": month(), "policies": report}))
        return
    for p in report:
        parts = " + ".join(usd(row["spent_usd"]) for row in p["destinations"])
        budget = (f"budget {usd(p['budget_usd'])}, {usd(p['budget_charged_usd'])} of it charged by the service's runs"
                  if p["budget_usd"] is not None else "no monthly budget")
        out.print(f"{p['name']}: {p['source']}: {usd(p['spent_usd'])} spent in {month()}"
                  f"{f' (= {parts})' if len(p['destinations']) > 1 else ''}; {budget}", markup=False, soft_wrap=True)
        if p["source_error"]:
            err.print(f"mcbridge: {p['name']}: source not listed: {p['source_error']}", markup=False, soft_wrap=True)
        for ckpt, why in p["waiting"].items():
            out.print(f"  {ckpt} waiting: {why}", markup=False)
        for ckpt, why in p["trusted"].items():
            out.print(f"  {ckpt} committed on trust: {why}", markup=False)
        for row in p["destinations"]:
            if row["last_run"] is None:
                out.print(f"  {row['destination']}: never run (by the service, or in-process here); {rpo_words(row)}",
                          markup=False)
                continue
            verified = (f"{row['newest_verified']} verified {row['verified_at']}" if row["newest_verified"]
                        else "nothing verified yet")
            if row["newest_verified"] and row["commit_to_verified_s"] is not None:
                verified += f", {row['commit_to_verified_s']}s after its commit"
            lag = row["lag_checkpoints"]
            behind = "up to date" if lag == 0 else f"{lag} checkpoint{'s' if lag != 1 else ''} behind {row['newest_source']}"
            by = "in-process" if row["job"] == "in-process" else f"job {row['job']}"
            out.print(f"  {row['destination']}: last run {row['last_run']} ({by}, "
                      f"{'ok' if row['ok'] else 'FAILED'}); {verified}; {behind}; {rpo_words(row)}; "
                      f"{usd(row['spent_usd'])} this month", markup=False)
            for problem in row["errors"]:
                out.print(f"    {problem}", markup=False)


def policy_report(ws, path: Path, name: str | None, settings) -> list[dict]:
    """Per policy of the file at ``path`` (only ``name`` if given) and destination: the newer of
    the service's last run and this machine's in-process one, the lag behind the source listed
    now, and this month's spend against the policy's budget. What ``policy status`` prints and
    the status page (bridge.workers.statuspage) draws."""
    from bridge.errors import BridgeError
    from bridge.policies import replication as rules
    from bridge.policies.replication import select
    from bridge.policies.cost.budgets import month
    from bridge.workers.redisbudgets import Budgets
    from bridge.workers.keys import Keys
    from bridge.workers.replicas import PolicyState
    from bridge.cli.policy import load_policies
    chosen = select(load_policies(path), name)
    client = connect(ws)
    keys = Keys(ws.namespace)
    state, budgets = PolicyState(client, keys), Budgets(client, keys)
    report = []
    from bridge.replicator import recorded as run_here
    for p in chosen:
        # the service's runs, and this machine's in-process ones (replicate --once/--watch): the newer wins
        recorded = _newer(state.destinations(p.name), run_here(p.name, settings))
        spend = state.spend(p.name)
        for dst, row in run_here(p.name, settings).items():
            if row.get("month") == month():
                spend[dst] = spend.get(dst, 0.0) + row.get("month_usd", 0.0)
        try:
            from bridge.replicator import survey
            readiness = survey(p.policy, settings)
            source_now, listed, waiting = rules.committed(readiness), None, rules.waiting(readiness)
            trusted = rules.trusted(readiness)   # committed on a name's word: said, never called verified
        except BridgeError as exc:
            readiness, source_now, listed, waiting, trusted = {}, None, str(exc), {}, {}
        now = time.time()
        rows = []
        for dst in p.policy.destinations:
            row = recorded.get(dst, {})
            newest = row.get("newest_verified")
            if source_now is not None:
                lag = rules.lag(p.policy, source_now, [newest] if newest else [])
            else:
                lag = {"newest_source": row.get("newest_source"), "lag_checkpoints": row.get("lag_checkpoints")}
            rows.append({"destination": dst, "last_run": row.get("last_run"), "job": row.get("job"),
                         "ok": row.get("ok"), "newest_verified": newest, "verified_at": row.get("verified_at"),
                         "newest_source": lag["newest_source"], "lag_checkpoints": lag["lag_checkpoints"],
                         "commit_to_verified_s": row.get("commit_to_verified_s"),
                         "spent_usd": money.usd_number(spend.get(dst, 0.0)), "errors": row.get("errors", []),
                         # as the alert rule: the source's newest committed checkpoint, verified here
                         # within the policy's RPO (not known when the source was not listed)
                         **rules.rpo_state(p.policy, lag["lag_checkpoints"] if source_now is not None else None,
                                           getattr(readiness.get(lag["newest_source"]), "committed_at", None), now),
                         "lag_history": state.lag_history(p.name, dst)})
        # The policy's spend is the sum of the destinations' as shown, so the numbers add up; its
        # budget is charged by the service's runs only (an in-process run charges none).
        report.append({"name": p.name, "source": p.policy.source, "source_error": listed,
                       "budget_usd": budgets.limit(p.name),
                       "spent_usd": round(sum(row["spent_usd"] for row in rows), 12),   # float noise only
                       "budget_charged_usd": money.usd_number(budgets.spent(p.name)),
                       "max_cost_usd": p.policy.max_cost_usd, "waiting": waiting, "trusted": trusted,
                       "destinations": rows})
    return report


def _newer(service: dict[str, dict], here: dict[str, dict]) -> dict[str, dict]:
    """Per destination, the record of the later run: the service's or this machine's in-process one."""
    from datetime import datetime

    def when(row: dict) -> datetime:
        try:
            return datetime.fromisoformat(row["last_run"])
        except (KeyError, TypeError, ValueError):
            return datetime.min.replace(tzinfo=None)

    out = dict(service)
    for dst, row in here.items():
        theirs = out.get(dst)
        if theirs is None or when(row).replace(tzinfo=None) > when(theirs).replace(tzinfo=None):
            out[dst] = row
    return out


def register(policy_group: typer.Typer) -> None:
    """Adds ``status`` to the core's ``mcbridge policy`` group."""
    policy_group.command("status")(policy_status)
