"""Reading shard sets: find one (``open_set``) and read one file through the index by a single
ranged read (``cat``). The seekable view over a stored object is ``rangefile.RangeFile``."""

from __future__ import annotations

import hashlib

from bridge.config import Settings
from bridge.errors import IntegrityError, ObjectNotFound, UsageError
from bridge.packing import index as indexes
from bridge.stores import Store, get_store
from bridge.urls import Location, parse


def open_set(url: str, settings: Settings, prefix: str | None) -> tuple[Store, indexes.ShardSet]:
    """The shard set at ``url``: a root holding one, or its ``.index.json`` itself."""
    loc = parse(url)
    store = get_store(loc, settings)
    if loc.key.endswith(".index.json"):
        head, _, name = loc.key.rpartition("/")
        return store, indexes.read(store, Location(loc.scheme, loc.bucket, head + "/" if head else ""), name)
    shard_set = indexes.find(store, loc.as_prefix(), prefix)
    if shard_set is None:
        raise ObjectNotFound(f"{loc.as_prefix()}: no shard-set index (*.index.json) there")
    return store, shard_set


def cat(url: str, path: str, settings: Settings, prefix: str | None = None) -> tuple[bytes, dict]:
    """One file's bytes out of a shard set: the index, the shard's list, then one ranged read of
    the shard. The bytes are checked against the file's SHA-256."""
    store, shard_set = open_set(url, settings, prefix)
    shard = shard_set.shard_for(path)
    entry = None
    if shard is not None:
        entry = next((e for e in indexes.read_list(store, shard_set, shard) if e["path"] == path), None)
    if entry is None:
        raise ObjectNotFound(f"{path!r} is not in the shard set {shard_set.root.join(shard_set.name)}")
    if "offset" not in entry:
        raise UsageError(f"{path!r} has no byte range in the index: use mcbridge unpack")
    loc = shard_set.root.join(shard["name"])
    data = store.read(loc, entry["offset"], entry["length"])
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise IntegrityError(f"{path!r} read from {loc} does not match its SHA-256 in the index")
    return data, {"shard": str(loc), "offset": entry["offset"], "length": entry["length"],
                  "sha256": entry["sha256"]}
