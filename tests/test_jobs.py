"""The one job model: a plan tells, before anything runs, what it will read, write and send at
each store (``usage``, shown by ``--dry-run --json``), and the run then sends that."""

from __future__ import annotations

import json
import os
import re
from collections import Counter

from bridge.urls import parse
from tests.helpers import mcbridge

MiB = 1024 * 1024


def _moto_requests(moto, bucket: str) -> Counter:
    """Requests moto answered for the data objects of ``bucket`` (not bridge's _bridge/ files), by
    bridge's request kinds."""
    line = re.compile(rf'"(?P<verb>[A-Z]+) /{re.escape(bucket)}/(?P<key>[^ ?]+)(?P<query>\?[^ ]*)? HTTP/1\.1" 20')
    seen = Counter()
    for m in line.finditer(moto.log_path.read_text(errors="replace")):
        if m["key"].startswith("_bridge/"):
            continue
        query = m["query"] or ""
        kind = {"PUT": "PART" if "partNumber=" in query else "PUT",
                "POST": "BEGIN" if "uploads" in query and "uploadId" not in query else "COMPLETE"}.get(m["verb"])
        if kind:
            seen[kind] += 1
    return seen


def test_a_copy_plan_tells_what_it_will_send_before_anything_runs_and_the_copy_sends_that(
        moto, make_root, emulator_env, tmp_path):
    src = tmp_path / "src"
    (src / "ckpt").mkdir(parents=True)
    (src / "ckpt/model.bin").write_bytes(os.urandom(12 * MiB + 3))
    for i in range(5):
        (src / f"small-{i}.txt").write_bytes(os.urandom(100 + i))
    total = 12 * MiB + 3 + sum(100 + i for i in range(5))
    dst = make_root("s3")
    bucket = parse(dst).bucket
    state = tmp_path / "state"

    r = mcbridge("cp", f"{src}/", dst, "--chunk-size", "5MiB", "--dry-run", "--json", env=emulator_env,
                 state_dir=state)
    assert r.returncode == 0, r.stderr
    usage = json.loads(r.stdout)["usage"]
    assert not moto.client().list_objects_v2(Bucket=bucket).get("Contents"), "a dry run wrote something"
    assert usage["source"]["bytes_read"] == usage["destination"]["bytes_written"] == total
    planned = usage["destination"]["requests"]
    assert (planned["PART"], planned["BEGIN"], planned["COMPLETE"]) == (3, 1, 1)

    r = mcbridge("cp", f"{src}/", dst, "--chunk-size", "5MiB", "--json", env=emulator_env, state_dir=state)
    assert r.returncode == 0, r.stderr
    sent = _moto_requests(moto, bucket)
    # the plan's PUTs are the data objects and the manifest (which _moto_requests leaves out)
    assert sent == Counter(PART=planned["PART"], BEGIN=planned["BEGIN"], COMPLETE=planned["COMPLETE"],
                           PUT=planned["PUT"] - 1), (sent, planned)


def test_pack_and_unpack_plans_tell_their_bytes_before_anything_runs(tmp_path):
    src, shards, out = tmp_path / "src", tmp_path / "shards", tmp_path / "out"
    sizes = {f"s/{i:03d}.bin": 3000 + 517 * i for i in range(40)}
    for rel, size in sizes.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(os.urandom(size))
    env, state = dict(os.environ), tmp_path / "state"

    r = mcbridge("pack", f"{src}/", f"{shards}/", "--shard-size", "40KiB", "--dry-run", "--json", env=env,
                 state_dir=state)
    assert r.returncode == 0, r.stderr
    packing = json.loads(r.stdout)
    assert not shards.exists(), "a dry run wrote something"
    assert packing["usage"]["source"]["bytes_read"] == sum(sizes.values())
    r = mcbridge("pack", f"{src}/", f"{shards}/", "--shard-size", "40KiB", "--json", env=env, state_dir=state)
    assert r.returncode == 0, r.stderr
    written = sum(p.stat().st_size for p in shards.glob("*.tar"))
    assert packing["usage"]["destination"]["bytes_written"] == written
    assert packing["usage"]["destination"]["requests"]["PUT"] >= packing["shards"] > 1

    r = mcbridge("unpack", f"{shards}/", f"{out}/", "--dry-run", "--json", env=env, state_dir=state)
    assert r.returncode == 0, r.stderr
    unpacking = json.loads(r.stdout)
    assert not out.exists(), "a dry run wrote something"
    usage = unpacking["usage"]
    assert usage["source"]["bytes_read"] == written
    assert usage["destination"]["bytes_written"] == sum(sizes.values())
    assert usage["destination"]["requests"]["PUT"] == len(sizes) + 1   # every file, and the manifest
    r = mcbridge("unpack", f"{shards}/", f"{out}/", "--json", env=env, state_dir=state)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["bytes"] == usage["destination"]["bytes_written"]


def test_a_unit_with_several_slots_runs_alone_and_in_its_turn():
    """ThreadExecutor: a unit taking the whole concurrency ("slots", a batch with its own
    connections) starts only when nothing else runs, and nothing starts beside it."""
    import threading
    import time
    from bridge import jobs
    from bridge.progress import Progress

    class Ctx(jobs.Context):
        def __init__(self):
            self.progress = Progress()
            self.lock = threading.Lock()
            self.running: set[str] = set()
            self.beside: dict[str, set[str]] = {}
            self.order: list[str] = []
            self.paired = threading.Event()

        def work(self, unit):
            name = unit["name"]
            with self.lock:
                self.order.append(name)
                self.beside[name] = set(self.running)
                for other in self.running:
                    self.beside[other].add(name)
                self.running.add(name)
                if len(self.running) >= 2:
                    self.paired.set()
            # The first small units wait for a second one to run beside them, so that the overlap
            # asserted below does not depend on timing (the deadline only ends a run without any).
            if name.startswith("a") and not self.paired.wait(20):
                self.paired.set()
            time.sleep(0.02)   # the unit's work: long enough for a wrongly started unit to show beside it
            with self.lock:
                self.running.discard(name)
            return {}

        ops = {"x": work, "finalize": lambda self, unit: {}}

    units = ([{"op": "x", "name": f"a{i}"} for i in range(6)] + [{"op": "x", "name": "heavy", "slots": 4}]
             + [{"op": "x", "name": f"b{i}"} for i in range(6)])
    ctx = Ctx()
    outcome = jobs.ThreadExecutor(4).run(ctx, units, None)
    assert outcome.ok
    assert ctx.beside["heavy"] == set()
    assert ctx.order.index("heavy") == 6   # in its turn: nothing after it started before it
    assert max(len(v) for k, v in ctx.beside.items() if k != "heavy") >= 1   # the others overlap
