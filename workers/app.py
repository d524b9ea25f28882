"""The Celery app: ``celery -A bridge.workers.app worker|beat|flower`` and ``mcbridge worker|beat`` use it.

Its settings come from ``bridge.workers.settings`` (the environment, read once, here). Each worker's
main process also runs the ``Upkeep`` step: it announces the worker in Redis, sweeps for tasks
of dead workers (workers/leases.py) and serves the Prometheus metrics.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from celery import Celery, bootsteps, signals

from bridge import redact
from bridge.workers import metrics
from bridge.workers.settings import WorkerSettings, celery_config

log = logging.getLogger(__name__)

app = Celery("bridge", include=["bridge.workers.tasks", "bridge.workers.cache_tasks"])
settings: WorkerSettings = WorkerSettings.from_env(os.environ)
_service = None


def configure(ws: WorkerSettings) -> None:
    """Use ``ws`` from now on (the CLI passes its flags this way, never through os.environ)."""
    global settings, _service
    from bridge.workers import auth
    settings = ws
    _service = None
    auth.configure(ws)   # what beat signs its messages with
    app.conf.update(celery_config(ws))


configure(settings)


def service():
    """This process's ``Service``, made on first use in each process (a pool process forked
    later must not share its parent's)."""
    global _service
    if _service is None or _service[0] != os.getpid():
        from bridge.workers.broker import publisher
        from bridge.workers.executor import Service
        from bridge.workers.keys import redis_client
        # (a call rides out a Redis restart for as long as the task's lease would keep it: FENCE)
        from bridge.workers.leases import FENCE
        _service = (os.getpid(), Service(settings, redis_client(settings.broker_url, ride_out=settings.lease * FENCE),
                                         publisher(app)))
    return _service[1]


class Upkeep(bootsteps.StartStopStep):
    """Presence, sweeping and metrics, in the worker's main process."""

    requires = {"celery.worker.components:Pool"}

    def __init__(self, worker, **kwargs):
        super().__init__(worker, **kwargs)
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None
        self.server = None

    def start(self, worker) -> None:
        import json

        from bridge.workers.broker import Unacked
        from bridge.workers.leases import Sweeper
        svc = service()
        queues = sorted(worker.app.amqp.queues.consume_from or [])
        presence = json.dumps({"hostname": worker.hostname, "pid": os.getpid(), "queues": queues,
                               "concurrency": worker.concurrency, "started": time.time(),
                               "metrics_port": settings.metrics_port})
        sweeper = Sweeper(svc.leases, svc.send, Unacked(app, svc.r),
                          on_requeue=lambda ref: (svc.jobs.add_progress(ref.job, {"requeued": 1})
                                                  if ref.job else None, metrics.task(ref.task, "requeued")))
        self.server = metrics.serve(settings.metrics_port, settings.metrics_addr,
                                    metrics.Records(svc.r, svc.keys, settings.default_queues(),
                                                    settings.queue_prefix))

        from kombu.exceptions import OperationalError
        from redis.exceptions import RedisError

        def loop() -> None:
            while True:
                try:
                    svc.r.set(svc.keys.worker(worker.hostname), presence,
                              px=int(max(settings.sweep * 3, settings.lease) * 1000))
                    sweeper.sweep(lock_ttl=max(settings.sweep * 2, 5.0))
                except (RedisError, OperationalError, OSError) as exc:  # broker away: next round
                    log.warning("upkeep: %s", redact.redact(str(exc)))
                except Exception:  # a bug must not stop the sweeping for good
                    log.exception("upkeep failed; trying again in %ss", settings.sweep)
                if self.stop_event.wait(settings.sweep):
                    return

        self.thread = threading.Thread(target=loop, name="bridge-upkeep", daemon=True)
        self.thread.start()

    def stop(self, worker) -> None:
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
        try:
            svc = service()
            svc.r.delete(svc.keys.worker(worker.hostname))
        except Exception as exc:
            log.info("upkeep: could not withdraw this worker: %s", exc)
        if self.server is not None:
            self.server.shutdown()


app.steps["worker"].add(Upkeep)

_metrics_dir: str | None = None


# What a pool process's first tasks would import otherwise: the engine and stores, the SDK stacks
# the stores import when first needed (a CLI's short job may never need them; a worker's jobs
# price their plan and ask a bucket's region through them), the cost model, the metrics client.
PRELOAD = ("bridge.pipeline.execute", "bridge.ops", "bridge.verdicts", "bridge.pricing", "bridge.stores.local",
           "bridge.stores.s3", "bridge.stores.s3direct", "bridge.stores.gcs", "bridge.stores.azure",
           "s3fs", "aiobotocore.session", "gcsfs.core", "azure.storage.blob", "prometheus_client")


@signals.worker_init.connect
def _before_pool(**_kwargs) -> None:
    """Before the pool forks: metrics in multiprocess mode, and the engine, the store SDKs and the
    cost model imported once here rather than in every pool process on its first task (about a
    second each), then frozen (gc.freeze)."""
    global _metrics_dir
    if settings.metrics_port:
        _metrics_dir = metrics.prepare()
    import gc
    import importlib
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError as exc:  # an extra that is not installed: its scheme fails when used
            log.debug("not preloaded: %s (%s)", name, exc)
    # The price tables every job's plan is priced with (YAML, parsed once per process: a fifth
    # of a second of each pool process's first plan on this kind of machine).
    from bridge.policies.cost.prices import builtin
    try:
        builtin()
    except Exception as exc:   # a job priced with them says what is wrong, in its record
        log.warning("price tables not preloaded: %s", exc)
    # Shared with every pool process: out of their collector's reach (it would walk it, and
    # touch its pages, on every full collection).
    gc.collect()
    gc.freeze()


@signals.worker_shutdown.connect
def _after_worker(**_kwargs) -> None:
    metrics.cleanup(_metrics_dir)


@signals.worker_process_shutdown.connect
def _child_gone(pid=None, **_kwargs) -> None:
    metrics.process_exited(pid or os.getpid())


@signals.after_setup_logger.connect
@signals.after_setup_task_logger.connect
def _redact_logs(logger=None, loglevel=None, **_kwargs) -> None:
    redact.install(logger)
    redact.install()
    from bridge.logs import quiet_libraries
    level = loglevel if isinstance(loglevel, int) else logging.getLevelName(str(loglevel or "INFO").upper())
    quiet_libraries(verbose=isinstance(level, int) and level <= logging.DEBUG)
