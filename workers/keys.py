"""Redis key names of one deployment, and the Redis client of this process.

Every key starts with the namespace (``BRIDGE_NAMESPACE``, default ``mcbridge``); Celery's own
keys get the same prefix through kombu's ``global_keyprefix``::

    mcbridge:jobs                     sorted set: job id by creation time
    mcbridge:job:<id>                 hash: the job record (workers/jobrecords.py)
    mcbridge:job:<id>:errors          list: the first errors, redacted
    mcbridge:job:<id>:done            set: ids of the job's tasks that finished
    mcbridge:job:<id>:pending         counter: transfer tasks not yet finished
    mcbridge:job:<id>:attempts        hash: task id -> how many times it was started
    mcbridge:job:<id>:tasks           list: the fan-out, kept so a re-run planner re-sends it
    mcbridge:job:<id>:bw              hash: the job's bandwidth budget (workers/limits.py)
    mcbridge:journal:<plan key>:<kind> hashes: the journal (workers/redisjournal.py)
    mcbridge:lease:<task id>          string with a TTL: who runs that task (workers/leases.py)
    mcbridge:running                  hash: task id -> how to queue it again
    mcbridge:worker:<hostname>        string with a TTL: a live worker and its queues
    mcbridge:replicas                 hash: "source -> destination" -> when last synced, and last proven equal
    mcbridge:schedule:<name>          hash: the last job a schedule started
    mcbridge:budgets                  hash: budget name -> monthly limit in USD (workers/redisbudgets.py)
    mcbridge:spend:<YYYY-MM>          hash: budget name -> USD charged that month
    mcbridge:job:<id>:usage           hash: requests and bytes the job actually sent (bridge/policies/cost/usage.py fields)
    mcbridge:job:<id>:seen            hash: task id -> journal marks before its first attempt
    mcbridge:policy:<name>            hash: destination -> its replication state (workers/policies.py)
    mcbridge:policy-spend:<YYYY-MM>   hash: "<policy> <destination>" -> USD spent that month
    mcbridge:admitted:<id>            string: the digest of the signed job a worker admitted (once)
    mcbridge:once:nonce:<nonce>       string with a TTL: a signed message from beat, seen
    mcbridge:audit                    stream: every admission, refusal and job end (workers/gate.py)
    mcbridge:job:<id>:ended           pub/sub channel (no key): the job has ended, or a cancelled
                                      job's last task has stopped; what ``--wait`` blocks on
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

_clients: dict[tuple[str, int], object] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class Keys:
    namespace: str

    def _k(self, *parts: str) -> str:
        return ":".join((self.namespace, *parts))

    @property
    def jobs(self) -> str:
        return self._k("jobs")

    def job(self, job_id: str, *sub: str) -> str:
        return self._k("job", job_id, *sub)

    def journal(self, plan_key: str) -> str:
        return self._k("journal", plan_key)

    def lease(self, task_id: str) -> str:
        return self._k("lease", task_id)

    @property
    def running(self) -> str:
        return self._k("running")

    @property
    def sweeper(self) -> str:
        return self._k("sweeper")

    def worker(self, hostname: str) -> str:
        return self._k("worker", hostname)

    @property
    def workers_pattern(self) -> str:
        return self._k("worker", "*")

    @property
    def replicas(self) -> str:
        return self._k("replicas")

    def schedule(self, name: str) -> str:
        return self._k("schedule", name)

    def once(self, token: str) -> str:
        return self._k("once", token)

    def admitted(self, job_id: str) -> str:
        return self._k("admitted", job_id)

    @property
    def audit(self) -> str:
        return self._k("audit")

    def policy(self, name: str) -> str:
        return self._k("policy", name)

    def policy_spend(self, month: str) -> str:
        return self._k("policy-spend", month)


def redis_client(url: str, ride_out: float = 0.0):
    """One client per URL and process (a client must not cross a fork). ``ride_out``: seconds
    for which a call whose connection is refused or dropped tries again (a worker's, through a
    Redis restart or failover: two thirds of its lease, when its fence would stop the task
    anyway); 0 (a command-line call's) keeps redis-py's default, which did not reconnect to a
    restarted Redis: a call made while it was down failed in 10 ms (redis-py 8.2)."""
    import redis

    key = (url, os.getpid(), ride_out)
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = redis.Redis.from_url(
                url, decode_responses=True, socket_connect_timeout=5, socket_timeout=30,
                health_check_interval=30, **_riding_out(ride_out))
        return client


RIDE_OUT_STEP = 0.5   # the longest wait between two tries of a call through an outage


def _riding_out(seconds: float) -> dict:
    """redis-py's retry settings that keep a call trying for about ``seconds`` while Redis
    refuses or drops its connections (waits of 0.1 s doubling up to RIDE_OUT_STEP): a restart,
    a failover. A timeout (a host that does not answer at all: a partition) is not tried again,
    as before: each try would wait out the 5 s connect or 30 s read timeout; the lease's fence,
    on a thread of its own, stops the task meanwhile."""
    from redis.backoff import ExponentialBackoff
    from redis.exceptions import ConnectionError
    from redis.retry import Retry

    if seconds <= 0:
        return {}
    tries, waited, wait = 0, 0.0, 0.05
    while waited < seconds:
        wait = min(RIDE_OUT_STEP, wait * 2)
        waited += wait
        tries += 1
    return {"retry": Retry(ExponentialBackoff(cap=RIDE_OUT_STEP, base=0.05), tries, supported_errors=(ConnectionError,)),
            "retry_on_error": [ConnectionError]}
