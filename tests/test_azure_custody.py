"""Azure custody: what proves an Azure blob holds its source's bytes when bridge did not move them.

Azure keeps no checksum of a block blob that it computed itself: its metadata (``bridge_crc32c``)
and a block list's Content-MD5 are whatever a client wrote (Azure and Azurite store a Put Block
List's Content-MD5 without checking it; Set Blob Properties writes one on any blob). So:

- adoption and ``check`` never take an Azure blob as equal on those claims (forged here with the
  real SDK against Azurite); they re-send it, or ``--adopt deep`` / ``--download`` reads both;
- a Put Block From URL copy pins the source version it planned (``x-ms-source-if-match``) and
  sends the source's own MD5 with a block that is the whole object, which Azure checks (the
  double in front of Azurite checks both, as Azure does); a source rewritten while its blocks are
  pulled is refused, never committed as a mix of two versions;
- an az->az server copy above the synchronous limit stages its blocks uncommitted and commits
  them in one Put Block List: a cancel leaves the blob that stood there as it was.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os

import pytest

from bridge.hashing import crc32c, crc_hex
from bridge.urls import parse
from tests.helpers import mcbridge

pytestmark = pytest.mark.timeout(300)


def _forge(az, url: str, data: bytes, *, crc: str | None = None, md5: bytes | None = None) -> None:
    """A blob of ``data`` committed by Put Block List, with the given ``bridge_crc32c`` metadata or
    Content-MD5 (neither checked by the service)."""
    from azure.storage.blob import BlobBlock, ContentSettings
    loc = parse(url)
    blob = az.get_blob_client(loc.bucket, loc.key)
    blob.stage_block("YmxvY2sx", data)
    blob.commit_block_list([BlobBlock("YmxvY2sx")], metadata={"bridge_crc32c": crc} if crc else None,
                           content_settings=ContentSettings(content_md5=bytearray(md5)) if md5 else None)


def _forged_destination(az, dst: str, files: dict[str, bytes]) -> None:
    """Each file's name at ``dst`` holds other bytes of its size: ``crc.bin`` claims the source's
    CRC32C in its metadata, ``md5.bin`` the source's MD5 as its Content-MD5."""
    other = {rel: bytes(b ^ 0x5A for b in data) for rel, data in files.items()}
    _forge(az, dst + "crc.bin", other["crc.bin"], crc=crc_hex(crc32c(files["crc.bin"])))
    _forge(az, dst + "md5.bin", other["md5.bin"], md5=hashlib.md5(files["md5.bin"]).digest())


def _blob(az, url: str) -> bytes:
    loc = parse(url)
    return az.get_blob_client(loc.bucket, loc.key).download_blob().readall()


@pytest.fixture
def forged(make_root, emulator_for):
    """A GCS source (which reports crc32c and md5Hash it computed) and an Azure destination whose
    blobs claim the source's checksums over other bytes."""
    files = {"crc.bin": os.urandom(5000), "md5.bin": os.urandom(7000)}
    src, dst = make_root("gs"), make_root("az")
    bucket = emulator_for("gs").client().bucket(parse(src).bucket)
    for rel, data in files.items():
        bucket.blob(rel).upload_from_string(data)
    az = emulator_for("az").client()
    _forged_destination(az, dst, files)
    return src, dst, files, az


def test_check_does_not_call_a_forged_azure_checksum_equal(forged, emulator_env, tmp_path):
    src, dst, files, az = forged
    r = mcbridge("check", src, dst, "--json", env=emulator_env, state_dir=tmp_path)
    report = json.loads(r.stdout)
    assert r.returncode == 1 and report["equal"] == 0, report
    assert sorted(row["path"] for row in report["unproven"] + report["differ"]) == sorted(files), report
    r = mcbridge("check", src, dst, "--download", "--json", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 1 and sorted(row["path"] for row in json.loads(r.stdout)["differ"]) == sorted(files)


def test_cp_skip_existing_sends_again_over_a_forged_azure_checksum(forged, emulator_env, tmp_path):
    src, dst, files, az = forged
    r = mcbridge("cp", src, dst, "--skip-existing", "--json", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["files"] == 2, r.stdout
    assert {rel: _blob(az, dst + rel) for rel in files} == files
    assert mcbridge("verify", dst, "--deep", env=emulator_env, state_dir=tmp_path).returncode == 0


def test_sync_does_not_adopt_a_forged_azure_checksum(forged, emulator_env, tmp_path):
    src, dst, files, az = forged
    r = mcbridge("sync", src, dst, "--json", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert sorted(summary["sent"]) == sorted(files) and summary["reasons"].get("adopted", 0) == 0, summary
    assert {rel: _blob(az, dst + rel) for rel in files} == files
    assert mcbridge("verify", dst, "--deep", env=emulator_env, state_dir=tmp_path).returncode == 0


def test_adopt_deep_still_takes_an_azure_copy_whose_bytes_are_equal(make_root, emulator_for, emulator_env, tmp_path):
    """What the forged claims no longer give, reading both does: the same bytes, committed by
    Put Block List with no checksum at all, are adopted by ``--adopt deep``."""
    data = os.urandom(6000)
    src, dst = make_root("gs"), make_root("az")
    emulator_for("gs").client().bucket(parse(src).bucket).blob("same.bin").upload_from_string(data)
    az = emulator_for("az").client()
    _forge(az, dst + "same.bin", data)
    r = mcbridge("cp", src, dst, "--adopt", "deep", "--json", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["files"] == 0, r.stdout + r.stderr
    assert mcbridge("verify", dst, "--deep", env=emulator_env, state_dir=tmp_path).returncode == 0
