"""Stores are found through a registry keyed by scheme, each with the extra that installs it."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass

from bridge.config import SecretStr, Settings
from bridge import registry
from bridge.errors import BadURL
from bridge.stores.base import Features, ObjectInfo, PartRecord, Store
from bridge.urls import Location

__all__ = ["Features", "ObjectInfo", "PartRecord", "Store", "get_store", "REGISTRY"]


@dataclass(frozen=True)
class Backend:
    target: str   # "module:Class"
    extra: str    # pip extra that installs its SDKs


REGISTRY: dict[str, Backend] = {
    "file": Backend("bridge.stores.local:LocalStore", ""),
    "s3": Backend("bridge.stores.s3:S3Store", "s3"),
    "gs": Backend("bridge.stores.gcs:GCSStore", "gcs"),
    "az": Backend("bridge.stores.azure:AzureStore", "azure"),
}

# Stores hold SDK clients (connection pools, credentials): a process that builds many Settings
# (a worker serving many jobs) must not keep one set of clients per Settings object forever.
CACHE_SIZE = 8
_cache: OrderedDict[tuple[str, str], Store] = OrderedDict()
_lock = threading.Lock()


def store_class(scheme: str) -> type[Store]:
    backend = REGISTRY.get(scheme)
    if backend is None:
        raise BadURL(f"no store for scheme {scheme!r}")
    return registry.load(backend.target, backend.extra, f"{scheme}://")


def fingerprint(settings: Settings) -> str:
    """Equal settings (secrets included) give the same fingerprint, so they share one store."""
    def plain(value):
        if isinstance(value, SecretStr):
            return value.get_secret_value()
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value
    raw = json.dumps(plain(settings.model_dump()), sort_keys=True, default=str)
    return hashlib.sha256(raw.encode()).hexdigest()


def get_store(loc: Location | str, settings: Settings) -> Store:
    """The store for a location's scheme, one instance per (scheme, equal settings) among the
    ``CACHE_SIZE`` most recently used. An evicted store is dropped, not closed: a job still
    running with it keeps it alive, and its clients are freed with the last reference."""
    scheme = loc if isinstance(loc, str) else loc.scheme
    key = (scheme, fingerprint(settings))
    with _lock:
        store = _cache.get(key)
        if store is None:
            store = _cache[key] = store_class(scheme)(settings)
            while len(_cache) > CACHE_SIZE:
                _cache.popitem(last=False)
        else:
            _cache.move_to_end(key)
        return store
