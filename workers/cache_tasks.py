"""Warm one node's cache: a task on that node's own queue, ``<prefix>.cache.<node>``.

A worker started on the node with ``mcbridge worker -Q bridge.cache.<node>`` (and that node's
``MCBRIDGE_CACHE_DIR``) takes it and fills its cache with bridge.cache.warm; ``mcbridge cache
warm --node NODE`` queues it. The task carries URLs and options, never a credential: the worker
reads objects with its own settings, and only when the message is signed for a tenant allowed to
read them (workers/gate.py), so a warm written to the broker by hand fills no cache.
"""

from __future__ import annotations

import json
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


def payload(items: list[str], profile: str | None, lookahead: int | None) -> list:
    """What a warm's signature covers (with the node's name)."""
    return [list(items), profile, lookahead]


@app.task(name=WARM, bind=True)
def warm(self, items: list[str], profile: str | None = None, lookahead: int | None = None,
         auth: dict | None = None, node: str = "") -> dict[str, Any]:
    from bridge.cache import warm as run_warm
    from bridge.config import load_settings
    from bridge.workers.app import service
    from bridge.workers.auth import Refused
    from bridge.workers.gate import Admitted
    gate = service().gate
    try:
        tenant = gate.message(WARM, node, payload(items, profile, lookahead), auth)
        gate.scope(Admitted(tenant, "", None), reads=items, job=False)
    except Refused as exc:
        gate.audit.record("refused", task=self.request.id, node=node, source=json.dumps(items), reason=str(exc))
        raise
    gate.audit.record("admitted", task=self.request.id, node=node, tenant=tenant, source=json.dumps(items))
    summary = run_warm(items, load_settings(profile=profile), lookahead)
    queue = (self.request.delivery_info or {}).get("routing_key") or ""
    metrics.cache(queue, summary["hits"], summary["misses"], summary["bytes_filled"])
    return summary
