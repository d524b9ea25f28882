"""``--max-cost``: a job estimated above its limit is refused after listing and before any data
request, counted where the requests land: moto logs every request line."""

from __future__ import annotations

import re

import pytest

from tests.emulators import unique_name
from tests.helpers import mcbridge

# An object request: a method on /bucket/key (a listing or bucket call has no key in its path).
_OBJECT_REQUEST = re.compile(r'"(GET|PUT|POST|HEAD|DELETE) /(?P<bucket>[^/?\s]+)/(?P<key>[^?\s]+)')


def object_requests(moto, buckets: set[str], since: int) -> list[str]:
    """Object GET/PUT/POST lines for ``buckets`` in moto's log after byte offset ``since``."""
    text = moto.log_path.read_bytes()[since:].decode(errors="replace")
    out = []
    for line in text.splitlines():
        m = _OBJECT_REQUEST.search(line)
        if m and m["bucket"] in buckets and m.group(1) in ("GET", "PUT", "POST"):
            out.append(line)
    return out


@pytest.fixture
def corpus(moto) -> tuple[str, str]:
    src, dst = unique_name(), unique_name()
    client = moto.client()
    client.create_bucket(Bucket=src)
    client.create_bucket(Bucket=dst)
    for i in range(40):
        client.put_object(Bucket=src, Key=f"train/{i:03d}.bin", Body=bytes([i]) * 2000)
    return src, dst


@pytest.mark.parametrize("command", [
    ["cp"], ["sync"], ["migrate"], ["migrate", "--pack", "tar"],
])
def test_over_budget_sends_no_data_request(command, corpus, moto, emulator_env, tmp_path):
    src, dst = corpus
    mark = moto.log_path.stat().st_size
    r = mcbridge(*command, f"s3://{src}/train/", f"s3://{dst}/copy/", "--max-cost", "0", "-q",
                 env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1, line
    # the estimate with the digits that make it comparable with the limit ($0.0002166, not $0.00)
    assert re.search(r"refused: estimated \$0\.000\d+ \(40 files, .*\) is over --max-cost \$0\.00; nothing was sent",
                     line), line
    assert object_requests(moto, {src, dst}, mark) == []
    assert moto.client().list_objects_v2(Bucket=dst).get("KeyCount", 0) == 0
    if command in (["cp"], ["sync"]):
        assert "route server" in line   # priced as it would run: the store copies between its buckets


def test_within_budget_the_copy_runs_and_its_data_requests_are_seen(corpus, moto, emulator_env, tmp_path):
    # the same count, on a copy allowed to run, sees every GET and PUT: the refusal above is real
    # (direct: between two S3 buckets the server route would send CopyObject instead)
    src, dst = corpus
    mark = moto.log_path.stat().st_size
    r = mcbridge("cp", f"s3://{src}/train/", f"s3://{dst}/copy/", "--max-cost", "5", "-q", "--route", "direct",
                 env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    seen = object_requests(moto, {src, dst}, mark)
    assert sum(1 for s in seen if f"GET /{src}/train/" in s) == 40
    assert sum(1 for s in seen if f"PUT /{dst}/copy/" in s) >= 40


def test_over_budget_is_refused_before_the_job_is_queued(corpus, moto, emulator_env, tmp_path):
    src, dst = corpus
    mark = moto.log_path.stat().st_size
    # no broker answers at this address: the refusal comes first
    r = mcbridge("submit", "cp", f"s3://{src}/train/", f"s3://{dst}/copy/", "--max-cost", "0",
                 "--broker", "redis://127.0.0.1:1/0", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 1
    assert "copy job refused: estimated $" in r.stderr and "over --max-cost $0.00" in r.stderr
    r = mcbridge("submit", "replicate", f"s3://{src}/train/", f"s3://{dst}/a/", f"s3://{dst}/b/", "--max-cost", "0",
                 "--broker", "redis://127.0.0.1:1/0", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 1 and "replicate job refused" in r.stderr and "(80 files" in r.stderr
    assert object_requests(moto, {src, dst}, mark) == []

    # unpack: planned from the shard set's index; the shards themselves are not read
    r = mcbridge("pack", f"s3://{src}/train/", f"s3://{dst}/shards/", "--shard-size", "32KiB", "-q",
                 env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    mark = moto.log_path.stat().st_size
    r = mcbridge("submit", "unpack", f"s3://{dst}/shards/", str(tmp_path / "out") + "/", "--max-cost", "0",
                 "--broker", "redis://127.0.0.1:1/0", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 1 and "unpack job refused: estimated $" in r.stderr and "(40 files" in r.stderr, r.stderr
    assert not [line for line in object_requests(moto, {dst}, mark) if ".tar HTTP" in line]   # the index only
    assert not (tmp_path / "out").exists()


def test_a_negative_limit_is_bad_input(corpus, emulator_env, tmp_path):
    src, dst = corpus
    r = mcbridge("cp", f"s3://{src}/train/", f"s3://{dst}/copy/", "--max-cost", "-1", env=emulator_env,
                 state_dir=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
