"""The transfer bench through Celery: the same copy in process (``mcbridge cp``) and through two
local workers (``mcbridge submit cp --wait``), on the same S3 endpoint.

    python -m bench.bench_celery [--size-mib 1024] [--files 2000] [--endpoint rclone|moto] [--repeat 2]

Cases:
  (a) one big file, local -> S3. Its parts stay in one worker process (the file's SHA-256 is fed
      in part order), so this measures what Celery costs: the plan and finalize tasks, the Redis
      journal, leases and heartbeats. Target: within 15% of in-process.
  (b) many 16 KiB files, local -> S3, fanned out in batches over both workers.
Times are wall clock from the command's start to its exit, the CLI's own start-up included on
both sides. Jobs run with ``--verify none`` (cp does not verify either) and, on rclone serve s3,
which keeps no checksums, ``--store-checksums skip`` on both sides. Redis: the machine's on
127.0.0.1:6379 if it answers, else a private redis-server; a namespace of its own either way.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.bench_transfer import make_data
from tests.emulators import MotoServer, RcloneS3, Redis
from bridge.workers.testing import ServiceProcess, purge_namespace

MiB = 1024 * 1024


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    result = subprocess.run(cmd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"failed ({result.returncode}): {' '.join(cmd)}\n{result.stderr[-2000:]}")
    return elapsed, result.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--endpoint", choices=("rclone", "moto"), default="rclone")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--pool", type=int, default=2, help="tasks at once per worker (pool processes)")
    ap.add_argument("--repeat", type=int, default=2, help="runs per side and case; the fastest counts")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="mcbridge-bench-celery-"))
    mcbridge = [sys.executable, "-m", "bridge"]
    big, small = make_data(work / "data", args.size_mib, args.files)
    cases = [("a", f"(a) {args.size_mib} MiB, 1 file", big, big.stat().st_size)]
    if args.files:
        cases.append(("b", f"(b) {args.files} x 16 KiB", Path(f"{small}/"), args.files * 16 * 1024))
    server = (RcloneS3 if args.endpoint == "rclone" else MotoServer)()
    redis = Redis().start()
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    workers: list[ServiceProcess] = []
    try:
        server.start()
        server.create_bucket("bench")
        base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "BRIDGE_"))}
        env = {**base, **server.env(), "MCBRIDGE_STATE_DIR": str(work / "state"),
               "XDG_CONFIG_HOME": str(work / "noconfig"), "AWS_EC2_METADATA_DISABLED": "true",
               "BRIDGE_BROKER_URL": redis.url, "BRIDGE_NAMESPACE": namespace, "BRIDGE_METRICS_PORT": "0"}
        sums = ["--store-checksums", "skip"] if args.endpoint == "rclone" else []
        for n in range(1, args.workers + 1):
            workers.append(ServiceProcess.worker(env, f"bench{n}", work, concurrency=args.pool).start())
        for w in workers:
            w.wait_ready()
        print(f"{args.endpoint} S3 at {server.endpoint}; {args.workers} workers x {args.pool} tasks; "
              f"Redis {redis.url}; {os.cpu_count()} CPUs", flush=True)
        rows = []
        for _key, label, path, nbytes in cases:
            best: dict[str, float] = {}
            job_seconds = None
            for run in range(args.repeat):
                src = str(path) + ("/" if path.is_dir() else "")
                t, _ = timed([*mcbridge, "cp", src, f"s3://bench/inproc-{_key}{run}/", "-q", *sums], env)
                best["in-process"] = min(best.get("in-process", t), t)
                print(f"{label:<22} in-process  {t:7.2f}s {nbytes / t / MiB:7.1f} MiB/s", flush=True)
                t, out = timed([*mcbridge, "submit", "cp", src, f"s3://bench/celery-{_key}{run}/", "--wait",
                                "--json", "--verify", "none", *sums], env)
                status = json.loads(out)
                assert status["state"] == "succeeded", status
                job = status["progress"]["elapsed_s"]
                job_seconds = job if job_seconds is None else min(job_seconds, job)
                best["celery"] = min(best.get("celery", t), t)
                print(f"{label:<22} celery      {t:7.2f}s {nbytes / t / MiB:7.1f} MiB/s "
                      f"(job {job:.2f}s, {status['progress']['tasks_total']} tasks)", flush=True)
            rows.append((label, nbytes, best, job_seconds))
        print()
        print("best of each: throughput through Celery / in process")
        for label, nbytes, best, job_seconds in rows:
            ratio = best["in-process"] / best["celery"]
            print(f"  {label:<22} in-process {nbytes / best['in-process'] / MiB:7.1f} MiB/s   celery "
                  f"{nbytes / best['celery'] / MiB:7.1f} MiB/s   ratio {ratio:.2f} "
                  f"({(ratio - 1) * 100:+.0f}%; job alone {job_seconds:.2f}s)")
    finally:
        for w in workers:
            w.stop()
        server.stop()
        purge_namespace(redis.url, namespace)
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
