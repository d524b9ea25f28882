"""The cost of the plain whole-file SHA-256: one big file copied with the default digest (part
SHA-256s in parallel, their sha256-tree, CRC32C combined from parts) against ``--sha256`` (the
same plus the whole file's SHA-256, one stream in part order).

    python -m bench.bench_digest [--cases local,up,down] [--size-mib 1024] [--repeat 3]

Cases: ``local`` local -> local; ``up`` local -> S3; ``down`` S3 -> local (S3 = ``rclone serve
s3``, which keeps no S3 checksums: bridge runs with ``--store-checksums skip`` there and relies on
the per-part checksums the endpoint checks). Method as in bench_speed.py: each run its own
process, wall time to exit including ``sync`` of the page cache, runs alternating (default,
--sha256, default ...), each round starting with the other; the fastest of ``--repeat`` counts
and the median is printed beside it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench.bench_transfer import BIN, MiB, _run_once, make_data, s3_env
from tests.emulators import RcloneS3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="local,up,down")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mcbridge-digest-"))
    log = work / "bench.log"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "RCLONE_", "STORAGE_"))}
    base.update({"MCBRIDGE_STATE_DIR": str(work / "state"), "XDG_CONFIG_HOME": str(work / "noconfig"),
                 "AWS_EC2_METADATA_DISABLED": "true"})
    big, _small = make_data(work / "data", args.size_mib, 0)
    size = big.stat().st_size
    mcbridge = str(BIN / "mcbridge")
    print(f"{args.size_mib} MiB, best of {args.repeat}; load average at start: "
          + " ".join(f"{x:.1f}" for x in os.getloadavg()), flush=True)
    with RcloneS3() as server:
        server.create_bucket("bench")
        env = s3_env(base, server)
        _run_once([str(BIN / "rclone"), "copy", str(big), "s3e:bench/seed/"], env, log)
        for case in args.cases.split(","):
            out = work / f"out-{case}"
            if case == "local":
                cmd = [mcbridge, "cp", str(big), f"{out}/{{run}}/"]
            elif case == "up":
                cmd = [mcbridge, "cp", str(big), "s3://bench/up-{run}/", "--store-checksums", "skip"]
            else:
                cmd = [mcbridge, "cp", f"s3://bench/seed/{big.name}", f"{out}/{{run}}/"]
            tools = {"default": [*cmd, "-q"], "--sha256": [*cmd, "-q", "--sha256"]}
            times: dict[str, list[float]] = {name: [] for name in tools}
            names = list(tools)
            for i in range(args.repeat):
                for name in names[i % 2:] + names[:i % 2]:
                    run = f"{name.strip('-')}-{i}"
                    subprocess.run(["sync"], check=True)
                    start = time.perf_counter()
                    _run_once([c.replace("{run}", run) for c in tools[name]], env, log)
                    subprocess.run(["sync"], check=True)
                    times[name].append(time.perf_counter() - start)
                    if case == "up":
                        _run_once([str(BIN / "rclone"), "purge", f"s3e:bench/up-{run}/"], env, log)
                    else:
                        shutil.rmtree(out / run, ignore_errors=True)
            best = {name: min(t) for name, t in times.items()}
            for name, t in times.items():
                print(f"{case:<6} {name:<9} best {best[name]:6.2f} s  {size / best[name] / MiB:7.0f} MiB/s  "
                      f"median {statistics.median(t):6.2f} s", flush=True)
            print(f"{case:<6} --sha256 / default: {best['--sha256'] / best['default']:.2f}x (best), "
                  f"{statistics.median(times['--sha256']) / statistics.median(times['default']):.2f}x (median)",
                  flush=True)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
