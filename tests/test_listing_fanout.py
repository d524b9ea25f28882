"""A job's listing fanned out by sub-prefix (workers/executor.py ``_fan_out``, bridge/pipeline/parts.py):
real worker processes on the real Redis, moto over HTTP. The source is listed once at its top
level and then once per sub-prefix, each by a ``bridge.list`` task that any worker may run (moto's
request log shows which prefixes were listed and how often); the job commits once, verified; a
sync deletes what its destination has beyond the source, part by part, and its guard counts the
whole job's deletions before any part's are run. (The same over several hosts, each LIST counted
by its host's address: tests/test_hosts.py.)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import uuid
from collections import Counter

import pytest

from tests.test_workers_service import s3_hashes as _contents
from tests.test_workers_service import service  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(240)

SUBS = [f"d{n}" for n in range(6)]


def _put_tree(moto, bucket: str, prefix: str, files: dict[str, bytes]) -> None:
    client = moto.client()
    for rel, data in files.items():
        client.put_object(Bucket=bucket, Key=prefix + rel, Body=data)


def _tree(per_sub: int = 15, root_files: int = 3) -> dict[str, bytes]:
    files = {f"{sub}/f{i:03d}.bin": os.urandom(512 + i) for sub in SUBS for i in range(per_sub)}
    files.update({f"top{i}.bin": os.urandom(100 + i) for i in range(root_files)})
    return files


def _lists(moto, bucket: str, since: int = 0) -> Counter:
    """The LIST requests moto answered for ``bucket`` from line ``since`` of its log: (prefix,
    delimiter) -> how many."""
    from urllib.parse import parse_qs, urlsplit
    line = re.compile(rf'"GET (/{re.escape(bucket)}/?\?[^ ]*) HTTP/1\.1" 200')
    found: Counter = Counter()
    for m in line.finditer("\n".join(moto.log_path.read_text(errors="replace").splitlines()[since:])):
        query = parse_qs(urlsplit(m[1]).query, keep_blank_values=True)
        if "list-type" in query or "prefix" in query or "delimiter" in query:
            found[(query.get("prefix", [""])[0], query.get("delimiter", [""])[0])] += 1
    return found


def _log_length(moto) -> int:
    return len(moto.log_path.read_text(errors="replace").splitlines())


def _two_workers(service):
    w1 = service.worker("w1", concurrency=1, threads=4)
    w2 = service.worker("w2", concurrency=1, threads=4)
    w1.wait_ready()
    w2.wait_ready()
    return w1, w2


def _bucket(moto) -> str:
    name = f"fan-{uuid.uuid4().hex[:8]}"
    moto.create_bucket(name)
    return name


def test_a_copy_is_listed_by_sub_prefix_on_two_workers_and_commits_once_verified(service, emulator_for):
    moto = emulator_for("s3")
    src_bucket, dst_bucket = _bucket(moto), _bucket(moto)
    files = _tree()
    _put_tree(moto, src_bucket, "corpus/", files)
    _two_workers(service)
    mark = _log_length(moto)
    job_id = service.submit("cp", f"s3://{src_bucket}/corpus/", f"s3://{dst_bucket}/out/")
    record = service.wait(job_id)
    assert record.state == "succeeded", record.errors
    assert record.verify["ok"] and record.verify["checked"] == len(files)
    expected = {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()}
    assert _contents(moto, dst_bucket, "out/") == expected

    raw = service.redis.hgetall(service.keys.job(job_id))
    assert "list_parts" in raw, "\n".join(p.log_tail(60) for p in service.processes)
    parts = json.loads(raw["list_parts"])
    assert len(parts) == 5, parts   # two pool processes: 2 x 2 groups of the 6 folders, and the top level's files
    listed_by = json.loads(raw["listed_by"])
    print(f"parts listed by {listed_by}")
    lists = _lists(moto, src_bucket, mark)
    # the top level once with a delimiter (the split) and once more for its own objects (a part);
    # each folder once, by the part that holds it; the whole prefix never
    assert lists[("corpus/", "/")] == 2, lists
    for sub in SUBS:
        assert lists[(f"corpus/{sub}/", "")] == 1, lists
    assert lists[("corpus/", "")] == 0, lists
    # one manifest, written last
    assert record.manifest and record.manifest.startswith(f"s3://{dst_bucket}/out/")


def test_the_part_holding_the_largest_file_sends_its_tasks_first(service, emulator_for, monkeypatch):
    """The top level's own objects are the last part by index, but one of them is sent in parts:
    its part's tasks go before every folder's, so the long tasks start first (at the end, two
    24 MiB files had run alone on two hosts while the others idled: bench/notes/hosts.md)."""
    moto = emulator_for("s3")
    src_bucket, dst_bucket = _bucket(moto), _bucket(moto)
    files = _tree(per_sub=4, root_files=1)
    files["top-big.bin"] = os.urandom(11 * 1024 * 1024)   # three 5 MiB parts (S3's least)
    _put_tree(moto, src_bucket, "corpus/", files)
    _two_workers(service)
    job_id = service.submit("cp", f"s3://{src_bucket}/corpus/", f"s3://{dst_bucket}/out/", "--chunk-size", "5MiB")
    record = service.wait(job_id)
    assert record.state == "succeeded", record.errors
    assert record.verify["ok"] and record.verify["checked"] == len(files)
    raw = service.redis.hgetall(service.keys.job(job_id))
    parts = [json.loads(text) for _task_id, text, _sig in json.loads(raw["list_parts"])]
    level = next(i for i, part in enumerate(parts) if part["level"])
    assert level == len(parts) - 1, parts   # listed last ...
    lists = json.loads(raw["task_lists"])
    assert len(lists) == len(parts)
    assert f":tasks:{level}:" in lists[0], lists   # ... sent first
    assert [f":tasks:{i}:" in key for i, key in zip(range(len(parts) - 1), lists[1:])] == [True] * (len(parts) - 1)


def _synced(service, moto) -> tuple[str, str, dict[str, bytes]]:
    """A source prefix of six folders and three files of its own, synced once to another bucket."""
    src_bucket, dst_bucket = _bucket(moto), _bucket(moto)
    files = _tree()
    _put_tree(moto, src_bucket, "corpus/", files)
    _two_workers(service)
    first = service.wait(service.submit("sync", f"s3://{src_bucket}/corpus/", f"s3://{dst_bucket}/out/"))
    assert first.state == "succeeded", first.errors
    return src_bucket, dst_bucket, files


def test_a_sync_by_sub_prefix_deletes_what_each_part_finds_gone_and_adds_what_is_new(service, emulator_for):
    moto = emulator_for("s3")
    src_bucket, dst_bucket, files = _synced(service, moto)
    client = moto.client()
    gone = ["d1/f000.bin", "d1/f007.bin", "d4/f003.bin", "top1.bin"] + [f"d5/f{i:03d}.bin" for i in range(15)]
    for rel in gone:   # a folder emptied whole (d5): at the destination only
        client.delete_object(Bucket=src_bucket, Key="corpus/" + rel)
        files.pop(rel)
    new = {"d0/new.bin": os.urandom(700), "d6/a.bin": os.urandom(800), "d6/b.bin": os.urandom(900),
           "top9.bin": os.urandom(10), "d2/f004.bin": os.urandom(999)}   # a new folder, a changed file
    _put_tree(moto, src_bucket, "corpus/", new)
    files.update(new)
    job_id = service.submit("sync", f"s3://{src_bucket}/corpus/", f"s3://{dst_bucket}/out/", "--delete")
    record = service.wait(job_id)
    assert record.state == "succeeded", record.errors
    raw = service.redis.hgetall(service.keys.job(job_id))
    assert len(json.loads(raw["list_parts"])) >= 3
    assert json.loads(raw["plan"])["deleting"] == len(gone)
    assert record.verify["ok"] and record.verify["extra"] == 0 and record.verify["checked"] == len(files)
    assert _contents(moto, dst_bucket, "out/") == {rel: hashlib.sha256(d).hexdigest() for rel, d in files.items()}


def test_a_sync_by_sub_prefix_is_refused_by_its_whole_jobs_deletions_before_anything_moves(service, emulator_for):
    """--max-delete 3, two objects gone from each of three folders: no part deletes more than
    three, the job six; refused before any copy or deletion."""
    moto = emulator_for("s3")
    src_bucket, dst_bucket, files = _synced(service, moto)
    client = moto.client()
    for sub in ("d0", "d2", "d4"):
        for i in (1, 2):
            client.delete_object(Bucket=src_bucket, Key=f"corpus/{sub}/f{i:03d}.bin")
    _put_tree(moto, src_bucket, "corpus/", {"d3/new.bin": b"new"})
    before = _contents(moto, dst_bucket, "out/")
    mark = _log_length(moto)
    job_id = service.submit("sync", f"s3://{src_bucket}/corpus/", f"s3://{dst_bucket}/out/", "--delete",
                            "--max-delete", "3")
    record = service.wait(job_id)
    assert record.state == "failed"
    assert any("sync would delete 6 objects" in e and "--max-delete 3" in e for e in record.errors), record.errors
    assert _contents(moto, dst_bucket, "out/") == before
    raw = service.redis.hgetall(service.keys.job(job_id))
    parts = service.redis.hgetall(service.keys.job(job_id, "parts"))
    assert len(parts) == len(json.loads(raw["list_parts"])) >= 3
    assert max(json.loads(p)["deletions"] for p in parts.values()) <= 3   # each part alone would pass
    written = [line for line in moto.log_path.read_text(errors="replace").splitlines()[mark:]
               if f"/{dst_bucket}/" in line and ('"PUT ' in line or '"DELETE ' in line or '"POST ' in line)]
    assert written == [], written[:5]


def test_a_listing_part_whose_worker_dies_is_listed_again_elsewhere(service, emulator_for):
    """The LIST of one folder held at a proxy until its worker is killed: its part's lease lapses,
    the sweeper queues the part again, the other worker lists it, and the job commits once."""
    from tests.faultproxy import FaultProxy, Rule, proxied_environment
    moto = emulator_for("s3")
    src_bucket, dst_bucket = _bucket(moto), _bucket(moto)
    files = _tree()
    _put_tree(moto, src_bucket, "corpus/", files)
    with FaultProxy(moto.endpoint) as proxy:
        proxy.configure(rules=[Rule(rf"GET /{src_bucket}/?\?.*prefix=corpus(%2F|/)d3(%2F|/)", "hold")])
        service.env.update(proxied_environment(service.env, {"s3": proxy}))
        w1, w2 = _two_workers(service)
        job_id = service.submit("cp", f"s3://{src_bucket}/corpus/", f"s3://{dst_bucket}/out/")

        def holder():
            if not proxy.counts["hold"]:
                return None
            for task_id, raw in service.redis.hgetall(service.keys.running).items():
                ref = json.loads(raw)
                if ref["task"] == "bridge.list" and '"d3/"' in ref["args"][2]:
                    return task_id, ref["worker"]
            return None
        found = None
        for _ in range(600):
            found = holder()
            if found:
                break
            time.sleep(0.05)
        assert found, "no worker listed d3/"
        task_id, worker = found
        victim, survivor = (w1, w2) if worker == w1.hostname else (w2, w1)
        victim.kill()
        record = service.wait(job_id)
        assert record.state == "succeeded", record.errors
        assert record.verify["ok"] and record.verify["checked"] == len(files)
        index = task_id.rsplit(".l", 1)[1]
        part = json.loads(service.redis.hget(service.keys.job(job_id, "parts"), index))
        assert part["worker"] == survivor.hostname
        assert int(service.redis.hget(service.keys.job(job_id, "attempts"), task_id)) == 2
        lists = _lists(moto, src_bucket)
        assert lists[("corpus/d3/", "")] == 1, lists   # the held one never reached moto
        assert record.counters.get("requeued", 0) >= 1
        proxy.release()
    expected = {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()}
    assert _contents(moto, dst_bucket, "out/") == expected


# -- the split itself, on a local folder (no service) ----------------------------------------------

def test_parts_group_folders_in_name_order_and_their_plans_add_up_to_the_whole(tmp_path):
    from bridge.pipeline import parts as splitting
    from bridge.pipeline.plan import plan_copy
    from bridge.stores import get_store
    from bridge.urls import parse
    from tests.helpers import settings_for
    src = tmp_path / "src"
    names = ["a", "a-b", "a.c", "b", "z", "\u00e9t\u00e9"]
    for name in names:
        for i in range(3):
            (src / name / "deep").mkdir(parents=True, exist_ok=True)
            (src / name / f"f{i}").write_bytes(b"x" * i)
            (src / name / "deep" / f"g{i}").write_bytes(b"y")
    (src / "top").write_bytes(b"t")
    (src / "_bridge").mkdir()
    (src / "_bridge" / "log").write_bytes(b"not data")
    settings = settings_for(dict(os.environ))
    root = parse(f"{src}/")
    subs, objects, reserved = splitting.top_level(get_store(root, settings), root)
    assert subs == {f"{n}/" for n in names} and objects == 1 and reserved
    assert splitting.top_level(get_store(root, settings), root, limit=0) is None   # flat enough: not split
    parts = splitting.split(subs, bool(objects), 4)
    assert [p.subs for p in parts[:-1]] == [("a-b/", "a.c/"), ("a/", "b/"), ("z/",), ("\u00e9t\u00e9/",)]
    assert parts[-1].level and not parts[-1].subs
    whole = plan_copy(f"{src}/", f"{tmp_path}/dst/", settings)
    pieces = [plan_copy(f"{src}/", f"{tmp_path}/dst/", settings, part=p) for p in parts]
    assert {p.key for p in pieces} == {whole.key}
    assert sorted(f.rel for p in pieces for f in p.files) == sorted(f.rel for f in whole.files)
    for p, planned in zip(parts, pieces):
        rels = [f.rel for f in planned.files]
        assert rels == sorted(rels) and all(p.holds(rel) for rel in rels)


def test_a_part_names_only_top_level_folders():
    from bridge.pipeline.parts import Part
    for bad in (["../"], ["a/b/"], ["/"], ["a"], ["./"]):
        with pytest.raises(ValueError):
            Part.from_dict({"subs": bad})
    assert Part.from_dict({"subs": ["b/", "a/"], "level": False}).subs == ("a/", "b/")


def test_a_job_cancelled_while_its_parts_are_listed_ends_cancelled_with_nothing_sent(service, emulator_for):
    """One folder's LIST held at a proxy, the job cancelled: the parts record the cancel, the last
    one ends the job (cancelled, its end announced), and no transfer was ever sent."""
    from tests.faultproxy import FaultProxy, Rule, proxied_environment
    moto = emulator_for("s3")
    src_bucket, dst_bucket = _bucket(moto), _bucket(moto)
    _put_tree(moto, src_bucket, "corpus/", _tree())
    with FaultProxy(moto.endpoint) as proxy:
        proxy.configure(rules=[Rule(rf"GET /{src_bucket}/?\?.*prefix=corpus(%2F|/)d2(%2F|/)", "hold")])
        service.env.update(proxied_environment(service.env, {"s3": proxy}))
        _two_workers(service)
        job_id = service.submit("cp", f"s3://{src_bucket}/corpus/", f"s3://{dst_bucket}/out/")
        deadline = time.monotonic() + 120
        while not proxy.counts["hold"]:
            assert time.monotonic() < deadline, "no part listed d2/"
            time.sleep(0.05)
        cancel = service.cli("jobs", "cancel", job_id)
        proxy.release()
        record = service.wait(job_id)
        assert cancel.returncode == 0, cancel.stderr
    assert record.state == "cancelled"
    assert service.redis.hget(service.keys.job(job_id), "finished")
    assert not service.redis.hexists(service.keys.job(job_id), "plan")   # never dispatched
    assert _contents(moto, dst_bucket, "out/") == {}
