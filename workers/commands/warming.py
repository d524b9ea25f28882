"""``mcbridge cache warm --node``: the warm queued on that node's queue for the worker there. The
cache group is the core's; this fills its "warm on a node" hook (bridge.registry)."""

from __future__ import annotations

from typing import Any

from bridge.cli.options import err
from bridge.workers.commands.connection import connect, consumed, service_settings


def submit_warm(node: str, items: list[str], *, profile: str | None = None, lookahead: int | None = None,
                wait: bool = False, broker: str | None = None, timeout: float | None = None) -> dict[str, Any]:
    """Queue a warm on ``node``'s queue; with ``wait``, the worker's summary within ``timeout``
    seconds (errors, and no answer by then, raised as one line)."""
    from bridge.errors import BridgeError
    from bridge.urls import parse
    from bridge.workers.app import app, configure
    from bridge.workers.cache_tasks import WARM, node_queue
    from bridge.workers.keys import Keys
    for item in items:
        parse(item)   # a bad URL is refused here, before anything is queued
    ws = service_settings(broker)
    queue = node_queue(ws.queue_prefix, node)
    client = connect(ws)
    configure(ws)
    if not consumed(client, Keys(ws.namespace), queue):
        err.print(f"mcbridge: warning: no live worker consumes queue {queue}; the warm waits for one "
                  f"(mcbridge worker -Q {queue} on {node})", markup=False)
    from bridge.workers.auth import Keyring, message_ttl
    from bridge.workers.cache_tasks import payload
    keyring = Keyring.load(ws)
    signed = keyring.sign_message(keyring.signer(), WARM, node, payload(items, profile, lookahead),
                                  ttl=message_ttl(ws))
    result = app.send_task(WARM, args=[*payload(items, profile, lookahead), signed, node], queue=queue)
    summary: dict[str, Any] = {"task_id": result.id, "queue": queue, "node": node}
    if wait:
        from celery.exceptions import TimeoutError as NoAnswer
        try:
            summary["result"] = result.get(timeout=timeout, propagate=True)
        except NoAnswer:
            raise BridgeError(f"cache warm on {node}: no summary from a worker after {timeout:g}s (--timeout); "
                              f"the warm stays queued on {queue} for the next worker there") from None
        except BridgeError:
            raise
        except Exception as exc:  # the worker's error, re-raised by Celery under its own type name
            raise BridgeError(f"cache warm on {node} failed: {type(exc).__name__}: {exc}") from None
    return summary
