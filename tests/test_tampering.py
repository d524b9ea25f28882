"""Objects rewritten behind bridge's back, keeping what the cheap check reads.

Each rewrite is made with the provider's own SDK (or the filesystem) and keeps the size, bridge's
metadata, the CRC32C the store reports (the new bytes are forged to the old CRC32C, which four
free bytes can reach), on Azure the committed block sizes, on local disks the mtime. Only the
object's identity (ETag, generation, version, inode times) gives it away; the cheap ``verify``
must then prove the bytes by rehashing, and ``sync`` must repair them.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import pytest

from bridge import manifest as manifests
from bridge.verdicts import judge
from bridge.hashing import crc32c, crc_hex
from bridge.stores import get_store
from bridge.urls import parse
from tests.helpers import mcbridge, settings_for

MiB = 1024 * 1024
SCHEMES = ["local", "s3", "gs", "az"]
PART = 5 * MiB   # the smallest part S3 and GCS take; Azure and local take it too


def forge_crc32c(data: bytes, target: str) -> bytes:
    """``data`` with its last four bytes replaced so that its CRC32C is ``target``. CRC32C is
    affine in the bits of the message: 32 free bits reach any value (Gaussian elimination)."""
    head = data[:-4]
    state = crc32c(head)
    base = crc32c(b"\0\0\0\0", state)
    basis: dict[int, tuple[int, int]] = {}   # pivot bit -> (CRC difference, window bits giving it)
    for bit in range(32):
        value, mask = crc32c((1 << bit).to_bytes(4, "little"), state) ^ base, 1 << bit
        for pivot in sorted(basis, reverse=True):
            if value >> pivot & 1:
                value, mask = value ^ basis[pivot][0], mask ^ basis[pivot][1]
        basis[value.bit_length() - 1] = (value, mask)
    want, window = base ^ int(target, 16), 0
    for pivot in sorted(basis, reverse=True):
        if want >> pivot & 1:
            want, window = want ^ basis[pivot][0], window ^ basis[pivot][1]
    forged = head + window.to_bytes(4, "little")
    assert want == 0 and crc_hex(crc32c(forged)) == target and len(forged) == len(data)
    return forged


def test_forge_reaches_the_crc():
    data = os.urandom(1000)
    other = forge_crc32c(os.urandom(1000), crc_hex(crc32c(data)))
    assert other != data and crc_hex(crc32c(other)) == crc_hex(crc32c(data))


def rewrite(emulator_for, url: str, data: bytes, *, part_sizes: list[int] | None = None,
            new_version_of_same_bytes: bool = False) -> None:
    """Replace the object at ``url`` by ``data`` with the provider's SDK, keeping its metadata
    (bridge_crc32c, bridge_sha256), its reported CRC32C and on Azure its block sizes."""
    loc = parse(url)
    data = bytes(data)   # a store's read may give a bytearray, which the Azure SDK takes for an iterable
    if loc.is_local:
        path = loc.local_path
        before = os.stat(path)
        with open(path, "r+b") as f:   # in place: same inode
            f.write(data)
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    elif loc.scheme == "s3":
        s3 = emulator_for("s3").client()
        metadata = s3.head_object(Bucket=loc.bucket, Key=loc.key)["Metadata"]
        b64 = base64.b64encode(crc32c(data).to_bytes(4, "big")).decode()
        if new_version_of_same_bytes:
            # One PUT of the same bytes would give the same ETag (their MD5): a multipart upload
            # of them is another version of the object with another ETag.
            up = s3.create_multipart_upload(Bucket=loc.bucket, Key=loc.key, Metadata=metadata)
            part = s3.upload_part(Bucket=loc.bucket, Key=loc.key, UploadId=up["UploadId"], PartNumber=1,
                                  Body=data)
            s3.complete_multipart_upload(Bucket=loc.bucket, Key=loc.key, UploadId=up["UploadId"],
                                         MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
        else:
            s3.put_object(Bucket=loc.bucket, Key=loc.key, Body=data, Metadata=metadata,
                          ChecksumAlgorithm="CRC32C", ChecksumCRC32C=b64)
    elif loc.scheme == "gs":
        bucket = emulator_for("gs").client().bucket(loc.bucket)
        blob = bucket.blob(loc.key)
        blob.metadata = bucket.get_blob(loc.key).metadata
        blob.upload_from_string(data)
    else:
        blob = emulator_for("az").client().get_blob_client(loc.bucket, loc.key)
        metadata = blob.get_blob_properties().metadata
        if part_sizes:
            ids, offset = [], 0
            for n, size in enumerate(part_sizes):
                block_id = base64.b64encode(f"tamper-{n:06d}".encode()).decode()
                blob.stage_block(block_id, data[offset:offset + size])
                ids.append(block_id)
                offset += size
            blob.commit_block_list(ids, metadata=metadata)
        else:
            blob.upload_blob(data, overwrite=True, metadata=metadata)


@pytest.fixture
def copied(make_root, emulator_env, tmp_path):
    """A source tree with a small file and a three-part file, copied to a new root on ``scheme``."""

    def make(scheme: str) -> tuple[str, str, dict[str, bytes]]:
        files = {"small.txt": os.urandom(5000), "big/weights.bin": os.urandom(2 * PART + 4321)}
        src = tmp_path / "src"
        for rel, data in files.items():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_bytes(data)
        dst = make_root(scheme) + "copy/"
        r = mcbridge("cp", f"{src}/", dst, "--chunk-size", "5MiB", "-q", env=emulator_env,
                     state_dir=tmp_path / "state")
        assert r.returncode == 0, r.stderr
        return f"{src}/", dst, files

    return make


def entries(emulator_env, dst: str) -> dict[str, manifests.FileEntry]:
    store = get_store(parse(dst), settings_for(emulator_env))
    return manifests.read(store, parse(dst)).files


@pytest.mark.parametrize("scheme", SCHEMES)
def test_rewrite_keeping_metadata_and_checksum_is_caught_and_repaired(scheme, copied, emulator_for,
                                                                      emulator_env, tmp_path):
    src, dst, files = copied(scheme)
    before = entries(emulator_env, dst)
    tampered = {}
    for rel, data in files.items():
        forged = forge_crc32c(os.urandom(len(data)), before[rel].crc32c)
        rewrite(emulator_for, dst + rel, forged,
                part_sizes=before[rel].part_sizes() if before[rel].part_size else None)
        tampered[rel] = forged

    # What the cheap check used to read still vouches for the new bytes: size, reported CRC32C,
    # bridge's metadata, block sizes (and on local disks, CRC32C from the disk).
    store = get_store(parse(dst), settings_for(emulator_env))
    present = dict(store.walk(parse(dst)))
    for rel, entry in before.items():
        assert judge(store, present[rel], dataclasses.replace(entry, identity={})).problem is None, rel

    r = mcbridge("verify", dst, env=emulator_env, state_dir=tmp_path / "state")
    assert r.returncode == 1, r.stdout + r.stderr
    for rel in files:
        line = next(line for line in r.stdout.splitlines() if line.startswith(f"mismatched  {rel}:"))
        assert "rewritten since the manifest was written" in line and "SHA-256" in line, line

    r = mcbridge("sync", src, dst, "--chunk-size", "5MiB", "--json", env=emulator_env,
                 state_dir=tmp_path / "state")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert sorted(summary["sent"]) == sorted(files) and summary["reasons"]["repaired"] == len(files)

    r = mcbridge("verify", dst, "--json", env=emulator_env, state_dir=tmp_path / "state")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["ok"] and report["mismatched"] == [] and report["rehashed"] == []
    assert {rel: store.read(present[rel].location) for rel in files} == files


@pytest.mark.parametrize("scheme", SCHEMES)
def test_same_bytes_under_a_new_identity_are_proven_by_rehash(scheme, copied, emulator_for, emulator_env,
                                                              tmp_path):
    src, dst, files = copied(scheme)
    before = entries(emulator_env, dst)
    rewrite(emulator_for, dst + "small.txt", files["small.txt"], new_version_of_same_bytes=True)
    store = get_store(parse(dst), settings_for(emulator_env))
    assert store.info(parse(dst + "small.txt")).identity != before["small.txt"].identity

    r = mcbridge("verify", dst, env=emulator_env, state_dir=tmp_path / "state")
    assert r.returncode == 0, r.stdout + r.stderr
    line = next(line for line in r.stdout.splitlines() if line.startswith("rehashed    small.txt:"))
    assert "bytes proven equal by rehash" in line
    assert "1 rewritten with equal bytes" in r.stdout and "weights.bin" not in r.stdout

    r = mcbridge("sync", src, dst, "--json", env=emulator_env, state_dir=tmp_path / "state")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["sent"] == []


@pytest.mark.parametrize("scheme", SCHEMES)
def test_manifest_records_provenance_and_identity(scheme, copied, emulator_env):
    _src, dst, files = copied(scheme)
    store = get_store(parse(dst), settings_for(emulator_env))
    present = dict(store.walk(parse(dst)))
    expected_identity = {"local": {"inode", "size", "mtime_ns", "ctime_ns"}, "s3": {"etag"},
                         "gs": {"generation"}, "az": {"etag", "last_modified"}}[scheme]
    for rel, entry in entries(emulator_env, dst).items():
        # a file copied in parts: its parts' SHA-256s and their tree (the whole SHA-256 only with --sha256)
        assert entry.computed == (["crc32c", "part_sha256", "sha256_tree"] if entry.part_size else ["crc32c", "sha256"])
        assert expected_identity <= entry.identity.keys(), (rel, entry.identity)
        # what a listing shows is the version committed: nothing to rehash
        assert judge(store, present[rel], entry).rehashed is None
        if scheme in ("s3", "gs"):
            assert entry.reported["crc32c"] == entry.crc32c
        if scheme == "local":
            assert entry.reported == {}
        if scheme == "az" and not entry.part_size:
            assert "md5" in entry.reported   # Azure's Content-MD5 of a one-request upload
        if scheme == "az" and entry.part_size:
            assert entry.reported == {}      # a committed block list has no whole-blob hash


def test_manifest_without_identity_is_read_and_checked_as_before(copied, emulator_for, emulator_env, tmp_path):
    """A version-1 manifest (one _bridge/manifest.json, before the commit log) written before
    identities: read, verified by what the store reports."""
    _src, dst, files = copied("az")
    store = get_store(parse(dst), settings_for(emulator_env))
    merged = manifests.read(store, parse(dst))
    doc = {"format": manifests.FORMAT, "version": 1, "bridge_version": "0.1.0", "created": "2026-11-29T15:00:00Z",
           "source": merged.source, "destination": merged.destination,
           "files": [e.to_dict() for e in merged.files.values()]}
    for e in doc["files"]:
        for key in ("computed", "reported", "identity", "source_id"):
            e.pop(key, None)
    old = json.dumps(doc).encode()
    manifests.remove(store, parse(dst))
    store.put(parse(dst).join(manifests.MANIFEST), old, crc32c=crc_hex(crc32c(old)), metadata={})
    rewrite(emulator_for, dst + "small.txt", files["small.txt"])
    r = mcbridge("verify", dst, "--json", env=emulator_env, state_dir=tmp_path / "state")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["ok"] and report["rehashed"] == [] and report["checked"] == len(files)
    entry = manifests.read(store, parse(dst)).files["small.txt"]
    assert entry.computed == ["crc32c", "sha256"] and entry.identity == {} and entry.reported == {}


@pytest.mark.parametrize("scheme", ["s3", "az"])
def test_packed_shards_carry_identity_and_a_rewritten_shard_is_caught(scheme, make_root, emulator_for,
                                                                      emulator_env, tmp_path):
    """pack joins shard, list and index entries into the manifest: each has its identity too, and
    unpack's manifest likewise."""
    src = tmp_path / "corpus"
    for i in range(60):
        (src / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 3}/f{i:03d}.bin").write_bytes(os.urandom(3000 + i))
    dst = make_root(scheme) + "shards/"
    r = mcbridge("pack", f"{src}/", dst, "--shard-size", "64KiB", "-q", env=emulator_env,
                 state_dir=tmp_path / "state")
    assert r.returncode == 0, r.stderr
    packed = entries(emulator_env, dst)
    assert len(packed) >= 4 and all(e.identity.get("etag") and e.computed == ["crc32c", "sha256"]
                                    for e in packed.values()), packed
    shard = sorted(p for p in packed if p.endswith(".tar"))[0]
    original = get_store(parse(dst), settings_for(emulator_env)).read(parse(dst + shard))
    rewrite(emulator_for, dst + shard, forge_crc32c(os.urandom(len(original)), packed[shard].crc32c))
    r = mcbridge("verify", dst, env=emulator_env, state_dir=tmp_path / "state")
    assert r.returncode == 1 and f"mismatched  {shard}: rewritten since the manifest was written" in r.stdout, \
        r.stdout
    rewrite(emulator_for, dst + shard, original, new_version_of_same_bytes=True)
    r = mcbridge("verify", dst, env=emulator_env, state_dir=tmp_path / "state")
    assert r.returncode == 0 and f"rehashed    {shard}:" in r.stdout, r.stdout + r.stderr

    out = tmp_path / "out"
    r = mcbridge("unpack", dst, f"{out}/", "-q", env=emulator_env, state_dir=tmp_path / "state")
    assert r.returncode == 0, r.stderr
    unpacked = entries(emulator_env, f"{out}/")
    assert len(unpacked) == 60 and all({"inode", "ctime_ns"} <= e.identity.keys() for e in unpacked.values())
