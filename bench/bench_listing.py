"""Planning a corpus job on the service: one lister against its listing split by sub-prefix over
one and two workers.

    python -m bench.bench_listing [--objects 100000] [--folders 16] [--rounds 3] [--delay-ms 10]

OBJECTS small objects in FOLDERS top-level folders of one prefix on ``rclone serve s3`` (its
folder written directly: the objects cost no upload), reached through tests/latencyproxy.py
(DELAY_MS each way, a store some way off). Three queues in one Redis namespace, each with its own
workers of one pool process: ``one`` (a worker with BRIDGE_LIST_PARTS=0: its planner lists the
whole prefix), ``split1`` (one worker: two parts, listed one after the other) and ``split2`` (two
workers: four parts, two at a time). Each round submits ``cp`` of the prefix to a local folder on
each queue in rotated order, and times the planning: from the job's start (its plan task taking
it) to its state ``running`` (every slice signed and queued), read from Redis every 10 ms; then
the job is cancelled (its copy is not what is measured). Medians and best of the rounds, with the
load average before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bridge.workers.keys import redis_client
from bridge.workers.testing import purge_namespace, tenant_env
from tests.emulators import RcloneS3, Redis
from tests.latencyproxy import LatencyProxy

QUEUES = {"one": (1, "0"), "split1": (1, "2"), "split2": (2, "2")}   # queue: (workers, BRIDGE_LIST_PARTS)


def write_corpus(data: Path, objects: int, folders: int) -> None:
    root = data / "bench" / "corpus"
    for i in range(objects):
        folder = root / f"f{i % folders:02d}"
        if i < folders:
            folder.mkdir(parents=True, exist_ok=True)
        (folder / f"o{i:07d}.bin").write_bytes(b"%07d" % i)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=100_000)
    ap.add_argument("--folders", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--delay-ms", type=float, default=10.0)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mcbridge-bench-listing-"))
    data = work / "data"
    started = time.monotonic()
    write_corpus(data, args.objects, args.folders)
    print(f"{args.objects} objects in {args.folders} folders written in {time.monotonic() - started:.1f}s", flush=True)
    server, redis = RcloneS3(data=data), Redis().start()
    namespace = f"listing-{uuid.uuid4().hex[:6]}"
    client = redis_client(redis.url)
    processes: list[subprocess.Popen] = []
    try:
        server.start()
        proxy = LatencyProxy(server.port, args.delay_ms / 1000).start()
        base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "BRIDGE_", "MCBRIDGE_"))}
        env = {**base, **server.env(), "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}",
               "XDG_CONFIG_HOME": str(work / "noconfig"), "AWS_EC2_METADATA_DISABLED": "true",
               "BRIDGE_BROKER_URL": redis.url, "BRIDGE_NAMESPACE": namespace, "BRIDGE_METRICS_PORT": "0",
               "MCBRIDGE_STATE_DIR": str(work / "state"), **tenant_env(work / "tenant", local_roots=[str(work)])}
        names = []
        for queue, (count, parts) in QUEUES.items():
            for n in range(count):
                name = f"{queue}w{n}@bench"
                log = open(work / f"{queue}w{n}.log", "ab")
                processes.append(subprocess.Popen(
                    [sys.executable, "-m", "bridge", "worker", "--hostname", name, "--concurrency", "1",
                     "--pool", "prefork", "--metrics-port", "0", "--loglevel", "INFO", "--queues", f"bench.{queue}"],
                    env={**env, "BRIDGE_LIST_PARTS": parts}, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True))
                log.close()
                names.append(name)
        for name in names:
            while not client.exists(f"{namespace}:worker:{name}"):
                if any(p.poll() is not None for p in processes):
                    raise SystemExit("a worker exited: see " + str(work))
                time.sleep(0.2)
        rows: dict[str, list[float]] = {q: [] for q in QUEUES}
        order = list(QUEUES)
        load_before = os.getloadavg()
        for rnd in range(args.rounds):
            for queue in order[rnd % len(order):] + order[:rnd % len(order)]:
                out = work / f"out-{queue}-{rnd}"
                submit = subprocess.run([sys.executable, "-m", "bridge", "submit", "cp", "s3://bench/corpus/",
                                         f"{out}/", "--queue", f"bench.{queue}", "--verify", "none", "--json"],
                                        env=env, capture_output=True, text=True)
                if submit.returncode != 0:
                    raise SystemExit(submit.stderr[-2000:])
                job = json.loads(submit.stdout)["id"]
                key = f"{namespace}:job:{job}"
                while client.hget(key, "state") in ("queued", "planning"):
                    time.sleep(0.01)
                running_at = time.time()
                h = client.hgetall(key)
                if h.get("state") != "running":
                    raise SystemExit(f"job {job} on {queue}: {h.get('state')}: {client.lrange(key + ':errors', 0, 3)}")
                planning = running_at - float(h["started"])
                rows[queue].append(planning)
                parts = len(json.loads(h["list_parts"])) if h.get("list_parts") else 1
                print(f"round {rnd} {queue:6s} planning {planning:6.2f}s  parts {parts:2d}  tasks {h.get('tasks_total')}"
                      f"  listed by {h.get('listed_by', '[planner]')}  load {os.getloadavg()[0]:.1f}", flush=True)
                subprocess.run([sys.executable, "-m", "bridge", "jobs", "cancel", job], env=env,
                               capture_output=True, text=True, timeout=120)
                deadline = time.monotonic() + 120
                while client.hget(key, "state") not in ("cancelled", "succeeded", "failed") \
                        and time.monotonic() < deadline:
                    time.sleep(0.1)
                time.sleep(2)   # its workers settle before the next job
        load_after = os.getloadavg()
        print(f"\nload average before {load_before[0]:.1f}, after {load_after[0]:.1f}")
        print("| queue | workers | parts | planning median | best |")
        print("|---|---:|---:|---:|---:|")
        for queue, (count, parts) in QUEUES.items():
            times = rows[queue]
            print(f"| {queue} | {count} | {'1 (planner)' if parts == '0' else int(parts) * count} | "
                  f"{statistics.median(times):.2f} s | {min(times):.2f} s |")
    finally:
        for p in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 15)
        for p in processes:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
        purge_namespace(redis.url, namespace)
        server.stop()
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
