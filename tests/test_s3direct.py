"""S3 reads without the event loop (bridge/stores/s3direct.py), against both S3 emulators:
moto answers a range with 206, ``rclone serve s3`` with 200 and a Content-Range."""

from __future__ import annotations

import hashlib
import os

import pytest

from bridge import ops
from bridge.errors import BucketNotFound, ObjectNotFound
from bridge.stores import get_store
from bridge.stores.s3direct import Direct
from bridge.urls import parse
from tests.emulators import RcloneS3
from tests.helpers import settings_for

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def rclone_s3():
    with RcloneS3() as server:
        server.create_bucket("direct")
        yield server


@pytest.fixture(params=["moto", "rclone"])
def s3(request, moto, rclone_s3):
    server = moto if request.param == "moto" else rclone_s3
    if request.param == "moto":
        server.create_bucket("direct")
    return server


def test_ranged_and_whole_reads_come_back_byte_exact(s3, tmp_path):
    data = os.urandom(20 * MiB + 7)
    s3.client().put_object(Bucket="direct", Key="a dir/ckpt #1.bin", Body=data)
    settings = settings_for({**s3.env(), "MCBRIDGE_STATE_DIR": str(tmp_path / "state")})
    store = get_store(parse("s3://direct/"), settings)
    assert isinstance(store._direct, Direct)
    loc = parse("s3://direct/a dir/ckpt #1.bin")
    assert bytes(store.read(loc)) == data
    assert bytes(store.read(loc, 5 * MiB, 3)) == data[5 * MiB:5 * MiB + 3]
    assert bytes(store.read(loc, 20 * MiB)) == data[20 * MiB:]
    ops.copy("s3://direct/a dir/ckpt #1.bin", f"{tmp_path}/out/", settings, chunk_size=8 * MiB)
    assert hashlib.sha256((tmp_path / "out" / "ckpt #1.bin").read_bytes()).digest() == hashlib.sha256(data).digest()


def test_missing_objects_and_buckets_are_bridge_errors(s3, tmp_path):
    store = get_store(parse("s3://direct/"), settings_for(s3.env()))
    with pytest.raises(ObjectNotFound):
        store.read(parse("s3://direct/no/such/key"))
    with pytest.raises(BucketNotFound):
        store.read(parse("s3://no-such-bucket-here/key"), 0, 10)


def test_profiles_and_the_default_endpoint_keep_the_sdk_path(moto):
    assert Direct.for_settings(settings_for({**moto.env(), "AWS_PROFILE": "other"})) is None
    env = {k: v for k, v in moto.env().items() if k != "AWS_ENDPOINT_URL"}
    assert Direct.for_settings(settings_for(env)) is None


def test_puts_carry_the_checksum_and_metadata(s3):
    store = get_store(parse("s3://direct/"), settings_for(s3.env()))
    from bridge.hashing import FileHash
    data = os.urandom(100_000)
    h = FileHash.of(data)
    store.put(parse("s3://direct/small/ü x.bin"), data, crc32c=h.crc32c,
              metadata={"bridge_crc32c": h.crc32c, "bridge_sha256": h.sha256})
    got = s3.client().get_object(Bucket="direct", Key="small/ü x.bin")
    assert got["Body"].read() == data
    # (rclone serve s3 gives metadata names back capitalised, whoever wrote them)
    assert {k.lower(): v for k, v in got["Metadata"].items()} == {"bridge_crc32c": h.crc32c,
                                                                  "bridge_sha256": h.sha256}
    with pytest.raises(BucketNotFound):
        store.put(parse("s3://no-such-bucket-here/k"), b"x", crc32c="00000000", metadata={})
