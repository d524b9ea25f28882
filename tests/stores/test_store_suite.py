"""One suite, run against every store: local first, then each emulator over real HTTP."""

from __future__ import annotations

import pytest

from bridge.errors import BucketNotFound, ObjectNotFound
from bridge.hashing import FileHash, combine_parts, crc32c, crc_hex
from bridge.stores import get_store
from bridge.urls import parse
from tests.helpers import settings_for


@pytest.fixture
def store_env(store_root, emulator_env):
    settings = settings_for(emulator_env)
    root = parse(store_root)
    return get_store(root, settings), root


def test_put_read_info_list_delete(store_env):
    store, root = store_env
    data = b"hello bridge\n"
    h = FileHash.of(data)
    loc = root.join("dir/sub/ü.txt")
    store.put(loc, data, crc32c=h.crc32c, metadata={"bridge_crc32c": h.crc32c})
    assert store.read(loc) == data
    assert store.read(loc, 6, 6) == b"bridge"
    info = store.info(loc)
    assert info.size == len(data)
    if "crc32c" in store.features.checksums:
        assert info.checksums["crc32c"] == h.crc32c
    assert [(rel, i.size) for rel, i in store.walk(root)] == [("dir/sub/ü.txt", len(data))]
    store.delete(loc)
    with pytest.raises(ObjectNotFound):
        store.info(loc)


def test_a_range_read_through_a_buffer_comes_in_order_in_pieces(store_env):
    """read_through (the engine's parts to a local destination): the bytes asked for, handed
    over in order in pieces no longer than the buffer; a direct path receives them straight
    into the caller's buffer from the socket."""
    import os
    store, root = store_env
    data = os.urandom(300_000)
    loc = root.join("into/obj.bin")
    store.put(loc, data, crc32c=crc_hex(crc32c(data)), metadata={})
    buf = bytearray(64 * 1024)
    for offset, length in ((0, 200_000), (123_457, 100_000), (299_990, 10)):
        pieces: list[tuple[int, bytes, bool]] = []
        got = store.read_through(loc, offset, length, buf,
                                 lambda pos, view: pieces.append((pos, bytes(view), view.obj is buf)))
        assert got == length
        assert b"".join(p for _, p, _ in pieces) == data[offset:offset + length]
        assert [pos for pos, _, _ in pieces] == list(range(0, length, len(buf)))
        if getattr(store, "_direct", None) is not None or store.scheme == "file":
            assert all(in_buf for _, _, in_buf in pieces)


def test_empty_object(store_env):
    store, root = store_env
    loc = root.join("empty")
    store.put(loc, b"", crc32c=crc_hex(crc32c(b"")), metadata={})
    assert store.read(loc) == b""
    assert store.info(loc).size == 0


def test_reserved_folder_is_not_data(store_env):
    store, root = store_env
    for rel in ("x", "_bridge/manifest.json", "sub/_bridge/y"):
        store.put(root.join(rel), b"1", crc32c=crc_hex(crc32c(b"1")), metadata={})
    assert sorted(rel for rel, _ in store.walk(root)) == ["x"]


def test_multipart_upload_resume_and_complete(store_env):
    store, root = store_env
    size = store.features.min_part_size
    size = max(size, 1024)
    parts = [bytes([i]) * size for i in range(3)] + [b"tail"]
    data = b"".join(parts)
    loc = root.join("big/object.bin")
    upload = store.begin_upload(loc, len(data))
    offset, records = 0, []
    for n, part in enumerate(parts[:2], 1):
        records.append(store.upload_part(loc, upload, n, offset, part, crc_hex(crc32c(part))))
        offset += len(part)
    held = store.list_parts(loc, upload)
    assert sorted(held) == [1, 2] and all(held[n].size == size for n in held)
    with pytest.raises(ObjectNotFound):
        store.info(loc)  # nothing visible before completion
    for n, part in enumerate(parts[2:], 3):
        records.append(store.upload_part(loc, upload, n, offset, part, crc_hex(crc32c(part))))
        offset += len(part)
    whole = crc_hex(combine_parts([(crc32c(p), len(p)) for p in parts]))
    assert whole == crc_hex(crc32c(data))
    store.complete_upload(loc, upload, records, crc32c=whole, metadata={"bridge_crc32c": whole})
    assert store.read(loc) == data
    info = store.info(loc)
    assert info.size == len(data)
    if "crc32c" in store.features.checksums:
        assert info.checksums["crc32c"] == whole


def test_abort_leaves_nothing(store_env):
    store, root = store_env
    loc = root.join("aborted.bin")
    part = b"x" * max(1024, store.features.min_part_size)
    upload = store.begin_upload(loc, len(part))
    store.upload_part(loc, upload, 1, 0, part, crc_hex(crc32c(part)))
    store.abort_upload(loc, upload)
    assert list(store.walk(root)) == []
    with pytest.raises(ObjectNotFound):
        store.info(loc)


def test_missing_bucket(store_env):
    store, root = store_env
    if root.is_local:
        pytest.skip("local paths have no bucket")
    with pytest.raises(BucketNotFound):
        store.check_bucket(parse(f"{root.scheme}://no-such-bucket-xyz/k"))


# Names whose order differs between a walk of folders and a sort of whole paths ("a-b" and "a.b"
# sort before the folder "a/", "a0" after it), or between code points and UTF-16 ("～" U+FF5E
# and "😀" U+1F600), upper and lower case, a space, accents and CJK.
AWKWARD = ["a-b", "a/b", "a.b", "a0", "a/b-c/d", "a/b.x", "a/c/d/e", "ab", "A", "a b", "é", "e", "ä/ö",
           "日本/x", "～", "😀", "z/9", "z-1"]


def test_walk_yields_every_name_in_sorted_order(store_env):
    """Store.walk's contract, which sync's merge of two listings relies on: (rel, info) in
    Python's str order (code points; S3 and GCS order keys by their UTF-8 bytes, the same
    order), read lazily."""
    store, root = store_env
    for rel in reversed(AWKWARD):
        data = rel.encode()
        store.put(root.join(rel), data, crc32c=crc_hex(crc32c(data)), metadata={})
    walked = [(rel, info.size) for rel, info in store.walk(root)]
    assert walked == [(rel, len(rel.encode())) for rel in sorted(AWKWARD)]
    sub = [rel for rel, _ in store.walk(root.join("a").as_prefix())]
    assert sub == sorted(rel[2:] for rel in AWKWARD if rel.startswith("a/"))


def test_a_listing_in_utf16_order_is_put_in_code_point_order():
    import random
    from bridge.stores.base import ObjectInfo, in_code_point_order
    from bridge.urls import Location
    rng = random.Random(7)
    alphabet = ["a", "b", "/", "-", "é", "\ue000", "～", "\uffff", "😀", "\U0001f600\U0001f601", "𝄞"]
    names = sorted({"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(3000)},
                   key=lambda n: n.encode("utf-16-be"))
    assert names != sorted(names)
    out = [o.location.key for o in in_code_point_order(ObjectInfo(Location("az", "c", n), 0) for n in names)]
    assert out == sorted(names)


def test_two_sorted_listings_merge_side_by_side():
    from bridge.errors import BridgeError
    from bridge.stores.base import merged
    left = [("a", 1), ("a/b", 2), ("c", 3)]
    right = [("a-b", "x"), ("a/b", "y"), ("d", "z")]
    assert list(merged(left, right)) == [("a", 1, None), ("a-b", None, "x"), ("a/b", 2, "y"), ("c", 3, None),
                                         ("d", None, "z")]
    assert list(merged([], right)) == [(r, None, v) for r, v in right]
    with pytest.raises(BridgeError, match="not in order"):
        list(merged([("b", 1), ("a", 2)], []))
