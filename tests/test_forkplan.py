"""A sync of a large local folder planned by parts in forked processes (bridge/pipeline/forkplan.py):
the same plan as one process makes, to the byte of every adopted entry; progress, requests and
errors reach the command; a process that dies fails the plan; a small folder is not split.

The thresholds (``MIN_ENTRIES``, ``PAGE``) are lowered here so that trees of a few hundred files
split; the command-line test meets the real ones."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from bridge import meter
from bridge.adopt import _can_fork
from bridge.errors import BridgeError, InvalidOption
from bridge.pipeline import execute as executor
from bridge.pipeline import forkplan
from bridge.pipeline import syncplan
from bridge.pipeline import verify as verifying
from bridge.progress import Progress
from bridge.urls import parse
from tests.helpers import mcbridge, settings_for

pytestmark = pytest.mark.skipif(not _can_fork(), reason="forks on Linux only")


def _tree(root: Path) -> dict[str, bytes]:
    """Three top-level folders (one two levels deep), files directly under the root between
    their names, and names that sort around the folders' ('a.bin' < 'b/' < 'b.bin' < 'b0/')."""
    files = {f"b/{i:03d}.bin": os.urandom(50 + i) for i in range(120)}
    files.update({f"b0/deep/{i:03d}.bin": os.urandom(70 + i) for i in range(90)})
    files.update({f"c/{i:03d}.bin": os.urandom(30 + i) for i in range(100)})
    files.update({"a.bin": b"a" * 10, "b.bin": b"b" * 11, "z.bin": b"z" * 12})
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


@pytest.fixture
def low(monkeypatch):
    """Every tree of these tests split; the runs of parts counted."""
    monkeypatch.setattr(forkplan, "MIN_ENTRIES", 1)
    monkeypatch.setattr(forkplan, "PAGE", 1)
    runs: list[int] = []
    real = forkplan._run

    def counted(parts, processes, progress, job):
        runs.append(processes)
        return real(parts, processes, progress, job)

    monkeypatch.setattr(forkplan, "_run", counted)
    return runs


def _plan(src: str, dst: str, settings, **kw):
    progress = Progress()
    with meter.metering(meter.Meter()) as counted:
        plan, counts = syncplan.plan_sync(src, dst, settings, progress=progress, **kw)
    return {"counts": counts, "files": [(f.rel, f.size, f.part_size, f.source_id) for f in plan.files],
            "adopted": [(p, str(t)) for p, t in plan.adopted.encoded()], "deletions": list(plan.deletions),
            "key": plan.key, "source": plan.source, "destination": plan.destination,
            "listed": (plan.listed["source"], plan.listed["destination"]),
            "progress": (progress.listed, progress.checks_done),
            "lists": sum(row["requests"].get("LIST", 0) for row in counted.to_dict().values())}, plan


@pytest.mark.parametrize("scheme", ["s3", "local"])
def test_a_split_plan_is_the_plan_one_process_makes(scheme, low, make_root, moto, emulator_env, tmp_path):
    """Onto another tool's copy (adopted, one file changed, one new, one only there) and again
    onto bridge's own record (one file changed since): with two processes, exactly one
    process's plan, adopted entries to the byte, in path order; it runs, and verifies."""
    src = tmp_path / "src"
    files = _tree(src)
    dst = make_root(scheme) + "theirs/"
    loc = parse(dst)
    for rel, data in files.items():   # the other tool's copy
        if scheme == "s3":
            moto.client().put_object(Bucket=loc.bucket, Key=loc.key + rel, Body=data)
        else:
            (Path(loc.local_path) / rel).parent.mkdir(parents=True, exist_ok=True)
            (Path(loc.local_path) / rel).write_bytes(data)
    (src / "c/007.bin").write_bytes(bytes(b ^ 1 for b in files["c/007.bin"]))   # same size, other bytes
    (src / "b0/deep/new.bin").write_bytes(b"new")
    if scheme == "s3":
        moto.client().put_object(Bucket=loc.bucket, Key=loc.key + "b/only-there.bin", Body=b"x")
    else:
        (Path(loc.local_path) / "b/only-there.bin").write_bytes(b"x")
    one = settings_for({**emulator_env, "MCBRIDGE_STATE_DIR": str(tmp_path / "state"), "MCBRIDGE_PROCESSES": "1"})
    two = settings_for({**emulator_env, "MCBRIDGE_STATE_DIR": str(tmp_path / "state"), "MCBRIDGE_PROCESSES": "2"})

    alone, _ = _plan(f"{src}/", dst, one, delete=True)
    assert low == []
    split, plan = _plan(f"{src}/", dst, two, delete=True)
    assert low == [2]
    lists = (alone.pop("lists"), split.pop("lists"))
    assert split == alone
    assert split["counts"] == {"new": 1, "changed": 1, "repaired": 0, "unchanged": 0, "adopted": len(files) - 1,
                               "deleted": 1}
    assert [p for p, _ in split["adopted"]] == sorted(set(files) - {"c/007.bin"})
    assert split["deletions"] == ["b/only-there.bin"]
    if scheme == "s3":   # every part's listing counted in the command's meter: a LIST a folder at least
        assert lists[1] >= 3 and lists[0] >= 1, lists
    assert executor.execute(plan, two)["ok"]
    assert verifying.verify(dst, two, deep=True)["ok"]

    (src / "b/005.bin").write_bytes(b"changed since")   # now against bridge's own record
    alone, _ = _plan(f"{src}/", dst, one)
    split, _ = _plan(f"{src}/", dst, two)
    alone.pop("lists"), split.pop("lists")
    assert split == alone and low == [2, 2]
    assert split["counts"]["changed"] == 1 and split["counts"]["unchanged"] == len(files)
    assert split["files"][0][0] == "b/005.bin"


def test_filters_select_the_same_files_in_parts(low, moto, make_root, emulator_env, tmp_path):
    """--exclude and --min-size apply in every part as in one process (a rule on a folder's
    files, one on names anywhere), deleting what only the destination has, unless excluded."""
    from bridge.filters import from_flags
    src = tmp_path / "src"
    files = _tree(src)
    dst = make_root("s3") + "mirror/"
    loc = parse(dst)
    for rel in ("b/old.bin", "c/old.txt", "b/small.bin"):
        moto.client().put_object(Bucket=loc.bucket, Key=loc.key + rel, Body=b"old" * (1 if "small" in rel else 40))
    env = {**emulator_env, "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}
    one, two = settings_for({**env, "MCBRIDGE_PROCESSES": "1"}), settings_for({**env, "MCBRIDGE_PROCESSES": "2"})
    rules = from_flags(exclude=["c/**", "*.txt"], min_size=60)
    alone, _ = _plan(f"{src}/", dst, one, delete=True, filters=rules)
    split, _ = _plan(f"{src}/", dst, two, delete=True, filters=rules)
    assert low == [2]
    alone.pop("lists"), split.pop("lists")
    assert split == alone
    sent = {rel for rel, *_ in split["files"]}
    assert sent == {rel for rel, data in files.items() if not rel.startswith("c/") and len(data) >= 60}
    assert split["deletions"] == ["b/old.bin"]   # c/old.txt and b/small.bin (3 bytes) are left out: kept


def test_a_sync_that_deletes_into_a_folder_not_made_yet_is_split(low, tmp_path):
    src = tmp_path / "src"
    files = _tree(src)
    dst = f"{tmp_path}/new/mirror/"
    settings = settings_for({"MCBRIDGE_STATE_DIR": str(tmp_path / "state"), "MCBRIDGE_PROCESSES": "2",
                             "PATH": os.environ.get("PATH", "")})
    plan, counts = syncplan.plan_sync(f"{src}/", dst, settings, delete=True)
    assert low == [2] and counts["new"] == len(files) and plan.deletions == []
    assert executor.execute(plan, settings)["ok"]
    assert verifying.verify(dst, settings)["ok"]


def test_a_parts_error_is_the_error_one_process_raises(low, tmp_path):
    """A destination inside its source: refused by the part that meets it, with the error one
    process raises, and nothing is written there."""
    src = tmp_path / "src"
    _tree(src)
    dst = f"{src}/c/inside/"
    for processes in ("1", "2"):
        settings = settings_for({"MCBRIDGE_STATE_DIR": str(tmp_path / "state"), "MCBRIDGE_PROCESSES": processes,
                                 "PATH": os.environ.get("PATH", "")})
        with pytest.raises(InvalidOption, match="is the source .* or inside it") as raised:
            syncplan.plan_sync(f"{src}/", dst, settings)
        if processes == "1":
            first = str(raised.value)
        else:
            assert str(raised.value) == first
    assert low == [2] and not (src / "c/inside").exists()


def _dies(*args, **kwargs):
    os._exit(3)


def test_a_planning_process_that_dies_fails_the_plan(low, tmp_path):
    src = tmp_path / "src"
    _tree(src)
    (tmp_path / "dst").mkdir()
    settings = settings_for({"MCBRIDGE_STATE_DIR": str(tmp_path / "state"), "MCBRIDGE_PROCESSES": "2",
                             "PATH": os.environ.get("PATH", "")})
    with pytest.raises(BridgeError, match=r"a planning process ended without its part \(exit code 3"):
        forkplan.plan_sync_split(_dies, f"{src}/", f"{tmp_path}/dst/", settings, delete=False, chunk_size=None,
                                 adopt="checksum", filters=None, progress=None)
    assert list((tmp_path / "state" / "spill").iterdir()) == []   # the parts' output went with them


def test_a_small_folder_or_one_process_is_not_split(tmp_path):
    src = tmp_path / "src"
    _tree(src)
    (tmp_path / "dst").mkdir()
    for processes in ("0", "1"):
        settings = settings_for({"MCBRIDGE_STATE_DIR": str(tmp_path / "state"), "MCBRIDGE_PROCESSES": processes,
                                 "PATH": os.environ.get("PATH", "")})
        assert forkplan.plan_sync_split(syncplan.plan_sync, f"{src}/", f"{tmp_path}/dst/", settings, delete=False, chunk_size=None,
                                        adopt="checksum", filters=None, progress=None) is None


def test_many_small_top_level_folders_are_not_split(monkeypatch, tmp_path):
    """A folder a part would list per top-level folder: 400 folders of 12 files would be 400 LISTs
    where 5 pages of 1,000 serve, so the plan stays in one process."""
    monkeypatch.setattr(forkplan, "MIN_ENTRIES", 100)
    src = tmp_path / "src"
    for i in range(400):
        (src / f"f{i:03d}").mkdir(parents=True)
        for j in range(12):
            (src / f"f{i:03d}" / f"{j}.bin").write_bytes(b"x")
    (tmp_path / "dst").mkdir()
    settings = settings_for({"MCBRIDGE_STATE_DIR": str(tmp_path / "state"), "MCBRIDGE_PROCESSES": "2",
                             "PATH": os.environ.get("PATH", "")})
    assert not forkplan._big_enough(parse(f"{src}/"), {f"f{i:03d}/" for i in range(400)}, 2)
    assert forkplan.plan_sync_split(syncplan.plan_sync, f"{src}/", f"{tmp_path}/dst/", settings, delete=False, chunk_size=None,
                                    adopt="checksum", filters=None, progress=None) is None
    assert forkplan._big_enough(parse(f"{src}/"), {f"f{i:03d}/" for i in range(400)}, 100)


def test_the_command_adopts_a_large_folder_planned_in_parts(tmp_path):
    """At the real thresholds: two folders of 2,100 files each, copied by another tool (cp), are
    adopted by ``mcbridge sync`` planned by two processes; -v says each adopted file, the
    summary counts them, and ``verify`` checks them all."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    for folder in ("one", "two"):
        (src / folder).mkdir(parents=True)
        for i in range(2100):
            (src / folder / f"{i:04d}.txt").write_bytes(f"{folder} {i}\n".encode())
    shutil.copytree(src, dst)
    env = {**os.environ, "MCBRIDGE_PROCESSES": "2"}
    r = mcbridge("sync", f"{src}/", f"{dst}/", "--json", "-v", env=env, state_dir=tmp_path / "state")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["reasons"]["adopted"] == 4200 and summary["sent"] == []
    said = [line for line in r.stderr.splitlines() if "adopted" in line and ".txt" in line]
    assert len(said) == 4200, r.stderr[-2000:]
    v = mcbridge("verify", f"{dst}/", "--json", env=env, state_dir=tmp_path / "state")
    assert v.returncode == 0 and json.loads(v.stdout)["checked"] == 4200, v.stdout + v.stderr


def test_the_pack_command_walks_a_large_folder_in_processes(tmp_path):
    """At the real thresholds: three folders of 1,400 files each are packed by ``mcbridge pack``
    (its walk shared by two processes), every file in the index once, and the shard set
    verifies and unpacks to the same tree."""
    src = tmp_path / "src"
    files = {}
    for folder in ("one", "three", "two"):
        (src / folder).mkdir(parents=True)
        for i in range(1400):
            files[f"{folder}/{i:04d}.txt"] = f"{folder} {i}\n".encode()
            (src / folder / f"{i:04d}.txt").write_bytes(files[f"{folder}/{i:04d}.txt"])
    env = {**os.environ, "MCBRIDGE_PROCESSES": "2"}
    r = mcbridge("pack", f"{src}/", f"{tmp_path}/set/", "--shard-size", "1MiB", "--json", env=env,
                 state_dir=tmp_path / "state")
    assert r.returncode == 0, r.stderr
    index = json.loads((tmp_path / "set" / "shard.index.json").read_text())
    assert sum(shard["files"] for shard in index["shards"]) == 4200 and len(index["shards"]) > 1
    v = mcbridge("verify", f"{tmp_path}/set/", env=env, state_dir=tmp_path / "state")
    assert v.returncode == 0, v.stdout + v.stderr
    u = mcbridge("unpack", f"{tmp_path}/set/", f"{tmp_path}/out/", env=env, state_dir=tmp_path / "state")
    assert u.returncode == 0, u.stderr
    back = {p.relative_to(tmp_path / "out").as_posix(): p.read_bytes()
            for p in (tmp_path / "out").rglob("*.txt")}
    assert back == files


def test_no_process_is_forked_from_another_thread_than_the_main_one(tmp_path):
    """A fork copies only the thread that forks: from another thread (the Python API's caller's,
    a replicator's) a job runs in one process."""
    import threading
    settings = settings_for({"MCBRIDGE_STATE_DIR": str(tmp_path / "state"), "MCBRIDGE_PROCESSES": "3",
                             "PATH": os.environ.get("PATH", "")})
    seen = []
    worker = threading.Thread(target=lambda: seen.append(forkplan.processes_for(settings)))
    worker.start()
    worker.join()
    assert seen == [1] and forkplan.processes_for(settings) == 3


def _walk_settings(tmp_path, processes: str):
    return settings_for({"MCBRIDGE_STATE_DIR": str(tmp_path / "state"), "MCBRIDGE_PROCESSES": processes,
                         "PATH": os.environ.get("PATH", "")})


def test_a_folders_sizes_walked_by_processes_are_the_walks(monkeypatch, tmp_path):
    """``sizes_split`` (a pack plan's walk, its top-level folders shared among processes) names
    the files ``LocalStore.sizes`` names, with their sizes, and the pack plan made from it is the
    one process's plan; the processes' output leaves nothing on disk."""
    from bridge.packing import job
    from bridge.stores.local import LocalStore
    from tests.test_local_walk import _tree as odd_names
    monkeypatch.setattr(forkplan, "MIN_ENTRIES", 1)
    src = tmp_path / "src"
    odd_names(src)
    _tree(src / "more")
    root = parse(f"{src}/")
    store = LocalStore(_walk_settings(tmp_path, "1"))
    whole = sorted(store.sizes(root))
    assert len(whole) > 300 and ("z/_bridge", 5) in whole and "_bridge.txt" in dict(whole)
    for processes in ("2", "3"):
        walked = forkplan.sizes_split(store, root, _walk_settings(tmp_path, processes))
        assert walked is not None and sorted(walked) == whole
    plans = [job.plan_pack(f"{src}/", f"{tmp_path}/out/", _walk_settings(tmp_path, p), shard_size=8192).to_dict()
             for p in ("1", "2")]
    assert plans[0] == plans[1] and len(plans[0]["shards"]) > 3
    assert list((tmp_path / "state" / "spill").iterdir()) == []


def test_a_walking_processes_error_or_death_fails_the_walk(monkeypatch, tmp_path):
    from bridge.errors import PermissionDenied
    from bridge.stores.local import LocalStore
    monkeypatch.setattr(forkplan, "MIN_ENTRIES", 1)
    src = tmp_path / "src"
    _tree(src)
    root = parse(f"{src}/")
    real = LocalStore.sizes
    how = {}

    def shared(self, prefix, only=None, top_files=True):
        if not top_files:   # another process's share
            if how["fail"] == "error":
                raise PermissionDenied(f"{prefix}: access denied (simulated)")
            os._exit(3)
        return real(self, prefix, only, top_files)

    monkeypatch.setattr(LocalStore, "sizes", shared)
    store = LocalStore(_walk_settings(tmp_path, "2"))
    how["fail"] = "error"
    with pytest.raises(PermissionDenied, match="access denied \\(simulated\\)"):
        list(forkplan.sizes_split(store, root, _walk_settings(tmp_path, "2")))
    how["fail"] = "death"
    with pytest.raises(BridgeError, match=r"walking part of the folder ended \(exit code 3\)"):
        list(forkplan.sizes_split(store, root, _walk_settings(tmp_path, "2")))


def test_a_small_folder_or_one_process_is_walked_in_one(monkeypatch, tmp_path):
    from bridge.stores.local import LocalStore
    src = tmp_path / "src"
    _tree(src)
    store = LocalStore(_walk_settings(tmp_path, "2"))
    root = parse(f"{src}/")
    assert forkplan.sizes_split(store, root, _walk_settings(tmp_path, "2")) is None   # 313 entries
    monkeypatch.setattr(forkplan, "MIN_ENTRIES", 1)
    assert forkplan.sizes_split(store, root, _walk_settings(tmp_path, "1")) is None
    assert forkplan.sizes_split(store, parse(f"{src}/c/"), _walk_settings(tmp_path, "2")) is None   # no folder
    (tmp_path / "state").mkdir(exist_ok=True)
    (tmp_path / "state" / "spill").write_bytes(b"")   # no folder for the shares' output: one process
    assert forkplan.sizes_split(store, root, _walk_settings(tmp_path, "2")) is None


@pytest.mark.parametrize("top_files", [False, True])
def test_a_split_adoption_commits_the_parts_shards_as_one_process_commits_its_entries(top_files, low, moto, make_root,
                                                                                      emulator_env, tmp_path,
                                                                                      monkeypatch):
    """The parts lay out their adopted entries as the commit's shards (``manifest.blocks_of``)
    and the commit writes them as they are (``jobs.commit_blocks``): the record holds what one
    process commits, entry for entry and to the byte, its shards in path order with their
    counts, first and last paths and SHA-256, and the totals; it verifies. Where files at the
    top of the folder fall between the parts' folders, the commit takes the entries one by one,
    to the same record."""
    from bridge import jobs
    from bridge import manifest as manifests
    from bridge.stores import get_store
    monkeypatch.setattr(manifests, "SHARD_ENTRIES", 40)
    src = tmp_path / "src"
    files = _tree(src)
    if not top_files:
        for rel in ("a.bin", "b.bin", "z.bin"):
            (src / rel).unlink()
            del files[rel]
    dst = make_root("s3") + "theirs/"
    loc = parse(dst)
    for rel, data in files.items():
        moto.client().put_object(Bucket=loc.bucket, Key=loc.key + rel, Body=data)
    laid_out: list[int] = []
    real = jobs.commit_blocks

    def counted(*args, **kwargs):
        laid_out.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(jobs, "commit_blocks", counted)

    records = []
    for processes in ("1", "2"):
        settings = settings_for({**emulator_env, "MCBRIDGE_STATE_DIR": str(tmp_path / f"state{processes}"),
                                 "MCBRIDGE_PROCESSES": processes})
        plan, counts = syncplan.plan_sync(f"{src}/", dst, settings)
        assert counts["adopted"] == len(files) and not plan.files
        assert executor.execute(plan, settings)["ok"]
        store = get_store(loc, settings)
        record = manifests.open_record(store, loc)
        [source] = record.sources
        shards = source.doc["file_shards"]
        lines = [line for s in shards for line in store.read(loc.join(s["name"])).splitlines()]
        for s in shards:
            body = store.read(loc.join(s["name"]))
            paths = [json.loads(line)["path"] for line in body.splitlines()]
            assert (s["entries"], s["first"], s["last"]) == (len(paths), paths[0], paths[-1])
            assert s["sha256"] == __import__("hashlib").sha256(body).hexdigest()
        assert [json.loads(line)["path"] for line in lines] == sorted(files)
        assert source.doc["totals"] == {"files": len(files), "bytes": sum(len(d) for d in files.values())}
        records.append(lines)
        assert verifying.verify(dst, settings, deep=True)["ok"]
        manifests.remove(store, loc)
    assert records[0] == records[1]
    assert low == [2] and laid_out == ([] if top_files else [1])


@pytest.mark.parametrize("here", [True, False])
def test_a_parts_walk_of_a_local_folder_is_read_in_its_merge_and_ahead_on_a_server(here, tmp_path, monkeypatch):
    """A part's plan (what each planning process runs, one process a core) reads its local
    source's walk in the merge's own thread where the filesystem answers here (a thread ahead
    would only take turns with the merge for the GIL and the core), and in a thread ahead where
    a server answers each stat (Lustre, NFS: the waits overlap the merge); the destination's
    listing is ahead either way. The plan is the same."""
    import threading

    from bridge.pipeline.parts import Part
    from bridge.stores.local import LocalStore
    src, dst = tmp_path / "src", tmp_path / "dst"
    files = _tree(src)
    shutil.copytree(src, dst)
    seen: list[tuple[str, str]] = []
    real = LocalStore.walk

    def walk(self, prefix):
        for item in real(self, prefix):
            seen.append((prefix.local_path, threading.current_thread().name))
            yield item
    monkeypatch.setattr(LocalStore, "walk", walk)
    monkeypatch.setattr(syncplan, "answered_here", lambda path: here)
    settings = settings_for({"MCBRIDGE_STATE_DIR": str(tmp_path / "state")})
    plan, counts = syncplan.plan_sync(f"{src}/", f"{dst}/", settings, part=Part(("b/", "b0/")))
    assert counts["adopted"] == 210 and not plan.files
    source = {name for path, name in seen if path.startswith(str(src))}
    destination = {name for path, name in seen if path.startswith(str(dst))}
    assert source == ({threading.current_thread().name} if here else {"ahead"}), seen[:3]
    assert destination == {"ahead"}


def test_a_filesystem_answers_here_when_its_type_is_a_local_ones(tmp_path):
    """``answered_here`` by the longest mount point holding the path (``/proc/mounts``): a disk's
    or memory's filesystem answers here; Lustre, NFS, a FUSE mount of a bucket, a type not
    known, or no mount table at all, do not."""
    from bridge.stores.local import answered_here
    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/vda / ext4 rw 0 0\ntmpfs /dev/shm tmpfs rw 0 0\n"
                      "mds@o2ib:/scratch /lustre/scratch lustre rw 0 0\nnas:/home /nfs/home nfs4 rw 0 0\n"
                      "s3fs /mnt/bucket fuse.s3fs rw 0 0\nthing /mnt/odd oddfs rw 0 0\n"
                      "/dev/vdb /mnt/with\\040space xfs rw 0 0\n")
    assert answered_here("/data/corpus", str(mounts)) and answered_here("/dev/shm/x", str(mounts))
    assert answered_here("/mnt/with space/corpus", str(mounts))
    for path in ("/lustre/scratch/corpus", "/nfs/home/me", "/mnt/bucket/prefix", "/mnt/odd/x"):
        assert not answered_here(path, str(mounts)), path
    assert answered_here("/lustre/scratchy/x", str(mounts))             # not under the Lustre mount
    assert not answered_here("/data", str(tmp_path / "no-such-mounts"))
