"""A DCP save of ~1 GiB of tensors through bridge.torch's writer against torch's own FsspecWriter
on s3fs, to the same moto endpoint.

    python -m bench.bench_torch [--size-mib 1024] [--repeat 3]

Three writers, in rotated order each round (so load from the machine's other users falls on all):

- ``bridge``: ``BridgeWriter(url)``: the save returns once every file is uploaded through the copy
  pipeline and bridge's record is written: time to return = time to committed.
- ``bridge-behind``: ``BridgeWriter(url, behind=<local folder>)``: the save returns once the files
  are on local disk; committed when the upload behind wrote the record (``bridge.torch.wait``).
- ``fsspec``: torch's ``FsspecWriter`` on s3fs: returns once ``.metadata`` is written. No checksum
  and no record: "committed" is DCP's own ``.metadata``, taken on trust, at return.

Each writer writes the tensors (16 of 64 MiB) into ``FILES`` files at once (torch's
``thread_count``). A run that fails is reported as such and left out of the medians.

One process per run (a single rank, no process group), timed inside it around ``dcp.save``;
moto is reset between runs (it holds every object in memory). Medians of ``--repeat`` rounds.
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
from pathlib import Path

from tests.emulators import MotoServer, unique_name

MiB = 1024 * 1024
WRITERS = ("bridge", "bridge-behind", "fsspec")
FILES = 4   # torch's thread_count: the save's files, written at once (one 1 GiB file through s3fs
            # ended in a 500 from moto's CompleteMultipartUpload on 2026-12-06; 512 MiB did not)


def child(writer: str, url: str, size_mib: int, staging: str) -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    n = max(1, size_mib // 64)
    gen = torch.Generator().manual_seed(0)
    state = {f"layer{i}": torch.rand(64 * MiB // 4, generator=gen) for i in range(n)}
    if writer == "fsspec":
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
        storage = FsspecWriter(url, endpoint_url=os.environ["AWS_ENDPOINT_URL"], thread_count=FILES)
    else:
        from bridge.torch import BridgeWriter
        storage = BridgeWriter(url, behind=staging if writer == "bridge-behind" else None, thread_count=FILES)
    started = time.perf_counter()
    dcp.save(state, storage_writer=storage)
    returned = time.perf_counter() - started
    if writer == "bridge-behind":
        from bridge.torch import wait
        wait()
    committed = time.perf_counter() - started
    print(json.dumps({"writer": writer, "bytes": n * 64 * MiB, "return_s": round(returned, 2),
                      "committed_s": round(committed, 2)}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--child", nargs=4, metavar=("WRITER", "URL", "SIZE", "STAGING"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        writer, url, size, staging = args.child
        child(writer, url, int(size), staging)
        return
    work = Path(tempfile.mkdtemp(prefix="mcbridge-torch-"))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "STORAGE_"))}
    base.update({"MCBRIDGE_STATE_DIR": str(work / "state"), "XDG_CONFIG_HOME": str(work / "noconfig"),
                 "AWS_EC2_METADATA_DISABLED": "true", "PYTHONWARNINGS": "ignore"})
    rows: dict[str, list[dict]] = {w: [] for w in WRITERS}
    print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    try:
        with MotoServer() as moto:
            env = {**base, **moto.env()}
            for round_ in range(args.repeat):
                order = WRITERS[round_ % len(WRITERS):] + WRITERS[:round_ % len(WRITERS)]
                for writer in order:
                    moto.reset()
                    bucket = unique_name()
                    moto.create_bucket(bucket)
                    staging = work / "staging"
                    shutil.rmtree(staging, ignore_errors=True)
                    run = subprocess.run([sys.executable, "-m", "bench.bench_torch", "--child", writer,
                                          f"s3://{bucket}/ckpt/step-1/", str(args.size_mib), str(staging)],
                                         env=env, capture_output=True, text=True)
                    if run.returncode != 0:
                        print(json.dumps({"writer": writer, "failed": run.stderr.strip().splitlines()[-1:]}),
                              flush=True)
                        continue
                    row = json.loads(run.stdout.strip().splitlines()[-1])
                    print(json.dumps(row), flush=True)
                    rows[writer].append(row)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ran = ", ".join(f"{w} {len(r)}" for w, r in rows.items())
    print(f"\nmedians of {args.repeat} rounds (runs that completed: {ran}); load average at end: "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print("| writer | bytes | time to return | time to committed | committed by |")
    print("|---|---:|---:|---:|---|")
    by = {"bridge": "bridge's record (per-part CRC32C and SHA-256)",
          "bridge-behind": "bridge's record, written by the upload behind",
          "fsspec": "DCP's .metadata only (no checksum, no record)"}
    for writer in WRITERS:
        if not rows[writer]:
            print(f"| {writer} | | failed | failed | |")
            continue
        ret = statistics.median(r["return_s"] for r in rows[writer])
        com = statistics.median(r["committed_s"] for r in rows[writer])
        print(f"| {writer} | {rows[writer][0]['bytes']:,} | {ret:.2f} s | {com:.2f} s | {by[writer]} |")


if __name__ == "__main__":
    main()
