"""The in-process journal: on disk (SQLite, WAL), every record put before a SIGKILL is there after
it, records come back in key order, and a job's records never live in the process's memory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from bridge.journal import FileJournal

WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from bridge.journal import FileJournal
    journal = FileJournal(Path(sys.argv[1]))
    i = 0
    while True:
        if i % 7 == 0:
            journal.put_many([(f"file:{i + k:08d}", {"size": i + k}) for k in range(7)])
            i += 7
        else:
            journal.put(f"file:{i:08d}", {"size": i})
            i += 1
        sys.stdout.write(f"{i}\\n")
        sys.stdout.flush()
""")


def test_every_record_put_before_a_sigkill_is_there_after_it(tmp_path):
    path = tmp_path / "journal" / "job.db"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    acknowledged = 0
    for line in proc.stdout:
        acknowledged = int(line)
        if acknowledged >= 3000:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert os.path.exists(f"{path}-wal"), "killed with its write-ahead log not yet folded in"
    journal = FileJournal(path)
    keys = [k for k, _v in journal.items("file:")]
    assert len(keys) >= acknowledged and keys == [f"file:{i:08d}" for i in range(len(keys))]
    assert journal.get(f"file:{acknowledged - 1:08d}") == {"size": acknowledged - 1}
    journal.remove()
    assert not any(path.parent.iterdir())


def test_items_stream_in_key_order_a_page_at_a_time_and_past_unicode(tmp_path):
    journal = FileJournal(tmp_path / "j.db")
    names = ["a-b", "a/b", "a.b", "a0", "é", "～", "😀", "z"]
    journal.put_many([(f"file:{n}", {"n": n}) for n in reversed(names)] + [("part:x:1", {}), ("filf", {})])
    journal.put_many([(f"file:~{i:05d}", {}) for i in range(2500)])
    rows = list(journal.items("file:"))
    expected = sorted([f"file:{n}" for n in names] + [f"file:~{i:05d}" for i in range(2500)])
    assert [k for k, _ in rows] == expected
    assert [v for _, v in rows[:3]] == [{"n": n} for n in sorted(names)[:3]]
    journal.clear()
    assert list(journal.items("")) == []
    journal.close()


def test_a_name_that_is_not_utf8_is_a_key_like_any_other(tmp_path):
    """A local file name with bytes that are not UTF-8 arrives as lone surrogates (surrogateescape):
    journaled, found and listed in str order like the rest, and kept in a long plan's file list."""
    from bridge.contracts import FilePlan
    from bridge.pipeline.plan import SPILL_FILES, FileList
    odd = b"caf\xe9.txt".decode("utf-8", "surrogateescape")
    journal = FileJournal(tmp_path / "j.db")
    names = ["a", odd, "caf\u00e9.txt", "caf\ue000", "z"]
    journal.put_many([(f"file:{n}", {"n": n}) for n in names])
    assert journal.get(f"file:{odd}") == {"n": odd}
    assert [k for k, _ in journal.items("file:")] == [f"file:{n}" for n in sorted(names)]
    journal.close()
    files = FileList([FilePlan(f"{i:06d}", 1) for i in range(SPILL_FILES)] + [FilePlan(odd, 2, 0, {"ino": "1"})],
                     where=tmp_path / "spill")
    assert len(files) == SPILL_FILES + 1 and files.find(odd) == FilePlan(odd, 2, 0, {"ino": "1"})
    assert list(files)[-1].rel == odd and [f.rel for f in files.shapes()][-1] == odd
    assert not any((tmp_path / "spill").iterdir()), "a spilled list keeps no name in its folder"
    files.close()


def test_get_many_answers_each_key_in_order_across_its_query_chunks(tmp_path):
    """One query per 500 keys (a batch of small files asks for all of its files at once): the
    answers are those of get, key by key, for missing, repeated and non-UTF-8 names too."""
    journal = FileJournal(tmp_path / "j.db")
    journal.put_many([(f"file:{i:05d}", {"size": i}) for i in range(1200)] + [("file:caf\udce9", {"size": -1})])
    keys = [f"file:{i:05d}" for i in range(1300, -1, -3)] + ["file:caf\udce9", "file:00003", "file:00003", "file:x"]
    got = journal.get_many(keys)
    assert got == [journal.get(k) for k in keys]
    assert got[-4:] == [{"size": -1}, {"size": 3}, {"size": 3}, None]
    assert sum(g is not None for g in got) == 400 + 3
    assert journal.get_many([]) == []


def test_an_encoded_value_is_stored_as_its_text_and_reads_back_as_its_value(tmp_path):
    """An adopted object's entry is encoded once, where it was judged (``Encoded``), and stored as
    that text: it reads back as the value it encodes, raw as the very text; a plain string is
    still a JSON string."""
    import json

    from bridge.journal import Encoded, encode
    journal = FileJournal(tmp_path / "j.db")
    entry = {"path": "a b/ü\"q.bin", "size": 3, "reported": {"md5": "00" * 16}}
    text = Encoded(json.dumps(entry, separators=(",", ":")))
    journal.put_many([("file:a", text), ("file:b", "plain text")])
    assert journal.get("file:a") == entry and journal.get("file:b") == "plain text"
    assert dict(journal.raw_items("file:")) == {"file:a": str(text), "file:b": '"plain text"'}
    assert encode(text) is text and encode("x") == '"x"'


def test_a_record_is_encoded_as_json_dumps_writes_it():
    """``encode`` (the C encoder made once, not at each call) writes the very text
    ``json.dumps(value, separators=(",", ":"))`` writes: nested containers, names no ASCII can
    carry, quotes and control characters, numbers of every kind, keys that are not strings; and
    refuses what JSON cannot hold, as json.dumps does."""
    import json
    import math

    import pytest

    from bridge.journal import encode
    values = [
        {"path": "a b/ü\"q\\\n\t\x01.bin", "size": 2**70, "parts": [], "computed": ["crc32c", "sha256"],
         "reported": {"md5": "00" * 16}, "identity": {}, "ratio": 0.1, "neg": -3, "big": 1e300,
         "flags": [True, False, None], "nested": {"x": [{"y": [1, 2.5, "z"]}]}, "名前": "\U0001F600"},
        {1: "int key", 2.5: "float key", True: "bool key", None: "none key"},
        [], {}, [[[]]], "a string", 7, 2.0, None, True, float("nan"), float("inf"),
    ]
    for value in values:
        assert encode(value) == json.dumps(value, separators=(",", ":"))
    with pytest.raises(TypeError):
        encode({"at": object()})
    with pytest.raises(TypeError):
        encode({("a", "tuple"): 1})
    assert math.isnan(json.loads(encode([float("nan")]))[0])


def test_an_entrys_text_is_what_json_dumps_writes_of_its_dict():
    """``FileEntry.text`` (``manifest.entry_text``: built from the fields, not through a dict and
    the encoder) is ``json.dumps(entry.to_dict(), separators=(",", ":"))`` for the entries a
    copy, a multipart upload or an adoption records, for names no ASCII carries, quotes and
    control characters, and for values of other types than the usual (a number where a str is
    usual, a nested ``carried``, a size that is not an int), which take the encoder's way."""
    import json

    from bridge.manifest import FileEntry, entry_text
    odd = "a b/ü\"q\\\n\t\x01\x7f\u2028名前\U0001F600.bin"
    entries = [
        FileEntry("d/0000001.bin", 8192, "58e26ff2", "ab" * 32),
        FileEntry(odd, 0, "", "", computed=[], note="unproven: " + odd),
        FileEntry("big.ckpt", 2**40 + 3, "00000000", "cd" * 32, part_size=8 << 20, parts=["aa" * 16, "bb" * 16],
                  part_sha256=["ef" * 32, "01" * 32], sha256_tree="23" * 32, identity={"etag": "\"x-2\"", "version_id": odd},
                  source_id={"generation": "17", odd: odd}, reported={"crc32c": "0a0b0c0d", "md5": "ff" * 16}),
        FileEntry("adopted.bin", 5, "1", "2", computed=["crc32c", "sha256"], reported={"md5": "00" * 16},
                  identity={"etag": "00" * 16, "last_modified": "2026-12-07T06:09:56Z"},
                  note="adopted: equal to its source by MD5", adopted="md5",
                  source_id={"inode": "13", "size": "5", "mtime_ns": "1", "ctime_ns": "2"}),
        FileEntry("carried.bin", 5, "1", "2", carried={"sha256": {"from": "s3://b/x/", "parts": [1, 2]}}),
        FileEntry("numbers.bin", 5, "1", "2", identity={"generation": 17, "metageneration": 1.5},
                  source_id={"size": None}),
        FileEntry("tuple.bin", 5, "1", "2", computed=("crc32c",), parts=("x",)),
        FileEntry("floatsize.bin", 5.0, "1", "2"),
        FileEntry("boolsize.bin", True, "1", "2", part_size=False),
    ]
    for entry in entries:
        assert entry.text() == json.dumps(entry.to_dict(), separators=(",", ":")), entry
        assert json.loads(entry.text()) == json.loads(json.dumps(entry.to_dict()))
    assert entry_text(*(getattr(entries[2], f) for f in entries[2].__dataclass_fields__)) == entries[2].text()


def test_entries_laid_out_as_shards_keep_their_text_order_and_sizes():
    """``manifest.blocks_of`` cuts entries (path, JSON text) into shards of at most SHARD_ENTRIES
    lines: each block's body is the texts, one a line, in order; its size the sum of theirs,
    read from each text whatever its path holds (quotes, ',"size":', names no ASCII carries);
    its SHA-256 the body's. Entries out of order, or a text that is not one line of the usual
    form, are refused."""
    import hashlib

    import pytest

    from bridge import manifest
    from bridge.errors import BridgeError
    from bridge.manifest import FileEntry, blocks_of
    odd = ['a",\\"size\\":5,"x', 'b ü,"size":9,', "c\n\t名前", "d"]
    entries = [FileEntry(path, 1000 + i, "1", "2", identity={"etag": 'e,"size":3'}) for i, path in enumerate(sorted(odd))]
    rows = [(e.path, e.text()) for e in entries]
    [block] = list(blocks_of(rows))
    assert block.paths == [e.path for e in entries] and block.size == sum(e.size for e in entries)
    assert block.body == b"".join(e.text().encode() + b"\n" for e in entries)
    assert block.sha256 == hashlib.sha256(block.body).hexdigest()
    many = [(f"f/{i:05d}", FileEntry(f"f/{i:05d}", i, "1", "2").text()) for i in range(manifest.SHARD_ENTRIES + 3)]
    blocks = list(blocks_of(many))
    assert [len(b.paths) for b in blocks] == [manifest.SHARD_ENTRIES, 3]
    assert sum(b.size for b in blocks) == sum(range(manifest.SHARD_ENTRIES + 3))
    with pytest.raises(BridgeError, match="out of order"):
        list(blocks_of([rows[1], rows[0]]))
    with pytest.raises(BridgeError, match="usual form"):
        list(blocks_of([("x", '{"path":"x","size":1,\n"crc32c":""}')]))
    with pytest.raises(BridgeError, match="usual form"):
        list(blocks_of([("x", '{"size":1,"path":"x"}')]))
