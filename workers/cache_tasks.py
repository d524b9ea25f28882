"""Warm one node's cache: a task on that node's own queue, ``<prefix>.cache.<node>``.

A worker started on the node with ``mcbridge worker -Q bridge.cache.<node>`` (and that node's
``MCBRIDGE_CACHE_DIR``) takes it and fills its cache with bridge.cache.warm; ``mcbridge cache
warm --node NODE`` queues it. The task carries URLs and options, never a credential: the worker
reads objects with its own settings.
"""

from __future__ import annotations

import re
from typing import Any

from workers import metrics
from workers.app import app

WARM = "bridge.cache.warm"
_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}$")


def node_queue(prefix: str, node: str) -> str:
    from bridge.errors import InvalidOption
    if not _NODE.match(node):
        raise InvalidOption(f"invalid node name {node!r}: letters, digits, '.', '_' and '-' only")
    return f"{prefix}.cache.{node}"


@app.task(name=WARM, bind=True)
def warm(self, items: list[str], profile: str | None = None, lookahead: int | None = None) -> dict[str, Any]:
    from bridge.cache import warm as run_warm
    from bridge.config import load_settings
    summary = run_warm(items, load_settings(profile=profile), lookahead)
    queue = (self.request.delivery_info or {}).get("routing_key") or ""
    metrics.cache(queue, summary["hits"], summary["misses"], summary["bytes_filled"])
    return summary


def submit_warm(node: str, items: list[str], *, profile: str | None = None, lookahead: int | None = None,
                wait: bool = False, broker: str | None = None, timeout: float | None = None) -> dict[str, Any]:
    """Queue a warm on ``node``'s queue; with ``wait``, the worker's summary (errors raised as one line)."""
    from bridge.errors import BridgeError
    from bridge.urls import parse
    from workers.app import configure
    from bridge.cli.options import err
    from workers.commands import _connect, _consumed, _ws
    from workers.keys import Keys
    for item in items:
        parse(item)   # a bad URL is refused here, before anything is queued
    ws = _ws(broker)
    queue = node_queue(ws.queue_prefix, node)
    client = _connect(ws)
    configure(ws)
    if not _consumed(client, Keys(ws.namespace), queue):
        err.print(f"mcbridge: warning: no live worker consumes queue {queue}; the warm waits for one "
                  f"(mcbridge worker -Q {queue} on {node})", markup=False)
    result = app.send_task(WARM, args=[list(items), profile, lookahead], queue=queue)
    summary: dict[str, Any] = {"task_id": result.id, "queue": queue, "node": node}
    if wait:
        try:
            summary["result"] = result.get(timeout=timeout, propagate=True)
        except BridgeError:
            raise
        except Exception as exc:  # the worker's error, re-raised by Celery under its own type name
            raise BridgeError(f"cache warm on {node} failed: {type(exc).__name__}: {exc}") from None
    return summary
