"""Many writers under one root: eight processes commit into one prefix at once, round after round
(copies of disjoint files, a sync and a pack among them), on every store. No commit may lose
another's entries, and ``verify`` of the prefix passes after every round (bridge/manifest.py)."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from bridge import manifest as manifests
from bridge import ops
from bridge.packing import job as packing
from bridge.stores import get_store
from bridge.urls import parse
from tests.helpers import settings_for
from bridge.pipeline import verify as verifying

WRITERS = 8
ROUNDS = 20


def _job(kind: str, env: dict[str, str], src: str, dst: str, state: str, start_at: float) -> str:
    """One writer's job, started at ``start_at`` so that the round's writers commit together."""
    settings = settings_for({**env, "MCBRIDGE_STATE_DIR": state})
    time.sleep(max(0.0, start_at - time.time()))
    if kind == "copy":
        return ops.copy(src, dst, settings)["manifest"]
    if kind == "sync":
        return ops.sync(src, dst, settings)["manifest"]
    return packing.pack(src, dst, settings, prefix=kind.split(":", 1)[1], shard_size=4096)["manifest"]


@pytest.fixture(scope="module")
def writers():
    with cf.ProcessPoolExecutor(WRITERS, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(abs, range(WRITERS)))   # started (and bridge imported) before the first round
        yield pool


@pytest.mark.parametrize("scheme", ["local", "s3", "gs", "az"])
def test_eight_writers_commit_into_one_prefix_and_lose_nothing(scheme, writers, make_root, emulator_env, tmp_path,
                                                              monkeypatch):
    root = make_root(scheme) + "shared/"
    settings = settings_for(emulator_env)
    store = get_store(parse(root), settings)
    sync_src = tmp_path / "syncsrc"
    expected: set[str] = set()
    seen_commits: set[str] = set()
    for rnd in range(ROUNDS):
        jobs = []
        for w in range(WRITERS - 2):           # six copies of one new file each
            f = tmp_path / f"in/r{rnd:02d}w{w}.bin"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(os.urandom(100 + w) + f"{rnd}/{w}".encode())
            jobs.append(("copy", str(f), root + f.name))
            expected.add(f.name)
        new = sync_src / f"synced/r{rnd:02d}.txt"   # a sync that finds one new file each round
        new.parent.mkdir(parents=True, exist_ok=True)
        new.write_bytes(f"round {rnd}\n".encode())
        jobs.append(("sync", f"{sync_src}/", root))
        expected |= {f"synced/r{i:02d}.txt" for i in range(rnd + 1)}
        pack_src = tmp_path / f"pack{rnd:02d}"    # a pack of a few small files into its own shard set
        for i in range(3):
            (pack_src / f"s{i}").mkdir(parents=True, exist_ok=True)
            (pack_src / f"s{i}" / "x.txt").write_bytes(os.urandom(50))
        jobs.append((f"pack:pack{rnd:02d}", str(pack_src), root))
        start_at = time.time() + 0.5
        futures = [writers.submit(_job, kind, emulator_env, src, dst, str(tmp_path / f"state{n}"), start_at)
                   for n, (kind, src, dst) in enumerate(jobs)]
        for fut in futures:
            seen_commits.add(fut.result(timeout=300))
        record = manifests.read(store, parse(root))
        packed = {p for p in record.files if p.startswith(f"pack{rnd:02d}")}
        assert packed, f"round {rnd}: the pack's shards are not in the record"
        expected |= packed
        missing = expected - set(record.files)
        assert not missing, f"round {rnd}: entries lost: {sorted(missing)[:5]}"
        assert f"pack{rnd:02d}" in record.extra["shard_sets"], f"round {rnd}: the pack's shard set is lost"
        report = verifying.verify(root, settings)
        assert report["ok"], (rnd, report["counts"], report["missing"][:3], report["extra"][:3],
                              report["mismatched"][:3])
        assert report["checked"] == len(record.files)
    # Each writer's commit is a document of its own: 20 rounds x 8 writers, less no-op syncs
    assert len(seen_commits) >= ROUNDS * (WRITERS - 1)
    # and compaction kept the log short (COMPACT_AFTER commits on top of a checkpoint, and the
    # one generation it keeps)
    state = manifests._list_state(store, parse(root))
    assert len(state.names) <= 3 * manifests.COMPACT_AFTER + WRITERS
    assert state.checkpoints


def test_concurrent_single_file_copies_into_one_prefix_all_verify(writers, make_root, emulator_env, tmp_path):
    """The case seen to fail before the log: six `cp fN.bin s3://b/conc/` at once all exit 0,
    and `verify` then found an extra file."""
    root = make_root("s3") + "conc/"
    files = []
    for n in range(6):
        f = tmp_path / f"f{n}.bin"
        f.write_bytes(os.urandom(1000))
        files.append(f)
    start_at = time.time() + 0.5
    futures = [writers.submit(_job, "copy", emulator_env, str(f), root, str(tmp_path / f"s{n}"), start_at)
               for n, f in enumerate(files)]
    for fut in futures:
        fut.result(timeout=120)
    report = verifying.verify(root, settings_for(emulator_env))
    assert report["ok"] and report["checked"] == 6, report


def test_a_compaction_racing_commits_loses_nothing(make_root, emulator_env, monkeypatch):
    """Compactions forced on every commit while writers commit from threads: the one-generation-late
    deletion keeps every commit reachable."""
    monkeypatch.setattr(manifests, "COMPACT_AFTER", 1)
    root = parse(make_root("s3") + "race/")
    store = get_store(root, settings_for(emulator_env))

    def commit(n: int) -> None:
        entry = manifests.FileEntry(f"f{n:03d}", n, "00000000", "0" * 64)
        manifests.append(store, root, "src", str(root), [entry])

    with cf.ThreadPoolExecutor(8) as pool:
        list(pool.map(commit, range(64)))
    assert sorted(manifests.read(store, root).files) == [f"f{n:03d}" for n in range(64)]
    manifests.compact(store, root)
    manifests.compact(store, root)
    state = manifests._list_state(store, root)
    assert sum(1 for n in state.names if n.kind == "c") == 0, "two compactions in a row fold every commit"
    assert sorted(manifests.read(store, root).files) == [f"f{n:03d}" for n in range(64)]


def test_removals_and_newest_wins_across_commits_and_checkpoints(tmp_path, monkeypatch):
    from bridge.stores.local import LocalStore  # noqa: F401  (the store of file:// paths)
    root = parse(f"{tmp_path}/r/")
    store = get_store(root, settings_for({}))

    def entry(path: str, size: int) -> manifests.FileEntry:
        return manifests.FileEntry(path, size, "00000000", "0" * 64)

    manifests.append(store, root, "s", "d", [entry("a", 1), entry("b", 1), entry("c", 1)])
    manifests.compact(store, root)
    manifests.append(store, root, "s", "d", [entry("b", 2)], removed=["c"])
    manifests.append(store, root, "s", "d", [entry("c", 3)], removed=["a"])
    got = {p: e.size for p, e in manifests.read(store, root).files.items()}
    assert got == {"b": 2, "c": 3}
    manifests.compact(store, root)
    manifests.compact(store, root)
    assert {p: e.size for p, e in manifests.read(store, root).files.items()} == {"b": 2, "c": 3}
    assert not (Path(tmp_path) / "r/_bridge/manifest.json").exists()


def test_a_journal_commits_its_records_as_their_text_and_decodes_any_other(tmp_path, monkeypatch):
    """A journal's records of written files are committed as the text they are stored in
    (``RawEntry``), byte for byte what decoding and encoding them again gives, in entries inline
    and in shards; a record in any other form (keys in another order, spaces, a line break) is
    decoded, so nothing but a one-line entry reaches a shard's line."""
    import json

    from bridge.pipeline.commit import journaled_entries
    from bridge.journal import FileJournal

    def record(path: str, size: int) -> dict:
        entry = manifests.FileEntry(path, size, "AAAAAA==", "ab" * 32, identity={"etag": '"e"'}).to_dict()
        return {**entry, "source_id": {"size": str(size), "mtime_ns": "1"}}

    texts = {f"f{i:03d}": json.dumps(record(f"f{i:03d}", i), separators=(",", ":")) for i in range(30)}
    assert manifests.RawEntry.of(texts["f007"]) == manifests.RawEntry("f007", 7, texts["f007"])
    odd = {"f001": json.dumps(record("f001", 1)),                                       # spaces
           "f002": json.dumps(dict(reversed(list(record("f002", 2).items()))), separators=(",", ":")),
           "f003": json.dumps(record("f003", 3), separators=(",", ":"), indent=1)}     # line breaks
    for text in odd.values():
        assert manifests.RawEntry.of(text) is None
    assert manifests.RawEntry.of('{"path":"a\\"b","size":5,"crc32c":"x"}').path == 'a"b'
    journal = FileJournal(tmp_path / "journal.sqlite")
    journal.put_many([(f"file:{p}", json.loads(odd.get(p, t))) for p, t in texts.items()])
    monkeypatch.setattr(journal, "raw_items",   # the odd forms as stored by another writer
                        lambda prefix: ((k, odd.get(k[5:], raw)) for k, raw in FileJournal.raw_items(journal, prefix)))
    entries = list(journaled_entries(journal))
    assert [type(e).__name__ for e in entries[:5]] == ["RawEntry", "FileEntry", "FileEntry", "FileEntry", "RawEntry"]
    store = get_store(parse(f"{tmp_path}/r/"), settings_for({}))
    for shard_entries in (1000, 7):   # inline in the commit's document, then in shards of 7
        monkeypatch.setattr(manifests, "SHARD_ENTRIES", shard_entries)
        root = parse(f"{tmp_path}/r{shard_entries}/")
        manifests.append(store, root, "s", "d", iter(journaled_entries(journal)))
        expected = {p: manifests.FileEntry.from_dict(record(p, int(p[1:]))) for p in texts}
        assert manifests.read(store, root).files == expected
        plain = parse(f"{tmp_path}/plain{shard_entries}/")
        manifests.append(store, plain, "s", "d", list(expected.values()))
        assert _entry_bytes(tmp_path / f"r{shard_entries}") == _entry_bytes(tmp_path / f"plain{shard_entries}")
    journal.close()


def _entry_bytes(root: Path) -> list[bytes]:
    """The bytes of a record's entries as written: its shards in order, and the ``files`` block
    of its commit documents."""
    shards = [p.read_bytes() for p in sorted(root.rglob("*.jsonl"))]
    docs = [p.read_bytes() for p in sorted(root.rglob("*.json"))]
    return shards + [d[d.index(b'"files": ['):] for d in docs if b'"files": [' in d]


def test_a_commits_shards_are_written_at_once_and_its_document_after_every_one(moto, make_root, emulator_env,
                                                                             monkeypatch):
    """A big commit's shards go out several at once (``SHARDS_IN_FLIGHT``, each by a thread of
    its own) while the next fills, and its document, the commit, only once every shard is
    written: with the first shard held at the endpoint, the next three arrive, the fifth waits
    for a slot, and the document waits for the first; a shard that cannot be written fails
    the commit, and no document names it."""
    import threading

    from bridge.errors import BridgeError
    from bridge.manifest import FileEntry
    from tests.faultproxy import FaultProxy, Rule, proxied_environment
    monkeypatch.setattr(manifests, "SHARD_ENTRIES", 50)
    entries = [FileEntry(f"d/{i:05d}.bin", i, "00000000", "ab" * 32) for i in range(400)]   # 8 shards
    root = parse(make_root("s3") + "rec/")

    def puts(proxy) -> list[str]:
        return [line.split("?")[0] for line, _ in proxy.log if line.startswith("PUT ")]

    with FaultProxy(moto.endpoint) as proxy:
        store = get_store(root, settings_for(proxied_environment(emulator_env, {"s3": proxy}), retries=0))
        proxy.configure(rules=[Rule(r"PUT [^?]*/_bridge/seg/[^?]*/000000\.jsonl", "hold")])
        failed: list[BaseException] = []

        def commit() -> None:
            try:
                manifests.append(store, root, "src/", str(root), entries)
            except BaseException as exc:
                failed.append(exc)
        writer = threading.Thread(target=commit)
        writer.start()
        deadline = time.monotonic() + 30
        while len(puts(proxy)) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)   # time enough for a fifth shard or the document, were either not held back
        seen = puts(proxy)
        assert sorted(p[-12:] for p in seen) == [f"{i:06d}.jsonl" for i in range(4)], seen
        proxy.release()
        writer.join(60)
        assert not failed, failed
        seen = puts(proxy)
        assert sorted(p[-12:] for p in seen[:-1]) == [f"{i:06d}.jsonl" for i in range(8)]
        assert "/_bridge/log/" in seen[-1]                                      # the commit, last
        assert list(manifests.read(store, root).files.values()) == entries

        other = parse(make_root("s3") + "rec2/")
        proxy.configure(rules=[Rule(r"PUT [^?]*/_bridge/seg/[^?]*/000005\.jsonl", "error", times=10)])
        with pytest.raises(BridgeError):
            manifests.append(store, other, "src/", str(other), entries)
        assert not any("/_bridge/log/" in p for p in puts(proxy))
        assert manifests.read(store, other) is None


def test_a_compaction_that_listed_first_never_outranks_one_that_folded_a_later_commit(tmp_path, monkeypatch):
    """The race behind a lost entry among eight writers, played out in turn. Commit x takes its
    seq, then waits; commit y lands with the same seq; compaction D lists (x not there yet) and
    then reads for a while; x lands; compaction B folds x into a checkpoint, and compaction C,
    on top of B's, deletes x's document (one generation late, as it should). When D names its
    checkpoint only after reading, its clock is the latest of the three checkpoints of that seq:
    readers take it as the newest, and x, which it never saw and whose document is gone, is lost.
    Named by the clock when its listing began, D's checkpoint is the oldest of the three, and
    every entry stays."""
    import threading

    from bridge.manifest import FileEntry
    root = parse(str(tmp_path / "shared")).as_prefix()
    (tmp_path / "shared").mkdir()
    store = get_store(root, settings_for({"MCBRIDGE_STATE_DIR": str(tmp_path / "state")}))

    def entry(path: str) -> FileEntry:
        return FileEntry(path, 1, "00000000", "ab" * 32)

    manifests.append(store, root, "s", "d", [entry("a")])
    manifests._compact(store, root)                                  # k0, over the first commit
    x_held, x_go, d_held, d_go = (threading.Event() for _ in range(4))
    real_put, real_new = manifests._put_json, manifests._Name.new.__func__

    def put(store_, loc, data):
        if threading.current_thread().name == "x" and "/_bridge/log/" in str(loc):
            x_held.set()
            x_go.wait(30)
        return real_put(store_, loc, data)

    def new(cls, kind, seq, *clock):
        if threading.current_thread().name == "D" and kind == "k":
            d_held.set()
            d_go.wait(30)
        return real_new(cls, kind, seq, *clock)
    monkeypatch.setattr(manifests, "_put_json", put)
    monkeypatch.setattr(manifests._Name, "new", classmethod(new))

    x = threading.Thread(target=manifests.append, args=(store, root, "s", "d", [entry("x")]), name="x")
    x.start()
    assert x_held.wait(30)                                           # x has its seq, not yet its document
    manifests.append(store, root, "s", "d", [entry("y")])            # y: the same seq, landed
    time.sleep(0.01)
    d = threading.Thread(target=manifests._compact, args=(store, root), name="D")
    d.start()
    assert d_held.wait(30)                                           # D listed without x, and read
    time.sleep(0.01)
    x_go.set()
    x.join(30)                                                       # x lands
    time.sleep(0.01)
    manifests._compact(store, root)                                  # B folds x
    time.sleep(0.01)
    manifests._compact(store, root)                                  # C deletes x's document
    assert not [n for n in manifests._list_state(store, root).names if n.kind == "c"]
    time.sleep(0.01)
    d_go.set()
    d.join(30)                                                       # D's checkpoint written last
    checkpoints = manifests._list_state(store, root).checkpoints
    assert len({k.seq for k in checkpoints}) == 1 and len(checkpoints) == 3
    assert sorted(manifests.read(store, root).files) == ["a", "x", "y"]
