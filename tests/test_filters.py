"""Filters (bridge/filters.py): rclone's glob semantics, checked against what the rclone binary
itself selects on one tree; the same selection on every store (local, s3, gs, az) through ls,
cp --dry-run and --json; filters through the plan's estimate and the service's job spec."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bridge import filters as filtering
from bridge.policies import replication as rules
from bridge.errors import InvalidOption
from bridge.filters import Filters, from_flags, glob_regex
from tests.emulators import SCHEMES
from tests.helpers import mcbridge

RCLONE = shutil.which("rclone") or str(Path(sys.executable).parent / "rclone")

# name -> size: folders at several depths, names that differ only by a folder, dots, braces' targets
TREE = {
    "x.txt": 379, "readme.md": 10, "a/y.txt": 2885, "a/b.txt": 1677, "a/b/z.txt": 1994, "a/b/w.bin": 314,
    "a/b/c/deep.bin": 4000, "c/v.bin": 2927, "c/a/y.txt": 50, "train/img/cat/1.jpg": 1200,
    "train/img/dog/2.jpg": 800, "train/img/dog/3.png": 900, "train/labels.json": 64, "val/img/cat/9.jpg": 700,
    "tmp/scratch.tmp": 5000, "logs/2026/01/run.log": 123,
}

CASES = [
    ["--include", "*.txt"],
    ["--include", "*.txt", "--exclude", "a/**"],
    ["--exclude", "*.bin", "--exclude", "tmp/**"],
    ["--include", "/a/*"],
    ["--include", "b/*"],                     # rclone never enters a: nothing
    ["--include", "**/b/*.bin"],
    ["--include", "{x,z}.txt"],
    ["--include", "train/img/*/[12].jpg"],
    ["--include", "/train/**", "--exclude", "*.png"],
    ["--exclude", "a/"],
    ["--exclude", "a/", "--include", "*.txt"],
    ["--include", "*.jp?"],
    ["--min-size", "1000B"],
    ["--max-size", "900B"],
    ["--min-size", "700B", "--max-size", "2900B", "--include", "*.jpg", "--include", "*.txt"],
    ["--files-from", "{list}"],
    ["--files-from", "{list}", "--max-size", "1000B"],
]
FILES_FROM = "# wanted\na/y.txt\n/c/v.bin\n\n  x.txt  \n; a comment\ntrain/img/dog/2.jpg\nnot/there.txt\n"


def make(root: Path) -> Path:
    for rel, size in TREE.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    return root


def rclone_selects(tree: Path, flags: list[str]) -> set[str]:
    """What ``rclone lsf -R --files-only`` lists with these flags. rclone takes --files-from
    alone; bridge also applies size bounds to the paths listed: those are applied here to
    rclone's answer (by the sizes of TREE)."""
    bounded = flags[0] == "--files-from" and len(flags) > 2
    r = subprocess.run([RCLONE, "lsf", "-R", "--files-only", *(flags[:2] if bounded else flags), str(tree)],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "RCLONE_CONFIG": "/dev/null"})
    assert r.returncode == 0, r.stderr
    found = set(r.stdout.splitlines())
    if bounded:
        assert flags[2:4] == ["--max-size", "1000B"], flags
        found = {p for p in found if TREE[p] <= 1000}
    return found


def filled(flags: list[str], listing: Path) -> list[str]:
    return [str(listing) if f == "{list}" else f for f in flags]


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = make(tmp_path_factory.mktemp("filters") / "tree")
    (root.parent / "list.txt").write_text(FILES_FROM)
    return root


# -- the globs ------------------------------------------------------------------------------------

@pytest.mark.parametrize("glob, yes, no", [
    ("*.jpg", ["x.jpg", "a/b/x.jpg"], ["x.jpeg", "a/x.jpg/y"]),
    ("/*.jpg", ["x.jpg"], ["a/x.jpg"]),
    ("a/*.jpg", ["a/x.jpg", "z/a/x.jpg"], ["a/b/x.jpg", "ba/x.jpg"]),
    ("/a/**", ["a/x", "a/b/c/d"], ["b/a/x"]),
    ("a/**/x", ["a/b/x", "a/b/c/x"], ["b/x"]),
    ("?.txt", ["x.txt", "d/y.txt"], ["xy.txt"]),
    ("[ab]*.log", ["a1.log", "b.log"], ["c.log"]),
    ("{train,val}/**", ["train/x", "q/val/y"], ["test/x"]),
    (r"\*.txt", ["*.txt"], ["a.txt"]),
    ("file.txt", ["file.txt", "d/file.txt"], ["myfile.txt", "file.txt.bak"]),
])
def test_globs_follow_rclone(glob, yes, no):
    pattern = glob_regex(glob)
    assert all(pattern.search(p) for p in yes), [p for p in yes if not pattern.search(p)]
    assert not any(pattern.search(p) for p in no), [p for p in no if pattern.search(p)]


@pytest.mark.parametrize("flags, words", [
    ({"include": ["a[b"]}, "'[' without ']'"),
    ({"include": ["{a,b"]}, "'{' without '}'"),
    ({"exclude": ["***"]}, "too many stars"),
    ({"include": ["*.txt"], "files_from": ["x"]}, "cannot be combined"),
    ({"min_size": 10, "max_size": 5}, "nothing could match"),
])
def test_filters_that_cannot_work_are_refused(flags, words):
    with pytest.raises(InvalidOption, match=words.replace("[", r"\[").replace("{", r"\{")):
        from_flags(**flags)


def test_the_listing_starts_at_the_folder_every_rule_shares():
    assert from_flags(include=["/train/img/**", "/train/labels.json"]).prefix() == "train/"
    assert from_flags(include=["/train/img/cat/*.jpg"]).prefix() == "train/img/cat/"
    assert from_flags(include=["/train/**", "/val/**"]).prefix() == ""
    assert from_flags(include=["*.jpg"]).prefix() == ""          # unanchored: anywhere
    assert from_flags(files_from=["a/b/c.txt", "a/b/d/e.txt"]).prefix() == "a/b/"


def test_a_walk_lists_only_under_the_shared_folder(tree):
    """The prefix goes into the listing request: the store is asked for train/ only."""
    from bridge.config import load_settings
    from bridge.stores import get_store
    from bridge.urls import parse
    root = parse(f"{tree}/")
    real = get_store(root, load_settings(environ={}))
    asked = []

    class Recording:
        def walk(self, prefix):
            asked.append(prefix.relative_to(root))
            return real.walk(prefix)

    found = [rel for rel, _ in filtering.walk(Recording(), root, from_flags(include=["/train/**"]))]
    assert asked == ["train/"]
    assert sorted(found) == sorted(r for r in TREE if r.startswith("train/"))


def test_ages_select_by_modified_time(tmp_path):
    root = make(tmp_path / "t")
    old = time.time() - 3 * 86400
    for rel in ("x.txt", "a/y.txt"):
        os.utime(root / rel, (old, old))
    r = mcbridge("ls", "-R", "--json", f"{root}/", "--min-age", "2d", env=dict(os.environ), state_dir=tmp_path / "s")
    assert r.returncode == 0, r.stderr
    assert sorted(row["path"] for row in json.loads(r.stdout)) == ["a/y.txt", "x.txt"]
    r = mcbridge("ls", "-R", "--json", f"{root}/", "--max-age", "1d", env=dict(os.environ), state_dir=tmp_path / "s")
    assert sorted(row["path"] for row in json.loads(r.stdout)) == sorted(set(TREE) - {"x.txt", "a/y.txt"})
    r = mcbridge("ls", f"{root}/", "--max-age", "soon", env=dict(os.environ), state_dir=tmp_path / "s")
    assert r.returncode == 2 and "--max-age 'soon'" in r.stderr


# -- against rclone, on one local tree, through ls, cp --dry-run and du -----------------------------

@pytest.mark.parametrize("flags", CASES, ids=[" ".join(c) for c in CASES])
def test_local_selection_equals_rclones(flags, tree, tmp_path):
    flags = filled(flags, tree.parent / "list.txt")
    expected = rclone_selects(tree, flags)
    env = dict(os.environ)
    listed = mcbridge("ls", "-R", "--json", f"{tree}/", *flags, env=env, state_dir=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert {row["path"] for row in json.loads(listed.stdout)} == expected
    plan = mcbridge("cp", "--dry-run", "--json", f"{tree}/", f"{tmp_path}/out/", *flags, env=env, state_dir=tmp_path)
    assert plan.returncode == 0, plan.stderr
    summary = json.loads(plan.stdout)
    assert {row["path"] for row in summary["plan"]} == expected
    assert summary["files"] == len(expected) and summary["bytes"] == sum(TREE[p] for p in expected)
    assert Filters.from_dict(summary["filters"]).active     # the plan says which filters made it
    assert summary["usage"]["source"]["bytes_read"] == summary["bytes"]   # the estimate prices the selection
    assert not (tmp_path / "out").exists()


# -- the same selection on every store -------------------------------------------------------------

STORE_CASES = [c for c in CASES if c[0] != "--max-size"][::2] + [["--files-from", "{list}"]]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_store_selects_what_rclone_selects(scheme, tree, make_root, env_for, tmp_path):
    env = env_for(*([] if scheme == "local" else [scheme]))
    root = make_root(scheme) + "data/"
    r = mcbridge("cp", "-q", f"{tree}/", root, env=env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    for flags in STORE_CASES:
        flags = filled(flags, tree.parent / "list.txt")
        expected = rclone_selects(tree, flags)
        listed = mcbridge("ls", "-R", "--json", root, *flags, env=env, state_dir=tmp_path)
        assert listed.returncode == 0, (flags, listed.stderr)
        assert {row["path"] for row in json.loads(listed.stdout)} == expected, flags
        du = json.loads(mcbridge("du", "--json", root, *flags, env=env, state_dir=tmp_path).stdout)
        assert (du["objects"], du["bytes"]) == (len(expected), sum(TREE[p] for p in expected)), flags
    # a filtered copy from the store, and a filtered verify of it
    out = f"{tmp_path}/back/"
    r = mcbridge("cp", root, out, "--include", "*.jpg", "--min-size", "750B", "--json", env=env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    got = sorted(str(p.relative_to(out)) for p in Path(out).rglob("*") if p.is_file() and "_bridge" not in p.parts)
    assert got == sorted(rclone_selects(tree, ["--include", "*.jpg", "--min-size", "750B"]))
    assert mcbridge("verify", out, "--include", "train/**", env=env, state_dir=tmp_path).returncode == 0


def test_sync_filters_both_sides_and_deletes_only_what_they_select(tmp_path):
    src, dst = make(tmp_path / "src"), f"{tmp_path}/dst/"
    env = dict(os.environ)
    assert mcbridge("cp", "-q", f"{src}/", dst, env=env, state_dir=tmp_path / "s").returncode == 0
    for rel in ("a/y.txt", "c/v.bin"):
        (src / rel).unlink()
    r = mcbridge("sync", f"{src}/", dst, "--delete", "--include", "*.txt", "--dry-run", "--json", env=env,
                 state_dir=tmp_path / "s")
    plan = json.loads(r.stdout)
    assert plan["delete"] == ["a/y.txt"], "c/v.bin is not selected: it stays"
    assert plan["filters"] == {"include": ["*.txt"]}


# -- the service: the spec carries the filters, and workers plan with them --------------------------

def test_submit_puts_the_filters_in_the_job_spec(tmp_path, tree):
    env = {**os.environ, "BRIDGE_BROKER_URL": "redis://127.0.0.1:1/0"}
    listing = tree.parent / "list.txt"
    r = subprocess.run([sys.executable, "-m", "bridge", "submit", "cp", f"{tree}/", "az://dst-c/x/", "--dry-run",
                        "--json", "--files-from", str(listing), "--min-size", "1KiB"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    spec = json.loads(r.stdout)["spec"]
    assert spec["filters"] == {"files_from": ["a/y.txt", "c/v.bin", "x.txt", "train/img/dog/2.jpg",
                                              "not/there.txt"], "min_size": 1024}
    r = subprocess.run([sys.executable, "-m", "bridge", "submit", "sync", f"{tree}/", "az://dst-c/x/", "--dry-run",
                        "--json", "--include", "a[b"], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2 and "'[' without ']'" in r.stderr


def test_a_worker_plans_with_the_specs_filters(tree, tmp_path):
    from bridge.config import load_settings
    from bridge.journal import FileJournal
    from bridge.workers.kinds import Files
    from bridge.workers.specs import parse_spec
    spec = parse_spec({"kind": "copy", "source": f"{tree}/", "destination": f"{tmp_path}/out/",
                       "filters": {"include": ["/train/**"], "exclude": ["*.png"]}})
    settings = load_settings({"transfer": {"state_dir": str(tmp_path / "state")}}, environ={})
    planned = Files(100, 1 << 30).plan(spec, settings, lambda key: FileJournal(tmp_path / "j" / f"{key}.jsonl"))
    assert planned.totals["files_total"] == len(rclone_selects(tree, ["--include", "/train/**",
                                                                       "--exclude", "*.png"])) == 4
    with pytest.raises(InvalidOption, match="unknown filter"):
        parse_spec({"kind": "copy", "source": f"{tree}/", "destination": f"{tmp_path}/o/", "filters": {"bogus": 1}})


# -- a replication policy's include/exclude: the same globs, the same files ------------------------

GLOB_CASES = [c for c in CASES if set(c[::2]) <= {"--include", "--exclude"}]


@pytest.mark.parametrize("flags", GLOB_CASES, ids=[" ".join(c) for c in GLOB_CASES])
def test_a_policys_include_exclude_select_what_rclone_and_the_cli_select(flags, tree):
    given = list(zip(flags[::2], flags[1::2]))
    include = [glob for flag, glob in given if flag == "--include"]
    exclude = [glob for flag, glob in given if flag == "--exclude"]
    policy = rules.Policy(source="s3://models/golden/", destinations=["gs://dr-models/golden/"], include=include,
                          exclude=exclude)
    chosen = {rel for rel in TREE if rules.wants(policy, rel)}
    assert chosen == rclone_selects(tree, flags)
    assert chosen == {rel for rel in TREE if from_flags(include, exclude).selects(rel)}


def test_a_policys_bad_glob_is_named_by_its_line(tmp_path):
    path = tmp_path / "policies.yaml"
    path.write_text("policies:\n  p:\n    source: s3://a/b/\n    destinations: [gs://c/d/]\n"
                    "    include: ['*.bin', 'a/[b']\n")
    with pytest.raises(InvalidOption) as caught:
        rules.load(path)
    assert f"{path}:5:" in str(caught.value) and "'[' without ']'" in str(caught.value), str(caught.value)


# -- one level (ls without -R): what rclone lsf shows without -R ------------------------------------

LEVEL_CASES = [c for c in CASES if c[0] != "--files-from"]


@pytest.mark.parametrize("flags", LEVEL_CASES, ids=[" ".join(c) for c in LEVEL_CASES])
def test_one_level_ls_shows_what_rclone_lsf_shows(flags, tree, tmp_path):
    r = subprocess.run([RCLONE, "lsf", *flags, str(tree)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "RCLONE_CONFIG": "/dev/null"})
    assert r.returncode == 0, r.stderr
    listed = mcbridge("ls", "--json", f"{tree}/", *flags, env=dict(os.environ), state_dir=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert {row["path"] for row in json.loads(listed.stdout)} == set(r.stdout.splitlines())
