"""PyTorch Distributed Checkpoint through bridge (bridge/torch/): a 2-rank gloo save of a small model
and its optimizer state to S3, GCS and Azure (the emulators), loaded back bit-identical on 2 ranks;
the record written after ``.metadata``; a rank killed mid-save commits nothing; a save uploaded
behind whose process is killed is finished by the next start; a save under a watched policy
replicates without waiting for the watch's listing; ``publish`` of a save_pretrained folder.

The ranks run in a subprocess (``python -m tests.test_torch_dcp MODE URL``) that spawns them with
``torch.multiprocessing``, its environment carrying the emulators' endpoints and credentials.
"""

from __future__ import annotations

import importlib.util
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

# torch is imported only by the processes these tests start, never by pytest's own: the DCP
# fixtures of other test files are made without torch, and some of them check it stays out
if importlib.util.find_spec("torch") is None:
    pytest.skip("PyTorch is not installed (pip install torch==2.13.0)", allow_module_level=True)

from tests.emulators import free_port, unique_name  # noqa: E402
from tests.helpers import MCBRIDGE, NO_CONFIG, mcbridge, settings_for  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORLD = 2


# -- what runs in the ranks --------------------------------------------------------------------------

def _model_and_optimizer(seed: int):
    """A small model and an Adam optimizer after two steps: weights and optimizer state that a
    given seed makes the same, bit for bit, on every run."""
    import torch
    import torch.nn as nn
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(2):
        model(torch.randn(8, 16)).pow(2).mean().backward()
        optim.step()
        optim.zero_grad()
    return model, optim


def _flat(tree, prefix=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _flat(v, f"{prefix}{k}/")
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from _flat(v, f"{prefix}{i}/")
    else:
        yield prefix.rstrip("/"), tree


def _same(a, b) -> list[str]:
    """The keys whose values differ (tensors compared bit for bit)."""
    import torch
    fa, fb = dict(_flat(a)), dict(_flat(b))
    if fa.keys() != fb.keys():
        return sorted(set(fa) ^ set(fb))
    differ = []
    for k, x in fa.items():
        y = fb[k]
        if isinstance(x, torch.Tensor):
            if x.dtype != y.dtype or x.shape != y.shape or x.reshape(-1).view(torch.uint8).ne(y.reshape(-1).view(torch.uint8)).any():
                differ.append(k)
        elif x != y:
            differ.append(k)
    return differ


def _rank(rank: int, steps: str, urls: str, port: int, cache: str) -> None:
    """For each of ``urls`` (space-separated), each of ``steps`` (comma-separated) in turn on this
    rank: ``save``, ``save-and-die`` (rank 1 killed mid-save), ``load`` (checked bit for bit),
    ``load-cached`` (through the cache in the folder ``cache``)."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        for url in urls.split():
            for step in steps.split(","):
                if step in ("save", "save-and-die"):
                    _save(url, _DiesOnRank1(url) if step == "save-and-die" else None)
                else:
                    _load_and_compare(url, cache if step == "load-cached" else False, f"rank {rank} {url} {step}")
                dist.barrier()
    finally:
        dist.destroy_process_group()


def _save(url: str, writer=None, **kwargs) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from bridge.torch import BridgeWriter
    model, optim = _model_and_optimizer(seed=7)
    model_sd, optim_sd = get_state_dict(model, optim)
    dcp.save({"model": model_sd, "optim": optim_sd}, storage_writer=writer or BridgeWriter(url, **kwargs))


def _load_and_compare(url: str, cache, who: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from bridge.torch import BridgeReader
    model, optim = _model_and_optimizer(seed=99)   # other weights and state, to be replaced
    model_sd, optim_sd = get_state_dict(model, optim)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, storage_reader=BridgeReader(url, cache=cache))
    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    want_model, want_optim = _model_and_optimizer(seed=7)
    expected, got = get_state_dict(want_model, want_optim), get_state_dict(model, optim)
    differ = _same(expected[0], got[0]) + _same(expected[1], got[1])
    if differ:
        raise SystemExit(f"{who}: loaded values differ from the saved ones: {differ[:5]}")
    sys.stdout.write(f"{who}: {len(dict(_flat(got)))} values bit-identical\n")   # one write: ranks share the pipe
    sys.stdout.flush()


def _dies_on_rank1():
    from bridge.torch.dcp import BridgeWriter

    class Dies(BridgeWriter):
        """Rank 1 is killed once its file is serialised, before its upload: mid-save."""

        def write_data(self, plan, planner):
            if self.rank == 1:
                from torch.distributed.checkpoint.filesystem import FileSystemWriter
                FileSystemWriter.write_data(self, plan, planner).wait()
                os.kill(os.getpid(), signal.SIGKILL)
            return super().write_data(plan, planner)
    return Dies


def _DiesOnRank1(url):
    return _dies_on_rank1()(url)


def _behind(url: str, staging: str, then: str) -> None:
    """One process (no process group): a save uploaded behind; ``then`` is ``die`` (killed once
    the upload put its first object, before its commit) or ``resume`` (the next start: the
    writer it makes resumes what is pending; then the checkpoint is loaded back)."""
    from bridge import manifest as manifests
    from bridge.config import load_settings
    from bridge.stores import get_store
    from bridge.torch import BridgeWriter, wait
    from bridge.urls import parse
    if then == "resume":
        BridgeWriter(url, behind=staging)
        wait()
        _load_and_compare(url, False, "resumed")
        return
    _save(url, behind=staging)
    print("returned", flush=True)
    root = parse(url).as_prefix()
    store = get_store(root, load_settings())
    while not any(True for _ in store.walk(root)):   # the upload behind has begun: killed mid-upload
        time.sleep(0.01)
    assert not manifests.committed(store, root)
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> None:
    mode, url = argv[0], argv[1]
    if mode == "behind":
        _behind(url, argv[2], argv[3])
        return
    import torch.multiprocessing as mp
    staging = argv[2] if len(argv) > 2 else ""
    mp.spawn(_rank, args=(mode, url, free_port(), staging), nprocs=WORLD, join=True)


# -- the tests -----------------------------------------------------------------------------------------

def _run(env: dict, state: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(env, MCBRIDGE_STATE_DIR=str(state), XDG_CONFIG_HOME=NO_CONFIG, AWS_EC2_METADATA_DISABLED="true",
               NO_GCE_CHECK="true", PYTHONWARNINGS="ignore")
    env.pop("MCBRIDGE_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "tests.test_torch_dcp", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _verified(url: str, settings) -> bool:
    """``mcbridge verify --deep URL`` in this process: every file read back against the record."""
    from bridge.pipeline.verify import verify
    return verify(url, settings, deep=True)["ok"]


def files_at(url: str, settings) -> dict:
    from bridge.stores import get_store
    from bridge.urls import parse
    root = parse(url)
    return dict(get_store(root, settings).walk(root))


def _bucket(scheme: str, moto, fake_gcs, azurite) -> str:
    name = unique_name()
    {"s3": moto, "gs": fake_gcs, "az": azurite}[scheme].create_bucket(name)
    return f"{scheme}://{name}/"


def test_a_two_rank_save_to_s3_gs_and_az_commits_and_loads_back_bit_identical(moto, fake_gcs, azurite,
                                                                             emulator_env, tmp_path):
    from bridge import manifest as manifests
    from bridge.stores import get_store
    from bridge.urls import parse
    urls = [_bucket(scheme, moto, fake_gcs, azurite) + "run/step-100/" for scheme in ("s3", "gs", "az")]
    # saved, loaded on two ranks, loaded again through the node-local cache: one spawn of the ranks
    ran = _run(emulator_env, tmp_path, "save,load,load-cached", " ".join(urls), str(tmp_path / "cache"))
    assert ran.returncode == 0, ran.stderr[-3000:]
    for url in urls:
        for step in ("load", "load-cached"):
            said = re.findall(re.escape(f" {url} {step}: ") + r"\d+ values bit-identical", ran.stdout)
            assert len(said) == WORLD, ran.stdout

    settings = settings_for(emulator_env, state_dir=str(tmp_path))
    for url in urls:
        root = parse(url)
        store = get_store(root, settings)
        files = files_at(url, settings)
        assert set(files) == {".metadata", "__0_0.distcp", "__1_0.distcp"}
        record = manifests.read(store, root)   # one record names every file, as listed
        assert record is not None and set(record.files) == set(files)
        for rel, entry in record.files.items():
            assert entry.size == files[rel].size and entry.crc32c and entry.sha256
        assert _verified(url, settings)
        cached = [p.stat().st_size for p in (tmp_path / "cache").rglob("*") if p.is_file()]
        assert files["__1_0.distcp"].size in cached, "the cached load did not read through the cache"
    check = mcbridge("verify", urls[0], "--deep", env=emulator_env, state_dir=tmp_path)   # and as the CLI says it
    assert check.returncode == 0, check.stdout + check.stderr

    # the record's commit is written after .metadata, in the order the S3 endpoint saw the writes
    root = parse(urls[0])
    log = moto.log_path.read_text(errors="replace").splitlines()
    meta = [i for i, line in enumerate(log) if f"PUT /{root.bucket}/{root.key}.metadata" in line]
    commit = [i for i, line in enumerate(log) if f"PUT /{root.bucket}/{root.key}_bridge/log/c-" in line]
    assert meta and commit and max(meta) < min(commit), (meta, commit)

    # a file rewritten behind the record's back is refused when read through the cache
    from bridge.errors import IntegrityError
    from bridge.torch import BridgeReader
    shard = files_at(urls[0], settings)["__0_0.distcp"]
    moto.client().put_object(Bucket=root.bucket, Key=f"{root.key}__0_0.distcp", Body=b"\0" * shard.size)
    reader = BridgeReader(urls[0], settings=settings, cache=tmp_path / "cache")
    with pytest.raises(IntegrityError, match="changed since the save committed"):
        reader.fs.create_stream(root.join("__0_0.distcp"), "rb")


def test_a_rank_killed_mid_save_commits_nothing_and_the_next_save_does(moto, fake_gcs, azurite, emulator_env,
                                                                       tmp_path):
    from bridge import evidence
    from bridge import manifest as manifests
    from bridge.stores import get_store
    from bridge.urls import parse
    url = _bucket("s3", moto, fake_gcs, azurite) + "run/step-200/"
    died = _run(emulator_env, tmp_path, "save-and-die", url)
    assert died.returncode != 0
    settings = settings_for(emulator_env, state_dir=str(tmp_path))
    root = parse(url)
    store = get_store(root, settings)
    assert not manifests.committed(store, root)
    assert not evidence.records_above(store, root)
    check = mcbridge("verify", url, env=emulator_env, state_dir=tmp_path)
    assert check.returncode != 0 and "incomplete" in check.stderr + check.stdout
    from bridge.errors import ManifestError
    from bridge.torch import BridgeReader
    with pytest.raises(ManifestError, match="not committed"):
        BridgeReader(url, settings=settings).read_metadata()

    assert any((tmp_path / "dcp").iterdir())   # the killed ranks' scratch folders
    again = _run(emulator_env, tmp_path, "save,load", url)
    assert again.returncode == 0, again.stderr[-3000:]
    assert not any((tmp_path / "dcp").iterdir())   # theirs removed by the next save, its own after it
    assert _verified(url, settings)


def test_a_save_behind_killed_mid_upload_is_finished_by_the_next_start(moto, fake_gcs, azurite, emulator_env,
                                                                      tmp_path):
    from bridge import manifest as manifests
    from bridge.stores import get_store
    from bridge.torch import pending
    from bridge.urls import parse
    url = _bucket("az", moto, fake_gcs, azurite) + "run/step-300/"
    staging = tmp_path / "lustre"
    slow = dict(emulator_env, MCBRIDGE_BWLIMIT="16KiB")   # ~75 kB to send: seconds, killed inside them
    died = _run(slow, tmp_path, "behind", url, str(staging), "die")
    assert died.returncode == -signal.SIGKILL, died.stderr[-3000:]
    assert "returned" in died.stdout          # the save had returned before its upload
    settings = settings_for(emulator_env, state_dir=str(tmp_path))
    root = parse(url)
    store = get_store(root, settings)
    assert not manifests.committed(store, root)
    assert pending(staging) == [str(root)]

    resumed = _run(emulator_env, tmp_path, "behind", url, str(staging), "resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert pending(staging) == []
    assert "bit-identical" in resumed.stdout
    assert _verified(url, settings)


def test_a_save_under_a_watched_policy_replicates_at_commit(moto, fake_gcs, azurite, emulator_env, tmp_path):
    src = _bucket("s3", moto, fake_gcs, azurite)
    gs = _bucket("gs", moto, fake_gcs, azurite) + "dr/"
    policy_file = tmp_path / "policies.yaml"
    policy_file.write_text(f"policies:\n  train:\n    source: {src}run/\n    destinations: [{gs}]\n"
                           f"    checkpoints: \"step-*\"\n    keep_last: 2\n    watch: {{interval: 300s}}\n")
    env = dict(emulator_env, MCBRIDGE_STATE_DIR=str(tmp_path), XDG_CONFIG_HOME=NO_CONFIG)
    watcher = subprocess.Popen([*MCBRIDGE, "replicate", "--policy", str(policy_file), "--watch", "--json"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    events: list[dict] = []
    threading.Thread(target=lambda: events.extend(json.loads(line) for line in watcher.stdout), daemon=True).start()
    try:
        # the watch's first listing, of an empty source, is behind it: its next is 300 s away
        while not any(e.get("event") == "waiting" or e.get("event") == "run" for e in list(events)):
            assert watcher.poll() is None, watcher.stderr.read()
            time.sleep(0.05)
        saved = _run(emulator_env, tmp_path, "save", f"{src}run/step-100/")
        assert saved.returncode == 0, saved.stderr[-3000:]
        while True:   # the announced commit wakes the policy: no listing interval waited for
            runs = [e for e in list(events) if e.get("event") == "run" and e.get("checkpoints") == ["step-100"]]
            if runs:
                break
            assert watcher.poll() is None, watcher.stderr.read()
            time.sleep(0.05)
    finally:
        watcher.send_signal(signal.SIGINT)
        try:
            watcher.wait(timeout=30)
        except subprocess.TimeoutExpired:
            watcher.kill()
    assert any(e.get("event") == "announced" and e["committed"] == [f"{src}run/step-100/"] for e in events)
    row = runs[0]["destinations"][gs]
    assert row["checkpoints"]["step-100"]["verified"] is True
    assert row["commit_to_verified_s"] is not None
    status = mcbridge("policy", "status", str(policy_file), "--json", env=emulator_env, state_dir=tmp_path)
    assert status.returncode == 0, status.stderr
    assert '"commit_to_verified_s": null' not in status.stdout and "commit_to_verified_s" in status.stdout, status.stdout


def test_publish_a_save_pretrained_folder(moto, fake_gcs, azurite, emulator_env, tmp_path):
    import struct

    from bridge import manifest as manifests
    from bridge.errors import InvalidOption
    from bridge.stores import get_store
    from bridge import publish
    from bridge.urls import parse
    folder = tmp_path / "model"
    folder.mkdir()

    def shard(name: str, n: int) -> None:
        header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
        (folder / name).write_bytes(struct.pack("<Q", len(header)) + header + os.urandom(4 * n))

    shard("model-00001-of-00002.safetensors", 1000)
    shard("model-00002-of-00002.safetensors", 500)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    (folder / "config.json").write_text("{}")
    (folder / "tokenizer.json").write_text("{}")
    settings = settings_for(emulator_env, state_dir=str(tmp_path))
    url = _bucket("gs", moto, fake_gcs, azurite) + "models/m1/"
    report = publish(folder, url, settings=settings)
    root = parse(url)
    record = manifests.read(get_store(root, settings), root)
    assert record is not None and len(record.files) == 5 and report["manifest"]
    announced = list((tmp_path / "announced").glob("*.json"))
    assert [json.loads(p.read_text())["url"] for p in announced] == [str(root)]

    # a shard cut short is refused before any byte moves
    data = (folder / "model-00002-of-00002.safetensors").read_bytes()
    (folder / "model-00002-of-00002.safetensors").write_bytes(data[:-10])
    other = _bucket("gs", moto, fake_gcs, azurite) + "models/m2/"
    with pytest.raises(InvalidOption, match="model-00002-of-00002.safetensors"):
        publish(folder, other, settings=settings)
    assert not list(get_store(parse(other), settings).walk(parse(other)))


def test_bridge_and_publish_go_without_torch_and_the_writer_says_what_is_missing(tmp_path):
    code = ("import sys; sys.modules['torch'] = None\n"   # as if PyTorch were not installed
            "import bridge.torch, bridge.ops\n"
            "import bridge\n"
            "from bridge.errors import MissingBackend\n"
            "from bridge.registry import install_hint\n"
            "print(bridge.torch.publish.__name__, bridge.publish is bridge.torch.publish)\n"
            "try:\n    bridge.torch.BridgeWriter\nexcept MissingBackend as exc:\n"
            "    print(str(exc) == 'bridge.torch needs PyTorch: ' + install_hint('torch'))\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, XDG_CONFIG_HOME=NO_CONFIG, MCBRIDGE_STATE_DIR=str(tmp_path)))
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["publish True", "True"]


if __name__ == "__main__":
    main(sys.argv[1:])
