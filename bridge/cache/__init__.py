"""A node-local read cache of objects, safe for many processes and nodes at once (bridge/cache/core.py).

    from bridge import cache
    path = cache.fetch("s3://corpus/shard-000001.tar")        # filled once, then local
    for url, path in cache.prefetch(urls, lookahead=4): ...    # in order, the next ones on their way
    fsspec.open("bridgecache::s3://corpus/shard-000001.tar")  # the same, for fsspec readers

Settings come from ``load_settings()`` (``MCBRIDGE_CACHE_DIR``, ``MCBRIDGE_CACHE_QUOTA``, the
``cache:`` section of the settings file) unless given.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from bridge.cache.core import Cache, CacheFull, Entry, targets, warm
from bridge.config import Settings, load_settings

__all__ = ["Cache", "CacheFull", "Entry", "fetch", "gopen_handler", "open_cached", "prefetch", "targets", "warm"]


def _cache(settings: Settings | None) -> Cache:
    return Cache(settings or load_settings())


def fetch(url: str, settings: Settings | None = None) -> Path:
    """The local path of the object at ``url`` (its current version), filled if needed."""
    return _cache(settings).fetch(url)


def open_cached(url: str, settings: Settings | None = None):
    """An open binary file of the cached object."""
    return _cache(settings).open(url)


def prefetch(urls: Iterable[str], lookahead: int | None = None,
             settings: Settings | None = None) -> Iterator[tuple[str, Path]]:
    return _cache(settings).prefetch(urls, lookahead)


def gopen_handler(settings: Settings | None = None):
    """A WebDataset opener reading through the cache, for ``bridgecache://URL`` shard URLs::

        webdataset.gopen_schemes["bridgecache"] = bridge.cache.gopen_handler()
        wds.WebDataset("bridgecache://s3://corpus/shard-{000000..000099}.tar")
    """
    from bridge.cache.fs import BridgeCacheFileSystem
    cache = _cache(settings)

    def gopen(url: str, mode: str = "rb", bufsize: int = 8192, **_kw):
        if mode != "rb":
            raise ValueError(f"{url}: bridgecache is read-only")
        return cache.open(BridgeCacheFileSystem._strip_protocol(url))

    return gopen


def _register_fsspec() -> None:
    try:
        import fsspec
    except ImportError:  # fsspec is a dependency; a trimmed install just goes without the protocol
        return
    fsspec.register_implementation("bridgecache", "bridge.cache.fs.BridgeCacheFileSystem", clobber=True)


_register_fsspec()
