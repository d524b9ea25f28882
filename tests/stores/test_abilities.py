"""Every ability a store declares runs here, against that store over real HTTP.

A store's abilities (``Features``) are derived from the methods its class implements
(bridge/stores/base.py, ABILITIES); each has a runner below that calls those methods and checks
what they did. A store that implements a method that does not work fails its runner; a runner
missing for an ability fails ``test_every_ability_has_a_runner``. Azure runs through the Put
Block From URL double (tests/doubles/azure_from_url.py), which forwards everything else to
Azurite unchanged.
"""

from __future__ import annotations

import urllib.request

import pytest

from bridge.config import load_settings
from bridge.hashing import combine_parts, crc32c, crc_hex
from bridge.stores import get_store
from bridge.stores.base import ABILITIES, MiB, Features
from bridge.stores.local import LocalStore
from bridge.urls import parse
from tests.helpers import NO_CONFIG

RUNNERS = {}


def runs(ability: str):
    def add(fn):
        RUNNERS[ability] = fn
        return fn
    return add


def _put(store, loc, data: bytes, metadata=None):
    return store.put(loc, data, crc32c=crc_hex(crc32c(data)), metadata=metadata or {})


def _pattern(n: int) -> bytes:
    return bytes((i * 7 + i // 251) % 256 for i in range(n))


@runs("multipart")
def multipart(store, root, ctx):
    size = max(store.features.min_part_size, 1024)
    parts = [_pattern(size), b"tail"]
    loc = root.join("mp/obj")
    upload = store.begin_upload(loc, size + 4)
    records = [store.upload_part(loc, upload, n, off, p, crc_hex(crc32c(p)))
               for n, (off, p) in enumerate(((0, parts[0]), (size, parts[1])), 1)]
    assert sorted(store.list_parts(loc, upload)) == [1, 2]
    whole = crc_hex(combine_parts([(crc32c(p), len(p)) for p in parts]))
    store.complete_upload(loc, upload, records, crc32c=whole, metadata={"bridge_crc32c": whole})
    assert store.read(loc) == b"".join(parts)
    other = store.begin_upload(root.join("mp/gone"), 4)
    store.upload_part(root.join("mp/gone"), other, 1, 0, b"abcd", crc_hex(crc32c(b"abcd")))
    store.abort_upload(root.join("mp/gone"), other)
    assert not store.list_parts(root.join("mp/gone"), other)


@runs("server_side_copy")
def server_side_copy(store, root, ctx):
    data = _pattern(300_000)
    src, dst = root.join("ssc/src.bin"), root.join("ssc/copy/dst.bin")
    _put(store, src, data, {"bridge_crc32c": crc_hex(crc32c(data))})
    info = store.copy_object(src, dst, size=len(data))
    assert info.size == len(data) and info.location == dst
    assert store.read(dst) == data
    if not dst.is_local:
        assert store.info(dst).metadata.get("bridge_crc32c") == crc_hex(crc32c(data))
    if "crc32c" in store.features.checksums:
        assert info.checksums["crc32c"] == crc_hex(crc32c(data))


@runs("part_copy")
def part_copy(store, root, ctx):
    size = store.features.min_part_size
    data = _pattern(2 * size + 3)
    src, dst = root.join("pc/src.bin"), root.join("pc/dst.bin")
    _put(store, src, data)
    upload = store.begin_upload(dst, len(data))
    ranges = [(1, 0, size), (2, size, size + 3)]
    records = [store.copy_part(dst, upload, n, off, src, off, length) for n, off, length in ranges]
    assert [r.size for r in records] == [size, size + 3]
    chunks = [data[off:off + length] for _, off, length in ranges]
    whole = crc_hex(combine_parts([(crc32c(c), len(c)) for c in chunks]))
    for r, c in zip(records, chunks):
        assert r.crc32c in ("", crc_hex(crc32c(c)))
    records = [type(r)(r.number, r.size, r.crc32c or crc_hex(crc32c(c)), r.token) for r, c in zip(records, chunks)]
    store.complete_upload(dst, upload, records, crc32c=whole, metadata={"bridge_crc32c": whole})
    assert store.read(dst) == data


@runs("copy_from_url")
def copy_from_url(store, root, ctx):
    s3 = get_store("s3", ctx["settings"])
    source = parse(ctx["make_root"]("s3")).join("remote.bin")
    data = _pattern(3 * MiB + 11)
    _put(s3, source, data)
    url = s3.signed_url(source)
    dst = root.join("fu/obj.bin")
    upload = store.begin_upload(dst, len(data))
    records = [store.upload_part_from_url(dst, upload, 1, 0, url, 0, 2 * MiB),
               store.upload_part_from_url(dst, upload, 2, 2 * MiB, url, 2 * MiB, len(data) - 2 * MiB)]
    assert sorted(store.list_parts(dst, upload)) == [1, 2]
    whole = crc_hex(crc32c(data))
    store.complete_upload(dst, upload, records, crc32c=whole, metadata={"bridge_crc32c": whole})
    assert store.read(dst) == data


@runs("signed_urls")
def signed_urls(store, root, ctx):
    data = _pattern(70_000)
    loc = root.join("su/a b+c.bin")
    _put(store, loc, data)
    url = store.signed_url(loc, 600)
    with urllib.request.urlopen(url, timeout=30) as answer:   # no credentials but the URL's own
        assert answer.read() == data
    ranged = urllib.request.Request(url, headers={"Range": "bytes=10-19"})
    with urllib.request.urlopen(ranged, timeout=30) as answer:
        assert answer.read() == data[10:20]


@runs("bucket_location")
def bucket_location(store, root, ctx):
    region = store.bucket_region(root)
    assert isinstance(region, str) and region, region


def test_every_ability_has_a_runner():
    assert set(RUNNERS) == set(ABILITIES)


@pytest.fixture
def able(store_root, emulator_env, azure_from_url, make_root):
    env = {**emulator_env, "XDG_CONFIG_HOME": NO_CONFIG,
           "AZURE_STORAGE_CONNECTION_STRING": azure_from_url.connection_string()}
    env.pop("MCBRIDGE_CONFIG", None)
    settings = load_settings({"azure": {"region": "westeurope"}}, environ=env)
    root = parse(store_root)
    return get_store(root, settings), root, {"settings": settings, "make_root": make_root}


def test_declared_abilities_work(able):
    store, root, ctx = able
    declared = store.features.abilities()
    assert "multipart" in declared
    for ability in declared:
        RUNNERS[ability](store, root, ctx)


def test_abilities_are_derived_from_methods_not_declared():
    class Pretender(LocalStore):
        features = Features(max_object_size=1, server_side_copy=False)

        def copy_object(self, src, dst, *, size):
            raise NotImplementedError("declared by implementing it, without working")

    assert Pretender.features.server_side_copy and not Pretender.features.signed_urls
    assert not LocalStore.features.signed_urls and LocalStore.features.server_side_copy


def test_a_store_whose_declared_ability_does_not_work_fails(tmp_path):
    class Pretender(LocalStore):
        def copy_object(self, src, dst, *, size):
            return super().put(dst, b"not the source", crc32c=crc_hex(crc32c(b"")), metadata={})

    store = Pretender(load_settings(None, environ={"XDG_CONFIG_HOME": NO_CONFIG}))
    with pytest.raises(AssertionError):
        RUNNERS["server_side_copy"](store, parse(f"{tmp_path}/"), {})


def test_store_checksums_are_applied_alike_to_every_store(able):
    """complete_upload returns what the store reports; verdicts.completed (the engine's and the
    shard writer's one check) decides, whatever the store."""
    from bridge import verdicts
    from bridge.errors import IntegrityError, ObjectNotFound
    store, root, _ctx = able
    data = _pattern(max(store.features.min_part_size, 1024))
    loc = root.join("sums/obj")
    upload = store.begin_upload(loc, len(data))
    whole = crc_hex(crc32c(data))
    record = store.upload_part(loc, upload, 1, 0, data, whole)
    reported = store.complete_upload(loc, upload, [record], crc32c=whole, metadata={"bridge_crc32c": whole})
    assert reported.size == len(data) and reported.location == loc
    if "crc32c" in store.features.checksums:
        assert reported.checksums["crc32c"] == whole
    assert verdicts.completed(store, loc, reported, whole, "require") is reported
    assert verdicts.completed(store, loc, reported, whole, "readback") is reported
    assert verdicts.completed(store, loc, reported, "00000000", "skip") is reported
    with pytest.raises(IntegrityError, match="the object was removed"):
        verdicts.completed(store, loc, reported, "00000000", "readback")
    with pytest.raises(ObjectNotFound):
        store.info(loc)
