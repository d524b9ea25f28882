"""Transfer benchmark: bridge against s5cmd and rclone on the same endpoints, in one run.

    python -m bench.bench_transfer [--size-mib 1024] [--files 2000] [--endpoints rclone,moto]

Cases (issue 3):
  (a) one big file, local -> S3
  (b) many 16 KiB files, local -> S3
  (c) the big file, S3 -> Azure (rclone between remotes; s5cmd speaks only S3)
S3 endpoints: ``rclone serve s3`` (fast, keeps no checksums) and moto (slower, keeps CRC32C).
Azure: Azurite. Every tool runs as its own process; wall time from start to exit, peak memory
is that process's ru_maxrss from wait4(). Each tool uses its defaults except where noted.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.emulators import AZURITE_ACCOUNT, AZURITE_KEY, Azurite, MotoServer, RcloneS3

BIN = Path(sys.executable).parent
MiB = 1024 * 1024


REPEAT = 1


def run(cmd: list[str], env: dict[str, str], log: Path) -> tuple[float, int]:
    """(seconds, peak RSS bytes) of a command: the fastest of REPEAT runs (this machine is shared
    and noisy), and the largest peak; raises if any run fails. Each run writes to its own
    destination ("{run}" in the command is replaced by the run's number) so none can skip work."""
    results = [_run_once([c.replace("{run}", str(i)) for c in cmd], env, log) for i in range(REPEAT)]
    return min(r[0] for r in results), max(r[1] for r in results)


def _run_once(cmd: list[str], env: dict[str, str], log: Path) -> tuple[float, int]:
    """The wall time and peak RSS of one run of ``cmd`` (its output appended to ``log``)."""
    elapsed, peak, _cpu = run_cpu(cmd, env, log)
    return elapsed, peak


def run_cpu(cmd: list[str], env: dict[str, str], log: Path) -> tuple[float, int, float]:
    """The wall time and peak RSS of one run of ``cmd``, with the CPU seconds (user + system) of
    the run and of the processes it waited for (``sh -c 'TOOL && sync'``: the tool's and sync's)."""
    with open(log, "ab") as out:
        out.write(("\n$ " + " ".join(cmd) + "\n").encode())
        out.flush()
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        _pid, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)} (see {log})")
    return elapsed, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime


def byte_compile(*trees: Path) -> None:
    """Byte-compile bridge's packages in each checkout ``trees`` (this one when none is given), so
    that it runs from its bytecode as a wheel's install does: with PYTHONDONTWRITEBYTECODE set (as
    on this machine) a source checkout compiles its modules again in every run (~50 ms of a
    small copy, more for the service's submitter, which imports more of them). A tree named on
    ``$PYTHONPATH`` (bench/README.md: bridge run from a ``git archive`` of a commit) is compiled
    too: left out, its bridge compiled itself in every run beside a compiled ``--before``."""
    import compileall
    on_path = [Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    for tree in [*(trees or (Path(__file__).resolve().parent.parent,)), *on_path]:
        for package in ("bridge", "policies", "workers"):
            if (tree / package).is_dir():
                compileall.compile_dir(str(tree / package), quiet=1)


def cpu_of(pid: int) -> float:
    """CPU seconds (user + system) a live process has used; 0 for one that is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_tree(root: int) -> list[int]:
    out = [root]
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == root:
                out += process_tree(int(name))
    return out


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def make_data(root: Path, size_mib: int, files: int) -> tuple[Path, Path]:
    big = root / "big" / "checkpoint.bin"
    big.parent.mkdir(parents=True)
    with open(big, "wb") as f:
        block = os.urandom(MiB)
        for i in range(size_mib):
            f.write(block[i % 251:] + block[: i % 251])  # distinct blocks, cheap to make
    small = root / "small"
    for i in range(files):
        d = small / f"{i // 500:03d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:06d}.bin").write_bytes(os.urandom(16 * 1024))
    return big, small


def s3_env(base: dict[str, str], s3) -> dict[str, str]:
    env = dict(base, **s3.env())
    env.update({"RCLONE_CONFIG": os.devnull, "RCLONE_CONFIG_S3E_TYPE": "s3",
                "RCLONE_CONFIG_S3E_PROVIDER": "Other", "RCLONE_CONFIG_S3E_ENDPOINT": s3.endpoint,
                "RCLONE_CONFIG_S3E_ACCESS_KEY_ID": "testing", "RCLONE_CONFIG_S3E_SECRET_ACCESS_KEY": "testing",
                "RCLONE_CONFIG_S3E_FORCE_PATH_STYLE": "true", "RCLONE_CONFIG_S3E_REGION": "us-east-1"})
    return env


def az_env(base: dict[str, str], az: Azurite) -> dict[str, str]:
    env = dict(base, **az.env())
    env.update({"RCLONE_CONFIG_AZ_TYPE": "azureblob", "RCLONE_CONFIG_AZ_ACCOUNT": AZURITE_ACCOUNT,
                "RCLONE_CONFIG_AZ_KEY": AZURITE_KEY,
                "RCLONE_CONFIG_AZ_ENDPOINT": f"{az.endpoint}/{AZURITE_ACCOUNT}"})
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--endpoints", default="rclone,moto")
    ap.add_argument("--cases", default="a,b,c")
    ap.add_argument("--bridge-args", default="", help="extra arguments for mcbridge cp")
    ap.add_argument("--repeat", type=int, default=1, help="runs per tool and case; the fastest counts")
    args = ap.parse_args()
    global REPEAT
    REPEAT = args.repeat
    cases = set(args.cases.split(","))
    work = Path(tempfile.mkdtemp(prefix="mcbridge-bench-"))
    log = work / "bench.log"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "RCLONE_"))}
    base.update({"MCBRIDGE_STATE_DIR": str(work / "state"), "XDG_CONFIG_HOME": str(work / "noconfig"),
                 "AWS_EC2_METADATA_DISABLED": "true"})
    big, small = make_data(work / "data", args.size_mib, args.files)
    size = big.stat().st_size
    rows: list[tuple[str, str, str, float, float, int]] = []
    extra = args.bridge_args.split()

    def record(case, endpoint, tool, seconds, peak, nbytes):
        rows.append((case, endpoint, tool, seconds, nbytes / seconds / MiB, peak))
        print(f"{case:<28} {endpoint:<10} {tool:<8} {seconds:8.2f}s {nbytes / seconds / MiB:8.1f} MiB/s "
              f"{peak / MiB:8.0f} MiB peak", flush=True)

    servers = {"rclone": RcloneS3, "moto": MotoServer}
    azurite = Azurite().start() if "c" in cases else None
    try:
        for name in args.endpoints.split(","):
            with servers[name]() as s3:
                s3.create_bucket("bench")
                env = s3_env(base, s3)
                # rclone serve s3 keeps no checksums: bridge cannot read back S3's proof there,
                # so it relies on the per-part checks; moto keeps them and bridge requires them.
                sums = ["--store-checksums", "skip"] if name == "rclone" else []
                if "a" in cases:
                    case = f"(a) {args.size_mib} MiB local->S3"
                    t, m = run([str(BIN / "mcbridge"), "cp", str(big), "s3://bench/a-bridge-{run}/", "-q", *sums, *extra],
                               env, log)
                    record(case, name, "bridge", t, m, size)
                    t, m = run([str(BIN / "s5cmd"), "--endpoint-url", s3.endpoint, "cp", str(big),
                                "s3://bench/a-s5cmd-{run}/"], env, log)
                    record(case, name, "s5cmd", t, m, size)
                    t, m = run([str(BIN / "rclone"), "copy", str(big), "s3e:bench/a-rclone-{run}/"], env, log)
                    record(case, name, "rclone", t, m, size)
                if "b" in cases:
                    case = f"(b) {args.files} x 16 KiB local->S3"
                    nbytes = args.files * 16 * 1024
                    t, m = run([str(BIN / "mcbridge"), "cp", f"{small}/", "s3://bench/b-bridge-{run}/", "-q", *extra],
                               env, log)
                    record(case, name, "bridge", t, m, nbytes)
                    t, m = run([str(BIN / "s5cmd"), "--endpoint-url", s3.endpoint, "cp", f"{small}/*",
                                "s3://bench/b-s5cmd-{run}/"], env, log)
                    record(case, name, "s5cmd", t, m, nbytes)
                    t, m = run([str(BIN / "rclone"), "copy", str(small), "s3e:bench/b-rclone-{run}/"], env, log)
                    record(case, name, "rclone", t, m, nbytes)
                if "c" in cases and azurite is not None:
                    case = f"(c) {args.size_mib} MiB S3->Azure"
                    azurite.create_bucket(f"c-{name}")
                    s3.client().upload_file(str(big), "bench", "c-src/checkpoint.bin") if "a" not in cases else None
                    src_key = "a-bridge-0/checkpoint.bin" if "a" in cases else "c-src/checkpoint.bin"
                    cenv = az_env(env, azurite)
                    t, m = run([str(BIN / "mcbridge"), "cp", f"s3://bench/{src_key}", f"az://c-{name}/bridge-{{run}}/",
                                "-q", *extra], cenv, log)
                    record(case, name, "bridge", t, m, size)
                    t, m = run([str(BIN / "rclone"), "copy", f"s3e:bench/{src_key}", f"az:c-{name}/rclone-{{run}}/"],
                               cenv, log)
                    record(case, name, "rclone", t, m, size)
    finally:
        if azurite is not None:
            azurite.stop()
    print()
    print("bridge's time / best peer's time on the same endpoint (below 1.0: bridge is faster)")
    for case, endpoint in dict.fromkeys((r[0], r[1]) for r in rows):
        mine = [r for r in rows if r[:3] == (case, endpoint, "bridge")]
        peers = [r for r in rows if r[0] == case and r[1] == endpoint and r[2] != "bridge"]
        if mine and peers:
            best = min(peers, key=lambda r: r[3])
            print(f"  {case:<28} {endpoint:<8} {mine[0][3] / best[3]:5.2f}  (best peer: {best[2]}, "
                  f"bridge peak {mine[0][5] / MiB:.0f} MiB)")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
