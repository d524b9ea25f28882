"""Saying what happens: -v shows every retry and why, --log-file keeps it with times, --stats
prints progress lines when stderr is no terminal, SIGUSR2 says what it did to the limit,
--version, shell completion, and help that reads at 80 columns with the choices listed."""

from __future__ import annotations

import os
import re
import signal
import subprocess

import pytest
import typer

from bridge import __version__, cli, routes
from tests.helpers import MCBRIDGE, NO_CONFIG, mcbridge


def env_plain(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MCBRIDGE_CONFIG"}
    env.update(XDG_CONFIG_HOME=NO_CONFIG, **extra)
    return env


def unreachable(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("profiles:\n  default:\n    transfer: {retries: 2, connect_timeout: 1}\n"
                      "    s3: {endpoint_url: 'http://127.0.0.1:1', access_key_id: a, secret_access_key: b}\n")
    return ["ls", "s3://no-such-bkt/", "--config", str(config)]


def test_retries_are_silent_by_default_and_said_with_their_reason_at_v(tmp_path):
    quiet = mcbridge(*unreachable(tmp_path), env=env_plain(), state_dir=tmp_path)
    assert quiet.returncode != 0 and len(quiet.stderr.strip().splitlines()) == 1, quiet.stderr
    loud = mcbridge("-v", *unreachable(tmp_path), env=env_plain(), state_dir=tmp_path)
    retries = [line for line in loud.stderr.splitlines() if "retry" in line]
    assert len(retries) == 2, loud.stderr
    assert re.search(r"retry 1 of 2 in \d+\.\ds \(http://127\.0\.0\.1:1\): EndpointUnreachable: cannot reach",
                     retries[0]), retries
    assert loud.stderr.strip().splitlines()[-1].startswith("mcbridge: error: ")


def test_a_log_file_keeps_the_retries_with_times(tmp_path):
    log = tmp_path / "run.log"
    r = mcbridge(*unreachable(tmp_path), "--log-file", str(log), env=env_plain(), state_dir=tmp_path)
    assert r.returncode != 0
    lines = log.read_text().splitlines()
    assert len([line for line in lines if "retry" in line]) == 2, lines
    assert all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ INFO bridge\.retry: retry", line)
               for line in lines if "retry" in line), lines
    assert "retry" not in r.stderr, "the file, not the terminal, without -v"
    bad = mcbridge("ls", str(tmp_path), "--log-file", str(tmp_path), env=env_plain(), state_dir=tmp_path)
    assert bad.returncode == 2 and "--log-file" in bad.stderr and "directory" in bad.stderr
    bad = mcbridge("ls", str(tmp_path), "--log-level", "loud", env=env_plain(), state_dir=tmp_path)
    assert bad.returncode == 2 and "debug, info, warning, error" in bad.stderr


def test_stats_lines_when_stderr_is_no_terminal_and_the_word_on_sigusr2(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.bin").write_bytes(os.urandom(6 * 2**20))
    # 6 MiB at 2 MiB/s lasts at least three seconds: several lines 0.5 s apart
    proc = subprocess.Popen([*MCBRIDGE, "cp", f"{src}/", f"{tmp_path}/dst/", "--bwlimit", "2MiB", "--stats", "0.5s"],
                            env=env_plain(MCBRIDGE_STATE_DIR=str(tmp_path / "s")), stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    first = proc.stderr.readline()
    assert re.match(r"mcbridge: (listing|copying): ", first), first
    seen = [first]   # a line may come before the listing has the total: the signal waits for one that has it
    while not re.search(r"mcbridge: copying: [\d.]+ [KM]?i?B of 6\.0 MiB, \d file", seen[-1]):
        seen.append(proc.stderr.readline())
        assert seen[-1].startswith("mcbridge: "), seen
    proc.send_signal(signal.SIGUSR2)
    rest, _ = proc.communicate(timeout=120)[1], None
    assert proc.returncode == 0, rest
    assert "mcbridge: SIGUSR2: bandwidth limit off" in rest, rest


def test_version_and_completion(tmp_path):
    r = mcbridge("--version", env=env_plain(), state_dir=tmp_path)
    assert r.stdout == f"mcbridge {__version__}\n" and r.returncode == 0
    for shell in ("bash", "zsh", "fish"):
        r = mcbridge("completion", shell, env=env_plain(), state_dir=tmp_path)
        assert r.returncode == 0 and "_MCBRIDGE_COMPLETE" in r.stdout, (shell, r.stderr)
    r = mcbridge("completion", "tcsh", env=env_plain(), state_dir=tmp_path)
    assert r.returncode == 2 and "bash, zsh, fish" in r.stderr
    answer = subprocess.run(MCBRIDGE, env=env_plain(_MCBRIDGE_COMPLETE="complete_bash", COMP_WORDS="mcbridge cp --inc",
                                                    COMP_CWORD="2"), capture_output=True, text=True, timeout=60)
    assert answer.stdout.split() == ["--include"], answer


def all_commands() -> list[list[str]]:
    cli._register_extensions()
    group = typer.main.get_group(cli.app)
    found = []
    for name, command in group.commands.items():
        subs = getattr(command, "commands", None)
        found += [[name, sub] for sub in subs] if subs else [[name]]
    return found


@pytest.mark.parametrize("command", all_commands(), ids=" ".join)
def test_help_reads_at_80_columns(command, tmp_path):
    r = subprocess.run([*MCBRIDGE, *command, "--help"], env=env_plain(COLUMNS="80"), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"Usage: mcbridge {' '.join(command)} ")
    assert max(map(len, r.stdout.splitlines())) <= 80, r.stdout
    assert "{" not in r.stdout.splitlines()[0] and "<str>" not in r.stdout and "<function>" not in r.stdout, r.stdout


def test_enumerated_options_list_their_choices(tmp_path):
    def helped(*command: str) -> str:
        return re.sub(r"\s+", " ", mcbridge(*command, "--help", env=env_plain(COLUMNS="80"), state_dir=tmp_path).stdout)
    assert "--store-checksums <require|readback|skip>" in helped("cp")
    assert "--pack <tar|parquet>" in helped("migrate") and "--format <tar|parquet>" in helped("pack")
    assert "--verify <store|deep|none>" in helped("submit", "cp")
    route_help = helped("cp")
    assert all(name in route_help for name in routes.names()), route_help
    r = mcbridge("cp", "a", "b", "--store-checksums", "often", env=env_plain(), state_dir=tmp_path)
    assert r.returncode == 2 and "'often' is not one of 'require', 'readback', 'skip'" in r.stderr


def test_the_main_help_names_the_global_options(tmp_path):
    text = mcbridge("--help", env=env_plain(COLUMNS="80"), state_dir=tmp_path).stdout
    for word in ("-v (-vv)", "--log-file", "--log-level", "--stats", "--version", "completion"):
        assert word in re.sub(r"\s+", " ", text), word


# -- the audit trail: a line per object at -v, in the log file, as JSON ---------------------------

def test_v_names_every_object_copied_and_deleted_with_size_route_and_retries(make_root, env_for, tmp_path):
    import json
    env = env_for("s3")
    src = tmp_path / "src"
    src.mkdir()
    files = {"a.txt": b"alpha", "b/c.bin": b"x" * 300, "d e.txt": b"spaced"}
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    dst = make_root("s3") + "audit/"
    quiet = mcbridge("cp", f"{src}/", dst, env=env, state_dir=tmp_path / "s0")
    assert quiet.returncode == 0 and not re.search(r"^copied ", quiet.stderr, re.M), quiet.stderr
    r = mcbridge("-v", "cp", f"{src}/", make_root("s3"), env=env, state_dir=tmp_path / "s1")
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("copied ")]
    assert len(lines) == 3, r.stderr
    for rel, data in files.items():
        assert f"copied {rel} ({len(data):,} B, route direct, 0 retries)" in lines, lines

    log = tmp_path / "audit.jsonl"
    (src / "a.txt").unlink()
    r = mcbridge("sync", f"{src}/", dst, "--delete", "--log-file", str(log), "--log-format", "json", "-q",
                 env=env, state_dir=tmp_path / "s0")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    audit = [row for row in rows if row["logger"] == "bridge.audit"]
    assert [(row["event"], row["path"]) for row in audit] == [("deleted", "a.txt")], rows
    assert all({"time", "level", "message"} <= set(row) for row in rows)
    gone = mcbridge("rm", "-r", "-v", dst, env=env, state_dir=tmp_path / "s0")
    assert gone.returncode == 0 and f"deleted {dst}b/c.bin" in gone.stderr.splitlines(), gone.stderr
    bad = mcbridge("ls", str(src), "--log-format", "xml", env=env, state_dir=tmp_path)
    assert bad.returncode == 2 and "text, json" in bad.stderr and bad.stderr.count("\n") == 1


def test_v_names_every_object_cache_warm_filled_or_found_cached(make_root, env_for, tmp_path):
    env = {**env_for("s3"), "MCBRIDGE_CACHE_DIR": str(tmp_path / "cache")}
    root = make_root("s3")
    src = tmp_path / "src"
    src.mkdir()
    for name, size in (("one.bin", 10), ("two.bin", 2000)):
        (src / name).write_bytes(b"w" * size)
    assert mcbridge("cp", f"{src}/", root, "-q", env=env, state_dir=tmp_path).returncode == 0
    quiet = mcbridge("cache", "warm", f"{root}one.bin", env=env, state_dir=tmp_path)
    assert quiet.returncode == 0 and "filled s3://" not in quiet.stderr, quiet.stderr
    r = mcbridge("-v", "cache", "warm", root, "--exclude", "_bridge/**", env=env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = sorted(line for line in r.stderr.splitlines() if line.startswith(("filled ", "cached ")))
    assert lines == [f"cached {root}one.bin (10 B, held already)", f"filled {root}two.bin (2,000 B)"], r.stderr


def test_v_names_every_file_pack_and_unpack_place(make_root, env_for, tmp_path):
    env = env_for("s3")
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    files = {"a.txt": b"alpha", "d/b.bin": b"b" * 3000, "d/c.txt": b"gamma!"}
    for rel, data in files.items():
        (src / rel).write_bytes(data)
    dst = make_root("s3") + "set/"
    quiet = mcbridge("pack", f"{src}/", dst, env=env, state_dir=tmp_path / "s0")
    assert quiet.returncode == 0 and "packed " not in quiet.stderr, quiet.stderr
    r = mcbridge("-v", "pack", f"{src}/", make_root("s3") + "set/", env=env, state_dir=tmp_path / "s1")
    assert r.returncode == 0, r.stderr
    lines = sorted(line for line in r.stderr.splitlines() if line.startswith("packed "))
    assert lines == [f"packed {rel} ({len(data):,} B, into shard-000000.tar)" for rel, data in sorted(files.items())], \
        r.stderr
    r = mcbridge("-v", "unpack", f"{dst}shard.index.json", f"{tmp_path}/out/", env=env, state_dir=tmp_path / "s2")
    assert r.returncode == 0, r.stderr
    lines = sorted(line for line in r.stderr.splitlines() if line.startswith("unpacked "))
    assert lines == [f"unpacked {rel} ({len(data):,} B, from shard-000000.tar)" for rel, data in sorted(files.items())], \
        r.stderr


def test_q_is_accepted_everywhere_and_keeps_the_results(make_root, env_for, tmp_path):
    env = env_for("s3")
    src = tmp_path / "src"
    src.mkdir()
    (src / "one.txt").write_bytes(b"one")
    (src / "two.txt").write_bytes(b"two!")
    dst = make_root("s3") + "q/"
    assert mcbridge("cp", "-q", f"{src}/", dst, env=env, state_dir=tmp_path).returncode == 0
    ls = mcbridge("ls", "-q", "-l", dst, env=env, state_dir=tmp_path)
    assert ls.returncode == 0 and ls.stderr == "", ls.stderr
    assert [line.split()[-1] for line in ls.stdout.splitlines()] == ["one.txt", "two.txt"], "no total line"
    du = mcbridge("du", "-q", "-s", dst, env=env, state_dir=tmp_path)
    assert du.returncode == 0 and du.stdout.split()[:2] == ["7", "2"], du.stdout
    sums = mcbridge("hashsum", "-q", "sha256", dst, env=env, state_dir=tmp_path)
    assert sums.returncode == 0 and len(sums.stdout.splitlines()) == 2, sums.stderr
    same = mcbridge("check", "-q", f"{src}/", dst, env=env, state_dir=tmp_path)
    assert same.returncode == 0 and same.stdout == "" and same.stderr == "", same.stdout
    (src / "three.txt").write_bytes(b"3")
    differ = mcbridge("check", "-q", f"{src}/", dst, env=env, state_dir=tmp_path)
    assert differ.returncode == 1 and "three.txt" in differ.stdout and "FAILED" in differ.stdout
    for command in ("ls", "du", "hashsum", "check"):
        help_text = mcbridge(command, "--help", env=env, state_dir=tmp_path).stdout
        assert "-q" in help_text and "--quiet" in help_text, command


def test_an_object_line_counts_the_retries_its_requests_took(moto, env_for, make_root, tmp_path):
    from tests.faultproxy import FaultProxy, Rule, proxied_environment
    src = tmp_path / "src"
    src.mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):
        (src / name).write_bytes(name.encode() * 4)
    dst = make_root("s3")
    with FaultProxy(moto.endpoint) as proxy:
        proxy.configure(rules=[Rule(r"^PUT /[^?]*/b\.txt", "error", times=1)])
        env = proxied_environment(env_for("s3"), {"s3": proxy})
        r = mcbridge("-v", "cp", f"{src}/", dst, env=env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    assert proxy.counts["error"] == 1
    lines = [line for line in r.stderr.splitlines() if line.startswith("copied ")]
    # three small files go up as one batch: its retry is said on each of its lines, as the batch's
    assert sorted(lines) == [f"copied {name} (20 B, route direct, 1 retry in its batch)"
                             for name in ("a.txt", "b.txt", "c.txt")], r.stderr
    big = tmp_path / "big"
    big.mkdir()
    (big / "one.bin").write_bytes(os.urandom(12 * 2**20))
    (big / "two.bin").write_bytes(os.urandom(12 * 2**20))
    with FaultProxy(moto.endpoint) as proxy:
        proxy.configure(rules=[Rule(r"^PUT /[^?]*/two\.bin\?.*partNumber=2", "error", times=1)])
        env = proxied_environment(env_for("s3"), {"s3": proxy})
        r = mcbridge("-v", "cp", f"{big}/", dst + "big/", "--chunk-size", "5MiB", env=env, state_dir=tmp_path)
    assert r.returncode == 0 and proxy.counts["error"] == 1, r.stderr
    lines = sorted(line for line in r.stderr.splitlines() if line.startswith("copied "))
    # a part's retry waits for the file's last unit and is said on its line, on no other
    assert lines == ["copied one.bin (12,582,912 B, route direct, 0 retries)",
                     "copied two.bin (12,582,912 B, route direct, 1 retry)"], r.stderr
