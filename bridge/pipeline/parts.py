"""A prefix's listing split by its top-level sub-prefixes, so that several workers list (and, for
a sync, compare) one part each instead of one worker listing the whole prefix in series.

The top level is listed once with a delimiter (S3/GCS/Azure) or one ``scandir`` (a local or
Lustre folder): its sub-prefixes are grouped into parts, in name order, and the objects directly
under the root (when there are any) are a part of their own. Each part is listed as
``Store.walk`` lists the whole prefix (paths relative to the root, in code-point order), so a
part's plan is the plan of exactly the paths it holds, made by the same code (bridge.pipeline.plan
``plan_copy``, bridge.pipeline.syncplan ``plan_sync`` with ``part``). A prefix with fewer than
two sub-prefixes, with more than ``LEVEL_LIMIT`` objects directly under it (a flat prefix:
listing them again per part would hold them in memory) or with more than ``FOLDER_LIMIT``
folders (their names would be held), is not split: one lister, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from bridge.stores.base import ObjectInfo, is_reserved
from bridge.urls import Location

LEVEL_LIMIT = 10_000    # objects directly under the root, at most, for the root to be split
FOLDER_LIMIT = 50_000   # top-level folders, at most (their names are held, and signed into the parts)
MAX_PARTS = 256         # parts of one job, at most


@dataclass(frozen=True)
class Part:
    """Top-level sub-prefixes (each ``name/``), or the objects directly under the root (``level``).
    ``record``: whether the source root holds a record (``_bridge/``) whose hashes its files may
    carry (bridge.carry); the top level's listing showed it, so no part looks for it in vain."""
    subs: tuple[str, ...] = ()
    level: bool = False
    record: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"subs": list(self.subs), "level": self.level, "record": self.record}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Part:
        subs = tuple(sorted(str(s) for s in d.get("subs", ())))
        for sub in subs:   # one folder's name each: nothing above the root, nothing deeper
            name = sub[:-1]
            if not sub.endswith("/") or not name or "/" in name or name in (".", ".."):
                raise ValueError(f"not a top-level sub-prefix: {sub!r}")
        return cls(subs, bool(d.get("level")), bool(d.get("record", True)))

    def holds(self, rel: str) -> bool:
        head, sep, _ = rel.partition("/")
        return (head + "/") in self.subs if sep else self.level

    def walk(self, store: Any, root: Location, listed: Callable[[int], None] | None = None
             ) -> Iterator[tuple[str, ObjectInfo]]:
        """(path relative to ``root``, info) of the part's data objects, in ``Store.walk``'s order."""
        root = root.as_prefix()
        if self.level:
            found = sorted((item.location.relative_to(root), item) for item in store.list_level(root)
                           if isinstance(item, ObjectInfo))
            if listed is not None and found:
                listed(len(found))
            yield from ((rel, info) for rel, info in found if rel and not is_reserved(rel))
            return
        for sub in self.subs:   # sorted, and no name/ sorts inside another's run of paths
            seen = 0
            for rel, info in store.walk(Location(root.scheme, root.bucket, root.key + sub)):
                seen += 1
                yield sub + rel, info
            if listed is not None and seen:
                listed(seen)


def top_level(store: Any, root: Location, limit: int = LEVEL_LIMIT) -> tuple[set[str], int, bool] | None:
    """(the sub-prefixes directly under ``root``, the objects directly under it, whether ``_bridge/``
    is there), or None when more than ``limit`` objects are (the listing stops there: a flat prefix
    is not split), more than ``FOLDER_LIMIT`` folders, or a sub-prefix has an empty or odd name.
    ``_bridge/`` is never a part."""
    subs: set[str] = set()
    objects, reserved = 0, False
    root = root.as_prefix()
    for item in store.list_level(root):
        if isinstance(item, Location):
            sub = item.as_prefix().key[len(root.key):]
            name = sub[:-1]
            if not name or "/" in name or name in (".", ".."):
                return None   # an empty or odd segment: not a folder a part can name
            if is_reserved(name):
                reserved = True
            else:
                subs.add(sub)
                if len(subs) > FOLDER_LIMIT:
                    return None
        else:
            rel = item.location.relative_to(root)
            if rel and not is_reserved(rel):
                objects += 1
                if objects > limit:
                    return None
    return subs, objects, reserved


def split(subs: Iterable[str], level: bool, parts: int, record: bool = True) -> list[Part]:
    """The sub-prefixes in name order, in at most ``parts`` groups of nearly equal counts (one
    group each when there are fewer), and the root's own objects as one more part when ``level``;
    ``record``: whether the source root holds a record (``Part.record``)."""
    names = sorted(subs)
    parts = max(1, min(parts, len(names), MAX_PARTS))
    out, start = [], 0
    for i in range(parts):
        end = start + len(names) // parts + (1 if i < len(names) % parts else 0)
        out.append(Part(tuple(names[start:end]), record=record))
        start = end
    if level:
        out.append(Part(level=True, record=record))
    return out
