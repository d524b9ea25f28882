"""A same-account copy of one big object by the ``server`` route against ``direct`` (issue 10).

    python -m bench.bench_routes [--stores s3,gcs,azure] [--size-mib 1024] [--repeat 3]

On each store (S3 = moto, which has CopyObject; GCS = fake-gcs-server; Azure = Azurite) one
object of ``--size-mib`` MiB is put into a bucket once, then copied to a new bucket of the same
store with ``mcbridge cp --route direct`` and ``--route server`` in turn (runs alternate, so load
from the machine's other users falls on both). Each run is its own process: wall time from start
to exit, as in bench_transfer.py. Bytes through the process are counted twice: by bridge itself
(``route.bytes_through_bridge`` in ``--json``) and at a byte-counting proxy in front of the
emulator (request and response bodies, tests/faultproxy.py), which sees every byte bridge sends
or receives. The fastest run of each counts.
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
from pathlib import Path

from tests.emulators import AZURITE_ACCOUNT, AZURITE_KEY, Azurite, FakeGCS, MotoServer, unique_name
from tests.faultproxy import FaultProxy

MiB = 1024 * 1024
STORES = {"s3": (MotoServer, "s3"), "gcs": (FakeGCS, "gs"), "azure": (Azurite, "az")}


def env_through(emulator, proxy: FaultProxy, base: dict[str, str]) -> dict[str, str]:
    env = dict(base, **emulator.env())
    if emulator.scheme == "s3":
        env["AWS_ENDPOINT_URL"] = proxy.endpoint
    elif emulator.scheme == "gs":
        env["STORAGE_EMULATOR_HOST"] = proxy.endpoint
    else:
        env["AZURE_STORAGE_CONNECTION_STRING"] = (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint={proxy.endpoint}/{AZURITE_ACCOUNT};")
    return env


def cp(args: list[str], env: dict[str, str]) -> tuple[float, dict]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "bridge", "cp", *args, "--json", "-q"], env=env,
                          capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"failed: mcbridge cp {' '.join(args)}: {done.stderr.strip()}")
    return elapsed, json.loads(done.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stores", default="s3,gcs,azure")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mcbridge-routes-"))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "STORAGE_"))}
    base.update({"MCBRIDGE_STATE_DIR": str(work / "state"), "XDG_CONFIG_HOME": str(work / "noconfig"),
                 "AWS_EC2_METADATA_DISABLED": "true"})
    big = work / "big.bin"
    with open(big, "wb") as f:
        block = os.urandom(MiB)
        for i in range(args.size_mib):
            f.write(block[i % 251:] + block[: i % 251])
    size = big.stat().st_size
    rows = []
    print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    try:
        for store in args.stores.split(","):
            cls, scheme = STORES[store]
            with cls() as emulator, FaultProxy(emulator.endpoint) as proxy:
                env = env_through(emulator, proxy, base)
                src = unique_name("src")
                emulator.create_bucket(src)
                cp([str(big), f"{scheme}://{src}/"], env)
                best: dict[str, dict] = {}
                for _ in range(args.repeat):
                    for route in ("direct", "server"):
                        dst = unique_name(route[:3])
                        emulator.create_bucket(dst)
                        proxy.configure()
                        elapsed, summary = cp([f"{scheme}://{src}/big.bin", f"{scheme}://{dst}/", "--route", route], env)
                        at_proxy = proxy.counts["bytes_up"] + proxy.counts["bytes_down"]
                        row = {"store": store, "route": summary["route"]["name"], "seconds": round(elapsed, 2),
                               "bytes_through_bridge": summary["route"]["bytes_through_bridge"],
                               "bytes_at_proxy": at_proxy, "size": size}
                        print(json.dumps(row), flush=True)
                        if route not in best or elapsed < best[route]["seconds"]:
                            best[route] = row
                rows += [best["direct"], best["server"]]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{args.size_mib} MiB, fastest of {args.repeat}; load average at end: "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print("| store | route | wall time | bytes through bridge (its count) | bytes at the proxy | server / direct |")
    print("|---|---|---:|---:|---:|---:|")
    for direct, server in zip(rows[::2], rows[1::2]):
        for row in (direct, server):
            ratio = f"{server['seconds'] / direct['seconds']:.2f}" if row is server else ""
            print(f"| {row['store']} | {row['route']} | {row['seconds']:.2f} s | {row['bytes_through_bridge']:,} | "
                  f"{row['bytes_at_proxy']:,} | {ratio} |")


if __name__ == "__main__":
    main()
