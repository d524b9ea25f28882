"""Redis memory per queued unit and per journaled record, at 1,000,000 of them.

    .venv/bin/python -m bench.bench_redis_footprint            # 1,000,000 each, about a minute
    .venv/bin/python -m bench.bench_redis_footprint --units 100000

1. A real job, to see the records as the service writes them: one ``mcbridge worker -c 1`` on a
   Redis of its own (redis-server on a free loopback port; the machine's Redis is not touched) and
   moto; ``mcbridge submit cp`` of small files and one multipart file, slowed by ``--bwlimit`` so
   that its journal, its list of signed sub-plans and its queued messages can be read while it
   runs. Sampled from Redis: ``file:`` and ``part:`` journal records, a sub-plan of small files,
   the broker's queued messages.
2. At scale, on a second empty Redis of its own: ``--units`` journal records of each kind written
   through ``RedisJournal.put_many`` (the workers' own path: hash, key-order index, expiry), their
   paths varied as a corpus's are (``data/shard-NNNN/file-NNNNNNN.bin``); and the sub-plans of
   ``--units`` small files as the planner pushes them (``fan_out`` batches of ``BRIDGE_BATCH_FILES``,
   each signed with ``Keyring.task_text``, to the job's task list). Memory is Redis's own count:
   ``INFO memory`` used_memory before and after, and ``MEMORY USAGE`` of each key written.

Queued broker messages are counted from the real job's queue (bytes per message and per file it
carries), not at scale: a queued task's message holds its sub-plan text once more, so a job's
queued-but-unstarted tasks cost their sub-plans twice until a worker takes them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.emulators import MotoServer, RedisServer  # noqa: E402

MiB = 1024 * 1024


def used(client) -> int:
    return int(client.info("memory")["used_memory"])


def sample_live(work: Path) -> dict:
    """Records of a real job, read from Redis while it runs."""
    from bridge.workers.keys import Keys, redis_client
    from bridge.workers.testing import ServiceProcess, tenant_env
    src = work / "src"
    src.mkdir()
    for n in range(400):
        (src / f"f{n:04d}.bin").write_bytes(os.urandom(4096))
    (src / "big.bin").write_bytes(os.urandom(12 * MiB))
    redis, moto = RedisServer().start(), MotoServer().start()
    namespace = "footprint"
    try:
        moto.create_bucket("dst")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "BRIDGE_", "MCBRIDGE_"))}
        env.update(moto.env(), XDG_CONFIG_HOME=str(work / "noconfig"), AWS_EC2_METADATA_DISABLED="true",
                   BRIDGE_BROKER_URL=redis.url(0), BRIDGE_NAMESPACE=namespace, BRIDGE_METRICS_PORT="0",
                   BRIDGE_TASK_SECONDS="0.5s", MCBRIDGE_CHUNK_SIZE="5MiB", MCBRIDGE_STATE_DIR=str(work / "state"),
                   **tenant_env(work / "tenant", local_roots=[str(work)]))
        client, keys = redis_client(redis.url(0)), Keys(namespace)
        with ServiceProcess.worker(env, "fp", work, concurrency=1):
            out = subprocess.run([sys.executable, "-m", "bridge", "submit", "cp", f"{src}/", "s3://dst/x/", "--json",
                                  "--bwlimit", "200KiB"], env=env, capture_output=True, text=True, check=True)
            job = json.loads(out.stdout)["id"]
            seen: dict = {}
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and not ("file" in seen and "part" in seen and "queue" in seen):
                record = client.hgetall(keys.job(job))
                if record.get("state") in ("succeeded", "failed"):
                    break
                plan_key = record.get("plan_key")
                if plan_key:
                    for kind in ("file", "part"):
                        name = f"{keys.journal(plan_key)}:{kind}"
                        if kind not in seen and client.hlen(name) >= (20 if kind == "file" else 1):
                            seen[kind] = client.hrandfield(name, 5, withvalues=True)
                    tasks = client.lrange(keys.job(job, "tasks"), 0, -1)
                    if tasks and "tasks" not in seen:
                        seen["tasks"] = tasks
                        seen["files_total"] = int(record.get("files_total") or 0)
                    queue = f"{namespace}:bridge.s3"   # the route queue of s3 (kombu's list, global key prefix)
                    if "queue" not in seen and client.llen(queue) > 0:
                        messages = client.lrange(queue, 0, -1)
                        seen["queue"] = {"messages": len(messages), "bytes": client.memory_usage(queue, samples=0),
                                         "files": sum(map(_message_files, messages))}
                time.sleep(0.1)
            subprocess.run([sys.executable, "-m", "bridge", "jobs", "cancel", job], env=env, capture_output=True)
        return seen
    finally:
        moto.stop()
        redis.stop()


def _message_files(raw: str) -> int:
    """The files of the sub-plan a queued transfer message carries (kombu's envelope, its body
    base64: [args, kwargs, embed], args [job, sub-plan text, signature])."""
    import base64
    body = json.loads(base64.b64decode(json.loads(raw)["body"]))
    sub = body[0][1]
    return len((json.loads(sub) if isinstance(sub, str) else sub).get("files", []))


def journal_at_scale(client, kind: str, samples: list[str], units: int) -> dict:
    """``units`` records of one kind through RedisJournal.put_many; Redis's memory for them."""
    from bridge.workers.redisjournal import RedisJournal
    journal = RedisJournal(client, f"fp:journal:{uuid.uuid4().hex[:12]}", 7 * 86400)
    values = [json.loads(v) for v in samples[1::2]]
    before, batch = used(client), []
    for n in range(units):
        rel = f"data/shard-{n // 1000:04d}/file-{n:07d}.bin"
        value = dict(values[n % len(values)])
        for field in ("path", "rel"):
            if field in value:
                value[field] = rel
        if isinstance(value.get("source_id"), dict):
            value["source_id"] = {**value["source_id"], "inode": str(3_000_000 + n)}
        batch.append((f"{kind}:{rel}" + (f":{n % 100 + 1}" if kind == "part" else ""), value))
        if len(batch) == 5000:
            journal.put_many(batch)
            batch = []
    if batch:
        journal.put_many(batch)
    names = [f"{journal.key}:{kind}"] + ([f"{journal.key}:{kind}:order"] if kind == "file" else [])
    usage = {name.rsplit(":", 1)[-1] if name.endswith("order") else "hash": client.memory_usage(name, samples=0)
             for name in names}
    grown = used(client) - before
    journal.clear()
    return {"used_memory": grown, "per_record": grown / units, "keys": usage,
            "record_json_bytes": sum(len(json.dumps(v, separators=(",", ":"))) for v in values) / len(values)}


def subplans_at_scale(client, sample_texts: list[str], units: int, batch_files: int) -> dict:
    """The signed sub-plans of ``units`` small files as the planner pushes them (a task list)."""
    from bridge.workers.auth import Keyring, new_key
    from bridge.workers.kinds import fan_out
    from bridge.pipeline.plan import Plan
    from bridge.workers.executor import _task_entry
    subs = [json.loads(_task_entry(raw)[1]) for raw in sample_texts]
    small = next(s for s in subs if s.get("files") and not any(f.get("part_size") for f in s["files"]))
    template = small["files"][0]
    files = []
    for n in range(units):
        f = dict(template)
        f["rel"] = f"data/shard-{n // 1000:04d}/file-{n:07d}.bin"
        if isinstance(f.get("source_id"), dict):
            f["source_id"] = {**f["source_id"], "inode": str(3_000_000 + n)}
        files.append(f)
    plan = Plan.from_dict({**small, "files": files})
    keyring = Keyring(keys={"tests": bytes.fromhex(new_key())}, tenant="tests")
    key, before, count, chunk = f"fp:job:{uuid.uuid4().hex[:8]}:tasks", used(client), 0, []
    for sub in fan_out(plan, batch_files, 1 << 40):
        task_id = f"job.t{count}"
        text, sig = keyring.task_text("tests", "0" * 64, task_id, sub.to_dict())
        chunk.append(f"[{json.dumps(task_id)},{text},{json.dumps(sig)}]")
        count += 1
        if len(chunk) >= 50:
            client.rpush(key, *chunk)
            chunk = []
    if chunk:
        client.rpush(key, *chunk)
    grown = used(client) - before
    usage = client.memory_usage(key, samples=0)
    client.delete(key)
    return {"tasks": count, "used_memory": grown, "per_unit": grown / units, "list_bytes": usage,
            "file_entry_json_bytes": len(json.dumps(template, separators=(",", ":")))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--units", type=int, default=1_000_000)
    ap.add_argument("--batch-files", type=int, default=5000, help="BRIDGE_BATCH_FILES")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bridge-bench-footprint-"))
    seen = sample_live(work)
    missing = {"file", "part", "tasks"} - set(seen)
    if missing:
        raise SystemExit(f"the live job ended before its {sorted(missing)} could be read; slow it more")
    print("live job: a file record", seen["file"][1])
    print("live job: a part record", seen["part"][1])
    if "queue" in seen:
        q = seen["queue"]
        print(f"live job: {q['messages']} queued messages carrying {q['files']} files, {q['bytes']} bytes in Redis "
              f"({q['bytes'] / max(1, q['files']):.0f} per file queued)")
    redis = RedisServer().start()
    try:
        from bridge.workers.keys import redis_client
        client = redis_client(redis.url(0))
        print(f"empty Redis: used_memory {used(client)} bytes")
        rows = {"file": journal_at_scale(client, "file", seen["file"], args.units),
                "part": journal_at_scale(client, "part", seen["part"], args.units),
                "subplan": subplans_at_scale(client, seen["tasks"], args.units, args.batch_files)}
        print(json.dumps(rows, indent=1))
        print(f"\n| at {args.units:,} | bytes each (used_memory) | MiB in all |")
        print("|---|---|---|")
        for name, label in (("file", "journaled file (`file:` record + key-order index)"),
                            ("part", "journaled part (`part:` record)"),
                            ("subplan", f"planned small file (signed sub-plan, {args.batch_files:,} a task)")):
            r = rows[name]
            each = r.get("per_record", r.get("per_unit"))
            print(f"| {label} | {each:.0f} | {r['used_memory'] / MiB:.0f} |")
    finally:
        redis.stop()


if __name__ == "__main__":
    main()
