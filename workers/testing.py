"""Real worker and beat processes for tests and benchmarks (as ``celery.contrib.testing`` does
for Celery's own). Plain Python, no pytest.

    env = {**emulator_env, "BRIDGE_BROKER_URL": url, "BRIDGE_NAMESPACE": ns, ...}
    with ServiceProcess.worker(env, "w1", log_dir, concurrency=2) as w1:
        ...
        w1.kill()          # SIGKILL to the worker and its pool processes, like a lost machine

Each process runs ``python -m bridge worker|beat`` in its own session, logs to a file, and is
told by Linux to die with the process that started it. ``wait_ready`` waits for the worker's
presence key in Redis, which its upkeep step writes once it consumes.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from bridge.workers.keys import Keys, redis_client
from bridge.workers.settings import WorkerSettings

_PR_SET_PDEATHSIG = 1


def _dies_with_parent():
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def arrange() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return arrange


class ServiceProcess:
    def __init__(self, args: list[str], env: Mapping[str, str], name: str, log_dir: Path):
        self.args = args
        self.env = dict(env)
        self.name = name
        self.log_path = Path(log_dir) / f"{name}.log"
        self.ws = WorkerSettings.from_env(self.env)
        self.process: subprocess.Popen | None = None

    @classmethod
    def worker(cls, env: Mapping[str, str], name: str, log_dir: Path, *, concurrency: int = 1,
               queues: list[str] | None = None, pool: str = "prefork", metrics_port: int = 0) -> ServiceProcess:
        args = ["worker", "--hostname", f"{name}@test", "--concurrency", str(concurrency), "--pool", pool,
                "--metrics-port", str(metrics_port), "--loglevel", "INFO"]
        if queues:
            args += ["--queues", ",".join(queues)]
        return cls(args, env, name, log_dir)

    @classmethod
    def beat(cls, env: Mapping[str, str], schedules: Path, log_dir: Path, name: str = "beat") -> ServiceProcess:
        db = Path(log_dir) / f"{name}-schedule"
        return cls(["beat", "--schedules", str(schedules), "--schedule-db", str(db), "--loglevel", "INFO"],
                   env, name, log_dir)

    @property
    def hostname(self) -> str:
        return f"{self.name}@test"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self) -> ServiceProcess:
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen([sys.executable, "-m", "bridge", *self.args], env=self.env,
                                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True, preexec_fn=_dies_with_parent())
        log.close()
        return self

    def wait_ready(self, timeout: float = 60.0) -> ServiceProcess:
        """For a worker: until it announces itself in Redis (it consumes from then on)."""
        client = redis_client(self.ws.broker_url)
        key = Keys(self.ws.namespace).worker(self.hostname)
        deadline = time.monotonic() + timeout
        while not client.exists(key):
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready after {timeout:.0f}s:\n{self.log_tail()}")
            time.sleep(0.1)
        return self

    def kill(self) -> None:
        """SIGKILL the whole process group: the worker and its pool, with no chance to clean up."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self, grace: float = 20.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.kill()
        # the pool processes of a worker stopped in the middle of a task
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(FileNotFoundError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    def __enter__(self) -> ServiceProcess:
        self.start()
        if self.args[0] == "worker":
            self.wait_ready()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def tenant_env(directory: Path, local_roots: list[str] | tuple[str, ...] = (), tenant: str = "tests",
               policy: str | None = None) -> dict[str, str]:
    """The variables of a worker and its submitters for one tenant with a fresh key: its keys file
    and a service policy (``policy``'s text, else every bucket and ``local_roots``) under
    ``directory``; workers may use ``local_roots``."""
    from bridge.policies.tenants import single_tenant
    from bridge.workers.auth import new_key, write_keys_file
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    keys, service = directory / "service-keys", directory / "service.yaml"
    write_keys_file(keys, {tenant: new_key()})
    service.write_text(policy if policy is not None else single_tenant(tenant, local_roots))
    return {"BRIDGE_KEYS_FILE": str(keys), "BRIDGE_SERVICE_POLICY": str(service), "BRIDGE_TENANT": tenant,
            "BRIDGE_LOCAL_ROOTS": ":".join(local_roots)}


def purge_namespace(broker_url: str, namespace: str) -> int:
    """Delete every key of a namespace (a test run's); returns how many."""
    client = redis_client(broker_url)
    names = list(client.scan_iter(match=f"{namespace}:*", count=500))
    for start in range(0, len(names), 500):
        client.delete(*names[start:start + 500])
    return len(names)
