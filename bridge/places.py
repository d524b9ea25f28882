"""Where each store's bytes are, for pricing: a cloud region or a named site.

The I/O half of the cost model (policies/ decides with the answers): S3 buckets by
GetBucketLocation, GCS buckets by their ``location``, Azure accounts from the settings
(``azure.region``: the data plane does not say), local and Lustre paths as the site named by
``pricing.site``. ``pricing.regions`` maps URL prefixes to regions and wins over all of these.
Answers are cached per process: a bucket does not move.
"""

from __future__ import annotations

import threading

from bridge.config import Settings
from bridge.stores import get_store
from bridge.urls import parse
from policies.cost import CLOUD_OF_SCHEME, Place
from policies.prices import builtin

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
