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

from bridge.cache.core import Cache
from bridge.config import load_settings
from bridge.errors import ObjectNotFound

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
        try:
            _loc, info, _key = self.cache.locate(url)
        except ObjectNotFound as exc:
            raise FileNotFoundError(url) from exc
        return {"name": path, "size": info.size, "type": "file"}

    def ls(self, path, detail=True, **kwargs):
        entry = self.info(path)
        return [entry] if detail else [entry["name"]]

    def cat_file(self, path, start=None, end=None, **kwargs):
        with self._open(path) as f:
            size = os.fstat(f.fileno()).st_size
            first = 0 if start is None else start if start >= 0 else max(0, size + start)
            stop = size if end is None else end if end >= 0 else max(0, size + end)
            f.seek(first)
            return f.read(max(0, stop - first))
