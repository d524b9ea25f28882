"""The cache directory as someone else may have left it: links planted where the cache writes
(objects/<xx>, fills/<key>, locks/<key>.lock, pins/, quota.lock), entries owned by another user,
a cache directory anyone can write; and object keys with empty path segments (``a//b``).

A planted link is refused with one line naming it (exit 2), and what it points at stays as it
was: nothing is written through it, nothing is created at its target.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from bridge.cache import Cache
from bridge.config import load_settings
from tests.emulators import unique_name
from tests.helpers import NO_CONFIG, mcbridge

OTHER_UID = 54321   # nobody on this machine; the tests run as root and chown to it


def env_for(cache_dir: Path, base: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in (base if base is not None else os.environ).items() if k != "MCBRIDGE_CONFIG"}
    env.update(MCBRIDGE_CACHE_DIR=str(cache_dir), XDG_CONFIG_HOME=NO_CONFIG, AWS_EC2_METADATA_DISABLED="true",
               **extra)
    return env


def source(tmp_path: Path, data: bytes = b"payload " * 100) -> str:
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    return str(src)


def key_of(url: str, env: dict[str, str]) -> str:
    return Cache(load_settings(environ=env)).locate(url)[2]


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def refused(r, planted: Path) -> None:
    """Exit 2, one line, naming the planted path; no traceback."""
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert len(lines) == 1 and str(planted) in lines[0], r.stderr
    assert "Traceback" not in r.stderr


@pytest.fixture
def setup(tmp_path):
    cache_dir, outside = tmp_path / "cache", tmp_path / "outside"
    outside.mkdir()
    url = source(tmp_path)
    env = env_for(cache_dir)
    Cache(load_settings(environ=env))   # lays the cache out
    return cache_dir, outside, url, env


def test_link_at_objects_shard_is_refused(setup, tmp_path):
    cache_dir, outside, url, env = setup
    key = key_of(url, env)
    planted = cache_dir / "objects" / key[:2]
    planted.symlink_to(outside, target_is_directory=True)
    r = mcbridge("cache", "path", url, env=env, state_dir=tmp_path)
    assert tree(outside) == []   # neither the entry's bytes nor its record landed there
    refused(r, planted)


def test_link_at_fill_dir_is_refused(setup, tmp_path):
    cache_dir, outside, url, env = setup
    key = key_of(url, env)
    planted = cache_dir / "fills" / key
    planted.symlink_to(outside, target_is_directory=True)
    r = mcbridge("cache", "path", url, env=env, state_dir=tmp_path)
    assert tree(outside) == []   # no reserve, journal or partial data written through it
    refused(r, planted)


def test_link_at_lock_file_is_refused_and_its_target_not_created(setup, tmp_path):
    cache_dir, outside, url, env = setup
    key = key_of(url, env)
    planted = cache_dir / "locks" / f"{key}.lock"
    victim = outside / "created-by-o_creat"
    planted.symlink_to(victim)
    r = mcbridge("cache", "path", url, env=env, state_dir=tmp_path)
    assert not victim.exists() and tree(outside) == []
    refused(r, planted)


def test_link_at_pins_is_refused(setup, tmp_path):
    cache_dir, outside, url, env = setup
    planted = cache_dir / "pins"
    planted.rmdir()
    planted.symlink_to(outside, target_is_directory=True)
    r = mcbridge("cache", "pin", url, env=env, state_dir=tmp_path)
    assert tree(outside) == []
    refused(r, planted)


def test_link_at_quota_lock_is_refused_and_its_target_not_created(setup, tmp_path):
    cache_dir, outside, url, env = setup
    planted = cache_dir / "quota.lock"
    victim = outside / "quota-victim"
    planted.symlink_to(victim)
    r = mcbridge("cache", "path", url, env={**env, "MCBRIDGE_CACHE_QUOTA": "1MB"}, state_dir=tmp_path)
    assert not victim.exists()
    refused(r, planted)


def test_link_at_an_entry_is_refused_when_listing(setup, tmp_path):
    cache_dir, outside, url, env = setup
    assert mcbridge("cache", "path", url, env=env, state_dir=tmp_path).returncode == 0
    key = key_of(url, env)
    meta = cache_dir / "objects" / key[:2] / f"{key}.json"
    (outside / "fake.json").write_text(meta.read_text())
    meta.unlink()
    meta.symlink_to(outside / "fake.json")
    for args in (["cache", "ls"], ["cache", "evict", "--all"], ["cache", "path", url]):
        refused(mcbridge(*args, env=env, state_dir=tmp_path), meta)
    assert (outside / "fake.json").exists()


def test_a_fifo_in_place_of_an_entry_is_refused_not_waited_on(setup, tmp_path):
    cache_dir, _outside, url, env = setup
    assert mcbridge("cache", "path", url, env=env, state_dir=tmp_path).returncode == 0
    key = key_of(url, env)
    meta = cache_dir / "objects" / key[:2] / f"{key}.json"
    meta.unlink()
    os.mkfifo(meta)
    r = mcbridge("cache", "ls", env=env, state_dir=tmp_path, timeout=60)   # an open for reading would block
    refused(r, meta)
    assert "a special file" in r.stderr


def test_an_entry_owned_by_another_user_is_refused(setup, tmp_path):
    cache_dir, _outside, url, env = setup
    r = mcbridge("cache", "path", url, env=env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    data = Path(r.stdout.strip().splitlines()[-1])
    os.chown(data, OTHER_UID, os.getgid())
    for args in (["cache", "path", url], ["cache", "ls"], ["cache", "verify"]):
        r = mcbridge(*args, env=env, state_dir=tmp_path)
        refused(r, data)
        assert f"uid {OTHER_UID}" in r.stderr
    assert data.stat().st_uid == OTHER_UID   # refused, not removed or rewritten


def test_a_cache_directory_owned_by_another_user_is_refused(tmp_path):
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir(mode=0o755)
    os.chown(cache_dir, OTHER_UID, os.getgid())
    r = mcbridge("cache", "stat", env=env_for(cache_dir), state_dir=tmp_path)
    refused(r, cache_dir)
    assert not (cache_dir / "objects").exists()


def test_a_world_writable_cache_directory_is_refused(tmp_path):
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    cache_dir.chmod(0o1777)
    r = mcbridge("cache", "stat", env=env_for(cache_dir), state_dir=tmp_path)
    refused(r, cache_dir)
    assert "writable by everyone" in r.stderr


def test_a_group_cache_serves_entries_of_the_groups_members(tmp_path):
    """A setgid directory of one of the user's groups is a group cache: entries another member
    made (another uid, the cache's group) are served; one outside the group is refused."""
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    os.chown(cache_dir, OTHER_UID, os.getgid())
    cache_dir.chmod(0o2770)
    env = env_for(cache_dir)
    url = source(tmp_path)
    r = mcbridge("cache", "path", url, env=env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    data = Path(r.stdout.strip().splitlines()[-1])
    assert data.stat().st_gid == os.getgid() and (data.parent.stat().st_mode & stat.S_ISGID)
    os.chown(data, OTHER_UID, os.getgid())   # as if another member had filled it
    r = mcbridge("cache", "path", url, env=env, state_dir=tmp_path)
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == str(data), r.stderr
    os.chown(data, OTHER_UID, os.getgid() + 4242)   # neither the user's nor the group's
    refused(mcbridge("cache", "path", url, env=env, state_dir=tmp_path), data)


def test_warm_a_prefix_with_empty_segments_in_keys(moto, tmp_path):
    bucket = unique_name("slashes")
    moto.create_bucket(bucket)
    keys = {"p/a//b": b"double", "p/c": b"plain", "p/d///e/f": b"triple"}
    for key, body in keys.items():
        moto.client().put_object(Bucket=bucket, Key=key, Body=body)
    env = env_for(tmp_path / "cache", moto.env())
    r = mcbridge("cache", "warm", f"s3://{bucket}/p/", "--json", env=env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert (summary["objects"], summary["misses"]) == (3, 3)
    listed = json.loads(mcbridge("cache", "ls", "--json", env=env, state_dir=tmp_path).stdout)
    held = {row["url"]: Path(row["path"]).read_bytes() for row in listed}
    assert held == {f"s3://{bucket}/{key}": body for key, body in keys.items()}
    # and the one object by its URL, as the listing names it
    r = mcbridge("cache", "path", f"s3://{bucket}/p/a//b", env=env, state_dir=tmp_path)
    assert r.returncode == 0 and Path(r.stdout.strip().splitlines()[-1]).read_bytes() == b"double", r.stderr
    r = mcbridge("cache", "evict", f"s3://{bucket}/p/a//b", env=env, state_dir=tmp_path)
    assert r.returncode == 0 and f"evicted s3://{bucket}/p/a//b" in r.stdout, r.stderr
