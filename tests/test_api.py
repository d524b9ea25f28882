"""bridge from Python (bridge/api.py): copy, sync, verify, check and replicate against the
emulators return typed results; failures raise bridge.errors classes that carry the CLI's exit
codes; progress reaches a callback in order and ends at the total."""

from __future__ import annotations

import dataclasses
import os

import pytest

import bridge
from bridge import api
from bridge.errors import (BadURL, BridgeError, CheckFailed, InvalidOption, ObjectNotFound, ReplicationFailed,
                           TreesDiffer, UsageError, VerifyFailed)
from bridge.stores import get_store
from bridge.urls import parse
from tests import dcpfake
from tests.helpers import has_record, imported_by, mcbridge, settings_for

BIG = 6 * 1024 * 1024 + 321   # two parts of 5 MiB: progress reports more than once for it


def _tree(root, files: dict[str, bytes]) -> str:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return f"{root}/"


@pytest.fixture
def files() -> dict[str, bytes]:
    return {"weights/big.bin": os.urandom(BIG), "config.json": b'{"step": 7}', "tok/vocab.txt": b"a\nb\nc\n"}


@pytest.mark.parametrize("scheme", ["s3", "gs", "az"])
def test_copy_sync_verify_check_return_typed_results(scheme, files, make_root, env_for, tmp_path):
    env = {**env_for(scheme), "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}
    settings = settings_for(env, chunk_size=5 * 1024 * 1024)
    src = _tree(tmp_path / "src", files)
    dst = make_root(scheme) + "run7/"
    seen: list[api.Snapshot] = []

    done = bridge.copy(src, dst, settings=settings, progress=seen.append)
    assert isinstance(done, api.CopyResult)
    assert (done.files, done.bytes, done.bytes_skipped) == (3, sum(map(len, files.values())), 0)
    assert done.route.name == "direct" and done.route.bytes_through_bridge == done.bytes
    assert done.spend_usd is None or done.spend_usd >= 0   # priced when read
    record = parse(done.record)
    assert done.record.startswith(dst) and get_store(record, settings).info(record).size > 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        done.files = 0   # type: ignore[misc]
    copying = [s for s in seen if s.phase == "copying"]
    assert [s.bytes_done for s in copying] == sorted(s.bytes_done for s in copying)
    assert len({s.bytes_done for s in copying}) > 2   # parts reported as they landed, not once at the end
    assert seen[-1].bytes_done == seen[-1].bytes_total == done.bytes and seen[-1].files_done == 3

    (tmp_path / "src" / "config.json").write_bytes(b'{"step": 8}')
    (tmp_path / "src" / "tok" / "vocab.txt").unlink()
    synced = bridge.sync(src, dst, settings=settings, delete=True)
    assert isinstance(synced, api.SyncResult)
    assert list(synced.sent) == ["config.json"] and list(synced.deleted) == ["tok/vocab.txt"]
    assert synced.reasons["changed"] == 1 and synced.reasons["unchanged"] == 1
    assert synced.record.startswith(dst)

    proven = bridge.verify(dst, settings=settings)
    assert isinstance(proven, api.VerifyResult) and proven.ok
    assert (proven.checked, proven.bytes, proven.missing, proven.mismatched) == (2, BIG + 11, (), ())
    same = bridge.check(src, dst, settings=settings, download=True)   # Azure keeps no checksum of a block blob
    assert isinstance(same, api.CheckResult) and same.ok and (same.checked, same.equal) == (2, 2)


def test_a_failing_verify_and_check_raise_their_classes_with_the_result(files, make_root, env_for, moto, tmp_path):
    env = {**env_for("s3"), "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}
    settings = settings_for(env)
    src = _tree(tmp_path / "src", {k: v for k, v in files.items() if k != "weights/big.bin"})
    dst = make_root("s3")
    bridge.copy(src, dst, settings=settings)
    moto.client().put_object(Bucket=parse(dst).bucket, Key="config.json", Body=b"not the bytes that were copied")

    with pytest.raises(VerifyFailed) as failed:
        bridge.verify(dst, settings=settings)
    assert isinstance(failed.value, CheckFailed) and failed.value.exit_code == 1
    assert failed.value.result.mismatched == ("config.json",) and not failed.value.result.ok
    assert "1 mismatched" in str(failed.value) and "\n" not in str(failed.value)
    r = mcbridge("verify", dst, env=env, state_dir=tmp_path / "state")
    assert r.returncode == VerifyFailed.exit_code and "mismatched  config.json" in r.stdout, r.stderr

    with pytest.raises(TreesDiffer) as differ:
        bridge.check(src, dst, settings=settings)
    assert differ.value.exit_code == 1 and differ.value.result.differ == ("config.json",)


def test_replicate_returns_each_policy_and_raises_when_copies_are_short(make_root, env_for, tmp_path):
    env = {**env_for("s3"), "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}
    settings = settings_for(env)
    source = tmp_path / "golden"
    shards = {"shard-0.bin": b"0" * 3000, "shard-1.bin": b"1" * 2000}
    _tree(source / "step-10", {**shards, ".metadata": dcpfake.metadata({k: [len(v)] for k, v in shards.items()})})
    dst = make_root("s3") + "dr/"
    policy = tmp_path / "p.yaml"
    policy.write_text(f"policies:\n  golden:\n    source: {source}/\n    destinations: [{dst}]\n"
                      f"    checkpoints: 'step-*'\n    keep_last: 1\n")

    done = bridge.replicate(policy, settings=settings)
    assert isinstance(done, api.ReplicateResult) and done.ok
    [run] = done.policies
    assert (run.policy, run.checkpoints, run.verified_copies) == ("golden", ("step-10",), 1)
    assert run.verified == {dst: ("step-10",)} and has_record(f"{dst}step-10/", env)

    short = tmp_path / "short.yaml"
    short.write_text(policy.read_text().replace(f"[{dst}]", f"[{dst}, s3://no-such-bucket-{os.getpid()}/dr/]")
                     )
    with pytest.raises(ReplicationFailed) as failed:
        bridge.replicate(short, settings=settings)
    assert failed.value.exit_code == 1 and not failed.value.result.ok
    assert failed.value.result.policies[0].verified_copies == 1


def test_bad_input_raises_one_usage_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MCBRIDGE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config"))
    monkeypatch.delenv("MCBRIDGE_CONFIG", raising=False)
    src = _tree(tmp_path / "src", {"a.txt": b"a"})
    out = f"{tmp_path}/out/"
    cases = [
        (dict(dst="foo://bucket/key"), BadURL, "unknown scheme 'foo'"),
        (dict(chunk_size="0"), InvalidOption, "--chunk-size '0' must be at least 1 byte"),
        (dict(chunk_size="5XB"), InvalidOption, "invalid size"),
        (dict(concurrency=0), InvalidOption, "concurrency"),
        (dict(store_checksums="maybe"), InvalidOption, "--store-checksums 'maybe'"),
        (dict(route="teleport"), InvalidOption, "teleport"),
        (dict(adopt="always"), InvalidOption, "--adopt 'always'"),
        (dict(max_cost=float("nan")), InvalidOption, "--max-cost nan"),
        (dict(include="*.txt"), InvalidOption, "include and exclude take a list"),
        (dict(progress="bar"), InvalidOption, "progress 'bar'"),
        (dict(profile=""), InvalidOption, "--profile is empty"),
        (dict(dst=""), InvalidOption, "destination ''"),
    ]
    for kw, kind, needle in cases:
        dst = kw.pop("dst", out)
        with pytest.raises(kind) as raised:
            bridge.copy(src, dst, **kw)
        message = str(raised.value)
        assert isinstance(raised.value, UsageError) and raised.value.exit_code == 2, kw
        assert needle in message and "\n" not in message, (kw, message)
    with pytest.raises(InvalidOption, match="give --deep with it"):
        bridge.verify(out, sha256=True)
    with pytest.raises(ObjectNotFound) as missing:
        bridge.copy(f"{tmp_path}/nope/", out)
    assert missing.value.exit_code == 1 and isinstance(missing.value, BridgeError)
    assert not os.path.exists(out) or not has_record(out)


def test_keyword_settings_win_over_the_profile_and_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("MCBRIDGE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("MCBRIDGE_CONCURRENCY", raising=False)
    config = tmp_path / "bridge.yaml"
    config.write_text("profiles:\n  default:\n    transfer: {concurrency: 5}\n"
                      "  fast:\n    transfer: {concurrency: 40}\n")
    assert api.settings_of(config=config).transfer.concurrency == 5
    assert api.settings_of("fast", config).transfer.concurrency == 40
    assert api.settings_of("fast", config, concurrency=3, chunk_size="8MiB").transfer.chunk_size == 8 * 2**20
    assert api.settings_of("fast", config, concurrency=3).transfer.concurrency == 3
    monkeypatch.setenv("MCBRIDGE_CONCURRENCY", "7")
    assert api.settings_of("fast", config).transfer.concurrency == 7
    assert api.settings_of("fast", config, concurrency=3).transfer.concurrency == 3
    src = _tree(tmp_path / "src", {"a.txt": b"abc"})
    planned = bridge.copy(src, f"{tmp_path}/out/", profile="fast", config=config, dry_run=True)
    assert isinstance(planned, api.PlanResult) and (planned.files, planned.bytes) == (1, 3)
    assert not (tmp_path / "out").exists()


def test_import_bridge_stays_cheap_and_loads_the_api_on_first_use():
    heavy = ("bridge.api", "bridge.ops", "bridge.pipeline.execute", "boto3", "botocore", "yaml", "typer")
    assert imported_by("import bridge", heavy, dict(os.environ)) == []
    assert imported_by("import bridge\nbridge.copy", heavy, dict(os.environ)) == ["bridge.api"]


def test_a_settings_object_and_settings_arguments_together_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("MCBRIDGE_STATE_DIR", str(tmp_path / "state"))
    src = _tree(tmp_path / "src", {"a.txt": b"a"})
    with pytest.raises(InvalidOption, match="settings= and concurrency: give the settings object"):
        bridge.copy(src, f"{tmp_path}/out/", settings=api.settings_of(), concurrency=4)
    assert not (tmp_path / "out").exists()
