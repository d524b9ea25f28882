"""A TCP proxy on loopback that delays what it carries, for an endpoint as far away as a cloud's.

Every chunk read from either side is written to the other ``delay`` seconds after it arrived (in
order), so a round trip takes ``2 * delay`` longer: the time to first byte of a small object on a
cloud's endpoint, which the emulators on loopback answer in well under a millisecond. It carries
bytes, not requests: TLS passes through untouched (the client still verifies the endpoint's
certificate, for 127.0.0.1). ``connections`` counts the connections accepted and ``most`` the
most open at once; ``carried`` lists (monotonic time, bytes) of every piece written, each way
(``"down"``: to the client, ``"up"``: to the endpoint), for what crossed the wire when. The proxy runs on its own event loop in a daemon thread, or in a process of its
own (``python -m tests.latencyproxy PORT DELAY_MS``, which prints its endpoint's port) so that its
CPU does not share a benchmark's interpreter. ``rate`` paces each direction as a link of that
many bytes a second, shared by every connection.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time

LOOPBACK = "127.0.0.1"
PIECE = 256 * 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


class LatencyProxy:
    """``LatencyProxy(upstream_port, delay)``: connections to ``port`` reach ``upstream_port``
    on loopback, each direction ``delay`` seconds late."""

    def __init__(self, upstream_port: int, delay: float, port: int | None = None, rate: float | None = None):
        self.upstream_port, self.delay = upstream_port, delay
        # bytes a second each way, shared by all connections (a host's link); None: unpaced
        self.rate = rate
        self._free = {"up": 0.0, "down": 0.0}   # when each direction's link is next free
        self.port = port or _free_port()
        self.connections = self.open = self.most = 0
        self.carried: dict[str, list[tuple[float, int]]] = {"up": [], "down": []}
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name=f"latency-{self.port}")
        self._server: asyncio.base_events.Server | None = None

    def start(self) -> LatencyProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, LOOPBACK, self.port)

    def stop(self) -> None:
        async def _stop() -> None:
            self._server.close()
            left = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in left:
                task.cancel()
            await asyncio.gather(*left, return_exceptions=True)
        asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def __enter__(self) -> LatencyProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def serve_forever(self) -> None:
        """In this thread (``python -m tests.latencyproxy``)."""
        self._loop.run_until_complete(self._start())
        self._loop.run_forever()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(LOOPBACK, self.upstream_port)
        except OSError:
            client_w.close()
            return
        with self._lock:
            self.connections += 1
            self.open += 1
            self.most = max(self.most, self.open)
        try:
            await asyncio.gather(self._carry(client_r, up_w, "up"),
                                 self._carry(up_r, client_w, "down"), return_exceptions=True)
        finally:
            with self._lock:
                self.open -= 1

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, way: str) -> None:
        """What ``reader`` gives, to ``writer``, each piece ``delay`` after it came (an end of
        stream too): a queue between a task that reads and this one that writes, so that pieces
        in flight overlap their delays as on a long wire. With ``rate``, each piece also waits
        for its turn on the direction's link, which carries ``rate`` bytes a second in all."""
        log = self.carried[way]
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def read() -> None:
            try:
                while True:
                    data = await reader.read(PIECE)
                    queue.put_nowait((time.monotonic() + self.delay, data))
                    if not data:
                        return
            except OSError:
                queue.put_nowait((time.monotonic(), b""))

        reading = asyncio.ensure_future(read())
        try:
            while True:
                due, data = await queue.get()
                wait = due - time.monotonic()
                if self.rate and data:
                    start = max(time.monotonic(), self._free[way])
                    self._free[way] = start + len(data) / self.rate
                    wait = max(wait, self._free[way] - time.monotonic())
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                log.append((time.monotonic(), len(data)))
                await writer.drain()
        except OSError:
            pass
        finally:
            reading.cancel()
            writer.close()


if __name__ == "__main__":   # python -m tests.latencyproxy UPSTREAM_PORT DELAY_MS: its port, then serves
    proxy = LatencyProxy(int(sys.argv[1]), float(sys.argv[2]) / 1000)
    print(proxy.port, flush=True)
    proxy.serve_forever()
