"""What a person at a terminal sees: the real program in a pseudo-terminal (pexpect), read as
text. Progress while ``verify --deep`` and ``replicate --once`` run, one line on Ctrl-C and on
SIGTERM saying how to resume (and the resumed run counting only what it moved), and ``-q``
printing nothing when all goes well. Nothing here waits on a clock: each step waits for what
the screen shows."""

from __future__ import annotations

import io
import os
import re
import signal
import sys

import pytest

pexpect = pytest.importorskip("pexpect")

from tests.helpers import NO_CONFIG  # noqa: E402

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def spawn(args: list[str], tmp_path, **env: str):
    full = {**os.environ, "MCBRIDGE_STATE_DIR": str(tmp_path / "state"), "XDG_CONFIG_HOME": NO_CONFIG,
            "COLUMNS": "120", "LINES": "40", "TERM": "xterm", **env}
    full.pop("MCBRIDGE_CONFIG", None)
    child = pexpect.spawn(sys.executable, ["-m", "bridge", *args], env=full, encoding="utf-8", timeout=120,
                          dimensions=(40, 120))
    child.logfile_read = io.StringIO()   # all of it, whatever expect() consumed on the way
    return child


def screen(child) -> str:
    """Everything the program wrote, without the terminal's control sequences."""
    child.expect(pexpect.EOF)
    child.close()
    return ANSI.sub("", child.logfile_read.getvalue())


def tree(root, files: dict[str, int]):
    for rel, size in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    return root


def copied(src, dst, tmp_path) -> None:
    child = spawn(["cp", "-q", f"{src}/", f"{dst}/"], tmp_path)
    assert screen(child) == "" and child.exitstatus == 0


def test_verify_deep_shows_its_progress(tmp_path):
    src = tree(tmp_path / "src", {f"shard-{i}.bin": 3 * 2**20 for i in range(4)})
    copied(src, tmp_path / "dst", tmp_path)
    child = spawn(["verify", "--deep", f"{tmp_path}/dst/"], tmp_path)
    child.expect(r"verifying: \d+ of 4 files")
    seen = screen(child)
    assert child.exitstatus == 0, seen
    assert "verifying: 4 of 4 files, 12.0 MiB of 12.0 MiB" in seen, seen
    assert "OK: 4 files, 12.0 MiB checked (deep)" in seen, seen


def test_replicate_once_shows_its_progress(tmp_path):
    src = tree(tmp_path / "models", {f"step-{n}/model.bin": 2 * 2**20 for n in (100, 200)})
    for n in (100, 200):
        (src / f"step-{n}" / ".metadata").write_bytes(b"dcp")
    policy = tmp_path / "p.yaml"
    policy.write_text(f"policies:\n  golden:\n    source: {src}/\n    destinations: [{tmp_path}/dr/]\n"
                      f"    checkpoints: \"step-*\"\n    verify: deep\n")
    # a bandwidth limit keeps the copy on screen for a few refreshes of the bar
    child = spawn(["replicate", "--policy", str(policy), "--once"], tmp_path, MCBRIDGE_BWLIMIT="2MiB")
    child.expect(r"copying step-100: [\d.]+ [KM]?i?B of 4\.0 MiB, \d file")
    child.expect(r"copying step-200: [\d.]+ [KM]?i?B of 4\.0 MiB")
    seen = screen(child)
    assert child.exitstatus == 0, seen
    # two checkpoints of two files each, verified one after the other: the run's count
    assert re.search(r"verifying: 4 of 4 files, 4\.0 MiB of 4\.0 MiB", seen), seen
    assert "OK: golden: step-100, step-200 at 1 of 1 destination" in seen, seen


@pytest.mark.parametrize("how, code", [("ctrl-c", 130), ("sigterm", 143)])
def test_an_interrupted_copy_says_how_to_resume_and_the_rerun_counts_only_what_it_moved(how, code, tmp_path):
    src = tree(tmp_path / "src", {"ckpt.bin": 32 * 2**20})   # 4 parts of 8 MiB to a local folder
    args = ["cp", f"{src}/", f"{tmp_path}/dst/"]
    child = spawn([*args, "--bwlimit", "4MiB"], tmp_path)
    child.expect(r"copying: (8|9|[12]\d)\.\d MiB of 32\.0 MiB")   # a part is done; most are not
    if how == "ctrl-c":
        child.sendintr()
    else:
        child.kill(signal.SIGTERM)
    child.expect("mcbridge: interrupted: run the same command to resume")
    seen = screen(child)
    assert child.exitstatus == code, seen
    assert "Traceback" not in seen, seen
    again = spawn(args, tmp_path)
    seen = screen(again)
    assert again.exitstatus == 0, seen
    # the parts in flight when the signal came finish (and are journaled) before the run stops
    m = re.search(r"copied 1 file, 32\.0 MiB in [\d.]+s \(([\d.]+) ([KMG]?i?B)/s; ([\d.]+) ([KM]?i?B) moved by this "
                  r"run, ([\d.]+) MiB already there from an earlier run\)", seen)
    assert m, seen
    unit = {"B": 1, "KiB": 2**10, "MiB": 2**20}
    moved, there = float(m.group(3)) * unit[m.group(4)], float(m.group(5)) * 2**20
    assert moved + there == 32 * 2**20 and there >= 8 * 2**20, seen
    if moved == 0:
        assert m.group(1, 2) == ("0", "B"), "a rate of bytes this run did not move"


def test_quiet_prints_nothing_on_success(tmp_path):
    src = tree(tmp_path / "src", {"a.bin": 2**20, "b/c.bin": 10})
    for args in (["cp", "-q", f"{src}/", f"{tmp_path}/dst/"],
                 ["sync", "-q", f"{src}/", f"{tmp_path}/dst/"],
                 ["verify", "-q", "--deep", f"{tmp_path}/dst/"],
                 ["rm", "-q", "-r", f"{tmp_path}/dst/b/"]):
        child = spawn(args, tmp_path)
        seen = screen(child)
        assert (seen, child.exitstatus) == ("", 0), (args, seen)
    child = spawn(["verify", "-q", f"{tmp_path}/dst/"], tmp_path)   # b/c.bin is missing now: said
    seen = screen(child)
    assert child.exitstatus == 1 and "missing     b/c.bin" in seen and "FAILED" in seen, seen
