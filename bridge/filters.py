"""Which objects a command works on: ``--include``/``--exclude`` globs, ``--files-from`` and size
and age bounds, with rclone's semantics, applied to every listing in one place (``walk``).

Globs (rclone's, https://rclone.org/filtering/):

    *        any characters but '/'             *.jpg     x.jpg, a/b/x.jpg (matched at any depth)
    **       any characters, '/' included       a/**      everything under a directory a
    ?        one character but '/'
    [a-z]    a character class
    {a,b}    either alternative
    \\*       a literal '*'
    /glob    anchored at the root of the listing: /a/*.jpg matches a/x.jpg, not b/a/x.jpg
    glob/    a directory; ``--exclude dir/`` leaves out everything under every directory dir

Every ``--include`` rule comes first, then every ``--exclude`` rule, then, when any include was
given, an exclude of everything else; the first rule that matches a path decides. As in rclone,
a directory is only looked into when the rules can select something inside it (``--include
'b/*'`` does not reach a/b/x: its directory a is never entered; ``--include '**/b/*'`` does).
``--files-from`` names exact paths, one a line (blank lines and lines starting with # or ; are
skipped, a leading / is dropped); like rclone, it is refused beside ``--include``/``--exclude``,
but size and age bounds still apply. ``--min-size``/``--max-size`` keep sizes within the bounds,
bounds included; ``--min-age``/``--max-age`` compare with the object's modified time.

A ``Filters`` is plain data (``to_dict``/``from_dict``) so that a job queued for workers carries
it and the worker selects the same objects. Where every include is anchored (or the paths come
from ``--files-from``), their common folder is listed instead of the whole root (``prefix``).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from bridge.errors import InvalidOption

_AGE_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "M": 30 * 86400,
              "y": 365 * 86400}
_AGE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w|M|y)?\s*$")
_META = set("*?[{\\")


def parse_age(text: str, flag: str = "age") -> float:
    """'30s', '90m', '12h', '7d', '2w' (a bare number is seconds), or a date '2026-01-31' /
    '2026-01-31T12:00:00' (UTC unless it says otherwise): an age in seconds."""
    m = _AGE_RE.match(str(text))
    if m:
        return float(m.group(1)) * _AGE_UNITS[m.group(2) or "s"]
    try:
        when = datetime.fromisoformat(str(text).strip())
    except ValueError:
        raise InvalidOption(f"{flag} {text!r}: give a duration such as 90m, 12h or 7d, or a date such as "
                            f"2026-01-31") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, time.time() - when.timestamp())


def glob_regex(glob: str) -> re.Pattern:
    """An rclone path glob as a regular expression over a relative path (see the module)."""
    out = []
    if glob.startswith("/"):
        glob, start = glob[1:], "^"
    else:
        start = "(^|/)"
    stars = 0
    in_braces = False
    brackets = 0
    i = 0

    def flush() -> None:
        nonlocal stars
        if stars == 1:
            out.append("[^/]*")
        elif stars == 2:
            out.append(".*")
        elif stars > 2:
            raise InvalidOption(f"glob {glob!r}: too many stars in a row (* or ** only)")
        stars = 0

    while i < len(glob):
        c = glob[i]
        if c != "*":
            flush()
        if brackets:
            out.append(re.escape(c) if c in "\\" else c)
            brackets += {"[": 1, "]": -1}.get(c, 0)
        elif c == "\\":
            if i + 1 == len(glob):
                raise InvalidOption(f"glob {glob!r} ends with a lone backslash")
            i += 1
            out.append(re.escape(glob[i]))
        elif c == "*":
            stars += 1
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            out.append("[")
            brackets = 1
        elif c == "]":
            raise InvalidOption(f"glob {glob!r}: ']' without '['")
        elif c == "{":
            if in_braces:
                raise InvalidOption(f"glob {glob!r}: braces cannot nest")
            in_braces = True
            out.append("(?:")
        elif c == "}":
            if not in_braces:
                raise InvalidOption(f"glob {glob!r}: '}}' without '{{'")
            in_braces = False
            out.append(")")
        elif c == "," and in_braces:
            out.append("|")
        else:
            out.append(re.escape(c))
        i += 1
    flush()
    if brackets:
        raise InvalidOption(f"glob {glob!r}: '[' without ']'")
    if in_braces:
        raise InvalidOption(f"glob {glob!r}: '{{' without '}}'")
    try:
        return re.compile(start + "".join(out) + "$")
    except re.error as exc:
        raise InvalidOption(f"glob {glob!r} cannot be used: {exc}") from None


def _expand_braces(glob: str) -> list[str]:
    start = glob.find("{")
    end = glob.find("}", start)
    if start < 0 or end < 0:
        return [glob]
    head, options, tail = glob[:start], glob[start + 1:end].split(","), glob[end + 1:]
    return [x for option in options for x in _expand_braces(head + option + tail)]


def _dir_globs(glob: str) -> list[str]:
    """The directory globs a directory must match for ``glob`` to select something under it
    (rclone's reading: cut the glob at each '/' or '**' from the right)."""
    out: list[str] = []
    for pattern in _expand_braces(glob):
        rest = re.sub(r"/{2,}", "/", pattern)
        while True:
            slash, stars = rest.rfind("/"), rest.rfind("**")
            cut, what = (stars, "**") if stars > slash else (slash, "")
            if cut < 0:
                if not out:
                    out.append("/**")
                break
            rest = rest[:cut]
            if rest + what + "/" not in out:
                out.append(rest + what + "/")
    return out


@dataclass
class _Rules:
    files: list[tuple[bool, re.Pattern]] = field(default_factory=list)
    dirs: list[tuple[bool, re.Pattern]] = field(default_factory=list)

    def add(self, include: bool, glob: str) -> None:
        if not glob:
            raise InvalidOption(f"--{'include' if include else 'exclude'} '': give a glob such as '*.jpg'")
        is_dir = glob.endswith("/")
        is_file = not is_dir
        if is_dir and not include:
            glob += "**"
        if "**" in glob:
            is_dir = is_file = True
        pattern = glob_regex(glob)
        if is_file:
            self.files.append((include, pattern))
            if include or glob == "*":
                self.dirs.extend((include, glob_regex(d)) for d in _dir_globs(glob) if d != "/")
        if is_dir:
            self.dirs.append((include, pattern))

    @staticmethod
    def _first(rules: list[tuple[bool, re.Pattern]], path: str) -> bool:
        for include, pattern in rules:
            if pattern.search(path):
                return include
        return True

    def selects(self, rel: str) -> bool:
        return self.enters(rel.rsplit("/", 1)[0] + "/" if "/" in rel else "") and self._first(self.files, rel)

    def enters(self, folder: str) -> bool:
        """Whether the folder ``folder`` ('' or ending with '/') and every folder above it are
        looked into."""
        parts = folder.rstrip("/").split("/") if folder else []
        return all(self._first(self.dirs, "/".join(parts[:depth]) + "/") for depth in range(1, len(parts) + 1))


def read_files_from(source: str, read: Callable[[], str]) -> list[str]:
    """The paths of a ``--files-from`` text (``read()`` gives it): one a line, stripped, blank
    lines and lines starting with # or ; skipped, a leading / dropped."""
    paths = []
    for line in read().splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        paths.append(line.lstrip("/"))
    if not paths:
        raise InvalidOption(f"--files-from {source} names no file")
    return paths


@dataclass(frozen=True)
class Filters:
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    files_from: tuple[str, ...] | None = None
    min_size: int | None = None
    max_size: int | None = None
    min_age: float | None = None    # seconds
    max_age: float | None = None

    def __post_init__(self) -> None:
        if self.files_from is not None and (self.include or self.exclude):
            raise InvalidOption("--files-from names exact paths and cannot be combined with --include or "
                                "--exclude (as in rclone): list only the paths you want")
        if None not in (self.min_size, self.max_size) and self.min_size > self.max_size:
            raise InvalidOption(f"--min-size {self.min_size} is above --max-size {self.max_size}: nothing could match")
        if None not in (self.min_age, self.max_age) and self.min_age > self.max_age:
            raise InvalidOption("--min-age is older than --max-age: nothing could match")
        for flag, value in (("--min-size", self.min_size), ("--max-size", self.max_size),
                            ("--min-age", self.min_age), ("--max-age", self.max_age)):
            if value is not None and value < 0:
                raise InvalidOption(f"{flag} cannot be negative")
        rules = _Rules()
        for glob in self.include:
            rules.add(True, glob)
        for glob in self.exclude:
            rules.add(False, glob)
        if self.include:
            rules.add(False, "/**")
        object.__setattr__(self, "_rules", rules)
        object.__setattr__(self, "_wanted", frozenset(self.files_from) if self.files_from is not None else None)
        object.__setattr__(self, "_now", time.time())

    # -- what it selects ----------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return bool(self.include or self.exclude or self.files_from is not None
                    or any(v is not None for v in (self.min_size, self.max_size, self.min_age, self.max_age)))

    def selects_name(self, rel: str) -> bool:
        """Whether the path rules (globs, --files-from) select ``rel``; sizes and ages aside."""
        if self._wanted is not None:
            return rel in self._wanted
        return self._rules.selects(rel)

    def selects_folder(self, folder: str) -> bool:
        """Whether the folder ``folder`` (ending with '/') is listed: as rclone shows a folder in
        a listing of one level, when the path rules could select something in it (sizes and
        ages are the files' own)."""
        if self._wanted is not None:
            return any(path.startswith(folder) for path in self._wanted)
        return self._rules.enters(folder)

    def selects(self, rel: str, info: Any = None) -> bool:
        """Whether ``rel`` (with its ObjectInfo ``info``, for sizes and times) is selected."""
        if not self.selects_name(rel):
            return False
        if info is None:
            return True
        if self.min_size is not None and info.size < self.min_size:
            return False
        if self.max_size is not None and info.size > self.max_size:
            return False
        if self.min_age is not None or self.max_age is not None:
            modified = getattr(info, "modified", None)
            if modified is None:
                return False   # an age cannot be proven: left out rather than guessed
            age = self._now - modified
            if self.min_age is not None and age < self.min_age:
                return False
            if self.max_age is not None and age > self.max_age:
                return False
        return True

    def prefix(self) -> str:
        """A folder (relative, '' or ending with '/') that holds everything these rules can
        select: the listing can start there instead of at the root."""
        if self.files_from is not None:
            heads = [p.rsplit("/", 1)[0] + "/" if "/" in p else "" for p in self.files_from]
        elif self.include and all(g.startswith("/") for g in self.include):
            heads = []
            for glob in self.include:
                literal = ""
                for c in glob[1:]:
                    if c in _META:
                        break
                    literal += c
                heads.append(literal.rsplit("/", 1)[0] + "/" if "/" in literal else "")
        else:
            return ""
        common = heads[0] if heads else ""
        for head in heads[1:]:
            while not head.startswith(common):
                common = common[:-1].rsplit("/", 1)[0] + "/" if "/" in common[:-1] else ""
        return common

    # -- as data ------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-able; only what was given (an empty dict: no filter)."""
        data: dict[str, Any] = {}
        if self.include:
            data["include"] = list(self.include)
        if self.exclude:
            data["exclude"] = list(self.exclude)
        if self.files_from is not None:
            data["files_from"] = list(self.files_from)
        for name in ("min_size", "max_size", "min_age", "max_age"):
            if getattr(self, name) is not None:
                data[name] = getattr(self, name)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Filters:
        data = dict(data or {})
        unknown = set(data) - {"include", "exclude", "files_from", "min_size", "max_size", "min_age", "max_age"}
        if unknown:
            raise InvalidOption(f"unknown filter {sorted(unknown)[0]!r}")
        return cls(tuple(data.get("include") or ()), tuple(data.get("exclude") or ()),
                   tuple(data["files_from"]) if data.get("files_from") is not None else None,
                   data.get("min_size"), data.get("max_size"), data.get("min_age"), data.get("max_age"))

    def key(self) -> str:
        """A short digest of the rules, for a job key: a filtered job is not another's rerun."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> str:
        """One line for a plan or a log: 'include *.jpg; exclude tmp/**; min-size 1024'."""
        parts = [f"include {' '.join(self.include)}"] if self.include else []
        if self.exclude:
            parts.append(f"exclude {' '.join(self.exclude)}")
        if self.files_from is not None:
            parts.append(f"files-from {len(self.files_from)} paths")
        for name in ("min_size", "max_size", "min_age", "max_age"):
            if getattr(self, name) is not None:
                parts.append(f"{name.replace('_', '-')} {getattr(self, name):g}")
        return "; ".join(parts)


NONE = Filters()


def walk(store: Any, root: Any, filters: Filters | None = None,
         listed: Callable[[int], None] | None = None) -> Iterator[tuple[str, Any]]:
    """(path relative to ``root``, ObjectInfo) of the data objects under the prefix ``root`` that
    ``filters`` select, listing from their common folder; ``listed(n)`` hears of every few
    hundred objects listed (progress for long listings)."""
    filters = filters or NONE
    start = filters.prefix() if filters.active else ""
    if any(part in ("", ".", "..") for part in start.split("/")[:-1]):
        start = ""   # a folder of odd segments: not pushed down (the rules still apply to each path)
    base = root.as_prefix()
    seen = 0
    for rel, info in store.walk(type(base)(base.scheme, base.bucket, base.key + start)):
        seen += 1
        if listed is not None and seen % 500 == 0:
            listed(500)
        rel = start + rel
        if not filters.active or filters.selects(rel, info):
            yield rel, info
    if listed is not None and seen % 500:
        listed(seen % 500)


def from_flags(include: Iterable[str] | None = None, exclude: Iterable[str] | None = None,
               files_from: list[str] | None = None, min_size: int | None = None, max_size: int | None = None,
               min_age: float | None = None, max_age: float | None = None) -> Filters:
    return Filters(tuple(include or ()), tuple(exclude or ()),
                   tuple(files_from) if files_from is not None else None, min_size, max_size, min_age, max_age)
