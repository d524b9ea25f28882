"""Several worker hosts on one machine: network namespaces, each with its own shaped link.

    with Cluster(hosts=4, rate="20mbit", stores=("s3", "gs")) as cluster:
        cluster.stores["s3"].create_bucket("src")
        job = cluster.submit("cp", "s3://src/", "gs://dst/")
        cluster.wait(job)
        cluster.hosts[1].cut()          # its links down: the host vanishes mid-job

The picture (one run; every name starts with the run's own prefix, so parallel runs never meet)::

    root namespace                                   host i (namespace <prefix>-hI)
    bridge <prefix>s  10.213.X.1/25  <-- veth -->    eth0  10.213.X.(10+i)   tc tbf both ways
        moto / fake-gcs / Azurite bound here
    bridge <prefix>r  10.213.X.129/25 <-- veth -->   red0  10.213.X.(138+i)  not shaped
        a redis-server of the run's own bound here

The stores and Redis are reached over two links, so that a host can lose Redis but not the
stores (``cut_redis``: its packets to Redis dropped), or everything (``cut``: its links down). Each host runs ``mcbridge worker`` processes
inside its namespace (``ip netns exec``) with its own state and cache folders; the submitter and
the test run in the root namespace. The addresses exist only on these bridges and namespaces:
nothing is sent anywhere else. Redis keeps an append-only file, fsynced at every write, so that
``restart_redis`` is a restart and not a wipe (as a deployment's Redis would be run).

Teardown kills what it started by PID and deletes its namespaces and links, on exit from the
``with``, at interpreter exit, and for a run that died before either, at the next run's start
(leftovers whose owning PID is gone). Needs root and iproute2: ``unavailable()`` says why not.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from tests.emulators import (LOOPBACK, _is_running, STORES, Emulator, EmulatorError, RedisServer, free_port,
                             redis_answers_ping)

NET = "10.213"             # the harness's own private range: 10.213.X.0/24, one X per run
LOCK = Path(tempfile.gettempdir()) / "bridge-hosts.lock"
PREFIX_RE = re.compile(r"^hb([0-9a-f]{4})-(\d+)")   # hbXXXX-<owner pid>: a run's namespaces


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    command = ["ip", *(("netns", "exec", ns, "ip") if ns else ()), *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")
    return done


def _tc(*args: str, ns: str | None = None) -> None:
    command = [*(("ip", "netns", "exec", ns) if ns else ()), "tc", *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")


def unavailable() -> str | None:
    """Why hosts cannot be made here (a test skips with it), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (ip, tc) is not installed"
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        return "`ip netns` is not available"
    return None


def remove_leftovers() -> None:
    """Delete the namespaces and bridges of runs whose process is gone (killed before teardown)."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    dead = set()
    for name in names:
        m = PREFIX_RE.match(name)
        if m and not _is_running(int(m.group(2))):
            dead.add(m.group(1))
            _ip("netns", "del", name, check=False)
    for tag in dead:
        for role in "sr":
            _ip("link", "del", f"hb{tag}{role}", check=False)


# -- the emulators, bound to the bridge's address ----------------------------------------------
class _Bound:
    """Mixed into an emulator: it listens on ``address`` (a bridge's) instead of loopback."""

    address = LOOPBACK

    def command(self) -> list[str]:
        return [arg.replace(LOOPBACK, self.address) for arg in super().command()]

    @property
    def endpoint(self) -> str:
        return super().endpoint.replace(LOOPBACK, self.address)


def bound(scheme: str, address: str, emulator: type[Emulator] | None = None) -> Emulator:
    """The emulator of ``scheme`` (s3, gs, az) listening on ``address``: the project's usual one,
    or ``emulator`` (tests/emulators.py ``RcloneS3``, a faster S3 for throughput runs)."""
    base = emulator or STORES[scheme]
    cls = type(f"Bound{base.__name__}", (_Bound, base), {"address": address})
    return cls()


class PersistentRedis(_Bound, RedisServer):
    """A redis-server of the run's own on ``address``, with an append-only file fsynced at every
    write: ``restart()`` kills it (SIGKILL) and starts it again on its port, from that file."""

    name = "redis-hosts"

    def __init__(self, address: str) -> None:
        super().__init__()
        self.address = address

    def command(self) -> list[str]:
        args = super().command()
        args[args.index("--appendonly") + 1] = "yes"
        # protected mode refuses any address but loopback without a password: this one is the
        # run's private bridge, reached only from its own namespaces
        return [*args, "--appendfsync", "always", "--protected-mode", "no"]

    def is_ready(self) -> bool:
        return redis_answers_ping(self.address, self.port)


# -- hosts -------------------------------------------------------------------------------------
class Host:
    """One namespace: its store link ``eth0`` (shaped), its Redis link ``red0``, its workers."""

    def __init__(self, cluster: Cluster, index: int):
        self.cluster = cluster
        self.index = index
        self.ns = f"{cluster.prefix}-h{index}"
        self.address = f"{cluster.net}.{10 + index}"
        self.redis_address = f"{cluster.net}.{138 + index}"
        self.root = cluster.work / f"h{index}"
        self.workers: list[HostWorker] = []

    @property
    def name(self) -> str:
        return f"h{self.index}"

    def build(self, rate: str | None) -> None:
        c = self.cluster
        _ip("netns", "add", self.ns)
        c.made_ns.append(self.ns)
        _ip("link", "set", "lo", "up", ns=self.ns)
        for role, inner, addr, bridge in (("s", "eth0", self.address, c.store_bridge),
                                          ("r", "red0", self.redis_address, c.redis_bridge)):
            outer = f"{c.prefix[:6]}{self.index}{role}"
            _ip("link", "add", outer, "type", "veth", "peer", "name", f"{outer}p")
            _ip("link", "set", f"{outer}p", "netns", self.ns)
            _ip("link", "set", f"{outer}p", "name", inner, ns=self.ns)
            _ip("addr", "add", f"{addr}/25", "dev", inner, ns=self.ns)
            _ip("link", "set", inner, "up", ns=self.ns)
            _ip("link", "set", outer, "master", bridge)
            _ip("link", "set", outer, "up")
            if role == "s" and rate:
                # both ways: the host's sends leave by eth0, what it receives leaves the bridge by outer
                _tc("qdisc", "add", "dev", inner, "root", "tbf", "rate", rate, "burst", "32kb",
                    "latency", "200ms", ns=self.ns)
                _tc("qdisc", "add", "dev", outer, "root", "tbf", "rate", rate, "burst", "32kb", "latency", "200ms")
        for folder in ("state", "cache", "logs"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)

    def env(self) -> dict[str, str]:
        return {**self.cluster.env, "MCBRIDGE_STATE_DIR": str(self.root / "state"),
                "MCBRIDGE_CACHE_DIR": str(self.root / "cache")}

    def launch_workers(self, count: int = 1, concurrency: int = 2) -> list[HostWorker]:
        """Start ``count`` workers without waiting for them (``HostWorker.wait_ready``)."""
        started = [HostWorker(self, f"{self.name}w{len(self.workers) + n}", concurrency) for n in range(count)]
        for worker in started:
            self.workers.append(worker)
            worker.start()
        return started

    def start_workers(self, count: int = 1, concurrency: int = 2) -> list[HostWorker]:
        started = self.launch_workers(count, concurrency)
        for worker in started:
            worker.wait_ready()
        return started

    def _links(self, names: Iterable[str], state: str) -> None:
        for name in names:
            _ip("link", "set", name, state, ns=self.ns)

    def cut(self) -> None:
        """Every link of the host down: for the others it is gone (its processes live on)."""
        self._links(("eth0", "red0"), "down")

    def cut_redis(self) -> None:
        """Its Redis link silently drops every packet (a partition: connections hang, as across a
        WAN, rather than failing at once as on a link set down); it still reaches the stores. A
        tbf whose burst is smaller than any packet drops them all (netem is not available here)."""
        _tc("qdisc", "replace", "dev", "red0", "root", "tbf", "rate", "1kbit", "burst", "10", "limit", "1", ns=self.ns)
        self.partitioned = True

    def restore(self) -> None:
        if getattr(self, "partitioned", False):
            _tc("qdisc", "del", "dev", "red0", "root", ns=self.ns)
            self.partitioned = False
        self._links(("eth0", "red0"), "up")
        for inner, addr in (("eth0", self.address), ("red0", self.redis_address)):   # down drops no address
            _ip("addr", "replace", f"{addr}/25", "dev", inner, ns=self.ns)

    def stop(self) -> None:
        for worker in self.workers:
            worker.kill()


class HostWorker:
    """``mcbridge worker`` inside a host's namespace, its own process group, killed by PID."""

    def __init__(self, host: Host, name: str, concurrency: int):
        self.host = host
        self.name = name
        self.concurrency = concurrency
        self.log_path = host.root / "logs" / f"{name}.log"
        self.process: subprocess.Popen | None = None

    @property
    def hostname(self) -> str:
        return f"{self.name}@{self.host.cluster.prefix}"

    def start(self) -> None:
        args = ["ip", "netns", "exec", self.host.ns, sys.executable, "-m", "bridge", "worker",
                "--hostname", self.hostname, "--concurrency", str(self.concurrency), "--pool", "prefork",
                "--metrics-port", "0", "--loglevel", "INFO"]
        with open(self.log_path, "ab") as log:
            # `ip netns exec` execs the command: its PID is the worker's
            self.process = subprocess.Popen(args, env=self.host.env(), stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        self.host.cluster.pids.append(self.process.pid)

    def wait_ready(self, timeout: float = 90.0) -> None:
        key = f"{self.host.cluster.namespace}:worker:{self.hostname}"
        deadline = time.monotonic() + timeout
        while not self.host.cluster.redis_client().exists(key):
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready after {timeout:.0f}s:\n{self.log_tail()}")
            time.sleep(0.2)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def log_tail(self, lines: int = 60) -> str:
        with contextlib.suppress(FileNotFoundError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"


_open: set[Cluster] = set()


@atexit.register
def _teardown_leftovers() -> None:
    for cluster in list(_open):
        cluster.close()


class Cluster:
    """N hosts on two bridges, the store emulators of ``stores`` and a Redis of its own."""

    def __init__(self, hosts: int = 2, *, rate: str | None = "20mbit", stores: Iterable[str] = ("s3",),
                 workers: int = 1, concurrency: int = 2, env: Mapping[str, str] | None = None,
                 local_roots: Iterable[str] = (), emulators: Mapping[str, type[Emulator]] | None = None):
        """``emulators``: by scheme, an emulator other than the usual one (``bound``)."""
        self.count, self.rate, self.schemes = hosts, rate, tuple(stores)
        self.emulators = dict(emulators or {})
        self.workers_per_host, self.concurrency = workers, concurrency
        self.extra_env = dict(env or {})
        self.local_roots = list(local_roots)
        self.tag = uuid.uuid4().hex[:4]
        self.prefix = f"hb{self.tag}-{os.getpid()}"
        self.namespace = f"hosts-{self.tag}"
        self.work = Path(tempfile.mkdtemp(prefix=f"bridge-hosts-{self.tag}-"))
        self.made_ns: list[str] = []
        self.made_links: list[str] = []
        self.pids: list[int] = []
        self.hosts: list[Host] = []
        self.stores: dict[str, Emulator] = {}
        self.redis: PersistentRedis | None = None
        self.env: dict[str, str] = {}
        self._client = None

    # names the kernel limits to 15 characters: hbXXXX + role
    @property
    def store_bridge(self) -> str:
        return f"hb{self.tag}s"

    @property
    def redis_bridge(self) -> str:
        return f"hb{self.tag}r"

    @property
    def broker_url(self) -> str:
        return f"redis://{self.redis.address}:{self.redis.port}/0"

    def redis_client(self):
        if self._client is None:
            from bridge.workers.keys import redis_client
            self._client = redis_client(self.broker_url)
        return self._client

    def __enter__(self) -> Cluster:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> Cluster:
        why = unavailable()
        if why:
            raise RuntimeError(why)
        _open.add(self)
        with open(LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            remove_leftovers()
            self.net = self._free_net()
            for bridge, addr in ((self.store_bridge, f"{self.net}.1/25"), (self.redis_bridge, f"{self.net}.129/25")):
                _ip("link", "add", bridge, "type", "bridge")
                self.made_links.append(bridge)
                _ip("addr", "add", addr, "dev", bridge)
                _ip("link", "set", bridge, "up")
        self.hosts = [Host(self, i) for i in range(1, self.count + 1)]
        for host in self.hosts:
            host.build(self.rate)
        self.redis = PersistentRedis(f"{self.net}.129")
        self.stores = {scheme: bound(scheme, f"{self.net}.1", self.emulators.get(scheme)) for scheme in self.schemes}
        for emulator in (self.redis, *self.stores.values()):
            emulator.launch()
        for emulator in (self.redis, *self.stores.values()):
            emulator.wait_ready()
        self.env = self._environment()
        # every host's workers start at once: each takes seconds to import and announce itself
        launched = [w for host in self.hosts for w in host.launch_workers(self.workers_per_host, self.concurrency)]
        for worker in launched:
            worker.wait_ready()
        return self

    def _free_net(self) -> str:
        used = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
        free = [x for x in range(256) if f" {NET}.{x}." not in used]
        if not free:
            raise RuntimeError(f"no free {NET}.X.0/24 left")
        return f"{NET}.{random.choice(free)}"

    def _environment(self) -> dict[str, str]:
        from bridge.workers.testing import tenant_env
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("AWS_", "AZURE_", "BRIDGE_", "MCBRIDGE_", "STORAGE_EMULATOR", "GOOGLE_"))
                and k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")}
        env = {**base, "XDG_CONFIG_HOME": str(self.work / "noconfig"), "AWS_EC2_METADATA_DISABLED": "true",
               "BRIDGE_BROKER_URL": self.broker_url, "BRIDGE_NAMESPACE": self.namespace,
               "BRIDGE_METRICS_PORT": "0", "PYTHONPYCACHEPREFIX": str(self.work / "pycache"),
               **tenant_env(self.work / "tenant", local_roots=self.local_roots)}
        for emulator in self.stores.values():
            env.update(emulator.env())
        env.update(self.extra_env)
        return env

    # -- jobs ------------------------------------------------------------------------------
    def submit(self, *args: str, wait: bool = False, timeout: float = 600) -> dict:
        """``mcbridge submit ARGS --json`` from the root namespace: the job's record as printed."""
        command = [sys.executable, "-m", "bridge", "submit", *args, "--json", *(("--wait",) if wait else ())]
        done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout)
        if done.returncode not in (0, 1) or not done.stdout.strip():
            raise RuntimeError(f"submit {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
        return json.loads(done.stdout)

    def job(self, job_id: str) -> dict[str, str]:
        """The job's record, with its errors (a list of their own) as ``errors``, one a line."""
        client = self.redis_client()
        record = client.hgetall(f"{self.namespace}:job:{job_id}")
        errors = client.lrange(f"{self.namespace}:job:{job_id}:errors", 0, -1)
        if errors:
            record["errors"] = "\n".join(e.decode() if isinstance(e, bytes) else e for e in errors)
        return record

    def wait(self, job_id: str, timeout: float = 300) -> dict[str, str]:
        """The job's record once it has ended (succeeded, failed, cancelled)."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError, ConnectionError):
                from redis.exceptions import RedisError
                try:
                    record = self.job(job_id)
                except RedisError:
                    record = {}
                if record.get("state") in ("succeeded", "failed", "cancelled") and record.get("finished"):
                    return record
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {record.get('state')} after {timeout:.0f}s\n"
                                   + self.logs())
            time.sleep(0.2)

    def running(self) -> dict[str, dict]:
        """The tasks registered as running (``<ns>:running``): task id -> its record."""
        raw = self.redis_client().hgetall(f"{self.namespace}:running")
        return {task: json.loads(value) for task, value in raw.items()}

    def host_of(self, worker: str) -> Host | None:
        for host in self.hosts:
            if any(w.hostname == worker for w in host.workers):
                return host
        return None

    def logs(self, lines: int = 30) -> str:
        return "\n".join(f"--- {w.name}\n{w.log_tail(lines)}" for h in self.hosts for w in h.workers)

    # -- requests seen by the endpoint -----------------------------------------------------
    def requests(self, scheme: str = "s3") -> list[tuple[str, str, str]]:
        """(client address, method, path with query) of every request the ``scheme`` emulator
        logged (moto logs one line per answered request)."""
        line = re.compile(r'^(\d+\.\d+\.\d+\.\d+) - - \[[^\]]*\] "([A-Z]+) (\S+) HTTP')
        found = []
        for text in self.stores[scheme].log_path.read_text(errors="replace").splitlines():
            m = line.match(text)
            if m:
                found.append(m.groups())
        return found

    # -- teardown --------------------------------------------------------------------------
    def close(self) -> None:
        for host in self.hosts:
            host.stop()
        for pid in self.pids:   # anything left of the workers, by the PIDs started here
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        for emulator in (*self.stores.values(), *([self.redis] if self.redis else [])):
            with contextlib.suppress(EmulatorError, OSError):
                emulator.stop()
        for ns in self.made_ns:
            _ip("netns", "del", ns, check=False)   # takes its ends of the veths, and so the pairs
        for link in self.made_links:
            _ip("link", "del", link, check=False)
        self.made_ns, self.made_links, self.pids = [], [], []
        shutil.rmtree(self.work, ignore_errors=True)
        _open.discard(self)


@contextlib.contextmanager
def cluster(**kwargs) -> Iterator[Cluster]:
    with Cluster(**kwargs) as made:
        yield made


__all__ = ["Cluster", "Host", "HostWorker", "bound", "cluster", "remove_leftovers", "unavailable", "free_port"]
