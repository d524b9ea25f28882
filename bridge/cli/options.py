"""What every command group shares: the consoles, the options (one flag, one type, one check,
wherever it appears), settings from flags, the progress bar and the way a summary is printed.

Each option exists as a ready ``Annotated`` type (``ConcOpt``) and, where a group means something
slightly different by it (``mcbridge submit`` runs units in each worker task, not in this
process), as a factory taking only the help text (``concurrency_opt("...")``): the flag's name,
type and limits stay the same everywhere.
"""

from __future__ import annotations

import collections.abc
import json
from pathlib import Path
from enum import StrEnum
from typing import Annotated, Any, Optional

import typer

from bridge import bwlimit as limits
from bridge.api import (MAX_USD, STORE_CHECKSUMS, dir_problem, filters_of, given, settings_of,  # noqa: F401
                        size_flag, transfer_flags, usable_dirs, usd_amount)
from bridge.cli.console import Console, shown
from bridge.config import Settings
from bridge.errors import InvalidOption
from bridge.progress import Progress, human_bytes, human_duration, plural

err = Console(stderr=True, highlight=False)
out = Console(highlight=False, soft_wrap=True)


def print_findings(report: dict, kinds: tuple[str, ...]) -> None:
    """One line per object a check listed, kind by kind in the given order: a bare path, or a
    row with its reason (``missing     a/b``, ``differ      a/c: size 3, 4``)."""
    for kind in kinds:
        for found in report.get(kind, []):
            path, why = (found["path"], f": {found['reason']}") if isinstance(found, dict) else (found, "")
            out.print(f"{kind:<11} {shown(path)}{why}", markup=False)


def concurrency_opt(help: str = "Units (files or parts) in flight at once."):
    return Annotated[Optional[int], typer.Option("--concurrency", "-j", metavar="N", min=1, max=256, help=help)]


class StoreChecksums(StrEnum):
    """--store-checksums: an enum, so that --help lists the values and a typo is refused by name."""
    require = "require"
    readback = "readback"
    skip = "skip"


class VerifyMode(StrEnum):
    store = "store"
    deep = "deep"
    none = "none"


class ShardFormat(StrEnum):
    tar = "tar"
    parquet = "parquet"


def chunk_size_opt(help: str = "Part size, e.g. 16MiB (default: derived from the destination's limits)."):
    return Annotated[Optional[str], typer.Option("--chunk-size", metavar="SIZE", help=help)]


def store_checksums_opt(help: str = "After a multipart upload: require the store's whole-object checksum "
                        "(default), read the object back when the store keeps none (readback), or skip the check."):
    return Annotated[Optional[StoreChecksums], typer.Option("--store-checksums", help=help)]


def bwlimit_opt(help: str = "Bytes per second across all of the job's connections, e.g. 50MiB (0: none). "
                "kill -USR2 the running process to toggle it off and on."):
    return Annotated[Optional[str], typer.Option("--bwlimit", metavar="RATE", help=help)]


def json_opt(help: str = "Print a machine-readable summary."):
    return Annotated[bool, typer.Option("--json", help=help)]


def dry_run_opt(help: str = "Print the plan; move nothing."):
    return Annotated[bool, typer.Option("--dry-run", help=help)]


def max_cost_opt(help: str = "Refuse, before any data request, a job estimated above this many US dollars "
                 "(see mcbridge plan)."):
    return Annotated[Optional[float], typer.Option("--max-cost", metavar="USD", min=0, help=help,
                                                   callback=lambda usd: usd_amount("--max-cost", usd))]


def profile_opt(help: str = "Profile in the settings file."):
    return Annotated[Optional[str], typer.Option("--profile", metavar="NAME", help=help)]


ProfileOpt = profile_opt()
# A string, not a Path: typer turns an empty Path into ".", and --config '' must be refused as empty.
ConfigOpt = Annotated[Optional[str], typer.Option("--config", metavar="FILE", help="Settings file (YAML).")]
ConcOpt = concurrency_opt()
ChunkOpt = chunk_size_opt()
StoreSumOpt = store_checksums_opt()
BwlimitOpt = bwlimit_opt()
BwlimitFileOpt = Annotated[Optional[Path], typer.Option(
    "--bwlimit-file", metavar="FILE", help="Read the limit from FILE at start and again on each SIGUSR2.")]
JsonOpt = json_opt()
Sha256Opt = Annotated[bool, typer.Option(
    "--sha256", help="Also record each file's plain whole-file SHA-256 (what sha256sum prints): one stream "
    "per file, so a big file's copy waits for it. Default: part SHA-256s, their sha256-tree and CRC32C.")]
DryOpt = dry_run_opt()
def quiet_opt(help: str = "No progress or summary lines: print nothing but errors.") -> Any:
    """-q on every command: no progress bar, --stats lines or summary; a command whose result is its
    output (ls, du, hashsum) still prints that, a check only what it found wrong."""
    return Annotated[bool, typer.Option("--quiet", "-q", help=help)]


QuietOpt = quiet_opt()
ListQuietOpt = quiet_opt("No progress or summary lines: only the results (errors on stderr).")
MaxCostOpt = max_cost_opt()


def route_opt():
    return Annotated[Optional[str], typer.Option(
        "--route", metavar="ROUTE", help="How the bytes go: direct (through this process), server (the store "
        "copies inside one account), from-url (Azure pulls from a signed URL of S3 or GCS), or a native route "
        "(sts, datasync). Default: chosen for the pair (see README, Routes).")]


RouteOpt = route_opt()
DeleteOpt = Annotated[bool, typer.Option("--delete", help="Remove from DST what SRC no longer has. Refused, "
                                         "before anything is copied or deleted, when that is more than half of "
                                         "the objects at DST, unless --force or --max-delete allows it.")]
MaxDeleteOpt = Annotated[Optional[int], typer.Option(
    "--max-delete", metavar="N", min=0, help="With --delete: refuse, before anything is copied or deleted, a sync "
    "that would delete more than N objects (as rclone); allows up to N whatever share of DST that is.")]


def force_opt(help: str = "Delete even what a guard refuses: more than half of a sync's destination.") -> Any:
    return Annotated[bool, typer.Option("--force", help=help)]


ForceOpt = force_opt()


def refuse_unused(reason: str, **flags: Any) -> None:
    """Refuse options given where they do not apply (``flags``: option name -> value, None when
    not given) rather than ignore them."""
    unused = [name for name, value in flags.items() if value is not None]
    if unused:
        raise InvalidOption(f"{', '.join(unused)} {'does' if len(unused) == 1 else 'do'} not apply {reason}")


def _read_rate_file(path: Path) -> str:
    try:
        if path.is_dir():
            raise InvalidOption(f"--bwlimit-file {path}: is a directory")
        with path.open("rb") as f:
            raw = f.read(1024)   # a rate is a few bytes; /dev/zero must not fill memory
        return raw.decode("utf-8")
    except OSError as exc:
        raise InvalidOption(f"--bwlimit-file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InvalidOption(f"--bwlimit-file {path}: not a text file (give a rate such as 50MiB)") from None


def settings_from_flags(profile: str | None, config: str | Path | None, concurrency: int | None = None,
                        chunk_size: str | None = None, store_checksums: str | None = None, *,
                        bwlimit: str | None = None, bwlimit_file: Path | None = None,
                        route: str | None = None, cache_dir: bool = False, sha256: bool = False,
                        local_dirs: bool = True) -> Settings:
    """The settings of a command run here (bridge.api.settings_of: defaults < settings file <
    environment < these flags), with --bwlimit-file read and --manifest-dir applied."""
    if bwlimit_file is not None:
        bwlimit = _read_rate_file(bwlimit_file)
        if not bwlimit.strip():
            raise InvalidOption(f"--bwlimit-file {bwlimit_file} is empty: write a rate such as 50MiB, or 0 for none")
    return settings_of(profile, config, concurrency=concurrency or None, chunk_size=chunk_size,
                       store_checksums=store_checksums, bwlimit=bwlimit, route=route, sha256=sha256,
                       manifest_dir=RUN.get("manifest_dir") or None, cache_dir=cache_dir, local_dirs=local_dirs)


# What the global options (bridge.cli.main reads them before the command) ask of every command:
# ``stats`` seconds between progress lines on a stderr that is no terminal (None: none).
# ``manifest_dir``: --manifest-dir, the records of local destinations kept there (None: not given).
RUN: dict[str, Any] = {"stats": None, "manifest_dir": None}


def status_line(p: Progress) -> str:
    """Where a job is, in one line: the bar's text, and the --stats line."""
    if p.phase.startswith("listing"):
        return f"{p.phase}: {plural(p.listed, 'object')} listed"
    if p.phase.startswith("planning"):
        judged = f"{p.checks_done} of {plural(p.checks_total, 'file')} compared" if p.checks_total else \
            f"{plural(p.listed, 'object')} listed"
        return f"{p.phase}: {judged}"
    if p.phase.startswith("verifying"):
        rate = p.check_bytes_done / p.elapsed if p.elapsed > 0 else 0
        return (f"{p.phase}: {p.checks_done} of {plural(p.checks_total, 'file')}, "
                f"{human_bytes(p.check_bytes_done)} of {human_bytes(p.check_bytes_total)} "
                f"({human_bytes(rate)}/s)")
    moved = p.bytes_done - p.bytes_skipped
    line = (f"{p.phase or 'copying'}: {human_bytes(p.bytes_done)} of {human_bytes(p.bytes_total)}, "
            f"{plural(p.files_done, 'file')} done, {human_bytes(p.rate)}/s")
    if p.bytes_skipped:
        line += f" ({human_bytes(moved)} moved by this run, {human_bytes(p.bytes_skipped)} already there)"
    if p.retries:
        line += f", {plural(p.retries, 'retry', 'retries')}"
    if moved >= 2**20 and p.elapsed >= 1 and p.bytes_total > p.bytes_done:   # a rate worth projecting
        line += f", ETA {human_duration((p.bytes_total - p.bytes_done) / p.rate)}"
    return line


class ProgressBar:
    """What a person sees while a job runs, fed by the job's Progress object (which also carries
    the job's bandwidth limit, changed by SIGUSR2): a bar on a terminal, or with ``--stats`` a
    line every so often on a stderr that is not one; nothing with -q. Rich is imported only when
    the bar is shown (not with -q, --json or a stderr that is not a terminal). Sizes in IEC units."""

    def __init__(self, enabled: bool, settings: Settings | None = None, bwlimit_file: Path | None = None,
                 quiet: bool = False):
        self.enabled = enabled and not quiet and err.is_terminal
        self.stats = None if quiet or self.enabled else RUN.get("stats")
        self.settings, self.bwlimit_file = settings, bwlimit_file
        self.bar = None
        self._stop = None
        if self.enabled:   # one line at the terminal's width (status_line carries the ETA)
            from bridge.cli.console import line_bar
            self.bar = line_bar(err.rich)
        self.task = None

    def __enter__(self) -> Progress:
        progress = Progress(audit=True)   # a line per object where -v or --log-file lets it through
        if self.settings is not None:
            rate = self.settings.transfer.bwlimit
            progress.limiter = limits.local(rate)
            limits.install_signal(progress.limiter, rate, self.bwlimit_file,
                                  said=lambda line: err.print(f"mcbridge: {line}", markup=False))
        if self.enabled:
            self.bar.start()
            self.task = self.bar.add_task("", total=None, status="starting")
            progress.listeners.append(self._update)
        elif self.stats:
            import threading
            self._stop = threading.Event()

            def every() -> None:
                while not self._stop.wait(self.stats):
                    err.print(f"mcbridge: {status_line(progress)}", markup=False)

            threading.Thread(target=every, name="bridge-stats", daemon=True).start()
        return progress

    def _update(self, p: Progress) -> None:
        if p.phase.startswith("verifying"):
            total, done = p.check_bytes_total, p.check_bytes_done
        elif p.phase.startswith(("planning", "listing")):
            total, done = p.checks_total, p.checks_done
        else:
            total, done = p.bytes_total, p.bytes_done
        self.bar.update(self.task, total=total or None, completed=done, status=status_line(p))

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self.bar.stop()
        if self._stop is not None:
            self._stop.set()


def route_line(summary: dict) -> str:
    """", by server (0 B through bridge; 2 files direct: ...)" for a job that took a route."""
    route = summary.get("route") or {}
    if route.get("name", "direct") == "direct":
        return ""
    fell = route.get("fallbacks") or {}
    tail = f"; {plural(len(fell), 'file')} direct: {next(iter(fell.values()))}" if fell else ""
    unproven = route.get("unproven") or {}
    if unproven:
        tail += f"; {plural(len(unproven), 'file')} {next(iter(unproven.values()))} (verify --deep reads them)"
    return f", by {route['name']} ({human_bytes(route['bytes_through_bridge'])} through bridge{tail})"


def emit(summary: dict, as_json: bool, line: str, quiet: bool = False) -> None:
    """The summary of a command: JSON with --json, else ``line``; nothing with -q."""
    if as_json:
        # a list read as it is written (a sync's paths sent, bridge.ops.Names): streamed, not held
        streams = {k: v for k, v in summary.items() if isinstance(v, (collections.abc.Sequence, collections.abc.Mapping))
                   and not isinstance(v, (list, tuple, dict, str))}
        if streams:
            out.print_json_streams({k: v for k, v in summary.items() if k not in streams}, streams)
        else:
            out.print_json(json.dumps(summary, default=str))
    elif not quiet:
        out.print(line, markup=False)


def moved_line(summary: dict) -> str:
    """'1.2 GiB in 3.4s (360.0 MiB/s)', and what of it a resumed run found already there: the
    rate counts only the bytes this run moved."""
    skipped = summary.get("bytes_skipped") or 0
    line = f"{human_bytes(summary['bytes'])} in {summary['elapsed_s']:.1f}s ({human_bytes(summary['rate_bytes_per_s'])}/s"
    if skipped:
        line += f"; {human_bytes(max(0, summary['bytes'] - skipped))} moved by this run, " \
                f"{human_bytes(skipped)} already there from an earlier run"
    return line + ")"


def print_usage(usage: dict | None) -> None:
    """One line per store: what the plan will read and write there, and its requests by kind."""
    for side, verb in (("source", "read"), ("destination", "write")):
        row = (usage or {}).get(side)
        if not row:
            continue
        requests = ", ".join(f"{n} {kind}" for kind, n in row["requests"].items() if n) or "no requests"
        out.print(f"{side} {row['url']}: {verb} {human_bytes(row['bytes_read'] or row['bytes_written'])}; "
                  f"{requests}", markup=False)


# A dry run's --json lists up to this many files through rich; a longer plan is written as it is
# read (Console.print_json_rows), in memory that does not grow with it.
JSON_ROWS_AT_ONCE = 1000


def print_plan(summary: dict, as_json: bool) -> None:
    if as_json:
        rows = summary.get("plan")
        if rows is None or isinstance(rows, list) or len(rows) <= JSON_ROWS_AT_ONCE:
            out.print_json(data={**summary, "plan": list(rows)} if rows is not None else summary)
        else:
            out.print_json_rows({k: v for k, v in summary.items() if k != "plan"}, "plan", rows)
        return
    for row in summary["plan"]:
        parts = f"{plural(row['parts'], 'part')} of {human_bytes(row['part_size'])}" if row["part_size"] else "1 request"
        out.print(f"copy {shown(row['path'])}  {human_bytes(row['size'])}  ({parts})", markup=False)
    for rel in summary.get("delete", []):
        out.print(f"delete {shown(rel)}", markup=False)
    n = summary.get("deletions") or 0
    deleting = f" and delete {n:,} object{'s' if n != 1 else ''}" if n else ""
    out.print(f"would copy {plural(summary['files'], 'file')}, {human_bytes(summary['bytes'])}{deleting} from "
              f"{summary['source']} to {summary['destination']} in {plural(summary['units'], 'unit')}", markup=False)
    if summary.get("refused"):
        out.print(f"a run would be refused: {summary['refused']}", markup=False)
    if summary.get("filters"):
        from bridge.filters import Filters
        out.print(f"filters: {Filters.from_dict(summary['filters']).describe()}", markup=False)
    route = summary.get("route")
    if route:
        out.print(f"route {route['name']}: {route['why']}", markup=False)
    print_usage(summary.get("usage"))


# -- filters (bridge/filters.py): the same seven options on every command that lists --------------
IncludeOpt = Annotated[Optional[list[str]], typer.Option(
    "--include", metavar="GLOB", help="Only paths matching GLOB (repeatable; rclone's globs: * stays within a "
    "folder, ** crosses folders, a leading / anchors at the root).")]
ExcludeOpt = Annotated[Optional[list[str]], typer.Option(
    "--exclude", metavar="GLOB", help="Leave out paths matching GLOB (repeatable; includes are tried first, "
    "the first rule that matches decides).")]
FilesFromOpt = Annotated[Optional[str], typer.Option(
    "--files-from", metavar="FILE", help="Only the paths listed in FILE, one a line, relative to the source "
    "(- reads standard input).")]
MinSizeOpt = Annotated[Optional[str], typer.Option("--min-size", metavar="SIZE",
                                                   help="Leave out objects smaller than SIZE, e.g. 1MiB.")]
MaxSizeOpt = Annotated[Optional[str], typer.Option("--max-size", metavar="SIZE",
                                                   help="Leave out objects larger than SIZE.")]
MinAgeOpt = Annotated[Optional[str], typer.Option(
    "--min-age", metavar="AGE", help="Leave out objects modified less than AGE ago (90m, 12h, 7d) or after a "
    "date (2026-01-31).")]
MaxAgeOpt = Annotated[Optional[str], typer.Option(
    "--max-age", metavar="AGE", help="Leave out objects modified more than AGE ago or before a date.")]


def filters_from_flags(include: list[str] | None = None, exclude: list[str] | None = None,
                       files_from: str | None = None, min_size: str | None = None, max_size: str | None = None,
                       min_age: str | None = None, max_age: str | None = None):
    """The Filters the options give (bridge.api.filters_of), or None when none is given."""
    return filters_of(include, exclude, files_from, min_size, max_size, min_age, max_age)
