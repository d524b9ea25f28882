"""Many small requests from one thread: HTTP/1.1 over asyncio streams, a few keep-alive
connections on one event loop (one of the process's: ``_Home``), kept from one batch to the next.

Why: 2,000 objects of 16 KiB fetched by eight threads, each with its own blocking
http.client connection, spent most of their time handing the GIL to one another (strace: ~84
futex calls per object) and used ~0.7 s of CPU for the HTTP alone; the same requests sent over
eight connections of one event loop in one thread used ~0.25 s (measured on ``rclone serve s3``,
see bench/README.md). A store that can build its own signed requests (``s3direct``) uses this
for batches of whole objects; everything else keeps its client.

The protocol subset is the one object stores answer with: a status line, headers, and a body
framed by Content-Length, by chunked transfer coding, or by the end of the connection. A
connection that fails in any way is closed and opened again for the next request; nothing is
retried here (the caller retries each request through ``bridge.retry``).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import ssl
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar
from urllib.parse import urlsplit

from bridge import bwlimit, meter
from bridge.errors import BridgeError, EndpointUnreachable, TransientError

HEAD_LIMIT = 1 << 20   # the status line and headers of one answer, at most
JOIN_LIMIT = 256 * 1024   # a body up to this size goes out in one write with its request's head
T = TypeVar("T")


@dataclass
class Answer:
    status: int
    headers: dict[str, str] = field(default_factory=dict)   # names in lower case
    body: bytes = b""


class Link:
    """One keep-alive HTTP/1.1 connection to ``origin``, used by one task at a time."""

    def __init__(self, origin: str, timeout: float, metered: tuple[str, str] | None = None,
                 tls: ssl.SSLContext | None = None):
        url = urlsplit(origin)
        self.metered = metered   # (scheme, endpoint path): each exchange counted (bridge/meter.py)
        self.origin = origin
        self.host = url.hostname or ""
        self.port = url.port or (443 if url.scheme == "https" else 80)
        # (``tls``: the store's context, its CA bundle: bridge.stores.base.tls_context)
        self.ssl = (tls or ssl.create_default_context()) if url.scheme == "https" else None
        self.timeout = timeout
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._kinds: dict[tuple[str, str], tuple[str, str]] = {}   # (method, alike): (store, kind)

    def alive(self) -> bool:
        """Connected, and nothing arrived since its last answer: a kept link the server closed
        (or that holds garbage) is not used again. One poll of the socket, no waiting (between
        runs the loop is not running to notice)."""
        from bridge.stores.base import _dropped
        if self._writer is None or self._writer.is_closing() or self._reader is None:
            return False
        if self._reader.at_eof() or self._reader.exception() is not None:
            return False
        sock = self._writer.get_extra_info("socket")
        return sock is not None and not _dropped(sock)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def send(self, method: str, target: str, headers: dict[str, str], body: bytes = b"",
                   *, what: str, alike: str = "") -> Answer:
        """One exchange. A lost connection, a timeout or a malformed answer raises
        TransientError naming ``what``; a refused connection EndpointUnreachable. ``alike``: the
        caller's word that every request it sends with this method and this ``alike`` (a whole
        object of one bucket) is metered as the same kind, so the request is classified once per
        link, not parsed again for each object of a batch."""
        noted = self._note(method, target, headers, len(body), alike) if self.metered else None
        try:
            async with asyncio.timeout(self.timeout):
                answer = await self._exchange(method, target, headers, body)
            meter.answered(noted, answer.status, len(answer.body))
            return answer
        except BridgeError:
            self.close()
            raise
        except ConnectionRefusedError as exc:
            self.close()
            raise EndpointUnreachable(f"cannot reach {self.origin}: {type(exc).__name__}") from exc
        except ssl.SSLCertVerificationError as exc:   # not retried: it will not prove itself next time
            self.close()
            raise BridgeError(f"{self.origin} did not prove who it is: {exc.verify_message or exc}") from exc
        except (OSError, EOFError, TimeoutError, ValueError, asyncio.IncompleteReadError,
                asyncio.LimitOverrunError) as exc:
            self.close()
            raise TransientError(f"{what}: connection dropped ({type(exc).__name__})") from exc

    def _note(self, method: str, target: str, headers: dict[str, str], sent: int, alike: str):
        if not alike:
            return meter.note(self.metered[0], method, target, headers, base=self.metered[1], sent=sent,
                              host=self.host)
        kind = self._kinds.get((method, alike))
        if kind is None:
            kind = self._kinds[(method, alike)] = meter.classify(self.metered[0], method, target, headers,
                                                                 self.metered[1], self.host)
        return meter.note_as(kind[0], kind[1], sent)

    async def _exchange(self, method: str, target: str, headers: dict[str, str], body: bytes) -> Answer:
        if self._writer is None or self._writer.is_closing() or self._reader.at_eof():   # (closed while idle)
            self._reader, self._writer = await asyncio.open_connection(
                self.host, self.port, ssl=self.ssl, limit=HEAD_LIMIT)
        reader, writer = self._reader, self._writer
        lines = [f"{method} {target} HTTP/1.1"]
        lines.extend(f"{name}: {value}" for name, value in headers.items())
        if body and not any(name.lower() == "content-length" for name in headers):
            lines.append(f"Content-Length: {len(body)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if body and len(body) <= JOIN_LIMIT:
            writer.write(head + body)   # one send (and over TLS one write into the TLS layer), not two
        else:
            writer.write(head)
            if body:
                writer.write(body)
        await writer.drain()
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        version, _, rest = head[0].partition(" ")
        if not version.startswith("HTTP/1."):
            raise ValueError(f"not an HTTP/1.x answer: {head[0][:40]!r}")
        answer = Answer(int(rest[:3]))
        for line in head[1:]:
            if line:
                name, _, value = line.partition(":")
                answer.headers[name.strip().lower()] = value.strip()
        keep = answer.headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"
        if method == "HEAD" or answer.status in (204, 304) or 100 <= answer.status < 200:
            pass
        elif "chunked" in answer.headers.get("transfer-encoding", "").lower():
            answer.body = await _chunked(reader)
        elif "content-length" in answer.headers:
            answer.body = await reader.readexactly(int(answer.headers["content-length"]))
        else:
            answer.body, keep = await reader.read(), False
        if not keep:
            self.close()
        return answer


async def _chunked(reader: asyncio.StreamReader) -> bytes:
    parts = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":   # trailers
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


def new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop where it is installed (a dependency on Linux and macOS), else
    asyncio's; ``$MCBRIDGE_EVENT_LOOP`` (``uvloop`` or ``asyncio``) chooses. Why: its transports
    and its TLS layer are C, not Python: 2,000 objects of 16 KiB took 6-7% less CPU with it over
    HTTPS, up and down, 6% up and 2% down over HTTP (``rclone serve s3``, medians of eight
    interleaved rounds each; see bench/notes/speed.md), the same requests on the same links."""
    choice = os.environ.get("MCBRIDGE_EVENT_LOOP", "").strip().lower()
    if choice not in ("", "uvloop", "asyncio"):
        raise BridgeError(f"MCBRIDGE_EVENT_LOOP={choice!r}: use uvloop or asyncio")
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise BridgeError("MCBRIDGE_EVENT_LOOP=uvloop, but uvloop is not installed: "
                                  "pip install uvloop, or leave the variable unset") from None
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


class _Home:
    """An event loop that runs of this process share, one at a time, each in its caller's
    thread, and the keep-alive links it keeps from one run to the next. Why: an engine batch is
    one run (256 files); with a loop and links of its own, 2,000 small files over HTTPS cost 65
    TCP connections and TLS handshakes, counted, where 8 lanes need 8: each batch opened every
    lane again. The process keeps as many homes as runs ever ran at once (``_homes``): a run
    that finds every home busy (other threads' runs: a pack's readers, say) makes one more, which
    the next run to find the others busy uses, links and all."""

    IDLE = 256   # links kept per (origin, settings), at most: transfer.concurrency's bound

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loop = new_loop()
        self.idle: dict[tuple, list[Link]] = {}

    def take(self, key: tuple) -> Link | None:
        """A kept link the server has not closed meanwhile (a request on it would fail)."""
        kept = self.idle.get(key)
        while kept:
            link = kept.pop()
            if link.alive():
                return link
            link.close()
        return None

    def give(self, key: tuple, link: Link) -> None:
        kept = self.idle.setdefault(key, [])
        if link.alive() and len(kept) < self.IDLE:
            kept.append(link)
        else:
            link.close()

    def close(self) -> None:
        """Close the kept links and the loop, cancelling what an interrupted run left in it."""
        for kept in self.idle.values():
            for link in kept:
                link.close()
        self.idle.clear()
        left = asyncio.all_tasks(self.loop)
        for task in left:
            task.cancel()
        async def drain() -> None:   # (gather made outside the loop would ask for the thread's current loop)
            await asyncio.gather(*left, return_exceptions=True)
            await asyncio.sleep(0)   # the closed links' transports finish closing

        with contextlib.suppress(BaseException):
            self.loop.run_until_complete(drain())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())   # name lookups' threads
        self.loop.close()


_homes: list[_Home] = []        # this process's (a forked child starts its own: _homes_pid)
_homes_pid: int | None = None
_homes_lock = threading.Lock()


def _free_home() -> _Home:
    """A home no other thread is running, taken (its lock held): the first free one, or a new one."""
    global _homes, _homes_pid
    with _homes_lock:
        if _homes_pid != os.getpid():   # first use, or a forked child: the parent's loops are not ours
            if _homes_pid is None:
                atexit.register(_close_homes)
            _homes, _homes_pid = [], os.getpid()
        for home in _homes:
            if home.lock.acquire(blocking=False):
                return home
        home = _Home()
        home.lock.acquire()
        _homes.append(home)
        return home


def _close_homes() -> None:
    """At exit: every home not being run (an interrupted thread's is left to the interpreter)."""
    if _homes_pid != os.getpid():
        return
    with _homes_lock:
        for home in list(_homes):
            if home.lock.acquire(blocking=False):
                _homes.remove(home)
                home.close()


def run_many(count: int, work: Callable[[int, Link], Awaitable[None]], origin: str, *,
             connections: int, timeout: float, metered: tuple[str, str] | None = None,
             tls: ssl.SSLContext | None = None) -> None:
    """``work(i, link)`` for every i in range(count), at most ``connections`` at a time, each on
    a keep-alive link of its own (kept from an earlier run where there is one), on an event loop
    of the process's that no other thread is running (``_Home``). An exception from
    ``work`` ends the run (the caller decides which failures are one item's and which are
    everyone's): the other lanes are cancelled and their links closed."""
    if count <= 0:
        return
    key = (origin, timeout, metered, tls)

    async def main(keeper: _Home) -> None:
        items = iter(range(count))

        async def lane() -> None:
            bwlimit.lane()   # a throttle in this task waits for its turn without stopping the loop
            link = keeper.take(key) or Link(origin, timeout, metered, tls)
            finished = False
            try:
                for i in items:
                    await work(i, link)
                finished = True
            finally:
                if finished:
                    keeper.give(key, link)
                else:   # cancelled or failed mid-exchange (what is left on it is unknown)
                    link.close()

        lanes = [asyncio.ensure_future(lane()) for _ in range(max(1, min(connections, count)))]
        try:
            await asyncio.gather(*lanes)
        finally:
            for task in lanes:
                task.cancel()
            await asyncio.gather(*lanes, return_exceptions=True)

    home = _free_home()
    try:
        home.loop.run_until_complete(main(home))
    except BaseException as exc:
        if not isinstance(exc, Exception):   # interrupted inside the loop: its tasks may be left
            _discard(home)
        raise
    finally:
        home.lock.release()


def _discard(home: _Home) -> None:
    with _homes_lock:
        if home in _homes:
            _homes.remove(home)
    home.close()


def each_of(count: int, send: Callable[[int, Link], Awaitable[T]], each: Callable[[int, T], None],
            origin: str, *, connections: int, timeout: float, retries: int,
            metered: tuple[str, str] | None = None, tls: ssl.SSLContext | None = None,
            pace: Callable[[int], None] | None = None,
            ready: Callable[[int], Awaitable[None]] | None = None) -> dict[int, BridgeError]:
    """What the stores' ``read_many`` and ``put_many`` share: for every i in range(count),
    ``await send(i, link)`` (one attempt: a request and its answer checked, raising bridge's
    error), retried on its own through bridge.retry, then ``each(i, result)`` here, in any
    order. What failed, by index: a BridgeError from ``send`` once its retries are spent, or
    from ``each``; any other exception ends the run. ``pace(i)``: called before object i's
    first request, where a read's bandwidth limit is taken (bridge.bwlimit: its request then
    goes when the bytes are due). ``ready(i)``: awaited before object i is first asked for (a
    relayed batch's file that has not arrived yet: the loop's other requests go on meanwhile); a
    BridgeError from it is object i's failure."""
    from bridge.retry import acall_with_retries
    failures: dict[int, BridgeError] = {}

    async def one(i: int, link: Link) -> None:
        try:
            if ready is not None:
                await ready(i)
            if pace is not None:
                pace(i)
                await bwlimit.settle()   # before its request is signed: it goes when its bytes are due
            each(i, await acall_with_retries(lambda: send(i, link), retries, where=origin))
        except BridgeError as exc:
            failures[i] = exc

    run_many(count, one, origin, connections=connections, timeout=timeout, metered=metered, tls=tls)
    return failures
