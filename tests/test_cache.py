"""The node-local cache (bridge/cache/): single-flight fills across processes, identity-keyed
entries, the quota under churn, a killed filler, verify, striping, fsspec and the CLI.

The "8 processes, one object" test uses 24 MiB here (moto holds it in memory; the suite stays
quick); bench/bench_cache.py runs the same with the issue's 200 MB.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bridge.cache import Cache, CacheFull
from bridge.cache import striping
from bridge.config import load_settings
from bridge.hashing import crc32c, crc_hex
from bridge.stores import get_store
from bridge.urls import parse
from bridge.stores.base import MiB
from tests.emulators import unique_name
from tests.faultproxy import FaultProxy
from tests.helpers import MCBRIDGE, NO_CONFIG, mcbridge


def cache_env(base: dict[str, str], cache_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k != "MCBRIDGE_CONFIG"}
    env.update(MCBRIDGE_CACHE_DIR=str(cache_dir), XDG_CONFIG_HOME=NO_CONFIG, AWS_EC2_METADATA_DISABLED="true",
               **extra)
    return env


def settings_of(env: dict[str, str], **cache) -> object:
    return load_settings({"cache": cache} if cache else None, environ=env)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def proxy(moto):
    with FaultProxy(moto.endpoint) as p:
        yield p


def put_s3(moto, data: bytes, key: str = "obj.bin") -> str:
    """One PUT through bridge's S3 store, which sends the CRC32C that S3 keeps as the object's."""
    bucket = unique_name("cache")
    moto.create_bucket(bucket)
    url = f"s3://{bucket}/{key}"
    settings = load_settings(environ={**moto.env(), "XDG_CONFIG_HOME": NO_CONFIG})
    get_store(parse(url), settings).put(parse(url), data, crc32c=crc_hex(crc32c(data)), metadata={})
    return url


def test_eight_processes_one_download(moto, proxy, tmp_path):
    data = os.urandom(24 * MiB + 17)
    url = put_s3(moto, data)
    env = cache_env(moto.env(), tmp_path / "cache", AWS_ENDPOINT_URL=proxy.endpoint, MCBRIDGE_STATE_DIR=str(tmp_path))
    procs = [subprocess.Popen([*MCBRIDGE, "cache", "path", url], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(8)]
    results = [p.communicate(timeout=240) + (p.returncode,) for p in procs]
    assert all(code == 0 for _out, _err, code in results), [e for _o, e, _c in results]
    paths = {out.strip().splitlines()[-1] for out, _err, _code in results}
    assert len(paths) == 1
    assert sha(Path(paths.pop()).read_bytes()) == sha(data)
    key_path = "/" + url[len("s3://"):]
    assert proxy.sent[f"GET {key_path}"] == len(data)          # the object's bytes crossed once
    assert proxy.counts["requests"] >= 8                        # every process asked the store (HEAD)
    stats = json.loads((tmp_path / "cache" / "stats.json").read_text())
    assert (stats["misses"], stats["hits"]) == (1, 7)


def test_changed_object_is_a_new_entry(moto, tmp_path):
    url = put_s3(moto, b"a" * 1000)
    cache = Cache(settings_of(cache_env(moto.env(), tmp_path / "c")))
    first = cache.fetch(url)
    bucket, key = url[5:].split("/", 1)
    moto.client().put_object(Bucket=bucket, Key=key, Body=b"b" * 1000)   # same size, new ETag
    second = cache.fetch(url)
    assert second != first and second.read_bytes() == b"b" * 1000
    local = tmp_path / "src.bin"
    local.write_bytes(b"x" * 10)
    one = cache.fetch(str(local))
    local.write_bytes(b"y" * 10)
    assert cache.fetch(str(local)).read_bytes() == b"y" * 10 and one.read_bytes() == b"x" * 10


def test_churn_stays_under_quota_and_keeps_pins(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(24):
        (src / f"f{i:02d}").write_bytes(bytes([i]) * MiB)
    env = cache_env(dict(os.environ), tmp_path / "cache", MCBRIDGE_CACHE_QUOTA="8MiB",
                    MCBRIDGE_STATE_DIR=str(tmp_path))
    cache = Cache(settings_of(env))
    cache.pin(str(src / "f00"))
    cache.pin(str(src / "f01"), ttl=3600)
    script = ("import sys; from bridge.cache import fetch\n"
              "for name in sys.argv[1:]: fetch(name)\n")
    procs = [subprocess.Popen([sys.executable, "-c", script, *[str(src / f"f{i:02d}") for i in range(k, 24, 3)]],
                              env=env, stderr=subprocess.PIPE, text=True) for k in range(3)]
    peak = 0
    while any(p.poll() is None for p in procs):
        peak = max(peak, cache.usage())
        time.sleep(0.02)
    assert [p.wait() for p in procs] == [0, 0, 0], [p.stderr.read() for p in procs]
    stat = cache.stat()
    assert max(peak, stat["bytes"]) <= 8 * MiB
    held = {Path(e.url).name for e in cache.entries()}
    assert {"f00", "f01"} <= held
    assert stat["evictions"] >= 24 - 8
    # Pinned entries fill the whole quota: an object that cannot fit is refused, nothing evicted.
    tight = Cache(settings_of(env, quota="2MiB"))
    (src / "new").write_bytes(b"n" * 1000)
    with pytest.raises(CacheFull, match="cache full"):
        tight.fetch(str(src / "new"))
    assert {"f00", "f01"} <= {Path(e.url).name for e in tight.entries()}


def test_killed_filler_leaves_nothing_torn(moto, proxy, tmp_path):
    data = os.urandom(32 * MiB)
    url = put_s3(moto, data)
    cache_dir = tmp_path / "cache"
    env = cache_env(moto.env(), cache_dir, AWS_ENDPOINT_URL=proxy.endpoint, MCBRIDGE_STATE_DIR=str(tmp_path),
                    MCBRIDGE_CHUNK_SIZE="4MiB")
    slow = {**env, "MCBRIDGE_BWLIMIT": "6MiB"}
    filler = subprocess.Popen([*MCBRIDGE, "cache", "path", url], env=slow, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        parts = list((cache_dir / "fills").glob("*/*.parts"))
        if parts and parts[0].read_text().count("\n") >= 2:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the filler never got two parts in")
    os.killpg(filler.pid, signal.SIGKILL)
    filler.wait()
    cache = Cache(settings_of(env))
    assert cache.entries() == []                             # nothing published, nothing torn
    assert not any((cache_dir / "objects").rglob("*"))
    # The next reader goes through a proxy of its own, which counts exactly what it reads (the
    # first proxy may still be reading answers for the dead filler).
    with FaultProxy(moto.endpoint) as second:
        r = mcbridge("cache", "path", url, env={**env, "AWS_ENDPOINT_URL": second.endpoint}, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sha(Path(r.stdout.strip().splitlines()[-1]).read_bytes()) == sha(data)
    resumed = second.sent[f"GET /{url[5:]}"]
    assert 0 < resumed < len(data)                           # the next reader took over the parts done
    assert list((cache_dir / "fills").iterdir()) == []


def test_verify_names_and_removes_a_flipped_byte(tmp_path):
    src = tmp_path / "weights.bin"
    data = os.urandom(3 * MiB)
    src.write_bytes(data)
    env = cache_env(dict(os.environ), tmp_path / "cache")
    path = Path(mcbridge("cache", "path", str(src), env=env, state_dir=tmp_path).stdout.strip().splitlines()[-1])
    with open(path, "r+b") as f:
        f.seek(1_000_000)
        byte = f.read(1)
        f.seek(1_000_000)
        f.write(bytes([byte[0] ^ 0x01]))
    r = mcbridge("cache", "verify", env=env, state_dir=tmp_path)
    assert r.returncode == 1 and f"corrupted {src}" in r.stdout and not path.exists()
    again = mcbridge("cache", "path", str(src), env=env, state_dir=tmp_path)
    assert Path(again.stdout.strip().splitlines()[-1]).read_bytes() == data
    assert mcbridge("cache", "verify", env=env, state_dir=tmp_path).returncode == 0


def test_lfs_setstripe_by_size_class(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    record = tmp_path / "lfs.log"
    lfs = bindir / "lfs"
    lfs.write_text(f"#!/bin/sh\necho \"$@\" >> {record}\n")
    lfs.chmod(0o755)
    config = tmp_path / "config.yaml"
    config.write_text("profiles:\n  default:\n    cache:\n      striping: 'on'\n"
                      "      stripe_counts: {'0': 1, 2MiB: 3, 8MiB: 7}\n")
    env = cache_env(dict(os.environ), tmp_path / "cache", MCBRIDGE_CONFIG=str(config), MCBRIDGE_STATE_DIR=str(tmp_path),
                    PATH=f"{bindir}:{os.environ['PATH']}")
    env["MCBRIDGE_CONFIG"] = str(config)
    sizes = {"small": MiB, "mid": 3 * MiB, "big": 9 * MiB}
    for name, size in sizes.items():
        (tmp_path / name).write_bytes(b"z" * size)
        r = subprocess.run([*MCBRIDGE, "cache", "path", str(tmp_path / name)], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    calls = [line.split() for line in record.read_text().splitlines()]
    assert [c[:3] for c in calls] == [["setstripe", "-c", "1"], ["setstripe", "-c", "3"], ["setstripe", "-c", "7"]]
    assert all(c[3].startswith(str(tmp_path / "cache" / "fills")) for c in calls)
    # off, or on with no lfs on PATH: nothing is called and the fill works
    plain = {**env, "PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin", "MCBRIDGE_CACHE_STRIPING": "on"}
    (tmp_path / "other").write_bytes(b"q" * 10)
    assert subprocess.run([*MCBRIDGE, "cache", "path", str(tmp_path / "other")], env=plain).returncode == 0
    assert len(record.read_text().splitlines()) == 3


def test_lustre_is_detected_from_mounts(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("rootfs / ext4 rw 0 0\n10.0.0.1@tcp:/scratch /lustre/scratch lustre rw,flock 0 0\n")
    assert striping.filesystem_type("/lustre/scratch/cache/x", str(mounts)) == "lustre"
    assert striping.filesystem_type("/lustre/scratchy", str(mounts)) == "ext4"
    assert striping.count_for(5 * MiB, {"0": 1, "4MiB": 2, "1GiB": 8}) == 2


def test_fsspec_reads_through_the_cache(moto, tmp_path):
    import fsspec
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pa.table({"x": list(range(1000))})
    local = tmp_path / "t.parquet"
    pq.write_table(table, local)
    url = put_s3(moto, local.read_bytes(), "t.parquet")
    settings = settings_of(cache_env(moto.env(), tmp_path / "cache"))
    fs = fsspec.filesystem("bridgecache", settings=settings)
    with fs.open(url) as f:
        assert pq.read_table(f).equals(table)
    cache = Cache(settings)
    assert cache.stat()["misses"] == 1
    env = cache_env(moto.env(), tmp_path / "cache")
    code = ("import fsspec, bridge.cache, sys\n"
            f"print(fsspec.open('bridgecache::{url}').open().read() == open('{local}', 'rb').read())\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.stdout.strip() == "True", r.stderr
    assert cache.stat()["hits"] == 1


def test_prefetch_is_in_order_with_bounded_lookahead(tmp_path):
    names = []
    for i in range(12):
        (tmp_path / f"s{i:02d}").write_bytes(bytes([i]) * 1000)
        names.append(str(tmp_path / f"s{i:02d}"))
    pulled = []

    def source():
        for name in names:
            pulled.append(name)
            yield name

    cache = Cache(settings_of(cache_env(dict(os.environ), tmp_path / "cache")))
    seen = []
    for url, path in cache.prefetch(source(), lookahead=3):
        assert len(pulled) <= len(seen) + 1 + 3
        seen.append(url)
        assert path.read_bytes() == bytes([len(seen) - 1]) * 1000
    assert seen == names


def test_warm_a_shard_set_and_a_prefix(moto, tmp_path):
    src = tmp_path / "corpus"
    for i in range(40):
        (src / f"d{i % 4}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 4}" / f"{i:03d}.txt").write_bytes(os.urandom(2000 + i))
    bucket = unique_name("packed")
    moto.create_bucket(bucket)
    env = cache_env(moto.env(), tmp_path / "cache", MCBRIDGE_STATE_DIR=str(tmp_path))
    r = mcbridge("pack", f"{src}/", f"s3://{bucket}/set/", "--shard-size", "30KB", "-q", env=env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    r = mcbridge("cache", "warm", f"s3://{bucket}/set/shard.index.json", "--json", env=env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    index = json.loads(moto.client().get_object(Bucket=bucket, Key="set/shard.index.json")["Body"].read())
    assert summary["objects"] == len(index["shards"]) > 1 and summary["misses"] == summary["objects"]
    r = mcbridge("cache", "warm", f"s3://{bucket}/set/", "--json", env=env, state_dir=tmp_path)
    again = json.loads(r.stdout)
    assert again["hits"] == summary["objects"] and again["misses"] == again["objects"] - summary["objects"]
    listed = mcbridge("cache", "ls", "--json", env=env, state_dir=tmp_path)
    assert len(json.loads(listed.stdout)) == again["objects"]
    # WebDataset reads the shards through the cache: every file once, all from cached copies
    import webdataset as wds
    from webdataset.gopen import gopen_schemes
    from bridge.cache import gopen_handler
    settings = settings_of(env)
    gopen_schemes["bridgecache"] = gopen_handler(settings)
    try:
        urls = [f"bridgecache://s3://{bucket}/set/{s['name']}" for s in index["shards"]]
        samples = list(wds.WebDataset(urls, shardshuffle=False))
    finally:
        del gopen_schemes["bridgecache"]
    assert len(samples) == 40 and {s["__key__"].rsplit("/", 1)[-1] for s in samples} == {f"{i:03d}" for i in range(40)}
    assert Cache(settings).stat()["misses"] == again["objects"]


def test_pin_unpin_evict_cli(tmp_path):
    env = cache_env(dict(os.environ), tmp_path / "cache")
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"a" * 100)
    b.write_bytes(b"b" * 100)
    assert mcbridge("cache", "pin", str(a), "--ttl", "1h", env=env, state_dir=tmp_path).returncode == 0
    assert mcbridge("cache", "path", str(b), env=env, state_dir=tmp_path).returncode == 0
    r = mcbridge("cache", "evict", env=env, state_dir=tmp_path)
    assert r.returncode == 2 and "--all" in r.stderr and r.stdout == "", "no target: nothing evicted"
    r = mcbridge("cache", "evict", "--all", env=env, state_dir=tmp_path)
    assert f"evicted {b}" in r.stdout and str(a) not in r.stdout
    assert mcbridge("cache", "unpin", str(a), env=env, state_dir=tmp_path).returncode == 0
    r = mcbridge("cache", "evict", str(a), env=env, state_dir=tmp_path)
    assert f"evicted {a}" in r.stdout
    stat = json.loads(mcbridge("cache", "stat", "--json", env=env, state_dir=tmp_path).stdout)
    assert (stat["entries"], stat["evictions"], stat["misses"]) == (0, 2, 2)


@pytest.mark.parametrize("args, extra, code, text", [
    (["cache", "path", "ftp://host/x"], {}, 2, "unknown scheme 'ftp'"),
    (["cache", "path", "/nonexistent/obj"], {}, 1, "no such file"),
    (["cache", "stat"], {"MCBRIDGE_CACHE_QUOTA": "lots"}, 2, "invalid size 'lots'"),
    (["cache", "pin", "/etc/hostname", "--ttl", "soon"], {}, 2, "invalid TTL"),
])
def test_bad_input_is_one_line(tmp_path, args, extra, code, text):
    r = mcbridge(*args, env=cache_env(dict(os.environ), tmp_path / "cache", **extra), state_dir=tmp_path)
    assert r.returncode == code and text in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_fsspec_ranges_and_whole_urls(tmp_path):
    import fsspec
    src = tmp_path / "blob.bin"
    src.write_bytes(bytes(range(256)) * 4)
    settings = settings_of(cache_env(dict(os.environ), tmp_path / "cache"))
    fs = fsspec.filesystem("bridgecache", settings=settings)
    url = f"bridgecache://{src}"
    assert fs.cat_file(url, 10, 20) == bytes(range(10, 20))
    assert fs.cat_file(url, -4) == bytes(range(252, 256))
    assert fs.info(url)["size"] == 1024
    with pytest.raises(FileNotFoundError):
        fs.info(f"bridgecache://{tmp_path}/missing")


def test_dead_fills_are_kept_to_resume_then_swept(tmp_path):
    cache = Cache(settings_of(cache_env(dict(os.environ), tmp_path / "cache")))
    old, recent = cache.fill_dir("a" * 64), cache.fill_dir("b" * 64)
    for work in (old, recent):
        work.mkdir()
        (work / "reserve").write_text("1000")
        (work / "data.x.partial").write_bytes(b"p" * 1000)
    for path in (old, *old.iterdir()):
        os.utime(path, (time.time() - 7200, time.time() - 7200))
    (tmp_path / "x").write_bytes(b"x")
    cache.fetch(str(tmp_path / "x"))
    assert not old.exists() and recent.exists()        # a recent one waits for its object's next reader
    cache.evict()
    assert not recent.exists()


def test_an_object_rewritten_during_its_fill_is_not_kept(tmp_path):
    import threading
    src = tmp_path / "moving.bin"
    src.write_bytes(b"1" * (6 * MiB))
    env = cache_env(dict(os.environ), tmp_path / "cache")
    settings = load_settings({"transfer": {"bwlimit": "4MiB", "chunk_size": "1MiB"}}, environ=env)
    cache = Cache(settings)
    errors = []
    filler = threading.Thread(target=lambda: errors.append(pytest.raises(Exception, cache.fetch, str(src))))
    filler.start()
    deadline = time.monotonic() + 60     # rewritten once the fill has the first of its six parts
    while not any(p.read_text().count("\n") for p in (tmp_path / "cache" / "fills").glob("*/*.parts")):
        assert time.monotonic() < deadline and filler.is_alive(), "the fill never got its first part in"
        time.sleep(0.01)
    with open(src, "r+b") as f:          # rewritten in place, same size: only its identity tells
        f.write(b"2" * MiB)
    filler.join(60)
    assert "rewritten while it was being cached" in str(errors[0].value)
    assert cache.entries() == [] and list((tmp_path / "cache" / "fills").iterdir()) == []
    assert cache.fetch(str(src)).read_bytes() == b"2" * MiB + b"1" * (5 * MiB)


@pytest.mark.parametrize("scheme", ["gs", "az"])
def test_fill_from_gcs_and_azure_checks_the_stores_crc32c(scheme, make_root, env_for, tmp_path):
    env = cache_env(env_for(scheme), tmp_path / "cache")
    settings = settings_of(env)
    url = make_root(scheme) + "ckpt.bin"
    data = os.urandom(9 * MiB + 5)
    get_store(parse(url), settings).put(parse(url), data, crc32c=crc_hex(crc32c(data)),
                                        metadata={"bridge_crc32c": crc_hex(crc32c(data))})
    cache = Cache(settings)
    assert sha(cache.fetch(url).read_bytes()) == sha(data)
    [entry] = cache.entries()
    assert entry.meta["store_crc32c"] == entry.meta["crc32c"] == crc_hex(crc32c(data))


def test_a_pin_ends_with_its_ttl(tmp_path):
    src = tmp_path / "p.bin"
    src.write_bytes(b"p" * 100)
    cache = Cache(settings_of(cache_env(dict(os.environ), tmp_path / "cache")))
    cache.pin(str(src), ttl=3600)
    assert cache.evict() == [] and len(cache.pins()) == 1
    cache.pin(str(src), ttl=0.3)         # pinned again: the new TTL replaces the old one
    deadline = time.monotonic() + 30
    while cache.pins():
        assert time.monotonic() < deadline, "the pin outlived its TTL"
        time.sleep(0.05)
    assert cache.evict() == [str(src)]


def test_a_filesystem_without_flock_is_named(tmp_path, monkeypatch):
    """Lustre mounted without -o flock answers flock with ENOSYS (no Lustre here: the answer is
    put in its place)."""
    import errno
    from bridge.cache import locks

    def no_flock(fd, op):
        raise OSError(errno.ENOSYS, "Function not implemented")

    src = tmp_path / "s.bin"
    src.write_bytes(b"s")
    cache = Cache(settings_of(cache_env(dict(os.environ), tmp_path / "cache")))
    monkeypatch.setattr(locks.fcntl, "flock", no_flock)
    with pytest.raises(locks.LockUnsupported, match="mount Lustre with -o flock"):
        cache.fetch(str(src))
