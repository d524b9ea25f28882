"""Settings, resolved in one documented order, later sources winning:

    defaults  <  settings file profile  <  environment  <  explicit arguments (CLI flags)

The settings file is YAML, found at ``--config``, ``$MCBRIDGE_CONFIG`` or
``~/.config/mcbridge/config.yaml``, and holds named profiles::

    profiles:
      default:
        s3: {endpoint_url: https://s3.example.internal, region: eu-west-1}
        gcs: {project: my-project}
        azure: {account_name: mystorage}
        transfer: {concurrency: 16, chunk_size: 16MiB, bwlimit: 50MiB}
        cache: {dir: /lustre/scratch/mcbridge-cache, quota: 500GiB}

The environment is read with each SDK's own variable names (``AWS_ENDPOINT_URL``,
``STORAGE_EMULATOR_HOST``, ``AZURE_STORAGE_CONNECTION_STRING`` ...), so pointing them at an emulator
just works. Only ``load_settings`` reads the environment; everything else receives a ``Settings``.

The sections are plain classes checked from their annotations (``_Model``, ``Field``): values
are coerced as the environment and YAML give them ("5" -> 5 for an int, 10 -> 10.0 for a float),
bounds, choices and patterns are checked, an unknown name is refused, and a bad value is one
``InvalidOption`` naming the setting (``invalid setting transfer.concurrency: must be at least 1``).
They were pydantic models: importing pydantic and building these classes' schemas cost every
process that read its settings ~135 ms of CPU (``python -c "import bridge.config"``: 181 ms,
now 46 ms), more than a copy of a few thousand small files spends on anything but the copy.
"""

from __future__ import annotations

import copy
import math
import os
import re
import reprlib
from collections.abc import Callable, Mapping
from pathlib import Path
from types import UnionType
from typing import Any, ClassVar, Literal, Union, get_args, get_origin, get_type_hints
from urllib.parse import urlsplit

from bridge import redact
from bridge.errors import InvalidOption

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1000, "KB": 1000, "KIB": 1024, "M": 1000**2, "MB": 1000**2,
          "MIB": 1024**2, "G": 1000**3, "GB": 1000**3, "GIB": 1024**3, "T": 1000**4, "TB": 1000**4,
          "TIB": 1024**4}


def parse_size(value: str | int) -> int:
    """'8MiB' -> 8388608; '64M' -> 64000000; 1024 -> 1024."""
    if isinstance(value, int):
        return value
    m = _SIZE_RE.match(str(value))
    unit = (m.group(2) or "").upper() if m else None
    if not m or unit not in _UNITS:
        raise InvalidOption(f"invalid size {value!r}: use a number with an optional unit, e.g. 8MiB or 64MB")
    return int(float(m.group(1)) * _UNITS[unit])


class SecretStr:
    """A secret that prints as stars (in a repr of the settings, a log line, an error) and
    compares by value; ``get_secret_value()`` is the one way to read it."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value
        redact.remember(value)   # masked in any text that leaves the process, even bare

    def get_secret_value(self) -> str:
        return self._value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SecretStr) and self._value == other._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __len__(self) -> int:
        return len(self._value)

    def __str__(self) -> str:
        return "**********" if self._value else ""

    def __repr__(self) -> str:
        return f"SecretStr({str(self)!r})"


class _Invalid(InvalidOption):
    """A setting's error that already names the setting (raised from deep in a nested value)."""


_REQUIRED: Any = object()


class Field:
    """What a field's annotation does not say: its default (none: the setting is required),
    bounds, a pattern, and checks run on the raw value (``before``: "8MiB" for a size) or on the
    typed one (``after``). Checks raise InvalidOption or ValueError with a short message."""

    __slots__ = ("default", "ge", "gt", "le", "pattern", "before", "after", "convert")

    def __init__(self, default: Any = _REQUIRED, *, ge: float | None = None, gt: float | None = None,
                 le: float | None = None, pattern: str | None = None,
                 before: Callable[[Any], Any] | None = None, after: Callable[[Any], Any] | None = None):
        self.default, self.ge, self.gt, self.le, self.before, self.after = default, ge, gt, le, before, after
        self.pattern = re.compile(pattern) if pattern else None
        self.convert: Callable[[Any, str], Any] = _no_type   # set from the annotation (_Model)

    def check(self, value: Any, path: str) -> Any:
        try:
            if self.before:
                value = self.before(value)
            value = self.convert(value, path)
            if value is not None:
                if self.ge is not None and value < self.ge:
                    raise ValueError(f"must be at least {self.ge}")
                if self.gt is not None and value <= self.gt:
                    raise ValueError(f"must be greater than {self.gt}")
                if self.le is not None and value > self.le:
                    raise ValueError(f"must be at most {self.le}")
                if self.pattern and not self.pattern.match(value):
                    raise ValueError(f"{value!r} does not match {self.pattern.pattern}")
            if self.after:
                value = self.after(value)
        except _Invalid:
            raise
        except (InvalidOption, ValueError) as exc:
            raise _Invalid(f"invalid setting {path}: {exc}") from None
        return value


def _no_type(value: Any, path: str) -> Any:
    raise TypeError(f"{path}: a Field outside a settings class")


def _at(path: str, convert: Callable[[Any, str], Any], value: Any) -> Any:
    """``convert(value)``, a ValueError named after ``path`` (an item of a list or a mapping)."""
    try:
        return convert(value, path)
    except ValueError as exc:
        raise _Invalid(f"invalid setting {path}: {exc}") from None


def _int(value: Any, path: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            try:
                number = float(value)
            except ValueError:
                number = None
            if number is not None and number.is_integer():
                return int(number)
    raise ValueError(f"must be a whole number, not {reprlib.repr(value)}")


def _float(value: Any, path: str) -> float:
    number = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            pass
    if number is None:
        raise ValueError(f"must be a number, not {reprlib.repr(value)}")
    if not math.isfinite(number):   # nan passes every bound (each comparison is false)
        raise ValueError(f"must be a finite number, not {reprlib.repr(value)}")
    return number


def _str(value: Any, path: str) -> str:
    if isinstance(value, str):
        return value
    raise ValueError(f"must be a string, not {type(value).__name__}")


_TRUTHS = {"true": True, "on": True, "yes": True, "1": True, "false": False, "off": False, "no": False, "0": False}


def _bool(value: Any, path: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUTHS:
        return _TRUTHS[value.strip().lower()]
    raise ValueError(f"must be true or false, not {reprlib.repr(value)}")


def _secret(value: Any, path: str) -> SecretStr:
    if isinstance(value, SecretStr):
        return value
    if isinstance(value, str):
        return SecretStr(value)
    raise ValueError(f"must be a string, not {type(value).__name__}")   # never the value: it is a secret


def _converter(tp: Any) -> Callable[[Any, str], Any]:
    """The check for one annotation: the types these settings use, and nothing more."""
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, UnionType):
        (inner,) = [a for a in args if a is not type(None)]   # X | None is the only union used
        convert = _converter(inner)
        return lambda value, path: None if value is None else convert(value, path)
    if origin is Literal:
        def choice(value: Any, path: str) -> Any:
            if isinstance(value, str) and value in args:
                return value
            raise ValueError(f"must be one of {', '.join(args)}, not {reprlib.repr(value)}")
        return choice
    if origin is list:
        item = _converter(args[0])
        def items(value: Any, path: str) -> list:
            if not isinstance(value, (list, tuple)):
                raise ValueError("must be a list")
            return [_at(f"{path}.{i}", item, v) for i, v in enumerate(value)]
        return items
    if origin is tuple:
        parts = [_converter(a) for a in args]
        def fixed(value: Any, path: str) -> tuple:
            if not isinstance(value, (list, tuple)) or len(value) != len(parts):
                raise ValueError(f"must be a list of {len(parts)}")
            return tuple(_at(f"{path}.{i}", part, v) for i, (part, v) in enumerate(zip(parts, value)))
        return fixed
    if origin is dict:
        key, val = _converter(args[0]), _converter(args[1])
        def mapping(value: Any, path: str) -> dict:
            if not isinstance(value, Mapping):
                raise ValueError("must be a mapping")
            return {_at(f"{path}.{k}", key, k): _at(f"{path}.{k}", val, v) for k, v in value.items()}
        return mapping
    if isinstance(tp, type) and issubclass(tp, _Model):
        return tp._from
    simple = {bool: _bool, int: _int, float: _float, str: _str, SecretStr: _secret}.get(tp)
    if simple is None:
        raise TypeError(f"no check for settings of type {tp!r}")
    return simple


def _dump(value: Any) -> Any:
    if isinstance(value, _Model):
        return value.model_dump()
    if isinstance(value, list):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value


class _Model:
    """A settings section: each annotated name is a field, its class value the default (or a
    ``Field``). Built from keywords and checked then; unknown names are refused. The pydantic
    methods the code uses are kept: ``model_dump()``, ``model_copy(update=)``, ``model_fields``."""

    model_fields: ClassVar[dict[str, Field]] = {}

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        fields: dict[str, Field] = {}
        for name, tp in get_type_hints(cls).items():
            if get_origin(tp) is ClassVar:
                continue
            spec = cls.__dict__.get(name, _REQUIRED)
            field = spec if isinstance(spec, Field) else Field(spec)
            field.convert = _converter(tp)
            fields[name] = field
            if name in cls.__dict__:
                delattr(cls, name)   # the value lives on each instance; the class keeps the Field
        cls.model_fields = fields

    def __init__(self, **values: Any):
        self.__dict__.update(self._check(values, ""))

    @classmethod
    def _check(cls, values: Mapping[str, Any], where: str) -> dict[str, Any]:
        """The checked values; every mistake at once (one line each) in one _Invalid."""
        problems = [f"invalid setting {where}{name}: unknown setting{_near(name, cls.model_fields)}"
                    for name in values if name not in cls.model_fields]
        out = {}
        for name, field in cls.model_fields.items():
            if name in values:
                value = values[name]
            elif field.default is _REQUIRED:
                problems.append(f"invalid setting {where}{name}: missing")
                continue
            elif isinstance(field.default, (list, dict, _Model)):   # a fresh copy: none shared
                value = copy.deepcopy(field.default)
            else:
                value = field.default
            try:
                out[name] = field.check(value, where + name)
            except _Invalid as exc:
                problems.extend(str(exc).splitlines())
        if problems:
            raise _Invalid("\n".join(problems))
        return out

    @classmethod
    def _from(cls, value: Any, path: str) -> Any:
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise ValueError("must be a mapping")
        model = cls.__new__(cls)
        model.__dict__.update(cls._check(value, f"{path}."))
        return model

    def model_dump(self) -> dict[str, Any]:
        """Nested dicts and lists; secrets stay SecretStr (as pydantic's python mode left them)."""
        return {name: _dump(getattr(self, name)) for name in self.model_fields}

    def model_copy(self, *, update: Mapping[str, Any] | None = None) -> Any:
        """A shallow copy with ``update`` applied as given (unchecked, as pydantic's was)."""
        for name in update or {}:
            if name not in self.model_fields:
                raise TypeError(f"{type(self).__name__} has no setting {name!r}")
        copied = type(self).__new__(type(self))
        copied.__dict__.update(self.__dict__, **(update or {}))
        return copied

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Model):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    __hash__ = None   # type: ignore[assignment]   # mutable, compared by value

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={getattr(self, k)!r}' for k in self.model_fields)})"


def _near(name: Any, known: Mapping[str, Any]) -> str:
    """'; did you mean concurrency?' for a misspelt setting."""
    import difflib
    close = difflib.get_close_matches(str(name), list(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _size_at_least_1(what: str) -> Callable[[Any], int | None]:
    def check(value: Any) -> int | None:
        if value is None:
            return None
        size = parse_size(value)
        if size < 1:  # 0 used to fall back to the default silently
            raise InvalidOption(f"{what} {value!r} must be at least 1 byte")
        return size
    return check


_OFF = ("", "0", "off", "none", "unlimited")


def parse_rate(value: str | int | None) -> int | None:
    """'50MiB' or '50MiB/s' -> 52428800 bytes per second; '0', 'off' or None -> None (unlimited)."""
    if value is None:
        return None
    if isinstance(value, int):
        return value or None
    text = str(value).strip().lower()
    if text in _OFF:
        return None
    try:
        rate = parse_size(text.removesuffix("/s"))
    except InvalidOption:
        raise InvalidOption(f"invalid bandwidth limit {reprlib.repr(value)}: use bytes per second with an optional "
                            f"unit, e.g. 50MiB (or 0/off for none)") from None
    return rate or None


def _rate(value: Any) -> int | None:
    return parse_rate(value)


def _endpoint(bare_host: bool = False) -> Callable[[Any], str | None]:
    """An endpoint URL: http(s), a host, a valid port. ``bare_host``: ``HOST:PORT`` alone is taken
    as http://HOST:PORT (as STORAGE_EMULATOR_HOST is by the GCS store)."""
    def check(value: str | None) -> str | None:
        if value is None:
            return None
        text = "http://" + value if bare_host and "://" not in value else value
        try:
            parts = urlsplit(text)
            parts.port   # noqa: B018   # ValueError for a port that is not a number or out of range
        except ValueError as exc:
            raise ValueError(f"{reprlib.repr(value)} is not a valid URL: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{reprlib.repr(value)} is not an endpoint URL: use http(s)://HOST[:PORT]")
        return value
    return check


def _comma_list(value: Any) -> Any:
    return [n.strip() for n in value.split(",") if n.strip()] if isinstance(value, str) else value


def _stripe_classes(classes: dict[str, int]) -> dict[str, int]:
    for size, count in classes.items():
        parse_size(size)
        if count == 0 or count < -1:
            raise InvalidOption(f"stripe count {count} for {size}: use a positive count, or -1 for all OSTs")
    return classes


S3Class = Literal["STANDARD", "REDUCED_REDUNDANCY", "STANDARD_IA", "ONEZONE_IA", "INTELLIGENT_TIERING",
                  "GLACIER", "DEEP_ARCHIVE", "GLACIER_IR", "OUTPOSTS", "EXPRESS_ONEZONE", "SNOW"]
GCSClass = Literal["STANDARD", "NEARLINE", "COLDLINE", "ARCHIVE", "MULTI_REGIONAL", "REGIONAL",
                   "DURABLE_REDUCED_AVAILABILITY"]
AzureTier = Literal["Hot", "Cool", "Cold", "Archive"]


class ObjectSettings(_Model):
    """What a copy writes besides the bytes (bridge/attributes.py): ``metadata: off`` carries no
    headers or user metadata of the source's; ``content_type`` and ``set_metadata`` override."""
    metadata: Literal["on", "off"] = "on"
    content_type: str | None = None
    set_metadata: dict[str, str] = {}


class S3Settings(_Model):
    endpoint_url: str | None = Field(None, after=_endpoint())
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: SecretStr | None = None
    session_token: SecretStr | None = None
    profile: str | None = None
    # PEM bundle of the CAs S3's endpoint is verified against (AWS_CA_BUNDLE; before transfer.ca_bundle)
    ca_bundle: str | None = None
    # On AWS's own endpoint: "path" sends every bucket's requests path-style to s3.REGION.amazonaws.com;
    # "auto" (the default) names the host by the bucket where its name can be one (s3direct.py)
    addressing_style: Literal["auto", "path"] | None = None
    # What objects written here are stored as (bridge's own _bridge/ records keep the bucket's
    # default class, so that they read back without a restore): README, Storage classes.
    storage_class: S3Class | None = None
    sse_kms_key_id: str | None = None     # SSE-KMS with this key (id, ARN or alias)
    bucket_key: bool | None = None        # S3 Bucket Keys for SSE-KMS


class GCSSettings(_Model):
    endpoint: str | None = Field(None, after=_endpoint(bare_host=True))   # an emulator, e.g. http://127.0.0.1:4443
    project: str | None = None
    credentials_file: str | None = None
    storage_class: GCSClass | None = None
    kms_key_name: str | None = None       # CMEK: projects/P/locations/L/keyRings/R/cryptoKeys/K


class AzureSettings(_Model):
    connection_string: SecretStr | None = None
    account_name: str | None = None
    account_key: SecretStr | None = None
    sas_token: SecretStr | None = None
    endpoint: str | None = Field(None, after=_endpoint())
    region: str | None = None            # Azure's data plane does not say where an account is
    tier: AzureTier | None = None        # access tier of blobs written here
    encryption_scope: str | None = None


def _not_empty(value: str | None, what: str) -> str | None:
    if value is not None and not value.strip():
        raise ValueError(f"is empty: give {what}, or leave it out")
    return value


class TransferSettings(_Model):
    concurrency: int = Field(8, ge=1, le=256)
    # Requests in flight for small whole files, which go in batches on one event loop (one
    # connection each): a small object's time is mostly the endpoint's latency, so eight in flight
    # left a copy waiting on the network (2,000 x 16 KiB over a 20 ms round trip: 6.6 s at 8,
    # 1.9 s at 64; bench/README.md). At most BATCH_IN_FLIGHT bytes of them are in flight, and never fewer
    # requests than ``concurrency`` (bridge.pipeline.units.batch_connections).
    small_files_in_flight: int = Field(64, ge=1, le=1024)
    # Processes that plan a sync of a large local folder at once, a part of its top-level
    # folders each (bridge.pipeline.forkplan), and that run a copy's batches of small files at
    # once (bridge.pipeline.forkrun); 0: one a core, at most 4; 1: all in one process.
    processes: int = Field(0, ge=0, le=64)
    # None: derived per store from its limits
    chunk_size: int | None = Field(None, before=_size_at_least_1("chunk size"))
    retries: int = Field(5, ge=0, le=20)
    # After a multipart upload: compare the whole-object checksum the store reports with ours.
    # "require" fails when the store reports none; "readback" then reads the object back and
    # hashes it; "skip" trusts the per-part checksums the service checked on arrival.
    store_checksums: Literal["require", "readback", "skip"] = "require"
    # Also the plain whole-file SHA-256 of a file copied in parts (one stream, in part order: it
    # cannot be split, ~0.9 s of one core per GiB). Off: each part's SHA-256 (in parallel), the
    # file's CRC32C and the sha256-tree over the parts are its record (README "Digests").
    sha256: bool = False
    # Where the journal of unfinished copies lives (load_settings fills in the default).
    state_dir: str | None = None
    connect_timeout: float = Field(5.0, gt=0)
    read_timeout: float = Field(120.0, gt=0)
    # Bytes per second across all of a job's connections (e.g. 50MiB); None: unlimited.
    bwlimit: int | None = Field(None, before=_rate)
    # Where the records (_bridge/) of local destinations are kept, outside the data: under this
    # folder, by the destination's absolute path (bridge.manifest.record_root). None: inside.
    manifest_dir: str | None = Field(None, after=lambda v: _not_empty(v, "a folder"))
    # PEM bundle of the CAs every HTTPS endpoint is verified against; None: the system's
    ca_bundle: str | None = None


class NativeSettings(_Model):
    """The clouds' own transfer services (the ``sts`` and ``datasync`` routes, bridge/routes/sts.py and datasync.py).
    Endpoints are overrides for a test double; left unset, each SDK finds the real service.
    ``enabled`` names the routes bridge may choose by itself and plans with; ``--route`` runs
    either route even when it is not enabled."""
    enabled: list[Literal["sts", "datasync"]] = Field([], before=_comma_list)   # "sts,datasync" from the environment
    poll_interval: float = Field(10.0, gt=0)    # seconds between status polls of a remote transfer
    sts_endpoint: str | None = Field(None, after=_endpoint())   # Storage Transfer Service REST endpoint
    sts_project: str | None = None               # the project that runs transfer jobs (default: gcs.project)
    sts_aws_role_arn: str | None = None          # role STS assumes to read S3 (instead of access keys)
    datasync_endpoint: str | None = Field(None, after=_endpoint())
    datasync_region: str | None = None           # default: s3.region
    datasync_s3_role_arn: str | None = None      # BucketAccessRoleArn DataSync assumes on S3 buckets
    datasync_agent_arns: list[str] = []          # agents of a Basic mode task's GCS or Azure location
    # CreateTask's TaskMode: ENHANCED (agentless between clouds, priced per GB and per execution)
    # or BASIC (an agent on the other cloud's side; priced per GB only): policies/cost/prices/aws.yaml
    datasync_task_mode: Literal["ENHANCED", "BASIC"] = "ENHANCED"
    gcs_hmac_access_id: str | None = None        # DataSync reads or writes GCS through its XML API
    gcs_hmac_secret: SecretStr | None = None
    gcs_xml_endpoint: str = Field("https://storage.googleapis.com", after=_endpoint())


class Discount(_Model):
    """Negotiated discounts, in percent off the list price."""
    egress_pct: float = Field(0, ge=0, le=100)
    requests_pct: float = Field(0, ge=0, le=100)
    services_pct: float = Field(0, ge=0, le=100)


class Interconnect(_Model):
    """A private link priced per GB instead of internet egress, between two places written
    ``provider:region`` (``aws:us-east-1``), ``provider:*`` or ``site:NAME``."""
    between: tuple[str, str]
    usd_per_gb: float = Field(ge=0)


class RouteSpeed(_Model):
    """What planning assumes a route sustains: time = startup + max(bytes/rate, requests/rate)."""
    bytes_per_s: float | None = Field(None, gt=0)
    requests_per_s: float | None = Field(None, gt=0)
    startup_s: float | None = Field(None, ge=0)


class PricingSettings(_Model):
    """What ``mcbridge plan`` and ``--max-cost`` price with, on top of policies/cost/prices/*.yaml."""
    runs_in: str = Field("site:local", pattern=r"^(aws|gcp|azure|site):[A-Za-z0-9_.\-]+$")  # where this process runs
    site: str = "local"                  # the site that local and Lustre paths belong to
    regions: dict[str, str] = {}         # URL prefix -> region, e.g. {"az://dr/": westeurope}
    discounts: dict[Literal["aws", "gcp", "azure"], Discount] = {}
    interconnects: list[Interconnect] = []
    month_to_date_gb: dict[Literal["aws", "gcp", "azure"], float] = {}  # egress already sent: tiers
    speeds: dict[str, RouteSpeed] = {}   # route -> throughput assumption
    available_routes: list[str] = []     # routes to plan with as if bridge could run them


class CacheSettings(_Model):
    """The node-local read cache (bridge/cache/): where it lives, how big it may grow."""
    dir: str | None = None               # load_settings fills in $XDG_CACHE_HOME/mcbridge/cache
    quota: int | None = Field(None, before=_size_at_least_1("cache quota"))   # bytes, e.g. 500GiB; None: no limit
    high_watermark: float = Field(0.95, gt=0, le=1)   # of the quota: above it, evict ...
    low_watermark: float = Field(0.85, gt=0, le=1)    # ... least recently used entries down to this
    striping: Literal["auto", "on", "off"] = "auto"   # lfs setstripe: auto = when the dir is on Lustre
    # from this size up: lfs setstripe -c N (-1: all OSTs)
    stripe_counts: dict[str, int] = Field({"0": 1, "1GiB": 4, "16GiB": 16}, after=_stripe_classes)
    lookahead: int = Field(4, ge=1, le=256)           # objects filled ahead of a prefetch's reader


class Settings(_Model):
    s3: S3Settings = S3Settings()
    gcs: GCSSettings = GCSSettings()
    azure: AzureSettings = AzureSettings()
    transfer: TransferSettings = TransferSettings()
    pricing: PricingSettings = PricingSettings()
    native: NativeSettings = NativeSettings()
    cache: CacheSettings = CacheSettings()
    objects: ObjectSettings = ObjectSettings()

    @classmethod
    def _check(cls, values: Mapping[str, Any], where: str) -> dict[str, Any]:
        """Section names match in any case (``S3:`` is ``s3:``), the first one given winning, as
        pydantic-settings' BaseSettings matched them; the rest of a name is checked as it is."""
        out: dict[Any, Any] = {}
        taken: set[Any] = set()
        for name in cls.model_fields:
            given = [key for key in values if isinstance(key, str) and key.lower() == name]
            if given:
                out[name] = values[given[0]]
                taken.update(given)
        out.update((key, value) for key, value in values.items() if key not in taken)
        return super()._check(out, where)


# Standard SDK variable names -> (section, field). The first one set wins.
_ENV_MAP: dict[str, tuple[str, str]] = {
    "AWS_ENDPOINT_URL_S3": ("s3", "endpoint_url"),
    "AWS_ENDPOINT_URL": ("s3", "endpoint_url"),
    "AWS_REGION": ("s3", "region"),
    "AWS_DEFAULT_REGION": ("s3", "region"),
    "AWS_ACCESS_KEY_ID": ("s3", "access_key_id"),
    "AWS_SECRET_ACCESS_KEY": ("s3", "secret_access_key"),
    "AWS_SESSION_TOKEN": ("s3", "session_token"),
    "AWS_PROFILE": ("s3", "profile"),
    "AWS_CA_BUNDLE": ("s3", "ca_bundle"),
    "MCBRIDGE_S3_ADDRESSING_STYLE": ("s3", "addressing_style"),
    "STORAGE_EMULATOR_HOST": ("gcs", "endpoint"),
    "GOOGLE_CLOUD_PROJECT": ("gcs", "project"),
    "GOOGLE_APPLICATION_CREDENTIALS": ("gcs", "credentials_file"),
    "AZURE_STORAGE_CONNECTION_STRING": ("azure", "connection_string"),
    "AZURE_STORAGE_ACCOUNT": ("azure", "account_name"),
    "AZURE_STORAGE_ACCOUNT_NAME": ("azure", "account_name"),
    "AZURE_STORAGE_KEY": ("azure", "account_key"),
    "AZURE_STORAGE_ACCOUNT_KEY": ("azure", "account_key"),
    "AZURE_STORAGE_SAS_TOKEN": ("azure", "sas_token"),
    "MCBRIDGE_NATIVE_ROUTES": ("native", "enabled"),
    "MCBRIDGE_STS_ENDPOINT": ("native", "sts_endpoint"),
    "MCBRIDGE_STS_PROJECT": ("native", "sts_project"),
    "MCBRIDGE_STS_AWS_ROLE_ARN": ("native", "sts_aws_role_arn"),
    "AWS_ENDPOINT_URL_DATASYNC": ("native", "datasync_endpoint"),
    "MCBRIDGE_DATASYNC_S3_ROLE_ARN": ("native", "datasync_s3_role_arn"),
    "MCBRIDGE_DATASYNC_TASK_MODE": ("native", "datasync_task_mode"),
    "MCBRIDGE_GCS_HMAC_ACCESS_ID": ("native", "gcs_hmac_access_id"),
    "MCBRIDGE_GCS_HMAC_SECRET": ("native", "gcs_hmac_secret"),
    "MCBRIDGE_GCS_XML_ENDPOINT": ("native", "gcs_xml_endpoint"),
    "MCBRIDGE_POLL_INTERVAL": ("native", "poll_interval"),
    "MCBRIDGE_CONCURRENCY": ("transfer", "concurrency"),
    "MCBRIDGE_SMALL_FILES_IN_FLIGHT": ("transfer", "small_files_in_flight"),
    "MCBRIDGE_PROCESSES": ("transfer", "processes"),
    "MCBRIDGE_CHUNK_SIZE": ("transfer", "chunk_size"),
    "MCBRIDGE_STORE_CHECKSUMS": ("transfer", "store_checksums"),
    "MCBRIDGE_SHA256": ("transfer", "sha256"),
    "MCBRIDGE_STATE_DIR": ("transfer", "state_dir"),
    "MCBRIDGE_BWLIMIT": ("transfer", "bwlimit"),
    "MCBRIDGE_MANIFEST_DIR": ("transfer", "manifest_dir"),
    "MCBRIDGE_CA_BUNDLE": ("transfer", "ca_bundle"),
    "REQUESTS_CA_BUNDLE": ("transfer", "ca_bundle"),
    "SSL_CERT_FILE": ("transfer", "ca_bundle"),
    "MCBRIDGE_CACHE_DIR": ("cache", "dir"),
    "MCBRIDGE_CACHE_QUOTA": ("cache", "quota"),
    "MCBRIDGE_CACHE_STRIPING": ("cache", "striping"),
}


def _env_values(environ: Mapping[str, str]) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The settings the environment gives, and the variable each came from ("s3.endpoint_url" ->
    "AWS_ENDPOINT_URL"), so that a bad value is named as the user wrote it."""
    out: dict[str, dict[str, Any]] = {}
    origin: dict[str, str] = {}
    for var, (section, field) in _ENV_MAP.items():
        value = environ.get(var)
        if value and field not in out.get(section, {}):
            out.setdefault(section, {})[field] = value
            origin[f"{section}.{field}"] = var
    return out, origin


def default_state_dir(environ: Mapping[str, str]) -> Path:
    """$XDG_STATE_HOME/mcbridge, else ~/.local/state/mcbridge."""
    base = environ.get("XDG_STATE_HOME") or os.path.join(environ.get("HOME", "~"), ".local", "state")
    return Path(base).expanduser() / "mcbridge"


def default_cache_dir(environ: Mapping[str, str]) -> Path:
    """$XDG_CACHE_HOME/mcbridge/cache, else ~/.cache/mcbridge/cache."""
    base = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME", "~"), ".cache")
    return Path(base).expanduser() / "mcbridge" / "cache"


def default_config_path(environ: Mapping[str, str]) -> Path:
    if environ.get("MCBRIDGE_CONFIG"):
        return Path(environ["MCBRIDGE_CONFIG"])
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(environ.get("HOME", "~"), ".config")
    return Path(base).expanduser() / "mcbridge" / "config.yaml"


MAX_SETTINGS_BYTES = 1024 * 1024   # a settings file is a few KiB; /dev/zero must not fill memory


class UnreadableText(InvalidOption):
    """A file the user named that is no small UTF-8 text: ``reason`` says why, ``line`` where
    the bad byte is (for a file that is not UTF-8)."""

    def __init__(self, path: Path, what: str, reason: str, line: int | None = None):
        super().__init__(f"{what} {path}: {reason}")
        self.reason, self.line = reason, line


def read_text_file(path: Path, what: str, limit: int = MAX_SETTINGS_BYTES) -> str:
    """The UTF-8 text of a small regular file, or UnreadableText naming ``what`` and ``path``: a
    directory, a device, an unreadable, oversized or binary file is bad input, not a crash.
    Settings, policy and schedule files are all read through here."""
    try:
        if path.is_dir():
            raise UnreadableText(path, what, "it is a directory, not a file")
        if path.exists() and not path.is_file():
            raise UnreadableText(path, what, "it is not a regular file")
        with path.open("rb") as f:
            raw = f.read(limit + 1)
    except OSError as exc:
        raise UnreadableText(path, what, f"it cannot be read: {exc.strerror or exc}") from None
    if len(raw) > limit:
        raise UnreadableText(path, what, f"it is over {limit // 1024} KiB")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableText(path, what, f"it is not UTF-8 text (byte {exc.start})",
                             line=raw[:exc.start].count(b"\n") + 1) from None


def _file_values(path: Path, profile: str, explicit: bool, texts: dict[Path, str] | None = None) -> dict[str, Any]:
    """The settings of ``profile`` in the file; ``texts`` keeps the file's text (for the lines
    of its mistakes)."""
    if not path.exists():
        if explicit:
            raise InvalidOption(f"settings file {path} does not exist")
        return {}
    text = read_text_file(path, "settings file")
    if texts is not None:
        texts[path] = text
    import yaml   # only when there is a file to read (~20 ms)
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise InvalidOption(f"settings file {path} is not valid YAML: {str(exc).splitlines()[0]}") from exc
    except RecursionError:
        raise InvalidOption(f"settings file {path} is nested too deeply") from None
    profiles = doc.get("profiles", {}) if isinstance(doc, dict) else None
    if not isinstance(profiles, dict):
        raise InvalidOption(f"settings file {path}: 'profiles' must be a mapping of profile names")
    if profile not in profiles:
        if profile != "default" or explicit:
            raise InvalidOption(f"settings file {path} has no profile {profile!r}")
        return {}
    values = profiles[profile] or {}
    if not isinstance(values, dict):
        raise InvalidOption(f"settings file {path}: profile {profile!r} must be a mapping of sections (s3, transfer ...)")
    for section, body in values.items():
        if not isinstance(section, str):
            raise InvalidOption(f"settings file {path}: profile {profile!r}: {reprlib.repr(section)} is not a "
                                f"section name (s3, transfer ...)")
        if body is not None and not isinstance(body, dict):   # it would be dropped when merged
            raise InvalidOption(f"settings file {path}: profile {profile!r}: {section} must be a mapping of "
                                f"settings, not {type(body).__name__}")
    return values


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``, as new dicts all the way down: load_settings fills in defaults
    afterwards, and they must not land in a mapping the caller gave (its ``overrides``)."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping):
            out[key] = _merge(dict(out[key]) if isinstance(out.get(key), Mapping) else {}, value)
        elif value is not None:
            out[key] = value
    return out


def load_settings(overrides: Mapping[str, Any] | None = None, *, profile: str | None = None,
                  config_path: str | os.PathLike | None = None,
                  environ: Mapping[str, str] | None = None) -> Settings:
    """Build Settings: defaults < file profile < environment < ``overrides`` (nested dict)."""
    environ = os.environ if environ is None else environ
    profile = profile or environ.get("MCBRIDGE_PROFILE") or "default"
    path = Path(config_path) if config_path else default_config_path(environ)
    explicit = config_path is not None or "MCBRIDGE_CONFIG" in environ or profile != "default"
    texts: dict[Path, str] = {}
    from_file = _file_values(path, profile, explicit, texts)
    env_values = _env_values(environ)[0]
    merged = _merge(from_file, env_values)
    merged = _merge(merged, overrides or {})
    if not merged.get("transfer", {}).get("state_dir"):
        merged.setdefault("transfer", {})["state_dir"] = str(default_state_dir(environ))
    if not merged.get("cache", {}).get("dir"):
        merged.setdefault("cache", {})["dir"] = str(default_cache_dir(environ))
    try:
        return Settings(**merged)   # a bad value: InvalidOption("invalid setting transfer.concurrency: ...")
    except _Invalid as exc:
        if path not in texts:
            raise
        elsewhere = [env_values, overrides or {}]
        raise _Invalid("\n".join(_where_in_file(line, path, texts[path], profile, from_file, elsewhere)
                                 for line in str(exc).splitlines())) from None


_SETTING = re.compile(r"^invalid setting ([^:]+):")


def _where_in_file(line: str, path: Path, text: str, profile: str, from_file: Mapping[str, Any],
                   elsewhere: list[Mapping[str, Any]]) -> str:
    """``line`` (one mistake) with 'FILE:LINE: ' before it when the setting it names came from
    the settings file (not from the environment or a flag, which win over it)."""
    m = _SETTING.match(line)
    if not m:
        return line
    steps = m.group(1).split(".")
    section = next((k for k in from_file if isinstance(k, str) and k.lower() == steps[0]), None)
    if section is None or any(isinstance(e.get(steps[0]), Mapping) and len(steps) > 1 and steps[1] in e[steps[0]]
                              for e in elsewhere):
        return line
    import yaml
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return f"{path}: {line}"
    where = _line_of(node, ["profiles", profile, section, *steps[1:]])
    return f"{path}:{where}: {line}" if where else f"{path}: {line}"


def _line_of(node: Any, path: list[str]) -> int | None:
    """1-based line of the deepest key of ``path`` found in a composed YAML tree."""
    import yaml
    line = None
    for step in path:
        if isinstance(node, yaml.MappingNode):
            for key, value in reversed(node.value):
                if key.value == step:
                    line, node = key.start_mark.line + 1, value
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and step.isdigit() and int(step) < len(node.value):
            node = node.value[int(step)]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def variable_of(error: InvalidOption, environ: Mapping[str, str], overrides: Mapping[str, Any] | None = None) -> str | None:
    """The environment variable that gave the setting ``error`` (from load_settings) refuses,
    or None when the value came from elsewhere: a CLI names the input as the user wrote it."""
    message = str(error)
    for where, var in _env_values(environ)[1].items():
        section, field = where.split(".")
        if (message.startswith((f"invalid setting {where}:", f"invalid setting {where}."))
                and field not in (overrides or {}).get(section, {})):
            return var
    return None
