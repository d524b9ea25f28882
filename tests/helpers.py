"""Small helpers shared by tests: settings from an env dict, running the CLI, building trees."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bridge.config import Settings, load_settings
from bridge.stores import get_store
from bridge.urls import parse

MCBRIDGE = [sys.executable, "-m", "bridge"]
NO_CONFIG = "/nonexistent/mcbridge-test-config"


def settings_for(env: dict[str, str], **transfer) -> Settings:
    env = {k: v for k, v in env.items() if k != "MCBRIDGE_CONFIG"}
    env["XDG_CONFIG_HOME"] = NO_CONFIG  # no user settings file leaks into tests
    return load_settings({"transfer": transfer} if transfer else None, environ=env)


def imported_by(code: str, modules: tuple[str, ...], env: dict[str, str]) -> list[str]:
    """Which of ``modules`` a fresh Python imported running ``code`` with ``env`` (it must succeed):
    how a test shows that a path never loads an SDK."""
    script = f"{code}\nimport sys\nprint(repr(sorted(m for m in {modules!r} if m in sys.modules)))"
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    import ast
    return ast.literal_eval(run.stdout.strip().splitlines()[-1])


def mcbridge(*args: str, env: dict[str, str], state_dir: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    """The CLI run to its end. One still running after ``timeout`` fails the test with where each
    of its processes' threads stood (faulthandler's dump on SIGABRT), not a bare timeout: a hang
    that happens once in several runs is then seen in the run it happened in."""
    env = {k: v for k, v in env.items() if k != "MCBRIDGE_CONFIG"}
    env.update(MCBRIDGE_STATE_DIR=str(state_dir), XDG_CONFIG_HOME=NO_CONFIG,
               AWS_EC2_METADATA_DISABLED="true", NO_GCE_CHECK="true", PYTHONFAULTHANDLER="1")
    with subprocess.Popen([*MCBRIDGE, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            out, err = _dumped(proc)
            raise AssertionError(f"mcbridge {' '.join(args)} still ran after {timeout:g} s; where its "
                                 f"processes stood:\n{err[-30000:]}\nits output:\n{out[-2000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _dumped(proc: subprocess.Popen) -> tuple[str, str]:
    """SIGABRT to a hung CLI and every process it forked (each prints its threads' stacks to the
    shared stderr as it dies), then what they wrote."""
    import signal
    import psutil
    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for member in reversed(family):   # the children first: the parent's death may end them
        try:
            member.send_signal(signal.SIGABRT)
        except psutil.NoSuchProcess:
            pass
    try:
        return proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        for member in family:
            try:
                member.kill()
            except psutil.NoSuchProcess:
                pass
        return proc.communicate()


def journaled_keys(state: Path, prefix: str) -> list[str]:
    """The keys starting with ``prefix`` in the journals of a state dir (SQLite files a running
    or killed job may still hold open: read through SQLite, which reads their WAL too)."""
    import sqlite3
    keys = []
    for path in sorted(state.glob("journal/*.db")):
        db = sqlite3.connect(path)
        try:
            raw = prefix.encode("utf-8", "surrogatepass")   # keys are stored as bytes (bridge.journal.key_bytes)
            keys += [k.decode("utf-8", "surrogatepass") for (k,) in
                     db.execute("SELECT k FROM records WHERE substr(k, 1, ?) = ? ORDER BY k", (len(raw), raw))]
        except sqlite3.OperationalError:
            pass   # created this instant: no table yet
        finally:
            db.close()
    return keys


def make_tree(root: Path) -> dict[str, bytes]:
    """Nested folders, an empty file, non-ASCII names, a few-MB file and small files."""
    files = {
        "empty.txt": b"",
        "a/b/c/deep.txt": b"deep\n",
        "données/ünïcödé 名前.txt": "non-ASCII ✓\n".encode(),
        "big/weights.bin": os.urandom(12 * 1024 * 1024 + 123),
    }
    for i in range(20):
        files[f"small/{i:03d}.json"] = f'{{"i": {i}}}\n'.encode() * (i + 1)
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def read_tree(url: str, settings: Settings) -> dict[str, bytes]:
    root = parse(url).as_prefix()
    store = get_store(root, settings)
    return {rel: store.read(info.location) for rel, info in store.walk(root)}


def small_files_go_in_batches_and_verify(env: dict[str, str], target: str, tmp_path, monkeypatch) -> None:
    """20 small files local -> ``target`` (a store that ``writes_many``): planned in batches of
    8, 8 and 4 (BATCH_FILES set to 8), copied, and verified deep."""
    from bridge.pipeline import execute as executor, plan as planning, verify as verifying
    monkeypatch.setattr(planning, "BATCH_FILES", 8)
    src = tmp_path / "src"
    for i in range(20):
        (src / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 3}" / f"{i}.bin").write_bytes(os.urandom(i * 300))
    settings = settings_for({**env, "MCBRIDGE_STATE_DIR": str(tmp_path / "state")})
    plan = planning.plan_copy(f"{src}/", target, settings)
    assert [len(u["files"]) for u in plan.units()] == [8, 8, 4]
    executor.execute(plan, settings)
    report = verifying.verify(target, settings, deep=True)
    assert report["ok"] and report["checked"] == 20, report


def record(url: str, env: dict[str, str] | None = None) -> dict | None:
    """The record (bridge.manifest) at ``url``, merged as one document: ``files`` (entries in
    path order), ``source``, ``destination``, ``extra`` and ``docs`` (the log's documents, in the
    order they apply); None when nothing was committed there."""
    import json as _json

    from bridge import manifest as manifests
    root = parse(url).as_prefix()
    store = get_store(root, settings_for(env or dict(os.environ)))
    rec = manifests.open_record(store, root)
    if rec is None:
        return None
    return {"files": [e.to_dict() for e in rec.entries()], "source": rec.source, "destination": rec.destination,
            "extra": rec.extra, "docs": [_json.loads(store.read(s.loc)) for s in rec.sources]}


def has_record(url: str, env: dict[str, str] | None = None) -> bool:
    from bridge import manifest as manifests
    root = parse(url).as_prefix()
    return manifests.committed(get_store(root, settings_for(env or dict(os.environ))), root)
