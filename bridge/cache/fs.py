"""fsspec protocol ``bridgecache``: reads through bridge's cache, so that fsspec users read a
cached local file instead of the store.

    fsspec.open("bridgecache::s3://bucket/key")     chained: fsspec strips s3:// and tells us
    fsspec.open("bridgecache://gs://bucket/key")    whole: any scheme bridge knows, no fsspec backend

Credentials and endpoints are bridge's (its settings file and environment), not fsspec's
``target_options``: the object is read by bridge's stores. Read-only.
"""

from __future__ import annotations

import os

from fsspec.implementations.chained import ChainedFileSystem

from bridge.cache.core import Cache, source_location
from bridge.config import load_settings
from bridge.errors import ObjectNotFound
from bridge.stores import get_store
from bridge.urls import Location

# fsspec protocol names -> bridge's URL schemes
_SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gs", "gcs": "gs", "az": "az", "abfs": "az", "file": "file",
            "local": "file"}


class BridgeCacheFileSystem(ChainedFileSystem):
    protocol = "bridgecache"
    root_marker = ""

    def __init__(self, target_protocol: str | None = None, target_options: dict | None = None,
                 fo: str | None = None, settings=None, **kwargs):
        super().__init__(**kwargs)
        self.target_protocol = _SCHEMES.get(target_protocol or "", target_protocol)
        self.cache = Cache(settings or load_settings())

    @classmethod
    def _strip_protocol(cls, path):
        path = str(path)
        for prefix in ("bridgecache::", "bridgecache://"):
            if path.startswith(prefix):
                return path[len(prefix):]
        return path

    def _url(self, path: str) -> str:
        path = self._strip_protocol(path)
        if "://" in path or self.target_protocol in (None, "file"):
            return path if "://" in path or path.startswith("/") else "/" + path
        return f"{self.target_protocol}://{path}"

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        if mode != "rb":
            raise NotImplementedError("bridgecache is read-only")
        return self.cache.open(self._url(path))

    def info(self, path, **kwargs):
        url = self._url(path)
        loc = source_location(url)
        if not loc.is_prefix:
            try:
                _loc, info, _key = self.cache.locate(loc)
                return {"name": path, "size": info.size, "type": "file"}
            except ObjectNotFound:
                pass   # no such object: a folder of that name, or nothing
        if next(self._level(path, loc.as_prefix()), None) is None:
            raise FileNotFoundError(url)
        return {"name": self._strip_protocol(path).rstrip("/"), "size": 0, "type": "directory"}

    def ls(self, path, detail=True, **kwargs):
        """The object ``path`` names, or one level of the folder it names (its objects and its
        sub-folders), as the store lists them now: the cache holds objects, not listings."""
        entry = self.info(path)
        if entry["type"] == "file":
            entries = [entry]
        else:
            folder = source_location(self._url(path)).as_prefix()
            entries = sorted(self._level(path, folder), key=lambda e: e["name"])
        return entries if detail else [e["name"] for e in entries]

    def _level(self, path: str, prefix: Location):
        """fsspec entries of one level of the store's listing under ``prefix``, named in the form
        ``path`` was given in (a whole URL, or a chained path)."""
        base = self._strip_protocol(path).rstrip("/") + "/"
        for item in get_store(prefix, self.cache.settings).list_level(prefix):
            if isinstance(item, Location):
                yield {"name": base + item.key[len(prefix.key):].rstrip("/"), "size": 0, "type": "directory"}
            else:
                yield {"name": base + item.location.relative_to(prefix), "size": item.size, "type": "file"}

    def cat_file(self, path, start=None, end=None, **kwargs):
        with self._open(path) as f:
            size = os.fstat(f.fileno()).st_size
            first = 0 if start is None else start if start >= 0 else max(0, size + start)
            stop = size if end is None else end if end >= 0 else max(0, size + end)
            f.seek(first)
            return f.read(max(0, stop - first))
