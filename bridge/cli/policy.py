"""``mcbridge plan``, ``mcbridge policy check`` and ``mcbridge replicate --policy``. Registered by
bridge.cli at start; the decisions they print are policies/'s, the facts bridge's. Plugins add
commands to ``mcbridge policy`` through the "policy commands" hook (the service its ``status``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from bridge.cli.placement import StorageClassOpt, with_object_flags
from bridge.cli.options import (ConfigOpt, ExcludeOpt, FilesFromOpt, IncludeOpt, JsonOpt, MaxAgeOpt, MaxCostOpt,
                                MaxSizeOpt, MinAgeOpt, MinSizeOpt, ProfileOpt, ProgressBar, QuietOpt, ShardFormat, err,
                                filters_from_flags, out, settings_from_flags, size_flag)
from bridge.progress import human_bytes, plural
from bridge.policies.cost.money import usd_column


def plan(src: str, dst: str,
         pack: Annotated[Optional[ShardFormat], typer.Option("--pack", help="Allow packing into tar or parquet shards "
                                                     "first (a route of its own).")] = None,
         route: Annotated[Optional[str], typer.Option("--route", metavar="ROUTE", help="Use this route (direct, "
                                                      "server, from-url, sts, datasync); refused if it cannot "
                                                      "serve the pair.")] = None,
         shard_size: Annotated[str, typer.Option("--shard-size", help="Shard size the pack route assumes.")] = "256MiB",
         source_class: Annotated[Optional[str], typer.Option(
             "--source-class", help="Storage class of the source objects, for retrieval fees (e.g. GLACIER, "
             "COLDLINE, COOL).")] = None,
         available: Annotated[Optional[list[str]], typer.Option(
             "--assume-available", help="Plan as if this route could run here (repeatable).")] = None,
         as_json: JsonOpt = False, profile: ProfileOpt = None, config: ConfigOpt = None,
         storage_class: StorageClassOpt = None) -> None:
    """Price every route for copying SRC to DST (bytes, requests, dollars, time) and say which
    one bridge would take and why. Lists the source; moves nothing."""
    from bridge.pricing import route_plan
    settings = with_object_flags(settings_from_flags(profile, config), dst, storage_class=storage_class)
    report = route_plan(src, dst, settings, pack=str(pack) if pack else None, shard_size=size_flag("--shard-size", shard_size), forced=route,
                        source_class=source_class, available=available)
    if as_json:
        out.print_json(json.dumps(report))
        return
    places = report["places"]
    out.print(f"{report['files']} files, {human_bytes(report['bytes'])}: {report['source']} ({places['source']}) -> "
              f"{report['destination']} ({places['destination']}); this process runs in {places['runs_in']}",
              markup=False)
    column = usd_column([row["usd"] for row in report["routes"]])
    wide = max(10, *(len(d) for d in column))
    out.print(f"{'route':<10} {'valid':<6} {'bytes':>10} {'requests':>9} {'usd':>{wide}} {'time':>10}  why", markup=False)
    for row, dollars in zip(report["routes"], column):
        mark = "*" if row["chosen"] else " "
        out.print(f"{mark}{row['route']:<9} {'yes' if row['valid'] else 'no':<6} {human_bytes(row['bytes']):>10} "
                  f"{row['requests']:>9} {dollars:>{wide}} {row['seconds']:>9.0f}s  {row['why']}"
                  f"{how_to_enable(row)}", markup=False)
    chosen = next(r for r in report["routes"] if r["chosen"])
    out.print(f"chosen: {chosen['route']}", markup=False)
    for line in chosen["cost"]["breakdown"]:
        out.print(f"  {line}", markup=False)
    if "restore" in report:
        out.print(f"restore first: {report['restore']['why']}", markup=False)


def how_to_enable(row: dict) -> str:
    """For a native route that is built but off by default (it starts jobs in your cloud accounts):
    how to turn it on, so that "not enabled" never reads as "not there"."""
    from bridge.routes import NATIVE
    if row["valid"] or not row.get("built") or row["route"] not in NATIVE or "not enabled" not in row["why"]:
        return ""
    return (f": off by default; enable it with MCBRIDGE_NATIVE_ROUTES={row['route']} or native.enabled in the "
            f"settings file, or run it once with --route {row['route']}")


PolicyFileArg = Annotated[Path, typer.Argument(help="A YAML file of replication policies.")]


def load_policies(path: Path):
    """The policies of a file; a bad file exits 2, each mistake on its own line naming file, line
    and field (also what `mcbridge beat --policies` does with one)."""
    from bridge.policies.replication import PolicyError, load
    try:
        return load(path)
    except PolicyError as exc:
        raise _problems(exc) from None


def _problems(exc) -> typer.Exit:
    """Each mistake of a policy file on its own line; the exit its error class says (2)."""
    for line in exc.problems:
        err.print(f"mcbridge: error: {line}", markup=False, soft_wrap=True)
    return typer.Exit(exc.exit_code)


def load_service_policy(path: Path):
    """The service policy (tenants and their scopes) of a file; a bad file exits 2, each mistake on
    its own line naming file, line and field."""
    from bridge.policies.replication import PolicyError
    from bridge.policies.tenants import load
    try:
        return load(path)
    except PolicyError as exc:
        raise _problems(exc) from None


def policy_check(file: PolicyFileArg, as_json: JsonOpt = False) -> None:
    """Check a replication policy file, or a service policy (tenants:); each mistake is named by
    file, line and field (exit 2)."""
    from bridge.policies import tenants
    from bridge.policies.yamlcheck import read
    try:
        text = read(file, "policy file")
    except ValueError:
        text = ""   # load_policies names the problem
    if tenants.is_service_policy(text):
        policy = load_service_policy(file)
        if as_json:
            out.print_json(json.dumps({name: t.model_dump() for name, t in policy.tenants.items()}))
            return
        for line in tenants.describe(policy):
            out.print(line, markup=False)
        out.print(f"{len(policy.tenants)} tenants OK", markup=False)
        return
    loaded = load_policies(file)
    if as_json:
        out.print_json(json.dumps([{"name": p.name, "line": p.line, **p.policy.model_dump()} for p in loaded]))
        return
    for p in loaded:
        keep = f"keep the newest {p.policy.keep_last}" if p.policy.keep_last else "keep all"
        out.print(f"{p.name}: {p.policy.source}{p.policy.checkpoints} -> {', '.join(p.policy.destinations)} "
                  f"({p.policy.mode}, {keep}, verify {p.policy.verify})", markup=False)
    out.print(f"{plural(len(loaded), 'policy', 'policies')} OK", markup=False)


def replicate(policy_file: Annotated[Path, typer.Option("--policy", help="YAML file of replication policies.")],
              name: Annotated[Optional[str], typer.Option("--name", help="Only this policy.")] = None,
              once: Annotated[bool, typer.Option("--once", help="Run each policy once, in this process.")] = False,
              watch: Annotated[bool, typer.Option(
                  "--watch", help="Keep running: list the source every watch.interval of the policy and "
                  "replicate each checkpoint soon after it commits (Ctrl-C stops). With --json, one JSON "
                  "object per line.")] = False,
              include: IncludeOpt = None, exclude: ExcludeOpt = None, files_from: FilesFromOpt = None,
              min_size: MinSizeOpt = None, max_size: MaxSizeOpt = None, min_age: MinAgeOpt = None,
              max_age: MaxAgeOpt = None,
              max_cost: MaxCostOpt = None, as_json: JsonOpt = False, quiet: QuietOpt = False,
              profile: ProfileOpt = None, config: ConfigOpt = None) -> None:
    """Replicate checkpoints by the rules of a policy file: the newest keep_last committed ones
    to every destination, each verified; with mode mirror, an older one removed only once the
    newest is proven everywhere and keep_last newer ones, committed by evidence, are proven
    where it is. A checkpoint committed on trust (a marker nothing read confirms) is said so.
    The filters narrow each checkpoint's files further (paths inside a checkpoint)."""
    from bridge import api
    from bridge.errors import InvalidOption, ReplicationFailed
    from bridge.policies.replication import PolicyError
    if once == watch:
        raise InvalidOption("give --once to run the policies once in this process, or --watch to replicate "
                            "checkpoints as they commit; on their schedules they run on the service: "
                            "mcbridge beat --policies FILE")
    settings = settings_from_flags(profile, config)
    if watch:
        from bridge.policies.replication import select
        filters = filters_from_flags(include, exclude, files_from, min_size, max_size, min_age, max_age)
        _watch(select(load_policies(policy_file), name), settings, max_cost, as_json, filters)
        return
    failed = None
    try:
        with ProgressBar(not as_json, settings, quiet=quiet) as progress:
            result = api.replicate(policy_file, name=name, max_cost=max_cost, settings=settings, progress=progress,
                                   include=include, exclude=exclude, files_from=files_from, min_size=min_size,
                                   max_size=max_size, min_age=min_age, max_age=max_age)
    except ReplicationFailed as exc:
        failed, result = exc, exc.result
    except PolicyError as exc:
        raise _problems(exc) from None
    if as_json:
        out.print_json(json.dumps(result.report))
    else:
        for r in result.policies:
            _print_run(r.report, quiet)
    if failed is not None:
        raise typer.Exit(failed.exit_code)


def _print_run(r: dict, quiet: bool = False) -> None:
    for problem in r["errors"]:
        err.print(f"mcbridge: {r['policy']}: {problem}", markup=False, soft_wrap=True)
    if quiet and r["ok"]:
        return
    for dst, state in r["destinations"].items():
        rows = ", ".join(f"{c} {'verified' if row['verified'] else 'FAILED' if row['error'] else 'sent'}"
                         f" ({row['sent']} sent{_latency(row)})" for c, row in state["checkpoints"].items())
        out.print(f"{r['policy']}: {dst}: {rows or state['error']}", markup=False)
    for ckpt, why in r.get("waiting", {}).items():
        out.print(f"{r['policy']}: {ckpt} waiting: {why}", markup=False)
    for ckpt, why in r.get("trusted", {}).items():
        out.print(f"{r['policy']}: {ckpt} committed on trust: {why}", markup=False)
    for ckpt, why in r.get("held_back", {}).items():
        out.print(f"{r['policy']}: {ckpt} not counted by retention: {why}", markup=False)
    for ckpt, why in r.get("revisited", {}).items():
        out.print(f"{r['policy']}: {ckpt} {why}", markup=False)
    for dst, old in r["removed"].items():
        out.print(f"{r['policy']}: {dst}: removed {', '.join(old)}", markup=False)
    verdict = "OK" if r["ok"] else "FAILED"
    out.print(f"{verdict}: {r['policy']}: {', '.join(r['checkpoints']) or 'no checkpoints'} at "
              f"{r['verified_copies']} of {plural(len(r['destinations']), 'destination')} "
              f"(need {r['copies_needed']})", markup=False)


def _latency(row: dict) -> str:
    return f", verified {row['commit_to_verified_s']}s after its commit" \
        if row.get("commit_to_verified_s") is not None else ""


def _watch(chosen, settings, max_cost, as_json: bool, filters=None) -> None:
    """``replicate --watch``: until Ctrl-C or SIGTERM, each run and each change of what waits."""
    import signal
    import threading
    from bridge.replicator import watch
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):   # stop after the run in progress
        signal.signal(sig, lambda *_: stop.set())

    def emit(event: dict) -> None:
        if as_json:
            out.print(json.dumps(event), markup=False, highlight=False, soft_wrap=True)
        elif event["event"] == "run":
            _print_run(event)
        elif event["event"] == "waiting":
            waiting = "; ".join(f"{c}: {why}" for c, why in event["waiting"].items())
            out.print(f"{event['policy']}: waiting: {waiting or 'nothing'}", markup=False)
        elif event["event"] == "changed":
            out.print(f"{event['policy']}: {', '.join(event['checkpoints'])} {event['why']}", markup=False)
        elif event["event"] == "announced":
            out.print(f"{event['policy']}: committed {', '.join(event['committed'])}: replicating now", markup=False)
        else:
            err.print(f"mcbridge: {event['policy']}: {event['error']}", markup=False, soft_wrap=True)

    try:
        watch(chosen, settings, emit, stop, max_cost=max_cost, filters=filters)
    except KeyboardInterrupt:
        pass


def register(app: typer.Typer) -> None:
    app.command()(plan)
    app.command()(replicate)
    group = typer.Typer(no_args_is_help=True, help="Replication policies: check a policy file, see their state.")
    group.command("check")(policy_check)
    from bridge.registry import plugins
    for add in plugins().each("policy commands"):   # the service adds its view of the policies' state
        add(group)
    app.add_typer(group, name="policy")
