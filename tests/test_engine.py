"""The transfer engine: manifest contents, verify, resume after SIGKILL, sync and repair."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from bridge import manifest as manifests
from bridge.hashing import crc32c, crc_hex, sha256_tree
from bridge.stores import get_store
from bridge.urls import parse
from tests.faultproxy import FaultProxy, proxied_environment
from tests.helpers import MCBRIDGE, journaled_keys, make_tree, mcbridge, read_tree, settings_for

MiB = 1024 * 1024


def overwrite(emulator_for, url: str, data: bytes) -> None:
    """Change an object behind bridge's back, with the provider's own SDK (or the filesystem)."""
    loc = parse(url)
    if loc.is_local:
        Path(loc.local_path).write_bytes(data)
    elif loc.scheme == "s3":
        emulator_for("s3").client().put_object(Bucket=loc.bucket, Key=loc.key, Body=data)
    elif loc.scheme == "gs":
        emulator_for("gs").client().bucket(loc.bucket).blob(loc.key).upload_from_string(data)
    else:
        emulator_for("az").client().get_blob_client(loc.bucket, loc.key).upload_blob(data, overwrite=True)


def test_manifest_contents(tmp_path, emulator_env):
    files = make_tree(tmp_path / "src")
    r = mcbridge("cp", f"{tmp_path}/src/", f"{tmp_path}/dst/", "--chunk-size", "1MiB", "--json",
                 env=emulator_env, state_dir=tmp_path / "state")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["files"] == len(files) and summary["bytes"] == sum(map(len, files.values()))
    commits = sorted((tmp_path / "dst/_bridge/log").iterdir())
    assert len(commits) == 1 and commits[0].name.startswith("c-000000000001-")
    doc = json.loads(commits[0].read_text())
    assert summary["manifest"] == str(commits[0])
    assert doc["format"] == "mcbridge-manifest" and doc["version"] == 3 and doc["kind"] == "commit"
    assert doc["source"] == f"{tmp_path}/src/" and doc["destination"] == f"{tmp_path}/dst/"
    assert doc["bridge_version"] and doc["created"].endswith("Z")
    assert doc["totals"] == {"files": len(files), "bytes": sum(map(len, files.values()))}
    entries = {e["path"]: e for e in doc["files"]}
    assert sorted(entries) == sorted(files) == [e["path"] for e in doc["files"]]
    for rel, data in files.items():
        e = entries[rel]
        assert e["size"] == len(data)
        assert e["crc32c"] == crc_hex(crc32c(data))
        if len(data) > MiB:   # parts: their SHA-256s and tree; the whole SHA-256 only with --sha256
            assert e["part_size"] == MiB and e["sha256"] == ""
            slices = [data[i:i + MiB] for i in range(0, len(data), MiB)]
            assert e["parts"] == [crc_hex(crc32c(s)) for s in slices]
            assert e["part_sha256"] == [hashlib.sha256(s).hexdigest() for s in slices]
            assert e["sha256_tree"] == sha256_tree(e["part_sha256"], MiB)
        else:
            assert e["sha256"] == hashlib.sha256(data).hexdigest()
            assert e["part_size"] == 0 and e["parts"] == []
    assert not list((tmp_path / "state").glob("journal/*")), "journal removed after success"


def test_manifest_shards_for_large_corpora(tmp_path, emulator_env, monkeypatch):
    store = get_store(parse(f"{tmp_path}/"), settings_for(emulator_env))
    files = {f"f{i:05d}": manifests.FileEntry(f"f{i:05d}", i, "00000000", "0" * 64) for i in range(25)}
    m = manifests.Manifest("src", "dst", files)
    monkeypatch.setattr(manifests, "SHARD_ENTRIES", 10)
    manifests.write(store, parse(f"{tmp_path}/"), m)
    [commit] = (tmp_path / "_bridge/log").iterdir()
    doc = json.loads(commit.read_text())
    assert "files" not in doc and [s["entries"] for s in doc["file_shards"]] == [10, 10, 5]
    assert [(s["first"], s["last"]) for s in doc["file_shards"]] == [("f00000", "f00009"), ("f00010", "f00019"),
                                                                     ("f00020", "f00024")]
    again = manifests.read(store, parse(f"{tmp_path}/"))
    assert again.files == files


def test_a_sharded_record_reads_its_shards_ahead_and_fails_on_one_changed_or_gone(tmp_path, emulator_env,
                                                                                   monkeypatch):
    """A record of one commit in three shards is read as written, its shards read ahead of the
    decoding by a thread (manifest._doc_entries); a reader that stops early leaves; a shard whose
    bytes no longer match its hash, or that is gone (a compaction under the reader), fails the
    read with one line, raised where the entries are read."""
    from bridge.errors import ManifestError
    store = get_store(parse(f"{tmp_path}/"), settings_for(emulator_env))
    files = {f"f{i:05d}": manifests.FileEntry(f"f{i:05d}", i, "00000000", "0" * 64) for i in range(25)}
    monkeypatch.setattr(manifests, "SHARD_ENTRIES", 10)
    manifests.write(store, parse(f"{tmp_path}/"), manifests.Manifest("src", "dst", files))
    record = manifests.open_record(store, parse(f"{tmp_path}/"))
    assert [e.path for e in record.entries()] == sorted(files)
    first = record.entries()
    assert [next(first).path for _ in range(3)] == ["f00000", "f00001", "f00002"]
    first.close()
    [shard_dir] = (tmp_path / "_bridge/seg").iterdir()
    second = shard_dir / "000001.jsonl"
    body = second.read_bytes()
    second.write_bytes(body.replace(b'"f00012"', b'"f00012x"'))
    with pytest.raises(ManifestError, match="does not match its hash"):
        list(manifests.open_record(store, parse(f"{tmp_path}/")).entries())
    second.unlink()
    with pytest.raises(ManifestError, match="compacted away"):
        list(manifests.open_record(store, parse(f"{tmp_path}/")).entries())


@pytest.mark.parametrize("scheme", ["local", "s3", "gs", "az"])
def test_verify_passes_then_names_the_corrupted_file(scheme, make_root, emulator_for, emulator_env, tmp_path):
    files = make_tree(tmp_path / "src")
    dst = make_root(scheme) + "copy/"
    assert mcbridge("cp", f"{tmp_path}/src/", dst, "--chunk-size", "5MiB", "-q", env=emulator_env,
                    state_dir=tmp_path).returncode == 0
    ok = mcbridge("verify", dst, "--json", env=emulator_env, state_dir=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert json.loads(ok.stdout)["checked"] == len(files)
    assert mcbridge("verify", dst, "--deep", env=emulator_env, state_dir=tmp_path).returncode == 0

    victim = "small/007.json"
    overwrite(emulator_for, dst + victim, bytes(b ^ 1 for b in files[victim]))  # same size, other bytes
    big = "big/weights.bin"
    overwrite(emulator_for, dst + big, files[big][:-1] + bytes([files[big][-1] ^ 0xFF]))
    bad = mcbridge("verify", dst, env=emulator_env, state_dir=tmp_path)
    assert bad.returncode == 1
    named = {line.split()[1].rstrip(":") for line in bad.stdout.splitlines() if line.startswith("mismatched")}
    assert named == {victim, big}, bad.stdout
    deep = mcbridge("verify", dst, "--deep", "--json", env=emulator_env, state_dir=tmp_path)
    assert deep.returncode == 1
    assert {m["path"] for m in json.loads(deep.stdout)["mismatched"]} == {victim, big}


def test_verify_lists_missing_and_extra(tmp_path, emulator_env):
    make_tree(tmp_path / "src")
    dst = tmp_path / "dst"
    assert mcbridge("cp", f"{tmp_path}/src/", str(dst), "-q", env=emulator_env, state_dir=tmp_path).returncode == 0
    (dst / "a/b/c/deep.txt").unlink()
    (dst / "stray.bin").write_bytes(b"?")
    r = mcbridge("verify", str(dst), "--json", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 1
    report = json.loads(r.stdout)
    assert report["missing"] == ["a/b/c/deep.txt"] and report["extra"] == ["stray.bin"]


def _moto_part_puts(moto, key: str) -> int:
    """UploadPart requests for ``key`` in moto's request log so far."""
    text = moto.log_path.read_text(errors="replace")
    return sum(1 for line in text.splitlines() if "PUT /" in line and key in line and "partNumber=" in line)


def _journaled_parts(state: Path) -> int:
    return len(journaled_keys(state, "part:"))


@pytest.mark.parametrize("scheme", ["s3", "gs", "az", "local"])
def test_killed_copy_resumes_without_resending_finished_parts(scheme, moto, make_root, emulator_env, tmp_path):
    size, part = 48 * MiB, 5 * MiB
    nparts = -(-size // part)
    src = tmp_path / "ckpt.bin"
    src.write_bytes(os.urandom(size))
    dst = make_root(scheme) + "models/"
    state = tmp_path / "state"
    env = dict(emulator_env, MCBRIDGE_STATE_DIR=str(state), XDG_CONFIG_HOME="/nonexistent")
    args = [*MCBRIDGE, "cp", str(src), dst, "--chunk-size", "5MiB", "-j", "2", "-q"]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    journaled = 0
    while time.monotonic() < deadline and proc.poll() is None:
        journaled = _journaled_parts(state)
        if journaled >= 3:
            break
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    journaled = _journaled_parts(state)
    assert 3 <= journaled < nparts, "the copy must be killed mid-way"
    key = "models/ckpt.bin"
    assert mcbridge("verify", dst, env=emulator_env, state_dir=state).returncode == 1  # no manifest yet
    assert read_tree(dst, settings_for(emulator_env)) == {}, "nothing visible before completion"

    # The second run reaches moto through a proxy of its own, which counts exactly its requests:
    # a part the killed run had in flight may still reach moto's log at any time after the kill.
    with FaultProxy(moto.endpoint) as second:
        env = proxied_environment(emulator_env, {"s3": second})
        r = mcbridge("cp", str(src), dst, "--chunk-size", "5MiB", "-j", "2", "--json", env=env, state_dir=state)
    assert r.returncode == 0, r.stderr
    # No part journaled by the first run is sent again: the second run skips at least that many
    # (the smallest such set includes the short last part).
    last = size - (nparts - 1) * part
    assert json.loads(r.stdout)["bytes_skipped"] >= (journaled - 1) * part + last
    assert read_tree(dst, settings_for(emulator_env))["ckpt.bin"] == src.read_bytes()
    assert mcbridge("verify", dst, env=emulator_env, state_dir=state).returncode == 0
    if scheme == "s3":
        second_run = sum(1 for line, _done in second.log if line.startswith(f"PUT /{parse(dst).bucket}/{key}?")
                         and "partNumber=" in line)
        # The killed run's parts that moto has logged by now: the journaled ones were answered, so
        # logged, before the kill; a part in flight then may be logged yet or not.
        first_run = _moto_part_puts(moto, key) - second_run
        assert first_run >= journaled and first_run + second_run >= nparts, "moto's log must show every part"
        # every part the journal lacks, and none it has
        assert second_run == nparts - journaled, (first_run, second_run, journaled)
        resent = first_run + second_run - nparts
        assert resent <= 2, f"only parts in flight (at most -j 2) may be sent twice; {resent} were"
        assert moto.client().list_multipart_uploads(Bucket=parse(dst).bucket).get("Uploads", []) == []


@pytest.mark.parametrize("scheme", ["local", "s3", "gs", "az"])
def test_sync_sends_only_the_changed_file_and_repairs(scheme, make_root, emulator_for, emulator_env, tmp_path):
    files = make_tree(tmp_path / "src")
    src, dst = f"{tmp_path}/src/", make_root(scheme) + "mirror/"
    first = mcbridge("sync", src, dst, "--chunk-size", "5MiB", "--json", env=emulator_env, state_dir=tmp_path)
    assert first.returncode == 0, first.stderr
    assert sorted(json.loads(first.stdout)["sent"]) == sorted(files)

    (tmp_path / "src/a/b/c/deep.txt").write_bytes(b"DEEP\n")  # same size, new content
    overwrite(emulator_for, dst + "small/003.json", b"corrupted!" * 1)
    (tmp_path / "src/small/019.json").unlink()
    r = mcbridge("sync", src, dst, "--chunk-size", "5MiB", "--delete", "--json", env=emulator_env,
                 state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert sorted(out["sent"]) == ["a/b/c/deep.txt", "small/003.json"]
    assert out["reasons"]["changed"] == 1 and out["reasons"]["repaired"] == 1
    assert out["deleted"] == ["small/019.json"]
    expected = {rel: data for rel, data in files.items() if rel != "small/019.json"}
    expected["a/b/c/deep.txt"] = b"DEEP\n"
    assert read_tree(dst, settings_for(emulator_env)) == expected
    assert mcbridge("verify", dst, env=emulator_env, state_dir=tmp_path).returncode == 0
    again = mcbridge("sync", src, dst, "--json", env=emulator_env, state_dir=tmp_path)
    assert json.loads(again.stdout)["sent"] == []


def test_dry_run_moves_nothing(tmp_path, emulator_env):
    make_tree(tmp_path / "src")
    r = mcbridge("cp", f"{tmp_path}/src/", f"{tmp_path}/dst/", "--dry-run", "--chunk-size", "5MiB",
                 env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "big/weights.bin" in r.stdout and "3 parts" in r.stdout and "would copy 24 files" in r.stdout
    assert not (tmp_path / "dst").exists()


@pytest.mark.parametrize("scheme", ["s3", "gs", "az", "local"])
def test_abandoned_uploads_are_listed_and_aborted(scheme, make_root, emulator_env, tmp_path):
    root = make_root(scheme)
    settings = settings_for(emulator_env)
    store = get_store(parse(root), settings)
    loc = parse(root + "abandoned/ckpt.bin")
    upload = store.begin_upload(loc, 6 * MiB)
    store.upload_part(loc, upload, 1, 0, b"x" * (5 * MiB), crc_hex(crc32c(b"x" * (5 * MiB))))
    listed = mcbridge("uploads", root, "--json", env=emulator_env, state_dir=tmp_path)
    assert [r["object"] for r in json.loads(listed.stdout)] == [str(loc)]
    assert mcbridge("uploads", root, "--abort", env=emulator_env, state_dir=tmp_path).returncode == 0
    assert list(store.list_uploads(parse(root))) == []


def test_local_files_are_durable_before_the_journal_and_the_manifest_name_them(tmp_path, monkeypatch):
    """Whole files written to a local destination skip their own fsyncs and are settled in
    batches: each is settled before it is journaled, all before the manifest is written, and a
    failed settle journals nothing and leaves no manifest."""
    from bridge import ops
    from bridge.pipeline import execute as executor
    from bridge.errors import BridgeError, TransferFailed
    from bridge.stores.local import LocalStore

    src = tmp_path / "src"
    for i in range(7):
        (src / f"d{i % 2}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 2}" / f"f{i}.bin").write_bytes(os.urandom(1000 + i))
    # One unit at a time, so that the batches are 3, 3 and the last 1.
    settings = settings_for({"MCBRIDGE_STATE_DIR": str(tmp_path / "state")}, concurrency=1)
    events: list[tuple[str, object]] = []
    settle, write = LocalStore.settle, manifests.append

    def settling(self, locations):
        locations = list(locations)
        settle(self, locations)
        events.append(("settled", sorted(loc.name for loc in locations)))

    monkeypatch.setattr(executor, "SETTLE_FILES", 3)
    monkeypatch.setattr(LocalStore, "settle", settling)
    monkeypatch.setattr(manifests, "append", lambda *a, **k: (events.append(("manifest", None)), write(*a, **k))[1])
    from bridge.journal import FileJournal
    put, put_many = FileJournal.put, FileJournal.put_many
    monkeypatch.setattr(FileJournal, "put", lambda self, key, value: (
        events.append(("journal", key.rpartition("/")[2])) if key.startswith("file:") else None, put(self, key, value))[1])
    monkeypatch.setattr(FileJournal, "put_many", lambda self, records: (
        events.extend(("journal", key.rpartition("/")[2]) for key, _value in records if key.startswith("file:")),
        put_many(self, records))[1])
    ops.copy(f"{src}/", f"{tmp_path}/out/", settings)
    settled: set[str] = set()
    for kind, what in events:
        if kind == "settled":
            settled |= set(what)
        elif kind == "journal":
            assert what in settled, f"{what} journaled before it was settled"
        else:
            assert settled == {f"f{i}.bin" for i in range(7)}
    assert [kind for kind, _ in events].count("manifest") == 1 and events[-1][0] == "manifest"
    assert [len(what) for kind, what in events if kind == "settled"] == [3, 3, 1]
    assert sorted(what for kind, what in events if kind == "journal") == [f"f{i}.bin" for i in range(7)]

    def failing(self, locations):
        raise BridgeError("settle failed: I/O error")

    monkeypatch.setattr(LocalStore, "settle", failing)
    events.clear()
    with pytest.raises(TransferFailed, match="settle failed"):
        ops.copy(f"{src}/", f"{tmp_path}/out2/", settings)
    assert not any(kind in ("journal", "manifest") for kind, _ in events)
    assert not (tmp_path / "out2" / "_bridge" / "log").exists()


def test_a_manifest_entry_as_a_dict_is_asdicts():
    """FileEntry.to_dict (the fast path, one per file) stays what dataclasses.asdict gives."""
    from dataclasses import asdict, fields
    from bridge.manifest import FileEntry
    entry = FileEntry("a/b", 5, "crc", "sha", 3, ["p1", "p2"], ["crc32c"], {"md5": "m"}, {"etag": "e"},
                      ["s1", "s2"], "note")
    assert entry.to_dict() == asdict(entry)
    assert list(entry.to_dict()) == [f.name for f in fields(FileEntry)]
    copied = entry.to_dict()
    copied["parts"].append("p3")
    assert entry.parts == ["p1", "p2"]


def test_a_plan_as_a_dict_is_asdicts_and_reads_back():
    """Plan.to_dict (a service job's plan goes to Redis as JSON) keeps every field asdict keeps:
    a field left out (the adopted entries once) is lost on the service, silently."""
    from dataclasses import asdict, fields
    from bridge.contracts import FilePlan
    from bridge.pipeline.plan import Plan
    plan = Plan("s3://a/", "s3://b/", None, [FilePlan("x", 3, source_id={"etag": "e"}, attrs={"h": 1},
                                                      carry={"crc32c": "c"})],
                ["gone"], "key", "direct", "why", [{"rel": "x"}], 64, 4, [{"path": "y", "size": 1}])
    assert list(plan.to_dict()) == [f.name for f in fields(Plan)]
    assert plan.to_dict()["files"] == [asdict(f) for f in plan.files]
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))).to_dict() == plan.to_dict()


def test_the_file_journal_takes_many_records_in_one_transaction_and_reads_them_back_in_key_order(tmp_path):
    from bridge.journal import FileJournal
    journal = FileJournal(tmp_path / "j.db")
    journal.put("file:a", {"size": 1})
    journal.put_many([(f"file:{i}", {"size": i}) for i in range(3000)] + [("file:a", {"size": 2})])
    journal.put("part:a:1", {"size": 9})
    journal.close()
    again = FileJournal(tmp_path / "j.db")
    assert again.get("file:a") == {"size": 2} and again.get("file:2999") == {"size": 2999}
    keys = [k for k, _v in again.items("file:")]
    assert len(keys) == 3001 and keys == sorted(keys) and "part:a:1" not in keys
    assert list(again.items("part:")) == [("part:a:1", {"size": 9})] and again.count("file:") == 3001
    again.remove()
    assert list(tmp_path.iterdir()) == []


def test_a_journal_left_as_json_lines_by_an_earlier_version_is_taken_over(tmp_path):
    from bridge.journal import FileJournal
    (tmp_path / "j.jsonl").write_bytes(b'{"k":"file:a","v":{"size":1}}\n{"k":"file:a","v":{"size":2}}\n'
                                       b'{"k":"file:cut","v":')   # a kill in the middle of a write
    journal = FileJournal(tmp_path / "j.db")
    assert journal.get("file:a") == {"size": 2} and journal.get("file:cut") is None
    assert not (tmp_path / "j.jsonl").exists()
    journal.close()
