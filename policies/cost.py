"""What a transfer costs: a usage (bridge/estimate.py) priced with the price tables.

Dollars are egress + requests + native service fees + retrieval of cold storage classes:

- **egress**, per leg the bytes travel. ``direct``, ``pack`` and ``unpack`` carry the bytes
  source -> this process -> destination; the native routes carry them source -> destination. A leg leaving a
  cloud region is priced by that cloud: free inside the region, inter-region inside the
  provider, else to the internet (to a site) or to another cloud, tiered per month. A leg
  leaving a site (local, Lustre, on-premises) is free: the clouds charge nothing to receive.
  A private interconnect from the settings replaces the price of the legs it joins.
- **requests**, per store, by the provider's price class of each request kind.
- **service fees**: DataSync per GB; Storage Transfer Service between clouds charges none.
- **retrieval**, when the source objects are in a cold storage class.

Discounts from the settings file take their percentage off each part. Pure functions: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bridge import money
from bridge.policies.prices import GB, ProviderPrices

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


@dataclass
class Overrides:
    """The settings file's ``pricing`` section, as plain data."""

    discounts: dict[str, dict[str, float]] = field(default_factory=dict)   # provider -> {egress_pct ...}
    interconnects: list[tuple[str, str, float]] = field(default_factory=list)
    month_to_date_gb: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, pricing: Any) -> Overrides:
        return cls({p: d.model_dump() for p, d in pricing.discounts.items()},
                   [(i.between[0], i.between[1], i.usd_per_gb) for i in pricing.interconnects],
                   dict(pricing.month_to_date_gb))

    def off(self, provider: str, part: str) -> float:
        return 1.0 - self.discounts.get(provider, {}).get(f"{part}_pct", 0.0) / 100.0


@dataclass
class Cost:
    egress: float = 0.0
    requests: float = 0.0
    services: float = 0.0
    retrieval: float = 0.0
    lines: list[str] = field(default_factory=list)   # how each amount was reached

    @property
    def total(self) -> float:
        return self.egress + self.requests + self.services + self.retrieval

    def to_dict(self) -> dict[str, Any]:
        return {"usd": round(self.total, 6), "egress_usd": round(self.egress, 6),
                "requests_usd": round(self.requests, 6), "services_usd": round(self.services, 6),
                "retrieval_usd": round(self.retrieval, 6), "breakdown": self.lines}


def _matches(pattern: str, place: Place) -> bool:
    provider, _, region = pattern.partition(":")
    return provider == place.provider and region in ("*", place.region)


def leg_price(frm: Place, to: Place, gb: float, tables: dict[str, ProviderPrices],
              overrides: Overrides) -> tuple[float, str]:
    """Dollars for ``gb`` travelling from ``frm`` to ``to``, and how that was priced."""
    for a, b, usd in overrides.interconnects:
        if (_matches(a, frm) and _matches(b, to)) or (_matches(a, to) and _matches(b, frm)):
            return gb * usd, f"{gb:.3f} GB {frm} -> {to} over a private interconnect at ${usd}/GB"
    if frm.provider == "site" or (frm.provider == to.provider and frm.region == to.region):
        return 0.0, f"{gb:.3f} GB {frm} -> {to}: no charge"
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
          overrides: Overrides | None = None, source_class: str | None = None) -> Cost:
    """The dollars of ``usage`` (a bridge.estimate.Usage) between these places."""
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
        usd = sum(table.request_usd(kind, n) for kind, n in side.requests.items()) * off
        cost.requests += usd
        counts = ", ".join(f"{n} {kind}" for kind, n in sorted(side.requests.items()))
        cost.lines.append(f"requests at {place}: {counts} = {money.usd(usd)}{_pct(off)}")
    if usage.route in SERVICE_OF_ROUTE:
        provider, service = SERVICE_OF_ROUTE[usage.route]
        rate = tables[provider].services[service]
        off = overrides.off(provider, "services")
        cost.services += gb * rate.usd_per_gb * off
        cost.lines.append(f"{service} fee {gb:.3f} GB at ${rate.usd_per_gb}/GB{_pct(off)} ({rate.source}, {rate.date})")
    if source_class and src.provider != "site":
        rate = tables[src.provider].retrieval.get(source_class)
        if rate is None:
            raise ValueError(f"no retrieval price for storage class {source_class!r} on {src.provider}; "
                             f"known: {', '.join(sorted(tables[src.provider].retrieval)) or 'none'}")
        cost.retrieval += gb * rate.usd_per_gb
        cost.lines.append(f"retrieval of {gb:.3f} GB from {source_class} at ${rate.usd_per_gb}/GB ({rate.source}, {rate.date})")
    return cost
