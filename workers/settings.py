"""Every setting of the service in one declarative table, read from the environment in one place.

Each field of ``WorkerSettings`` names its environment variable, its parser and what it does
(the shape of celery's ``celery/app/defaults.py``). ``WorkerSettings.from_env`` is the only reader
of the environment; the Celery app, the CLI and the tests pass a ``WorkerSettings`` around.
``celery_config`` turns it into Celery's own settings.

Cloud credentials are not here: a worker loads them from its own environment or settings file
(``bridge.config.load_settings``) for the profile a job names, so they never travel with a job.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from bridge.config import parse_size
from bridge.errors import InvalidOption

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1, None: 1, "m": 60, "h": 3600, "d": 86400}
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}$")


def parse_duration(value: str | float) -> float:
    """'30s' -> 30.0, '5m' -> 300.0, '1.5' -> 1.5 (seconds)."""
    if isinstance(value, (int, float)):
        return float(value)
    m = _DURATION_RE.match(value)
    if not m:
        raise ValueError(f"{value!r} is not a duration: use a number of seconds or e.g. 30s, 5m, 2h, 1d")
    return float(m.group(1)) * _DURATION_UNITS[m.group(2)]


def _name(value: str) -> str:
    if not _NAME_RE.match(value):
        raise ValueError(f"{value!r}: use letters, digits, '_', '.', '-' (at most 63)")
    return value


def _flag(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{value!r} is not a boolean: use true or false")


def _port(value: str) -> int:
    port = int(value)
    if not 0 <= port <= 65535:
        raise ValueError(f"{port} is not a TCP port")
    return port


def parse_routes(value: str) -> dict[str, str]:
    """'s3=bridge.aws, gs://models=bridge.gpu' -> {'s3': 'bridge.aws', 'gs://models': 'bridge.gpu'}."""
    routes: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        match, sep, queue = item.partition("=")
        if not sep or not match.strip() or not queue.strip():
            raise ValueError(f"{item!r}: write MATCH=QUEUE, MATCH a scheme (s3) or scheme://bucket")
        routes[match.strip().rstrip("/")] = _name(queue.strip())
    return routes


def parse_route_limits(value: str) -> dict[str, int]:
    """'s3=200MiB, az://archive=50MiB' -> {'s3': 209715200, 'az://archive': 52428800} (0: none)."""
    from bridge.config import parse_rate
    from bridge.errors import BridgeError
    limits: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        match, sep, rate = item.partition("=")
        if not sep or not match.strip():
            raise ValueError(f"{item!r}: write MATCH=RATE, MATCH a scheme (s3) or scheme://bucket")
        try:
            limits[match.strip().rstrip("/")] = parse_rate(rate) or 0
        except BridgeError as exc:
            raise ValueError(str(exc)) from None
    return limits


def parse_local_roots(value: str) -> tuple[str, ...]:
    """'/data:/scratch/x' -> ('/data', '/scratch/x'): absolute paths, separated by ':' as in PATH."""
    roots = []
    for item in filter(None, (part.strip() for part in value.split(":"))):
        if not item.startswith("/"):
            raise ValueError(f"{item!r} is not an absolute path")
        roots.append(item)
    return tuple(roots)


def _tenant(value: str) -> str:
    from bridge.workers.auth import _NAME_RE as TENANT   # the service policy's rule (policies/tenants.py), without its YAML
    if not TENANT.match(value):
        raise ValueError(f"{value!r}: a tenant name uses letters, digits, '_', '.', '-' (at most 63)")
    return value


def _setting(env: str, default: Any, parse: Callable[[str], Any], doc: str, secret: bool = False) -> Any:
    return field(default=default, repr=not secret, metadata={"env": env, "parse": parse, "doc": doc})


def service_dir(environ: Mapping[str, str]) -> Path:
    """Where ``mcbridge service init`` writes the tenant keys and the service policy:
    $XDG_CONFIG_HOME/mcbridge, else ~/.config/mcbridge."""
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(environ.get("HOME", "~"), ".config")
    return Path(base).expanduser() / "mcbridge"


KEYS_FILE_NAME, SERVICE_POLICY_NAME = "service-keys", "service.yaml"


@dataclass(frozen=True)
class WorkerSettings:
    broker_url: str = _setting(
        "BRIDGE_BROKER_URL", "redis://localhost:6379/0", str,
        "Redis of the broker; job records, journals and leases live there too.")
    result_backend: str | None = _setting(
        "BRIDGE_RESULT_BACKEND", None, str, "Where Celery keeps task results (default: the broker URL).")
    namespace: str = _setting(
        "BRIDGE_NAMESPACE", "mcbridge", _name,
        "Prefix of every Redis key and channel of this deployment, so that several deployments "
        "(or test runs) share one Redis without seeing each other.")
    lease: float = _setting(
        "BRIDGE_LEASE", 30.0, parse_duration,
        "A running task holds a lease this long, renewed by a heartbeat every third of it. A task "
        "whose worker died runs again about lease + sweep after the last heartbeat.")
    sweep: float = _setting(
        "BRIDGE_SWEEP", 5.0, parse_duration, "How often workers look for expired leases.")
    max_attempts: int = _setting(
        "BRIDGE_MAX_ATTEMPTS", 5, int,
        "A task whose worker dies this many times while running it (a crash it causes, such as "
        "running out of memory) fails its job instead of being run again.")
    visibility_timeout: float = _setting(
        "BRIDGE_VISIBILITY_TIMEOUT", 12 * 3600.0, parse_duration,
        "Redis hands an unacknowledged message to another worker after this. Leases recover dead "
        "workers long before, so it only has to exceed the slowest task.")
    result_expires: float = _setting(
        "BRIDGE_RESULT_EXPIRES", 86400.0, parse_duration, "How long task results are kept.")
    job_ttl: float = _setting(
        "BRIDGE_JOB_TTL", 30 * 86400.0, parse_duration, "How long a finished job's record is kept.")
    journal_ttl: float = _setting(
        "BRIDGE_JOURNAL_TTL", 7 * 86400.0, parse_duration,
        "How long an unfinished job's journal is kept, so that submitting it again resumes it.")
    task_seconds: float = _setting(
        "BRIDGE_TASK_SECONDS", 10.0, parse_duration,
        "A task of small files is sized to take about this long at most, estimated from its files and "
        "bytes; a job too small to give each live pool process of its queue three such tasks (when "
        "there are several) gets shorter ones (half a second at least), so that adding workers adds speed.")
    list_parts: int = _setting(
        "BRIDGE_LIST_PARTS", 2, int,
        "A job whose source prefix has folders is listed by parts, on any workers: this many parts per "
        "live pool process of its queue (at most 256), each a group of the top-level folders; 0: the "
        "planner lists the whole source itself.")
    batch_files: int = _setting(
        "BRIDGE_BATCH_FILES", 5000, int,
        "At most this many small files per task (bounds a task's message and its plan in memory).")
    batch_bytes: int = _setting(
        "BRIDGE_BATCH_BYTES", 1024 * 1024 * 1024, parse_size, "At most this many bytes of small files per task.")
    file_task_bytes: int = _setting(
        "BRIDGE_FILE_TASK_BYTES", 1024 * 1024 * 1024, parse_size,
        "A multipart file bigger than this is sent by several tasks (on any workers), each with about "
        "this many bytes of its parts; it is completed when the job commits.")
    queue_prefix: str = _setting(
        "BRIDGE_QUEUE_PREFIX", "bridge", _name,
        "The control queue's name; route queues are <prefix>.<scheme> (bridge.s3, bridge.local ...).")
    routes: dict[str, str] = _setting(
        "BRIDGE_ROUTES", None, parse_routes,
        "Queues by destination, most specific first: 's3=bridge.aws,gs://models-eu=bridge.eu'.")
    route_bwlimits: dict[str, int] = _setting(
        "BRIDGE_ROUTE_BWLIMITS", None, parse_route_limits,
        "Default bandwidth limit of jobs by destination, matched as BRIDGE_ROUTES: 's3=200MiB,az://archive=50MiB'; "
        "a job's --bwlimit or its profile's transfer.bwlimit comes first.")
    metrics_port: int = _setting(
        "BRIDGE_METRICS_PORT", 9808, _port, "Prometheus endpoint of each worker; 0 turns it off.")
    metrics_addr: str = _setting(
        "BRIDGE_METRICS_ADDR", "127.0.0.1", str, "Address the metrics endpoint binds (0.0.0.0 in a container).")
    schedules: str | None = _setting(
        "BRIDGE_SCHEDULES", None, str, "YAML file of named schedules that beat runs.")
    policies: str | None = _setting(
        "BRIDGE_POLICIES", None, str, "YAML file of replication policies whose schedules beat runs.")
    timezone: str = _setting(
        "BRIDGE_TIMEZONE", "UTC", str, "Time zone of the cron expressions in the schedules.")
    task_events: bool = _setting(
        "BRIDGE_TASK_EVENTS", True, _flag, "Workers send task events (Flower shows them).")
    keys_file: str | None = _setting(
        "BRIDGE_KEYS_FILE", None, str,
        "File of tenant keys, one 'TENANT HEX-KEY' a line (mcbridge service init writes one; default: "
        "~/.config/mcbridge/service-keys when it exists). Workers hold every tenant's key; a submitter "
        "or beat only its own. Keys sign jobs (workers/auth.py) and are never printed.")
    keys: str | None = _setting(
        "BRIDGE_KEYS", None, str,
        "Tenant keys given inline from a secret, 'TENANT=HEX-KEY,...', added to BRIDGE_KEYS_FILE's.",
        secret=True)
    tenant: str | None = _setting(
        "BRIDGE_TENANT", None, _tenant,
        "The tenant this submitter or beat signs jobs as (default: the only tenant of its keys).")
    service_policy: str | None = _setting(
        "BRIDGE_SERVICE_POLICY", None, str,
        "YAML file of tenants and what each may read and write (policies/tenants.py; default: "
        "~/.config/mcbridge/service.yaml when it exists). A worker without one runs no job.")
    local_roots: tuple[str, ...] = _setting(
        "BRIDGE_LOCAL_ROOTS", (), parse_local_roots,
        "Local folders this worker may read or write for any job, ':'-separated (default: none, so no "
        "local path at all); links and '..' are resolved before the check.")
    worker_group: str = _setting(
        "BRIDGE_WORKER_GROUP", "default", _name,
        "The group of this worker in the service policy's per-tenant local scopes (local: GROUP: ...).")
    signature_ttl: float = _setting(
        "BRIDGE_SIGNATURE_TTL", 86400.0, parse_duration,
        "A submitted job must be admitted by a worker within this long of being signed (its expiry); "
        "a message beat signs is good for a tenth of it, at least a minute.")
    audit_maxlen: int = _setting(
        "BRIDGE_AUDIT_MAXLEN", 1_000_000, int,
        "Entries kept in the audit stream (<namespace>:audit), the oldest trimmed first; 0 keeps all.")

    def __post_init__(self) -> None:
        if self.routes is None:
            object.__setattr__(self, "routes", {})
        if self.route_bwlimits is None:
            object.__setattr__(self, "route_bwlimits", {})

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **overrides: Any) -> WorkerSettings:
        """Defaults < environment < ``overrides``; a bad value is one line naming the variable."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = environ.get(f.metadata["env"])
            if raw is None or raw == "":
                continue
            try:
                values[f.name] = f.metadata["parse"](raw)
            except ValueError as exc:
                raise InvalidOption(f"{f.metadata['env']}={raw!r}: {exc}") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        home = service_dir(environ)
        for name, file in (("keys_file", KEYS_FILE_NAME), ("service_policy", SERVICE_POLICY_NAME)):
            if name not in values and (home / file).is_file():
                values[name] = str(home / file)
        settings = cls(**values)
        if settings.lease <= 0 or settings.sweep <= 0 or settings.max_attempts < 1:
            raise InvalidOption("BRIDGE_LEASE, BRIDGE_SWEEP and BRIDGE_MAX_ATTEMPTS must be positive")
        if settings.signature_ttl <= 0 or settings.audit_maxlen < 0:
            raise InvalidOption("BRIDGE_SIGNATURE_TTL must be positive and BRIDGE_AUDIT_MAXLEN at least 0")
        if settings.visibility_timeout <= settings.lease:
            raise InvalidOption("BRIDGE_VISIBILITY_TIMEOUT must be longer than BRIDGE_LEASE")
        return settings

    def with_(self, **changes: Any) -> WorkerSettings:
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    # -- derived ----------------------------------------------------------------------------
    @property
    def key_prefix(self) -> str:
        return f"{self.namespace}:"

    @property
    def backend_url(self) -> str:
        return self.result_backend or self.broker_url

    @property
    def control_queue(self) -> str:
        return self.queue_prefix

    @property
    def recovery_bound(self) -> float:
        """Seconds from a worker's death to its tasks being queued again, at worst."""
        return self.lease + self.sweep

    def route_queues(self) -> list[str]:
        defaults = [f"{self.queue_prefix}.{name}" for name in ("local", "s3", "gs", "az")]
        return list(dict.fromkeys([*defaults, *self.routes.values()]))

    def default_queues(self) -> list[str]:
        """What a worker consumes when not told: the control queue and every route queue."""
        return [self.control_queue, *self.route_queues()]


def describe() -> list[tuple[str, str, str]]:
    """(variable, default, what it does) of every setting, for docs and ``--help``."""
    return [(f.metadata["env"], repr(f.default), f.metadata["doc"]) for f in fields(WorkerSettings)]


def celery_config(ws: WorkerSettings) -> dict[str, Any]:
    """Celery's settings for this deployment."""
    prefix = ws.key_prefix
    return {
        "broker_url": ws.broker_url,
        "result_backend": ws.backend_url,
        # JSON only: a message is never code, and a task's arguments stay readable in Flower.
        "task_serializer": "json",
        "result_serializer": "json",
        "event_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        # Acknowledge after the work, never before: a dead worker's task is not lost. Leases
        # (workers/leases.py) decide when it runs again; Redis's own redelivery is the backstop.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        # A pool process lives as long as its worker: its store clients, connections and settings
        # (cached per process) stay warm from one task to the next.
        "worker_max_tasks_per_child": None,
        "broker_transport_options": {"visibility_timeout": ws.visibility_timeout, "global_keyprefix": prefix},
        "result_backend_transport_options": {"global_keyprefix": prefix},
        "result_expires": ws.result_expires,
        "task_default_queue": ws.control_queue,
        "task_create_missing_queues": True,
        "timezone": ws.timezone,
        "enable_utc": True,
        "worker_send_task_events": ws.task_events,
        "task_send_sent_event": ws.task_events,
        "broker_connection_retry_on_startup": True,
        # A task that loses the broker connection goes on: its lease still fences it, and the
        # duplicate Redis may deliver later finds its work done.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "beat_scheduler": "bridge.workers.schedules:Scheduler",
    }
