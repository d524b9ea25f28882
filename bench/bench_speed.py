"""Issue 13's cases: downloads and loose small objects, bridge against the best peer per store.

    python -m bench.bench_speed [--stores s3,gcs,azure] [--size-mib 1024] [--files 2000] [--repeat 3]
                                [--tls] [--credentials env|profile] [--sync-in-time] [--latency-ms MS]

Cases, on each store:
  big-down    one big object, store -> local        (peer on S3: s5cmd and rclone; else rclone)
  big-down-bridge  the same object written by bridge (a committed prefix), store -> local: bridge
              checks it against its record (the part digests carried, no recomputed SHA-256)
  big-up      the big file, local -> store
  small-up    N x 16 KiB loose files, local -> store
  small-down  the same N objects, store -> local
  adopt       ``sync`` onto a copy another tool made (S3 only): once, untimed, rclone copies
              ``--adopt-files`` x ``--adopt-kib`` KiB to a prefix; then ``mcbridge sync TREE/
              s3://...`` (adopts each object whose MD5 ETag equals the local file's MD5, sends
              none, commits a record naming them all) beside ``rclone sync --checksum`` (compares
              the same MD5s, sends none, writes nothing), each onto that prefix; after each bridge
              run its record (``_bridge/``) is deleted, untimed, so that every run meets the copy
              as rclone left it (neither tool rewrites an equal object; a fresh copy per run took
              minutes at 100,000 files); one untimed ``rclone sync --checksum`` first, so that no
              timed run pays the endpoint's first MD5 of each file
Stores: S3 = ``rclone serve s3`` (fast, Go), GCS = fake-gcs-server, Azure = Azurite. Method as in
bench_transfer.py: each tool is its own process, wall time from start to exit, peak RSS from
wait4(); each tool runs at its defaults with bridge's hashing and manifest on. Runs alternate
between the tools (bridge, peer, bridge, peer ...) so that a burst of load from the machine's
other users falls on both, and each round starts with the next tool, so that none always meets
the emulator emptiest, and what each upload run wrote is deleted after it (untimed); the fastest
of ``--repeat`` counts, and the load average is printed.
Before each run the page cache is written back (``sync``), and downloaded small files are kept
until the end, so that no run pays for another tool's dirty pages or freed inodes; bridge's
modules are byte-compiled first, as a wheel's are when installed.

``--tls``: every emulator behind HTTPS with a certificate of a CA made for the run (trustme), which
every tool is told to trust through its standard variable (AWS_CA_BUNDLE, REQUESTS_CA_BUNDLE,
SSL_CERT_FILE, RCLONE_CA_CERT). ``--credentials profile``: S3's keys in a shared credentials
file, named by AWS_PROFILE, instead of AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (bridge and s5cmd
read it; rclone keeps its own remote's keys). ``--sync-in-time``: each tool's time includes a
``sync`` after it, so that all have the bytes on disk (equal durability: bridge syncs what it
writes before it exits, the peers do not). ``--latency-ms MS``: every timed run reaches the
endpoint through tests/latencyproxy.py in a process of its own, which delays each direction by
MS, so that a round trip takes 2 x MS longer, as a cloud's endpoint is farther than loopback
(seeding and clean-up go direct).
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
from pathlib import Path

from bench.bench_transfer import BIN, MiB, _run_once, byte_compile, make_data, run_cpu, s3_env
from tests.emulators import (AZURITE_ACCOUNT, AZURITE_KEY, Azurite, FakeGCS, LocalCA, RcloneS3, TLSAzurite,
                             TLSFakeGCS, TLSRcloneS3)

TLS = {RcloneS3: TLSRcloneS3, FakeGCS: TLSFakeGCS, Azurite: TLSAzurite}


def gcs_env(base: dict[str, str], gcs: FakeGCS) -> dict[str, str]:
    env = dict(base, **gcs.env())
    env.update({"RCLONE_CONFIG": os.devnull, "RCLONE_CONFIG_G_TYPE": "google cloud storage",
                "RCLONE_CONFIG_G_ANONYMOUS": "true", "RCLONE_CONFIG_G_ENDPOINT": f"{gcs.endpoint}/storage/v1/",
                "RCLONE_CONFIG_G_BUCKET_POLICY_ONLY": "true"})
    return env


def azure_env(base: dict[str, str], az: Azurite) -> dict[str, str]:
    env = dict(base, **az.env())
    env.update({"RCLONE_CONFIG": os.devnull, "RCLONE_CONFIG_AZ_TYPE": "azureblob",
                "RCLONE_CONFIG_AZ_ACCOUNT": AZURITE_ACCOUNT, "RCLONE_CONFIG_AZ_KEY": AZURITE_KEY,
                "RCLONE_CONFIG_AZ_ENDPOINT": f"{az.endpoint}/{AZURITE_ACCOUNT}"})
    return env


STORES = {
    # name: (emulator, bridge URL scheme, rclone remote, environment)
    "s3": (RcloneS3, "s3://", "s3e:", s3_env),
    "gcs": (FakeGCS, "gs://", "g:", gcs_env),
    "azure": (Azurite, "az://", "az:", azure_env),
}


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stores", default="s3,gcs,azure")
    ap.add_argument("--cases", default="big-down,big-down-bridge,big-up,small-up,small-down")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--adopt-files", type=int, default=20000, help="files of the adopt case's tree")
    ap.add_argument("--adopt-kib", type=int, default=8, help="size of each file of the adopt case's tree")
    ap.add_argument("--bridge-args", default="", help="extra arguments for mcbridge cp")
    ap.add_argument("--verbose", action="store_true", help="print every run's time, not only the fastest")
    ap.add_argument("--tls", action="store_true", help="the emulators behind HTTPS, with a CA made for the run")
    ap.add_argument("--credentials", choices=("env", "profile"), default="env",
                    help="S3 keys in environment variables, or in a profile of a shared credentials file")
    ap.add_argument("--sync-in-time", action="store_true", help="each tool's time includes a sync after it")
    ap.add_argument("--latency-ms", type=float, default=0.0,
                    help="each direction of every timed run's connections delayed by this much (a far endpoint)")
    ap.add_argument("--out-dir", default="", help="where downloads go (default: the bench's work folder); "
                    "a tmpfs such as /dev/shm takes the disk out of the times")
    ap.add_argument("--before", default="", help="a folder holding an earlier bridge/ package: run it too, "
                    "as tool 'before', for a before/after comparison in the same run")
    args = ap.parse_args()
    cases = args.cases.split(",")
    work = Path(tempfile.mkdtemp(prefix="mcbridge-speed-"))
    outs = Path(tempfile.mkdtemp(prefix="mcbridge-speed-out-", dir=args.out_dir)) if args.out_dir else work
    log = work / "bench.log"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "RCLONE_", "STORAGE_"))}
    base.update({"MCBRIDGE_STATE_DIR": str(work / "state"), "XDG_CONFIG_HOME": str(work / "noconfig"),
                 "AWS_EC2_METADATA_DISABLED": "true"})
    big, small = make_data(work / "data", args.size_mib, args.files)
    theirs = work / "data" / "adopt"
    if "adopt" in cases:
        for i in range(args.adopt_files):
            folder = theirs / f"{i // 1000:03d}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{i:07d}.bin").write_bytes(os.urandom(args.adopt_kib * 1024))
    byte_compile(Path(__file__).resolve().parent.parent, *([Path(args.before)] if args.before else []))
    sizes = {"big-down": big.stat().st_size, "big-down-bridge": big.stat().st_size, "big-up": big.stat().st_size,
             "small-up": args.files * 16 * 1024,
             "small-down": args.files * 16 * 1024, "adopt": args.adopt_files * args.adopt_kib * 1024}
    extra = args.bridge_args.split()
    rows: list[dict] = []
    print(f"load average at start: {load()}", flush=True)
    ca = LocalCA(work / "ca") if args.tls else None
    print(f"over {'HTTPS' if ca else 'HTTP'}, S3 keys from {'a profile' if args.credentials == 'profile' else 'the environment'}"
          f"{', sync in each time' if args.sync_in_time else ''}"
          f"{f', {2 * args.latency_ms:g} ms added to each round trip' if args.latency_ms else ''}", flush=True)
    for store in args.stores.split(","):
        emulator, scheme, remote, make_env = STORES[store]
        with (TLS[emulator](ca) if ca else emulator()) as server:
            server.create_bucket("bench")
            env = make_env(base, server)
            if ca:
                env.update({name: str(ca.ca_file) for name in ("AWS_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE",
                                                              "RCLONE_CA_CERT", "MCBRIDGE_CA_BUNDLE")})
            if store == "s3" and args.credentials == "profile":
                keys = work / "aws-credentials"
                keys.write_text(f"[bench]\naws_access_key_id = {env.pop('AWS_ACCESS_KEY_ID')}\n"
                                f"aws_secret_access_key = {env.pop('AWS_SECRET_ACCESS_KEY')}\n")
                env.update(AWS_SHARED_CREDENTIALS_FILE=str(keys), AWS_CONFIG_FILE=str(work / "no-aws-config"),
                           AWS_PROFILE="bench")
            rclone, s5cmd = str(BIN / "rclone"), str(BIN / "s5cmd")
            # The objects to download, put there by rclone (not timed).
            _run_once([rclone, "copy", str(big), f"{remote}bench/seed-big/"], env, log)
            _run_once([rclone, "copy", str(small), f"{remote}bench/seed-small/", "--transfers", "16"], env, log)
            far, endpoint, proxy = env, server.endpoint, None
            if args.latency_ms:   # the timed runs through a proxy that delays, in a process of its own
                proxy = subprocess.Popen([sys.executable, "-m", "tests.latencyproxy", str(server.port),
                                          str(args.latency_ms)], stdout=subprocess.PIPE, text=True,
                                         cwd=Path(__file__).resolve().parent.parent)
                port = proxy.stdout.readline().strip()
                far = {k: v.replace(f":{server.port}", f":{port}") for k, v in env.items()}
                endpoint = server.endpoint.replace(f":{server.port}", f":{port}")
            # rclone serve s3 keeps no S3 checksums: bridge relies on its per-part ones there
            keep = ["--store-checksums", "skip"] if store == "s3" else []
            if "big-down-bridge" in cases:   # a prefix bridge wrote and committed (not timed)
                # Read back, not skipped: rclone serve s3 answers a completed multipart upload with
                # an ETag of the parts' MD5s but lists the object under the MD5 of the whole, so
                # an identity taken from that answer (skip) never matches the listing, and the
                # download would take the object for another version and hash it all again
                # instead of carrying the record's SHA-256s. readback records what HEAD says.
                seed_check = ["--store-checksums", "readback"] if store == "s3" else []
                _run_once([str(BIN / "mcbridge"), "cp", str(big), f"{scheme}bench/seed-big-bridge/", "-q",
                           *seed_check], env, log)
            # Outputs of the small cases stay until the bench ends: ext4 scans past inodes freed in
            # the last minutes when it allocates new ones (recently_deleted() in a kernel profile), so
            # deleting 2,000-file trees between runs made every later run slower, by up to 2x.
            out = outs / f"out-{store}"
            for case in cases:
                if case == "adopt" and store != "s3":
                    continue
                tools: dict[str, list[str]] = {}
                if case in ("big-down", "big-down-bridge"):
                    seed = "seed-big" if case == "big-down" else "seed-big-bridge"
                    # from the bridge-written prefix bridge copies the prefix: its record proves the bytes
                    source = f"bench/{seed}/{big.name}" if case == "big-down" else f"bench/{seed}/"
                    tools["bridge"] = [str(BIN / "mcbridge"), "cp", f"{scheme}{source}",
                                       f"{out}/{{run}}/bridge/", "-q", *extra]
                    tools["rclone"] = [rclone, "copy", f"{remote}bench/{seed}/{big.name}", f"{out}/{{run}}/rclone/"]
                    if store == "s3":
                        tools["s5cmd"] = [s5cmd, "--endpoint-url", endpoint, "cp",
                                          f"s3://bench/{seed}/{big.name}", f"{out}/{{run}}/s5cmd/"]
                elif case == "big-up":
                    tools["bridge"] = [str(BIN / "mcbridge"), "cp", str(big), f"{scheme}bench/up-bridge-{{run}}/",
                                       "-q", *keep, *extra]
                    tools["rclone"] = [rclone, "copy", str(big), f"{remote}bench/up-rclone-{{run}}/"]
                    if store == "s3":
                        tools["s5cmd"] = [s5cmd, "--endpoint-url", endpoint, "cp", str(big),
                                          "s3://bench/up-s5cmd-{run}/"]
                elif case == "small-down":
                    tools["bridge"] = [str(BIN / "mcbridge"), "cp", f"{scheme}bench/seed-small/",
                                       f"{out}/{{run}}/bridge/", "-q", *extra]
                    tools["rclone"] = [rclone, "copy", f"{remote}bench/seed-small/", f"{out}/{{run}}/rclone/"]
                    if store == "s3":
                        tools["s5cmd"] = [s5cmd, "--endpoint-url", endpoint, "cp",
                                          "s3://bench/seed-small/*", f"{out}/{{run}}/s5cmd/"]
                elif case == "adopt":
                    # the copy another tool made (untimed, once), which every run syncs onto
                    _run_once([rclone, "copy", str(theirs), f"{remote}bench/adopt-theirs/", "--transfers", "16"],
                              env, log)
                    # and listed once with its MD5s (untimed): the first listing of a copy costs
                    # rclone serve s3 an MD5 of each file, which the first timed run would pay
                    _run_once([rclone, "sync", "--checksum", str(theirs), f"{remote}bench/adopt-theirs/"], env, log)
                    tools["bridge"] = [str(BIN / "mcbridge"), "sync", f"{theirs}/", f"{scheme}bench/adopt-theirs/",
                                       "-q", *keep, *extra]
                    tools["rclone"] = [rclone, "sync", "--checksum", str(theirs), f"{remote}bench/adopt-theirs/"]
                else:
                    tools["bridge"] = [str(BIN / "mcbridge"), "cp", f"{small}/", f"{scheme}bench/up-bridge-{{run}}/",
                                       "-q", *extra]
                    tools["rclone"] = [rclone, "copy", str(small), f"{remote}bench/up-rclone-{{run}}/"]
                    if store == "s3":
                        tools["s5cmd"] = [s5cmd, "--endpoint-url", endpoint, "cp", f"{small}/*",
                                          "s3://bench/up-s5cmd-{run}/"]
                if args.before:
                    tools["before"] = [c.replace("/bridge/", "/before/").replace("up-bridge-", "up-before-")
                                       for c in tools["bridge"]]
                before_env = dict(far, PYTHONPATH=args.before)
                best: dict[str, tuple[float, int]] = {}
                times: dict[str, list[float]] = {}
                cpus: dict[str, list[float]] = {}   # CPU seconds of each run (user + system)
                names = list(tools)
                for i in range(args.repeat):
                    # Each round starts with the next tool: an emulator that slows as it fills up
                    # (fake-gcs-server: 12 s for the first 2,000 uploads, 67 s some rounds later)
                    # would otherwise favour whichever tool always went first.
                    for tool in names[i % len(names):] + names[:i % len(names)]:
                        cmd = tools[tool]
                        # No tool pays for another's dirty pages (bridge's syncfs would write them back).
                        os.sync()
                        run = [c.replace("{run}", f"{case}-{i}") for c in cmd]
                        if args.sync_in_time:
                            run = ["sh", "-c", '"$@" && sync', "sh", *run]
                        t, peak, cpu = run_cpu(run, before_env if tool == "before" else far, log)
                        cpus.setdefault(tool, []).append(cpu)
                        if args.verbose:
                            print(f"  {store} {case} run {i} {tool:<7} {t:6.2f}s  cpu {cpu:5.2f}s", flush=True)
                        if case == "adopt" and tool in ("bridge", "before"):
                            # its record gone again (untimed): the next run meets rclone's copy alone
                            _run_once([rclone, "purge", f"{remote}bench/adopt-theirs/_bridge/"], env, log)
                        if case in ("small-up", "big-up"):
                            # Gone again before the next run (not timed): fake-gcs-server and
                            # Azurite slow down as they fill up (2,000 uploads to fake-gcs-server:
                            # 9 s into a fresh one, 43 s with 10,000 objects in it), which made
                            # each round slower than the last and the small downloads after them
                            # slower than against a fresh emulator.
                            _run_once([rclone, "purge", f"{remote}bench/up-{tool}-{case}-{i}/"], env, log)
                        times.setdefault(tool, []).append(t)
                        old = best.get(tool)
                        best[tool] = (min(t, old[0]) if old else t, max(peak, old[1]) if old else peak)
                    if case.startswith("big-down"):
                        shutil.rmtree(out, ignore_errors=True)
                peer = min((t for t in best if t not in ("bridge", "before")), key=lambda t: best[t][0])
                row = {"store": store, "case": case, "load": load(), "best_peer": peer,
                       "ratio": round(best["bridge"][0] / best[peer][0], 2),
                       **{f"{t}_s": round(v[0], 2) for t, v in best.items()},
                       "bridge_peak_mib": round(best["bridge"][1] / MiB),
                       **({"round_trip_added_ms": 2 * args.latency_ms} if args.latency_ms else {})}
                # The median as well: on this VM one tool's 1 GiB download moved by 2-3x between runs
                # minutes apart (memory the hypervisor had taken back is slow to touch again).
                median = {t: statistics.median(v) for t, v in times.items()}
                row["median_ratio"] = round(median["bridge"] / min(median[t] for t in median if t not in ("bridge", "before")), 2)
                row.update({f"{t}_median_s": round(v, 2) for t, v in median.items()})
                # CPU seconds per GiB moved (median of the runs): what each tool's time costs the machine's cores
                gib = sizes[case] / (1024 * MiB)
                row.update({f"{t}_cpu_s_per_gib": round(statistics.median(v) / gib, 2) for t, v in cpus.items()})
                if "before" in best:
                    row["before_ratio"] = round(best["before"][0] / best[peer][0], 2)
                    row["before_peak_mib"] = round(best["before"][1] / MiB)
                rows.append(row)
                per_gib = ", ".join(f"{t} {row[f'{t}_cpu_s_per_gib']:.2f}" for t in cpus)
                tools_line = "  ".join(f"{t} {v[0]:6.2f}s" for t, v in best.items())
                before = f"  before/{peer} {row['before_ratio']:5.2f}" if "before" in row else ""
                print(f"{store:<6} {case:<11} {tools_line}  bridge/{peer} {row['ratio']:5.2f}{before}  "
                      f"(medians: bridge/best peer {row['median_ratio']:5.2f})  "
                      f"bridge peak {row['bridge_peak_mib']} MiB  (load {row['load']}, "
                      f"CPU s/GiB {per_gib}, "
                      f"{sizes[case] / best['bridge'][0] / MiB:.0f} MiB/s)", flush=True)
            if proxy is not None:
                proxy.terminate()
                proxy.wait(10)
    print(json.dumps(rows))
    shutil.rmtree(work, ignore_errors=True)
    if outs != work:
        shutil.rmtree(outs, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
