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
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from functools import cache

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


@cache
def _metrics() -> dict | None:
    pc = _client()
    if pc is None:
        return None
    return {
        "moved": pc.Counter("bridge_bytes_moved", "Bytes sent to a destination", ["queue"]),
        "skipped": pc.Counter("bridge_bytes_skipped", "Bytes found already at the destination", ["queue"]),
        "units": pc.Counter("bridge_units", "Units finished", ["queue", "result"]),
        "retries": pc.Counter("bridge_retries", "Store requests retried", ["queue"]),
        "routed": pc.Counter("bridge_route_bytes", "Bytes put at destinations, by route and by who moved them",
                             ["queue", "route", "path"]),
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


def routed(queue: str, route: str, moved: int = 0, through: int = 0) -> None:
    m = _metrics()
    if m is None:
        return
    if through > 0:
        m["routed"].labels(queue, route, "bridge").inc(through)
    if moved - through > 0:
        m["routed"].labels(queue, route, "store").inc(moved - through)


def task(name: str, outcome: str) -> None:
    m = _metrics()
    if m is not None:
        m["tasks"].labels(name, outcome).inc()


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
            commit_to_verified: float | None = None) -> None:
    m = _metrics()
    if m is None:
        return
    if commit_to_verified is not None:
        m["commit_latency"].labels(policy, destination).observe(commit_to_verified)
    m["lag"].labels(policy, destination).set(lag)
    if verified_at is not None:
        m["verified"].labels(policy, destination).set(verified_at)
    if spent > 0:
        m["spend"].labels(policy, destination).inc(spent)


def serve(port: int, addr: str):
    """Start the HTTP endpoint (a daemon thread); None if off, unavailable or the port is taken."""
    pc = _client()
    if not port or pc is None:
        return None
    from prometheus_client import CollectorRegistry, multiprocess
    registry = CollectorRegistry()
    if _ENV in os.environ:
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = pc.REGISTRY
    try:
        server, _thread = pc.start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        log.warning("metrics endpoint not started: %s:%s: %s", addr, port, exc)
        return None
    log.info("metrics on http://%s:%s/metrics", addr, port)
    return server
