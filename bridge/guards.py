"""Guards on mass deletion: the one place that decides whether a deletion is too large to run
without being asked for by name. The CLI and the Python API call the same functions
(``bridge.ops.sync``, ``bridge.objects.remove``/``move``), which call these before anything is
deleted or copied, so both refuse alike.

- A sync with ``--delete``: with ``max_delete`` (rclone's ``--max-delete N``), refused when more
  than N objects would go; without it, refused when more than ``DELETE_SHARE`` of the
  destination's objects would go, unless ``force``. A wrong source (an empty folder, a typo'd
  prefix) looks exactly like this: every object at the destination "no longer in the source".
- ``rm -r`` and ``mv`` of a whole bucket or container root (``s3://B/``, ``gs://B/``,
  ``az://CONTAINER/``): other teams' prefixes and records go with it; refused unless ``force``.
- ``rm``/``mv`` of the filesystem root, a folder directly under it (``/etc``, ``/usr``, ``/home``
  ...), a few system folders below those, or the user's home (or a folder above it): refused
  unless ``force``. Links are followed first, so a link to ``/etc`` is ``/etc``.
"""

from __future__ import annotations

import os

from bridge.errors import InvalidOption
from bridge.urls import Location, canonical

# A sync that would delete more than this share of the destination's objects is refused
# without --force (or a --max-delete that allows the count).
DELETE_SHARE = 0.5

# Below the top-level folders (all of which are guarded): folders whose loss breaks the system.
SYSTEM_FOLDERS = ("/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib64", "/usr/local", "/usr/share", "/usr/include",
                  "/var/lib", "/var/log", "/var/cache", "/var/spool", "/etc/ssl", "/etc/systemd")


class DeletionRefused(InvalidOption):
    """A deletion larger than its guard allows, refused before anything is deleted."""


def sync_deletions(deletions: int, present: int, destination: str, *, max_delete: int | None = None,
                   force: bool = False) -> str | None:
    """Why a sync that would delete ``deletions`` of the ``present`` objects it listed at
    ``destination`` must not run, in one line; None when it may. ``max_delete`` is the count
    the caller allows (it replaces the share rule); ``force`` lifts the share rule."""
    if max_delete is not None:
        if deletions > max_delete:
            return (f"sync would delete {deletions:,} objects at {destination}, more than --max-delete "
                    f"{max_delete:,}: nothing copied or deleted (raise --max-delete to allow it)")
        return None
    if force or deletions == 0 or deletions <= DELETE_SHARE * present:
        return None
    return (f"sync would delete {deletions:,} of the {present:,} objects at {destination} "
            f"(over {DELETE_SHARE:.0%}): nothing copied or deleted; check the source, or give --force "
            f"(or --max-delete {deletions}) to delete them")


def refuse_sync_deletions(deletions: int, present: int, destination: str, *, max_delete: int | None = None,
                          force: bool = False) -> None:
    why = sync_deletions(deletions, present, destination, max_delete=max_delete, force=force)
    if why is not None:
        raise DeletionRefused(why)


def protected(loc: Location) -> str | None:
    """What ``loc`` is, when removing everything under it needs --force: a bucket or container
    root, the filesystem root, a system folder or a home; None otherwise."""
    if not loc.is_local:
        if loc.key.strip("/") == "":
            return f"the whole {'container' if loc.scheme == 'az' else 'bucket'} {loc.scheme}://{loc.bucket}/"
        return None
    real = canonical(loc).local_path.rstrip("/") or "/"
    if not os.path.isdir(real):
        return None   # one file: removing it removes nothing else
    if real == "/":
        return "the filesystem root /"
    if real.count("/") == 1:
        return f"the system folder {real}"
    if real in SYSTEM_FOLDERS:
        return f"the system folder {real}"
    home = os.path.realpath(os.path.expanduser("~")).rstrip("/")
    if home and home != "/" and (home == real or home.startswith(real + "/")):
        return f"the home folder {real}" if home == real else f"{real}, a folder holding the home folder {home}"
    return None


def refuse_protected(verb: str, loc: Location, *, force: bool = False) -> None:
    """Refuse ``verb`` (rm -r, mv) of a protected location unless ``force``."""
    what = None if force else protected(loc)
    if what is not None:
        raise DeletionRefused(f"{verb} of {what} would delete everything in it: nothing done; "
                              f"give --force if that is what you mean")
