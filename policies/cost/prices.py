"""Price tables: what moving bytes and sending requests costs, per provider, as data.

Each provider's table is a YAML file in ``policies/cost/prices/`` (shipped with the package), checked
with pydantic when loaded; every price names where it comes from (the provider's public pricing
page and section) and the date it was read. Negotiated discounts and private interconnects come
from the ``pricing`` section of the settings file and are applied on top (``with_overrides``).

    egress.internet[group]        tiered $/GB out to the internet, by the source's region group
    egress.other_clouds[group]    tiered $/GB to another cloud (all three price it as internet)
    egress.inter_region[group]    $/GB to another region of the same provider: same group, other
    egress.same_region            $/GB inside one region (free everywhere)
    requests.classes[name]        $ per 1,000 requests of a price class (S3 write/read, GCS A/B ...)
    requests.kinds[kind]          bridge's request kinds (GET, PUT, PART ...) -> price class
    retrieval[storage class]      $/GB read from a cold storage class
    storage[storage class]        $/GB-month stored in a class, its minimum storage duration in
                                  days (deleting or moving sooner bills the rest), and what a
                                  write into the class costs per 1,000 when it differs from the
                                  standard class's
    services[name]                $/GB of a native transfer service (DataSync, Storage Transfer),
                                  and $ per run (a task execution) where the service bills one;
                                  a service with task modes has an entry per mode, ``NAME_MODE``
                                  (``datasync_enhanced``, ``datasync_basic``: ``service``)

Nothing here does I/O except reading these files once.
"""

from __future__ import annotations

import functools
from datetime import date
from importlib import resources
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

GB = 1 << 30            # the providers bill data transfer per GiB
PROVIDERS = ("aws", "gcp", "azure")
REQUEST_KINDS = ("GET", "HEAD", "LIST", "PUT", "BEGIN", "PART", "COMPLETE", "COPY", "DELETE")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Sourced(_Strict):
    source: str = Field(min_length=10)  # the pricing page's name and section
    date: date


class Rate(Sourced):
    usd_per_gb: float = Field(ge=0)


class ServiceRate(Rate):
    usd_per_run: float = Field(0.0, ge=0)   # a fee per run of the service (DataSync: per task execution)


class Tier(_Strict):
    up_to_gb: float | None = Field(None, gt=0)  # None: everything above the previous tier
    usd_per_gb: float = Field(ge=0)


class Tiered(Sourced):
    tiers: list[Tier] = Field(min_length=1)

    @model_validator(mode="after")
    def _ascending(self) -> Tiered:
        bounds = [t.up_to_gb for t in self.tiers]
        if bounds[-1] is not None or any(b is None for b in bounds[:-1]):
            raise ValueError("only the last tier is open-ended (no up_to_gb)")
        if bounds[:-1] != sorted(bounds[:-1]):
            raise ValueError("tiers must be in ascending order of up_to_gb")
        return self

    def cost(self, gb: float, already_gb: float = 0.0) -> float:
        """Dollars for ``gb`` sent after ``already_gb`` this month, tier by tier."""
        total, low, start, end = 0.0, 0.0, already_gb, already_gb + gb
        for tier in self.tiers:
            high = tier.up_to_gb if tier.up_to_gb is not None else float("inf")
            overlap = max(0.0, min(end, high) - max(start, low))
            total += overlap * tier.usd_per_gb
            low = high
        return total


class InterRegion(Sourced):
    within_group_usd_per_gb: float = Field(ge=0)
    across_groups_usd_per_gb: float = Field(ge=0)


class PerThousand(Sourced):
    usd: float = Field(ge=0)


class StorageRate(Sourced):
    usd_per_gb_month: float = Field(ge=0)
    min_days: int = Field(0, ge=0)
    write_usd_per_1000: float | None = Field(None, ge=0)


class Egress(_Strict):
    internet: dict[str, Tiered]
    other_clouds: dict[str, Tiered]
    inter_region: dict[str, InterRegion]
    same_region: Rate


class Requests(_Strict):
    classes: dict[str, PerThousand]
    kinds: dict[str, str]

    @model_validator(mode="after")
    def _every_kind_priced(self) -> Requests:
        missing = [k for k in REQUEST_KINDS if k not in self.kinds]
        if missing:
            raise ValueError(f"kinds lacks {', '.join(missing)}")
        unknown = sorted({c for c in self.kinds.values() if c not in self.classes})
        if unknown:
            raise ValueError(f"kinds names undefined classes: {', '.join(unknown)}")
        return self


class ProviderPrices(_Strict):
    provider: Literal["aws", "gcp", "azure"]
    scheme: str
    default_region: str
    region_groups: dict[str, list[str]]
    egress: Egress
    requests: Requests
    retrieval: dict[str, Rate] = {}
    storage: dict[str, StorageRate] = {}
    services: dict[str, ServiceRate] = {}

    def storage_class(self, name: str) -> StorageRate | None:
        """The storage prices of a class, named as the store names it (Azure's ``Cool`` is ``COOL``)."""
        return self.storage.get(name.upper())

    def service(self, name: str, mode: str | None = None) -> ServiceRate:
        """The price of a native service, of its task mode when it has modes (``datasync`` in
        ``ENHANCED`` is ``services.datasync_enhanced``)."""
        key = f"{name}_{mode.lower()}" if mode else name
        if key not in self.services:
            raise ValueError(f"no price for {name}" + (f" in {mode} mode" if mode else "")
                             + f" on {self.provider}; known: {', '.join(sorted(self.services)) or 'none'}")
        return self.services[key]

    def retrieval_rate(self, name: str) -> Rate | None:
        return self.retrieval.get(name.upper())

    @model_validator(mode="after")
    def _groups_priced(self) -> ProviderPrices:
        for table in ("internet", "other_clouds", "inter_region"):
            missing = [g for g in self.region_groups if g not in getattr(self.egress, table)]
            if missing:
                raise ValueError(f"egress.{table} lacks region groups {', '.join(missing)}")
        return self

    def group(self, region: str) -> str:
        """The region group of ``region`` (case-insensitive prefix match); the default region's
        group when nothing matches."""
        name = region.lower()
        for group, prefixes in self.region_groups.items():
            if any(name.startswith(p.lower()) for p in prefixes):
                return group
        return self.group(self.default_region) if region != self.default_region else next(iter(self.region_groups))

    def request_usd(self, kind: str, count: int) -> float:
        return self.requests.classes[self.requests.kinds[kind]].usd * count / 1000.0


class PriceError(ValueError):
    """A price table that does not pass its checks; names the file and the field."""


def parse(text: str, name: str) -> ProviderPrices:
    try:
        return ProviderPrices.model_validate(yaml.safe_load(text))
    except yaml.YAMLError as exc:
        raise PriceError(f"{name}: not valid YAML: {str(exc).splitlines()[0]}") from None
    except ValidationError as exc:
        e = exc.errors()[0]
        raise PriceError(f"{name}: {'.'.join(map(str, e['loc']))}: {e['msg']}") from None


@functools.cache
def builtin() -> dict[str, ProviderPrices]:
    """The tables shipped in policies/cost/prices/, by provider."""
    folder = resources.files("bridge.policies.cost") / "prices"
    tables = {}
    for provider in PROVIDERS:
        table = parse((folder / f"{provider}.yaml").read_text(), f"policies/cost/prices/{provider}.yaml")
        tables[table.provider] = table
    return tables
