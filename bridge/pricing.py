"""The I/O half of cost: pricing a live job, with the facts gathered here (the plan, where each
store's bytes are, what a job's journal holds) and the decisions made by the pure half,
bridge.policies.cost (usage, price tables, cost model) and bridge.policies.routes (route planner).

    locate(url, settings)               the place of a URL's bucket or site: a cloud region, or the
                                        site named by ``pricing.site`` (local and Lustre paths)
    route_plan(src, dst, settings)      every route priced and timed, one chosen (mcbridge plan)
    check_budget(usage, ...)            refuse a job whose estimate is above --max-cost
    spend(meter, ...)                   what a job cost, from what its meter counted
    journal_marks / pack_marks          what a job's journal holds of a plan's units (what ran)

Places are the I/O half of the cost model: S3 buckets by GetBucketLocation, GCS buckets by their
``location``, Azure accounts from the settings (``azure.region``: the data plane does not say).
``pricing.regions`` maps URL prefixes to regions and wins over all of these. Answers are cached
per process: a bucket does not move.
"""

from __future__ import annotations

import threading
from typing import Any

from bridge.config import Settings
from bridge.pipeline.plan import Plan, plan_copy
from bridge.errors import InvalidOption, OverBudget
from bridge.progress import human_bytes
from bridge.stores import get_store
from bridge.urls import parse
from bridge.policies import routes
from bridge.policies.cost import money, usage as counting
from bridge.policies.cost.model import CLOUD_OF_SCHEME, Overrides, Place, price
from bridge.policies.cost.prices import builtin
from bridge.policies.cost.usage import Usage

DEFAULT_SHARD_SIZE = 256 * 1024 * 1024

# -- where each store's bytes are (places) --------------------------------------------------------

_cache: dict[tuple[str, str, str], str | None] = {}
_lock = threading.Lock()


def _configured(url: str, settings: Settings) -> str | None:
    best = None
    for prefix, region in settings.pricing.regions.items():
        if url.startswith(prefix) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, region)
    return best[1] if best else None


def locate(url: str, settings: Settings) -> Place:
    """The place of ``url``'s bucket (or site); ``assumed`` when it could not be found out."""
    loc = parse(url)
    if loc.is_local:
        return Place("site", _configured(str(loc), settings) or settings.pricing.site)
    provider = CLOUD_OF_SCHEME[loc.scheme]
    region = _configured(str(loc), settings)
    if region is None and loc.scheme == "az":
        region = settings.azure.region
    if region is None:
        endpoint = {"s3": settings.s3.endpoint_url, "gs": settings.gcs.endpoint}.get(loc.scheme) or ""
        key = (loc.scheme, endpoint, loc.bucket)
        with _lock:
            known = key in _cache
            region = _cache.get(key)
        if not known:
            region = get_store(loc, settings).bucket_region(loc)
            with _lock:
                _cache[key] = region
    if region is None:
        return Place(provider, builtin()[provider].default_region, assumed=True)
    return Place(provider, region.lower())


def host(settings: Settings) -> Place:
    """Where this process runs (``pricing.runs_in``): its legs of a direct copy are priced from there."""
    return Place.parse(settings.pricing.runs_in)


# -- prices of plans ------------------------------------------------------------------------------


def _speeds(settings: Settings) -> dict[str, dict[str, float | None]]:
    return {route: speed.model_dump() for route, speed in settings.pricing.speeds.items()}


def available_routes(settings: Settings, extra: list[str] | None = None) -> set[str]:
    """The routes this bridge can run: those registered with bridge/routes (built and importable;
    the native ones only once enabled in the settings, since they start jobs in the user's
    accounts), packing, plus those the settings or ``extra`` mark available for planning."""
    from bridge import routes as runnable
    names = ((set(runnable.built()) - set(runnable.NATIVE)) | set(settings.native.enabled)
             | set(settings.pricing.available_routes) | set(extra or []))
    unknown = sorted(n for n in names if n not in routes.ORDER)
    if unknown:
        raise InvalidOption(f"unknown route {unknown[0]!r}; routes: {', '.join(routes.ORDER)}")
    return names


def places(plan: Plan, settings: Settings) -> tuple[Place, Place, Place]:
    source = plan.single or plan.source
    return locate(source, settings), locate(plan.destination, settings), host(settings)


def route_plan(source: str, destination: str, settings: Settings, *, pack: str | None = None,
               shard_size: int = DEFAULT_SHARD_SIZE, forced: str | None = None, source_class: str | None = None,
               available: list[str] | None = None) -> dict[str, Any]:
    """What each route would read, write, request, cost and take for SRC -> DST, and the choice."""
    if pack not in (None, "tar", "parquet"):
        raise InvalidOption(f"--pack takes tar or parquet, not {pack!r}")
    plan = plan_copy(source, destination, settings, settings.transfer.chunk_size, archived_ok=True)
    src, dst, where = places(plan, settings)
    classes: dict[str, int] = {}
    for f in plan.files:
        if f.storage_class:
            classes[f.storage_class] = classes.get(f.storage_class, 0) + f.size
    restore = [f for f in plan.files if f.storage_class in ARCHIVED]
    what_if = bool(pack or available or settings.pricing.available_routes)
    # Unless asked what would happen with packing or with routes assumed available, the route
    # marked chosen is the one cp takes here: the same decision, asked the same way.
    from bridge import routes as runnable_routes
    runs = None if forced or what_if else runnable_routes.choose(plan, settings)
    usages = {route: plan.usage(route, shard_size=shard_size, shard_format=pack or "tar")
              for route in routes.ORDER}
    try:
        choices = routes.plan_routes(usages, src, dst, where, builtin(), available=available_routes(settings, available),
                                     built=runnable_routes.built(),
                                     pack_allowed=pack is not None, forced=forced,
                                     overrides=Overrides.from_settings(settings.pricing, settings.native), speeds=_speeds(settings),
                                     source_class=source_class, source_classes=classes,
                                     destination_class=destination_class(destination, settings),
                                     decided=(runs.route, runs.route_why) if runs is not None else None)
    except (routes.RouteError, ValueError) as exc:
        raise InvalidOption(str(exc)) from None
    return {"source": plan.single or plan.source, "destination": plan.destination, "files": len(plan.files),
            "bytes": plan.bytes, "places": {"source": str(src), "destination": str(dst), "runs_in": str(where)},
            "source_classes": classes, "destination_class": destination_class(destination, settings),
            **({"restore": {"files": len(restore), "bytes": sum(f.size for f in restore),
                            "why": f"{len(restore)} source objects are archived "
                                   f"({', '.join(sorted({f.storage_class for f in restore}))}) and need a "
                                   f"restore before they can be read"}} if restore else {}),
            "routes": [c.to_dict() for c in choices]}


ARCHIVED = ("GLACIER", "DEEP_ARCHIVE", "Archive")   # classes read only after a restore


def destination_class(url: str, settings: Settings) -> str | None:
    """The storage class objects written at ``url`` get (its store's settings), or None."""
    scheme = parse(url).scheme
    return {"s3": settings.s3.storage_class, "gs": settings.gcs.storage_class,
            "az": settings.azure.tier}.get(scheme)


def cost_of(usage: Usage, settings: Settings, source_url: str, destination_url: str) -> float:
    src, dst = locate(source_url, settings), locate(destination_url, settings)
    return price(usage, src, dst, host(settings), builtin(), Overrides.from_settings(settings.pricing, settings.native)).total


def check_budget(usage: Usage | list[Usage], settings: Settings, max_cost: float | None,
                 what: str) -> float | None:
    """Refuse (OverBudget, exit 1) when ``usage`` (or all of them) would cost more than
    ``max_cost`` dollars; the estimate otherwise. Only listings, bucket lookups and (for a sync)
    the destination's manifest have been read by then: no object data."""
    if max_cost is None:
        return None
    if max_cost < 0:
        raise InvalidOption(f"--max-cost must be zero or more, not {max_cost}")
    usages = usage if isinstance(usage, list) else [usage]
    usd = sum(cost_of(u, settings, u.source.url, u.destination.url) for u in usages)
    if money.over(usd, max_cost):
        shown, cap = money.usd_apart(usd, max_cost)
        files = sum(u.files for u in usages)
        requests = sum(u.request_count for u in usages)
        payload = sum(u.payload for u in usages)
        routes_used = ", ".join(sorted({u.route for u in usages}))
        raise OverBudget(f"{what} refused: estimated {shown} ({files} files, {human_bytes(payload)}, "
                         f"{requests} requests, route {routes_used}) is over --max-cost {cap}; "
                         f"nothing was sent")
    return usd


def total_cost(usages: list[Usage], settings: Settings) -> float:
    return sum(cost_of(u, settings, u.source.url, u.destination.url) for u in usages)


def spend(meter: Any, source: str, destination: str, settings: Settings, *, route: str = "direct",
          moved_remote: int = 0, also: list[Usage] | None = None) -> float:
    """What a job cost, from what its meter counted (bridge/meter.py) with the price table, priced
    from where this process runs (``pricing.runs_in``): the process that ran it. ``also``: usages
    of work no request of ours carried (a cloud transfer service's own reads and writes)."""
    usages = counting.metered(meter, source, destination, route=route, moved_remote=moved_remote)
    return total_cost(usages + list(also or []), settings)


# -- what ran: a job's journal read -----------------------------------------------------------------

def journal_marks(plan: Plan, journal: Any) -> set[str]:
    """The journal records of ``plan``'s files that are there now: ``file:REL`` (finished),
    ``part:REL:N`` (a part sent) and ``upload:REL`` (a multipart upload begun); two looks give
    ``bridge.policies.cost.usage.ran`` what ran between them."""
    keys = []
    for f in plan.files:
        keys.append(f"file:{f.rel}")
        if f.part_size:
            keys += [f"upload:{f.rel}", *(f"part:{f.rel}:{n}" for n in f.part_numbers())]
    return _present(journal, keys)


def pack_marks(pack_plan: Any, journal: Any) -> set[str]:
    """The shards of a pack plan that the journal holds as written (``shard:NAME``)."""
    return _present(journal, [f"shard:{s.name}" for s in pack_plan.shards])


def _present(journal: Any, keys: list[str]) -> set[str]:
    if hasattr(journal, "present"):       # one round trip for many keys (workers/redisjournal.py)
        return journal.present(keys)
    return {k for k in keys if journal.get(k) is not None}
