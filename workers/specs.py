"""What a job asks for, checked before anything is queued.

A spec is plain data (it is stored in the job record and travels in task arguments): URLs,
options and the name of a settings profile, never a credential. ``JobSpec`` is shared by
``mcbridge submit`` and the schedules file, so both refuse the same mistakes with the same words.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from bridge.config import parse_size
from bridge.errors import BridgeError, InvalidOption
from bridge.urls import Location, parse

KINDS = ("copy", "sync", "replicate", "pack", "unpack")
PACK_FIELDS = ("shard_format", "shard_size", "max_count", "shard_prefix", "row_group_size")
VERIFY = ("store", "deep", "none")


def _location(url: str) -> Location:
    try:
        return parse(url)
    except BridgeError as exc:
        raise ValueError(str(exc)) from None


class JobSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["copy", "sync", "replicate", "pack", "unpack"]
    source: str
    destinations: list[str] = Field(min_length=1)
    delete: bool | None = None          # sync and replicate: deleting at a destination is asked for, never a default
    chunk_size: int | None = None
    concurrency: int | None = Field(None, ge=1, le=256)
    profile: str | None = Field(None, pattern=r"^[A-Za-z0-9_.\-]+$")
    queue: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    verify: Literal["store", "deep", "none"] = "store"
    store_checksums: Literal["require", "readback", "skip"] | None = None
    route: str | None = Field(None, pattern=r"^[a-z][a-z\-]*$")   # copy and sync: bridge/routes; None: chosen
    bwlimit: int | None = None           # bytes/s across the job's workers; `jobs limit` changes it
    # where the records of local destinations are kept (--manifest-dir; bridge.manifest.record_root)
    manifest_dir: str | None = Field(None, pattern=r"^/")
    # destination URL -> its storage class / tier and encryption (a replication policy's placement)
    placement: dict[str, dict[str, Any]] | None = None
    # sync and replicate: only the files matching one of include (default all) and none of exclude
    # (a replication policy's patterns, policies/replication.py)
    include: list[str] | None = None
    exclude: list[str] | None = None
    # copy, sync, replicate, pack: the command line's filters (bridge/filters.py Filters.to_dict)
    filters: dict[str, Any] | None = None
    # pack only: the shard set (bridge/packing)
    shard_format: Literal["tar", "parquet"] | None = None
    shard_size: int | None = None
    max_count: int | None = Field(None, ge=1)
    shard_prefix: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    row_group_size: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_destination(cls, data: Any) -> Any:
        if isinstance(data, dict) and "destination" in data:
            if "destinations" in data:
                raise ValueError("give destination or destinations, not both")
            data = {**data, "destinations": [data["destination"]]}
            del data["destination"]
        return data

    @field_validator("source")
    @classmethod
    def _source(cls, url: str) -> str:
        return str(_location(url))

    @field_validator("destinations")
    @classmethod
    def _destinations(cls, urls: list[str]) -> list[str]:
        out = [str(_location(url)) for url in urls]
        if len(set(out)) != len(out):
            raise ValueError("a destination is listed twice")
        return out

    @field_validator("chunk_size", "shard_size", "row_group_size", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        if value is None:
            return None
        try:
            return parse_size(value)
        except BridgeError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("filters")
    @classmethod
    def _filters(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        from bridge.filters import Filters
        if not value:
            return None
        try:
            return Filters.from_dict(value).to_dict()
        except BridgeError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("bwlimit", mode="before")
    @classmethod
    def _rate(cls, value: Any) -> Any:
        from bridge.config import parse_rate
        try:
            return parse_rate(value)
        except BridgeError as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _coherent(self) -> JobSpec:
        if self.kind != "replicate" and len(self.destinations) != 1:
            raise ValueError(f"a {self.kind} job has one destination; use replicate for several")
        if self.kind in ("copy", "pack", "unpack") and self.delete:
            raise ValueError(f"delete applies to sync and replicate, not {self.kind}")
        if self.kind not in ("sync", "replicate") and (self.include or self.exclude):
            raise ValueError(f"include and exclude apply to sync and replicate, not {self.kind}")
        if self.filters and self.kind == "unpack":
            raise ValueError("filters apply to copy, sync, replicate and pack, not unpack")
        if self.kind != "pack":
            # unpack takes the shard set's prefix, when the source holds several
            given = [name for name in PACK_FIELDS if getattr(self, name) is not None
                     and not (self.kind == "unpack" and name == "shard_prefix")]
            if given:
                raise ValueError(f"{', '.join(given)} applies to pack jobs only")
        src = parse(self.source)
        for url in self.destinations:
            dst = parse(url)
            if src.is_prefix and dst.is_within(src):
                raise ValueError(f"destination {url} is inside the source {self.source}")
            if str(dst.as_prefix()) == str(src.as_prefix()):
                raise ValueError(f"destination {url} is the source")
        return self

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
                                      ("bwlimit", self.bwlimit), ("manifest_dir", self.manifest_dir))
                    if v is not None}
        out: dict[str, Any] = {"transfer": transfer} if transfer else {}
        if self.kind != "replicate":   # a sync to one destination: that destination's placement
            from bridge.attributes import placement_overrides
            for url, placed in (self.placement or {}).items():
                if self.destination.startswith(url):
                    out.update(placement_overrides(self.destination, **placed))
        return out

    def for_destination(self, url: str) -> JobSpec:
        """The sync that keeps one destination of a replication equal to the source."""
        return self.model_copy(update={"kind": "sync", "destinations": [url], "delete": self.deletes})

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


def error_line(err: dict) -> str:
    """One pydantic error as 'field: message'."""
    where = ".".join(str(p) for p in err["loc"])
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        message = "unknown field"
    elif err["type"] == "literal_error":
        message = f"must be one of {err['ctx']['expected']}"
    return f"{where}: {message}" if where else message


def parse_spec(data: dict[str, Any]) -> JobSpec:
    """A JobSpec, or InvalidOption with the first problem on one line."""
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise InvalidOption(f"invalid job: {error_line(exc.errors()[0])}") from None
