"""Where a copy's objects come from and go: the source and destination roots of two URLs, and
the source's listing, read as it is consumed and checked as it passes (a destination inside its
source, a copy onto itself, names the destination cannot hold, archived sources) before any byte
moves. The first stage of a transfer: the plan is made from it (bridge.pipeline.plan), sync
merges it with the destination's (bridge.pipeline.syncplan), and a remote route names its
objects from it."""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from bridge import filters as filtering
from bridge import names
from bridge.config import Settings
from bridge.errors import Archived, InvalidOption, ObjectNotFound
from bridge.filters import Filters
from bridge.progress import Progress
from bridge.stores import get_store
from bridge.stores.base import ObjectInfo
from bridge.urls import Location, canonical, parse


def parent(loc: Location) -> Location:
    """The folder ``loc`` is in, as a prefix."""
    head = loc.key.rstrip("/").rpartition("/")[0]
    return Location(loc.scheme, loc.bucket, head + "/" if head else "")


def listing_to(progress: Progress | None):
    """The ``listed`` callback of a listing that ``progress`` follows (None: nobody does)."""
    if progress is None:
        return None
    progress.begin("listing")
    return progress.saw


def with_filters(summary: dict[str, Any], filters: Filters | None) -> dict[str, Any]:
    """A command's summary naming the filters its listing applied, when any did."""
    if filters is not None and filters.active:
        summary["filters"] = filters.to_dict()
    return summary


def wildcard_source(source: str, filters: Filters | None, settings: Settings) -> tuple[str, Filters | None]:
    """s5cmd's wildcard sources, on every store: ``s3://b/p/*.tar`` is the folder before the first
    wildcard (``s3://b/p/``) and a filter that selects, under it, what the rest matches (``/*.tar``:
    ``*`` stays within a folder, ``**`` crosses folders, ``?``, ``[a-z]`` and ``{a,b}`` as in
    --include), by the bounded matcher of bridge/filters.py, besides any filters given; a trailing
    ``/`` takes everything under the folders matched. A file, object or folder that exists under
    the very name given is that one (names may hold ``*`` or ``[``). Else ``(source, filters)``
    unchanged."""
    loc = parse(source)
    split = filtering.split_wildcard(loc.key)
    if split is None:
        return source, filters
    if loc.is_local:
        if os.path.lexists(loc.local_path):
            return source, filters
    else:
        store = get_store(loc, settings)
        try:
            store.info(loc)
            return source, filters
        except ObjectNotFound:
            pass
        if next(iter(store.walk(loc.as_prefix())), None) is not None:
            return source, filters   # a folder whose name holds the character: one page of one listing
    folder, glob = split
    if glob.endswith("/"):
        glob += "**"
    root = Location(loc.scheme, loc.bucket, folder)
    return str(root) if not loc.is_local or folder else "/", dataclasses.replace(filters or Filters(), within=glob)


def resolve(source: str, destination: str, settings: Settings, filters: Filters | None = None,
            listed: Callable[[int], None] | None = None,
            ) -> tuple[Location, Location, Iterator[tuple[str, ObjectInfo]], str | None]:
    """Where the objects come from and go: (source root, destination root, (rel, info) in
    sorted rel order as the source lists them, single). The listing is read as it is consumed;
    its first page is read here, to say at once when there is nothing there. ``filters`` select
    among the objects under a prefix (bridge/filters.py); ``listed(n)`` hears of the listing's
    progress."""
    src, dst = parse(source), parse(destination)
    src_store, dst_store = get_store(src, settings), get_store(dst, settings)
    src_store.check_bucket(src)
    dst_store.check_bucket(dst)
    if not src.is_prefix:
        try:
            info = src_store.info(src)
        except ObjectNotFound:
            info = None
        if info is not None:
            if filters is not None and filters.active:
                raise InvalidOption(f"{source} is one object: filters (--include, --min-size ...) select among "
                                    f"the objects under a prefix; end SRC with / to copy a folder")
            root = dst if dst.is_prefix else parent(dst)
            rel = src.name if dst.is_prefix else dst.key[len(root.key):]
            return parent(src), root, iter([(rel, info)]), str(src)
        src = src.as_prefix()
    listing = filtering.walk(src_store, src, filters, listed)
    first = next(listing, None)
    if first is None:
        if filters is not None and filters.within is not None:
            raise ObjectNotFound(f"no object under {src} matches {filters.within[1:]!r}: nothing to copy")
        if filters is not None and filters.active and next(iter(src_store.walk(src)), None) is not None:
            return src, dst.as_prefix(), iter(()), None   # there are objects; the filters select none
        if not (src.is_local and _local_dir_exists(src)):
            raise ObjectNotFound(f"{source}: no such object, prefix or directory")
        return src, dst.as_prefix(), iter(()), None
    return src, dst.as_prefix(), itertools.chain([first], listing), None


def _local_dir_exists(loc: Location) -> bool:
    return os.path.isdir(loc.local_path)


def checked_listing(src_root: Location, dst_root: Location, objects: Iterable[tuple[str, ObjectInfo]],
                single: str | None, archived_ok: bool = False) -> Iterator[tuple[str, ObjectInfo]]:
    """``objects`` checked as they pass, before any byte moves: a destination inside its source
    would copy into itself (one level deeper each run), an object copied onto itself would be
    rewritten from itself (and its folder's manifest set aside), and every name must be one the
    destination holds as written (judged one by one as the listing streams; the names it cannot
    hold are refused together once the listing ends, as are sources archived in a class that
    must be restored before it can be read, unless ``archived_ok``). Links and other spellings are resolved
    first (``canonical``): ``b/`` where ``b`` is a link to ``a`` is ``a/``."""
    if single is None and canonical(dst_root).is_within(canonical(src_root)):
        raise InvalidOption(f"the destination {dst_root} is the source {src_root} or inside it: "
                            f"each run would copy the last one's copy again")
    objects = iter(objects)
    if single is not None:
        first = next(objects)
        target = Location(dst_root.scheme, dst_root.bucket, dst_root.as_prefix().key + first[0])
        if target.same_as(parse(single)):
            raise InvalidOption(f"the destination {target} is the source object {single} itself: "
                                f"a copy onto itself would rewrite it from itself; nothing was copied")
        objects = itertools.chain([first], objects)
    return _named(objects, names.NameCheck(dst_root.scheme, dst_root.key), f"cannot copy to {dst_root}", src_root,
                  archived_ok)


def _named(objects: Iterator[tuple[str, ObjectInfo]], check: names.NameCheck, what: str, src_root: Location,
           archived_ok: bool) -> Iterator[tuple[str, ObjectInfo]]:
    archived: list[str] = []
    count, cls = 0, ""
    for item in objects:
        check.see(item[0])
        if item[1].needs_restore and not archived_ok:
            count, cls = count + 1, cls or item[1].storage_class
            if len(archived) < 5:
                archived.append(item[0])
        yield item
    check.refuse(what)
    if count:
        shown = ", ".join(repr(rel) for rel in archived) + (" ..." if count > 5 else "")
        raise Archived(f"{count} source objects are archived ({src_root.scheme}:// {cls}) and "
                       f"need a restore before they can be read: {shown}")
