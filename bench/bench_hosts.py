"""Throughput by number of worker hosts: 1, 2 and 4 hosts side by side in one run, each host a
network namespace whose link to the stores is shaped by tc tbf (tests/hosts.py), so that the
links and not this machine's two cores are the bottleneck, as across real hosts.

    sudo .venv/bin/python -m bench.bench_hosts                 # defaults below, a few minutes
    sudo .venv/bin/python -m bench.bench_hosts --hosts 1,4 --rate 20mbit --files 500

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
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

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


def run_job(cluster: Cluster, source: str, destination: str) -> dict:
    record = cluster.submit("cp", source, destination, "--wait", timeout=3600)
    job = cluster.job(record["id"])
    verify = json.loads(job.get("verify") or "{}")
    return {"state": job.get("state"), "seconds": float(job["finished"]) - float(job["created"]),
            "verified": bool(verify.get("ok")), "tasks": int(job.get("tasks_total") or 0),
            "errors": job.get("errors", "")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", default="1,2,4")
    ap.add_argument("--rate", default="16mbit", help="each host's link, both ways (tc tbf)")
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--file-kib", type=int, default=64)
    ap.add_argument("--mid", type=int, default=2)
    ap.add_argument("--mid-mib", type=int, default=16)
    ap.add_argument("--large-mib", type=int, default=128)
    ap.add_argument("--part-mib", type=int, default=8, help="part size, and bytes per task of a spread file")
    ap.add_argument("--batch-files", type=int, default=50,
                    help="BRIDGE_BATCH_FILES: small files per task at most, so that a corpus makes tasks for every host "
                         "(the service sizes tasks by an estimate of time that does not know the links are slow)")
    ap.add_argument("--routes", default="s3-gs,local-az")
    ap.add_argument("--json", help="write the rows here too")
    args = ap.parse_args()
    why = unavailable()
    if why:
        raise SystemExit(f"bench_hosts: {why}")
    counts = [int(n) for n in args.hosts.split(",")]
    routes = args.routes.split(",")
    work = Path(tempfile.mkdtemp(prefix="bridge-bench-hosts-"))
    data = work / "data"
    sizes = make_local(data, args.files, args.file_kib, args.mid, args.mid_mib, args.large_mib)
    env = {"BRIDGE_FILE_TASK_BYTES": f"{args.part_mib}MiB", "MCBRIDGE_CHUNK_SIZE": f"{args.part_mib}MiB",
           "BRIDGE_BATCH_FILES": str(args.batch_files)}
    print(f"corpus {sizes['corpus_files']} files, {sizes['corpus'] / MiB:.1f} MiB; large {args.large_mib} MiB; "
          f"link {args.rate} per host; parts {args.part_mib} MiB; at most {args.batch_files} small files a task", flush=True)
    print(f"before: {_uptime()}", flush=True)
    rows: list[dict] = []
    started = time.time()
    for count in counts:
        with Cluster(hosts=count, rate=args.rate, stores=("s3", "gs", "az"), workers=1, concurrency=2,
                     env=env, local_roots=[str(data)]) as cluster:
            if "s3-gs" in routes:
                seed_s3(cluster, data)
            for route in routes:
                for workload in ("corpus", "large"):
                    dst = f"d{count}-{workload}"
                    if route == "s3-gs":
                        cluster.stores["gs"].create_bucket(dst)
                        src, destination = f"s3://src/{workload}/", f"gs://{dst}/"
                    else:
                        cluster.stores["az"].create_bucket(dst)
                        src, destination = f"{data / workload}/", f"az://{dst}/"
                    row = {"hosts": count, "route": route, "workload": workload, **run_job(cluster, src, destination)}
                    row["MB_s"] = sizes[workload] / 1e6 / row["seconds"]
                    rows.append(row)
                    print(f"{count} host(s) {route:8s} {workload:6s} {row['seconds']:7.1f} s {row['MB_s']:6.2f} MB/s "
                          f"{row['state']} verified={row['verified']} tasks={row['tasks']} {row['errors'][:200]}",
                          flush=True)
    print(f"after: {_uptime()}  ({time.time() - started:.0f} s in all)\n")
    print("| route | workload | " + " | ".join(f"{n} host{'s' if n > 1 else ''}" for n in counts)
          + " | " + " | ".join(f"{n}/1" for n in counts if n > 1) + " |")
    print("|---|---|" + "---|" * (2 * len(counts) - 1))
    for route in routes:
        for workload in ("corpus", "large"):
            by = {r["hosts"]: r for r in rows if r["route"] == route and r["workload"] == workload}
            cells = [f"{by[n]['seconds']:.1f} s ({by[n]['MB_s']:.2f} MB/s)" for n in counts]
            ratios = [f"{by[counts[0]]['seconds'] / by[n]['seconds']:.2f}x" for n in counts if n > 1] \
                if counts[0] == 1 else []
            print(f"| {route} | {workload} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
