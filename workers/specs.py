"""What a job asks for, checked before anything is queued.

A spec is plain data (it is stored in the job record and travels in task arguments): URLs,
options and the name of a settings profile, never a credential. ``JobSpec`` is shared by
``mcbridge submit`` and the schedules file, so both refuse the same mistakes with the same words.

It is a plain class checked field by field, as the settings are (``bridge.config``): it was a
pydantic model, and importing pydantic and building the model's schema came before anything a
``mcbridge submit`` could queue (a submit took 0.55-0.61 s with it and 0.37-0.45 s without, on
two cores). Values are coerced as the settings' are ("5" -> 5 for a number, "yes" -> True),
unknown fields are refused, and every mistake is one ``Problem``: which field (none: the spec
as a whole) and what.
"""

from __future__ import annotations

import copy
import re
import reprlib
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from bridge.config import _bool, _int, _str, parse_size
from bridge.errors import BridgeError, InvalidOption
from bridge.urls import Location, parse

KINDS = ("copy", "sync", "replicate", "pack", "unpack", "migrate")
# A kind named for the command that queued it, and the kind whose work it is: ``submit migrate
# --pack`` is listed as a migrate job and runs, is checked and is priced as a pack.
RUNS_AS = {"migrate": "pack"}


def runs_as(kind: str) -> str:
    """The kind whose plan, checks and price a job of ``kind`` has."""
    return RUNS_AS.get(kind, kind)
PACK_FIELDS = ("shard_format", "shard_size", "max_count", "shard_prefix", "row_group_size")
VERIFY = ("store", "deep", "none")
_REQUIRED: Any = object()


class Problem(NamedTuple):
    loc: tuple[Any, ...]   # (the field,); () for the whole spec
    message: str
    unknown: bool = False  # a field the spec does not have (its line is that of the key)

    def line(self) -> str:
        where = ".".join(str(p) for p in self.loc)
        return f"{where}: {self.message}" if where else self.message


class SpecError(InvalidOption):
    """A spec that cannot be run: ``problems``, each mistake once (unknown fields first, then
    the fields' own in their order, then a whole spec's incoherence)."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__(f"invalid job: {problems[0].line()}")


def _location(url: str) -> Location:
    try:
        return parse(url)
    except BridgeError as exc:
        raise ValueError(str(exc)) from None


def _choice(*allowed: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if isinstance(value, str) and value in allowed:
            return value
        raise ValueError(f"must be one of {', '.join(repr(a) for a in allowed)}, not {reprlib.repr(value)}")
    return check


def _text(pattern: str | None = None) -> Callable[[Any], str]:
    rule = re.compile(pattern) if pattern else None

    def check(value: Any) -> str:
        value = _str(value, "")
        if rule is not None and not rule.match(value):
            raise ValueError(f"{value!r} does not match {rule.pattern}")
        return value
    return check


def _whole(low: int | None = None, high: int | None = None) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        value = _int(value, "")
        if low is not None and value < low:
            raise ValueError(f"must be at least {low}")
        if high is not None and value > high:
            raise ValueError(f"must be at most {high}")
        return value
    return check


def _flag(value: Any) -> bool:
    return _bool(value, "")


def _size(value: Any) -> int:
    try:
        return _int(parse_size(value), "")
    except BridgeError as exc:
        raise ValueError(str(exc)) from None


def _rate(value: Any) -> int | None:
    from bridge.config import parse_rate
    try:
        return parse_rate(value)
    except BridgeError as exc:
        raise ValueError(str(exc)) from None


def _source(value: Any) -> str:
    return str(_location(_str(value, "")))


def _destinations(value: Any) -> list[str]:
    if not isinstance(value, (list, tuple)):
        raise ValueError("must be a list")
    if not value:
        raise ValueError("must name at least one destination")
    out = [str(_location(_str(url, ""))) for url in value]
    if len(set(out)) != len(out):
        raise ValueError("a destination is listed twice")
    return out


def _patterns(value: Any) -> list[str]:
    if not isinstance(value, (list, tuple)):
        raise ValueError("must be a list")
    return [_str(v, "") for v in value]


def _placement(value: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(value, Mapping) or not all(isinstance(v, Mapping) for v in value.values()):
        raise ValueError("must map each destination to its settings")
    return {_str(k, ""): dict(v) for k, v in value.items()}


def _objects(value: Any) -> dict[str, Any] | None:
    """The ``objects`` settings section's fields (bridge.config ObjectSettings), checked as a
    profile's are."""
    from bridge.config import ObjectSettings
    if not isinstance(value, Mapping):
        raise ValueError("must be a mapping")
    if not value:
        return None
    try:
        ObjectSettings(**value)
    except BridgeError as exc:   # one line per field that is wrong: the first
        raise ValueError(str(exc).splitlines()[0].replace("invalid setting ", "", 1)) from None
    return copy.deepcopy(dict(value))


def _filters(value: Any) -> dict[str, Any] | None:
    from bridge.filters import Filters
    if not isinstance(value, Mapping):
        raise ValueError("must be a mapping")
    if not value:
        return None
    try:
        return Filters.from_dict(dict(value)).to_dict()
    except BridgeError as exc:
        raise ValueError(str(exc)) from None


# name -> (default, check of a value that is not None); in the order problems are reported
FIELDS: dict[str, tuple[Any, Callable[[Any], Any]]] = {
    "kind": (_REQUIRED, _choice(*KINDS)),
    "source": (_REQUIRED, _source),
    "destinations": (_REQUIRED, _destinations),
    "delete": (None, _flag),           # sync and replicate: deleting at a destination is asked for, never a default
    # with delete: bridge/guards.py's limits, checked by the worker before anything is deleted
    # (--max-delete N; --force lifts the rule that refuses deleting over half of a destination)
    "max_delete": (None, _whole(0)),
    "force_delete": (None, _flag),
    "chunk_size": (None, _size),
    "concurrency": (None, _whole(1, 256)),
    "profile": (None, _text(r"^[A-Za-z0-9_.\-]+$")),
    "queue": (None, _text(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")),
    "verify": ("store", _choice(*VERIFY)),
    "store_checksums": (None, _choice("require", "readback", "skip")),
    "route": (None, _text(r"^[a-z][a-z\-]*$")),   # copy and sync: bridge/routes; None: chosen
    "bwlimit": (None, _rate),           # bytes/s across the job's workers; `jobs limit` changes it
    # where the records of local destinations are kept (--manifest-dir; bridge.manifest.record_root)
    "manifest_dir": (None, _text(r"^/")),
    # destination URL -> its storage class / tier and encryption (a replication policy's placement)
    "placement": (None, _placement),
    # copy and sync: headers and metadata written (cp's --content-type, --metadata, --no-metadata)
    "objects": (None, _objects),
    # copy and sync: objects already at the destination without a record (cp --skip-existing,
    # sync --adopt; None: copy sends everything, sync adopts by checksum)
    "adopt": (None, _choice("checksum", "deep", "off")),
    # also each file's plain whole-file SHA-256 (--sha256)
    "sha256": (None, _flag),
    # sync and replicate: only the files matching one of include (default all) and none of exclude
    # (a replication policy's patterns, policies/replication.py)
    "include": (None, _patterns),
    "exclude": (None, _patterns),
    # copy, sync, replicate, pack: the command line's filters (bridge/filters.py Filters.to_dict)
    "filters": (None, _filters),
    # pack only: the shard set (bridge/packing)
    "shard_format": (None, _choice("tar", "parquet")),
    "shard_size": (None, _size),
    "max_count": (None, _whole(1)),
    "shard_prefix": (None, _text(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")),
    "row_group_size": (None, _size),
}


class JobSpec:
    """A checked spec: each of ``FIELDS`` an attribute, and nothing else. Frozen: a changed spec
    is a new one (``replace``)."""

    __slots__ = tuple(FIELDS)
    kind: str
    source: str
    destinations: list[str]
    delete: bool | None
    max_delete: int | None
    force_delete: bool | None
    chunk_size: int | None
    concurrency: int | None
    profile: str | None
    queue: str | None
    verify: str
    store_checksums: str | None
    route: str | None
    bwlimit: int | None
    manifest_dir: str | None
    placement: dict[str, dict[str, Any]] | None
    objects: dict[str, Any] | None
    adopt: str | None
    sha256: bool | None
    include: list[str] | None
    exclude: list[str] | None
    filters: dict[str, Any] | None
    shard_format: str | None
    shard_size: int | None
    max_count: int | None
    shard_prefix: str | None
    row_group_size: int | None

    def __init__(self, **fields: Any):
        values = _checked(fields)
        for name in FIELDS:
            object.__setattr__(self, name, values[name])

    @classmethod
    def from_dict(cls, data: Any) -> JobSpec:
        """A spec from plain data (a job record's, a schedule's, the command line's), which may
        name one ``destination`` in place of ``destinations``; SpecError lists what is wrong."""
        if not isinstance(data, Mapping):
            raise SpecError([Problem((), "a job is a mapping of its fields")])
        if "destination" in data:
            if "destinations" in data:
                raise SpecError([Problem((), "give destination or destinations, not both")])
            data = {**data, "destinations": [data["destination"]]}
            del data["destination"]
        return cls(**data)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a job spec does not change: {name}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, JobSpec):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in FIELDS)

    __hash__ = None   # type: ignore[assignment]   # holds lists

    def __reduce__(self):   # pickled and copied as its fields, checked again when made
        return (JobSpec.from_dict, (self.to_dict(),))

    def __repr__(self) -> str:
        return f"JobSpec({', '.join(f'{k}={v!r}' for k, v in self.to_dict().items())})"

    # -- use ------------------------------------------------------------------------------
    @property
    def destination(self) -> str:
        return self.destinations[0]

    @property
    def deletes(self) -> bool:
        return bool(self.delete)

    def selection(self):
        """The Filters of the job (bridge/filters.py), or None."""
        if not self.filters:
            return None
        from bridge.filters import Filters
        return Filters.from_dict(self.filters)

    def settings_overrides(self) -> dict[str, Any]:
        """What the spec changes in a worker's settings: transfer options, never credentials."""
        transfer = {k: v for k, v in (("concurrency", self.concurrency), ("chunk_size", self.chunk_size),
                                      ("store_checksums", self.store_checksums),
                                      ("bwlimit", self.bwlimit), ("manifest_dir", self.manifest_dir),
                                      ("sha256", self.sha256 or None))
                    if v is not None}
        out: dict[str, Any] = {"transfer": transfer} if transfer else {}
        if self.objects:
            out["objects"] = dict(self.objects)
        if self.kind != "replicate":   # a sync to one destination: that destination's placement
            from bridge.attributes import placement_overrides
            for url, placed in (self.placement or {}).items():
                if self.destination.startswith(url):
                    out.update(placement_overrides(self.destination, **placed))
        return out

    def for_destination(self, url: str, source: str | None = None) -> JobSpec:
        """The sync that keeps one destination of a replication equal to the source (or to
        ``source``, a folder of it: one checkpoint of a replication policy)."""
        return self.replace(kind="sync", source=source or self.source, destinations=[url], delete=self.deletes)

    def replace(self, **changes: Any) -> JobSpec:
        """This spec with ``changes``, checked as a new one is."""
        return JobSpec(**{**self.to_dict(), **changes})

    def to_dict(self) -> dict[str, Any]:
        """The fields that are set, as JSON data (what the job record and the signature hold)."""
        out = {}
        for name in FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = copy.deepcopy(value) if isinstance(value, (list, dict)) else value
        return out


def _checked(fields: Mapping[str, Any]) -> dict[str, Any]:
    problems = [Problem((name,), "unknown field", unknown=True) for name in fields if name not in FIELDS]
    values: dict[str, Any] = {}
    for name, (default, check) in FIELDS.items():
        value = fields.get(name, default)
        if value is _REQUIRED or (value is None and default is _REQUIRED):   # (YAML's `source:` is None)
            problems.append(Problem((name,), "required"))
            continue
        try:
            values[name] = None if value is None else check(value)
        except ValueError as exc:
            problems.append(Problem((name,), str(exc)))
    if not problems:
        reason = _incoherent(values)
        if reason:
            problems.append(Problem((), reason))
    if problems:
        raise SpecError(problems)
    return values


def _incoherent(spec: dict[str, Any]) -> str | None:
    """Why fields that are each valid do not make a job together, or None."""
    kind, destinations = runs_as(spec["kind"]), spec["destinations"]
    if kind != "replicate" and len(destinations) != 1:
        return f"a {kind} job has one destination; use replicate for several"
    if kind in ("copy", "pack", "unpack") and spec["delete"]:
        return f"delete applies to sync and replicate, not {kind}"
    if not spec["delete"] and (spec["max_delete"] is not None or spec["force_delete"]):
        return "max_delete and force_delete limit what delete removes: set delete too, or leave them out"
    if kind not in ("sync", "replicate") and (spec["include"] or spec["exclude"]):
        return f"include and exclude apply to sync and replicate, not {kind}"
    if spec["filters"] and kind == "unpack":
        return "filters apply to copy, sync, replicate and pack, not unpack"
    if kind != "pack":
        # unpack takes the shard set's prefix, when the source holds several
        given = [name for name in PACK_FIELDS if spec[name] is not None
                 and not (kind == "unpack" and name == "shard_prefix")]
        if given:
            return f"{', '.join(given)} applies to pack jobs only"
    src = parse(spec["source"])
    for url in destinations:
        dst = parse(url)
        if src.is_prefix and dst.is_within(src):
            return f"destination {url} is inside the source {spec['source']}"
        if str(dst.as_prefix()) == str(src.as_prefix()):
            return f"destination {url} is the source"
    return None




def parse_spec(data: dict[str, Any]) -> JobSpec:
    """A JobSpec, or InvalidOption (SpecError) with the first problem on one line."""
    return JobSpec.from_dict(data)
