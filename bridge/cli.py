"""mcbridge: the command line. Errors become one line on stderr and an exit code (2 for bad
input, 1 for failures at run time), never a traceback."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, Progress as Bar, TextColumn, TimeRemainingColumn,
                           TransferSpeedColumn)

from bridge import __version__
from bridge import bwlimit as limits
from bridge.bwlimit import parse_rate
from bridge.config import Settings, load_settings, parse_size
from bridge.errors import BridgeError, InvalidOption
from bridge.progress import Progress, human_bytes
from bridge.redact import redact

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Move ML corpora and checkpoints between local/Lustre, s3://, gs:// and az://.")
err = Console(stderr=True, highlight=False)
out = Console(highlight=False, soft_wrap=True)

ProfileOpt = Annotated[Optional[str], typer.Option("--profile", help="Profile in the settings file.")]
ConfigOpt = Annotated[Optional[Path], typer.Option("--config", help="Settings file (YAML).")]
ConcOpt = Annotated[Optional[int], typer.Option("--concurrency", "-j", min=1, max=256,
                                                help="Units (files or parts) in flight at once.")]
ChunkOpt = Annotated[Optional[str], typer.Option("--chunk-size", help="Part size, e.g. 16MiB (default: "
                                                 "derived from the destination's limits).")]
StoreSumOpt = Annotated[Optional[str], typer.Option(
    "--store-checksums", help="After a multipart upload: require the store's whole-object checksum "
    "(default), read the object back when the store keeps none (readback), or skip the check.")]
BwlimitOpt = Annotated[Optional[str], typer.Option(
    "--bwlimit", help="Bytes per second across all of the job's connections, e.g. 50MiB (0: none). "
    "kill -USR2 the running process to toggle it off and on.")]
BwlimitFileOpt = Annotated[Optional[Path], typer.Option(
    "--bwlimit-file", help="Read the limit from FILE at start and again on each SIGUSR2.")]
RouteOpt = Annotated[Optional[str], typer.Option(
    "--route", help="How the bytes go: direct (through this process), server (the store copies inside "
    "one account), from-url (Azure pulls from a signed URL of S3 or GCS), or a native route. "
    "Default: chosen per pair (see README).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print a machine-readable summary.")]
DryOpt = Annotated[bool, typer.Option("--dry-run", help="Print the plan; move nothing.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")]
MaxCostOpt = Annotated[Optional[float], typer.Option(
    "--max-cost", min=0, help="Refuse, before any data request, a job estimated above this many US dollars "
    "(see mcbridge plan).")]


def settings_from_flags(profile: str | None, config: Path | None, concurrency: int | None = None,
              chunk_size: str | None = None, store_checksums: str | None = None, *,
              bwlimit: str | None = None, bwlimit_file: Path | None = None) -> Settings:
    transfer: dict[str, Any] = {}
    if bwlimit_file is not None:
        try:
            bwlimit = bwlimit_file.read_text()
        except OSError as exc:
            raise InvalidOption(f"--bwlimit-file {bwlimit_file}: {exc.strerror or exc}") from None
    if bwlimit is not None:
        transfer["bwlimit"] = parse_rate(bwlimit) or 0
    if store_checksums:
        transfer["store_checksums"] = store_checksums
    if concurrency:
        transfer["concurrency"] = concurrency
    if chunk_size:
        transfer["chunk_size"] = parse_size(chunk_size)
    return load_settings({"transfer": transfer}, profile=profile, config_path=config)


class ProgressBar:
    """A rich progress bar fed by the job's Progress object, which carries the job's bandwidth
    limit (changed by SIGUSR2 while the job runs)."""

    def __init__(self, enabled: bool, settings: Settings | None = None, bwlimit_file: Path | None = None):
        self.enabled = enabled and err.is_terminal
        self.settings, self.bwlimit_file = settings, bwlimit_file
        self.bar = Bar(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                       TimeRemainingColumn(), console=err, transient=False, disable=not self.enabled)
        self.task = None

    def __enter__(self) -> Progress:
        progress = Progress()
        if self.settings is not None:
            rate = self.settings.transfer.bwlimit
            progress.limiter = limits.local(rate)
            limits.install_signal(progress.limiter, rate, self.bwlimit_file)
        if self.enabled:
            self.bar.start()
            self.task = self.bar.add_task("copying", total=None)
            progress.listeners.append(self._update)
        return progress

    def _update(self, p: Progress) -> None:
        self.bar.update(self.task, total=p.bytes_total or None, completed=p.bytes_done,
                        description=f"{p.files_done} files")

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self.bar.stop()


def emit(summary: dict, as_json: bool, line: str) -> None:
    if as_json:
        out.print_json(json.dumps(summary, default=str))
    else:
        out.print(line)


@app.command()
def ls(url: str, profile: ProfileOpt = None, config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """List objects under URL (recursively) with their sizes."""
    from bridge import ops
    rows = ops.ls(url, settings_from_flags(profile, config))
    if as_json:
        out.print_json(json.dumps(rows))
        return
    for row in rows:
        out.print(f"{row['size']:>14}  {row['path']}", markup=False)


@app.command()
def cp(src: str, dst: str, concurrency: ConcOpt = None, chunk_size: ChunkOpt = None,
       store_checksums: StoreSumOpt = None, bwlimit: BwlimitOpt = None, bwlimit_file: BwlimitFileOpt = None,
       dry_run: DryOpt = False, as_json: JsonOpt = False, quiet: QuietOpt = False,
       max_cost: MaxCostOpt = None, route: RouteOpt = None, profile: ProfileOpt = None,
       config: ConfigOpt = None) -> None:
    """Copy SRC to DST: one object, or every object under a directory or prefix (trailing slash)."""
    from bridge import ops
    settings = settings_from_flags(profile, config, concurrency, chunk_size, store_checksums, bwlimit=bwlimit,
                                   bwlimit_file=bwlimit_file)
    if dry_run:
        summary = ops.copy(src, dst, settings, chunk_size=settings.transfer.chunk_size, dry_run=True,
                           route=route)
        print_plan(summary, as_json)
        return
    with ProgressBar(not quiet and not as_json, settings, bwlimit_file) as progress:
        summary = ops.copy(src, dst, settings, chunk_size=settings.transfer.chunk_size, progress=progress,
                           max_cost=max_cost, route=route)
    emit(summary, as_json, f"copied {summary['files']} files, {human_bytes(summary['bytes'])} in "
          f"{summary['elapsed_s']:.1f}s ({human_bytes(summary['rate_bytes_per_s'])}/s){route_line(summary)}; "
          f"manifest {summary['manifest']}")


@app.command()
def sync(src: str, dst: str, delete: Annotated[bool, typer.Option("--delete", help="Remove from DST what "
                                                                  "SRC no longer has.")] = False,
         concurrency: ConcOpt = None, chunk_size: ChunkOpt = None, store_checksums: StoreSumOpt = None,
         bwlimit: BwlimitOpt = None, bwlimit_file: BwlimitFileOpt = None,
         dry_run: DryOpt = False, as_json: JsonOpt = False, quiet: QuietOpt = False,
         max_cost: MaxCostOpt = None, route: RouteOpt = None, profile: ProfileOpt = None,
         config: ConfigOpt = None) -> None:
    """Make DST equal to SRC: send what is new or changed (by size and checksum, not time), repair
    what no longer matches the manifest, and with --delete remove what SRC no longer has."""
    from bridge import ops
    settings = settings_from_flags(profile, config, concurrency, chunk_size, store_checksums, bwlimit=bwlimit,
                                   bwlimit_file=bwlimit_file)
    if dry_run:
        summary = ops.sync(src, dst, settings, delete=delete, chunk_size=settings.transfer.chunk_size,
                           dry_run=True, route=route)
        print_plan(summary, as_json)
        return
    with ProgressBar(not quiet and not as_json, settings, bwlimit_file) as progress:
        summary = ops.sync(src, dst, settings, delete=delete, chunk_size=settings.transfer.chunk_size,
                           progress=progress, max_cost=max_cost, route=route)
    r = summary["reasons"]
    emit(summary, as_json, f"sent {len(summary['sent'])} files ({r['new']} new, {r['changed']} changed, "
          f"{r['repaired']} repaired), {r['unchanged']} unchanged, deleted {len(summary['deleted'])}; "
          f"{human_bytes(summary['bytes'])} in {summary['elapsed_s']:.1f}s{route_line(summary)}; "
          f"manifest {summary['manifest']}")


def route_line(summary: dict) -> str:
    """", by server (0 B through bridge; 2 files direct: ...)" for a job that used a route."""
    route = summary.get("route") or {}
    if route.get("name", "direct") == "direct":
        return ""
    fell = route.get("fallbacks") or {}
    tail = f"; {len(fell)} files direct: {next(iter(fell.values()))}" if fell else ""
    return f", by {route['name']} ({human_bytes(route['bytes_through_bridge'])} through bridge{tail})"


@app.command()
def verify(url: str, deep: Annotated[bool, typer.Option("--deep", help="Re-read and rehash every object "
                                                        "instead of trusting store-reported checksums.")] = False,
           concurrency: ConcOpt = None, as_json: JsonOpt = False, profile: ProfileOpt = None,
           config: ConfigOpt = None) -> None:
    """Check every object under URL against its manifest; exit 1 naming each missing, extra or
    mismatched file."""
    from bridge import ops
    report = ops.verify(url, settings_from_flags(profile, config, concurrency), deep=deep)
    if as_json:
        out.print_json(json.dumps(report))
    else:
        for path in report["missing"]:
            out.print(f"missing     {path}", markup=False)
        for path in report["extra"]:
            out.print(f"extra       {path}", markup=False)
        for row in report["mismatched"]:
            out.print(f"mismatched  {row['path']}: {row['reason']}", markup=False)
        for row in report["rehashed"]:
            out.print(f"rehashed    {row['path']}: {row['reason']}", markup=False)
        for shard_set in report["shard_sets"]:
            for problem in shard_set["problems"]:
                out.print(f"shard set   {shard_set['index']}: {problem}", markup=False)
            if shard_set["ok"]:
                out.print(f"shard set   {shard_set['index']}: intact", markup=False)
        verdict = "OK" if report["ok"] else "FAILED"
        out.print(f"{verdict}: {report['checked']} files, {human_bytes(report['bytes'])} checked "
                  f"({'deep' if deep else 'store checksums'}) at {report['url']}; "
                  f"{len(report['missing'])} missing, {len(report['extra'])} extra, "
                  f"{len(report['mismatched'])} mismatched"
                  + (f", {len(report['rehashed'])} rewritten with equal bytes" if report["rehashed"] else ""),
                  markup=False)
    if not report["ok"]:
        raise typer.Exit(1)


def print_plan(summary: dict, as_json: bool) -> None:
    if as_json:
        out.print_json(json.dumps(summary))
        return
    for row in summary["plan"]:
        parts = f"{row['parts']} parts of {human_bytes(row['part_size'])}" if row["part_size"] else "1 request"
        out.print(f"copy {row['path']}  {human_bytes(row['size'])}  ({parts})", markup=False)
    for rel in summary.get("delete", []):
        out.print(f"delete {rel}", markup=False)
    out.print(f"would copy {summary['files']} files, {human_bytes(summary['bytes'])} from {summary['source']} "
              f"to {summary['destination']} in {summary['units']} units", markup=False)


@app.command()
def uploads(url: str, abort: Annotated[bool, typer.Option("--abort", help="Abort them.")] = False,
            as_json: JsonOpt = False, profile: ProfileOpt = None, config: ConfigOpt = None) -> None:
    """List (or --abort) the unfinished multipart uploads under URL that killed copies left behind.
    A copy aborts the leftovers of the objects it writes by itself."""
    from bridge import ops
    rows = ops.uploads(url, settings_from_flags(profile, config), abort=abort)
    if as_json:
        out.print_json(json.dumps(rows))
        return
    for row in rows:
        out.print(f"{'aborted' if abort else 'unfinished'}  {row['object']}  ({row['upload_id']})", markup=False)
    out.print(f"{len(rows)} unfinished uploads{' aborted' if abort else ''} under {url}", markup=False)


@app.command()
def version() -> None:
    """Print bridge's version."""
    out.print(__version__)


# Command groups that live in their own modules; each exposes ``register(app)`` and imports its
# heavy dependencies (Celery, pyarrow) only when one of its commands runs.
EXTENSIONS = ("bridge.packing.commands", "workers.commands", "bridge.policy_commands")


def _register_extensions() -> None:
    import importlib
    for name in EXTENSIONS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue  # that part of bridge is not installed here
            raise
        module.register(app)


def fail(message: str, code: int) -> None:
    """The one way an error leaves the CLI: secrets masked, one line (a message that lists several
    problems on lines of their own, or an SDK text with a line break, is joined with '; ')."""
    line = "; ".join(part.strip() for part in redact(message).splitlines() if part.strip())
    err.print(f"mcbridge: error: {line}", markup=False, soft_wrap=True)
    sys.exit(code)


def main() -> None:
    _register_extensions()
    try:
        code = app(standalone_mode=False)  # returns the code of a typer.Exit
    except BridgeError as exc:
        fail(str(exc), exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        err.print("mcbridge: aborted", markup=False)
        sys.exit(130)
    except KeyboardInterrupt:
        err.print("mcbridge: interrupted; run the same command again to resume", markup=False)
        sys.exit(130)
    except Exception as exc:
        # Usage errors of typer's (vendored) click arrive here in non-standalone mode.
        if hasattr(exc, "format_message") and isinstance(getattr(exc, "exit_code", None), int):
            fail(exc.format_message(), exc.exit_code)
        # A bug of ours: still one line, and an SDK's text in it may quote a signed URL.
        fail(f"internal error: {type(exc).__name__}: {exc}", 1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
