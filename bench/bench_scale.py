"""Corpus scale (issue 20): many small files, bridge beside rclone in one run, time and peak memory.

    python -m bench.bench_scale [--files 10000,1000000] [--tree-dir DIR] [--listing 10000000]

For each N in --files, N x 1 KiB files (folders of 1,000) go local -> S3 (``rclone serve s3``, the
fast endpoint), then a no-op sync, then a check of what is there (``--steps pack,unpack`` packs
the tree local -> local and unpacks it again, beside ``tar -cf`` and ``tar -xf``):

    bridge   mcbridge cp TREE/ s3://bench/bridge-N/   mcbridge sync (the same)   mcbridge verify
    rclone   rclone copy TREE s3e:bench/rclone-N      rclone sync (the same)     rclone check

``--steps adopt`` takes over a copy another tool made: ``rclone copy`` puts the tree at a prefix of
each tool's own (untimed), then ``mcbridge sync`` (which adopts each object whose MD5 ETag equals
the local file's MD5 and commits a record naming them, sending no object) beside ``rclone sync
--checksum`` (which compares the same MD5s and sends nothing).

Each step is its own process; wall time from start to exit; peak RSS is the largest of the
process tree's summed RSS (psutil, sampled every 0.1 s) and the process's own ru_maxrss from
wait4(). Both tools run at their defaults (bridge with --store-checksums skip: rclone serve s3
keeps no checksums for it to read back). Ratios are bridge/rclone; per-file times are the
step's time over N.

--listing M plans a copy of M generated objects with ``cp --dry-run`` (``--listing-json``: with
``--json``, every file printed, to /dev/null), the real planner, estimator and printer over a listing that a test-only store synthesises (``GeneratedStore``:
an s3:// store whose walk yields M ObjectInfo in key order, with no request), to a local folder;
its peak RSS is reported. --tree-dir keeps the source trees (made once, reused by later runs:
making 1,000,000 files takes a few minutes). The load average is printed: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.bench_transfer import byte_compile

BIN = Path(sys.executable).parent
MiB = 1024 * 1024
BRIDGE = [sys.executable, "-m", "bridge"]
FOLDER = 1000


def make_tree(root: Path, count: int) -> Path:
    """``count`` files of 1 KiB, each different, in folders of FOLDER; kept for later runs (a
    ``.done`` file beside the tree says it is whole)."""
    done = root.with_name(root.name + ".done")
    if done.exists() and done.read_text().strip() == str(count):
        return root
    shutil.rmtree(root, ignore_errors=True)
    block = os.urandom(1024 - 8)
    started = time.perf_counter()
    for first in range(0, count, FOLDER):
        folder = root / f"d{first // FOLDER:05d}"
        folder.mkdir(parents=True)
        base = str(folder) + "/f"
        for i in range(first, min(first + FOLDER, count)):
            fd = os.open(f"{base}{i:08d}.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, block + i.to_bytes(8, "little"))
            os.close(fd)
    done.write_text(str(count))
    print(f"made {count} files in {time.perf_counter() - started:.0f}s", flush=True)
    return root


def measure(cmd: list[str], env: dict[str, str], log: Path, quiet: bool = False) -> tuple[float, int]:
    """(seconds, peak RSS bytes) of one run of ``cmd``; raises when it fails. Its output goes to
    ``log`` (with ``quiet``, only its stderr)."""
    import psutil
    with open(log, "ab") as out:
        out.write(("\n$ " + " ".join(cmd) + "\n").encode())
        out.flush()
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL if quiet else out,
                                stderr=out if quiet else subprocess.STDOUT)
        peak = 0
        stop = threading.Event()

        def sample() -> None:
            nonlocal peak
            try:
                top = psutil.Process(proc.pid)
            except psutil.NoSuchProcess:
                return
            while not stop.wait(0.1):
                try:
                    tree = [top, *top.children(recursive=True)]
                    peak = max(peak, sum(p.memory_info().rss for p in tree))
                except psutil.NoSuchProcess:
                    return

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _pid, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - start
        stop.set()
        sampler.join()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"failed ({code}): {' '.join(cmd)} (see {log})")
    return elapsed, max(peak, usage.ru_maxrss * 1024)


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


# -- a generated listing, for planning 10,000,000 objects --------------------------------------------

def generated_store_class():
    """An s3:// store whose listing is synthesised (GEN_OBJECTS objects of 1 KiB, in key order,
    folders of FOLDER) and which sends no request: the real planner, estimator and printer over a
    listing no emulator could hold. Test-only: it serves nothing but check_bucket, info and walk."""
    from bridge.errors import ObjectNotFound
    from bridge.stores.base import Features, ObjectInfo, Store
    from bridge.urls import Location

    class GeneratedStore(Store):
        scheme = "s3"
        features = Features(min_part_size=5 * MiB, max_part_size=5 * 1024 * MiB, max_parts=10_000,
                            max_object_size=5 * 1024**4, max_copy_size=5 * 1024**3)

        def __init__(self, settings):
            self.settings = settings
            self.count = int(os.environ["GEN_OBJECTS"])

        def check_bucket(self, loc):
            return None

        def info(self, loc):
            raise ObjectNotFound(str(loc))

        def read(self, loc, offset=0, length=None):
            raise NotImplementedError("a generated listing has no bytes")

        put = delete = read

        def list(self, prefix):
            bucket, key = prefix.bucket, prefix.key
            for i in range(self.count):
                yield ObjectInfo(Location("s3", bucket, f"{key}d{i // FOLDER:05d}/f{i:08d}.bin"), 1024,
                                 identity={"etag": f"{i:032x}", "last_modified": "2026-01-01T00:00:00Z"})

    return GeneratedStore


def run_generated(argv: list[str]) -> None:
    """In a child process: mcbridge with s3:// served by the generated store."""
    from bridge import stores
    stores.REGISTRY["s3"] = stores.Backend("bench.bench_scale:GENERATED", "")
    globals()["GENERATED"] = generated_store_class()
    from bridge.cli import main as cli_main
    sys.argv = ["mcbridge", *argv]
    cli_main()


# -- the run ---------------------------------------------------------------------------------

def s3_env(base: dict[str, str], s3) -> dict[str, str]:
    env = dict(base, **s3.env())
    env.update({"RCLONE_CONFIG": os.devnull, "RCLONE_CONFIG_S3E_TYPE": "s3",
                "RCLONE_CONFIG_S3E_PROVIDER": "Other", "RCLONE_CONFIG_S3E_ENDPOINT": s3.endpoint,
                "RCLONE_CONFIG_S3E_ACCESS_KEY_ID": "testing", "RCLONE_CONFIG_S3E_SECRET_ACCESS_KEY": "testing",
                "RCLONE_CONFIG_S3E_FORCE_PATH_STYLE": "true", "RCLONE_CONFIG_S3E_REGION": "us-east-1"})
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", default="10000", help="comma-separated file counts, e.g. 10000,1000000")
    ap.add_argument("--tree-dir", default="", help="where the source trees are made and kept for reuse")
    ap.add_argument("--listing", type=int, default=0, help="plan a copy of this many generated objects (dry run)")
    ap.add_argument("--listing-json", action="store_true",
                    help="print the generated plan as JSON, every file of it (default: the plan's summary)")
    ap.add_argument("--steps", default="cp,sync,verify", help="which of cp,sync,verify,pack,unpack,adopt to "
                    "run (pack: mcbridge pack local -> local, beside tar -cf in the rclone column; unpack, "
                    "after pack: mcbridge unpack of its shards beside tar -xf then sync; adopt: sync onto a "
                    "copy rclone made, beside rclone sync --checksum)")
    ap.add_argument("--tools", default="bridge,rclone")
    ap.add_argument("--bridge-args", default="", help="extra arguments for mcbridge cp and sync")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mcbridge-scale-"))
    trees = Path(args.tree_dir) if args.tree_dir else work / "trees"
    trees.mkdir(parents=True, exist_ok=True)
    log = work / "bench.log"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "RCLONE_", "STORAGE_"))}
    base.update({"MCBRIDGE_STATE_DIR": str(work / "state"), "XDG_CONFIG_HOME": str(work / "noconfig"),
                 "AWS_EC2_METADATA_DISABLED": "true"})
    byte_compile()
    steps, tools = args.steps.split(","), args.tools.split(",")
    extra = args.bridge_args.split()
    rows: list[dict] = []
    print(f"load average at start: {load()}; log {log}", flush=True)
    for count in (int(n) for n in args.files.split(",") if n):
        tree = make_tree(trees / f"tree-{count}", count)
        from tests.emulators import RcloneS3
        with RcloneS3() as s3:
            s3.create_bucket("bench")
            env = s3_env(base, s3)
            rclone = str(BIN / "rclone")
            commands = {
                "bridge": {"cp": [*BRIDGE, "cp", f"{tree}/", f"s3://bench/bridge-{count}/", "-q",
                                  "--store-checksums", "skip", *extra],
                           "sync": [*BRIDGE, "sync", f"{tree}/", f"s3://bench/bridge-{count}/", "-q",
                                    "--store-checksums", "skip", *extra],
                           "verify": [*BRIDGE, "verify", f"s3://bench/bridge-{count}/"]},
                "rclone": {"cp": [rclone, "copy", str(tree), f"s3e:bench/rclone-{count}"],
                           "sync": [rclone, "sync", str(tree), f"s3e:bench/rclone-{count}"],
                           "verify": [rclone, "check", str(tree), f"s3e:bench/rclone-{count}"]},
            }
            # pack, local -> local: beside tar, which only copies bytes
            commands["bridge"]["pack"] = [*BRIDGE, "pack", f"{tree}/", str(work / f"packed-{count}"), "-q"]
            commands["rclone"]["pack"] = ["tar", "-cf", str(work / f"packed-{count}.tar"), "-C", str(tree), "."]
            # unpack what pack made, local -> local: beside tar -xf (then sync, as bridge syncs what it writes)
            commands["bridge"]["unpack"] = [*BRIDGE, "unpack", str(work / f"packed-{count}"),
                                            str(work / f"unpacked-{count}"), "-q"]
            commands["rclone"]["unpack"] = ["sh", "-c", f"mkdir -p {work}/untarred-{count} && tar -xf "
                                            f"{work}/packed-{count}.tar -C {work}/untarred-{count} && sync"]
            # adopt: a sync onto a copy another tool made (rclone copy, untimed, a prefix per tool)
            commands["bridge"]["adopt"] = [*BRIDGE, "sync", f"{tree}/", f"s3://bench/theirs-bridge-{count}/", "-q",
                                           "--store-checksums", "skip", *extra]
            commands["rclone"]["adopt"] = [rclone, "sync", "--checksum", str(tree), f"s3e:bench/theirs-rclone-{count}"]
            for step in steps:
                if step == "adopt":
                    for tool in tools:
                        subprocess.run([rclone, "copy", str(tree), f"s3e:bench/theirs-{tool}-{count}"], env=env,
                                       check=True, capture_output=True)
                row: dict = {"files": count, "step": step, "load": load()}
                for tool in tools:
                    os.sync()
                    seconds, peak = measure(commands[tool][step], env, log)
                    row[f"{tool}_s"] = round(seconds, 2)
                    row[f"{tool}_us_per_file"] = round(seconds / count * 1e6, 1)
                    row[f"{tool}_peak_mib"] = round(peak / MiB, 1)
                if "bridge" in tools and "rclone" in tools:
                    row["ratio"] = round(row["bridge_s"] / row["rclone_s"], 2)
                if step == "unpack" or (step == "pack" and "unpack" not in steps):
                    for made in (f"packed-{count}", f"unpacked-{count}", f"untarred-{count}"):
                        shutil.rmtree(work / made, ignore_errors=True)
                    Path(work / f"packed-{count}.tar").unlink(missing_ok=True)
                rows.append(row)
                print("  ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    if args.listing:
        env = dict(base, GEN_OBJECTS=str(args.listing), PYTHONPATH=os.pathsep.join(
            [str(Path(__file__).resolve().parent.parent), base.get("PYTHONPATH", "")]))
        out = work / "listing-dst"
        out.mkdir()
        cmd = [sys.executable, "-c", "import sys, bench.bench_scale as b; b.run_generated(sys.argv[1:])",
               "cp", "s3://gen/", f"{out}/", "--dry-run", *(["--json"] if args.listing_json else [])]
        seconds, peak = measure(cmd, env, log, quiet=True)
        step = "cp --dry-run --json" if args.listing_json else "cp --dry-run"
        row = {"files": args.listing, "step": f"{step} (generated listing)", "load": load(),
               "bridge_s": round(seconds, 1), "bridge_us_per_file": round(seconds / args.listing * 1e6, 1),
               "bridge_peak_mib": round(peak / MiB, 1)}
        rows.append(row)
        print("  ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    peaks = {r["files"]: max(x["bridge_peak_mib"] for x in rows if x["files"] == r["files"] and "bridge_peak_mib" in x)
             for r in rows if "bridge_peak_mib" in r and "generated" not in r["step"]}
    if len(peaks) > 1:
        small, big = min(peaks), max(peaks)
        print(f"bridge peak RSS at {big} files / at {small}: {peaks[big] / peaks[small]:.2f}x "
              f"({peaks[big]} MiB / {peaks[small]} MiB)", flush=True)
    print(json.dumps(rows))
    shutil.rmtree(work / "state", ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
