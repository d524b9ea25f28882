"""Guards on mass deletion (bridge/guards.py), over real HTTP against the emulators: a sync
--delete that would remove most of its destination is refused before anything is deleted unless
--force or a --max-delete that allows it; its dry run counts the deletions; rm -r of a bucket
root and rm/mv of the filesystem root or a system folder are refused without --force; the
Python API (bridge.ops, bridge.objects) refuses alike."""

from __future__ import annotations

import concurrent.futures as cf
import json

import pytest

from bridge import guards, objects, ops
from bridge.urls import parse
from tests.helpers import mcbridge, settings_for

MANY = 5000


def _keys(moto, bucket: str, prefix: str = "") -> list[str]:
    pages = moto.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


@pytest.fixture
def mirror(moto, make_root, tmp_path, env_for):
    """A source folder of 3 files synced to S3, and 5,000 more objects put beside them at the
    destination (in parallel, straight through boto3): a sync of that source with --delete would
    remove 5,000 of the 5,003 objects there."""
    env = env_for("s3")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):
        (src / name).write_bytes(name.encode() * 10)
    dst = make_root("s3") + "mirror/"
    first = mcbridge("sync", f"{src}/", dst, "-q", env=env, state_dir=tmp_path / "st")
    assert first.returncode == 0, first.stderr
    bucket = parse(dst).bucket
    client = moto.client()
    with cf.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: client.put_object(Bucket=bucket, Key=f"mirror/old/{i:05d}.bin", Body=b"x"),
                      range(MANY)))
    return src, dst, bucket, env


def test_a_sync_that_would_delete_most_of_its_destination_is_refused_unless_allowed(mirror, moto, tmp_path):
    src, dst, bucket, env = mirror
    before = _keys(moto, bucket, "mirror/")
    assert len([k for k in before if "/_bridge/" not in k]) == MANY + 3

    refused = mcbridge("sync", f"{src}/", dst, "--delete", env=env, state_dir=tmp_path / "st")
    assert refused.returncode != 0
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1, refused.stderr
    assert "5,000 of the 5,003 objects" in lines[0] and "--force" in lines[0] and "Traceback" not in lines[0]
    assert _keys(moto, bucket, "mirror/") == before, "refused before anything was deleted or written"

    alone = mcbridge("sync", f"{src}/", dst, "--max-delete", "10", env=env, state_dir=tmp_path / "st")
    assert alone.returncode == 2 and "give --delete too" in alone.stderr, alone.stderr
    low = mcbridge("sync", f"{src}/", dst, "--delete", "--max-delete", "4999", env=env, state_dir=tmp_path / "st")
    assert low.returncode != 0 and "more than --max-delete 4,999" in low.stderr, low.stderr
    assert _keys(moto, bucket, "mirror/") == before

    dry = mcbridge("sync", f"{src}/", dst, "--delete", "--dry-run", env=env, state_dir=tmp_path / "st")
    assert dry.returncode == 0, dry.stderr
    assert "would copy 0 files, 0 B and delete 5,000 objects" in dry.stdout, dry.stdout[-500:]
    assert "a run would be refused" in dry.stdout
    as_json = json.loads(mcbridge("sync", f"{src}/", dst, "--delete", "--dry-run", "--json", "--max-delete", "6000",
                                  env=env, state_dir=tmp_path / "st").stdout)
    assert as_json["deletions"] == MANY and as_json["present"] == MANY + 3 and as_json["refused"] is None

    allowed = mcbridge("sync", f"{src}/", dst, "--delete", "--max-delete", "6000", "--json", "-j", "32", env=env,
                       state_dir=tmp_path / "st")
    assert allowed.returncode == 0, allowed.stderr
    assert len(json.loads(allowed.stdout)["deleted"]) == MANY
    left = [k for k in _keys(moto, bucket, "mirror/") if "/_bridge/" not in k]
    assert sorted(left) == ["mirror/a.txt", "mirror/b.txt", "mirror/c.txt"]


def test_the_share_rule_and_force_through_the_python_api(make_root, env_for, tmp_path):
    env = env_for("s3")
    settings = settings_for(env)
    src, dst = tmp_path / "src", make_root("s3")
    src.mkdir()
    (src / "keep.txt").write_bytes(b"keep")
    for name in ("keep.txt", "x1", "x2"):
        (tmp_path / name).write_bytes(b"old")
    for name in ("keep.txt", "x1", "x2"):
        ops.copy(str(tmp_path / name), dst + name, settings, state_dir=tmp_path / "s")
    with pytest.raises(guards.DeletionRefused, match="2 of the 3 objects"):
        ops.sync(f"{src}/", dst, settings, delete=True, state_dir=tmp_path / "s")
    done = ops.sync(f"{src}/", dst, settings, delete=True, force=True, state_dir=tmp_path / "s")
    assert sorted(done["deleted"]) == ["x1", "x2"]


def test_rm_r_of_a_bucket_root_needs_force_on_every_store(make_root, env_for, tmp_path):
    env = env_for("s3", "gs", "az")
    for scheme in ("s3", "gs", "az"):
        root = make_root(scheme)
        (tmp_path / "f").write_bytes(b"data")
        assert mcbridge("cp", str(tmp_path / "f"), root + "team/f", env=env, state_dir=tmp_path).returncode == 0
        r = mcbridge("rm", "-r", root, env=env, state_dir=tmp_path)
        assert r.returncode == 2, (scheme, r.stderr)
        assert r.stderr.count("\n") == 1 and "whole" in r.stderr and "--force" in r.stderr, r.stderr
        assert mcbridge("ls", "-R", root, env=env, state_dir=tmp_path).stdout.strip().endswith("team/f")
        r = mcbridge("rm", "-r", root + "team/", env=env, state_dir=tmp_path)
        assert r.returncode == 0, r.stderr   # a prefix under the root is no guarded place
        assert mcbridge("cp", str(tmp_path / "f"), root + "team/f", env=env, state_dir=tmp_path).returncode == 0
        r = mcbridge("rm", "-r", "--force", root, env=env, state_dir=tmp_path)
        assert r.returncode == 0, r.stderr
        assert mcbridge("ls", "-R", root, env=env, state_dir=tmp_path).returncode != 0, "nothing there"


def test_rm_and_mv_of_system_folders_are_refused_without_force(tmp_path, env_for):
    env = env_for("s3")
    for args in (["rm", "-r", "/"], ["rm", "-r", "/etc/"], ["rm", "-r", "file:///usr/"], ["mv", "/etc/", f"{tmp_path}/x/"],
                 ["mv", "/usr/lib/", f"{tmp_path}/y/"]):
        r = mcbridge(*args, env=env, state_dir=tmp_path)
        assert r.returncode == 2 and "--force" in r.stderr and r.stderr.count("\n") == 1, (args, r.stderr)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists(), "refused before anything was copied"
    (tmp_path / "etc").symlink_to("/etc")
    with pytest.raises(guards.DeletionRefused, match="system folder /etc"):
        objects.remove(f"{tmp_path}/etc/", settings_for(env), recursive=True)
    assert guards.protected(parse(f"{tmp_path}/")) is None


def test_verify_points_at_sync_delete_for_extra_objects_and_passes_after_it(make_root, env_for, moto, tmp_path):
    env = env_for("s3")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("a", "b", "c", "d"):
        (src / name).write_bytes(name.encode())
    dst = make_root("s3") + "dr/"
    assert mcbridge("sync", f"{src}/", dst, "-q", env=env, state_dir=tmp_path).returncode == 0
    moto.client().put_object(Bucket=parse(dst).bucket, Key="dr/stray.bin", Body=b"not ours")
    failed = mcbridge("verify", dst, env=env, state_dir=tmp_path)
    assert failed.returncode == 1
    assert "hint: 1 extra object at the destination: sync --delete from its source removes it" in failed.stdout
    as_json = json.loads(mcbridge("verify", dst, "--json", env=env, state_dir=tmp_path).stdout)
    assert any("sync --delete" in hint for hint in as_json["hints"])
    assert mcbridge("sync", f"{src}/", dst, "-q", env=env, state_dir=tmp_path).returncode == 0
    still = mcbridge("verify", dst, env=env, state_dir=tmp_path)
    assert still.returncode == 1 and "sync --delete" in still.stdout, "a plain sync leaves the extra object"
    assert mcbridge("sync", f"{src}/", dst, "--delete", "-q", env=env, state_dir=tmp_path).returncode == 0
    fixed = mcbridge("verify", dst, env=env, state_dir=tmp_path)
    assert fixed.returncode == 0 and "hint" not in fixed.stdout, fixed.stdout
