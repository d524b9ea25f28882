"""The datasync route against the DataSync double (tests/doubles/datasync.py), which real boto3
reaches over JSON 1.1 and which moves the bytes between moto, fake-gcs-server and Azurite:
requests, polling, cancel, errors, exact data, no secret shown."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request

import pytest

from bridge import ops
from bridge.config import SecretStr
from bridge.errors import JobCancelled, RouteFailed, RouteUnavailable
from bridge.manifest import read as read_manifest
from bridge.routes import datasync
from bridge.progress import Progress
from bridge.stores import get_store
from bridge.urls import parse
from tests.doubles.datasync import DataSyncDouble
from tests.helpers import read_tree, settings_for
from tests.test_native_sts import FILES, fill
from bridge.pipeline import verify as verifying

HMAC_SECRET = "hmac-Secret-Never-Shown-42"
ROLE = "arn:aws:iam::111122223333:role/mcbridge-datasync"


@pytest.fixture
def double(moto):
    with DataSyncDouble(s3_endpoint=moto.endpoint) as d:
        yield d


@pytest.fixture
def settings(double, env_for, fake_gcs):
    env = env_for("s3", "gs", "az")
    env.update(AWS_ENDPOINT_URL_DATASYNC=double.endpoint, MCBRIDGE_POLL_INTERVAL="0.05",
               MCBRIDGE_DATASYNC_S3_ROLE_ARN=ROLE, MCBRIDGE_GCS_HMAC_ACCESS_ID="GOOG1EXAMPLE",
               MCBRIDGE_GCS_HMAC_SECRET=HMAC_SECRET, MCBRIDGE_GCS_XML_ENDPOINT=fake_gcs.endpoint)
    return settings_for(env)


@pytest.mark.parametrize("scheme", ["gs", "az"])
def test_a_prefix_into_s3_arrives_exact_and_verifies_deep(scheme, make_root, settings, double):
    src, dst = make_root(scheme) + "in/", make_root("s3") + "out/"
    fill(src, settings, FILES)
    progress = Progress()
    summary = datasync.copy(src, dst, settings, progress=progress)
    assert summary["route"]["name"] == "datasync" and summary["route"]["bytes_through_bridge"] == 0 and summary["files"] == 3
    assert progress.files_done == 3 and progress.bytes_done == sum(map(len, FILES.values()))
    assert read_tree(dst, settings) == FILES
    manifest = read_manifest(get_store(parse(dst), settings), parse(dst))
    for entry in manifest.files.values():   # S3 computed each CRC32C itself, equal to the source's
        assert entry.computed == [] and entry.reported["crc32c"] == entry.crc32c and "datasync" in entry.note
        assert entry.unproven == (scheme == "az")   # an Azure blob's checksums are a client's claim
    assert verifying.verify(dst, settings)["ok"] == (scheme != "az")
    assert verifying.verify(dst, settings, deep=True)["ok"]
    (task,) = double.calls("CreateTask")
    assert task["Options"]["VerifyMode"] == "ONLY_FILES_TRANSFERRED" and task["TaskMode"] == "ENHANCED"
    (s3_location,) = double.calls("CreateLocationS3")
    assert s3_location == {"S3BucketArn": f"arn:aws:s3:::{parse(dst).bucket}", "Subdirectory": "/out/",
                           "S3Config": {"BucketAccessRoleArn": ROLE}}
    if scheme == "gs":
        (gcs_location,) = double.calls("CreateLocationObjectStorage")
        assert gcs_location["SecretKey"] == HMAC_SECRET and gcs_location["BucketName"] == parse(src).bucket
    else:
        assert "sig=" in double.calls("CreateLocationAzureBlob")[0]["SasConfiguration"]["Token"]
    assert not double.tasks and not double.locations   # tidied up
    shown = json.dumps(summary)
    assert HMAC_SECRET not in shown and "sig=" not in shown


def test_one_object_out_of_s3_by_an_include_filter(make_root, settings, double):
    src, dst = make_root("s3"), make_root("gs") + "x/"
    fill(src, settings, FILES)
    datasync.copy(src + "sub/b.txt", dst, settings)
    assert read_tree(dst, settings) == {"b.txt": FILES["sub/b.txt"]}
    assert double.calls("CreateTask")[0]["Includes"] == [{"FilterType": "SIMPLE_PATTERN", "Value": "/b.txt"}]
    assert verifying.verify(dst, settings, deep=True)["ok"]


def test_cancel_mid_way_cancels_the_execution(make_root, settings, double):
    files = {f"f{i:02d}": os.urandom(100) for i in range(12)}
    src, dst = make_root("gs"), make_root("s3")
    fill(src, settings, files)
    double.delay = 0.2
    stop, progress, outcome = threading.Event(), Progress(), {}

    def run():
        try:
            datasync.copy(src, dst, settings, progress=progress, stop=stop)
        except JobCancelled as exc:
            outcome["error"] = exc
    worker = threading.Thread(target=run)
    worker.start()
    while progress.files_done < 2 and worker.is_alive():
        time.sleep(0.02)
    stop.set()
    worker.join(30)
    assert "was cancelled at the service (it reports cancelled" in str(outcome["error"])
    ((_task, remote),) = double.executions.values()
    assert remote.state == "cancelled" and 2 <= remote.objects_copied < 12
    assert len(double.calls("CancelTaskExecution")) == 1
    assert read_manifest(get_store(parse(dst), settings), parse(dst)) is None


def test_failures_are_one_line_without_secrets(make_root, settings, double, azurite):
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas
    src, dst = make_root("az"), make_root("s3")
    fill(src, settings, FILES)
    key = azurite.connection_string.split("AccountKey=")[1].split(";")[0]
    sas = generate_container_sas("devstoreaccount1", parse(src).bucket, account_key=key,
                                 permission=ContainerSasPermissions(read=True), expiry=time.time() + 3600)
    narrow = settings.model_copy(update={"azure": settings.azure.model_copy(update={"sas_token": SecretStr(sas)})})
    with pytest.raises(RouteFailed) as caught:   # the SAS may not list: the execution fails
        datasync.copy(src, dst, narrow)
    line = str(caught.value)
    assert "execution" in line and "failed" in line and "\n" not in line and not caught.value.moved_data
    assert sas.split("sig=")[1].split("&")[0] not in line
    double.deny_role = ROLE                       # refused before anything runs
    with pytest.raises(RouteFailed, match="refused to set up the task: InvalidRequestException") as caught:
        datasync.copy(src, dst, settings)
    assert caught.value.moved_data is False
    assert read_tree(dst, settings) == {}
    no_role = settings.model_copy(update={"native": settings.native.model_copy(update={"datasync_s3_role_arn": None})})
    with pytest.raises(RouteUnavailable, match="datasync_s3_role_arn"):
        datasync.copy(src, dst, no_role)
    with pytest.raises(RouteUnavailable, match="does not serve az->gs"):
        datasync.copy(src, make_root("gs"), settings)


def test_the_double_refuses_requests_without_required_fields(double):
    def call(target: str, body: dict) -> tuple[int, dict]:
        request = urllib.request.Request(double.endpoint + "/", data=json.dumps(body).encode(), method="POST",
                                         headers={"X-Amz-Target": f"FmrsService.{target}",
                                                  "Content-Type": "application/x-amz-json-1.1"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as exc:
            return exc.code, json.load(exc)
    for target, body, missing in [("CreateLocationS3", {"S3BucketArn": "arn:aws:s3:::b"}, "S3Config"),
                                  ("CreateLocationObjectStorage", {"BucketName": "b"}, "ServerHostname"),
                                  ("CreateLocationAzureBlob", {"ContainerUrl": "https://a/c", "AuthenticationType": "SAS"},
                                   "SasConfiguration.Token"),
                                  ("CreateTask", {"SourceLocationArn": "x"}, "DestinationLocationArn"),
                                  ("StartTaskExecution", {}, "TaskArn")]:
        status, error = call(target, body)
        assert status == 400 and error["__type"] == "InvalidRequestException" and missing in error["message"]


def test_enabled_native_routes_are_planned_as_valid(emulator_env):
    from bridge.pricing import available_routes
    settings = settings_for({**emulator_env, "MCBRIDGE_NATIVE_ROUTES": "sts,datasync"})
    assert {"sts", "datasync"} <= available_routes(settings)
    assert not {"sts", "datasync"} & available_routes(settings_for(emulator_env))


def test_an_enhanced_task_the_caller_may_not_create_falls_back_to_direct(make_root, settings, double):
    """Agentless tasks run in Enhanced mode, which needs DataSync's service-linked role: a caller
    that may not create it (iam:CreateServiceLinkedRole) is refused at CreateTask, before any data
    moved, and the files go direct with that reason."""
    double.no_service_linked_role = True
    src, dst = make_root("gs"), make_root("s3") + "x/"
    fill(src, settings, FILES)
    summary = ops.copy(src, dst, settings, route="datasync")
    assert double.calls("CreateTask")[0]["TaskMode"] == "ENHANCED"
    assert set(summary["route"]["fallbacks"]) == set(FILES)
    assert all("iam:CreateServiceLinkedRole" in why for why in summary["route"]["fallbacks"].values())
    assert double.calls("StartTaskExecution") == []
    assert read_tree(dst, settings) == FILES and verifying.verify(dst, settings, deep=True)["ok"]


def test_a_name_with_a_pipe_or_a_star_is_never_a_wider_copy(make_root, settings, double):
    """DataSync's include filter separates patterns with '|' and reads '*' as a wildcard, with no
    escape: a job that must name "a|b.bin" or "star*" goes direct (saying why), and creates no task
    whose filter would take "a", "starry" and the rest; one such object alone is refused."""
    src, dst = make_root("gs"), make_root("s3")
    files = {"a": b"a" * 10, "b.bin": b"b" * 10, "a|b.bin": b"p" * 10, "star*": b"s" * 10, "starry": b"r" * 10}
    fill(src, settings, files)
    ops.sync(src, dst, settings, route="datasync")      # the whole prefix: no filter, every name fits
    tasks = len(double.calls("CreateTask"))
    changed = {"a|b.bin": b"P" * 12, "star*": b"S" * 12}
    fill(src, settings, changed)
    summary = ops.sync(src, dst, settings, route="datasync")
    assert sorted(summary["sent"]) == sorted(changed)
    fallbacks = summary["route"]["fallbacks"]
    assert set(fallbacks) == set(changed) and all("escapes neither" in why for why in fallbacks.values()), fallbacks
    assert len(double.calls("CreateTask")) == tasks       # no task with a filter wider than the plan
    assert read_tree(dst, settings) == {**files, **changed}
    assert verifying.verify(dst, settings, deep=True)["ok"]
    with pytest.raises(RouteUnavailable, match="'star\\*'"):
        datasync.copy(src + "star*", make_root("s3"), settings)
    assert len(double.calls("CreateTask")) == tasks


def test_a_name_that_is_a_folder_of_other_names_is_never_a_wider_copy(make_root, settings, double):
    """DataSync reads the include pattern "/x" as the folder x too, so naming the object "x" would
    copy "x/y" with it, which the plan left out: such a job goes direct, saying why."""
    src, dst = make_root("gs"), make_root("s3")
    files = {"x": b"x" * 10, "x/y": b"y" * 10, "z": b"z" * 10}
    fill(src, settings, files)
    ops.sync(src, dst, settings, route="datasync")
    tasks = len(double.calls("CreateTask"))
    fill(src, settings, {"x": b"X" * 12})
    summary = ops.sync(src, dst, settings, route="datasync")
    assert summary["sent"] == ["x"] and "folder" in summary["route"]["fallbacks"]["x"], summary["route"]
    assert len(double.calls("CreateTask")) == tasks
    assert read_tree(dst, settings) == {**files, "x": b"X" * 12}
    assert verifying.verify(dst, settings)["ok"]
    with pytest.raises(RouteUnavailable, match="folder x/"):
        datasync.copy(src + "x", make_root("s3"), settings)
    assert len(double.calls("CreateTask")) == tasks
    datasync.copy(src + "z", make_root("s3"), settings)     # one object with nothing under it: filtered
    assert double.calls("CreateTask")[-1]["Includes"][0]["Value"] == "/z"
