"""A prefix's walk with its sub-prefixes listed at once: ``Store.walk``'s objects, in its order,
for a store whose listing is one page after another (S3's continuation tokens). One listing of
the top level with a delimiter gives the objects there and the sub-prefixes below; each
sub-prefix is then listed whole by a thread of its own (``meter.Ahead``), up to ``WIDTH`` of them
at once and a bounded number of objects ahead of the consumer, and everything is handed on in
path order: each sub-prefix's objects where its name sorts among the top level's.

Why: a listing's pages cost a round trip each, one after the other. A no-op sync of a prefix of
a million objects in a thousand folders waits for a thousand pages in a row where rclone, which
lists folders eight at a time, waits for an eighth of them. Where the top level holds only one
sub-prefix (``data/`` above everything), the walk goes down to the first level that holds more.

The order is Store.walk's (code-point order of the paths, as S3 sorts keys by their UTF-8
bytes): a sub-prefix ``a/`` sorts among the top level's names by its own name, since every key
below it begins with ``a/`` and no key outside it does; each stream is checked as it is handed
on, and one that is not in order fails the walk (a merge that trusted it could delete)."""

from __future__ import annotations

import collections
import heapq
from collections.abc import Callable, Iterable, Iterator

from bridge import meter
from bridge.errors import BridgeError
from bridge.stores.base import ObjectInfo, is_reserved
from bridge.urls import Location

WIDTH = 4          # sub-prefixes listed at once
AHEAD_ITEMS = 2000  # top-level items (objects and sub-prefixes) read ahead of the consumer, at most


def in_key_order(objects: Iterable[ObjectInfo], prefixes: Iterable[Location]) -> Iterator[ObjectInfo | Location]:
    """One page of a delimited listing (its objects, its sub-prefixes: each sorted) as one stream in
    key order."""
    return heapq.merge(objects, prefixes,
                       key=lambda item: item.key if isinstance(item, Location) else item.location.key)


def fanned_walk(root: Location, level: Callable[[Location], Iterator[ObjectInfo | Location]],
                listing: Callable[[Location], Iterator[ObjectInfo]], width: int = WIDTH
                ) -> Iterator[tuple[str, ObjectInfo]]:
    """(path relative to ``root``, info) of every data object under the prefix ``root`` (bridge's
    reserved folders skipped), in path order. ``level(prefix)``: one level under ``prefix``, in key
    order (``in_key_order`` of each page); ``listing(prefix)``: everything under it, in key order."""
    top = root
    items = level(top)
    while True:   # down through a lone sub-prefix
        first: list[ObjectInfo | Location] = []
        for item in items:
            if isinstance(item, Location) and is_reserved(item.key[len(root.key):]):
                continue
            first.append(item)
            if len(first) == 2:
                break
        if len(first) == 1 and isinstance(first[0], Location):
            _close(items)
            top = first[0]
            items = level(top)
            continue
        break
    pending: collections.deque[ObjectInfo | meter.Ahead] = collections.deque()
    streams = 0
    last = ""
    cut = len(root.key)

    def handed(item: ObjectInfo | meter.Ahead) -> Iterator[tuple[str, ObjectInfo]]:
        nonlocal last
        try:
            for info in ([item] if isinstance(item, ObjectInfo) else item):
                rel = info.location.key[cut:]
                if not rel or is_reserved(rel):
                    continue
                if rel <= last:
                    raise BridgeError(f"{root}: the listing gave {rel!r} after {last!r}: not in order; "
                                      f"nothing was done with it")
                last = rel
                yield rel, info
        finally:
            if isinstance(item, meter.Ahead):
                item.close()

    try:
        for item in _chained(first, items):
            if isinstance(item, Location):
                if is_reserved(item.key[cut:]):
                    continue
                pending.append(meter.Ahead(listing(item)))
                streams += 1
            else:
                pending.append(item)
            while streams >= width or len(pending) > AHEAD_ITEMS:
                head = pending.popleft()
                streams -= not isinstance(head, ObjectInfo)
                yield from handed(head)
        while pending:
            yield from handed(pending.popleft())
    finally:
        _close(items)
        for item in pending:
            if isinstance(item, meter.Ahead):
                item.close()


def _close(items: Iterator) -> None:
    close = getattr(items, "close", None)
    if close is not None:
        close()


def _chained(first: list, rest: Iterator) -> Iterator:
    yield from first
    yield from rest
