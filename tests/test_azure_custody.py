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
from bridge.pipeline import verify as verifying

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
    # Read when adopted, its version recorded: while the listing shows that version, the default
    # verify passes it on the listing, neither reading it again nor calling it rewritten.
    r = mcbridge("verify", dst, "--json", env=emulator_env, state_dir=tmp_path)
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["counts"]["rehashed"] == 0 and not report["unproven"], report


# -- Put Block From URL ------------------------------------------------------------------------

MiB = 1024 * 1024


def test_a_source_rewritten_during_a_from_url_copy_is_refused_not_mixed(moto, azure_from_url, make_root,
                                                                        emulator_env, tmp_path):
    """A 12 MiB S3 object (a multipart upload: no MD5 to check) pulled in three 4 MiB blocks one at
    a time; the double rewrites the source with other bytes of its size once the first block is
    fetched. The next block's fetch no longer matches the ETag planned: the copy is refused and
    nothing is committed (before, the blob was committed from two versions and the default
    verify passed it by the CRC32C bridge wrote into its metadata)."""
    from bridge import ops
    from bridge.errors import BridgeError
    from tests.helpers import settings_for
    env = {**emulator_env, "AZURE_STORAGE_CONNECTION_STRING": azure_from_url.connection_string()}
    settings = settings_for(env, chunk_size=4 * MiB, concurrency=1)
    src, dst = make_root("s3"), make_root("az")
    first, second = os.urandom(12 * MiB), os.urandom(12 * MiB)
    (tmp_path / "w.bin").write_bytes(first)
    ops.copy(str(tmp_path / "w.bin"), src, settings, state_dir=tmp_path / "s1")
    rewritten = []

    def rewrite(fetches: int) -> None:
        if not rewritten:
            rewritten.append(fetches)
            moto.client().put_object(Bucket=parse(src).bucket, Key="w.bin", Body=second)

    azure_from_url.on_fetched = rewrite
    try:
        with pytest.raises(BridgeError) as failed:
            ops.copy(src, dst, settings, route="from-url", state_dir=tmp_path / "s2")
    finally:
        azure_from_url.on_fetched = None
    assert rewritten and "changed since the copy was planned" in str(failed.value), failed.value
    container = _client(azure_from_url).get_container_client(parse(dst).bucket)
    assert [b.name for b in container.list_blobs(include=["uncommittedblobs"])] == []   # nothing committed or staged


def _client(double):
    from azure.storage.blob import BlobServiceClient
    return BlobServiceClient.from_connection_string(double.connection_string(), retry_total=0)


class _Source:
    """A loopback HTTP source for Azure to fetch: ``/data`` serves ranges with an ETag, ``/moved``
    redirects to it, ``/whole`` ignores Range and answers 200 with every byte."""

    def __init__(self, data: bytes):
        import http.server
        import threading
        body, etag = data, '"v1"'

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path == "/moved":
                    self.send_response(302)
                    self.send_header("Location", "/data")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.headers.get("If-Match") not in (None, etag):
                    self.send_response(412)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                rng = self.headers.get("Range")
                part, status = body, 200
                if rng and self.path == "/data":
                    start, end = (int(x) for x in rng.removeprefix("bytes=").split("-"))
                    part, status = body[start:end + 1], 206
                self.send_response(status)
                self.send_header("ETag", etag)
                self.send_header("Content-Length", str(len(part)))
                self.end_headers()
                self.wfile.write(part)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_from_url_double_checks_what_azure_checks(azure_from_url, make_root):
    """The double refuses what Azure refuses: a redirect, a source that ignores Range, a source
    ETag other than the one pinned, an MD5 or a CRC64 unlike the bytes; and stages the block when
    all hold."""
    from azure.core.exceptions import HttpResponseError
    from azure.storage.blob._generated.models import SourceModifiedAccessConditions
    from azure.storage.blob._shared.validation import calculate_crc64_bytes
    data = os.urandom(3000)
    source = _Source(data)
    blob = _client(azure_from_url).get_blob_client(parse(make_root("az")).bucket, "b.bin")

    def refused(url: str, **kw) -> str:
        with pytest.raises(HttpResponseError) as err:
            blob.stage_block_from_url("YmxvY2sx", url, source_offset=1000, source_length=1000, **kw)
        return err.value.error_code

    try:
        assert refused(source.url + "/moved") == "CannotVerifyCopySource"
        assert refused(source.url + "/whole") == "InvalidSourceBlobRange"
        assert refused(source.url + "/data", source_modified_access_conditions=SourceModifiedAccessConditions(
            source_if_match='"v0"')) == "SourceConditionNotMet"
        assert refused(source.url + "/data", source_content_md5=hashlib.md5(data).digest()) == "Md5Mismatch"
        assert refused(source.url + "/data", source_contentcrc64=calculate_crc64_bytes(data)) == "Crc64Mismatch"
        part = data[1000:2000]
        blob.stage_block_from_url("YmxvY2sx", source.url + "/data", source_offset=1000, source_length=1000,
                                  source_content_md5=hashlib.md5(part).digest(),
                                  source_contentcrc64=calculate_crc64_bytes(part),
                                  source_modified_access_conditions=SourceModifiedAccessConditions(
                                      source_if_match='"v1"'))
        from azure.storage.blob import BlobBlock
        blob.commit_block_list([BlobBlock("YmxvY2sx")])
        assert blob.download_blob().readall() == part
    finally:
        source.close()


# -- az -> az above the synchronous copy limit -----------------------------------------------------

class _CancelOnceStarted:
    """A cancel (bridge.retry.stopping takes anything with ``is_set``) seen once the copy has
    begun at the destination: a Copy Blob sent, or two blocks staged from the source's URL."""

    def __init__(self, double):
        self.double = double
        self.copies, self.blocks = double.counts["copies_forwarded"], double.counts["blocks_from_url"]

    def is_set(self) -> bool:
        counts = self.double.counts
        return counts["copies_forwarded"] > self.copies or counts["blocks_from_url"] >= self.blocks + 2


@pytest.fixture
def big_over_verified(azurite, emulator_env, make_root, tmp_path):
    """A 257 MiB blob at ``src`` (written a MiB at a time), and at ``dst`` a verified copy of an
    older version of it: (src, dst, the destination's blob client, its bytes, its ETag)."""
    from bridge import ops
    from tests.helpers import settings_for
    direct = settings_for(emulator_env)
    src, dst = make_root("az"), make_root("az")
    old = os.urandom(MiB)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "model.bin").write_bytes(old)
    ops.copy(f"{tmp_path / 'old'}/", dst, direct, state_dir=tmp_path / "s0")
    assert verifying.verify(dst, direct)["ok"]
    chunk = os.urandom(MiB)
    (tmp_path / "new").mkdir()
    with open(tmp_path / "new" / "model.bin", "wb") as out:
        for i in range(257):
            out.write(i.to_bytes(4, "big") + chunk[4:])
    ops.copy(f"{tmp_path / 'new'}/", src, direct, state_dir=tmp_path / "s1")
    blob = azurite.client().get_blob_client(parse(dst).bucket, "model.bin")
    return src, dst, blob, old, blob.get_blob_properties().etag


def _as_it_was(blob, old: bytes, etag: str, dst: str, env: dict) -> None:
    from bridge import ops
    from tests.helpers import settings_for
    props = blob.get_blob_properties()
    assert (props.size, props.etag) == (len(old), etag), (props.size, props.etag, etag)
    assert blob.download_blob().readall() == old
    assert verifying.verify(dst, settings_for(env))["ok"]


def test_a_cancelled_azure_copy_above_256_mib_leaves_the_verified_blob_as_it_was(big_over_verified, azure_from_url,
                                                                                 emulator_env, tmp_path):
    """The 257 MiB blob copied inside one account over the verified older version, the job
    cancelled once the copy has begun at Azure. Before, Copy Blob (asynchronous above 256 MiB)
    then Abort Copy left a zero-length blob with full metadata under the name; now the blocks are
    staged uncommitted and only a Put Block List puts them in place, so the cancel leaves the old
    blob, its ETag and its record as they were."""
    from bridge import ops
    from bridge.errors import BridgeError
    from bridge.retry import stopping
    from tests.helpers import settings_for
    src, dst, blob, old, etag = big_over_verified
    through = settings_for({**emulator_env, "AZURE_STORAGE_CONNECTION_STRING": azure_from_url.connection_string()},
                           concurrency=2)
    # (Azurite ends a same-account Copy Blob at once, so there the Abort Copy came too late and the
    # new bytes stood unrecorded where the verified ones were; on Azure it finds the copy pending.)
    with stopping(_CancelOnceStarted(azure_from_url)), pytest.raises(BridgeError) as cancelled:
        ops.copy(src, dst, through, route="server", state_dir=tmp_path / "s2")
    assert "cancelled" in str(cancelled.value), cancelled.value
    _as_it_was(blob, old, etag, dst, emulator_env)


def test_a_killed_azure_copy_above_256_mib_leaves_the_verified_blob_as_it_was(big_over_verified, azure_from_url,
                                                                              emulator_env, tmp_path):
    """``mcbridge cp`` of the same copy killed with SIGKILL once its first block is staged: the
    blocks staged stay uncommitted, invisible to readers, and the old blob stands as it was."""
    import signal
    import subprocess
    import time
    from tests.helpers import MCBRIDGE, NO_CONFIG
    src, dst, blob, old, etag = big_over_verified
    env = {**{k: v for k, v in emulator_env.items() if k != "MCBRIDGE_CONFIG"},
           "AZURE_STORAGE_CONNECTION_STRING": azure_from_url.connection_string(),
           "MCBRIDGE_STATE_DIR": str(tmp_path / "state"), "XDG_CONFIG_HOME": NO_CONFIG}
    started = _CancelOnceStarted(azure_from_url)
    run = subprocess.Popen([*MCBRIDGE, "cp", src, dst, "--route", "server", "-q"], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not started.is_set() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert run.poll() is None, run.stderr.read()   # killed mid-copy, not after it
        run.send_signal(signal.SIGKILL)
    finally:
        run.wait(30)
    _as_it_was(blob, old, etag, dst, emulator_env)


def test_an_azure_copy_in_blocks_whose_source_is_rewritten_fails_and_leaves_the_old_blob(
        azure_from_url, azurite, emulator_env, make_root, tmp_path, monkeypatch):
    """The same copy in blocks (its threshold and block size lowered to 1 MiB), the source blob
    rewritten once its first block is fetched: the next block no longer matches the source's ETag
    as read, the copy fails, and the blob that stood at the destination is left as it was."""
    import bridge.stores.azure as azure
    from bridge import ops
    from bridge.errors import IntegrityError
    from bridge.stores import get_store
    from tests.helpers import settings_for
    monkeypatch.setattr(azure, "SYNC_COPY_MAX", MiB)
    monkeypatch.setattr(azure, "COPY_BLOCK", MiB)
    direct = settings_for(emulator_env)
    src, dst = make_root("az"), make_root("az")
    store = get_store(parse(src), settings_for(
        {**emulator_env, "AZURE_STORAGE_CONNECTION_STRING": azure_from_url.connection_string()}, concurrency=1))
    old, first = os.urandom(MiB // 2), os.urandom(4 * MiB)
    for root, data in ((dst, old), (src, first)):
        (tmp_path / "f.bin").write_bytes(data)
        ops.copy(str(tmp_path / "f.bin"), root, direct, state_dir=tmp_path / "s")
    src_blob = azurite.client().get_blob_client(parse(src).bucket, "f.bin")
    dst_blob = azurite.client().get_blob_client(parse(dst).bucket, "f.bin")
    before = dst_blob.get_blob_properties().etag
    azure_from_url.on_fetched = lambda _n: src_blob.upload_blob(os.urandom(4 * MiB), overwrite=True)
    try:
        for name in ("f.bin", "new.bin"):   # over a standing blob, and to a name with none
            with pytest.raises(IntegrityError, match="changed since the copy was planned"):
                store.copy_object(parse(src + "f.bin"), parse(dst + name), size=4 * MiB)
    finally:
        azure_from_url.on_fetched = None
    assert dst_blob.get_blob_properties().etag == before and dst_blob.download_blob().readall() == old
    assert verifying.verify(dst, direct)["ok"]
    container = azurite.client().get_container_client(parse(dst).bucket)
    assert "new.bin" not in [b.name for b in container.list_blobs(include=["uncommittedblobs"])]
