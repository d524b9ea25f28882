"""The whole-file SHA-256 of parts that finish out of order on several threads, and ``digest``,
the one loop that reads bytes in bounded pieces and hashes them."""

from __future__ import annotations

import hashlib
import os
import random
import threading
import zlib

import pytest

from bridge.config import load_settings
from bridge.errors import ObjectNotFound, TransferFailed
from bridge.hashing import (FileRegion, OrderedSha256, ShortRead, crc32c, crc_hex, digest, file_reader, reader,
                            rehash)
from bridge.stores import get_store
from bridge.urls import parse


def _parts(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


def test_parts_fed_out_of_order_make_the_files_digest(tmp_path):
    """Parts arrive in a shuffled order from 4 threads, half as buffers and half as regions of
    a file already written: with room for all of them, feeding never waits for the parts ahead,
    and the digest is the file's."""
    data = os.urandom(40 * 1000 + 17)
    parts = _parts(data, 1000)
    path = tmp_path / "partial"
    path.write_bytes(data)
    hasher = OrderedSha256(max_pending=len(parts), max_ahead=len(parts))
    for n in range(1, len(parts) + 1):
        hasher.expect(n)
    order = list(range(1, len(parts) + 1))
    random.Random(7).shuffle(order)
    feeds = [(n, parts[n - 1] if n % 2 else FileRegion(str(path), (n - 1) * 1000, len(parts[n - 1])))
             for n in order]

    def run(share):
        for n, what in share:
            assert hasher.feed(n, what)

    threads = [threading.Thread(target=run, args=(feeds[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert hasher.whole(len(parts)) == hashlib.sha256(data).hexdigest()


def test_memory_waits_for_the_part_ahead_and_a_gap_gives_no_digest():
    """At most ``max_pending`` buffers wait: the next one waits until the part ahead arrives.
    A part this process does not run leaves no digest, and nobody waits for it."""
    parts = _parts(os.urandom(5000), 1000)
    hasher = OrderedSha256(max_pending=2)
    for n in range(1, 6):
        hasher.expect(n)
    assert hasher.feed(2, parts[1]) and hasher.feed(3, parts[2])
    done = threading.Event()
    late = threading.Thread(target=lambda: (hasher.feed(4, parts[3]), done.set()))
    late.start()
    assert not done.wait(0.3), "a third buffer was taken while the part ahead was missing"
    hasher.feed(1, parts[0])
    assert done.wait(30)
    hasher.feed(5, parts[4])
    assert hasher.whole(5) == hashlib.sha256(b"".join(parts)).hexdigest()

    other = OrderedSha256()
    other.expect(2)   # part 1 runs in another process
    assert not other.feed(2, parts[1])
    assert other.whole(2) is None


def test_a_written_part_too_far_ahead_of_the_hash_waits_its_turn(tmp_path):
    """A part already in the file (a FileRegion) is left at once while it is fewer than
    ``max_ahead`` parts after the next one to hash; one further ahead waits until the hash
    catches up, so that its thread starts no other download meanwhile."""
    data = os.urandom(6000)
    path = tmp_path / "partial"
    path.write_bytes(data)
    regions = [FileRegion(str(path), n * 1000, 1000) for n in range(6)]
    hasher = OrderedSha256(max_ahead=2)
    for n in range(1, 7):
        hasher.expect(n)
    assert hasher.feed(2, regions[1])            # 1 after the next (1): left at once
    done = threading.Event()
    far = threading.Thread(target=lambda: (hasher.feed(3, regions[2]), done.set()))
    far.start()
    assert not done.wait(0.3), "a part 2 after the next one to hash was taken without waiting"
    hasher.feed(1, regions[0])                    # the hash moves on to part 3: it is let in
    assert done.wait(30)
    far.join(30)
    for n in (4, 5, 6):
        hasher.feed(n, regions[n - 1])
    assert hasher.whole(6) == hashlib.sha256(data).hexdigest()

    failed = OrderedSha256(max_ahead=1)
    failed.expect(1)
    failed.expect(2)
    waiting = []
    t = threading.Thread(target=lambda: waiting.append(pytest.raises(TransferFailed, failed.feed, 2, regions[1])))
    t.start()
    failed.fail(RuntimeError("part 1 failed"))   # a failure lets the waiting thread go, with an error
    t.join(30)
    assert not t.is_alive() and waiting


def test_a_failed_part_stops_the_digest():
    hasher = OrderedSha256()
    for n in (1, 2, 3):
        hasher.expect(n)
    hasher.feed(2, b"x")
    hasher.fail(RuntimeError("part 1 failed"))
    with pytest.raises(TransferFailed):
        hasher.feed(3, b"y")
    assert hasher.whole(3) is None


# -- digest: the one read-in-pieces-and-hash loop ---------------------------------------------

def test_digest_feeds_every_algorithm_in_one_pass_of_bounded_reads(tmp_path):
    """Every algorithm asked for, over reads no larger than ``piece`` (the last one shorter),
    equals the hash of the whole bytes; a store object (the local store, ranged reads) and an
    open file give the same answers."""
    data = os.urandom(3 * 4096 + 123)
    reads: list[tuple[int, int]] = []

    def read(offset: int, length: int) -> bytes:
        reads.append((offset, length))
        return data[offset:offset + length]

    sums = digest(read, len(data), ("crc32c", "crc32", "md5", "sha256"), piece=4096)
    assert sums == {"crc32c": crc_hex(crc32c(data)), "crc32": f"{zlib.crc32(data):08x}",
                    "md5": hashlib.md5(data).hexdigest(), "sha256": hashlib.sha256(data).hexdigest()}
    assert reads == [(0, 4096), (4096, 4096), (8192, 4096), (12288, 123)]

    path = tmp_path / "object.bin"
    path.write_bytes(data)
    store, loc = get_store(parse(str(path)), load_settings({})), parse(str(path))
    assert digest(reader(store, loc), len(data), ("sha256", "crc32c")) == {k: sums[k] for k in ("sha256", "crc32c")}
    assert rehash(store, loc, len(data)) == (sums["crc32c"], sums["sha256"])
    with open(path, "rb") as f:
        assert digest(file_reader(f.fileno()), len(data), ("md5",), piece=1000) == {"md5": sums["md5"]}


def test_digest_refuses_bytes_that_end_before_their_size(tmp_path):
    """An object cut short while read (or listed with a size its bytes do not have) has no
    digest: a hash of fewer bytes would be another object's."""
    path = tmp_path / "short.bin"
    path.write_bytes(b"x" * 5000)
    store, loc = get_store(parse(str(path)), load_settings({})), parse(str(path))
    with pytest.raises(ShortRead, match=r"short\.bin: read 5000 bytes of 6000"):
        digest(reader(store, loc), 6000, ("sha256",), name=str(loc), piece=1024)
    with pytest.raises(ObjectNotFound):   # what verify and sync's repair catch
        rehash(store, loc, 6000)
    with open(path, "rb") as f, pytest.raises(ShortRead, match="read 5000 bytes of 6000"):
        digest(file_reader(f.fileno()), 6000, ("crc32c",), piece=4096)
    assert digest(reader(store, loc), 0, ("crc32c",)) == {"crc32c": "00000000"}
