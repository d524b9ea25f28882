"""Hostile and unholdable object names: put with each provider's own SDK, copied with the real CLI.

A name that would land outside a local destination, or that the destination would store under
another name, is refused before any byte moves: exit 1, one stderr line quoting the names, nothing
written (so no manifest), never skipped. Names every store holds as written copy and verify.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bridge.errors import UnsafeName
from bridge.names import check_local_path, cloud_problem, local_problem, problems_for
from bridge.urls import parse
from tests.helpers import mcbridge


def put_keys(emulator, root: str, objects: dict[str, bytes]) -> None:
    """Each object put under the bucket of ``root`` with the provider's SDK, keys exactly as given."""
    loc = parse(root)
    client = emulator.client()
    for key, data in objects.items():
        if emulator.scheme == "s3":
            client.put_object(Bucket=loc.bucket, Key=key, Body=data)
        elif emulator.scheme == "gs":
            client.bucket(loc.bucket).blob(key).upload_from_string(data)
        else:
            client.get_container_client(loc.bucket).upload_blob(key, data)


def files_under(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() or p.is_symlink()}


def refused(r, *names: str) -> str:
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr and lines[0].startswith("mcbridge: error: "), r.stderr
    for name in names:
        assert repr(name) in lines[0], (name, lines[0])
    return lines[0]


@pytest.fixture
def deep_dest(tmp_path: Path) -> Path:
    """A destination three levels down, so that climbing keys have parents to land in."""
    dest = tmp_path / "one" / "two" / "dl"
    dest.parent.mkdir(parents=True)
    (tmp_path / "one" / "keep.txt").write_text("here before")
    return dest


@pytest.mark.parametrize("command", ["cp", "sync"])
@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_keys_that_climb_out_are_refused_before_anything_is_written(scheme, command, make_root, emulator_for,
                                                                   env_for, tmp_path, deep_dest):
    root = make_root(scheme)
    absolute_target = tmp_path / "abs-escape.txt"
    climbing = "x/" + "../" * 40 + str(absolute_target).lstrip("/")
    hostile = ["x/../../escape.txt", "x/../../../escape2.txt", climbing]
    put_keys(emulator_for(scheme), root, {"fine.txt": b"ok", **{k: b"pwned" for k in hostile}})
    before = files_under(tmp_path)

    r = mcbridge(command, root, f"{deep_dest}/", env=env_for(scheme), state_dir=tmp_path / "state")

    line = refused(r, *hostile)
    assert "climbs out" in line and "nothing was copied" in line
    assert files_under(tmp_path) - before <= {p for p in files_under(tmp_path) if p.startswith("state/")}
    assert not absolute_target.exists()
    assert not deep_dest.exists() or not any(deep_dest.iterdir())  # no manifest, no fine.txt either


# (key, what the message says): names an S3 or GCS key can be but a local file cannot.
NOT_LOCAL = {
    "a//b.txt": "empty path segment",
    "./dot.txt": "'.' path segment",
    "/abs.txt": "absolute path",
    "dir/": "folder marker",
    "s" * 256 + ".txt": "over 255 bytes",
    "x.bridge-partial": "unfinished local files",
}


@pytest.mark.parametrize("scheme", ["s3", "gs", "az"])
def test_names_a_local_folder_cannot_hold_are_refused(scheme, make_root, emulator_for, env_for, tmp_path):
    root = make_root(scheme)
    keys = dict(NOT_LOCAL)
    if scheme == "az":  # Azurite refuses '.' segments itself
        del keys["./dot.txt"]
    put_keys(emulator_for(scheme), root, {"fine.txt": b"ok", **{k: b"x" for k in keys}})
    dest = tmp_path / "dl"

    r = mcbridge("cp", root, f"{dest}/", env=env_for(scheme), state_dir=tmp_path / "state")

    line = refused(r)
    shown = [key for key in keys if repr(key) in line]
    assert len(shown) == min(5, len(keys))                    # the first five, then a count
    assert ("(and 1 more)" in line) == (len(keys) > 5)
    assert all(keys[key] in line for key in shown)
    assert not dest.exists()


def test_a_name_that_is_both_file_and_folder_is_refused_for_local(make_root, emulator_for, env_for, tmp_path):
    root = make_root("s3")
    put_keys(emulator_for("s3"), root, {"a": b"file", "a/b.txt": b"under it"})
    r = mcbridge("cp", root, f"{tmp_path}/dl/", env=env_for("s3"), state_dir=tmp_path / "state")
    assert "is a file, and also the folder of other names" in refused(r, "a")
    assert not (tmp_path / "dl").exists()


def test_a_link_in_the_destination_that_leads_out_is_refused(make_root, emulator_for, env_for, tmp_path):
    root = make_root("s3")
    put_keys(emulator_for("s3"), root, {"link/passwd": b"pwned"})
    outside, dest = tmp_path / "outside", tmp_path / "dl"
    outside.mkdir()
    dest.mkdir()
    (dest / "link").symlink_to(outside)
    r = mcbridge("cp", root, f"{dest}/", env=env_for("s3"), state_dir=tmp_path / "state")
    assert "through a link" in refused(r, "link/passwd")
    assert not any(outside.iterdir())


@pytest.mark.parametrize("src_scheme", ["s3", "gs"])
def test_names_azure_would_rewrite_are_refused(src_scheme, make_root, emulator_for, env_for, tmp_path):
    src, dst = make_root(src_scheme), make_root("az")
    keys = {"back\\slash.txt": "backslash", "trail.": "ends with '.'", "x/../y.txt": "'..' path segment",
            "./dot.txt": "'.' or '..'"}
    put_keys(emulator_for(src_scheme), src, {"fine.txt": b"ok", **{k: b"x" for k in keys}})

    r = mcbridge("cp", src, dst, env=env_for(src_scheme, "az"), state_dir=tmp_path / "state")

    line = refused(r, *keys)
    for reason in keys.values():
        assert reason in line
    container = emulator_for("az").client().get_container_client(parse(dst).bucket)
    assert list(container.list_blob_names()) == []


def test_local_names_azure_and_gcs_cannot_hold(make_root, env_for, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "back\\slash.txt").write_text("x")
    (src / "line\nbreak.txt").write_text("y")
    r = mcbridge("cp", f"{src}/", make_root("az"), env=env_for("az"), state_dir=tmp_path / "state")
    assert "backslash" in refused(r, "back\\slash.txt")
    r = mcbridge("cp", f"{src}/", make_root("gs"), env=env_for("gs"), state_dir=tmp_path / "state")
    assert "line break" in refused(r, "line\nbreak.txt")


def test_a_key_over_the_length_limit_is_refused(make_root, env_for, tmp_path):
    src = tmp_path / "src"
    deep = src / "/".join(["d" * 250] * 5)
    deep.mkdir(parents=True)
    (deep / "f.txt").write_text("x")
    r = mcbridge("cp", f"{src}/", make_root("s3"), env=env_for("s3"), state_dir=tmp_path / "state")
    assert "the limit is 1024" in refused(r, str((deep / "f.txt").relative_to(src)))


@pytest.mark.parametrize("pair", [("s3", "gs"), ("gs", "s3"), ("s3", "s3"), ("gs", "az")])
def test_odd_names_a_store_holds_copy_and_verify(pair, make_root, emulator_for, env_for, tmp_path):
    """Keys a local folder refuses are plain keys between object stores: kept exactly, verified."""
    src_scheme, dst_scheme = pair
    src, dst = make_root(src_scheme), make_root(dst_scheme) + "copy/"
    objects = {"a//b.txt": b"1", "./dot.txt": b"2", "/abs.txt": b"3", "x/../y.txt": b"4", "y.txt": b"5"}
    if dst_scheme == "az":  # Azure refuses the '.' segments (test_names_azure_would_rewrite_are_refused)
        objects = {k: v for k, v in objects.items() if not {".", ".."} & set(k.split("/"))}
    put_keys(emulator_for(src_scheme), src, objects)
    env = env_for(src_scheme, dst_scheme)

    r = mcbridge("cp", src, dst, env=env, state_dir=tmp_path / "state")
    assert r.returncode == 0, r.stderr
    v = mcbridge("verify", dst, "--deep", env=env, state_dir=tmp_path / "state")
    assert v.returncode == 0, v.stdout + v.stderr
    assert "0 missing, 0 extra, 0 mismatched" in v.stdout


# -- the rules themselves, and the local store's second line ------------------------------------

@pytest.mark.parametrize("rel", ["..", "a/../../b", "/etc/passwd", "a//b", "./a", "a/./b", "a\x00b", "a/", ""])
def test_local_problem_refuses_what_is_not_a_plain_relative_path(rel):
    assert local_problem(rel) is not None


@pytest.mark.parametrize("rel", ["a", "a/b.txt", "..hidden", "a..b/c", "back\\slash", "line\nbreak", "é/名前"])
def test_local_problem_accepts_plain_relative_paths(rel):
    assert local_problem(rel) is None


def test_cloud_rules_per_destination():
    assert cloud_problem("a\\b", "az") and cloud_problem("a\\b", "s3") is None
    assert cloud_problem("x/../y", "az") and cloud_problem("x/../y", "gs") is None
    assert cloud_problem("a\nb", "gs") and cloud_problem("a\nb", "s3") is None
    assert cloud_problem("\udcff", "s3")                      # a local name that is not UTF-8
    assert cloud_problem("k" * 1025, "gs") and cloud_problem("k" * 1024, "gs") is None


def test_problems_for_caps_nothing_and_names_every_key():
    found = problems_for([f"../{i}" for i in range(7)], "file", "tmp/dl/")
    assert len(found) == 7


@pytest.mark.parametrize("path", ["/tmp/dl/../x", "/tmp/dl/./x", "/tmp//x", "//tmp/x", "tmp/x", "/tmp/x/",
                                  "/tmp/a\x00b"])
def test_the_local_store_refuses_paths_not_in_normal_form(path):
    with pytest.raises(UnsafeName):
        check_local_path(path)


def test_joining_a_hostile_name_to_a_local_location_is_refused(tmp_path):
    root = parse(f"{tmp_path}/")
    with pytest.raises(UnsafeName, match="climbs out"):
        root.join("x/../../escape")
    assert root.join("a/b").local_path == os.path.join(str(tmp_path), "a/b")
    assert parse("s3://bkt/p/").join("/abs").key == "p//abs"   # object keys are kept exactly


def test_unpack_refuses_a_member_name_the_destination_would_rewrite(make_root, emulator_for, env_for, tmp_path):
    """A local name with a backslash packs fine, but Azure would restore it as a folder: refused."""
    src, shards = tmp_path / "src", tmp_path / "shards"
    src.mkdir()
    (src / "back\\slash.txt").write_text("x")
    (src / "plain.txt").write_text("y")
    env = env_for("az")
    assert mcbridge("pack", f"{src}/", f"{shards}/", env=env, state_dir=tmp_path / "state").returncode == 0
    dst = make_root("az")
    r = mcbridge("unpack", f"{shards}/", dst, env=env, state_dir=tmp_path / "state")
    assert "backslash" in refused(r, "back\\slash.txt")
    container = emulator_for("az").client().get_container_client(parse(dst).bucket)
    assert list(container.list_blob_names()) == []


@pytest.mark.parametrize("kind", ["copy", "sync"])
def test_the_service_plans_through_the_same_check(kind, make_root, emulator_for, env_for, tmp_path):
    """A worker's planning task refuses hostile keys before it prepares the destination or fans out."""
    pytest.importorskip("celery")
    from tests.helpers import settings_for
    from bridge.workers.kinds import Files
    from bridge.workers.specs import JobSpec
    root = make_root("s3")
    put_keys(emulator_for("s3"), root, {"x/../../escape.txt": b"pwned", "ok.txt": b"ok"})
    spec = JobSpec(kind=kind, source=root, destinations=[f"{tmp_path}/dl/"])

    def journal_for(_key):
        raise AssertionError("planning went on to prepare the destination")

    with pytest.raises(UnsafeName, match="climbs out"):
        Files(100, 1 << 30).plan(spec, settings_for(env_for("s3")), journal_for)
    assert not (tmp_path / "dl").exists()
