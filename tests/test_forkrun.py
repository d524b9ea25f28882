"""A copy of small files run by forked processes, a batch at a time each (bridge/pipeline/forkrun.py):
the same files, record, counts and requests as the thread pool's run, both ways between S3
(moto, over HTTP) and a local folder; a failed batch and a process that dies fail the job, and
the run again finishes it; -v says every file; a bandwidth limit keeps the job in one process.

Batches are made of 16 files here (``BATCH_FILES``), so that a few hundred files are many batches."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bridge import manifest as manifests
from bridge import meter
from bridge.adopt import _can_fork
from bridge.bwlimit import install_signal, local
from bridge.errors import TransferFailed
from bridge.pipeline import execute as executor
from bridge.pipeline import forkrun
from bridge.pipeline import plan as planning
from bridge.pipeline import verify as verifying
from bridge.progress import Progress
from bridge.stores import get_store
from bridge.urls import parse
from tests.helpers import mcbridge, settings_for

pytestmark = pytest.mark.skipif(not _can_fork(), reason="forks on Linux only")

FILES = 200


@pytest.fixture
def forked(monkeypatch):
    """Batches of 16; the forked runs counted (how many processes each)."""
    monkeypatch.setattr(planning, "BATCH_FILES", 16)
    runs: list[int] = []
    real = forkrun.ForkedExecutor.run

    def counted(self, ctx, units, final):
        runs.append(self.processes)
        return real(self, ctx, units, final)

    monkeypatch.setattr(forkrun.ForkedExecutor, "run", counted)
    return runs


def _tree(root: Path) -> dict[str, bytes]:
    files = {f"d{i % 3}/{i:04d}.bin": os.urandom(100 + 37 * i) for i in range(FILES)}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def _copy(src: str, dst: str, settings):
    progress = Progress()
    with meter.metering(meter.Meter()) as counted:
        plan = planning.plan_copy(src, dst, settings)
        summary = executor.execute(plan, settings, progress)
    return summary, counted.to_dict()


def _read(url: str, settings) -> dict[str, bytes]:
    root = parse(url)
    store = get_store(root, settings)
    return {rel: store.read(info.location) for rel, info in store.walk(root)}


@pytest.mark.parametrize("way", ["down", "up"])
def test_forked_batches_copy_what_the_thread_pool_copies(way, forked, make_root, emulator_env, tmp_path):
    src = tmp_path / "src"
    files = _tree(src)
    env = {**emulator_env, "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}
    one, two = settings_for({**env, "MCBRIDGE_PROCESSES": "1"}), settings_for({**env, "MCBRIDGE_PROCESSES": "2"})
    if way == "down":   # S3 -> local: the objects put there by a copy first
        seeded = make_root("s3")
        _copy(f"{src}/", seeded, one)
        sources, targets = [seeded, seeded], [f"{tmp_path}/one/", f"{tmp_path}/two/"]
    else:               # local -> S3
        sources, targets = [f"{src}/", f"{src}/"], [make_root("s3"), make_root("s3")]
    forked.clear()

    alone, alone_requests = _copy(sources[0], targets[0], one)
    assert forked == []
    split, split_requests = _copy(sources[1], targets[1], two)
    assert forked == [2]
    for key in ("files", "bytes", "files_done", "bytes_done", "bytes_through", "units_done", "units_total",
                "units_failed", "ok"):
        assert split[key] == alone[key], key
    assert split["units_done"] == FILES // 16 + 2   # 13 batches, and the finalize
    store_of = {"down": "s3://", "up": "s3://"}[way]
    theirs = {k: v for k, v in split_requests.items() if k.startswith(store_of)}
    mine = {k: v for k, v in alone_requests.items() if k.startswith(store_of)}
    assert [row["requests"] for row in theirs.values()] == [row["requests"] for row in mine.values()]
    for target in targets:
        assert _read(target, two) == files
        report = verifying.verify(target, two, deep=True)
        assert report["ok"] and report["checked"] == FILES, report["counts"]
    first = manifests.read(get_store(parse(targets[0]), two), parse(targets[0])).files
    second = manifests.read(get_store(parse(targets[1]), two), parse(targets[1])).files
    assert {p: (e.size, e.crc32c, e.sha256) for p, e in first.items()} == \
        {p: (e.size, e.crc32c, e.sha256) for p, e in second.items()}
    assert not list((tmp_path / "state" / "journal").glob("*.db"))   # committed: no journal left


def test_a_plan_kept_on_disk_is_read_by_each_process_through_its_own_copy(forked, make_root, emulator_env,
                                                                           tmp_path, monkeypatch):
    """A plan past ``SPILL_FILES`` (lowered to 50) keeps its files in SQLite: the processes read
    a copy of it, each through a connection of its own (an upload asks the plan for each file's
    size and attributes); the copy is gone afterwards, and the files are the source's, with the
    type each one's name gives."""
    monkeypatch.setattr(planning, "SPILL_FILES", 50)
    src = tmp_path / "src"
    files = _tree(src)
    (src / "d0" / "page.html").write_bytes(b"<p>hi</p>")
    files["d0/page.html"] = b"<p>hi</p>"
    dst = make_root("s3")
    settings = settings_for({**emulator_env, "MCBRIDGE_STATE_DIR": str(tmp_path / "state"), "MCBRIDGE_PROCESSES": "2"})
    plan = planning.plan_copy(f"{src}/", dst, settings)
    assert plan.files.spilled
    ours, here = plan.files._rows, os.getpid()
    real_find = planning.FileList.find

    def find(self, rel):   # the parent's connection, used in a forked process: refused
        if self._rows is ours and os.getpid() != here:
            raise RuntimeError("a forked process used its parent's SQLite connection")
        return real_find(self, rel)

    monkeypatch.setattr(planning.FileList, "find", find)
    assert executor.execute(plan, settings)["files_done"] == FILES + 1
    assert forked == [2]
    assert not list((tmp_path / "state" / "spill").glob("files-*.sqlite"))   # the copy removed
    assert _read(dst, settings) == files
    loc = parse(dst)
    head = get_store(loc, settings).info(loc.join("d0/page.html"))
    assert get_store(loc, settings).attributes(head).content_type == "text/html"
    report = verifying.verify(dst, settings, deep=True)
    assert report["ok"] and report["checked"] == FILES + 1, report["counts"]


def test_each_process_keeps_its_share_of_the_requests_in_flight(forked, make_root, emulator_env, tmp_path,
                                                                 monkeypatch):
    """``transfer.small_files_in_flight`` is the job's: 40 in all, 20 for each of two processes
    (each batch asks ``batch_connections`` for its count, written down here by the process)."""
    from bridge.pipeline import units
    src = tmp_path / "src"
    _tree(src)
    asked = tmp_path / "asked"
    real = units.batch_connections

    def noted(settings, biggest):
        with open(asked, "a") as out:
            out.write(f"{os.getpid()} {settings.transfer.small_files_in_flight}\n")
        return real(settings, biggest)

    monkeypatch.setattr(units, "batch_connections", noted)
    settings = settings_for({**emulator_env, "MCBRIDGE_STATE_DIR": str(tmp_path / "state"), "MCBRIDGE_PROCESSES": "2",
                             "MCBRIDGE_SMALL_FILES_IN_FLIGHT": "40"})
    executor.execute(planning.plan_copy(f"{src}/", make_root("s3"), settings), settings)
    lines = [line.split() for line in asked.read_text().splitlines()]
    assert forked == [2] and len(lines) == FILES // 16 + 1
    assert {n for _pid, n in lines} == {"20"} and len({pid for pid, _n in lines}) == 2
    assert all(int(pid) != os.getpid() for pid, _n in lines)


def test_a_failed_batch_fails_the_job_and_the_run_again_finishes_it(forked, make_root, emulator_env, tmp_path):
    """A file gone between the plan and its batch: that batch fails the job, with the error the
    thread pool would give; the other batches' files are journaled, so the run again sends only
    the batch that failed."""
    src = tmp_path / "src"
    files = _tree(src)
    dst = make_root("s3")
    settings = settings_for({**emulator_env, "MCBRIDGE_STATE_DIR": str(tmp_path / "state"), "MCBRIDGE_PROCESSES": "2"})
    plan = planning.plan_copy(f"{src}/", dst, settings)
    gone = "d1/0100.bin"
    (src / gone).unlink()
    with pytest.raises(TransferFailed, match=r"copy did not complete: .*0100\.bin"):
        executor.execute(plan, settings)
    assert forked == [2]
    assert manifests.open_record(get_store(parse(dst), settings), parse(dst)) is None   # nothing committed
    (src / gone).write_bytes(files[gone])
    with meter.metering(meter.Meter()) as counted:
        plan = planning.plan_copy(f"{src}/", dst, settings)
        executor.execute(plan, settings)
    puts = sum(row["requests"].get("PUT", 0) for row in counted.to_dict().values())
    assert puts <= 16 + 4, puts   # the failed batch's files (and the record), not the others
    assert _read(dst, settings) == files


def _dies(ctx, unit):
    os._exit(5)


def test_a_process_that_dies_fails_the_job(forked, make_root, emulator_env, tmp_path, monkeypatch):
    src = tmp_path / "src"
    _tree(src)
    dst = make_root("s3")
    settings = settings_for({**emulator_env, "MCBRIDGE_STATE_DIR": str(tmp_path / "state"), "MCBRIDGE_PROCESSES": "2"})
    plan = planning.plan_copy(f"{src}/", dst, settings)
    monkeypatch.setitem(executor.JobContext.ops, "batch", _dies)   # as the forked processes find it
    with pytest.raises(TransferFailed, match=r"ended with exit code 5 before it was done"):
        executor.execute(plan, settings)
    assert forked == [2]
    assert manifests.open_record(get_store(parse(dst), settings), parse(dst)) is None   # nothing committed


def test_a_bandwidth_limit_or_one_process_keeps_the_batches_here(forked, make_root, emulator_env, tmp_path):
    """Batches run by one process where a bandwidth limit is set, or could be set while the job
    runs (--bwlimit-file), or one process is asked for; between two local folders there are no
    batches at all."""
    src = tmp_path / "src"
    _tree(src)
    dst = make_root("s3")
    env = {**emulator_env, "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}
    settings = settings_for({**env, "MCBRIDGE_PROCESSES": "2"})
    plan = planning.plan_copy(f"{src}/", dst, settings)
    assert forkrun.forkable(plan, settings, Progress()) == 2
    limited = Progress(limiter=local(10 * 2 ** 20))
    assert forkrun.forkable(plan, settings, limited) == 0
    unlimited = Progress(limiter=local(None))
    assert forkrun.forkable(plan, settings, unlimited) == 2
    install_signal(unlimited.limiter, None, tmp_path / "rate")   # a file may set a limit later
    assert forkrun.forkable(plan, settings, unlimited) == 0
    assert forkrun.forkable(plan, settings_for({**env, "MCBRIDGE_PROCESSES": "1"}), Progress()) == 0
    assert forkrun.forkable(plan, settings_for({**env, "MCBRIDGE_PROCESSES": "2", "MCBRIDGE_BWLIMIT": "1MiB"}),
                            Progress()) == 0
    between = planning.plan_copy(f"{src}/", f"{tmp_path}/dst/", settings)
    assert not between.batch and forkrun.forkable(between, settings, Progress()) == 0


def test_the_command_says_every_file_a_process_copied(make_root, emulator_env, tmp_path):
    """At the real batch size (256): 600 files are three batches, copied to S3 by two processes;
    -v says each file once, and the summary counts them all."""
    src = tmp_path / "src"
    for i in range(600):
        (src / f"d{i % 4}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 4}" / f"{i:04d}.txt").write_bytes(f"file {i}\n".encode())
    dst = make_root("s3")
    env = {**emulator_env, "MCBRIDGE_PROCESSES": "2"}
    r = mcbridge("cp", f"{src}/", dst, "--json", "-v", env=env, state_dir=tmp_path / "state")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["files_done"] == 600 and summary["units_done"] == summary["units_total"] == 4
    said = sorted(line.split()[1] for line in r.stderr.splitlines() if line.startswith("copied "))
    assert said == sorted(f"d{i % 4}/{i:04d}.txt" for i in range(600)), r.stderr[-2000:]
    v = mcbridge("verify", dst, "--json", env=env, state_dir=tmp_path / "state")
    assert v.returncode == 0 and json.loads(v.stdout)["checked"] == 600, v.stdout + v.stderr


def _state(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1])


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        state = _state(int(entry)) if entry.isdigit() else None
        if state is not None and state[1] == pid and state[0] != "Z":
            found.append(int(entry))
    return found


def _running(pid: int) -> bool:
    state = _state(pid)
    return state is not None and state[0] != "Z"


def test_the_processes_end_with_their_parent_however_it_dies(make_root, emulator_env, tmp_path):
    """``mcbridge cp`` killed with SIGKILL (no handler of its own runs) while its processes run
    batches: they end too (PR_SET_PDEATHSIG, or their pipe's end), and a run again finishes the
    copy."""
    import signal
    import subprocess
    import time
    from tests.helpers import MCBRIDGE, NO_CONFIG
    src = tmp_path / "src"
    for i in range(3000):
        (src / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 3}" / f"{i:05d}.bin").write_bytes(os.urandom(2000))
    dst = make_root("s3")
    env = {**emulator_env, "MCBRIDGE_PROCESSES": "2", "MCBRIDGE_STATE_DIR": str(tmp_path / "state"),
           "XDG_CONFIG_HOME": NO_CONFIG}
    run = subprocess.Popen([*MCBRIDGE, "cp", f"{src}/", dst, "-q"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while len(_children(run.pid)) < 2 and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.01)
    forked = _children(run.pid)
    assert len(forked) >= 2, "the batches did not go to processes of their own"
    run.send_signal(signal.SIGKILL)
    run.wait(30)
    deadline = time.monotonic() + 30
    while any(_running(pid) for pid in forked) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in forked if _running(pid)] == [], "processes outlived their parent"
    again = mcbridge("cp", f"{src}/", dst, "--json", env=env, state_dir=tmp_path / "state")
    assert again.returncode == 0, again.stderr
    v = mcbridge("verify", dst, "--json", env=env, state_dir=tmp_path / "state")
    assert v.returncode == 0 and json.loads(v.stdout)["checked"] == 3000, v.stdout + v.stderr
