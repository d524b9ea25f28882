"""The everyday object verbs beside copy and sync: list buckets, make one, total sizes (``du``),
read an object (``cat``), remove (``rm``), move (``mv``: copy, prove, then remove the source) and
print hashes (``hashsum``). Each returns JSON-able data; bridge/cli/verbs.py prints it.

Every listing goes through bridge/filters.py (``walk``), so the filters select the same objects
here as in cp, sync and verify.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bridge import guards, verdicts, hashing, routes
from bridge import filters as filtering
from bridge import manifest as manifests
from bridge.config import Settings
from bridge import listing
from bridge.listing import listing_to
from bridge.pipeline import execute as executor
from bridge.pipeline.plan import plan_copy
from bridge.errors import BridgeError, IntegrityError, InvalidOption, ObjectNotFound
from bridge.filters import Filters
from bridge.progress import Progress
from bridge.stores import get_store
from bridge.stores.base import DELETES_PER_REQUEST, MiB, identity_changed
from bridge.urls import CLOUD_SCHEMES, Location, parse

READ_PIECE = 8 * MiB   # cat and hashsum read an object this much per request
HASHES = ("crc32c", "md5", "sha256")


def bucket_scheme(url: str) -> str | None:
    """'s3' for 's3://' (and gs://, az://): a URL that names a provider and no bucket."""
    for scheme in CLOUD_SCHEMES:
        if url.strip().lower() == f"{scheme}://":
            return scheme
    return None


def buckets(scheme: str, settings: Settings) -> list[dict[str, Any]]:
    return [{"path": f"{scheme}://{name}/", "bucket": name} for name in get_store(scheme, settings).buckets()]


def make_bucket(url: str, settings: Settings) -> dict[str, Any]:
    """Create the bucket (container) of ``url``, or the folder of a local path."""
    loc = parse(url)
    if not loc.is_local and loc.key:
        raise InvalidOption(f"{url}: mb makes a bucket; give {loc.scheme}://{loc.bucket}/ without a key")
    store = get_store(loc, settings)
    if not loc.is_local:
        try:
            store.check_bucket(loc)
        except BridgeError:
            pass
        else:
            raise BridgeError(f"bucket {loc.bucket!r} already exists")
    store.make_bucket(loc)
    return {"made": str(loc) if loc.is_local else f"{loc.scheme}://{loc.bucket}/"}


def _objects(url: str, settings: Settings, filters: Filters | None, *, recursive: bool,
             listed: Callable[[int], None] | None = None) -> tuple[Any, Location, list[tuple[str, Any]], bool]:
    """(store, root, [(rel, info)], single) of what ``url`` names: one object, or (``recursive``)
    the objects under a prefix that the filters select."""
    loc = parse(url)
    store = get_store(loc, settings)
    store.check_bucket(loc)
    if not loc.is_prefix:
        try:
            info = store.info(loc)
        except ObjectNotFound:
            loc = loc.as_prefix()
        else:
            if filters is not None and filters.active:
                raise InvalidOption(f"{url} is one object: filters select among the objects under a prefix")
            parent = Location(loc.scheme, loc.bucket, loc.key.rpartition("/")[0] + "/" if "/" in loc.key else "")
            return store, parent, [(loc.relative_to(parent), info)], True
    if not recursive:
        raise InvalidOption(f"{url} is a prefix: give -r (--recursive) to work on every object under it")
    rows = list(filtering.walk(store, loc, filters, listed))
    if not rows and not (filters is not None and filters.active):
        if not (loc.is_local and Path(loc.local_path).is_dir()):
            raise ObjectNotFound(f"{url}: no such object, prefix or directory")
    return store, loc, sorted(rows, key=lambda r: r[0]), False


# -- du ------------------------------------------------------------------------------------------

def du(url: str, settings: Settings, *, filters: Filters | None = None,
       progress: Progress | None = None) -> dict[str, Any]:
    """Objects and bytes under ``url``, in total and per folder directly under it ('.' for the
    objects at its top)."""
    store, root, rows, _single = _objects(url, settings, filters, recursive=True,
                                          listed=progress.saw if progress else None)
    folders: dict[str, dict[str, int]] = {}
    for rel, info in rows:
        head, sep, _ = rel.partition("/")
        row = folders.setdefault(head + "/" if sep else ".", {"objects": 0, "bytes": 0})
        row["objects"] += 1
        row["bytes"] += info.size
    return {"url": str(root), "objects": len(rows), "bytes": sum(info.size for _, info in rows),
            "folders": [{"path": k, **v} for k, v in sorted(folders.items())]}


# -- cat -----------------------------------------------------------------------------------------

def cat(url: str, settings: Settings, write: Callable[[bytes], Any], *, offset: int = 0,
        count: int | None = None) -> int:
    """Bytes [offset, offset+count) of the object ``url`` (to its end without ``count``; a
    negative offset counts from the end), handed to ``write`` piece by piece. Returns how many."""
    loc = parse(url)
    if loc.is_prefix:
        raise InvalidOption(f"{url} names a prefix: cat prints one object")
    store = get_store(loc, settings)
    store.check_bucket(loc)
    size = store.info(loc).size
    start = max(0, size + offset) if offset < 0 else offset
    if start > size:
        raise InvalidOption(f"--offset {offset} is past the end of {url} ({size} bytes)")
    end = size if count is None else min(size, start + count)
    pos = start
    while pos < end:
        n = min(READ_PIECE, end - pos)
        data = store.read(loc, pos, n)
        if len(data) != n:
            raise IntegrityError(f"{url}: asked for {n} bytes at {pos}, got {len(data)}")
        write(data)
        pos += n
    return end - start


# -- rm ------------------------------------------------------------------------------------------

def _guarded(verb: str, url: str, force: bool, dry_run: bool) -> str | None:
    """bridge.guards' refusal of ``verb`` of ``url``: raised for a run; for a dry run, said (the
    line a run would be refused with), or None."""
    try:
        guards.refuse_protected(verb, parse(url), force=force)
    except guards.DeletionRefused as exc:
        if not dry_run:
            raise
        return str(exc)
    return None


def remove(url: str, settings: Settings, *, recursive: bool = False, filters: Filters | None = None,
           dry_run: bool = False, progress: Progress | None = None, force: bool = False) -> dict[str, Any]:
    """Remove the object ``url``, or with ``recursive`` every object under the prefix (those the
    filters select). Without filters a whole prefix goes, bridge's ``_bridge/`` records with it,
    the manifest first: a removal cut short never leaves a prefix that looks complete. With
    filters only the selected data objects go; a manifest above them then names them missing.
    A bucket root, the filesystem root or a system folder is refused unless ``force``
    (bridge.guards); a dry run only lists, and says (``refused``) when a run would be refused."""
    refused = _guarded("rm -r", url, force, dry_run) if recursive else None
    store, root, rows, single = _objects(url, settings, filters, recursive=recursive,
                                         listed=progress.saw if progress else None)
    targets = [info.location for _rel, info in rows]
    whole = not single and not (filters is not None and filters.active)
    home = root
    if whole:   # _bridge/ too (walk leaves it out; kept in --manifest-dir or here): the manifest first
        home, records = manifests.record_files(store, root)
        targets = records + targets
    nbytes = sum(info.size for _rel, info in rows)
    summary = {"url": str(root) if not single else url, "objects": len(targets), "bytes": nbytes,
               "removed": [str(loc) for loc in targets]}
    if dry_run:
        return {"dry_run": True, **summary, "refused": refused}
    if progress is not None:
        progress.begin("removing")
        progress.plan_checks(len(targets), nbytes)
    failed: list[str] = []

    def delete(locs: list[Location]) -> None:
        store.delete_many(locs)
        if progress is not None:
            for loc in locs:
                progress.checked()
                progress.deleted(str(loc))

    # the commit markers first (what was committed stops looking complete), then the rest as
    # many a request as the store removes at once
    delete([t for t in targets if manifests.is_commit_marker(t)])
    rest = [t for t in targets if not manifests.is_commit_marker(t)]
    per_request = DELETES_PER_REQUEST.get(root.scheme, 1)
    groups = [rest[start:start + per_request] for start in range(0, len(rest), per_request)]
    with cf.ThreadPoolExecutor(settings.transfer.concurrency) as pool:
        for group, fut in zip(groups, [pool.submit(delete, group) for group in groups]):
            try:
                fut.result()
            except BridgeError as exc:
                failed.append((len(group), f"{group[0] if len(group) == 1 else 'a group from ' + str(group[0])}: {exc}"))
    if failed:
        raise BridgeError(f"{sum(n for n, _ in failed)} of {len(targets)} objects not removed: {failed[0][1]}")
    if whole and root.is_local:
        _remove_empty_folders(root.local_path)
        if home != root:
            _remove_empty_folders(home.local_path)
    return summary


def _remove_empty_folders(top: str) -> None:
    """What ``rm -r`` of a local folder leaves: its folders, emptied; removed bottom up."""
    for dirpath, _dirs, _files in os.walk(top, topdown=False):
        try:
            os.rmdir(dirpath)
        except OSError:
            pass   # not empty: something the listing did not select (a partial file of a running copy)


# -- mv ------------------------------------------------------------------------------------------

def move(source: str, destination: str, settings: Settings, *, filters: Filters | None = None,
         chunk_size: int | None = None, progress: Progress | None = None, dry_run: bool = False,
         max_cost: float | None = None, route: str | None = None, force: bool = False) -> dict[str, Any]:
    """Copy, prove every copied object against the destination's new manifest (size and the
    store's checksum), and only then remove the sources. A source whose copy is not proven stays.
    A bucket root, the filesystem root or a system folder as the source is refused unless
    ``force`` (bridge.guards), before anything is copied."""
    refused = _guarded("mv", source, force, dry_run)
    source, filters = listing.wildcard_source(source, filters, settings)   # s3://b/p/*.tar
    from bridge import ops
    plan = routes.choose(plan_copy(source, destination, settings, chunk_size, filters=filters,
                                   listed=listing_to(progress)), settings, route)
    ops._within_budget(plan, settings, max_cost, "move")
    if dry_run:
        return {"dry_run": True, **ops.plan_summary(plan), "remove_from_source": [f.rel for f in plan.files],
                "refused": refused}
    summary = executor.execute(plan, settings, progress)
    dst_root = parse(plan.destination).as_prefix()
    dst = get_store(dst_root, settings)
    manifest = manifests.read(dst, dst_root)
    if progress is not None:
        progress.begin("verifying")
        progress.plan_checks(len(plan.files), plan.bytes)
    unproven = []
    for f in plan.files:
        entry = manifest.files.get(f.rel) if manifest else None
        try:
            verdict = verdicts.judge(dst, dst.info(dst_root.join(f.rel)), entry, False) if entry else None
        except ObjectNotFound:
            verdict = None
        if verdict is None or verdict.problem:
            unproven.append(f"{f.rel}: {verdict.problem if verdict else 'not at the destination'}")
        if progress is not None:
            progress.checked(f.size)
    if unproven:
        raise IntegrityError(f"moved nothing from the source: {len(unproven)} copied objects not proven at "
                             f"{plan.destination} ({unproven[0]}); run mcbridge verify there")
    src_root = parse(plan.source) if plan.single is None else None
    src = get_store(parse(plan.single or plan.source), settings)
    gone = [parse(plan.single)] if plan.single else [src_root.as_prefix().join(f.rel) for f in plan.files]
    whole = plan.single is None and not (filters is not None and filters.active)
    home = None
    if whole:   # every object moved: the source's own records name nothing any more
        home, records = manifests.record_files(src, src_root)
        gone = records + gone
    per_request = DELETES_PER_REQUEST.get(parse(plan.single or plan.source).scheme, 1)
    with cf.ThreadPoolExecutor(settings.transfer.concurrency) as pool:
        list(pool.map(src.delete_many, [gone[start:start + per_request] for start in range(0, len(gone), per_request)]))
    if whole and src_root.is_local:
        _remove_empty_folders(src_root.local_path)
        if home is not None and home != src_root.as_prefix():
            _remove_empty_folders(home.local_path)
    return {**summary, "removed_from_source": len(plan.files)}


# -- hashsum -------------------------------------------------------------------------------------

def hashsum(algorithm: str, url: str, settings: Settings, *, filters: Filters | None = None,
            progress: Progress | None = None) -> list[dict[str, Any]]:
    """The ``algorithm`` hash (crc32c, md5, sha256) of every object ``url`` names: from the
    manifest of a bridge copy when it records this version of the object, else as the store
    reports it, else computed from the bytes. Each row says which (``from``)."""
    if algorithm not in HASHES:
        raise InvalidOption(f"unknown hash {algorithm!r}: use one of {', '.join(HASHES)}")
    store, root, rows, _single = _objects(url, settings, filters, recursive=True,
                                          listed=progress.saw if progress else None)
    manifest = manifests.read(store, root)
    entries = manifest.files if manifest else {}
    if progress is not None:
        progress.begin("hashing")
        progress.plan_checks(len(rows), sum(info.size for _rel, info in rows))

    def one(item) -> dict[str, Any]:
        rel, info = item
        value, source = _recorded(algorithm, entries.get(rel), info)
        if value is None:
            value, source = _computed(algorithm, store, info), "computed"
        if progress is not None:
            progress.checked(info.size)
        return {"path": rel, "hash": value, "from": source, "size": info.size}

    with cf.ThreadPoolExecutor(settings.transfer.concurrency) as pool:
        return list(pool.map(one, rows))


def _recorded(algorithm: str, entry, info) -> tuple[str | None, str]:
    if entry is not None and entry.size == info.size and not identity_changed(entry.identity, info.identity):
        value = {"crc32c": entry.crc32c, "sha256": entry.sha256}.get(algorithm) or entry.reported.get(algorithm)
        if value:
            return value, "manifest"
    if info.checksums.get(algorithm):
        return info.checksums[algorithm], "store"
    return None, ""


def _computed(algorithm: str, store, info) -> str:
    return hashing.digest(hashing.reader(store, info.location), info.size, (algorithm,), name=str(info.location),
                          piece=READ_PIECE)[algorithm]

