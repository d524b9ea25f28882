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


def commit_doc(url: str) -> tuple[str, dict]:
    """The one commit document of a local prefix's record."""
    [name] = os.listdir(f"{url}_bridge/log")
    with open(f"{url}_bridge/log/{name}") as f:
        return f"{url}_bridge/log/{name}", json.load(f)


def test_a_copy_from_a_recorded_prefix_carries_its_hashes_across_stores(tree, make_root, env_for, tmp_path):
    src, files = tree
    env = env_for("s3")
    first = f"{tmp_path}/first/"
    r = mcbridge("cp", src, first, "--chunk-size", "5MiB", "-q", env=env, state_dir=tmp_path / "state")
    assert r.returncode == 0, r.stderr
    recorded = entries(env, first)
    doc, _ = commit_doc(first)
    hops = [first, make_root("s3") + "copy/", f"{tmp_path}/back/"]   # local -> S3 -> local, no chunk size asked
    for came_from, to in zip(hops, hops[1:]):
        r = mcbridge("cp", came_from, to, "-q", env=env, state_dir=tmp_path / "state")
        assert r.returncode == 0, r.stderr
        got = entries(env, to)
        store = get_store(parse(came_from), settings_for(env))
        [(origin, _doc)] = [(e, d) for e, d in manifests.open_record(store, parse(came_from)).entries_with_origin()
                            if e.path == "big.bin"]
        for rel, entry in got.items():
            want = recorded[rel]
            assert entry.computed == ["crc32c"] and entry.crc32c == want.crc32c, (to, rel)
            assert (entry.sha256, entry.part_sha256, entry.sha256_tree, entry.part_size) == \
                (want.sha256, want.part_sha256, want.sha256_tree, want.part_size), (to, rel)
            assert entry.carried["manifest"].startswith(came_from + "_bridge/log/c-")
        assert got["big.bin"].carried["hashes"] == ["part_sha256", "sha256_tree"]
        assert got["big.bin"].carried["identity"] == origin.identity
        assert got["small.txt"].carried["hashes"] == ["sha256"]
        r = mcbridge("verify", to, "--deep", env=env, state_dir=tmp_path / "state")
        assert r.returncode == 0, r.stdout + r.stderr
    assert entries(env, hops[1])["big.bin"].carried["manifest"] == doc
    assert {rel: (tmp_path / "back" / rel).read_bytes() for rel in files} == files
    r = mcbridge("sync", first, f"{tmp_path}/synced/", "-q", env=env, state_dir=tmp_path / "state")   # sync too
    assert r.returncode == 0, r.stderr
    assert all(e.carried["manifest"] == doc and e.computed == ["crc32c"]
               for e in entries(env, f"{tmp_path}/synced/").values())


@pytest.mark.parametrize("rel, field", [("big.bin", "parts"), ("small.txt", "crc32c"), ("big.bin", "sha256_tree")])
def test_bytes_that_differ_from_the_carried_record_fail_the_copy(rel, field, tree, tmp_path):
    src, _files = tree
    first = f"{tmp_path}/first/"
    r = mcbridge("cp", src, first, "--chunk-size", "5MiB", "-q", env=dict(os.environ), state_dir=tmp_path / "state")
    assert r.returncode == 0, r.stderr
    path, doc = commit_doc(first)
    [entry] = [e for e in doc["files"] if e["path"] == rel]
    if field == "parts":
        entry["parts"][1] = f"{int(entry['parts'][1], 16) ^ 1:08x}"
    elif field == "sha256_tree":
        entry["sha256_tree"] = "0" * 64
    else:
        entry["crc32c"] = f"{int(entry['crc32c'], 16) ^ 1:08x}"
    with open(path, "w") as f:
        json.dump(doc, f)
    r = mcbridge("cp", first, f"{tmp_path}/second/", "-q", env=dict(os.environ), state_dir=tmp_path / "state")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "the source's manifest" in r.stderr and "Traceback" not in r.stderr
    assert not os.path.exists(f"{tmp_path}/second/_bridge/log")   # nothing committed


def test_a_replication_policy_asks_for_the_whole_sha256():
    from bridge.policies import replication as rules
    from bridge.replicator import placed
    text = "policies:\n  p:\n    source: s3://src-bucket/ckpt/\n    destinations: [s3://dr-bucket/ckpt/]\n    sha256: true\n"
    [named] = rules.parse(text)
    settings = settings_for(dict(os.environ))
    assert named.policy.sha256 and not settings.transfer.sha256
    assert placed(named.policy, "s3://dr-bucket/ckpt/", settings).transfer.sha256
    [plain] = rules.parse(text.replace("    sha256: true\n", ""))
    assert not placed(plain.policy, "s3://dr-bucket/ckpt/", settings).transfer.sha256
