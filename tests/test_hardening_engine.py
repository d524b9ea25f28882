"""The transfer engine against what hardening found, over the real stores:

- an object copied onto itself, however spelt, is refused before any request that writes;
- names of up to NAME_MAX bytes (ASCII and multi-byte) round-trip through every store, their
  temporary and partial files included;
- a store that goes away mid-copy stops the job in one line (the job's breaker), not file by file;
- a link to the source is the source: ``cp b/ a/sub/`` with ``b -> a`` is refused as ``cp a/ a/sub/``.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
from pathlib import Path

import pytest
from aiohttp import web

from bridge import retry
from bridge.errors import EndpointUnreachable, StoreDown, TransientError
from bridge.names import NAME_MAX
from bridge.stores import get_store
from bridge.stores.local import LocalStore
from bridge.urls import canonical, parse
from tests.faultproxy import LOOPBACK, FaultProxy, proxied_environment
from tests.helpers import has_record, mcbridge, settings_for
from bridge.pipeline import verify as verifying

SCHEMES = ("local", "s3", "gs", "az")
CLOUDS = ("s3", "gs", "az")


def one_line(r: subprocess.CompletedProcess) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def env_with_state(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    return {**env, "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}


# -- an object onto itself -------------------------------------------------------------------

@pytest.mark.parametrize("scheme", SCHEMES)
def test_an_object_copied_onto_itself_is_refused_and_nothing_changes(scheme, make_root, env_for, tmp_path):
    env = env_for(*(() if scheme == "local" else (scheme,)))
    settings = settings_for(env_with_state(env, tmp_path))
    src = tmp_path / "seed"
    src.mkdir()
    (src / "f").write_bytes(b"the only copy\n" * 100)
    (src / "g").write_bytes(b"another\n")
    root = make_root(scheme) + "p/"
    assert mcbridge("cp", f"{src}/", root, "-q", env=env, state_dir=tmp_path).returncode == 0
    store = get_store(parse(root), settings)
    target = parse(root).join("f")
    before = store.info(target).identity
    listed = sorted(info.location.relative_to(parse(root)) for info in store.list(parse(root)))
    assert any(p.startswith("_bridge/log/c-") for p in listed), listed

    for destination in (root + "f", root):   # the object's own name, and its folder
        r = mcbridge("cp", root + "f", destination, env=env, state_dir=tmp_path)
        assert r.returncode == 2, (destination, r.stdout, r.stderr)
        assert "itself" in one_line(r), r.stderr
    r = mcbridge("sync", root + "f", root + "f", env=env, state_dir=tmp_path)
    assert r.returncode == 2 and "itself" in one_line(r), r.stderr

    # Not rewritten, the folder's manifest not set aside: the earlier copy still verifies.
    assert store.info(target).identity == before
    assert store.read(target) == b"the only copy\n" * 100
    assert sorted(info.location.relative_to(parse(root)) for info in store.list(parse(root))) == listed
    report = verifying.verify(root, settings)
    assert report["ok"] and report["checked"] == 2, report


def test_a_local_file_reached_through_a_link_is_itself(tmp_path):
    folder = tmp_path / "a"
    folder.mkdir()
    (folder / "f").write_bytes(b"data")
    (tmp_path / "b").symlink_to(folder)
    (folder / "also-f").symlink_to(folder / "f")
    for source, destination in ((tmp_path / "b" / "f", folder / "f"), (folder / "also-f", folder / "f"),
                                (folder / "f", f"{tmp_path}/b/./")):
        r = mcbridge("cp", str(source), str(destination), env=dict(os.environ), state_dir=tmp_path / "state")
        assert r.returncode == 2 and "itself" in one_line(r), (source, destination, r.stderr)
    # Nothing written into the source's folder: no _bridge/, no temporary.
    assert sorted(os.listdir(folder)) == ["also-f", "f"]
    assert (folder / "f").read_bytes() == b"data"


def test_an_azure_name_is_compared_with_its_dot_segments_resolved():
    # Azure resolves '.' and '..' in a blob's URL (names.cloud_problem); S3 and GCS keep keys as written.
    assert parse("az://c1c/p/./f").same_as(parse("az://c1c/p/f"))
    assert parse("az://c1c/q/../p/f").same_as(parse("az://c1c/p/f"))
    assert canonical(parse("az://c1c/p/./")) == parse("az://c1c/p/")
    assert not parse("s3://b1b/p/./f").same_as(parse("s3://b1b/p/f"))
    assert not parse("gs://b1b/p/./f").same_as(parse("gs://b1b/p/f"))


# -- a link to the source is the source ---------------------------------------------------------

def test_a_destination_inside_the_source_through_a_link_is_refused(tmp_path):
    a = tmp_path / "a"
    a.mkdir()
    (a / "x.txt").write_bytes(b"x")
    (tmp_path / "b").symlink_to(a)
    (tmp_path / "c").symlink_to(a / "sub", target_is_directory=True)
    env = dict(os.environ)
    for source, destination in ((f"{tmp_path}/b/", f"{a}/sub/"),     # the source is a link to a
                                (f"{a}/", f"{tmp_path}/c/"),          # the destination leads into a
                                (f"{a}/", f"{a}/sub/")):              # the plain form, refused before
        r = mcbridge("cp", source, destination, env=env, state_dir=tmp_path / "state")
        assert r.returncode == 2 and "inside it" in one_line(r), (source, destination, r.stderr)
    assert sorted(os.listdir(a)) == ["x.txt"]


# -- names up to NAME_MAX bytes -----------------------------------------------------------------

def long_names() -> list[str]:
    names = []
    for size in (228, 240, NAME_MAX):
        names.append(f"{size}-".ljust(size, "a"))
        stem = f"{size}-".ljust(size - 2 * ((size - 4) // 2), "b")
        names.append(stem + "é" * ((size - len(stem)) // 2))   # 2 bytes each
        assert len(names[-1].encode()) == size, (size, len(names[-1].encode()))
    kanji = "名" * (NAME_MAX // 3)   # 3 bytes each: 255
    assert len(kanji.encode()) == NAME_MAX
    return [*names, kanji]


def long_tree(root: Path) -> dict[str, bytes]:
    files = {name: os.urandom(100 + i) for i, name in enumerate(long_names())}
    files["deep/" + long_names()[2]] = os.urandom(300)
    files["big/" + "z" * NAME_MAX] = os.urandom(6 * 1024 * 1024 + 17)   # in parts: a partial file
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def local_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and "_bridge" not in p.parts}


@pytest.mark.parametrize("via", ["local", *CLOUDS])
def test_names_of_up_to_name_max_bytes_round_trip(via, make_root, env_for, tmp_path):
    env = env_for(*(() if via == "local" else (via,)))
    src = tmp_path / "src"
    files = long_tree(src)
    middle = make_root(via) + "long/"
    back = tmp_path / "back"
    for source, destination in ((f"{src}/", middle), (middle, f"{back}/")):
        r = mcbridge("cp", source, destination, "--chunk-size", "5MiB", "-q", env=env, state_dir=tmp_path / "state")
        assert r.returncode == 0, (source, destination, r.stderr)
    assert local_tree(back) == files
    settings = settings_for(env_with_state(env, tmp_path))
    for url in (middle, f"{back}/"):
        report = verifying.verify(url, settings, deep=True)
        assert report["ok"] and report["checked"] == len(files), report
    # No temporary or partial file left behind, in either local folder.
    assert not [p for p in back.rglob("*") if ".bridge-" in p.name]


def test_an_unfinished_upload_to_a_long_name_is_listed_under_that_name(tmp_path):
    store = LocalStore(settings_for(dict(os.environ)))
    name = "é" * 127 + "x"
    loc = parse(f"{tmp_path}/{name}")
    upload_id = store.begin_upload(loc, 10)
    store.upload_part(loc, upload_id, 1, 0, b"0123456789", "")
    assert all(len(os.fsencode(n)) <= NAME_MAX for n in os.listdir(tmp_path))
    assert list(store.list_uploads(parse(f"{tmp_path}/"))) == [(loc, upload_id)]
    assert [p.number for p in store.list_parts(loc, upload_id).values()] == [1]
    store.abort_upload(loc, upload_id)
    assert os.listdir(tmp_path) == []


# -- a store that goes away mid-copy ------------------------------------------------------------

class Vanishing(FaultProxy):
    """Forwards the first ``after`` requests, then goes away as a stopped emulator does: it stops
    listening (new connections are refused) and drops every connection still open. Its port
    stays bound, not listening, until the proxy stops: freed, another test's server (the suite
    runs in several processes) could take it, and the job's requests would reach that server
    instead of being refused; one that accepted and never answered held a request for the whole
    read timeout (120 s), past the test's guard."""

    name = "vanishing"

    def __init__(self, upstream: str, after: int):
        super().__init__(upstream)
        self.after = after
        self.gone = False
        self._held_port: socket.socket | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        with self._lock:
            self.counts["seen"] += 1
            vanish = self.counts["seen"] > self.after
        if vanish:
            if not self.gone:
                self.gone = True
                for site in list(self._runner.sites):
                    await site.stop()
                held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # (past its connections' TIME_WAIT)
                held.bind((LOOPBACK, self.port))   # bound, never listening: a connection is refused
                self._held_port = held
            request.transport.abort()
            await asyncio.sleep(0)
            return web.Response(status=503)   # never reaches the client: its connection is gone
        return await super()._handle(request)

    def stop(self) -> None:
        super().stop()
        if self._held_port is not None:
            self._held_port.close()


def small_tree(root: Path, count: int) -> None:
    for i in range(count):
        (root / f"d{i % 5}").mkdir(parents=True, exist_ok=True)
        (root / f"d{i % 5}" / f"{i:04d}.bin").write_bytes(os.urandom(64 + i))


def has_manifest(url: str, env: dict[str, str]) -> bool:
    return has_record(url, env)


# Each stops within WINDOW plus a retry's wait; unbounded (file by file) they ran for minutes.
# The job's read timeout is READ_TIMEOUT here, so that a request an emulator holds unanswered
# (not the vanished endpoint: that one refuses) ends well inside the guard; one the guard still
# catches is a hang, and the failure prints where each process stood (tests/helpers.mcbridge).
# (s3-to-gs once ran into the guard when both were 120 s, in one clean-clone run of several.)
HANG_GUARD = 120
READ_TIMEOUT = 30


@pytest.mark.parametrize("src,dst", [("local", "s3"), ("s3", "gs"), ("local", "az")],
                         ids=["local-to-s3", "s3-to-gs", "local-to-az"])
def test_a_destination_that_goes_away_stops_the_job_in_one_line(src, dst, make_root, emulator_for, env_for, tmp_path):
    env = env_for(*{s for s in (src, dst) if s != "local"})
    tree = tmp_path / "tree"
    small_tree(tree, 300)
    source = f"{tree}/"
    if src != "local":
        source = make_root(src) + "tree/"
        assert mcbridge("cp", f"{tree}/", source, "-q", env=env, state_dir=tmp_path / "seed").returncode == 0
    target = make_root(dst) + "copy/"
    config = tmp_path / "config.yaml"
    config.write_text(f"profiles: {{default: {{transfer: {{read_timeout: {READ_TIMEOUT}}}}}}}\n")
    with Vanishing(emulator_for(dst).endpoint, after=40) as proxy:
        proxied = proxied_environment(env, {dst: proxy})
        r = mcbridge("cp", source, target, "-q", "--config", str(config), env=proxied, state_dir=tmp_path / "state",
                     timeout=HANG_GUARD)
        assert proxy.gone, proxy.counts   # it did go away mid-copy
    line = one_line(r)
    print(f"{src} -> {dst}: {line}")
    assert r.returncode == 1, r.stderr
    assert "stopped: every request to" in line and f"127.0.0.1:{proxy.port}" in line, line
    assert not has_manifest(target, env)   # nothing looks complete


def breaker_at(clock: list[float], **kwargs) -> retry.Breaker:
    return retry.Breaker(window=20, failures=4, clock=lambda: clock[0], **kwargs)


def test_the_breaker_trips_only_on_a_window_of_one_stores_failures_all_alike():
    now = [0.0]
    breaker = breaker_at(now)
    down = EndpointUnreachable("cannot reach the S3 endpoint http://h:1: refused")
    for t in range(0, 19):            # many failures, but younger than the window
        now[0] = t
        breaker.failed("http://h:1", down)
    assert not breaker.tripped.is_set()
    breaker.succeeded("http://h:1")   # one success starts the streak again
    for t in range(19, 40):
        now[0] = t
        breaker.failed("http://h:1", down if t % 2 else TransientError("503"))   # two ways, alternating
        breaker.failed("http://other:2", down)
        breaker.succeeded("http://other:2")   # another store answering does not clear this one's
    assert not breaker.tripped.is_set()
    for _ in range(4):                # then the last four the same way, the streak 20 s old
        breaker.failed("http://h:1/path?sig=secret", down)
    assert breaker.tripped.is_set()
    assert "every request to http://h:1 failed for 20 s" in breaker.reason and "sig" not in breaker.reason
    with pytest.raises(StoreDown):
        breaker.check()


def test_a_tripped_breaker_stops_the_requests_waiting_to_retry():
    now = [0.0]
    breaker = breaker_at(now)
    calls = []

    def down():
        calls.append(1)
        now[0] += 10
        raise EndpointUnreachable("refused")

    with retry.guarding(breaker), pytest.raises(StoreDown):
        retry.call_with_retries(down, 20, where="http://h:1")
    assert breaker.tripped.is_set() and len(calls) == 4   # not 21: it stopped at the trip
    with retry.guarding(breaker), pytest.raises(StoreDown):
        retry.call_with_retries(lambda: "never sent", 5, where="http://h:1")
