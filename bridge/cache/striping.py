"""Lustre striping of cache fills: a big object spread over several OSTs reads back faster than
one whose bytes all sit on one. ``lfs setstripe -c N`` is given to the fill's own (new, empty)
directory before any byte is written: the files the engine then creates there (it names its
partial file itself) take that layout, and keep it through the rename that publishes them.

N comes from ``cache.stripe_counts`` by size class (the largest class not above the object's
size). Striping is on when the cache directory is on a Lustre mount (``/proc/mounts``), or when
``MCBRIDGE_CACHE_STRIPING=on``; never with ``off``, and never when no ``lfs`` is on PATH.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from functools import lru_cache

from bridge.config import CacheSettings, parse_size
from bridge.stores.local import filesystem_type

log = logging.getLogger(__name__)


def count_for(size: int, classes: dict[str, int]) -> int:
    chosen = 1
    for threshold, count in sorted(((parse_size(k), v) for k, v in classes.items())):
        if size >= threshold:
            chosen = count
    return chosen


@lru_cache(maxsize=16)
def _on_lustre(directory: str) -> bool:
    return filesystem_type(directory) == "lustre"


def wanted(settings: CacheSettings, directory: str) -> bool:
    if settings.striping == "off":
        return False
    return settings.striping == "on" or _on_lustre(directory)


def stripe(directory: str, size: int, settings: CacheSettings) -> int | None:
    """Set the layout new files in ``directory`` get; returns the count given to lfs, or None when
    striping is off or lfs is absent. A failing lfs is logged, not fatal: the fill still works."""
    if not wanted(settings, directory):
        return None
    lfs = shutil.which("lfs")
    if lfs is None:
        return None
    count = count_for(size, settings.stripe_counts)
    done = subprocess.run([lfs, "setstripe", "-c", str(count), directory], capture_output=True, text=True)
    if done.returncode != 0:
        log.warning("lfs setstripe -c %s %s failed: %s", count, directory, done.stderr.strip())
        return None
    return count
