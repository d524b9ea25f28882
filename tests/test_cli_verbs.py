"""The everyday verbs on every store (local, s3 on moto, gs on fake-gcs-server, az on Azurite):
ls (one level, -R, -l, -H, buckets), du, cat (--offset/--count), hashsum, rm (-r, --dry-run),
mv (copy, prove, remove the source) and mb, with the URL forms, exit codes and one-line errors
of the other commands."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from bridge.hashing import crc32c, crc_hex
from tests.emulators import SCHEMES, unique_name
from tests.helpers import mcbridge

FILES = {"a.txt": b"alpha\n" * 100, "d/b.bin": os.urandom(3000), "d/e/c.bin": os.urandom(70_000)}
VERSION_FIELD = {"local": "inode=", "s3": "etag=", "gs": "generation=", "az": "etag="}


def one_line_error(r, code: int, *words: str) -> None:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mcbridge: error: ") and "Traceback" not in r.stderr, r.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_verb_on_every_store(scheme, make_root, env_for, tmp_path):
    env = env_for(*([] if scheme == "local" else [scheme]))
    state = tmp_path / "state"

    def run(*args: str):
        return mcbridge(*args, env=env, state_dir=state)

    src = tmp_path / "src"
    for rel, data in FILES.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    root = make_root(scheme) + "data/"
    assert run("cp", "-q", f"{src}/", root).returncode == 0

    # ls: one level by default (objects, and folders listed by a delimiter: no size); -R every
    # object; -l versions and a total
    r = run("ls", root)
    assert r.returncode == 0, r.stderr
    assert [line.split()[-1] for line in r.stdout.splitlines()] == ["a.txt", "d/"]
    assert r.stdout.splitlines()[1].split()[0] == "DIR"
    assert [line.split()[-1] for line in run("ls", root + "d/").stdout.splitlines()] == ["b.bin", "e/"]
    rows = json.loads(run("ls", "-R", "--json", root).stdout)
    assert [(row["path"], row["size"]) for row in rows] == [(k, len(v)) for k, v in sorted(FILES.items())]
    assert all(row["modified"] for row in rows), "every store says when an object was written"
    long = run("ls", "-l", "-R", "-H", root).stdout.splitlines()
    assert all(VERSION_FIELD[scheme] in line for line in long[:-1]), long
    assert "68.4 KiB" in long[2] and long[-1] == "total: 3 objects, 71.9 KiB", long
    assert run("ls", "-l", root).stdout.splitlines()[-1] == \
        "total: 1 object, 600 B and 1 folder (mcbridge du counts what is in them)"
    one = json.loads(run("ls", "--json", root + "d/b.bin").stdout)
    assert [(o["path"], o["size"]) for o in one] == [("b.bin", 3000)]
    if scheme != "local":
        bucket = root.split("/")[2]
        buckets = run("ls", f"{scheme}://").stdout.splitlines()
        assert f"{scheme}://{bucket}/" in buckets, buckets

    # du
    du = json.loads(run("du", "--json", root).stdout)
    assert (du["objects"], du["bytes"]) == (3, sum(map(len, FILES.values())))
    assert [(f["path"], f["objects"]) for f in du["folders"]] == [(".", 1), ("d/", 2)]
    assert run("du", "-s", "-H", root).stdout.strip().endswith("total (3 objects, 71.9 KiB)")

    # cat: any object, whole or a range (a negative offset counts from the end)
    assert run_bytes(env, state, "cat", root + "d/e/c.bin") == FILES["d/e/c.bin"]
    assert run_bytes(env, state, "cat", root + "d/e/c.bin", "--offset", "100", "--count", "50") == \
        FILES["d/e/c.bin"][100:150]
    assert run_bytes(env, state, "cat", root + "a.txt", "--offset", "-6") == b"alpha\n"
    out = tmp_path / "cat.out"
    assert run("cat", root + "d/b.bin", "-o", str(out)).returncode == 0 and out.read_bytes() == FILES["d/b.bin"]
    one_line_error(run("cat", root + "nope.bin"), 1, "nope.bin")
    one_line_error(run("cat", root + "a.txt", "--offset", "99999"), 2, "past the end")

    # hashsum: from the manifest of the copy, from the store, or computed; always the bytes' hash
    for algorithm, digest in (("sha256", lambda b: hashlib.sha256(b).hexdigest()),
                              ("md5", lambda b: hashlib.md5(b).hexdigest()),
                              ("crc32c", lambda b: crc_hex(crc32c(b)))):
        rows = json.loads(run("hashsum", algorithm, "--json", root).stdout)
        assert {row["path"]: row["hash"] for row in rows} == {k: digest(v) for k, v in FILES.items()}, algorithm
        if algorithm == "sha256":
            assert {row["from"] for row in rows} == {"manifest"}
    plain = run("hashsum", "sha256", root + "a.txt").stdout
    assert plain == f"{hashlib.sha256(FILES['a.txt']).hexdigest()}  a.txt\n"
    one_line_error(run("hashsum", "sha1", root), 2, "sha1", "crc32c, md5, sha256")

    # rm: a prefix needs -r; --dry-run removes nothing
    one_line_error(run("rm", root + "d/"), 2, "-r")
    dry = run("rm", "-r", "--dry-run", root + "d/")
    assert dry.returncode == 0 and "would remove 2 objects" in dry.stdout
    assert len(json.loads(run("ls", "-R", "--json", root).stdout)) == 3
    gone = run("rm", "-r", root + "d/", "--include", "*.bin", "--max-size", "5000B")
    assert gone.returncode == 0 and gone.stdout.startswith("removed 1 object, 2.9 KiB"), gone.stdout
    assert [row["path"] for row in json.loads(run("ls", "-R", "--json", root).stdout)] == ["a.txt", "d/e/c.bin"]

    # mv: copied, proven, then removed at the source
    moved = run("mv", root + "d/", f"{tmp_path}/moved/")
    assert moved.returncode == 0 and moved.stdout.startswith("moved 1 file"), moved.stderr
    assert (tmp_path / "moved" / "e" / "c.bin").read_bytes() == FILES["d/e/c.bin"]
    assert [row["path"] for row in json.loads(run("ls", "-R", "--json", root).stdout)] == ["a.txt"]
    assert run("mv", "-q", f"{tmp_path}/moved/e/c.bin", root + "back/c.bin").returncode == 0
    assert not (tmp_path / "moved" / "e" / "c.bin").exists()
    assert run_bytes(env, state, "cat", root + "back/c.bin") == FILES["d/e/c.bin"]

    # rm -r of a whole prefix takes bridge's records with it
    assert run("rm", "-r", "-q", root).returncode == 0
    left = run("ls", "-R", root)
    assert left.stdout == "", left.stdout

    # mb
    if scheme == "local":
        made = tmp_path / "made" / "here"
        assert run("mb", str(made)).returncode == 0 and made.is_dir()
        one_line_error(run("mb", str(made)), 1, "already exists")
    else:
        name = unique_name("mb")
        assert run("mb", f"{scheme}://{name}/").stdout == f"made {scheme}://{name}/\n"
        assert f"{scheme}://{name}/" in run("ls", f"{scheme}://").stdout.splitlines()
        one_line_error(run("mb", f"{scheme}://{name}/"), 1, "already exists")
        one_line_error(run("mb", f"{scheme}://{name}/key"), 2, "without a key")


def run_bytes(env, state: Path, *args: str) -> bytes:
    import subprocess

    from tests.helpers import MCBRIDGE, NO_CONFIG
    full = {k: v for k, v in env.items() if k != "MCBRIDGE_CONFIG"}
    full.update(MCBRIDGE_STATE_DIR=str(state), XDG_CONFIG_HOME=NO_CONFIG)
    r = subprocess.run([*MCBRIDGE, *args], env=full, capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_ls_of_a_scheme_alone_on_local_paths_and_typos(tmp_path):
    env = dict(os.environ)
    one_line_error(mcbridge("ls", "s3:/", env=env, state_dir=tmp_path), 2, "malformed URL")
    one_line_error(mcbridge("ls", "ftp://x/", env=env, state_dir=tmp_path), 2, "unknown scheme")
    one_line_error(mcbridge("ls", str(tmp_path / "none") + "/", env=env, state_dir=tmp_path), 1, "nothing there")


def test_plurals_and_iec_units_in_summaries(tmp_path):
    env = dict(os.environ)
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "f").write_bytes(b"x" * 1536)
    r = mcbridge("cp", f"{tmp_path}/one/", f"{tmp_path}/out/", env=env, state_dir=tmp_path / "s")
    assert r.stdout.startswith("copied 1 file, 1.5 KiB in "), r.stdout
    r = mcbridge("cp", "--dry-run", f"{tmp_path}/one/", f"{tmp_path}/out2/", env=env, state_dir=tmp_path / "s")
    assert "would copy 1 file, 1.5 KiB" in r.stdout and "in 2 units" in r.stdout
    r = mcbridge("verify", f"{tmp_path}/out/", env=env, state_dir=tmp_path / "s")
    assert r.stdout.startswith("OK: 1 file, 1.5 KiB checked"), r.stdout



DEEP = 240   # objects six folders down, with long random names


@pytest.mark.parametrize("scheme", [s for s in SCHEMES if s != "local"])
def test_one_level_ls_lists_one_level_of_the_store_never_the_deep_tree(scheme, make_root, env_for, emulator_for,
                                                                       tmp_path):
    """ls without -R asks the store for one level (S3 Delimiter=/, GCS delimiter=/, Azure
    walk_blobs' delimiter): one listing request, whose answer is far smaller than the names under
    the folder, which a listing of the whole prefix folded afterwards would have to receive.
    Counted at a loopback proxy in front of the emulator (tests/faultproxy.py, no faults)."""
    import concurrent.futures as cf
    import uuid

    from bridge.stores import get_store
    from bridge.urls import parse
    from tests.faultproxy import FaultProxy, proxied_environment
    from tests.helpers import settings_for

    env = env_for(scheme)
    root = make_root(scheme) + "top/"
    store = get_store(parse(root), settings_for(env))
    deep = [f"deep/l1/l2/l3/l4/l5/{uuid.uuid4().hex}{uuid.uuid4().hex}.bin" for _ in range(DEEP)]

    def put(rel: str) -> None:
        store.put(parse(root + rel), b"x", crc32c=crc_hex(crc32c(b"x")), metadata={})

    with cf.ThreadPoolExecutor(8) as pool:
        list(pool.map(put, ["a.txt", "b/c.txt", *deep]))
    names = sum(len(rel) for rel in deep)   # what any answer naming the deep objects holds, at least

    with FaultProxy(emulator_for(scheme).endpoint) as proxy:
        proxied = proxied_environment(env, {scheme: proxy})
        r = mcbridge("ls", "--json", root, env=proxied, state_dir=tmp_path / "state")
        assert r.returncode == 0, r.stderr
        rows = json.loads(r.stdout)
        assert [(row["path"], row.get("dir", False)) for row in rows] == \
            [("a.txt", False), ("b/", True), ("deep/", True)]
        listings = [line for line, _done in proxy.log if "delimiter" in line.lower()]
        assert len(listings) == 1, proxy.log
        assert proxy.counts["bytes_down"] < names / 4, (proxy.counts, names)

        # the control: -R receives every deep name (so the bound above can fail)
        proxy.configure()
        r = mcbridge("ls", "-R", "--json", root, env=proxied, state_dir=tmp_path / "state")
        assert r.returncode == 0 and len(json.loads(r.stdout)) == DEEP + 2, r.stderr
        assert proxy.counts["bytes_down"] > names / 4, (proxy.counts, names)
