"""The transfer commands: ``mcbridge cp``, ``sync``, ``verify``, ``uploads``, ``version`` and
``completion``."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from bridge import __version__
from bridge.cli.options import (BwlimitFileOpt, BwlimitOpt, ChunkOpt, ConcOpt, ConfigOpt, DeleteOpt, DryOpt,
                                ExcludeOpt, FilesFromOpt, ForceOpt, IncludeOpt, JsonOpt, MaxAgeOpt, MaxCostOpt, MaxDeleteOpt, MaxSizeOpt,
                                MinAgeOpt, MinSizeOpt, ProfileOpt, ProgressBar, QuietOpt, RouteOpt, Sha256Opt,
                                StoreSumOpt, emit, err, filters_from_flags, moved_line, out, print_findings, print_plan, route_line,
                                settings_from_flags, shown)
from bridge.errors import InvalidOption
from bridge.progress import human_bytes, plural
from bridge.cli.placement import (AdoptOpt, BucketKeyOpt, ChecksumOpt, ContentTypeOpt, KmsKeyOpt, MetadataOpt,
                                NoMetadataOpt, ScopeOpt, SkipExistingOpt, StorageClassOpt)


def cp(src: str, dst: str, concurrency: ConcOpt = None, chunk_size: ChunkOpt = None,
       store_checksums: StoreSumOpt = None, bwlimit: BwlimitOpt = None, bwlimit_file: BwlimitFileOpt = None,
       include: IncludeOpt = None, exclude: ExcludeOpt = None, files_from: FilesFromOpt = None,
       min_size: MinSizeOpt = None, max_size: MaxSizeOpt = None, min_age: MinAgeOpt = None,
       max_age: MaxAgeOpt = None,
       dry_run: DryOpt = False, as_json: JsonOpt = False, quiet: QuietOpt = False,
       max_cost: MaxCostOpt = None, route: RouteOpt = None, profile: ProfileOpt = None,
       config: ConfigOpt = None, content_type: ContentTypeOpt = None, metadata: MetadataOpt = None,
       no_metadata: NoMetadataOpt = False, storage_class: StorageClassOpt = None, kms_key: KmsKeyOpt = None,
       bucket_key: BucketKeyOpt = None, encryption_scope: ScopeOpt = None, skip_existing: SkipExistingOpt = False,
       checksum: ChecksumOpt = False, adopt: AdoptOpt = None, sha256: Sha256Opt = False) -> None:
    """Copy SRC to DST: one object, or every object under a directory or prefix (trailing
    slash) that the filters select. SRC may hold wildcards, as s5cmd's do ('s3://b/p/*.tar',
    'gs://b/run-*/**.bin'): what they match under the folder before the first one."""
    from bridge import api
    settings = settings_from_flags(profile, config, concurrency, chunk_size, store_checksums, bwlimit=bwlimit,
                                   bwlimit_file=bwlimit_file, route=route, sha256=sha256)
    given = dict(settings=settings, route=route, include=include, exclude=exclude, files_from=files_from,
                 min_size=min_size, max_size=max_size, min_age=min_age, max_age=max_age,
                 content_type=content_type, metadata=metadata, no_metadata=no_metadata,
                 storage_class=storage_class, kms_key=kms_key, bucket_key=bucket_key,
                 encryption_scope=encryption_scope, adopt=adopt, skip_existing=skip_existing, checksum=checksum)
    if dry_run:
        print_plan(api.copy(src, dst, dry_run=True, **given).summary, as_json)
        return
    with ProgressBar(not as_json, settings, bwlimit_file, quiet) as progress:
        summary = api.copy(src, dst, progress=progress, max_cost=max_cost, **given).summary
    skipped = f"; {summary['skipped']} skipped (equal at the destination)" if summary.get("skipped") else ""
    emit(summary, as_json, f"copied {plural(summary['files'], 'file')}, {moved_line(summary)}"
         f"{route_line(summary)}{skipped}; manifest {summary['manifest']}", quiet)


def sync(src: str, dst: str, delete: DeleteOpt = False, max_delete: MaxDeleteOpt = None, force: ForceOpt = False,
         concurrency: ConcOpt = None, chunk_size: ChunkOpt = None, store_checksums: StoreSumOpt = None,
         bwlimit: BwlimitOpt = None, bwlimit_file: BwlimitFileOpt = None,
         include: IncludeOpt = None, exclude: ExcludeOpt = None, files_from: FilesFromOpt = None,
         min_size: MinSizeOpt = None, max_size: MaxSizeOpt = None, min_age: MinAgeOpt = None,
         max_age: MaxAgeOpt = None,
         dry_run: DryOpt = False, as_json: JsonOpt = False, quiet: QuietOpt = False,
         max_cost: MaxCostOpt = None, route: RouteOpt = None, profile: ProfileOpt = None,
         config: ConfigOpt = None, content_type: ContentTypeOpt = None, metadata: MetadataOpt = None,
         no_metadata: NoMetadataOpt = False, storage_class: StorageClassOpt = None, kms_key: KmsKeyOpt = None,
         bucket_key: BucketKeyOpt = None, encryption_scope: ScopeOpt = None, adopt: AdoptOpt = None,
         sha256: Sha256Opt = False) -> None:
    """Make DST equal to SRC: send what is new or changed (by size and checksum, not time), repair
    what no longer matches the record, adopt what is already there and equal though bridge did not
    write it, and with --delete remove what SRC no longer has. Filters apply to both sides: what
    they leave out is neither sent nor deleted."""
    from bridge import api
    if max_delete is not None and not delete:
        raise InvalidOption("--max-delete limits what --delete removes: give --delete too, or leave it out")
    settings = settings_from_flags(profile, config, concurrency, chunk_size, store_checksums, bwlimit=bwlimit,
                                   bwlimit_file=bwlimit_file, route=route, sha256=sha256)
    given = dict(settings=settings, delete=delete, route=route, include=include, exclude=exclude,
                 files_from=files_from, min_size=min_size, max_size=max_size, min_age=min_age, max_age=max_age,
                 content_type=content_type, metadata=metadata, no_metadata=no_metadata,
                 storage_class=storage_class, kms_key=kms_key, bucket_key=bucket_key,
                 encryption_scope=encryption_scope, adopt=adopt, max_delete=max_delete, force=force)
    if dry_run:
        with ProgressBar(not as_json, quiet=quiet) as progress:
            planned = api.sync(src, dst, dry_run=True, progress=progress, **given)
        print_plan(planned.summary, as_json)
        return
    with ProgressBar(not as_json, settings, bwlimit_file, quiet) as progress:
        summary = api.sync(src, dst, progress=progress, max_cost=max_cost, **given).summary
    r = summary["reasons"]
    emit(summary, as_json, f"sent {plural(len(summary['sent']), 'file')} ({r['new']} new, {r['changed']} changed, "
         f"{r['repaired']} repaired), {r['unchanged']} unchanged, {r.get('adopted', 0)} adopted, "
         f"deleted {len(summary['deleted'])}; {moved_line(summary)}{route_line(summary)}; "
         f"manifest {summary['manifest']}", quiet)


def verify(url: str, deep: Annotated[bool, typer.Option("--deep", help="Re-read and rehash every object "
                                                        "instead of trusting store-reported checksums.")] = False,
           include: IncludeOpt = None, exclude: ExcludeOpt = None, files_from: FilesFromOpt = None,
           min_size: MinSizeOpt = None, max_size: MaxSizeOpt = None, min_age: MinAgeOpt = None,
           max_age: MaxAgeOpt = None,
           concurrency: ConcOpt = None, as_json: JsonOpt = False, quiet: QuietOpt = False,
           profile: ProfileOpt = None, config: ConfigOpt = None,
           sha256: Annotated[bool, typer.Option("--sha256", help="With --deep, also compute each file's plain "
                                                "whole-file SHA-256 (one stream per file) and check it where "
                                                "the record has one.")] = False) -> None:
    """Check every committed copy at or under URL (the files the filters select) against its
    record; exit 1 naming each missing, extra, mismatched or unproven file (one a cloud copied that
    no checksum both stores computed proves: --deep reads it)."""
    from bridge import api
    from bridge.errors import VerifyFailed
    settings = settings_from_flags(profile, config, concurrency)
    failed = None
    with ProgressBar(not as_json, quiet=quiet) as progress:
        try:
            report = api.verify(url, deep=deep, sha256=sha256, settings=settings, progress=progress,
                                include=include, exclude=exclude, files_from=files_from, min_size=min_size,
                                max_size=max_size, min_age=min_age, max_age=max_age).report
        except VerifyFailed as exc:
            failed, report = exc, exc.result.report
    if as_json:
        out.print_json(json.dumps(report))
    else:
        print_findings(report, ("missing", "extra", "mismatched", "unproven") + (() if quiet else ("rehashed",)))
        for shard_set in report["shard_sets"]:
            for problem in shard_set["problems"]:
                out.print(f"shard set   {shard_set['index']}: {problem}", markup=False)
            if shard_set["ok"] and not quiet:
                out.print(f"shard set   {shard_set['index']}: intact", markup=False)
        if len(report["copies"]) > 1 or report["copies"][0]["prefix"]:
            for copy in report["copies"]:
                if not (quiet and copy["ok"]):
                    out.print(f"{'intact' if copy['ok'] else 'FAILED':<11} {shown(copy['url'])}: "
                              f"{plural(copy['files'], 'file')}, {human_bytes(copy['bytes'])}", markup=False)
        if report.get("not_recorded"):
            err.print(f"warning: {report['not_recorded']}", markup=False)
        if not (quiet and report["ok"]):
            counts = report["counts"]
            verdict = "OK" if report["ok"] else "FAILED"
            copies = len(report["copies"])
            out.print(f"{verdict}: {plural(report['checked'], 'file')}, {human_bytes(report['bytes'])} checked "
                      f"({'deep' if deep else 'store checksums'}) at {report['url']}"
                      + (f" in {copies} committed copies" if copies > 1 else "") + "; "
                      f"{counts['missing']} missing, {counts['extra']} extra, {counts['mismatched']} mismatched"
                      + (f", {counts['unproven']} unproven" if counts.get("unproven") else "")
                      + (f", {counts['proven']} unproven before, proven by reading and recorded so"
                         if counts.get("proven") else "")
                      + (f", {counts['rehashed']} rewritten with equal bytes" if counts["rehashed"] else ""),
                      markup=False)
        for hint in report.get("hints", []):
            out.print(f"hint: {hint}", markup=False)
    if failed is not None:
        raise typer.Exit(failed.exit_code)


def uploads(url: str, abort: Annotated[bool, typer.Option("--abort", help="Abort them.")] = False,
            as_json: JsonOpt = False, profile: ProfileOpt = None, config: ConfigOpt = None) -> None:
    """List (or --abort) the unfinished multipart uploads under URL that killed copies left
    behind. A copy aborts the leftovers of the objects it writes by itself."""
    from bridge import ops
    rows = ops.uploads(url, settings_from_flags(profile, config), abort=abort)
    if as_json:
        out.print_json(json.dumps(rows))
        return
    for row in rows:
        out.print(f"{'aborted' if abort else 'unfinished'}  {shown(row['object'])}  ({row['upload_id']})", markup=False)
    out.print(f"{plural(len(rows), 'unfinished upload')}{' aborted' if abort else ''} under {url}", markup=False)


def version() -> None:
    """Print bridge's version (also: mcbridge --version)."""
    out.print(__version__)


SHELLS = ("bash", "zsh", "fish")


def completion(shell: Annotated[str, typer.Argument(metavar="SHELL", help="bash, zsh or fish.")]) -> None:
    """Print the shell completion script for SHELL. Install, e.g.:
    mcbridge completion bash > ~/.local/share/bash-completion/completions/mcbridge"""
    from bridge.cli.completion import script
    out.print(script(shell), markup=False, highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    for command in (cp, sync, verify, uploads, version, completion):
        app.command()(command)
