"""What a newcomer's first week found wrong in check, verify, waits, cancel and the numbers policies
print, each shown over real HTTP against the emulators.

Requests are counted at a loopback proxy in front of the emulator (tests/faultproxy.py, no faults
injected): what the endpoint saw, not what the client says it sent.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import time

import pytest

from tests.faultproxy import FaultProxy, proxied_environment
from tests.helpers import mcbridge
from tests.test_workers_service import service  # noqa: F401  (the fixture)

OBJECTS = 5000


def _put_many(client, bucket: str, keys: list[str]) -> None:
    with cf.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda key: client.put_object(Bucket=bucket, Key=key, Body=key.encode() * 3), keys))


def test_check_decides_from_listings_and_names_what_failed(moto, make_root, emulator_env, tmp_path):
    """``check`` of 5,000 S3 objects against an equal local tree (the S3 side counted at a proxy)
    sends the listing's pages only, at most 10 requests per 1,000 objects: no S3 object is read
    (it was one ranged GET per object, 5,005 requests); the local side is hashed, at no request.
    One extra object fails it with a summary that says so."""
    src, dst = make_root("s3"), tmp_path / "dst"
    keys = [f"corpus/part-{i:05d}.txt" for i in range(OBJECTS)]
    _put_many(moto.client(), src[5:-1], keys)
    for key in keys:
        (dst / key).parent.mkdir(parents=True, exist_ok=True)
        (dst / key).write_bytes(key.encode() * 3)
    with FaultProxy(moto.endpoint) as proxy:
        env = proxied_environment(emulator_env, {"s3": proxy})
        r = mcbridge("check", src, f"{dst}/", env=env, state_dir=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        requests = proxy.counts["requests"]
        print(f"check of {OBJECTS} equal S3 objects: {requests} requests at the endpoint")
        assert requests <= 10 * OBJECTS // 1000, (requests, [line for line, _ in proxy.log[:20]])
        assert not [line for line, _ in proxy.log if line.startswith("GET /" + src[5:-1] + "/corpus/")]
        assert r.stdout.splitlines()[-1] == f"OK: {OBJECTS} of {OBJECTS} pairs equal ({OBJECTS} by md5)", r.stdout

        (dst / "corpus" / "zz-extra.txt").write_bytes(b"extra")
        r = mcbridge("check", src, f"{dst}/", env=env, state_dir=tmp_path)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "extra       corpus/zz-extra.txt" in r.stdout.splitlines(), r.stdout
        assert r.stdout.splitlines()[-1] == (f"FAILED: {OBJECTS} of {OBJECTS} pairs equal ({OBJECTS} by md5); "
                                             f"1 only at the destination"), r.stdout


def test_check_of_two_s3_trees_reads_no_object(moto, make_root, emulator_env, tmp_path):
    src, dst = make_root("s3"), make_root("s3")
    keys = [f"d{i % 3}/part-{i:03d}.txt" for i in range(40)]
    _put_many(moto.client(), src[5:-1], keys)
    _put_many(moto.client(), dst[5:-1], keys)
    with FaultProxy(moto.endpoint) as proxy:
        r = mcbridge("check", src, dst, env=proxied_environment(emulator_env, {"s3": proxy}), state_dir=tmp_path)
        assert r.returncode == 0 and r.stdout.splitlines()[-1] == "OK: 40 of 40 pairs equal (40 by md5)", r.stdout
        assert sorted(line.split(" ")[0] for line, _ in proxy.log) == ["GET", "GET", "HEAD", "HEAD"], proxy.log


def test_check_calls_a_pair_with_no_common_checksum_unproven_never_equal(moto, azurite, make_root, emulator_env,
                                                                          tmp_path):
    """An S3 object and an Azure blob of the same bytes share no checksum a store computed: check
    says they are unproven and how to prove them, and --download proves them by reading both."""
    src, dst = make_root("s3"), make_root("az")
    moto.client().put_object(Bucket=src[5:-1], Key="a.bin", Body=b"same bytes\n" * 100)
    azurite.client().get_blob_client(dst[5:-1], "a.bin").upload_blob(b"same bytes\n" * 100)
    r = mcbridge("check", src, dst, env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    last = r.stdout.splitlines()[-1]
    assert last.startswith("FAILED: 0 of 1 pairs equal; 1 unproven") and "--download" in last, r.stdout
    r = mcbridge("check", src, dst, "--download", "--json", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["by"] == {"download": 1}, r.stdout + r.stderr


def test_migrate_refuses_as_migrate_and_plan_says_how_to_enable_datasync(moto, make_root, emulator_env, tmp_path):
    src, dst = make_root("s3"), make_root("s3")
    moto.client().put_object(Bucket=src[5:-1], Key="a.bin", Body=b"x" * 100)
    r = mcbridge("migrate", src, dst, "--max-cost", "0", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 1 and r.stderr.startswith("mcbridge: error: migrate refused: estimated"), r.stderr
    r = mcbridge("plan", src, dst, env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith(" datasync "))
    assert "built, not enabled in these settings: off by default; enable it with MCBRIDGE_NATIVE_ROUTES=datasync" \
        in row and "--route datasync" in row, row


# -- waits with an end, and a cancel that answers at once (the service: real Redis, real workers) -----

def test_waits_on_the_service_end_with_one_line_when_their_timeout_lapses(service):  # noqa: F811
    """No worker consumes the queues: ``cache warm --node --wait``, ``jobs watch`` and ``submit
    --wait`` would wait for ever; with --timeout each exits 1 with one line naming it."""
    r = service.cli("cache", "warm", "s3://some-bucket/data/", "--node", "nowhere", "--wait", "--timeout", "1")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "mcbridge: error: cache warm on nowhere: no summary from a worker after 1s (--timeout)" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    job_id = service.submit("cp", "s3://some-bucket/data/", "s3://other-bucket/data/")
    r = service.cli("jobs", "watch", job_id, "--timeout", "1")
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr.strip().splitlines()[-1] == (f"mcbridge: error: job {job_id} is still queued after 1s (--timeout); "
                                                 f"it goes on: mcbridge jobs watch {job_id}"), r.stderr
    r = service.cli("submit", "cp", "s3://some-bucket/data/", "s3://other-bucket/data/", "--wait", "--timeout", "1")
    assert r.returncode == 1 and "is still queued after 1s (--timeout); it goes on" in r.stderr, r.stdout + r.stderr
    r = service.cli("submit", "cp", "s3://some-bucket/data/", "s3://other-bucket/data/", "--timeout", "1")
    assert r.returncode != 0 and "--timeout bounds --wait" in r.stderr, r.stdout + r.stderr


def test_jobs_cancel_answers_before_the_workers_stop_and_says_when_they_have(service, moto, tmp_path):  # noqa: F811
    """The workers' uploads are held at a proxy, so they cannot stop before it lets them go: the
    cancel's first line (what it dropped and asked to stop) must come while they are held, and
    its last (they stopped) after."""
    import re
    import subprocess
    import sys

    from tests.emulators import unique_name
    from tests.faultproxy import Rule
    src = tmp_path / "src"
    src.mkdir()
    for i in range(8):
        (src / f"f{i}.bin").write_bytes(bytes([i]) * (6 * 1024 * 1024))
    bucket = unique_name()
    moto.create_bucket(bucket)
    with FaultProxy(moto.endpoint) as proxy:
        proxy.configure(rules=[Rule(rf"^PUT /{bucket}/", "hold", times=10_000)])
        service.env.update(proxied_environment(service.env, {"s3": proxy}))
        service.worker("w1", threads=2).wait_ready()
        job_id = service.submit("cp", f"{src}/", f"s3://{bucket}/c/", "--chunk-size", "5MiB")
        while proxy.counts["hold"] == 0:
            assert service.jobs.get(job_id).state in ("queued", "planning", "running")
            time.sleep(0.05)
        cancel = subprocess.Popen([sys.executable, "-m", "bridge", "jobs", "cancel", job_id, "--wait"],
                                  env=service.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            first = cancel.stdout.readline().strip()
            assert service.jobs.get(job_id).finished is None   # the workers are still held
            found = re.fullmatch(rf"cancelling job {job_id} \(it was running\): (\d+) tasks? not started dropped, "
                                 r"(\d+) running asked to stop", first)
            assert found and int(found[2]) >= 1, first
            proxy.release()
            rest, errors = cancel.communicate(timeout=120)
        finally:
            cancel.kill()
        assert cancel.returncode == 0, rest + errors
        assert re.fullmatch(rf"cancelled job {job_id}: its workers stopped at \S+, nothing committed", rest.strip()), rest


# -- shard sets on every store -------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["az", "gs", "s3"])
def test_a_shard_set_migrated_as_files_is_recognised_by_verify_on_every_store(kind, moto, make_root, emulator_env,
                                                                              emulator_for, tmp_path):
    """A corpus packed on S3, then migrated as files to each store: verify there names the shard
    set and finds it intact, as it does on S3; a shard list changed there fails it."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"f{i}.bin").write_bytes(bytes([i]) * (2000 + i))
    packed, copy = make_root("s3") + "corpus/", make_root(kind) + "corpus/"
    assert mcbridge("migrate", f"{src}/", packed, "--pack", "tar", "-q", env=emulator_env,
                    state_dir=tmp_path).returncode == 0
    r = mcbridge("migrate", packed, copy, "-q", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    r = mcbridge("verify", copy, "--json", env=emulator_env, state_dir=tmp_path)
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["shard_sets"] == [
        {"prefix": "shard", "index": "shard.index.json", "ok": True, "problems": []}], r.stdout + r.stderr

    from bridge.stores import get_store
    from bridge.urls import parse
    from tests.helpers import settings_for
    store = get_store(parse(copy), settings_for(emulator_env))
    listed = parse(copy + "shard.index.d/shard-000000.tar.jsonl")
    body = store.read(listed)
    from bridge.hashing import crc32c, crc_hex
    store.put(listed, body + b"\n", crc32c=crc_hex(crc32c(body + b"\n")), metadata={})
    r = mcbridge("verify", copy, "--json", env=emulator_env, state_dir=tmp_path)
    problems = json.loads(r.stdout)["shard_sets"][0]["problems"]
    assert r.returncode == 1 and any("does not match the SHA-256" in p for p in problems), r.stdout


# -- spend that adds up ----------------------------------------------------------------------------

def test_policy_status_spend_is_the_sum_of_its_destinations(service, moto, fake_gcs, azurite, tmp_path):  # noqa: F811
    """A policy run in process to two destinations: policy status's spend for the policy is the sum
    of the two it shows per destination (it was the budget's charges, which an in-process run
    never makes: $0 against two spends above zero)."""
    from tests.emulators import unique_name
    from tests.test_service_policies import _put_checkpoint
    src, gbucket, container = unique_name(), unique_name(), unique_name()
    moto.create_bucket(src)
    fake_gcs.create_bucket(gbucket)
    azurite.create_bucket(container)
    _put_checkpoint(moto, src, "step-1")
    gs, az = f"gs://{gbucket}/dr/", f"az://{container}/dr/"
    policy_file = tmp_path / "policies.yaml"
    policy_file.write_text(f"policies:\n  golden:\n    source: s3://{src}/golden/\n    destinations: [{gs}, {az}]\n"
                           f"    checkpoints: \"step-*\"\n    verify: store\n")
    r = service.cli("replicate", "--policy", str(policy_file), "--once", "--json")
    assert r.returncode == 0, r.stderr
    status = json.loads(service.cli("policy", "status", str(policy_file), "--json").stdout)
    [golden] = status["policies"]
    spends = [row["spent_usd"] for row in golden["destinations"]]
    assert all(s > 0 for s in spends) and golden["spent_usd"] == pytest.approx(sum(spends), abs=1e-12), golden
    from bridge.policies.cost.money import usd
    text = service.cli("policy", "status", str(policy_file)).stdout.splitlines()[0]
    assert text.startswith(f"golden: s3://{src}/golden/: {usd(sum(spends))} spent in ") and \
        f"(= {usd(spends[0])} + {usd(spends[1])})" in text, text


# -- commit-to-verified from the newest file ------------------------------------------------------

def test_commit_to_verified_is_measured_from_the_newest_shard_not_an_index_written_first(moto, fake_gcs,
                                                                                         emulator_env, tmp_path):
    """A sharded safetensors checkpoint whose index went up before its shards: the commit time
    a policy run reports (and measures commit-to-verified from) is the newest shard's
    LastModified as the source lists it, not the index's."""
    from datetime import timezone

    from tests.emulators import unique_name
    from tests.test_readiness_evidence import tensors_file
    src, gbucket = unique_name(), unique_name()
    moto.create_bucket(src)
    fake_gcs.create_bucket(gbucket)
    s3 = moto.client()
    shards = {f"model-{n:05d}-of-00002.safetensors": tensors_file(n) for n in (1, 2)}
    weight_map = {f"layers.{n}.weight": f"model-{n:05d}-of-00002.safetensors" for n in (1, 2)}
    s3.put_object(Bucket=src, Key="golden/step-1/model.safetensors.index.json",
                  Body=json.dumps({"metadata": {"total_size": 512}, "weight_map": weight_map}).encode())
    time.sleep(1.1)   # S3 dates objects to the second: the shards land in a later one than the index
    for name, body in shards.items():
        s3.put_object(Bucket=src, Key=f"golden/step-1/{name}", Body=body)
    listed = {o["Key"].rsplit("/", 1)[1]: o["LastModified"]
              for o in s3.list_objects_v2(Bucket=src, Prefix="golden/step-1/")["Contents"]}
    newest_shard = max(listed[name] for name in shards)
    assert newest_shard > listed["model.safetensors.index.json"]

    policy_file = tmp_path / "policies.yaml"
    policy_file.write_text(f"policies:\n  golden:\n    source: s3://{src}/golden/\n    destinations: "
                           f"[gs://{gbucket}/dr/]\n    checkpoints: \"step-*\"\n    verify: store\n")
    r = mcbridge("replicate", "--policy", str(policy_file), "--once", "--json", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    run = json.loads(r.stdout)["policies"][0]
    assert run["committed_at"]["step-1"] == newest_shard.astimezone(timezone.utc).isoformat(timespec="seconds"), run
    row = run["destinations"][f"gs://{gbucket}/dr/"]
    assert row["commit_to_verified_s"] is not None, row
