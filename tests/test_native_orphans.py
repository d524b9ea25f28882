"""A delegated copy killed with SIGKILL leaves its remote job running; the re-run adopts it
(one remote job in all, not a second copy of everything), or, when it was made for other
objects, cancels it and deletes what bridge created before starting afresh. After either,
nothing bridge created stays at the service. mcbridge runs in a subprocess; the doubles
(tests/doubles/) in this process, holding their runs while ``paused`` is set."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.helpers import MCBRIDGE, NO_CONFIG, mcbridge, read_tree, settings_for
from tests.test_native_cli import datasync_double, env, sts_double  # noqa: F401  fixtures
from tests.test_native_sts import fill

FILES = {f"f{i}": os.urandom(200 + i) for i in range(5)}


def wait_for(condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def start(route: str, src: str, dst: str, env: dict, state_dir) -> subprocess.Popen:
    run_env = {k: v for k, v in env.items() if k != "MCBRIDGE_CONFIG"}
    run_env.update(MCBRIDGE_STATE_DIR=str(state_dir), XDG_CONFIG_HOME=NO_CONFIG)
    return subprocess.Popen([*MCBRIDGE, "cp", src, dst, "--route", route, "-q"], env=run_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def kill(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def nothing_recorded(state_dir) -> bool:
    folder = state_dir / "native"
    return not folder.exists() or not list(folder.iterdir())


# -- Storage Transfer Service ---------------------------------------------------------------------

def sts_running(double) -> bool:
    return any(run.state == "running" for _meta, run in double.operations.values())


def sts_left(double) -> list[str]:
    """Transfer jobs not deleted, and operations still running."""
    return ([name for name, job in double.jobs.items() if job["status"] != "DELETED"]
            + [name for name, (_meta, run) in double.operations.items() if not run.finished.is_set()])


def killed_mid_job(route: str, src_scheme: str, dst_scheme: str, double, running, make_root, env, tmp_path):
    """A copy by ``route`` started and SIGKILLed while its remote job runs (the double holds it
    until ``paused`` is cleared): the settings and the two roots."""
    settings = settings_for(env)
    src, dst = make_root(src_scheme), make_root(dst_scheme)
    fill(src, settings, FILES)
    double.paused.set()
    first = start(route, src, dst, env, tmp_path)
    wait_for(lambda: running(double), "the remote job to run")
    kill(first)
    return settings, src, dst


def completes(rerun: subprocess.Popen) -> None:
    _out, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err


def copied_once_and_verifies(run, dst: str, settings, env, tmp_path) -> None:
    """The one remote run succeeded having copied each object once, and the copy proves deep."""
    assert run.state == "success" and run.objects_copied == len(FILES)
    assert read_tree(dst, settings) == FILES
    deep = mcbridge("verify", dst, "--deep", env=env, state_dir=tmp_path)
    assert deep.returncode == 0 and f"OK: {len(FILES)} files" in deep.stdout, deep.stdout + deep.stderr


def test_sts_a_killed_copy_is_adopted_by_its_rerun(make_root, env, sts_double, tmp_path):
    settings, src, dst = killed_mid_job("sts", "s3", "gs", sts_double, sts_running, make_root,
                                        env, tmp_path)
    assert sts_left(sts_double) and not nothing_recorded(tmp_path)   # orphaned, and bridge knows it

    polled = len(sts_double.server.calls(""))
    rerun = start("sts", src, dst, env, tmp_path)
    # the re-run follows the operation while it still runs: only then does the double let it go on
    wait_for(lambda: any("transferOperations/" in path for _m, path, _h, _b in sts_double.server.requests[polled:]),
             "the re-run to poll the killed run's operation")
    assert sts_running(sts_double)
    sts_double.paused.clear()
    completes(rerun)
    assert len(sts_double.server.calls("/v1/transferJobs")) == 1 and len(sts_double.server.calls(":run")) == 1
    ((_meta, run),) = sts_double.operations.values()
    copied_once_and_verifies(run, dst, settings, env, tmp_path)
    assert sts_left(sts_double) == [] and nothing_recorded(tmp_path)


def test_sts_a_killed_job_for_other_objects_is_cancelled_and_deleted(make_root, env, sts_double, tmp_path):
    settings, src, dst = killed_mid_job("sts", "s3", "gs", sts_double, sts_running, make_root,
                                        env, tmp_path)
    (old_job,) = sts_double.jobs
    ((old_op, (_meta, old_run)),) = sts_double.operations.items()
    fill(src, settings, {"new": b"added after the kill"})   # the re-run copies other objects
    rerun = start("sts", src, dst, env, tmp_path)
    wait_for(old_run.finished.is_set, "the re-run to cancel the killed run's operation")
    assert old_run.state == "cancelled"
    sts_double.paused.clear()
    completes(rerun)
    assert len(sts_double.server.calls("/v1/transferJobs")) == 2
    assert sts_double.jobs[old_job]["status"] == "DELETED"
    assert sts_double.server.calls(f"{old_op}:cancel")
    assert read_tree(dst, settings) == {**FILES, "new": b"added after the kill"}
    assert mcbridge("verify", dst, "--deep", env=env, state_dir=tmp_path).returncode == 0
    assert sts_left(sts_double) == [] and nothing_recorded(tmp_path)


# -- DataSync -----------------------------------------------------------------------------------

def ds_running(double) -> bool:
    return any(run.state == "running" for _task, run in double.executions.values())


def ds_left(double) -> list[str]:
    """Locations and tasks not deleted, and executions still running."""
    return ([*double.locations, *double.tasks]
            + [arn for arn, (_task, run) in double.executions.items() if not run.finished.is_set()])


def test_datasync_a_killed_copy_is_adopted_by_its_rerun(make_root, env, datasync_double, tmp_path):
    settings, src, dst = killed_mid_job("datasync", "gs", "s3", datasync_double, ds_running, make_root,
                                        env, tmp_path)
    assert len(ds_left(datasync_double)) == 4 and not nothing_recorded(tmp_path)   # 2 locations, task, execution

    polled = len(datasync_double.calls("DescribeTaskExecution"))
    rerun = start("datasync", src, dst, env, tmp_path)
    wait_for(lambda: len(datasync_double.calls("DescribeTaskExecution")) > polled,
             "the re-run to poll the killed run's execution")
    assert ds_running(datasync_double)
    datasync_double.paused.clear()
    completes(rerun)
    for operation in ("CreateLocationObjectStorage", "CreateLocationS3", "CreateTask", "StartTaskExecution"):
        assert len(datasync_double.calls(operation)) == 1, operation
    ((_task, run),) = datasync_double.executions.values()
    copied_once_and_verifies(run, dst, settings, env, tmp_path)
    assert ds_left(datasync_double) == [] and nothing_recorded(tmp_path)


def test_datasync_a_killed_job_for_other_objects_is_cancelled_and_deleted(make_root, env, datasync_double, tmp_path):
    settings, src, dst = killed_mid_job("datasync", "gs", "s3", datasync_double, ds_running, make_root,
                                        env, tmp_path)
    ((old_arn, (_task, old_run)),) = datasync_double.executions.items()
    old_made = set(datasync_double.locations) | set(datasync_double.tasks)
    fill(src, settings, {"new": b"added after the kill"})
    rerun = start("datasync", src, dst, env, tmp_path)
    wait_for(old_run.finished.is_set, "the re-run to cancel the killed run's execution")
    assert old_run.state == "cancelled"
    assert any(c["TaskExecutionArn"] == old_arn for c in datasync_double.calls("CancelTaskExecution"))
    datasync_double.paused.clear()
    completes(rerun)
    assert len(datasync_double.calls("StartTaskExecution")) == 2
    deleted = {c.get("TaskArn") or c.get("LocationArn")
               for c in datasync_double.calls("DeleteTask") + datasync_double.calls("DeleteLocation")}
    assert old_made <= deleted
    assert read_tree(dst, settings) == {**FILES, "new": b"added after the kill"}
    assert mcbridge("verify", dst, "--deep", env=env, state_dir=tmp_path).returncode == 0
    assert ds_left(datasync_double) == [] and nothing_recorded(tmp_path)


def test_sts_a_run_killed_before_recording_its_operation_is_found_by_the_job(make_root, env, sts_double, tmp_path):
    """Killed between ``transferJobs.run`` and writing the operation's name: the re-run finds the
    operation through the job's latestOperationName and follows it."""
    from bridge.routes import delegated as native
    from bridge.routes import sts
    from bridge.routes.ledger import Ledger
    settings = settings_for(env, state_dir=str(tmp_path))
    src, dst = make_root("s3"), make_root("gs")
    fill(src, settings, FILES)
    transfer = native.plan("sts", src, dst, settings, sts.PAIRS)
    client = sts.client_for(settings)
    name = "transferJobs/mcbridge-killed"
    Ledger(settings, transfer).begin(route="sts", project="test", job=name)    # as run() records it
    client.create_transfer_job({"transfer_job": {"name": name, "project_id": "test", "status": 1,
                                                 "transfer_spec": sts.transfer_spec(transfer, settings)}})
    client.run_transfer_job({"job_name": name, "project_id": "test"})
    summary = sts.copy(src, dst, settings)
    assert summary["route"]["remote"]["job"] == name and summary["route"]["remote"].get("adopted") is True
    assert len(sts_double.server.calls("/v1/transferJobs")) == 1 and len(sts_double.operations) == 1
    assert read_tree(dst, settings) == FILES
    assert sts_left(sts_double) == [] and nothing_recorded(tmp_path)


def test_a_record_half_written_by_a_killed_run_goes_with_the_record(env, tmp_path):
    """SIGKILL between writing a note and renaming it into place leaves ``<key>.<pid>.tmp``:
    dropping the record removes it too, so nothing of the job stays in the state dir."""
    from bridge.routes import delegated
    from bridge.routes.ledger import Ledger
    from bridge.urls import parse
    settings = settings_for(env, state_dir=str(tmp_path))
    transfer = delegated.Transfer("sts", parse("s3://bkt/src/"), parse("gs://cnt/dst/"), [], None)
    ledger = Ledger(settings, transfer)
    ledger.begin(route="sts", job="transferJobs/x")
    ledger.path.with_suffix(".12345.tmp").write_text('{"half": ')
    ledger.drop()
    assert nothing_recorded(tmp_path)
