"""Issue 21's client choice: bridge's S3 request path against awscrt's S3 client and obstore.

    python -m bench.bench_clients [--size-mib 1024] [--files 2000] [--repeat 3] [--tls]

The same requests through each client library, in a process of its own per run, against one
``rclone serve s3`` on loopback (plain HTTP, static keys, path-style), so that what differs is
the request path and nothing else (no manifest, no journal, no hashing beyond what the client
sends by default):

  big-down    one object of --size-mib MiB to a local file: bridge reads 8 MiB ranges, 8 at a
              time, each written to its place (os.pwrite); awscrt splits the GET itself
              (part_size 8 MiB) and writes the file (recv_filepath); obstore streams one GET
              (its ranged reads refuse rclone serve s3's answers as not partial)
  small-up    --files objects of 16 KiB PUT, 64 at a time
  small-down  those objects read back into memory, 64 at a time

Clients: ``bridge`` is bridge's S3 store as the engine calls it (``read`` in a thread pool for
ranges, ``put_many`` and ``read_many`` for small objects: the direct path's batched requests,
with the CRC32C header each PUT carries); ``obstore`` (Rust object_store, asyncio API) and
``awscrt`` (the CRT S3 client boto3's CRT transfer manager and Mountpoint use). Time is measured
inside each process from the first request to the last answer (start-up and imports left out),
with the process's CPU time (user + system) over the same span; the fastest of ``--repeat``
runs counts, with the median, runs alternating between clients and each round starting with the
next. ``--tls``: the endpoint behind HTTPS with a certificate of a CA made for the run (trustme),
which each client is given (bridge: its CA bundle; obstore: ``root_certificate``; awscrt: its
trust store); ``awscrt-ranges``: the engine's calls (8 MiB ranges, 8 threads) through
awscrt's S3 client, one request per range, TLS and reads in C (``--clients`` names it: it runs
over HTTP too). ``mcbridge`` and ``s5cmd`` (big-down only): the whole command as a user runs it,
``mcbridge cp`` with its part checksums, default digest, record and fsync, its time and CPU from
start to exit (the CPU of the child process), for CPU seconds per GiB side by side. Needs the ``bench`` extra
(``pip install -e '.[bench]'``: awscrt, obstore).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_transfer import BIN, MiB, _run_once, make_data, s3_env
from tests.emulators import AWS_TEST_CREDENTIALS, LocalCA, RcloneS3, TLSRcloneS3

KEY, SECRET = AWS_TEST_CREDENTIALS["aws_access_key_id"], AWS_TEST_CREDENTIALS["aws_secret_access_key"]
RANGE = 8 * MiB
RANGES_AT_ONCE = 8
SMALL_AT_ONCE = 64
BUCKET = "bench"


def _cpu() -> float:
    """This process's CPU time, user + system, with its finished children's (a whole command's)."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                   resource.getrusage(resource.RUSAGE_CHILDREN)))


# -- one client's run of one case, in this process ---------------------------------------------

def run_bridge(case: str, endpoint: str, size: int, names: list[str], out: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor
    from bridge.config import load_settings
    from bridge.hashing import crc32c, crc_hex
    from bridge.stores import get_store
    from bridge.urls import parse
    settings = load_settings(None, environ=os.environ)   # the endpoint and keys of s3_env's variables
    root = parse(f"s3://{BUCKET}/")
    store = get_store(root, settings)
    if case == "big-down":
        loc = root.join("seed-big/checkpoint.bin")
        fd = os.open(out / "big.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.ftruncate(fd, size)

        def one(offset: int) -> None:
            os.pwrite(fd, store.read(loc, offset, min(RANGE, size - offset)), offset)
        with ThreadPoolExecutor(RANGES_AT_ONCE) as pool:
            list(pool.map(one, range(0, size, RANGE)))
        os.close(fd)
    elif case == "small-up":
        data = [os.urandom(16 * 1024) for _ in names]

        def body(i: int) -> tuple:
            return root.join(f"up/{names[i]}"), data[i], crc_hex(crc32c(data[i])), {}, None
        failed = store.put_many(len(names), body, lambda i, info: None)
        assert not failed, failed
    else:
        got = []
        failed = store.read_many([root.join(f"seed-small/{n}") for n in names], lambda i, data: got.append(len(data)))
        assert not failed and len(got) == len(names), failed


def run_obstore(case: str, endpoint: str, size: int, names: list[str], out: Path) -> None:
    import asyncio
    import obstore
    from obstore.store import S3Store
    cafile = os.environ.get("MCBRIDGE_CA_BUNDLE")
    tls = {"root_certificate": Path(cafile).read_bytes()} if cafile else {"allow_http": True}
    store = S3Store(BUCKET, endpoint=endpoint, access_key_id=KEY, secret_access_key=SECRET, region="us-east-1",
                    virtual_hosted_style_request=False, client_options=tls)

    async def main() -> None:
        if case == "big-down":
            # One GET streamed to the file: obstore's ranged reads refuse rclone serve s3's
            # answers ("Received non-partial response when range requested").
            result = await obstore.get_async(store, "seed-big/checkpoint.bin")
            with open(out / "big.bin", "wb") as f:
                async for chunk in result.stream(min_chunk_size=RANGE):
                    f.write(memoryview(chunk))
            return
        gate = asyncio.Semaphore(SMALL_AT_ONCE)
        data = os.urandom(16 * 1024)

        async def put(name: str) -> None:
            async with gate:
                await obstore.put_async(store, f"up/{name}", data)

        async def get(name: str) -> int:
            async with gate:
                result = await obstore.get_async(store, f"seed-small/{name}")
                return len(await result.bytes_async())
        await asyncio.gather(*((put if case == "small-up" else get)(n) for n in names))
    asyncio.run(main())


def _crt_client(endpoint: str):
    from awscrt.auth import AwsCredentialsProvider
    from awscrt.io import ClientBootstrap, ClientTlsContext, DefaultHostResolver, EventLoopGroup, TlsContextOptions
    from awscrt.s3 import S3Client, S3RequestTlsMode
    loop = EventLoopGroup()
    tls = {"tls_mode": S3RequestTlsMode.DISABLED}
    if endpoint.startswith("https://"):
        options = TlsContextOptions()
        options.override_default_trust_store_from_path(ca_filepath=os.environ["MCBRIDGE_CA_BUNDLE"])
        tls = {"tls_mode": S3RequestTlsMode.ENABLED,
               "tls_connection_options": ClientTlsContext(options).new_connection_options()}
    return S3Client(bootstrap=ClientBootstrap(loop, DefaultHostResolver(loop)), region="us-east-1",
                    credential_provider=AwsCredentialsProvider.new_static(KEY, SECRET),
                    part_size=RANGE, throughput_target_gbps=10.0, **tls)


def run_awscrt_ranges(case: str, endpoint: str, size: int, names: list[str], out: Path) -> None:
    """big-down as bridge's engine asks for it (8 MiB ranges from 8 threads, each written to its
    place), each range one request of awscrt's S3 client."""
    from concurrent.futures import ThreadPoolExecutor
    from urllib.parse import urlsplit
    from awscrt.http import HttpHeaders, HttpRequest
    from awscrt.s3 import S3RequestType
    assert case == "big-down", "awscrt-ranges runs big-down only"
    host = urlsplit(endpoint).netloc
    client = _crt_client(endpoint)
    fd = os.open(out / "big.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.ftruncate(fd, size)

    def one(offset: int) -> None:
        end = min(offset + RANGE, size) - 1
        request = HttpRequest("GET", f"/{BUCKET}/seed-big/checkpoint.bin",
                              HttpHeaders([("Host", host), ("Range", f"bytes={offset}-{end}")]))
        client.make_request(type=S3RequestType.GET_OBJECT, request=request,
                            on_body=lambda chunk, offset, **_kw: os.pwrite(fd, chunk, offset)).finished_future.result()
        # (offset: the chunk's place in the object, as awscrt gives it)
    with ThreadPoolExecutor(RANGES_AT_ONCE) as pool:
        list(pool.map(one, range(0, size, RANGE)))
    os.close(fd)


def run_awscrt(case: str, endpoint: str, size: int, names: list[str], out: Path) -> None:
    import io
    from urllib.parse import urlsplit
    from awscrt.http import HttpHeaders, HttpRequest
    from awscrt.s3 import S3RequestType
    host = urlsplit(endpoint).netloc
    client = _crt_client(endpoint)
    if case == "big-down":
        request = HttpRequest("GET", f"/{BUCKET}/seed-big/checkpoint.bin", HttpHeaders([("Host", host)]))
        client.make_request(type=S3RequestType.GET_OBJECT, request=request,
                            recv_filepath=str(out / "big.bin")).finished_future.result()
        return
    data = os.urandom(16 * 1024)
    pending = []
    for name in names:
        if case == "small-up":
            headers = HttpHeaders([("Host", host), ("Content-Length", str(len(data))),
                                   ("Content-Type", "application/octet-stream")])
            request = HttpRequest("PUT", f"/{BUCKET}/up/{name}", headers, io.BytesIO(data))
            kind = S3RequestType.PUT_OBJECT
        else:
            request = HttpRequest("GET", f"/{BUCKET}/seed-small/{name}", HttpHeaders([("Host", host)]))
            kind = S3RequestType.GET_OBJECT
        chunks: list[int] = []
        pending.append(client.make_request(type=kind, request=request,
                                           on_body=lambda chunk, offset, got=chunks, **_kw: got.append(len(chunk))))
        if len(pending) >= SMALL_AT_ONCE:
            pending.pop(0).finished_future.result()
    for request in pending:
        request.finished_future.result()


def run_tool(tool: str):
    """big-down by a whole command, as a user runs it (start-up included): ``mcbridge cp`` (its
    part checksums, default digest, record and fsync) or ``s5cmd cp``; its CPU is the child's."""
    def run(case: str, endpoint: str, size: int, names: list[str], out: Path) -> None:
        assert case == "big-down", f"{tool} runs big-down only"
        src = f"s3://{BUCKET}/seed-big/checkpoint.bin"
        cmd = ([str(BIN / "mcbridge"), "cp", src, f"{out}/", "-q"] if tool == "mcbridge" else
               [str(BIN / "s5cmd"), "--endpoint-url", endpoint, "cp", src, f"{out}/"])
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return run


BIG_DOWN_ONLY = {"awscrt-ranges", "mcbridge", "s5cmd"}   # (skipped in the other cases)
CLIENTS = {"bridge": run_bridge, "obstore": run_obstore, "awscrt": run_awscrt, "awscrt-ranges": run_awscrt_ranges,
           "mcbridge": run_tool("mcbridge"), "s5cmd": run_tool("s5cmd")}


def child(args: argparse.Namespace) -> None:
    """One run, timed from the first request to the last answer; prints its JSON line."""
    names = [f"{i // 500:03d}/{i:06d}.bin" for i in range(args.files)]
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)   # (a command would skip a file already there)
    out.mkdir(parents=True, exist_ok=True)
    wall, cpu = time.perf_counter(), _cpu()
    CLIENTS[args.client](args.case, args.endpoint, args.size_mib * MiB, names, out)
    print(json.dumps({"wall": time.perf_counter() - wall, "cpu": _cpu() - cpu}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cases", default="big-down,small-up,small-down")
    ap.add_argument("--clients", default="bridge,obstore,awscrt")
    ap.add_argument("--tls", action="store_true", help="the endpoint behind HTTPS, with a CA made for the run")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--client", help=argparse.SUPPRESS)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--endpoint", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    work = Path(tempfile.mkdtemp(prefix="mcbridge-clients-"))
    log = work / "bench.log"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RCLONE_"))}
    base.update({"MCBRIDGE_STATE_DIR": str(work / "state"), "XDG_CONFIG_HOME": str(work / "noconfig"),
                 "AWS_EC2_METADATA_DISABLED": "true"})
    big, small = make_data(work / "data", args.size_mib, args.files)
    clients = args.clients.split(",")
    print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    rows = []
    with (TLSRcloneS3(LocalCA(work / "ca")) if args.tls else RcloneS3()) as server:
        server.create_bucket(BUCKET)
        env = s3_env(base, server)
        if args.tls:
            env.update({name: str(server.ca.ca_file) for name in ("AWS_CA_BUNDLE", "RCLONE_CA_CERT", "MCBRIDGE_CA_BUNDLE")})
        print(f"over {'HTTPS' if args.tls else 'HTTP'}", flush=True)
        rclone = str(BIN / "rclone")
        _run_once([rclone, "copy", str(big), f"s3e:{BUCKET}/seed-big/"], env, log)
        _run_once([rclone, "copy", str(small), f"s3e:{BUCKET}/seed-small/", "--transfers", "16"], env, log)
        for case in args.cases.split(","):
            best: dict[str, dict] = {}
            walls: dict[str, list[float]] = {}
            here = [c for c in clients if case == "big-down" or c not in BIG_DOWN_ONLY]
            for i in range(args.repeat):
                for client in here[i % len(here):] + here[:i % len(here)]:
                    os.sync()
                    r = subprocess.run([sys.executable, "-m", "bench.bench_clients", "--child", "--client", client,
                                        "--case", case, "--endpoint", server.endpoint, "--out", str(work / "out"),
                                        "--size-mib", str(args.size_mib), "--files", str(args.files)],
                                       env=env, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
                    if r.returncode != 0:
                        print(f"  {case} {client}: failed (exit {r.returncode}): {r.stderr.strip()[-600:]}", flush=True)
                        continue
                    got = json.loads(r.stdout.strip().splitlines()[-1])
                    walls.setdefault(client, []).append(got["wall"])
                    if client not in best or got["wall"] < best[client]["wall"]:
                        best[client] = got
                    if case == "small-up":   # what it wrote goes (untimed)
                        _run_once([rclone, "purge", f"s3e:{BUCKET}/up/"], env, log)
            size = args.size_mib * MiB if case == "big-down" else args.files * 16 * 1024
            median = {c: statistics.median(v) for c, v in walls.items()}
            per_gib = (lambda cpu: f" = {cpu / (size / (1024 * MiB)):5.2f} s/GiB") if case == "big-down" else (lambda cpu: "")
            line = "  ".join(f"{c} {v['wall']:6.2f}s (median {median[c]:6.2f}s, cpu {v['cpu']:5.2f}s{per_gib(v['cpu'])}, "
                             f"{size / v['wall'] / MiB:5.0f} MiB/s)" for c, v in best.items())
            print(f"{case:<11} {line}  (load {' '.join(f'{x:.1f}' for x in os.getloadavg())})", flush=True)
            rows.append({"case": case, **{f"{c}_s": round(v["wall"], 3) for c, v in best.items()},
                         **{f"{c}_median_s": round(v, 3) for c, v in median.items()},
                         **{f"{c}_cpu_s": round(v["cpu"], 3) for c, v in best.items()}})
    print(json.dumps(rows))


if __name__ == "__main__":
    sys.exit(main())
