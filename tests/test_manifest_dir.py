"""Records kept outside the data (``--manifest-dir``, ``transfer.manifest_dir``,
``MCBRIDGE_MANIFEST_DIR``): a local destination then holds only the data, so a loader that takes
every folder for a class (torchvision's ImageFolder) or globs the tree sees no ``_bridge/``, and
every command that reads or writes a local record finds it in the manifest folder."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bridge import manifest as manifests
from bridge.errors import InvalidOption
from bridge.urls import parse
from tests.helpers import mcbridge, settings_for
from tests.test_workers_service import service  # noqa: F401  (the fixture: workers, Redis, one tenant)

CLASSES = {"cats/c1.jpg": b"\xff\xd8cat-1" * 50, "cats/c2.jpg": b"\xff\xd8cat-2" * 70,
           "dogs/d1.jpg": b"\xff\xd8dog-1" * 60, "dogs/puppies/p1.jpg": b"\xff\xd8pup" * 10}


def find_classes(directory: Path) -> list[str]:
    """The class names torchvision's ImageFolder gives a folder: the same rule as
    ``torchvision.datasets.folder.find_classes`` (torchvision/datasets/folder.py), which is
    ``sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())``. torchvision
    itself is not installed here (it pulls in torch); the rule is one line."""
    return sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def one_line_error(r, code: int, *words: str) -> None:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mcbridge: error: "), r.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_imagefolder_sees_only_the_data_classes_of_a_tree_restored_from_s3(make_root, env_for, tmp_path):
    env = env_for("s3")
    state = tmp_path / "state"

    def run(*args: str):
        return mcbridge(*args, env=env, state_dir=state)

    src = tmp_path / "dataset"
    write_tree(src, CLASSES)
    bucket = make_root("s3") + "imagenet-mini/train/"
    assert run("cp", "-q", f"{src}/", bucket).returncode == 0

    records = tmp_path / "records"
    restored = tmp_path / "restored"
    r = run("cp", "--manifest-dir", str(records), bucket, f"{restored}/")
    assert r.returncode == 0, r.stderr
    assert find_classes(restored) == ["cats", "dogs"]
    assert not any("_bridge" in p.parts for p in restored.rglob("*"))
    assert {p.relative_to(restored).as_posix() for p in restored.rglob("*") if p.is_file()} == set(CLASSES)
    # The record is under the manifest folder, by the destination's absolute path.
    logs = list((records / str(restored.resolve()).lstrip("/") / "_bridge" / "log").glob("c-*.json"))
    assert len(logs) == 1

    # verify proves the copy with the manifest folder, and says in one line that none is there without it
    ok = run("verify", "--json", "--manifest-dir", str(records), f"{restored}/")
    assert ok.returncode == 0 and json.loads(ok.stdout)["checked"] == len(CLASSES), ok.stdout + ok.stderr
    one_line_error(run("verify", f"{restored}/"), 1, "no manifest", "--manifest-dir")

    # The same restore without --manifest-dir: ImageFolder would take _bridge for a class.
    inside = tmp_path / "restored-inside"
    assert run("cp", "-q", bucket, f"{inside}/").returncode == 0
    assert find_classes(inside) == ["_bridge", "cats", "dogs"]


def test_every_command_on_a_local_record_uses_the_manifest_folder(tmp_path):
    env = dict(os.environ)
    state = tmp_path / "state"
    records = tmp_path / "records"

    def run(*args: str, **extra: str):
        return mcbridge(*args, env={**env, **extra}, state_dir=state)

    src = tmp_path / "src"
    write_tree(src, CLASSES)
    a, b = tmp_path / "a", tmp_path / "b"
    # the global option, before or after the command
    assert run("--manifest-dir", str(records), "cp", "-q", f"{src}/", f"{a}/").returncode == 0
    assert run("cp", "-q", f"{src}/", f"{b}/", "--manifest-dir", str(records)).returncode == 0
    for dst in (a, b):   # two destinations share one manifest folder, each its own record
        assert not (dst / "_bridge").exists()
        assert (records / str(dst.resolve()).lstrip("/") / "_bridge" / "log").is_dir()

    # sync reads the record there: sends only what changed, and commits there
    (src / "cats" / "c1.jpg").write_bytes(b"changed")
    s = run("sync", "--json", f"{src}/", f"{a}/", MCBRIDGE_MANIFEST_DIR=str(records))   # the setting, from the env
    assert s.returncode == 0, s.stderr
    assert json.loads(s.stdout)["sent"] == ["cats/c1.jpg"]
    assert not (a / "_bridge").exists()
    assert run("verify", "-q", "--deep", "--manifest-dir", str(records), f"{a}/").returncode == 0

    # hashsum takes the hash from the record it finds there
    rows = json.loads(run("hashsum", "sha256", "--json", "--manifest-dir", str(records), f"{a}/").stdout)
    assert {row["from"] for row in rows} == {"manifest"}, rows

    # pack and unpack: the index is data, the record is not
    packed, unpacked = tmp_path / "packed", tmp_path / "unpacked"
    assert run("--manifest-dir", str(records), "pack", "-q", f"{src}/", f"{packed}/").returncode == 0
    assert not (packed / "_bridge").exists()
    assert run("--manifest-dir", str(records), "verify", "-q", f"{packed}/").returncode == 0
    u = run("--manifest-dir", str(records), "unpack", "-q", f"{packed}/", f"{unpacked}/")
    assert u.returncode == 0, u.stderr
    assert find_classes(unpacked) == ["cats", "dogs"]

    # mv proves against the record in the manifest folder, then removes the source's record too
    moved = tmp_path / "moved"
    m = run("--manifest-dir", str(records), "mv", "-q", f"{b}/", f"{moved}/")
    assert m.returncode == 0, m.stderr
    assert not b.exists() and not (records / str(b.resolve()).lstrip("/")).exists()
    assert find_classes(moved) == ["cats", "dogs"]

    # rm -r of a whole folder removes its record from the manifest folder, commit markers first
    assert run("--manifest-dir", str(records), "rm", "-q", "-r", f"{moved}/").returncode == 0
    assert not (records / str(moved.resolve()).lstrip("/")).exists()

    # a manifest folder inside the data (or the data inside it) is refused before a byte moves
    one_line_error(run("--manifest-dir", str(tmp_path / "new" / "meta"), "cp", f"{src}/", f"{tmp_path}/new/"),
                   2, "overlap")
    assert not (tmp_path / "new").exists()
    one_line_error(run("--manifest-dir", "", "cp", f"{src}/", f"{a}/"), 2, "--manifest-dir")


def test_the_record_location_is_one_function_of_destination_and_settings(tmp_path):
    plain = settings_for(dict(os.environ))
    kept = settings_for(dict(os.environ), manifest_dir=str(tmp_path / "m"))
    data = parse(f"{tmp_path}/data/")
    assert manifests.record_root(data, plain) == data
    assert manifests.record_root(data, kept) == parse(f"{tmp_path}/m/{str(tmp_path.resolve()).lstrip('/')}/data/")
    cloud = parse("s3://bucket/data/")
    assert manifests.record_root(cloud, kept) == cloud   # only local destinations keep it elsewhere
    with pytest.raises(InvalidOption, match="overlap"):
        manifests.record_root(parse(f"{tmp_path}/m/x/"), kept)


def test_the_service_keeps_a_local_destinations_record_in_the_manifest_folder(service, make_root, tmp_path,
                                                                               tmp_path_factory):
    src = tmp_path / "src"
    write_tree(src, CLASSES)
    bucket = make_root("s3") + "train/"
    assert service.cli("cp", "-q", f"{src}/", bucket).returncode == 0
    service.worker("w1").wait_ready()
    records, restored = tmp_path / "records", tmp_path / "restored"
    result = service.cli("--manifest-dir", str(records), "submit", "cp", bucket, f"{restored}/", "--wait", "--json")
    assert result.returncode == 0, result.stderr + result.stdout
    status = json.loads(result.stdout)
    assert status["state"] == "succeeded" and status["verify"]["ok"], status
    assert find_classes(restored) == ["cats", "dogs"]
    assert (records / str(restored.resolve()).lstrip("/") / "_bridge" / "log").is_dir()
    assert service.cli("verify", "-q", "--manifest-dir", str(records), f"{restored}/").returncode == 0

    # a manifest folder is a place the job writes: outside the tenant's roots, the job is refused
    elsewhere = tmp_path_factory.mktemp("not-a-root")
    refused = service.cli("--manifest-dir", str(elsewhere), "submit", "cp", bucket, f"{tmp_path}/again/",
                          "--wait", "--json")
    assert refused.returncode != 0 and "outside" in refused.stdout + refused.stderr, refused.stdout + refused.stderr
    assert not any(elsewhere.iterdir()) and not (tmp_path / "again").exists()


def test_a_replication_source_committed_with_records_outside_the_data_is_seen_committed(tmp_path):
    from bridge import ops
    from bridge.policies import replication as rules
    from bridge.replicator import survey
    records = tmp_path / "records"
    kept = settings_for(dict(os.environ), manifest_dir=str(records), state_dir=str(tmp_path / "state"))
    plain = settings_for(dict(os.environ), state_dir=str(tmp_path / "state"))
    src, ckpts = tmp_path / "trained", tmp_path / "ckpts"
    write_tree(src, {"model.bin": b"w" * 1000, "config.json": b"{}"})
    for step in ("step-100", "step-200"):
        ops.copy(f"{src}/", f"{ckpts}/{step}/", kept)
    write_tree(ckpts, {"step-300/model.bin": b"half"})   # still being written, no commit
    assert not list(ckpts.rglob("_bridge"))
    policy = rules.Policy(source=f"{ckpts}/", destinations=["s3://dr-models/golden/"], checkpoints="step-*")
    seen = survey(policy, kept)
    assert {name for name, r in seen.items() if r.committed} == {"step-100", "step-200"}, seen
    assert all("bridge commit" in seen[name].why for name in ("step-100", "step-200"))
    # without the manifest folder, the same source shows no bridge commit
    assert not any("bridge commit" in r.why for r in survey(policy, plain).values())


def test_a_cache_fill_keeps_its_own_record_whatever_the_manifest_folder(tmp_path):
    from bridge.cache import Cache
    records = tmp_path / "records"
    settings = settings_for(dict(os.environ), manifest_dir=str(records), state_dir=str(tmp_path / "state"))
    settings = settings.model_copy(update={"cache": settings.cache.model_copy(update={"dir": str(tmp_path / "c")})})
    write_tree(tmp_path / "src", {"w.bin": b"weights" * 100})
    cache = Cache(settings)
    with open(cache.fetch(f"{tmp_path}/src/w.bin"), "rb") as f:
        assert f.read() == b"weights" * 100
    assert not records.exists()


def test_replicate_to_a_local_destination_and_verify_every_copy_under_it(tmp_path):
    env = dict(os.environ)
    state, records = tmp_path / "state", tmp_path / "records"
    ckpts, dr = tmp_path / "ckpts", tmp_path / "dr"
    write_tree(ckpts, {"step-1/model.bin": b"a" * 300, "step-2/model.bin": b"b" * 400, "step-2/x.tmp": b"t"})
    policy = tmp_path / "policies.yaml"
    policy.write_text(f"policies:\n  p:\n    source: {ckpts}/\n    destinations: [{dr}/]\n"
                      f"    checkpoints: 'step-*'\n    exclude: ['*.tmp']\n")
    r = mcbridge("--manifest-dir", str(records), "replicate", "--policy", str(policy), "--once", env=env,
                 state_dir=state)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.relative_to(dr).as_posix() for p in dr.rglob("*") if p.is_file()) == \
        ["step-1/model.bin", "step-2/model.bin"]
    # verify of the folder above the copies: each committed copy against its record
    v = mcbridge("verify", "--json", "--manifest-dir", str(records), f"{dr}/", env=env, state_dir=state)
    assert v.returncode == 0, v.stdout + v.stderr
    assert len(json.loads(v.stdout)["copies"]) == 2
    (dr / "step-2" / "extra.bin").write_bytes(b"x")
    v = mcbridge("verify", "--json", "--manifest-dir", str(records), f"{dr}/", env=env, state_dir=state)
    assert v.returncode == 1 and json.loads(v.stdout)["extra"] == ["step-2/extra.bin"], v.stdout


def test_the_manifest_folder_from_a_profile_of_the_settings_file(tmp_path):
    records, dst = tmp_path / "records", tmp_path / "dst"
    config = tmp_path / "config.yaml"
    config.write_text(f"profiles:\n  datasets:\n    transfer: {{manifest_dir: {records}}}\n")
    write_tree(tmp_path / "src", CLASSES)
    env = dict(os.environ)
    r = mcbridge("cp", "-q", "--profile", "datasets", "--config", str(config), f"{tmp_path}/src/", f"{dst}/",
                 env=env, state_dir=tmp_path / "s")
    assert r.returncode == 0, r.stderr
    assert find_classes(dst) == ["cats", "dogs"] and (records / str(dst.resolve()).lstrip("/")).is_dir()
    assert mcbridge("verify", "-q", "--profile", "datasets", "--config", str(config), f"{dst}/", env=env,
                    state_dir=tmp_path / "s").returncode == 0
