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

Cost and limits. A glob is read once, when the Filters is made, in time linear in its length:
braces are never spelled out (``{a,b}`` sixteen times over is one glob of 82 characters, not
65,536). A glob with no braces and at most one star run (``*.jpg``, ``train/**``,
``/a/*/x.bin``) is matched by ``re``, whose backtracking there stays within the name's length
squared times the glob's (0.13 s at worst, seen with ``**`` and 254 classes against 1,024
characters); any other is matched by an automaton (``Automaton``: a Thompson NFA run as a DFA
built lazily) whose time is at most the name's length times the glob's: ``**a**a**a**a**a**b``
reads a 200-character name once (through ``re`` it backtracked for 108 s). The folders a glob
can select something in (rclone's directory globs: the glob cut at each '/' and '**') are one
more automaton over the same glob. Refused, with one line, before anything is listed:

    a glob longer than MAX_GLOB_CHARS (1,024) characters
    more than MAX_GLOBS (256) --include and --exclude globs in one selection (--files-from
    takes any number of exact paths)

Measured on one core: the worst a 1,024-character glob was made to cost against a 1,024-character
name is about 0.1 s; 300,000 names under ``*.jpg`` or ``{train,val}/**/*.jpg`` take 0.3-0.6 s
(1.1-1.8 s before: a folder's answer is now kept for the names under it).

A ``Filters`` is plain data (``to_dict``/``from_dict``) so that a job queued for workers carries
it and the worker selects the same objects. Where every include is anchored (or the paths come
from ``--files-from``), their common folder is listed instead of the whole root (``prefix``).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
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


MAX_GLOB_CHARS = 1024   # a glob longer than this is refused (an S3 key's own limit is 1,024 bytes)
MAX_GLOBS = 256         # --include and --exclude globs of one selection, together
_SIMPLE_STARS = 1       # star runs a glob without braces may have and still be matched by `re`
_MAX_DFA_STATES = 4096  # sets of positions an automaton keeps before it starts a fresh table,
_MAX_DFA_POSITIONS = 1 << 20   # or positions in them all (some 30 MB at most)

_NOT_SLASH, _ANY = object(), object()   # what a star consumes: '*' anything but '/', '**' anything


@dataclass(frozen=True)
class _Glob:
    """A glob read once: its tokens, each ('lit', c), ('one', None) for ?, ('class', '[...]'),
    ('star', 1 or 2) or ('alt', [tokens, ...]) for braces; and whether it is anchored."""
    text: str
    tokens: tuple
    anchored: bool

    @property
    def stars(self) -> int:
        return _count(self.tokens, "star")

    @property
    def braces(self) -> int:
        return _count(self.tokens, "alt")


def _count(tokens, kind: str) -> int:
    return sum((kind == k) + (sum(_count(option, kind) for option in v) if k == "alt" else 0) for k, v in tokens)


def parse_glob(glob: str) -> _Glob:
    """Read an rclone glob (see the module) into tokens, in one pass; InvalidOption names what is
    wrong with it."""
    if len(glob) > MAX_GLOB_CHARS:
        raise InvalidOption(f"glob {glob[:40]!r}... is {len(glob)} characters long; at most {MAX_GLOB_CHARS} are "
                            f"taken")
    text, anchored = (glob[1:], True) if glob.startswith("/") else (glob, False)
    top: list = []
    options: list[list] | None = None   # the alternatives of the brace being read
    out = top
    i, stars = 0, 0

    def flush() -> None:
        nonlocal stars
        if stars > 2:
            raise InvalidOption(f"glob {glob!r}: too many stars in a row (* or ** only)")
        if stars:
            out.append(("star", stars))
        stars = 0

    while i < len(text):
        c = text[i]
        if c != "*":
            flush()
        if c == "\\":
            if i + 1 == len(text):
                raise InvalidOption(f"glob {glob!r} ends with a lone backslash")
            i += 1
            out.append(("lit", text[i]))
        elif c == "*":
            stars += 1
        elif c == "?":
            out.append(("one", None))
        elif c == "[":
            i = _read_class(glob, text, i, out)
        elif c == "]":
            raise InvalidOption(f"glob {glob!r}: ']' without '['")
        elif c == "{":
            if options is not None:
                raise InvalidOption(f"glob {glob!r}: braces cannot nest")
            options = [[]]
            out = options[0]
        elif c == "}":
            if options is None:
                raise InvalidOption(f"glob {glob!r}: '}}' without '{{'")
            top.append(("alt", tuple(tuple(option) for option in options)))
            options, out = None, top
        elif c == "," and options is not None:
            options.append([])
            out = options[-1]
        else:
            out.append(("lit", c))
        i += 1
    flush()
    if options is not None:
        raise InvalidOption(f"glob {glob!r}: '{{' without '}}'")
    return _Glob(glob, tuple(top), anchored)


def _read_class(glob: str, text: str, i: int, out: list) -> int:
    """A character class from text[i] ('['), as `re` reads it, appended to ``out``; the index of
    its ']'."""
    depth, j, body = 0, i, []
    while j < len(text):
        c = text[j]
        body.append(re.escape(c) if c == "\\" else c)
        depth += {"[": 1, "]": -1}.get(c, 0)
        if depth == 0:
            break
        j += 1
    if depth:
        raise InvalidOption(f"glob {glob!r}: '[' without ']'")
    part = "".join(body)
    try:
        test = re.compile(part)
    except re.error as exc:
        raise InvalidOption(f"glob {glob!r} cannot be used: {exc}") from None
    out.append(("class", (part, test)))
    return j


def _regex_of(tokens) -> str:
    parts = []
    for kind, value in tokens:
        if kind == "lit":
            parts.append(re.escape(value))
        elif kind == "one":
            parts.append("[^/]")
        elif kind == "class":
            parts.append(value[0])
        elif kind == "star":
            parts.append("[^/]*" if value == 1 else ".*")
        else:
            parts.append("(?:" + "|".join(_regex_of(option) for option in value) + ")")
    return "".join(parts)


def glob_regex(glob: str | _Glob) -> re.Pattern:
    """An rclone path glob as a regular expression over a relative path (see the module). Python's
    `re` backtracks: with several star runs or braces its time grows as a power of the name's
    length (``compile_glob`` chooses)."""
    parsed = glob if isinstance(glob, _Glob) else parse_glob(glob)
    try:
        return re.compile(("^" if parsed.anchored else "(^|/)") + _regex_of(parsed.tokens) + "$")
    except re.error as exc:
        raise InvalidOption(f"glob {parsed.text!r} cannot be used: {exc}") from None


def compile_glob(glob: str | _Glob):
    """A matcher (``.search(path)``: true when the glob matches the relative path) whose time is
    bounded by the lengths of the glob and the path: `re` where its backtracking is (no braces,
    at most one star run: ``*.jpg``, ``train/**``; C-fast on the common path), else an automaton."""
    parsed = glob if isinstance(glob, _Glob) else parse_glob(glob)
    if not parsed.braces and parsed.stars <= _SIMPLE_STARS:
        return glob_regex(parsed)
    return Automaton(parsed.tokens, parsed.anchored)


class _Everything:
    """The directory matcher of a glob that can match at any depth: every folder is looked into."""

    @staticmethod
    def search(path: str) -> bool:
        return True


def _passes(test, c: str) -> bool:
    if test is _ANY:
        return True
    if test is _NOT_SLASH:
        return c != "/"
    if isinstance(test, str):
        return c == test
    return test.fullmatch(c) is not None


class Automaton:
    """A glob as a Thompson NFA (one position per token, a star a position that loops on what it
    consumes, braces joined by empty moves: built in the glob's length, never expanding an
    alternative), run over a path as a DFA made lazily: each set of positions reached is a state,
    and its move on a character is computed once, from the positions in it, then looked up. A
    path of n characters costs at most n such moves of at most m positions each (m: the glob's
    tokens), however its stars and braces could have backtracked. The table of moves is dropped
    and started again past ``_MAX_DFA_STATES`` states or ``_MAX_DFA_POSITIONS`` positions in
    them, so its memory stays bounded too.

    ``at_cuts``: a path is accepted where the glob could be cut (after a '/', inside a '**': the
    folders it can select something in) rather than at its end. An unanchored glob also starts
    after every '/' (rclone's matching at any depth)."""

    def __init__(self, tokens, anchored: bool, at_cuts: bool = False):
        self.moves: list[list[tuple[Any, int]]] = []
        self.empty: list[list[int]] = []
        self.cuts: set[int] = set()   # the positions right after a '/' and the positions of '**'
        self.start = self._position()
        self.end = self._build(tokens, self.start)
        self.accepting = frozenset(self.cuts) if at_cuts else frozenset({self.end})
        self.restart = not anchored
        self._lock = threading.Lock()
        self._table = _Table(self)

    # -- building ----------------------------------------------------------------------------
    def _position(self) -> int:
        self.moves.append([])
        self.empty.append([])
        return len(self.moves) - 1

    def _build(self, tokens, at: int) -> int:
        for kind, value in tokens:
            if kind == "alt":
                joined = self._position()
                for option in value:
                    self.empty[self._build(option, at)].append(joined)
                at = joined
            elif kind == "star":
                loop = self._position()
                self.empty[at].append(loop)
                self.moves[loop].append((_ANY if value == 2 else _NOT_SLASH, loop))
                if value == 2:
                    self.cuts.add(loop)
                at = loop
            else:
                nxt = self._position()
                test = value if kind == "lit" else _NOT_SLASH if kind == "one" else value[1]
                self.moves[at].append((test, nxt))
                if kind == "lit" and value == "/":
                    self.cuts.add(nxt)
                at = nxt
        return at

    def closure(self, positions: Iterable[int]) -> frozenset[int]:
        seen, todo = set(positions), list(positions)
        while todo:
            for nxt in self.empty[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return frozenset(seen)

    def step(self, positions: frozenset[int], c: str) -> frozenset[int]:
        reached = [nxt for at in positions for test, nxt in self.moves[at] if _passes(test, c)]
        if c == "/" and self.restart:
            reached.append(self.start)
        return self.closure(reached)

    def uncut_end(self) -> bool:
        """Whether the glob's end is reached on a way through no '/' and no '**'."""
        seen, todo = {self.start}, [self.start]
        while todo:
            at = todo.pop()
            nexts = [n for n in self.empty[at]] + [n for test, n in self.moves[at] if test is not _ANY]
            for nxt in nexts:
                if nxt not in seen and nxt not in self.cuts:
                    seen.add(nxt)
                    todo.append(nxt)
        return self.end in seen

    # -- matching ----------------------------------------------------------------------------
    def search(self, path: str) -> bool:
        table = self._table
        state, moves = 0, table.moves
        for c in path:
            nxt = moves[state].get(c)
            if nxt is None:
                with self._lock:
                    nxt = table.move(state, c)
                    if table.full() and table is self._table:
                        self._table = _Table(self)   # later searches start afresh; this one ends on its own
            state = nxt
        return table.accepts[state]


class _Table:
    """The DFA states of an Automaton made so far: sets of positions, their moves, whether each accepts."""

    def __init__(self, automaton: Automaton):
        self.automaton = automaton
        self.ids: dict[frozenset[int], int] = {}
        self.sets: list[frozenset[int]] = []
        self.moves: list[dict[str, int]] = []
        self.accepts: list[bool] = []
        self.positions = 0
        self.state(automaton.closure([automaton.start]))

    def full(self) -> bool:
        return len(self.sets) > _MAX_DFA_STATES or self.positions > _MAX_DFA_POSITIONS

    def state(self, positions: frozenset[int]) -> int:
        found = self.ids.get(positions)
        if found is None:
            found = self.ids[positions] = len(self.sets)
            self.sets.append(positions)
            self.positions += len(positions)
            self.moves.append({})
            self.accepts.append(not positions.isdisjoint(self.automaton.accepting))
        return found

    def move(self, state: int, c: str) -> int:
        nxt = self.state(self.automaton.step(self.sets[state], c))
        self.moves[state][c] = nxt
        return nxt


def dir_matcher(glob: str | _Glob):
    """A matcher of the folders (each ending with '/') a glob can select something under, or None
    for none but the root. rclone cuts the glob at each '/' and each '**' (``a/*/x.jpg``: ``a/``,
    ``a/*/``; ``a/**``: ``a/``, ``a/**/``); here the cuts are the positions of one automaton
    over the glob, braces included, so no alternative is ever spelled out. A glob that can match
    with no cut at all (``*.jpg``, ``{a/x,y}``), unanchored, can match in any folder."""
    text = glob.text if isinstance(glob, _Glob) else glob
    parsed = parse_glob(re.sub(r"/{2,}", "/", text))   # rclone's cuts make a run of '/' one
    automaton = Automaton(parsed.tokens, parsed.anchored, at_cuts=True)
    if not parsed.anchored and automaton.uncut_end():
        return _Everything()
    return automaton if automaton.cuts else None


@dataclass
class _Rules:
    files: list[tuple[bool, Any]] = field(default_factory=list)
    dirs: list[tuple[bool, Any]] = field(default_factory=list)
    # folder -> whether it and every folder above it are looked into: a listing's names come in
    # runs under the same folder, and its answer is the same for each of them
    entered: dict[str, bool] = field(default_factory=dict)

    FOLDERS_KEPT = 65536

    def add(self, include: bool, glob: str) -> None:
        if not glob:
            raise InvalidOption(f"--{'include' if include else 'exclude'} '': give a glob such as '*.jpg'")
        is_dir = glob.endswith("/")
        is_file = not is_dir
        if is_dir and not include:
            glob += "**"
        if "**" in glob:
            is_dir = is_file = True
        parsed = parse_glob(glob)
        matcher = compile_glob(parsed)
        if is_file:
            self.files.append((include, matcher))
            folders = dir_matcher(parsed) if include or glob == "*" else None
            if folders is not None:
                self.dirs.append((include, folders))
        if is_dir:
            self.dirs.append((include, matcher))

    @staticmethod
    def _first(rules: list[tuple[bool, Any]], path: str) -> bool:
        for include, matcher in rules:
            if matcher.search(path):
                return include
        return True

    def selects(self, rel: str) -> bool:
        return self.enters(rel.rsplit("/", 1)[0] + "/" if "/" in rel else "") and self._first(self.files, rel)

    def enters(self, folder: str) -> bool:
        """Whether the folder ``folder`` ('' or ending with '/') and every folder above it are
        looked into."""
        if not folder:
            return True
        known = self.entered.get(folder)
        if known is not None:
            return known
        if len(self.entered) >= self.FOLDERS_KEPT:
            self.entered.clear()
        known, end = True, 0
        while known and end < len(folder):   # from the top down, each folder's answer kept
            end = folder.index("/", end) + 1
            above = folder[:end]
            found = self.entered.get(above)
            if found is None:
                found = self.entered[above] = self._first(self.dirs, above)
            known = found
        self.entered[folder] = known
        return known


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
    # A wildcard source URL's glob (``s3://b/p/*.tar``: ``/*.tar`` under ``s3://b/p/``), anchored at
    # the root: a path must match it as well as the rules above (an AND, where another --include
    # would be an OR). Matched by the same bounded matcher as the rules.
    within: str | None = None

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
        if len(self.include) + len(self.exclude) > MAX_GLOBS:
            raise InvalidOption(f"{len(self.include) + len(self.exclude)} --include/--exclude globs; at most "
                                f"{MAX_GLOBS} are taken (list many exact paths with --files-from)")
        rules = _Rules()
        for glob in self.include:
            rules.add(True, glob)
        for glob in self.exclude:
            rules.add(False, glob)
        if self.include:
            rules.add(False, "/**")
        object.__setattr__(self, "_rules", rules)
        within = within_dirs = None
        if self.within is not None:
            if not self.within.startswith("/"):
                raise InvalidOption(f"wildcard {self.within!r}: expected a glob anchored at its folder")
            parsed = parse_glob(self.within)
            within, within_dirs = compile_glob(parsed), dir_matcher(parsed)
        object.__setattr__(self, "_within", within)
        object.__setattr__(self, "_within_dirs", within_dirs)
        object.__setattr__(self, "_wanted", frozenset(self.files_from) if self.files_from is not None else None)
        object.__setattr__(self, "_now", time.time())

    # -- what it selects ----------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return bool(self.include or self.exclude or self.files_from is not None or self.within is not None
                    or any(v is not None for v in (self.min_size, self.max_size, self.min_age, self.max_age)))

    def selects_name(self, rel: str) -> bool:
        """Whether the path rules (globs, --files-from) select ``rel``; sizes and ages aside."""
        if self._within is not None and not self._within.search(rel):
            return False
        if self._wanted is not None:
            return rel in self._wanted
        return self._rules.selects(rel)

    def selects_folder(self, folder: str) -> bool:
        """Whether the folder ``folder`` (ending with '/') is listed: as rclone shows a folder in
        a listing of one level, when the path rules could select something in it (sizes and
        ages are the files' own)."""
        if self._within is not None and (self._within_dirs is None or not self._within_dirs.search(folder)):
            return False
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
        ruled = self._rules_prefix()
        if self.within is None:
            return ruled
        head = _literal_folder(self.within)
        return ruled if ruled.startswith(head) else head

    def _rules_prefix(self) -> str:
        if self.files_from is not None:
            heads = [p.rsplit("/", 1)[0] + "/" if "/" in p else "" for p in self.files_from]
        elif self.include and all(g.startswith("/") for g in self.include):
            heads = [_literal_folder(glob) for glob in self.include]
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
        for name in ("min_size", "max_size", "min_age", "max_age", "within"):
            if getattr(self, name) is not None:
                data[name] = getattr(self, name)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Filters:
        data = dict(data or {})
        unknown = set(data) - {"include", "exclude", "files_from", "min_size", "max_size", "min_age", "max_age",
                               "within"}
        if unknown:
            raise InvalidOption(f"unknown filter {sorted(unknown)[0]!r}")
        return cls(tuple(data.get("include") or ()), tuple(data.get("exclude") or ()),
                   tuple(data["files_from"]) if data.get("files_from") is not None else None,
                   data.get("min_size"), data.get("max_size"), data.get("min_age"), data.get("max_age"),
                   data.get("within"))

    def key(self) -> str:
        """A short digest of the rules, for a job key: a filtered job is not another's rerun."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> str:
        """One line for a plan or a log: 'include *.jpg; exclude tmp/**; min-size 1024'."""
        parts = [f"wildcard {self.within}"] if self.within is not None else []
        if self.include:
            parts.append(f"include {' '.join(self.include)}")
        if self.exclude:
            parts.append(f"exclude {' '.join(self.exclude)}")
        if self.files_from is not None:
            parts.append(f"files-from {len(self.files_from)} paths")
        for name in ("min_size", "max_size", "min_age", "max_age"):
            if getattr(self, name) is not None:
                parts.append(f"{name.replace('_', '-')} {getattr(self, name):g}")
        return "; ".join(parts)


NONE = Filters()


def _literal_folder(glob: str) -> str:
    """The folder an anchored glob's literal head names ('' when none): ``/a/b*/x`` -> ``a/``."""
    literal = ""
    for c in glob[1:]:
        if c in _META:
            break
        literal += c
    return literal.rsplit("/", 1)[0] + "/" if "/" in literal else ""


WILDCARDS = frozenset("*?[{")


def split_wildcard(path: str) -> tuple[str, str] | None:
    """A wildcard path (``p/q*/x.tar``) as its folder before the first wildcard (``p/``) and the
    rest as a glob anchored there (``/q*/x.tar``); None when it has no wildcard."""
    first = next((i for i, c in enumerate(path) if c in WILDCARDS), None)
    if first is None:
        return None
    cut = path.rfind("/", 0, first) + 1
    return path[:cut], "/" + path[cut:]


def walk(store: Any, root: Any, filters: Filters | None = None,
         listed: Callable[[int], None] | None = None) -> Iterator[tuple[str, Any]]:
    """(path relative to ``root``, ObjectInfo) of the data objects under the prefix ``root`` that
    ``filters`` select, listing from their common folder; ``listed(n)`` hears of every few
    hundred objects listed (progress for long listings)."""
    filters = filters or NONE
    active = filters.active   # once: a property of six fields, asked per object was 3% of a long sync
    start = filters.prefix() if active else ""
    if any(part in ("", ".", "..") for part in start.split("/")[:-1]):
        start = ""   # a folder of odd segments: not pushed down (the rules still apply to each path)
    base = root.as_prefix()
    seen = 0
    active = filters.active   # (a property that looks at every rule: once, not per object)
    for rel, info in store.walk(type(base)(base.scheme, base.bucket, base.key + start)):
        seen += 1
        if listed is not None and seen % 500 == 0:
            listed(500)
        rel = start + rel
        if not active or filters.selects(rel, info):
            yield rel, info
    if listed is not None and seen % 500:
        listed(seen % 500)


def from_flags(include: Iterable[str] | None = None, exclude: Iterable[str] | None = None,
               files_from: list[str] | None = None, min_size: int | None = None, max_size: int | None = None,
               min_age: float | None = None, max_age: float | None = None) -> Filters:
    return Filters(tuple(include or ()), tuple(exclude or ()),
                   tuple(files_from) if files_from is not None else None, min_size, max_size, min_age, max_age)
