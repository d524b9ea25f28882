"""The object commands: ``mcbridge ls``, ``du``, ``cat``, ``rm``, ``mv``, ``hashsum`` and ``mb``
(the work is bridge/objects.py's and bridge/ops.py's)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from bridge.cli.options import (ChunkOpt, ConcOpt, ConfigOpt, DryOpt, ExcludeOpt, FilesFromOpt, IncludeOpt, JsonOpt,
                                ListQuietOpt, force_opt,
                                MaxAgeOpt, MaxCostOpt, MaxSizeOpt, MinAgeOpt, MinSizeOpt, ProfileOpt, ProgressBar,
                                QuietOpt, RouteOpt, StoreSumOpt, emit, filters_from_flags, given, moved_line, out,
                                print_plan, route_line, settings_from_flags, shown)
from bridge.errors import InvalidOption
from bridge.progress import human_bytes, plural

UrlArg = Annotated[str, typer.Argument(metavar="URL", help="A local path or an s3://, gs://, az:// URL.")]
RecursiveOpt = Annotated[bool, typer.Option("--recursive", "-R", "-r", help="Every object under URL, not one level.")]
HumanOpt = Annotated[bool, typer.Option("--human-readable", "-H", help="Sizes in KiB, MiB, GiB.")]
SetPrefixOpt = Annotated[Optional[str], typer.Option("--prefix", metavar="NAME", help="Which shard set, when the "
                                                     "root holds several (default: the only one).")]
RemoveForceOpt = force_opt("Remove even a whole bucket or container, the filesystem root, a system folder or a "
                           "home folder (refused without it).")
OutputOpt = Annotated[Optional[Path], typer.Option("--output", "-o", metavar="FILE", help="Write to FILE, not stdout.")]


def _size(n: int, human: bool) -> str:
    return human_bytes(n) if human else str(n)


def _when(epoch: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch)) if epoch is not None else "-"


def _version(identity: dict) -> str:
    """The field that names this version of the object: S3/Azure ETag, GCS generation, a file's inode."""
    for key in ("generation", "version_id", "etag", "inode"):
        if identity.get(key):
            return f"{key}={identity[key]}"
    return "-"


def ls(url: UrlArg,
       recursive: RecursiveOpt = False,
       long: Annotated[bool, typer.Option("--long", "-l", help="Size, modified time, storage class, version "
                                          "(ETag, generation) and a total.")] = False,
       human: HumanOpt = False,
       include: IncludeOpt = None, exclude: ExcludeOpt = None, files_from: FilesFromOpt = None,
       min_size: MinSizeOpt = None, max_size: MaxSizeOpt = None, min_age: MinAgeOpt = None,
       max_age: MaxAgeOpt = None,
       as_json: JsonOpt = False, quiet: ListQuietOpt = False, profile: ProfileOpt = None,
       config: ConfigOpt = None) -> None:
    """List the objects and folders directly under URL (every object with -R); s3://, gs:// or
    az:// alone lists the buckets. -q: the rows only (no progress, no -l total)."""
    from bridge import objects, ops
    filters = filters_from_flags(include, exclude, files_from, min_size, max_size, min_age, max_age)
    settings = settings_from_flags(profile, config)
    scheme = objects.bucket_scheme(url)
    if scheme:
        rows = objects.buckets(scheme, settings)
        if as_json:
            out.print_json(json.dumps(rows))
            return
        for row in rows:
            out.print(row["path"], markup=False)
        return
    with ProgressBar(not as_json, quiet=quiet) as progress:
        rows = ops.ls(url, settings, recursive=recursive or filters is not None and filters.files_from is not None,
                      filters=filters, progress=progress)
    if as_json:
        out.print_json(json.dumps(rows))
        return
    for row in rows:
        size = ("-" if long else "DIR") if row.get("dir") else _size(row["size"], human)
        if long:
            kind = "DIR" if row.get("dir") else (row["storage_class"] or "-")
            out.print(f"{size:>14}  {_when(row['modified'])}  {kind:<12} {_version(row['identity']):<40} "
                      f"{shown(row['path'])}", markup=False)
        else:
            out.print(f"{size:>14}  {shown(row['path'])}", markup=False)
    if long and not quiet:
        objs = [row for row in rows if not row.get("dir")]
        folders = len(rows) - len(objs)
        out.print(f"total: {plural(len(objs), 'object')}, {human_bytes(sum(r['size'] for r in objs))}"
                  + (f" and {plural(folders, 'folder')} (mcbridge du counts what is in them)" if folders else ""),
                  markup=False)


def du(url: UrlArg, human: HumanOpt = False,
       summarize: Annotated[bool, typer.Option("--summarize", "-s", help="Only the total.")] = False,
       include: IncludeOpt = None, exclude: ExcludeOpt = None, files_from: FilesFromOpt = None,
       min_size: MinSizeOpt = None, max_size: MaxSizeOpt = None, min_age: MinAgeOpt = None,
       max_age: MaxAgeOpt = None,
       as_json: JsonOpt = False, quiet: ListQuietOpt = False, profile: ProfileOpt = None,
       config: ConfigOpt = None) -> None:
    """Objects and bytes under URL: per folder directly under it, and in total (-q: no progress)."""
    from bridge import objects
    filters = filters_from_flags(include, exclude, files_from, min_size, max_size, min_age, max_age)
    with ProgressBar(not as_json, quiet=quiet) as progress:
        report = objects.du(url, settings_from_flags(profile, config), filters=filters, progress=progress)
    if as_json:
        out.print_json(json.dumps(report))
        return
    if not summarize:
        for row in report["folders"]:
            out.print(f"{_size(row['bytes'], human):>14}  {row['objects']:>9}  {shown(row['path'])}", markup=False)
    out.print(f"{_size(report['bytes'], human):>14}  {report['objects']:>9}  total "
              f"({plural(report['objects'], 'object')}, {human_bytes(report['bytes'])})", markup=False)


def cat(url: UrlArg,
        member: Annotated[Optional[str], typer.Argument(metavar="[PATH]", help="A file of the shard set URL "
                                                        "(read by one ranged request through its index).")] = None,
        offset: Annotated[int, typer.Option("--offset", metavar="N", help="Start at byte N (negative: N bytes "
                                            "before the end).")] = 0,
        count: Annotated[Optional[int], typer.Option("--count", metavar="N", min=0,
                                                     help="At most N bytes.")] = None,
        prefix: SetPrefixOpt = None, output: OutputOpt = None,
        profile: ProfileOpt = None, config: ConfigOpt = None) -> None:
    """Print the object URL (or a range of it), or with PATH one file of the shard set URL."""
    if output is not None:   # before the read: a file that cannot be written is bad input, not a crash after it
        given("--output", str(output))
        if output.is_dir():
            raise InvalidOption(f"--output {output} is a directory: name a file")
        if not output.parent.is_dir():
            raise InvalidOption(f"--output {output}: {output.parent} is not a directory")
    settings = settings_from_flags(profile, config)
    if member is not None:
        from bridge.packing.reading import cat as read_one
        data, _where = read_one(url, member, settings, prefix)
        data = data[offset:] if offset >= 0 else data[len(data) + offset:]
        _write_all([data[:count] if count is not None else data], output)
        return
    if prefix is not None:
        raise InvalidOption("--prefix names a shard set: give the file's PATH too")
    from bridge import objects
    sink = open(output, "wb") if output is not None else None   # noqa: SIM115 (closed below)
    try:
        write = sink.write if sink is not None else sys.stdout.buffer.write
        objects.cat(url, settings, write, offset=offset, count=count)
    except OSError as exc:
        raise InvalidOption(f"--output {output} cannot be written: {exc.strerror or exc}") from None
    finally:
        if sink is not None:
            sink.close()
        else:
            sys.stdout.buffer.flush()


def _write_all(pieces: list[bytes], output: Path | None) -> None:
    if output is None:
        for piece in pieces:
            sys.stdout.buffer.write(piece)
        sys.stdout.buffer.flush()
        return
    try:
        output.write_bytes(b"".join(pieces))
    except OSError as exc:
        raise InvalidOption(f"--output {output} cannot be written: {exc.strerror or exc}") from None


def rm(url: UrlArg, recursive: RecursiveOpt = False,
       include: IncludeOpt = None, exclude: ExcludeOpt = None, files_from: FilesFromOpt = None,
       min_size: MinSizeOpt = None, max_size: MaxSizeOpt = None, min_age: MinAgeOpt = None,
       max_age: MaxAgeOpt = None,
       concurrency: ConcOpt = None, dry_run: DryOpt = False, as_json: JsonOpt = False, quiet: QuietOpt = False,
       force: RemoveForceOpt = False, profile: ProfileOpt = None, config: ConfigOpt = None) -> None:
    """Remove the object URL, or with -r every object under the prefix URL (those the filters
    select). --dry-run lists what would go. A whole bucket (s3://B/, gs://B/, az://CONTAINER/),
    the filesystem root or a system folder needs --force."""
    from bridge import objects
    filters = filters_from_flags(include, exclude, files_from, min_size, max_size, min_age, max_age)
    settings = settings_from_flags(profile, config, concurrency)
    with ProgressBar(not as_json and not dry_run, quiet=quiet) as progress:
        summary = objects.remove(url, settings, recursive=recursive, filters=filters, dry_run=dry_run,
                                 progress=progress, force=force)
    if dry_run and not as_json:
        for loc in summary["removed"]:
            out.print(f"would remove {shown(loc)}", markup=False)
        out.print(f"would remove {plural(summary['objects'], 'object')}, {human_bytes(summary['bytes'])}", markup=False)
        if summary.get("refused"):
            out.print(f"a run would be refused: {summary['refused']}", markup=False)
        return
    emit(summary, as_json, f"removed {plural(summary['objects'], 'object')}, {human_bytes(summary['bytes'])} "
         f"under {summary['url']}", quiet)


def mv(src: Annotated[str, typer.Argument(metavar="SRC")], dst: Annotated[str, typer.Argument(metavar="DST")],
       include: IncludeOpt = None, exclude: ExcludeOpt = None, files_from: FilesFromOpt = None,
       min_size: MinSizeOpt = None, max_size: MaxSizeOpt = None, min_age: MinAgeOpt = None,
       max_age: MaxAgeOpt = None,
       concurrency: ConcOpt = None, chunk_size: ChunkOpt = None, store_checksums: StoreSumOpt = None,
       dry_run: DryOpt = False, as_json: JsonOpt = False, quiet: QuietOpt = False, max_cost: MaxCostOpt = None,
       route: RouteOpt = None, force: RemoveForceOpt = False, profile: ProfileOpt = None,
       config: ConfigOpt = None) -> None:
    """Move SRC to DST: copy, prove each copied object against the destination's manifest, then
    remove it from the source. Nothing is removed unless every copy is proven. A whole bucket,
    the filesystem root or a system folder as SRC needs --force."""
    from bridge import objects
    filters = filters_from_flags(include, exclude, files_from, min_size, max_size, min_age, max_age)
    settings = settings_from_flags(profile, config, concurrency, chunk_size, store_checksums, route=route)
    if dry_run:
        print_plan(objects.move(src, dst, settings, filters=filters, chunk_size=settings.transfer.chunk_size,
                                dry_run=True, route=route), as_json)
        return
    with ProgressBar(not as_json, settings, quiet=quiet) as progress:
        summary = objects.move(src, dst, settings, filters=filters, chunk_size=settings.transfer.chunk_size,
                               progress=progress, max_cost=max_cost, route=route, force=force)
    emit(summary, as_json, f"moved {plural(summary['files'], 'file')}, {moved_line(summary)}{route_line(summary)}; "
         f"manifest {summary['manifest']}", quiet)


def hashsum(algorithm: Annotated[str, typer.Argument(metavar="HASH", help="crc32c, md5 or sha256.")],
            url: UrlArg,
            include: IncludeOpt = None, exclude: ExcludeOpt = None, files_from: FilesFromOpt = None,
            min_size: MinSizeOpt = None, max_size: MaxSizeOpt = None, min_age: MinAgeOpt = None,
            max_age: MaxAgeOpt = None,
            concurrency: ConcOpt = None, as_json: JsonOpt = False, quiet: ListQuietOpt = False,
            profile: ProfileOpt = None, config: ConfigOpt = None) -> None:
    """Print the crc32c, md5 or sha256 of the object URL or of every object under it: from the
    manifest of a bridge copy when it records that version, else as the store reports it, else
    read and computed here. Lines as sha256sum prints them (-q: no progress)."""
    from bridge import objects
    filters = filters_from_flags(include, exclude, files_from, min_size, max_size, min_age, max_age)
    settings = settings_from_flags(profile, config, concurrency)
    with ProgressBar(not as_json, quiet=quiet) as progress:
        rows = objects.hashsum(algorithm.lower(), url, settings, filters=filters, progress=progress)
    if as_json:
        out.print_json(json.dumps(rows))
        return
    for row in rows:
        out.print(f"{row['hash']}  {shown(row['path'])}", markup=False)


def mb(url: UrlArg, as_json: JsonOpt = False, profile: ProfileOpt = None, config: ConfigOpt = None) -> None:
    """Make the bucket (container) URL, in the region of the settings (s3.region); a local path
    becomes a folder."""
    from bridge import objects
    summary = objects.make_bucket(url, settings_from_flags(profile, config))
    emit(summary, as_json, f"made {summary['made']}")


def register(app: typer.Typer) -> None:
    for command in (ls, du, cat, rm, mv, hashsum, mb):
        app.command()(command)
