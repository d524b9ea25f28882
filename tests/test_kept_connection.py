"""The keep-alive connection the S3, GCS and Azure direct paths share (bridge.stores.base.
kept_connection), against a real HTTP/1.1 server on loopback: one the server closed while it was
kept is not reused, one that cannot be opened is EndpointUnreachable, and an exchange that left
nothing unread gives the connection back for the next request."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bridge.errors import EndpointUnreachable, ObjectNotFound
from bridge.stores.base import kept_connection
from bridge.urls import parse

LOC = parse("s3://bucket/key")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    connections: list[int] = []

    def setup(self):
        super().setup()
        type(self).connections.append(self.client_address[1])

    def do_GET(self):
        body = b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        # /hangup: answered as keep-alive, then closed by the server, as an idle timeout does
        self.close_connection = self.path == "/hangup"

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    _Handler.connections = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _get(local, port: int, path: str) -> bytes:
    connect = lambda: http.client.HTTPConnection("127.0.0.1", port, timeout=5)   # noqa: E731
    with kept_connection(local, connect, LOC, "the test endpoint") as conn:
        conn.request("GET", path)
        return conn.getresponse().read()


def test_a_connection_is_reused_after_a_clean_exchange(server):
    local = threading.local()
    port = server.server_address[1]
    assert [_get(local, port, "/a") for _ in range(3)] == [b"ok"] * 3
    assert len(_Handler.connections) == 1


def test_a_connection_the_server_closed_while_kept_is_not_reused(server):
    local = threading.local()
    port = server.server_address[1]
    assert _get(local, port, "/hangup") == b"ok"
    kept = local.conn
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:   # the server's FIN reaches the kept socket
        kept.sock.setblocking(False)
        try:
            if kept.sock.recv(1, socket.MSG_PEEK) == b"":
                break
        except BlockingIOError:
            time.sleep(0.01)
        finally:
            kept.sock.setblocking(True)
    # the next request goes out on a new connection and succeeds at its first attempt
    assert _get(local, port, "/a") == b"ok"
    assert local.conn is not kept and len(_Handler.connections) == 2


def test_a_connection_that_cannot_be_opened_is_endpoint_unreachable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]   # bound, not listening: refused

    def opening():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.connect()
        return conn

    with pytest.raises(EndpointUnreachable, match="cannot reach the test endpoint: ConnectionRefusedError"):
        with kept_connection(threading.local(), opening, LOC, "the test endpoint"):
            pass


def test_azure_keeps_its_connection_after_an_error_answer(azurite, make_root):
    from bridge.stores import get_store
    from tests.helpers import settings_for
    container = parse(make_root("az")).bucket
    direct = get_store(parse(f"az://{container}/"), settings_for(azurite.env()))._direct
    assert direct is not None
    direct.check_container(parse(f"az://{container}/"))
    kept = direct._local.conn
    with pytest.raises(ObjectNotFound):
        direct.head(parse(f"az://{container}/missing.bin"))
    assert direct._local.conn is kept
