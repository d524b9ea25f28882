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
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

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


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class S3Settings(_Section):
    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: SecretStr | None = None
    session_token: SecretStr | None = None
    profile: str | None = None


class GCSSettings(_Section):
    endpoint: str | None = None          # an emulator, e.g. http://127.0.0.1:4443
    project: str | None = None
    credentials_file: str | None = None


class AzureSettings(_Section):
    connection_string: SecretStr | None = None
    account_name: str | None = None
    account_key: SecretStr | None = None
    sas_token: SecretStr | None = None
    endpoint: str | None = None
    region: str | None = None            # Azure's data plane does not say where an account is


class TransferSettings(_Section):
    concurrency: int = Field(8, ge=1, le=256)
    chunk_size: int | None = None        # None: derived per store from its limits
    retries: int = Field(5, ge=0, le=20)
    # After a multipart upload: compare the whole-object checksum the store reports with ours.
    # "require" fails when the store reports none; "readback" then reads the object back and
    # hashes it; "skip" trusts the per-part checksums the service checked on arrival.
    store_checksums: Literal["require", "readback", "skip"] = "require"
    # Where the journal of unfinished copies lives (load_settings fills in the default).
    state_dir: str | None = None
    connect_timeout: float = 5.0
    read_timeout: float = 120.0
    # Bytes per second across all of a job's connections (e.g. 50MiB); None: unlimited.
    bwlimit: int | None = None

    @field_validator("chunk_size", mode="before")
    @classmethod
    def _size(cls, v: Any) -> Any:
        if v is None:
            return None
        size = parse_size(v)
        if size < 1:  # 0 used to fall back to the default silently
            raise InvalidOption(f"chunk size {v!r} must be at least 1 byte")
        return size

    @field_validator("bwlimit", mode="before")
    @classmethod
    def _rate(cls, v: Any) -> Any:
        from bridge.bwlimit import parse_rate
        return parse_rate(v)


class NativeSettings(_Section):
    """The clouds' own transfer services (the ``sts`` and ``datasync`` routes, bridge/native/).
    Endpoints are overrides for a test double; left unset, each SDK finds the real service.
    ``enabled`` names the routes bridge may choose by itself and plans with; ``--route`` runs
    either route even when it is not enabled."""
    enabled: list[Literal["sts", "datasync"]] = []
    poll_interval: float = Field(10.0, gt=0)    # seconds between status polls of a remote transfer
    sts_endpoint: str | None = None              # Storage Transfer Service REST endpoint
    sts_project: str | None = None               # the project that runs transfer jobs (default: gcs.project)
    sts_aws_role_arn: str | None = None          # role STS assumes to read S3 (instead of access keys)
    datasync_endpoint: str | None = None
    datasync_region: str | None = None           # default: s3.region
    datasync_s3_role_arn: str | None = None      # BucketAccessRoleArn DataSync assumes on S3 buckets
    datasync_agent_arns: list[str] = []          # none: an agentless (Enhanced mode) task
    gcs_hmac_access_id: str | None = None        # DataSync reads or writes GCS through its XML API
    gcs_hmac_secret: SecretStr | None = None
    gcs_xml_endpoint: str = "https://storage.googleapis.com"

    @field_validator("enabled", mode="before")
    @classmethod
    def _names(cls, v: Any) -> Any:
        return [n.strip() for n in v.split(",") if n.strip()] if isinstance(v, str) else v


class Discount(_Section):
    """Negotiated discounts, in percent off the list price."""
    egress_pct: float = Field(0, ge=0, le=100)
    requests_pct: float = Field(0, ge=0, le=100)
    services_pct: float = Field(0, ge=0, le=100)


class Interconnect(_Section):
    """A private link priced per GB instead of internet egress, between two places written
    ``provider:region`` (``aws:us-east-1``), ``provider:*`` or ``site:NAME``."""
    between: tuple[str, str]
    usd_per_gb: float = Field(ge=0)


class RouteSpeed(_Section):
    """What planning assumes a route sustains: time = startup + max(bytes/rate, requests/rate)."""
    bytes_per_s: float | None = Field(None, gt=0)
    requests_per_s: float | None = Field(None, gt=0)
    startup_s: float | None = Field(None, ge=0)


class PricingSettings(_Section):
    """What ``mcbridge plan`` and ``--max-cost`` price with, on top of policies/prices/*.yaml."""
    runs_in: str = Field("site:local", pattern=r"^(aws|gcp|azure|site):[A-Za-z0-9_.\-]+$")  # where this process runs
    site: str = "local"                  # the site that local and Lustre paths belong to
    regions: dict[str, str] = {}         # URL prefix -> region, e.g. {"az://dr/": westeurope}
    discounts: dict[Literal["aws", "gcp", "azure"], Discount] = {}
    interconnects: list[Interconnect] = []
    month_to_date_gb: dict[Literal["aws", "gcp", "azure"], float] = {}  # egress already sent: tiers
    speeds: dict[str, RouteSpeed] = {}   # route -> throughput assumption
    available_routes: list[str] = []     # routes to plan with as if bridge could run them


class CacheSettings(_Section):
    """The node-local read cache (bridge/cache/): where it lives, how big it may grow."""
    dir: str | None = None               # load_settings fills in $XDG_CACHE_HOME/mcbridge/cache
    quota: int | None = None             # bytes, e.g. 500GiB; None: no limit
    high_watermark: float = Field(0.95, gt=0, le=1)   # of the quota: above it, evict ...
    low_watermark: float = Field(0.85, gt=0, le=1)    # ... least recently used entries down to this
    striping: Literal["auto", "on", "off"] = "auto"   # lfs setstripe: auto = when the dir is on Lustre
    stripe_counts: dict[str, int] = {"0": 1, "1GiB": 4, "16GiB": 16}  # from this size up: -c N (-1: all OSTs)
    lookahead: int = Field(4, ge=1, le=256)           # objects filled ahead of a prefetch's reader

    @field_validator("quota", mode="before")
    @classmethod
    def _quota(cls, v: Any) -> Any:
        if v is None:
            return None
        size = parse_size(v)
        if size < 1:
            raise InvalidOption(f"cache quota {v!r} must be at least 1 byte")
        return size

    @field_validator("stripe_counts")
    @classmethod
    def _classes(cls, v: dict[str, int]) -> dict[str, int]:
        for size, count in v.items():
            parse_size(size)
            if count == 0 or count < -1:
                raise InvalidOption(f"stripe count {count} for {size}: use a positive count, or -1 for all OSTs")
        return v


class Settings(BaseModel):
    # What pydantic-settings' BaseSettings, which this was, set and load_settings relies on; its
    # sources are load_settings's business, and leaving that library out saves ~70 ms a process.
    model_config = ConfigDict(extra="forbid", validate_default=True, arbitrary_types_allowed=True)

    s3: S3Settings = S3Settings()
    gcs: GCSSettings = GCSSettings()
    azure: AzureSettings = AzureSettings()
    transfer: TransferSettings = TransferSettings()
    pricing: PricingSettings = PricingSettings()
    native: NativeSettings = NativeSettings()
    cache: CacheSettings = CacheSettings()

    @model_validator(mode="before")
    @classmethod
    def _sections_in_any_case(cls, data: Any) -> Any:
        """Section names match in any case (``S3:`` is ``s3:``), the first one given winning, as
        BaseSettings matched them; the rest of a name is checked as it is."""
        if not isinstance(data, dict):
            return data
        out: dict[Any, Any] = {}
        taken: set[Any] = set()
        for name in cls.model_fields:
            given = [key for key in data if isinstance(key, str) and key.lower() == name]
            if given:
                out[name] = data[given[0]]
                taken.update(given)
        out.update((key, value) for key, value in data.items() if key not in taken)
        return out


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
    "MCBRIDGE_GCS_HMAC_ACCESS_ID": ("native", "gcs_hmac_access_id"),
    "MCBRIDGE_GCS_HMAC_SECRET": ("native", "gcs_hmac_secret"),
    "MCBRIDGE_GCS_XML_ENDPOINT": ("native", "gcs_xml_endpoint"),
    "MCBRIDGE_POLL_INTERVAL": ("native", "poll_interval"),
    "MCBRIDGE_CONCURRENCY": ("transfer", "concurrency"),
    "MCBRIDGE_CHUNK_SIZE": ("transfer", "chunk_size"),
    "MCBRIDGE_STORE_CHECKSUMS": ("transfer", "store_checksums"),
    "MCBRIDGE_STATE_DIR": ("transfer", "state_dir"),
    "MCBRIDGE_BWLIMIT": ("transfer", "bwlimit"),
    "MCBRIDGE_CACHE_DIR": ("cache", "dir"),
    "MCBRIDGE_CACHE_QUOTA": ("cache", "quota"),
    "MCBRIDGE_CACHE_STRIPING": ("cache", "striping"),
}


def _env_values(environ: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for var, (section, field) in _ENV_MAP.items():
        value = environ.get(var)
        if value and field not in out.get(section, {}):
            out.setdefault(section, {})[field] = value
    return out


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


def _file_values(path: Path, profile: str, explicit: bool) -> dict[str, Any]:
    if not path.exists():
        if explicit:
            raise InvalidOption(f"settings file {path} does not exist")
        return {}
    import yaml   # only when there is a file to read (~20 ms)
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise InvalidOption(f"settings file {path} is not valid YAML: {str(exc).splitlines()[0]}") from exc
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
    return values


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
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
    merged = _merge(_file_values(path, profile, explicit), _env_values(environ))
    merged = _merge(merged, overrides or {})
    if not merged.get("transfer", {}).get("state_dir"):
        merged.setdefault("transfer", {})["state_dir"] = str(default_state_dir(environ))
    if not merged.get("cache", {}).get("dir"):
        merged.setdefault("cache", {})["dir"] = str(default_cache_dir(environ))
    try:
        return Settings(**merged)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise InvalidOption(f"invalid setting {where}: {err['msg']}") from None
