"""The integrity record of a prefix: a log of commits under ``<root>/_bridge/``, each written last
by the job it records, as that job's commit marker. A local ``root`` with ``transfer.manifest_dir``
set keeps it under ``<manifest_dir>/<root's absolute path>/_bridge/`` instead (``record_root``):
every function here takes the data's root and finds the record through the store's settings.

A prefix with no commit is incomplete. Any number of writers may commit into one prefix at once
(several jobs dropping shards or checkpoints under one root) and none loses another's entries:

    _bridge/log/c-<seq>-<ms>-<rand>.json      one commit: the entries a job wrote, the paths it
                                              removed, and the ``extra`` it merges (shard sets)
    _bridge/log/k-<seq>-<ms>-<rand>.json      a checkpoint: every entry of the commits it
                                              ``covers`` (and of the checkpoint below it), folded
    _bridge/seg/<name>/000000.jsonl …         the entries of a big commit or checkpoint, sorted
                                              by path, in shards of at most SHARD_ENTRIES lines

Every name is new (a sequence number one above the highest the writer saw, its clock, and 48
random bits), so a commit never overwrites another: no writer needs a lock or a conditional write
to be safe, on any store (an S3 endpoint that ignores ``If-None-Match`` included). ``seq`` orders
commits that saw one another: a later commit's entry for a path wins. Commits that ran at the same
time share a ``seq`` and are ordered by clock, then name; they wrote different files (or the same
file twice, and then its object is whichever upload landed last: ``verify`` checks it against the
entry that won, by its identity and bytes).

A reader lists ``_bridge/log/`` (one request per 1,000 commits), takes the newest checkpoint
(highest ``seq``, then name) and the commits it does not cover, in order. Entries stream in path
order, newest first per path (``entries``): a merge of sorted shards, one shard of each source in
memory at a time, never the whole record.

Compaction folds the checkpoint and the commits on top of it into a new checkpoint once more than
COMPACT_AFTER commits lie on top. A checkpoint's clock is the time its listing began, so that of
two checkpoints of one seq the one that listed later, and so holds all the other held, is newest. It deletes only what the checkpoint *below* its base covered (and
checkpoints below that): one generation late, so that a reader (or a compaction) that started from
the older state still finds every file it needs, and two compactions running at once can neither
lose a commit nor each other's work. A reader whose file vanished under it starts again.

A commit's document (a checkpoint's has ``covers`` too)::

    {"format": "mcbridge-manifest", "version": 3, "kind": "commit", "seq": 7,
     "bridge_version": "0.1.0", "created": "2026-12-01T15:00:00Z", "source": "...", "destination": "...",
     "totals": {"files": 2, "bytes": 10}, "extra": {...}, "removed": ["old.bin"],
     "files": [{"path": "a/b.bin", "size": 10, "crc32c": "…", "sha256": "…",
                "part_size": 8388608, "parts": ["crc32c hex", …], "part_sha256": ["hex", …],
                "computed": ["crc32c", "sha256"], "reported": {"crc32c": "…"},
                "identity": {"etag": "…", "last_modified": "2026-11-29T15:00:00Z"},
                "source_id": {"etag": "…"}, "note": "", "sha256_tree": "hex",
                "carried": {"hashes": ["sha256"], "manifest": "s3://…/_bridge/log/c-….json",
                            "identity": {…}}}, …]}

or, for more than SHARD_ENTRIES entries, ``file_shards`` (name, entries, sha256, first and last
path) in place of ``files``.

Versions. 3 is this log. Versions 1 and 2 were one document, ``_bridge/manifest.json``, rewritten
whole by every commit (its entries inline or in ``_bridge/manifest.d/`` shards; 2 when an entry
lacks a computed hash). Such a document is still read, as the base below the log, until the first
checkpoint folds it; it is no longer written. A bridge older than the log finds no
``manifest.json`` in a prefix committed by this one and reports it incomplete: a refusal, never a
false pass.

Entries. Hashes of a multipart file, and resume without paying egress twice. Each part's CRC32C and
SHA-256 are computed as it passes (in parallel, by the part workers) and journaled with it, so a
part never has to be read again to be accounted for; ``parts`` and ``part_sha256`` list them in
order, ``crc32c`` is combined from the parts' CRC32Cs, and ``sha256_tree`` (hashing.sha256_tree,
README "Digests") over the part SHA-256s and ``part_size`` is the file's content identity. The
plain whole-file ``sha256`` of a multipart file is one stream that cannot be split: it is
recorded only when asked for (``transfer.sha256``, ``--sha256``), fed in part order when every part
passes through one process in one run, or carried. A resumed copy skips finished parts without
reading them from a cloud source; asked for the whole ``sha256``, it then hashes a local
destination once complete, and otherwise leaves ``sha256`` empty and says so in ``note``:
``part_sha256`` still covers every byte, and ``verify --deep`` checks whatever the entry has.
``carried`` (bridge/carry.py) names the hashes taken from a source prefix's record instead of
computed, the document that recorded them and the source object's identity then.
``sha256_tree`` and ``carried`` are optional (absent: "" and {}), so version 3 stays: a reader
that predates them ignores them and checks the part SHA-256s. ``computed`` names the hashes bridge took from the bytes as they
passed through it (empty for a copy the clouds made, committed from what the stores report);
``reported`` holds what the store said of the written object at commit; ``identity`` is what named
that exact version of the object on its store at commit (S3 ETag and version id, GCS generation,
Azure ETag and last-modified, a local file's inode, size, mtime and ctime): when a listing shows
another one, the object was rewritten since, and the cheap ``verify`` and ``sync`` re-read it.
``source_id`` is the identity the source object had when it was copied: ``sync`` compares it with
the source's listing, so an unchanged source costs no request.

Proof. A value in ``reported`` is one the store computed of the object it holds (S3's CRC32C,
CRC64NVME and CRC32 additional checksums and a one-request upload's ETag, GCS crc32c and md5Hash),
never one a client could have written (``bridge_crc32c`` metadata, an Azure Content-MD5). An entry
bridge committed without the bytes passing through it (``computed`` empty: a server-side copy,
Storage Transfer, DataSync) is proven when a checksum its source's store computed equals the one the
destination's store computed; where none is common, or a side computes none (an Azure blob), its
``note`` begins ``unproven:`` (UNPROVEN) and says why: the default ``verify`` reports such an object
as unproven, never as verified, and ``verify --deep`` reads it back against the entry.

``adopted`` (optional: an entry without it reads as "", and an older reader ignores it) marks an object bridge did not write but found
already at the destination, equal to its source (bridge/adopt.py): it names the checksum that
proved it (``md5``, ``crc64nvme``, ``crc32c``, ``crc32``, or ``deep`` when both sides were read).
``reported`` then holds what the destination reports of the object, ``computed`` the hashes bridge
took from bytes it read (a local source's; both sides' under ``deep``), and ``note`` says so.
"""

from __future__ import annotations

import contextvars
import hashlib
import heapq
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bridge.version import __version__
from bridge.errors import BridgeError, IntegrityError, InvalidOption, ManifestError, ObjectNotFound
from bridge.hashing import FileHash, crc32c, crc_hex
from bridge.stores.base import RESERVED, ObjectInfo, Store
from bridge.urls import Location, canonical

if TYPE_CHECKING:
    from bridge.config import Settings

FORMAT = "mcbridge-manifest"
VERSION = 3          # the newest this bridge reads, and what it writes
SHARD_ENTRIES = 5_000
SHARDS_IN_FLIGHT = 4   # a commit's shards written at once, each by a thread of its own
COMPACT_AFTER = 32   # commits on top of a checkpoint before a commit folds them
COMPUTED = ("crc32c", "sha256")   # what bridge hashes every byte it moves with
UNPROVEN = "unproven:"   # how an entry's note begins when nothing proves the object equal to its source
READ_BACK = "proven by reading it"   # how it begins once a deep read found the object equal to the entry
LOG = f"{RESERVED}/log/"
SEGMENTS = f"{RESERVED}/seg/"
MANIFEST = f"{RESERVED}/manifest.json"              # versions 1 and 2: read, never written
PREVIOUS = f"{RESERVED}/manifest.previous.json"     # what their in-flight jobs set aside
LEGACY_SHARDS = f"{RESERVED}/manifest.d/"
_READ_TRIES = 5


@dataclass
class FileEntry:
    path: str
    size: int
    crc32c: str
    sha256: str
    part_size: int = 0                          # 0: written in one request
    parts: list[str] = field(default_factory=list)
    computed: list[str] = field(default_factory=lambda: list(COMPUTED))  # hashes bridge took from the bytes
    reported: dict[str, str] = field(default_factory=dict)   # hashes the store reported at commit
    identity: dict[str, str] = field(default_factory=dict)   # the object version committed
    part_sha256: list[str] = field(default_factory=list)   # per part, when every part has one
    note: str = ""                              # why a hash is left out ("" : none is)
    source_id: dict[str, str] = field(default_factory=dict)  # the source version it was copied from
    adopted: str = ""                           # found already there, equal by this checksum (bridge.adopt)
    sha256_tree: str = ""                       # hashing.sha256_tree(part_sha256, part_size): content identity
    carried: dict = field(default_factory=dict)   # hashes taken from a source manifest: which, from where

    @classmethod
    def from_dict(cls, d: dict) -> FileEntry:
        return cls(d["path"], int(d["size"]), d["crc32c"], d["sha256"], int(d.get("part_size", 0)),
                   list(d.get("parts", [])), list(d.get("computed", COMPUTED)), dict(d.get("reported", {})),
                   dict(d.get("identity", {})), list(d.get("part_sha256", [])), d.get("note", ""),
                   dict(d.get("source_id", {})), d.get("adopted", ""), d.get("sha256_tree", ""),
                   dict(d.get("carried", {})))

    def text(self) -> str:
        """``to_dict`` as compact JSON (``entry_text``)."""
        return entry_text(self.path, self.size, self.crc32c, self.sha256, self.part_size, self.parts, self.computed,
                          self.reported, self.identity, self.part_sha256, self.note, self.source_id, self.adopted,
                          self.sha256_tree, self.carried)

    def to_dict(self) -> dict:
        """As ``dataclasses.asdict`` gives it, without its deep copy (~10x faster; one per file)."""
        return {"path": self.path, "size": self.size, "crc32c": self.crc32c, "sha256": self.sha256,
                "part_size": self.part_size, "parts": list(self.parts), "computed": list(self.computed),
                "reported": dict(self.reported), "identity": dict(self.identity),
                "part_sha256": list(self.part_sha256), "note": self.note, "source_id": dict(self.source_id),
                "adopted": self.adopted, "sha256_tree": self.sha256_tree, "carried": dict(self.carried)}

    @property
    def unproven(self) -> bool:
        """Committed with no store's checksum nor bridge's reading proving it equal to its source."""
        return self.note.startswith(UNPROVEN)

    @property
    def reported_only(self) -> bool:
        """Committed from what the stores reported: bridge never saw the bytes."""
        return not self.computed

    def part_sizes(self) -> list[int]:
        if not self.part_size or not self.parts:
            return [self.size]
        full, last = divmod(self.size, self.part_size)
        sizes = [self.part_size] * full
        if last:
            sizes.append(last)
        return sizes


_FIELDS = tuple(f.name for f in FileEntry.__dataclass_fields__.values())
_esc = json.encoder.encode_basestring_ascii   # (C) a str as JSON; TypeError for anything else


def _strs(items: list[str]) -> str:
    return "[" + ",".join([_esc(v) for v in items]) + "]" if items else "[]"


def _flat(items: dict[str, str]) -> str:
    return "{" + ",".join([f"{_esc(k)}:{_esc(v)}" for k, v in items.items()]) + "}" if items else "{}"


def entry_text(path: str, size: int, crc32c: str, sha256: str, part_size: int, parts: list[str], computed: list[str],
               reported: dict[str, str], identity: dict[str, str], part_sha256: list[str], note: str,
               source_id: dict[str, str], adopted: str, sha256_tree: str, carried: dict) -> str:
    """A ``FileEntry``'s ``to_dict`` (the fields given in its order) as the compact JSON text
    ``json.dumps(..., separators=(",", ":"))`` writes, built from the fields rather than through
    a dict and the encoder: a third of the time, once per adopted file (tests/test_journal.py
    holds the two texts equal). Values of other types than the usual (a nested ``carried``, a
    number where a str is usual) take the encoder's way."""
    if type(size) is int and type(part_size) is int and not carried:
        try:
            return (f'{{"path":{_esc(path)},"size":{size},"crc32c":{_esc(crc32c)},"sha256":{_esc(sha256)},'
                    f'"part_size":{part_size},"parts":{_strs(parts)},"computed":{_strs(computed)},'
                    f'"reported":{_flat(reported)},"identity":{_flat(identity)},'
                    f'"part_sha256":{_strs(part_sha256)},"note":{_esc(note)},"source_id":{_flat(source_id)},'
                    f'"adopted":{_esc(adopted)},"sha256_tree":{_esc(sha256_tree)},"carried":{{}}}}')
        except TypeError:
            pass
    values = (path, size, crc32c, sha256, part_size, parts, computed, reported, identity, part_sha256, note,
              source_id, adopted, sha256_tree, carried)
    return json.dumps(dict(zip(_FIELDS, values)), separators=(",", ":"))


@dataclass
class Manifest:
    """A prefix's record read whole (``read``): for small records and the tests. Jobs and
    ``verify`` stream ``Record.entries()`` instead."""
    source: str
    destination: str
    files: dict[str, FileEntry]
    created: str = ""
    bridge_version: str = __version__
    extra: dict = field(default_factory=dict)   # e.g. shard-set indexes

    def totals(self) -> dict:
        return {"files": len(self.files), "bytes": sum(e.size for e in self.files.values())}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _put_json(store: Store, loc: Location, data: bytes) -> None:
    store.put(loc, data, crc32c=crc_hex(crc32c(data)), metadata={})


@dataclass(frozen=True, slots=True)
class RawEntry:
    """A file's entry as the compact JSON text a job's journal holds it in (``FileEntry.to_dict``'s
    keys in their order, as ``json.dumps(..., separators=(",", ":"))`` wrote it), committed as
    that text: a commit of thousands of small files spent most of its time decoding each record
    and encoding it again. ``path`` and ``size`` are what a commit reads of it."""
    path: str
    size: int
    text: str

    @classmethod
    def of(cls, text: str) -> RawEntry | None:
        """The entry of ``text`` when it is one line that starts ``{"path":"...","size":N,``;
        None otherwise (decode it)."""
        if not text.startswith('{"path":"') or not text.endswith("}") or "\n" in text:
            return None
        try:
            path, end = _scanstring(text, 9)
        except ValueError:
            return None
        size = _SIZE.match(text, end)
        return cls(path, int(size.group(1)), text) if size else None


def entry_of(text: str) -> RawEntry | FileEntry:
    """An entry held as its JSON text (a journal's record, a plan's adopted entry): committed as
    that text where it is one line of the usual form (``RawEntry``), else decoded."""
    return RawEntry.of(text) or FileEntry.from_dict(json.loads(text))


_scanstring = json.decoder.scanstring
_SIZE = re.compile(r',"size":(\d+),')


def _path(entry: dict | RawEntry) -> str:
    return entry.path if isinstance(entry, RawEntry) else entry["path"]


def _text(entry: dict | RawEntry) -> str:
    return entry.text if isinstance(entry, RawEntry) else json.dumps(entry, separators=(",", ":"))


def _line(entry: dict | RawEntry) -> bytes:
    return _text(entry).encode() + b"\n"


# -- names ---------------------------------------------------------------------------------------

@dataclass(frozen=True, order=True)
class _Name:
    """A log document's name, in the order commits apply: ``seq``, then clock, then the rest."""
    seq: int
    ms: int
    name: str          # the file name, e.g. c-000000000007-1733065200000-0f3c9a1b2d4e.json
    kind: str          # "c" commit, "k" checkpoint

    @classmethod
    def parse(cls, name: str) -> _Name | None:
        parts = name.split("-")
        if len(parts) != 4 or parts[0] not in ("c", "k") or not name.endswith(".json") \
                or not parts[1].isdigit() or not parts[2].isdigit():
            return None
        return cls(int(parts[1]), int(parts[2]), name, parts[0])

    @classmethod
    def new(cls, kind: str, seq: int, ms: int | None = None) -> _Name:
        ms = int(time.time() * 1000) if ms is None else ms
        return cls(seq, ms, f"{kind}-{seq:012d}-{ms:013d}-{os.urandom(6).hex()}.json", kind)


@dataclass
class _State:
    """What a listing of ``_bridge/log/`` says: the checkpoint to start from, the commits on top."""
    names: list[_Name]
    legacy: bool                 # a version 1/2 manifest.json is there
    legacy_previous: bool        # only its set-aside copy is there

    @property
    def top_seq(self) -> int:
        return max((n.seq for n in self.names), default=0)

    @property
    def checkpoints(self) -> list[_Name]:
        return sorted(n for n in self.names if n.kind == "k")


def _folder(root: Location, rel: str) -> Location:
    return root.join(rel.rstrip("/")).as_prefix()


# -- where a record lives --------------------------------------------------------------------------

def record_root(root: Location, settings: Settings | None) -> Location:
    """The prefix that holds ``root``'s ``_bridge/`` record: ``root`` itself, or, for a local
    ``root`` when ``transfer.manifest_dir`` is set (``--manifest-dir``, ``MCBRIDGE_MANIFEST_DIR``),
    that folder followed by ``root``'s absolute path (links resolved), so that the data folder holds
    only the data and several destinations share one manifest folder. Every reader and writer of a
    record asks here (through the store's settings), and nowhere else."""
    root = root.as_prefix()
    manifest_dir = settings.transfer.manifest_dir if settings is not None else None
    if not root.is_local or not manifest_dir:
        return root
    home = canonical(Location("file", "", os.path.abspath(os.path.expanduser(manifest_dir)).strip("/") + "/"))
    data = canonical(root)
    if home.key.startswith(data.key) or data.key.startswith(home.key):
        raise InvalidOption(f"manifest folder {home.local_path} and destination {data.local_path} overlap: "
                            f"keep the manifest folder outside the data (and the data outside it)")
    return Location("file", "", home.key + data.key)


def record_home(store: Store, root: Location) -> Location:
    """``record_root`` with the settings the store was made with (every store keeps them)."""
    return record_root(root, getattr(store, "settings", None))


def log_folder(store: Store, root: Location) -> str:
    """Where ``root``'s commits are (``_bridge/log/``), as a summary names it."""
    return str(record_home(store, root)) + LOG


def _list_state(store: Store, root: Location) -> _State:
    names, legacy, previous = [], False, False
    for info in store.list(_folder(root, RESERVED)):
        rel = info.location.relative_to(root)
        if rel.startswith(LOG) and "/" not in rel[len(LOG):]:
            parsed = _Name.parse(rel[len(LOG):])
            if parsed:
                names.append(parsed)
        elif rel == MANIFEST:
            legacy = True
        elif rel == PREVIOUS:
            previous = True
    return _State(sorted(names), legacy, previous and not legacy)


# -- reading -------------------------------------------------------------------------------------

class _Vanished(Exception):
    """A file of the record went away while it was read (a compaction): read it again."""


def _read_doc(store: Store, loc: Location, *, must_exist: bool = True) -> dict | None:
    try:
        raw = store.read(loc)
    except ObjectNotFound:
        if must_exist:
            raise _Vanished(str(loc)) from None
        return None
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise ManifestError(f"{loc} is not valid JSON") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("version"), int):
        raise ManifestError(f"{loc} is not a bridge manifest")
    if doc["version"] > VERSION:
        raise ManifestError(f"{loc} has version {doc['version']}; this bridge reads up to {VERSION}: "
                            f"upgrade mcbridge")
    return doc


def _doc_entries(store: Store, root: Location, loc: Location, doc: dict) -> Iterator[dict]:
    """A document's entries in path order, one shard decoded at a time. The shards' bytes are
    read (and checked against their hashes) by a thread one or two shards ahead, so that a record
    of many shards costs its reads' round trips beside the decoding, not between; the decoding
    stays in the reader's thread (a second thread of Python work beside a sync's merge cost it
    more CPU than it saved in waits: bench/notes/adopt-pack.md)."""
    if "files" in doc:
        files = doc["files"]
        if doc.get("version", 1) < 3:
            files = sorted(files, key=lambda e: e["path"])
        yield from files
        return
    shards = doc.get("file_shards", [])
    bodies = _shard_bodies(store, root, loc, shards)
    if len(shards) > 1:
        from bridge import meter
        bodies = meter.ahead(bodies, chunk=1, chunks=2)
    loads = json.loads
    for body in bodies:
        for line in body.splitlines():
            yield loads(line)


def _shard_bodies(store: Store, root: Location, loc: Location, shards: list[dict]) -> Iterator[bytes]:
    for shard in shards:
        where = root.join(shard["name"])
        try:
            body = store.read(where)
        except ObjectNotFound:
            raise _Vanished(str(where)) from None
        if hashlib.sha256(body).hexdigest() != shard["sha256"]:
            raise ManifestError(f"{where}: manifest shard does not match its hash (in {loc})")
        yield body


@dataclass
class _Source:
    loc: Location
    doc: dict


class Record:
    """A prefix's record as of one listing: its documents, newest last. ``entries()`` streams the
    merged entries; ``extra``, ``source`` and ``destination`` are the newest commit's view."""

    def __init__(self, store: Store, root: Location, state: _State, sources: list[_Source]):
        self.store, self.root, self.state, self.sources = store, root, state, sources
        self.extra: dict = {}
        for src in sources:
            for key, value in (src.doc.get("extra") or _legacy_extra(src.doc)).items():
                self.extra[key] = ({**self.extra.get(key, {}), **value}
                                   if isinstance(value, dict) and isinstance(self.extra.get(key), dict) else value)
        newest = sources[-1].doc if sources else {}
        self.source = newest.get("source", "")
        self.destination = newest.get("destination", "")
        self.created = newest.get("created", "")
        self.bridge_version = newest.get("bridge_version", "")

    @property
    def commits_on_top(self) -> int:
        return sum(1 for s in self.sources if s.doc.get("kind") == "commit")

    def _raw(self) -> Iterator[tuple[str, int, dict | None]]:
        """(path, -rank, entry or None for a removal) of every source, merged in path order."""
        def tagged(rank: int, src: _Source) -> Iterator[tuple[str, int, dict | None]]:
            removed = iter(sorted(src.doc.get("removed", [])))
            entries = _doc_entries(self.store, self.root, src.loc, src.doc)
            yield from heapq.merge(((p, -rank, None) for p in removed),
                                   ((e["path"], -rank, e) for e in entries), key=lambda t: (t[0], t[1]))
        return heapq.merge(*(tagged(i, s) for i, s in enumerate(self.sources)), key=lambda t: (t[0], t[1]))

    def entries(self) -> Iterator[FileEntry]:
        """Every live entry in path order (the newest commit's, per path). May raise ManifestError
        when a file of the record vanished under the reader (compactions faster than it reads).
        A record of one document that removes nothing (one commit, or a checkpoint alone) is
        read without the merge: it has one entry a path, in path order."""
        if len(self.sources) == 1 and not self.sources[0].doc.get("removed"):
            return self._one_source(self.sources[0])
        return (entry for entry, _doc in self.entries_with_origin())

    def _one_source(self, src: _Source) -> Iterator[FileEntry]:
        from_dict, last = FileEntry.from_dict, None
        try:
            for entry in _doc_entries(self.store, self.root, src.loc, src.doc):
                if entry["path"] != last:   # (as the merge keeps one entry a path)
                    last = entry["path"]
                    yield from_dict(entry)
        except _Vanished as exc:
            raise self._compacted(exc) from None

    def _compacted(self, exc: _Vanished) -> ManifestError:
        return ManifestError(f"{exc}: part of the record at {self.root} was compacted away while "
                             f"it was read; run the command again")

    def entries_with_origin(self) -> Iterator[tuple[FileEntry, str]]:
        """``entries()``, each with the document it was read from (``_bridge/log/c-….json``, a
        checkpoint, or a version-1/2 ``_bridge/manifest.json``), relative to the root."""
        last = None
        try:
            for path, rank, entry in self._raw():
                if path == last:
                    continue
                last = path
                if entry is not None:
                    yield FileEntry.from_dict(entry), self.sources[-rank].loc.relative_to(self.root)
        except _Vanished as exc:
            raise self._compacted(exc) from None


def _legacy_extra(doc: dict) -> dict:
    if doc.get("version", 3) >= 3:
        return {}
    return {k: v for k, v in doc.items() if k not in {"format", "version", "bridge_version", "created", "source",
                                                       "destination", "totals", "files", "file_shards"}}


def open_record(store: Store, root: Location) -> Record | None:
    """The prefix's record, or None when nothing was ever committed there."""
    root = record_home(store, root)
    for _try in range(_READ_TRIES):
        state = _list_state(store, root)
        try:
            return _open(store, root, state)
        except _Vanished:
            continue
    raise ManifestError(f"the record at {root.join(LOG)} kept changing while it was read; run the command again")


def _open(store: Store, root: Location, state: _State) -> Record | None:
    sources: list[_Source] = []
    checkpoints = state.checkpoints
    covered: set[str] = set()
    if checkpoints:
        base = checkpoints[-1]
        loc = root.join(LOG + base.name)
        doc = _read_doc(store, loc)
        sources.append(_Source(loc, doc))
        covered = set(doc.get("covers", []))
    elif state.legacy or state.legacy_previous:
        loc = root.join(MANIFEST if state.legacy else PREVIOUS)
        doc = _read_doc(store, loc, must_exist=False)
        if doc is not None:
            sources.append(_Source(loc, doc))
    for name in state.names:
        if name.kind == "c" and name.name not in covered:
            loc = root.join(LOG + name.name)
            sources.append(_Source(loc, _read_doc(store, loc)))
    if not sources:
        return None
    return Record(store, root, state, sources)


def read(store: Store, root: Location) -> Manifest | None:
    """The whole record in memory (small prefixes, tests): None when nothing was committed."""
    record = open_record(store, root)
    if record is None:
        return None
    files = {e.path: e for e in record.entries()}
    return Manifest(record.source, record.destination, files, record.created, record.bridge_version,
                    record.extra)


def committed(store: Store, root: Location) -> bool:
    """Whether anything was ever committed at ``root`` (one listing, no document read)."""
    state = _list_state(store, record_home(store, root))
    return bool(state.names) or state.legacy


def committed_prefixes(store: Store, root: Location) -> list[str]:
    """The keys (relative to ``root``, "" for root itself) of every prefix beneath ``root`` that
    holds a record: one listing of the manifest folder's copy of the tree, where records are
    kept outside the data (a listing of the data itself finds them with ``record_head``)."""
    home = record_home(store, root)
    return sorted({head for head in (record_head(info.location.relative_to(home)) for info in store.list(home))
                   if head is not None})


def record_head(rel: str) -> str | None:
    """The prefix (relative, "" for the root listed) whose record the key ``rel`` is a commit
    or legacy manifest of, or None when it is no such key."""
    marker = f"{RESERVED}/"
    at = rel.find(marker) if rel.startswith(marker) else rel.find("/" + marker)
    if at < 0:
        return None
    head = rel[:at + 1] if at > 0 else ""
    tail = rel[len(head) + len(marker):]
    if (tail.startswith("log/") and _Name.parse(tail[4:]) is not None) or tail == "manifest.json":
        return head
    return None


def is_commit_marker(loc: Location) -> bool:
    """A document that says a prefix is committed: removed before the rest of a record."""
    key = "/" + loc.key
    return key.endswith("/" + MANIFEST) or f"/{LOG}" in key


def record_files(store: Store, root: Location) -> tuple[Location, list[Location]]:
    """Where the records at and beneath ``root`` are kept (``record_root``), and every file of
    theirs, commit markers first: what removing the whole prefix removes with it."""
    at = record_home(store, root)
    found = [info.location for info in store.list(at) if f"/{RESERVED}/" in "/" + info.location.relative_to(at)]
    return at, sorted(found, key=lambda loc: not is_commit_marker(loc))


# -- writing -------------------------------------------------------------------------------------

class _SegmentWriter:
    """Sorted entries into a document's ``files`` or, past SHARD_ENTRIES, its shards: each shard
    written by a thread of its own while the next one fills (a commit of 20,000 entries waited
    on its four PUTs in turn for a third of its time), all of them written before ``fields``
    returns, and so before the document that names them."""

    def __init__(self, store: Store, root: Location, name: str):
        self.store, self.root, self.folder = store, root, f"{SEGMENTS}{name[:-len('.json')]}/"
        self.pending: list[dict | RawEntry] = []
        self.shards: list[dict] = []
        self.files = 0
        self.bytes = 0
        self.last: str | None = None
        self.unversioned = False
        self._sending: list[tuple[threading.Thread, list[BaseException]]] = []

    def add(self, entry: dict | RawEntry) -> None:
        raw = isinstance(entry, RawEntry)
        path = entry.path if raw else entry["path"]
        if self.last is not None and path <= self.last:
            raise BridgeError(f"internal error: manifest entries out of order ({self.last!r}, then {path!r})")
        self.last = path
        self.files += 1
        self.bytes += entry.size if raw else int(entry["size"])
        self.pending.append(entry)
        if len(self.pending) >= SHARD_ENTRIES:
            self._flush()

    def _flush(self) -> None:
        if not self.pending:
            return
        body = b"".join(_line(e) for e in self.pending)
        fields = {"entries": len(self.pending), "sha256": hashlib.sha256(body).hexdigest(),
                  "first": _path(self.pending[0]), "last": _path(self.pending[-1])}
        self.pending = []
        self._send(body, fields)

    def _send(self, body: bytes, fields: dict) -> None:
        name = f"{self.folder}{len(self.shards):06d}.jsonl"
        self.shards.append({"name": name, **fields})
        if len(self._sending) >= SHARDS_IN_FLIGHT:
            self._sent(1)
        failed: list[BaseException] = []

        def send() -> None:
            try:
                _put_json(self.store, self.root.join(name), body)
            except BaseException as exc:   # raised again in the writer's thread
                failed.append(exc)
        # (with this thread's context: the job's meter counts the PUT)
        thread = threading.Thread(target=contextvars.copy_context().run, args=(send,), daemon=True,
                                  name="record-shard")
        thread.start()
        self._sending.append((thread, failed))

    def _sent(self, at_most: int | None = None) -> None:
        """The oldest shards' PUTs finished (all, or ``at_most`` of them); their error raised here."""
        while self._sending and (at_most is None or at_most > 0):
            thread, failed = self._sending.pop(0)
            thread.join()
            if failed:
                raise failed[0]
            at_most = None if at_most is None else at_most - 1

    def add_block(self, block: Block) -> None:
        """A shard laid out already (``blocks_of``), written as it is, after what came before it."""
        if self.pending:
            raise BridgeError("internal error: a laid-out shard after single entries")
        if self.last is not None and block.paths[0] <= self.last:
            raise BridgeError(f"internal error: manifest entries out of order ({self.last!r}, then {block.paths[0]!r})")
        self.last = block.paths[-1]
        self.files += len(block.paths)
        self.bytes += block.size
        self._send(block.body, {"entries": len(block.paths), "sha256": block.sha256, "first": block.paths[0],
                                "last": block.paths[-1]})

    def fields(self) -> dict:
        if not self.shards:
            return {"files": self.pending}
        self._flush()
        self._sent()
        return {"file_shards": self.shards}


def _doc(kind: str, seq: int, source: str, destination: str, writer: _SegmentWriter, extra: dict | None,
         removed: list[str], covers: list[str] | None = None) -> dict:
    doc = {"format": FORMAT, "version": VERSION, "kind": kind, "seq": seq, "bridge_version": __version__,
           "created": _now(), "source": source, "destination": destination,
           "totals": {"files": writer.files, "bytes": writer.bytes}, "extra": extra or {}, "removed": removed}
    if covers is not None:
        doc["covers"] = covers
    doc.update(writer.fields())
    return doc


def _dumps(doc: dict) -> bytes:
    """The document as JSON: its fields one per line, each file's entry on a line of its own."""
    files = doc.get("files")
    lines = [f" {json.dumps(k)}: {json.dumps(v)}" for k, v in doc.items() if k != "files"]
    if files is not None:
        entries = ",\n  ".join(_text(e) for e in files)
        lines.append(f' "files": [\n  {entries}\n ]' if files else ' "files": []')
    return ("{\n" + ",\n".join(lines) + "\n}\n").encode()


def _sorted_entries(entries: Iterable[FileEntry | dict | RawEntry]) -> Iterator[dict | RawEntry]:
    """Entries as dicts (or as their text) in path order, the last of a path kept. A sized
    collection is sorted here; an iterator must already be in path order (a journal's, a merge's)."""
    as_dicts = (e.to_dict() if isinstance(e, FileEntry) else e for e in entries)
    if hasattr(entries, "__len__"):
        as_dicts = iter(sorted(as_dicts, key=_path))
    held = None
    for entry in as_dicts:
        if held is not None and _path(held) != _path(entry):
            yield held
        held = entry
    if held is not None:
        yield held


def append(store: Store, root: Location, source: str, destination: str,
           entries: Iterable[FileEntry | dict | RawEntry], *,
           removed: Iterable[str] = (), extra: dict | None = None) -> Location:
    """Commit ``entries`` (and the removal of ``removed``) at ``root``: their shards, then the
    commit's document, last. Returns the document's location. Folds the log when it has grown."""
    def fill(writer: _SegmentWriter) -> None:
        for entry in _sorted_entries(entries):
            writer.add(entry)
    return _append(store, root, source, destination, fill, removed, extra)


@dataclass
class Block:
    """Entries laid out as one shard of a commit (``blocks_of``): their paths in order, their
    lines as the shard holds them, the sum of their sizes and the lines' SHA-256. A sync planned
    by parts (bridge.pipeline.forkplan) lays out its adopted entries in the parts' processes, so
    that the commit writes them as they are instead of taking each entry apart again in one
    process (a tenth of adopting 20,000 files, after the parts)."""
    paths: list[str]
    body: bytes
    size: int
    sha256: str


def blocks_of(rows: Iterable[tuple[str, str]]) -> Iterator[Block]:
    """(path, JSON text of its entry) in path order, as blocks of at most SHARD_ENTRIES entries."""
    paths: list[str] = []
    lines: list[bytes] = []
    size = 0
    for path, text in rows:
        if paths and path <= paths[-1]:
            raise BridgeError(f"internal error: manifest entries out of order ({paths[-1]!r}, then {path!r})")
        # (the text encode or entry_text made: '{"path":"...","size":N,' first, RawEntry's form; its
        # size the first _SIZE, since every quote inside the path is escaped; one line, since
        # control characters are too)
        found = _SIZE.search(text)
        if found is None or not text.startswith('{"path":"') or "\n" in text:
            raise BridgeError(f"internal error: the entry of {path!r} is not one line of the usual form")
        paths.append(path)
        lines.append(text.encode() + b"\n")
        size += int(found.group(1))
        if len(paths) >= SHARD_ENTRIES:
            body = b"".join(lines)
            yield Block(paths, body, size, hashlib.sha256(body).hexdigest())
            paths, lines, size = [], [], 0
    if paths:
        body = b"".join(lines)
        yield Block(paths, body, size, hashlib.sha256(body).hexdigest())


def append_blocks(store: Store, root: Location, source: str, destination: str, blocks: Iterable[Block]) -> Location:
    """``append`` of entries laid out already (``blocks_of``), each block written as a shard of
    its own, in the order given (which must be path order): a commit of many adopted entries."""
    def fill(writer: _SegmentWriter) -> None:
        for block in blocks:
            writer.add_block(block)
    return _append(store, root, source, destination, fill, (), None)


def _append(store: Store, root: Location, source: str, destination: str, fill: Callable[[_SegmentWriter], None],
            removed: Iterable[str], extra: dict | None) -> Location:
    root = record_home(store, root)
    state = _list_state(store, root)
    name = _Name.new("c", state.top_seq + 1)
    writer = _SegmentWriter(store, root, name.name)
    fill(writer)
    doc = _doc("commit", name.seq, source, destination, writer, extra, sorted(set(removed)))
    where = root.join(LOG + name.name)
    _put_json(store, where, _dumps(doc))
    # Commits a checkpoint covers have a seq at most its own (it was one above none of them):
    # those above it are on top, without reading it.
    base = state.checkpoints[-1].seq if state.checkpoints else -1
    if sum(1 for n in state.names if n.kind == "c" and n.seq > base) + 1 > COMPACT_AFTER:
        try:
            _compact(store, root)
        except (BridgeError, _Vanished):
            pass   # the commit stands; the next one folds the log
    return where


def write(store: Store, root: Location, manifest: Manifest) -> Location:
    """Commit a whole manifest held in memory (one commit of all its entries)."""
    return append(store, root, manifest.source, manifest.destination, manifest.files.values(),
                  extra=manifest.extra)


def compact(store: Store, root: Location) -> Location | None:
    """Fold the newest checkpoint and the commits on top of it into a new checkpoint, then delete
    what the checkpoint below the old one covered (one generation late: see the module's text)."""
    return _compact(store, record_home(store, root))


def _compact(store: Store, root: Location) -> Location | None:
    # The checkpoint's clock is when its listing began, not when it is named: of two checkpoints
    # of one seq, the one that listed later (and so saw every commit the other saw, or the
    # checkpoint that folded it) must be the newest. Named after its reading, a compaction that
    # listed before a commit landed could outrank one that folded that commit and deleted its
    # document, and hide it from every reader (tests/test_many_writers.py).
    listed_at = int(time.time() * 1000)
    state = _list_state(store, root)
    record = _open(store, root, state)
    if record is None:
        return None
    base_doc = record.sources[0].doc if record.sources and record.sources[0].doc.get("kind") == "checkpoint" else None
    commits = [n.name for n in state.names if n.kind == "c"]
    name = _Name.new("k", state.top_seq, listed_at)
    writer = _SegmentWriter(store, root, name.name)
    for entry in record.entries():
        writer.add(entry.to_dict())
    doc = _doc("checkpoint", name.seq, record.source, record.destination, writer, record.extra, [], commits)
    where = root.join(LOG + name.name)
    _put_json(store, where, _dumps(doc))
    # One generation late: what the old base covered, the checkpoints below it, a legacy
    # manifest the old base had folded already; each document's shards after it.
    if base_doc is not None:
        live = set(commits)
        gone = [c for c in base_doc.get("covers", []) if c in live] + [k.name for k in state.checkpoints[:-1]]
        for doc_name in gone:
            _delete_quietly(store, root.join(LOG + doc_name))
            for info in list(store.list(_folder(root, SEGMENTS + doc_name[:-len(".json")]))):
                _delete_quietly(store, info.location)
        if state.legacy or state.legacy_previous:
            for rel in (MANIFEST, PREVIOUS):
                _delete_quietly(store, root.join(rel))
            for info in list(store.list(_folder(root, LEGACY_SHARDS))):
                _delete_quietly(store, info.location)
    return where


def _delete_quietly(store: Store, loc: Location) -> None:
    try:
        store.delete(loc)
    except ObjectNotFound:
        pass


def remove(store: Store, root: Location) -> None:
    """Uncommit ``root``: every commit marker first (then nothing there looks complete), then the
    shards."""
    root = record_home(store, root)
    for info in list(store.list(_folder(root, LOG))):
        _delete_quietly(store, info.location)
    for rel in (MANIFEST, PREVIOUS):
        _delete_quietly(store, root.join(rel))
    for folder in (SEGMENTS, LEGACY_SHARDS):
        for info in list(store.list(_folder(root, folder))):
            _delete_quietly(store, info.location)


def entry_from_hash(path: str, h: FileHash, part_size: int = 0, parts: Iterable[str] = (),
                    committed: ObjectInfo | None = None) -> FileEntry:
    """The entry of a file whose bytes bridge hashed, with what the store answered at commit."""
    return FileEntry(path, h.size, h.crc32c, h.sha256, part_size, list(parts), **provenance(committed))


def provenance(committed: ObjectInfo | None) -> dict:
    """``reported`` and ``identity`` for an entry, from what the store said of the written object."""
    if committed is None:
        return {}
    return {"reported": dict(committed.checksums), "identity": dict(committed.identity)}


def committed_info(store: Store, loc: Location, h: FileHash) -> ObjectInfo:
    """What the store says of an object just completed from parts: its identity for the manifest.
    Asked right after the commit (whose checksum the store has checked): should the object already
    be another one, its size or the hashes in bridge's metadata differ from ours and the copy fails."""
    info = store.info(loc)
    if info.size != h.size or info.metadata.get("bridge_crc32c", h.crc32c) != h.crc32c \
            or info.metadata.get("bridge_sha256", h.sha256) != h.sha256:
        raise IntegrityError(f"{loc}: was changed right after its upload completed; run the copy again")
    return info
