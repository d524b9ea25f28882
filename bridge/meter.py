"""What a job really sent: every request to a store, counted where it leaves this process.

A ``Meter`` counts requests per store (``scheme://bucket``) and per kind, and the bytes sent and
received, for whatever runs while it is ``metering`` (a context variable: the job's units, its
listing and commit, and the threads and event-loop tasks they start with their context). Every
attempt counts, retries included: the hooks sit at the client layer, one per way a request
leaves, and never above bridge.retry:

    http.client          the direct paths' connections (``connection``: s3direct, gcsdirect,
                         azuredirect)
    streams.Link         many requests from one event loop (``Link.send``)
    botocore             S3 through aiobotocore: the ``before-send`` and ``after-call`` events
                         (``botocore_hooks``)
    aiohttp              GCS through gcsfs: a TraceConfig on its session (``aiohttp_trace``)
    azure-core           Azure through the SDK: its raw request and response hooks (``azure_hooks``)

A request's kind is read from the request itself (method, path, query, a copy-source header), as
the store would bill it, with bridge's names (bridge/policies/cost/usage.py): GET HEAD LIST PUT BEGIN PART
COMPLETE COPY DELETE. So the meter of a copy through a proxy that answers some requests 503 is
the emulator's own request log plus those 503s. bridge/policies/cost/usage.py ``metered`` turns a meter's
rows into the usage that policies/ price: spend is priced from this, estimates from the plan.

A meter kept in this process dies with it. A meter given ``ahead`` (a worker's: the job's meter
in Redis, workers/metering.py) hands each count to it as it is made, a request's before the
request leaves, and ``drain`` then gives only what ``ahead`` could not take: a worker killed with
SIGKILL mid-task has had every request it sent counted, those in flight included, so the spend
of a job whose task ran twice is priced from both runs' requests (what crossed the wire).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import contextvars
import http.client
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

T = TypeVar("T")

KINDS = ("GET", "HEAD", "LIST", "PUT", "BEGIN", "PART", "COMPLETE", "COPY", "DELETE")
PIECE = 256 * 1024   # a request body is sent this much at a time (a cancel is looked for in between)


@dataclass
class StoreMeter:
    requests: Counter = field(default_factory=Counter)   # kind -> requests sent
    bytes_sent: int = 0
    bytes_received: int = 0
    bytes_read: int = 0        # of bytes_received, object data (GET answers)
    errors: int = 0            # answers with a status of 400 or more (throttling and 5xx included)

    def to_dict(self) -> dict[str, Any]:
        return {"requests": dict(sorted(self.requests.items())), "bytes_sent": self.bytes_sent,
                "bytes_received": self.bytes_received, "bytes_read": self.bytes_read, "errors": self.errors}


# Where a meter's counts go as they are made (``Meter(ahead=...)``): given the flat fields of one
# count (``to_fields``' names), True once they are kept somewhere that outlives this process.
Ahead = Callable[[dict[str, int]], bool]


class Meter:
    """Requests and bytes per store, from any number of threads."""

    def __init__(self, ahead: Ahead | None = None) -> None:
        self.stores: dict[str, StoreMeter] = {}
        self._lock = threading.Lock()
        self.ahead = ahead
        self._handed: Counter = Counter()   # fields ``ahead`` has kept: ``drain`` leaves them out

    def _row(self, store: str) -> StoreMeter:
        row = self.stores.get(store)
        if row is None:
            row = self.stores[store] = StoreMeter()
        return row

    def _hand(self, fields: dict[str, int]) -> bool:
        """``fields`` to ``ahead``, before this meter counts them (so that a ``drain`` meanwhile
        sees them both counted and handed, or neither)."""
        fields = {name: n for name, n in fields.items() if n}
        return bool(fields) and self.ahead is not None and self.ahead(fields)

    def request(self, store: str, kind: str, sent: int = 0) -> None:
        fields = {f"{store}|req.{kind}": 1, f"{store}|bytes_sent": sent}
        handed = self._hand(fields)
        with self._lock:
            row = self._row(store)
            row.requests[kind] += 1
            row.bytes_sent += sent
            if handed:
                self._handed.update(fields)

    def answer(self, store: str, kind: str, status: int | None, received: int = 0) -> None:
        read = received if kind == "GET" and (status or 200) < 300 else 0
        error = 1 if status is not None and status >= 400 else 0
        fields = {f"{store}|bytes_received": received, f"{store}|bytes_read": read, f"{store}|errors": error}
        handed = self._hand(fields)
        with self._lock:
            row = self._row(store)
            row.bytes_received += received
            row.bytes_read += read
            row.errors += error
            if handed:
                self._handed.update(fields)

    def sent(self, store: str, nbytes: int) -> None:
        fields = {f"{store}|bytes_sent": nbytes}
        handed = self._hand(fields)
        with self._lock:
            self._row(store).bytes_sent += nbytes
            if handed:
                self._handed.update(fields)

    def received(self, store: str, kind: str, nbytes: int) -> None:
        self.answer(store, kind, None, nbytes)

    @property
    def request_count(self) -> int:
        with self._lock:
            return sum(sum(r.requests.values()) for r in self.stores.values())

    def to_dict(self) -> dict[str, Any]:
        with self._lock:
            return {store: row.to_dict() for store, row in sorted(self.stores.items())}

    def to_fields(self) -> dict[str, int]:
        """Flat counters (``store|req.KIND``, ``store|bytes_sent`` ...) for a Redis hash; ``from_fields`` reads them."""
        with self._lock:
            return self._fields()

    def _fields(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for store, row in self.stores.items():
            out.update({f"{store}|req.{k}": n for k, n in row.requests.items()})
            for name in ("bytes_sent", "bytes_received", "bytes_read", "errors"):
                out[f"{store}|{name}"] = getattr(row, name)
        return {k: v for k, v in out.items() if v}

    def drain(self) -> dict[str, int]:
        """``to_fields`` less what ``ahead`` already kept, and the meter from zero: for counts
        handed over as they go."""
        with self._lock:
            fields = {name: n - self._handed[name] for name, n in self._fields().items()}
            self.stores, self._handed = {}, Counter()
        return {name: n for name, n in fields.items() if n}

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> Meter:
        meter = cls()
        for key, value in fields.items():
            store, sep, name = str(key).rpartition("|")
            if not sep:
                continue
            row = meter._row(store)
            if name.startswith("req."):
                row.requests[name[4:]] += int(value)
            elif name in ("bytes_sent", "bytes_received", "bytes_read", "errors"):
                setattr(row, name, getattr(row, name) + int(value))
        return meter

    def add(self, other: Meter) -> Meter:
        for store, theirs in other.to_dict().items():
            with self._lock:
                row = self._row(store)
                row.requests.update(theirs["requests"])
                for name in ("bytes_sent", "bytes_received", "bytes_read", "errors"):
                    setattr(row, name, getattr(row, name) + theirs[name])
        return self


_current: contextvars.ContextVar[Meter | None] = contextvars.ContextVar("bridge_meter", default=None)


@contextlib.contextmanager
def metering(meter: Meter | None) -> Iterator[Meter | None]:
    """Every request sent from this thread (and what it starts with its context) while inside
    counts in ``meter``."""
    token = _current.set(meter)
    try:
        yield meter
    finally:
        _current.reset(token)


def current() -> Meter | None:
    return _current.get()


class Pool(cf.ThreadPoolExecutor):
    """A thread pool whose tasks run in (a copy of) the context of the thread that submitted
    them: what they send counts in its meter, their retries reach its observer."""

    def submit(self, fn, /, *args, **kwargs):
        return super().submit(contextvars.copy_context().run, fn, *args, **kwargs)


def ahead(items: Iterable[T], chunk: int = 500, chunks: int = 8) -> Iterator[T]:
    """``items`` made by a thread of their own (in a copy of this thread's context: what it sends
    counts in this meter), up to ``chunks`` chunks of ``chunk`` ahead of the consumer: a listing
    fetched while what it gave is judged, not between. An error in the thread is raised here,
    where the next item would have come; a consumer that stops early stops the thread (at its
    next chunk, and the iterator is closed there)."""
    import queue
    import threading
    handed: queue.Queue = queue.Queue(maxsize=chunks)
    stop = threading.Event()
    done = object()

    def hand(item: Any) -> bool:
        while not stop.is_set():
            try:
                handed.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def make() -> None:
        source = iter(items)
        try:
            piece: list = []
            for item in source:
                piece.append(item)
                if len(piece) >= chunk:
                    if not hand(piece):
                        return
                    piece = []
            if piece and not hand(piece):
                return
            hand(done)
        except BaseException as exc:   # raised again in the consumer's thread
            hand(exc)
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=contextvars.copy_context().run, args=(make,), daemon=True, name="ahead")
    thread.start()
    try:
        while True:
            got = handed.get()
            if got is done:
                return
            if isinstance(got, BaseException):
                raise got
            yield from got
    finally:
        stop.set()


def carried(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` to run in another thread (a pool's) with this thread's meter (and the rest of its context)."""
    meter = _current.get()
    if meter is None:
        return fn

    def run(*args: Any, **kwargs: Any) -> T:
        with metering(meter):
            return fn(*args, **kwargs)
    return run


# -- what a request is --------------------------------------------------------------------------

def _query(query: str) -> dict[str, str]:
    return dict(parse_qsl(query, keep_blank_values=True))


def _header(headers: Mapping[str, str] | None, name: str) -> bool:
    return bool(headers) and any(k.lower() == name for k in headers)


# AWS's virtual-hosted form: BUCKET.s3[.-REGION].amazonaws.com[.cn] (not an interface endpoint's
# BUCKET.vpce-ID.s3.REGION.vpce.amazonaws.com, where "bucket" is a literal and the path names it)
_S3_VIRTUAL = re.compile(r"^(?P<bucket>.+)\.s3(?:[.-][a-z0-9-]+)?\.amazonaws\.com(?:\.cn)?$")


def _s3(method: str, segments: list[str], q: dict[str, str], headers, host: str) -> tuple[str, str]:
    bucket = ""
    virtual = _S3_VIRTUAL.match(host)
    if virtual:
        bucket = virtual.group("bucket")       # virtual-hosted: the bucket names the host
    elif segments:
        bucket, segments = segments[0], segments[1:]
    key = "/".join(segments)
    copy = _header(headers, "x-amz-copy-source")
    if method == "GET":
        if not key:
            return bucket, "HEAD" if "location" in q else "LIST"
        return bucket, "LIST" if "uploadId" in q else "GET"
    if method == "HEAD":
        return bucket, "HEAD"
    if method == "PUT":
        if "partNumber" in q:
            return bucket, "COPY" if copy else "PART"
        return bucket, "COPY" if copy else "PUT"
    if method == "POST":
        if "uploads" in q:
            return bucket, "BEGIN"
        if "uploadId" in q:
            return bucket, "COMPLETE"
        return bucket, "DELETE" if "delete" in q else "PUT"
    return bucket, "DELETE" if method == "DELETE" else method


def _gcs(method: str, segments: list[str], q: dict[str, str], headers, host: str) -> tuple[str, str]:
    upload = segments[:1] == ["upload"]
    download = segments[:1] == ["download"]
    if upload or download:
        segments = segments[1:]
    if segments[:2] == ["storage", "v1"] and segments[2:3] == ["b"]:
        rest = segments[3:]
        bucket = rest[0] if rest else ""
        tail = rest[1:]
        if "rewriteTo" in tail or "copyTo" in tail:   # billed to the destination bucket
            at = tail.index("rewriteTo" if "rewriteTo" in tail else "copyTo")
            dst = tail[at + 2:at + 3]
            return (dst[0] if dst else bucket), "COPY"
        if tail[-1:] == ["compose"]:
            return bucket, "COMPLETE"
        if upload:
            if method == "POST":
                if q.get("uploadType") == "resumable":
                    return bucket, "BEGIN"
                # a part of bridge's: a temporary object, composed later (bridge/stores/gcs.py)
                return bucket, "PART" if q.get("name", "").startswith("_bridge/uploads/") else "PUT"
            if method == "PUT":
                return bucket, "PART"
            return bucket, "DELETE" if method == "DELETE" else "PUT"
        if method == "GET":
            if tail == ["o"]:
                return bucket, "LIST"
            if len(tail) >= 2:
                return bucket, "GET" if download or q.get("alt") == "media" else "HEAD"
            return bucket, "HEAD"
        if method == "DELETE":
            return bucket, "DELETE"
        return bucket, "PUT"                   # POST (insert), PATCH, PUT of metadata
    bucket = segments[0] if segments else ""    # the XML API: /bucket/object
    if method in ("GET", "HEAD"):
        return bucket, ("LIST" if len(segments) < 2 and method == "GET" else method)
    return bucket, {"PUT": "PUT", "DELETE": "DELETE", "POST": "PUT"}.get(method, method)


def _az(method: str, segments: list[str], q: dict[str, str], headers, host: str) -> tuple[str, str]:
    container = segments[0] if segments else ""
    blob = len(segments) > 1
    comp, copy = q.get("comp"), _header(headers, "x-ms-copy-source")
    if method == "GET":
        if comp in ("list", "blocklist"):
            return container, "LIST"
        return container, "GET" if blob and comp is None else "HEAD"
    if method == "HEAD":
        return container, "HEAD"
    if method == "PUT":
        if comp == "block":
            return container, "COPY" if copy else "PART"
        if comp == "blocklist":
            return container, "COMPLETE"
        return container, "COPY" if copy else "PUT"
    return container, "DELETE" if method == "DELETE" else "PUT"


_KIND_OF: dict[str, Callable[..., tuple[str, str]]] = {"s3": _s3, "gs": _gcs, "az": _az}


def classify(scheme: str, method: str, target: str, headers: Mapping[str, str] | None = None,
             base: str = "", host: str = "") -> tuple[str, str]:
    """(store, kind) of one request: ``target`` is its URL or path with query; ``base`` the
    endpoint's own path (``/devstoreaccount1`` for Azurite), left out before reading the path;
    ``host`` the host it goes to when ``target`` is a path (a bucket can name it: S3 on AWS)."""
    parts = urlsplit(target)
    path = parts.path
    if base and path.startswith(base.rstrip("/") + "/"):
        path = path[len(base.rstrip("/")):]
    segments = [unquote(s) for s in path.split("/") if s]
    bucket, kind = _KIND_OF[scheme](method.upper(), segments, _query(parts.query), headers, parts.hostname or host)
    return f"{scheme}://{bucket}", kind


def note(scheme: str, method: str, target: str, headers: Mapping[str, str] | None = None, *,
         base: str = "", sent: int = 0, host: str = "") -> tuple[Meter, str, str] | None:
    """Count one request in the current meter: (meter, store, kind) for its answer, or None
    when nothing is metering."""
    meter = _current.get()
    if meter is None:
        return None
    store, kind = classify(scheme, method, target, headers, base, host)
    meter.request(store, kind, sent)
    return meter, store, kind


def note_as(store: str, kind: str, sent: int = 0) -> tuple[Meter, str, str] | None:
    """``note`` for a request already classified (``classify``'s (store, kind))."""
    meter = _current.get()
    if meter is None:
        return None
    meter.request(store, kind, sent)
    return meter, store, kind


def answered(noted: tuple[Meter, str, str] | None, status: int | None, received: int) -> None:
    if noted is not None:
        meter, store, kind = noted
        meter.answer(store, kind, status, received)


def body_length(method: str, content_length: Any) -> int:
    """The bytes an answer's body carries, by its Content-Length: none for a HEAD, whose
    Content-Length is the object's size, not bytes on the wire."""
    if str(method).upper() == "HEAD" or content_length is None or not str(content_length).isdigit():
        return 0
    return int(content_length)


# -- the hooks, one per client ---------------------------------------------------------------------

class _Metered:
    """http.client's connection, counting each request it sends and the answer's body length."""

    meter_scheme = ""
    meter_base = ""

    def request(self, method, url, body=None, headers=None, **kwargs):   # noqa: D401
        headers = headers or {}
        size = len(body) if isinstance(body, (bytes, bytearray, memoryview)) else int(
            next((v for k, v in headers.items() if k.lower() == "content-length"), 0) or 0)
        self._noted = note(self.meter_scheme, method, url, headers, base=self.meter_base, sent=size, host=self.host)
        self._noted_method = method
        return super().request(method, url, body=body, headers=headers, **kwargs)

    def send(self, data):
        """A body goes in pieces of ``PIECE`` bytes: a cancelled job's request stops at the next one."""
        if isinstance(data, (bytes, bytearray, memoryview)) and len(data) > PIECE:
            from bridge.retry import check_stop
            view = memoryview(data)
            for at in range(0, len(view), PIECE):
                check_stop()
                super().send(view[at:at + PIECE])
            return
        super().send(data)

    def getresponse(self):
        resp = super().getresponse()
        noted, self._noted = getattr(self, "_noted", None), None
        if noted is not None:
            answered(noted, resp.status, body_length(self._noted_method, resp.getheader("Content-Length")))
        return resp


class MeteredHTTPConnection(_Metered, http.client.HTTPConnection):
    pass


class MeteredHTTPSConnection(_Metered, http.client.HTTPSConnection):
    pass


def connection(https: bool, scheme: str, base: str = "", **kwargs: Any) -> Callable[..., http.client.HTTPConnection]:
    """A maker of metered http.client connections for a store of ``scheme`` (``base``: its endpoint's path)."""
    cls = MeteredHTTPSConnection if https else MeteredHTTPConnection

    def make(host: str, port: int | None = None, **more: Any) -> http.client.HTTPConnection:
        conn = cls(host, port, **kwargs, **more)
        conn.meter_scheme, conn.meter_base = scheme, base
        return conn
    return make


def botocore_hooks(events: Any) -> None:
    """Count what botocore sends for S3 (each attempt: ``before-send``) and what each answer
    carries (``after-call``), on a session's or client's event emitter."""
    def before_send(request=None, **_kwargs):
        body = getattr(request, "body", None)
        size = len(body) if isinstance(body, (bytes, bytearray)) else int(request.headers.get("Content-Length") or 0)
        noted = note("s3", request.method, request.url, dict(request.headers), sent=size)
        if noted is not None:
            _last_s3.set((noted, request.method))
        return None

    def after_call(http_response=None, **_kwargs):
        last = _last_s3.get()
        if last is not None and http_response is not None:
            _last_s3.set(None)
            noted, method = last
            answered(noted, http_response.status_code, body_length(method, http_response.headers.get("content-length")))

    events.register("before-send.s3", before_send)
    events.register("after-call.s3", after_call)


# (what before-send noted, the request's method) of the S3 request this context sent last
_last_s3: contextvars.ContextVar[tuple[tuple[Meter, str, str], str] | None] = contextvars.ContextVar(
    "bridge_meter_s3", default=None)


def aiohttp_trace(scheme: str, base: str = "") -> Any:
    """An aiohttp TraceConfig counting each request of a session (GCS through gcsfs)."""
    import aiohttp

    async def start(_session, ctx, params):
        ctx.noted = note(scheme, params.method, str(params.url), dict(params.headers), base=base)

    async def chunk_sent(_session, ctx, params):
        noted = getattr(ctx, "noted", None)
        if noted is not None:
            noted[0].sent(noted[1], len(params.chunk))

    async def end(_session, ctx, params):
        noted = getattr(ctx, "noted", None)
        if noted is not None:
            answered(noted, params.response.status, body_length(params.method, params.response.content_length))

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(start)
    trace.on_request_chunk_sent.append(chunk_sent)
    trace.on_request_end.append(end)
    return trace


def azure_hooks(base: str = "") -> dict[str, Callable[[Any], None]]:
    """azure-storage-blob's ``raw_request_hook`` and ``raw_response_hook``: each request the SDK
    sends (after its retry policy: each attempt) and its answer."""
    def on_request(pipeline_request) -> None:
        req = pipeline_request.http_request
        body = req.body
        size = len(body) if isinstance(body, (bytes, bytearray)) else int(req.headers.get("Content-Length") or 0)
        pipeline_request.context["bridge_meter"] = note("az", req.method, req.url, dict(req.headers),
                                                        base=base, sent=size)

    def on_response(pipeline_response) -> None:
        noted = pipeline_response.context.get("bridge_meter")
        if noted is not None:
            resp = pipeline_response.http_response
            answered(noted, resp.status_code,
                     body_length(pipeline_response.http_request.method, resp.headers.get("Content-Length")))

    return {"raw_request_hook": on_request, "raw_response_hook": on_response}
