"""Packing against the emulators: shards streamed to S3, GCS and Azure (in parts when big), read
back one file at a time by a single ranged request, unpacked, and packed remote to remote."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re

import pytest

from bridge.manifest import read as read_manifest
from bridge.packing import index as indexes
from bridge.packing import job
from bridge.packing.reading import cat
from bridge.packing.unpack import unpack
from bridge.stores import get_store
from bridge.stores.base import MiB
from bridge.urls import parse
from tests.helpers import mcbridge, read_tree, settings_for
from tests.test_packing import corpus, read_back, write_tree

REMOTE = ("s3", "gs", "az")


@pytest.fixture(scope="module")
def small_tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("stores") / "src"
    files = corpus(samples=150, seed=11)
    write_tree(root, files)
    return root, files


def counted_reads(monkeypatch, store):
    reads = []
    original = type(store).read

    def counting(self, loc, offset=0, length=None):
        reads.append((loc.key.rsplit("/", 1)[-1], offset, length))
        return original(self, loc, offset, length)

    monkeypatch.setattr(type(store), "read", counting)
    return reads


@pytest.mark.parametrize("scheme", REMOTE)
def test_pack_to_a_store_then_cat_and_unpack(scheme, small_tree, make_root, env_for, tmp_path, monkeypatch):
    src, files = small_tree
    settings = settings_for(env_for(scheme))
    root = make_root(scheme) + "set/"
    for fmt in ("tar", "parquet"):
        prefix = f"{fmt}-set"
        summary = job.pack(f"{src}/", root, settings, fmt=fmt, prefix=prefix, shard_size=96 * 1024,
                           state_dir=tmp_path / "state")
        assert summary["shards"] > 2 and summary["files"] == len(files)
    store = get_store(parse(root), settings)
    manifest = read_manifest(store, parse(root))
    assert set(manifest.extra["shard_sets"]) == {"tar-set", "parquet-set"}   # two sets merge in one manifest
    for pointer in manifest.extra["shard_sets"].values():
        assert list(indexes.check(store, parse(root), pointer, deep=True)) == []

    reads = counted_reads(monkeypatch, store)
    path = "part1/sample00101.jpg"
    for prefix in ("tar-set", "parquet-set"):
        reads.clear()
        data, where = cat(root, path, settings, prefix=prefix)
        assert data == files[path]
        shard = where["shard"].rsplit("/", 1)[-1]
        assert [r for r in reads if r[0] == shard] == [(shard, where["offset"], len(data))]

    for prefix in ("tar-set", "parquet-set"):
        out = tmp_path / prefix
        unpack(root, f"{out}/", settings, prefix=prefix)
        assert read_back(out) == files


@pytest.mark.parametrize("scheme", REMOTE)
def test_big_shards_stream_to_the_store_in_parts(scheme, make_root, env_for, tmp_path):
    settings = settings_for(env_for(scheme), chunk_size=5 * MiB)
    rng = random.Random(3)
    files = {"weights/a.bin": rng.randbytes(7 * MiB + 5), **{f"tok/{i:03d}.txt": rng.randbytes(2000)
                                                             for i in range(50)}}
    write_tree(tmp_path / "src", files)
    root = make_root(scheme)
    job.pack(f"{tmp_path / 'src'}/", root, settings, shard_size=64 * MiB, state_dir=tmp_path / "state")
    store = get_store(parse(root), settings)
    entry = read_manifest(store, parse(root)).files["shard-000000.tar"]
    assert entry.part_size == 5 * MiB and len(entry.parts) == 2
    body = store.read(parse(root + "shard-000000.tar"))
    assert hashlib.sha256(body).hexdigest() == entry.sha256 and len(body) == entry.size
    unpack(root, f"{tmp_path / 'out'}/", settings)
    assert read_back(tmp_path / "out") == files


def test_remote_to_remote_pack_and_unpack(small_tree, make_root, env_for, tmp_path):
    """Source on S3 (reads run ahead on a pool), Parquet shards on Azure, unpacked onto GCS."""
    _src, files = small_tree
    env = env_for("s3", "gs", "az")
    settings = settings_for(env)
    source = make_root("s3") + "corpus/"
    s3 = get_store(parse(source), settings)
    subset = dict(list(sorted(files.items()))[:120])
    for rel, data in subset.items():
        s3.put(parse(source).join(rel), data, crc32c="00000000", metadata={})
    shards = make_root("az")
    summary = job.pack(source, shards, settings, fmt="parquet", shard_size=64 * 1024, state_dir=tmp_path)
    assert summary["files"] == len(subset)
    target = make_root("gs") + "restored/"
    result = unpack(shards, target, settings)
    assert result["verified"]
    assert read_tree(target, settings) == subset


def test_cli_migrate_to_s3_then_cat_sends_one_get_for_the_shard(small_tree, make_root, env_for, moto, tmp_path):
    src, files = small_tree
    env = env_for("s3")
    root = make_root("s3")
    r = mcbridge("migrate", str(src), root, "--pack", "tar", "--shard-size", "128KiB", "--json", env=env,
                 state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["files"] == len(files) and summary["bytes_done"] == summary["bytes_total"] > 0
    assert summary["units_done"] == summary["units_total"] == summary["shards"] + 2
    assert summary["manifest"].startswith(root + "_bridge/log/c-") and summary["manifest"].endswith(".json")

    path = "part3/sample00047.cls"
    doc = json.loads(get_store(parse(root), settings_for(env)).read(parse(root + "shard.index.json")))
    shard_set = indexes.ShardSet(parse(root), "shard.index.json", doc)
    shard = shard_set.shard_for(path)["name"]
    log = moto.log_path
    before = log.stat().st_size
    r = mcbridge("cat", root, path, env=env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    with open(log, "rb") as f:
        f.seek(before)
        lines = re.sub(r"\x1b\[[0-9;]*m", "", f.read().decode(errors="replace")).splitlines()  # no colours
    bucket = root.removeprefix("s3://").rstrip("/")
    shard_requests = [line for line in lines if f"/{bucket}/{shard} " in line]
    assert len(shard_requests) == 1 and '"GET ' in shard_requests[0] and '" 206 ' in shard_requests[0], lines
    assert len([line for line in lines if f"/{bucket}/" in line]) == 3   # index, list, shard
    assert r.stdout.encode() == files[path]
    out = tmp_path / "one.jpg"
    r = mcbridge("cat", root, "part3/sample00047.jpg", "-o", str(out), env=env, state_dir=tmp_path)
    assert r.returncode == 0 and out.read_bytes() == files["part3/sample00047.jpg"]


def test_cli_migrate_without_pack_copies_loose_files(small_tree, make_root, env_for, tmp_path):
    src, files = small_tree
    env = env_for("gs")
    root = make_root("gs")
    r = mcbridge("migrate", str(src), root, env=env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    assert read_tree(root, settings_for(env)) == files
    assert "/_bridge/log/c-" in r.stdout.split("manifest ")[-1].strip()
