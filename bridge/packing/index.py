"""The shard set's index: ``<root>/<prefix>.index.json``, written after every shard, as its commit
marker; and the entry in the prefix's record (``_bridge/log/``) that points at it.

The index document (versioned JSON, deterministic: the same input gives the same bytes)::

    {"format": "mcbridge-shardset", "version": 1, "shard_format": "tar", "prefix": "shard",
     "source": "s3://…/", "shard_size": 268435456, "max_count": null,
     "totals": {"shards": 2, "files": 3000, "bytes": 12000000, "shard_bytes": 13600000},
     "shards": [{"name": "shard-000000.tar", "size": …, "sha256": …, "crc32c": …,
                 "files": 1500, "bytes": …, "first": "a/000.jpg", "last": "a/749.txt",
                 "list": {"name": "shard.index.d/shard-000000.tar.jsonl", "size": …, "sha256": …,
                          "crc32c": …}}, …]}

Each shard's list holds one JSON line per file, in pack order::

    {"path": "a/000.jpg", "offset": 512, "length": 8192, "sha256": "…"}           tar
    {"path": …, "offset": …, "length": …, "row_group": 0, "row": 17, "sha256": …}   parquet

``offset`` and ``length`` are the file's bytes inside the shard: one ranged read returns them.
``first``/``last`` let a reader find a path's shard by binary search in pack order.

The manifest at the same root lists the shards, lists and index as ordinary files (size, CRC32C,
SHA-256, parts), and under ``shard_sets`` (one per prefix)::

    "shard_sets": {"shard": {"index": "shard.index.json", "size": …, "sha256": …,
                             "format": "tar", "version": 1, "shards": 2, "files": 3000}}

``check`` verifies a shard set from that pointer; ``mcbridge verify`` calls it.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bridge.errors import IntegrityError, ManifestError, ObjectNotFound, UsageError
from bridge.hashing import crc32c, crc_hex
from bridge.packing import layout
from bridge.packing.rangefile import RangeFile
from bridge.stores.base import Store
from bridge.urls import Location


@dataclass
class ShardSet:
    """An index as read: where it is, and its document."""

    root: Location
    name: str
    doc: dict[str, Any]

    @property
    def shards(self) -> list[dict[str, Any]]:
        return self.doc["shards"]

    @property
    def prefix(self) -> str:
        return self.doc["prefix"]

    @property
    def shard_format(self) -> str:
        return self.doc["shard_format"]

    def shard_for(self, path: str) -> dict[str, Any] | None:
        """The shard whose pack-order range holds ``path``."""
        lasts = [layout.pack_order(s["last"]) for s in self.shards]
        i = bisect.bisect_left(lasts, layout.pack_order(path))
        if i < len(self.shards) and self.shards[i]["files"] and \
                layout.pack_order(self.shards[i]["first"]) <= layout.pack_order(path):
            return self.shards[i]
        return None


def dumps(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, indent=1, ensure_ascii=False).encode()


def build(*, shard_format: str, prefix: str, source: str, shard_size: int, max_count: int | None,
          records: list[dict[str, Any]]) -> dict[str, Any]:
    shards = [{k: r[k] for k in ("name", "size", "sha256", "crc32c", "files", "bytes", "first", "last")}
              | {"list": {k: v for k, v in r["list"].items() if k not in ("committed", "upload")}}   # the manifest's
              for r in records]
    return {"format": layout.INDEX_FORMAT, "version": layout.INDEX_VERSION, "shard_format": shard_format,
            "prefix": prefix, "source": source, "shard_size": shard_size, "max_count": max_count,
            "totals": {"shards": len(shards), "files": sum(s["files"] for s in shards),
                       "bytes": sum(s["bytes"] for s in shards),
                       "shard_bytes": sum(s["size"] for s in shards)},
            "shards": shards}


def pointer(name: str, body: bytes, doc: dict[str, Any]) -> dict[str, Any]:
    """The manifest's ``shard_sets`` entry for an index written as ``body``."""
    return {"index": name, "size": len(body), "sha256": hashlib.sha256(body).hexdigest(),
            "format": doc["shard_format"], "version": doc["version"], "shards": doc["totals"]["shards"],
            "files": doc["totals"]["files"]}


def parse(body: bytes, where: Location) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise ManifestError(f"{where} is not valid JSON") from exc
    if not isinstance(doc, dict) or doc.get("format") != layout.INDEX_FORMAT:
        raise ManifestError(f"{where} is not a bridge shard-set index")
    if not isinstance(doc.get("version"), int) or doc["version"] > layout.INDEX_VERSION:
        raise ManifestError(f"{where} has version {doc.get('version')}; this bridge reads up to "
                            f"{layout.INDEX_VERSION}: upgrade mcbridge")
    return doc


def read(store: Store, root: Location, name: str) -> ShardSet:
    loc = root.join(name)
    return ShardSet(root, name, parse(store.read(loc), loc))


def iter_list(store: Store, shard_set: ShardSet, shard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A shard's file list, checked against the SHA-256 the index gives it, parsed an entry at a
    time: its bytes are held (about 100 a member), not a million parsed entries."""
    loc = shard_set.root.join(shard["list"]["name"])
    body = store.read(loc)
    if hashlib.sha256(body).hexdigest() != shard["list"]["sha256"]:
        raise IntegrityError(f"{loc}: file list does not match the SHA-256 in {shard_set.name}")
    start = 0
    while start < len(body):
        end = body.find(b"\n", start)
        end = len(body) if end < 0 else end
        if body[start:end].strip():
            yield json.loads(body[start:end])
        start = end + 1


def read_list(store: Store, shard_set: ShardSet, shard: dict[str, Any]) -> list[dict[str, Any]]:
    """A shard's file list, checked against the SHA-256 the index gives it."""
    return list(iter_list(store, shard_set, shard))


def find(store: Store, root: Location, prefix: str | None) -> ShardSet | None:
    """The shard set under ``root``: ``<prefix>.index.json``, else the only index there."""
    root = root.as_prefix()
    names = [layout.index_name(prefix or "shard")]
    try:
        return read(store, root, names[0])
    except ObjectNotFound:
        if prefix:
            raise ObjectNotFound(f"{root}: no shard set {prefix!r} (no {names[0]})") from None
    found = sorted(rel for rel, _info in store.walk(root) if "/" not in rel and rel.endswith(".index.json"))
    if len(found) > 1:
        raise UsageError(f"{root} holds several shard sets ({', '.join(found)}): pick one with --prefix")
    return read(store, root, found[0]) if found else None


def noting_indexes(entries: Iterator[Any], found: list[Any]) -> Iterator[Any]:
    """A record's entries, unchanged; those named like a shard-set index (``*.index.json``) are
    also put in ``found``, for ``recorded_sets``."""
    for entry in entries:
        if entry.path.endswith(layout.index_name("")) and "/" not in entry.path:   # as ``find``: at the root
            found.append(entry)
        yield entry


def recorded_sets(store: Store, root: Location, named: dict[str, Any], indexes: list[Any]) -> dict[str, Any]:
    """The shard sets of a record: those its commit names under ``shard_sets`` (a pack's), and
    those whose index it holds as an ordinary file (a shard set copied or migrated as files, to
    any store). For the latter the index is read once; a file that is not a bridge shard-set index
    is none. Its pointer's SHA-256 is the one the record gives the file; where the record has none,
    the body read must match the record's CRC32C, and is then taken as the index's."""
    sets = dict(named)
    known = {pointer_["index"] for pointer_ in named.values()}
    for entry in indexes:
        if entry.path in known:
            continue
        loc = root.as_prefix().join(entry.path)
        try:
            body = store.read(loc)
            doc = parse(body, loc)
        except (ObjectNotFound, ManifestError):
            continue   # gone (verify reports it missing) or not a shard-set index
        found = pointer(entry.path, body, doc)
        if entry.sha256:
            found["sha256"] = entry.sha256
        elif not entry.crc32c or crc_hex(crc32c(body)) != entry.crc32c:
            found["sha256"] = ""   # unproven: check reports that the index does not match its record
        sets[entry.path[:-len(layout.index_name(""))]] = found
    return sets


def check(store: Store, root: Location, entry: dict[str, Any], *, deep: bool = False) -> Iterator[str]:
    """Problems with the shard set a manifest's ``shard_sets`` entry points at; none when intact.

    Always: the index matches its SHA-256, each shard and list exists with the indexed size,
    each list matches its SHA-256, lists and shards agree on file counts and byte ranges.
    ``deep``: every shard is read and must match its SHA-256, and every file its own.
    """
    root = root.as_prefix()
    loc = root.join(entry["index"])
    try:
        body = store.read(loc)
    except ObjectNotFound:
        yield f"{loc}: index missing"
        return
    if hashlib.sha256(body).hexdigest() != entry["sha256"]:
        yield f"{loc}: index does not match the SHA-256 in the manifest"
        return
    shard_set = ShardSet(root, entry["index"], parse(body, loc))
    for shard in shard_set.shards:
        shard_loc = root.join(shard["name"])
        try:
            size = store.info(shard_loc).size
        except ObjectNotFound:
            yield f"{shard_loc}: shard missing"
            continue
        if size != shard["size"]:
            yield f"{shard_loc}: {size} bytes, index says {shard['size']}"
            continue
        try:
            files = read_list(store, shard_set, shard)
        except (ObjectNotFound, IntegrityError) as exc:
            yield str(exc)
            continue
        if len(files) != shard["files"]:
            yield f"{shard_loc}: list has {len(files)} files, index says {shard['files']}"
        if any(f["offset"] < 0 or f["offset"] + f["length"] > size for f in files):
            yield f"{shard_loc}: list has byte ranges outside the shard"
            continue
        if deep:
            yield from _check_bytes(store, shard_loc, shard, files)


def _check_bytes(store: Store, loc: Location, shard: dict[str, Any], files: list[dict[str, Any]]) -> Iterator[str]:
    """Read the shard front to back once, in windows: each file against its SHA-256, then the
    whole shard against its own."""
    view = RangeFile(store, loc, shard["size"])
    for f in sorted(files, key=lambda f: f["offset"]):
        view.seek(f["offset"])
        hasher = hashlib.sha256()
        left = f["length"]
        while left:
            chunk = view.read(min(left, view.window))
            hasher.update(chunk)
            left -= len(chunk)
        if hasher.hexdigest() != f["sha256"]:
            yield f"{loc}: {f['path']} does not match its SHA-256"
    view.hash_rest()
    if view.sha256 != shard["sha256"]:
        yield f"{loc}: shard does not match its SHA-256"
