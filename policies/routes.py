"""The route planner: which way to move a plan's bytes, priced, timed and chosen.

Routes (their names are bridge.routes.NAMES, the route registry's, in this order):

    direct     through this process; serves every pair
    server     inside one store account: S3 CopyObject/UploadPartCopy, GCS rewrite, Azure Copy Blob
    from-url   into Azure from S3 or GCS: Put Block From URL on a signed source URL
    sts        into GCS: Storage Transfer Service (from S3, Azure Blob or GCS)
    datasync   AWS DataSync between S3 and S3, GCS or Azure Blob (agentless: no local paths)
    pack       through this process, packed into shards first: many small files become few objects

``plan_routes`` takes everything as data (usages, places, tables, which routes this bridge has
built and which of them it may run here, whether shards are acceptable) and returns one ``RouteChoice`` per route with exactly one
chosen: the route decided for the run (``decided``: what bridge.routes.choose picks, so that
``mcbridge plan`` marks the route cp takes), else the forced route, else the cheapest valid one,
ties (to the cent) broken by time, then by the order above (a what-if: ``--pack`` or routes
assumed available). Which routes are built and available are arguments: the caller reads them
from the route registry and the settings.

Time is an assumption, settable per route in the settings file (``pricing.speeds``):
startup + the longer of payload / bytes_per_s and cloud requests / requests_per_s. The defaults below come from
this project's benchmarks (bench/README.md) for direct and pack, and from the services' own
descriptions for the others (STS and DataSync take minutes to schedule a job).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bridge.policies.cost.money import usd, usd_number
from bridge.routes import DIRECT, NAMES, PACK

if TYPE_CHECKING:   # the price tables (pydantic, YAML) load when a route is priced, not when one is checked
    from bridge.policies.cost.model import Cost, Overrides, Place
    from bridge.policies.cost.prices import ProviderPrices

ORDER = NAMES
MiB = 1024 * 1024

# route -> (bytes per second, cloud requests per second, startup seconds)
DEFAULT_SPEEDS: dict[str, tuple[float, float, float]] = {
    "direct": (100 * MiB, 200.0, 1.0),      # bench: 70-110 MB/s per process, ~180-240 small objects/s
    "pack": (100 * MiB, 200.0, 1.0),
    "server": (500 * MiB, 200.0, 1.0),      # the store copies inside itself
    "from-url": (250 * MiB, 200.0, 1.0),
    "sts": (200 * MiB, 1000.0, 60.0),       # a transfer job is scheduled, then runs wide
    "datasync": (200 * MiB, 1000.0, 180.0), # a task execution launches in minutes
}


class RouteError(ValueError):
    """A forced route that cannot serve the pair, or an unknown route name."""


@dataclass
class RouteChoice:
    route: str
    valid: bool
    chosen: bool
    bytes: int
    requests: int
    cost: Cost
    seconds: float
    why: str
    usage: Any = None
    built: bool = True

    def to_dict(self, detail: bool = True) -> dict[str, Any]:
        row = {"route": self.route, "built": self.built, "valid": self.valid, "chosen": self.chosen, "bytes": self.bytes,
               "requests": self.requests, "usd": usd_number(self.cost.total), "seconds": round(self.seconds, 3),
               "why": self.why}
        if detail:
            row["cost"] = self.cost.to_dict()
            if self.usage is not None:
                row["usage"] = self.usage.to_dict()
        return row


def serves(route: str, src_scheme: str, dst_scheme: str, *, pack_allowed: bool) -> str | None:
    """Why ``route`` cannot carry a src -> dst copy, or None when it can."""
    from bridge.routes import scheme_reason
    if route not in ORDER:
        raise RouteError(f"unknown route {route!r}; routes: {', '.join(ORDER)}")
    if route == DIRECT:
        return None
    if route == PACK:
        return None if pack_allowed else "changes the destination to shards: allowed with --pack tar|parquet"
    return scheme_reason(route, src_scheme, dst_scheme)


def seconds(route: str, usage: Any, speeds: Mapping[str, Mapping[str, float | None]] | None = None) -> float:
    rate, req_rate, startup = DEFAULT_SPEEDS[route]
    given = (speeds or {}).get(route) or {}
    rate = given.get("bytes_per_s") or rate
    req_rate = given.get("requests_per_s") or req_rate
    startup = given.get("startup_s") if given.get("startup_s") is not None else startup
    cloud_requests = sum(sum(side.requests.values()) for side in (usage.source, usage.destination)
                         if side.scheme != "file")
    # Bytes and requests flow at once: the slower of the two bounds the run.
    return startup + max(usage.payload / rate, cloud_requests / req_rate)


def plan_routes(usages: Mapping[str, Any], src: Place, dst: Place, host: Place,
                tables: dict[str, ProviderPrices], *, available: Iterable[str], built: Iterable[str] | None = None,
                pack_allowed: bool = False, forced: str | None = None, overrides: Overrides | None = None,
                speeds: Mapping[str, Mapping[str, float | None]] | None = None,
                source_class: str | None = None, decided: tuple[str, str] | None = None,
                destination_class: str | None = None, source_classes: Mapping[str, int] | None = None
                ) -> list[RouteChoice]:
    """Every route priced and timed, exactly one chosen (see the module docstring); with
    ``decided`` (route, why), that route is the chosen one: the route a copy takes here.
    ``built`` (default: ``available``): the routes this bridge has, run here or not."""
    from bridge.policies.cost.model import price
    available = set(available)
    built = available if built is None else set(built) | available
    if forced is not None and forced not in ORDER:
        raise RouteError(f"unknown route {forced!r}; routes: {', '.join(ORDER)}")
    choices = []
    for route in ORDER:
        usage = usages[route]
        src_scheme, dst_scheme = usage.source.scheme, usage.destination.scheme
        reason = serves(route, src_scheme, dst_scheme, pack_allowed=pack_allowed)
        if reason is None and route not in available:
            reason = "built, not enabled in these settings" if route in built else "not built in this bridge"
        cost = price(usage, src, dst, host, tables, overrides, source_class, destination_class,
                     dict(source_classes or {}))
        choices.append(RouteChoice(route, reason is None, False, usage.destination.bytes_written,
                                   usage.request_count, cost, seconds(route, usage, speeds), reason or "", usage,
                                   route in built))
    valid = [c for c in choices if c.valid]
    if decided is not None and any(c.route == decided[0] and c.valid for c in choices):
        pick = next(c for c in choices if c.route == decided[0])
        pick.why = f"the route a copy takes here: {decided[1]}; {usd(pick.cost.total)}, about {_human_time(pick.seconds)}"
    elif forced is not None:
        pick = next(c for c in choices if c.route == forced)
        if not pick.valid:
            raise RouteError(f"route {forced} cannot be used for {_pair(src, dst)}: {pick.why}")
        pick.why = f"forced with --route; {usd(pick.cost.total)}, about {_human_time(pick.seconds)}"
    else:
        pick = min(valid, key=lambda c: (round(c.cost.total, 2), c.seconds, ORDER.index(c.route)))
        runner_up = [c for c in valid if c is not pick]
        pick.why = f"cheapest valid route: {usd(pick.cost.total)}, about {_human_time(pick.seconds)}"
        if runner_up:
            nxt = min(runner_up, key=lambda c: (round(c.cost.total, 2), c.seconds))
            if round(nxt.cost.total, 2) == round(pick.cost.total, 2):
                pick.why += f"; as cheap as {nxt.route} and faster"
            else:
                pick.why += f"; {nxt.route}, the next, costs {usd(nxt.cost.total)}"
    pick.chosen = True
    for c in choices:
        if c.valid and not c.chosen:
            diff = round(c.cost.total - pick.cost.total, 2)
            c.why = (f"valid; {usd(diff)} more than {pick.route}" if diff > 0 else
                     f"valid; {usd(-diff)} cheaper than the forced {pick.route}" if diff < 0 else
                     f"valid; as cheap as {pick.route}, " + ("slower" if c.seconds >= pick.seconds else "faster"))
    return choices


def _pair(src: Place, dst: Place) -> str:
    return f"{src} -> {dst}"


def _human_time(s: float) -> str:
    if s < 90:
        return f"{s:.0f}s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def scheme_provider(scheme: str) -> str:
    from bridge.policies.cost.model import CLOUD_OF_SCHEME
    return CLOUD_OF_SCHEME.get(scheme, "site")
