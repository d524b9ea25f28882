"""Stores are found through a registry keyed by scheme, each with the extra that installs it."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from bridge.config import Settings
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

_cache: dict[tuple[str, int], Store] = {}
_lock = threading.Lock()


def store_class(scheme: str) -> type[Store]:
    backend = REGISTRY.get(scheme)
    if backend is None:
        raise BadURL(f"no store for scheme {scheme!r}")
    return registry.load(backend.target, backend.extra, f"{scheme}://")


def get_store(loc: Location | str, settings: Settings) -> Store:
    """The store for a location's scheme, one instance per (scheme, settings) in this process."""
    scheme = loc if isinstance(loc, str) else loc.scheme
    key = (scheme, id(settings))
    with _lock:
        store = _cache.get(key)
        if store is None:
            store = _cache[key] = store_class(scheme)(settings)
        return store
