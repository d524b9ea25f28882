"""The service's commands: ``mcbridge worker|beat``, ``mcbridge submit cp|sync|replicate|pack|migrate|unpack``,
``mcbridge jobs list|status|watch|cancel|limit|approve|audit``, ``mcbridge service init|add-tenant``.

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

from bridge.cli.options import RUN, ConfigOpt, settings_from_flags
from bridge.cli.options import ProfileOpt as LocalProfileOpt
from bridge.cli.options import (DeleteOpt, ExcludeOpt, FilesFromOpt, IncludeOpt, JsonOpt, MaxAgeOpt, MaxSizeOpt,
                                MinAgeOpt, MinSizeOpt, QuietOpt, ShardFormat, VerifyMode, bwlimit_opt, chunk_size_opt,
                                concurrency_opt, dry_run_opt, err, filters_from_flags, given, max_cost_opt, out,
                                profile_opt, refuse_unused, route_opt, size_flag, store_checksums_opt, transfer_flags,
                                usd_amount)
from bridge.cli.options import Sha256Opt
from bridge.cli.placement import (AdoptOpt, BucketKeyOpt, ChecksumOpt, ContentTypeOpt, KmsKeyOpt, MetadataOpt,
                                  NoMetadataOpt, ScopeOpt, SkipExistingOpt, StorageClassOpt)
from bridge import money
from bridge.money import usd
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
# `submit --budget` when the job is held over its budget: not a failure, not queued either.
AWAITING_APPROVAL = 3
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
    warning = broker_warning(ws.broker_url)
    if warning:
        err.print(f"mcbridge: warning: {warning}", markup=False, soft_wrap=True)
    _check_gate(ws)
    _connect(ws)
    from bridge.workers.app import app, configure
    configure(ws)
    argv = ["worker", f"--loglevel={loglevel}", f"--pool={pool}", f"--queues={queues or ','.join(ws.default_queues())}"]
    if concurrency:
        argv.append(f"--concurrency={concurrency}")
    if hostname:
        argv.append(f"--hostname={hostname}")
    app.worker_main(argv)


def broker_warning(url: str) -> str | None:
    """What is wrong with a broker that anyone on the network can reach: no password, not on this machine."""
    import ipaddress
    from urllib.parse import urlsplit
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or parts.password:
        return None   # unix sockets are this machine's
    host = parts.hostname or "localhost"
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return None
    return (f"the broker {_safe_url(url)} has no password and is not on this machine: whoever reaches it can "
            f"queue and cancel jobs and read their records; give Redis a password (requirepass, then "
            f"redis://:PASSWORD@HOST:PORT/DB) and TLS (rediss://), see deploy/README.md")


def _check_gate(ws) -> None:
    """A worker's keys and service policy, read now so that a bad file is one line at start; without
    them it starts, but runs no job (it says so)."""
    from bridge.workers.auth import Keyring
    keyring = Keyring.load(ws)
    if ws.service_policy:
        from bridge.cli.policy import load_service_policy
        load_service_policy(Path(ws.service_policy))
    if not keyring.keys or not ws.service_policy:
        missing = " and ".join(name for name, given in (("tenant keys (BRIDGE_KEYS_FILE)", keyring.keys),
                                                        ("service policy (BRIDGE_SERVICE_POLICY)", ws.service_policy))
                               if not given)
        err.print(f"mcbridge: warning: no {missing}: this worker refuses every job; run mcbridge service init",
                  markup=False, soft_wrap=True)
    if not ws.local_roots:
        err.print("mcbridge: note: BRIDGE_LOCAL_ROOTS is not set: this worker reads and writes no local path",
                  markup=False, soft_wrap=True)


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
    from bridge.workers.auth import Keyring
    if ws.schedules or ws.policies:
        Keyring.load(ws).signer()   # beat signs what it sends: refused here, not by every worker later
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
    # The flags mcbridge cp shares, and this process's settings (its environment, its settings
    # file), by the function cp checks them with: refused here, in the same words, rather than
    # by a worker after the job was queued. The profile is the workers' to resolve.
    settings_from_flags(None, None, fields.get("concurrency"), fields.get("chunk_size"), fields.get("store_checksums"),
                        bwlimit=fields.get("bwlimit"), route=fields.get("route"), local_dirs=False)
    fields.update(transfer_flags(chunk_size=fields.get("chunk_size"), store_checksums=fields.get("store_checksums"),
                                 bwlimit=fields.get("bwlimit"), route=fields.get("route"),
                                 profile=fields.get("profile")))
    for flag, name in (("--queue", "queue"), ("--prefix", "shard_prefix"), ("--shard-size", "shard_size"),
                       ("--row-group-size", "row_group_size")):
        given(flag, fields.get(name))
    for flag, name in (("--shard-size", "shard_size"), ("--row-group-size", "row_group_size")):
        if fields.get(name) is not None:   # as mcbridge pack checks them: a shard of nothing cannot be cut
            size_flag(flag, fields[name])
    given("--budget", budget)
    usd_amount("--max-cost", max_cost)
    if RUN.get("manifest_dir"):   # the global --manifest-dir: the workers keep local records there too
        fields["manifest_dir"] = os.path.abspath(os.path.expanduser(RUN["manifest_dir"]))
    spec = parse_spec({k: v for k, v in fields.items() if v is not None})
    estimate = _within_budget(spec, max_cost) if max_cost is not None or budget is not None else None
    ws = _ws(broker)
    if ws.service_policy:
        _looks_like_a_service_policy(Path(ws.service_policy))
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
    svc = _submitter(ws, client)
    queue = svc.route(spec)
    job_id = svc.submit(spec, budget=budget, estimate=estimate)
    if svc.jobs.state(job_id) == "awaiting-approval":
        # Held, not queued: the id on stdout (to approve or cancel it), why on stderr, exit 3.
        from bridge.workers.budgets import Budgets
        b = Budgets(client, svc.keys)
        if as_json:
            out.print_json(json.dumps({"id": job_id, "state": "awaiting-approval", "queue": queue,
                                       "estimate_usd": money.usd_number(estimate or 0.0), "spec": spec.to_dict()}))
        else:
            out.print(job_id, markup=False)
        err.print(f"job {job_id} awaits approval: estimated {usd(estimate or 0.0)}, and budget {budget} has "
                  f"{usd(b.spent(budget) + b.reserved(budget))} of {usd(b.limit(budget) or 0.0)} spent or held by "
                  f"admitted jobs this month; run mcbridge jobs approve {job_id} (or cancel)", markup=False,
                  soft_wrap=True)
        raise typer.Exit(AWAITING_APPROVAL)
    if not _consumed(client, svc.keys, queue):
        err.print(f"mcbridge: warning: no live worker consumes queue {queue}; the job waits for one "
                  f"(mcbridge worker -Q {queue})", markup=False)
    if as_json and not wait:
        out.print_json(json.dumps({"id": job_id, "state": "queued", "queue": queue, "spec": spec.to_dict()}))
    elif not as_json:
        out.print(job_id, markup=False)
        err.print(f"queued {spec.kind} job {job_id} on {queue}", markup=False)
    if wait:
        raise typer.Exit(_follow(svc.jobs, job_id, quiet=quiet, as_json=as_json))


def _looks_like_a_service_policy(path: Path) -> None:
    """The service policy workers on this machine would read (BRIDGE_SERVICE_POLICY, else the
    service directory's): a worker given one that is no policy refuses every job, so a submit is
    refused first. Only a look (readable text, with tenants:), not a load: a policy is checked by
    pydantic, which a submit does not import (~0.15 s of its start); each worker loads it, and
    mcbridge policy check names every mistake."""
    import re

    from bridge.config import read_text_file
    from bridge.errors import InvalidOption
    text = read_text_file(path, "service policy (BRIDGE_SERVICE_POLICY)")
    if not re.search(r"^tenants\s*:", text, re.MULTILINE):   # as bridge.policies.tenants.is_service_policy
        raise InvalidOption(f"service policy (BRIDGE_SERVICE_POLICY) {path}: no tenants: in it, so it is no service "
                            f"policy; see mcbridge policy check")


def _submitter(ws, client):
    """The service as a submitter uses it: the plan task's message pushed onto its queue as
    Celery would push it (workers/broker.py), without importing Celery. With task events on,
    Flower sees the plan task from its receipt by a worker on, not from a task-sent event."""
    from bridge.workers.broker import direct_publisher
    from bridge.workers.executor import Service
    return Service(ws, client, direct_publisher(client, ws.key_prefix))


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
              budget: BudgetOpt = None, route: RouteOpt = None, broker: BrokerOpt = None,
              content_type: ContentTypeOpt = None, metadata: MetadataOpt = None, no_metadata: NoMetadataOpt = False,
              storage_class: StorageClassOpt = None, kms_key: KmsKeyOpt = None, bucket_key: BucketKeyOpt = None,
              encryption_scope: ScopeOpt = None, skip_existing: SkipExistingOpt = False, checksum: ChecksumOpt = False,
              adopt: AdoptOpt = None, sha256: Sha256Opt = False) -> None:
    """Queue a copy of SRC to DST; prints the job id."""
    options = dict(locals())
    _submit(_fields("copy", options, destinations=[dst], **_written(options, dst)), **_how(options))


def submit_sync(src: str, dst: str, delete: DeleteOpt = False, include: IncludeOpt = None, exclude: ExcludeOpt = None, files_from: FilesFromOpt = None,
              min_size: MinSizeOpt = None, max_size: MaxSizeOpt = None, min_age: MinAgeOpt = None,
              max_age: MaxAgeOpt = None, concurrency: ConcOpt = None,
                chunk_size: ChunkOpt = None, store_checksums: StoreSumOpt = None, bwlimit: BwlimitOpt = None, profile: ProfileOpt = None,
                queue: QueueOpt = None, verify: VerifyOpt = "store", wait: WaitOpt = False,
                as_json: JsonOpt = False, quiet: QuietOpt = False, dry_run: DryOpt = False,
                max_cost: MaxCostOpt = None, budget: BudgetOpt = None, route: RouteOpt = None,
                broker: BrokerOpt = None,
                content_type: ContentTypeOpt = None, metadata: MetadataOpt = None, no_metadata: NoMetadataOpt = False,
                storage_class: StorageClassOpt = None, kms_key: KmsKeyOpt = None, bucket_key: BucketKeyOpt = None,
                encryption_scope: ScopeOpt = None, adopt: AdoptOpt = None, sha256: Sha256Opt = False) -> None:
    """Queue a sync: make DST equal to SRC, sending only what is new or changed; prints the job id."""
    options = dict(locals())
    _submit(_fields("sync", options, destinations=[dst], delete=delete, **_written(options, dst)), **_how(options))


def _written(options: dict[str, Any], dst: str) -> dict[str, Any]:
    """The spec's fields for what a copy or sync writes besides the bytes, and how it takes over
    objects already there: the flags of mcbridge cp and sync, checked here as cp checks them (a
    class or key the destination's store has not is refused before the job is queued)."""
    from bridge.attributes import parse_pairs
    from bridge.cli.placement import adopt_mode, with_object_flags
    from bridge.config import load_settings
    placed = {k: options[k] for k in ("storage_class", "kms_key", "bucket_key", "encryption_scope")
              if options.get(k) is not None}
    flags = {k: options.get(k) for k in ("content_type", "metadata", "no_metadata")}
    with_object_flags(load_settings(environ={}), dst, **flags, **placed)
    objects: dict[str, Any] = {}
    if options.get("no_metadata"):
        objects["metadata"] = "off"
    if options.get("content_type") is not None:
        objects["content_type"] = options["content_type"]
    if options.get("metadata"):
        objects["set_metadata"] = parse_pairs(options["metadata"])
    adopt = adopt_mode(options.get("adopt"), options.get("skip_existing", False), options.get("checksum", False),
                       default=None)
    return {**({"placement": {dst: placed}} if placed else {}), **({"objects": objects} if objects else {}),
            **({"adopt": adopt} if adopt is not None else {}), **({"sha256": True} if options.get("sha256") else {})}


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


END_GRACE = 5.0   # seconds a follower waits, after a job's end, for its worker to announce it


def _follow(jobs, job_id: str, *, quiet: bool = False, as_json: bool = False, interval: float = 0.5) -> int:
    """Follow a job to its end with a progress bar (or state lines); 0 only if it succeeded.
    The record is read every ``interval`` seconds for the bar, and at once when the job's end is
    announced (``Jobs.following``)."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
    from bridge.workers.jobs import TERMINAL
    bar_on = not quiet and not as_json and err.is_terminal
    bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                   console=err, disable=not bar_on)
    task = bar.add_task("queued", total=None)
    last_state = None
    ended_at: float | None = None
    with bar, jobs.following(job_id) as wait:
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
                # ended; its worker announces it once it is priced (what it spent is then in the
                # record): a short wait for that, whose timeout covers a worker that died between
                if jobs.announced(job_id):
                    record = jobs.get(job_id) or record   # read again: complete now
                    break
                if ended_at is None:
                    ended_at = time.monotonic()
                elif time.monotonic() - ended_at > END_GRACE:
                    break
                wait(min(interval, END_GRACE))
                continue
            wait(interval)
    if as_json:
        out.print_json(json.dumps(_status_doc(jobs, record)))
    else:
        out.print(_summary_line(jobs, record), markup=False)
    return 0 if record.state == "succeeded" else 1


def metered_text(spent: float | None, metered: dict[str, Any] | None) -> str:
    """What ran, side by side with the estimate: metered requests per store and kind, retried
    answers included, and their price."""
    price = f"{usd(spent)} spent" if spent is not None else "not priced yet"
    if not metered:
        return f"{price} (nothing metered)"
    stores = []
    for store, row in metered.items():
        kinds = ", ".join(f"{n} {kind}" for kind, n in row["requests"].items())
        failed = f"; {row['errors']} answered with an error" if row.get("errors") else ""
        stores.append(f"{store}: {kinds}{failed}")
    total = sum(sum(row["requests"].values()) for row in metered.values())
    return f"{price}, metered {total} requests ({'; '.join(stores)})"


def estimated_text(estimate: float | None, requests: int | None) -> str:
    if estimate is None:
        return "no estimate"
    return f"estimated {usd(estimate)}" + (f" for {requests} requests" if requests is not None else "")


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
        cost = usd(r.spent_usd) if r.spent_usd is not None else f"~{usd(r.estimate_usd)}" if r.estimate_usd else "-"
        out.print(f"{r.id:<14} {r.kind:<9} {r.state:<10} {progress:>22} {cost:>9} {r.to_dict()['created']:<20} "
                  f"{route}{tag}", markup=False)
        for dst, row in (r.replicas or {}).items():
            out.print(f"{'':<14} {dst}: lag {row['lag_checkpoints']}, newest verified "
                      f"{row.get('newest_verified') or '-'}, {usd(row['spent_usd'])}", markup=False)


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
             f"  queue        {record.queue}" + (f"  profile {record.spec['profile']}" if record.spec.get("profile") else "")
             + (f"  tenant {record.tenant}" if record.tenant else ""),
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
        verdict = "OK" if v.get("ok") else "NOT PROVEN" if v.get("unproven") and v.get("mismatched") == 0 \
            and v.get("missing") == 0 else "FAILED"
        unproven = f", {v['unproven']} unproven (verify --deep reads them)" if v.get("unproven") else ""
        lines.append(f"  verified     {verdict} ({v['mode']}): {v['checked']} files, {v['missing']} missing, "
                     f"{v['mismatched']} mismatched, {v['extra']} extra{unproven}, at {v['at']}")
    if record.spent_usd is not None or record.estimate_usd is not None or record.metered:
        lines.append(f"  cost         {metered_text(record.spent_usd, record.metered)}; "
                     f"{estimated_text(record.estimate_usd, record.estimate_requests)}"
                     + (f"; budget {record.budget}" if record.budget else ""))
    for child in doc.get("children", []):
        spent = f", {usd(child['spent_usd'])}" if child.get("spent_usd") is not None else ""
        lines.append(f"  -> {child['spec']['destinations'][0]}  {child['state']}  (job {child['id']}{spent})")
    for dst, row in (record.replicas or {}).items():
        verified = f"{row['newest_verified']} verified {row['verified_at']}" if row.get("newest_verified") else "nothing verified"
        lines.append(f"  replica      {dst}: {verified}; lag {row['lag_checkpoints']} checkpoints; "
                     f"{usd(row['spent_usd'])}" + (f"; removed {', '.join(row['removed'])}" if row.get("removed") else ""))
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


def jobs_cancel(job_id: str, timeout: Annotated[float, typer.Option(
                    "--timeout", min=0, help="Seconds to wait for the job's workers to stop (0: do not wait).")] = 60.0,
                broker: BrokerOpt = None) -> None:
    """Stop a job: no request is sent after its workers see the cancel (they look every 0.2 s,
    also inside a part), its remote transfer is cancelled, its unfinished uploads are aborted, no
    manifest is written. Waits until its workers have stopped."""
    jobs = _jobs(_ws(broker))
    cancelled, state = jobs.cancel(job_id)
    if state is None:
        raise _no_job(job_id)
    if not cancelled:
        err.print(f"mcbridge: job {job_id} is {state}; it can no longer be cancelled", markup=False)
        raise typer.Exit(1)
    deadline = time.monotonic() + timeout
    with jobs.following(job_id) as wait:
        stopped = jobs.get(job_id)
        while stopped is not None and stopped.finished is None and time.monotonic() < deadline:
            wait(min(0.5, max(0.0, deadline - time.monotonic())))
            stopped = jobs.get(job_id)
    if stopped is not None and stopped.finished is not None:
        out.print(f"cancelled job {job_id} (it was {state}); its workers stopped at "
                  f"{stopped.to_dict()['finished']}, nothing committed", markup=False)
    else:
        out.print(f"cancelled job {job_id} (it was {state}); its workers are still stopping", markup=False)


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


def jobs_audit(job: Annotated[Optional[str], typer.Option("--job", help="Only this job (and its children).")] = None,
               tenant: Annotated[Optional[str], typer.Option("--tenant", help="Only this tenant's.")] = None,
               limit: Annotated[int, typer.Option("--limit", min=1)] = 50, as_json: JsonOpt = False,
               broker: BrokerOpt = None) -> None:
    """What the workers decided, newest first: each job's tenant, digest, admitted or refused and
    why, and when it ended its route, bytes and spend (the audit stream)."""
    from bridge.workers.gate import Audit
    from bridge.workers.keys import Keys
    given("--job", job)
    given("--tenant", tenant)
    ws = _ws(broker)
    entries = list(Audit(_connect(ws), Keys(ws.namespace)).read(limit, job=job, tenant=tenant))
    if as_json:
        out.print_json(json.dumps(entries))
        return
    if not entries:
        out.print("no audit entries", markup=False)
        return
    for e in entries:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(e.get("at", 0))))
        what = e.get("job") or (f"schedule {e['schedule']}" if e.get("schedule") else
                                f"policy {e['policy']}" if e.get("policy") else e.get("task", "-"))
        line = f"{when} {e['decision']:<8} {what} tenant {e.get('tenant', '-')}"
        if e.get("source"):
            line += f" {e['source']} -> {', '.join(json.loads(e['destinations'])) if e.get('destinations') else '-'}"
        if e["decision"] == "ended":
            line += f" {e.get('state')}: {human_bytes(int(e.get('bytes', 0)))}, route {e.get('route') or '-'}"
            line += f", {usd(float(e['spent_usd']))}" if e.get("spent_usd") else ""
        if e.get("digest"):
            line += f" digest {e['digest'][:16]}"
        if e.get("reason"):
            line += f": {e['reason']}"
        out.print(line, markup=False, soft_wrap=True)


def service_init(tenant: Annotated[str, typer.Option("--tenant", help="The one tenant's name.")] = "default",
                 directory: Annotated[Optional[Path], typer.Option(
                     "--dir", help="Where to write service-keys and service.yaml (default: ~/.config/mcbridge, "
                     "where workers and submitters on this machine look when BRIDGE_KEYS_FILE and "
                     "BRIDGE_SERVICE_POLICY are unset).")] = None,
                 local: Annotated[Optional[list[str]], typer.Option(
                     "--local", help="A local folder the tenant may read and write on workers (repeatable; "
                     "workers need it in BRIDGE_LOCAL_ROOTS too).")] = None,
                 force: Annotated[bool, typer.Option("--force", help="Replace files that exist.")] = False) -> None:
    """Set up a single-user service: one tenant with a fresh key, allowed every bucket of every
    store (and the --local folders). Edit service.yaml to narrow it or add tenants."""
    from bridge.errors import InvalidOption
    from bridge.workers.auth import new_key, write_keys_file
    from bridge.workers.settings import KEYS_FILE_NAME, SERVICE_POLICY_NAME, _tenant, service_dir
    try:
        _tenant(tenant)
    except ValueError as exc:
        raise InvalidOption(f"--tenant: {exc}") from None
    folders = [os.path.realpath(os.path.expanduser(p)) for p in local or []]
    if any(not f or not Path(f).is_dir() for f in folders):
        raise InvalidOption(f"--local: {next(p for p, f in zip(local, folders) if not Path(f).is_dir())!r} is not a folder")
    home = directory or service_dir(os.environ)
    keys_path, policy_path = home / KEYS_FILE_NAME, home / SERVICE_POLICY_NAME
    for path in (keys_path, policy_path):
        if path.exists() and not force:
            raise InvalidOption(f"{path} exists: keep it, or give --force to replace it")
    policy_path.parent.mkdir(parents=True, exist_ok=True)
    from bridge.policies.tenants import single_tenant
    policy_path.write_text(single_tenant(tenant, folders))
    write_keys_file(keys_path, {tenant: new_key()})
    out.print(f"wrote {keys_path} (tenant {tenant}'s key; mode 600) and {policy_path}", markup=False)
    if directory is not None:
        out.print(f"export BRIDGE_KEYS_FILE={keys_path} BRIDGE_SERVICE_POLICY={policy_path}", markup=False)
    if folders:
        out.print(f"workers: export BRIDGE_LOCAL_ROOTS={':'.join(folders)}", markup=False)


def service_add_tenant(tenant: Annotated[str, typer.Argument(help="The new tenant's name.")],
                       keys_file: Annotated[Optional[Path], typer.Option(
                           "--keys-file", help="The keys file (default: $BRIDGE_KEYS_FILE, else ~/.config/mcbridge/service-keys).")] = None,
                       out_file: Annotated[Optional[Path], typer.Option(
                           "--out", help="Also write the new tenant's key alone to this file (for its submitters).")] = None) -> None:
    """Add a tenant with a fresh key to a keys file (workers need the whole file, the tenant's
    submitters only --out); then give the tenant a scope in the service policy."""
    from bridge.errors import InvalidOption
    from bridge.workers.auth import new_key, parse_keys, write_keys_file
    from bridge.workers.settings import KEYS_FILE_NAME, _tenant, service_dir
    try:
        _tenant(tenant)
    except ValueError as exc:
        raise InvalidOption(f"TENANT: {exc}") from None
    from bridge.workers.settings import WorkerSettings
    path = keys_file or Path(WorkerSettings.from_env(os.environ).keys_file or service_dir(os.environ) / KEYS_FILE_NAME)
    existing = {name: key.hex() for name, key in parse_keys(path.read_text(), str(path)).items()} if path.exists() else {}
    if tenant in existing:
        raise InvalidOption(f"{path} already holds a key for tenant {tenant!r}")
    key = new_key()
    write_keys_file(path, {**existing, tenant: key})
    if out_file is not None:
        write_keys_file(out_file, {tenant: key})
    out.print(f"added tenant {tenant} to {path}" + (f" and wrote its key alone to {out_file}" if out_file else ""),
              markup=False)
    out.print(f"now give it a scope in the service policy (tenants: {tenant}: read: [...] write: [...]) and check it "
              f"with mcbridge policy check", markup=False)


def budgets_set(name: Annotated[str, typer.Argument(help="Budget name, e.g. a policy's.")],
                usd: Annotated[float, typer.Argument(min=0, help="Monthly limit in US dollars.")],
                broker: BrokerOpt = None) -> None:
    """Set the monthly limit of a budget; jobs submitted with --budget NAME are held above it."""
    from bridge.workers.budgets import Budgets, check
    from bridge.workers.keys import Keys
    check(name, usd)
    usd_amount("USD", usd)
    ws = _ws(broker)
    Budgets(_connect(ws), Keys(ws.namespace)).set(name, usd)
    out.print(f"budget {name}: {money.usd(usd)} a month", markup=False)


def budgets_list(as_json: JsonOpt = False, broker: BrokerOpt = None) -> None:
    """Each budget's monthly limit and what was spent this month."""
    from bridge.workers.budgets import Budgets, month
    from bridge.workers.keys import Keys
    ws = _ws(broker)
    rows = Budgets(_connect(ws), Keys(ws.namespace)).all()
    if as_json:
        shown = {name: {k: None if v is None else money.usd_number(v) for k, v in row.items()}
                 for name, row in rows.items()}
        out.print_json(json.dumps({"month": month(), "budgets": shown}))
        return
    for name, row in rows.items():
        cap = usd(row['limit_usd']) if row["limit_usd"] is not None else "no limit"
        out.print(f"{name}: {usd(row['spent_usd'])} spent in {month()} of {cap}", markup=False)


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
    from bridge.workers.auth import Keyring, message_ttl
    from bridge.workers.cache_tasks import payload
    keyring = Keyring.load(ws)
    signed = keyring.sign_message(keyring.signer(), WARM, node, payload(items, profile, lookahead),
                                  ttl=message_ttl(ws))
    result = app.send_task(WARM, args=[*payload(items, profile, lookahead), signed, node], queue=queue)
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
    from bridge.replication import recorded as run_here
    for p in chosen:
        # the service's runs, and this machine's in-process ones (replicate --once/--watch): the newer wins
        recorded = _newer(state.destinations(p.name), run_here(p.name, settings))
        spend = state.spend(p.name)
        for dst, row in run_here(p.name, settings).items():
            if row.get("month") == month():
                spend[dst] = spend.get(dst, 0.0) + row.get("month_usd", 0.0)
        try:
            from bridge.replication import survey
            readiness = survey(p.policy, settings)
            source_now, listed, waiting = rules.committed(readiness), None, rules.waiting(readiness)
            trusted = rules.trusted(readiness)   # committed on a name's word: said, never called verified
        except BridgeError as exc:
            source_now, listed, waiting, trusted = None, str(exc), {}, {}
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
                         "spent_usd": money.usd_number(spend.get(dst, 0.0)), "errors": row.get("errors", [])})
        report.append({"name": p.name, "source": p.policy.source, "source_error": listed,
                       "budget_usd": budgets.limit(p.name), "spent_usd": money.usd_number(budgets.spent(p.name)),
                       "max_cost_usd": p.policy.max_cost_usd, "waiting": waiting, "trusted": trusted,
                       "destinations": rows})
    if as_json:
        out.print_json(json.dumps({"month": month(), "policies": report}))
        return
    for p in report:
        cap = usd(p['budget_usd']) if p["budget_usd"] is not None else "no monthly budget"
        out.print(f"{p['name']}: {p['source']}: {usd(p['spent_usd'])} spent in {month()} of {cap}", markup=False)
        if p["source_error"]:
            err.print(f"mcbridge: {p['name']}: source not listed: {p['source_error']}", markup=False, soft_wrap=True)
        for ckpt, why in p["waiting"].items():
            out.print(f"  {ckpt} waiting: {why}", markup=False)
        for ckpt, why in p["trusted"].items():
            out.print(f"  {ckpt} committed on trust: {why}", markup=False)
        for row in p["destinations"]:
            if row["last_run"] is None:
                out.print(f"  {row['destination']}: never run (by the service, or in-process here)", markup=False)
                continue
            verified = (f"{row['newest_verified']} verified {row['verified_at']}" if row["newest_verified"]
                        else "nothing verified yet")
            if row["newest_verified"] and row["commit_to_verified_s"] is not None:
                verified += f", {row['commit_to_verified_s']}s after its commit"
            lag = row["lag_checkpoints"]
            behind = "up to date" if lag == 0 else f"{lag} checkpoint{'s' if lag != 1 else ''} behind {row['newest_source']}"
            by = "in-process" if row["job"] == "in-process" else f"job {row['job']}"
            out.print(f"  {row['destination']}: last run {row['last_run']} ({by}, "
                      f"{'ok' if row['ok'] else 'FAILED'}); {verified}; {behind}; {usd(row['spent_usd'])} this month",
                      markup=False)
            for problem in row["errors"]:
                out.print(f"    {problem}", markup=False)


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
    jobs.command("audit")(jobs_audit)
    service = typer.Typer(no_args_is_help=True, help="Tenants of the service: set up, add.")
    service.command("init")(service_init)
    service.command("add-tenant")(service_add_tenant)
    app.add_typer(service, name="service")
    budgets = typer.Typer(no_args_is_help=True, help="Monthly budgets of the service: set, list.")
    budgets.command("set")(budgets_set)
    budgets.command("list")(budgets_list)
    app.add_typer(budgets, name="budgets")
    app.add_typer(jobs, name="jobs")

