"""Wildcard source URLs, as s5cmd takes them (``mcbridge cp 's3://b/p/*.tar' DEST/``), on every
store over real HTTP: the folder before the first wildcard is listed and the rest matched by
bridge/filters.py's bounded matcher; no match is one line and a non-zero exit."""

from __future__ import annotations

import json
from pathlib import Path

from bridge import ops
from bridge.filters import Filters, split_wildcard
from bridge.listing import wildcard_source
from tests.helpers import mcbridge, settings_for

TREE = {"p/a.tar": b"a" * 10, "p/b.tar": b"b" * 20, "p/c.txt": b"c", "p/sub/d.tar": b"d" * 5, "p2/e.tar": b"e"}


def _copied(dst: Path) -> list[str]:
    return sorted(str(p.relative_to(dst)) for p in dst.rglob("*") if p.is_file() and "_bridge" not in p.parts)


def test_a_wildcard_source_copies_what_it_matches_on_every_store(store_root, env_for, tmp_path):
    env = env_for("s3", "gs", "az")
    src = tmp_path / "tree"
    for rel, data in TREE.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    assert mcbridge("cp", "-q", f"{src}/", store_root, env=env, state_dir=tmp_path / "s").returncode == 0

    r = mcbridge("cp", store_root + "p/*.tar", f"{tmp_path}/one/", env=env, state_dir=tmp_path / "s")
    assert r.returncode == 0, r.stderr
    assert _copied(tmp_path / "one") == ["a.tar", "b.tar"], "* stays within its folder; p2/ is not p/"
    assert (tmp_path / "one/b.tar").read_bytes() == TREE["p/b.tar"]

    r = mcbridge("cp", store_root + "p/**.tar", f"{tmp_path}/deep/", env=env, state_dir=tmp_path / "s")
    assert r.returncode == 0 and _copied(tmp_path / "deep") == ["a.tar", "b.tar", "sub/d.tar"], r.stderr

    r = mcbridge("cp", store_root + "p*/{a,e}.tar", f"{tmp_path}/brace/", env=env, state_dir=tmp_path / "s")
    assert r.returncode == 0 and _copied(tmp_path / "brace") == ["p/a.tar", "p2/e.tar"], r.stderr

    none = mcbridge("cp", store_root + "p/*.zip", f"{tmp_path}/none/", env=env, state_dir=tmp_path / "s")
    assert none.returncode != 0 and none.stderr.count("\n") == 1, none.stderr
    assert "matches '*.zip'" in none.stderr and "Traceback" not in none.stderr
    assert not (tmp_path / "none").exists()


def test_the_wildcard_narrows_other_filters_and_a_real_name_with_a_star_is_itself(moto, make_root, env_for, tmp_path):
    env = env_for("s3")
    settings = settings_for(env)
    root = make_root("s3")
    client = moto.client()
    bucket = root[len("s3://"):].rstrip("/")
    for rel, data in {**TREE, "p/star*.bin": b"literal", "run[1]/x.bin": b"in a folder named run[1]"}.items():
        client.put_object(Bucket=bucket, Key=rel, Body=data)
    # --include is an OR among includes; the wildcard is an AND with them
    done = ops.copy(root + "p/*.tar", f"{tmp_path}/inc/", settings, filters=Filters(include=("b*",)),
                    state_dir=tmp_path / "s")
    assert done["files"] == 1 and _copied(tmp_path / "inc") == ["b.tar"]
    # an object named with a '*' is copied as itself, not read as a wildcard
    assert wildcard_source(root + "p/star*.bin", None, settings) == (root + "p/star*.bin", None)
    r = mcbridge("cp", root + "p/star*.bin", f"{tmp_path}/lit/x.bin", env=env, state_dir=tmp_path / "s")
    assert r.returncode == 0 and (tmp_path / "lit/x.bin").read_bytes() == b"literal", r.stderr
    r = mcbridge("cp", root + "run[1]", f"{tmp_path}/folder/", env=env, state_dir=tmp_path / "s")
    assert r.returncode == 0 and _copied(tmp_path / "folder") == ["x.bin"], r.stderr
    plan = json.loads(mcbridge("sync", root + "p/*.t?r", f"{tmp_path}/sync/", "--dry-run", "--json", env=env,
                               state_dir=tmp_path / "s").stdout)
    assert sorted(row["path"] for row in plan["plan"]) == ["a.tar", "b.tar"]
    assert plan["filters"] == {"within": "/*.t?r"}
    moved = mcbridge("mv", root + "p/*.tar", f"{tmp_path}/moved/", env=env, state_dir=tmp_path / "s")
    assert moved.returncode == 0 and _copied(tmp_path / "moved") == ["a.tar", "b.tar"], moved.stderr
    left = sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="p/")["Contents"])
    assert "p/a.tar" not in left and "p/c.txt" in left and "p/sub/d.tar" in left, left


def test_split_and_bounds():
    assert split_wildcard("p/q*/x.tar") == ("p/", "/q*/x.tar")
    assert split_wildcard("*.tar") == ("", "/*.tar")
    assert split_wildcard("p/x.tar") is None
    # the bounded matcher: a glob that makes a backtracking regex run for minutes is read once
    hostile = Filters(within="/" + "**a" * 10 + "**b")
    assert not hostile.selects_name("a" * 2000)
    assert Filters.from_dict(Filters(within="/*.tar").to_dict()).selects_name("x.tar")
