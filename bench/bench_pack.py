"""Packing benchmark (issue 5): many small files, local -> S3 emulator, in one run.

    python -m bench.bench_pack [--files 20000] [--size-kib 8] [--shard-size 256MiB]

  migrate   ``mcbridge migrate SRC s3://… --pack tar`` (defaults; and with --shard-size 64MiB,
            so that several shards stream at once) against ``s5cmd cp`` and ``rclone copy`` of
            the loose files, each with its defaults; wall time, requests the endpoint received
            (counted in moto's request log) and peak RSS of each process.
  pack      ``mcbridge pack SRC DIR --format tar`` (and parquet) local -> local against
            ``tar -cf`` of the same tree, warm page cache: throughput of the file bytes.

  one-file  (``--one-file-rounds N``) ``mcbridge migrate SRC s3://… --pack tar`` against a one-file
            upload of the same bytes (the tree as one tar file, made untimed) by ``mcbridge cp``
            and ``s5cmd cp``, on ``rclone serve s3`` (fast, Go: the endpoint's per-request cost
            out of the way), N rounds, each starting with the next tool, each time including a
            ``sync``; best and median of each, and packing's ratio to the faster one-file upload.
            bridge's modules are byte-compiled first, as an installed wheel's are.

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
    ap.add_argument("--one-file-rounds", type=int, default=0,
                    help="rounds of packing against a one-file upload of the same bytes (0: none)")
    ap.add_argument("--before", default="", help="with --one-file-rounds: a folder holding an earlier bridge/ "
                    "package (git archive REV bridge policies workers, the last two moved into bridge/): its "
                    "packing runs in the same rounds, as 'bridge pack, before'")
    ap.add_argument("--skip", default="", help="comma list of runs to leave out: migrate (the moto section), s5cmd,rclone,pack")
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

    if args.one_file_rounds:
        one_file(args, src, nbytes, base, work, log)
    if "migrate" not in skip:
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


def one_file(args, src: Path, nbytes: int, base: dict[str, str], work: Path, log: Path) -> None:
    """Packing against a one-file upload of the same bytes, rotated rounds on rclone serve s3."""
    import statistics
    from bench.bench_transfer import _run_once, byte_compile
    from tests.emulators import RcloneS3
    one = work / "one.tar"   # the tree as one file: its bytes, tar's headers (what a tar shard holds)
    subprocess.run(["tar", "-cf", str(one), "-C", str(src), "."], check=True)
    # bridge as installed (pip byte-compiles a wheel): a checkout run with PYTHONDONTWRITEBYTECODE
    # would compile every module at each start, 0.3 s of CPU that every bridge row would pay.
    byte_compile(Path(__file__).resolve().parent.parent, *([Path(args.before)] if args.before else []))
    mcbridge, s5cmd, rclone = str(BIN / "mcbridge"), str(BIN / "s5cmd"), str(BIN / "rclone")
    times: dict[str, list[float]] = {}
    with RcloneS3() as s3:
        s3.create_bucket("bench")
        env = s3_env(base, s3)
        keep = ["--store-checksums", "skip"]   # rclone serve s3 keeps no S3 checksums to read back
        tools = {"bridge pack": [mcbridge, "migrate", f"{src}/", "s3://bench/pack-{run}/", "--pack", "tar",
                                 "--shard-size", args.shard_size, "-q", *keep],
                 "bridge one file": [mcbridge, "cp", str(one), "s3://bench/one-bridge-{run}/", "-q", *keep],
                 "s5cmd one file": [s5cmd, "--endpoint-url", s3.endpoint, "cp", str(one), "s3://bench/one-s5cmd-{run}/"]}
        if args.before:   # the same packing by an earlier checkout, in the same rounds
            tools["bridge pack, before"] = [c.replace("/pack-{run}/", "/before-{run}/") for c in tools["bridge pack"]]
        envs = {tool: dict(env, PYTHONPATH=args.before) if tool.endswith("before") else env for tool in tools}
        names = list(tools)
        print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}; "
              f"one file of {one.stat().st_size / MiB:.1f} MiB", flush=True)
        for i in range(args.one_file_rounds):
            for tool in names[i % len(names):] + names[:i % len(names)]:
                os.sync()
                cmd = ["sh", "-c", '"$@" && sync', "sh", *(c.replace("{run}", str(i)) for c in tools[tool])]
                seconds, _peak = _run_once(cmd, envs[tool], log)
                times.setdefault(tool, []).append(seconds)
                print(f"  round {i} {tool:<16} {seconds:6.2f}s", flush=True)
                prefix = tools[tool][[j for j, c in enumerate(tools[tool]) if c.startswith("s3://")][0]]
                _run_once([rclone, "purge", prefix.replace("s3://", "s3e:").replace("{run}", str(i))], env, log)
    best = {t: min(v) for t, v in times.items()}
    median = {t: statistics.median(v) for t, v in times.items()}
    peer_best = min(v for t, v in best.items() if not t.startswith("bridge pack"))
    peer_median = min(v for t, v in median.items() if not t.startswith("bridge pack"))
    for tool in names:
        print(f"{tool:<16} best {best[tool]:6.2f}s  median {median[tool]:6.2f}s  ({nbytes / best[tool] / MiB:.0f} MiB/s)")
    for tool in (t for t in names if t.startswith("bridge pack")):
        print(f"{tool} / fastest one-file upload: {best[tool] / peer_best:.2f}x by best, "
              f"{median[tool] / peer_median:.2f}x by median")
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)


if __name__ == "__main__":
    main()
