"""What the sweeper needs from the broker: send a task, and see deliveries nobody acknowledged.

kombu's Redis transport keeps every delivered, unacknowledged message in a hash (``unacked``)
with its delivery time in a sorted set (``unacked_index``), and puts it back in its queue only
after the visibility timeout. A worker killed between receiving a task and starting it leaves
such a message without a lease; ``Unacked.requeue_unleased`` queues it again after ``grace``
instead of hours later. The key names come from kombu's channel, not from here.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import time
import uuid
from collections.abc import Callable
from functools import cached_property

from bridge.workers.leases import Leases, TaskRef

# Tasks whose first argument is a job id and which take a lease when they start.
LEASED_TASKS = ("bridge.plan", "bridge.list", "bridge.transfer", "bridge.finalize")
# Tasks that are safe to send twice (they deduplicate themselves) but take no lease.
IDEMPOTENT_TASKS = ("bridge.scheduled",)


def publisher(app) -> Callable[[TaskRef], None]:
    def publish(ref: TaskRef) -> None:
        app.send_task(ref.task, args=ref.args, task_id=ref.id, queue=ref.queue)
    return publish


def direct_publisher(client, key_prefix: str) -> Callable[[TaskRef], None]:
    """A submitter's sender: the message ``app.send_task`` would send (Celery's message protocol
    2, a JSON body, in kombu's Redis framing: pushed onto the list named after the queue, under the
    deployment's key prefix), made without importing Celery and kombu, which took a third of a
    ``submit``'s start-up. tests/test_workers_publish.py holds it equal to Celery's own."""
    origin = f"{os.getpid()}@{socket.gethostname()}"

    def publish(ref: TaskRef) -> None:
        args = list(ref.args)
        body = json.dumps([args, {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}])
        message = {
            "body": base64.b64encode(body.encode()).decode(), "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": {"lang": "py", "task": ref.task, "id": ref.id, "shadow": None, "eta": None, "expires": None,
                        "group": None, "group_index": None, "retries": 0, "timelimit": [None, None],
                        "root_id": ref.id, "parent_id": None, "argsrepr": repr(args), "kwargsrepr": "{}",
                        "origin": origin, "ignore_result": None, "replaced_task_nesting": 0,
                        "stamped_headers": None, "stamps": {}},
            "properties": {"correlation_id": ref.id, "reply_to": str(uuid.uuid4()), "delivery_mode": 2,
                           "delivery_info": {"exchange": "", "routing_key": ref.queue}, "priority": 0,
                           "body_encoding": "base64", "delivery_tag": str(uuid.uuid4())},
        }
        client.lpush(key_prefix + ref.queue, json.dumps(message))
    return publish


class Unacked:
    def __init__(self, app, client):
        self.app = app
        self.r = client   # a plain client: these key names already carry the prefix

    @cached_property
    def _names(self) -> tuple[str, str]:
        with self.app.connection_for_write() as conn:
            channel = conn.default_channel
            prefix = getattr(channel, "global_keyprefix", "") or ""
            return prefix + channel.unacked_key, prefix + channel.unacked_index_key

    def drop(self, tag: str) -> None:
        """Forget a delivery whose task has been queued again by other means."""
        unacked, index = self._names
        pipe = self.r.pipeline()
        pipe.hdel(unacked, tag)
        pipe.zrem(index, tag)
        pipe.execute()

    def requeue_unleased(self, leases: Leases, requeue: Callable[[TaskRef, str], None], grace: float,
                         skip: set[str]) -> list[str]:
        r = self.r
        requeued: list[str] = []
        unacked, index = self._names
        with self.app.connection_for_write() as conn:
            channel = conn.default_channel
            for tag in r.zrangebyscore(index, "-inf", time.time() - grace):
                raw = r.hget(unacked, tag)
                if raw is None:
                    r.zrem(index, tag)
                    continue
                payload, _exchange, routing_key = json.loads(raw)
                headers = payload.get("headers") or {}
                task_id, name = headers.get("id"), headers.get("task")
                if not task_id or task_id in skip or name not in LEASED_TASKS + IDEMPOTENT_TASKS:
                    continue
                if r.exists(leases.keys.lease(task_id)):
                    continue  # running, and its worker is alive: slow, not lost
                args, _kwargs, _embed = channel.Message(payload, channel=channel).decode()
                job = args[0] if args and name in LEASED_TASKS else ""
                if not (job and r.sismember(leases.keys.job(job, "done"), task_id)):
                    requeue(TaskRef(id=task_id, task=name, args=list(args), queue=routing_key, job=job),
                            "was received by a worker that died before starting it")
                    requeued.append(task_id)
                pipe = r.pipeline()
                pipe.hdel(unacked, tag)
                pipe.zrem(index, tag)
                pipe.execute()
        return requeued
