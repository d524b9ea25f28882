"""Routes: which way a copy's bytes go, chosen once per job, run file by file or as one remote job.

    direct     through this process (bridge.pipeline.units: put / part / complete); serves every
               pair, and is where every other route falls back to
    server     inside one store account: the store copies (bridge/routes/server.py)
    from-url   into Azure from S3 or GCS: Azure pulls blocks from a signed URL (bridge/routes/fromurl.py)
    sts, datasync   the clouds' transfer services (bridge/routes/sts.py and datasync.py, their steps in delegated.py, registered by native.py)

The seam. A route is an object in ``REGISTRY`` (``register(route)``) with:

    name                        its name, one of ``NAMES`` (``register`` refuses any other)
    serves(src, dst, settings)  why it cannot carry this pair of roots (None: it can); asked at
                                planning, before any data request, from the URLs and the stores'
                                declared abilities (``Store.features``)
    units(plan)                 the plan's units: by default one {"op": "route", "files": [rel]}
                                per file, and the deletions; a route that runs one remote job for
                                many files yields one unit naming all of them
    run(ctx, files)             carry those files (bridge.contracts: FilePlan, RouteContext: the
                                stores, progress, settings); yields, per file, either
                                (rel, FileEntry) once the file is committed at the destination, or
                                (rel, Fallback) when the route cannot carry it and has
                                moved none of its bytes

The ``route`` unit (bridge.pipeline.units) journals each FileEntry as the file's record (so a re-run finds it
done) and turns each Fallback into the file's ``direct`` units, recording the reason; a
route whose failure says so (``Fallback(job_wide=True)``: the store answers that it
cannot do this at all) is not tried again by the job. Any other error fails the unit as usual.
The entry's hashes are honest about where they come from: ``computed`` lists only the hashes
bridge took from bytes it read, ``reported`` what a store said, and ``note`` why a hash is left
out (bridge/manifest.py). Bytes the route moved count as ``Progress.moved(n, through=...)`` with
only those that passed through this process as ``through``.

``decide(src, dst, settings, forced)`` is the one route decision, ``choose(plan, settings, forced)``
the same for a plan's roots: the forced route (bad input, exit 2, when it cannot serve the pair), else the first of ``AUTOMATIC`` that serves
it and is ``preferred`` for it (``server`` is not, between local paths: it only saves the copy's
writes there, and is taken with --route server), else ``direct``. ``bridge.policies.routes`` prices the same routes for ``mcbridge plan``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from bridge.config import Settings
from bridge.errors import BridgeError, InvalidOption
from bridge.urls import Location, parse

if TYPE_CHECKING:
    from bridge.contracts import FilePlan, RouteContext, RoutedPlan
    from bridge.manifest import FileEntry

DIRECT = "direct"
PACK = "pack"   # not a Route here: bridge/packing writes shards through this process
# Every route's name, the one list --route, mcbridge plan and the price estimates read; in the
# order mcbridge plan lists them and breaks ties by.
NAMES = (DIRECT, "server", "from-url", "sts", "datasync", PACK)
# The clouds' transfer services: they start jobs in the user's accounts, so bridge takes them by
# itself only where the settings enable them (bridge.config's native.enabled).
NATIVE = ("sts", "datasync")
# Tried in this order when no route is forced; the first that serves the pair is chosen.
AUTOMATIC = ("server", "from-url")


FORCED = "forced with --route"   # a plan's route_why when the user chose its route


def forced(plan: RoutedPlan) -> bool:
    """Whether the user chose the plan's route (it then runs as asked, where bridge alone would
    prefer another way for some files)."""
    return plan.route_why == FORCED


class Fallback(BridgeError):
    """The route cannot carry a file and has moved none of its bytes: the file goes ``direct``.
    ``job_wide``: no other file of the job will fare better (the store does not do this at all)."""

    def __init__(self, message: str, *, job_wide: bool = False):
        super().__init__(message)
        self.job_wide = job_wide


class Route:
    """A way to move files; subclasses set ``name`` and implement ``serves`` and ``copy_file``
    (one file at a time) or ``run`` (many at once)."""

    name: str = ""

    def serves(self, src: Location, dst: Location, settings: Settings) -> str | None:
        raise NotImplementedError

    def preferred(self, src: Location, dst: Location) -> bool:
        """Whether ``choose`` takes this route without --route when it serves the pair."""
        return True

    def units(self, plan: RoutedPlan) -> Iterator[dict[str, Any]]:
        for rel in plan.deletions:
            yield {"op": "delete", "rel": rel}
        for f in plan.files:
            yield {"op": "route", "files": [f.rel]}

    def unit_count(self, plan: RoutedPlan) -> int:
        return sum(1 for _ in self.units(plan)) + 1

    def run(self, ctx: RouteContext, files: list[FilePlan]) -> Iterator[tuple[str, FileEntry | Fallback]]:
        for f in files:
            try:
                yield f.rel, self.copy_file(ctx, f)
            except Fallback as exc:
                yield f.rel, exc

    def copy_file(self, ctx: RouteContext, f: FilePlan) -> FileEntry:
        raise NotImplementedError


REGISTRY: dict[str, Route] = {}


def register(route: Route) -> Route:
    if route.name not in NAMES:   # a name planned and priced nowhere would be a second list of routes
        raise ValueError(f"route {route.name!r} is not in bridge.routes.NAMES")
    REGISTRY[route.name] = route
    return route


def get(name: str) -> Route:
    _load_builtin()
    try:
        return REGISTRY[name]
    except KeyError:
        raise InvalidOption(f"unknown route {name!r}; routes: {', '.join(names())}") from None


def names() -> list[str]:
    _load_builtin()
    return [DIRECT, *sorted(REGISTRY)]


def built() -> list[str]:
    """The routes this bridge has, in ``NAMES`` order: direct, packing, and every route
    registered (a route module that is not installed is not built)."""
    _load_builtin()
    return [name for name in NAMES if name in (DIRECT, PACK) or name in REGISTRY]


_loaded = False


def _load_builtin() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    import importlib
    for module in BUILTIN:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if not (exc.name and module.startswith(exc.name)):
                raise


# Modules that register routes when imported; a missing one (not built or not installed) is skipped.
BUILTIN = ("bridge.routes.server", "bridge.routes.fromurl", "bridge.routes.native")


def scheme_reason(route: str, src_scheme: str, dst_scheme: str) -> str | None:
    """Why ``route`` cannot carry a copy between these two kinds of store, or None when it can:
    the route table, read by ``choose`` here and by bridge.policies.routes for ``mcbridge plan``.
    A name that is no route is None here (``get`` refuses it)."""
    if route == "server":
        return None if src_scheme == dst_scheme else "server-side copies stay inside one store account"
    if route == "from-url":
        if dst_scheme != "az":
            return "only Azure pulls from a URL (S3's UploadPartCopy takes S3 sources only)"
        return None if src_scheme in ("s3", "gs") else "from-url reads an S3 or GCS signed URL"
    if route == "sts":
        if dst_scheme != "gs":
            return "Storage Transfer Service writes into GCS only"
        return None if src_scheme in ("s3", "az", "gs") else "Storage Transfer Service needs an agent for local files"
    if route == "datasync":
        if "file" in (src_scheme, dst_scheme):
            return "DataSync needs an agent next to local files"
        return None if "s3" in (src_scheme, dst_scheme) else "DataSync moves data to or from S3"
    return None


def pair_reason(name: str, src: Location, dst: Location) -> str | None:
    """The route table's answer for this pair of roots."""
    return scheme_reason(name, src.scheme, dst.scheme)


def roots(plan: RoutedPlan) -> tuple[Location, Location]:
    src = parse(plan.single) if plan.single else parse(plan.source)
    return src, parse(plan.destination)


def runnable(src: Location, dst: Location, settings: Settings) -> tuple[list[str], list[str]]:
    """The routes that may carry a copy between these roots without --route, ``direct`` first:
    each of ``AUTOMATIC`` and of the enabled native routes that serves the pair and is
    ``preferred`` for it; and why each other one may not."""
    known = names()
    can, why_not = [DIRECT], []
    for name in (*AUTOMATIC, *settings.native.enabled):   # native routes only where enabled
        if name not in known:
            continue
        route = get(name)
        if not route.preferred(src, dst):
            continue
        reason = pair_reason(name, src, dst) or route.serves(src, dst, settings)
        if reason is None:
            can.append(name)
        else:
            why_not.append(f"{name}: {reason}")
    return can, why_not


def decide(src: Location, dst: Location, settings: Settings, forced: str | None = None) -> tuple[str, str]:
    """The one route decision, (route, why), for a copy between these roots: the forced route
    (bad input, exit 2, when it cannot serve the pair or lacks what its settings must give, its
    credentials among them), else the first ``runnable`` route that is not direct. It reads only
    the roots and the settings, so cp and sync take it before any request of their planning (a
    bad --route is refused before the stores' own checks); ``choose`` takes it for a plan."""
    if forced is not None and forced != DIRECT:
        reason = pair_reason(forced, src, dst) or get(forced).serves(src, dst, settings)
        if reason:
            raise InvalidOption(f"--route {forced} cannot copy {src} to {dst}: {reason}")
        return forced, FORCED
    if forced == DIRECT:
        return DIRECT, FORCED
    can, why_not = runnable(src, dst, settings)
    if len(can) == 1:
        return DIRECT, "no other route serves the pair (" + "; ".join(why_not) + ")" if why_not else "the only route"
    return can[1], _why(can[1])


def choose(plan: RoutedPlan, settings: Settings, forced: str | None = None) -> RoutedPlan:
    """``decide`` for a plan's roots, set as ``plan.route`` and ``plan.route_why``: ``mcbridge
    plan`` (which marks it chosen among the priced routes), migrate, submit, replicate and the
    service's policies ask it."""
    plan.route, plan.route_why = decide(*roots(plan), settings, forced)
    return plan


def _why(name: str) -> str:
    return {"server": "source and destination are in one store account: the store copies inside itself",
            "from-url": "Azure pulls the bytes from a signed URL of the source",
            "sts": "enabled in the settings: Storage Transfer Service copies into GCS",
            "datasync": "enabled in the settings: DataSync copies to or from S3"}.get(name, f"{name} serves the pair")


def report(plan: RoutedPlan, fallbacks: dict[str, str], through: int,
           unproven: dict[str, str] | None = None) -> dict[str, Any]:
    """What ``--json``, the job record and the metrics say of a job's route; ``unproven``: the
    files it copied that nothing proved equal to their source (manifest.UNPROVEN), with why."""
    out = {"name": plan.route, "why": plan.route_why, "fallbacks": dict(sorted(fallbacks.items())),
           "bytes_through_bridge": through}
    if unproven:
        out["unproven"] = dict(sorted(unproven.items()))
    return out

