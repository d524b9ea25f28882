"""Packing on local paths: shards readable by webdataset, pyarrow, DuckDB and Polars; identical
when packed twice; unpack restores the tree and refuses unsafe members before writing anything."""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import sys
import tarfile
from pathlib import Path

import pytest

from bridge.errors import InvalidOption, ManifestError, TransferFailed
from bridge.manifest import read as read_manifest
from bridge.packing import index as indexes
from bridge.packing import job
from bridge.packing.layout import UnsafeMember, pack_order, sample_key
from bridge.packing.reading import cat
from bridge.packing.unpack import unpack
from bridge.stores import get_store
from bridge.urls import parse
from tests.helpers import mcbridge, settings_for
from bridge.pipeline import verify as verifying

SAMPLES = 1000   # two files each: a few thousand small files in all


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def corpus(samples: int = SAMPLES, seed: int = 5) -> dict[str, bytes]:
    """WebDataset-style samples (key.jpg + key.cls) in a few folders, plus awkward names."""
    rng = random.Random(seed)
    files = {}
    for i in range(samples):
        key = f"part{i % 4}/sample{i:05d}"
        files[f"{key}.jpg"] = rng.randbytes(rng.randint(0, 3000))
        files[f"{key}.cls"] = str(i % 10).encode()
    files["part0/sample00001.extra.json"] = b'{"a": 1}'          # a second file of one sample
    files["naïve/ünïcödé 名前.txt"] = "non-ASCII ✓\n".encode()  # pax header
    files["deep/" + "d" * 90 + "/" + "n" * 60 + ".bin"] = b"long name"
    files["empty.txt"] = b""
    return files


def read_back(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "_bridge" not in p.relative_to(root).parts}


@pytest.fixture(scope="module")
def settings(tmp_path_factory):
    # a job run without its own state_dir journals here, not in ~/.local/state/mcbridge
    return settings_for({**os.environ, "MCBRIDGE_STATE_DIR": str(tmp_path_factory.mktemp("state"))})


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> tuple[Path, dict[str, bytes]]:
    root = tmp_path_factory.mktemp("tree") / "src"
    files = corpus()
    write_tree(root, files)
    return root, files


@pytest.fixture(scope="module")
def packed(tree, settings, tmp_path_factory) -> dict[str, Path]:
    """The tree packed once as tar and once as Parquet, in several shards each."""
    src, _files = tree
    base = tmp_path_factory.mktemp("packed")
    out = {}
    for fmt, size in (("tar", 512 * 1024), ("parquet", 400 * 1024)):
        out[fmt] = base / fmt
        job.pack(f"{src}/", f"{out[fmt]}/", settings, fmt=fmt, shard_size=size,
                 options={"row_group_size": 128 * 1024}, state_dir=base / "state")
    return out


def shards_of(root: Path, ext: str) -> list[Path]:
    return sorted(root.glob(f"shard-*.{ext}"))


def test_webdataset_reads_tar_shards_sample_by_sample(tree, packed):
    import webdataset as wds
    _src, files = tree
    urls = [str(p) for p in shards_of(packed["tar"], "tar")]
    assert len(urls) > 3
    seen: dict[str, bytes] = {}
    keys = []
    for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        keys.append(sample["__key__"])
        for ext, data in sample.items():
            if not ext.startswith("__"):
                seen[f"{sample['__key__']}.{ext}"] = data
    assert len(keys) == len(set(keys)), "a sample was split across shards or members"
    expected = {rel: data for rel, data in files.items() if sample_key(rel) != rel}   # webdataset skips no-dot names
    assert seen == expected


def test_tar_members_are_fixed_regular_files_in_pack_order(tree, packed):
    _src, files = tree
    names = []
    for shard in shards_of(packed["tar"], "tar"):
        with tarfile.open(shard) as archive:
            for info in archive:
                assert info.isreg() and info.mtime == 0 and info.uid == info.gid == 0 and info.mode == 0o644
                assert info.uname == info.gname == ""
                names.append(info.name)
    assert names == sorted(files, key=pack_order)


def test_pyarrow_reads_parquet_shards_row_by_row(tree, packed):
    import pyarrow.parquet as pq
    _src, files = tree
    rows = {}
    shard_set = indexes.read(get_store(parse(str(packed["parquet"])), settings_for(dict(os.environ))),
                             parse(f"{packed['parquet']}/"), "shard.index.json")
    for shard in shards_of(packed["parquet"], "parquet"):
        pf = pq.ParquetFile(shard)
        assert pf.num_row_groups > 1   # row groups are sized too
        for group in range(pf.num_row_groups):
            for row in pf.read_row_group(group).to_pylist():
                assert row["size"] == len(row["data"])
                assert row["sha256"] == hashlib.sha256(row["data"]).hexdigest()
                rows[row["path"]] = row["data"]
    assert rows == files
    assert shard_set.doc["totals"]["files"] == len(files)


def test_duckdb_and_polars_read_parquet_shards(tree, packed):
    duckdb = pytest.importorskip("duckdb")
    pl = pytest.importorskip("polars")
    _src, files = tree
    pattern = f"{packed['parquet']}/shard-*.parquet"
    [(count, total)] = duckdb.sql(f"select count(*), sum(size) from read_parquet('{pattern}')").fetchall()
    assert (count, total) == (len(files), sum(map(len, files.values())))
    one = "naïve/ünïcödé 名前.txt"
    [(data,)] = duckdb.sql(f"select data from read_parquet('{pattern}') where path = '{one}'").fetchall()
    assert bytes(data) == files[one]
    frame = pl.read_parquet(pattern)
    assert dict(zip(frame["path"].to_list(), frame["data"].to_list(), strict=True)) == files


def test_packing_twice_gives_identical_shards_and_index(tree, packed, settings, tmp_path):
    src, _files = tree
    for fmt in ("tar", "parquet"):
        again = tmp_path / fmt
        job.pack(f"{src}/", f"{again}/", settings, fmt=fmt, shard_size=512 * 1024 if fmt == "tar" else 400 * 1024,
                 options={"row_group_size": 128 * 1024}, state_dir=tmp_path / "state")
        first = shards_of(packed[fmt], fmt)
        assert [p.name for p in shards_of(again, fmt)] == [p.name for p in first]
        for a in first:
            assert (again / a.name).read_bytes() == a.read_bytes(), a.name
        assert (again / "shard.index.json").read_bytes() == (packed[fmt] / "shard.index.json").read_bytes()


def test_index_places_every_file_for_one_ranged_read(tree, packed, settings):
    _src, files = tree
    for fmt, root in packed.items():
        store = get_store(parse(str(root)), settings)
        shard_set = indexes.read(store, parse(f"{root}/"), "shard.index.json")
        seen = 0
        for shard in shard_set.shards:
            body = (root / shard["name"]).read_bytes()
            assert len(body) == shard["size"]
            assert hashlib.sha256(body).hexdigest() == shard["sha256"]
            for entry in indexes.read_list(store, shard_set, shard):
                assert body[entry["offset"]:entry["offset"] + entry["length"]] == files[entry["path"]]
                assert entry["sha256"] == hashlib.sha256(files[entry["path"]]).hexdigest()
                if fmt == "parquet":
                    assert {"row_group", "row"} <= set(entry)
                seen += 1
        assert seen == len(files)


def test_unpack_restores_a_byte_identical_tree(tree, packed, settings, tmp_path):
    _src, files = tree
    for fmt, root in packed.items():
        target = tmp_path / fmt
        summary = unpack(f"{root}/", f"{target}/", settings)
        assert summary["verified"] and summary["files"] == len(files)
        assert read_back(target) == files
        manifest = read_manifest(get_store(parse(str(target)), settings), parse(f"{target}/"))
        assert set(manifest.files) == set(files)


def test_cat_reads_one_file_with_one_ranged_read(tree, packed, settings, monkeypatch):
    _src, files = tree
    store = get_store(parse("/"), settings)
    reads = []
    original = type(store).read

    def counting(self, loc, offset=0, length=None):
        reads.append((loc.name, offset, length))
        return original(self, loc, offset, length)

    monkeypatch.setattr(type(store), "read", counting)
    for root in packed.values():
        reads.clear()
        path = "part2/sample00502.jpg"
        data, where = cat(f"{root}/", path, settings)
        assert data == files[path]
        on_shards = [r for r in reads if r[0].startswith("shard-") and not r[0].endswith(".jsonl")]
        assert on_shards == [(Path(where["shard"]).name, where["offset"], len(data))]
        assert len(reads) == 3   # index, the shard's list, the shard


def test_cli_cat_prints_the_bytes(tree, packed, tmp_path):
    _src, files = tree
    path = "naïve/ünïcödé 名前.txt"
    r = mcbridge("cat", str(packed["tar"]), path, env=dict(os.environ), state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.encode() == files[path]
    r = mcbridge("cat", str(packed["parquet"]), "nope.txt", env=dict(os.environ), state_dir=tmp_path)
    assert r.returncode == 1 and r.stderr.startswith("mcbridge: error:") and "Traceback" not in r.stderr


def test_manifest_lists_shards_and_points_at_the_index(packed, settings):
    for fmt, root in packed.items():
        store = get_store(parse(str(root)), settings)
        manifest = read_manifest(store, parse(f"{root}/"))
        names = {p.name for p in shards_of(root, fmt)}
        assert names <= set(manifest.files)
        assert "shard.index.json" in manifest.files
        pointer = manifest.extra["shard_sets"]["shard"]
        assert pointer["index"] == "shard.index.json" and pointer["format"] == fmt
        assert pointer["sha256"] == hashlib.sha256((root / "shard.index.json").read_bytes()).hexdigest()
        assert list(indexes.check(store, parse(f"{root}/"), pointer, deep=True)) == []


def test_check_reports_a_corrupted_or_missing_shard(tree, settings, tmp_path):
    src, _files = tree
    root = tmp_path / "set"
    job.pack(f"{src}/", f"{root}/", settings, shard_size=512 * 1024, state_dir=tmp_path / "state")
    store = get_store(parse(str(root)), settings)
    pointer = read_manifest(store, parse(f"{root}/")).extra["shard_sets"]["shard"]
    shard = root / "shard-000001.tar"
    body = bytearray(shard.read_bytes())
    body[1000] ^= 0xFF
    shard.write_bytes(bytes(body))
    (root / "shard-000002.tar").unlink()
    problems = list(indexes.check(store, parse(f"{root}/"), pointer, deep=True))
    assert any("shard-000001.tar" in p and "SHA-256" in p for p in problems)
    assert any("shard-000002.tar: shard missing" in p for p in problems)
    with pytest.raises(TransferFailed, match="shard-00000[12].tar"):
        unpack(f"{root}/", f"{tmp_path / 'out'}/", settings)


# -- unpack refuses unsafe members before writing anything -----------------------------------------------

def crafted_tar(path: Path, members: list[tarfile.TarInfo]) -> None:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as archive:
        good = tarfile.TarInfo("fine/first.txt")
        good.size = 2
        archive.addfile(good, io.BytesIO(b"ok"))
        for info in members:
            archive.addfile(info, io.BytesIO(b"x" * info.size) if info.isreg() else None)


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = 1 if kind == tarfile.REGTYPE else 0
    info.linkname = link
    return info


@pytest.mark.parametrize("bad,reason", [
    (member("../evil.txt"), "climbs out"),
    (member("a/../../evil.txt"), "climbs out"),
    (member("/tmp/evil-absolute.txt"), "absolute"),
    (member("link", tarfile.SYMTYPE, "/etc/passwd"), "is a link"),
    (member("hard", tarfile.LNKTYPE, "fine/first.txt"), "is a link"),
    (member("dev", tarfile.CHRTYPE), "is a device"),
    (member("_bridge/manifest.json"), "reserved"),
], ids=["dotdot", "nested-dotdot", "absolute", "symlink", "hardlink", "device", "reserved"])
def test_unpack_refuses_a_crafted_tar_and_writes_nothing(bad, reason, settings, tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    crafted_tar(shards / "evil-000000.tar", [bad])
    target = tmp_path / "deep" / "target"
    target.mkdir(parents=True)
    before = sorted(p for p in tmp_path.rglob("*"))
    with pytest.raises(UnsafeMember, match=reason) as caught:
        unpack(f"{shards}/", f"{target}/", settings)
    assert "nothing was written" in str(caught.value)
    assert sorted(p for p in tmp_path.rglob("*")) == before
    assert not Path("/tmp/evil-absolute.txt").exists()


def test_cli_unpack_of_a_crafted_tar_is_one_line_error(tmp_path):
    crafted_tar(tmp_path / "x.tar", [member("../../evil.txt")])
    r = mcbridge("unpack", str(tmp_path / "x.tar"), str(tmp_path / "out"), env=dict(os.environ),
                 state_dir=tmp_path / "state")
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "climbs out" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path.parent / "evil.txt").exists()


def test_unpack_refuses_a_path_twice_or_both_file_and_folder_across_shards(settings, tmp_path):
    """The tree check sees every shard's members together (sorted on disk, not in a dict): a path
    in two shards, and a file that other members need as their folder, are named."""
    shards = tmp_path / "shards"
    shards.mkdir()
    crafted_tar(shards / "a-000000.tar", [member("same.txt"), member("d"), member("d-x/ok.txt")])
    crafted_tar(shards / "b-000000.tar", [member("same.txt"), member("d/under.txt"), member("d/deeper/y.txt")])
    with pytest.raises(UnsafeMember) as caught:
        unpack(f"{shards}/", f"{tmp_path / 'out'}/", settings)
    line = str(caught.value)
    assert "'same.txt' appears twice (also in a-000000.tar)" in line
    assert "'d/under.txt' needs 'd' to be a directory" in line and "'d/deeper/y.txt' needs 'd'" in line
    assert "d-x/ok.txt" not in line and "nothing was written" in line
    assert not (tmp_path / "out").exists()


def test_unpack_refuses_an_index_that_names_unsafe_paths(tree, settings, tmp_path):
    """A crafted index (lists and hashes rewritten consistently) is refused like a crafted tar."""
    src, _files = tree
    root = tmp_path / "set"
    job.pack(f"{src}/", f"{root}/", settings, shard_size=512 * 1024, state_dir=tmp_path / "state")
    doc = json.loads((root / "shard.index.json").read_text())
    listing = root / doc["shards"][0]["list"]["name"]
    lines = listing.read_text().splitlines()
    entry = json.loads(lines[0])
    entry["path"] = "../../escaped.txt"
    body = ("\n".join([json.dumps(entry)] + lines[1:]) + "\n").encode()
    listing.write_bytes(body)
    doc["shards"][0]["list"]["sha256"] = hashlib.sha256(body).hexdigest()
    (root / "shard.index.json").write_text(json.dumps(doc))
    with pytest.raises(UnsafeMember, match="climbs out"):
        unpack(f"{root}/", f"{tmp_path / 'out'}/", settings)
    assert not (tmp_path / "out").exists() and not (tmp_path / "escaped.txt").exists()


def test_unpack_refuses_to_follow_a_symlink_out_of_the_target(settings, tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    crafted_tar(shards / "s-000000.tar", [member("inside/file.txt")])
    outside = tmp_path / "outside"
    outside.mkdir()
    target = tmp_path / "target"
    target.mkdir()
    (target / "inside").symlink_to(outside)
    with pytest.raises(UnsafeMember, match="outside the target through a symlink"):
        unpack(f"{shards}/", f"{target}/", settings)
    assert list(outside.iterdir()) == []


def test_unpack_without_an_index_restores_foreign_tar_shards(settings, tmp_path):
    """Shards written by other tools (here: tarfile, with directories and ./ names) unpack too."""
    shards = tmp_path / "wds"
    shards.mkdir()
    with tarfile.open(shards / "train-000000.tar", "w") as archive:
        archive.addfile(member("./a", tarfile.DIRTYPE))
        for name, data in (("./a/x.txt", b"xx"), ("./a/y.bin", b"\x00y")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    summary = unpack(f"{shards}/", f"{tmp_path / 'out'}/", settings)
    assert not summary["verified"]
    assert read_back(tmp_path / "out") == {"a/x.txt": b"xx", "a/y.bin": b"\x00y"}


# -- planning --------------------------------------------------------------------------------------------

def test_shards_respect_size_and_count_and_never_split_a_sample(tree, settings, tmp_path):
    src, files = tree
    plan = job.plan_pack(f"{src}/", f"{tmp_path}/out/", settings, shard_size=64 * 1024, max_count=101)
    assert len(plan.shards) > 10
    assert [s.name for s in plan.shards[:2]] == ["shard-000000.tar", "shard-000001.tar"]
    keys_seen: dict[str, str] = {}
    for shard in plan.shards:
        assert len(shard.files) <= 101
        assert shard.size <= 64 * 1024 or len({sample_key(rel) for rel, _ in shard.files}) == 1
        for rel, _size in shard.files:
            assert keys_seen.setdefault(sample_key(rel), shard.name) == shard.name
    assert sum(len(s.files) for s in plan.shards) == len(files)
    assert job.PackPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


def test_plan_refuses_what_cannot_work(tree, settings, tmp_path):
    src, _files = tree
    with pytest.raises(InvalidOption, match="inside the source"):
        job.plan_pack(f"{src}/", f"{src}/shards/", settings)
    with pytest.raises(InvalidOption, match="shard prefix"):
        job.plan_pack(f"{src}/", f"{tmp_path}/o/", settings, prefix="a/b")
    with pytest.raises(InvalidOption, match="unknown shard format"):
        job.plan_pack(f"{src}/", f"{tmp_path}/o/", settings, fmt="zip")
    with pytest.raises(InvalidOption, match="max-count"):
        job.plan_pack(f"{src}/", f"{tmp_path}/o/", settings, max_count=0)
    from bridge.packing import parquetfmt
    big = tmp_path / "big"
    write_tree(big, {"ok.bin": b"1", "huge.bin": b"x" * 2048})
    original = parquetfmt.ParquetFormat.max_file_size
    try:
        parquetfmt.ParquetFormat.max_file_size = 1024
        with pytest.raises(InvalidOption, match="huge.bin"):
            job.plan_pack(f"{big}/", f"{tmp_path}/o/", settings, fmt="parquet")
    finally:
        parquetfmt.ParquetFormat.max_file_size = original


def test_cli_errors_are_one_line_with_exit_2_for_bad_options(tree, tmp_path):
    src, _files = tree
    r = mcbridge("pack", str(src), str(tmp_path / "o"), "--format", "zip", env=dict(os.environ), state_dir=tmp_path)
    assert r.returncode == 2 and "'zip' is not one of 'tar', 'parquet'" in r.stderr and "Traceback" not in r.stderr
    r = mcbridge("pack", str(src), str(tmp_path / "o"), "--shard-size", "lots", env=dict(os.environ),
                 state_dir=tmp_path)
    assert r.returncode == 2 and "invalid size" in r.stderr


# -- big files, repacking, resuming ------------------------------------------------------------------

def test_big_files_stream_through_tar_in_parts(settings, tmp_path):
    small_parts = settings_for({**os.environ, "MCBRIDGE_STATE_DIR": str(tmp_path / "st")}, chunk_size=64 * 1024)
    files = {"ckpt/model.bin": os.urandom(300 * 1024 + 7), "ckpt/meta.json": b"{}"}
    write_tree(tmp_path / "src", files)
    summary = job.pack(f"{tmp_path / 'src'}/", f"{tmp_path / 'set'}/", small_parts, state_dir=tmp_path / "st")
    manifest = read_manifest(get_store(parse("/"), small_parts), parse(f"{tmp_path / 'set'}/"))
    assert manifest.files["shard-000000.tar"].part_size == 64 * 1024   # streamed in parts
    assert summary["bytes_done"] == summary["bytes_total"]
    unpack(f"{tmp_path / 'set'}/", f"{tmp_path / 'out'}/", small_parts)
    assert read_back(tmp_path / "out") == files


def test_a_file_list_longer_than_a_part_is_streamed_in_parts_and_verifies(settings, tmp_path):
    """A shard's file list is written as its files are placed, not built in memory first: one
    longer than a part goes up in parts, is recorded with them, and verify and unpack read it."""
    small_parts = settings_for({**os.environ, "MCBRIDGE_STATE_DIR": str(tmp_path / "st")}, chunk_size=64 * 1024)
    files = {f"many/{i:05d}-{'x' * 60}.txt": str(i).encode() for i in range(1500)}   # ~150 KiB of list
    write_tree(tmp_path / "src", files)
    job.pack(f"{tmp_path / 'src'}/", f"{tmp_path / 'set'}/", small_parts, state_dir=tmp_path / "st")
    manifest = read_manifest(get_store(parse("/"), small_parts), parse(f"{tmp_path / 'set'}/"))
    listed = manifest.files["shard.index.d/shard-000000.tar.jsonl"]
    assert listed.part_size == 64 * 1024 and len(listed.parts) == -(-listed.size // (64 * 1024)) > 1
    assert verifying.verify(f"{tmp_path / 'set'}/", small_parts, deep=True)["ok"]
    unpack(f"{tmp_path / 'set'}/", f"{tmp_path / 'out'}/", small_parts)
    assert read_back(tmp_path / "out") == files


def test_repacking_with_fewer_shards_removes_the_stale_ones(tree, settings, tmp_path):
    src, files = tree
    root = tmp_path / "set"
    job.pack(f"{src}/", f"{root}/", settings, shard_size=128 * 1024, state_dir=tmp_path / "st")
    many = len(shards_of(root, "tar"))
    summary = job.pack(f"{src}/", f"{root}/", settings, shard_size=1024 * 1024, state_dir=tmp_path / "st")
    assert len(shards_of(root, "tar")) == summary["shards"] < many
    assert summary["stale_removed"] == 2 * (many - summary["shards"])
    store = get_store(parse("/"), settings)
    manifest = read_manifest(store, parse(f"{root}/"))
    assert sorted(n for n in manifest.files if n.endswith(".tar")) == [p.name for p in shards_of(root, "tar")]
    assert list(indexes.check(store, parse(f"{root}/"), manifest.extra["shard_sets"]["shard"])) == []
    unpack(f"{root}/", f"{tmp_path / 'out'}/", settings)
    assert read_back(tmp_path / "out") == files


def test_a_stopped_pack_resumes_without_rewriting_finished_shards(tree, settings, tmp_path, monkeypatch):
    from bridge.packing import writer
    src, files = tree
    plan = job.plan_pack(f"{src}/", f"{tmp_path / 'set'}/", settings, shard_size=256 * 1024)
    original = writer.ShardWriter.write
    calls = []

    def failing_once(self, name, shard_files):
        calls.append(name)
        if name == "shard-000002.tar" and calls.count(name) == 1:
            from bridge.errors import TransientError
            raise TransientError("simulated outage")
        return original(self, name, shard_files)

    monkeypatch.setattr(writer.ShardWriter, "write", failing_once)
    with pytest.raises(Exception, match="simulated outage"):
        job.execute(plan, settings, state_dir=tmp_path / "st")
    assert not (tmp_path / "set" / "shard.index.json").exists()   # no commit marker for half a set
    written = len(calls)
    summary = job.execute(plan, settings, state_dir=tmp_path / "st")
    assert calls[written:] == ["shard-000002.tar"]
    assert summary["bytes_skipped"] > 0
    unpack(f"{tmp_path / 'set'}/", f"{tmp_path / 'out'}/", settings)
    assert read_back(tmp_path / "out") == files


def test_parquet_values_are_located_across_many_pages():
    """pyarrow cuts data pages every 20,000 rows; offsets must survive the page headers."""
    from bridge.packing.parquetfmt import ParquetEncoder

    class Sink:
        def __init__(self):
            self.buf = bytearray()

        def write(self, data):
            self.buf += data
            return len(data)

        def tell(self):
            return len(self.buf)

    sink = Sink()
    encoder = ParquetEncoder(sink, row_group_size=1 << 30)
    values = [i.to_bytes(3, "little") for i in range(45_000)]
    for i, value in enumerate(values):
        encoder.add(f"f{i:06d}", value, hashlib.sha256(value).hexdigest())
    encoder.finish()
    assert len(encoder.placements) == len(values)
    for value, placed in zip(values, encoder.placements, strict=True):
        assert sink.buf[placed["offset"]:placed["offset"] + placed["length"]] == value


def test_help_does_not_import_pyarrow_or_webdataset(tmp_path):
    code = ("import sys\nfrom bridge import cli\ncli._register_extensions()\n"
            "names = [c.name or c.callback.__name__ for c in cli.app.registered_commands]\n"
            "assert {'pack', 'unpack', 'cat', 'migrate'} <= set(names), names\n"
            "assert 'pyarrow' not in sys.modules and 'webdataset' not in sys.modules\n")
    import subprocess
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = mcbridge("--help", env=dict(os.environ), state_dir=tmp_path)
    assert r.returncode == 0 and "pack" in r.stdout and "migrate" in r.stdout


def test_an_index_from_a_newer_bridge_is_refused(packed, settings, tmp_path):
    doc = json.loads((packed["tar"] / "shard.index.json").read_text())
    doc["version"] = 99
    (tmp_path / "shard.index.json").write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match="upgrade"):
        cat(str(tmp_path / "shard.index.json"), "empty.txt", settings)


@pytest.mark.parametrize("rel,size", [("a/b.jpg", 8192), ("x" * 100, 0), ("y" * 101, 5), ("naïve/ü 名.txt", 3),
                                      ("big.bin", 8 ** 11 + 3), ("z" * 300 + "é", 9)])
def test_tar_headers_are_what_tarfile_writes(rel, size):
    """bridge lays out headers itself (fast, and independent of the Python version); they match
    tarfile's own POSIX/pax output for the fixed metadata."""
    from bridge.packing.tarfmt import header_size, member_header
    info = tarfile.TarInfo(rel)
    info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = size, 0, 0o644, 0, 0, "", ""
    assert member_header(rel, size) == info.tobuf(tarfile.PAX_FORMAT, "utf-8", "strict")
    assert header_size(rel, size) == len(member_header(rel, size))


def test_commit_aborts_leftover_uploads_to_its_shards_only(tree, settings, tmp_path):
    src, _files = tree
    root = parse(f"{tmp_path / 'set'}/")
    store = get_store(root, settings)
    mine = store.begin_upload(root.join("shard-000000.tar"), 0)     # a killed run's upload
    theirs = store.begin_upload(root.join("other/ckpt.bin"), 0)     # another job's, still running
    job.pack(f"{src}/", str(root), settings, shard_size=1024 * 1024, state_dir=tmp_path / "st")
    assert store.list_parts(root.join("shard-000000.tar"), mine) is None
    assert store.list_parts(root.join("other/ckpt.bin"), theirs) == {}


def test_a_run_of_files_encodes_as_tarfile_writes_it_and_lists_as_json_dumps():
    """TarEncoder.add_many builds short ASCII names' headers from pieces kept once, and the shard
    list's lines by formatting: the same bytes as tarfile's archive and json.dumps' lines."""
    import collections

    from bridge.packing.tarfmt import TarEncoder

    class Sink:
        def __init__(self):
            self.buf = bytearray()

        def write(self, data):
            self.buf += data

        def tell(self):
            return len(self.buf)

    files = [("a/b.jpg", b"x" * 8192), ("x" * 100, b""), ("y" * 101, b"12345"), ("naïve/ü 名.txt", b"abc"),
             ('q"uo\\te\t.bin', os.urandom(513)), ("d/0000001.cls", b"7")]
    read = [(data, hashlib.sha256(data).hexdigest()) for _rel, data in files]
    encoder = TarEncoder(Sink())
    encoder.add_many([(rel, len(data)) for rel, data in files], read)
    placed = collections.deque((rel, sha) for (rel, _), (_, sha) in zip(files, read))
    lines = encoder.lines(placed)
    encoder.finish()
    expected = io.BytesIO()
    with tarfile.open(fileobj=expected, mode="w", format=tarfile.PAX_FORMAT, encoding="utf-8") as tar:
        for rel, data in files:
            info = tarfile.TarInfo(rel)
            info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = len(data), 0, 0o644, 0, 0, "", ""
            tar.addfile(info, io.BytesIO(data))
    assert bytes(encoder.sink.buf) == expected.getvalue()
    with tarfile.open(fileobj=io.BytesIO(expected.getvalue())) as tar:
        offsets = [m.offset_data for m in tar.getmembers()]
    assert lines == b"".join(json.dumps({"path": rel, "offset": off, "length": len(data), "sha256": sha},
                                        separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
                             for (rel, data), off, (_, sha) in zip(files, offsets, read))
    assert not placed and not encoder.placements


def test_a_failed_part_stops_the_shard_and_drops_its_upload(settings, tmp_path, monkeypatch):
    from bridge.errors import PermissionDenied
    from bridge.packing.sink import StreamingUpload
    store = get_store(parse("/"), settings)
    original = type(store).upload_part

    def refuse_second(self, loc, upload_id, number, offset, data, crc32c):
        if number == 2:
            raise PermissionDenied(f"{loc}: access denied (simulated)")
        return original(self, loc, upload_id, number, offset, data, crc32c)

    monkeypatch.setattr(type(store), "upload_part", refuse_second)
    loc = parse(f"{tmp_path}/obj.bin")
    sink = StreamingUpload(store, loc, part_size=1000)
    with pytest.raises(PermissionDenied):
        for _ in range(10):
            sink.write(os.urandom(700))
        sink.close()
    sink.abort()
    assert list(store.list_uploads(parse(f"{tmp_path}/"))) == []
    assert not (tmp_path / "obj.bin").exists()


def test_unpack_from_the_index_url_and_pack_dry_run(tree, packed, settings, tmp_path):
    src, files = tree
    summary = unpack(str(packed["parquet"] / "shard.index.json"), f"{tmp_path / 'out'}/", settings)
    assert summary["verified"] and read_back(tmp_path / "out") == files
    r = mcbridge("pack", str(src), str(tmp_path / "dry"), "--shard-size", "1MiB", "--dry-run", "--json",
                 env=dict(os.environ), state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["dry_run"] and plan["files"] == len(files) and plan["shards"] == len(plan["plan"]) > 1
    assert not (tmp_path / "dry").exists()


def test_shards_are_written_in_parallel_within_the_memory_budget(tree, tmp_path, monkeypatch):
    import threading

    from bridge.packing import writer
    src, _files = tree
    settings = settings_for(dict(os.environ), concurrency=4)
    running, peak, lock = [0], [0], threading.Lock()
    limit, full = [4], threading.Event()
    original = writer.ShardWriter.write

    def tracked(self, name, files):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            if running[0] >= limit[0]:
                full.set()
        # The first writers wait for one another until as many run at once as the limit allows;
        # the deadline only ends the wait of a run that never gets there (its assert then fails).
        if not full.wait(timeout=20):
            full.set()
        try:
            return original(self, name, files)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(writer.ShardWriter, "write", tracked)
    plan = job.plan_pack(f"{src}/", f"{tmp_path / 'a'}/", settings, shard_size=128 * 1024)
    assert len(plan.shards) >= 8
    job.execute(plan, settings, state_dir=tmp_path / "st")
    assert peak[0] == 4                                   # the concurrency setting, never more
    per_writer = job.get_format("tar").memory_per_writer(plan.part_size)
    peak[0], limit[0] = 0, 2
    full.clear()
    plan = job.plan_pack(f"{src}/", f"{tmp_path / 'b'}/", settings, shard_size=128 * 1024)
    job.execute(plan, settings, state_dir=tmp_path / "st", memory=2 * per_writer)
    assert peak[0] == 2                                   # the memory budget, never more


def test_verify_checks_the_shard_set_through_its_index(tree, settings, tmp_path):
    src, _files = tree
    root = tmp_path / "set"
    job.pack(f"{src}/", f"{root}/", settings, shard_size=512 * 1024, state_dir=tmp_path / "state")
    good = mcbridge("verify", str(root), "--deep", "--json", env=dict(os.environ), state_dir=tmp_path)
    assert good.returncode == 0, good.stdout + good.stderr
    sets = json.loads(good.stdout)["shard_sets"]
    assert [(s["index"], s["ok"]) for s in sets] == [("shard.index.json", True)]
    shard = root / "shard-000001.tar"
    body = bytearray(shard.read_bytes())
    body[1000] ^= 0xFF
    shard.write_bytes(bytes(body))
    bad = mcbridge("verify", str(root), "--deep", "--json", env=dict(os.environ), state_dir=tmp_path)
    assert bad.returncode == 1
    report = json.loads(bad.stdout)
    assert [m["path"] for m in report["mismatched"]] == ["shard-000001.tar"]
    assert any("shard-000001.tar" in p for p in report["shard_sets"][0]["problems"])


def test_no_packing_signature_takes_a_retries_argument():
    """Each store request retries on its own (bridge.retry, the stores' direct paths): a
    ``retries`` threaded through packing was never read, and a reader would take it for a
    knob that does something."""
    import inspect

    from bridge.packing import index, job, rangefile, sink, unpack, writer
    taking = [f"{module.__name__}.{name}" for module in (index, job, rangefile, sink, unpack, writer)
              for name, thing in vars(module).items()
              if getattr(thing, "__module__", None) == module.__name__
              for fn in ([thing] if inspect.isfunction(thing) else
                         [m for m in vars(thing).values() if inspect.isfunction(m)] if inspect.isclass(thing) else [])
              if "retries" in inspect.signature(fn).parameters]
    assert taking == []


def test_a_file_that_changed_after_the_plan_stops_the_pack_before_its_commit(settings, tmp_path):
    """read_listed reads a file's listed size and a byte more: one that grew or shrank since the
    plan listed it is refused, and no index or manifest names the shards."""
    from bridge.errors import BridgeError
    for change in ("grow", "shrink"):
        src = tmp_path / change / "src"
        write_tree(src, {f"f{i:03d}.bin": bytes([i]) * 100 for i in range(200)})
        plan = job.plan_pack(f"{src}/", f"{tmp_path / change / 'out'}/", settings)
        victim = src / "f150.bin"
        victim.write_bytes(bytes(101) if change == "grow" else bytes(99))
        with pytest.raises(BridgeError) as caught:
            job.execute(plan, settings, state_dir=tmp_path / change / "st")
        assert "f150.bin" in str(caught.value) and "changed during packing" in str(caught.value)
        out = tmp_path / change / "out"
        assert not (out / "_bridge").exists() and not list(out.glob("*.index"))


@pytest.mark.parametrize("alone", [False, True], ids=["shared-reader", "writer-reads"])
def test_local_reads_go_wide_only_once_runs_wait_on_their_storage(alone, tmp_path, monkeypatch):
    """A local source is read by one thread (page-cache reads in parallel only take turns with
    the GIL) until SLOW_READS runs in a row waited on their storage: then by the pool. That one
    thread is the shared first reader, or for a writer alone the writer's own. A store whose
    every open waits a millisecond (a network filesystem's round trip) goes wide; one whose runs
    never wait stays on the one thread. Either way each file's bytes and SHA-256 are its own."""
    import concurrent.futures as cf
    import threading
    import time as timing

    from bridge.packing import writer
    from bridge.progress import Progress
    from bridge.stores.local import LocalStore
    files = {f"d/{i:04d}.bin": os.urandom(64 + i % 7) for i in range(64 * 12)}
    write_tree(tmp_path / "src", files)
    listed = [(rel, len(data)) for rel, data in sorted(files.items())]
    root = parse(f"{tmp_path / 'src'}/")
    seen: list[str] = []

    class Waiting(LocalStore):
        def read_listed(self, root, batch):
            seen.append(threading.current_thread().name)
            timing.sleep(len(batch) * 1e-3)
            return super().read_listed(root, batch)

    class Counted(LocalStore):
        def read_listed(self, root, batch):
            seen.append(threading.current_thread().name)
            return super().read_listed(root, batch)

    def run(store) -> list[str]:
        seen.clear()
        with cf.ThreadPoolExecutor(1, thread_name_prefix="first") as first, \
                cf.ThreadPoolExecutor(4, thread_name_prefix="wide") as wide:
            got = {}
            for batch, read in writer.source_batches(store, root, listed, stream_over=1 << 20, pool=wide,
                                                     first=None if alone else first, local=alone,
                                                     progress=Progress(), connections=1):
                for (rel, _size), (data, sha) in zip(batch, read, strict=True):
                    got[rel] = (data, sha)
        assert got == {rel: (data, hashlib.sha256(data).hexdigest()) for rel, data in files.items()}
        return list(seen)

    monkeypatch.setattr(writer, "READ_AHEAD_BATCHES", 4)   # (what is queued already stays with its reader)
    one = threading.current_thread().name if alone else "first_0"
    slow = run(Waiting(settings_for(dict(os.environ))))
    assert slow[:writer.SLOW_READS] == [one] * writer.SLOW_READS
    assert any(name.startswith("wide") for name in slow)
    if alone:   # (the writer sends every later run to the pool: none is queued with another reader)
        assert all(name.startswith("wide") for name in slow[writer.SLOW_READS:]) and len(slow) == 12
    monkeypatch.setattr(writer, "SLOW_READ_FILE", 10.0)   # no run of this machine waits 10 s a file
    fast = run(Counted(settings_for(dict(os.environ))))
    assert fast == [one] * 12


@pytest.mark.parametrize("spill", [False, True])
def test_a_local_folder_is_planned_from_its_sizes_as_from_its_listing(spill, tmp_path, monkeypatch):
    """A local folder packed whole is planned from ``LocalStore.sizes`` (names and sizes, no
    info a file): the same shards, members, sizes and job key as from the store's listing,
    bridge's own folders and temporaries left out either way, held in memory or on disk."""
    from bridge.names import PARTIAL, TEMPORARY
    if spill:
        monkeypatch.setattr(job, "SPILL_FILES", 10)
    src = tmp_path / "src"
    names = [f"s{i // 7:02d}/{i:03d}.{'jpg' if i % 2 else 'json'}" for i in range(120)]
    names += ["a-b", "a.b", "a/x", "a0", "deep/_bridge/inner", "naïve/名前.txt", "sub dir/with space",
              f"t/f{PARTIAL}1", f"t/g{TEMPORARY}123.host.abcd", "_bridge/manifest.json", "z/_bridge"]
    for i, rel in enumerate(names):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(os.urandom(i * 13))
    (src / "link-to-file").symlink_to(src / "a0")
    (src / "link-to-folder").symlink_to(src / "a", target_is_directory=True)
    settings = settings_for({"MCBRIDGE_STATE_DIR": str(tmp_path / "state"), "PATH": os.environ.get("PATH", "")})
    made = []
    real = job._local_sizes

    def counted(*args):
        found = real(*args)
        made.append(found is not None)
        return found

    monkeypatch.setattr(job, "_local_sizes", counted)
    fast = job.plan_pack(f"{src}/", f"{tmp_path}/out/", settings, shard_size=4096).to_dict()
    monkeypatch.setattr(job, "_local_sizes", lambda *args: made.append(False))
    listed = job.plan_pack(f"{src}/", f"{tmp_path}/out/", settings, shard_size=4096).to_dict()
    assert made == [True, False]
    assert fast == listed and len(fast["shards"]) > 3
    members = [rel for shard in fast["shards"] for rel, _size in shard["files"]]
    assert "z/_bridge" in members and "link-to-file" in members and "a/x" in members
    assert not any(PARTIAL in rel or TEMPORARY in rel or rel.startswith("_bridge/") or "/_bridge/" in rel
                   or rel.startswith("link-to-folder") for rel in members)


NAMES = ["a/b.txt", "a/./b", "a//b", "./a", "a/", "", ".", "..", "a/..", "..a", "a..b/c", "/abs", "C:/x", "c:\\x",
         "a\\b", "a:/b", "_bridge", "_bridge/x", "x/_bridge/y", "_bridgex/y", "a\x00b", "ok/" + "n" * 120,
         "naïve/ünïcödé.txt"]


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_a_run_of_names_is_refused_as_each_name_alone_is(fmt):
    """job._check_files (the names of a run searched at once) refuses a run when, and as, the
    first file that _check_file refuses on its own; it passes runs that _check_file passes."""
    from bridge.packing.writer import get_format
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    shard_format = get_format(fmt)

    def alone(files):
        try:
            for rel, size in files:
                job._check_file(rel, size, shard_format)
        except InvalidOption as exc:
            return str(exc)
        return None

    def at_once(files):
        try:
            job._check_files(files, shard_format)
        except InvalidOption as exc:
            return str(exc)
        return None

    good = [(f"d{i}/s{i}.jpg", i) for i in range(50)]
    assert at_once(good) is None and at_once([]) is None
    refused = 0
    rng = random.Random(3)
    for name in NAMES:
        for where in (0, 25, 50):
            files = good[:where] + [(name, 10)] + good[where:]
            assert at_once(files) == alone(files), (name, where)
            refused += alone(files) is not None
        many = [(name, 1)] + [(n, 2) for n in rng.sample(NAMES, 5)]
        assert at_once(many) == alone(many), many
    assert refused >= 3 * 14   # most of NAMES are refused, each in every place
    too_big = good + [("big.bin", shard_format.max_file_size + 1)]
    assert at_once(too_big) == alone(too_big) is not None


def test_a_streamed_object_reuses_its_parts_buffers(settings, tmp_path, monkeypatch):
    """Bytes written in pieces of every size, across parts' ends, make the object as written,
    its SHA-256 and CRC32C those of its bytes; the parts go out of at most PARTS_IN_FLIGHT
    buffers, reused part after part."""
    from bridge.hashing import crc32c, crc_hex
    from bridge.packing import sink as sinks
    store = get_store(parse("/"), settings)
    original = type(store).upload_part
    buffers: list[int] = []

    def seen(self, loc, upload_id, number, offset, data, crc32c, **kw):
        if isinstance(data, bytearray):
            buffers.append(id(data))
        return original(self, loc, upload_id, number, offset, data, crc32c, **kw)

    monkeypatch.setattr(type(store), "upload_part", seen)
    loc = parse(f"{tmp_path}/obj.bin")
    upload = sinks.StreamingUpload(store, loc, part_size=1000)
    rng = random.Random(7)
    written = bytearray()
    while len(written) < 23_456:
        piece = rng.randbytes(rng.choice([1, 17, 999, 1000, 1001, 2500]))
        upload.write(piece if rng.random() < 0.5 else memoryview(piece))
        written += piece
    result = upload.close()
    assert (tmp_path / "obj.bin").read_bytes() == bytes(written)
    assert result.size == len(written) and result.sha256 == hashlib.sha256(written).hexdigest()
    assert result.crc32c == crc_hex(crc32c(bytes(written))) and len(result.parts) == -(-len(written) // 1000) > 20
    assert len(buffers) >= 20 and len(set(buffers)) <= sinks.PARTS_IN_FLIGHT


def test_a_shard_written_alone_reads_its_own_files_and_several_share_one_reader(tmp_path, monkeypatch):
    """A local folder's files are read by the shard's writer itself when it is the only one
    running (one shard at a time), and by one shared reading thread when several shards are
    written at once; the shard sets are the same either way."""
    import threading

    from bridge.stores.local import LocalStore
    files = {f"d{i % 3}/{i:04d}.bin": os.urandom(700 + i) for i in range(600)}
    write_tree(tmp_path / "src", files)
    readers: set[str] = set()
    real = LocalStore.read_listed

    def noted(self, root, batch):
        readers.add(threading.current_thread().name.rstrip("0123456789").rstrip("_"))
        return real(self, root, batch)

    monkeypatch.setattr(LocalStore, "read_listed", noted)
    settings = settings_for(dict(os.environ), concurrency=4)
    job.pack(f"{tmp_path / 'src'}/", f"{tmp_path / 'one'}/", settings, shard_size=64 << 20)
    alone, readers = set(readers), set()
    job.pack(f"{tmp_path / 'src'}/", f"{tmp_path / 'many'}/", settings, shard_size=96 << 10)
    assert alone and "bridge-read-first" not in alone and readers == {"bridge-read-first"}
    assert len(json.loads((tmp_path / "many" / "shard.index.json").read_text())["shards"]) > 3
    for out in ("one", "many"):
        unpack(f"{tmp_path / out}/", f"{tmp_path / out}-back/", settings)
        assert read_back(tmp_path / f"{out}-back") == files
