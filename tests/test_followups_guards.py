"""Guards on mass deletion in the service, and the dry run of rm -r of a bucket root: real Redis,
real worker processes, moto over HTTP.

``submit sync --delete`` and ``submit replicate --delete`` carry ``--max-delete``/``--force`` in
the signed job spec; the worker that plans the job applies bridge/guards.py's guard to the
deletions it planned, before any task is sent: a refused job fails with the guard's one line and
nothing at the destination changes. A mirror replication policy's ``max_delete`` reaches each of
its checkpoint syncs the same way."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from bridge.policies.replication import PolicyError, parse
from bridge.urls import parse as parse_url
from tests.emulators import unique_name
from tests.helpers import mcbridge
from tests.test_service_policies import Clock, _beat, _put_checkpoint, _run
from tests.test_workers_service import service  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(300)
EXTRA = 20


def _keys(moto, bucket: str, prefix: str = "") -> list[str]:
    pages = moto.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def _data(keys: list[str]) -> list[str]:
    return [k for k in keys if "/_bridge/" not in k]


def policy_places(moto, tmp_path, destinations: int, lines: str) -> tuple[str, list[str], Path]:
    """A source bucket holding the committed checkpoint ``step-1``, ``destinations`` buckets, and
    a policy file ``golden`` between them with ``lines`` (YAML, indented 4) besides."""
    src = unique_name()
    moto.create_bucket(src)
    _put_checkpoint(moto, src, "step-1")
    dsts = []
    for _ in range(destinations):
        bucket = unique_name()
        moto.create_bucket(bucket)
        dsts.append(f"s3://{bucket}/dr/")
    policy_file = tmp_path / "policies.yaml"
    policy_file.write_text(f"policies:\n  golden:\n    source: s3://{src}/golden/\n    destinations: [{', '.join(dsts)}]\n"
                           f"    checkpoints: \"step-*\"\n{lines}")
    return src, dsts, policy_file


def first_run(service, policy_file: Path):
    """beat's scheduler for the policy file (due daily at 02:00) and its first run, ended:
    (scheduler, clock, run)."""
    clock = Clock(datetime(2026, 3, 1, 1, 59, tzinfo=timezone.utc))
    beat = _beat(service.env, policy_file, clock)
    beat.schedule["mcbridge-policy:golden"].last_run_at = datetime(2026, 2, 28, 2, 0, 30, tzinfo=timezone.utc)
    beat.tick()
    return beat, clock, _run(service, beat, clock, datetime(2026, 3, 1, 2, 0, 5, tzinfo=timezone.utc))


def _submit(service, *args: str) -> dict:
    result = service.cli("submit", *args, "--wait", "--json")
    assert result.stdout, result.stderr
    return json.loads(result.stdout)


def test_submit_sync_and_replicate_delete_are_guarded_by_the_worker(service, moto, make_root, tmp_path):  # noqa: F811
    src = tmp_path / "src"
    src.mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):
        (src / name).write_bytes(name.encode() * 10)
    dst, other = make_root("s3") + "mirror/", make_root("s3") + "mirror/"
    bucket, other_bucket = parse_url(dst).bucket, parse_url(other).bucket
    service.worker("w1", concurrency=2).wait_ready()
    first = _submit(service, "replicate", f"{src}/", dst, other)
    assert first["state"] == "succeeded", first
    for b in (bucket, other_bucket):   # another team's objects beside the three: the source looks wrong
        for i in range(EXTRA):
            moto.client().put_object(Bucket=b, Key=f"mirror/old/{i:03d}.bin", Body=b"x")
    before = {b: _keys(moto, b, "mirror/") for b in (bucket, other_bucket)}
    assert len(_data(before[bucket])) == EXTRA + 3

    # flags checked where they are given, on one line
    alone = service.cli("submit", "sync", f"{src}/", dst, "--max-delete", "5")
    assert alone.returncode == 2 and alone.stderr.count("\n") == 1 and "give --delete too" in alone.stderr, alone.stderr
    # carried in the job's spec (the signature covers the spec)
    dry = json.loads(service.cli("submit", "sync", f"{src}/", dst, "--delete", "--max-delete", "5", "--dry-run",
                                 "--json").stdout)
    assert dry["spec"]["max_delete"] == 5 and "force_delete" not in dry["spec"]

    # the share rule: 20 of the 23 objects there
    refused = _submit(service, "sync", f"{src}/", dst, "--delete")
    assert refused["state"] == "failed", refused
    assert refused["errors"] == [f"sync would delete {EXTRA} of the {EXTRA + 3} objects at {dst} (over 50%): nothing "
                                 f"copied or deleted; check the source, or give --force (or --max-delete {EXTRA}) "
                                 f"to delete them"], refused["errors"]
    # --max-delete below the count
    low = _submit(service, "sync", f"{src}/", dst, "--delete", "--max-delete", str(EXTRA - 1))
    assert low["state"] == "failed" and f"more than --max-delete {EXTRA - 1}" in low["errors"][0], low
    # replicate: each destination's sync refused alike
    rep = _submit(service, "replicate", f"{src}/", dst, other, "--delete")
    assert rep["state"] == "failed", rep
    children = [service.jobs.get(c["id"]) for c in rep["children"]]
    assert {c.state for c in children} == {"failed"}
    assert all(c.errors[0].startswith(f"sync would delete {EXTRA} of the {EXTRA + 3} objects at ") for c in children)
    assert {b: _keys(moto, b, "mirror/") for b in (bucket, other_bucket)} == before, "nothing deleted or written"

    # allowed: by a --max-delete that covers the count, and by --force
    allowed = _submit(service, "sync", f"{src}/", dst, "--delete", "--max-delete", str(EXTRA))
    assert allowed["state"] == "succeeded", allowed
    forced = _submit(service, "replicate", f"{src}/", other, "--delete", "--force")
    assert forced["state"] == "succeeded", forced
    for b in (bucket, other_bucket):
        assert _data(_keys(moto, b, "mirror/")) == ["mirror/a.txt", "mirror/b.txt", "mirror/c.txt"]


def test_a_mirror_policys_max_delete_refuses_a_checkpoint_sync_deleting_more(service, moto, tmp_path):  # noqa: F811
    _src, [dst], policy_file = policy_places(moto, tmp_path, 1, "    mode: mirror\n    max_delete: 2\n"
                                                                "    schedule: {cron: \"0 2 * * *\"}\n")
    dst_bucket = parse_url(dst).bucket
    service.worker("w1").wait_ready()
    beat, clock, first = first_run(service, policy_file)
    assert first.state == "succeeded", first.errors
    for i in range(3):   # three objects the source never had, in the checkpoint's folder
        moto.client().put_object(Bucket=dst_bucket, Key=f"dr/step-1/stray-{i}.bin", Body=b"x")
    before = _keys(moto, dst_bucket)
    second = _run(service, beat, clock, datetime(2026, 3, 2, 2, 0, 5, tzinfo=timezone.utc))
    assert second.state == "failed", second
    [child] = [service.jobs.get(c) for c in second.children]
    assert child.state == "failed" and child.errors == [
        f"sync would delete 3 objects at {dst}step-1/, more than --max-delete 2: nothing copied or deleted "
        f"(raise --max-delete to allow it)"], child.errors
    assert _keys(moto, dst_bucket) == before, "nothing deleted"

    # raised to cover them: the next run deletes them
    policy_file.write_text(policy_file.read_text().replace("max_delete: 2", "max_delete: 3"))
    beat = _beat(service.env, policy_file, clock)
    beat.schedule["mcbridge-policy:golden"].last_run_at = datetime(2026, 3, 2, 2, 0, 30, tzinfo=timezone.utc)
    third = _run(service, beat, clock, datetime(2026, 3, 3, 2, 0, 5, tzinfo=timezone.utc))
    assert third.state == "succeeded", third.errors
    assert not [k for k in _keys(moto, dst_bucket) if "stray-" in k]


def test_a_policy_file_refuses_max_delete_without_mirror_on_one_line():
    text = ("policies:\n  golden:\n    source: s3://src-bucket/golden/\n    destinations: [s3://dst-bucket/dr/]\n"
            "    max_delete: 10\n")
    with pytest.raises(PolicyError) as refused:
        parse(text)
    assert refused.value.problems == ["policies.yaml:5: policies.golden.max_delete: max_delete limits what mode mirror "
                                      "deletes; mode append-only deletes nothing (set mode: mirror, or leave "
                                      "max_delete out)"]
    assert parse(text.replace("    max_delete", "    mode: mirror\n    max_delete"))[0].policy.max_delete == 10


def test_rm_r_dry_run_of_a_bucket_root_says_a_run_would_be_refused(make_root, env_for, moto, tmp_path):
    env = env_for("s3")
    root = make_root("s3")
    (tmp_path / "f").write_bytes(b"data")
    assert mcbridge("cp", str(tmp_path / "f"), root + "team/f", env=env, state_dir=tmp_path).returncode == 0
    dry = mcbridge("rm", "-r", "--dry-run", root, env=env, state_dir=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert f"would remove {root}team/f" in dry.stdout
    assert (f"a run would be refused: rm -r of the whole bucket {root} would delete everything in it: nothing done; "
            f"give --force if that is what you mean") in dry.stdout, dry.stdout
    as_json = json.loads(mcbridge("rm", "-r", "--dry-run", "--json", root, env=env, state_dir=tmp_path).stdout)
    assert "--force" in as_json["refused"]
    forced = mcbridge("rm", "-r", "--dry-run", "--force", root, env=env, state_dir=tmp_path)
    assert forced.returncode == 0 and "refused" not in forced.stdout, forced.stdout
    below = mcbridge("rm", "-r", "--dry-run", root + "team/", env=env, state_dir=tmp_path)
    assert below.returncode == 0 and "refused" not in below.stdout, below.stdout   # a prefix is no guarded place
    assert "team/f" in _keys(moto, parse_url(root).bucket), "a dry run removes nothing"


def test_a_mirror_policys_max_delete_holds_in_process_too(moto, env_for, tmp_path):
    """replicate --policy --once (the CLI's own process) plans through the same guard."""
    env = env_for("s3")
    _src, [dst], policy_file = policy_places(moto, tmp_path, 1, "    mode: mirror\n    max_delete: 2\n")
    dst_bucket = parse_url(dst).bucket
    first = mcbridge("replicate", "--policy", str(policy_file), "--once", env=env, state_dir=tmp_path)
    assert first.returncode == 0, first.stderr
    for i in range(3):
        moto.client().put_object(Bucket=dst_bucket, Key=f"dr/step-1/stray-{i}.bin", Body=b"x")
    before = _keys(moto, dst_bucket)
    second = mcbridge("replicate", "--policy", str(policy_file), "--once", env=env, state_dir=tmp_path)
    assert second.returncode != 0
    assert (f"sync would delete 3 objects at {dst}step-1/, more than --max-delete 2: nothing copied or deleted"
            in second.stdout + second.stderr), second.stdout + second.stderr
    assert _keys(moto, dst_bucket) == before, "nothing deleted"
