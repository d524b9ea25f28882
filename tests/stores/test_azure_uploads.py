"""Azure: uploads left by killed copies (uncommitted blocks) are listed and discarded, and a
committed blob of the same name keeps its bytes and metadata."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

from azure.storage.blob import BlobBlock

from bridge.stores import get_store
from bridge.urls import parse
from tests.helpers import MCBRIDGE, mcbridge, settings_for
from tests.test_resume import _env, _kill_after

MiB = 1024 * 1024


def test_uploads_of_killed_copies_are_listed_and_aborted(azurite, make_root, emulator_env, tmp_path):
    root = make_root("az")
    container = parse(root).bucket
    client = azurite.client()
    put_blob = client.get_blob_client(container, "dir/put-blob.bin")       # one Put Blob: no block list
    put_blob.upload_blob(b"kept as it was\n", metadata={"owner": "someone else"})
    blocks = client.get_blob_client(container, "dir/blocks.bin")            # another tool's block list
    ids = [base64.b64encode(f"other-{n}".encode()).decode() for n in range(2)]
    for n, block_id in enumerate(ids):
        blocks.stage_block(block_id, f"block {n}\n".encode())
    blocks.commit_block_list([BlobBlock(block_id=i) for i in ids], metadata={"owner": "someone else"})
    before = {name: (client.get_blob_client(container, name).download_blob().readall(),
                     client.get_blob_client(container, name).get_blob_properties().metadata)
              for name in ("dir/put-blob.bin", "dir/blocks.bin")}

    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(8 * MiB))
    for name in ("put-blob.bin", "blocks.bin", "fresh.bin"):
        state = tmp_path / f"state-{name}"  # a journal each, so that each run is killed mid-way
        args = [*MCBRIDGE, "cp", str(src), f"{root}dir/{name}", "--chunk-size", "1MiB", "-j", "2", "-q"]
        assert 2 <= _kill_after(args, _env(emulator_env, state), state, 2) < 8, "killed mid-way"

    listed = mcbridge("uploads", root, "--json", env=emulator_env, state_dir=state)
    assert listed.returncode == 0, listed.stderr
    objects = sorted(r["object"] for r in json.loads(listed.stdout))
    assert objects == [f"{root}dir/{n}" for n in ("blocks.bin", "fresh.bin", "put-blob.bin")], objects

    aborted = mcbridge("uploads", root, "--abort", "--json", env=emulator_env, state_dir=state)
    assert aborted.returncode == 0, aborted.stderr
    store = get_store(parse(root), settings_for(emulator_env))
    assert list(store.list_uploads(parse(root))) == []
    for name, (data, metadata) in before.items():
        blob = client.get_blob_client(container, name)
        assert blob.download_blob().readall() == data and blob.get_blob_properties().metadata == metadata
        assert blob.get_block_list("uncommitted")[1] == []
    names = [b.name for b in client.get_container_client(container).list_blobs(include=["uncommittedblobs"])]
    assert sorted(names) == ["dir/blocks.bin", "dir/put-blob.bin"], "the blob that only had blocks is gone"
