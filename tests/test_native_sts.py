"""The sts route against the Storage Transfer double (tests/doubles/sts.py), which the real
google-cloud-storage-transfer client reaches over REST and which moves the bytes between moto,
Azurite and fake-gcs-server: requests, polling, cancel, errors, exact data, no secret shown."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from functools import partial

import pytest

from bridge import ops
from bridge.config import SecretStr
from bridge.errors import JobCancelled, PermissionDenied, RouteFailed, RouteUnavailable
from bridge.manifest import read as read_manifest
from bridge.routes import sts
from bridge.progress import Progress
from bridge.stores import get_store
from bridge.urls import parse
from tests.doubles.sts import StorageTransferDouble
from tests.helpers import read_tree, settings_for
from bridge.pipeline import verify as verifying

SECRET = "s3cr3t-Never-Shown-0123456789"


@pytest.fixture
def double(moto, fake_gcs, azurite):
    with StorageTransferDouble(gcs_endpoint=fake_gcs.endpoint, s3_endpoint=moto.endpoint,
                               azure_endpoint=f"{azurite.endpoint}/{{account}}") as d:
        yield d


@pytest.fixture
def settings(double, env_for):
    env = env_for("s3", "gs", "az")
    env.update(MCBRIDGE_STS_ENDPOINT=double.endpoint, MCBRIDGE_POLL_INTERVAL="0.05",
               AWS_SECRET_ACCESS_KEY=SECRET)
    return settings_for(env)


def fill(url: str, settings, files: dict[str, bytes]) -> None:
    root = parse(url)
    store = get_store(root, settings)
    from bridge.hashing import crc32c, crc_hex
    for rel, data in files.items():
        store.put(root.join(rel), data, crc32c=crc_hex(crc32c(data)), metadata={})


FILES = {"a.bin": os.urandom(3000), "sub/b.txt": b"hello\n" * 100, "sub/deeper/c": b""}


def assert_committed(dst: str, settings, files: dict[str, bytes]) -> None:
    assert read_tree(dst, settings) == files
    manifest = read_manifest(get_store(parse(dst), settings), parse(dst))
    assert set(manifest.files) == set(files)
    azure = parse(manifest.source).scheme == "az"
    for entry in manifest.files.values():
        assert entry.computed == [] and entry.sha256 == "" and entry.reported["crc32c"] == entry.crc32c
        assert "sts" in entry.note and entry.unproven == azure   # an Azure source's checksums are a client's
    report = verifying.verify(dst, settings)
    assert report["ok"] != azure and report["counts"]["unproven"] == (len(files) if azure else 0), report
    assert verifying.verify(dst, settings, deep=True)["ok"]


@pytest.mark.parametrize("scheme", ["s3", "az", "gs"])
def test_a_prefix_arrives_exact_and_verifies_deep(scheme, make_root, settings, double):
    src, dst = make_root(scheme) + "in/", make_root("gs") + "out/"
    fill(src, settings, FILES)
    progress = Progress()
    summary = sts.copy(src, dst, settings, progress=progress)
    assert summary["route"]["name"] == "sts" and summary["route"]["bytes_through_bridge"] == 0
    assert summary["files"] == 3 and progress.files_done == 3 and progress.bytes_done == sum(map(len, FILES.values()))
    assert_committed(dst, settings, FILES)
    # The requests carried what the service documents as required, and the credential went there only.
    (job,) = double.server.bodies("/v1/transferJobs")[:1]
    assert job["projectId"] == "test" and job["status"] in ("ENABLED", 1)
    assert job["transferSpec"]["gcsDataSink"] == {"bucketName": parse(dst).bucket, "path": "out/"}
    if scheme == "s3":
        assert job["transferSpec"]["awsS3DataSource"]["awsAccessKey"]["secretAccessKey"] == SECRET
    elif scheme == "az":
        assert "sig=" in job["transferSpec"]["azureBlobStorageDataSource"]["azureCredentials"]["sasToken"]
    else:
        assert job["transferSpec"]["gcsDataSource"] == {"bucketName": parse(src).bucket, "path": "in/"}
    assert [r["projectId"] for r in double.server.calls(":run")] == ["test"]
    assert all(j["status"] == "DELETED" for j in double.jobs.values())   # tidied up
    shown = json.dumps(summary)
    assert SECRET not in shown and "sig=" not in shown and "sasToken" not in shown


def test_one_object_is_named_by_a_transfer_manifest(make_root, settings, double):
    src, dst = make_root("s3"), make_root("gs") + "x/"
    fill(src, settings, {**FILES, "sub/b.txt.1": b"not me"})
    sts.copy(src + "sub/b.txt", dst, settings)
    assert read_tree(dst, settings) == {"b.txt": FILES["sub/b.txt"]}
    spec = double.server.bodies("/v1/transferJobs")[0]["transferSpec"]
    assert spec["awsS3DataSource"]["path"] == "sub/" and "objectConditions" not in spec
    assert spec["transferManifest"]["location"].startswith(f"gs://{parse(dst).bucket}/x/_bridge/sts/")
    with pytest.raises(RouteUnavailable, match="keeps object names"):
        sts.copy(src + "sub/b.txt", dst + "renamed.txt", settings)


def test_cancel_mid_way_cancels_the_operation(make_root, settings, double):
    files = {f"f{i:02d}": os.urandom(100) for i in range(12)}
    src, dst = make_root("s3"), make_root("gs")
    fill(src, settings, files)
    double.delay = 0.2
    stop, progress, outcome = threading.Event(), Progress(), {}

    def run():
        try:
            sts.copy(src, dst, settings, progress=progress, stop=stop)
        except JobCancelled as exc:
            outcome["error"] = exc
    worker = threading.Thread(target=run)
    worker.start()
    while progress.files_done < 2 and worker.is_alive():
        time.sleep(0.02)
    stop.set()
    worker.join(30)
    assert "was cancelled at the service (it reports cancelled" in str(outcome["error"])
    (_meta, remote), = double.operations.values()
    assert remote.state == "cancelled" and 2 <= remote.objects_copied < 12
    assert len(double.server.calls(":cancel")) == 1
    assert read_manifest(get_store(parse(dst), settings), parse(dst)) is None   # nothing claims completeness


def test_a_failed_operation_is_one_line_without_the_sas(make_root, settings, double, azurite):
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas
    src, dst = make_root("az"), make_root("gs")
    fill(src, settings, FILES)
    # A SAS that may read but not list: the service cannot enumerate the source.
    sas = generate_container_sas("devstoreaccount1", parse(src).bucket, account_key=azurite.connection_string.split(
        "AccountKey=")[1].split(";")[0], permission=ContainerSasPermissions(read=True),
        expiry=time.time() + 3600)
    narrow = settings.model_copy(update={"azure": settings.azure.model_copy(update={"sas_token": SecretStr(sas)})})
    with pytest.raises(RouteFailed) as caught:
        sts.copy(src, dst, narrow)
    line = str(caught.value)
    assert "failed" in line and "PERMISSION_DENIED" in line and "\n" not in line
    assert sas.split("sig=")[1].split("&")[0] not in line and not caught.value.moved_data
    assert read_tree(dst, settings) == {}


def test_refusals_before_any_data(make_root, settings, double):
    src, dst = make_root("s3"), make_root("gs")
    fill(src, settings, FILES)
    double.deny_projects.add("test")
    with pytest.raises(PermissionDenied, match="storagetransfer.user") as caught:
        sts.copy(src, dst, settings)
    assert caught.value.moved_data is False and SECRET not in str(caught.value)
    double.deny_projects.clear()
    double.quota_exhausted = True
    with pytest.raises(RouteFailed, match="429.*Quota exceeded") as caught:
        sts.copy(src, dst, settings)
    assert caught.value.moved_data is False
    no_project = settings.model_copy(update={"gcs": settings.gcs.model_copy(update={"project": None})})
    with pytest.raises(RouteUnavailable, match="native.sts_project"):
        sts.copy(src, dst, no_project)
    with pytest.raises(RouteUnavailable, match="does not serve gs->s3"):
        sts.copy(dst, src, settings)
    assert read_tree(dst, settings) == {}


def test_the_double_refuses_requests_without_required_fields(double):
    from google.api_core import exceptions
    from google.cloud import storage_transfer
    client = sts.client_for(settings_for({"MCBRIDGE_STS_ENDPOINT": double.endpoint}))
    sink = {"gcs_data_sink": {"bucket_name": "b"}}
    for job, missing in [({"status": 1, "transfer_spec": sink}, "projectId"),
                         ({"project_id": "p", "transfer_spec": sink}, "status"),
                         ({"project_id": "p", "status": 1, "transfer_spec": {
                             "aws_s3_data_source": {"bucket_name": "s"}, **sink}}, "accessKeyId"),
                         ({"project_id": "p", "status": 1, "transfer_spec": {
                             "aws_s3_data_source": {"bucket_name": "s", "path": "noslash", "role_arn":
                                                    "arn:aws:iam::123456789012:role/r"}, **sink}}, "path")]:
        with pytest.raises(exceptions.BadRequest, match=missing):
            client.create_transfer_job({"transfer_job": storage_transfer.TransferJob(job)})


def test_an_http_url_list(make_root, settings, double, tmp_path):
    files = {"data/one.bin": os.urandom(500), "data/two.txt": b"two\n"}
    for rel, data in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host = f"127.0.0.1:{server.server_address[1]}"
    try:
        lines = ["TsvHttpData-1.0"] + [f"http://{host}/{rel}\t{len(d)}\t{base64.b64encode(hashlib.md5(d).digest()).decode()}"
                                       for rel, d in files.items()]
        (tmp_path / "list.tsv").write_text("\n".join(lines) + "\n")
        dst = make_root("gs")
        sts.copy(f"http://{host}/list.tsv", dst, settings)
        expected = {f"{host}/{rel}": data for rel, data in files.items()}
        assert read_tree(dst, settings) == expected
        assert verifying.verify(dst, settings, deep=True)["ok"]
    finally:
        server.shutdown()
        server.server_close()


def test_a_role_instead_of_keys_and_no_temporary_keys(make_root, settings, double):
    src, dst = make_root("s3"), make_root("gs")
    fill(src, settings, {"k": b"k" * 10})
    role = "arn:aws:iam::123456789012:role/sts-reader"
    with_role = settings.model_copy(update={"native": settings.native.model_copy(update={"sts_aws_role_arn": role})})
    sts.copy(src, dst, with_role)
    s3 = double.server.calls("/v1/transferJobs")[0]["transferSpec"]["awsS3DataSource"]
    assert s3["roleArn"] == role and "awsAccessKey" not in s3
    assert read_tree(dst, settings) == {"k": b"k" * 10}
    temporary = settings.model_copy(update={"s3": settings.s3.model_copy(update={"session_token": SecretStr("t")})})
    with pytest.raises(RouteUnavailable, match="temporary AWS keys"):
        sts.copy(src, dst, temporary)


def test_an_unreachable_service_and_one_lost_mid_run(make_root, settings, double):
    from tests.emulators import free_port
    src, dst = make_root("s3"), make_root("gs")
    files = {f"f{i}": os.urandom(50) for i in range(6)}
    fill(src, settings, files)
    nowhere = settings.model_copy(update={"native": settings.native.model_copy(
        update={"sts_endpoint": f"http://127.0.0.1:{free_port()}"})})
    with pytest.raises(RouteFailed, match="refused to create the transfer job") as caught:
        sts.copy(src, dst, nowhere)
    assert caught.value.moved_data is False
    double.delay = 0.3
    progress, outcome = Progress(), {}

    def run():
        try:
            sts.copy(src, dst, settings, progress=progress)
        except RouteFailed as exc:
            outcome["error"] = exc
    worker = threading.Thread(target=run)
    worker.start()
    while progress.bytes_done < 50 and worker.is_alive():
        time.sleep(0.02)
    double.server.down.set()
    worker.join(60)
    assert "lost track of Storage Transfer Service operation" in str(outcome["error"])
    assert outcome["error"].moved_data is True
    assert read_manifest(get_store(parse(dst), settings), parse(dst)) is None


def test_names_that_begin_other_names_are_each_named_exactly(make_root, settings, double):
    """Storage Transfer refuses include prefixes that are prefixes of one another ("a.bin" and
    "a.bin.1"; "shard-1" and "shard-10"), as the double does; a sync of some of the source's files
    names each in the job's transfer manifest instead, and copies exactly those."""
    from google.api_core import exceptions
    from google.cloud import storage_transfer
    client = sts.client_for(settings)
    nested = {"project_id": "test", "status": 1, "transfer_spec": {
        "gcs_data_source": {"bucket_name": "s"}, "gcs_data_sink": {"bucket_name": "b"},
        "object_conditions": {"include_prefixes": ["shard-1", "shard-10"]}}}
    with pytest.raises(exceptions.BadRequest, match="is a prefix of"):
        client.create_transfer_job({"transfer_job": storage_transfer.TransferJob(nested)})

    src, dst = make_root("s3"), make_root("gs") + "x/"
    files = {"a.bin": b"a" * 100, "a.bin.1": b"b" * 100, "shard-1": b"1" * 50, "shard-10": b"2" * 50,
             "shard-2": b"3" * 50, "z.txt": b"z"}
    fill(src, settings, files)
    ops.sync(src, dst, settings, route="sts")
    changed = {"a.bin": b"A" * 120, "shard-1": b"!" * 60}
    fill(src, settings, changed)
    summary = ops.sync(src, dst, settings, route="sts")
    assert summary["route"]["name"] == "sts" and summary["route"]["fallbacks"] == {}
    assert sorted(summary["sent"]) == ["a.bin", "shard-1"]
    ((_meta, run),) = [op for op in double.operations.values()][-1:]
    assert run.objects_copied == 2          # not a.bin.1 nor shard-10 again
    assert read_tree(dst, settings) == {**files, **changed}
    assert verifying.verify(dst, settings, deep=True)["ok"]


def test_exclude_copies_exactly_the_planned_objects_by_a_transfer_manifest(make_root, settings, double):
    """``--exclude shard-10`` beside ``shard-1``: the job names exactly the planned objects in a
    transfer manifest (a CSV in the destination bucket), never a prefix that takes shard-10 too;
    the manifest object is gone afterwards and ``verify`` finds nothing extra."""
    from bridge.filters import Filters
    src, dst = make_root("s3"), make_root("gs") + "x/"
    files = {"shard-1": b"1" * 50, "shard-10": b"2" * 50, "shard-2": b"3" * 50, "a,b \"q\".bin": b"q" * 9}
    fill(src, settings, files)
    summary = ops.copy(src, dst, settings, route="sts", filters=Filters(exclude=("shard-10",)))
    assert summary["route"]["name"] == "sts" and summary["route"]["fallbacks"] == {}
    wanted = {k: v for k, v in files.items() if k != "shard-10"}
    assert read_tree(dst, settings) == wanted
    spec = [b for b in double.server.bodies("/v1/transferJobs") if "transferSpec" in b][-1]["transferSpec"]
    assert "objectConditions" not in spec and spec["transferManifest"]["location"].startswith(
        f"gs://{parse(dst).bucket}/x/_bridge/")
    report = verifying.verify(dst, settings)
    assert report["ok"] and report["counts"]["extra"] == 0, report
    store = get_store(parse(dst), settings)
    assert [i.location.key for i in store.list(parse(dst).join("_bridge/sts/"))] == []   # removed after the job


def test_a_killed_filtered_copy_leaves_its_transfer_manifest_to_the_rerun_which_removes_it(make_root, tmp_path,
                                                                                           moto, fake_gcs, azurite,
                                                                                           env_for):
    """SIGKILL while the job runs: the transfer manifest stays (the adopted operation still reads
    it) and is named in the ledger; the re-run follows that operation and removes the manifest."""
    import subprocess
    from tests.helpers import MCBRIDGE, NO_CONFIG
    from tests.test_native_orphans import FILES as FIVE, kill, nothing_recorded, sts_running, wait_for
    with StorageTransferDouble(gcs_endpoint=fake_gcs.endpoint, s3_endpoint=moto.endpoint) as double:
        env = env_for("s3", "gs")
        env.update(MCBRIDGE_STS_ENDPOINT=double.endpoint, MCBRIDGE_POLL_INTERVAL="0.05",
                   MCBRIDGE_STATE_DIR=str(tmp_path), XDG_CONFIG_HOME=NO_CONFIG)
        env.pop("MCBRIDGE_CONFIG", None)
        settings = settings_for(env)
        src, dst = make_root("s3"), make_root("gs")
        fill(src, settings, FIVE)
        command = [*MCBRIDGE, "cp", src, dst, "--route", "sts", "--exclude", "f0", "-q"]
        double.paused.set()
        first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: sts_running(double), "the remote job to run")
        kill(first)
        store, manifests = get_store(parse(dst), settings), parse(dst).join("_bridge/sts/")
        assert len(list(store.list(manifests))) == 1 and not nothing_recorded(tmp_path)
        rerun = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: len(double.server.calls("")) > 6, "the re-run to poll")
        double.paused.clear()
        _out, err = rerun.communicate(timeout=120)
        assert rerun.returncode == 0, err
        assert len(double.server.calls(":run")) == 1     # adopted, not run again
        assert read_tree(dst, settings) == {k: v for k, v in FIVE.items() if k != "f0"}
        assert list(store.list(manifests)) == [] and nothing_recorded(tmp_path)
