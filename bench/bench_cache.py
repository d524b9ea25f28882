"""Issue 12's figures for the node-local cache, on ``rclone serve s3`` (the fast S3 endpoint).

    python -m bench.bench_cache [--size-mb 200] [--repeat 3] [--readers 8]

Cases:
  cold-fill    ``mcbridge cache path URL`` into an empty cache against ``mcbridge cp URL DIR/`` of the
               same object: each its own process, wall time from start to exit, alternating
               (cp, fill, cp, fill ...), the fastest of --repeat each. Target: cp time / fill time >= 0.9.
  warm-read    reading the cached file through the cache (``Cache.open``: the store's HEAD for the
               object's identity, the entry lookup, open, read) against reading the same file with
               a plain open/read, in one process, alternating, fastest of 5 each: once from the disk
               (the file's pages dropped from the page cache before each read, posix_fadvise), the
               target's case (raw time / cache time >= 0.9); once from the page cache, where the
               read takes tens of milliseconds and the HEAD's latency shows most.
  single-flight  --readers processes ask for the object at once (empty cache), through a counting
               proxy (tests/faultproxy.py): the bytes of GET answers for the object must equal its
               size (one download), and every reader must get the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_transfer import _run_once, s3_env
from tests.emulators import RcloneS3, unique_name
from tests.faultproxy import FaultProxy

MB = 1000 * 1000
BIN = [sys.executable, "-m", "bridge"]   # this tree's bridge (PYTHONPATH), as the tests run it


def make_object(path: Path, size: int) -> None:
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        left, i = size, 0
        while left:
            chunk = (block[i % 251:] + block[: i % 251])[:left]
            f.write(chunk)
            left -= len(chunk)
            i += 1


def sha_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def drop_cached_pages(path: Path) -> None:
    """Make the next read of ``path`` come from the disk: its pages are clean (published files are
    fsynced), so the kernel drops them from the page cache when told, no root needed."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_all(f) -> int:
    buf, n = bytearray(8 << 20), 0
    while got := f.readinto(buf):
        n += got
    return n


def cold_fill(url: str, size: int, env: dict[str, str], work: Path, log: Path, repeat: int) -> dict:
    cp_times, fill_times = [], []
    for i in range(repeat):
        cp_times.append(_run_once([*BIN, "cp", url, str(work / f"cp{i}") + "/", "-q"], env, log)[0])
        fill_env = {**env, "MCBRIDGE_CACHE_DIR": str(work / f"cache{i}")}
        fill_times.append(_run_once([*BIN, "cache", "path", url], fill_env, log)[0])
    cp_t, fill_t = min(cp_times), min(fill_times)
    return {"case": "cold-fill", "bytes": size, "cp_s": round(cp_t, 2), "fill_s": round(fill_t, 2),
            "cp_runs": [round(t, 2) for t in cp_times], "fill_runs": [round(t, 2) for t in fill_times],
            "ratio_cp_over_fill": round(cp_t / fill_t, 3),
            "ratio_of_medians": round(statistics.median(cp_times) / statistics.median(fill_times), 3), "target": 0.9}


def warm_read(url: str, size: int, env: dict[str, str], work: Path, where: str) -> dict:
    from bridge.cache import Cache
    from bridge.config import load_settings
    cache = Cache(load_settings(environ={**env, "MCBRIDGE_CACHE_DIR": str(work / "warm")}))
    path = cache.fetch(url)
    raw, through = [], []
    for _ in range(5):
        if where == "disk":
            drop_cached_pages(path)
        start = time.perf_counter()
        with open(path, "rb", buffering=0) as f:
            assert read_all(f) == size
        raw.append(time.perf_counter() - start)
        if where == "disk":
            drop_cached_pages(path)
        start = time.perf_counter()
        with cache.open(url) as f:
            assert read_all(f) == size
        through.append(time.perf_counter() - start)
    raw_t, through_t = min(raw), min(through)
    return {"case": f"warm-read-{where}", "bytes": size, "raw_s": round(raw_t, 4), "cache_s": round(through_t, 4),
            "raw_MBps": round(size / raw_t / MB), "cache_MBps": round(size / through_t / MB),
            "ratio_raw_over_cache": round(raw_t / through_t, 3), "target": 0.9 if where == "disk" else None}


def single_flight(s3, url: str, size: int, want: str, env: dict[str, str], work: Path, readers: int) -> dict:
    key_path = "/" + url[len("s3://"):]
    with FaultProxy(s3.endpoint) as proxy:
        flight_env = {**env, "AWS_ENDPOINT_URL": proxy.endpoint, "MCBRIDGE_CACHE_DIR": str(work / "flight")}
        start = time.perf_counter()
        procs = [subprocess.Popen([*BIN, "cache", "path", url], env=flight_env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(readers)]
        outs = [p.communicate() for p in procs]
        elapsed = time.perf_counter() - start
        if any(p.returncode for p in procs):
            raise SystemExit(f"a reader failed: {[e for _o, e in outs if e]}")
        got = proxy.sent[f"GET {key_path}"]
    paths = {o.strip().splitlines()[-1] for o, _e in outs}
    return {"case": "single-flight", "readers": readers, "bytes": size, "bytes_downloaded": got,
            "downloads": round(got / size, 3), "identical": all(sha_file(Path(p)) == want for p in paths),
            "distinct_paths": len(paths), "wall_s": round(elapsed, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--readers", type=int, default=8)
    ap.add_argument("--cases", default="cold-fill,warm-read,single-flight")
    args = ap.parse_args()
    cases = args.cases.split(",")
    work = Path(tempfile.mkdtemp(prefix="mcbridge-cache-bench-"))
    log = work / "bench.log"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "RCLONE_", "STORAGE_", "MCBRIDGE_"))}
    base.update({"MCBRIDGE_STATE_DIR": str(work / "state"), "XDG_CONFIG_HOME": str(work / "noconfig"),
                 "AWS_EC2_METADATA_DISABLED": "true"})
    size = args.size_mb * MB
    source = work / "object.bin"
    make_object(source, size)
    want = sha_file(source)
    rows = []
    print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    try:
        with RcloneS3() as s3:
            env = s3_env(base, s3)
            bucket = unique_name("cache")
            s3.create_bucket(bucket)
            url = f"s3://{bucket}/object.bin"
            # rclone serve s3 keeps no S3 checksums: the upload is proven by reading it back
            _run_once([*BIN, "cp", str(source), url, "-q", "--store-checksums", "readback"], env, log)
            if "cold-fill" in cases:
                rows.append(cold_fill(url, size, env, work, log, args.repeat))
                print(json.dumps(rows[-1]), flush=True)
            if "warm-read" in cases:
                for where in ("disk", "page-cache"):
                    rows.append(warm_read(url, size, env, work, where))
                    print(json.dumps(rows[-1]), flush=True)
            if "single-flight" in cases:
                rows.append(single_flight(s3, url, size, want, env, work, args.readers))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        print(f"load average at end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}; log {log}", flush=True)
        for entry in work.iterdir():   # ~10 copies of the object: keep only the log
            if entry != log:
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


if __name__ == "__main__":
    main()
