"""Store to store, both directions of a link at once: a part's bytes go on to the destination as
they arrive from the source (bridge.pipeline.units._pipe_part), and each file of a batch of small
files is sent as it arrives while the rest is read (_relay_files). Over real HTTP: moto as the
source behind a paced proxy (tests/latencyproxy.py, a link of a few MiB a second) and
fake-gcs-server as the destination behind another, whose logs say what crossed each wire when."""

from __future__ import annotations

import hashlib
import os
import threading
import time

import pytest

from bridge import ops
from bridge.pipeline import verify as verifying
from tests.emulators import unique_name
from tests.faultproxy import FaultProxy, Rule
from tests.helpers import settings_for
from tests.latencyproxy import LatencyProxy

MiB = 1024 * 1024


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1].rstrip("/"))


@pytest.fixture
def buckets(moto, fake_gcs):
    src, dst = unique_name("rs"), unique_name("rd")
    moto.client().create_bucket(Bucket=src)
    fake_gcs.create_bucket(dst)
    return src, dst


def _env(moto, fake_gcs, tmp_path, s3_endpoint: str, gcs_endpoint: str, **more: str) -> dict[str, str]:
    return {**os.environ, **moto.env(), **fake_gcs.env(), "AWS_ENDPOINT_URL": s3_endpoint,
            "STORAGE_EMULATOR_HOST": gcs_endpoint, "MCBRIDGE_STATE_DIR": str(tmp_path / "state"), **more}


def _verified(url: str, settings) -> None:
    report = verifying.verify(url, settings, deep=True)
    assert report["ok"], report


def _down_before_upload(source: LatencyProxy, destination: LatencyProxy, up: int) -> int:
    """Bytes the source's link had carried to bridge when the destination's had carried ``up``
    bytes from it (its requests without a body are a few hundred bytes each)."""
    carried = 0
    for when, size in destination.carried["up"]:
        carried += size
        if carried >= up:
            return sum(size for at, size in source.carried["down"] if at <= when)
    raise AssertionError(f"the destination's link carried {carried} bytes up, not {up}")


def test_a_part_goes_on_to_the_destination_while_it_arrives(moto, fake_gcs, buckets, tmp_path):
    src, dst = buckets
    data = os.urandom(10 * MiB + 12345)   # three parts of 5 MiB (GCS's least part size)
    moto.client().put_object(Bucket=src, Key="ckpt/model.bin", Body=data)
    with LatencyProxy(_port(moto.endpoint), 0.0, rate=4 * MiB) as source, \
            LatencyProxy(_port(fake_gcs.endpoint), 0.0) as destination:
        env = _env(moto, fake_gcs, tmp_path, f"http://127.0.0.1:{source.port}",
                   f"http://127.0.0.1:{destination.port}", MCBRIDGE_CONCURRENCY="1")
        settings = settings_for(env)
        ops.copy(f"s3://{src}/ckpt/", f"gs://{dst}/ckpt/", settings, chunk_size=5 * MiB)
        # One part at a time (concurrency 1): read whole before it was sent, the first part's
        # upload would begin after its 5 MiB had come; sent as it comes, after its first pieces.
        assert _down_before_upload(source, destination, 1 * MiB) < 5 * MiB
        _verified(f"gs://{dst}/ckpt/", settings)
    got = fake_gcs.client().bucket(dst).blob("ckpt/model.bin").download_as_bytes()
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()


def test_a_source_read_begun_again_mid_part_sends_the_part_whole(moto, fake_gcs, buckets, tmp_path):
    """The first range GET is cut half-way: its first half has gone on to GCS when the source's
    retry begins the part again, so that upload stops and the part is sent whole, once read."""
    src, dst = buckets
    data = os.urandom(10 * MiB + 777)
    moto.client().put_object(Bucket=src, Key="m/w.bin", Body=data)
    with FaultProxy(moto.endpoint) as faults, \
            LatencyProxy(_port(fake_gcs.endpoint), 0.0) as destination:
        faults.configure(rules=[Rule(r"^GET /[^?]*w\.bin", "cut")])
        env = _env(moto, fake_gcs, tmp_path, faults.endpoint, f"http://127.0.0.1:{destination.port}",
                   MCBRIDGE_CONCURRENCY="1")
        settings = settings_for(env)
        ops.copy(f"s3://{src}/m/", f"gs://{dst}/m/", settings, chunk_size=5 * MiB)
        assert faults.counts["cut"] == 1
        # the part went up more than once: the cut stream's half, then the whole part
        assert sum(size for _when, size in destination.carried["up"]) > len(data) + 2 * MiB
        _verified(f"gs://{dst}/m/", settings)
    got = fake_gcs.client().bucket(dst).blob("m/w.bin").download_as_bytes()
    assert got == data


def _relayed(moto, fake_gcs, buckets, tmp_path, files: dict[str, bytes], up: int, hold: str | None = None) -> int:
    """``files`` copied s3 -> gs as one batch, 8 requests in flight each way, the source behind a
    link of 1 MiB/s: verified and byte-exact; the bytes the source's link had carried when the
    destination's had carried ``up`` (_down_before_upload). With ``hold`` (a pattern of request
    lines), the source holds the answers to the GETs it matches until the destination's link has
    carried ``up`` bytes (or 20 s have passed), so that the other files arrive first whatever
    order moto would have answered them in."""
    src, dst = buckets
    s3 = moto.client()
    for key, body in files.items():
        s3.put_object(Bucket=src, Key=key, Body=body)
    with FaultProxy(moto.endpoint) as faults, \
            LatencyProxy(faults.port, 0.0, rate=1 * MiB) as source, \
            LatencyProxy(_port(fake_gcs.endpoint), 0.0) as destination:
        released = threading.Event()
        if hold:
            faults.configure(rules=[Rule(hold, "hold", times=len(files))])

            def release() -> None:
                deadline = time.monotonic() + 20
                while sum(size for _when, size in destination.carried["up"]) < up and time.monotonic() < deadline:
                    time.sleep(0.01)
                faults.release()
                released.set()

            threading.Thread(target=release, daemon=True).start()
        env = _env(moto, fake_gcs, tmp_path, f"http://127.0.0.1:{source.port}",
                   f"http://127.0.0.1:{destination.port}", MCBRIDGE_SMALL_FILES_IN_FLIGHT="8")
        settings = settings_for(env)
        ops.copy(f"s3://{src}/c/", f"gs://{dst}/c/", settings)
        carried = _down_before_upload(source, destination, up)
        _verified(f"gs://{dst}/c/", settings)
        if hold:
            assert released.wait(30) and faults.counts["hold"] == len(files) - 1, faults.counts
    bucket = fake_gcs.client().bucket(dst)
    for key, body in files.items():
        assert bucket.blob(key).download_as_bytes() == body
    return carried


def test_a_batch_of_small_files_is_sent_while_the_rest_is_read(moto, fake_gcs, buckets, tmp_path):
    files = {f"c/{i:03d}.bin": os.urandom(32 * 1024 + i) for i in range(64)}
    # one batch of 2 MiB: its first uploads cross the destination's link before the source's has
    # carried half of it (read whole first, they came after all of it)
    assert _relayed(moto, fake_gcs, buckets, tmp_path, files, 256 * 1024) < sum(map(len, files.values())) // 2


def test_a_relayed_file_is_sent_when_it_arrives_not_when_a_send_of_them_has(moto, fake_gcs, buckets, tmp_path):
    """A small file and 15 of 128 KiB, the answers to the large ones held at the source until the
    small one's upload has crossed the destination's link: sent as it arrives, it crosses while
    no large file has come (the source's link has carried the listing and the small file's
    answer, 9,848 bytes in every run). Sent in groups of a send's worth (8), it waits for seven
    of the large ones, which come only when the hold gives up (20 s): over 1 MB had crossed when
    the relay was made to wait so. Without the hold, moto answers the eight requests in flight
    in any order: the small file's answer had come after up to six of the large ones (781 KB),
    and in a suite run on 2026-12-07 after seven (931 KB), which no bound on bytes can tell from
    a relay that waits for eight."""
    files = {"c/000.bin": os.urandom(4096), **{f"c/{i:03d}.bin": os.urandom(128 * 1024 + i) for i in range(1, 16)}}
    carried = _relayed(moto, fake_gcs, buckets, tmp_path, files, 4096, hold=r"^GET /[^?]*/c/0(0[1-9]|1[0-5])\.bin")
    assert carried < 128 * 1024


def test_a_file_of_a_relayed_batch_that_cannot_be_read_fails_alone(moto, fake_gcs, buckets, tmp_path):
    """One file of a later run answers 404 (gone between the listing and its read): the job fails
    naming it, every other file of the batch is sent, and a rerun sends only that file."""
    src, dst = buckets
    s3 = moto.client()
    for i in range(40):
        s3.put_object(Bucket=src, Key=f"b/{i:03d}", Body=os.urandom(4096 + i))
    missing = (404, {"Content-Type": "application/xml"},
               b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>NoSuchKey</Code>"
               b"<Message>The specified key does not exist.</Message></Error>")
    with FaultProxy(moto.endpoint) as faults:
        faults.configure(rules=[Rule(r"^GET /[^?]*/b/030", "reply", times=100, reply=missing)])
        env = _env(moto, fake_gcs, tmp_path, faults.endpoint, fake_gcs.endpoint, MCBRIDGE_SMALL_FILES_IN_FLIGHT="8")
        with pytest.raises(Exception, match="b/030"):
            ops.copy(f"s3://{src}/b/", f"gs://{dst}/b/", settings_for(env))
    bucket = fake_gcs.client().bucket(dst)
    written = {blob.name for blob in fake_gcs.client().list_blobs(dst, prefix="b/")}
    assert written == {f"b/{i:03d}" for i in range(40)} - {"b/030"}
    with LatencyProxy(_port(fake_gcs.endpoint), 0.0) as destination:
        env = _env(moto, fake_gcs, tmp_path, moto.endpoint, f"http://127.0.0.1:{destination.port}")
        settings = settings_for(env)
        ops.copy(f"s3://{src}/b/", f"gs://{dst}/b/", settings)
        # the one file's 4,126 bytes and the record, not the batch's 160 KiB again
        assert sum(size for _when, size in destination.carried["up"]) < 64 * 1024
        _verified(f"gs://{dst}/b/", settings)
    assert bucket.blob("b/030").download_as_bytes() == s3.get_object(Bucket=src, Key="b/030")["Body"].read()


def test_a_rerun_after_a_failed_commit_sends_none_of_a_relayed_batch_again(moto, fake_gcs, buckets, tmp_path):
    """Every file of the batch was sent and journaled, then the record could not be written: the
    rerun finds the whole batch journaled (nothing to read or send) and commits."""
    src, dst = buckets
    s3 = moto.client()
    for i in range(24):
        s3.put_object(Bucket=src, Key=f"j/{i:03d}", Body=os.urandom(2048 + i))
    with FaultProxy(fake_gcs.endpoint) as faults:
        faults.configure(rules=[Rule(r"name=[^&]*_bridge", "error", times=1000)])
        env = _env(moto, fake_gcs, tmp_path, moto.endpoint, faults.endpoint, MCBRIDGE_SMALL_FILES_IN_FLIGHT="8")
        settings = settings_for(env)
        with pytest.raises(Exception):
            ops.copy(f"s3://{src}/j/", f"gs://{dst}/j/", settings)
        sent_first = [line for line, _done in faults.log if "uploadType=multipart" in line and "_bridge" not in line]
        assert len(sent_first) == 24
        faults.configure()
        ops.copy(f"s3://{src}/j/", f"gs://{dst}/j/", settings)
        sent_again = [line for line, _done in faults.log if "uploadType=multipart" in line and "_bridge" not in line]
        assert sent_again == []
        _verified(f"gs://{dst}/j/", settings)
