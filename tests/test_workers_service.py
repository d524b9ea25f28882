"""The service end to end: real Redis, real worker and beat processes, the emulators.

Each test runs in a namespace of its own (keys, queues and channels), so it never sees another
test's or another user's work on the same Redis, and removes its keys afterwards. Transfers are
counted where they land: moto logs every request, so a part sent twice is two log lines.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

import pytest

from bridge.hashing import sha256_tree
from bridge.urls import parse
from tests.emulators import free_port
from tests.helpers import record
from bridge.workers.jobrecords import TERMINAL, Jobs
from bridge.workers.keys import Keys, redis_client
from bridge.workers.testing import ServiceProcess, purge_namespace, tenant_env

MiB = 1024 * 1024
pytestmark = pytest.mark.timeout(240)


class Harness:
    """Workers, beat and the CLI of one test, in one namespace."""

    def __init__(self, env: dict[str, str], tmp_path: Path):
        self.env = env
        self.tmp_path = tmp_path
        self.processes: list[ServiceProcess] = []
        self.keys = Keys(env["BRIDGE_NAMESPACE"])
        self.redis = redis_client(env["BRIDGE_BROKER_URL"])
        self.jobs = Jobs(self.redis, self.keys, ttl=3600)

    def worker(self, name: str, *, threads: int = 4, **kwargs) -> ServiceProcess:
        env = {**self.env, "MCBRIDGE_CONCURRENCY": str(threads)}
        worker = ServiceProcess.worker(env, name, self.tmp_path, **kwargs)
        self.processes.append(worker)
        return worker.start()

    def beat(self, schedules: Path) -> ServiceProcess:
        beat = ServiceProcess.beat(self.env, schedules, self.tmp_path)
        self.processes.append(beat)
        return beat.start()

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "bridge", *args], env=self.env, capture_output=True,
                              text=True, timeout=timeout)

    def submit(self, *args: str) -> str:
        result = self.cli("submit", *args)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    def wait(self, job_id: str, timeout: float = 120, states=TERMINAL):
        """The job's record once it is in one of ``states``; an ended job once its worker has
        announced the end too (priced and logged, as submit --wait waits for it), or 10 s later."""
        deadline = time.monotonic() + timeout
        ended_at = None
        while True:
            record = self.jobs.get(job_id)
            if record and record.state in states:
                if record.state not in TERMINAL:
                    return record
                if self.jobs.announced(job_id):
                    return self.jobs.get(job_id)   # read again: complete now
                ended_at = ended_at or time.monotonic()
                if time.monotonic() - ended_at > 10:
                    return record
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {p.name}\n{p.log_tail(25)}" for p in self.processes)
                raise AssertionError(f"job {job_id} is {record.state if record else None} after {timeout}s\n{logs}")
            time.sleep(0.1)

    def close(self) -> None:
        for process in self.processes:
            process.stop()


def sub_plan(ref: dict) -> dict:
    """A running transfer task's slice of the plan: the signed text it carries, read."""
    sub = ref["args"][1]
    return json.loads(sub) if isinstance(sub, str) else sub


@pytest.fixture
def service(redis_url, emulator_env, tmp_path, tmp_path_factory):
    """One tenant (tests/, its key outside the workers' reach) allowed every bucket and, on the
    workers, the test's tmp_path: the workers' only local root."""
    namespace = f"mcbt-{uuid.uuid4().hex[:10]}"
    env = {**emulator_env, "BRIDGE_BROKER_URL": redis_url, "BRIDGE_NAMESPACE": namespace,
           "BRIDGE_LEASE": "3s", "BRIDGE_SWEEP": "0.5s", "BRIDGE_METRICS_PORT": "0",
           "MCBRIDGE_STATE_DIR": str(tmp_path / "state"),
           **tenant_env(tmp_path_factory.mktemp("tenant"), local_roots=[str(tmp_path)])}
    harness = Harness(env, tmp_path)
    yield harness
    harness.close()
    purge_namespace(redis_url, namespace)


def write_tree(root: Path, big: dict[str, int], small: int, small_size: int = 4096) -> dict[str, str]:
    """Files under ``root``; returns relative path -> SHA-256."""
    hashes: dict[str, str] = {}
    for rel, size in big.items():
        data = os.urandom(size)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        hashes[rel] = hashlib.sha256(data).hexdigest()
    for i in range(small):
        rel = f"small/{i // 100:02d}/{i:04d}.bin"
        data = os.urandom(small_size + i)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        hashes[rel] = hashlib.sha256(data).hexdigest()
    return hashes


def s3_hashes(moto, bucket: str, prefix: str = "") -> dict[str, str]:
    client = moto.client()
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(prefix):]
            if not rel.startswith("_bridge/"):
                out[rel] = hashlib.sha256(client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()).hexdigest()
    return out


def moto_puts(moto, bucket: str) -> tuple[Counter, Counter]:
    """(whole-object PUTs by key, part PUTs by (key, part number)) that moto answered 200,
    leaving out bridge's own _bridge/ files."""
    line = re.compile(rf'"PUT /{re.escape(bucket)}/(?P<key>[^ ?]+)(?P<query>\?[^ ]*)? HTTP/1\.1" 200')
    whole, parts = Counter(), Counter()
    for m in line.finditer(moto.log_path.read_text(errors="replace")):
        if m["key"].startswith("_bridge/"):
            continue
        number = re.search(r"partNumber=(\d+)", m["query"] or "")
        if number:
            parts[(m["key"], int(number[1]))] += 1
        else:
            whole[m["key"]] += 1
    return whole, parts


def metric_total(port: int, name: str) -> float:
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
            f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def test_a_job_of_100_mb_and_300_small_files_between_two_emulators(service, emulator_for, make_root):
    """Azure -> S3 through two workers whose lease (2 s) is far shorter than the big file's task:
    every part is sent exactly once, the job verifies, and the workers' metrics count it."""
    azure, moto = emulator_for("az"), emulator_for("s3")
    src, dst = make_root("az"), make_root("s3")
    container, bucket = src[len("az://"):].rstrip("/"), dst[len("s3://"):].rstrip("/")
    big = os.urandom(100 * 10**6)
    smalls = {f"small/{i:03d}.txt": os.urandom(500 + 7 * i) for i in range(300)}
    client = azure.client().get_container_client(container)
    client.upload_blob("ckpt/model.bin", big, max_concurrency=4)
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda item: client.upload_blob(*item), smalls.items()))
    expected = {rel: hashlib.sha256(data).hexdigest() for rel, data in smalls.items()}
    expected["ckpt/model.bin"] = hashlib.sha256(big).hexdigest()

    service.env["BRIDGE_LEASE"] = "2s"
    ports = [free_port(), free_port()]
    for name, port in zip(("w1", "w2"), ports):
        service.worker(name, concurrency=2, metrics_port=port)
    for worker in service.processes:
        worker.wait_ready()

    result = service.cli("submit", "cp", src, dst, "--chunk-size", "8MiB", "--wait", "--json")
    assert result.returncode == 0, result.stderr + result.stdout
    status = json.loads(result.stdout)
    assert status["state"] == "succeeded", status["errors"]
    assert status["verify"]["ok"] and status["verify"]["checked"] == 301
    # On a loaded machine a heartbeat can come late and the sweeper may queue the big file's task
    # again (CI saw it once); the duplicate must then find it busy and do nothing, which the
    # exactly-once counts of moto's log below prove. How often it happens is timing, not tested.
    assert status["progress"]["files_done"] == 301
    assert status["progress"]["bytes_total"] == len(big) + sum(map(len, smalls.values()))
    timings = status["timings"]   # the finalize's time, and the verify's within it
    assert 0 < timings["verify_s"] <= timings["finalize_s"]

    assert s3_hashes(moto, bucket) == expected
    whole, parts = moto_puts(moto, bucket)
    parts_expected = math.ceil(len(big) / (8 * MiB))
    assert sorted(parts) == [("ckpt/model.bin", n) for n in range(1, parts_expected + 1)]
    assert set(parts.values()) == {1}, "a part was sent twice: a slow task ran twice"
    assert whole == Counter(smalls.keys()), "a small file was sent twice"
    manifest = record(f"s3://{bucket}/", service.env)
    # A file sent in one request has its whole SHA-256; one sent in parts, its parts' SHA-256s and
    # their tree digest (README: Digests), each part hashed by the task that sent it.
    digests = {e["path"]: e["sha256"] or e["sha256_tree"] for e in manifest["files"]}
    part = 8 * MiB
    assert digests == {**expected, "ckpt/model.bin": sha256_tree(
        [hashlib.sha256(big[i:i + part]).hexdigest() for i in range(0, len(big), part)], part)}
    # finalize on a worker records what S3 answered at commit, as the in-process copy does
    assert all(e["identity"].get("etag") and e["reported"].get("crc32c") == e["crc32c"]
               for e in manifest["files"])

    moved = sum(metric_total(port, "bridge_bytes_moved_total") for port in ports)
    assert moved == status["progress"]["bytes_total"]
    assert sum(metric_total(port, "bridge_job_duration_seconds_count") for port in ports) == 1
    listed = service.cli("jobs", "list", "--json")
    assert [job["id"] for job in json.loads(listed.stdout)] == [status["id"]]

    # Credentials stay with the workers: not in Redis (records, tasks, results), not in a log.
    from tests.emulators import AZURITE_KEY
    for key in service.redis.scan_iter(match=f"{service.keys.namespace}:*"):
        kind = service.redis.type(key)
        if kind == "none":   # gone between the scan and this look (a lease or marker that expired)
            continue
        dump = {"hash": service.redis.hgetall, "list": lambda k: service.redis.lrange(k, 0, -1),
                "string": service.redis.get, "set": service.redis.smembers,
                "zset": lambda k: service.redis.zrange(k, 0, -1), "stream": service.redis.xrange}[kind](key)
        assert AZURITE_KEY[:20] not in json.dumps(dump, default=str), key
    for worker in service.processes:
        assert AZURITE_KEY[:20] not in worker.log_path.read_text()


def test_a_worker_killed_with_sigkill_mid_job_costs_only_its_units_in_flight(service, emulator_for, make_root,
                                                                            tmp_path):
    """With the default lease and sweep, the task of a worker killed inside a multipart file runs
    again on the other worker within 60 s, and only the units in flight are sent twice."""
    moto = emulator_for("s3")
    src = tmp_path / "src"
    big = {f"ckpt/shard-{i}.bin": 40 * MiB for i in range(3)}
    hashes = write_tree(src, big, small=200)
    dst = make_root("s3")
    bucket = dst[len("s3://"):].rstrip("/")
    threads, tasks_at_once = 2, 2
    for name in ("BRIDGE_LEASE", "BRIDGE_SWEEP"):   # the defaults: the promise is about them
        service.env.pop(name)
    w1 = service.worker("w1", concurrency=tasks_at_once, threads=threads)
    w2 = service.worker("w2", concurrency=tasks_at_once, threads=threads)
    w1.wait_ready()
    w2.wait_ready()
    job_id = service.submit("cp", f"{src}/", dst, "--chunk-size", "5MiB")

    # Kill w1 while it is inside a multipart file: some of its parts journaled, not all.
    deadline = time.monotonic() + 60
    victim = victim_task = None
    while victim is None:
        assert time.monotonic() < deadline, "w1 never got a multipart file"
        for task_id, raw in service.redis.hgetall(service.keys.running).items():
            ref = json.loads(raw)
            if ref["worker"] != w1.hostname or ref["task"] != "bridge.transfer":
                continue
            files = sub_plan(ref)["files"]
            if files and files[0]["part_size"]:
                plan_key = sub_plan(ref)["key"]
                done = service.redis.hkeys(f"{service.keys.journal(plan_key)}:part")
                if any(k.startswith(f"part:{files[0]['rel']}:") for k in done):
                    victim, victim_task = files[0]["rel"], task_id
        time.sleep(0.02)
    w1.kill()
    killed_at = time.monotonic()
    # What w1 held at the kill (its running tasks stay listed until their lease runs out): the
    # small files of those tasks (records buffered up to workers.redisjournal.FLUSH_SECONDS), and
    # what the journal already had.
    w1_files = {f["rel"] for raw in service.redis.hgetall(service.keys.running).values()
                for ref in [json.loads(raw)] if ref["worker"] == w1.hostname and ref["task"] == "bridge.transfer"
                for f in sub_plan(ref)["files"] if not f["part_size"]}
    journaled = {k.decode()[len("file:"):] if isinstance(k, bytes) else k[len("file:"):]
                 for k in service.redis.hkeys(f"{service.keys.journal(plan_key)}:file")}

    while True:   # until the victim's task runs again, on w2
        raw = service.redis.hget(service.keys.running, victim_task)
        if raw and json.loads(raw)["worker"] == w2.hostname:
            rerun_after = time.monotonic() - killed_at
            break
        done = service.redis.sismember(service.keys.job(job_id, "done"), victim_task)
        assert not done, "w1's task finished without running again"
        assert time.monotonic() - killed_at < 60, "w1's task was not running again within 60 s"
        time.sleep(0.05)
    record = service.wait(job_id, timeout=120)
    assert record.state == "succeeded", record.errors
    assert record.counters.get("requeued", 0) >= 1
    assert record.verify["ok"] and record.verify["checked"] == len(hashes)
    assert s3_hashes(moto, bucket) == hashes

    whole, parts = moto_puts(moto, bucket)
    expected_parts = {(rel, n) for rel in big for n in range(1, 9)}
    assert set(parts) == expected_parts and set(whole) == {rel for rel in hashes if rel not in big}
    resent_parts = sum(parts.values()) - len(parts)
    resent_files = {rel for rel, n in whole.items() if n > 1}
    # Parts are journaled as each one ends: only those in flight (one per thread of each task
    # w1 ran) go again. Small files go again only if they were in w1's running tasks and not yet
    # journaled (their records wait for a flush); nothing journaled is ever sent twice.
    assert resent_parts <= tasks_at_once * threads, (victim, resent_parts, parts)
    assert all(n <= 2 for n in whole.values()), whole
    assert resent_files <= w1_files - journaled, (resent_files - w1_files, resent_files & journaled)
    resent = resent_parts + len(resent_files)
    # the job is charged each part once, the parts w1 finished before it died included
    used = service.redis.hgetall(service.keys.job(job_id, "usage"))
    assert int(used["destination.req.PART"]) == len(expected_parts) and int(used["destination.req.PUT"]) == 201
    assert service.jobs.get(job_id).spent_usd > 0
    print(f"SIGKILL mid-{victim}: running again on w2 {rerun_after:.1f}s after the kill (lease 30 s, "
          f"sweep 5 s); {resent} units sent again")


def test_cancel_stops_a_running_job_and_leaves_no_manifest(service, emulator_for, make_root, tmp_path):
    moto = emulator_for("s3")
    src = tmp_path / "src"
    write_tree(src, {f"big-{i}.bin": 48 * MiB for i in range(2)}, small=200)
    dst = make_root("s3")
    bucket = dst[len("s3://"):].rstrip("/")
    service.worker("w1", concurrency=1, threads=1).wait_ready()
    # Held to 16 MiB/s (about 6 s for the 97 MiB): on an idle machine the copy ended before the
    # cancel, a CLI process started after the first bytes, reached the worker (all 97 MiB done,
    # the job cancelled at its finalize), and this test could not show the bytes stopping.
    waiting = subprocess.Popen([sys.executable, "-m", "bridge", "submit", "cp", f"{src}/", dst, "--chunk-size",
                                "5MiB", "--bwlimit", "16MiB", "--wait", "--quiet"], env=service.env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while True:
        records = service.jobs.list()
        if records and records[0].counters.get("bytes_done", 0) > 0:
            job_id = records[0].id
            break
        assert time.monotonic() < deadline and waiting.poll() is None, waiting.communicate()
        time.sleep(0.05)

    cancelled = service.cli("jobs", "cancel", job_id)
    assert cancelled.returncode == 0 and "cancelled job" in cancelled.stdout, cancelled.stderr
    stdout, stderr = waiting.communicate(timeout=60)
    assert waiting.returncode == 1 and f"job {job_id} cancelled" in stdout, stderr

    plan_key = service.jobs.get(job_id).plan_key
    deadline = time.monotonic() + 60   # the queued tasks drain, finalize cleans up
    while list(service.redis.scan_iter(match=f"{service.keys.journal(plan_key)}:*")):
        assert time.monotonic() < deadline, "the cancelled job's journal was not discarded"
        time.sleep(0.2)
    record = service.jobs.get(job_id)
    assert record.state == "cancelled" and record.counters.get("bytes_done", 0) < record.counters["bytes_total"]
    s3 = moto.client()
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert not any(k.startswith("_bridge/manifest") for k in keys) and len(keys) < 202
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads"), "an upload was left unfinished"
    status = service.cli("jobs", "status", job_id)
    assert "cancelled" in status.stdout.splitlines()[0]


def test_scheduled_sync_and_replication_fire_and_produce_verified_copies(service, emulator_for, make_root,
                                                                        tmp_path):
    azure, moto, gcs = emulator_for("az"), emulator_for("s3"), emulator_for("gs")
    src = tmp_path / "golden"
    hashes = write_tree(src, {"model.safetensors": 6 * MiB}, small=20)
    mirror, dr_s3, dr_gs = make_root("az"), make_root("s3"), make_root("gs")
    schedules = tmp_path / "schedules.yaml"
    schedules.write_text(f"""\
schedules:
  golden-mirror:
    every: 2s
    kind: sync
    source: {src}/
    destination: {mirror}golden/
    delete: true
  golden-dr:
    every: 2s
    kind: replicate
    source: {src}/
    destinations: [{dr_s3}golden/, {dr_gs}golden/]
    delete: true
""")
    service.worker("w1", concurrency=2).wait_ready()
    service.beat(schedules)

    fired: dict[str, str] = {}
    deadline = time.monotonic() + 90
    while len(fired) < 2:
        assert time.monotonic() < deadline, f"schedules did not fire: {fired}\n{service.processes[1].log_tail()}"
        for record in service.jobs.list():
            if record.schedule and not record.parent and record.state == "succeeded":
                fired.setdefault(record.schedule, record.id)
        time.sleep(0.2)

    mirror_job = service.jobs.get(fired["golden-mirror"])
    assert mirror_job.kind == "sync" and mirror_job.verify["ok"]
    dr_job = service.jobs.get(fired["golden-dr"])
    assert dr_job.kind == "replicate" and len(dr_job.children) == 2
    proven = service.jobs.proven(str(src) + "/", [f"{dr_s3}golden/", f"{dr_gs}golden/"])
    # proven by a child of a golden-dr run: the schedule fires every 2 s, so a later run than
    # the first one seen may have written the proof since
    for proof in proven.values():
        assert proof, proven
        parent = service.jobs.get(proof["job"].rpartition("-")[0])
        assert parent is not None and parent.schedule == "golden-dr" and parent.kind == "replicate", proven

    assert s3_hashes(moto, dr_s3[len("s3://"):].rstrip("/"), "golden/") == hashes
    container = azure.client().get_container_client(mirror[len("az://"):].rstrip("/"))
    assert {b.name[len("golden/"):]: hashlib.sha256(container.download_blob(b.name).readall()).hexdigest()
            for b in container.list_blobs(name_starts_with="golden/") if "/_bridge/" not in b.name} == hashes
    bucket = gcs.client().bucket(dr_gs[len("gs://"):].rstrip("/"))
    assert {b.name[len("golden/"):]: hashlib.sha256(b.download_as_bytes()).hexdigest()
            for b in bucket.list_blobs(prefix="golden/") if "/_bridge/" not in b.name} == hashes

    status = service.cli("jobs", "status", dr_job.id)
    assert "proven equal" in status.stdout and "never" not in status.stdout, status.stdout


@pytest.mark.parametrize("command", [["pack", "--format", "tar"], ["migrate", "--pack", "tar"]],
                         ids=["submit-pack", "submit-migrate"])
def test_a_pack_job_writes_one_shard_per_task_and_unpacks_to_the_same_files(command, service, make_root, emulator_for,
                                                                            tmp_path):
    src = tmp_path / "corpus"
    hashes = write_tree(src, {}, small=120, small_size=2048)
    dst = make_root("az")
    service.worker("w1", concurrency=2).wait_ready()
    result = service.cli("submit", command[0], f"{src}/", f"{dst}shards/", *command[1:], "--shard-size", "64KiB",
                         "--wait", "--json")
    assert result.returncode == 0, result.stderr + result.stdout
    status = json.loads(result.stdout)
    assert status["state"] == "succeeded" and status["verify"]["ok"], status["errors"]
    shards = status["progress"]["tasks_total"]
    assert shards >= 4 and status["progress"]["files_total"] == 120
    container = dst[len("az://"):].rstrip("/")
    manifest = record(f"az://{container}/shards/", service.env)
    assert all(e["identity"].get("etag") and e["computed"] == ["crc32c", "sha256"] for e in manifest["files"])

    out = tmp_path / "unpacked"
    unpacked = service.cli("unpack", f"{dst}shards/", f"{out}/", "-q")
    assert unpacked.returncode == 0, unpacked.stderr
    got = {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
           for p in out.rglob("*") if p.is_file() and "_bridge" not in p.parts}
    assert got == hashes

    if command[0] != "pack":
        return
    # the same shard set restored by the workers: one task per shard, the manifest at commit
    restored = make_root("s3") + "restored/"
    result = service.cli("submit", "unpack", f"{dst}shards/", restored, "--wait", "--json")
    assert result.returncode == 0, result.stderr + result.stdout
    status = json.loads(result.stdout)
    assert status["state"] == "succeeded" and status["verify"]["ok"], status["errors"]
    assert status["progress"]["tasks_total"] == shards and status["progress"]["files_done"] == 120
    assert s3_hashes(emulator_for("s3"), parse(restored).bucket, "restored/") == hashes


def test_beat_keeps_its_schedule_in_the_state_dir(redis_url, tmp_path):
    """compose and k8s mount $MCBRIDGE_STATE_DIR: beat's last-run database must live there."""
    namespace = f"mcbt-{uuid.uuid4().hex[:10]}"
    state, home = tmp_path / "state", tmp_path / "home"
    env = {**os.environ, "BRIDGE_BROKER_URL": redis_url, "BRIDGE_NAMESPACE": namespace,
           "MCBRIDGE_STATE_DIR": str(state), "HOME": str(home), "XDG_CONFIG_HOME": str(tmp_path / "no-config"),
           **tenant_env(tmp_path / "tenant")}
    env.pop("XDG_STATE_HOME", None)
    schedules = tmp_path / "schedules.yaml"
    schedules.write_text("schedules:\n  nightly:\n    cron: \"0 2 * * *\"\n    kind: sync\n"
                         f"    source: {tmp_path}/src/\n    destination: {tmp_path}/dst/\n")
    beat = ServiceProcess(["beat", "--schedules", str(schedules), "--loglevel", "INFO"], env, "beat", tmp_path)
    try:
        beat.start()
        deadline = time.monotonic() + 60
        while not list(state.glob(f"beat-{namespace}*")) and beat.process.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(state.glob(f"beat-{namespace}*")), beat.log_tail()
        assert not list(home.rglob("beat-*")), "nothing outside the state dir"
    finally:
        beat.stop()
        purge_namespace(redis_url, namespace)


def test_replicate_without_delete_or_verify_none_records_a_sync_but_proves_nothing(service, make_root, tmp_path):
    src = tmp_path / "golden"
    write_tree(src, {}, small=5, small_size=512)
    proven_dst, weak_dst = make_root("local") + "golden/", make_root("local") + "golden/"
    service.worker("w1", concurrency=2).wait_ready()
    strong = json.loads(service.cli("submit", "replicate", f"{src}/", proven_dst, "--delete", "--wait",
                                    "--json").stdout)
    assert strong["state"] == "succeeded", strong
    for extra in ([], ["--delete", "--verify", "none"]):
        job = json.loads(service.cli("submit", "replicate", f"{src}/", proven_dst, weak_dst, *extra,
                                     "--wait", "--json").stdout)
        assert job["state"] == "succeeded", job
        records = service.jobs.proven(f"{src}/", [proven_dst, weak_dst])
        for dst in (proven_dst, weak_dst):
            assert records[dst]["synced_job"].startswith(job["id"])
            assert records[dst]["keeps_extra"] == (extra == [])
            assert records[dst]["verify"] == ("none" if "none" in extra else "store")
        assert records[proven_dst]["job"].startswith(strong["id"]), "the earlier proof is kept, not renewed"
        assert "proven_at" not in records[weak_dst], "a sync that keeps extras or skips verify proves nothing"
        status = service.cli("jobs", "status", job["id"]).stdout
        assert f"proven equal {weak_dst}: never; last synced" in status, status


def test_the_parts_of_a_large_file_run_as_separate_tasks_and_commit_once(service, emulator_for, make_root, tmp_path):
    """A file bigger than BRIDGE_FILE_TASK_BYTES goes out as several tasks (runs of its parts)
    that any worker may take; the job's finalize completes it. Each part is sent once, and the
    manifest holds a SHA-256 per part and their tree digest (the default digest, README:
    Digests), to S3 and to a local destination alike."""
    moto = emulator_for("s3")
    src = tmp_path / "src"
    hashes = write_tree(src, {"ckpt/model.bin": 42 * MiB + 5}, small=3)
    data = (src / "ckpt/model.bin").read_bytes()
    dst, local = make_root("s3"), tmp_path / "local"
    bucket = dst[len("s3://"):].rstrip("/")
    service.env["BRIDGE_FILE_TASK_BYTES"] = "10MiB"
    for name in ("w1", "w2"):
        service.worker(name, concurrency=2, threads=2)
    for worker in service.processes:
        worker.wait_ready()

    for target in (dst, f"{local}/"):
        result = service.cli("submit", "cp", f"{src}/", target, "--chunk-size", "5MiB", "--wait", "--json")
        assert result.returncode == 0, result.stderr + result.stdout
        status = json.loads(result.stdout)
        assert status["state"] == "succeeded" and status["verify"]["ok"], status["errors"]
        # 9 parts of 5 MiB, two to a task (10 MiB): 5 tasks for the file, 1 for the small ones
        assert status["progress"]["tasks_total"] == status["progress"]["tasks_done"] == 6, status["progress"]
        assert status["progress"]["files_done"] == 4

    assert s3_hashes(moto, bucket) == hashes
    _whole, parts = moto_puts(moto, bucket)
    assert sorted(parts) == [("ckpt/model.bin", n) for n in range(1, 10)] and set(parts.values()) == {1}
    part = 5 * MiB
    per_part = [hashlib.sha256(data[i:i + part]).hexdigest() for i in range(0, len(data), part)]
    remote = record(f"s3://{bucket}/", service.env)
    entry = next(e for e in remote["files"] if e["path"] == "ckpt/model.bin")
    assert entry["part_sha256"] == per_part and entry["sha256"] == "" and \
        entry["sha256_tree"] == sha256_tree(per_part, part)
    assert (local / "ckpt/model.bin").read_bytes() == data
    entry = next(e for e in record(f"{local}/", service.env)["files"]
                 if e["path"] == "ckpt/model.bin")
    assert entry["part_sha256"] == per_part and entry["sha256_tree"] == sha256_tree(per_part, part)


def test_a_same_account_job_on_workers_runs_by_server_and_says_so(service, make_root, tmp_path):
    """The route is chosen when the job is planned, carried by its tasks, and shown in the job's
    record, `jobs status` and the metrics; the bytes never pass through the worker."""
    src, dst = make_root("gs"), make_root("gs")
    files = {f"d/{i}.bin": os.urandom(20_000 + i) for i in range(6)}
    for rel, data in files.items():
        (tmp_path / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / rel).write_bytes(data)
    assert service.cli("cp", f"{tmp_path / 'src'}/", src, "-q").returncode == 0
    port = free_port()
    service.worker("w1", metrics_port=port).wait_ready()
    result = service.cli("submit", "cp", src, dst, "--wait", "--json")
    assert result.returncode == 0, result.stderr + result.stdout
    status = json.loads(result.stdout)
    assert status["state"] == "succeeded" and status["verify"]["ok"], status
    assert status["route"]["name"] == "server" and "one store account" in status["route"]["why"]
    assert status["route"]["bytes_through_bridge"] == 0 and status["route"]["fallbacks"] == 0
    text = service.cli("jobs", "status", status["id"]).stdout
    assert "route        server:" in text and "0 B through bridge" in text
    total = sum(map(len, files.values()))
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
            f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        routed = [line for line in response.read().decode().splitlines()
                  if line.startswith("bridge_route_bytes_total{")]
    assert [float(line.rsplit(" ", 1)[1]) for line in routed if 'route="server"' in line
            and 'path="store"' in line] == [total], routed
    assert not [line for line in routed if 'path="bridge"' in line], routed
    forced = json.loads(service.cli("submit", "cp", src, make_root("gs"), "--route", "direct", "--wait",
                                    "--json").stdout)
    assert forced["route"]["name"] == "direct" and forced["route"]["bytes_through_bridge"] == total
