"""Warm one node's cache: a task on that node's own queue, ``<prefix>.cache.<node>``.

A worker started on the node with ``mcbridge worker -Q bridge.cache.<node>`` (and that node's
``MCBRIDGE_CACHE_DIR``) takes it and fills its cache with bridge.cache.warm; ``mcbridge cache
warm --node NODE`` queues it. The task carries URLs and options, never a credential: the worker
reads objects with its own settings.
"""

from __future__ import annotations

import re
from typing import Any

from bridge.workers import metrics
from bridge.workers.app import app

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
