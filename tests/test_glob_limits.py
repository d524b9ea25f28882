"""Globs whose cost is bounded (bridge/filters.py, "Cost and limits"): a glob of many braces or
many stars is answered at once by every command that reads globs (ls, cp, submit, policy check)
and by a worker running a signed job that carries one; a glob past the documented limits is
refused with one line, exit 2; the automaton selects what the regular expression selects, on
many random globs and names, and the folders it enters are rclone's directory globs.

Each command is given 60 s: the brace globs took more than 60 s (N=16) and did not end (N=22,
memory rising), the stars minutes, before globs were compiled to an automaton; each takes well
under a second of matching now (the rest is the program starting)."""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.errors import InvalidOption
from bridge.filters import MAX_GLOB_CHARS, MAX_GLOBS, Automaton, Filters, dir_matcher, glob_regex, parse_glob
from tests.helpers import mcbridge
from tests.test_service_security import secured  # noqa: F401  (the fixture)
from tests.test_workers_service import service  # noqa: F401  (the fixture)

RCLONE = shutil.which("rclone") or str(Path(sys.executable).parent / "rclone")
HANG = 60   # seconds a command is given; what hung took longer


def brace_glob(n: int) -> str:
    """The issue's glob: ``{a,b}`` n times, then ``/x`` (2^n spellings)."""
    return "{a,b}" * n + "/x"


def brace_tree(root: Path, n: int) -> Path:
    """One file the brace glob selects, and three it does not."""
    for rel in ("ab" * (n // 2) + "/x", "ab" * (n // 2) + "/y", "c" * n + "/x", "ab" * (n // 2) + "c/x"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"data")
    return root


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bridge", *args], capture_output=True, text=True, timeout=HANG,
                          env={**os.environ, **(env or {})})


# -- the commands ---------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [16, 22])
def test_a_brace_glob_is_answered_at_once_by_ls_and_cp(n, tmp_path):
    src = brace_tree(tmp_path / "src", n)
    wanted = ["ab" * (n // 2) + "/x"]
    listed = mcbridge("ls", "-R", "--json", f"{src}/", "--include", brace_glob(n), env=dict(os.environ),
                      state_dir=tmp_path / "s", timeout=HANG)
    assert listed.returncode == 0, listed.stderr
    assert [row["path"] for row in json.loads(listed.stdout)] == wanted
    copied = mcbridge("cp", "--json", f"{src}/", f"{tmp_path}/out/", "--include", brace_glob(n),
                      env=dict(os.environ), state_dir=tmp_path / "s", timeout=HANG)
    assert copied.returncode == 0, copied.stderr
    assert sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("x")) == wanted


@pytest.mark.parametrize("n", [16, 22])
def test_submit_checks_a_brace_glob_at_once(n, tmp_path):
    src = brace_tree(tmp_path / "src", n)
    r = run("submit", "cp", f"{src}/", "az://dst-c/x/", "--dry-run", "--json", "--include", brace_glob(n),
            env={"BRIDGE_BROKER_URL": "redis://127.0.0.1:1/0"})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["spec"]["filters"] == {"include": [brace_glob(n)]}


def policy_file(path: Path, *globs: str) -> Path:
    path.write_text("policies:\n  p:\n    source: s3://models/golden/\n    destinations: [gs://dr-models/golden/]\n"
                    f"    include: {json.dumps(list(globs))}\n")
    return path


@pytest.mark.parametrize("n", [16, 22])
def test_policy_check_reads_a_brace_glob_at_once(n, tmp_path):
    r = run("policy", "check", str(policy_file(tmp_path / "p.yaml", "*.bin", brace_glob(n))))
    assert r.returncode == 0 and "1 policy OK" in r.stdout, r.stdout + r.stderr


def test_many_stars_against_a_long_name_are_answered_at_once(tmp_path):
    """Five '**' runs through Python's `re` against a 200-character name backtrack for about two
    minutes (measured: 108 s); the automaton reads the name once."""
    src = tmp_path / "src"
    src.mkdir()
    (src / ("a" * 200)).write_bytes(b"1")
    (src / "ab").write_bytes(b"2")
    listed = mcbridge("ls", "-R", "--json", f"{src}/", "--include", "**a**a**a**a**a**b", env=dict(os.environ),
                      state_dir=tmp_path / "s", timeout=HANG)
    assert listed.returncode == 0, listed.stderr
    assert [row["path"] for row in json.loads(listed.stdout)] == []   # five a's before the b: neither name
    listed = mcbridge("ls", "-R", "--json", f"{src}/", "--include", "**a**a**b", "--include", "**a**a**a**a**a",
                      env=dict(os.environ), state_dir=tmp_path / "s", timeout=HANG)
    assert sorted(row["path"] for row in json.loads(listed.stdout)) == ["a" * 200]


def test_a_worker_runs_a_signed_job_carrying_a_brace_glob(service, tmp_path):  # noqa: F811
    """The job is admitted, planned with the glob and copies the one file it selects; the worker
    answers the glob as the command line did."""
    n = 22
    src = brace_tree(tmp_path / "src", n)
    worker = service.worker("w1", threads=1)
    worker.wait_ready()
    job_id = service.submit("cp", f"{src}/", f"{tmp_path}/out/", "--include", brace_glob(n))
    record = service.wait(job_id, timeout=HANG)
    assert record.state == "succeeded", (record.errors, worker.log_tail(40))
    copied = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*")
                    if p.is_file() and "_bridge" not in p.parts)
    assert copied == ["ab" * (n // 2) + "/x"]


def test_a_worker_answers_the_globs_of_signed_jobs_written_by_hand_at_once(secured):  # noqa: F811
    """Jobs signed with the tenant's key and written to Redis by hand, as anyone holding that
    key can, past every check of the command line: the worker admits the one whose glob has 22
    braces and runs it at once (it hung a pool process before, its memory rising); it refuses
    the one whose glob is past the length limit, in one line, before listing anything."""
    s = secured
    n = 22
    s.moto.client().put_object(Bucket=s.src, Key="team-a/in/" + "ab" * (n // 2) + "/x", Body=b"selected")
    jobs = {"braces": brace_glob(n), "toolong": "a/" * (MAX_GLOB_CHARS // 2) + "x"}
    for job_id, glob in jobs.items():
        spec = {"kind": "copy", "source": f"s3://{s.src}/team-a/in/",
                "destinations": [f"s3://{s.dst}/team-a/{job_id}/"], "verify": "store", "filters": {"include": [glob]}}
        s.write_record(job_id, spec, auth=s.keyring.sign_job("team-a", job_id, spec, budget=None, ttl=3600))
        s.push("bridge.plan", [job_id])
    record = s.wait("braces", timeout=HANG)
    assert record.state == "succeeded", (record.errors, s.processes[0].log_tail(30))
    copied = s.moto.client().list_objects_v2(Bucket=s.dst, Prefix="team-a/braces/").get("Contents", [])
    assert [o["Key"] for o in copied if "/_bridge/" not in o["Key"]] == ["team-a/braces/" + "ab" * (n // 2) + "/x"]
    record = s.wait("toolong", timeout=HANG)
    assert record.state == "failed" and len(record.errors) == 1, record.errors
    assert f"at most {MAX_GLOB_CHARS} are taken" in record.errors[0] and "\n" not in record.errors[0], record.errors


# -- the limits ------------------------------------------------------------------------------------

def test_a_glob_past_the_limits_is_refused_with_one_line(tmp_path):
    src = brace_tree(tmp_path / "src", 2)
    long = "a/" * (MAX_GLOB_CHARS // 2) + "x"
    r = mcbridge("ls", f"{src}/", "--include", long, env=dict(os.environ), state_dir=tmp_path / "s", timeout=HANG)
    assert r.returncode == 2 and f"at most {MAX_GLOB_CHARS} are taken" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    many = [arg for i in range(MAX_GLOBS + 1) for arg in ("--exclude", f"*.{i}")]
    r = mcbridge("ls", f"{src}/", *many, env=dict(os.environ), state_dir=tmp_path / "s", timeout=HANG)
    assert r.returncode == 2 and f"at most {MAX_GLOBS} are taken" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = run("policy", "check", str(policy_file(tmp_path / "p.yaml", "*.bin", long)))
    assert r.returncode == 2 and f"{tmp_path / 'p.yaml'}:5:" in r.stderr and "at most" in r.stderr, r.stderr
    r = run("submit", "cp", f"{src}/", "az://dst-c/x/", "--dry-run", "--include", long,
            env={"BRIDGE_BROKER_URL": "redis://127.0.0.1:1/0"})
    assert r.returncode == 2 and "at most" in r.stderr and "Traceback" not in r.stderr, r.stderr
    # exactly at the limits: taken
    Filters(include=("a" * MAX_GLOB_CHARS,), exclude=tuple(f"*.{i}" for i in range(MAX_GLOBS - 1)))
    with pytest.raises(InvalidOption, match="1025 characters"):
        Filters(include=("a" * (MAX_GLOB_CHARS + 1),))


# -- the automaton selects what the regular expression selects -------------------------------------

PIECES = ["a", "b", "/", "*", "**", "?", "[ab]", "[!a]", "{a,b}", "{a/,*}", "{,b*}", "{**,a}", "\\*", "."]
NAME_CHARS = "ab/.*"


def random_glob(rng: random.Random) -> str:
    glob = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 7)))
    return ("/" if rng.random() < 0.3 else "") + glob


def test_the_automaton_matches_what_the_regex_matches_on_random_globs_and_names():
    """5,000 random globs (stars, braces holding '/' and stars, classes, escapes), each against
    40 random names: the automaton and Python's `re` agree on every one."""
    rng = random.Random(46)
    checked = 0
    for _ in range(5000):
        glob = random_glob(rng)
        try:
            parsed = parse_glob(glob)
            regex = glob_regex(parsed)
        except InvalidOption:
            continue
        automaton = Automaton(parsed.tokens, parsed.anchored)
        for _ in range(40):
            name = "".join(rng.choice(NAME_CHARS) for _ in range(rng.randint(0, 12)))
            assert automaton.search(name) == bool(regex.search(name)), (glob, name, regex.pattern)
            checked += 1
    assert checked > 100_000


def spelled(glob: str) -> list[str]:
    """Every spelling of a small glob's braces (the reference only: 2^n for n braces)."""
    parts = []
    rest = glob
    while "{" in rest:
        start = rest.index("{")
        end = rest.index("}", start)
        parts += [[rest[:start]], rest[start + 1:end].split(",")]
        rest = rest[end + 1:]
    return ["".join(choice) for choice in itertools.product(*parts, [rest])]


def reference_dir_globs(glob: str) -> list[str]:
    """rclone's directory globs, spelled out: each spelling cut at each '/' and '**' from the
    right; a spelling with no cut (unanchored) can match in any folder."""
    out = []
    for pattern in spelled(glob):
        rest = pattern
        while "//" in rest:
            rest = rest.replace("//", "/")
        cut_once = False
        while True:
            slash, stars = rest.rfind("/"), rest.rfind("**")
            cut, what = (stars, "**") if stars > slash else (slash, "")
            if cut < 0:
                break
            cut_once = True
            rest = rest[:cut]
            out.append(rest + what + "/")
        if not cut_once:
            out.append("/**")
    return [d for d in out if d != "/"]


def test_the_folders_entered_are_rclones_directory_globs_without_spelling_braces():
    rng = random.Random(4646)
    pieces = ["a", "b", "/", "*", "**", "?", "{a,b}", "{a/,b}", "{a,**}", "{,/b}"]
    compared = 0
    for _ in range(3000):
        glob = ("/" if rng.random() < 0.3 else "") + "".join(rng.choice(pieces) for _ in range(rng.randint(1, 6)))
        if any("***" in s or "//" in s or s[:1] != glob[:1] == "{" for s in spelled(glob)) \
                or glob.endswith("/") or glob == "/":
            continue   # no glob (***), or the reference reads a spelling differently ('//', a leading '/')
        if "*{" in glob or "}*" in glob:
            continue   # spelled, star runs on either side of a brace would join
        folders = dir_matcher(glob)
        references = [glob_regex(d) for d in reference_dir_globs(glob)]
        for _ in range(30):
            folder = "".join(rng.choice("ab/") for _ in range(rng.randint(0, 8))).strip("/")
            folder = (folder + "/").replace("//", "/") if folder else "a/"
            expected = any(r.search(folder) for r in references)
            assert (folders is not None and bool(folders.search(folder))) == expected, (glob, folder)
            compared += 1
    assert compared > 20_000


def test_a_brace_with_a_cut_and_one_without_enters_every_folder_as_rclone_does(tmp_path):
    """``{a/x,y}``: the y can be at any depth, so every folder is entered (rclone lists b/y and
    c/a/x); spelling the braces out in order once entered only a/ when a/x came first."""
    root = tmp_path / "t"
    for rel in ("a/x", "b/y", "y", "c/a/x", "c/z"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b".")
    for glob in ("{a/x,y}", "{y,a/x}"):
        r = subprocess.run([RCLONE, "lsf", "-R", "--files-only", "--include", glob, str(root)], capture_output=True,
                           text=True, timeout=60, env={**os.environ, "RCLONE_CONFIG": "/dev/null"})
        assert r.returncode == 0, r.stderr
        listed = mcbridge("ls", "-R", "--json", f"{root}/", "--include", glob, env=dict(os.environ),
                          state_dir=tmp_path / "s", timeout=HANG)
        assert {row["path"] for row in json.loads(listed.stdout)} == set(r.stdout.split()) == {"a/x", "b/y", "y",
                                                                                               "c/a/x"}, glob
