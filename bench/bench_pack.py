"""Packing benchmark (issue 5): many small files, local -> S3 emulator, in one run.

    python -m bench.bench_pack [--files 20000] [--size-kib 8] [--shard-size 256MiB]

  migrate   ``mcbridge migrate SRC s3://… --pack tar`` (defaults; and with --shard-size 64MiB,
            so that several shards stream at once) against ``s5cmd cp`` and ``rclone copy`` of
            the loose files, each with its defaults; wall time, requests the endpoint received
            (counted in moto's request log) and peak RSS of each process.
  pack      ``mcbridge pack SRC DIR --format tar`` (and parquet) local -> local against
            ``tar -cf`` of the same tree, warm page cache: throughput of the file bytes.

Every tool runs as its own process; its time runs from start to exit (Python start-up included).
The S3 endpoint is moto, which keeps checksums and logs each request; it is slow per request
(~180 small PUTs/s), which is the cost of moving loose files that packing avoids.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_transfer import run, s3_env
from bridge.config import parse_size
from tests.emulators import MotoServer

BIN = Path(sys.executable).parent
MiB = 1024 * 1024
_REQUEST = re.compile(r'"(?:\x1b\[[0-9;]*m)*(GET|PUT|POST|HEAD|DELETE) ')


def make_tree(root: Path, files: int, size: int) -> int:
    """``files`` random files of ``size`` bytes, 500 to a folder; returns the total bytes."""
    for i in range(files):
        folder = root / f"{i // 500:04d}"
        if i % 500 == 0:
            folder.mkdir(parents=True)
        (folder / f"{i:07d}.bin").write_bytes(os.urandom(size))
    return files * size


def requests_since(log: Path, offset: int) -> dict[str, int]:
    counts: dict[str, int] = {}
    with open(log, "rb") as f:
        f.seek(offset)
        for line in f.read().decode(errors="replace").splitlines():
            m = _REQUEST.search(line)
            if m:
                counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


def objects_in(s3: MotoServer, bucket: str, prefix: str) -> int:
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sum(len(page.get("Contents", [])) for page in pages)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=20_000)
    ap.add_argument("--size-kib", type=int, default=8)
    ap.add_argument("--shard-size", default="256MiB", help="bridge's default, for the headline run")
    ap.add_argument("--skip", default="", help="comma list of runs to leave out: s5cmd,rclone,pack")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    work = Path(tempfile.mkdtemp(prefix="mcbridge-bench-pack-"))
    log = work / "bench.log"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "RCLONE_"))}
    base.update({"MCBRIDGE_STATE_DIR": str(work / "state"), "XDG_CONFIG_HOME": str(work / "noconfig"),
                 "AWS_EC2_METADATA_DISABLED": "true"})
    src = work / "corpus"
    nbytes = make_tree(src, args.files, args.size_kib * 1024)
    print(f"{args.files} files x {args.size_kib} KiB = {nbytes / MiB:.1f} MiB in {src}; "
          f"{os.cpu_count()} CPUs", flush=True)
    rows = []

    def record(case: str, tool: str, seconds: float, peak: int, requests: dict[str, int] | None, note: str = ""):
        total = sum(requests.values()) if requests else None
        rows.append({"case": case, "tool": tool, "seconds": round(seconds, 2),
                     "files_per_s": round(args.files / seconds), "mib_per_s": round(nbytes / seconds / MiB, 1),
                     "requests": total, "by_method": requests, "peak_mib": round(peak / MiB), "note": note})
        shown = "" if total is None else f"{total:7d} requests {json.dumps(requests)}"
        print(f"{case:<8} {tool:<24} {seconds:8.2f}s {args.files / seconds:9.0f} files/s "
              f"{nbytes / seconds / MiB:7.1f} MiB/s {peak / MiB:6.0f} MiB peak {shown} {note}", flush=True)

    with MotoServer() as s3:
        s3.create_bucket("bench")
        env = s3_env(base, s3)

        def on_s3(tool: str, cmd: list[str], prefix: str, note: str = "") -> None:
            offset = s3.log_path.stat().st_size
            seconds, peak = run(cmd, env, log)
            time.sleep(0.2)   # let the server flush its log
            record("migrate", tool, seconds, peak, requests_since(s3.log_path, offset),
                   note or f"{objects_in(s3, 'bench', prefix)} objects")

        mcbridge = str(BIN / "mcbridge")
        on_s3(f"bridge tar {args.shard_size}", [mcbridge, "migrate", str(src), "s3://bench/bridge/", "--pack", "tar",
                                                "--shard-size", args.shard_size, "-q"], "bridge/")
        on_s3("bridge tar 64MiB", [mcbridge, "migrate", str(src), "s3://bench/bridge64/", "--pack", "tar",
                                   "--shard-size", "64MiB", "-q"], "bridge64/")
        if "s5cmd" not in skip:
            on_s3("s5cmd cp", [str(BIN / "s5cmd"), "--endpoint-url", s3.endpoint, "cp", f"{src}/*",
                               "s3://bench/s5cmd/"], "s5cmd/")
        if "rclone" not in skip:
            on_s3("rclone copy", [str(BIN / "rclone"), "copy", str(src), "s3e:bench/rclone/"], "rclone/")

    if "pack" not in skip:
        subprocess.run(["tar", "-cf", str(work / "warm.tar"), "-C", str(src), "."], check=True)   # warm the cache
        (work / "warm.tar").unlink()
        seconds, peak = run(["tar", "-cf", str(work / "tree.tar"), "-C", str(src), "."], base, log)
        record("pack", "tar -cf", seconds, peak, None)
        for fmt in ("tar", "parquet"):
            seconds, peak = run([str(BIN / "mcbridge"), "pack", str(src), str(work / f"packed-{fmt}"), "--format",
                                 fmt, "--shard-size", args.shard_size, "-q"], base, log)
            record("pack", f"bridge pack {fmt}", seconds, peak, None)
        tar_size = (work / "tree.tar").stat().st_size
        shard_bytes = sum(p.stat().st_size for p in (work / "packed-tar").glob("shard-*.tar"))
        print(f"archive bytes: tar -cf {tar_size}, bridge tar shards {shard_bytes}")

    print()
    migrate = {r["tool"]: r for r in rows if r["case"] == "migrate"}
    peers = [r for t, r in migrate.items() if not t.startswith("bridge")]
    if peers:
        best = min(peers, key=lambda r: r["seconds"])
        for tool, r in migrate.items():
            if tool.startswith("bridge"):
                print(f"{tool}: {best['seconds'] / r['seconds']:.1f}x faster than the best peer ({best['tool']}), "
                      f"{best['requests'] / r['requests']:.0f}x fewer requests")
    pack = {r["tool"]: r for r in rows if r["case"] == "pack"}
    if "tar -cf" in pack:
        for tool, r in pack.items():
            if tool != "tar -cf":
                print(f"{tool}: {r['mib_per_s']} MiB/s, {r['mib_per_s'] / pack['tar -cf']['mib_per_s']:.2f}x tar -cf")
    print(json.dumps({"files": args.files, "size_kib": args.size_kib, "shard_size": parse_size(args.shard_size),
                      "rows": rows}))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
