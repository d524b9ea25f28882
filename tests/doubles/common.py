"""What the transfer-service doubles share: a loopback HTTP server, the three emulated stores
as a source or sink of objects, and a background run that moves the bytes with counters.

A run copies whole objects one at a time (each read into memory: test objects are small),
updating its counters after each, and checks its cancel flag between objects; ``delay`` seconds
between objects lets a test cancel it half-way; ``after_write`` lets a test act as a third party on
each object right after the service wrote it, before bridge commits it. Listing happens before any
byte moves, as the services do, so ``found`` counters are known from the start.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOOPBACK = "127.0.0.1"


class ApiError(Exception):
    """An error the double answers with, in the service's own shape."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


Handler = Callable[[str, str, dict[str, str], bytes], tuple[int, dict[str, str], bytes]]


class LoopbackServer:
    """An HTTP/1.1 server on 127.0.0.1:free port that hands every request to ``handle`` and
    keeps the requests it saw (method, path, headers, body) for tests to read. While ``down``
    is set it drops every connection without an answer, as an unreachable service does."""

    def __init__(self, handle: Handler):
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.down = threading.Event()
        outer = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if outer.down.is_set():
                    self.close_connection = True
                    return
                headers = {k.lower(): v for k, v in self.headers.items()}
                outer.requests.append((self.command, self.path, headers, body))
                status, out_headers, payload = handle(self.command, self.path, headers, body)
                self.send_response(status)
                for name, value in out_headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_DELETE = do_PATCH = _serve

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer((LOOPBACK, 0), _Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://{LOOPBACK}:{self.httpd.server_address[1]}"

    def start(self) -> LoopbackServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def calls(self, suffix: str) -> list[dict]:
        """The JSON bodies of the requests whose path (without its query) ends with ``suffix``."""
        import urllib.parse
        return [json.loads(body) if body else {} for _m, path, _h, body in self.requests
                if urllib.parse.unquote(urllib.parse.urlsplit(path).path).endswith(suffix)]

    def bodies(self, needle: str = "") -> list[dict]:
        """The JSON bodies of the requests whose path or target header contains ``needle``."""
        found = []
        for _method, path, headers, body in self.requests:
            if needle in path or needle in headers.get("x-amz-target", ""):
                found.append(json.loads(body) if body else {})
        return found


# -- the stores, as a service reaches them ------------------------------------------------------

class Side:
    """Objects under a prefix of one bucket: list, read, write. ``rel`` names are relative."""

    def list(self) -> list[tuple[str, int]]:
        raise NotImplementedError

    def read(self, rel: str) -> bytes:
        raise NotImplementedError

    def write(self, rel: str, data: bytes) -> None:
        raise NotImplementedError


class S3Side(Side):
    def __init__(self, endpoint: str, bucket: str, prefix: str, key_id: str = "testing",
                 secret: str = "testing"):
        import boto3
        self.client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                                   aws_access_key_id=key_id, aws_secret_access_key=secret)
        self.bucket, self.prefix = bucket, prefix

    def list(self) -> list[tuple[str, int]]:
        out = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix):
            out += [(o["Key"][len(self.prefix):], o["Size"]) for o in page.get("Contents", [])]
        return out

    def read(self, rel: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=self.prefix + rel)["Body"].read()

    def write(self, rel: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.prefix + rel, Body=data)


class GCSSide(Side):
    def __init__(self, endpoint: str, bucket: str, prefix: str):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage
        client = storage.Client(project="test", credentials=AnonymousCredentials(),
                                client_options={"api_endpoint": endpoint})
        self.bucket, self.prefix = client.bucket(bucket), prefix

    def list(self) -> list[tuple[str, int]]:
        return [(b.name[len(self.prefix):], b.size) for b in self.bucket.list_blobs(prefix=self.prefix)]

    def read(self, rel: str) -> bytes:
        return self.bucket.blob(self.prefix + rel).download_as_bytes()

    def write(self, rel: str, data: bytes) -> None:
        self.bucket.blob(self.prefix + rel).upload_from_string(data, checksum="crc32c")


class AzureSide(Side):
    def __init__(self, container_url: str, sas: str, prefix: str):
        from azure.storage.blob import ContainerClient
        self.container = ContainerClient.from_container_url(f"{container_url}?{sas.lstrip('?')}")
        self.prefix = prefix

    def list(self) -> list[tuple[str, int]]:
        return [(b.name[len(self.prefix):], b.size) for b in self.container.list_blobs(name_starts_with=self.prefix)]

    def read(self, rel: str) -> bytes:
        return self.container.download_blob(self.prefix + rel).readall()

    def write(self, rel: str, data: bytes) -> None:
        self.container.upload_blob(self.prefix + rel, data, overwrite=True)


class Pausable(Side):
    """A source that, while ``paused`` is set, holds the run before reading its next object (a
    test keeps a remote job running as long as it needs); a cancel request lets it go on to stop."""

    def __init__(self, side: Side, paused: threading.Event, cancelled: threading.Event):
        self.side, self.paused, self.cancelled = side, paused, cancelled

    def list(self) -> list[tuple[str, int]]:
        return self.side.list()

    def read(self, rel: str) -> bytes:
        while self.paused.is_set() and not self.cancelled.wait(0.02):
            pass
        return self.side.read(rel)

    def write(self, rel: str, data: bytes) -> None:
        self.side.write(rel, data)


# -- a run --------------------------------------------------------------------------------------

@dataclass
class Run:
    """One transfer moving objects from ``source`` to ``sink`` in a background thread."""

    source: Callable[[], Side]          # built in the thread: a bad credential fails the run, not the call
    sink: Callable[[], Side]
    include: Callable[[str], bool] = lambda rel: True
    rename: Callable[[str], str] = lambda rel: rel
    delay: float = 0.0
    after_write: Callable[[str], None] | None = None   # a third party acting on each object just written
    state: str = "queued"                # queued, running, success, failed, cancelled
    error: str = ""
    objects_found: int = 0
    bytes_found: int = 0
    objects_copied: int = 0
    bytes_copied: int = 0
    objects_failed: int = 0
    bytes_failed: int = 0
    cancel_requested: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)

    def pausable(self, paused: threading.Event) -> Run:
        """Hold the run before each object while ``paused`` is set (see Pausable)."""
        source = self.source
        self.source = lambda: Pausable(source(), paused, self.cancel_requested)
        return self

    def start(self) -> Run:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def cancel(self) -> None:
        self.cancel_requested.set()

    def _run(self) -> None:
        try:
            self.state = "running"
            source, sink = self.source(), self.sink()
            todo = [(rel, size) for rel, size in source.list() if self.include(rel)]
            self.objects_found, self.bytes_found = len(todo), sum(size for _, size in todo)
            for rel, size in todo:
                if self.cancel_requested.is_set():
                    self.state = "cancelled"
                    return
                data = source.read(rel)
                sink.write(self.rename(rel), data)
                if self.after_write is not None:
                    self.after_write(self.rename(rel))
                self.objects_copied += 1
                self.bytes_copied += len(data)
                if self.delay:
                    self.cancel_requested.wait(self.delay)
            self.state = "cancelled" if self.cancel_requested.is_set() and self.objects_copied < len(todo) \
                else "success"
        except Exception as exc:  # the service reports any failure of the run in its status
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
            self.objects_failed = self.objects_found - self.objects_copied
            self.bytes_failed = self.bytes_found - self.bytes_copied
        finally:
            self.finished.set()


def now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
