"""sync reads its source listing, destination listing and record each in a thread of its own,
ahead of the merge (``bridge.meter.ahead``): the items come in order, an error in the thread is
raised where the next item would have come, a consumer that stops early stops the thread, and a
listing that fails mid-sync ends it with that listing's error."""

from __future__ import annotations

import threading
import time

import pytest

from bridge import meter, ops
from bridge.errors import BridgeError, TransientError
from tests.emulators import unique_name
from tests.faultproxy import FaultProxy, Rule
from tests.helpers import settings_for


def test_ahead_gives_every_item_in_order_and_raises_the_threads_error_in_place():
    assert list(meter.ahead(range(5000), chunk=7, chunks=2)) == list(range(5000))

    def failing():
        yield from range(1200)
        raise TransientError("listing page 3: connection dropped")

    got = []
    with pytest.raises(TransientError, match="page 3"):
        for item in meter.ahead(failing(), chunk=100):
            got.append(item)
    assert got == list(range(1200))


def test_a_consumer_that_stops_early_stops_the_thread_and_closes_its_source():
    closed = threading.Event()

    def endless():
        try:
            n = 0
            while True:
                yield n
                n += 1
        finally:
            closed.set()

    items = meter.ahead(endless(), chunk=10, chunks=2)
    assert [next(items) for _ in range(25)] == list(range(25))
    items.close()
    assert closed.wait(5)   # the producer saw the stop and closed its source
    deadline = time.monotonic() + 5
    while any(t.name == "ahead" and t.is_alive() for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(t.name == "ahead" and t.is_alive() for t in threading.enumerate())


def test_a_destination_listing_that_fails_mid_sync_ends_it_with_that_error(moto, tmp_path):
    bucket = unique_name()
    moto.create_bucket(bucket)
    src = tmp_path / "src"
    src.mkdir()
    for i in range(30):
        (src / f"{i:02d}.txt").write_text(f"{i}\n")
    env = {**moto.env(), "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}
    assert ops.copy(f"{src}/", f"s3://{bucket}/x/", settings_for(env))["ok"]
    (src / "new.txt").write_text("new\n")
    with FaultProxy(moto.endpoint) as proxy:
        # the data listing fails every time; the record's (_bridge/) and the uploads' answer
        proxy.configure(rules=[Rule(rf"^GET /{bucket}\?(?!.*_bridge)(?!.*uploads).*list-type=2", "error", times=100)])
        far = settings_for({**env, "AWS_ENDPOINT_URL": proxy.endpoint}, retries=1)
        with pytest.raises(BridgeError, match="503"):
            ops.sync(f"{src}/", f"s3://{bucket}/x/", far)
    assert ops.sync(f"{src}/", f"s3://{bucket}/x/", settings_for(env))["sent"] == ["new.txt"]
