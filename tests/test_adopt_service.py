"""A service job adopts as the in-process one does: a ``submit sync`` onto a copy another tool
made commits the objects it found equal (it does not send them), so the record names every file
and ``verify`` passes."""

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
