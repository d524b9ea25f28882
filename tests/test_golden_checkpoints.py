"""Golden checkpoints: only committed checkpoints are replicated (a policy's marker, or the DCP,
Orbax and sharded safetensors layouts), a source rewritten during its copy commits nothing, and
``replicate --watch`` copies a checkpoint soon after its marker while a slow writer is at work.
Everything over real HTTP against the emulators."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bridge.policies import replication as rules
from tests import dcpfake
from tests.emulators import unique_name
from tests.helpers import MCBRIDGE, NO_CONFIG, mcbridge, settings_for

pytestmark = pytest.mark.timeout(240)


def policy(**fields) -> rules.Policy:
    return rules.Policy(**{"source": "s3://models/golden/", "destinations": ["gs://dr-models/golden/"],
                           "checkpoints": "step-*", **fields})


def files(*names: str, at: float = 100.0) -> dict[str, rules.SourceFile]:
    return {n: rules.SourceFile(10, at + i) for i, n in enumerate(names)}


# -- the rules ------------------------------------------------------------------------------------

def test_marker_min_age_and_temporary_folders():
    listing = {"step-1": files("a.bin", ".metadata"), "step-2": files("a.bin"),
               "step-3.orbax-checkpoint-tmp-1733051234": files("x", "commit_success.txt")}
    by_marker = rules.assess(policy(ready={"marker": ".metadata"}), listing, now=1000)
    assert rules.committed(by_marker) == ["step-1"]
    assert rules.waiting(by_marker) == {"step-2": "no .metadata yet"}
    assert by_marker["step-1"].committed_at == 101.0           # the marker's own time
    quiet = policy(ready={"min_age": "10m"})
    early = rules.assess(quiet, {"step-9": files("a.bin")}, now=400)
    assert rules.waiting(early) == {"step-9": "quiet for 300s of min_age 10m"}
    assert rules.committed(rules.assess(quiet, {"step-9": files("a.bin")}, now=700)) == ["step-9"]
    # no layout known and no marker: the siblings' convention decides
    assert rules.waiting(rules.assess(policy(), listing, now=1000)) == {"step-2": "no .metadata yet, which its siblings have"}


@pytest.mark.parametrize("body, expected", [
    ("ready: {marker: /abs}", r"policies\.golden\.ready\.marker: marker '/abs': a file's path inside"),
    ("ready: {marker: '*.done'}", r"policies\.golden\.ready\.marker: .*no wildcards"),
    ("ready: {min_age: 10 minutes}", r"policies\.golden\.ready\.min_age: min_age '10 minutes': use a number and s, m, h or d"),
    ("ready: {marke: .metadata}", r"p\.yaml:5: policies\.golden\.ready\.marke: unknown field"),
    ("watch: {interval: 0.5s}", r"policies\.golden\.watch\.interval: interval '0.5s' is under 1s"),
    ("watch: {every: 5s}", r"policies\.golden\.watch\.every: unknown field"),
])
def test_ready_and_watch_keys_are_checked(body, expected, tmp_path):
    text = f"policies:\n  golden:\n    source: s3://models/golden/\n    destinations: [gs://dr-models/x/]\n    {body}\n"
    with pytest.raises(rules.PolicyError) as caught:
        rules.parse(text, "p.yaml")
    assert re.search(expected, str(caught.value)), str(caught.value)
    bad = tmp_path / "p.yaml"
    bad.write_text(text)
    r = mcbridge("policy", "check", str(bad), env={}, state_dir=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


# -- layouts, replicated once ------------------------------------------------------------------

def _once(policy_file: Path, env, tmp_path) -> tuple[int, dict, str]:
    r = mcbridge("replicate", "--policy", str(policy_file), "--once", "--json", env=env, state_dir=tmp_path)
    return r.returncode, (json.loads(r.stdout)["policies"][0] if r.stdout.strip() else {}), r.stderr


def _folders(url: str, env) -> set[str]:
    from bridge.replicator import folders
    return folders(url, settings_for(env))


def _write_policy(tmp_path: Path, source: str, dst: str, extra: str = "") -> Path:
    path = tmp_path / "policies.yaml"
    path.write_text(f"policies:\n  golden:\n    source: {source}\n    destinations: [{dst}]\n"
                    f"    checkpoints: \"{'*' if 'orbax' in extra else 'step-*'}\"\n    verify: deep\n{extra}")
    return path


def test_dcp_layout_waits_for_its_metadata(moto, fake_gcs, emulator_env, tmp_path):
    src, gbucket = unique_name(), unique_name()
    moto.create_bucket(src)
    fake_gcs.create_bucket(gbucket)
    s3 = moto.client()
    two_ranks = {"__0_0.distcp": [3000], "__1_0.distcp": [3000]}
    for step, ranks in (("step-100", 2), ("step-200", 1)):
        for rank in range(ranks):
            s3.put_object(Bucket=src, Key=f"golden/{step}/__{rank}_0.distcp", Body=os.urandom(3000))
    s3.put_object(Bucket=src, Key="golden/step-100/.metadata", Body=dcpfake.metadata(two_ranks))
    dst = f"gs://{gbucket}/dr/"
    policy_file = _write_policy(tmp_path, f"s3://{src}/golden/", dst)
    code, run, stderr = _once(policy_file, emulator_env, tmp_path)
    assert code == 0, stderr
    assert run["checkpoints"] == ["step-100"]
    assert run["waiting"] == {"step-200": "PyTorch DCP shards without .metadata yet"}
    assert _folders(dst, emulator_env) == {"step-100"}
    r = mcbridge("replicate", "--policy", str(policy_file), "--once", env=emulator_env, state_dir=tmp_path)
    assert "golden: step-200 waiting: PyTorch DCP shards without .metadata yet" in r.stdout, r.stdout
    s3.put_object(Bucket=src, Key="golden/step-200/__1_0.distcp", Body=os.urandom(3000))
    s3.put_object(Bucket=src, Key="golden/step-200/.metadata", Body=dcpfake.metadata(two_ranks))
    code, run, stderr = _once(policy_file, emulator_env, tmp_path)
    assert code == 0 and run["checkpoints"] == ["step-100", "step-200"] and run["waiting"] == {}, stderr
    row = run["destinations"][dst]["checkpoints"]["step-200"]
    assert row["verified"] and row["sent"] == 3 and row["commit_to_verified_s"] is not None


def _orbax_files(step: str) -> dict[str, bytes]:
    """What Orbax (OCDBT) writes for one step, per its documented layout."""
    return {f"{step}/_CHECKPOINT_METADATA": b'{"item_handlers": {"state": "PyTreeCheckpointHandler"}}',
            f"{step}/state/_METADATA": b'{"tree_metadata": {}}',
            f"{step}/state/manifest.ocdbt": os.urandom(200),
            f"{step}/state/ocdbt.process_0/d/0123abcd": os.urandom(4000)}


def test_orbax_on_gcs_waits_for_commit_success(moto, fake_gcs, emulator_env, tmp_path):
    gbucket, dbucket = unique_name(), unique_name()
    fake_gcs.create_bucket(gbucket)
    moto.create_bucket(dbucket)
    bucket = fake_gcs.client().bucket(gbucket)
    for step in ("100", "200"):
        for rel, data in _orbax_files(step).items():
            bucket.blob(f"run/{rel}").upload_from_string(data)
    bucket.blob("run/100/commit_success.txt").upload_from_string(b"Checkpoint commit was successful")
    for rel, data in _orbax_files("300.orbax-checkpoint-tmp-1733051234").items():
        bucket.blob(f"run/{rel}").upload_from_string(data)
    dst = f"s3://{dbucket}/dr/"
    policy_file = _write_policy(tmp_path, f"gs://{gbucket}/run/", dst, "    # orbax\n")
    code, run, stderr = _once(policy_file, emulator_env, tmp_path)
    assert code == 0, stderr
    assert run["checkpoints"] == ["100"] and run["waiting"] == {"200": "Orbax checkpoint without commit_success.txt yet"}
    assert _folders(dst, emulator_env) == {"100"}
    bucket.blob("run/200/commit_success.txt").upload_from_string(b"Checkpoint commit was successful")
    code, run, stderr = _once(policy_file, emulator_env, tmp_path)
    assert code == 0 and run["checkpoints"] == ["100", "200"], stderr
    assert _folders(dst, emulator_env) == {"100", "200"}


def test_orbax_renamed_into_place_on_a_file_system(fake_gcs, emulator_env, tmp_path):
    gbucket = unique_name()
    fake_gcs.create_bucket(gbucket)
    root = tmp_path / "ckpt"
    for step in ("100", "200.orbax-checkpoint-tmp-1733051234"):
        for rel, data in _orbax_files(step).items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
    dst = f"gs://{gbucket}/dr/"
    policy_file = _write_policy(tmp_path, f"{root}/", dst, "    # orbax\n")
    code, run, stderr = _once(policy_file, emulator_env, tmp_path)
    assert code == 0 and run["checkpoints"] == ["100"] and run["waiting"] == {}, stderr
    assert _folders(dst, emulator_env) == {"100"}          # the temporary folder is not a checkpoint
    (root / "200.orbax-checkpoint-tmp-1733051234").rename(root / "200")
    code, run, stderr = _once(policy_file, emulator_env, tmp_path)
    assert code == 0 and run["checkpoints"] == ["100", "200"], stderr
    assert _folders(dst, emulator_env) == {"100", "200"}


def test_sharded_safetensors_complete_when_every_indexed_shard_is_there(moto, azurite, emulator_env, tmp_path):
    np = pytest.importorskip("numpy")
    from safetensors.numpy import load, save_file
    src, container = unique_name(), unique_name()
    moto.create_bucket(src)
    azurite.create_bucket(container)
    local = tmp_path / "model"
    local.mkdir()
    weight_map, total = {}, 0
    for n in range(1, 4):
        name = f"model-{n:05d}-of-00003.safetensors"
        tensors = {f"layers.{n}.weight": np.full((16, 16), n, dtype=np.float32)}
        save_file(tensors, str(local / name), metadata={"format": "np"})
        weight_map.update(dict.fromkeys(tensors, name))
        total += sum(t.nbytes for t in tensors.values())
    (local / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    s3 = moto.client()
    for path in sorted(local.iterdir()):
        if path.name != "model-00003-of-00003.safetensors":
            s3.put_object(Bucket=src, Key=f"golden/step-5/{path.name}", Body=path.read_bytes())
    dst = f"az://{container}/dr/"
    policy_file = _write_policy(tmp_path, f"s3://{src}/golden/", dst)
    code, run, stderr = _once(policy_file, emulator_env, tmp_path)
    assert code == 1 and run["checkpoints"] == [], stderr
    assert run["waiting"] == {"step-5": "model.safetensors.index.json names 3 shards, 1 not there yet: "
                                        "model-00003-of-00003.safetensors"}
    assert run["errors"] == [f"no committed checkpoint under s3://{src}/golden/ matches 'step-*' (1 not committed yet)"]
    s3.put_object(Bucket=src, Key="golden/step-5/model-00003-of-00003.safetensors",
                  Body=(local / "model-00003-of-00003.safetensors").read_bytes())
    code, run, stderr = _once(policy_file, emulator_env, tmp_path)
    assert code == 0 and run["checkpoints"] == ["step-5"], stderr
    r = mcbridge("cp", f"{dst}step-5/model-00003-of-00003.safetensors", str(tmp_path / "back.safetensors"),
                 env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    assert float(load((tmp_path / "back.safetensors").read_bytes())["layers.3.weight"][0, 0]) == 3.0


# -- a consistent copy ---------------------------------------------------------------------------

def _manifest_at(url: str, env) -> bool:
    from bridge import manifest as manifests
    from bridge.stores import get_store
    from bridge.urls import parse
    root = parse(url).as_prefix()
    return manifests.read(get_store(root, settings_for(env)), root) is not None


def _slow_replicate_until_a_shard_lands(policy_file, env, tmp_path, bucket) -> subprocess.Popen:
    """``replicate --once`` of step-1 slow enough (one file at a time, 512 KiB/s; small files
    between two stores go in batches, with small_files_in_flight requests at once) that the
    source can change while it is copied; returned once a shard has landed in ``bucket``."""
    slow = dict(env, MCBRIDGE_BWLIMIT="512KiB", MCBRIDGE_CONCURRENCY="1", MCBRIDGE_SMALL_FILES_IN_FLIGHT="1",
                MCBRIDGE_STATE_DIR=str(tmp_path), XDG_CONFIG_HOME=NO_CONFIG)
    proc = subprocess.Popen([*MCBRIDGE, "replicate", "--policy", str(policy_file), "--once", "--json"],
                            env=slow, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not any(b.name.endswith(".bin") for b in bucket.list_blobs(prefix="dr/step-1/")):
        assert proc.poll() is None and time.monotonic() < deadline, "the copy ended before any shard arrived"
        time.sleep(0.05)
    return proc


def test_a_shard_rewritten_mid_copy_commits_nothing_and_is_right_next_run(moto, fake_gcs, emulator_env, tmp_path):
    src, gbucket = unique_name(), unique_name()
    moto.create_bucket(src)
    fake_gcs.create_bucket(gbucket)
    s3 = moto.client()
    for i in range(4):
        s3.put_object(Bucket=src, Key=f"golden/step-1/shard-{i}.bin", Body=bytes([i]) * (512 * 1024))
    s3.put_object(Bucket=src, Key="golden/step-1/.metadata", Body=b"committed")
    dst = f"gs://{gbucket}/dr/"
    policy_file = _write_policy(tmp_path, f"s3://{src}/golden/", dst, "    ready: {marker: .metadata}\n")
    bucket = fake_gcs.client().bucket(gbucket)
    proc = _slow_replicate_until_a_shard_lands(policy_file, emulator_env, tmp_path, bucket)
    copied = next(b.name for b in bucket.list_blobs(prefix="dr/step-1/") if b.name.endswith(".bin"))
    shard = copied.rsplit("/", 1)[-1]
    assert proc.poll() is None, "the copy ended before the source was rewritten"
    s3.put_object(Bucket=src, Key=f"golden/step-1/{shard}", Body=b"\xee" * (512 * 1024))   # same size, new bytes
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stdout + stderr
    run = json.loads(stdout)["policies"][0]
    row = run["destinations"][dst]["checkpoints"]["step-1"]
    assert not row["verified"] and f"source changed while it was copied: {shard} (rewritten)" in row["error"], row
    assert not _manifest_at(f"{dst}step-1/", emulator_env)              # nothing committed for it
    assert mcbridge("verify", f"{dst}step-1/", env=emulator_env, state_dir=tmp_path).returncode != 0

    code, run, stderr = _once(policy_file, emulator_env, tmp_path)
    assert code == 0, stderr
    assert run["destinations"][dst]["checkpoints"]["step-1"]["verified"]
    assert bucket.blob(f"dr/step-1/{shard}").download_as_bytes() == b"\xee" * (512 * 1024)
    assert mcbridge("verify", f"{dst}step-1/", "--deep", env=emulator_env, state_dir=tmp_path).returncode == 0


def test_a_shard_added_after_planning_commits_nothing(moto, fake_gcs, emulator_env, tmp_path):
    """A writer that puts its marker first: the copy runs on what was listed, and a shard that
    appears before the commit fails it (the re-check compares the whole checkpoint, not only
    the files planned)."""
    src, gbucket = unique_name(), unique_name()
    moto.create_bucket(src)
    fake_gcs.create_bucket(gbucket)
    s3 = moto.client()
    s3.put_object(Bucket=src, Key="golden/step-1/DONE", Body=b"")
    for i in range(3):
        s3.put_object(Bucket=src, Key=f"golden/step-1/shard-{i}.bin", Body=bytes([i]) * (512 * 1024))
    dst = f"gs://{gbucket}/dr/"
    policy_file = _write_policy(tmp_path, f"s3://{src}/golden/", dst, "    ready: {marker: DONE}\n")
    bucket = fake_gcs.client().bucket(gbucket)
    proc = _slow_replicate_until_a_shard_lands(policy_file, emulator_env, tmp_path, bucket)
    assert proc.poll() is None, "the copy ended before the writer's next shard"
    s3.put_object(Bucket=src, Key="golden/step-1/shard-3.bin", Body=b"\x03" * 1000)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stdout + stderr
    row = json.loads(stdout)["policies"][0]["destinations"][dst]["checkpoints"]["step-1"]
    assert not row["verified"] and "source changed while it was copied: shard-3.bin (added)" in row["error"], row
    assert not _manifest_at(f"{dst}step-1/", emulator_env)
    code, run, stderr = _once(policy_file, emulator_env, tmp_path)
    assert code == 0 and run["destinations"][dst]["checkpoints"]["step-1"]["verified"], stderr
    assert bucket.blob("dr/step-1/shard-3.bin").download_as_bytes() == b"\x03" * 1000


# -- replicate --watch while a slow writer is at work --------------------------------------------

WRITER = """
import sys, time, boto3
endpoint, bucket, prefix, pause, metadata = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
marker_first = len(sys.argv) > 6 and sys.argv[6] == "marker-first"
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
def marker():
    s3.put_object(Bucket=bucket, Key=f"{prefix}.metadata", Body=open(metadata, "rb").read())
    print(f"marker {time.time()}", flush=True)
if marker_first:
    marker()
for i in range(4):
    s3.put_object(Bucket=bucket, Key=f"{prefix}__{i}_0.distcp", Body=bytes([i]) * 200000)
    print(f"shard {i} {time.time()}", flush=True)
    time.sleep(pause)   # a trainer between shards, not a synchronisation
if not marker_first:
    marker()
"""
FOUR_SHARDS = {f"__{i}_0.distcp": [200000] for i in range(4)}
SMALL_SHARDS = {f"__{i}_0.distcp": [20000] for i in range(4)}


def _put_complete_steps(s3, src: str, steps) -> None:
    """DCP checkpoints of four 20,000-byte shards, each with the .metadata that names them."""
    for step in steps:
        for i in range(4):
            s3.put_object(Bucket=src, Key=f"golden/{step}/__{i}_0.distcp", Body=os.urandom(20000))
        s3.put_object(Bucket=src, Key=f"golden/{step}/.metadata", Body=dcpfake.metadata(SMALL_SHARDS))


def _watch(policy_file, env, tmp_path) -> tuple[subprocess.Popen, list[dict]]:
    """``replicate --watch --json`` running, and the list its events are read into as they come."""
    env = dict(env, MCBRIDGE_STATE_DIR=str(tmp_path), XDG_CONFIG_HOME=NO_CONFIG)
    watcher = subprocess.Popen([*MCBRIDGE, "replicate", "--policy", str(policy_file), "--watch", "--json"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    events: list[dict] = []
    threading.Thread(target=lambda: events.extend(json.loads(line) for line in watcher.stdout), daemon=True).start()
    return watcher, events


def test_watch_replicates_a_checkpoint_soon_after_its_marker_and_never_before(moto, fake_gcs, azurite,
                                                                              emulator_env, tmp_path):
    src, gbucket, container = unique_name(), unique_name(), unique_name()
    moto.create_bucket(src)
    fake_gcs.create_bucket(gbucket)
    azurite.create_bucket(container)
    s3 = moto.client()
    _put_complete_steps(s3, src, ("step-100", "step-200"))
    gs, az = f"gs://{gbucket}/dr/", f"az://{container}/dr/"
    (tmp_path / "step-300.metadata").write_bytes(dcpfake.metadata(FOUR_SHARDS))
    policy_file = tmp_path / "policies.yaml"
    policy_file.write_text(f"policies:\n  golden:\n    source: s3://{src}/golden/\n    destinations: [{gs}, {az}]\n"
                           f"    checkpoints: \"step-*\"\n    keep_last: 2\n    mode: mirror\n    ready: {{marker: .metadata}}\n"
                           f"    watch: {{interval: 1s}}\n")
    watcher, events = _watch(policy_file, emulator_env, tmp_path)

    def verified_in_output(step: str) -> set[str]:
        return {dst for e in list(events) if e["event"] == "run"
                for dst, state in e["destinations"].items() if state["checkpoints"].get(step, {}).get("verified")}

    def marker_exists() -> bool:
        return bool(s3.list_objects_v2(Bucket=src, Prefix="golden/step-300/.metadata").get("KeyCount"))

    try:
        deadline = time.monotonic() + 60
        while verified_in_output("step-200") != {gs, az}:
            assert watcher.poll() is None and time.monotonic() < deadline, watcher.stderr.read() if watcher.poll() else ""
            time.sleep(0.1)
        writer = subprocess.Popen([sys.executable, "-c", WRITER, moto.endpoint, src, "golden/step-300/", "5",
                                   str(tmp_path / "step-300.metadata")], env=emulator_env, stdout=subprocess.PIPE, text=True)
        polls_before_marker = 0
        deadline = time.monotonic() + 90   # a hang guard, not a timing
        while verified_in_output("step-300") != {gs, az}:
            assert time.monotonic() < deadline, f"step-300 not verified everywhere; events: {events[-3:]}"
            # what the destinations and the watch show first, then the marker: a copy seen before a
            # marker that is still absent afterwards was made before the marker existed
            seen = {dst: (_folders(dst, emulator_env), _manifest_at(f"{dst}step-300/", emulator_env)) for dst in (gs, az)}
            said = verified_in_output("step-300")
            if not marker_exists():
                polls_before_marker += 1
                assert not said, f"the watch said step-300 verified before its marker: {said}"
                for dst, (present, committed) in seen.items():
                    assert not committed, f"{dst} holds a manifest for step-300 before its marker"
                    assert {"step-100", "step-200"} <= present, f"{dst} lost an older checkpoint early: {present}"
            time.sleep(0.2)
        verified_seen = time.time()
        marker_line = next(line for line in writer.communicate(timeout=30)[0].splitlines() if line.startswith("marker"))
        assert writer.returncode == 0 and polls_before_marker > 10
        run = next(e for e in reversed(list(events)) if e["event"] == "run" and e["checkpoints"][-1] == "step-300")
        latency = {dst: state["commit_to_verified_s"] for dst, state in run["destinations"].items()}
        print(f"\nmarker to verified: {verified_seen - float(marker_line.split()[1]):.1f}s seen by the test; "
              f"reported by the watch per destination: {latency}")
        assert all(v is not None for v in latency.values())
        deadline = time.monotonic() + 60
        while any(_folders(dst, emulator_env) != {"step-200", "step-300"} for dst in (gs, az)):
            assert time.monotonic() < deadline, {dst: _folders(dst, emulator_env) for dst in (gs, az)}
            time.sleep(0.2)
        assert run["removed"] == {gs: ["step-100"], az: ["step-100"]}
        for dst in (gs, az):
            assert mcbridge("verify", f"{dst}step-300/", "--deep", env=emulator_env, state_dir=tmp_path).returncode == 0
    finally:
        watcher.send_signal(signal.SIGTERM)
        try:
            watcher.wait(timeout=60)
        finally:
            if watcher.poll() is None:
                watcher.kill()
    assert watcher.returncode == 0, watcher.stderr.read()


def test_a_marker_first_writer_never_costs_the_older_complete_checkpoint(moto, fake_gcs, emulator_env, tmp_path):
    """A writer that puts its .metadata first and its shards after, under --watch with mode
    mirror: the new checkpoint waits for the shards its .metadata names, and the older complete
    one stays at the destination until the new one is whole and verified."""
    src, gbucket = unique_name(), unique_name()
    moto.create_bucket(src)
    fake_gcs.create_bucket(gbucket)
    s3 = moto.client()
    _put_complete_steps(s3, src, ("step-100", "step-200"))
    gs = f"gs://{gbucket}/dr/"
    (tmp_path / "step-300.metadata").write_bytes(dcpfake.metadata(FOUR_SHARDS))
    policy_file = tmp_path / "policies.yaml"
    policy_file.write_text(f"policies:\n  golden:\n    source: s3://{src}/golden/\n    destinations: [{gs}]\n"
                           f"    checkpoints: \"step-*\"\n    keep_last: 2\n    mode: mirror\n"
                           f"    ready: {{marker: .metadata}}\n    watch: {{interval: 1s}}\n")
    watcher, events = _watch(policy_file, emulator_env, tmp_path)

    def verified(step: str) -> bool:
        return any(e["event"] == "run" and e["destinations"][gs]["checkpoints"].get(step, {}).get("verified")
                   for e in list(events))

    def shards_written() -> int:
        return s3.list_objects_v2(Bucket=src, Prefix="golden/step-300/__").get("KeyCount", 0)

    try:
        deadline = time.monotonic() + 60
        while not verified("step-200"):
            assert watcher.poll() is None and time.monotonic() < deadline, watcher.stderr.read() if watcher.poll() else ""
            time.sleep(0.1)
        writer = subprocess.Popen([sys.executable, "-c", WRITER, moto.endpoint, src, "golden/step-300/", "2",
                                   str(tmp_path / "step-300.metadata"), "marker-first"],
                                  env=emulator_env, stdout=subprocess.PIPE, text=True)
        polls_while_incomplete = 0
        deadline = time.monotonic() + 90   # a hang guard, not a timing
        while not verified("step-300"):
            assert time.monotonic() < deadline, f"step-300 not verified; events: {events[-3:]}"
            # what the destination and the watch show first, then the source: seen before the
            # fourth shard was there, it was so while the checkpoint was incomplete
            present, said = _folders(gs, emulator_env), verified("step-300")
            older_whole = _manifest_at(f"{gs}step-100/", emulator_env)
            if shards_written() < 4:
                polls_while_incomplete += 1
                assert not said, "the watch said step-300 verified while shards were missing"
                assert {"step-100", "step-200"} <= present and older_whole, \
                    f"the older complete checkpoint left while step-300 was incomplete: {present}"
            time.sleep(0.2)
        assert writer.wait(timeout=30) == 0 and polls_while_incomplete > 5
        waits = [e["waiting"].get("step-300", "") for e in list(events) if e["event"] == "waiting"]
        assert any(w.startswith(".metadata present, but .metadata names 4 storage files") for w in waits), waits
        deadline = time.monotonic() + 60
        while _folders(gs, emulator_env) != {"step-200", "step-300"}:
            assert time.monotonic() < deadline, _folders(gs, emulator_env)
            time.sleep(0.2)
        assert mcbridge("verify", f"{gs}step-300/", "--deep", env=emulator_env, state_dir=tmp_path).returncode == 0
    finally:
        watcher.send_signal(signal.SIGTERM)
        try:
            watcher.wait(timeout=60)
        finally:
            if watcher.poll() is None:
                watcher.kill()
    assert watcher.returncode == 0, watcher.stderr.read()


def test_watch_verifies_again_a_checkpoint_whose_source_changed_after_it_was_verified(moto, fake_gcs, emulator_env,
                                                                                     tmp_path):
    src, gbucket = unique_name(), unique_name()
    moto.create_bucket(src)
    fake_gcs.create_bucket(gbucket)
    s3 = moto.client()
    for i in range(4):
        s3.put_object(Bucket=src, Key=f"golden/step-1/__{i}_0.distcp", Body=os.urandom(20000))
    s3.put_object(Bucket=src, Key="golden/step-1/.metadata", Body=dcpfake.metadata(SMALL_SHARDS))
    gs = f"gs://{gbucket}/dr/"
    policy_file = tmp_path / "policies.yaml"
    policy_file.write_text(f"policies:\n  golden:\n    source: s3://{src}/golden/\n    destinations: [{gs}]\n"
                           f"    checkpoints: \"step-*\"\n    watch: {{interval: 1s}}\n")
    watcher, events = _watch(policy_file, emulator_env, tmp_path)
    runs = lambda: [e for e in list(events) if e["event"] == "run"]   # noqa: E731
    blob = fake_gcs.client().bucket(gbucket).blob("dr/step-1/__2_0.distcp")
    try:
        deadline = time.monotonic() + 60
        while not any(r["destinations"][gs]["checkpoints"].get("step-1", {}).get("verified") for r in runs()):
            assert watcher.poll() is None and time.monotonic() < deadline, watcher.stderr.read() if watcher.poll() else ""
            time.sleep(0.1)
        rewritten = os.urandom(20000)   # same size, new bytes: a trainer that saved the step again
        s3.put_object(Bucket=src, Key="golden/step-1/__2_0.distcp", Body=rewritten)
        deadline = time.monotonic() + 60
        while len(runs()) < 2 or not runs()[-1]["destinations"][gs]["checkpoints"]["step-1"]["verified"]:
            assert watcher.poll() is None and time.monotonic() < deadline, f"not verified again: {events[-3:]}"
            time.sleep(0.1)
        changed = [e for e in list(events) if e["event"] == "changed"]
        assert changed and changed[0]["checkpoints"] == ["step-1"], events
        assert changed[0]["why"] == "changed at the source after it was verified: verifying again"
        assert runs()[-1]["revisited"] == {"step-1": f"changed at the source after it was verified at {gs}: "
                                                     f"copied and verified again"}
        assert blob.download_as_bytes() == rewritten
    finally:
        watcher.send_signal(signal.SIGTERM)
        try:
            watcher.wait(timeout=60)
        finally:
            if watcher.poll() is None:
                watcher.kill()
    assert watcher.returncode == 0, watcher.stderr.read()
