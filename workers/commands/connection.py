"""What every service command shares: the service's settings with the broker URL checked, a
Redis client that answered, the job records, and one line naming the 'service' extra when
Celery or redis is not installed (checked before anything imports them)."""

from __future__ import annotations

import json
import os
from typing import Annotated, Any, Optional

import typer

from bridge.cli.options import given


BrokerOpt = Annotated[Optional[str], typer.Option(
    "--broker", help="Redis URL of the broker (default: $BRIDGE_BROKER_URL, else redis://localhost:6379/0).")]


def service_settings(broker: str | None = None, **overrides: Any):
    """The service's settings, the broker URL checked; every service command starts here, so a
    missing 'service' extra is named before anything imports redis."""
    _need_service()
    from bridge.workers.settings import WorkerSettings
    given("--broker", broker)
    ws = WorkerSettings.from_env(os.environ, broker_url=broker, **overrides)
    _check_broker(ws.broker_url, "--broker" if broker else "BRIDGE_BROKER_URL")
    return ws


def _check_broker(url: str, named: str) -> None:
    """A Redis URL redis-py can use, or one line naming the flag or variable it came from."""
    from urllib.parse import urlsplit

    from redis.connection import parse_url

    from bridge.errors import InvalidOption
    try:
        parts = parse_url(url)
        db = urlsplit(url).path.strip("/") if url.startswith(("redis://", "rediss://")) else ""
    except ValueError as exc:
        raise InvalidOption(f"{named} {safe_url(url)!r} is not a Redis URL: {exc}") from None
    if not (parts.get("host") or parts.get("path")):
        raise InvalidOption(f"{named} {safe_url(url)!r} names no host: use redis://HOST:PORT/DB")
    if db and not db.isdigit():
        raise InvalidOption(f"{named} {safe_url(url)!r}: the database must be a number, not {db!r}")


def safe_url(url: str) -> str:
    from bridge.redact import redact
    return redact(url)


def _need_service() -> None:
    """One line naming the extra when Celery or redis is not installed: every service command needs both."""
    import importlib.util

    from bridge.errors import MissingBackend
    from bridge.registry import install_hint
    def absent(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is None
        except (ImportError, ValueError):   # ValueError: a module set to None (blocked) in sys.modules
            return True

    missing = [name for name in ("celery", "redis") if absent(name)]
    if missing:
        raise MissingBackend(f"the service needs the 'service' extra: {install_hint('service')} "
                             f"({missing[0]} is missing)")


def connect(ws):
    """A Redis client that answered PING, or one line saying why not (``ws`` comes from
    ``service_settings``, which has checked that the service's packages are installed)."""
    from redis.exceptions import RedisError

    from bridge.errors import EndpointUnreachable
    from bridge.workers.keys import redis_client
    client = redis_client(ws.broker_url)
    try:
        client.ping()
    except (RedisError, OSError) as exc:
        raise EndpointUnreachable(f"cannot reach the broker at {safe_url(ws.broker_url)}: {exc}") from None
    return client


def job_records(ws):
    from bridge.workers.jobrecords import Jobs
    from bridge.workers.keys import Keys
    return Jobs(connect(ws), Keys(ws.namespace), ws.job_ttl)


def consumed(client, keys, queue: str) -> bool:
    """Whether a live worker (by the record each one keeps in Redis) consumes ``queue``: a job queued
    where none listens waits, and the submitter is told so."""
    for name in client.scan_iter(match=keys.workers_pattern, count=100):
        raw = client.get(name)
        if raw and queue in json.loads(raw).get("queues", []):
            return True
    return False
