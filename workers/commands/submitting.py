"""``mcbridge submit cp|sync|replicate|pack|migrate|unpack``: a job checked here (its flags as
``mcbridge cp`` checks them, its price against --max-cost or --budget) and queued for the
workers, without importing Celery."""

from __future__ import annotations

import enum
import json
import os
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from bridge.policies.cost import money
from bridge.cli.options import (RUN, DeleteOpt, ExcludeOpt, FilesFromOpt, ForceOpt, IncludeOpt, JsonOpt, MaxAgeOpt,
                                MaxDeleteOpt, MaxSizeOpt, MinAgeOpt, MinSizeOpt, QuietOpt, Sha256Opt, ShardFormat, VerifyMode, bwlimit_opt,
                                chunk_size_opt, concurrency_opt, dry_run_opt, err, filters_from_flags, given,
                                max_cost_opt, out, profile_opt, refuse_unused, route_opt, settings_from_flags,
                                size_flag, store_checksums_opt, transfer_flags, usd_amount)
from bridge.cli.placement import (AdoptOpt, BucketKeyOpt, ChecksumOpt, ContentTypeOpt, KmsKeyOpt, MetadataOpt,
                                  NoMetadataOpt, ScopeOpt, SkipExistingOpt, StorageClassOpt)
from bridge.policies.cost.money import usd
from bridge.workers.commands.connection import BrokerOpt, connect, consumed, service_settings
from bridge.workers.commands.job_control import follow
from bridge.workers.specs import runs_as

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
QueueOpt = Annotated[Optional[str], typer.Option(
    "--queue", help="Queue for the job's tasks (default: by destination, e.g. bridge.s3).")]
VerifyOpt = Annotated[VerifyMode, typer.Option(
    "--verify", help="After the copy: store (checksums the store reports), deep (re-read) or none.")]
WaitOpt = Annotated[bool, typer.Option("--wait", help="Follow the job; exit 0 only if it succeeds.")]
WaitTimeoutOpt = Annotated[Optional[float], typer.Option(
    "--timeout", min=0.1, help="With --wait: seconds to follow the job at most; exit 1 if it has not ended by then "
    "(the job goes on). Default: none, until the job ends.")]
RouteOpt = route_opt()
# `submit --budget` when the job is held over its budget: not a failure, not queued either.
AWAITING_APPROVAL = 3
BudgetOpt = Annotated[Optional[str], typer.Option(
    "--budget", help="Charge the job to this monthly budget (mcbridge budgets); over it, the job waits "
    "for mcbridge jobs approve.")]


def _submit(fields: dict[str, Any], *, wait: bool, as_json: bool, quiet: bool, dry_run: bool,
            broker: str | None, max_cost: float | None = None, budget: str | None = None,
            wait_timeout: float | None = None) -> None:
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
    ws = service_settings(broker)
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
    client = connect(ws)
    svc = _submitter(ws, client)
    queue = svc.route(spec)
    job_id = svc.submit(spec, budget=budget, estimate=estimate)
    if svc.jobs.state(job_id) == "awaiting-approval":
        # Held, not queued: the id on stdout (to approve or cancel it), why on stderr, exit 3.
        from bridge.workers.redisbudgets import Budgets
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
    if not consumed(client, svc.keys, queue):
        err.print(f"mcbridge: warning: no live worker consumes queue {queue}; the job waits for one "
                  f"(mcbridge worker -Q {queue})", markup=False)
    if as_json and not wait:
        out.print_json(json.dumps({"id": job_id, "state": "queued", "queue": queue, "spec": spec.to_dict()}))
    elif not as_json:
        out.print(job_id, markup=False)
        err.print(f"queued {spec.kind} job {job_id} on {queue}", markup=False)
    if wait:
        raise typer.Exit(follow(svc.jobs, job_id, quiet=quiet, as_json=as_json, timeout=wait_timeout))


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
    from bridge.pricing import check_budget, total_cost
    from bridge.ops import job_usages
    settings = load_settings(profile=spec.profile)
    pack = None
    if runs_as(spec.kind) == "pack":
        pack = {"fmt": spec.shard_format or "tar", "prefix": spec.shard_prefix or "shard",
                "max_count": spec.max_count,
                "options": {"row_group_size": spec.row_group_size} if spec.row_group_size else {}}
        if spec.shard_size:
            pack["shard_size"] = spec.shard_size
    if spec.kind == "unpack":
        pack = {"prefix": spec.shard_prefix}
    usages = job_usages(runs_as(spec.kind), spec.source, list(spec.destinations), settings, delete=bool(spec.deletes),
                        pack=pack, route=spec.route, filters=spec.selection())
    if max_cost is None:
        return total_cost(usages, settings)
    return check_budget(usages, settings, max_cost, f"{spec.kind} job")


def submit_cp(src: str, dst: str, include: IncludeOpt = None, exclude: ExcludeOpt = None, files_from: FilesFromOpt = None,
              min_size: MinSizeOpt = None, max_size: MaxSizeOpt = None, min_age: MinAgeOpt = None,
              max_age: MaxAgeOpt = None, concurrency: ConcOpt = None, chunk_size: ChunkOpt = None,
              store_checksums: StoreSumOpt = None, bwlimit: BwlimitOpt = None, profile: ProfileOpt = None, queue: QueueOpt = None,
              verify: VerifyOpt = "store", wait: WaitOpt = False, wait_timeout: WaitTimeoutOpt = None, as_json: JsonOpt = False,
              quiet: QuietOpt = False, dry_run: DryOpt = False, max_cost: MaxCostOpt = None,
              budget: BudgetOpt = None, route: RouteOpt = None, broker: BrokerOpt = None,
              content_type: ContentTypeOpt = None, metadata: MetadataOpt = None, no_metadata: NoMetadataOpt = False,
              storage_class: StorageClassOpt = None, kms_key: KmsKeyOpt = None, bucket_key: BucketKeyOpt = None,
              encryption_scope: ScopeOpt = None, skip_existing: SkipExistingOpt = False, checksum: ChecksumOpt = False,
              adopt: AdoptOpt = None, sha256: Sha256Opt = False) -> None:
    """Queue a copy of SRC to DST; prints the job id."""
    options = dict(locals())
    _submit(_fields("copy", options, destinations=[dst], **_written(options, dst)), **_how(options))


def submit_sync(src: str, dst: str, delete: DeleteOpt = False, max_delete: MaxDeleteOpt = None,
                force: ForceOpt = False, include: IncludeOpt = None, exclude: ExcludeOpt = None, files_from: FilesFromOpt = None,
              min_size: MinSizeOpt = None, max_size: MaxSizeOpt = None, min_age: MinAgeOpt = None,
              max_age: MaxAgeOpt = None, concurrency: ConcOpt = None,
                chunk_size: ChunkOpt = None, store_checksums: StoreSumOpt = None, bwlimit: BwlimitOpt = None, profile: ProfileOpt = None,
                queue: QueueOpt = None, verify: VerifyOpt = "store", wait: WaitOpt = False, wait_timeout: WaitTimeoutOpt = None,
                as_json: JsonOpt = False, quiet: QuietOpt = False, dry_run: DryOpt = False,
                max_cost: MaxCostOpt = None, budget: BudgetOpt = None, route: RouteOpt = None,
                broker: BrokerOpt = None,
                content_type: ContentTypeOpt = None, metadata: MetadataOpt = None, no_metadata: NoMetadataOpt = False,
                storage_class: StorageClassOpt = None, kms_key: KmsKeyOpt = None, bucket_key: BucketKeyOpt = None,
                encryption_scope: ScopeOpt = None, adopt: AdoptOpt = None, sha256: Sha256Opt = False) -> None:
    """Queue a sync: make DST equal to SRC, sending only what is new or changed; prints the job id."""
    options = dict(locals())
    _submit(_fields("sync", options, destinations=[dst], **_deleting(options), **_written(options, dst)),
            **_how(options))


def _deleting(options: dict[str, Any]) -> dict[str, Any]:
    """The spec's fields for --delete and its guards (bridge/guards.py), which the worker applies
    to the deletions it plans, before anything is deleted: --max-delete N, or --force."""
    from bridge.errors import InvalidOption
    if not options["delete"] and (options["max_delete"] is not None or options["force"]):
        raise InvalidOption(f"{'--max-delete' if options['max_delete'] is not None else '--force'} limits what "
                            f"--delete removes: give --delete too, or leave it out")
    return {"delete": options["delete"], "max_delete": options["max_delete"], "force_delete": options["force"] or None}


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
                     max_delete: MaxDeleteOpt = None, force: ForceOpt = False,
                     include: IncludeOpt = None, exclude: ExcludeOpt = None, files_from: FilesFromOpt = None,
              min_size: MinSizeOpt = None, max_size: MaxSizeOpt = None, min_age: MinAgeOpt = None,
              max_age: MaxAgeOpt = None, concurrency: ConcOpt = None, chunk_size: ChunkOpt = None,
                     store_checksums: StoreSumOpt = None, bwlimit: BwlimitOpt = None, profile: ProfileOpt = None, queue: QueueOpt = None,
                     verify: VerifyOpt = "store", wait: WaitOpt = False, wait_timeout: WaitTimeoutOpt = None, as_json: JsonOpt = False,
                     quiet: QuietOpt = False, dry_run: DryOpt = False, max_cost: MaxCostOpt = None,
                     budget: BudgetOpt = None, broker: BrokerOpt = None) -> None:
    """Queue a DR replication: keep every DST equal to SRC (sync, then verify), recording when
    each was last proven equal; prints the job id."""
    options = dict(locals())
    _submit(_fields("replicate", options, destinations=dsts, **_deleting(options)), **_how(options))


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
                wait: WaitOpt = False, wait_timeout: WaitTimeoutOpt = None, as_json: JsonOpt = False, quiet: QuietOpt = False, dry_run: DryOpt = False,
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
                  verify: VerifyOpt = "store", wait: WaitOpt = False, wait_timeout: WaitTimeoutOpt = None, as_json: JsonOpt = False,
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
                   wait: WaitOpt = False, wait_timeout: WaitTimeoutOpt = None, as_json: JsonOpt = False, quiet: QuietOpt = False,
                   dry_run: DryOpt = False, max_cost: MaxCostOpt = None, budget: BudgetOpt = None,
                   route: RouteOpt = None, broker: BrokerOpt = None) -> None:
    """Queue a corpus migration (as mcbridge migrate): with --pack, packed into shards on the
    way, one task per shard; without, a copy. Prints the job id."""
    options = dict(locals())
    if pack is None:
        refuse_unused("without --pack", **{"--shard-size": shard_size, "--max-count": max_count, "--prefix": prefix})
        _submit(_fields("copy", options, destinations=[dst]), **_how(options))
        return
    _submit(_fields("migrate", options, destinations=[dst], shard_format=str(pack), shard_size=shard_size or "256MiB",
                    max_count=max_count, shard_prefix="shard" if prefix is None else prefix, row_group_size=None),
            **_how(options))


def _fields(kind: str, options: dict[str, Any], **extra: Any) -> dict[str, Any]:
    names = ("concurrency", "chunk_size", "store_checksums", "bwlimit", "profile", "queue", "verify")
    if runs_as(kind) not in ("copy", "sync"):
        refuse_unused(f"to a {runs_as(kind)} job", **{"--route": options.get("route")})
    routed = {"route": options["route"]} if options.get("route") is not None else {}
    # The filters travel in the spec (a --files-from list read here), so that workers select what
    # mcbridge cp would select here.
    filters = filters_from_flags(*(options.get(n) for n in ("include", "exclude", "files_from", "min_size",
                                                           "max_size", "min_age", "max_age")))
    selected = {"filters": filters.to_dict()} if filters is not None else {}
    plain = {n: str(options[n]) if isinstance(options[n], enum.Enum) else options[n] for n in names}
    return {"kind": kind, "source": options["src"], **plain, **routed, **selected, **extra}


def _how(options: dict[str, Any]) -> dict[str, Any]:
    if options.get("wait_timeout") is not None and not options["wait"]:
        from bridge.errors import InvalidOption
        raise InvalidOption("--timeout bounds --wait: give both, or neither")
    return {n: options[n] for n in ("wait", "wait_timeout", "as_json", "quiet", "dry_run", "broker", "max_cost",
                                    "budget")}


def register(app: typer.Typer) -> None:
    submit = typer.Typer(no_args_is_help=True, help="Queue a job for the workers and print its id.")
    for name, command in (("cp", submit_cp), ("sync", submit_sync), ("replicate", submit_replicate),
                          ("pack", submit_pack), ("migrate", submit_migrate), ("unpack", submit_unpack)):
        submit.command(name)(command)
    app.add_typer(submit, name="submit")
