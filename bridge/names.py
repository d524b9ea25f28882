"""Which object names a destination can hold, and the one way a relative name becomes a local path.

Object stores hold keys that a file system cannot (``x/../../escape.txt``, ``a//b``, ``/abs``),
and each store rewrites or refuses some names of the others (Azure turns ``\\`` into ``/``).
A copy that wrote such a name would land outside its destination, or exit 0 and then fail
``verify``. So every name is judged for the destination before any byte moves, and the names
that cannot be held are refused together, in one line, never skipped or silently rewritten.

``local_join`` is the only place a relative name becomes a local path (``Location.join`` calls
it for local locations), and ``check_local_path`` lets the local store refuse, as a second line,
any write to a path that is not already in normal form.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from bridge.errors import UnsafeName

PARTIAL = ".bridge-partial"     # the local store's unfinished multipart files ...
TEMPORARY = ".bridge-tmp-"      # ... and whole files being written; its listing hides both
NAME_MAX = 255                  # bytes in one local path segment (Linux and macOS)
KEY_MAX = 1024                  # bytes in an S3 or GCS key, characters in an Azure blob name
AZURE_SEGMENTS = 254            # path segments in an Azure blob name
SHOWN = 5                       # names quoted in one error line


def quote(name: str) -> str:
    """A name as it appears in a message: repr-quoted, so a newline in it stays on one line."""
    return repr(name)


def local_problem(rel: str) -> str | None:
    """Why ``rel`` cannot be a path under a local folder, or None."""
    wrapped = f"/{rel}/"  # '//' in it: an empty, leading or trailing segment
    if rel and "//" not in wrapped and "/./" not in wrapped and "/../" not in wrapped and "\x00" not in rel \
            and PARTIAL not in rel and TEMPORARY not in rel and (len(rel) <= NAME_MAX // 4 or _segments_fit(rel)):
        return None  # the common case, in a few substring searches
    if "\x00" in rel:
        return "has a NUL byte"
    if rel.startswith("/"):
        return "is an absolute path"
    if rel.endswith("/"):
        return "ends with '/' (a folder marker), which a local file cannot"
    for segment in rel.split("/"):
        if segment == "":
            return "has an empty path segment ('//')"
        if segment == "..":
            return "climbs out of the destination with '..'"
        if segment == ".":
            return "has a '.' path segment"
        if len(segment.encode("utf-8", "surrogateescape")) > NAME_MAX:
            return f"has a path segment over {NAME_MAX} bytes"
        if PARTIAL in segment or TEMPORARY in segment:
            return "looks like one of bridge's unfinished local files"
    return None


def _segments_fit(rel: str) -> bool:
    return all(len(segment.encode("utf-8", "surrogateescape")) <= NAME_MAX for segment in rel.split("/"))


def cloud_problem(key: str, scheme: str) -> str | None:
    """Why ``key`` (the whole object name) cannot be held as written by the ``scheme`` store."""
    try:
        raw = key.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8, as object names must be"
    if "\x00" in key:
        return "has a NUL byte"
    if len(raw) > KEY_MAX:
        return f"is {len(raw)} bytes long as a key; the limit is {KEY_MAX}"
    if scheme == "gs":
        if "\r" in key or "\n" in key:
            return "has a line break, which GCS object names cannot hold"
        if key in (".", ".."):
            return "is '.' or '..', which GCS object names cannot be"
    if scheme == "az":
        if "\\" in key:
            return "has a backslash, which Azure turns into '/'"
        segments = key.split("/")
        if "." in segments or ".." in segments:
            return "has a '.' or '..' path segment, which Azure resolves away"
        if key.endswith("."):
            return "ends with '.', which Azure drops"
        if len(segments) > AZURE_SEGMENTS:
            return f"has more than {AZURE_SEGMENTS} path segments, Azure's limit"
    return None


def local_join(base: str, rel: str) -> str:
    """``base`` (a local key: an absolute path without its leading '/', ending with '/' or
    empty) joined with ``rel``; UnsafeName if ``rel`` is not a plain relative path."""
    problem = local_problem(rel)
    if problem:
        raise UnsafeName(f"refusing the local path {quote(rel)} under /{base}: it {problem}")
    return base + rel


def check_local_path(path: str) -> None:
    """The local store writes only to absolute paths in normal form: a path with '..', '.',
    empty segments or a NUL was built from a hostile name somewhere, and is refused."""
    if "\x00" in path or not path.startswith("/") or os.path.normpath(path) != path or path.startswith("//"):
        raise UnsafeName(f"refusing to write the local path {quote(path)}: it is not a plain absolute path")


def problems_for(rels: Iterable[str], dst_scheme: str, dst_base: str) -> list[tuple[str, str]]:
    """(name, reason) for each relative name the destination cannot hold as written.

    ``dst_base`` is the destination root's key (the absolute path, for a local folder)."""
    check = NameCheck(dst_scheme, dst_base, keep=None)
    for rel in sorted(rels):
        check.see(rel)
    return check.found


class NameCheck:
    """``problems_for`` one name at a time, for names that arrive in sorted order (as
    ``Store.walk`` yields them), holding only the first ``keep`` problems and their count: a
    listing of millions of names is judged as it streams by, in memory that does not grow with it.

    A local destination cannot hold a name that is a file and also the folder of other names
    ("a" and "a/b"). In sorted order every name between "a" and "a/..." starts with "a", so
    the names that may still turn out to be folders form a stack of prefixes of the current one."""

    def __init__(self, dst_scheme: str, dst_base: str, keep: int | None = SHOWN):
        self.scheme, self.base, self.keep = dst_scheme, dst_base, keep
        self.found: list[tuple[str, str]] = []
        self.count = 0
        self._above: list[list] = []   # [name, reported] of files that are prefixes of the last name
        self._root = os.path.realpath("/" + dst_base) if dst_scheme == "file" else ""
        self._inside: dict[str, bool] = {"": True}

    def _add(self, rel: str, reason: str) -> None:
        self.count += 1
        if self.keep is None or len(self.found) < self.keep:
            self.found.append((rel, reason))

    def see(self, rel: str) -> None:
        if self.scheme != "file":
            problem = cloud_problem(self.base + rel, self.scheme)
            if problem:
                self._add(rel, problem)
            return
        problem = local_problem(rel)
        if problem:
            self._add(rel, problem)
            return
        above = self._above
        while above and not rel.startswith(above[-1][0]):
            above.pop()
        if above and rel.startswith(above[-1][0] + "/") and not above[-1][1]:
            self._add(above[-1][0], "is a file, and also the folder of other names")
            above[-1][1] = True
        above.append([rel, False])
        if not self._stays(rel.rpartition("/")[0]):
            self._add(rel, "would be written outside the destination through a link in it")

    def _stays(self, folder: str) -> bool:
        """Whether ``folder``, if it is in the destination already, leads nowhere outside it
        (one lstat per folder, its parents answered first)."""
        inside = self._inside
        if folder not in inside:
            parent = folder.rpartition("/")[0]
            path = os.path.join(self._root, folder)
            if not self._stays(parent):
                inside[folder] = False
            elif os.path.islink(path):
                real = os.path.realpath(path)
                inside[folder] = real == self._root or real.startswith(self._root.rstrip("/") + "/")
            else:
                inside[folder] = True
        return inside[folder]

    def refuse(self, what: str) -> None:
        refuse(self.found, what, self.count)


def refuse(found: list[tuple[str, str]], what: str, count: int | None = None) -> None:
    """Raise one UnsafeName naming the first few of ``found`` (and how many more, of ``count``
    in all when only the first few were kept)."""
    if not found:
        return
    total = len(found) if count is None else count
    shown = "; ".join(f"{quote(name)} {reason}" for name, reason in found[:SHOWN])
    more = f" (and {total - SHOWN} more)" if total > SHOWN else ""
    raise UnsafeName(f"{what}: {shown}{more}; nothing was copied")
