"""The harness itself: emulators start, hold objects, reset, stop, and leave os.environ alone."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.emulators import (
    SCHEMES,
    STORES,
    Emulator,
    EmulatorError,
    FakeGCS,
    Redis,
    free_port,
    redis_answers_ping,
    unique_name,
)


def test_moto_holds_an_object(moto):
    bucket = unique_name()
    moto.create_bucket(bucket)
    s3 = moto.client()
    s3.put_object(Bucket=bucket, Key="dir/hello.txt", Body=b"hello s3")
    assert s3.get_object(Bucket=bucket, Key="dir/hello.txt")["Body"].read() == b"hello s3"


def test_fake_gcs_holds_an_object(fake_gcs):
    bucket = unique_name()
    fake_gcs.create_bucket(bucket)
    blob = fake_gcs.client().bucket(bucket).blob("dir/hello.txt")
    blob.upload_from_string(b"hello gcs")
    assert blob.download_as_bytes() == b"hello gcs"


def test_azurite_holds_an_object(azurite):
    container = unique_name()
    azurite.create_bucket(container)
    blob = azurite.client().get_blob_client(container, "dir/hello.txt")
    blob.upload_blob(b"hello azure")
    assert blob.download_blob().readall() == b"hello azure"


@pytest.mark.parametrize("scheme", sorted(STORES))
def test_reset_empties_an_emulator(scheme):
    # A private emulator: resetting the session's one would wipe other tests' buckets.
    with STORES[scheme]() as emulator:
        emulator.create_bucket(unique_name())
        emulator.create_bucket(unique_name())
        assert len(emulator.list_buckets()) == 2
        emulator.reset()
        assert emulator.list_buckets() == []


@pytest.mark.parametrize("scheme", SCHEMES)
def test_make_root_gives_a_new_root_each_call(make_root, emulator_for, scheme):
    first, second = make_root(scheme), make_root(scheme)
    assert first != second
    assert first.endswith("/") and second.endswith("/")
    if scheme == "local":
        assert os.path.isabs(first) and os.listdir(first) == []
    else:
        bucket = first.removeprefix(f"{scheme}://").rstrip("/")
        assert bucket in emulator_for(scheme).list_buckets()


def test_store_root_runs_once_per_scheme(store_root, request):
    scheme = request.node.callspec.params["store_root"]
    assert store_root.startswith("/" if scheme == "local" else f"{scheme}://")


# Plain SDK clients and fsspec filesystems with no arguments: everything comes from the environment.
_WRITE_FROM_ENVIRONMENT = textwrap.dedent(
    """
    import os, sys
    import boto3, fsspec
    from azure.storage.blob import BlobServiceClient
    from google.cloud import storage

    s3_bucket, gs_bucket, az_container = sys.argv[1:]
    boto3.client("s3").put_object(Bucket=s3_bucket, Key="sdk", Body=b"s3")
    storage.Client().bucket(gs_bucket).blob("sdk").upload_from_string(b"gs")
    azure = BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"])
    azure.get_blob_client(az_container, "sdk").upload_blob(b"az")
    for protocol, bucket in [("s3", s3_bucket), ("gs", gs_bucket)]:
        fsspec.filesystem(protocol).pipe(f"{bucket}/fsspec", protocol.encode())
    # bridge's Azure store uses the SDK itself (adlfs hides block staging), so no adlfs here.
    azure.get_blob_client(az_container, "fsspec").upload_blob(b"az")
    """
)


def test_emulator_env_points_subprocesses_at_the_emulators(emulator_env, moto, fake_gcs, azurite):
    variables = ["AWS_ENDPOINT_URL", "STORAGE_EMULATOR_HOST", "AZURE_STORAGE_CONNECTION_STRING"]
    assert emulator_env is not os.environ
    assert all(os.environ.get(name) != emulator_env[name] for name in variables)

    buckets = {}
    for emulator in (moto, fake_gcs, azurite):
        buckets[emulator.scheme] = unique_name()
        emulator.create_bucket(buckets[emulator.scheme])
    subprocess.run(
        [sys.executable, "-c", _WRITE_FROM_ENVIRONMENT, *(buckets[s] for s in ("s3", "gs", "az"))],
        env=emulator_env,
        check=True,
        timeout=120,
    )

    for key in ("sdk", "fsspec"):
        s3_object = moto.client().get_object(Bucket=buckets["s3"], Key=key)
        assert s3_object["Body"].read() == b"s3"
        assert fake_gcs.client().bucket(buckets["gs"]).blob(key).download_as_bytes() == b"gs"
        az_blob = azurite.client().get_blob_client(buckets["az"], key)
        assert az_blob.download_blob().readall() == b"az"


def test_env_for_holds_only_the_emulators_asked_for(env_for, fake_gcs):
    env = env_for("gs")
    assert env["STORAGE_EMULATOR_HOST"] == fake_gcs.endpoint
    assert env.get("AWS_ENDPOINT_URL") == os.environ.get("AWS_ENDPOINT_URL")
    with pytest.raises(ValueError, match="no emulator for 'ftp'"):
        env_for("ftp")


def _answers_ping(url: str) -> bool:
    address = urlsplit(url)
    return redis_answers_ping(address.hostname, address.port)


def test_redis_url_answers_ping(redis_url):
    assert _answers_ping(redis_url)


def test_redis_starts_its_own_server_where_none_answers():
    # The CI machine has a Redis on 6379; a port where none listens takes the other branch.
    with Redis(db=3, port=free_port()) as redis:
        assert redis.server is not None
        assert redis.url == redis.server.url(3)
        assert _answers_ping(redis.url)
        server_pid = redis.server.pid
    with pytest.raises(ProcessLookupError):
        os.kill(server_pid, 0)


def test_stop_ends_the_process_and_removes_its_files():
    server = FakeGCS().start()
    pid, workdir = server.pid, server.workdir
    server.stop()
    server.stop()
    assert not workdir.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_launch_removes_work_dirs_of_killed_owners():
    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan = Path(tempfile.mkdtemp(prefix=f"bridge-emulator-{dead.pid}-moto-"))
    mine = Path(tempfile.mkdtemp(prefix=f"bridge-emulator-{os.getpid()}-moto-"))
    with FakeGCS():
        assert not orphan.exists()
        assert mine.exists()
    mine.rmdir()


class _Crashes(Emulator):
    name = "crashes"

    def command(self):
        return [sys.executable, "-c", "print('unknown flag --blobPort'); raise SystemExit(2)"]

    def is_ready(self):
        return False


class _Hangs(_Crashes):
    name = "hangs"

    def command(self):
        loading = "print('still loading', flush=True); import time; time.sleep(60)"
        return [sys.executable, "-c", loading]


def test_a_start_that_fails_says_why():
    with pytest.raises(EmulatorError, match="exited with code 2") as crash:
        _Crashes().start()
    assert "unknown flag --blobPort" in str(crash.value)

    hangs = _Hangs(startup_timeout=0.5)
    with pytest.raises(EmulatorError, match="did not answer within") as timeout:
        hangs.start()
    assert "still loading" in str(timeout.value)
    assert hangs.pid is None and hangs.workdir is None
