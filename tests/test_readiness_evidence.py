"""Readiness from evidence, not names: what a checkpoint's own files say (a DCP ``.metadata``
read without torch, safetensors headers, Orbax's metadata, bridge records at the folder or above)
checked against the listing, and retention that counts only checkpoints so committed. Storage
over real HTTP against the emulators; the DCP ``.metadata`` pickles torch's own module paths
(tests/dcpfake.py), torch itself is never needed."""

from __future__ import annotations

import json
import os
import pickle
import pickletools
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from bridge import evidence
from tests import dcpfake
from tests.emulators import unique_name
from tests.helpers import mcbridge, settings_for
from tests.test_workers_service import service  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(240)


def tensors_file(n: int, values: int = 64) -> bytes:
    """A safetensors file of one float32 tensor of ``values`` values, as the format lays it out:
    the header's length (8 bytes, little-endian), the JSON header padded to 8 bytes, the data."""
    data = struct.pack(f"<{values}f", *[float(n)] * values)
    header = json.dumps({"__metadata__": {"format": "pt"},
                         f"layers.{n}.weight": {"dtype": "F32", "shape": [values], "data_offsets": [0, len(data)]}})
    padded = header.encode() + b" " * (-len(header) % 8)
    return struct.pack("<Q", len(padded)) + padded + data


def test_the_safetensors_fixture_is_what_safetensors_itself_reads():
    from safetensors import deserialize
    [(name, tensor)] = deserialize(tensors_file(3))
    assert name == "layers.3.weight" and tensor["shape"] == [64] and bytes(tensor["data"]) == tensors_file(3)[-256:]


# -- the readers, with no store -----------------------------------------------------------------------

def test_the_dcp_fixture_pickles_torch_own_names_and_loads_without_torch():
    shards = {"__0_0.distcp": [400, 800], "__1_0.distcp": [1200]}
    data = dcpfake.metadata(shards)
    names = {arg for op, arg, _pos in pickletools.genops(data) if op.name in ("SHORT_BINUNICODE", "BINUNICODE")}
    for module, name in (("torch.distributed.checkpoint.metadata", "Metadata"),
                         ("torch.distributed.checkpoint.metadata", "MetadataIndex"),
                         ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"),
                         ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
                         ("torch", "Size"), ("torch", "float32"), ("pathlib", "PurePosixPath")):
        assert module in names and name in names, (module, name)
    assert evidence.dcp_storage(data) == {"__0_0.distcp": 1200, "__1_0.distcp": 1200}
    assert _read_where_torch_cannot_load(data) == {"__0_0.distcp": 1200, "__1_0.distcp": 1200}


REAL_DCP = Path(__file__).parent / "fixtures" / "dcp-torch-2.13.0"


@pytest.mark.parametrize("ranks, shards", [("one-rank", {"__0_0.distcp": 22316}),
                                           ("two-ranks", {"__0_0.distcp": 3625, "__1_0.distcp": 8511})])
def test_a_metadata_torch_itself_wrote_is_read_without_torch(ranks, shards):
    """The shard sizes torch wrote beside these .metadata files (fixtures/dcp-torch-2.13.0/README.md)
    are what the torch-free reader says each shard must hold."""
    assert evidence.dcp_storage((REAL_DCP / ranks / ".metadata").read_bytes()) == shards
    assert _read_where_torch_cannot_load((REAL_DCP / ranks / ".metadata").read_bytes()) == shards


def _read_where_torch_cannot_load(data: bytes) -> dict:
    """``evidence.dcp_storage`` in a Python where importing torch fails: the reader needs none
    (this process may hold torch: webdataset imports it when it is installed)."""
    code = ("import json, sys\nsys.modules['torch'] = None\nfrom bridge import evidence\n"
            "print(json.dumps(evidence.dcp_storage(sys.stdin.buffer.read())))\n")
    run = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True, timeout=120)
    assert run.returncode == 0, run.stderr.decode(errors="replace")
    return json.loads(run.stdout)


def test_a_checkpoint_torch_saved_is_committed_by_its_own_metadata(emulator_env, tmp_path):
    """Two ranks' .metadata as torch wrote it, on a file system: committed once both shards hold
    the bytes it names, waiting while one is short."""
    meta = (REAL_DCP / "two-ranks" / ".metadata").read_bytes()
    for step, second in (("step-100", 8511), ("step-200", 8000)):
        folder = tmp_path / "src" / step
        folder.mkdir(parents=True)
        (folder / ".metadata").write_bytes(meta)
        (folder / "__0_0.distcp").write_bytes(os.urandom(3625))
        (folder / "__1_0.distcp").write_bytes(os.urandom(second))
    policy_file = tmp_path / "policies.yaml"
    policy_file.write_text(f"policies:\n  golden:\n    source: {tmp_path / 'src'}/\n"
                           f"    destinations: [{tmp_path / 'dst'}/]\n")
    code, run, stderr = _once(policy_file, emulator_env, tmp_path / "state")
    assert code == 0, stderr
    assert run["checkpoints"] == ["step-100"], run
    assert run["waiting"] == {"step-200": ".metadata needs more bytes than are there: __1_0.distcp (8000 of 8511 bytes)"}


def test_a_dcp_metadata_cut_short_or_hostile_is_no_evidence(tmp_path):
    data = dcpfake.metadata({"__0_0.distcp": [100]})
    assert "is not a whole DCP metadata pickle" in evidence.dcp_storage(data[:len(data) // 2])
    assert evidence.dcp_storage(b"") == "is empty"
    assert evidence.dcp_storage(b"my own marker") is None          # not a pickle: a marker sharing the name
    witness = tmp_path / "ran"

    class Hostile:
        def __reduce__(self):
            return (os.system, (f"touch {witness}",))

    why = evidence.dcp_storage(pickle.dumps(Hostile()))
    assert "refused to load posix.system" in why and not witness.exists()
    assert "not a DCP Metadata" in evidence.dcp_storage(pickle.dumps({"storage_data": {}}))


# -- the four readiness probes, replicated once ---------------------------------------------------------

def _index(shards: dict[str, bytes]) -> bytes:
    weight_map = {f"layers.{n}.weight": name for n, name in enumerate(sorted(shards), start=1)}
    return json.dumps({"metadata": {"total_size": sum(map(len, shards.values()))}, "weight_map": weight_map}).encode()


def _once(policy_file: Path, env, tmp_path, *args: str) -> tuple[int, dict, str]:
    r = mcbridge("replicate", "--policy", str(policy_file), "--once", "--json", *args, env=env, state_dir=tmp_path)
    return r.returncode, (json.loads(r.stdout)["policies"][0] if r.stdout.strip() else {}), r.stderr


def test_names_alone_commit_nothing_the_files_say_is_incomplete(moto, fake_gcs, emulator_env, tmp_path):
    src, gbucket = unique_name(), unique_name()
    moto.create_bucket(src)
    fake_gcs.create_bucket(gbucket)
    s3 = moto.client()

    def put(key: str, body: bytes) -> None:
        s3.put_object(Bucket=src, Key=f"golden/{key}", Body=body)

    dcp = {"__0_0.distcp": [1000], "__1_0.distcp": [1000]}
    one, two = tensors_file(1), tensors_file(2)
    sharded = {"model-00001-of-00002.safetensors": one, "model-00002-of-00002.safetensors": two}
    # DCP .metadata without its second shard; with it cut short
    for step in ("step-1", "step-2"):
        put(f"{step}/.metadata", dcpfake.metadata(dcp))
        put(f"{step}/__0_0.distcp", os.urandom(1000))
    put("step-2/__1_0.distcp", os.urandom(600))
    # a safetensors index naming a 0-byte shard; one naming a shard cut short
    for step, second in (("step-3", b""), ("step-4", two[:len(two) - 40])):
        put(f"{step}/model.safetensors.index.json", _index(sharded))
        put(f"{step}/model-00001-of-00002.safetensors", one)
        put(f"{step}/model-00002-of-00002.safetensors", second)
    put("step-5/commit_success.txt", b"Checkpoint commit was successful")      # Orbax's marker alone
    put("step-6/model.safetensors", one[:len(one) - 100])                        # a lone file cut short
    put("step-7/.metadata", dcpfake.metadata(dcp))                               # complete: the controls
    for name, lengths in dcp.items():
        put(f"step-7/{name}", os.urandom(sum(lengths)))
    put("step-8/model.safetensors", one)
    dst = f"gs://{gbucket}/dr/"
    policy_file = tmp_path / "policies.yaml"
    policy_file.write_text(f"policies:\n  golden:\n    source: s3://{src}/golden/\n    destinations: [{dst}]\n"
                           f"    checkpoints: \"step-*\"\n")
    code, run, stderr = _once(policy_file, emulator_env, tmp_path)
    assert code == 0, stderr
    assert run["checkpoints"] == ["step-7", "step-8"], run["waiting"]
    assert run["waiting"] == {
        "step-1": ".metadata names 2 storage files, 1 not there yet: __1_0.distcp",
        "step-2": ".metadata needs more bytes than are there: __1_0.distcp (600 of 1000 bytes)",
        "step-3": "model.safetensors.index.json: not whole yet by its header: model-00002-of-00002.safetensors "
                  "(0 bytes, under the 8-byte header length)",
        "step-4": f"model.safetensors.index.json: not whole yet by its header: model-00002-of-00002.safetensors "
                  f"({len(two) - 40} bytes of the {len(two)} its header declares)",
        "step-5": "commit_success.txt with no Orbax checkpoint metadata beside it "
                  "(_CHECKPOINT_METADATA, _METADATA, manifest.ocdbt) yet",
        "step-6": f"safetensors: not whole yet by its header: model.safetensors "
                  f"({len(one) - 100} bytes of the {len(one)} its header declares)"}
    assert run["trusted"] == {}
    from bridge.replicator import folders
    assert folders(dst, settings_for(emulator_env)) == {"step-7", "step-8"}

    # each writer finishes: every checkpoint is committed by what its files say
    put("step-1/__1_0.distcp", os.urandom(1000))
    put("step-2/__1_0.distcp", os.urandom(1000))
    put("step-3/model-00002-of-00002.safetensors", two)
    put("step-4/model-00002-of-00002.safetensors", two)
    put("step-5/_CHECKPOINT_METADATA", json.dumps({"item_handlers": {"state": "PyTreeCheckpointHandler"}}).encode())
    put("step-5/state/_METADATA", b'{"tree_metadata": {}}')
    put("step-6/model.safetensors", one)
    code, run, stderr = _once(policy_file, emulator_env, tmp_path)
    assert code == 0 and run["waiting"] == {}, stderr + json.dumps(run.get("waiting"))
    assert run["checkpoints"] == [f"step-{n}" for n in range(1, 9)]
    assert all(row["verified"] for row in run["destinations"][dst]["checkpoints"].values())


def test_orbax_metadata_naming_an_item_not_there_waits(moto, fake_gcs, emulator_env, tmp_path):
    src, gbucket = unique_name(), unique_name()
    moto.create_bucket(src)
    fake_gcs.create_bucket(gbucket)
    s3 = moto.client()
    meta = json.dumps({"item_handlers": {"state": "PyTreeCheckpointHandler", "dataset": "JsonCheckpointHandler"}})
    for key, body in (("100/_CHECKPOINT_METADATA", meta.encode()), ("100/state/_METADATA", b"{}"),
                      ("100/commit_success.txt", b"Checkpoint commit was successful")):
        s3.put_object(Bucket=src, Key=f"run/{key}", Body=body)
    policy_file = tmp_path / "policies.yaml"
    policy_file.write_text(f"policies:\n  golden:\n    source: s3://{src}/run/\n    destinations: [gs://{gbucket}/dr/]\n")
    code, run, _stderr = _once(policy_file, emulator_env, tmp_path)
    assert code == 1 and run["waiting"] == {"100": "_CHECKPOINT_METADATA names items not there yet: dataset"}
    s3.put_object(Bucket=src, Key="run/100/dataset/data.json", Body=b"{}")
    code, run, stderr = _once(policy_file, emulator_env, tmp_path)
    assert code == 0 and run["checkpoints"] == ["100"], stderr


# -- a marker of the policy's: honoured, said to be taken on trust -------------------------------------

def test_a_marker_is_taken_on_trust_and_a_layout_that_disagrees_holds_it_back(moto, fake_gcs, emulator_env,
                                                                               tmp_path):
    src, gbucket = unique_name(), unique_name()
    moto.create_bucket(src)
    fake_gcs.create_bucket(gbucket)
    s3 = moto.client()
    for step in ("step-1", "step-2"):
        s3.put_object(Bucket=src, Key=f"golden/{step}/weights.bin", Body=os.urandom(500))
        s3.put_object(Bucket=src, Key=f"golden/{step}/DONE", Body=b"")
    s3.put_object(Bucket=src, Key="golden/step-2/model.safetensors", Body=tensors_file(1)[:50])
    dst = f"gs://{gbucket}/dr/"
    policy_file = tmp_path / "policies.yaml"
    policy_file.write_text(f"policies:\n  golden:\n    source: s3://{src}/golden/\n    destinations: [{dst}]\n"
                           f"    checkpoints: \"step-*\"\n    ready: {{marker: DONE}}\n    keep_last: 1\n"
                           f"    mode: mirror\n")
    code, run, stderr = _once(policy_file, emulator_env, tmp_path)
    assert code == 0, stderr
    assert run["trusted"] == {"step-1": "DONE present (taken on trust: no layout read here confirms it)"}
    assert run["waiting"]["step-2"].startswith("DONE present, but safetensors: not whole yet by its header")
    assert run["held_back"] == {"step-1": "committed on trust only (DONE present (taken on trust: no layout "
                                          "read here confirms it))"}
    r = mcbridge("replicate", "--policy", str(policy_file), "--once", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "golden: step-1 committed on trust: DONE present (taken on trust" in r.stdout, r.stdout
    assert "golden: step-2 waiting: DONE present, but safetensors" in r.stdout, r.stdout


# -- a record of bridge's at a folder above the checkpoints ---------------------------------------------

def test_steps_seeded_by_one_cp_of_their_parent_are_committed_and_the_window_moves(moto, fake_gcs, emulator_env,
                                                                                   tmp_path):
    src, gbucket = unique_name(), unique_name()
    moto.create_bucket(src)
    fake_gcs.create_bucket(gbucket)
    seed, later = tmp_path / "seed", tmp_path / "later"
    for step in ("step-100", "step-300", "step-1000"):
        (seed / step).mkdir(parents=True)
        (seed / step / "weights.bin").write_bytes(os.urandom(700))
        (seed / step / "optim.bin").write_bytes(os.urandom(300))
    (later / "step-2000").mkdir(parents=True)
    (later / "step-2000" / "weights.bin").write_bytes(os.urandom(700))
    golden = f"s3://{src}/golden/"
    for args in ((f"{seed}/", golden), (f"{later}/step-2000/", f"{golden}step-2000/")):
        r = mcbridge("cp", *args, env=emulator_env, state_dir=tmp_path)
        assert r.returncode == 0, r.stderr
    s3 = moto.client()
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=src)["Contents"]}
    assert any(k.startswith("golden/_bridge/log/") for k in keys)              # one record, above the steps
    assert any(k.startswith("golden/step-2000/_bridge/log/") for k in keys)    # and one of step-2000's own
    dst = f"gs://{gbucket}/dr/"
    r = mcbridge("cp", f"{golden}step-300/", f"{dst}step-300/", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr                                          # an older copy already there
    policy_file = tmp_path / "policies.yaml"
    policy_file.write_text(f"policies:\n  golden:\n    source: {golden}\n    destinations: [{dst}]\n"
                           f"    checkpoints: \"step-*\"\n    keep_last: 2\n    mode: mirror\n")
    code, run, stderr = _once(policy_file, emulator_env, tmp_path)
    assert code == 0, stderr
    assert run["waiting"] == {} and run["trusted"] == {}
    assert run["checkpoints"] == ["step-1000", "step-2000"]
    assert all(row["verified"] for row in run["destinations"][dst]["checkpoints"].values())
    assert run["removed"] == {dst: ["step-300"]}
    from bridge.replicator import folders
    assert folders(dst, settings_for(emulator_env)) == {"step-1000", "step-2000"}

    # a file rewritten since the record, and a step dropped by hand: neither is held by a record
    s3.put_object(Bucket=src, Key="golden/step-1000/optim.bin", Body=os.urandom(300))
    s3.put_object(Bucket=src, Key="golden/step-3000/weights.bin", Body=os.urandom(700))
    code, run, stderr = _once(policy_file, emulator_env, tmp_path)
    assert run["waiting"]["step-1000"].startswith(f"bridge commit at {golden} holds 1 of its 2 files; not: optim.bin")
    assert run["waiting"]["step-3000"] == "no _bridge/log/ yet, which its siblings have"
    # the window is the newest two committed now; step-1000 stays at the destination, as one
    # good copy newer than it (step-2000) is not keep_last of them
    assert run["checkpoints"] == ["step-300", "step-2000"] and run["removed"] == {}, stderr
    assert folders(dst, settings_for(emulator_env)) == {"step-300", "step-1000", "step-2000"}


# -- a file system: a present name can be a file still being written ----------------------------------

def test_on_a_file_system_a_file_still_growing_holds_its_checkpoint_back(tmp_path):
    import threading
    import time
    from bridge.policies import replication as rules
    from bridge.replicator import survey
    ckpts = tmp_path / "ckpts"
    for step in ("step-1", "step-2", "step-3"):
        (ckpts / step).mkdir(parents=True)
    (ckpts / "step-1" / "weights.bin").write_bytes(b"w" * 4096)
    (ckpts / "step-2" / "weights.bin").write_bytes(b"w" * 1024)
    (ckpts / "step-3" / "model.safetensors").write_bytes(tensors_file(3))
    old = time.time() - 3600
    os.utime(ckpts / "step-1" / "weights.bin", (old, old))
    stop = threading.Event()

    def writer() -> None:   # a trainer still appending to step-2, and one touching a whole step-3 file
        while not stop.is_set():
            with open(ckpts / "step-2" / "weights.bin", "ab") as f:
                f.write(b"w" * 1024)
            os.utime(ckpts / "step-3" / "model.safetensors")
            stop.wait(0.1)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        policy = rules.Policy(source=f"{ckpts}/", destinations=["s3://dr-models/golden/"], checkpoints="step-*")
        seen = survey(policy, settings_for(dict(os.environ), state_dir=str(tmp_path / "state")))
    finally:
        stop.set()
        thread.join()
    assert not seen["step-2"].committed and seen["step-2"].why.startswith("still being written: weights.bin (size "), \
        seen["step-2"]
    assert seen["step-1"].committed and seen["step-1"].trusted, seen["step-1"]
    assert seen["step-3"].committed and not seen["step-3"].trusted, seen["step-3"]   # its header proves its length


def test_policy_status_says_a_marker_is_taken_on_trust(service, moto, tmp_path):  # noqa: F811
    src = unique_name()
    moto.create_bucket(src)
    s3 = moto.client()
    s3.put_object(Bucket=src, Key="golden/step-1/weights.bin", Body=os.urandom(300))
    s3.put_object(Bucket=src, Key="golden/step-1/DONE", Body=b"")
    s3.put_object(Bucket=src, Key="golden/step-2/weights.bin", Body=os.urandom(300))
    policy_file = tmp_path / "policies.yaml"
    policy_file.write_text(f"policies:\n  golden:\n    source: s3://{src}/golden/\n    destinations: [gs://dr-models/x/]\n"
                           f"    checkpoints: \"step-*\"\n    ready: {{marker: DONE}}\n")
    text = service.cli("policy", "status", str(policy_file))
    assert text.returncode == 0, text.stderr
    assert "  step-1 committed on trust: DONE present (taken on trust: no layout read here confirms it)" \
        in text.stdout, text.stdout
    assert "  step-2 waiting: no DONE yet" in text.stdout
    status = json.loads(service.cli("policy", "status", str(policy_file), "--json").stdout)
    assert list(status["policies"][0]["trusted"]) == ["step-1"]
