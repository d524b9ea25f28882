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
import uuid
from collections import Counter
from pathlib import Path

import pytest

from bridge.workers.testing import ServiceProcess
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


def _contents(moto, bucket: str, prefix: str) -> dict[str, str]:
    client = moto.client()
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(prefix):]
            if not rel.startswith("_bridge/"):
                out[rel] = hashlib.sha256(client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()).hexdigest()
    return out


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
