"""Resume after SIGKILL: a changed source listing is the same job, and a resumed copy from a cloud
source never reads a finished part again. Bytes are counted where they are served: moto logs
every request, one line per part sent (PUT ...partNumber=) or read (GET of the object, 206)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from bridge import manifest as manifests
from bridge.jobs import ThreadExecutor
from bridge.pipeline.execute import JobContext, run_unit
from bridge.pipeline.plan import plan_copy
from bridge.journal import FileJournal
from bridge.stores import get_store
from bridge.urls import parse
from tests.faultproxy import FaultProxy, proxied_environment
from tests.helpers import MCBRIDGE, mcbridge, record, settings_for
from tests.test_engine import _journaled_parts

MiB = 1024 * 1024


def _moto_part_puts(moto, bucket: str, key: str) -> int:
    """UploadPart requests for this object in moto's log so far (the log is the session's)."""
    text = moto.log_path.read_text(errors="replace")
    return sum(1 for line in text.splitlines() if f"PUT /{bucket}/{key}?" in line and "partNumber=" in line)


def _kill_after(args: list[str], env: dict, state: Path, parts: int) -> int:
    """Run the CLI, SIGKILL it once at least ``parts`` parts are journaled; the count then."""
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and _journaled_parts(state) < parts:
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return _journaled_parts(state)


def _env(emulator_env: dict, state: Path) -> dict:
    return dict(emulator_env, MCBRIDGE_STATE_DIR=str(state), XDG_CONFIG_HOME="/nonexistent")


def test_a_file_added_after_a_kill_does_not_restart_the_copy(moto, make_root, emulator_env, tmp_path):
    size, part = 48 * MiB + 7, 5 * MiB
    nparts = -(-size // part)
    src = tmp_path / "src"
    src.mkdir()
    (src / "weights.bin").write_bytes(os.urandom(size))
    dst = make_root("s3") + "models/"
    state = tmp_path / "state"
    args = [*MCBRIDGE, "cp", f"{src}/", dst, "--chunk-size", "5MiB", "-j", "2", "-q"]
    journaled = _kill_after(args, _env(emulator_env, state), state, 3)
    assert 3 <= journaled < nparts, "the copy must be killed mid-way"
    key, bucket = "models/weights.bin", parse(dst).bucket

    (src / "added.txt").write_bytes(b"a file that appeared after the kill\n")
    # The second run's requests are counted at a proxy of its own: a part the killed run had in
    # flight may reach moto's log at any time after the kill.
    with FaultProxy(moto.endpoint) as second:
        r = mcbridge("cp", f"{src}/", dst, "--chunk-size", "5MiB", "-j", "2", "--json",
                     env=proxied_environment(emulator_env, {"s3": second}), state_dir=state)
    assert r.returncode == 0, r.stderr
    second_run = sum(1 for line, _done in second.log if line.startswith(f"PUT /{bucket}/{key}?") and "partNumber=" in line)
    first_run = _moto_part_puts(moto, bucket, key) - second_run   # at least the journaled parts: answered before the kill
    assert first_run >= journaled, (first_run, journaled)
    assert second_run == nparts - journaled, (first_run, second_run, journaled)   # what the journal lacks, no more
    assert first_run + second_run - nparts <= 2, "only parts in flight at the kill (-j 2) may be sent twice"
    client = moto.client()
    assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == (src / "weights.bin").read_bytes()
    assert client.get_object(Bucket=bucket, Key="models/added.txt")["Body"].read().startswith(b"a file")
    assert mcbridge("verify", dst, "--deep", env=emulator_env, state_dir=state).returncode == 0


def _moto_object_gets(moto, bucket: str, key: str) -> int:
    text = moto.log_path.read_text(errors="replace")
    return sum(1 for line in text.splitlines() if f"GET /{bucket}/{key} HTTP" in line)  # 206 lines are coloured


def test_s3_to_local_killed_three_times_reads_each_part_once(moto, make_root, emulator_env, tmp_path):
    size, part = 60 * MiB + 11, 5 * MiB
    nparts = -(-size // part)
    data = os.urandom(size)
    root = make_root("s3")
    bucket = parse(root).bucket
    moto.client().put_object(Bucket=bucket, Key="ckpt/weights.bin", Body=data)
    dst = tmp_path / "dst"
    state = tmp_path / "state"
    env = _env(emulator_env, state)
    # --sha256: the whole-file SHA-256 too, which a resume must not claim from parts it did not read
    args = [*MCBRIDGE, "cp", f"{root}ckpt/weights.bin", f"{dst}/", "--chunk-size", "5MiB", "-j", "2", "-q",
            "--sha256"]
    seen = 0
    for share in (0.25, 0.5, 0.75):
        seen = _kill_after(args, env, state, max(seen + 1, int(nparts * share)))
    assert seen < nparts, "the third run must be killed before the end"
    r = mcbridge("cp", f"{root}ckpt/weights.bin", f"{dst}/", "--chunk-size", "5MiB", "-j", "2", "--json", "--sha256",
                 env=emulator_env, state_dir=state)
    assert r.returncode == 0, r.stderr
    assert (dst / "weights.bin").read_bytes() == data
    gets = _moto_object_gets(moto, bucket, "ckpt/weights.bin")
    # Each part once, plus at most what was in flight (-j 2) at each of the three kills.
    assert nparts <= gets <= nparts + 3 * 2, (gets, nparts)

    entry = record(f"{dst}/", emulator_env)["files"][0]
    assert entry["sha256"] == hashlib.sha256(data).hexdigest(), "a local destination gives the whole SHA-256"
    assert entry["part_sha256"] == [hashlib.sha256(data[i:i + part]).hexdigest() for i in range(0, size, part)]
    assert mcbridge("verify", f"{dst}/", "--deep", env=emulator_env, state_dir=state).returncode == 0


def test_cloud_to_cloud_resume_keeps_part_hashes_and_verify_deep_checks_them(moto, make_root, emulator_env,
                                                                             emulator_for, tmp_path):
    size, part = 40 * MiB + 3, 5 * MiB
    nparts = -(-size // part)
    data = os.urandom(size)
    src, dst = make_root("s3"), make_root("s3") + "copy/"
    moto.client().put_object(Bucket=parse(src).bucket, Key="w.bin", Body=data)
    state = tmp_path / "state"
    # --route direct: the bytes pass through bridge in parts (the server route would have S3 copy it)
    args = [*MCBRIDGE, "cp", f"{src}w.bin", dst, "--chunk-size", "5MiB", "-j", "2", "-q", "--route", "direct",
            "--sha256"]
    assert 2 <= _kill_after(args, _env(emulator_env, state), state, 2) < nparts
    r = mcbridge("cp", f"{src}w.bin", dst, "--chunk-size", "5MiB", "-j", "2", "--route", "direct", "--sha256",
                 env=emulator_env, state_dir=state)
    assert r.returncode == 0, r.stderr
    entry = record(dst, emulator_env)["files"][0]
    assert entry["sha256"] == "" and "part_sha256" in entry["note"], "no whole SHA-256 is claimed unread"
    assert entry["part_sha256"] == [hashlib.sha256(data[i:i + part]).hexdigest() for i in range(0, size, part)]
    assert mcbridge("verify", dst, "--deep", env=emulator_env, state_dir=state).returncode == 0
    tampered = bytearray(data)
    tampered[part + 1] ^= 0xFF  # in part 2; CRC32C alone would also catch it, SHA-256 names the part
    moto.client().put_object(Bucket=parse(dst).bucket, Key="copy/w.bin", Body=bytes(tampered))
    bad = mcbridge("verify", dst, "--deep", "--json", env=emulator_env, state_dir=state)
    assert bad.returncode == 1 and json.loads(bad.stdout)["mismatched"][0]["path"] == "w.bin"


def test_a_file_rewritten_after_a_kill_is_sent_whole_again(tmp_path, emulator_env):
    src = tmp_path / "src"
    src.mkdir()
    (src / "ckpt.bin").write_bytes(os.urandom(24 * MiB))
    state, dst = tmp_path / "state", tmp_path / "dst"
    args = [*MCBRIDGE, "cp", f"{src}/", f"{dst}/", "--chunk-size", "1MiB", "-j", "2", "-q"]
    assert 3 <= _kill_after(args, _env(emulator_env, state), state, 3) < 24
    changed = os.urandom(20 * MiB + 5)
    (src / "ckpt.bin").write_bytes(changed)
    r = mcbridge("cp", f"{src}/", f"{dst}/", "--chunk-size", "1MiB", "-j", "2", env=emulator_env, state_dir=state)
    assert r.returncode == 0, r.stderr
    assert (dst / "ckpt.bin").read_bytes() == changed
    assert mcbridge("verify", f"{dst}/", "--deep", env=emulator_env, state_dir=state).returncode == 0


def test_parts_of_one_file_can_run_in_different_processes(moto, make_root, emulator_env, tmp_path):
    """Two JobContexts stand for two workers sharing one journal: each runs some parts of one
    file. Neither waits for a part the other runs; the entry then has part hashes only."""
    size, part = 6 * 5 * MiB + 9, 5 * MiB
    data = os.urandom(size)
    (tmp_path / "w.bin").write_bytes(data)
    dst = make_root("s3") + "split/"
    settings = settings_for(emulator_env, sha256=True)   # the whole SHA-256 asked for, and not to be had
    plan = plan_copy(str(tmp_path / "w.bin"), dst, settings, 5 * MiB)
    journal = FileJournal(tmp_path / "journal.jsonl")
    one, other = JobContext(plan, settings, journal), JobContext(plan, settings, journal)
    units = list(plan.units())
    assert len(units) == 7
    first = ThreadExecutor(1).run(one, iter(units[:1]), final=None)   # begins the upload
    assert first.ok, first.errors
    outcomes: list = []
    workers = [threading.Thread(target=lambda c=ctx, u=subset: outcomes.append(ThreadExecutor(2).run(c, iter(u), None)),
                                daemon=True)   # a part waiting forever for the other's must not hang the suite
               for ctx, subset in ((one, units[2::2]), (other, units[1::2]))]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=300)   # a guard against a deadlock, not a timing target
    assert not any(w.is_alive() for w in workers), "a part waited for one that runs in the other process"
    assert all(o.ok for o in outcomes), [o.errors for o in outcomes]
    last = JobContext(plan, settings, journal)
    run_unit(last, {"op": "complete", "rel": "w.bin", "size": size, "part_size": part})
    run_unit(last, {"op": "finalize"})
    entry = manifests.read(get_store(parse(dst), settings), parse(dst)).files["w.bin"]
    assert entry.sha256 == "" and entry.note and entry.computed == ["crc32c", "part_sha256", "sha256_tree"]
    assert entry.part_sha256 == [hashlib.sha256(data[i:i + part]).hexdigest() for i in range(0, size, part)]
    assert mcbridge("verify", dst, "--deep", env=emulator_env, state_dir=tmp_path).returncode == 0
