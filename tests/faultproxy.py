"""A fault-injecting reverse proxy on loopback, put in front of one emulator.

It forwards every request unchanged (method, path, query, headers including Host, body: Azure's
SharedKey signature covers headers) and answers with the emulator's response, except that

- a fraction ``error_rate`` of requests are answered 503 without reaching the emulator, and
- a fraction ``cut_rate`` of responses are cut: the request reaches the emulator and takes
  effect, then the client gets the headers and half the body (nothing, for an empty body) and
  the connection is closed, as when a connection drops while an answer is read.

With ``check_payload`` it also does what S3 does and the emulators do not: a request whose
``x-amz-content-sha256`` is a SHA-256 other than that of the body it carries is answered 400
XAmzContentSHA256Mismatch without reaching the emulator (counted as ``payload_mismatch``).

Decisions come from ``random.Random(seed)`` drawn in the order requests arrive, so a run with the
same seed injects the same sequence of faults (which request receives which one depends on the
client's concurrency). ``rules`` act before the random faults, to aim at one request ("cut the
first answer to a multipart completion"); a rule's "hold" keeps the requests it matches (their
bodies read, counted in ``counts["hold"]``) until ``release()``, then forwards them, so that a
test can act while they are in flight ("kill the worker whose parts are held"). ``counts`` says what was done (with ``bytes_up`` and ``bytes_down``, the request and
response body bytes); ``sent`` counts the
body bytes answered per "METHOD path" (query left out), e.g. to prove an object was read once.

The proxy runs on its own event loop in a daemon thread of the test process.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
import socket
import threading
from collections import Counter
from dataclasses import dataclass

import aiohttp
from aiohttp import web

LOOPBACK = "127.0.0.1"
# Headers that belong to one connection, not to the request; aiohttp sets its own.
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
        "proxy-connection", "proxy-authorization", "content-length", "expect"}


@dataclass
class Rule:
    """Do ``action`` ("error", "cut", "reply" or "hold") to ``times`` requests whose "METHOD path?query"
    matches ``pattern`` (a regular expression, searched), after letting ``after`` of them pass."""

    pattern: str
    action: str
    times: int = 1
    after: int = 0
    reply: tuple[int, dict[str, str], bytes] = (503, {}, b"")

    def matches(self, line: str) -> bool:
        return self.times > 0 and re.search(self.pattern, line) is not None


class LoopbackServer:
    """An aiohttp server on a free loopback port, run by its own event loop in a thread, with one
    client session for what it sends upstream. A subclass gives ``_handle(request)``."""

    name = "loopback"

    def __init__(self) -> None:
        self.port = _free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name=f"{self.name}-{self.port}")
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    def start(self):
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession(auto_decompress=False, timeout=aiohttp.ClientTimeout(total=300),
                                              connector=aiohttp.TCPConnector(limit=0))
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, LOOPBACK, self.port).start()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    def stop(self) -> None:
        async def _stop():
            await self._runner.cleanup()
            await self._session.close()
        asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def proxied_environment(env: dict[str, str], proxies: dict[str, FaultProxy]) -> dict[str, str]:
    """A copy of the emulators' ``env`` in which each store present in ``proxies`` ("s3", "gs",
    "az") is reached through its proxy (Azure's with the emulator account's key)."""
    from tests.emulators import AZURITE_ACCOUNT, AZURITE_KEY
    env = dict(env)
    if "s3" in proxies:
        env["AWS_ENDPOINT_URL"] = proxies["s3"].endpoint
    if "gs" in proxies:
        env["STORAGE_EMULATOR_HOST"] = proxies["gs"].endpoint
    if "az" in proxies:
        env["AZURE_STORAGE_CONNECTION_STRING"] = (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint={proxies['az'].endpoint}/{AZURITE_ACCOUNT};")
    return env


class FaultProxy(LoopbackServer):
    name = "faultproxy"

    def __init__(self, upstream: str, *, error_rate: float = 0.0, cut_rate: float = 0.0, seed: int = 0,
                 check_payload: bool = False):
        super().__init__()
        self.upstream = upstream.rstrip("/")
        self.check_payload = check_payload
        self.rules: list[Rule] = []
        self.counts: Counter[str] = Counter()
        self.sent: Counter[str] = Counter()
        self.log: list[tuple[str, str]] = []   # (request line, what was done)
        self._lock = threading.Lock()
        self._released = threading.Event()
        self.configure(error_rate=error_rate, cut_rate=cut_rate, seed=seed)

    def release(self) -> None:
        """Forward the requests held by a "hold" rule (and any it holds later)."""
        self._released.set()

    @property
    def endpoint(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def configure(self, *, error_rate: float = 0.0, cut_rate: float = 0.0, seed: int = 0,
                  rules: list[Rule] | None = None) -> None:
        """New fault rates and rules, and counts from zero."""
        with self._lock:
            self.error_rate, self.cut_rate = error_rate, cut_rate
            self._rng = random.Random(seed)
            self.rules = list(rules or [])
            self.counts = Counter()
            self.sent = Counter()
            self.log = []

    @property
    def faults(self) -> int:
        return self.counts["error"] + self.counts["cut"]

    # -- one request ----------------------------------------------------------------------------
    def _decide(self, line: str) -> tuple[str, Rule | None]:
        with self._lock:
            self.counts["requests"] += 1
            for rule in self.rules:
                if rule.matches(line):
                    if rule.after > 0:
                        rule.after -= 1
                        continue
                    rule.times -= 1
                    action = rule.action
                    self.counts[action] += 1
                    self.log.append((line, action))
                    return action, rule
            draw = self._rng.random()
            action = ("error" if draw < self.error_rate
                      else "cut" if draw < self.error_rate + self.cut_rate else "forward")
            self.counts[action] += 1
            self.log.append((line, action))
            return action, None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        line = f"{request.method} {request.rel_url}"
        signed = request.headers.get("x-amz-content-sha256", "")
        if self.check_payload and re.fullmatch(r"[0-9a-f]{64}", signed) and hashlib.sha256(body).hexdigest() != signed:
            with self._lock:
                self.counts["payload_mismatch"] += 1
                self.log.append((line, "payload_mismatch"))
            return web.Response(status=400, content_type="application/xml",
                                body=b"<Error><Code>XAmzContentSHA256Mismatch</Code></Error>")
        action, rule = self._decide(line)
        with self._lock:
            self.counts["bytes_up"] += len(body)
        if action == "error":
            return web.Response(status=503, body=b"")
        if action == "reply":
            status, headers, payload = rule.reply
            return web.Response(status=status, headers=headers, body=payload)
        if action == "hold":
            while not self._released.is_set():
                await asyncio.sleep(0.02)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
        async with self._session.request(
                request.method, self.upstream + str(request.rel_url), headers=headers, data=body,
                allow_redirects=False,
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type")) as upstream:
            payload = await upstream.read()
            status = upstream.status
            with self._lock:
                self.counts["bytes_down"] += len(payload)
            out_headers = [(k, v) for k, v in upstream.headers.items() if k.lower() not in _HOP]
        with self._lock:
            self.sent[f"{request.method} {request.path}"] += len(payload) // 2 if action == "cut" else len(payload)
        if action == "cut":
            return await self._cut(request, status, out_headers, payload)
        response = web.Response(status=status, body=payload)
        for k, v in out_headers:
            response.headers.add(k, v)
        if request.method == "HEAD":  # keep the emulator's Content-Length of the object
            length = upstream.headers.get("Content-Length")
            if length is not None:
                response.headers["Content-Length"] = length
        return response

    async def _cut(self, request: web.Request, status: int, headers, payload: bytes) -> web.StreamResponse:
        response = web.StreamResponse(status=status)
        if len(payload) >= 2:
            for k, v in headers:
                response.headers.add(k, v)
            response.content_length = len(payload)
            await response.prepare(request)
            await response.write(payload[: len(payload) // 2])
            await asyncio.sleep(0.01)  # let the half reach the client before the close
            request.transport.close()
        else:
            request.transport.abort()  # an empty answer is lost whole
        return response  # aiohttp finds the connection closed and sends nothing more


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]
