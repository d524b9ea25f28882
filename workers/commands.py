"""The service's commands: ``mcbridge worker|beat``, ``mcbridge submit cp|sync|replicate|pack|migrate|unpack``,
``mcbridge jobs list|status|watch|cancel|limit``.

``bridge.cli`` imports this module at start (one of its GROUPS) and calls ``register(app)``; Celery, Redis and the
rest are imported inside the commands, so ``mcbridge --help`` stays fast. Settings come from
``bridge.workers.settings`` (environment), with these flags winning; a bad value, a bad URL or an
unreachable broker is refused on one line before anything is queued.
"""

from __future__ import annotations

import enum
import json
import os
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from bridge.cli.options import ConfigOpt, settings_from_flags
from bridge.cli.options import ProfileOpt as LocalProfileOpt
from bridge.cli.options import (DeleteOpt, ExcludeOpt, FilesFromOpt, IncludeOpt, JsonOpt, MaxAgeOpt, MaxSizeOpt,
                                MinAgeOpt, MinSizeOpt, QuietOpt, ShardFormat, VerifyMode, bwlimit_opt, chunk_size_opt,
                                concurrency_opt, dry_run_opt, err, filters_from_flags, given, max_cost_opt, out,
                                profile_opt, refuse_unused, route_opt, store_checksums_opt, transfer_flags,
                                usd_amount)
from bridge.progress import human_bytes

# The flags of mcbridge cp, with the meaning they have for a job that runs on workers.
ConcOpt = concurrency_opt("Units in flight at once in each task (default: the worker's).")
ChunkOpt = chunk_size_opt("Part size, e.g. 16MiB.")
ProfileOpt = profile_opt("Settings profile the workers use for this job (their own credentials).")
DryOpt = dry_run_opt("Check the job and print it; queue nothing.")
StoreSumOpt = store_checksums_opt("After a multipart upload: require the store's whole-object checksum, "
                                  "readback, or skip (as in mcbridge cp).")
BwlimitOpt = bwlimit_opt("Bytes per second across all of the job's workers, e.g. 50MiB; change it later "
                         "with mcbridge jobs limit.")
MaxCostOpt = max_cost_opt("Plan the job here (listing with this machine's settings) and refuse to queue "
                          "it if estimated above this many US dollars.")
BrokerOpt = Annotated[Optional[str], typer.Option(
    "--broker", help="Redis URL of the broker (default: $BRIDGE_BROKER_URL, else redis://localhost:6379/0).")]
QueueOpt = Annotated[Optional[str], typer.Option(
    "--queue", help="Queue for the job's tasks (default: by destination, e.g. bridge.s3).")]
VerifyOpt = Annotated[VerifyMode, typer.Option(
    "--verify", help="After the copy: store (checksums the store reports), deep (re-read) or none.")]
WaitOpt = Annotated[bool, typer.Option("--wait", help="Follow the job; exit 0 only if it succeeds.")]
RouteOpt = route_opt()
BudgetOpt = Annotated[Optional[str], typer.Option(
    "--budget", help="Charge the job to this monthly budget (mcbridge budgets); over it, the job waits "
    "for mcbridge jobs approve.")]


def _ws(broker: str | None = None, **overrides: Any):
    """The service's settings, the broker URL checked; every service command starts here, so a
    missing 'service' extra is named before anything imports redis."""
    _need_service()
    from bridge.workers.settings import WorkerSettings
    given("--broker", broker)
    ws = WorkerSettings.from_env(os.environ, broker_url=broker, **overrides)
    _check_broker(ws.broker_url, "--broker" if broker else "BRIDGE_BROKER_URL")
    return ws


def _check_broker(url: str, named: str) -> None:
    """A Redis URL redis-py can use, or one line naming the flag or variable it came from."""
    from urllib.parse import urlsplit

    from redis.connection import parse_url

    from bridge.errors import InvalidOption
    try:
        parts = parse_url(url)
        db = urlsplit(url).path.strip("/") if url.startswith(("redis://", "rediss://")) else ""
    except ValueError as exc:
        raise InvalidOption(f"{named} {_safe_url(url)!r} is not a Redis URL: {exc}") from None
    if not (parts.get("host") or parts.get("path")):
        raise InvalidOption(f"{named} {_safe_url(url)!r} names no host: use redis://HOST:PORT/DB")
    if db and not db.isdigit():
        raise InvalidOption(f"{named} {_safe_url(url)!r}: the database must be a number, not {db!r}")


def _safe_url(url: str) -> str:
    from bridge.redact import redact
    return redact(url)


def _need_service() -> None:
    """One line naming the extra when Celery or redis is not installed: every service command needs both."""
    import importlib.util

    from bridge.errors import MissingBackend
    def absent(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is None
        except (ImportError, ValueError):   # ValueError: a module set to None (blocked) in sys.modules
            return True

    missing = [name for name in ("celery", "redis") if absent(name)]
    if missing:
        raise MissingBackend(f"the service needs the 'service' extra: pip install 'cloud-artifact-bridge[service]' "
                             f"({missing[0]} is missing)")


def _connect(ws):
    """A Redis client that answered PING, or one line saying why not (``ws`` comes from ``_ws``,
    which has checked that the service's packages are installed)."""
    from redis.exceptions import RedisError

    from bridge.errors import EndpointUnreachable
    from bridge.workers.keys import redis_client
    client = redis_client(ws.broker_url)
    try:
        client.ping()
    except (RedisError, OSError) as exc:
        raise EndpointUnreachable(f"cannot reach the broker at {_safe_url(ws.broker_url)}: {exc}") from None
    return client


def _jobs(ws):
    from bridge.workers.jobs import Jobs
    from bridge.workers.keys import Keys
    return Jobs(_connect(ws), Keys(ws.namespace), ws.job_ttl)


# -- worker and beat -----------------------------------------------------------------------------

def worker(
    concurrency: Annotated[Optional[int], typer.Option(
        "--concurrency", "-c", min=1, help="Tasks at once (pool processes; default: CPU count).")] = None,
    queues: Annotated[Optional[str], typer.Option(
        "--queues", "-Q", help="Comma-separated queues (default: the control queue and every route).")] = None,
    hostname: Annotated[Optional[str], typer.Option("--hostname", "-n", help="Worker name, e.g. w1@%h.")] = None,
    pool: Annotated[str, typer.Option("--pool", "-P", help="prefork, threads or solo.")] = "prefork",
    loglevel: Annotated[str, typer.Option("--loglevel", "-l")] = "INFO",
    metrics_port: Annotated[Optional[int], typer.Option(
        "--metrics-port", min=0, max=65535, help="Prometheus endpoint (default $BRIDGE_METRICS_PORT or 9808; 0: off).")] = None,
    broker: BrokerOpt = None,
) -> None:
    """Start a worker (Celery's own, with bridge's settings): runs the units of queued jobs."""
    _queue_names(queues)
    for flag, value in (("--hostname", hostname), ("--pool", pool), ("--loglevel", loglevel)):
        given(flag, value)
    ws = _ws(broker, metrics_port=metrics_port)
    _connect(ws)
    from bridge.workers.app import app, configure
    configure(ws)
    argv = ["worker", f"--loglevel={loglevel}", f"--pool={pool}", f"--queues={queues or ','.join(ws.default_queues())}"]
    if concurrency:
        argv.append(f"--concurrency={concurrency}")
    if hostname:
        argv.append(f"--hostname={hostname}")
    app.worker_main(argv)


def _queue_names(queues: str | None) -> list[str] | None:
    """The queues of -Q, each a name: an empty one would make Celery consume every queue."""
    from bridge.errors import InvalidOption
    from bridge.workers.settings import _NAME_RE
    if queues is None:
        return None
    names = [name.strip() for name in queues.split(",")]
    if not any(names):
        raise InvalidOption("--queues is empty: name the queues, or leave the option out for the defaults")
    for name in names:
        if not _NAME_RE.match(name):
            raise InvalidOption(f"--queues {queues!r}: {name!r} is not a queue name (letters, digits, '_', '.', '-')")
    return names


def beat(
    schedules: Annotated[Optional[Path], typer.Option(
        "--schedules", help="YAML file of schedules (default: $BRIDGE_SCHEDULES).")] = None,
    policies: Annotated[Optional[Path], typer.Option(
        "--policies", help="YAML file of replication policies; each one with a schedule runs on it "
        "(default: $BRIDGE_POLICIES).")] = None,
    schedule_db: Annotated[Optional[Path], typer.Option(
        "--schedule-db", help="Where beat remembers last run times (default: beat-NAMESPACE in $MCBRIDGE_STATE_DIR).")] = None,
    check: Annotated[bool, typer.Option("--check", help="Validate the schedules and policy files and exit.")] = False,
    loglevel: Annotated[str, typer.Option("--loglevel", "-l")] = "INFO",
    broker: BrokerOpt = None,
) -> None:
    """Start the scheduler (Celery beat) for the schedules file and the replication policies'
    schedules; run exactly one."""
    from bridge.workers.schedules import load
    ws = _ws(broker, schedules=str(schedules) if schedules else None, policies=str(policies) if policies else None)
    loaded = load(ws.schedules) if ws.schedules else []
    timed = _scheduled_policies(ws.policies) if ws.policies else []
    if check:
        for s in loaded:
            out.print(s.describe() + ("" if s.enabled else " (disabled)"), markup=False)
        for p in timed:
            when = p.policy.schedule
            out.print(f"policy {p.name}: {f'cron {when.cron!r}' if when.cron else f'every {when.every}'}, "
                      f"{p.policy.source} -> {', '.join(p.policy.destinations)}", markup=False)
        if ws.schedules:
            out.print(f"{len(loaded)} schedules OK", markup=False)
        if ws.policies:
            out.print(f"{len(timed)} scheduled policies OK", markup=False)
        if not (ws.schedules or ws.policies):
            out.print("no schedules or policy file given", markup=False)
        return
    if not (ws.schedules or ws.policies):
        err.print("mcbridge: warning: no schedules or policy file (--schedules, --policies, BRIDGE_SCHEDULES, "
                  "BRIDGE_POLICIES): beat will send nothing", markup=False)
    _connect(ws)
    from bridge.config import load_settings
    from bridge.workers.app import app, configure
    configure(ws)
    # The state dir as every command resolves it ($MCBRIDGE_STATE_DIR, the settings file...):
    # it is the volume compose and k8s mount, so last run times survive a restart of beat.
    state_dir = Path(load_settings(environ=os.environ).transfer.state_dir)
    db = schedule_db or state_dir / f"beat-{ws.namespace}"
    db.parent.mkdir(parents=True, exist_ok=True)
    app.start(["beat", f"--schedule={db}", f"--loglevel={loglevel}"])


def _scheduled_policies(path: str):
    """The policies of a file that have a schedule; a bad file (or a cron Celery refuses) exits 2
    naming file, line and field."""
    from bridge.cli.policy import load_policies
    from bridge.workers.replicas import check_crons
    policies = load_policies(Path(path))
    problems = check_crons(policies)
    if problems:
        lines = {p.name: p.line for p in policies}
        for problem in problems:
            name = problem.split(".")[1]
            err.print(f"mcbridge: error: {path}:{lines.get(name, 1)}: {problem}", markup=False, soft_wrap=True)
        raise typer.Exit(2)
    return [p for p in policies if p.policy.schedule is not None]


# -- submit ------------------------------------------------------------------------------------

def _submit(fields: dict[str, Any], *, wait: bool, as_json: bool, quiet: bool, dry_run: bool,
            broker: str | None, max_cost: float | None = None, budget: str | None = None) -> None:
    from bridge.workers.specs import parse_spec
    # The flags mcbridge cp shares, by the function cp checks them with: refused here, in the
    # same words, rather than by a worker after the job was queued.
    fields.update(transfer_flags(chunk_size=fields.get("chunk_size"), store_checksums=fields.get("store_checksums"),
                                 bwlimit=fields.get("bwlimit"), route=fields.get("route"),
                                 profile=fields.get("profile")))
    for flag, name in (("--queue", "queue"), ("--prefix", "shard_prefix"), ("--shard-size", "shard_size"),
                       ("--row-group-size", "row_group_size")):
        given(flag, fields.get(name))
    given("--budget", budget)
    usd_amount("--max-cost", max_cost)
    spec = parse_spec({k: v for k, v in fields.items() if v is not None})
    estimate = _within_budget(spec, max_cost) if max_cost is not None or budget is not None else None
    ws = _ws(broker)
    if dry_run:
        from bridge.workers.executor import route
        summary = {"spec": spec.to_dict(), "queue": route(ws, spec)}
        if as_json:
            out.print_json(json.dumps(summary))
        else:
            out.print(f"would queue {spec.kind} {spec.source} -> {', '.join(spec.destinations)} on "
                      f"{summary['queue']}", markup=False)
        return
    client = _connect(ws)
    from bridge.workers.app import configure, service
    configure(ws)
    svc = service()
    queue = svc.route(spec)
    job_id = svc.submit(spec, budget=budget, estimate=estimate)
    if svc.jobs.state(job_id) == "awaiting-approval":
        from bridge.workers.budgets import Budgets
        b = Budgets(client, svc.keys)
        err.print(f"job {job_id} awaits approval: estimated ${estimate:.2f}, and budget {budget} has "
                  f"${b.spent(budget):.2f} of ${b.limit(budget):.2f} spent this month; run mcbridge jobs "
                  f"approve {job_id} (or cancel)", markup=False)
    if not _consumed(client, svc.keys, queue):
        err.print(f"mcbridge: warning: no live worker consumes queue {queue}; the job waits for one "
                  f"(mcbridge worker -Q {queue})", markup=False)
    if as_json and not wait:
        out.print_json(json.dumps({"id": job_id, "queue": queue, "spec": spec.to_dict()}))
    elif not as_json:
        out.print(job_id, markup=False)
        err.print(f"queued {spec.kind} job {job_id} on {queue}", markup=False)
    if wait:
        raise typer.Exit(_follow(svc.jobs, job_id, quiet=quiet, as_json=as_json))


def _within_budget(spec, max_cost: float | None) -> float:
    """Price the job before it is queued: an estimate above ``max_cost`` is refused (exit 1)."""
    from bridge.config import load_settings
    from bridge.costing import check_budget, total_cost
    from bridge.ops import job_usages
    settings = load_settings(profile=spec.profile)
    pack = None
    if spec.kind == "pack":
        pack = {"fmt": spec.shard_format or "tar", "prefix": spec.shard_prefix or "shard",
                "max_count": spec.max_count,
                "options": {"row_group_size": spec.row_group_size} if spec.row_group_size else {}}
        if spec.shard_size:
            pack["shard_size"] = spec.shard_size
    if spec.kind == "unpack":
        pack = {"prefix": spec.shard_prefix}
    usages = job_usages(spec.kind, spec.source, list(spec.destinations), settings, delete=bool(spec.deletes),
                        pack=pack, route=spec.route, filters=spec.selection())
    if max_cost is None:
        return total_cost(usages, settings)
    return check_budget(usages, settings, max_cost, f"{spec.kind} job")


def _consumed(client, keys, queue: str) -> bool:
    for name in client.scan_iter(match=keys.workers_pattern, count=100):
        raw = client.get(name)
        if raw and queue in json.loads(raw).get("queues", []):
            return True
    return False


def submit_cp(src: str, dst: str, include: IncludeOpt = None, exclude: ExcludeOpt = None, files_from: FilesFromOpt = None,
              min_size: MinSizeOpt = None, max_size: MaxSizeOpt = None, min_age: MinAgeOpt = None,
              max_age: MaxAgeOpt = None, concurrency: ConcOpt = None, chunk_size: ChunkOpt = None,
              store_checksums: StoreSumOpt = None, bwlimit: BwlimitOpt = None, profile: ProfileOpt = None, queue: QueueOpt = None,
              verify: VerifyOpt = "store", wait: WaitOpt = False, as_json: JsonOpt = False,
              quiet: QuietOpt = False, dry_run: DryOpt = False, max_cost: MaxCostOpt = None,
              budget: BudgetOpt = None, route: RouteOpt = None, broker: BrokerOpt = None) -> None:
    """Queue a copy of SRC to DST; prints the job id."""
    options = dict(locals())
    _submit(_fields("copy", options, destinations=[dst]), **_how(options))


def submit_sync(src: str, dst: str, delete: DeleteOpt = False, include: IncludeOpt = None, exclude: ExcludeOpt = None, files_from: FilesFromOpt = None,
              min_size: MinSizeOpt = None, max_size: MaxSizeOpt = None, min_age: MinAgeOpt = None,
              max_age: MaxAgeOpt = None, concurrency: ConcOpt = None,
                chunk_size: ChunkOpt = None, store_checksums: StoreSumOpt = None, bwlimit: BwlimitOpt = None, profile: ProfileOpt = None,
                queue: QueueOpt = None, verify: VerifyOpt = "store", wait: WaitOpt = False,
                as_json: JsonOpt = False, quiet: QuietOpt = False, dry_run: DryOpt = False,
                max_cost: MaxCostOpt = None, budget: BudgetOpt = None, route: RouteOpt = None,
                broker: BrokerOpt = None) -> None:
    """Queue a sync: make DST equal to SRC, sending only what is new or changed; prints the job id."""
    options = dict(locals())
    _submit(_fields("sync", options, destinations=[dst], delete=delete), **_how(options))


def submit_replicate(src: str, dsts: Annotated[list[str], typer.Argument(help="One or more destinations.")],
                     delete: Annotated[bool, typer.Option(
                         "--delete", help="Remove from each DST what SRC no longer has (as sync --delete; "
                         "default: keep it).")] = False,
                     include: IncludeOpt = None, exclude: ExcludeOpt = None, files_from: FilesFromOpt = None,
              min_size: MinSizeOpt = None, max_size: MaxSizeOpt = None, min_age: MinAgeOpt = None,
              max_age: MaxAgeOpt = None, concurrency: ConcOpt = None, chunk_size: ChunkOpt = None,
                     store_checksums: StoreSumOpt = None, bwlimit: BwlimitOpt = None, profile: ProfileOpt = None, queue: QueueOpt = None,
                     verify: VerifyOpt = "store", wait: WaitOpt = False, as_json: JsonOpt = False,
                     quiet: QuietOpt = False, dry_run: DryOpt = False, max_cost: MaxCostOpt = None,
                     budget: BudgetOpt = None, broker: BrokerOpt = None) -> None:
    """Queue a DR replication: keep every DST equal to SRC (sync, then verify), recording when
    each was last proven equal; prints the job id."""
    options = dict(locals())
    _submit(_fields("replicate", options, destinations=dsts, delete=delete), **_how(options))


def submit_pack(src: str, dst: str,
                shard_format: Annotated[ShardFormat, typer.Option("--format", "-f",
                                                                  help="tar (WebDataset) or parquet.")] = ShardFormat.tar,
                shard_size: Annotated[str, typer.Option("--shard-size", help="Target shard size.")] = "256MiB",
                max_count: Annotated[Optional[int], typer.Option("--max-count", min=1,
                                                                 help="At most N files per shard.")] = None,
                prefix: Annotated[str, typer.Option("--prefix", help="Shard names: PREFIX-000000.tar ...")] = "shard",
                row_group_size: Annotated[Optional[str], typer.Option("--row-group-size",
                                                                      help="Parquet: bytes per row group.")] = None,
                include: IncludeOpt = None, exclude: ExcludeOpt = None, files_from: FilesFromOpt = None,
              min_size: MinSizeOpt = None, max_size: MaxSizeOpt = None, min_age: MinAgeOpt = None,
              max_age: MaxAgeOpt = None, concurrency: ConcOpt = None, chunk_size: ChunkOpt = None, store_checksums: StoreSumOpt = None,
                bwlimit: BwlimitOpt = None, profile: ProfileOpt = None, queue: QueueOpt = None, verify: VerifyOpt = "store",
                wait: WaitOpt = False, as_json: JsonOpt = False, quiet: QuietOpt = False, dry_run: DryOpt = False,
                max_cost: MaxCostOpt = None, budget: BudgetOpt = None, broker: BrokerOpt = None) -> None:
    """Queue packing the files under SRC into shards at DST (as mcbridge pack), one task per
    shard; prints the job id."""
    options = dict(locals())
    shard_format = str(shard_format)
    if shard_format != "parquet":
        refuse_unused(f"to {shard_format} shards (parquet only)", **{"--row-group-size": row_group_size})
    _submit(_fields("pack", options, destinations=[dst], shard_format=shard_format, shard_size=shard_size,
                    max_count=max_count, shard_prefix=prefix, row_group_size=row_group_size), **_how(options))


def submit_unpack(src: str, dst: str,
                  prefix: Annotated[Optional[str], typer.Option(
                      "--prefix", help="Which shard set, when the root holds several.")] = None,
                  concurrency: ConcOpt = None, profile: ProfileOpt = None, queue: QueueOpt = None,
                  verify: VerifyOpt = "store", wait: WaitOpt = False, as_json: JsonOpt = False,
                  quiet: QuietOpt = False, dry_run: DryOpt = False, max_cost: MaxCostOpt = None,
                  budget: BudgetOpt = None, broker: BrokerOpt = None) -> None:
    """Queue restoring the shard set at SRC into DST (as mcbridge unpack), one task per shard;
    prints the job id."""
    options = dict(locals(), chunk_size=None, store_checksums=None, bwlimit=None)
    _submit(_fields("unpack", options, destinations=[dst], shard_prefix=prefix), **_how(options))


def submit_migrate(src: str, dst: str,
                   pack: Annotated[Optional[ShardFormat], typer.Option(
                       "--pack", help="Pack into tar (WebDataset) or parquet shards on the way; "
                       "without it, a plain copy.")] = None,
                   shard_size: Annotated[Optional[str], typer.Option(
                       "--shard-size", help="Target shard size (default 256MiB).")] = None,
                   max_count: Annotated[Optional[int], typer.Option("--max-count", min=1,
                                                                    help="At most N files per shard.")] = None,
                   prefix: Annotated[Optional[str], typer.Option(
                       "--prefix", help="Shard names: PREFIX-000000.tar ... (default shard)")] = None,
                   include: IncludeOpt = None, exclude: ExcludeOpt = None, files_from: FilesFromOpt = None,
              min_size: MinSizeOpt = None, max_size: MaxSizeOpt = None, min_age: MinAgeOpt = None,
              max_age: MaxAgeOpt = None, 
                   concurrency: ConcOpt = None, chunk_size: ChunkOpt = None, store_checksums: StoreSumOpt = None,
                   bwlimit: BwlimitOpt = None, profile: ProfileOpt = None, queue: QueueOpt = None, verify: VerifyOpt = "store",
                   wait: WaitOpt = False, as_json: JsonOpt = False, quiet: QuietOpt = False,
                   dry_run: DryOpt = False, max_cost: MaxCostOpt = None, budget: BudgetOpt = None,
                   route: RouteOpt = None, broker: BrokerOpt = None) -> None:
    """Queue a corpus migration (as mcbridge migrate): with --pack, packed into shards on the
    way, one task per shard; without, a copy. Prints the job id."""
    options = dict(locals())
    if pack is None:
        refuse_unused("without --pack", **{"--shard-size": shard_size, "--max-count": max_count, "--prefix": prefix})
        _submit(_fields("copy", options, destinations=[dst]), **_how(options))
        return
    _submit(_fields("pack", options, destinations=[dst], shard_format=str(pack), shard_size=shard_size or "256MiB",
                    max_count=max_count, shard_prefix="shard" if prefix is None else prefix, row_group_size=None),
            **_how(options))


def _fields(kind: str, options: dict[str, Any], **extra: Any) -> dict[str, Any]:
    names = ("concurrency", "chunk_size", "store_checksums", "bwlimit", "profile", "queue", "verify")
    if kind not in ("copy", "sync"):
        refuse_unused(f"to a {kind} job", **{"--route": options.get("route")})
    routed = {"route": options["route"]} if options.get("route") is not None else {}
    # The filters travel in the spec (a --files-from list read here), so that workers select what
    # mcbridge cp would select here.
    filters = filters_from_flags(*(options.get(n) for n in ("include", "exclude", "files_from", "min_size",
                                                           "max_size", "min_age", "max_age")))
    selected = {"filters": filters.to_dict()} if filters is not None else {}
    plain = {n: str(options[n]) if isinstance(options[n], enum.Enum) else options[n] for n in names}
    return {"kind": kind, "source": options["src"], **plain, **routed, **selected, **extra}


def _how(options: dict[str, Any]) -> dict[str, Any]:
    return {n: options[n] for n in ("wait", "as_json", "quiet", "dry_run", "broker", "max_cost", "budget")}


# -- following a job ---------------------------------------------------------------------------

def _totals(jobs, record) -> dict[str, int]:
    """Progress of a job, or the sum of its children's for a replication."""
    records = [c for c in (jobs.get(child) for child in record.children) if c] if record.children else [record]
    keys = ("bytes_total", "bytes_done", "bytes_skipped", "files_total", "files_done", "tasks_total", "tasks_done")
    return {k: sum(r.counters.get(k, 0) for r in records) for k in keys}


def _summary_line(jobs, record) -> str:
    t = _totals(jobs, record)
    if record.state == "succeeded":
        moved = t["bytes_done"] - t["bytes_skipped"]
        line = (f"job {record.id} succeeded: {t['files_total']} files, {human_bytes(t['bytes_total'])} "
                f"({human_bytes(moved)} sent) in {record.elapsed:.1f}s")
        return line + (f"; manifest {record.manifest}" if record.manifest else "")
    if record.state == "failed":
        first = record.errors[0] if record.errors else "see mcbridge jobs status"
        more = record.counters.get("error_count", 0) - 1
        return f"job {record.id} failed: {first}" + (f" (and {more} more)" if more > 0 else "")
    return f"job {record.id} {record.state}"


def _follow(jobs, job_id: str, *, quiet: bool = False, as_json: bool = False, interval: float = 0.2) -> int:
    """Follow a job to its end with a progress bar (or state lines); 0 only if it succeeded."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
    from bridge.workers.jobs import TERMINAL
    bar_on = not quiet and not as_json and err.is_terminal
    bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                   console=err, disable=not bar_on)
    task = bar.add_task("queued", total=None)
    last_state = None
    with bar:
        while True:
            record = jobs.get(job_id)
            if record is None:
                raise _no_job(job_id)
            t = _totals(jobs, record)
            bar.update(task, total=t["bytes_total"] or None, completed=min(t["bytes_done"], t["bytes_total"]),
                       description=f"{record.state} {t['files_done']}/{t['files_total']} files")
            if record.state != last_state and not bar_on and not quiet and not as_json:
                err.print(f"job {job_id}: {record.state}", markup=False)
            last_state = record.state
            if record.state in TERMINAL:
                break
            time.sleep(interval)
    if as_json:
        out.print_json(json.dumps(_status_doc(jobs, record)))
    else:
        out.print(_summary_line(jobs, record), markup=False)
    return 0 if record.state == "succeeded" else 1


def usd_text(usd: float) -> str:
    """Dollars to the cent, or to six places when less than a cent (a small job's requests)."""
    return f"{usd:.2f}" if usd >= 0.01 or usd == 0 else f"{usd:.6f}"


def _no_job(job_id: str):
    from bridge.errors import InvalidOption
    return InvalidOption(f"no job {job_id!r} (it never existed, or its record expired)")


def _status_doc(jobs, record) -> dict[str, Any]:
    doc = record.to_dict()
    if record.children:
        doc["children"] = [c.to_dict() for c in (jobs.get(child) for child in record.children) if c]
    # A policy run proves each checkpoint on its own (doc["replicas"]), not the source root.
    if (record.kind == "replicate" and not record.policy) or (record.kind == "sync" and record.spec.get("delete")):
        doc["proven_equal"] = jobs.proven(record.spec["source"], record.spec["destinations"])
    return doc


# -- jobs ----------------------------------------------------------------------------------------

def jobs_list(state: Annotated[Optional[str], typer.Option("--state", help="Only jobs in this state "
                                                            "(or 'active').")] = None,
              limit: Annotated[int, typer.Option("--limit", min=1)] = 30, as_json: JsonOpt = False,
              broker: BrokerOpt = None) -> None:
    """The most recent jobs, newest first."""
    from bridge.errors import InvalidOption
    from bridge.workers.jobs import ACTIVE, STATES
    if state and state != "active" and state not in STATES:
        raise InvalidOption(f"--state {state!r}: use one of {', '.join(STATES)} or active")
    jobs = _jobs(_ws(broker))
    records = jobs.list(limit, ACTIVE if state == "active" else ((state,) if state else None))
    if as_json:
        out.print_json(json.dumps([r.to_dict() for r in records]))
        return
    if not records:
        out.print("no jobs", markup=False)
        return
    out.print(f"{'ID':<14} {'KIND':<9} {'STATE':<10} {'PROGRESS':>22} {'USD':>9} {'CREATED':<20} ROUTE", markup=False)
    for r in records:
        t = _totals(jobs, r)
        pct = f"{100 * min(t['bytes_done'], t['bytes_total']) / t['bytes_total']:.0f}%" if t["bytes_total"] else "-"
        progress = f"{human_bytes(min(t['bytes_done'], t['bytes_total']))} {pct}"
        route = f"{r.spec['source']} -> {', '.join(r.spec['destinations'])}"
        tag = f" [{r.schedule}]" if r.schedule else ""
        usd = usd_text(r.spent_usd) if r.spent_usd is not None else f"~{usd_text(r.estimate_usd)}" if r.estimate_usd else "-"
        out.print(f"{r.id:<14} {r.kind:<9} {r.state:<10} {progress:>22} {usd:>9} {r.to_dict()['created']:<20} "
                  f"{route}{tag}", markup=False)
        for dst, row in (r.replicas or {}).items():
            out.print(f"{'':<14} {dst}: lag {row['lag_checkpoints']}, newest verified "
                      f"{row.get('newest_verified') or '-'}, ${usd_text(row['spent_usd'])}", markup=False)


def jobs_status(job_id: str, as_json: JsonOpt = False, broker: BrokerOpt = None) -> None:
    """Everything about one job: spec, state, progress, errors, verification."""
    jobs = _jobs(_ws(broker))
    record = jobs.get(job_id)
    if record is None:
        raise _no_job(job_id)
    doc = _status_doc(jobs, record)
    if as_json:
        out.print_json(json.dumps(doc))
        return
    t = _totals(jobs, record)
    p = doc["progress"]
    lines = [f"job {record.id}  {record.kind}  {record.state}" + (f"  (schedule {record.schedule})" if record.schedule else ""),
             f"  source       {record.spec['source']}",
             f"  destination  {', '.join(record.spec['destinations'])}",
             f"  queue        {record.queue}" + (f"  profile {record.spec['profile']}" if record.spec.get("profile") else ""),
             f"  created      {doc['created']}  started {doc['started'] or '-'}  finished {doc['finished'] or '-'}"]
    pct = f" ({100 * min(t['bytes_done'], t['bytes_total']) / t['bytes_total']:.0f}%)" if t["bytes_total"] else ""
    lines.append(f"  progress     {human_bytes(min(t['bytes_done'], t['bytes_total']))} of {human_bytes(t['bytes_total'])}{pct}, "
                 f"{t['files_done']}/{t['files_total']} files, {t['tasks_done']}/{t['tasks_total']} tasks, "
                 f"{human_bytes(p['rate_bytes_per_s'])}/s")
    lines.append(f"  recovery     {p['retries']} retried requests, {p['requeued']} tasks requeued from lost workers")
    if doc.get("route"):
        r = doc["route"]
        fell = f", {r['fallbacks']} files sent direct" if r["fallbacks"] else ""
        lines.append(f"  route        {r['name']}: {r['why']}; {human_bytes(r['bytes_through_bridge'])} through "
                     f"bridge{fell}")
    if record.manifest:
        lines.append(f"  manifest     {record.manifest}")
    if record.verify and record.verify.get("mode") != "none":
        v = record.verify
        verdict = "OK" if v.get("ok") else "FAILED"
        lines.append(f"  verified     {verdict} ({v['mode']}): {v['checked']} files, {v['missing']} missing, "
                     f"{v['mismatched']} mismatched, {v['extra']} extra, at {v['at']}")
    if record.spent_usd is not None or record.estimate_usd is not None:
        spent = f"${usd_text(record.spent_usd)} spent" if record.spent_usd is not None else "not priced yet"
        est = f" (estimated ${usd_text(record.estimate_usd)})" if record.estimate_usd is not None else ""
        lines.append(f"  cost         {spent}{est}" + (f", budget {record.budget}" if record.budget else ""))
    for child in doc.get("children", []):
        spent = f", ${usd_text(child['spent_usd'])}" if child.get("spent_usd") is not None else ""
        lines.append(f"  -> {child['spec']['destinations'][0]}  {child['state']}  (job {child['id']}{spent})")
    for dst, row in (record.replicas or {}).items():
        verified = f"{row['newest_verified']} verified {row['verified_at']}" if row.get("newest_verified") else "nothing verified"
        lines.append(f"  replica      {dst}: {verified}; lag {row['lag_checkpoints']} checkpoints; "
                     f"${usd_text(row['spent_usd'])}" + (f"; removed {', '.join(row['removed'])}" if row.get("removed") else ""))
    for dst, proof in (doc.get("proven_equal") or {}).items():
        proof = proof or {}
        when = f"{proof['proven_at']} (job {proof['job']})" if proof.get("proven_at") else "never"
        if proof.get("synced_at"):
            how = f"verify {proof['verify']}" + (", extra files kept" if proof.get("keeps_extra") else "")
            when += f"; last synced {proof['synced_at']} (job {proof['synced_job']}, {how})"
        lines.append(f"  proven equal {dst}: {when}")
    if record.errors:
        lines.append(f"  errors ({doc['error_count']}):")
        lines += [f"    {e}" for e in record.errors[:10]]
    for line in lines:
        out.print(line, markup=False)


def jobs_watch(job_id: str, quiet: QuietOpt = False, as_json: JsonOpt = False, broker: BrokerOpt = None) -> None:
    """Follow a job to its end; exit 0 only if it succeeded."""
    raise typer.Exit(_follow(_jobs(_ws(broker)), job_id, quiet=quiet, as_json=as_json))


def jobs_cancel(job_id: str, broker: BrokerOpt = None) -> None:
    """Stop a job: no more units start, its unfinished uploads are aborted, no manifest is written."""
    jobs = _jobs(_ws(broker))
    cancelled, state = jobs.cancel(job_id)
    if state is None:
        raise _no_job(job_id)
    if not cancelled:
        err.print(f"mcbridge: job {job_id} is {state}; it can no longer be cancelled", markup=False)
        raise typer.Exit(1)
    out.print(f"cancelled job {job_id} (it was {state})", markup=False)


def jobs_limit(job_id: str, rate: Annotated[str, typer.Argument(help="Bytes per second, e.g. 50MiB; 0 or off: none.")],
               broker: BrokerOpt = None) -> None:
    """Change a job's bandwidth limit while it runs; all of its workers follow within seconds."""
    from bridge.config import parse_rate
    from bridge.workers.jobs import TERMINAL
    from bridge.workers.limits import set_limit
    if not rate.strip():
        from bridge.errors import InvalidOption
        raise InvalidOption("RATE is empty: give bytes per second (e.g. 50MiB), or 0 or off for no limit")
    value = parse_rate(rate)
    jobs = _jobs(_ws(broker))
    record = jobs.get(job_id)
    if record is None:
        raise _no_job(job_id)
    if record.state in TERMINAL:
        err.print(f"mcbridge: job {job_id} is {record.state}; there is nothing left to limit", markup=False)
        raise typer.Exit(1)
    for target in (job_id, *record.children):  # a replication's destinations run as jobs of their own
        set_limit(jobs.r, jobs.keys, target, value)
    out.print(f"job {job_id}: bandwidth limit {human_bytes(value) + '/s' if value else 'off'}", markup=False)


def jobs_approve(job_id: str, broker: BrokerOpt = None) -> None:
    """Queue a job that waits for approval because it would pass its monthly budget."""
    ws = _ws(broker)
    _connect(ws)
    from bridge.workers.app import configure, service
    configure(ws)
    approved, state = service().approve(job_id)
    if state is None:
        raise _no_job(job_id)
    if not approved:
        err.print(f"mcbridge: job {job_id} is {state}, not awaiting approval", markup=False)
        raise typer.Exit(1)
    out.print(f"approved job {job_id}: queued", markup=False)


def budgets_set(name: Annotated[str, typer.Argument(help="Budget name, e.g. a policy's.")],
                usd: Annotated[float, typer.Argument(min=0, help="Monthly limit in US dollars.")],
                broker: BrokerOpt = None) -> None:
    """Set the monthly limit of a budget; jobs submitted with --budget NAME are held above it."""
    from bridge.workers.budgets import Budgets, check
    from bridge.workers.keys import Keys
    check(name, usd)
    ws = _ws(broker)
    Budgets(_connect(ws), Keys(ws.namespace)).set(name, usd)
    out.print(f"budget {name}: ${usd:.2f} a month", markup=False)


def budgets_list(as_json: JsonOpt = False, broker: BrokerOpt = None) -> None:
    """Each budget's monthly limit and what was spent this month."""
    from bridge.workers.budgets import Budgets, month
    from bridge.workers.keys import Keys
    ws = _ws(broker)
    rows = Budgets(_connect(ws), Keys(ws.namespace)).all()
    if as_json:
        out.print_json(json.dumps({"month": month(), "budgets": rows}))
        return
    for name, row in rows.items():
        cap = f"${row['limit_usd']:.2f}" if row["limit_usd"] is not None else "no limit"
        out.print(f"{name}: ${row['spent_usd']:.2f} spent in {month()} of {cap}", markup=False)


# -- what the CLI's other groups ask of the service -------------------------------------------------

def submit_warm(node: str, items: list[str], *, profile: str | None = None, lookahead: int | None = None,
                wait: bool = False, broker: str | None = None, timeout: float | None = None) -> dict[str, Any]:
    """Queue a warm on ``node``'s queue; with ``wait``, the worker's summary (errors raised as one line)."""
    from bridge.errors import BridgeError
    from bridge.urls import parse
    from bridge.workers.app import app, configure
    from bridge.workers.cache_tasks import WARM, node_queue
    from bridge.workers.keys import Keys
    for item in items:
        parse(item)   # a bad URL is refused here, before anything is queued
    ws = _ws(broker)
    queue = node_queue(ws.queue_prefix, node)
    client = _connect(ws)
    configure(ws)
    if not _consumed(client, Keys(ws.namespace), queue):
        err.print(f"mcbridge: warning: no live worker consumes queue {queue}; the warm waits for one "
                  f"(mcbridge worker -Q {queue} on {node})", markup=False)
    result = app.send_task(WARM, args=[list(items), profile, lookahead], queue=queue)
    summary: dict[str, Any] = {"task_id": result.id, "queue": queue, "node": node}
    if wait:
        try:
            summary["result"] = result.get(timeout=timeout, propagate=True)
        except BridgeError:
            raise
        except Exception as exc:  # the worker's error, re-raised by Celery under its own type name
            raise BridgeError(f"cache warm on {node} failed: {type(exc).__name__}: {exc}") from None
    return summary


def policy_status(file: Annotated[Optional[Path], typer.Argument(
                      help="The policy file (default: $BRIDGE_POLICIES).")] = None,
                  name: Annotated[Optional[str], typer.Option("--name", help="Only this policy.")] = None,
                  as_json: JsonOpt = False, profile: LocalProfileOpt = None, config: ConfigOpt = None,
                  broker: Annotated[Optional[str], typer.Option(
                      "--broker", help="Redis URL of the service (default: $BRIDGE_BROKER_URL).")] = None) -> None:
    """Per policy and destination, as the service last ran it: last run, newest checkpoint
    verified there and when, lag behind the source (listed now), and this month's spend
    against the policy's budget."""
    from bridge.errors import BridgeError, InvalidOption
    from bridge.policies import replication as rules
    from bridge.policies.replication import select
    from bridge.workers.budgets import Budgets, month
    from bridge.workers.keys import Keys
    from bridge.workers.replicas import PolicyState
    from bridge.cli.policy import load_policies
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
            from bridge.replication import survey
            readiness = survey(p.policy, settings)
            source_now, listed, waiting = rules.committed(readiness), None, rules.waiting(readiness)
        except BridgeError as exc:
            source_now, listed, waiting = None, str(exc), {}
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
                         "spent_usd": round(spend.get(dst, 0.0), 9), "errors": row.get("errors", [])})
        report.append({"name": p.name, "source": p.policy.source, "source_error": listed,
                       "budget_usd": budgets.limit(p.name), "spent_usd": round(budgets.spent(p.name), 9),
                       "max_cost_usd": p.policy.max_cost_usd, "waiting": waiting, "destinations": rows})
    if as_json:
        out.print_json(json.dumps({"month": month(), "policies": report}))
        return
    for p in report:
        cap = f"${p['budget_usd']:.2f}" if p["budget_usd"] is not None else "no monthly budget"
        out.print(f"{p['name']}: {p['source']}: ${usd_text(p['spent_usd'])} spent in {month()} of {cap}", markup=False)
        if p["source_error"]:
            err.print(f"mcbridge: {p['name']}: source not listed: {p['source_error']}", markup=False, soft_wrap=True)
        for ckpt, why in p["waiting"].items():
            out.print(f"  {ckpt} waiting: {why}", markup=False)
        for row in p["destinations"]:
            if row["last_run"] is None:
                out.print(f"  {row['destination']}: never run by the service", markup=False)
                continue
            verified = (f"{row['newest_verified']} verified {row['verified_at']}" if row["newest_verified"]
                        else "nothing verified yet")
            if row["newest_verified"] and row["commit_to_verified_s"] is not None:
                verified += f", {row['commit_to_verified_s']}s after its commit"
            lag = row["lag_checkpoints"]
            behind = "up to date" if lag == 0 else f"{lag} checkpoint{'s' if lag != 1 else ''} behind {row['newest_source']}"
            out.print(f"  {row['destination']}: last run {row['last_run']} (job {row['job']}, "
                      f"{'ok' if row['ok'] else 'FAILED'}); {verified}; {behind}; ${usd_text(row['spent_usd'])} this month",
                      markup=False)
            for problem in row["errors"]:
                out.print(f"    {problem}", markup=False)


def register(app: typer.Typer) -> None:
    app.command("worker")(worker)
    app.command("beat")(beat)
    submit = typer.Typer(no_args_is_help=True, help="Queue a job for the workers and print its id.")
    submit.command("cp")(submit_cp)
    submit.command("sync")(submit_sync)
    submit.command("replicate")(submit_replicate)
    submit.command("pack")(submit_pack)
    submit.command("migrate")(submit_migrate)
    submit.command("unpack")(submit_unpack)
    app.add_typer(submit, name="submit")
    jobs = typer.Typer(no_args_is_help=True, help="Jobs queued for the workers: list, status, watch, cancel.")
    jobs.command("list")(jobs_list)
    jobs.command("status")(jobs_status)
    jobs.command("watch")(jobs_watch)
    jobs.command("cancel")(jobs_cancel)
    jobs.command("limit")(jobs_limit)
    jobs.command("approve")(jobs_approve)
    budgets = typer.Typer(no_args_is_help=True, help="Monthly budgets of the service: set, list.")
    budgets.command("set")(budgets_set)
    budgets.command("list")(budgets_list)
    app.add_typer(budgets, name="budgets")
    app.add_typer(jobs, name="jobs")

