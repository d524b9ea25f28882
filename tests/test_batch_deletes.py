"""Deletions on S3 go 1,000 keys a request (DeleteObjects), on Azure 256 a Blob Batch, over real
HTTP against moto and Azurite, the requests counted at a loopback proxy in front of them
(tests/faultproxy.py): what the endpoint saw.
A sync's deletions, ``rm -r`` and the estimate agree on the count; keys XML must escape go in the
batch, a key XML cannot carry goes alone; a failed batch is sent again whole; stores without a
batch delete keep one request per object, side by side."""

from __future__ import annotations

import concurrent.futures as cf
import json

import pytest

from bridge.errors import BucketNotFound
from bridge.pipeline import syncplan
from bridge.policies.cost import usage
from bridge.stores import get_store
from bridge.stores.base import DELETES_PER_REQUEST
from bridge.urls import Location, parse
from tests.faultproxy import FaultProxy, Rule, proxied_environment
from tests.helpers import mcbridge, settings_for

EXTRA = 2500


def _keys(moto, bucket: str, prefix: str = "") -> list[str]:
    pages = moto.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def _put(moto, bucket: str, keys: list[str]) -> None:
    client = moto.client()
    with cf.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda key: client.put_object(Bucket=bucket, Key=key, Body=b"x"), keys))


def _requests(proxy, method: str, bucket: str) -> list[str]:
    return [line for line, _ in proxy.log if line.startswith(f"{method} /{bucket}")]


def test_a_syncs_deletions_go_a_thousand_a_request_and_the_estimate_counts_them(moto, make_root, emulator_env,
                                                                                tmp_path):
    assert DELETES_PER_REQUEST == usage.DELETES_PER_REQUEST == {"s3": 1000, "az": 256}   # what the stores do, as counted
    src = tmp_path / "src"
    src.mkdir()
    for name in ("a.txt", "b.txt"):
        (src / name).write_bytes(name.encode() * 10)
    dst = make_root("s3") + "mirror/"
    bucket = parse(dst).bucket
    first = mcbridge("sync", f"{src}/", dst, "-q", env=emulator_env, state_dir=tmp_path / "st")
    assert first.returncode == 0, first.stderr
    _put(moto, bucket, [f"mirror/old/{i:05d}.bin" for i in range(EXTRA)])

    with FaultProxy(moto.endpoint) as proxy:
        env = proxied_environment(emulator_env, {"s3": proxy})
        settings = settings_for(env)
        plan, _ = syncplan.plan_sync(f"{src}/", dst, settings, delete=True)
        assert len(plan.deletions) == EXTRA
        assert plan.usage(route="direct").destination.requests["DELETE"] == 3, "2,500 keys: three requests"
        assert [len(u["rels"]) for u in plan.units() if u["op"] == "deletes"] == [1000, 1000, 500]
        proxy.log.clear()

        r = mcbridge("sync", f"{src}/", dst, "--delete", "--force", "--json", env=env, state_dir=tmp_path / "st")
        assert r.returncode == 0, r.stderr
        assert len(json.loads(r.stdout)["deleted"]) == EXTRA
        posts = [line for line in _requests(proxy, "POST", bucket) if "delete" in line.split(" ")[1]]
        assert len(posts) == 3, posts
        assert not [line for line in _requests(proxy, "DELETE", bucket) if "/old/" in line], "no key deleted alone"
    left = [k for k in _keys(moto, bucket, "mirror/") if "/_bridge/" not in k]
    assert sorted(left) == ["mirror/a.txt", "mirror/b.txt"]
    v = mcbridge("verify", dst, env=emulator_env, state_dir=tmp_path / "st")
    assert v.returncode == 0, v.stdout + v.stderr


def test_rm_removes_keys_xml_must_escape_in_the_batch_and_one_it_cannot_carry_alone(moto, make_root, emulator_env,
                                                                                    tmp_path):
    root = make_root("s3")
    bucket = parse(root).bucket
    odd = ["t/a&b.txt", "t/<tag>.txt", "t/quote\"'.txt", "t/space name.txt", "t/plus+percent%20.txt",
           "t/unicode-\u00e9\u4e2d.txt", "t/tab\there.txt"]
    alone = ["t/carriage\rreturn.txt", "t/bell\x07.txt"]     # (moto stores no key with a newline)
    plain = [f"t/p/{i:04d}.bin" for i in range(1200)]
    _put(moto, bucket, odd + plain + alone + ["keep/x.txt"])
    with FaultProxy(moto.endpoint) as proxy:
        env = proxied_environment(emulator_env, {"s3": proxy})
        r = mcbridge("rm", "-r", f"{root}t/", env=env, state_dir=tmp_path / "st")
        assert r.returncode == 0, r.stderr
        posts = [line for line in _requests(proxy, "POST", bucket) if "delete" in line.split(" ")[1]]
        deletes = _requests(proxy, "DELETE", bucket)
    assert len(posts) == 2, posts               # 1,207 keys: 1,000 + 207
    assert len(deletes) == 2, deletes
    assert _keys(moto, bucket) == ["keep/x.txt"]


def test_a_batch_the_endpoint_fails_is_sent_again_whole(moto, make_root, emulator_env, tmp_path):
    root = make_root("s3")
    bucket = parse(root).bucket
    keys = [f"gone/{i:04d}" for i in range(40)]
    _put(moto, bucket, keys)
    with FaultProxy(moto.endpoint) as proxy:
        proxy.rules.append(Rule(r"^POST /[^ ]*\?delete", "error", times=1))
        store = get_store(parse(root), settings_for(proxied_environment(emulator_env, {"s3": proxy})))
        store.delete_many([parse(root).join(k) for k in keys] + [parse(root).join("never/there")])
        posts = [line for line in _requests(proxy, "POST", bucket) if "delete" in line.split(" ")[1]]
    assert len(posts) == 2, posts               # the 503, then the same request again
    assert _keys(moto, bucket, "gone/") == []


def test_the_sdk_path_deletes_in_batches_too(moto, make_root, emulator_env):
    """Where the settings leave S3 to aiobotocore (no keys this process signs with), the same
    batches go through its DeleteObjects."""
    root = make_root("s3")
    bucket = parse(root).bucket
    keys = [f"sdk/{i:04d}" for i in range(1001)]
    _put(moto, bucket, keys + ["sdk-keep"])
    store = get_store(parse(root), settings_for(emulator_env))
    store._direct = None
    store.delete_many([parse(root).join(k) for k in keys])
    assert _keys(moto, bucket) == ["sdk-keep"]


def test_stores_without_a_batch_delete_keep_a_unit_per_object(emulator_env, tmp_path):
    settings = settings_for(emulator_env)
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (dst / "old").mkdir(parents=True)
    (src / "a.txt").write_bytes(b"a")
    for i in range(5):
        (dst / "old" / f"{i}.txt").write_bytes(b"x")
    plan, _ = syncplan.plan_sync(f"{src}/", f"{dst}/", settings, delete=True)
    assert [len(u["rels"]) for u in plan.units() if u["op"] == "deletes"] == [1] * 5
    assert plan.usage(route="direct").destination.requests["DELETE"] == 5
    assert get_store(parse(f"{dst}/"), settings).delete_many([parse(f"{dst}/old/{i}.txt") for i in range(5)]) is None
    assert not list((dst / "old").iterdir())


def test_azure_deletions_go_256_a_blob_batch_and_the_estimate_counts_them(azurite, make_root, emulator_env, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_bytes(b"a" * 10)
    dst = make_root("az") + "mirror/"
    first = mcbridge("sync", f"{src}/", dst, "-q", env=emulator_env, state_dir=tmp_path / "st")
    assert first.returncode == 0, first.stderr
    store = get_store(parse(dst), settings_for(emulator_env))
    extra = 600
    with cf.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: store.put(parse(dst).join(f"old/{i:04d}.bin"), b"x", crc32c="", metadata={}),
                      range(extra)))
    with FaultProxy(azurite.endpoint) as proxy:
        env = proxied_environment(emulator_env, {"az": proxy})
        plan, _ = syncplan.plan_sync(f"{src}/", dst, settings_for(env), delete=True)
        assert len(plan.deletions) == extra
        assert plan.usage(route="direct").destination.requests["DELETE"] == 3, "600 blobs: three batches"
        proxy.log.clear()
        r = mcbridge("sync", f"{src}/", dst, "--delete", "--force", "--json", env=env, state_dir=tmp_path / "st")
        assert r.returncode == 0, r.stderr
        assert len(json.loads(r.stdout)["deleted"]) == extra
        batches = [line for line, _ in proxy.log if line.startswith("POST ") and "comp=batch" in line]
        assert len(batches) == 3, batches
        assert not [line for line, _ in proxy.log if line.startswith("DELETE ") and "/old/" in line]
    left = [info.location.key for info in store.list(parse(dst)) if "/_bridge/" not in info.location.key]
    assert left == [parse(dst).key + "a.txt"], left
    # a blob already gone, and one never there, count as deleted; a container that is not there fails
    store.delete_many([parse(dst).join("a.txt"), parse(dst).join("never/there")])
    with pytest.raises(BucketNotFound):
        store.delete_many([Location("az", "no-such-container-zz", "x")])
