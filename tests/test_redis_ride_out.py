"""A worker's Redis calls ride out a Redis restart (workers/keys.py ``redis_client(ride_out=)``):
against a redis-server of the test's own, killed and started again on its port while a call is
made. With redis-py's default retry such a call failed at once (10 ms), so any task whose
journal write or count fell in a restart would fail; tests/test_hosts.py's restart test failed
once, its job "failed", the error not recorded then: this is the likely cause."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from bridge.workers.keys import redis_client
from tests.emulators import RedisServer


@pytest.fixture
def server():
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _call_while_restarting(client, server: RedisServer, down: float) -> tuple[str, float]:
    """``client.set`` made just after the server was killed; it starts again ``down`` s later."""
    client.ping()   # connected before the kill: the call finds its connection dropped
    original = server._process
    thread = threading.Thread(target=server.restart, kwargs={"down": down})
    thread.start()
    while server._process is original:   # restart() kills, then sleeps ``down``, then spawns
        time.sleep(0.005)
    started = time.monotonic()
    try:
        client.set("ride-out", "yes")
        result = "ok"
    except redis.ConnectionError:
        result = "failed"
    took = time.monotonic() - started
    thread.join()
    return result, took


def test_a_workers_call_made_while_redis_restarts_goes_through_when_it_is_back(server):
    client = redis_client(server.url(), ride_out=4.0)
    result, took = _call_while_restarting(client, server, down=1.0)
    assert result == "ok"
    assert took >= 0.9   # it waited for the restart, it did not land elsewhere
    assert redis.Redis.from_url(server.url()).get("ride-out") == b"yes"


def test_a_call_gives_up_after_its_ride_out(server):
    client = redis_client(server.url(), ride_out=0.5)
    result, took = _call_while_restarting(client, server, down=3.0)
    assert result == "failed"
    assert took < 2.5   # given up before Redis came back


def test_a_command_line_call_fails_at_once_as_before(server):
    client = redis_client(server.url())
    result, took = _call_while_restarting(client, server, down=1.0)
    assert result == "failed"
