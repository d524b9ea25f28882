"""Prometheus metrics of a worker: bytes moved, units done and failed, retries, job durations.

Tasks run in the worker's pool processes, so the counters use prometheus_client's multiprocess
mode: ``prepare`` (in the worker's main process, before the pool forks) points
``PROMETHEUS_MULTIPROC_DIR`` at a fresh directory, every process writes its values there, and
``serve`` exposes their sum on ``BRIDGE_METRICS_PORT``. Without prometheus_client installed the
metrics are a no-op and the worker says so once.

    bridge_bytes_moved_total{queue}         bytes sent to a destination
    bridge_bytes_skipped_total{queue}       bytes found already there (resumed work)
    bridge_units_total{queue,result}        units done / failed
    bridge_retries_total{queue}             retried store requests
    bridge_route_bytes_total{queue,route,path}  bytes a route put at destinations: path="bridge"
                                            passed through the worker, path="store" the stores
                                            (or a cloud service) moved themselves (bridge/routes)
    bridge_tasks_total{task,outcome}        tasks run / skipped as duplicates / requeued
    bridge_job_duration_seconds{kind,state} from running to the end, per finished job
    bridge_cache_objects_total{queue,result} objects a cache warm found cached (hit) or filled (miss)
    bridge_cache_bytes_filled_total{queue}  bytes a cache warm downloaded into its node's cache
    bridge_replica_lag_checkpoints{policy,destination}      source checkpoints newer than the
                                                            newest verified there, after each run
    bridge_replica_verified_timestamp_seconds{policy,destination}  when that was last verified
    bridge_replica_spend_usd_total{policy,destination}      dollars the policy's runs spent there
    bridge_replica_committed_timestamp_seconds{policy,destination}  commit time of the source's
                                                            newest committed checkpoint, seen by the last run
    bridge_replica_verified_commit_timestamp_seconds{policy,destination}  commit time of the newest
                                                            checkpoint verified at the destination
    bridge_replica_rpo_seconds{policy,destination}          the policy's own RPO (``rpo``), where it
                                                            sets one (the alert rule's 4 h elsewhere)
    bridge_store_requests_total{store,kind}  requests sent to a store (scheme://bucket), by kind
    bridge_store_errors_total{store}         answers of status 400 or more from a store
    bridge_store_retries_total{endpoint}     requests retried, by the store's endpoint (bridge/retry.py)

``bridge_route_bytes_total`` also carries ``tenant`` (whom the job is signed for) and
``destination`` (the destination's scheme://bucket).

Read from the deployment's Redis records when Prometheus scrapes (``Records``; every worker
reports the same values, so a dashboard takes the max over workers). The records are Redis's,
taken on trust, as ``mcbridge jobs`` takes them:

    bridge_jobs{tenant,kind,state}          job records by state (the newest ``MAX_JOBS``)
    bridge_queue_depth{queue}               messages waiting in a queue
    bridge_workers_live{queue}              workers whose presence key names the queue
    bridge_worker_processes{queue}          their pool processes
    bridge_budget_limit_usd{budget}         a budget's monthly limit
    bridge_budget_spent_usd{budget}         spent this month (UTC)
    bridge_budget_reserved_usd{budget}      held by admitted jobs that have not ended
    bridge_job_bytes_done{tenant,job_id,queue}  bytes done so far by a running job
    bridge_job_started_timestamp_seconds{tenant,job_id,queue}  when it started
    bridge_cache_node_used_bytes, bridge_cache_node_quota_bytes   this node's cache, when it has one
    bridge_cache_node_{hits,misses,bytes_hit,bytes_filled,evictions}_total  its own counters
                                            (stats.json: every process that reads through it)

Every series a worker exposes carries ``namespace`` (BRIDGE_NAMESPACE): one Prometheus can
watch several deployments on one Redis.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
from collections import Counter
from functools import cache

from bridge import retry

log = logging.getLogger(__name__)

_ENV = "PROMETHEUS_MULTIPROC_DIR"


def prepare() -> str | None:
    """Set up multiprocess mode for this process and the ones it forks; returns the directory."""
    directory = tempfile.mkdtemp(prefix="mcbridge-metrics-")
    os.environ[_ENV] = directory  # prometheus_client's only way to be told, read in forked children
    return directory


def cleanup(directory: str | None) -> None:
    if directory:
        shutil.rmtree(directory, ignore_errors=True)


def process_exited(pid: int) -> None:
    if _ENV in os.environ and _client() is not None:
        from prometheus_client import multiprocess
        multiprocess.mark_process_dead(pid)


@cache
def _client():
    try:
        import prometheus_client
    except ImportError:
        from bridge.registry import install_hint
        log.warning("prometheus_client is not installed: no metrics (it comes with the 'service' extra: %s)",
                    install_hint("service"))
        return None
    return prometheus_client


_MADE = threading.Lock()


def _metrics() -> dict | None:
    """The metrics, registered once: two threads asking first at the same moment (a task's
    progress and the request meter) would otherwise both register them, and the second fails
    with DuplicateTimeseries."""
    with _MADE:
        return _registered()


@cache
def _registered() -> dict | None:
    pc = _client()
    if pc is None:
        return None
    return {
        "moved": pc.Counter("bridge_bytes_moved", "Bytes sent to a destination", ["queue"]),
        "skipped": pc.Counter("bridge_bytes_skipped", "Bytes found already at the destination", ["queue"]),
        "units": pc.Counter("bridge_units", "Units finished", ["queue", "result"]),
        "retries": pc.Counter("bridge_retries", "Store requests retried", ["queue"]),
        "routed": pc.Counter("bridge_route_bytes", "Bytes put at destinations, by route and by who moved them",
                             ["queue", "route", "path", "tenant", "destination"]),
        "tasks": pc.Counter("bridge_tasks", "Tasks by outcome", ["task", "outcome"]),
        "duration": pc.Histogram("bridge_job_duration_seconds", "Job duration from start to end",
                                 ["kind", "state"],
                                 buckets=(1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 48 * 3600)),
        "cache_objects": pc.Counter("bridge_cache_objects", "Objects a cache warm found or filled",
                                    ["queue", "result"]),
        "cache_filled": pc.Counter("bridge_cache_bytes_filled", "Bytes filled into a node's cache", ["queue"]),
        "lag": pc.Gauge("bridge_replica_lag_checkpoints", "Source checkpoints newer than the newest verified "
                        "at the destination", ["policy", "destination"], multiprocess_mode="mostrecent"),
        "verified": pc.Gauge("bridge_replica_verified_timestamp_seconds", "When the destination last had its "
                             "newest checkpoint verified", ["policy", "destination"], multiprocess_mode="mostrecent"),
        "spend": pc.Counter("bridge_replica_spend_usd", "US dollars a policy's runs spent at a destination",
                            ["policy", "destination"]),
        "committed": pc.Gauge("bridge_replica_committed_timestamp_seconds", "Commit time of the source's newest "
                              "committed checkpoint, as the policy's last run saw it", ["policy", "destination"],
                              multiprocess_mode="mostrecent"),
        "verified_commit": pc.Gauge("bridge_replica_verified_commit_timestamp_seconds", "Commit time of the newest "
                                    "checkpoint verified at the destination", ["policy", "destination"],
                                    multiprocess_mode="mostrecent"),
        "rpo": pc.Gauge("bridge_replica_rpo_seconds", "The policy's recovery point objective: how long its "
                        "newest committed checkpoint may wait to be verified at the destination",
                        ["policy", "destination"], multiprocess_mode="mostrecent"),
        "store_requests": pc.Counter("bridge_store_requests", "Requests sent to a store", ["store", "kind"]),
        "store_errors": pc.Counter("bridge_store_errors", "Answers of status 400 or more from a store", ["store"]),
        "store_retries": pc.Counter("bridge_store_retries", "Requests retried, by the store's endpoint", ["endpoint"]),
        "commit_latency": pc.Histogram("bridge_replica_commit_to_verified_seconds", "From a checkpoint's commit "
                                       "(its marker) to its verification at a destination", ["policy", "destination"],
                                       buckets=(1, 5, 15, 30, 60, 120, 300, 900, 3600, 4 * 3600, 24 * 3600)),
    }


def transfer(queue: str, moved: int = 0, skipped: int = 0, done: int = 0, failed: int = 0,
             retries: int = 0) -> None:
    m = _metrics()
    if m is None:
        return
    for name, value, labels in (("moved", moved, (queue,)), ("skipped", skipped, (queue,)),
                                ("units", done, (queue, "done")), ("units", failed, (queue, "failed")),
                                ("retries", retries, (queue,))):
        if value > 0:
            m[name].labels(*labels).inc(value)


def routed(queue: str, route: str, moved: int = 0, through: int = 0, tenant: str = "",
           destination: str = "") -> None:
    m = _metrics()
    if m is None:
        return
    if through > 0:
        m["routed"].labels(queue, route, "bridge", tenant, destination).inc(through)
    if moved - through > 0:
        m["routed"].labels(queue, route, "store", tenant, destination).inc(moved - through)


def store_of(url: str) -> str:
    """A URL's store as a label: scheme://bucket (a local path: its scheme alone)."""
    from bridge.urls import parse
    loc = parse(url)
    return f"{loc.scheme}://{loc.bucket}" if loc.bucket else f"{loc.scheme}://"


def metered(fields: dict[str, int]) -> None:
    """One count of a job's meter (bridge/meter.py's flat fields: ``store|req.KIND``,
    ``store|errors`` ...): requests and error answers per store."""
    m = _metrics()
    if m is None:
        return
    for name, value in fields.items():
        store, _, what = name.rpartition("|")
        if value <= 0 or not store:
            continue
        if what.startswith("req."):
            m["store_requests"].labels(store, what[4:]).inc(value)
        elif what == "errors":
            m["store_errors"].labels(store).inc(value)


def task(name: str, outcome: str) -> None:
    m = _metrics()
    if m is not None:
        m["tasks"].labels(name, outcome).inc()


def _retried(where: str | None) -> None:
    m = _metrics()
    if m is not None:
        from bridge.redact import redact   # an endpoint given with credentials in it keeps them out
        m["store_retries"].labels(redact(where) if where else "unknown").inc()


retry.retry_listeners.append(_retried)


def job_finished(kind: str, state: str, seconds: float) -> None:
    m = _metrics()
    if m is not None and seconds >= 0:
        m["duration"].labels(kind, state).observe(seconds)


def cache(queue: str, hits: int = 0, misses: int = 0, bytes_filled: int = 0) -> None:
    m = _metrics()
    if m is None:
        return
    for result, value in (("hit", hits), ("miss", misses)):
        if value > 0:
            m["cache_objects"].labels(queue, result).inc(value)
    if bytes_filled > 0:
        m["cache_filled"].labels(queue).inc(bytes_filled)


def replica(policy: str, destination: str, *, lag: int, verified_at: float | None, spent: float,
            commit_to_verified: float | None = None, committed_at: float | None = None,
            verified_committed_at: float | None = None, rpo: float | None = None) -> None:
    """``committed_at``: when the source's newest committed checkpoint was committed;
    ``verified_committed_at``: when the newest checkpoint verified at ``destination`` was;
    ``rpo``: the policy's RPO in seconds, when it sets one."""
    m = _metrics()
    if m is None:
        return
    if rpo is not None:
        m["rpo"].labels(policy, destination).set(rpo)
    if committed_at is not None:
        m["committed"].labels(policy, destination).set(committed_at)
    if verified_committed_at is not None:
        m["verified_commit"].labels(policy, destination).set(verified_committed_at)
    if commit_to_verified is not None:
        m["commit_latency"].labels(policy, destination).observe(commit_to_verified)
    m["lag"].labels(policy, destination).set(lag)
    if verified_at is not None:
        m["verified"].labels(policy, destination).set(verified_at)
    if spent > 0:
        m["spend"].labels(policy, destination).inc(spent)


def serve(port: int, addr: str, records: Records | None = None):
    """Start the HTTP endpoint (a daemon thread); None if off, unavailable or the port is taken.
    With ``records``, its gauges are read at each scrape, and every series carries its namespace."""
    pc = _client()
    if not port or pc is None:
        return None
    from prometheus_client import CollectorRegistry, multiprocess
    if _ENV in os.environ:
        counted = multiprocess.MultiProcessCollector(None)
    else:
        counted = pc.REGISTRY
    registry = CollectorRegistry(auto_describe=False)
    if records is None:
        registry.register(counted)
    else:
        registry.register(_Labelled([counted, records], {"namespace": records.keys.namespace}))
    try:
        server, _thread = pc.start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        log.warning("metrics endpoint not started: %s:%s: %s", addr, port, exc)
        return None
    log.info("metrics on http://%s:%s/metrics", addr, port)
    return server


MAX_JOBS = 2000   # job records read per scrape, newest first: a window, not the whole history


class _Labelled:
    """Collectors whose every sample gets the given labels too."""

    def __init__(self, collectors: list, labels: dict[str, str]):
        self.collectors, self.labels = collectors, labels

    def collect(self):
        from prometheus_client.metrics_core import Metric
        for collector in self.collectors:
            for family in collector.collect():
                out = Metric(family.name, family.documentation, family.type, family.unit)
                for sample in family.samples:
                    out.add_sample(sample.name, {**sample.labels, **self.labels}, sample.value,
                                   sample.timestamp, sample.exemplar)
                yield out


def _tenant(auth: str | None) -> str:
    """Whom a record's signature names (its ``auth`` field, JSON), or "" for none."""
    try:
        signed = json.loads(auth) if auth else None
    except ValueError:
        return ""
    return str(signed.get("tenant") or "") if isinstance(signed, dict) else ""


class Records:
    """The deployment's state in Redis, as gauges, read when Prometheus scrapes: jobs by state,
    queues and the workers on them, budgets, running jobs' bytes, and this node's cache. A Redis
    that does not answer gives a scrape without these series (and a warning), not a failed one."""

    def __init__(self, client, keys, queues: list[str], prefix: str, cache_settings=None):
        """``queues``: those always reported; besides them, every queue named ``prefix`` or
        ``prefix.*`` that a worker consumes or once declared (a node's cache queue whose worker
        is gone still has its work counted). ``cache_settings``: the bridge Settings naming this
        node's cache (default: this process's, read at each scrape)."""
        self.r, self.keys, self.queues, self.cache_settings = client, keys, list(queues), cache_settings
        self.prefix = prefix

    def collect(self):
        from redis.exceptions import RedisError
        try:
            families = [*self._jobs(), *self._queues(), *self._budgets()]
        except RedisError as exc:
            log.warning("metrics: the records in Redis not read: %s", exc)
            families = []
        yield from families
        yield from self._cache()

    def _jobs(self):
        from prometheus_client.core import GaugeMetricFamily

        from bridge.workers.jobrecords import STATES
        ids = self.r.zrevrange(self.keys.jobs, 0, MAX_JOBS - 1)
        pipe = self.r.pipeline(transaction=False)
        for job_id in ids:
            pipe.hmget(self.keys.job(job_id), "state", "kind", "auth", "queue", "started", "bytes_done")
        counts: Counter = Counter()
        done = GaugeMetricFamily("bridge_job_bytes_done", "Bytes done so far by a running job",
                                 labels=["tenant", "job_id", "queue"])
        started = GaugeMetricFamily("bridge_job_started_timestamp_seconds", "When a running job started",
                                    labels=["tenant", "job_id", "queue"])
        for job_id, (state, kind, auth, queue, began, nbytes) in zip(ids, pipe.execute() if ids else []):
            if state not in STATES:
                continue   # expired, or not a record
            tenant = _tenant(auth)
            counts[(tenant, kind or "", state)] += 1
            if state == "running" and began:
                done.add_metric([tenant, job_id, queue or ""], float(nbytes or 0))
                started.add_metric([tenant, job_id, queue or ""], float(began))
        jobs = GaugeMetricFamily("bridge_jobs", f"Job records by state (the newest {MAX_JOBS})",
                                 labels=["tenant", "kind", "state"])
        for labels, n in sorted(counts.items()):
            jobs.add_metric(list(labels), n)
        return [jobs, done, started]

    def _queues(self):
        from prometheus_client.core import GaugeMetricFamily
        live: Counter = Counter()
        processes: Counter = Counter()
        # One walk of the keyspace for both: the workers' presence keys, and kombu's bindings
        # (``_kombu.binding.<exchange>``, the exchange named after its queue), which outlive the
        # workers that declared them.
        prefix = f"{self.keys.namespace}:"
        workers, declared = [], set()
        for key in self.r.scan_iter(match=f"{prefix}[w_]*", count=1000):
            if key.startswith(self.keys.worker("")):
                workers.append(key)
            elif key.startswith(f"{prefix}_kombu.binding."):
                name = key[len(f"{prefix}_kombu.binding."):]
                if name == self.prefix or name.startswith(f"{self.prefix}."):
                    declared.add(name)
        for raw in (self.r.mget(workers) if workers else []):
            try:
                presence = json.loads(raw) if raw else None
            except ValueError:
                presence = None
            if not isinstance(presence, dict):
                continue   # gone since the scan
            for queue in presence.get("queues") or []:
                live[queue] += 1
                processes[queue] += int(presence.get("concurrency") or 0)
        queues = sorted(set(self.queues) | set(live) | declared)
        pipe = self.r.pipeline(transaction=False)
        for queue in queues:
            # kombu keeps a queue's messages of priority 0 under its name, others under name + a
            # separator and the priority step
            for name in (queue, *(f"{queue}\x06\x16{step}" for step in (3, 6, 9))):
                pipe.llen(prefix + name)
        lengths = pipe.execute() if queues else []
        depth = GaugeMetricFamily("bridge_queue_depth", "Messages waiting in a queue", labels=["queue"])
        workers = GaugeMetricFamily("bridge_workers_live", "Live workers consuming a queue", labels=["queue"])
        pool = GaugeMetricFamily("bridge_worker_processes", "Pool processes of the live workers on a queue",
                                 labels=["queue"])
        for i, queue in enumerate(queues):
            depth.add_metric([queue], sum(lengths[4 * i:4 * i + 4]))
            workers.add_metric([queue], live.get(queue, 0))
            pool.add_metric([queue], processes.get(queue, 0))
        return [depth, workers, pool]

    def _budgets(self):
        from prometheus_client.core import GaugeMetricFamily

        from bridge.workers.redisbudgets import Budgets
        limit = GaugeMetricFamily("bridge_budget_limit_usd", "A budget's monthly limit", labels=["budget"])
        spent = GaugeMetricFamily("bridge_budget_spent_usd", "Spent this month (UTC)", labels=["budget"])
        held = GaugeMetricFamily("bridge_budget_reserved_usd", "Held by admitted jobs that have not ended",
                                 labels=["budget"])
        for name, row in Budgets(self.r, self.keys).all().items():
            if row["limit_usd"] is not None:
                limit.add_metric([name], row["limit_usd"])
            spent.add_metric([name], row["spent_usd"])
            held.add_metric([name], row["reserved_usd"])
        return [limit, spent, held]

    def _cache(self):
        """This node's cache (a worker with ``MCBRIDGE_CACHE_DIR``): its size, quota and counters."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        from bridge.cache.core import Cache
        from bridge.config import load_settings
        from bridge.errors import BridgeError
        try:
            settings = self.cache_settings or load_settings()
        except BridgeError as exc:
            log.warning("metrics: no settings for the cache: %s", exc)
            return
        directory = settings.cache.dir
        if not directory or not os.path.isdir(os.path.join(directory, "objects")):
            return   # no cache on this node (a cache is made by its first use, never by a scrape)
        try:
            cache = Cache(settings, directory)
            try:
                stat = cache.stat()
            finally:
                cache.close()
        except (BridgeError, OSError) as exc:
            log.warning("metrics: the cache at %s not read: %s", directory, exc)
            return
        used = GaugeMetricFamily("bridge_cache_node_used_bytes", "Bytes this node's cache holds", labels=["dir"])
        used.add_metric([stat["dir"]], stat["bytes"])
        yield used
        if stat["quota"] is not None:
            quota = GaugeMetricFamily("bridge_cache_node_quota_bytes", "This node's cache quota", labels=["dir"])
            quota.add_metric([stat["dir"]], stat["quota"])
            yield quota
        for name in ("hits", "misses", "bytes_hit", "bytes_filled", "evictions"):
            family = CounterMetricFamily(f"bridge_cache_node_{name}", f"This node's cache: {name.replace('_', ' ')}",
                                         labels=["dir"])
            family.add_metric([stat["dir"]], stat.get(name, 0))
            yield family
