"""bridge from Python: what ``mcbridge cp``, ``sync``, ``verify``, ``check`` and ``replicate`` do,
as functions that return typed results and raise bridge's own exceptions (bridge.errors).

    import bridge
    done = bridge.copy("/data/run7/", "s3://ckpt/run7/", concurrency=16, progress=print)
    done.files, done.bytes, done.route.name, done.record   # the record (manifest) it committed
    bridge.verify("s3://ckpt/run7/")   # a VerifyResult, or VerifyFailed naming what is not proven

Settings are keyword arguments with the names of the CLI's flags (``concurrency``,
``chunk_size``, ``store_checksums``, ``bwlimit``, ``route``, ``sha256``, the filters ``include``
... ``max_age``), or a ``profile`` of the settings file (``config``: which file), or a ready
``settings`` object: defaults < file < environment < arguments, as on the command line
(bridge/config.py). Each bad value raises one ``InvalidOption`` (a ``UsageError``, exit code 2)
naming it. ``progress``: a callable that gets a ``Snapshot`` (bytes done of the total, files,
phase) each time the job moves on, in order; or the job's ``bridge.progress.Progress`` itself.

A check that ran and did not prove everything (``verify``, ``check``, ``replicate``) raises a
``CheckFailed`` subclass whose ``result`` holds what it found; nothing is printed.
Importing this module loads no SDK and no part of the engine: each function loads what it runs.
"""

from __future__ import annotations

import functools
import math
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge.config import Settings, load_settings, parse_rate, parse_size, variable_of
from bridge.errors import InvalidOption, ReplicationFailed, TreesDiffer, VerifyFailed

if TYPE_CHECKING:
    from bridge.filters import Filters
    from bridge.progress import Progress

__all__ = ["copy", "sync", "verify", "check", "replicate", "settings_of", "Snapshot", "Route", "CopyResult",
           "SyncResult", "PlanResult", "VerifyResult", "CheckResult", "PolicyResult", "ReplicateResult"]


# -- progress ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Snapshot:
    """Where a job is: bytes at the destination of the bytes planned, files finished, and what it
    is doing (``phase``: listing, planning, copying, verifying ...)."""
    phase: str
    bytes_done: int
    bytes_total: int
    files_done: int
    units_done: int
    units_total: int
    bytes_skipped: int = 0
    listed: int = 0
    elapsed_s: float = 0.0

    @classmethod
    def of(cls, p: Progress) -> Snapshot:
        return cls(p.phase, p.bytes_done, p.bytes_total, p.files_done, p.units_done, p.units_total,
                   p.bytes_skipped, p.listed, round(p.elapsed, 3))


ProgressCallback = Callable[[Snapshot], None]


def _progress(given: ProgressCallback | Progress | None) -> Progress:
    """The job's accounting object: ``given`` itself, or one that hands a ``Snapshot`` to the
    callback at each change. Snapshots are taken and handed over under one lock, so that the
    callback sees them in order (threads report parts as they finish)."""
    from bridge.progress import Progress
    if isinstance(given, Progress):
        return given
    progress = Progress()
    if given is None:
        return progress
    if not callable(given):
        raise InvalidOption(f"progress {given!r}: give a callable that takes a bridge.api.Snapshot")
    lock = threading.Lock()

    def tell(p: Progress) -> None:
        with lock:
            given(Snapshot.of(p))

    progress.listeners.append(tell)
    return progress


def _last(progress: Progress) -> None:
    """Every listener once more with the job's final state (the last part's report may have
    raced the job's own end)."""
    for listener in progress.listeners:
        listener(progress)


# -- results -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Route:
    """How the bytes went: ``direct`` through this process, or a route the stores or a cloud's
    service ran (``bytes_through_bridge`` then small); ``fallbacks``: files it could not carry,
    sent direct, with why; ``unproven``: files it copied that no checksum both stores computed
    proves (``verify(deep=True)`` reads them)."""
    name: str
    why: str
    bytes_through_bridge: int
    fallbacks: Mapping[str, str] = field(default_factory=dict)
    unproven: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, route: Mapping[str, Any] | None) -> Route:
        route = route or {}
        return cls(route.get("name", "direct"), route.get("why", ""), route.get("bytes_through_bridge", 0),
                   dict(route.get("fallbacks") or {}), dict(route.get("unproven") or {}))


@dataclass(frozen=True)
class CopyResult:
    """A committed copy: ``files`` and ``bytes`` of the job (``bytes_skipped`` of them already
    there from an earlier run that was resumed), its ``route``, the ``record`` it committed at the
    destination (the manifest's URL), ``spend_usd`` (what its requests and bytes cost by the price
    table; None when not priceable) and ``summary``, the dict ``--json`` prints."""
    source: str
    destination: str
    files: int
    bytes: int
    bytes_skipped: int
    elapsed_s: float
    route: Route
    record: str
    summary: Mapping[str, Any] = field(repr=False, compare=False)
    price: Callable[[], float | None] | None = field(default=None, repr=False, compare=False)

    @functools.cached_property
    def spend_usd(self) -> float | None:
        """Priced when first read, not by every copy: finding where a bucket is to price its
        bytes is a request of its own."""
        return self.price() if self.price is not None else None

    @property
    def unproven(self) -> Mapping[str, str]:
        return self.route.unproven


@dataclass(frozen=True)
class SyncResult(CopyResult):
    """A sync: a copy, plus what it sent, deleted and adopted, and the counts by reason (new,
    changed, repaired, unchanged, adopted)."""
    sent: Sequence[str] = ()
    deleted: Sequence[str] = ()
    adopted: Mapping[str, str] = field(default_factory=dict)
    reasons: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class PlanResult:
    """A dry run: what would be copied (``files``, ``bytes``, ``units``), by which route, what it
    would read, write and request (``usage``); nothing moved. ``summary`` is what ``--dry-run
    --json`` prints; its "plan" rows are read as iterated."""
    source: str
    destination: str
    files: int
    bytes: int
    units: int
    route: Route
    deletions: int
    usage: Mapping[str, Any]
    summary: Mapping[str, Any] = field(repr=False, compare=False)


@dataclass(frozen=True)
class VerifyResult:
    """What ``verify`` found under ``url``: ``checked`` files and their ``bytes``, and the paths
    missing, extra, mismatched or unproven (a cloud's copy no checksum proves: ``deep`` reads it)."""
    url: str
    ok: bool
    deep: bool
    checked: int
    bytes: int
    missing: tuple[str, ...]
    extra: tuple[str, ...]
    mismatched: tuple[str, ...]
    unproven: tuple[str, ...]
    copies: int
    report: Mapping[str, Any] = field(repr=False, compare=False)


@dataclass(frozen=True)
class CheckResult:
    """What ``check`` found comparing two trees: pairs ``checked`` and ``equal`` (``by`` which
    checksum), and the paths missing at the destination, extra there, differing or unproven."""
    source: str
    destination: str
    ok: bool
    checked: int
    equal: int
    by: Mapping[str, int]
    missing: tuple[str, ...]
    extra: tuple[str, ...]
    differ: tuple[str, ...]
    unproven: tuple[str, ...]
    report: Mapping[str, Any] = field(repr=False, compare=False)


@dataclass(frozen=True)
class PolicyResult:
    """One policy's run: the checkpoints in its window, how many destinations hold them verified
    (of ``copies_needed``), per destination what was verified and what it cost, and errors."""
    policy: str
    ok: bool
    checkpoints: tuple[str, ...]
    verified_copies: int
    copies_needed: int
    verified: Mapping[str, tuple[str, ...]]
    spend_usd: Mapping[str, float | None]
    errors: tuple[str, ...]
    report: Mapping[str, Any] = field(repr=False, compare=False)


@dataclass(frozen=True)
class ReplicateResult:
    ok: bool
    policies: tuple[PolicyResult, ...]

    @property
    def report(self) -> dict[str, Any]:
        """What ``replicate --once --json`` prints."""
        return {"policies": [p.report for p in self.policies], "ok": self.ok}


def _paths(found: Iterable[Any]) -> tuple[str, ...]:
    return tuple(f["path"] if isinstance(f, dict) else f for f in found)


# -- settings from keyword arguments -------------------------------------------------------------

STORE_CHECKSUMS = ("require", "readback", "skip")


def given(flag: str, value: str | None) -> str | None:
    """An option's value as given; an empty one is refused: it must not quietly mean "unset"
    (``--profile ''`` the default profile, ``--bwlimit ''`` no limit)."""
    if value is not None and not str(value).strip():
        raise InvalidOption(f"{flag} is empty: give a value, or leave the option out")
    return value


def size_flag(flag: str, text: str | int) -> int:
    """A size option's bytes, at least one: a part, a shard or a memory budget of nothing cannot work."""
    size = parse_size(text)
    if size < 1:
        raise InvalidOption(f"{flag} {text!r} must be at least 1 byte")
    return size


def transfer_flags(*, chunk_size: str | int | None = None, store_checksums: str | None = None,
                   bwlimit: str | int | None = None, route: str | None = None,
                   profile: str | None = None) -> dict[str, Any]:
    """The transfer flags cp, sync, pack, migrate and submit share, checked by one function so
    that a job queued for workers is refused with the same words as one run here, before
    anything runs or is queued. Returns the parsed values that were given."""
    for flag, value in (("--chunk-size", chunk_size), ("--store-checksums", store_checksums),
                        ("--bwlimit", bwlimit), ("--route", route), ("--profile", profile)):
        given(flag, value)
    parsed: dict[str, Any] = {}
    if chunk_size is not None:
        parsed["chunk_size"] = size_flag("--chunk-size", chunk_size)
    if store_checksums is not None:
        store_checksums = str(store_checksums)
        if store_checksums not in STORE_CHECKSUMS:
            raise InvalidOption(f"--store-checksums {store_checksums!r}: use one of {', '.join(STORE_CHECKSUMS)}")
        parsed["store_checksums"] = store_checksums
    if bwlimit is not None:
        parsed["bwlimit"] = parse_rate(bwlimit) or 0
    if route is not None:
        from bridge import routes
        if route != routes.DIRECT:   # direct is no registered route: it is the engine itself
            routes.get(route)        # an unknown name: InvalidOption listing the routes
    return parsed


def settings_of(profile: str | None = None, config: str | Path | None = None, *, concurrency: int | None = None,
             chunk_size: str | int | None = None, store_checksums: str | None = None,
             bwlimit: str | int | None = None, route: str | None = None, sha256: bool = False,
             manifest_dir: str | Path | None = None, cache_dir: bool = False, local_dirs: bool = True) -> Settings:
    """The settings of a job run here: defaults < settings file (``config``, its ``profile``) <
    environment < these arguments, each bad value one ``InvalidOption`` naming where it came
    from. ``local_dirs``: also check the directories this process will write (state, cache with
    ``cache_dir``, manifests); a submitter writes none."""
    transfer = transfer_flags(chunk_size=chunk_size, store_checksums=store_checksums, bwlimit=bwlimit,
                              route=route, profile=profile)
    if concurrency is not None:
        transfer["concurrency"] = concurrency
    if manifest_dir is not None:
        given("--manifest-dir", str(manifest_dir))
        transfer["manifest_dir"] = os.path.abspath(os.path.expanduser(manifest_dir))
    if sha256:
        transfer["sha256"] = True
    given("--config", None if config is None else str(config))
    try:
        loaded = load_settings({"transfer": transfer}, profile=profile, config_path=config)
    except InvalidOption as exc:
        lines = str(exc).splitlines()
        named = [(line, variable_of(InvalidOption(line), os.environ, {"transfer": transfer})) for line in lines]
        if not any(var for _line, var in named):
            raise
        # every mistake, each named as the user wrote it (bridge.cli.fail joins the lines with '; ')
        raise InvalidOption("\n".join(f"{line} (from {var})" if var else line for line, var in named)) from None
    if local_dirs:
        usable_dirs(loaded, cache_dir)
    return loaded


def usable_dirs(settings: Settings, cache_dir: bool) -> None:
    """Found here, not as an OSError from deep in the first job that writes its journal."""
    dirs = [("state directory", settings.transfer.state_dir, "transfer.state_dir, MCBRIDGE_STATE_DIR")]
    if cache_dir:
        dirs.append(("cache directory", settings.cache.dir, "cache.dir, MCBRIDGE_CACHE_DIR"))
    if settings.transfer.manifest_dir:
        dirs.append(("manifest directory", settings.transfer.manifest_dir,
                     "--manifest-dir, transfer.manifest_dir, MCBRIDGE_MANIFEST_DIR"))
    for what, path, where in dirs:
        problem = dir_problem(Path(path))
        if problem:
            raise InvalidOption(f"{what} {path} ({where}): {problem}")


def dir_problem(path: Path) -> str | None:
    """Why a directory cannot be used or made at ``path``, or None; checked without making it:
    the nearest path up that exists must be a directory this user may write, and one in which a
    directory can be made (tried, and removed: a mode says nothing of /proc or a full disk)."""
    at = path
    while not os.path.lexists(at):
        if at.parent == at:
            break
        at = at.parent
    if not at.is_dir():
        return "is not a directory" if at == path else f"{at} is not a directory"
    if not os.access(at, os.W_OK | os.X_OK):
        return "cannot be written" if at == path else f"cannot be created: {at} is not writable"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".mcbridge-check-", dir=at))
    except OSError as exc:
        why = exc.strerror or str(exc)
        return f"a directory cannot be made in it: {why}" if at == path else f"cannot be created in {at}: {why}"
    return None


def filters_of(include: Iterable[str] | None = None, exclude: Iterable[str] | None = None,
               files_from: str | Path | Iterable[str] | None = None, min_size: str | int | None = None,
               max_size: str | int | None = None, min_age: str | float | None = None,
               max_age: str | float | None = None) -> Filters | None:
    """The Filters these give (bridge/filters.py), or None when none is given. ``files_from``:
    a file listing paths one a line ("-": standard input), or the paths themselves; the list is
    read here, so that a queued job carries the paths."""
    from bridge import filters
    for flag, value in (("--min-size", min_size), ("--max-size", max_size), ("--min-age", min_age),
                        ("--max-age", max_age)):
        given(flag, value)
    if isinstance(include, str) or isinstance(exclude, str):
        raise InvalidOption("include and exclude take a list of globs, not one string")
    paths = None
    if isinstance(files_from, (str, Path)):
        given("--files-from", str(files_from))
        paths = filters.read_files_from(str(files_from), lambda: _read_list(str(files_from)))
    elif files_from is not None:
        paths = filters.read_files_from("list", lambda: "\n".join(files_from))

    def age(value: str | float | None, flag: str) -> float | None:
        return None if value is None else filters.parse_age(str(value), flag)

    found = filters.from_flags(include, exclude, paths,
                               parse_size(min_size) if min_size is not None else None,
                               parse_size(max_size) if max_size is not None else None,
                               age(min_age, "--min-age"), age(max_age, "--max-age"))
    return found if found.active else None


def _read_list(source: str) -> str:
    import sys
    if source == "-":
        return sys.stdin.read()
    from bridge.config import UnreadableText, read_text_file
    try:
        return read_text_file(Path(source), "--files-from list", 256 * 1024 * 1024)
    except UnreadableText as exc:
        raise InvalidOption(f"--files-from {source}: {exc.reason}") from None


ADOPT = ("checksum", "deep", "off")


def adopt_mode(adopt: str | None, skip_existing: bool = False, checksum: bool = False,
               default: str | None = "off") -> str | None:
    """``--adopt`` (checksum, deep, off), or what ``--skip-existing``/``--checksum`` ask for."""
    if adopt is not None and adopt not in ADOPT:
        raise InvalidOption(f"--adopt {adopt!r}: use one of {', '.join(ADOPT)}")
    if adopt is not None:
        return adopt
    return "checksum" if (skip_existing or checksum) else default


def with_object_flags(settings: Settings, destination: str, *, content_type: str | None = None,
                      metadata: Iterable[str] | Mapping[str, str] | None = None, no_metadata: bool = False,
                      storage_class: str | None = None, kms_key: str | None = None,
                      bucket_key: bool | None = None, encryption_scope: str | None = None) -> Settings:
    """``settings`` with what a copy writes besides the bytes (headers, metadata as KEY=VALUE
    strings or a mapping, storage class, encryption) for ``destination``'s store
    (bridge.attributes.with_objects)."""
    from bridge.attributes import parse_pairs, with_objects
    if content_type is not None and not content_type.strip():
        raise InvalidOption("--content-type is empty: give a type such as application/json")
    objects: dict[str, Any] = {}
    if no_metadata:
        objects["metadata"] = "off"
    if content_type is not None:
        objects["content_type"] = content_type
    if metadata:
        pairs = [f"{k}={v}" for k, v in metadata.items()] if isinstance(metadata, Mapping) else list(metadata)
        objects["set_metadata"] = parse_pairs(pairs)
    return with_objects(settings, destination, objects, storage_class=storage_class, kms_key=kms_key,
                        bucket_key=bucket_key, encryption_scope=encryption_scope)


MAX_USD = 1e12   # a float keeps cents exact to about $9e13; an amount above a trillion is a slip


def usd_amount(flag: str, usd: float | None) -> float | None:
    """A dollar amount: finite and not negative (nan compares false with every limit, so a guard
    given nan, like one given inf, would never refuse anything), and at most MAX_USD (1e40 would
    be shown as 41 digits of a float's noise)."""
    if usd is not None and not (isinstance(usd, (int, float)) and math.isfinite(usd) and usd >= 0):
        raise InvalidOption(f"{flag} {usd}: give a finite number of US dollars, 0 or more")
    if usd is not None and usd > MAX_USD:
        raise InvalidOption(f"{flag} {usd:g}: give at most {MAX_USD:.0f} US dollars")
    return usd


def _url(what: str, url: Any) -> str:
    if isinstance(url, Path):
        url = str(url)
    if not isinstance(url, str) or not url.strip():
        raise InvalidOption(f"{what} {url!r}: give a local path or an s3://, gs://, az:// URL")
    return url


# -- the commands ----------------------------------------------------------------------------------

def _chosen(given_settings: Settings | None, profile: str | None = None, config: str | Path | None = None,
            **flags: Any) -> Settings:
    """``settings=`` as given, or those the other arguments make; both at once is refused (one
    of them would be silently ignored)."""
    if given_settings is None:
        return settings_of(profile, config, **flags)
    also = [name for name, value in {"profile": profile, "config": config, **flags}.items()
            if value not in (None, False)]
    if also:
        raise InvalidOption(f"settings= and {', '.join(also)}: give the settings object or those arguments, "
                            f"not both")
    return given_settings


FILTER_ARGS = ("include", "exclude", "files_from", "min_size", "max_size", "min_age", "max_age")
SETTING_ARGS = ("concurrency", "chunk_size", "store_checksums", "bwlimit", "sha256", "manifest_dir")
OBJECT_ARGS = ("content_type", "metadata", "no_metadata", "storage_class", "kms_key", "bucket_key", "encryption_scope")


def _transfer(job: Callable[..., dict], args: Mapping[str, Any], adopting: str | None,
              **more: Any) -> tuple[dict, Callable[[], float | None] | None]:
    """A copy or a sync (``job``: ops.copy or ops.sync) of the public function's ``args``, each
    checked before anything is listed."""
    src, dst = _url("source", args["src"]), _url("destination", args["dst"])
    filters = filters_of(*(args[name] for name in FILTER_ARGS))
    chosen = _chosen(args["settings"], args["profile"], args["config"], **{name: args[name] for name in SETTING_ARGS})
    chosen = with_object_flags(chosen, dst, **{name: args[name] for name in OBJECT_ARGS})
    transfer_flags(route=args["route"])
    return _run(job, src, dst, chosen, _progress(args["progress"]), args["dry_run"],
                max_cost=usd_amount("--max-cost", args["max_cost"]), route=args["route"], adopt=adopting,
                filters=filters, **more)


def _spend(metered, source: str, destination: str, settings: Settings, route: str) -> float | None:
    if not metered.stores:
        return 0.0
    from bridge import pricing
    from bridge.errors import BridgeError
    try:
        return pricing.spend(metered, source, destination, settings, route=route)
    except (BridgeError, ValueError):
        return None   # where a bucket is could not be found out: not priced


def _run(job: Callable[..., dict], source: str, destination: str, settings: Settings, progress: Progress,
         dry_run: bool, **kw: Any) -> tuple[dict, Callable[[], float | None] | None]:
    """``job`` (ops.copy or ops.sync) under a meter of its own, and how to price what it spent."""
    from bridge import meter
    metered = meter.Meter()
    with meter.metering(metered):
        summary = job(source, destination, settings, chunk_size=settings.transfer.chunk_size, progress=progress,
                      dry_run=dry_run, **kw)
    if dry_run:
        return summary, None
    _last(progress)
    route = (summary.get("route") or {}).get("name", "direct")
    return summary, lambda: _spend(metered, source, destination, settings, route)


def _plan_result(summary: dict) -> PlanResult:
    return PlanResult(summary["source"], summary["destination"], summary["files"], summary["bytes"],
                      summary["units"], Route.of({**summary.get("route", {}), "bytes_through_bridge": 0}),
                      summary.get("deletions", 0), summary.get("usage") or {}, summary)


def _copied(summary: dict, price: Callable[[], float | None] | None) -> dict[str, Any]:
    return dict(source=summary["source"], destination=summary["destination"], files=summary["files"],
                bytes=summary["bytes"], bytes_skipped=summary.get("bytes_skipped", 0),
                elapsed_s=summary.get("elapsed_s", 0.0), route=Route.of(summary.get("route")),
                record=summary.get("manifest", ""), summary=summary, price=price)


def copy(src: str | Path, dst: str | Path, *, progress: ProgressCallback | Progress | None = None,
         dry_run: bool = False, max_cost: float | None = None, route: str | None = None,
         settings: Settings | None = None, profile: str | None = None, config: str | Path | None = None,
         concurrency: int | None = None, chunk_size: str | int | None = None, store_checksums: str | None = None,
         bwlimit: str | int | None = None, sha256: bool = False, manifest_dir: str | Path | None = None,
         include: Iterable[str] | None = None, exclude: Iterable[str] | None = None,
         files_from: str | Path | Iterable[str] | None = None, min_size: str | int | None = None,
         max_size: str | int | None = None, min_age: str | float | None = None, max_age: str | float | None = None,
         content_type: str | None = None, metadata: Iterable[str] | Mapping[str, str] | None = None,
         no_metadata: bool = False, storage_class: str | None = None, kms_key: str | None = None,
         bucket_key: bool | None = None, encryption_scope: str | None = None,
         adopt: str | None = None, skip_existing: bool = False, checksum: bool = False) -> CopyResult | PlanResult:
    """Copy ``src`` to ``dst`` (one object, or every object under a folder or prefix ending in
    "/" that the filters select), commit its record at ``dst`` and return a ``CopyResult``; with
    ``dry_run``, a ``PlanResult`` and nothing moved. Raises OverBudget above ``max_cost``
    dollars, before any data request; TransferFailed (and its kinds) when units fail."""
    from bridge import ops
    summary, spent = _transfer(ops.copy, locals(), adopt_mode(adopt, skip_existing, checksum))
    return _plan_result(summary) if dry_run else CopyResult(**_copied(summary, spent))


def sync(src: str | Path, dst: str | Path, *, delete: bool = False, max_delete: int | None = None,
         force: bool = False, progress: ProgressCallback | Progress | None = None,
         dry_run: bool = False, max_cost: float | None = None, route: str | None = None,
         settings: Settings | None = None, profile: str | None = None, config: str | Path | None = None,
         concurrency: int | None = None, chunk_size: str | int | None = None, store_checksums: str | None = None,
         bwlimit: str | int | None = None, sha256: bool = False, manifest_dir: str | Path | None = None,
         include: Iterable[str] | None = None, exclude: Iterable[str] | None = None,
         files_from: str | Path | Iterable[str] | None = None, min_size: str | int | None = None,
         max_size: str | int | None = None, min_age: str | float | None = None, max_age: str | float | None = None,
         content_type: str | None = None, metadata: Iterable[str] | Mapping[str, str] | None = None,
         no_metadata: bool = False, storage_class: str | None = None, kms_key: str | None = None,
         bucket_key: bool | None = None, encryption_scope: str | None = None,
         adopt: str | None = None) -> SyncResult | PlanResult:
    """Make ``dst`` equal to ``src``: send what is new or changed (by size and checksum), repair
    what no longer matches the record, adopt what is already there and equal, and with
    ``delete`` remove what ``src`` no longer has: refused (DeletionRefused) when that is more than
    ``max_delete`` objects or, without it, more than half of what is there unless ``force``.
    Returns a ``SyncResult`` (a ``PlanResult`` with ``dry_run``)."""
    from bridge import ops
    summary, spent = _transfer(ops.sync, locals(), adopt_mode(adopt, default="checksum"), delete=delete,
                               max_delete=max_delete, force=force)
    if dry_run:
        return _plan_result(summary)
    return SyncResult(**_copied(summary, spent), sent=summary["sent"], deleted=tuple(summary["deleted"]),
                      adopted=summary["adopted"], reasons=dict(summary["reasons"]))


def verify(url: str | Path, *, deep: bool = False, sha256: bool = False,
           progress: ProgressCallback | Progress | None = None, settings: Settings | None = None,
           profile: str | None = None, config: str | Path | None = None, concurrency: int | None = None,
           include: Iterable[str] | None = None, exclude: Iterable[str] | None = None,
           files_from: str | Path | Iterable[str] | None = None, min_size: str | int | None = None,
           max_size: str | int | None = None, min_age: str | float | None = None,
           max_age: str | float | None = None) -> VerifyResult:
    """Check every committed copy at or under ``url`` against its record (sizes and the
    checksums the store reports; with ``deep``, every byte re-read). Returns a ``VerifyResult``
    when all is proven; raises ``VerifyFailed`` (its ``result`` says what) when anything is
    missing, extra, mismatched or unproven."""
    url = _url("url", url)
    filters = filters_of(include, exclude, files_from, min_size, max_size, min_age, max_age)
    chosen = _chosen(settings, profile, config, concurrency=concurrency)
    from bridge.pipeline import verify as verifying
    report = verifying.verify(url, chosen, deep=deep, sha256=sha256, filters=filters, progress=_progress(progress))
    result = VerifyResult(report["url"], report["ok"], report["deep"], report["checked"], report["bytes"],
                          _paths(report["missing"]), _paths(report["extra"]), _paths(report["mismatched"]),
                          _paths(report["unproven"]), len(report["copies"]), report)
    if not result.ok:
        counts = report["counts"]
        raise VerifyFailed(f"verify {result.url}: {counts['missing']} missing, {counts['extra']} extra, "
                           f"{counts['mismatched']} mismatched, {counts.get('unproven', 0)} unproven", result)
    return result


def check(src: str | Path, dst: str | Path, *, download: bool = False, settings: Settings | None = None,
          profile: str | None = None, config: str | Path | None = None,
          concurrency: int | None = None) -> CheckResult:
    """Compare the objects under ``src`` and ``dst`` by size and a checksum both stores report
    (no record needed; ``download`` reads both sides and compares CRC32C and SHA-256). Returns a
    ``CheckResult`` when every pair is equal; raises ``TreesDiffer`` (its ``result``) when not."""
    src, dst = _url("source", src), _url("destination", dst)
    chosen = _chosen(settings, profile, config, concurrency=concurrency)
    from bridge.treecheck import check_trees
    report = check_trees(src, dst, chosen, download=download)
    result = CheckResult(report["source"], report["destination"], report["ok"], report["checked"],
                         report["equal"], dict(report["by"]), _paths(report["missing"]), _paths(report["extra"]),
                         _paths(report["differ"]), _paths(report["unproven"]), report)
    if not result.ok:
        raise TreesDiffer(f"check {result.source} {result.destination}: {len(result.missing)} missing, "
                          f"{len(result.extra)} extra, {len(result.differ)} differ, "
                          f"{len(result.unproven)} unproven", result)
    return result


def _policy_result(r: dict) -> PolicyResult:
    verified = {dst: tuple(c for c, row in state["checkpoints"].items() if row["verified"])
                for dst, state in r["destinations"].items()}
    spent = {dst: state.get("spent_usd") for dst, state in r["destinations"].items()}
    return PolicyResult(r["policy"], r["ok"], tuple(r["checkpoints"]), r["verified_copies"], r["copies_needed"],
                        verified, spent, tuple(r["errors"]), r)


def replicate(policy_file: str | Path, *, name: str | None = None, max_cost: float | None = None,
              progress: ProgressCallback | Progress | None = None, settings: Settings | None = None,
              profile: str | None = None, config: str | Path | None = None,
              include: Iterable[str] | None = None, exclude: Iterable[str] | None = None,
              files_from: str | Path | Iterable[str] | None = None, min_size: str | int | None = None,
              max_size: str | int | None = None, min_age: str | float | None = None,
              max_age: str | float | None = None) -> ReplicateResult:
    """Run each policy of ``policy_file`` (only ``name``, if given) once, here: the newest
    ``keep_last`` committed checkpoints to every destination, each verified, retention applied.
    Returns a ``ReplicateResult``; raises ``ReplicationFailed`` (its ``result``) when a policy
    did not reach its copies, ``PolicyError`` (an InvalidOption naming each mistake) for a bad file."""
    from bridge.policies.replication import load, select
    from bridge.replicator import run_once
    filters = filters_of(include, exclude, files_from, min_size, max_size, min_age, max_age)
    chosen = select(load(Path(_url("policy file", policy_file))), name)   # PolicyError: a UsageError
    chosen_settings = _chosen(settings, profile, config)
    max_cost = usd_amount("--max-cost", max_cost)
    runs = []
    for p in chosen:
        each = _progress(progress)
        each.begin(f"{p.name}: listing")
        runs.append(_policy_result(run_once(p, chosen_settings, max_cost=max_cost, filters=filters, progress=each)))
    result = ReplicateResult(all(r.ok for r in runs), tuple(runs))
    if not result.ok:
        failed = [r.policy for r in runs if not r.ok]
        raise ReplicationFailed(f"replicate: {', '.join(failed)} did not reach the copies asked for", result)
    return result
