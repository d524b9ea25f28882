"""The transfer bench through Celery: the same copy in process (``mcbridge cp``) and through local
workers (``mcbridge submit cp --wait``), on the same S3 endpoint, in one run.

    python -m bench.bench_celery [--big-mib 1024] [--corpora 4000x16,20000x8] [--repeat 3]

Corpora: one big file (``--big-mib``; 0 leaves it out) and small-file trees (``--corpora``, each
FILESxKIB), all local -> S3. Each corpus is copied by:
  in-process   ``mcbridge cp``
  -c 1         one worker with one pool process
  -c 2         one worker with two pool processes
  2 x -c 1     two workers (two processes, as two machines would be) of one pool process each
Each configuration of workers consumes a queue of its own (the job names it with ``--queue``), so
the idle workers of the others never take its tasks; the two workers of ``2 x -c 1`` share theirs,
and so the job. The big file runs in process and on ``-c 2`` only (one file is one task).

Rounds are interleaved (every configuration once per round, then again), each round starting with
the next configuration, so that none always runs first or last; the fastest run of each counts, and
the ratio of the medians of all the rounds is printed beside it (on a shared machine whose speed
wanders from minute to minute, one lucky run of the in-process copy sways every best-of ratio).
Before each run the page cache is written back (``sync``), and after it what the run wrote is
deleted (``rclone purge``), both untimed, so that every run meets the same empty destination: the
endpoint's CPU per request grew with the objects it held (rclone serve s3 keeps a listing of each
folder it has served), which made each later run of a round slower. rclone serve s3 keeps its
objects on a tmpfs (/dev/shm; ``--no-endpoint-tmpfs``: in its work dir on the disk), which keeps the
endpoint's disk out of the times: on ext4, creating thousands of files right after thousands were
deleted is slower (the allocator scans past the freed inodes), and a run would pay for the previous
run's deletions. Times are wall clock from the command's start to its exit, the CLI's own start-up
included on both sides (bridge byte-compiled first, as a wheel's install is); the job's own time
(first task to last), its plan and finalize, and the per-task overhead (a task's time outside its
units, from the job's record: ``timings``) come from the worker. Each run's CPU seconds are counted
from /proc for the command (the cp, or the submitter), the configuration's workers and their pool
processes, and the endpoint; their sum over the machine's cores is the least wall time the run could
have taken had every process always found a free core (Redis, shared, is left out). Jobs run with
``--verify none`` (cp does not verify either) and, on rclone serve s3, which keeps no checksums,
``--store-checksums skip`` on both sides. Redis: the machine's on 127.0.0.1:6379 if it answers, else
a private redis-server; a namespace of its own either way.

``--latency-ms MS`` sends the timed runs (the cp, the workers) through tests/latencyproxy.py, which
delays each direction of every connection by MS, in a process of its own: an endpoint as far away
as a cloud's, where a small object's time is mostly the round trip, not CPU. Its CPU is not counted.

Targets (issue 28): for small files, ``-c 1`` at most 1.1x the in-process time, ``-c 2`` at most
0.8x, finalize at most 10% of the job's time; the big file at least 0.95x in-process throughput.
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

from bench.bench_transfer import BIN, byte_compile, children_cpu, cpu_of, make_data, process_tree, s3_env
from tests.emulators import MotoServer, RcloneS3, Redis
from bridge.workers.testing import ServiceProcess, purge_namespace, tenant_env

MiB = 1024 * 1024
# name: (workers, pool processes each)
CONFIGS = {"-c 1": (1, 1), "-c 2": (1, 2), "2 x -c 1": (2, 1)}
TARGETS = {"-c 1": 1.1, "-c 2": 0.8}
CPUS = os.cpu_count() or 1


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    result = subprocess.run(cmd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"failed ({result.returncode}): {' '.join(cmd)}\n{result.stderr[-2000:]}")
    return elapsed, result.stdout


def tree_cpu(roots: list[int | None]) -> float:
    """CPU seconds used so far by the processes under each of ``roots`` (a worker and its pool)."""
    return sum(cpu_of(pid) for root in roots if root for pid in process_tree(root))


def small_tree(root: Path, files: int, kib: int) -> Path:
    for i in range(files):
        d = root / f"{i // 500:03d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:06d}.bin").write_bytes(os.urandom(kib * 1024))
    return root


def corpora(spec: str) -> list[tuple[int, int]]:
    out = []
    for item in filter(None, spec.split(",")):
        files, _, kib = item.partition("x")
        out.append((int(files), int(kib)))
    return out


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--big-mib", type=int, default=1024)
    ap.add_argument("--corpora", default="4000x16,20000x8", help="small-file trees, FILESxKIB, comma-separated")
    ap.add_argument("--endpoint", choices=("rclone", "moto"), default="rclone")
    ap.add_argument("--repeat", type=int, default=3, help="rounds; the fastest run of each counts")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="worker configurations to run")
    ap.add_argument("--endpoint-tmpfs", action=argparse.BooleanOptionalAction, default=True,
                    help="rclone serve s3 keeps its objects in /dev/shm (default), not on the disk")
    ap.add_argument("--latency-ms", type=float, default=0.0,
                    help="delay each direction of every timed run's connections by MS (tests/latencyproxy.py, "
                         "in a process of its own): an endpoint as far as a cloud's")
    args = ap.parse_args()
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]

    work = Path(tempfile.mkdtemp(prefix="mcbridge-bench-celery-"))
    byte_compile()   # as a wheel installs it: no module compiled again in each CLI run
    mcbridge = [sys.executable, "-m", "bridge"]
    cases = []   # (key, label, source, bytes, configurations)
    if args.big_mib:
        big, _ = make_data(work / "data", args.big_mib, 0)
        cases.append(("big", f"{args.big_mib} MiB x 1", str(big), args.big_mib * MiB,
                      [c for c in configs if c == "-c 2"] or configs[:1]))
    for files, kib in corpora(args.corpora):
        root = small_tree(work / "data" / f"small-{files}x{kib}", files, kib)
        cases.append((f"s{files}x{kib}", f"{files:,} x {kib} KiB", f"{root}/", files * kib * 1024, configs))
    served = None
    if args.endpoint == "rclone":
        if args.endpoint_tmpfs and Path("/dev/shm").is_dir():
            served = Path(tempfile.mkdtemp(prefix="mcbridge-bench-celery-s3-", dir="/dev/shm"))
        server = RcloneS3(data=served)
    else:
        server = MotoServer()
    redis = Redis().start()
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    workers: list[ServiceProcess] = []
    proxy = None
    try:
        server.start()
        server.create_bucket("bench")
        endpoint = server.endpoint
        if args.latency_ms:   # the cp and the workers reach the endpoint through it; the purges go direct
            proxy = subprocess.Popen([sys.executable, "-m", "tests.latencyproxy", str(server.port),
                                      str(args.latency_ms)], stdout=subprocess.PIPE, text=True,
                                     cwd=Path(__file__).resolve().parent.parent)
            endpoint = server.endpoint.replace(f":{server.port}", f":{proxy.stdout.readline().strip()}")
        # BRIDGE_SRC: a checkout that maps bridge.workers to its own workers/ (kept, when set)
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("AWS_", "AZURE_", "BRIDGE_")) or k == "BRIDGE_SRC"}
        env = {**base, **server.env(), "AWS_ENDPOINT_URL": endpoint, "MCBRIDGE_STATE_DIR": str(work / "state"),
               "XDG_CONFIG_HOME": str(work / "noconfig"), "AWS_EC2_METADATA_DISABLED": "true",
               "BRIDGE_BROKER_URL": redis.url, "BRIDGE_NAMESPACE": namespace, "BRIDGE_METRICS_PORT": "0",
               **tenant_env(work / "tenant", local_roots=[str(work)])}
        sums = ["--store-checksums", "skip"] if args.endpoint == "rclone" else []
        queues = {}
        by_config: dict[str, list[ServiceProcess]] = {}
        for n, name in enumerate(configs):
            count, pool = CONFIGS[name]
            queues[name] = f"bench.q{n}"
            for m in range(count):
                workers.append(ServiceProcess.worker(env, f"q{n}w{m}", work, concurrency=pool,
                                                     queues=[queues[name]]).start())
                by_config.setdefault(name, []).append(workers[-1])
        for w in workers:
            w.wait_ready()
        print(f"{args.endpoint} S3 at {server.endpoint}"
              f"{f' through a proxy adding {2 * args.latency_ms:g} ms to each round trip' if proxy else ''}; "
              f"Redis {redis.url}; {os.cpu_count()} CPUs; "
              f"configurations {', '.join(configs)}; {args.repeat} rounds", flush=True)
        best: dict[tuple[str, str], dict] = {}
        walls: dict[tuple[str, str], list[float]] = {}   # every run's, for the medians
        run = 0
        purging = s3_env(env, server)   # straight to the endpoint (s3_env sets its own address)
        for rnd in range(args.repeat):
            for key, label, src, nbytes, case_configs in cases:
                sides = ["in-process", *case_configs]
                for side in sides[rnd % len(sides):] + sides[:rnd % len(sides)]:
                    run += 1
                    dst = f"s3://bench/r{run}/"
                    os.sync()
                    serving = [w.pid for w in by_config.get(side, [])]
                    cpu_before = (children_cpu(), tree_cpu(serving), tree_cpu([server.pid]))
                    if side == "in-process":
                        t, _ = timed([*mcbridge, "cp", src, dst, "-q", *sums], env)
                        row = {"wall": t}
                        note = ""
                    else:
                        t, out = timed([*mcbridge, "submit", "cp", src, dst, "--wait", "--json", "--verify", "none",
                                        "--queue", queues[side], *sums], env)
                        status = json.loads(out)
                        assert status["state"] == "succeeded", status
                        p, tm = status["progress"], status["timings"]
                        row = {"wall": t, "job": p["elapsed_s"], "tasks": p["tasks_total"], **tm}
                        note = (f"job {p['elapsed_s']:.2f}s: plan {tm['plan_s']:.2f}s, {p['tasks_total']} tasks "
                                f"({tm['per_task_overhead_s'] * 1000:.0f} ms overhead each), "
                                f"finalize {tm['finalize_s']:.2f}s")
                    cpu = [after - before for before, after in
                           zip(cpu_before, (children_cpu(), tree_cpu(serving), tree_cpu([server.pid])))]
                    row["cpu"] = {"cli": round(cpu[0], 2), "workers": round(cpu[1], 2), "endpoint": round(cpu[2], 2)}
                    row["cpu_floor_s"] = sum(cpu) / CPUS
                    print(f"round {rnd + 1} {label:<18} {side:<10} {t:7.2f}s {nbytes / t / MiB:7.1f} MiB/s  "
                          f"load {load()}  CPU s: cli {cpu[0]:.2f} workers {cpu[1]:.2f} endpoint {cpu[2]:.2f} "
                          f"(all / {CPUS} cores: {row['cpu_floor_s']:.2f}s)  {note}", flush=True)
                    if (key, side) not in best or t < best[(key, side)]["wall"]:
                        best[(key, side)] = row
                    walls.setdefault((key, side), []).append(t)
                    subprocess.run([str(BIN / "rclone"), "purge", f"s3e:bench/r{run}/"], env=purging,
                                   check=True, capture_output=True)
        print()
        print("fastest of each: wall time (the ratio to in process; and the ratio of the medians of all the "
              "rounds, less swayed by a run that met a quiet moment); job time, finalize's share of it, "
              "per-task overhead")
        summary = []
        for key, label, _src, nbytes, case_configs in cases:
            base_t = best[(key, "in-process")]["wall"]
            print(f"  {label:<18} in-process {base_t:7.2f}s ({nbytes / base_t / MiB:6.1f} MiB/s), CPU of it and "
                  f"the endpoint / {CPUS} cores {best[(key, 'in-process')]['cpu_floor_s']:.2f}s")
            base_m = statistics.median(walls[(key, "in-process")])
            for side in case_configs:
                r = best[(key, side)]
                ratio = r["wall"] / base_t
                median_ratio = statistics.median(walls[(key, side)]) / base_m
                share = r["finalize_s"] / r["job"] if r["job"] else 0.0
                target = (f"target <= {TARGETS[side]}" if key != "big" and side in TARGETS
                          else "target: throughput >= 0.95x" if key == "big" else "")
                print(f"  {'':<18} {side:<10} {r['wall']:7.2f}s  x{ratio:.2f} (medians x{median_ratio:.2f}) "
                      f"{target:<28} job {r['job']:.2f}s "
                      f"({r['tasks']} tasks), plan {r['plan_s']:.2f}s, finalize {r['finalize_s']:.2f}s "
                      f"({share:.0%}), overhead {r['per_task_overhead_s'] * 1000:.0f} ms/task; CPU / {CPUS} cores "
                      f"{r['cpu_floor_s']:.2f}s (x{r['cpu_floor_s'] / base_t:.2f} of in-process wall)")
                summary.append({"case": label, "config": side, "in_process_s": round(base_t, 3), **r,
                                "ratio": round(ratio, 3), "median_ratio": round(median_ratio, 3),
                                "in_process_median_s": round(base_m, 3),
                                "median_s": round(statistics.median(walls[(key, side)]), 3),
                                "finalize_share": round(share, 3)})
        print(json.dumps(summary))
    finally:
        for w in workers:
            w.stop()
        if proxy is not None:
            proxy.kill()
            proxy.wait()
        server.stop()
        if served is not None:
            shutil.rmtree(served, ignore_errors=True)
        purge_namespace(redis.url, namespace)
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
