"""Copies bridge did not move (a server-side copy, Storage Transfer, DataSync) are recorded from
what the stores computed, never from what a client wrote: an object no checksum both stores
computed proves is committed with a note beginning "unproven:", and the default ``verify`` lists
it as unproven (not verified) until ``verify --deep`` reads it. The transfer doubles move the
bytes between moto, fake-gcs-server and Azurite; ``after_write`` is a third party acting on each
object between the service's write and bridge's commit."""

from __future__ import annotations

import hashlib
import os

import pytest

from bridge import ops
from bridge.hashing import crc32c, crc_hex
from bridge.manifest import read as read_manifest
from bridge.routes import datasync, sts
from bridge.stores import get_store
from bridge.urls import parse
from tests.doubles.datasync import DataSyncDouble
from tests.doubles.sts import StorageTransferDouble
from tests.helpers import mcbridge, read_tree, settings_for
from tests.test_native_cli import datasync_double, sts_double  # noqa: F401  (fixtures)
from tests.test_native_sts import FILES, fill
from bridge.pipeline import verify as verifying


@pytest.fixture
def env(env_for, sts_double, datasync_double, fake_gcs):
    env = env_for("s3", "gs", "az")
    env.update(MCBRIDGE_STS_ENDPOINT=sts_double.endpoint, AWS_ENDPOINT_URL_DATASYNC=datasync_double.endpoint,
               MCBRIDGE_POLL_INTERVAL="0.05", MCBRIDGE_DATASYNC_S3_ROLE_ARN="arn:aws:iam::111122223333:role/dsync",
               MCBRIDGE_GCS_HMAC_ACCESS_ID="GOOG1EXAMPLE", MCBRIDGE_GCS_HMAC_SECRET="hmac-secret",
               MCBRIDGE_GCS_XML_ENDPOINT=fake_gcs.endpoint)
    return env


def crc(data: bytes) -> str:
    return crc_hex(crc32c(data))


def test_a_datasync_copy_into_azure_rewritten_before_commit_is_not_called_verified(make_root, env, datasync_double):
    """S3 -> Azure: Azure computes no checksum of a block blob, so nothing proves what DataSync
    left. A third party replaces each blob after DataSync wrote it, same size, with the source's
    CRC32C forged into its metadata: the commit cannot tell, so the record says unproven, the
    default verify does not pass it, and --deep finds the other bytes."""
    settings = settings_for(env)
    src, dst = make_root("s3"), make_root("az") + "copy/"
    fill(src, settings, FILES)
    dst_root = parse(dst)
    blobs = get_store(dst_root, settings).client.get_container_client(dst_root.bucket)

    def third_party(rel: str) -> None:
        other = bytes(b ^ 0xFF for b in FILES[rel])
        blobs.get_blob_client(dst_root.key + rel).upload_blob(other, overwrite=True,
                                                             metadata={"bridge_crc32c": crc(FILES[rel])})
    datasync_double.after_write = third_party
    datasync.copy(src, dst, settings)

    manifest = read_manifest(get_store(dst_root, settings), dst_root)
    assert all(e.unproven and "Azure" in e.note and e.reported == {} for e in manifest.files.values()), [(e.note, e.reported) for e in manifest.files.values()]
    report = verifying.verify(dst, settings)
    assert not report["ok"] and report["counts"]["unproven"] + report["counts"]["mismatched"] == len(FILES), report
    changed = [p for p, data in FILES.items() if data]      # the empty object cannot be other bytes
    deep = verifying.verify(dst, settings, deep=True)
    assert sorted(row["path"] for row in deep["mismatched"]) == sorted(changed), deep


def test_storage_transfer_from_azure_is_unproven_until_read(make_root, env, tmp_path):
    """Azure -> GCS: GCS computes the copy's CRC32C and MD5, but the Azure source's only CRC32C is
    the one bridge wrote into its metadata, which any client can write: the copy is unproven, the
    default verify says so (exit 1, one line per object) and --deep reads it and passes it."""
    settings = settings_for(env)
    src, dst = make_root("az"), make_root("gs") + "copy/"
    fill(src, settings, FILES)
    summary = sts.copy(src, dst, settings)
    assert summary["ok"] and read_tree(dst, settings) == FILES
    assert sorted(summary["route"]["unproven"]) == sorted(FILES)     # said in the output too
    manifest = read_manifest(get_store(parse(dst), settings), parse(dst))
    assert all(e.note.startswith("unproven:") for e in manifest.files.values())
    assert all(set(e.reported) == {"crc32c", "md5"} for e in manifest.files.values())   # GCS's own
    report = verifying.verify(dst, settings)
    assert not report["ok"] and sorted(r["path"] for r in report["unproven"]) == sorted(FILES), report
    r = mcbridge("verify", dst, env=env, state_dir=tmp_path)
    assert r.returncode == 1 and r.stdout.count("unproven    ") == len(FILES), r.stdout + r.stderr
    assert "3 unproven" in r.stdout
    assert verifying.verify(dst, settings, deep=True)["ok"]
    again = mcbridge("cp", src, make_root("gs"), "--route", "sts", env=env, state_dir=tmp_path)
    assert again.returncode == 0 and "3 files unproven: copied by the sts route" in again.stdout, again.stdout


def test_storage_transfer_from_s3_is_proven_by_the_checksum_both_stores_computed(make_root, env):
    settings = settings_for(env)
    src, dst = make_root("s3"), make_root("gs") + "copy/"
    fill(src, settings, FILES)
    sts.copy(src, dst, settings)
    manifest = read_manifest(get_store(parse(dst), settings), parse(dst))
    assert not any(e.unproven for e in manifest.files.values())
    assert all("computed by both stores is equal" in e.note for e in manifest.files.values())
    assert verifying.verify(dst, settings)["ok"]


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_a_server_copy_records_what_the_stores_computed_not_forged_metadata(scheme, make_root, env, moto,
                                                                           fake_gcs):
    """A source written by another client with bridge's metadata keys forged (a CRC32C and a
    SHA-256 of other bytes): the server copy is proven by the MD5 (or CRC32C) both stores
    computed, and neither forged value enters the record, so --deep passes the true copy."""
    settings = settings_for(env)
    src, dst = make_root(scheme), make_root(scheme) + "copy/"
    data, other = os.urandom(2000), os.urandom(2000)
    forged = {"bridge_crc32c": crc(other), "bridge_sha256": hashlib.sha256(other).hexdigest()}
    loc = parse(src).join("model.bin")
    if scheme == "s3":
        moto.client().put_object(Bucket=loc.bucket, Key=loc.key, Body=data, Metadata=forged)
    else:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage
        client = storage.Client(project="test", credentials=AnonymousCredentials(),
                                client_options={"api_endpoint": fake_gcs.endpoint})
        blob = client.bucket(loc.bucket).blob(loc.key)
        blob.metadata = forged
        blob.upload_from_string(data)
    summary = ops.copy(src + "model.bin", dst, settings, route="server")
    assert summary["route"]["name"] == "server" and summary["route"]["fallbacks"] == {}, summary
    (entry,) = read_manifest(get_store(parse(dst), settings), parse(dst)).files.values()
    assert entry.crc32c == crc(data) and entry.sha256 == "" and not entry.unproven, entry
    assert forged["bridge_crc32c"] not in entry.reported.values() and "computed by both stores" in entry.note
    assert verifying.verify(dst, settings)["ok"]
    assert verifying.verify(dst, settings, deep=True)["ok"]
