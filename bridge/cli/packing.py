"""``mcbridge pack``, ``unpack`` and ``migrate`` (``cat`` of a shard set's file is bridge/cli/verbs.py's). Registered by bridge.cli at start (see its GROUPS);
the packing machinery (and pyarrow, for Parquet) is imported only when one of them runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from bridge.cli.options import (BwlimitFileOpt, BwlimitOpt, ChunkOpt, ConcOpt, ConfigOpt, DryOpt, ExcludeOpt,
                                FilesFromOpt, IncludeOpt, JsonOpt, MaxAgeOpt, MaxCostOpt, MaxSizeOpt, MinAgeOpt,
                                MinSizeOpt, ProfileOpt, ProgressBar, QuietOpt, RouteOpt, Sha256Opt, ShardFormat,
                                StoreSumOpt, emit, filters_from_flags, given, moved_line, out, print_plan, print_usage,
                                refuse_unused, route_line, settings_from_flags, size_flag)
from bridge.progress import human_bytes, plural

FormatOpt = Annotated[ShardFormat, typer.Option("--format", "-f", help="Shard format: tar (WebDataset) or parquet.")]
PackOpt = Annotated[Optional[ShardFormat], typer.Option("--pack", help="Pack into shards on the way: tar or parquet "
                                                        "(default: copy the files as they are).")]
ShardSizeOpt = Annotated[Optional[str], typer.Option("--shard-size", metavar="SIZE", help="Target shard size (default 256MiB); a "
                                                     "sample bigger than this gets a shard of its own.")]
MaxCountOpt = Annotated[Optional[int], typer.Option("--max-count", min=1, help="At most N files per shard.")]
PrefixOpt = Annotated[Optional[str], typer.Option("--prefix", metavar="NAME", help="Shard names: PREFIX-000000.tar …, index "
                                                  "PREFIX.index.json (default shard).")]
RowGroupOpt = Annotated[Optional[str], typer.Option("--row-group-size", metavar="SIZE", help="Parquet: data bytes per row "
                                                    "group (default 32MiB).")]
MemoryOpt = Annotated[Optional[str], typer.Option("--memory", metavar="SIZE", help="Memory budget for shards written at once "
                                                  "(default 1GiB).")]
SetPrefixOpt = Annotated[Optional[str], typer.Option("--prefix", metavar="NAME", help="Which shard set, when the root holds "
                                                     "several (default: the only one).")]

DEFAULT_SHARD_SIZE = "256MiB"
DEFAULT_PREFIX = "shard"
DEFAULT_MEMORY = "1GiB"


def _pack(src: str, dst: str, fmt: str, shard_size: str | None, max_count: int | None, prefix: str | None,
          row_group_size: str | None, memory: str | None, concurrency: int | None, chunk_size: str | None,
          store_checksums: str | None, dry_run: bool, as_json: bool, quiet: bool, profile: str | None,
          config: str | None, bwlimit: str | None = None, bwlimit_file: Path | None = None,
          max_cost: float | None = None, filters=None) -> None:
    from bridge.packing import job
    fmt = str(fmt)
    for flag, value in (("--format", fmt), ("--shard-size", shard_size), ("--prefix", prefix),
                        ("--row-group-size", row_group_size), ("--memory", memory)):
        given(flag, value)
    if fmt != "parquet":
        refuse_unused(f"to {fmt} shards (parquet only)", **{"--row-group-size": row_group_size})
    shard_size, memory = shard_size or DEFAULT_SHARD_SIZE, memory or DEFAULT_MEMORY
    prefix = DEFAULT_PREFIX if prefix is None else prefix
    settings = settings_from_flags(profile, config, concurrency, chunk_size, store_checksums, bwlimit=bwlimit,
                                   bwlimit_file=bwlimit_file)
    options = {"row_group_size": size_flag("--row-group-size", row_group_size)} if row_group_size else {}
    kwargs = dict(fmt=fmt, prefix=prefix, shard_size=size_flag("--shard-size", shard_size), max_count=max_count,
                  options=options, memory=size_flag("--memory", memory))
    if filters is not None:
        kwargs["filters"] = filters
    if dry_run:
        summary = job.pack(src, dst, settings, dry_run=True, **kwargs)
        if filters is not None:
            summary["filters"] = filters.to_dict()
        if as_json:
            emit(summary, True, "")
            return
        for row in summary["plan"]:
            out.print(f"shard {row['shard']}  {plural(row['files'], 'file')}  {human_bytes(row['size'])}", markup=False)
        out.print(f"would pack {plural(summary['files'], 'file')}, {human_bytes(summary['bytes'])} from "
                  f"{summary['source']} into {plural(summary['shards'], summary['format'] + ' shard')} at "
                  f"{summary['destination']}", markup=False)
        print_usage(summary["usage"])
        return
    with ProgressBar(not as_json, settings, bwlimit_file, quiet) as progress:
        summary = job.pack(src, dst, settings, progress=progress, max_cost=max_cost, **kwargs)
    if filters is not None:
        summary["filters"] = filters.to_dict()
    emit(summary, as_json, f"packed {plural(summary['files'], 'file')}, {human_bytes(summary['bytes'])} into "
         f"{plural(summary['shards'], summary['format'] + ' shard')} ({human_bytes(summary['shard_bytes'])}) in "
         f"{summary['elapsed_s']:.1f}s; index {summary['index']}; manifest {summary['manifest']}", quiet)


def pack(src: str, dst: str, fmt: FormatOpt = ShardFormat.tar, shard_size: ShardSizeOpt = None,
         max_count: MaxCountOpt = None, prefix: PrefixOpt = None, row_group_size: RowGroupOpt = None,
         memory: MemoryOpt = None, concurrency: ConcOpt = None, chunk_size: ChunkOpt = None,
         store_checksums: StoreSumOpt = None, bwlimit: BwlimitOpt = None, bwlimit_file: BwlimitFileOpt = None,
         include: IncludeOpt = None, exclude: ExcludeOpt = None, files_from: FilesFromOpt = None,
         min_size: MinSizeOpt = None, max_size: MaxSizeOpt = None, min_age: MinAgeOpt = None,
         max_age: MaxAgeOpt = None,
         dry_run: DryOpt = False, as_json: JsonOpt = False,
         quiet: QuietOpt = False, max_cost: MaxCostOpt = None, profile: ProfileOpt = None,
         config: ConfigOpt = None) -> None:
    """Pack the files under SRC (those the filters select) into tar (WebDataset) or Parquet
    shards at DST, with an index."""
    filters = filters_from_flags(include, exclude, files_from, min_size, max_size, min_age, max_age)
    _pack(src, dst, fmt, shard_size, max_count, prefix, row_group_size, memory, concurrency, chunk_size,
          store_checksums, dry_run, as_json, quiet, profile, config, bwlimit, bwlimit_file, max_cost, filters)


def migrate(src: str, dst: str, pack_format: PackOpt = None, shard_size: ShardSizeOpt = None,
            max_count: MaxCountOpt = None, prefix: PrefixOpt = None, row_group_size: RowGroupOpt = None,
            memory: MemoryOpt = None, concurrency: ConcOpt = None, chunk_size: ChunkOpt = None,
            store_checksums: StoreSumOpt = None, bwlimit: BwlimitOpt = None, bwlimit_file: BwlimitFileOpt = None,
            include: IncludeOpt = None, exclude: ExcludeOpt = None, files_from: FilesFromOpt = None,
            min_size: MinSizeOpt = None, max_size: MaxSizeOpt = None, min_age: MinAgeOpt = None,
            max_age: MaxAgeOpt = None,
            dry_run: DryOpt = False, as_json: JsonOpt = False,
            quiet: QuietOpt = False, max_cost: MaxCostOpt = None, route: RouteOpt = None,
            profile: ProfileOpt = None, config: ConfigOpt = None, sha256: Sha256Opt = False) -> None:
    """Move a corpus from SRC to DST in one pass (the files the filters select), packing it
    into shards with --pack; the destination gets its index and a commit in _bridge/log/.
    (Shards always record their whole SHA-256: --sha256 matters without --pack.)"""
    filters = filters_from_flags(include, exclude, files_from, min_size, max_size, min_age, max_age)
    if pack_format:
        refuse_unused("with --pack (packing writes through this process)", **{"--route": route})
        _pack(src, dst, pack_format, shard_size, max_count, prefix, row_group_size, memory, concurrency,
              chunk_size, store_checksums, dry_run, as_json, quiet, profile, config, bwlimit, bwlimit_file, max_cost,
              filters)
        return
    from bridge import ops
    refuse_unused("without --pack", **{"--shard-size": shard_size, "--max-count": max_count, "--prefix": prefix,
                                       "--row-group-size": row_group_size, "--memory": memory})
    settings = settings_from_flags(profile, config, concurrency, chunk_size, store_checksums, bwlimit=bwlimit,
                                   bwlimit_file=bwlimit_file, route=route, sha256=sha256)
    if dry_run:
        print_plan(ops.copy(src, dst, settings, chunk_size=settings.transfer.chunk_size, dry_run=True,
                            route=route, filters=filters), as_json)
        return
    with ProgressBar(not as_json, settings, bwlimit_file, quiet) as progress:
        summary = ops.copy(src, dst, settings, chunk_size=settings.transfer.chunk_size, progress=progress,
                           max_cost=max_cost, route=route, filters=filters, verb="migrate")
    emit(summary, as_json, f"migrated {plural(summary['files'], 'file')}, {moved_line(summary)}"
         f"{route_line(summary)}; manifest {summary['manifest']}", quiet)


def unpack(src: str, dst: str, prefix: SetPrefixOpt = None, concurrency: ConcOpt = None,
           dry_run: DryOpt = False, as_json: JsonOpt = False, quiet: QuietOpt = False, profile: ProfileOpt = None,
           config: ConfigOpt = None) -> None:
    """Restore the files packed at SRC (a shard set, its .index.json, or .tar/.parquet shards)
    into DST, checking every file against its hash; unsafe members stop it before any write."""
    from bridge.packing.unpack import unpack as run
    given("--prefix", prefix)
    settings = settings_from_flags(profile, config, concurrency)
    if dry_run:
        summary = run(src, dst, settings, prefix=prefix, dry_run=True)
        if as_json:
            emit(summary, True, "")
            return
        out.print(f"would unpack {plural(summary['files'], 'file')}, {human_bytes(summary['bytes'])} from "
                  f"{plural(summary['shards'], 'shard')} at {summary['source']} into {summary['destination']}",
                  markup=False)
        print_usage(summary["usage"])
        return
    with ProgressBar(not as_json, quiet=quiet) as progress:
        summary = run(src, dst, settings, prefix=prefix, progress=progress)
    checked = "every file checked against the index" if summary["verified"] else \
        "no index: file hashes not checked"
    emit(summary, as_json, f"unpacked {plural(summary['files'], 'file')}, {human_bytes(summary['bytes'])} from "
         f"{plural(summary['shards'], 'shard')} in {summary['elapsed_s']:.1f}s ({checked}); "
         f"manifest {summary['manifest']}", quiet)


def register(app: typer.Typer) -> None:
    app.command()(pack)
    app.command()(unpack)
    app.command()(migrate)
