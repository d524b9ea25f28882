"""The default digest of a file copied in parts (part SHA-256s, their sha256-tree, the CRC32C
combined from the parts) and the plain whole-file SHA-256 when asked for (README "Digests")."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from bridge import manifest as manifests
from bridge.hashing import combine_parts, crc32c, crc_hex, rehash_parts, sha256_tree
from bridge.stores import get_store
from bridge.urls import parse
from tests.helpers import mcbridge, settings_for

MiB = 1024 * 1024
PART = 5 * MiB


def tree_by_hand(data: bytes, part_size: int) -> str:
    """The README's definition, written out again."""
    digests = b"".join(hashlib.sha256(data[i:i + part_size]).digest() for i in range(0, len(data), part_size))
    return hashlib.sha256(b"mcbridge-sha256-tree-v1\n" + part_size.to_bytes(8, "big") + digests).hexdigest()


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> tuple[str, dict[str, bytes]]:
    src = tmp_path_factory.mktemp("digest-src")
    files = {"small.txt": os.urandom(3000), "big.bin": os.urandom(2 * PART + 1234)}
    for rel, data in files.items():
        (src / rel).write_bytes(data)
    return f"{src}/", files


def entries(env: dict, url: str) -> dict[str, manifests.FileEntry]:
    return manifests.read(get_store(parse(url), settings_for(env)), parse(url)).files


def test_tree_digest_is_the_documented_one_and_parts_rehash_in_parallel(tmp_path):
    data = os.urandom(3 * 1000 + 17)
    (tmp_path / "f").write_bytes(data)
    store = get_store(parse(str(tmp_path)), settings_for(dict(os.environ)))
    loc = parse(str(tmp_path / "f"))
    crc, whole, parts = rehash_parts(store, loc, len(data), 1000)
    crc_p, none, parts_p = rehash_parts(store, loc, len(data), 1000, whole=False)
    assert (crc_p, parts_p, none) == (crc, parts, "") and crc == crc_hex(crc32c(data))
    assert whole == hashlib.sha256(data).hexdigest()
    assert sha256_tree(parts, 1000) == tree_by_hand(data, 1000) != sha256_tree(parts, 999)
    pieces = [data[i:i + 1000] for i in range(0, len(data), 1000)]
    assert crc_hex(combine_parts([(crc32c(p), len(p)) for p in pieces])) == crc


@pytest.mark.parametrize("scheme", ["local", "s3"])
def test_default_copy_records_part_digests_and_tree_and_verifies_deep(scheme, tree, make_root, env_for, tmp_path):
    src, files = tree
    env = env_for("s3") if scheme == "s3" else dict(os.environ)
    dst = make_root(scheme) + "copy/"
    r = mcbridge("cp", src, dst, "--chunk-size", "5MiB", "-q", env=env, state_dir=tmp_path / "state")
    assert r.returncode == 0, r.stderr
    got = entries(env, dst)
    big, small = got["big.bin"], got["small.txt"]
    assert big.sha256 == "" and big.note == "" and big.computed == ["crc32c", "part_sha256", "sha256_tree"]
    assert big.part_size == PART and big.sha256_tree == tree_by_hand(files["big.bin"], PART)
    assert big.crc32c == crc_hex(crc32c(files["big.bin"]))
    # a one-request file's SHA-256 is its only stream: free, so recorded as before
    assert small.sha256 == hashlib.sha256(files["small.txt"]).hexdigest() and small.sha256_tree == ""
    for args in ([], ["--deep"], ["--deep", "--sha256"]):
        r = mcbridge("verify", dst, *args, env=env, state_dir=tmp_path / "state")
        assert r.returncode == 0, (args, r.stdout + r.stderr)


@pytest.mark.parametrize("how", ["flag", "env"])
def test_sha256_asked_records_the_plain_whole_file_digest(how, tree, tmp_path):
    src, files = tree
    env = {**os.environ, **({"MCBRIDGE_SHA256": "true"} if how == "env" else {})}
    dst = f"{tmp_path}/copy/"
    r = mcbridge("cp", src, dst, "--chunk-size", "5MiB", "-q", *(["--sha256"] if how == "flag" else []),
                 env=env, state_dir=tmp_path / "state")
    assert r.returncode == 0, r.stderr
    big = entries(env, dst)["big.bin"]
    assert big.sha256 == hashlib.sha256(files["big.bin"]).hexdigest() and big.computed == ["crc32c", "sha256"]


def test_deep_verify_catches_a_changed_byte_by_its_part_and_old_whole_sha_records_still_verify(tree, tmp_path):
    src, files = tree
    for args, name in (([], "default"), (["--sha256"], "whole")):   # --sha256: the record older bridges wrote
        dst = tmp_path / name
        r = mcbridge("cp", src, f"{dst}/", "--chunk-size", "5MiB", "-q", *args, env=dict(os.environ),
                     state_dir=tmp_path / "state")
        assert r.returncode == 0, r.stderr
        r = mcbridge("verify", f"{dst}/", "--deep", env=dict(os.environ), state_dir=tmp_path / "state")
        assert r.returncode == 0, r.stdout + r.stderr
        stat = os.stat(dst / "big.bin")
        with open(dst / "big.bin", "r+b") as f:   # one byte of the second part, size and times kept
            f.seek(PART + 10)
            byte = f.read(1)
            f.seek(PART + 10)
            f.write(bytes([byte[0] ^ 1]))
        os.utime(dst / "big.bin", ns=(stat.st_atime_ns, stat.st_mtime_ns))
        r = mcbridge("verify", f"{dst}/", "--deep", "--json", env=dict(os.environ), state_dir=tmp_path / "state")
        assert r.returncode == 1, r.stdout + r.stderr
        assert [row["path"] for row in json.loads(r.stdout)["mismatched"]] == ["big.bin"]


def test_verify_sha256_without_deep_is_refused_in_one_line(tree, tmp_path):
    src, _files = tree
    r = mcbridge("cp", src, f"{tmp_path}/copy/", "-q", env=dict(os.environ), state_dir=tmp_path / "state")
    assert r.returncode == 0, r.stderr
    r = mcbridge("verify", f"{tmp_path}/copy/", "--sha256", env=dict(os.environ), state_dir=tmp_path / "state")
    assert r.returncode == 2 and "give --deep" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
