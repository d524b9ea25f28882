"""The sts and datasync routes through mcbridge itself (the route seam): --route, the route in
--json, fallback to direct with the reason, SIGTERM cancelling the remote job, one-line errors
and no secret in what is printed. The doubles run in this process; mcbridge in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from tests.doubles.datasync import DataSyncDouble
from tests.doubles.sts import StorageTransferDouble
from tests.helpers import MCBRIDGE, NO_CONFIG, mcbridge, read_tree, settings_for
from tests.test_native_sts import FILES, SECRET, fill

HMAC_SECRET = "hmac-Secret-Never-Shown-42"


@pytest.fixture
def sts_double(moto, fake_gcs, azurite):
    with StorageTransferDouble(gcs_endpoint=fake_gcs.endpoint, s3_endpoint=moto.endpoint,
                               azure_endpoint=f"{azurite.endpoint}/{{account}}") as d:
        yield d


@pytest.fixture
def datasync_double(moto):
    with DataSyncDouble(s3_endpoint=moto.endpoint) as d:
        yield d


@pytest.fixture
def env(env_for, sts_double, datasync_double, fake_gcs):
    env = env_for("s3", "gs", "az")
    env.update(MCBRIDGE_STS_ENDPOINT=sts_double.endpoint, AWS_ENDPOINT_URL_DATASYNC=datasync_double.endpoint,
               MCBRIDGE_POLL_INTERVAL="0.05", AWS_SECRET_ACCESS_KEY=SECRET,
               MCBRIDGE_DATASYNC_S3_ROLE_ARN="arn:aws:iam::111122223333:role/dsync",
               MCBRIDGE_GCS_HMAC_ACCESS_ID="GOOG1EXAMPLE", MCBRIDGE_GCS_HMAC_SECRET=HMAC_SECRET,
               MCBRIDGE_GCS_XML_ENDPOINT=fake_gcs.endpoint)
    return env


def no_secret(*texts: str) -> None:
    for text in texts:
        assert SECRET not in text and HMAC_SECRET not in text and "sig=" not in text


@pytest.mark.parametrize("route,src_scheme,dst_scheme", [("sts", "s3", "gs"), ("sts", "az", "gs"),
                                                         ("datasync", "gs", "s3"), ("datasync", "az", "s3")])
def test_cp_by_a_native_route_then_verify_deep(route, src_scheme, dst_scheme, make_root, env, tmp_path):
    settings = settings_for(env)
    src, dst = make_root(src_scheme), make_root(dst_scheme) + "copy/"
    fill(src, settings, FILES)
    r = mcbridge("cp", src, dst, "--route", route, "--json", env=env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["route"]["name"] == route and summary["route"]["why"] == "forced with --route"
    assert summary["route"]["bytes_through_bridge"] == 0 and summary["route"]["fallbacks"] == {}
    assert set(summary["route"]["remote"]) >= ({"job", "operation"} if route == "sts" else {"task", "execution"})
    assert read_tree(dst, settings) == FILES
    deep = mcbridge("verify", dst, "--deep", env=env, state_dir=tmp_path)
    assert deep.returncode == 0 and "OK: 3 files" in deep.stdout, deep.stdout + deep.stderr
    no_secret(r.stdout, r.stderr)


def test_enabled_routes_are_chosen_and_a_refusal_falls_back_to_direct(make_root, env, sts_double, tmp_path):
    settings = settings_for(env)
    src, dst = make_root("s3"), make_root("gs")
    fill(src, settings, FILES)
    enabled = {**env, "MCBRIDGE_NATIVE_ROUTES": "sts"}
    sts_double.deny_projects.add("test")
    r = mcbridge("cp", src, dst, "--json", env=enabled, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    route = json.loads(r.stdout)["route"]
    assert route["name"] == "sts" and route["why"].startswith("enabled in the settings")
    assert set(route["fallbacks"]) == set(FILES)
    assert all("PERMISSION_DENIED" in why or "403" in why for why in route["fallbacks"].values())
    assert route["bytes_through_bridge"] == sum(map(len, FILES.values()))   # direct carried them
    assert read_tree(dst, settings) == FILES
    assert mcbridge("verify", dst, "--deep", env=env, state_dir=tmp_path).returncode == 0
    no_secret(r.stdout, r.stderr)
    # not enabled: direct, and sts is not tried
    again = mcbridge("cp", src, make_root("gs"), "--json", env=env, state_dir=tmp_path)
    assert json.loads(again.stdout)["route"]["name"] == "direct"


def test_bad_input_and_missing_settings_are_one_line(make_root, env, tmp_path):
    src, dst = make_root("gs"), make_root("s3")
    fill(src, settings_for(env), {"x": b"x"})
    r = mcbridge("cp", src, dst, "--route", "sts", env=env, state_dir=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--route sts cannot copy" in r.stderr
    no_role = {k: v for k, v in env.items() if k != "MCBRIDGE_DATASYNC_S3_ROLE_ARN"}
    r = mcbridge("cp", src, dst, "--route", "datasync", env=no_role, state_dir=tmp_path)
    assert r.returncode == 2 and "datasync_s3_role_arn" in r.stderr and r.stderr.count("\n") == 1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_or_ctrl_c_cancels_the_remote_job(sig, make_root, env, sts_double, tmp_path):
    settings = settings_for(env)
    files = {f"f{i:02d}": os.urandom(100) for i in range(15)}
    src, dst = make_root("s3"), make_root("gs")
    fill(src, settings, files)
    sts_double.delay = 0.3
    run_env = {k: v for k, v in env.items() if k != "MCBRIDGE_CONFIG"}
    run_env.update(MCBRIDGE_STATE_DIR=str(tmp_path), XDG_CONFIG_HOME=NO_CONFIG)
    proc = subprocess.Popen([*MCBRIDGE, "cp", src, dst, "--route", "sts", "-q"], env=run_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(r.objects_copied >= 2 for _m, r in sts_double.operations.values()):
        time.sleep(0.05)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    lines = err.splitlines()
    if lines and lines[0] == "mcbridge: interrupted: run the same command to resume":
        lines = lines[1:]   # said at once on the signal, before the remote job is cancelled
    assert len(lines) == 1 and lines[0].startswith("mcbridge: error: ") and "cancelled at the service" in lines[0], err
    ((_meta, remote),) = sts_double.operations.values()
    assert remote.state == "cancelled" and remote.objects_copied < 15
    assert sts_double.server.calls(":cancel")
    from bridge.manifest import read as read_manifest
    from bridge.stores import get_store
    from bridge.urls import parse
    assert read_manifest(get_store(parse(dst), settings), parse(dst)) is None


def test_a_remote_failure_after_data_moved_fails_the_job_in_one_line(make_root, env, sts_double, moto, tmp_path):
    settings = settings_for(env)
    files = {f"f{i:02d}": os.urandom(100) for i in range(6)}
    src, dst = make_root("s3"), make_root("gs")
    fill(src, settings, files)
    sts_double.delay = 0.3
    run_env = {k: v for k, v in env.items() if k != "MCBRIDGE_CONFIG"}
    run_env.update(MCBRIDGE_STATE_DIR=str(tmp_path), XDG_CONFIG_HOME=NO_CONFIG)
    proc = subprocess.Popen([*MCBRIDGE, "cp", src, dst, "--route", "sts", "-q"], env=run_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(r.objects_copied >= 1 for _m, r in sts_double.operations.values()):
        time.sleep(0.05)
    moto.client().delete_object(Bucket=src.split("/")[2], Key="f05")   # listed by the service, gone when it reads
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert err.count("\n") == 1 and "copy did not complete: Storage Transfer Service operation" in err
    assert "failed: NOT_FOUND" in err
    no_secret(out, err)
    from bridge.manifest import read as read_manifest
    from bridge.stores import get_store
    from bridge.urls import parse
    assert read_manifest(get_store(parse(dst), settings), parse(dst)) is None


@pytest.mark.parametrize("route,src_scheme,dst_scheme", [("sts", "s3", "gs"), ("datasync", "gs", "s3")])
def test_sync_sends_only_what_changed_by_naming_it(route, src_scheme, dst_scheme, make_root, env, sts_double,
                                                   datasync_double, tmp_path):
    settings = settings_for(env)
    src, dst = make_root(src_scheme), make_root(dst_scheme)
    fill(src, settings, FILES)
    assert mcbridge("cp", src, dst, "--route", route, env=env, state_dir=tmp_path).returncode == 0
    changed = {"a.bin": os.urandom(3001), "sub/new.txt": b"new\n"}
    fill(src, settings, changed)
    r = mcbridge("sync", src, dst, "--route", route, "--json", env=env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert sorted(summary["sent"]) == sorted(changed) and summary["route"]["name"] == route
    if route == "sts":
        spec = sts_double.server.calls("/v1/transferJobs")[-1]["transferSpec"]
        assert "objectConditions" not in spec and "/_bridge/sts/" in spec["transferManifest"]["location"]
        ((_meta, run),) = list(sts_double.operations.values())[-1:]
        assert run.objects_copied == len(changed)
    else:
        value = datasync_double.calls("CreateTask")[-1]["Includes"][0]["Value"]
        assert sorted(value.split("|")) == sorted("/" + rel for rel in changed)
    assert read_tree(dst, settings) == {**FILES, **changed}
    assert mcbridge("verify", dst, "--deep", env=env, state_dir=tmp_path).returncode == 0


def test_an_enabled_route_that_does_not_serve_the_pair_leaves_it_direct(make_root, env, tmp_path):
    settings = settings_for(env)
    src, dst = make_root("local"), make_root("gs")
    fill(src, settings, {"x": b"x"})
    r = mcbridge("cp", src, dst, "--json", env={**env, "MCBRIDGE_NATIVE_ROUTES": "sts,datasync"}, state_dir=tmp_path)
    route = json.loads(r.stdout)["route"]
    assert route["name"] == "direct" and "sts" in route["why"] and "datasync" in route["why"], route


def test_one_object_by_datasync_and_a_rename_goes_direct(make_root, env, datasync_double, tmp_path):
    settings = settings_for(env)
    src, dst = make_root("gs"), make_root("s3")
    fill(src, settings, FILES)
    r = mcbridge("cp", src + "sub/b.txt", dst, "--route", "datasync", "--json", env=env, state_dir=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["route"]["fallbacks"] == {}, r.stderr
    assert datasync_double.calls("CreateTask")[0]["Includes"][0]["Value"] == "/b.txt"
    r = mcbridge("cp", src + "a.bin", dst + "renamed.bin", "--route", "datasync", "--json", env=env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "keeps object names" in json.loads(r.stdout)["route"]["fallbacks"]["renamed.bin"]
    assert len(datasync_double.calls("CreateTask")) == 1     # no remote job for the rename
    assert read_tree(dst, settings) == {"b.txt": FILES["sub/b.txt"], "renamed.bin": FILES["a.bin"]}
    assert mcbridge("verify", dst, "--deep", env=env, state_dir=tmp_path).returncode == 0


@pytest.mark.parametrize("enabled,src_scheme,dst_scheme", [("datasync,sts", "s3", "gs"), ("sts,datasync", "s3", "gs"),
                                                           ("", "s3", "gs"), ("", "s3", "s3"), ("", "local", "local")])
def test_plan_marks_chosen_the_route_cp_takes(enabled, src_scheme, dst_scheme, make_root, env, tmp_path):
    """One decision: what ``mcbridge plan`` marks chosen is what ``cp`` runs, with native routes
    enabled in either order, none, inside one store and between local folders."""
    settings = settings_for(env)
    src, dst = make_root(src_scheme), make_root(dst_scheme) + "copy/"
    fill(src, settings, FILES)
    run_env = {**env, "MCBRIDGE_NATIVE_ROUTES": enabled} if enabled else env
    planned = mcbridge("plan", src, dst, "--json", env=run_env, state_dir=tmp_path)
    assert planned.returncode == 0, planned.stderr
    chosen = [row for row in json.loads(planned.stdout)["routes"] if row["chosen"]]
    dry = mcbridge("cp", src, dst, "--dry-run", "--json", env=run_env, state_dir=tmp_path)
    assert dry.returncode == 0, dry.stderr
    runs = json.loads(dry.stdout)["route"]["name"]
    assert [row["route"] for row in chosen] == [runs]
    assert chosen[0]["why"].startswith("the route a copy takes here")


def test_route_sts_without_google_credentials_is_refused_before_any_request(make_root, env, sts_double, tmp_path):
    """No STS endpoint of the double and no Google credentials: --route sts is bad input, one line,
    exit 2, and the service saw nothing (it was an internal error after planning)."""
    src, dst = make_root("s3"), make_root("gs")
    fill(src, settings_for(env), FILES)
    bare = {k: v for k, v in env.items() if k not in ("MCBRIDGE_STS_ENDPOINT", "GOOGLE_APPLICATION_CREDENTIALS")}
    bare.update(CLOUDSDK_CONFIG=str(tmp_path / "no-gcloud"), GCE_METADATA_HOST="127.0.0.1:9",
                GCE_METADATA_IP="127.0.0.1:9", NO_GCE_CHECK="True")
    r = mcbridge("cp", src, dst + "x/", "--route", "sts", env=bare, state_dir=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and "route sts needs Google credentials" in line and "internal" not in line
    assert sts_double.server.bodies("/v1/transferJobs") == []


def test_route_datasync_without_aws_credentials_is_refused_before_any_request(make_root, env, datasync_double,
                                                                              tmp_path):
    """No AWS credentials anywhere boto3 looks: --route datasync is bad input, one line, exit 2,
    and DataSync saw nothing (it was an internal error once the copy had been planned)."""
    src, dst = make_root("gs"), make_root("s3")
    fill(src, settings_for(env), FILES)
    bare = {k: v for k, v in env.items() if not k.startswith("AWS_") or k == "AWS_ENDPOINT_URL_DATASYNC"}
    bare.update(AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=str(tmp_path / "none"),
                AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_ENDPOINT_URL=env["AWS_ENDPOINT_URL"],
                AWS_REGION=env.get("AWS_REGION", "us-east-1"))
    r = mcbridge("cp", src, dst + "x/", "--route", "datasync", env=bare, state_dir=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and "route datasync needs AWS credentials" in line, line
    assert "internal" not in line and "resume" not in line
    assert datasync_double.server.requests == []


def test_the_task_mode_is_a_setting_sent_and_checked(make_root, env, datasync_double, tmp_path):
    """ENHANCED (the default) and BASIC go to CreateTask as TaskMode; a Basic mode task between
    clouds needs an agent and an Enhanced one takes none: each is refused before any request."""
    settings = settings_for(env)
    src = make_root("s3")
    fill(src, settings, FILES)
    r = mcbridge("cp", src, make_root("s3") + "x/", "--route", "datasync", env=env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    basic = {**env, "MCBRIDGE_DATASYNC_TASK_MODE": "BASIC"}
    r = mcbridge("cp", src, make_root("s3") + "x/", "--route", "datasync", env=basic, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    assert [t["TaskMode"] for t in datasync_double.calls("CreateTask")] == ["ENHANCED", "BASIC"]
    r = mcbridge("cp", src, make_root("gs") + "x/", "--route", "datasync", env=basic, state_dir=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "through a DataSync agent" in r.stderr, r.stderr
    assert len(datasync_double.calls("CreateTask")) == 2
