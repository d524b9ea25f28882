"""Small files far away: a batch keeps ``transfer.small_files_in_flight`` requests in flight.

A small object's time is mostly the endpoint's latency, which the emulators on loopback do not
have: here moto is reached through tests/latencyproxy.py, which delays each direction, and the
proxy counts the connections open at once (one per request in flight: bridge.stores.streams)."""

from __future__ import annotations

import os

import pytest

from bridge import ops
from bridge.config import load_settings
from bridge.errors import BridgeError
from bridge.pipeline.units import BATCH_IN_FLIGHT, batch_connections
from tests.emulators import unique_name
from tests.helpers import settings_for
from tests.latencyproxy import LatencyProxy
from bridge.pipeline import execute as executor
from bridge.pipeline import plan as planning
from bridge.pipeline import units
from bridge.pipeline import verify as verifying

MiB = 1024 * 1024
FILES = 120


def _tree(root, count: int, size: int) -> None:
    for i in range(count):
        (root / f"d{i % 4}").mkdir(parents=True, exist_ok=True)
        (root / f"d{i % 4}" / f"{i:04d}.bin").write_bytes(os.urandom(size))


@pytest.mark.parametrize("in_flight, most", [(None, 64), (8, 8)])
def test_small_files_far_away_go_with_many_requests_in_flight_both_ways(moto, tmp_path, in_flight, most):
    bucket = unique_name()
    moto.create_bucket(bucket)
    src = tmp_path / "src"
    _tree(src, FILES, 2048)
    with LatencyProxy(moto.port, 0.005) as proxy:
        env = {**moto.env(), "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}",
               "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}
        extra = {"small_files_in_flight": in_flight} if in_flight else {}
        settings = settings_for(env, **extra)
        assert settings.transfer.small_files_in_flight == (in_flight or 64)
        plan = planning.plan_copy(f"{src}/", f"s3://{bucket}/far/", settings)
        assert [len(u["files"]) for u in plan.units() if u["op"] == "batch"] == [FILES]
        proxy.most = proxy.open   # from what the plan left open
        executor.execute(plan, settings)
        up = proxy.most
        proxy.most = proxy.open
        ops.copy(f"s3://{bucket}/far/", f"{tmp_path / 'back'}/", settings)
        down = proxy.most
    # One connection per request in flight, and a few more: the job's other threads' own, for
    # their single requests (listing, record, commit), and connections closing, which the proxy
    # sees a delay late (on a loaded machine up to 16 more were seen). At 8, well under 64.
    assert up >= most and down >= most, (up, down)
    if most < 64:
        assert up <= 32 and down <= 32, (up, down)
    for i in range(FILES):
        rel = f"d{i % 4}/{i:04d}.bin"
        assert (tmp_path / "back" / rel).read_bytes() == (src / rel).read_bytes()


def test_the_bytes_in_flight_are_bounded_and_never_fewer_requests_than_the_concurrency():
    settings = load_settings({"transfer": {"concurrency": 8}}, environ={})
    assert batch_connections(settings, 16 * 1024) == 64          # small files: small_files_in_flight
    assert batch_connections(settings, 4 * MiB) == BATCH_IN_FLIGHT // (4 * MiB) == 16   # bigger: bytes bound it
    assert batch_connections(settings, 32 * MiB) == 8             # never fewer than the concurrency
    assert batch_connections(settings, 0) == 64                   # empty files
    more = load_settings({"transfer": {"concurrency": 100, "small_files_in_flight": 10}}, environ={})
    assert batch_connections(more, 1024) == 100
    fewer = load_settings(environ={"MCBRIDGE_SMALL_FILES_IN_FLIGHT": "16", "MCBRIDGE_CONCURRENCY": "4"})
    assert batch_connections(fewer, 1024) == 16


def test_a_deep_verify_of_small_files_far_away_reads_them_in_batches_and_names_the_damaged_in_order(moto, tmp_path):
    """``verify --deep`` reads small whole objects as a copy does (verdicts.judge_many: a batch's
    requests in flight from one thread), and its report still names what differs in path order."""
    bucket = unique_name()
    moto.create_bucket(bucket)
    src = tmp_path / "src"
    _tree(src, FILES, 2048)
    env = {**moto.env(), "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}
    assert ops.copy(f"{src}/", f"s3://{bucket}/far/", settings_for(env))["ok"]
    damaged = [f"d{i % 4}/{i:04d}.bin" for i in (97, 5, 42)]
    for rel in damaged:   # the same size, other bytes, behind bridge's back
        moto.client().put_object(Bucket=bucket, Key=f"far/{rel}", Body=os.urandom(2048))
    with LatencyProxy(moto.port, 0.005) as proxy:
        far = settings_for({**env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}"})
        report = verifying.verify(f"s3://{bucket}/far/", far, deep=True)
    assert not report["ok"] and report["checked"] == FILES
    assert [row["path"] for row in report["mismatched"]] == sorted(damaged)
    assert all(row["reason"].startswith("CRC32C ") for row in report["mismatched"])
    assert proxy.most >= 64   # the batch's requests in flight, not transfer.concurrency's 8 threads


def test_packing_small_files_far_away_reads_each_batch_with_requests_in_flight_on_kept_links(tmp_path):
    """A pack from an object store reads its small members a batch at a time per read thread,
    several requests in flight each (packing.writer._read_batch: small_files_in_flight in all),
    and the read threads' event loops keep their links from one batch to the next
    (bridge.stores.streams: a home per run at once), not a connection per request in flight per
    batch. ``rclone serve s3`` keeps connections alive (moto's server closes each)."""
    from bridge.packing import job
    from bridge.packing.unpack import unpack
    from tests.emulators import RcloneS3
    src = tmp_path / "src"
    count = 1200   # 19 batches of 64 for the 8 read threads
    _tree(src, count, 1024)
    with RcloneS3() as server:
        server.create_bucket("corpus")
        env = {**server.env(), "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}
        assert ops.copy(f"{src}/", "s3://corpus/in/", settings_for(env))["ok"]
        with LatencyProxy(server.port, 0.005) as proxy:
            far = settings_for({**env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}"})
            assert far.transfer.concurrency == 8
            summary = job.pack("s3://corpus/in/", f"{tmp_path / 'shards'}/", far, state_dir=tmp_path / "pack")
    assert summary["files"] == count
    # 8 threads with 8 requests in flight each (one thread's blocking reads: at most 8 and a few)
    assert proxy.most >= 32, proxy.most
    # links kept: 64 and the listing's few, where a loop per batch opens 8 for each of the 19 batches
    assert proxy.connections <= 96, proxy.connections
    unpack(f"{tmp_path / 'shards'}/", f"{tmp_path / 'out'}/", settings_for(env))
    for i in range(count):
        rel = f"d{i % 4}/{i:04d}.bin"
        assert (tmp_path / "out" / rel).read_bytes() == (src / rel).read_bytes()


def test_unpacking_to_an_object_store_far_away_puts_each_batch_with_requests_in_flight(tmp_path):
    """Unpack into an object store: a put thread sends a batch of small members with several
    requests in flight (packing.unpack._Extractor._queue: small_files_in_flight in all), on kept
    links; what lands is the tree, verified against the record the unpack commits."""
    from bridge.packing import job
    from bridge.packing.unpack import unpack
    from tests.emulators import RcloneS3
    src = tmp_path / "src"
    count = 1200
    _tree(src, count, 1024)
    local = settings_for({"MCBRIDGE_STATE_DIR": str(tmp_path / "state")})
    job.pack(f"{src}/", f"{tmp_path / 'shards'}/", local, state_dir=tmp_path / "pack")
    with RcloneS3() as server:
        server.create_bucket("corpus")
        env = {**server.env(), "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}
        with LatencyProxy(server.port, 0.005) as proxy:
            far = settings_for({**env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}"},
                               store_checksums="skip")   # rclone serve s3 keeps no S3 checksums
            summary = unpack(f"{tmp_path / 'shards'}/", "s3://corpus/out/", far, state_dir=tmp_path / "unpack")
        assert summary["files"] == count, summary
        # 8 put threads with 8 requests in flight each (one request per thread: at most 8 and a few)
        assert proxy.most >= 32, proxy.most
        assert proxy.connections <= 96, proxy.connections
        near = settings_for(env, store_checksums="skip")
        assert verifying.verify("s3://corpus/out/", near, deep=True)["ok"]
        assert ops.copy("s3://corpus/out/", f"{tmp_path / 'back'}/", near)["ok"]
    for i in range(count):
        rel = f"d{i % 4}/{i:04d}.bin"
        assert (tmp_path / "back" / rel).read_bytes() == (src / rel).read_bytes()


@pytest.mark.parametrize("way", ["pack from", "unpack into"])
def test_batches_of_members_ride_out_503s_and_cut_answers(moto, tmp_path, way):
    """A pack's batch reads and an unpack's batch puts retry each request on its own (503s, and
    answers cut halfway) and what lands is byte-exact and verified."""
    from bridge.packing import job
    from bridge.packing.unpack import unpack
    from tests.faultproxy import FaultProxy
    bucket = unique_name()
    moto.create_bucket(bucket)
    src = tmp_path / "src"
    count = 300
    _tree(src, count, 1500)
    env = {**moto.env(), "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}
    near = settings_for(env)
    if way == "pack from":
        assert ops.copy(f"{src}/", f"s3://{bucket}/in/", near)["ok"]
    else:
        job.pack(f"{src}/", f"{tmp_path / 'shards'}/", near, state_dir=tmp_path / "pack")
    # 8% of requests fail. As a batch drains, its last requests' retries take consecutive draws of
    # the proxy's random sequence, so one request can meet a run of faults: with 5 retries at 15%
    # one run in 20 failed; 8 retries at 8% leave a run of 9 to fail one.
    with FaultProxy(moto.endpoint, error_rate=0.05, cut_rate=0.03, seed=7) as proxy:
        flaky = settings_for({**env, "AWS_ENDPOINT_URL": proxy.endpoint}, retries=8)
        if way == "pack from":
            job.pack(f"s3://{bucket}/in/", f"{tmp_path / 'shards'}/", flaky, state_dir=tmp_path / "pack")
        else:
            unpack(f"{tmp_path / 'shards'}/", f"s3://{bucket}/out/", flaky, state_dir=tmp_path / "unpack")
    assert proxy.faults >= 10, proxy.counts
    if way == "pack from":
        unpack(f"{tmp_path / 'shards'}/", f"{tmp_path / 'back'}/", near)
    else:
        assert verifying.verify(f"s3://{bucket}/out/", near, deep=True)["ok"]
        assert ops.copy(f"s3://{bucket}/out/", f"{tmp_path / 'back'}/", near)["ok"]
    for i in range(count):
        rel = f"d{i % 4}/{i:04d}.bin"
        assert (tmp_path / "back" / rel).read_bytes() == (src / rel).read_bytes()


def test_small_files_between_two_stores_go_in_batches_read_then_sent(moto, fake_gcs, tmp_path):
    """S3 -> GCS: a batch's objects are read with many requests in flight, then sent with many
    (units._batch between two stores), their headers kept, and the copy verifies deep."""
    bucket, target = unique_name(), unique_name()
    moto.create_bucket(bucket)
    fake_gcs.create_bucket(target)
    s3 = moto.client()
    data = {f"d{i % 3}/{i:03d}.json": os.urandom(1000 + i) for i in range(FILES)}
    for key, body in data.items():
        s3.put_object(Bucket=bucket, Key=f"in/{key}", Body=body, ContentType="application/x-test")
    env = {**moto.env(), **fake_gcs.env(), "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}
    with LatencyProxy(moto.port, 0.005) as proxy:
        far = settings_for({**env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}"})
        plan = planning.plan_copy(f"s3://{bucket}/in/", f"gs://{target}/out/", far)
        assert [len(u["files"]) for u in plan.units() if u["op"] == "batch"] == [FILES]
        proxy.most = proxy.open
        summary = executor.execute(plan, far)
    assert summary["ok"], summary
    assert proxy.most >= 32, proxy.most   # the batch's reads in flight (a thread per file: 8 and a few)
    near = settings_for(env)
    assert verifying.verify(f"gs://{target}/out/", near, deep=True)["ok"]
    blobs = {b.name[len("out/"):]: b for b in fake_gcs.client().list_blobs(target, prefix="out/")
             if not b.name.startswith("out/_bridge/")}   # the record
    assert {name: blob.download_as_bytes() for name, blob in blobs.items()} == data
    assert {blob.content_type for blob in blobs.values()} == {"application/x-test"}


def test_a_batch_to_a_local_folder_writes_beside_its_requests_and_names_the_files_it_could_not_write(
        moto, tmp_path, monkeypatch):
    """A batch's files are written by threads of their own while its requests go on
    (units._read_into_files): every file that could be written arrives byte-exact, each one whose
    write failed is the unit's error, and the job commits no record."""
    from bridge.errors import TransferFailed
    from bridge.stores.local import LocalStore
    bucket = unique_name()
    moto.create_bucket(bucket)
    src = tmp_path / "src"
    _tree(src, 40, 3000)
    env = {**moto.env(), "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}
    settings = settings_for(env)
    assert ops.copy(f"{src}/", f"s3://{bucket}/in/", settings)["ok"]
    refused = {"d1/0005.bin", "d2/0030.bin"}
    put = LocalStore.put
    writers = set()

    def failing_put(self, loc, data, **kw):
        import threading
        writers.add(threading.current_thread().name)
        if any(loc.local_path.endswith(rel) for rel in refused):
            raise BridgeError(f"{loc}: refused by the test")
        return put(self, loc, data, **kw)

    monkeypatch.setattr(LocalStore, "put", failing_put)
    back = tmp_path / "back"
    plan = planning.plan_copy(f"s3://{bucket}/in/", f"{back}/", settings)
    assert [len(u["files"]) for u in plan.units() if u["op"] == "batch"] == [40]
    with pytest.raises(TransferFailed, match=r"refused by the test \(and 1 more files of its batch of 40\)"):
        executor.execute(plan, settings)
    assert writers and all(name.startswith("bridge-write") for name in writers), writers
    for i in range(40):
        rel = f"d{i % 4}/{i:04d}.bin"
        assert (back / rel).exists() == (rel not in refused)
        if rel not in refused:
            assert (back / rel).read_bytes() == (src / rel).read_bytes()
    assert not list(back.rglob("*manifest*"))


def test_a_write_that_breaks_in_a_batch_to_a_local_folder_is_raised_as_it_was(moto, tmp_path, monkeypatch):
    """An error that is not bridge's (a bug, not a file's failure) ends the unit as it ended it
    when the event loop wrote the files itself."""
    from bridge.stores.local import LocalStore
    bucket = unique_name()
    moto.create_bucket(bucket)
    src = tmp_path / "src"
    _tree(src, 12, 1000)
    settings = settings_for({**moto.env(), "MCBRIDGE_STATE_DIR": str(tmp_path / "state")})
    assert ops.copy(f"{src}/", f"s3://{bucket}/in/", settings)["ok"]

    def broken_put(self, loc, data, **kw):
        raise ZeroDivisionError("a bug in a write")

    monkeypatch.setattr(LocalStore, "put", broken_put)
    with pytest.raises(Exception, match="a bug in a write"):
        ops.copy(f"s3://{bucket}/in/", f"{tmp_path / 'back'}/", settings)
