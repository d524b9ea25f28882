"""What a transfer costs: a usage (bridge.policies.cost.usage) priced with the price tables.

Dollars are egress + requests + native service fees + retrieval of cold storage classes:

- **egress**, per leg the bytes travel. ``direct``, ``pack`` and ``unpack`` carry the bytes
  source -> this process -> destination; the native routes carry them source -> destination. A leg leaving a
  cloud region is priced by that cloud: free inside the region, inter-region inside the
  provider, else to the internet (to a site) or to another cloud, tiered per month. A leg
  leaving a site (local, Lustre, on-premises) is free: the clouds charge nothing to receive.
  A private interconnect from the settings replaces the price of the legs it joins.
- **requests**, per store, by the provider's price class of each request kind.
- **service fees**: DataSync per GB and, in Enhanced mode, per task execution, by the task mode
  the settings give (``Overrides.service_modes``); Storage Transfer Service between clouds
  charges none.
- **retrieval**, when the source objects are in a cold storage class (given, or each class's
  bytes as the source's listing says).
- **the destination's storage class**: writes into a cold class are priced at its request price
  (S3 charges $0.05 per 1,000 PUTs into Deep Archive against $0.005), part of the total; what the
  copy will then cost to keep (per month, and the least it is billed: the class's minimum storage
  duration) is reported beside the total (``storage``), not in it.

Discounts from the settings file take their percentage off each part. Pure functions: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bridge.policies.cost import money
from bridge.policies.cost.prices import GB, ProviderPrices

CLOUD_OF_SCHEME = {"s3": "aws", "gs": "gcp", "az": "azure"}
SERVICE_OF_ROUTE = {"datasync": ("aws", "datasync"), "sts": ("gcp", "storage_transfer")}


@dataclass(frozen=True)
class Place:
    """Where bytes are: a cloud provider's region, or a named site (``site``) outside the clouds."""

    provider: str          # aws | gcp | azure | site
    region: str            # the cloud region, or the site's name
    assumed: bool = False  # the region was not found out but defaulted

    @classmethod
    def parse(cls, text: str) -> Place:
        provider, sep, region = text.partition(":")
        if not sep or provider not in ("aws", "gcp", "azure", "site") or not region:
            raise ValueError(f"a place is PROVIDER:REGION (aws, gcp, azure) or site:NAME, not {text!r}")
        return cls(provider, region)

    def __str__(self) -> str:
        return f"{self.provider}:{self.region}" + (" (assumed)" if self.assumed else "")

    @property
    def label(self) -> str:
        """The place as a sentence names it: a site by its name ("local"), a region with its cloud."""
        return self.region if self.provider == "site" else str(self)


@dataclass
class Overrides:
    """The settings file's ``pricing`` section, as plain data."""

    discounts: dict[str, dict[str, float]] = field(default_factory=dict)   # provider -> {egress_pct ...}
    interconnects: list[tuple[str, str, float]] = field(default_factory=list)
    month_to_date_gb: dict[str, float] = field(default_factory=dict)
    # route -> the task mode its service runs in (DataSync: ENHANCED or BASIC, priced apart)
    service_modes: dict[str, str] = field(default_factory=lambda: {"datasync": "ENHANCED"})

    @classmethod
    def from_settings(cls, pricing: Any, native: Any = None) -> Overrides:
        modes = {"datasync": native.datasync_task_mode} if native is not None else {"datasync": "ENHANCED"}
        return cls({p: d.model_dump() for p, d in pricing.discounts.items()},
                   [(i.between[0], i.between[1], i.usd_per_gb) for i in pricing.interconnects],
                   dict(pricing.month_to_date_gb), modes)

    def off(self, provider: str, part: str) -> float:
        return 1.0 - self.discounts.get(provider, {}).get(f"{part}_pct", 0.0) / 100.0


@dataclass
class Cost:
    egress: float = 0.0
    requests: float = 0.0
    services: float = 0.0
    retrieval: float = 0.0
    lines: list[str] = field(default_factory=list)   # how each amount was reached
    storage: dict[str, Any] = field(default_factory=dict)   # the destination class's keeping costs

    @property
    def total(self) -> float:
        return self.egress + self.requests + self.services + self.retrieval

    def to_dict(self) -> dict[str, Any]:
        return {"usd": round(self.total, 6), "egress_usd": round(self.egress, 6),
                "requests_usd": round(self.requests, 6), "services_usd": round(self.services, 6),
                "retrieval_usd": round(self.retrieval, 6), "breakdown": self.lines,
                **({"storage": self.storage} if self.storage else {})}


def _matches(pattern: str, place: Place) -> bool:
    provider, _, region = pattern.partition(":")
    return provider == place.provider and region in ("*", place.region)


def leg_price(frm: Place, to: Place, gb: float, tables: dict[str, ProviderPrices],
              overrides: Overrides) -> tuple[float, str]:
    """Dollars for ``gb`` travelling from ``frm`` to ``to``, and how that was priced."""
    for a, b, usd in overrides.interconnects:
        if (_matches(a, frm) and _matches(b, to)) or (_matches(a, to) and _matches(b, frm)):
            return gb * usd, f"{gb:.3f} GB {frm} -> {to} over a private interconnect at ${usd}/GB"
    if frm.provider == "site":
        why = "neither end is in a cloud" if to.provider == "site" else "a cloud does not bill data coming in"
        return 0.0, f"{gb:.3f} GB {frm.label} -> {to.label}: no cloud charges ({why})"
    if frm.provider == to.provider and frm.region == to.region:
        return 0.0, f"{gb:.3f} GB within {frm.label}: no charge inside one region"
    table = tables[frm.provider]
    off = overrides.off(frm.provider, "egress")
    group = table.group(frm.region)
    if frm.provider == to.provider:
        inter = table.egress.inter_region[group]
        same = table.group(to.region) == group
        rate = inter.within_group_usd_per_gb if same else inter.across_groups_usd_per_gb
        return gb * rate * off, (f"{gb:.3f} GB {frm} -> {to} inter-region at ${rate}/GB"
                                 f"{_pct(off)} ({inter.source}, {inter.date})")
    kind = "internet" if to.provider == "site" else "other_clouds"
    tiers = getattr(table.egress, kind)[group]
    already = overrides.month_to_date_gb.get(frm.provider, 0.0)
    usd = tiers.cost(gb, already) * off
    return usd, (f"{gb:.3f} GB {frm} -> {to} out to {'the internet' if kind == 'internet' else 'another cloud'}, "
                 f"tiered from {already:g} GB this month{_pct(off)}: {money.usd(usd)} ({tiers.source}, {tiers.date})")


def _pct(off: float) -> str:
    return f" less {100 * (1 - off):g}%" if off != 1.0 else ""


def legs(route: str, src: Place, dst: Place, host: Place) -> list[tuple[Place, Place]]:
    """The network legs a route's bytes travel."""
    if route in ("direct", "pack", "unpack"):
        return [(src, host), (host, dst)]
    return [(src, dst)]


def price(usage: Any, src: Place, dst: Place, host: Place, tables: dict[str, ProviderPrices],
          overrides: Overrides | None = None, source_class: str | None = None,
          destination_class: str | None = None, source_classes: dict[str, int] | None = None) -> Cost:
    """The dollars of ``usage`` (a bridge.policies.cost.usage.Usage) between these places. ``source_class``
    prices every byte's retrieval from that class; else ``source_classes`` (bytes by class, from
    the listing) prices each class's bytes. ``destination_class`` is the class written."""
    overrides = overrides or Overrides()
    cost = Cost()
    gb = usage.payload / GB
    for frm, to in legs(usage.route, src, dst, host):
        usd, line = leg_price(frm, to, gb, tables, overrides)
        cost.egress += usd
        cost.lines.append(line)
    for side, place in ((usage.source, src), (usage.destination, dst)):
        if place.provider == "site" or not side.requests:
            continue
        table = tables[place.provider]
        off = overrides.off(place.provider, "requests")
        written = table.storage_class(destination_class) if destination_class and side is usage.destination else None
        usd = sum(_request_usd(table, kind, n, written) for kind, n in side.requests.items()) * off
        cost.requests += usd
        counts = ", ".join(f"{n} {kind}" for kind, n in sorted(side.requests.items()))
        cost.lines.append(f"requests at {place}: {counts} = {money.usd(usd)}{_pct(off)}")
    if usage.route in SERVICE_OF_ROUTE:
        provider, service = SERVICE_OF_ROUTE[usage.route]
        mode = overrides.service_modes.get(usage.route)
        rate = tables[provider].service(service, mode)
        off = overrides.off(provider, "services")
        runs = 1 if usage.files else 0   # one remote job (a task execution) for all of a plan's files
        cost.services += (gb * rate.usd_per_gb + runs * rate.usd_per_run) * off
        per_run = f" + ${rate.usd_per_run} per run x {runs}" if rate.usd_per_run else ""
        cost.lines.append(f"{service}{f' ({mode} mode)' if mode else ''} fee {gb:.3f} GB at ${rate.usd_per_gb}/GB"
                          f"{per_run}{_pct(off)} ({rate.source}, {rate.date})")
    classes = {source_class: usage.payload} if source_class else dict(source_classes or {})
    if classes and src.provider != "site":
        for name, nbytes in sorted(classes.items()):
            rate = tables[src.provider].retrieval_rate(name)
            if rate is None and source_class:
                raise ValueError(f"no retrieval price for storage class {source_class!r} on {src.provider}; "
                                 f"known: {', '.join(sorted(tables[src.provider].retrieval)) or 'none'}")
            if rate is None:
                continue   # a class read without a retrieval fee (STANDARD, Hot ...)
            part = nbytes / GB
            cost.retrieval += part * rate.usd_per_gb
            cost.lines.append(f"retrieval of {part:.3f} GB from {name} at ${rate.usd_per_gb}/GB ({rate.source}, {rate.date})")
    if destination_class and dst.provider != "site":
        kept = tables[dst.provider].storage_class(destination_class)
        if kept is None:
            raise ValueError(f"no storage price for class {destination_class!r} on {dst.provider}; "
                             f"known: {', '.join(sorted(tables[dst.provider].storage)) or 'none'}")
        stored = usage.payload / GB
        month = stored * kept.usd_per_gb_month
        cost.storage = {"class": destination_class, "gb": round(stored, 6),
                        "usd_per_gb_month": kept.usd_per_gb_month, "month_usd": round(month, 6),
                        "min_days": kept.min_days, "minimum_usd": round(month * kept.min_days / 30, 6)}
        cost.lines.append(f"kept in {destination_class}: {stored:.3f} GB at ${kept.usd_per_gb_month}/GB-month "
                          f"= ${month:.4f} a month, billed for at least {kept.min_days} days "
                          f"({kept.source}, {kept.date})")
    return cost


WRITES = ("PUT", "BEGIN", "PART", "COMPLETE", "COPY")   # requests that write into the class (bridge's
# own manifest among them: priced as if it went there too, a small overestimate)


def _request_usd(table: ProviderPrices, kind: str, count: int, written: Any) -> float:
    """A kind's requests at the price of their class; writes into ``written`` (a StorageRate) at
    that storage class's write price."""
    if written is not None and written.write_usd_per_1000 is not None and kind in WRITES:
        return written.write_usd_per_1000 * count / 1000.0
    return table.request_usd(kind, count)
