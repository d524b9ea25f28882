"""sync and a new version of a remote source object (syncplan._source_differs): the same bytes
written again (S3 keeps their ETag, the MD5) are not read at all; other bytes of the same size are
read once, to be copied, not once to be hashed and again to be copied."""

from __future__ import annotations

import os
import time

from bridge import ops
from tests.emulators import unique_name
from tests.faultproxy import FaultProxy
from tests.helpers import settings_for
from bridge.pipeline import syncplan
from bridge.pipeline import verify as verifying


def test_a_rewritten_s3_source_is_read_once_when_changed_and_not_at_all_when_the_same(moto, tmp_path):
    bucket = unique_name()
    moto.create_bucket(bucket)
    s3 = moto.client()
    data = {f"f{i:02d}.bin": os.urandom(4096 + i) for i in range(12)}
    for name, body in data.items():
        s3.put_object(Bucket=bucket, Key=f"src/{name}", Body=body)
    env = {**moto.env(), "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}
    dst = f"{tmp_path / 'mirror'}/"
    assert ops.sync(f"s3://{bucket}/src/", dst, settings_for(env))["ok"]
    time.sleep(1.1)   # a listing's time is to the second: the rewrites show a new one
    s3.put_object(Bucket=bucket, Key="src/f03.bin", Body=data["f03.bin"])        # the same bytes again
    changed = bytes(b ^ 0xFF for b in data["f07.bin"])
    s3.put_object(Bucket=bucket, Key="src/f07.bin", Body=changed)                 # other bytes, same size
    listed = {o["Key"]: o for o in s3.list_objects_v2(Bucket=bucket, Prefix="src/")["Contents"]}
    assert listed["src/f03.bin"]["ETag"] != "" and listed["src/f07.bin"]["Size"] == len(data["f07.bin"])
    with FaultProxy(moto.endpoint) as proxy:
        out = ops.sync(f"s3://{bucket}/src/", dst, settings_for({**env, "AWS_ENDPOINT_URL": proxy.endpoint}))
    assert out["ok"] and out["sent"] == ["f07.bin"], out["sent"]
    assert out["reasons"]["changed"] == 1 and out["reasons"]["unchanged"] == 11, out["reasons"]
    assert proxy.sent[f"GET /{bucket}/src/f07.bin"] == len(changed)   # read once: copied, not hashed first
    assert proxy.sent[f"GET /{bucket}/src/f03.bin"] == 0               # its ETag says it is what was copied
    assert (tmp_path / "mirror" / "f07.bin").read_bytes() == changed
    assert (tmp_path / "mirror" / "f03.bin").read_bytes() == data["f03.bin"]
    with FaultProxy(moto.endpoint) as proxy:   # and again: the rewrite of the same bytes costs no read
        again = ops.sync(f"s3://{bucket}/src/", dst, settings_for({**env, "AWS_ENDPOINT_URL": proxy.endpoint}))
    assert again["ok"] and again["sent"] == [] and again["reasons"]["unchanged"] == 12, again
    assert not [k for k in proxy.sent if k.startswith("GET ") and "/src/" in k], proxy.sent
    assert verifying.verify(dst, settings_for(env))["ok"]


def test_a_touched_local_source_of_the_same_bytes_is_hashed_not_sent(moto, tmp_path):
    """A local file whose identity changed (touched, rewritten with its bytes) is read and hashed:
    reading it is cheap, and it spares the upload."""
    bucket = unique_name()
    moto.create_bucket(bucket)
    src = tmp_path / "src"
    src.mkdir()
    for i in range(5):
        (src / f"{i}.bin").write_bytes(os.urandom(2000))
    env = {**moto.env(), "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}
    assert ops.sync(f"{src}/", f"s3://{bucket}/m/", settings_for(env))["ok"]
    (src / "2.bin").write_bytes((src / "2.bin").read_bytes())
    os.utime(src / "3.bin", (time.time() + 5, time.time() + 5))
    out = ops.sync(f"{src}/", f"s3://{bucket}/m/", settings_for(env))
    assert out["ok"] and out["sent"] == [] and out["reasons"]["unchanged"] == 5, out


def test_a_listing_and_a_head_a_second_apart_on_one_etag_name_one_version():
    """``rclone serve s3`` rounds a listing's LastModified to the second and truncates a HEAD's:
    an object written at .5 s or later was seen as changed between its plan and its copy, and an
    S3 -> S3 copy there failed "changed since the copy was planned". With the same ETag, a second
    apart is one version; two seconds, or another ETag, or no ETag to vouch, are not."""
    from bridge.stores.base import identity_changed
    listed = {"etag": "0cc175b9c0f1b6a831c399e269772661", "last_modified": "2026-12-03T19:22:20Z"}
    assert not identity_changed(listed, {**listed, "last_modified": "2026-12-03T19:22:19Z"})
    assert not identity_changed(listed, dict(listed))
    assert identity_changed(listed, {**listed, "last_modified": "2026-12-03T19:22:18Z"})
    assert identity_changed(listed, {**listed, "etag": "92eb5ffee6ae2fec3ad71c777531578f"})
    assert identity_changed({"last_modified": "2026-12-03T19:22:20Z"}, {"last_modified": "2026-12-03T19:22:19Z"})
