"""``mcbridge plan``, ``mcbridge policy check`` and ``mcbridge replicate --policy``. Registered by
bridge.cli at start; the decisions they print are policies/'s, the facts bridge's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from bridge.cli.options import ConfigOpt, JsonOpt, MaxCostOpt, ProfileOpt, err, out, settings_from_flags
from bridge.config import parse_size
from bridge.progress import human_bytes


def plan(src: str, dst: str,
         pack: Annotated[Optional[str], typer.Option("--pack", help="Allow packing into tar or parquet shards "
                                                     "first (a route of its own).")] = None,
         route: Annotated[Optional[str], typer.Option("--route", help="Use this route; refused if it cannot "
                                                      "serve the pair.")] = None,
         shard_size: Annotated[str, typer.Option("--shard-size", help="Shard size the pack route assumes.")] = "256MiB",
         source_class: Annotated[Optional[str], typer.Option(
             "--source-class", help="Storage class of the source objects, for retrieval fees (e.g. GLACIER, "
             "COLDLINE, COOL).")] = None,
         available: Annotated[Optional[list[str]], typer.Option(
             "--assume-available", help="Plan as if this route could run here (repeatable).")] = None,
         as_json: JsonOpt = False, profile: ProfileOpt = None, config: ConfigOpt = None) -> None:
    """Price every route for copying SRC to DST (bytes, requests, dollars, time) and say which
    one bridge would take and why. Lists the source; moves nothing."""
    from bridge.costing import route_plan
    settings = settings_from_flags(profile, config)
    report = route_plan(src, dst, settings, pack=pack, shard_size=parse_size(shard_size), forced=route,
                        source_class=source_class, available=available)
    if as_json:
        out.print_json(json.dumps(report))
        return
    places = report["places"]
    out.print(f"{report['files']} files, {human_bytes(report['bytes'])}: {report['source']} ({places['source']}) -> "
              f"{report['destination']} ({places['destination']}); this process runs in {places['runs_in']}",
              markup=False)
    out.print(f"{'route':<10} {'valid':<6} {'bytes':>10} {'requests':>9} {'usd':>10} {'time':>10}  why", markup=False)
    for row in report["routes"]:
        mark = "*" if row["chosen"] else " "
        out.print(f"{mark}{row['route']:<9} {'yes' if row['valid'] else 'no':<6} {human_bytes(row['bytes']):>10} "
                  f"{row['requests']:>9} {row['usd']:>10.4f} {row['seconds']:>9.0f}s  {row['why']}", markup=False)
    chosen = next(r for r in report["routes"] if r["chosen"])
    out.print(f"chosen: {chosen['route']}", markup=False)
    for line in chosen["cost"]["breakdown"]:
        out.print(f"  {line}", markup=False)


PolicyFileArg = Annotated[Path, typer.Argument(help="A YAML file of replication policies.")]


def load_policies(path: Path):
    """The policies of a file; a bad file exits 2, each mistake on its own line naming file, line
    and field (also what `mcbridge beat --policies` does with one)."""
    from policies.replication import PolicyError, load
    try:
        return load(path)
    except PolicyError as exc:
        for line in exc.problems:
            err.print(f"mcbridge: error: {line}", markup=False, soft_wrap=True)
        raise typer.Exit(2) from None


def policy_check(file: PolicyFileArg, as_json: JsonOpt = False) -> None:
    """Check a replication policy file; each mistake is named by file, line and field (exit 2)."""
    loaded = load_policies(file)
    if as_json:
        out.print_json(json.dumps([{"name": p.name, "line": p.line, **p.policy.model_dump()} for p in loaded]))
        return
    for p in loaded:
        keep = f"keep the newest {p.policy.keep_last}" if p.policy.keep_last else "keep all"
        out.print(f"{p.name}: {p.policy.source}{p.policy.checkpoints} -> {', '.join(p.policy.destinations)} "
                  f"({p.policy.mode}, {keep}, verify {p.policy.verify})", markup=False)
    out.print(f"{len(loaded)} policies OK", markup=False)


def replicate(policy_file: Annotated[Path, typer.Option("--policy", help="YAML file of replication policies.")],
              name: Annotated[Optional[str], typer.Option("--name", help="Only this policy.")] = None,
              once: Annotated[bool, typer.Option("--once", help="Run each policy once, in this process.")] = False,
              max_cost: MaxCostOpt = None, as_json: JsonOpt = False, profile: ProfileOpt = None,
              config: ConfigOpt = None) -> None:
    """Replicate checkpoints by the rules of a policy file: the newest keep_last to every
    destination, each verified; older ones removed only once the newest is proven everywhere."""
    from bridge.errors import InvalidOption
    from bridge.replication import run_once
    from policies.replication import select
    if not once:
        raise InvalidOption("give --once to run the policies once in this process; on their schedules they "
                            "run on the service: mcbridge beat --policies FILE")
    chosen = select(load_policies(policy_file), name)
    settings = settings_from_flags(profile, config)
    reports = [run_once(p, settings, max_cost=max_cost) for p in chosen]
    if as_json:
        out.print_json(json.dumps({"policies": reports, "ok": all(r["ok"] for r in reports)}))
    else:
        for r in reports:
            for dst, state in r["destinations"].items():
                rows = ", ".join(f"{c} {'verified' if row['verified'] else 'FAILED' if row['error'] else 'sent'}"
                                 f" ({row['sent']} sent)" for c, row in state["checkpoints"].items())
                out.print(f"{r['policy']}: {dst}: {rows or state['error']}", markup=False)
            for dst, old in r["removed"].items():
                out.print(f"{r['policy']}: {dst}: removed {', '.join(old)}", markup=False)
            for problem in r["errors"]:
                err.print(f"mcbridge: {r['policy']}: {problem}", markup=False, soft_wrap=True)
            verdict = "OK" if r["ok"] else "FAILED"
            out.print(f"{verdict}: {r['policy']}: {', '.join(r['checkpoints']) or 'no checkpoints'} at "
                      f"{r['verified_copies']} of {len(r['destinations'])} destinations (need {r['copies_needed']})",
                      markup=False)
    if not all(r["ok"] for r in reports):
        raise typer.Exit(1)


def policy_status(file: Annotated[Optional[Path], typer.Argument(
                      help="The policy file (default: $BRIDGE_POLICIES).")] = None,
                  name: Annotated[Optional[str], typer.Option("--name", help="Only this policy.")] = None,
                  as_json: JsonOpt = False, profile: ProfileOpt = None, config: ConfigOpt = None,
                  broker: Annotated[Optional[str], typer.Option(
                      "--broker", help="Redis URL of the service (default: $BRIDGE_BROKER_URL).")] = None) -> None:
    """Per policy and destination, as the service last ran it: last run, newest checkpoint
    verified there and when, lag behind the source (listed now), and this month's spend
    against the policy's budget."""
    from bridge.errors import BridgeError, InvalidOption
    from policies import replication as rules
    from policies.replication import select
    from workers.budgets import Budgets, month
    from workers.commands import _connect, _ws, usd_text
    from workers.keys import Keys
    from workers.replicas import PolicyState
    ws = _ws(broker)
    path = file or (Path(ws.policies) if ws.policies else None)
    if path is None:
        raise InvalidOption("give the policy file (or set BRIDGE_POLICIES)")
    chosen = select(load_policies(path), name)
    client = _connect(ws)
    keys = Keys(ws.namespace)
    state, budgets = PolicyState(client, keys), Budgets(client, keys)
    settings = settings_from_flags(profile, config)
    report = []
    for p in chosen:
        recorded = state.destinations(p.name)
        spend = state.spend(p.name)
        try:
            from bridge.replication import folders
            source_now, listed = folders(p.policy.source, settings), None
        except BridgeError as exc:
            source_now, listed = None, str(exc)
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
                         "spent_usd": round(spend.get(dst, 0.0), 9), "errors": row.get("errors", [])})
        report.append({"name": p.name, "source": p.policy.source, "source_error": listed,
                       "budget_usd": budgets.limit(p.name), "spent_usd": round(budgets.spent(p.name), 9),
                       "max_cost_usd": p.policy.max_cost_usd, "destinations": rows})
    if as_json:
        out.print_json(json.dumps({"month": month(), "policies": report}))
        return
    for p in report:
        cap = f"${p['budget_usd']:.2f}" if p["budget_usd"] is not None else "no monthly budget"
        out.print(f"{p['name']}: {p['source']}: ${usd_text(p['spent_usd'])} spent in {month()} of {cap}", markup=False)
        if p["source_error"]:
            err.print(f"mcbridge: {p['name']}: source not listed: {p['source_error']}", markup=False, soft_wrap=True)
        for row in p["destinations"]:
            if row["last_run"] is None:
                out.print(f"  {row['destination']}: never run by the service", markup=False)
                continue
            verified = (f"{row['newest_verified']} verified {row['verified_at']}" if row["newest_verified"]
                        else "nothing verified yet")
            lag = row["lag_checkpoints"]
            behind = "up to date" if lag == 0 else f"{lag} checkpoint{'s' if lag != 1 else ''} behind {row['newest_source']}"
            out.print(f"  {row['destination']}: last run {row['last_run']} (job {row['job']}, "
                      f"{'ok' if row['ok'] else 'FAILED'}); {verified}; {behind}; ${usd_text(row['spent_usd'])} this month",
                      markup=False)
            for problem in row["errors"]:
                out.print(f"    {problem}", markup=False)


def register(app: typer.Typer) -> None:
    app.command()(plan)
    app.command()(replicate)
    group = typer.Typer(no_args_is_help=True, help="Replication policies: check a policy file, see their state.")
    group.command("check")(policy_check)
    group.command("status")(policy_status)
    app.add_typer(group, name="policy")
