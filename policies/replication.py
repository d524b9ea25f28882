"""Replication policies: DR copies of checkpoints written as rules, checked before anything runs.

    # policies.yaml
    policies:
      golden:
        source: s3://models/golden/
        destinations: [gs://dr-models/golden/, az://dr-models/golden/]
        checkpoints: "step-*"       # each matching folder under the source is one checkpoint
        keep_last: 2                # the newest by natural order: step-1000 comes after step-300
        include: ["*.safetensors", "*.json"]   # files inside a checkpoint (default: all), with the
        exclude: ["*.tmp"]                     # command line's --include/--exclude globs (rclone's)
        mode: mirror                # delete what the source lost and what keep_last drops
                                    # (default append-only: never delete at a destination)
        min_verified_copies: 2      # destinations that must prove the newest checkpoint (default: all)
        verify: store               # store | deep | none
        sha256: false               # also record each file's whole SHA-256 (cp --sha256)
        max_cost_usd: 5             # refuse a run estimated above this
        rpo: 30m                    # the newest committed checkpoint must be verified at each
                                    # destination within this (default: the alert's 4h)
        max_delete: 100             # mirror: a checkpoint's sync deleting more objects is refused
                                    # (default: refused past half of what is there; bridge/guards.py)
        schedule: {cron: "0 2 * * *"}
        ready: {marker: ".metadata", min_age: 10m}   # when a checkpoint counts as committed
        watch: {interval: 5s}       # replicate --watch: how often the source is listed
        placement:                  # per destination: storage class / tier and encryption
          az://dr-models/golden/: {storage_class: Cool, encryption_scope: dr}
          gs://dr-models/golden/: {storage_class: ARCHIVE, kms_key: projects/p/locations/l/keyRings/r/cryptoKeys/k}

Readiness (``assess``): a checkpoint enters the window only once committed, by evidence where
there is some: what its own files say (read by bridge/evidence.py, handed here as ``Evidence``)
checked against the listing. A PyTorch DCP ``.metadata`` names every storage file and the bytes
each must hold; a ``*.safetensors.index.json`` names every shard, and each safetensors file's
header its exact size (a lone ``model.safetensors`` too); Orbax's ``commit_success.txt`` counts
beside its checkpoint metadata, with every item ``_CHECKPOINT_METADATA`` names there (on a file
system, the rename into place: ``<step>.orbax-checkpoint-tmp-<n>`` folders are never
checkpoints); a record of bridge's (``_bridge/log/``) at the folder or at any folder above it
counts when it holds every file with the size and version listed. With ``ready.marker`` that
file must be there, and a layout that disagrees still holds the checkpoint back; where nothing
read confirms it, the marker is taken on trust and says so (``trusted``), as is a folder of no
known layout (committed as listed, unless its siblings were committed by a marker it lacks). On
a file system a file that moved within the quiet period is still being written, unless the
layout proved its length. ``ready.min_age`` adds a quiet period: no file newer than that.

What is decided here, as pure functions: which checkpoints a policy keeps (``window``), which
files of one it sends (``wants``), and what retention may remove (``removals``): an older
checkpoint leaves a destination only once ``keep_last`` newer ones are verified there and
committed by evidence (one taken on trust is no good copy), and only after the newest one is
verified at *every* destination, so one failing destination keeps every checkpoint everywhere.
bridge/replicator.py does the I/O.
A file with mistakes is refused whole, one line per mistake: ``FILE:LINE: FIELD: what is wrong``.
"""

from __future__ import annotations

import calendar
import fnmatch
import functools
import json
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from bridge.errors import BridgeError, InvalidOption
from bridge.filters import Filters
from bridge.urls import parse as parse_url
from bridge.policies.yamlcheck import compose, line_of, read

# The RPO of a policy that sets none: the one deploy/prometheus/alerts.yml falls back to.
DEFAULT_RPO = "4h"

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$")
_DIGITS = re.compile(r"(\d+)")


class PolicyError(InvalidOption):
    """A policy file that cannot be used; ``problems`` has one line per mistake."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


def natural_key(name: str) -> tuple:
    """Order names as people read numbers in them: step-300 < step-1000."""
    return tuple(int(part) if part.isdigit() else part for part in _DIGITS.split(name))


def _prefix_url(url: str) -> str:
    try:
        loc = parse_url(url)
    except BridgeError as exc:
        raise ValueError(str(exc)) from None
    return str(loc.as_prefix())


_CRON_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day-of-month", 1, 31), ("month", 1, 12),
                ("day-of-week", 0, 7))
_CRON_NAMES = {"month": ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"],
               "day-of-week": ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]}


def cron_problem(expr: str) -> str | None:
    """Why ``expr`` is not a five-field cron expression (minute hour day-of-month month
    day-of-week; *, N, A-B, lists, /STEP, month and day names), or None."""
    parts = expr.split()
    if len(parts) != 5:
        return f"cron {expr!r} has {len(parts)} fields; a cron expression has 5"
    for text, (name, low, high) in zip(parts, _CRON_FIELDS):
        names = _CRON_NAMES.get(name, [])

        def value(v: str) -> int:
            if v.lower() in names:
                return names.index(v.lower()) + (1 if name == "month" else 0)
            if not v.isdigit() or not low <= int(v) <= high:
                raise ValueError
            return int(v)

        for item in text.split(","):
            span, _, step = item.partition("/")
            try:
                if step and (not step.isdigit() or int(step) < 1):
                    raise ValueError
                if span != "*":
                    first, _, last = span.partition("-")
                    if last and value(first) > value(last):
                        raise ValueError
                    value(first)
            except ValueError:
                return f"cron {expr!r}: {name} {item!r} is not in {low}-{high}"
    return None


class Schedule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    cron: str | None = None
    every: str | None = None

    @model_validator(mode="after")
    def _one(self) -> Schedule:
        if (self.cron is None) == (self.every is None):
            raise ValueError("give exactly one of cron (e.g. \"0 2 * * *\") or every (e.g. 6h)")
        if self.cron is not None and cron_problem(self.cron):
            raise ValueError(cron_problem(self.cron))
        if self.every is not None and not re.fullmatch(r"\d+(\.\d+)?[smhd]", self.every.strip()):
            raise ValueError(f"every {self.every!r}: use a number and s, m, h or d, e.g. 6h")
        return self


_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(text: str) -> float:
    """``10m`` -> 600.0; ValueError naming the form otherwise."""
    found = _DURATION.fullmatch(str(text).strip())
    if not found:
        raise ValueError(f"{text!r}: use a number and s, m, h or d, e.g. 10m")
    return float(found.group(1)) * _UNIT_S[found.group(2)]


class Ready(BaseModel):
    """When a checkpoint counts as committed (see ``assess``)."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    marker: str | None = None     # a file inside the checkpoint its writer writes last
    min_age: str | None = None    # no file of the checkpoint newer than this

    @field_validator("marker")
    @classmethod
    def _marker(cls, marker: str | None) -> str | None:
        if marker is None:
            return None
        parts = marker.split("/")
        if not marker or marker.startswith("/") or any(p in ("", ".", "..") for p in parts) or \
                any(c in marker for c in "*?["):
            raise ValueError(f"marker {marker!r}: a file's path inside the checkpoint (no '/' first, "
                             f"no '..', no wildcards), e.g. .metadata")
        return marker

    @field_validator("min_age")
    @classmethod
    def _min_age(cls, text: str | None) -> str | None:
        if text is not None:
            try:
                seconds(text)
            except ValueError as exc:
                raise ValueError(f"min_age {exc}") from None
        return text

    @property
    def min_age_s(self) -> float:
        return seconds(self.min_age) if self.min_age else 0.0


class Watch(BaseModel):
    """``replicate --watch``: how often the source's checkpoints are listed for new commits."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    interval: str = "30s"

    @field_validator("interval")
    @classmethod
    def _interval(cls, text: str) -> str:
        try:
            value = seconds(text)
        except ValueError as exc:
            raise ValueError(f"interval {exc}") from None
        if value < 1:
            raise ValueError(f"interval {text!r} is under 1s")
        return text

    @property
    def interval_s(self) -> float:
        return seconds(self.interval)


class Placement(BaseModel):
    """How one destination stores what it receives: its storage class (S3, GCS) or access tier
    (Azure), and encryption (S3 SSE-KMS key and bucket key, GCS CMEK key, Azure encryption scope)."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    storage_class: str | None = None
    kms_key: str | None = None
    bucket_key: bool | None = None
    encryption_scope: str | None = None


class Policy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str
    destinations: list[str] = Field(min_length=1)
    placement: dict[str, Placement] = {}   # destination URL -> its class and encryption
    checkpoints: str = "*"
    keep_last: int | None = Field(None, ge=1)
    include: list[str] = []
    exclude: list[str] = []
    # Deleting at a destination is asked for, never a default (as sync --delete): mirror removes
    # what the source no longer has and checkpoints retention drops; append-only removes nothing.
    mode: Literal["mirror", "append-only"] = "append-only"
    min_verified_copies: int | None = Field(None, ge=1)
    verify: Literal["store", "deep", "none"] = "store"
    sha256: bool = False   # the plain whole-file SHA-256 too (transfer.sha256, README "Digests")
    max_cost_usd: float | None = Field(None, ge=0)
    # Recovery point objective: how long the newest committed checkpoint may wait to be verified
    # at a destination (policy status, the status page and the alert rules read it).
    rpo: str | None = None
    # mode mirror: the most objects one checkpoint's sync may delete (bridge/guards.py, as sync
    # --max-delete); without it, one deleting more than half of what is there is refused.
    max_delete: int | None = Field(None, ge=0)
    schedule: Schedule | None = None
    ready: Ready = Ready()
    watch: Watch = Watch()

    @field_validator("source")
    @classmethod
    def _source(cls, url: str) -> str:
        return _prefix_url(url)

    @field_validator("destinations")
    @classmethod
    def _destinations(cls, urls: list[str]) -> list[str]:
        out = [_prefix_url(u) for u in urls]
        if len(set(out)) != len(out):
            raise ValueError("a destination is listed twice")
        return out

    @field_validator("include", "exclude")
    @classmethod
    def _globs(cls, globs: list[str], info) -> list[str]:
        for glob in globs:
            try:
                Filters(**{info.field_name: (glob,)})
            except InvalidOption as exc:
                raise ValueError(str(exc).replace("--include ", "").replace("--exclude ", "")) from None
        return globs

    @field_validator("rpo")
    @classmethod
    def _rpo(cls, text: str | None) -> str | None:
        if text is not None:
            try:
                value = seconds(text)
            except ValueError as exc:
                raise ValueError(f"rpo {exc}") from None
            if value <= 0:
                raise ValueError(f"rpo {text!r} is no time at all; give e.g. 30m or 4h")
        return text

    @property
    def rpo_s(self) -> float | None:
        return seconds(self.rpo) if self.rpo else None

    @field_validator("checkpoints")
    @classmethod
    def _pattern(cls, pattern: str) -> str:
        if not pattern or "/" in pattern:
            raise ValueError("a pattern for folder names directly under the source, without '/'")
        return pattern

    @model_validator(mode="after")
    def _consistent(self) -> Policy:
        """Every mistake between fields at once, each as 'FIELD:: what is wrong' on a line of its
        own (``parse`` names each by the line of that field)."""
        problems = [f"destinations:: destination {dst} overlaps the source {self.source}"
                    for dst in self.destinations if dst.startswith(self.source) or self.source.startswith(dst)]
        if self.min_verified_copies is not None and self.min_verified_copies > len(self.destinations):
            problems.append(f"min_verified_copies:: min_verified_copies {self.min_verified_copies} is more than the "
                            f"{len(self.destinations)} destinations")
        unknown = [url for url in self.placement if _prefix_url(url) not in self.destinations]
        if unknown:
            problems.append(f"placement:: placement names {unknown[0]}, which is not one of the destinations")
        from bridge.attributes import with_objects
        from bridge.config import Settings
        for url, placed in self.placement.items():
            try:
                with_objects(Settings(), url, **placed.model_dump(exclude_none=True))
            except InvalidOption as exc:
                problems.append(f"placement:: placement of {url}: {str(exc).replace('--', '')}")
        if self.mode == "mirror" and self.verify == "none":
            problems.append("verify:: mode mirror removes old checkpoints only once the newest is proven: "
                            "verify must be store or deep (or use mode append-only)")
        if self.max_delete is not None and self.mode != "mirror":
            problems.append("max_delete:: max_delete limits what mode mirror deletes; mode append-only deletes "
                            "nothing (set mode: mirror, or leave max_delete out)")
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def placement_of(self, url: str) -> dict[str, Any]:
        """The placement of the destination ``url`` is under (a checkpoint's URL included)."""
        for dst, placed in self.placement.items():
            if url.startswith(_prefix_url(dst)):
                return placed.model_dump(exclude_none=True)
        return {}

    @property
    def copies_needed(self) -> int:
        return self.min_verified_copies or len(self.destinations)


def rpo_state(policy: Policy, lag_checkpoints: int | None, committed_at: float | None,
              now: float) -> dict[str, Any]:
    """Whether one destination is within the policy's RPO (its ``rpo``, else ``DEFAULT_RPO``), as
    the alert rule decides it: past it when the source's newest committed checkpoint is not
    verified there (``lag_checkpoints`` > 0) and was committed (``committed_at``) longer ago than
    the RPO. ``within`` is None when that is not known (the source not listed)."""
    rpo = policy.rpo or DEFAULT_RPO
    out: dict[str, Any] = {"rpo": rpo, "rpo_s": seconds(rpo), "rpo_default": policy.rpo is None, "within": None}
    if lag_checkpoints == 0:
        out["within"] = True
    elif lag_checkpoints is not None and committed_at is not None:
        out["within"] = now - committed_at <= out["rpo_s"]
    return out


def rpo_words(state: Mapping[str, Any]) -> str:
    """``within RPO``, ``past its RPO of 30m`` (``past the default RPO of 4h``), or not known."""
    whose = "the default" if state["rpo_default"] else "its"
    if state["within"] is None:
        return f"RPO {state['rpo']}: not known"
    return "within RPO" if state["within"] else f"past {whose} RPO of {state['rpo']}"


@dataclass(frozen=True)
class NamedPolicy:
    name: str
    policy: Policy
    line: int


def parse(text: str, filename: str = "policies.yaml") -> list[NamedPolicy]:
    """Every policy in ``text``, or PolicyError naming the line and field of each mistake."""
    try:
        root, doc = compose(text, filename)
    except ValueError as exc:
        raise PolicyError([str(exc)]) from None
    problems: list[str] = []
    if not isinstance(doc, dict) or not isinstance(doc.get("policies"), dict):
        raise PolicyError([f"{filename}:{line_of(root, ('policies',)) or 1}: policies: expected a mapping of "
                           f"policy names to policies"])
    for key in (k for k, _ in root.value):
        if key.value != "policies":
            problems.append(f"{filename}:{key.start_mark.line + 1}: {key.value}: unknown top-level field "
                            f"(only 'policies')")
    out = []
    for name, body in doc["policies"].items():
        where = f"policies.{name}"
        line = line_of(root, ("policies", name), keys=True) or 1
        if not isinstance(name, str) or not _NAME_RE.match(name):
            problems.append(f"{filename}:{line}: {where}: a policy name uses letters, digits, '_', '.', '-'")
            continue
        if not isinstance(body, dict):
            problems.append(f"{filename}:{line}: {where}: expected a mapping with source and destinations")
            continue
        try:
            out.append(NamedPolicy(name, Policy.model_validate(body), line))
        except ValidationError as exc:
            for err in exc.errors():
                loc = tuple(err["loc"])
                unknown = err["type"] == "extra_forbidden"
                at = (line_of(root, ("policies", name, *loc), keys=unknown) if loc else line) or line
                field = ".".join([where, *map(str, loc)])
                message = "unknown field" if unknown else err["msg"].removeprefix("Value error, ")
                for one in message.splitlines():
                    named, sep, text = one.partition(":: ")
                    if sep and not loc:   # a mistake between fields, named by one of them
                        # the line of the policy, as before, when the field is only a default
                        given = named in body
                        problems.append(f"{filename}:{line_of(root, ('policies', name, named)) if given else line}: "
                                        f"{field}.{named}: {text}" if given else f"{filename}:{line}: {field}: {text}")
                    else:
                        problems.append(f"{filename}:{at}: {field}: {one}")
    if problems:
        raise PolicyError(problems)
    return out


def load(path) -> list[NamedPolicy]:
    """The policies of a file, or PolicyError (one line per mistake)."""
    try:
        text = read(path, "policy file")
    except ValueError as exc:
        raise PolicyError([str(exc)]) from None
    return parse(text, str(path))


def select(policies: list[NamedPolicy], name: str | None) -> list[NamedPolicy]:
    if name is None:
        return policies
    chosen = [p for p in policies if p.name == name]
    if not chosen:
        raise InvalidOption(f"no policy named {name!r}; the file has {', '.join(p.name for p in policies) or 'none'}")
    return chosen


# -- decisions ------------------------------------------------------------------------------

def temporary(name: str) -> bool:
    """A folder a writer has not committed by its name: Orbax writes ``<step>.orbax-checkpoint-tmp-<n>``
    and renames it into place; never a checkpoint, whatever the pattern."""
    return _TEMPORARY.search(name) is not None


_TEMPORARY = re.compile(r"\.orbax-checkpoint-tmp-\d+$")


def checkpoints(policy: Policy, folders: Iterable[str]) -> list[str]:
    """The checkpoint folders among ``folders``, oldest first by natural order."""
    return sorted({f for f in folders if fnmatch.fnmatchcase(f, policy.checkpoints) and not temporary(f)},
                  key=natural_key)


# -- readiness ------------------------------------------------------------------------------

@dataclass(frozen=True)
class SourceFile:
    """What a listing says of one file of a checkpoint: its size and when it was last written
    (seconds since the epoch; None when the store does not say)."""
    size: int
    modified: float | None = None


@dataclass(frozen=True)
class Readiness:
    committed: bool
    why: str                        # how it is known to be committed, or what it waits for
    committed_at: float | None = None   # its newest file's time (the marker's where the others have none)
    marker: str | None = None       # the file that committed it, when one did
    trusted: bool = False           # committed on a name's word alone: nothing read confirms it


@dataclass(frozen=True)
class Evidence:
    """What bridge/evidence.py read of one checkpoint's own files, each by its path inside it:
    the facts ``assess`` checks against the listing. A ``str`` in place of a fact says why the
    fact could not be had (a file cut short, not of its format)."""
    indexes: Mapping[str, str] = field(default_factory=dict)      # a safetensors index's text
    # the exact size a safetensors file's header declares; None: its head is no safetensors header
    safetensors: Mapping[str, int | str | None] = field(default_factory=dict)
    # .metadata: each storage file it names -> the bytes it must hold; None: not read, or no pickle
    dcp: Mapping[str, int] | str | None = None
    orbax_items: tuple[str, ...] | str | None = None   # the items _CHECKPOINT_METADATA names
    recorded: Mapping[str, str] = field(default_factory=dict)   # file -> the bridge record holding this version
    unsettled: Mapping[str, str] = field(default_factory=dict)  # POSIX: file -> how it moved in the quiet period


NO_EVIDENCE = Evidence()
DCP_METADATA = ".metadata"
ORBAX_COMMIT = "commit_success.txt"
ORBAX_METADATA = "_CHECKPOINT_METADATA"
BRIDGE_MANIFEST = "_bridge/manifest.json"   # a record of bridge before its commit log
BRIDGE_LOG = "_bridge/log/"                  # a commit of bridge's: c-<seq>-<ms>-<rand>.json
_ORBAX_SIGNS = (ORBAX_METADATA, "_METADATA", "manifest.ocdbt")
_SHARD_OF = re.compile(r"-\d+-of-\d+\.safetensors$")


def modified_at(identity: Mapping[str, str]) -> float | None:
    """When a store's identity of an object says it was written: S3's and Azure's last-modified,
    a local file's mtime, a GCS generation (microseconds since the epoch)."""
    if identity.get("last_modified"):
        return float(calendar.timegm(time.strptime(identity["last_modified"], "%Y-%m-%dT%H:%M:%SZ")))
    if identity.get("mtime_ns", "").isdigit():
        return int(identity["mtime_ns"]) / 1e9
    generation = identity.get("generation", "")
    if generation.isdigit() and int(generation) > 10 ** 15:
        return int(generation) / 1e6
    return None


def index_files(files: Iterable[str]) -> list[str]:
    """The safetensors indexes among a checkpoint's files: ``assess`` needs their text."""
    return sorted(f for f in files if f.endswith(".safetensors.index.json"))


def _few(names: Iterable[str], limit: int = 3) -> str:
    names = sorted(names, key=natural_key)
    return ", ".join(names[:limit]) + (" ..." if len(names) > limit else "")


def _data(files: Iterable[str]) -> list[str]:
    """A checkpoint's own files: not bridge's record of it."""
    return [f for f in files if not (f.startswith("_bridge/") or "/_bridge/" in f)]


def _short(rel: str, size: int, declared: int | str | None) -> str | None:
    """Why a safetensors file is not whole by its own header, or None when it is."""
    if declared is None:
        return f"{rel} (no safetensors header)"
    if isinstance(declared, str):
        return f"{rel} ({declared})"
    if size != declared:
        return f"{rel} ({size} bytes of the {declared} its header declares)"
    return None


def _safetensors(files: Mapping[str, SourceFile], ev: Evidence) -> Readiness | None:
    """Sharded safetensors: every shard its index names there, each exactly as long as its own
    header says; a lone ``*.safetensors`` (no index) too."""
    found = index_files(files)
    lone = [f for f in files if f.endswith(".safetensors") and not _SHARD_OF.search(f)
            and (f not in ev.safetensors or ev.safetensors[f] is not None)]   # else: only its name says so
    named: set[str] = set(lone)
    what = "safetensors"
    if not found:
        shards = [f for f in files if _SHARD_OF.search(f)]
        if shards:
            return Readiness(False, f"{len(shards)} safetensors shards and no *.safetensors.index.json yet")
        if not lone:
            return None
    for rel in found:
        folder = rel.rpartition("/")[0]
        try:
            weight_map = json.loads(ev.indexes[rel])["weight_map"]
            named |= {f"{folder}/{s}" if folder else s for s in weight_map.values()}
        except (KeyError, TypeError, ValueError, AttributeError):
            return Readiness(False, f"{rel} is not a safetensors index (no weight_map) yet")
        what = rel
    missing = set(named) - set(files)
    if missing:
        return Readiness(False, f"{what} names {len(named)} shards, {len(missing)} not there yet: {_few(missing)}")
    short = [why for f in sorted(named, key=natural_key) if (why := _short(f, files[f].size, ev.safetensors.get(f)))]
    if short:
        return Readiness(False, f"{what}: not whole yet by its header: {'; '.join(short[:3])}"
                                f"{' ...' if len(short) > 3 else ''}")
    if found:
        return Readiness(True, f"{what}: all {len(named)} shards present, each as long as its header declares",
                         marker=what)
    return Readiness(True, f"{_few(named)}: as long as its header declares")


def _dcp(files: Mapping[str, SourceFile], ev: Evidence) -> Readiness | None:
    """PyTorch DCP: its ``.metadata`` read, every storage file it names there and long enough."""
    if DCP_METADATA not in files:
        if any(f.endswith(".distcp") for f in files):
            return Readiness(False, f"PyTorch DCP shards without {DCP_METADATA} yet")
        return None
    if isinstance(ev.dcp, str):
        return Readiness(False, f"{DCP_METADATA} {ev.dcp}")
    if ev.dcp is None:
        return Readiness(True, f"{DCP_METADATA} present, not read as a DCP pickle (taken on trust)",
                         marker=DCP_METADATA, trusted=True)
    missing = [p for p in ev.dcp if p not in files]
    if missing:
        return Readiness(False, f"{DCP_METADATA} names {len(ev.dcp)} storage files, {len(missing)} not there yet: "
                                f"{_few(missing)}")
    short = [f"{p} ({files[p].size} of {n} bytes)" for p, n in ev.dcp.items() if files[p].size < n]
    if short:
        return Readiness(False, f"{DCP_METADATA} needs more bytes than are there: {'; '.join(sorted(short)[:3])}")
    return Readiness(True, f"PyTorch DCP {DCP_METADATA}: all {len(ev.dcp)} storage files present and long enough",
                     marker=DCP_METADATA)


def _orbax(files: Mapping[str, SourceFile], ev: Evidence, atomic_rename: bool) -> Readiness | None:
    """Orbax: ``commit_success.txt`` beside its checkpoint metadata (object stores) or the folder
    renamed into place (file systems), and every item ``_CHECKPOINT_METADATA`` names there."""
    signs = any(f.rsplit("/", 1)[-1] in _ORBAX_SIGNS for f in files)
    if ORBAX_COMMIT not in files and not signs:
        return None
    if not signs:
        return Readiness(False, f"{ORBAX_COMMIT} with no Orbax checkpoint metadata beside it "
                                f"({', '.join(_ORBAX_SIGNS)}) yet")
    if isinstance(ev.orbax_items, str):
        return Readiness(False, f"{ORBAX_METADATA} {ev.orbax_items}")
    absent = [i for i in ev.orbax_items or () if not any(f.startswith(f"{i}/") for f in files)]
    if absent:
        return Readiness(False, f"{ORBAX_METADATA} names items not there yet: {_few(absent)}")
    if ORBAX_COMMIT in files:
        return Readiness(True, f"Orbax {ORBAX_COMMIT} beside its checkpoint metadata", marker=ORBAX_COMMIT)
    if atomic_rename:
        return Readiness(True, "Orbax checkpoint renamed into place")
    return Readiness(False, f"Orbax checkpoint without {ORBAX_COMMIT} yet")


def _records(files: Mapping[str, SourceFile], ev: Evidence) -> Readiness | None:
    """bridge's own records, at the folder or any folder above it: each of the checkpoint's
    files held by one, with the size and version listed now."""
    data = _data(files)
    held = [f for f in data if f in ev.recorded]
    if not held:
        return None
    where = ", ".join(sorted(set(ev.recorded.values())))
    if len(held) < len(data):
        return Readiness(False, f"bridge commit at {where} holds {len(held)} of its {len(data)} files; not: "
                                f"{_few(set(data) - set(held))}")
    return Readiness(True, f"bridge commit at {where} holds all {len(data)} files as listed", marker=BRIDGE_LOG)


def _layout(files: Mapping[str, SourceFile], ev: Evidence, atomic_rename: bool) -> Readiness | None:
    """What the checkpoint's own files say of it; None when no layout known here is there.
    A record of bridge's that holds every file wins; one that holds only some is said when no
    framework's layout is there either."""
    by_record = _records(files, ev)
    if by_record is not None and by_record.committed:
        return by_record
    for read in (lambda: _safetensors(files, ev), lambda: _dcp(files, ev),
                 lambda: _orbax(files, ev, atomic_rename)):
        verdict = read()
        if verdict is not None:
            return verdict
    if by_record is not None:
        return by_record
    if any(f.startswith(BRIDGE_LOG) for f in files):   # its own record, holding none of it as listed now
        return Readiness(False, f"its bridge commit ({BRIDGE_LOG}) holds none of its {len(_data(files))} files "
                                f"as listed", marker=BRIDGE_LOG)
    if BRIDGE_MANIFEST in files:
        return Readiness(True, f"bridge manifest {BRIDGE_MANIFEST} present (taken on trust: its entries were not "
                               f"read)", marker=BRIDGE_MANIFEST, trusted=True)
    return None


def _with_marker(marker: str, files: Mapping[str, SourceFile], layout: Readiness | None) -> Readiness:
    """A policy's marker must be there; what the layout says may still hold the checkpoint back,
    and where no layout says anything the marker is taken on trust."""
    if marker not in files:
        return Readiness(False, f"no {marker} yet")
    if layout is None or layout.trusted:
        return Readiness(True, f"{marker} present (taken on trust: no layout read here confirms it)",
                         marker=marker, trusted=True)
    if not layout.committed:
        return Readiness(False, f"{marker} present, but {layout.why}")
    return Readiness(True, f"{marker} present; {layout.why}", marker=marker)


def _settled(verdict: Readiness, files: Mapping[str, SourceFile], ev: Evidence) -> Readiness:
    """On a file system a name can be a file still being written: a file that moved within the
    quiet period holds the checkpoint back unless the layout proved its length (DCP's
    storage files, safetensors' headers, a bridge record)."""
    proven = set(ev.recorded) | {f for f, n in ev.safetensors.items() if isinstance(n, int)
                                 and f in files and files[f].size == n}
    if isinstance(ev.dcp, Mapping):   # a whole pickle, and every storage file as long as it says
        proven |= {DCP_METADATA} | {f for f, n in ev.dcp.items() if f in files and files[f].size >= n}
    moving = {f: how for f, how in ev.unsettled.items() if f not in proven}
    if not verdict.committed or not moving:
        return verdict
    return Readiness(False, f"still being written: {'; '.join(f'{f} ({h})' for f, h in sorted(moving.items())[:3])}")


def assess(policy: Policy, listing: Mapping[str, Mapping[str, SourceFile]], now: float, *,
           atomic_rename: bool = False, evidence: Mapping[str, Evidence] | None = None) -> dict[str, Readiness]:
    """Whether each checkpoint of ``listing`` (folder -> its files by path inside it) is committed,
    and why. ``atomic_rename``: the source is a file system, where a folder renamed into place is
    complete; ``evidence``: what bridge/evidence.py read of each checkpoint's files (none read:
    names alone decide, and say so). A folder of no known layout is committed as listed, on
    trust, unless sibling checkpoints were committed by a marker it lacks."""
    ready, evidence = policy.ready, evidence or {}
    out: dict[str, Readiness | None] = {}
    for name in checkpoints(policy, listing):
        files, ev = listing[name], evidence.get(name, NO_EVIDENCE)
        layout = _layout(files, ev, atomic_rename)
        out[name] = _with_marker(ready.marker, files, layout) if ready.marker is not None else layout
    markers = {BRIDGE_LOG if v.marker.startswith(BRIDGE_LOG) else v.marker
               for v in out.values() if v and v.committed and v.marker}
    for name, verdict in out.items():
        if verdict is None:
            lacking = sorted(markers, key=natural_key)
            out[name] = Readiness(False, f"no {' or '.join(lacking)} yet, which its siblings have") if lacking \
                else Readiness(True, "no commit marker known for its layout: committed as listed (taken on trust)",
                               trusted=True)
    for name, verdict in out.items():
        files = listing[name]
        verdict = _settled(verdict, files, evidence.get(name, NO_EVIDENCE))
        times = [f.modified for f in files.values()]
        newest = max(times) if times and None not in times else None
        # Committed when its newest file landed: a marker written before its shards (a safetensors
        # index first) does not date the commit, and commit-to-verified is measured from this.
        marked = files[verdict.marker].modified if verdict.marker in files else None
        at = max((t for t in (newest, marked) if t is not None), default=None) if verdict.committed else None
        verdict = replace(verdict, committed_at=at)
        if verdict.committed and ready.min_age:
            if newest is None:
                verdict = Readiness(False, f"min_age {ready.min_age}: the store does not say when its files "
                                           f"were written")
            elif now - newest < ready.min_age_s:
                verdict = Readiness(False, f"quiet for {max(0.0, now - newest):.0f}s of min_age {ready.min_age}")
            else:
                verdict = replace(verdict, committed_at=max(newest + ready.min_age_s, at or newest))
        out[name] = verdict
    return out


def trusted(readiness: Mapping[str, Readiness]) -> dict[str, str]:
    """The committed checkpoints whose commit is taken on a name's word, each with that word:
    replicated, but never counted by retention as a good copy."""
    return {n: r.why for n, r in sorted(readiness.items(), key=lambda i: natural_key(i[0]))
            if r.committed and r.trusted}


def committed(readiness: Mapping[str, Readiness]) -> list[str]:
    """The committed checkpoints, oldest first: the window is taken among these only."""
    return sorted((n for n, r in readiness.items() if r.committed), key=natural_key)


def waiting(readiness: Mapping[str, Readiness]) -> dict[str, str]:
    """The checkpoints not committed yet, each with what it waits for."""
    return {n: r.why for n, r in sorted(readiness.items(), key=lambda i: natural_key(i[0])) if not r.committed}


def window(policy: Policy, folders: Iterable[str]) -> list[str]:
    """The checkpoints the policy keeps at its destinations: the newest ``keep_last``."""
    found = checkpoints(policy, folders)
    return found[-policy.keep_last:] if policy.keep_last else found


@functools.lru_cache(maxsize=256)
def _rules(include: tuple[str, ...], exclude: tuple[str, ...]) -> Filters:
    return Filters(include, exclude)


def selected(include: Iterable[str], exclude: Iterable[str], rel: str) -> bool:
    """Whether ``rel`` (a path inside a checkpoint) passes the patterns, read as the command
    line's ``--include``/``--exclude`` read them (bridge/filters.py, rclone's semantics): a
    policy and ``mcbridge cp --include ... --exclude ...`` select the same files. Every include
    is tried first, then every exclude, then (when any include was given) the rest is left out;
    ``*`` stays within a folder, ``**`` crosses folders, a glob without a leading ``/`` matches
    at any depth, with one at the checkpoint's root."""
    return _rules(tuple(include), tuple(exclude)).selects_name(rel)


def wants(policy: Policy, rel: str) -> bool:
    """Whether a file (its path inside a checkpoint) is replicated."""
    return selected(policy.include, policy.exclude, rel)


def removals(policy: Policy, kept: list[str], present: Mapping[str, Iterable[str]],
             verified: Mapping[str, Mapping[str, bool]],
             readiness: Mapping[str, Readiness] | None = None) -> dict[str, list[str]]:
    """Checkpoints retention removes, per destination: those present there, outside the window
    and older than its newest, each only once ``keep_last`` (at least one) newer checkpoints are
    verified at that destination and committed by evidence at the source (``readiness``: one
    taken on trust, or no longer at the source, is no good copy), and only when the newest is
    verified at *every* destination. Nothing at all otherwise, and never in append-only mode."""
    if policy.mode == "append-only" or not kept:
        return {}
    newest = kept[-1]
    if not all(verified.get(dst, {}).get(newest) for dst in policy.destinations):
        return {}

    def good(ckpt: str, dst: str) -> bool:
        proven = readiness is None or (ckpt in readiness and readiness[ckpt].committed
                                       and not readiness[ckpt].trusted)
        return bool(verified.get(dst, {}).get(ckpt)) and proven

    out = {}
    for dst in policy.destinations:
        copies = [c for c in kept if good(c, dst)]
        old = [c for c in checkpoints(policy, present.get(dst, ()))
               if c not in kept and natural_key(c) < natural_key(newest)
               and sum(1 for g in copies if natural_key(g) > natural_key(c)) >= (policy.keep_last or 1)]
        if old:
            out[dst] = old
    return out


def held_back(policy: Policy, kept: list[str], readiness: Mapping[str, Readiness]) -> dict[str, str]:
    """Checkpoints of the window retention does not count as good copies, with why."""
    if policy.mode == "append-only":
        return {}
    return {c: f"committed on trust only ({readiness[c].why})" for c in kept
            if c in readiness and readiness[c].trusted}


def lag(policy: Policy, source_folders: Iterable[str], verified: Iterable[str]) -> dict[str, object]:
    """How far one destination is behind: the newest checkpoint at the source, the newest one
    verified at the destination, and how many source checkpoints are newer than that (all of
    them when none was ever verified)."""
    found = checkpoints(policy, source_folders)
    proven = checkpoints(policy, verified)
    newest_verified = proven[-1] if proven else None
    behind = [c for c in found if newest_verified is None or natural_key(c) > natural_key(newest_verified)]
    return {"newest_source": found[-1] if found else None, "newest_verified": newest_verified,
            "lag_checkpoints": len(behind)}


def outcome(policy: Policy, kept: list[str], verified: Mapping[str, Mapping[str, bool]]) -> tuple[int, bool]:
    """(destinations holding the newest kept checkpoint proven, whether that is enough)."""
    if not kept:
        return 0, False
    copies = sum(1 for dst in policy.destinations if verified.get(dst, {}).get(kept[-1]))
    return copies, copies >= policy.copies_needed
