"""Where a service job's time goes, phase by phase, for two checkouts side by side.

    python -m bench.bench_service_phases --baseline /path/to/other/.venv/bin/python [--rounds 5] [--files 4000]

One local tree of FILES x 16 KiB is copied to one ``rclone serve s3`` by ``mcbridge submit cp
--wait --json`` on a worker of one pool process per checkout (``A``: the interpreter given as
``--baseline``, with the checkout it has installed; ``B``: this one), each worker on a queue and
in a Redis namespace of its own, and by an in-process ``mcbridge cp`` (``in``, this checkout), in
interleaved rounds after one warm-up round (the first job of a pool process; printed, not
counted). Per run, from the submitter's side and the job's record (raw timestamps, not the
second-rounded ones of ``jobs status``):

  to_created   the submitter's start to the job's record (start-up, signing)
  queued       the record to the plan task's start
  job          the plan task's start to the job's end; plan, tasks, moving, finalize inside it
  to_output    the job's end to the submitter's first byte of output (how --wait learns of it)
  teardown     that byte to the submitter's exit
  cli_cpu, worker_cpu, rclone_cpu   CPU seconds of the submitter (or cp), the worker's
               processes and the endpoint during the run

On a loaded machine the wall times say little; the phases and CPU times say more. Medians and
minimums of the counted rounds at the end, then every row as JSON.
"""

from __future__ import annotations

import argparse
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

from bench.bench_celery import small_tree
from bench.bench_transfer import children_cpu, cpu_of, process_tree
from bridge.workers.keys import redis_client
from bridge.workers.testing import purge_namespace, tenant_env
from tests.emulators import RcloneS3, Redis


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="python of the other checkout's venv (side A)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--files", type=int, default=4000)
    args = ap.parse_args()
    if not Path(args.baseline).exists():
        raise SystemExit(f"--baseline {args.baseline}: no such interpreter")
    sides = {"A": args.baseline, "B": sys.executable}
    work = Path(tempfile.mkdtemp(prefix="mcbridge-bench-phases-"))
    src = f"{small_tree(work / 'data', args.files, 16)}/"
    server, redis = RcloneS3(), Redis().start()
    client = redis_client(redis.url)
    namespaces = {s: f"phases{s}-{uuid.uuid4().hex[:6]}" for s in sides}
    workers: dict[str, subprocess.Popen] = {}
    try:
        server.start()
        server.create_bucket("bench")
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("AWS_", "AZURE_", "BRIDGE_", "PYTHONDONTWRITEBYTECODE"))}
        common = {**base, **server.env(), "XDG_CONFIG_HOME": str(work / "noconfig"), "AWS_EC2_METADATA_DISABLED": "true",
                  "BRIDGE_BROKER_URL": redis.url, "BRIDGE_METRICS_PORT": "0",
                  **tenant_env(work / "tenant", local_roots=[str(work)])}
        # each side's compiled modules in a folder of its own, never in either checkout
        env = {s: {**common, "BRIDGE_NAMESPACE": namespaces[s], "MCBRIDGE_STATE_DIR": str(work / f"state-{s}"),
                   "PYTHONPYCACHEPREFIX": str(work / f"pycache-{s}")} for s in sides}
        for s, python in sides.items():
            log = open(work / f"worker-{s}.log", "ab")
            workers[s] = subprocess.Popen(
                [python, "-m", "bridge", "worker", "--hostname", f"phases{s}@bench", "--concurrency", "1",
                 "--pool", "prefork", "--metrics-port", "0", "--loglevel", "INFO", "--queues", f"phases.{s}"],
                env=env[s], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            log.close()
        for s in sides:
            while not client.exists(f"{namespaces[s]}:worker:phases{s}@bench"):
                if workers[s].poll() is not None:
                    raise SystemExit((work / f"worker-{s}.log").read_text()[-3000:])
                time.sleep(0.2)
        rows: dict[str, list[dict]] = {k: [] for k in ("in", *sides)}
        order, run = ["in", *sides], 0
        for rnd in range(-1, args.rounds):
            for side in (order if rnd % 2 == 0 else order[::-1]):
                run += 1
                dst = f"s3://bench/r{run}/"
                wpids = process_tree(workers[side].pid) if side != "in" else []
                w0, rc0, c0, t0 = sum(map(cpu_of, wpids)), cpu_of(server.pid), children_cpu(), time.time()
                if side == "in":
                    done = subprocess.run([sys.executable, "-m", "bridge", "cp", src, dst, "-q", "--store-checksums", "skip"],
                                          env=env["B"], capture_output=True, text=True)
                    out, code, errors = done.stdout, done.returncode, done.stderr
                else:
                    proc = subprocess.Popen([sides[side], "-m", "bridge", "submit", "cp", src, dst, "--wait", "--json",
                                             "--verify", "none", "--queue", f"phases.{side}", "--store-checksums", "skip"],
                                            env=env[side], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                    first = proc.stdout.read(1)
                    t_out = time.time()
                    out, errors = first + proc.stdout.read(), proc.stderr.read()
                    code = proc.wait()
                t1 = time.time()
                if code != 0:
                    raise SystemExit(f"{side} failed ({code}): {errors[-2000:]}")
                row = {"wall": t1 - t0, "cli_cpu": children_cpu() - c0, "rclone_cpu": cpu_of(server.pid) - rc0}
                if side != "in":
                    row["worker_cpu"] = sum(map(cpu_of, process_tree(workers[side].pid))) - w0
                    h = client.hgetall(f"{namespaces[side]}:job:{json.loads(out)['id']}")
                    created, started, finished = (float(h[k]) for k in ("created", "started", "finished"))
                    ms = {k: int(h.get(k, 0)) / 1000 for k in ("plan_ms", "finalize_ms", "task_ms", "moving_ms")}
                    row.update(to_created=created - t0, queued=started - created, job=finished - started,
                               to_output=t_out - finished, teardown=t1 - t_out, plan=ms["plan_ms"],
                               tasks=ms["task_ms"], moving=ms["moving_ms"], finalize=ms["finalize_ms"],
                               overhead_per_task=(ms["task_ms"] - ms["moving_ms"]) / max(1, int(h.get("tasks_done", 1))))
                print(f"round {rnd if rnd >= 0 else 'warm-up'} {side:3s} "
                      + " ".join(f"{k} {v:.3f}" for k, v in row.items()) + f"  load {os.getloadavg()[0]:.1f}", flush=True)
                if rnd >= 0:
                    rows[side].append(row)
        print(f"\nmedian (min) of {args.rounds} rounds")
        for side, rs in rows.items():
            print(f"{side:3s} " + "  ".join(f"{k} {statistics.median(r[k] for r in rs):.3f} ({min(r[k] for r in rs):.3f})"
                                        for k in rs[0]))
        print(json.dumps(rows))
    finally:
        for w in workers.values():
            try:
                os.killpg(w.pid, 15)
                w.wait(20)
            except (OSError, subprocess.TimeoutExpired):
                pass
            try:
                os.killpg(w.pid, 9)
            except OSError:
                pass
        server.stop()
        for ns in namespaces.values():
            purge_namespace(redis.url, ns)
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
