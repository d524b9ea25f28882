"""What a service job writes besides the bytes, and what it takes over, as ``cp`` and ``sync`` in
process: ``submit cp|sync`` carry ``--storage-class``, ``--kms-key``, ``--metadata``,
``--content-type``, ``--sha256`` and ``--adopt``/``--skip-existing`` in the job's spec; a ``submit
sync`` onto a copy another tool made commits the objects it found equal (it does not send them),
so the record names every file and ``verify`` passes."""

from __future__ import annotations

import json
import os

from bridge import manifest as manifests
from bridge.stores import get_store
from bridge.urls import parse
from tests.helpers import settings_for
from tests.test_workers_service import service  # noqa: F401  (the fixture)


def test_a_service_sync_onto_another_tools_copy_commits_what_it_adopted(service, moto, make_root, tmp_path):  # noqa: F811
    src = tmp_path / "src"
    files = {f"d{i % 3}/{i:03d}.bin": os.urandom(100 + i) for i in range(40)}
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    dst = make_root("s3") + "mirror/"
    loc = parse(dst)
    s3 = moto.client()
    changed = "d1/004.bin"
    for rel, data in files.items():   # another tool's copy: plain PUTs, one of them stale
        s3.put_object(Bucket=loc.bucket, Key=loc.key + rel, Body=data if rel != changed else b"old")
    service.worker("w1", concurrency=1)
    result = service.cli("submit", "sync", f"{src}/", dst, "--wait", "--json")
    assert result.returncode == 0, result.stderr
    store = get_store(loc, settings_for(service.env))
    entries = manifests.read(store, loc).files
    assert set(entries) == set(files)
    assert entries["d0/000.bin"].adopted == "md5" and not entries[changed].adopted
    verify = service.cli("verify", dst, "--deep", "--json")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert json.loads(verify.stdout)["checked"] == len(files)


def test_a_service_copy_writes_the_class_headers_and_digest_asked_and_skips_what_is_there(service, moto, make_root,  # noqa: F811
                                                                                          tmp_path):
    src = tmp_path / "src"
    files = {f"f{i}.json": os.urandom(300 + i) for i in range(6)}
    src.mkdir()
    for rel, data in files.items():
        (src / rel).write_bytes(data)
    dst = make_root("s3") + "out/"
    loc = parse(dst)
    service.worker("w1", concurrency=1)
    result = service.cli("submit", "cp", f"{src}/", dst, "--storage-class", "STANDARD_IA", "--metadata", "owner=ops",
                         "--content-type", "application/x-mine", "--sha256", "--wait", "--json")
    assert result.returncode == 0, result.stderr
    s3 = moto.client()
    head = s3.head_object(Bucket=loc.bucket, Key=loc.key + "f0.json")
    assert head["StorageClass"] == "STANDARD_IA" and head["ContentType"] == "application/x-mine"
    assert head["Metadata"]["owner"] == "ops"
    store = get_store(loc, settings_for(service.env))
    entries = manifests.read(store, loc).files
    import hashlib
    assert entries["f0.json"].sha256 == hashlib.sha256(files["f0.json"]).hexdigest()

    # --skip-existing onto a copy another tool made: only what differs is sent
    other = make_root("s3") + "mirror/"
    theirs = parse(other)
    for rel, data in files.items():
        s3.put_object(Bucket=theirs.bucket, Key=theirs.key + rel, Body=data if rel != "f3.json" else b"x")
    result = service.cli("submit", "cp", f"{src}/", other, "--skip-existing", "--wait", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["progress"]["files_total"] == 1   # f3.json alone
    entries = manifests.read(store, theirs).files
    assert set(entries) == set(files) and not entries["f3.json"].adopted and entries["f0.json"].adopted == "md5"

    # a class the destination's store has not: refused before anything is queued, in one line
    bad = service.cli("submit", "cp", f"{src}/", f"{tmp_path}/local/", "--storage-class", "GLACIER")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert "--storage-class" in bad.stderr and "Traceback" not in bad.stderr
