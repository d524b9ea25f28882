"""Throughput by number of worker hosts: 1, 2 and 4 hosts side by side in one run, each host a
network namespace whose link to the stores is shaped by tc tbf (tests/hosts.py), so that the
links and not this machine's two cores are the bottleneck, as across real hosts.

    sudo .venv/bin/python -m bench.bench_hosts                 # the recorded run's settings, about 30 minutes
    sudo .venv/bin/python -m bench.bench_hosts --hosts 4 --routes local-az --workloads corpus --logs /tmp/logs

Two workloads, each over two routes:

- corpus: ``--files`` files of ``--file-kib`` KiB plus ``--mid`` files of ``--mid-mib`` MiB;
- large: one file of ``--large-mib`` MiB, its parts spread over tasks (``BRIDGE_FILE_TASK_BYTES``
  = one part), so over hosts;
- routes: s3 -> gs (moto to fake-gcs-server) and local -> az (a folder every host sees, as on
  Lustre, to Azurite).

Each host runs one ``mcbridge worker -c 2``. A row's time is the job's own, from its record
(created -> finished: queueing, planning, every task, the commit and the verify), so the
submitter's start-up is not in it. The emulators and Redis run in the root namespace on the same
two cores; ``uptime`` is printed before and after, as other work on the machine changes the numbers.
The corpus is scaled down from the design's 20,000 x 64 KiB + 4 x 256 MiB and 2 GiB so that the
run takes minutes at these link rates; what scales is bytes over the links, which this keeps.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import redis as redis_lib  # noqa: E402

from tests.emulators import RcloneS3  # noqa: E402
from tests.hosts import Cluster, unavailable  # noqa: E402

MiB = 1024 * 1024


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def make_local(root: Path, files: int, file_kib: int, mid: int, mid_mib: int, large_mib: int) -> dict[str, int]:
    """The corpus and the large file in ``root`` (made once: every run of every host count reads them)."""
    corpus, large = root / "corpus", root / "large"
    corpus.mkdir(parents=True)
    large.mkdir()
    block = os.urandom(max(file_kib * 1024, MiB))
    for n in range(files):
        (corpus / f"d{n % 20:02d}" ).mkdir(exist_ok=True)
        # distinct bytes per file: a counter in front of shared random bytes
        (corpus / f"d{n % 20:02d}" / f"f{n:06d}.bin").write_bytes(n.to_bytes(8, "big") + block[:file_kib * 1024 - 8])
    for n in range(mid):
        (corpus / f"mid{n}.bin").write_bytes(os.urandom(mid_mib * MiB))
    with open(large / "big.bin", "wb") as out:
        for _ in range(large_mib):
            out.write(os.urandom(MiB))
    return {"corpus": files * file_kib * 1024 + mid * mid_mib * MiB, "large": large_mib * MiB,
            "corpus_files": files + mid}


def seed_s3(cluster: Cluster, root: Path) -> None:
    """The same files in the S3 emulator (the s3 -> gs source), put from the root namespace."""
    from boto3.s3.transfer import TransferConfig
    client = cluster.stores["s3"].client()
    client.create_bucket(Bucket="src")
    config = TransferConfig(multipart_threshold=64 * MiB, multipart_chunksize=64 * MiB)
    for path in sorted(root.rglob("*.bin")):
        client.upload_file(str(path), "src", path.relative_to(root).as_posix(), Config=config)


class Timeline:
    """The job's transfer tasks as ``<ns>:running`` shows them, looked at every 0.2 s: when each
    was first and last seen running, and on which host (a task shorter than a look may be missed)."""

    def __init__(self, cluster: Cluster):
        self.cluster, self.seen, self.stop = cluster, {}, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        client = redis_lib.Redis.from_url(self.cluster.broker_url, decode_responses=True)
        key = f"{self.cluster.namespace}:running"
        while not self.stop.wait(0.2):
            now = time.time()
            with contextlib.suppress(Exception):
                for task, raw in client.hgetall(key).items():
                    if ".t" not in task:
                        continue
                    worker = json.loads(raw).get("worker", "").split("@")[0][:2]
                    first = self.seen.get(task, (now, now, worker))[0]
                    self.seen[task] = (first, now, worker)

    def __enter__(self) -> Timeline:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def summary(self, created: float) -> dict:
        """First task seen, last task seen (seconds after the job's creation); busy task-seconds by host."""
        if not self.seen:
            return {}
        busy: dict[str, float] = {}
        for first, last, host in self.seen.values():
            busy[host] = busy.get(host, 0.0) + last - first
        return {"first_task": min(v[0] for v in self.seen.values()) - created,
                "last_task": max(v[1] for v in self.seen.values()) - created,
                "busy_by_host": {h: round(b, 1) for h, b in sorted(busy.items())},
                "each": sorted((task.rsplit(".", 1)[1], host, round(first - created, 1), round(last - created, 1))
                               for task, (first, last, host) in self.seen.items())}


def run_job(cluster: Cluster, source: str, destination: str) -> dict:
    with Timeline(cluster) as timeline:
        record = cluster.submit("cp", source, destination, "--wait", timeout=3600)
    job = cluster.job(record["id"])
    verify = json.loads(job.get("verify") or "{}")
    created, finished = float(job["created"]), float(job["finished"])
    started = float(job.get("started") or created)
    plan, final = int(job.get("plan_ms") or 0) / 1000, int(job.get("finalize_ms") or 0) / 1000
    # where the job's time went, from its record: waiting for a worker to take its plan task,
    # planning, the transfer tasks (from the plan's end to the finalize's start, so with the
    # hand-over to the finalize), the finalize (the commit and the verify)
    phases = {"queued": started - created, "plan": plan, "tasks": finished - started - plan - final, "finalize": final,
              "(verify)": int(job.get("verify_ms") or 0) / 1000}   # (within the finalize)
    return {"state": job.get("state"), "seconds": finished - created,
            "verified": bool(verify.get("ok")), "checked": int(verify.get("checked") or 0),
            "tasks": int(job.get("tasks_total") or 0), "phases": phases,
            "task_s": int(job.get("task_ms") or 0) / 1000, "errors": job.get("errors", ""),
            **timeline.summary(created)}


def _rate_bytes(rate: str) -> float:
    """tc's rate ('10mbit', '4mbit', '800kbit') in bytes per second."""
    units = {"kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return float(rate[:-len(unit)]) * scale
    raise SystemExit(f"bench_hosts: --rate {rate!r}: write e.g. 10mbit or 800kbit")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", default="1,2,4")
    ap.add_argument("--rate", default="4mbit", help="each host's link, both ways (tc tbf)")
    ap.add_argument("--files", type=int, default=600)
    ap.add_argument("--file-kib", type=int, default=64)
    ap.add_argument("--mid", type=int, default=2)
    ap.add_argument("--mid-mib", type=int, default=24)
    ap.add_argument("--large-mib", type=int, default=80)
    ap.add_argument("--part-mib", type=int, default=4, help="part size, and bytes per task of a spread file")
    ap.add_argument("--batch-files", type=int, default=50,
                    help="BRIDGE_BATCH_FILES: small files per task at most, so that a corpus makes tasks for every host "
                         "(the service sizes tasks by an estimate of time that does not know the links are slow)")
    ap.add_argument("--small-in-flight", type=int, default=8,
                    help="MCBRIDGE_SMALL_FILES_IN_FLIGHT of every worker (0: bridge's default, 64): at 64 a "
                         "process, a host's two processes overflowed its shaped link's queue, and the drops "
                         "left tasks waiting on TCP's retransmission timers")
    ap.add_argument("--routes", default="s3-gs,local-az",
                    help="SOURCE-DEST pairs: SOURCE s3 or local (a folder every host sees), DEST gs, az or s3")
    ap.add_argument("--workloads", default="corpus,large")
    ap.add_argument("--s3", choices=("moto", "rclone"), default="moto",
                    help="the S3 source's emulator: moto (the tests') or rclone serve s3 (faster; no checksums kept)")
    ap.add_argument("--concurrency", type=int, default=2,
                    help="pool processes of each host's worker (mcbridge worker -c): a store-to-store task "
                         "downloads a batch or part before it uploads it, so more processes keep both "
                         "directions of a host's link busy")
    ap.add_argument("--json", help="write the rows here too")
    ap.add_argument("--logs", help="copy every host's worker logs into this folder before each cluster's teardown")
    args = ap.parse_args()
    why = unavailable()
    if why:
        raise SystemExit(f"bench_hosts: {why}")
    counts = [int(n) for n in args.hosts.split(",")]
    routes = args.routes.split(",")
    for route in routes:
        source, _, target = route.partition("-")
        if source not in ("s3", "local") or target not in ("gs", "az", "s3") or route == "s3-s3":
            raise SystemExit(f"bench_hosts: --routes {route!r}: write SOURCE-DEST, SOURCE s3 or local, DEST gs, az or s3")
    workloads = args.workloads.split(",")
    link = _rate_bytes(args.rate)
    work = Path(tempfile.mkdtemp(prefix="bridge-bench-hosts-"))
    data = work / "data"
    sizes = make_local(data, args.files, args.file_kib, args.mid, args.mid_mib, args.large_mib)
    env = {"BRIDGE_FILE_TASK_BYTES": f"{args.part_mib}MiB", "MCBRIDGE_CHUNK_SIZE": f"{args.part_mib}MiB",
           "BRIDGE_BATCH_FILES": str(args.batch_files),
           **({"MCBRIDGE_SMALL_FILES_IN_FLIGHT": str(args.small_in_flight)} if args.small_in_flight else {})}
    print(f"S3 source: {args.s3}; corpus {sizes['corpus_files']} files, {sizes['corpus'] / MiB:.1f} MiB; large {args.large_mib} MiB; "
          f"link {args.rate} per host; worker -c {args.concurrency}; parts {args.part_mib} MiB; at most {args.batch_files} small files a task", flush=True)
    print(f"before: {_uptime()}", flush=True)
    rows: list[dict] = []
    started = time.time()
    for count in counts:
        with Cluster(hosts=count, rate=args.rate, stores=("s3", "gs", "az"), workers=1, concurrency=args.concurrency,
                     emulators={"s3": RcloneS3} if args.s3 == "rclone" else None,
                     env=env, local_roots=[str(data)]) as cluster:
            if any(route.startswith("s3-") for route in routes):
                seed_s3(cluster, data)
            for route in routes:
                for workload in workloads:
                    dst = f"d{count}-{workload}"
                    source, target = route.split("-")
                    cluster.stores[target].create_bucket(dst)
                    src = f"s3://src/{workload}/" if source == "s3" else f"{data / workload}/"
                    destination = f"{target}://{dst}/"
                    row = {"hosts": count, "route": route, "workload": workload, **run_job(cluster, src, destination)}
                    row["MB_s"] = sizes[workload] / 1e6 / row["seconds"]
                    row["of_links"] = sizes[workload] / row["seconds"] / (link * count)
                    rows.append(row)
                    ph = " ".join(f"{k} {v:.1f}" for k, v in row["phases"].items())
                    print(f"{count} host(s) {route:8s} {workload:6s} {row['seconds']:7.1f} s {row['MB_s']:6.2f} MB/s "
                          f"({row['of_links']:.0%} of the links) {row['state']} verified={row['verified']} "
                          f"checked={row['checked']} tasks={row['tasks']} [{ph}; task-seconds {row['task_s']:.0f}] "
                          f"{row['errors'][:200]}", flush=True)
                    if row.get("busy_by_host"):
                        print(f"    tasks seen running from {row['first_task']:.1f} s to {row['last_task']:.1f} s; "
                              f"busy task-seconds by host {row['busy_by_host']}", flush=True)
                        if args.logs:
                            print("    " + " ".join(f"{t}@{h}:{a}-{b}" for t, h, a, b in sorted(row["each"], key=lambda e: e[2])))
            if args.logs:
                for host in cluster.hosts:
                    shutil.copytree(host.root / "logs", Path(args.logs) / f"{count}hosts-{host.name}", dirs_exist_ok=True)
    print(f"after: {_uptime()}  ({time.time() - started:.0f} s in all)\n")
    print("| route | workload | " + " | ".join(f"{n} host{'s' if n > 1 else ''}" for n in counts)
          + " | " + " | ".join(f"{n}/1" for n in counts if n > 1) + " |")
    print("|---|---|" + "---|" * (2 * len(counts) - 1))
    for route in routes:
        for workload in workloads:
            by = {r["hosts"]: r for r in rows if r["route"] == route and r["workload"] == workload}
            cells = [f"{by[n]['seconds']:.1f} s ({by[n]['of_links']:.0%})" for n in counts]
            ratios = [f"{by[counts[0]]['seconds'] / by[n]['seconds']:.2f}x" for n in counts if n > 1] \
                if counts[0] == 1 else []
            print(f"| {route} | {workload} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
