"""Bad input: one clear line on stderr, no traceback; exit 2 for usage, 1 for run-time failures."""

from __future__ import annotations

import os

import pytest

from tests.emulators import AZURITE_ACCOUNT, AZURITE_KEY, free_port
from tests.helpers import mcbridge

# An environment with no credentials of any kind (and no metadata-server lookups).
BARE = {"PATH": os.environ["PATH"], "HOME": "/nonexistent-home", "LANG": "C.UTF-8"}


def one_line_error(r, code: int, *needles: str) -> None:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert lines[0].startswith("mcbridge: error: ")
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture
def src_file(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text("x")
    return str(path)


@pytest.mark.parametrize("url,needle", [
    ("foo://bucket/key", "unknown scheme 'foo'"),
    ("s3:///key", "missing bucket"),
    ("gs://", "missing bucket"),
    ("az://UPPER/key", "not a valid az bucket name"),
    ("s3://b/k", "not a valid s3 bucket name"),
    ("s3://bucket//key", "empty path segment"),
    ("file://host/path", "file URLs take an absolute path"),
    ("://nothing", "malformed URL"),
])
def test_malformed_urls_exit_2(url, needle, src_file, tmp_path):
    one_line_error(mcbridge("cp", src_file, url, env=BARE, state_dir=tmp_path), 2, needle)


def test_usage_errors_exit_2(tmp_path, src_file):
    one_line_error(mcbridge("cp", src_file, env=BARE, state_dir=tmp_path), 2, "Missing argument")
    one_line_error(mcbridge("cp", "--chunk-size", "5XB", src_file, "/tmp/x", env=BARE, state_dir=tmp_path), 2,
                   "invalid size")
    one_line_error(mcbridge("cp", "-j", "0", src_file, "/tmp/x", env=BARE, state_dir=tmp_path), 2, "concurrency")


def test_missing_local_source(tmp_path):
    one_line_error(mcbridge("cp", str(tmp_path / "nope"), str(tmp_path / "out"), env=BARE, state_dir=tmp_path),
                   1, "no such object, prefix or directory")


@pytest.mark.parametrize("scheme", ["s3", "gs", "az"])
def test_missing_bucket(scheme, src_file, env_for, tmp_path):
    r = mcbridge("cp", src_file, f"{scheme}://no-such-bucket-here/f.txt", env=env_for(scheme), state_dir=tmp_path)
    one_line_error(r, 1, "no-such-bucket-here", "does not exist")


@pytest.mark.parametrize("scheme", ["s3", "gs", "az"])
def test_missing_source_object(scheme, make_root, env_for, tmp_path):
    root = make_root(scheme)
    r = mcbridge("cp", root + "not/there.bin", str(tmp_path / "out"), env=env_for(scheme), state_dir=tmp_path)
    one_line_error(r, 1, "not/there.bin", "no such object")


@pytest.mark.parametrize("scheme,needle", [
    ("s3", "no AWS credentials"), ("gs", "no Google credentials"), ("az", "no Azure credentials")])
def test_missing_credentials(scheme, needle, src_file, tmp_path):
    one_line_error(mcbridge("cp", src_file, f"{scheme}://some-bucket/f.txt", env=BARE, state_dir=tmp_path),
                   1, needle)


def _closed_port_env(scheme: str) -> dict[str, str]:
    port = free_port()  # nothing listens there
    if scheme == "s3":
        return {**BARE, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "k",
                "AWS_SECRET_ACCESS_KEY": "s", "AWS_DEFAULT_REGION": "us-east-1"}
    if scheme == "gs":
        return {**BARE, "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}"}
    return {**BARE, "AZURE_STORAGE_CONNECTION_STRING":
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};"}


@pytest.mark.parametrize("scheme", ["s3", "gs", "az"])
def test_unreachable_endpoint(scheme, src_file, tmp_path):
    r = mcbridge("cp", src_file, f"{scheme}://some-bucket/f.txt", env=_closed_port_env(scheme), state_dir=tmp_path,
                 timeout=120)
    one_line_error(r, 1, "cannot reach the", "endpoint")


def test_verify_without_manifest(tmp_path):
    (tmp_path / "d").mkdir()
    one_line_error(mcbridge("verify", str(tmp_path / "d"), env=BARE, state_dir=tmp_path), 1, "no manifest")
