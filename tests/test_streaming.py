"""Jobs in bounded memory: a plan past its threshold lives on disk and runs the same as one in
memory; planning a long listing holds about as much memory as planning a short one."""

from __future__ import annotations

import io
import json
import os
import tarfile
import tracemalloc
from pathlib import Path

import pytest

from bridge import manifest as manifests
from bridge import ops, stores
from bridge.errors import ObjectNotFound
from bridge.journal import journal_at
from bridge.packing import job as packing
from bridge.packing import unpack
from bridge.stores.base import Features, ObjectInfo, Store
from bridge.urls import Location, parse
from tests.helpers import settings_for
from bridge import listing
from bridge.pipeline import plan as planning
from bridge.pipeline import verify as verifying

ENV = dict(os.environ, XDG_CONFIG_HOME="/nonexistent")


def _tree(root: Path, count: int) -> dict[str, bytes]:
    files = {}
    for i in range(count):
        # "s.d/" folders put pack order (by sample key) apart from path order
        rel = f"s{i % 7}.d/x{i:04d}.{'jpg' if i % 2 else 'json'}" if i % 3 else f"s{i % 7}/y{i:04d}.bin"
        files[rel] = os.urandom(i % 50)
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def test_a_pack_plan_cut_on_disk_is_the_plan_cut_in_memory(tmp_path, monkeypatch):
    _tree(tmp_path / "src", 300)
    settings = settings_for(ENV, state_dir=str(tmp_path / "state"))
    kw = dict(fmt="tar", shard_size=16 * 1024, max_count=40)
    held = packing.plan_pack(f"{tmp_path}/src/", f"{tmp_path}/set/", settings, **kw)
    monkeypatch.setattr(packing, "SPILL_FILES", 25)
    spilled = packing.plan_pack(f"{tmp_path}/src/", f"{tmp_path}/set/", settings, **kw)
    assert any(isinstance(s.files, packing.MemberSlice) for s in spilled.shards)
    assert len(held.shards) > 3 and spilled.key == held.key
    assert [s.to_dict() for s in spilled.shards] == [s.to_dict() for s in held.shards]
    assert spilled.to_dict() == held.to_dict() and spilled.files == 300 and spilled.bytes == held.bytes
    assert list(spilled.units()) == list(held.units())
    assert not any((tmp_path / "state" / "spill").iterdir()), "a plan's tables keep no name in their folder"


def test_a_copy_and_a_pack_whose_plans_live_on_disk_run_resume_and_verify(tmp_path, monkeypatch):
    files = _tree(tmp_path / "src", 120)
    (tmp_path / "src" / "big.bin").write_bytes(os.urandom(3 * 1024 * 1024 + 5))
    settings = settings_for(ENV, state_dir=str(tmp_path / "state"))
    monkeypatch.setattr(planning, "SPILL_FILES", 10)
    monkeypatch.setattr(packing, "SPILL_FILES", 10)
    plan = planning.plan_copy(f"{tmp_path}/src/", f"{tmp_path}/out/", settings, 1024 * 1024)
    assert plan.files._rows is not None and plan.files.multipart == 1
    assert plan.unit_count() == sum(1 for _ in plan.units()) + 1 + 1   # the big file's complete, finalize
    summary = ops.copy(f"{tmp_path}/src/", f"{tmp_path}/out/", settings, chunk_size=1024 * 1024)
    assert summary["files"] == 121
    assert verifying.verify(f"{tmp_path}/out/", settings, deep=True)["ok"]
    for rel, data in files.items():
        assert (tmp_path / "out" / rel).read_bytes() == data
    again = ops.copy(f"{tmp_path}/src/", f"{tmp_path}/out/", settings, chunk_size=1024 * 1024)
    assert again["files"] == 121
    packing.pack(f"{tmp_path}/src/", f"{tmp_path}/set/", settings, shard_size=64 * 1024)
    unpack.unpack(f"{tmp_path}/set/", f"{tmp_path}/back/", settings)
    for rel, data in files.items():
        assert (tmp_path / "back" / rel).read_bytes() == data
    assert not list((tmp_path / "state" / "journal").iterdir())


class Generated(Store):
    """An s3:// listing of ``COUNT`` 1 KiB objects, synthesised: no request, nothing else served."""

    scheme = "s3"
    features = Features(min_part_size=5 * 1024**2, max_part_size=5 * 1024**3, max_parts=10_000,
                        max_object_size=5 * 1024**4, max_copy_size=5 * 1024**3)
    COUNT = 0

    def __init__(self, settings):
        self.settings = settings

    def check_bucket(self, loc):
        return None

    def info(self, loc):
        from bridge.errors import ObjectNotFound
        raise ObjectNotFound(str(loc))

    def read(self, loc, offset=0, length=None):
        raise NotImplementedError

    put = delete = read

    def list(self, prefix):
        for i in range(self.COUNT):
            yield ObjectInfo(Location("s3", prefix.bucket, f"{prefix.key}d{i // 1000:04d}/f{i:07d}.bin"), 1024,
                             identity={"etag": f"{i:032x}"})


def _planning_peak(tmp_path: Path, count: int) -> int:
    stores.store_class("s3").COUNT = count   # the class as the registry loaded it
    settings = settings_for(ENV, state_dir=str(tmp_path / "state"))
    tracemalloc.start()
    try:
        summary = ops.copy("s3://gen/", f"{tmp_path}/dst/", settings, dry_run=True)
        assert summary["files"] == count and sum(1 for _ in summary["plan"]) == count
        # each file, the commit's document and its shards of SHARD_ENTRIES entries
        shards = -(-count // manifests.SHARD_ENTRIES) if count > manifests.SHARD_ENTRIES else 0
        assert summary["usage"]["destination"]["requests"]["PUT"] == count + 1 + shards
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_planning_a_listing_ten_times_longer_takes_about_the_same_memory(tmp_path, monkeypatch):
    monkeypatch.setitem(stores.REGISTRY, "s3", stores.Backend("tests.test_streaming:Generated", ""))
    monkeypatch.setattr(stores, "_cache", type(stores._cache)())
    monkeypatch.setattr(planning, "SPILL_FILES", 500)
    (tmp_path / "dst").mkdir()
    short, long = _planning_peak(tmp_path, 4_000), _planning_peak(tmp_path, 40_000)
    assert long < short * 1.5, f"planning 40,000 objects peaked at {long} bytes, 4,000 at {short}"


def test_a_listing_read_once_as_it_is_planned(tmp_path, monkeypatch):
    """resolve() reads the listing lazily: its first object before it returns, the rest as the
    plan is built."""
    monkeypatch.setitem(stores.REGISTRY, "s3", stores.Backend("tests.test_streaming:Generated", ""))
    monkeypatch.setattr(stores, "_cache", type(stores._cache)())
    stores.store_class("s3").COUNT = 5
    settings = settings_for(ENV)
    src, dst, objects, single = listing.resolve("s3://gen/", f"{tmp_path}/", settings)
    assert single is None and not isinstance(objects, list)
    assert [rel for rel, _ in objects] == [f"d0000/f{i:07d}.bin" for i in range(5)]
    assert parse(str(src)) == parse("s3://gen/")


def _tar_shards(root: Path, shards: int, members: int) -> None:
    """Foreign tar shards (no index: their members are read from the tar headers), each member
    a few bytes."""
    root.mkdir(parents=True)
    for s in range(shards):
        with tarfile.open(root / f"part-{s:04d}.tar", "w", format=tarfile.USTAR_FORMAT) as archive:
            for i in range(members):
                info = tarfile.TarInfo(f"d{s:04d}/f{i:05d}.txt")
                data = f"{s}.{i}".encode()
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))


def _unpack_planning_peak(tmp_path: Path, shards: int) -> int:
    settings = settings_for(ENV, state_dir=str(tmp_path / "state"))
    _tar_shards(tmp_path / f"set{shards}", shards, 500)
    tracemalloc.start()
    try:
        plan = unpack.plan_unpack(f"{tmp_path}/set{shards}/", f"{tmp_path}/out{shards}/", settings)
        try:
            assert plan.files == shards * 500 and plan.usage().files == shards * 500
            assert "members" not in json.dumps(plan.to_dict())     # the service's header names shards only
            # a unit's members are read from the plan's table as its shard is restored
            assert sum(1 for u in plan.units() for _m in plan.shard(u).each()) == shards * 500
        finally:
            plan.close()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_planning_an_unpack_of_ten_times_the_members_takes_about_the_same_memory(tmp_path):
    short, long = _unpack_planning_peak(tmp_path, 4), _unpack_planning_peak(tmp_path, 40)
    assert long < short * 1.5, f"planning 20,000 members peaked at {long} bytes, 2,000 at {short}"


def test_an_unpack_commits_only_the_records_of_its_own_shards(tmp_path):
    """The commit takes the members' entries from the journal in path order: a record another
    shard set left under the same job's journal is not committed, and a shard without its own
    record stops the commit before it starts."""
    settings = settings_for(ENV, state_dir=str(tmp_path / "state"))
    _tar_shards(tmp_path / "set", 3, 20)
    summary = unpack.unpack(f"{tmp_path}/set/", f"{tmp_path}/out/", settings)
    assert summary["files"] == 60
    assert len(list((tmp_path / "out").rglob("*.txt"))) == 60
    plan = unpack.plan_unpack(f"{tmp_path}/set/", f"{tmp_path}/out/", settings)
    journal = journal_at(tmp_path / "j", plan.key)
    ctx = unpack.UnpackContext(plan, settings, journal)
    for unit in plan.units():
        ctx.run_unit(unit)
    journal.put("file:d0000/stale.txt", {"path": "d0000/stale.txt", "size": 1, "crc32c": "x", "sha256": "y",
                                         "shard": "part-0000.tar:1:"})
    entries = list(unpack.restored_entries(journal, plan))
    assert len(entries) == 60 and [e.path for e in entries] == sorted(e.path for e in entries)
    journal.put("shard:part-0001.tar", None)
    with pytest.raises(ObjectNotFound, match="shard part-0001.tar was not restored"):
        unpack.restored_entries(journal, plan)
    ctx.close()
    plan.close()
    journal.close()
