"""Parts written into one partial file by many threads at once: every byte lands where it belongs,
the threads take turns at the file (bridge/stores/local.py, _writer_lock), and nothing is kept
once the writing is over."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

from bridge.hashing import crc32c, crc_hex
from bridge.stores import get_store
from bridge.stores import local
from bridge.urls import parse
from tests.helpers import settings_for

PIECE = 4096


def test_parts_written_by_eight_threads_in_pieces_land_in_place(tmp_path):
    store = get_store("file", settings_for({"MCBRIDGE_STATE_DIR": str(tmp_path / "state")}))
    loc = parse(str(tmp_path / "out.bin"))
    part, parts = 64 * 1024, 16
    data = os.urandom(part * parts)
    upload = store.begin_upload(loc, len(data))

    def one(n: int):
        offset = (n - 1) * part
        chunk = memoryview(data)[offset:offset + part]

        def fill(write):
            for pos in range(0, part, PIECE):
                write(pos, chunk[pos:pos + PIECE])
            return crc_hex(crc32c(chunk))

        crc = store.write_part(loc, upload, offset, fill)
        return store.record_part(loc, upload, n, offset, part, crc)

    with ThreadPoolExecutor(8) as pool:
        records = sorted(pool.map(one, range(1, parts + 1)), key=lambda r: r.number)
    store.complete_upload(loc, upload, records, crc32c="", metadata={})
    assert (tmp_path / "out.bin").read_bytes() == data
    assert not any(path.startswith(str(tmp_path)) for path in local._WRITERS.keys())


def test_a_thread_writing_a_piece_holds_off_the_others_on_that_file_only(tmp_path):
    store = get_store("file", settings_for({"MCBRIDGE_STATE_DIR": str(tmp_path / "state")}))
    one, other = parse(str(tmp_path / "one.bin")), parse(str(tmp_path / "other.bin"))
    up_one, up_other = store.begin_upload(one, 2 * PIECE), store.begin_upload(other, PIECE)
    lock = local._writer_lock(store._partial(one, up_one))
    wrote = threading.Event()

    def second_part():
        store.write_part(one, up_one, PIECE, lambda write: write(0, memoryview(b"b" * PIECE)))
        wrote.set()

    with lock:   # as a thread does while its piece goes into the file
        writer = threading.Thread(target=second_part)
        writer.start()
        assert not wrote.wait(0.3), "a second thread wrote into the file while the first held it"
        # another file is not held up
        store.write_part(other, up_other, 0, lambda write: write(0, memoryview(b"c" * PIECE)))
    writer.join(10)
    assert wrote.is_set()
    with open(store._partial(one, up_one), "rb") as f:
        assert f.read() == b"\0" * PIECE + b"b" * PIECE
    del lock
    assert store._partial(one, up_one) not in local._WRITERS
