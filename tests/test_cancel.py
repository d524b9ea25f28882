"""Cancel stops the bytes: a 200 MiB copy on the service, limited to a rate at which 30% is
reached in seconds, cancelled there; ``jobs cancel`` returns once its workers have stopped, and
from then on a counting proxy in front of the store sees (nearly) nothing more: no object, no
manifest, no upload left, and the record ends when the last worker stopped.

Each destination's parts go up in 8 MiB bodies from 8 threads (two worker processes of four), so
up to 64 MiB can be in flight when the cancel is seen: a part that went on to its end would show
as 8 MiB at the proxy, and the copy still has 140 MiB to go, more than those 64 MiB. The bound
of 2 MiB leaves room for the requests that look for uploads to abort and abort them.

Since ``jobs cancel`` returns only once the workers have stopped, a worker that finished the part
it was sending before stopping would still pass that count (its bytes arrive before the return,
only later); ``test_a_part_being_sent_stops_at_its_next_piece`` shows the part stopping mid-body
on each store, at a fixed point, and fails where a part goes in one piece (the SDKs' calls)."""

from __future__ import annotations

import calendar
import os
import time

import pytest

from tests.emulators import unique_name
from tests.faultproxy import FaultProxy, Rule, proxied_environment
from tests.test_workers_service import service  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(300)
MiB = 1024 * 1024


def _left_at(scheme: str, emulator, bucket: str) -> tuple[list[str], list[str]]:
    """(the names of every object at the destination, bridge's own records and part objects
    included; the uploads left open there)."""
    if scheme == "s3":
        s3 = emulator.client()
        names = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
        return names, [u["Key"] for u in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]
    if scheme == "gs":   # parts are objects of their own under _bridge/uploads/ until composed
        return [b.name for b in emulator.client().list_blobs(bucket)], []
    container = emulator.client().get_container_client(bucket)
    committed = [b.name for b in container.list_blobs()]
    # a blob holding only uncommitted blocks is listed with uncommittedblobs only
    return committed, [b.name for b in container.list_blobs(include=["uncommittedblobs"]) if b.name not in committed]


class CancelledAfter:
    """A cancel event (bridge.retry.stopping takes anything with ``is_set``) that is seen as set
    from its ``n``-th look on: the looks are the one before a request and one before each 256 KiB
    piece of its body, so this cancels a part while its body is being sent, at the same point
    every run."""

    def __init__(self, n: int):
        self.n, self.looks = n, 0

    def is_set(self) -> bool:
        self.looks += 1
        return self.looks >= self.n


@pytest.mark.parametrize("scheme", ["s3", "gs", "az"])
def test_a_part_being_sent_stops_at_its_next_piece(scheme, env_for, make_root):
    """The body of a part stops mid-way when the cancel is seen (after two of its eight pieces):
    the store never gets the part (no part object, no staged block, no uploaded part), so the
    request cannot complete after the cancel. A part sent in one piece (the SDKs' calls) would
    arrive whole: this fails then."""
    from bridge.errors import JobCancelled
    from bridge.hashing import crc32c, crc_hex
    from bridge.retry import stopping
    from bridge.stores import get_store
    from bridge.urls import parse
    from tests.helpers import settings_for
    settings = settings_for(env_for(scheme))
    loc = parse(make_root(scheme)).join("model.bin")
    store = get_store(loc, settings)
    data = os.urandom(2 * MiB)
    upload_id = store.begin_upload(loc, len(data))
    cancel = CancelledAfter(4)
    with stopping(cancel), pytest.raises(JobCancelled):
        store.upload_part(loc, upload_id, 1, 0, data, crc_hex(crc32c(data)))
    assert cancel.looks == 4   # before the request, then before each of the first three pieces
    assert not store.list_parts(loc, upload_id), "the part arrived whole after the cancel"
    store.abort_upload(loc, upload_id)


@pytest.mark.parametrize("scheme", ["s3", "gs", "az"])
def test_cancel_at_30_percent_of_a_200_mib_copy_stops_the_bytes(scheme, service, emulator_for, tmp_path):  # noqa: F811
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "model.bin", "wb") as f:
        for _ in range(25):
            f.write(os.urandom(8 * MiB))
    emulator = emulator_for(scheme)
    bucket = unique_name()
    emulator.create_bucket(bucket)
    with FaultProxy(emulator.endpoint) as proxy:
        # the workers reach the store through the proxy
        service.env.update(proxied_environment(service.env, {scheme: proxy}))
        service.worker("w1", concurrency=2, threads=4).wait_ready()
        job_id = service.submit("cp", f"{src}/", f"{scheme}://{bucket}/c/", "--bwlimit", "16MiB",
                                "--chunk-size", "8MiB")
        deadline = time.monotonic() + 120
        while True:
            record = service.jobs.get(job_id)
            done = record.counters.get("bytes_done", 0)
            if done >= 0.3 * 200 * MiB:
                break
            assert time.monotonic() < deadline and record.state in ("queued", "planning", "running"), record
            time.sleep(0.05)

        # The first three deletes (the aborts of the upload, or of its part objects or staged
        # blocks) are refused 503 and sent again after a backoff: the aborts take seconds, and
        # the cancel must still return only once they are done.
        proxy.rules = [Rule(r"^DELETE ", "error", times=3)]
        asked = time.time()
        r = service.cli("jobs", "cancel", job_id)
        assert r.returncode == 0 and "workers stopped" in r.stdout, r.stdout + r.stderr
        at_return = proxy.counts["bytes_up"] + proxy.counts["bytes_down"]
        returned = time.monotonic()
        # The record ends once the last task has stopped and its uploads are aborted, and the
        # cancel returns on that: nothing is left by then.
        assert _left_at(scheme, emulator, bucket) == ([], []), "left when the cancel returned"
        time.sleep(max(0.0, returned + 3 - time.monotonic()))   # as long as a part in flight would take
        after = proxy.counts["bytes_up"] + proxy.counts["bytes_down"] - at_return
        print(f"{scheme}: cancel at {done / MiB:.0f} MiB done; {after} bytes at the proxy after the cancel "
              f"returned; {proxy.counts['bytes_up'] / MiB:.0f} MiB sent in all")
        assert after < 2 * MiB, after

        record = service.jobs.get(job_id)
        assert record.state == "cancelled" and record.errors == []
        finished = calendar.timegm(time.strptime(record.to_dict()["finished"], "%Y-%m-%dT%H:%M:%SZ"))
        assert finished >= int(asked)   # the end is when its last task stopped, not when it was asked
        objects, uploads = _left_at(scheme, emulator, bucket)
        assert objects == [], objects        # no object, no part object, no manifest
        assert uploads == [], "an upload was left"
        text = service.cli("jobs", "status", job_id).stdout
        assert "cancelled" in text.splitlines()[0]


def test_cancel_at_30_percent_of_a_datasync_job_stops_the_remote_execution(service, moto, fake_gcs, tmp_path):  # noqa: F811
    """A native route on the service: the bytes move inside DataSync (its double writes S3
    through the counting proxy), so the cancel must reach the remote execution. Twenty 1 MiB
    objects, copied one at a time: at 30% fourteen are left, and at most the one in flight when
    the execution is cancelled may still arrive."""
    from bridge.manifest import read as read_manifest
    from bridge.stores import get_store
    from bridge.urls import parse
    from tests.doubles.datasync import DataSyncDouble
    from tests.helpers import settings_for
    from tests.test_native_sts import fill
    files = {f"f{i:02d}": os.urandom(MiB) for i in range(20)}
    src, dst = f"gs://{unique_name()}/", f"s3://{unique_name()}/"
    fake_gcs.create_bucket(parse(src).bucket)
    moto.create_bucket(parse(dst).bucket)
    with FaultProxy(moto.endpoint) as proxy, DataSyncDouble(s3_endpoint=proxy.endpoint, delay=0.5) as double:
        service.env.update(AWS_ENDPOINT_URL_DATASYNC=double.endpoint, MCBRIDGE_POLL_INTERVAL="0.05",
                           MCBRIDGE_DATASYNC_S3_ROLE_ARN="arn:aws:iam::111122223333:role/dsync",
                           MCBRIDGE_GCS_HMAC_ACCESS_ID="GOOG1EXAMPLE", MCBRIDGE_GCS_HMAC_SECRET="hmac-secret",
                           MCBRIDGE_GCS_XML_ENDPOINT=fake_gcs.endpoint)
        settings = settings_for(service.env)
        fill(src, settings, files)
        service.worker("w1").wait_ready()
        job_id = service.submit("cp", src, dst, "--route", "datasync")
        deadline = time.monotonic() + 60
        while not any(run.objects_copied >= 6 for _task, run in double.executions.values()):
            assert time.monotonic() < deadline, "the execution did not get to 30%"
            time.sleep(0.02)

        r = service.cli("jobs", "cancel", job_id)
        assert r.returncode == 0 and "workers stopped" in r.stdout, r.stdout + r.stderr
        at_return = proxy.counts["bytes_up"]
        ((_task, remote),) = double.executions.values()
        assert remote.finished.wait(10) and remote.state == "cancelled"
        time.sleep(1)
        after = proxy.counts["bytes_up"] - at_return
        print(f"datasync: {remote.objects_copied} of 20 objects copied; {after} bytes at the proxy after the "
              f"cancel returned")
        assert after < 2 * MiB, after
        assert len(double.calls("CancelTaskExecution")) == 1 and remote.objects_copied < 20
        assert double.tasks == {} and double.locations == {}   # nothing left at the service
        assert service.jobs.get(job_id).state == "cancelled"
        assert read_manifest(get_store(parse(dst), settings), parse(dst)) is None   # nothing committed


# -- routes whose bytes never pass through bridge ------------------------------------------------
# A worker's task runs its route inside ``stopping(cancelled)`` (workers/executor.py), and the
# cancel watcher sets that event: these tests run the route in-process inside ``stopping`` of an
# event that reads as set once the store has taken ``k`` of the copy's pieces, so the cancel lands
# at the same point of the copy every run, whatever the machine's speed. Then: no piece is asked
# for after the first ``concurrency`` (those in flight when the cancel was seen), no request at
# all once the copy has returned, the upload is aborted, and nothing is committed.

class CancelledOnceSeen:
    """A cancel event that reads as set once ``seen()`` (a count at the store) reaches ``n``."""

    def __init__(self, seen, n: int):
        self.seen, self.n = seen, n

    def is_set(self) -> bool:
        return self.seen() >= self.n


def _lines(proxy: FaultProxy, pattern: str) -> int:
    import re
    return sum(1 for line, _ in list(proxy.log) if re.search(pattern, line))


def test_a_server_side_copy_in_parts_stops_between_parts_and_aborts(moto, emulator_env, tmp_path, monkeypatch):
    """S3 UploadPartCopy: a 60 MiB object in twelve 5 MiB parts copied two at a time, cancelled
    once the third part was asked for. moto keeps objects in memory, so S3's 5 GiB CopyObject
    limit is lowered to 5 MiB instead of copying 5 GiB (as tests/test_routes.py does): the parts
    are S3's smallest, the most a copy can have for its size. At most the part in flight on the
    other thread may still be asked for after the cancel is seen; twelve would be, without it."""
    import dataclasses
    from bridge import ops
    from bridge.errors import BridgeError
    from bridge.manifest import read as read_manifest
    from bridge.retry import stopping
    from bridge.stores import get_store
    from bridge.stores.s3 import S3Store
    from bridge.urls import parse
    from tests.helpers import settings_for
    src, dst = f"s3://{unique_name()}/", f"s3://{unique_name()}/"
    moto.create_bucket(parse(src).bucket)
    moto.create_bucket(parse(dst).bucket)
    with FaultProxy(moto.endpoint) as proxy:
        settings = settings_for(proxied_environment(emulator_env, {"s3": proxy}), concurrency=2)
        (tmp_path / "model.bin").write_bytes(os.urandom(60 * MiB))
        ops.copy(str(tmp_path / "model.bin"), src, settings, state_dir=tmp_path / "s1")
        monkeypatch.setattr(S3Store, "features", dataclasses.replace(S3Store.features, max_copy_size=5 * MiB))
        proxy.configure()
        part = r"^PUT /[^?]+\?(?=.*partNumber=)(?=.*uploadId=)"
        cancel = CancelledOnceSeen(lambda: _lines(proxy, part), 3)
        with stopping(cancel), pytest.raises(BridgeError, match="cancelled"):   # the unit's error, in-process
            ops.copy(src, dst, settings, route="server", state_dir=tmp_path / "s2")
        at_return = proxy.counts["requests"]
        time.sleep(1)
        asked = _lines(proxy, part)
        print(f"server: {asked} of 12 parts asked for; {proxy.counts['requests'] - at_return} requests after the "
              f"cancel returned")
        assert 3 <= asked <= 4, proxy.log
        assert proxy.counts["requests"] == at_return, proxy.log[at_return:]
        assert _lines(proxy, r"^DELETE /[^?]+\?.*uploadId=") == 1, proxy.log   # the upload was aborted
        assert _left_at("s3", moto, parse(dst).bucket) == ([], [])             # no object, manifest or upload
        assert read_manifest(get_store(parse(dst), settings), parse(dst)) is None


def test_a_copy_from_url_stops_between_blocks_and_drops_the_staged_ones(moto, azurite, azure_from_url, emulator_env,
                                                                        tmp_path):
    """Azure Put Block From URL (the double in front of Azurite): a 48 MiB S3 object in twelve
    4 MiB blocks pulled two at a time, cancelled once the third block was asked for. The blocks
    Azure staged are dropped (the blob, holding only uncommitted blocks, is deleted) and no
    block list is put; at most the block in flight on the other thread may still be asked for."""
    from bridge import ops
    from bridge.errors import BridgeError
    from bridge.manifest import read as read_manifest
    from bridge.retry import stopping
    from bridge.stores import get_store
    from bridge.urls import parse
    from tests.helpers import settings_for
    src, dst = f"s3://{unique_name()}/", f"az://{unique_name()}/"
    moto.create_bucket(parse(src).bucket)
    azurite.create_bucket(parse(dst).bucket)
    with FaultProxy(azure_from_url.endpoint.rsplit("/", 1)[0]) as proxy:
        settings = settings_for(proxied_environment(emulator_env, {"az": proxy}), concurrency=2,
                                chunk_size=4 * MiB)
        (tmp_path / "model.bin").write_bytes(os.urandom(48 * MiB))
        ops.copy(str(tmp_path / "model.bin"), src, settings, state_dir=tmp_path / "s1")
        proxy.configure()
        block = r"^PUT /[^?]+\?(?=.*comp=block(&|$))"
        cancel = CancelledOnceSeen(lambda: _lines(proxy, block), 3)
        with stopping(cancel), pytest.raises(BridgeError, match="cancelled"):   # the unit's error, in-process
            ops.copy(src, dst, settings, route="from-url", state_dir=tmp_path / "s2")
        at_return = proxy.counts["requests"]
        time.sleep(1)
        asked = _lines(proxy, block)
        print(f"from-url: {asked} of 12 blocks asked for; {proxy.counts['requests'] - at_return} requests after "
              f"the cancel returned")
        assert 3 <= asked <= 4, proxy.log
        assert proxy.counts["requests"] == at_return, proxy.log[at_return:]
        assert _lines(proxy, r"^PUT /[^?]+\?.*comp=blocklist") == 0, proxy.log   # nothing committed
        assert _lines(proxy, r"^DELETE /[^?]+model\.bin$") == 1, proxy.log       # the staged blocks dropped
        assert _left_at("az", azurite, parse(dst).bucket) == ([], [])   # no blob, no staged block, no manifest
        assert read_manifest(get_store(parse(dst), settings), parse(dst)) is None


def test_cancel_at_30_percent_of_a_storage_transfer_job_cancels_the_operation(service, moto, fake_gcs, tmp_path):  # noqa: F811
    """The sts route on the service: Storage Transfer's double writes fake-gcs-server through the
    counting proxy, one object at a time (twenty 1 MiB objects, half a second apart, so 30% is
    reached in seconds and the cancel lands with fourteen to go). ``jobs cancel`` returns once the
    worker has cancelled the operation at the service and seen it stop: by then at most the
    object in flight may still arrive, the transfer job is deleted, and no manifest is written."""
    from bridge.manifest import read as read_manifest
    from bridge.stores import get_store
    from bridge.urls import parse
    from tests.doubles.sts import StorageTransferDouble
    from tests.helpers import settings_for
    from tests.test_native_sts import fill
    files = {f"f{i:02d}": os.urandom(MiB) for i in range(20)}
    src, dst = f"s3://{unique_name()}/", f"gs://{unique_name()}/"
    moto.create_bucket(parse(src).bucket)
    fake_gcs.create_bucket(parse(dst).bucket)
    with FaultProxy(fake_gcs.endpoint) as proxy, \
            StorageTransferDouble(gcs_endpoint=proxy.endpoint, s3_endpoint=moto.endpoint, delay=0.5) as double:
        service.env.update(MCBRIDGE_STS_ENDPOINT=double.endpoint, MCBRIDGE_POLL_INTERVAL="0.05")
        settings = settings_for(service.env)
        fill(src, settings, files)
        service.worker("w1").wait_ready()
        job_id = service.submit("cp", src, dst, "--route", "sts")
        deadline = time.monotonic() + 60
        while not any(run.objects_copied >= 6 for _meta, run in double.operations.values()):
            assert time.monotonic() < deadline, "the operation did not get to 30%"
            time.sleep(0.02)

        r = service.cli("jobs", "cancel", job_id)
        assert r.returncode == 0 and "workers stopped" in r.stdout, r.stdout + r.stderr
        at_return = proxy.counts["bytes_up"]
        ((_meta, remote),) = double.operations.values()
        assert len(double.server.calls(":cancel")) == 1, "the operation was not cancelled before the return"
        assert remote.finished.is_set() and remote.state == "cancelled"
        time.sleep(1)
        after = proxy.counts["bytes_up"] - at_return
        print(f"sts: {remote.objects_copied} of 20 objects copied; {after} bytes at the proxy after the cancel "
              f"returned")
        assert after < 2 * MiB, after
        assert remote.objects_copied < 20
        assert all(j["status"] == "DELETED" for j in double.jobs.values())   # nothing left at the service
        assert service.jobs.get(job_id).state == "cancelled"
        assert read_manifest(get_store(parse(dst), settings), parse(dst)) is None   # nothing committed


def test_a_job_cancelled_while_queued_is_dropped_by_its_plan_task(service, make_root, tmp_path):  # noqa: F811
    """Cancelled before any worker took it: ``jobs cancel`` returns at once (nothing ran), and the
    plan task a worker takes later drops it without an error; a job submitted after it (taken
    after it from the same queue) runs, so the plan task has run by then."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"x")
    dst = make_root("s3")
    job_id = service.submit("cp", f"{src}/", dst + "a/")
    r = service.cli("jobs", "cancel", job_id)
    assert r.returncode == 0 and "workers stopped" in r.stdout, r.stdout + r.stderr
    later = service.submit("cp", f"{src}/", dst + "b/")
    worker = service.worker("w1", threads=1)
    worker.wait_ready()
    assert service.wait(later).state == "succeeded"
    assert service.jobs.get(job_id).state == "cancelled"
    log = worker.log_tail(400)
    assert "Traceback" not in log and "ERROR/" not in log, log   # no task failed


# -- a task busy inside one call ---------------------------------------------------------------------

def _busy_tree(root, files: int) -> None:
    """``files`` files, each under three folders of its own, every name 240 random a's and b's
    ending with an a: 963-character paths no two of which share a folder."""
    import random
    rng = random.Random(46)
    for _ in range(files):
        parts = ["".join(rng.choice("ab") for _ in range(239)) + "a" for _ in range(4)]
        path = root.joinpath(*parts)
        path.parent.mkdir(parents=True)
        path.write_bytes(b"x")


def test_a_cancel_ends_a_task_busy_inside_one_call(service, tmp_path):  # noqa: F811
    """A job's plan busy in one long call, which never looks at the cancel: its listing goes
    through two globs, one that Python's `re` backtracks on for ever (five '**' runs against
    names ending without their b) and one within the limits that still costs the automaton tens
    of milliseconds a name (bridge/filters.py: a position for every a in the last 250
    characters), over 2,000 such names: a minute or more of matching either way. ``jobs cancel``
    returns within seconds: the pool process that was busy is ended (after the grace its watcher
    gives it) with the job's finalize handed over, which ends the record cancelled, nothing at
    the destination; the worker's new pool process runs the next job. Without the ending, the
    plan goes on matching and the cancel waits out its timeout."""
    import psutil
    from bridge.workers.executor import Service
    src, small = tmp_path / "src", tmp_path / "small"
    _busy_tree(src, 2000)
    small.mkdir()
    (small / "f").write_bytes(b"after")
    worker = service.worker("w1", concurrency=1, threads=1)
    worker.wait_ready()
    pool = psutil.Process(worker.pid).children(recursive=True)
    job_id = service.submit("cp", f"{src}/", f"{tmp_path}/out/", "--include", "**a**a**a**a**a**b",
                            "--include", "{**a,x}" + "[^c]" * 250)
    service.wait(job_id, timeout=60, states=("planning",))
    (busy,) = pool   # its one pool process, planning
    spent = busy.cpu_times().user
    time.sleep(2)   # well inside the listing
    assert service.jobs.get(job_id).state == "planning" and busy.cpu_times().user > spent + 0.1

    asked = time.monotonic()
    r = service.cli("jobs", "cancel", job_id, "--timeout", "40")
    took = time.monotonic() - asked
    assert r.returncode == 0 and "workers stopped" in r.stdout, (r.stdout + r.stderr, worker.log_tail(30))
    print(f"busy plan: the cancel returned in {took:.1f}s (the watcher's grace: {Service.CANCEL_GRACE:.0f}s)")
    assert took < 30, took
    assert not busy.is_running() or busy.status() == psutil.STATUS_ZOMBIE, "the busy process goes on"
    assert "ending its pool process" in worker.log_tail(200)
    record = service.jobs.get(job_id)
    assert record.state == "cancelled" and record.finished is not None, record.to_dict()
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*")), "left at the destination"

    later = service.submit("cp", f"{small}/", f"{tmp_path}/later/")
    assert service.wait(later, timeout=60).state == "succeeded"
    assert (tmp_path / "later" / "f").read_bytes() == b"after"
