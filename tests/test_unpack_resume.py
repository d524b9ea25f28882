"""A killed unpack: the re-run removes what the dead run left (a temporary cut short, an
unfinished multipart file), skips what it had restored, and ends with exactly the packed tree."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

from bridge.packing import job
from tests.helpers import journaled_keys, mcbridge, settings_for

MiB = 1024 * 1024

# The child dies the moment it writes past 2 MiB into one file (the 4 MiB one: the journal's log
# stays near 1 MiB), as a kill at that instant would leave it: Python ignores SIGXFSZ (writes
# would fail cleanly), so the default action, termination, is put back.
DIES_AT_2MIB = ("import resource, runpy, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_DFL); "
                "resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, 2 << 20)); "
                "sys.argv = ['mcbridge'] + sys.argv[1:]; runpy.run_module('bridge', run_name='__main__')")


def _tree(root: Path) -> dict[str, bytes]:
    rng = random.Random(9)
    files = {f"small/{i:04d}.bin": rng.randbytes(rng.randint(0, 20_000)) for i in range(400)}
    files["zz/whole.bin"] = os.urandom(4 * MiB)        # written whole: through a temporary
    files["zz/streamed.bin"] = os.urandom(20 * MiB)    # over 16 MiB: in parts into a partial file
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def _strays(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if ".bridge-" in p.name)


def test_a_killed_unpack_resumes_to_the_exact_tree_with_no_stray_files(tmp_path):
    files = _tree(tmp_path / "src")
    env = dict(os.environ, XDG_CONFIG_HOME="/nonexistent")
    settings = settings_for(env)
    job.pack(f"{tmp_path}/src/", f"{tmp_path}/set/", settings, shard_size=2 * MiB, state_dir=tmp_path / "packst")
    state, out = tmp_path / "state", tmp_path / "out"
    env["MCBRIDGE_STATE_DIR"] = str(state)
    killed = subprocess.run([sys.executable, "-c", DIES_AT_2MIB, "unpack", f"{tmp_path}/set/", f"{out}/", "-j", "1"],
                            env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode < 0, f"the first unpack must be killed: {killed.returncode} {killed.stderr[-500:]}"
    left = _strays(out)
    assert left, "the killed run left a temporary or partial file behind"
    restored = len(journaled_keys(state, "file:"))
    assert restored > 0, "the killed run had restored some files"

    r = mcbridge("unpack", f"{tmp_path}/set/", f"{out}/", "-j", "2", "--json", env=env, state_dir=state)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["bytes_skipped"] > 0, "files restored by the killed run are not written again"
    assert _strays(out) == [], f"left behind: {_strays(out)} (the killed run left {left})"
    got = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*")
           if p.is_file() and "_bridge" not in p.relative_to(out).parts}
    assert got == files
    assert mcbridge("verify", f"{out}/", "--deep", env=env, state_dir=state).returncode == 0
    assert not list(state.glob("journal/*")), "the journal goes once the unpack is complete"
