"""Replication policies: the rules as pure functions, a bad file refused by line and field, and
checkpoints replicated s3 -> gs and az with keep_last and retention, run in-process."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bridge.policies import replication as rules
from tests import dcpfake
from tests.emulators import unique_name
from tests.helpers import mcbridge, settings_for

GOOD = """\
policies:
  golden:
    source: s3://models/golden/
    destinations: [gs://dr-models/golden/, az://dr-models/golden/]
    checkpoints: "step-*"
    keep_last: 2
    max_cost_usd: 5
    schedule: {cron: "0 2 * * *"}
    mode: mirror
"""


def policy(**fields) -> rules.Policy:
    return rules.Policy(**{"source": "s3://models/golden/",
                           "destinations": ["gs://dr-models/golden/", "az://dr-models/golden/"], **fields})


def test_natural_order_and_the_window():
    names = ["step-1000", "step-20", "step-300", "step-100", "other", "step-9"]
    p = policy(checkpoints="step-*", keep_last=2)
    assert rules.checkpoints(p, names) == ["step-9", "step-20", "step-100", "step-300", "step-1000"]
    assert rules.window(p, names) == ["step-300", "step-1000"]
    assert sorted(names)[-2:] != rules.window(p, names)   # plain string order would keep step-300, step-9
    assert rules.window(policy(checkpoints="step-*"), names)[0] == "step-9"


def test_include_exclude():
    """The command line's globs (rclone's; tests/test_filters.py compares them with rclone itself):
    every include first, then every exclude, then the rest left out."""
    p = policy(include=["*.safetensors", "/config/*.json"], exclude=["*.tmp"])
    assert rules.wants(p, "model-00001.safetensors") and rules.wants(p, "sub/model.safetensors")
    assert rules.wants(p, "config/a.json") and not rules.wants(p, "notes.txt")
    assert not rules.wants(p, "sub/config/a.json") and not rules.wants(p, "config/x/a.json")   # anchored, one level
    assert not rules.wants(p, "model.safetensors.tmp")
    # an include matched first wins over a later exclude, as with --include/--exclude
    assert rules.wants(policy(include=["*.safetensors"], exclude=["*.tmp.safetensors"]), "model.tmp.safetensors")
    assert not rules.wants(policy(exclude=["*.tmp.safetensors"]), "model.tmp.safetensors")
    assert not rules.wants(policy(exclude=["optimizer/"]), "optimizer/state.pt")
    assert rules.wants(policy(), "anything/at/all")


def test_retention_waits_for_the_newest_at_every_destination():
    p = policy(checkpoints="step-*", keep_last=2, mode="mirror")
    gs, az = p.destinations
    kept = ["step-1000", "step-2000"]
    present = {gs: {"step-300", "step-1000", "step-2000"}, az: {"step-300", "step-1000", "step-2000", "step-5000"}}
    both = {gs: {"step-1000": True, "step-2000": True}, az: {"step-1000": True, "step-2000": True}}
    # step-5000 is newer than the window: not ours to remove
    assert rules.removals(p, kept, present, both) == {gs: ["step-300"], az: ["step-300"]}
    one_failed = {gs: {"step-1000": True, "step-2000": True}, az: {"step-1000": True, "step-2000": False}}
    assert rules.removals(p, kept, present, one_failed) == {}
    assert rules.removals(p, kept, present, {gs: both[gs]}) == {}           # az never answered
    assert rules.removals(policy(checkpoints="step-*", keep_last=2, mode="append-only"), kept, present, both) == {}


def test_a_good_file_parses():
    [named] = rules.parse(GOOD, "p.yaml")
    assert named.name == "golden" and named.line == 2
    assert named.policy.copies_needed == 2 and named.policy.schedule.cron == "0 2 * * *"


@pytest.mark.parametrize("change, expected", [
    (("keep_last: 2", "keep_last: 0"), r"p\.yaml:6: policies\.golden\.keep_last: Input should be greater than or equal to 1"),
    (("keep_last: 2", "keep_lsat: 2"), r"p\.yaml:6: policies\.golden\.keep_lsat: unknown field"),
    (("s3://models/golden/", "s4://models/golden/"), r"p\.yaml:3: policies\.golden\.source: unknown scheme 's4'"),
    (('cron: "0 2 * * *"', 'cron: "0 2 * *"'), r"p\.yaml:8: policies\.golden\.schedule: .*has 4 fields"),
    (("max_cost_usd: 5", "max_cost_usd: lots"), r"p\.yaml:7: policies\.golden\.max_cost_usd: Input should be a valid number"),
    (("keep_last: 2", "keep_last: 2\n    verify: none"), r"p\.yaml:7: policies\.golden\.verify: .*verify must be store or deep"),
    (("keep_last: 2", "keep_last: 2\n    min_verified_copies: 3"),
     r"p\.yaml:7: policies\.golden\.min_verified_copies: min_verified_copies 3 is more than the 2"),
    (("destinations: [gs://dr-models/golden/, az://dr-models/golden/]", "destinations: []"),
     r"p\.yaml:4: policies\.golden\.destinations: List should have at least 1 item"),
])
def test_a_bad_file_names_line_and_field(change, expected):
    with pytest.raises(rules.PolicyError) as caught:
        rules.parse(GOOD.replace(*change), "p.yaml")
    assert re.search(expected, str(caught.value)), str(caught.value)


def test_every_mistake_between_fields_is_named_in_one_run_each_by_its_line():
    text = GOOD.replace("keep_last: 2", "keep_last: 2\n    verify: none\n    min_verified_copies: 3")
    with pytest.raises(rules.PolicyError) as caught:
        rules.parse(text, "p.yaml")
    assert caught.value.problems == [
        "p.yaml:8: policies.golden.min_verified_copies: min_verified_copies 3 is more than the 2 destinations",
        "p.yaml:7: policies.golden.verify: mode mirror removes old checkpoints only once the newest is proven: "
        "verify must be store or deep (or use mode append-only)"]


def test_policy_check_command(tmp_path):
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(GOOD)
    bad.write_text(GOOD.replace("keep_last: 2", "keep_last: -1").replace("checkpoints: \"step-*\"", "checkpoints: 7"))
    r = mcbridge("policy", "check", str(good), env={}, state_dir=tmp_path)
    assert r.returncode == 0 and "golden: s3://models/golden/step-*" in r.stdout and "1 policy OK" in r.stdout
    r = mcbridge("policy", "check", str(bad), env={}, state_dir=tmp_path)
    assert r.returncode == 2, r.stdout
    lines = r.stderr.strip().splitlines()
    assert lines == [f"mcbridge: error: {bad}:5: policies.golden.checkpoints: Input should be a valid string",
                     f"mcbridge: error: {bad}:6: policies.golden.keep_last: Input should be greater than or equal to 1"]
    r = mcbridge("policy", "check", str(tmp_path / "missing.yaml"), env={}, state_dir=tmp_path)
    assert r.returncode == 2 and "cannot read the policy file" in r.stderr and "Traceback" not in r.stderr


# -- in-process runs against the emulators ------------------------------------------------------

def _put_checkpoint(moto, bucket: str, name: str) -> None:
    """Shards and the DCP .metadata that names them, written last: committed by evidence."""
    client = moto.client()
    shards = {}
    for i in range(3):
        body = f"{name}:{i}".encode() * 500
        client.put_object(Bucket=bucket, Key=f"golden/{name}/shard-{i}.bin", Body=body)
        shards[f"shard-{i}.bin"] = [len(body)]
    client.put_object(Bucket=bucket, Key=f"golden/{name}/config.json", Body=b'{"step": "%s"}' % name.encode())
    client.put_object(Bucket=bucket, Key=f"golden/{name}/.metadata", Body=dcpfake.metadata(shards))


def _checkpoints_at(url: str, settings) -> set[str]:
    from bridge.stores import get_store
    from bridge.urls import parse
    root = parse(url)
    return {rel.split("/", 1)[0] for rel, _ in get_store(root, settings).walk(root) if "/" in rel}


def _replicate(policy_file: Path, env, tmp_path) -> tuple[int, dict, str]:
    r = mcbridge("replicate", "--policy", str(policy_file), "--name", "golden", "--once", "--json",
                 env=env, state_dir=tmp_path)
    return r.returncode, json.loads(r.stdout) if r.stdout.strip() else {}, r.stderr


def test_keep_last_two_replicated_to_two_clouds_then_the_window_moves(moto, fake_gcs, azurite, emulator_env,
                                                                      tmp_path):
    src, gbucket, container = unique_name(), unique_name(), unique_name()
    moto.create_bucket(src)
    fake_gcs.create_bucket(gbucket)
    azurite.create_bucket(container)
    for name in ("step-20", "step-100", "step-300", "step-1000"):
        _put_checkpoint(moto, src, name)
    gs, az = f"gs://{gbucket}/dr/golden/", f"az://{container}/dr/golden/"
    policy_file = tmp_path / "policies.yaml"
    policy_file.write_text(f"""\
policies:
  golden:
    source: s3://{src}/golden/
    destinations: [{gs}, {az}]
    checkpoints: "step-*"
    keep_last: 2
    mode: mirror
    verify: deep
    max_cost_usd: 1
  other:
    source: s3://{src}/elsewhere/
    destinations: [{gs}x/]
""")
    settings = settings_for(emulator_env)

    # four checkpoints: the newest two by natural order reach both clouds, verified
    code, report, stderr = _replicate(policy_file, emulator_env, tmp_path)
    assert code == 0, stderr
    [run] = report["policies"]
    assert run["checkpoints"] == ["step-300", "step-1000"]
    for dst in (gs, az):
        assert _checkpoints_at(dst, settings) == {"step-300", "step-1000"}
        assert all(row["verified"] for row in run["destinations"][dst]["checkpoints"].values())
        assert run["destinations"][dst]["last_proven_equal"]
        for ckpt in ("step-300", "step-1000"):
            check = mcbridge("verify", f"{dst}{ckpt}/", "--deep", env=emulator_env, state_dir=tmp_path)
            assert check.returncode == 0, check.stdout + check.stderr
    assert run["removed"] == {} and run["verified_copies"] == 2
    for dst in (gs, az):   # the destination root: each checkpoint is a committed copy of its own
        root = mcbridge("verify", dst, "--json", env=emulator_env, state_dir=tmp_path)
        assert root.returncode == 0, root.stdout + root.stderr
        copies = json.loads(root.stdout)["copies"]
        assert [(c["prefix"], c["ok"]) for c in copies] == [("step-1000/", True), ("step-300/", True)]

    # a fifth checkpoint moves the window: step-300 leaves both destinations
    _put_checkpoint(moto, src, "step-2000")
    code, report, stderr = _replicate(policy_file, emulator_env, tmp_path)
    assert code == 0, stderr
    [run] = report["policies"]
    assert run["checkpoints"] == ["step-1000", "step-2000"]
    assert run["removed"] == {gs: ["step-300"], az: ["step-300"]}
    assert run["destinations"][gs]["checkpoints"]["step-1000"]["sent"] == 0      # already there, proven
    for dst in (gs, az):
        assert _checkpoints_at(dst, settings) == {"step-1000", "step-2000"}

    # one destination failing (Azure refuses a wrong key): nothing is removed anywhere
    _put_checkpoint(moto, src, "step-3000")
    wrong = dict(emulator_env, AZURE_STORAGE_CONNECTION_STRING=re.sub(
        r"AccountKey=[^;]+", "AccountKey=" + "A" * 86 + "==", emulator_env["AZURE_STORAGE_CONNECTION_STRING"]))
    code, report, stderr = _replicate(policy_file, wrong, tmp_path)
    assert code == 1
    [run] = report["policies"]
    assert run["checkpoints"] == ["step-2000", "step-3000"] and run["removed"] == {}
    assert run["destinations"][az]["error"] and run["verified_copies"] == 1
    assert _checkpoints_at(gs, settings) == {"step-1000", "step-2000", "step-3000"}
    assert _checkpoints_at(az, settings) == {"step-1000", "step-2000"}
    assert mcbridge("verify", f"{gs}step-3000/", env=emulator_env, state_dir=tmp_path).returncode == 0

    # Azure back: the newest is proven at both, and step-1000 goes from both
    code, report, stderr = _replicate(policy_file, emulator_env, tmp_path)
    assert code == 0, stderr
    assert report["policies"][0]["removed"] == {gs: ["step-1000"], az: ["step-1000"]}
    for dst in (gs, az):
        assert _checkpoints_at(dst, settings) == {"step-2000", "step-3000"}


def test_a_policy_over_its_budget_sends_nothing(moto, fake_gcs, emulator_env, tmp_path):
    src, gbucket = unique_name(), unique_name()
    moto.create_bucket(src)
    fake_gcs.create_bucket(gbucket)
    _put_checkpoint(moto, src, "step-1")
    policy_file = tmp_path / "p.yaml"
    policy_file.write_text(f"policies:\n  golden:\n    source: s3://{src}/golden/\n"
                           f"    destinations: [gs://{gbucket}/dr/]\n    max_cost_usd: 0\n")
    r = mcbridge("replicate", "--policy", str(policy_file), "--once", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 1 and "policy golden refused: estimated $" in r.stderr and "over --max-cost $0.00" in r.stderr
    assert _checkpoints_at(f"gs://{gbucket}/", settings_for(emulator_env)) == set()


def test_lag_and_the_verdict_of_a_run():
    policy = rules.Policy.model_validate({"source": "s3://models/golden/", "destinations": ["gs://dra/x/", "az://bbb/x/"],
                                    "checkpoints": "step-*", "min_verified_copies": 1})
    source = ["step-20", "step-300", "step-1000", "notes"]
    assert rules.lag(policy, source, ["step-1000"]) == {"newest_source": "step-1000", "newest_verified": "step-1000",
                                                        "lag_checkpoints": 0}
    assert rules.lag(policy, source, ["step-20"])["lag_checkpoints"] == 2      # natural order: 300 and 1000
    assert rules.lag(policy, source, [])["lag_checkpoints"] == 3              # never verified: all behind
    kept = ["step-300", "step-1000"]
    one = {"gs://dra/x/": {"step-300": True, "step-1000": True}, "az://bbb/x/": {"step-1000": False}}
    assert rules.outcome(policy, kept, one) == (1, True)                      # one copy is enough here
    assert rules.outcome(policy.model_copy(update={"min_verified_copies": None}), kept, one) == (1, False)
    assert rules.outcome(policy, [], one) == (0, False)


def test_beat_checks_the_policy_file(tmp_path):
    good = tmp_path / "p.yaml"
    good.write_text("policies:\n  golden:\n    source: s3://models/golden/\n    destinations: [gs://dra/x/]\n"
                    "    schedule: {cron: \"0 2 * * *\"}\n  adhoc:\n    source: s3://models/other/\n"
                    "    destinations: [gs://dra/y/]\n")
    r = mcbridge("beat", "--policies", str(good), "--check", env={}, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "policy golden: cron '0 2 * * *'" in r.stdout and "1 scheduled policies OK" in r.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("0 2 * * *", "0 25 * * *"))
    r = mcbridge("beat", "--policies", str(bad), "--check", env={}, state_dir=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == f"mcbridge: error: {bad}:5: policies.golden.schedule: cron '0 25 * * *': " \
                               f"hour '25' is not in 0-23", r.stderr
    assert mcbridge("policy", "check", str(bad), env={}, state_dir=tmp_path).stderr == r.stderr


def test_append_only_never_deletes_at_a_destination(moto, fake_gcs, emulator_env, tmp_path):
    src, gbucket = unique_name(), unique_name()
    moto.create_bucket(src)
    fake_gcs.create_bucket(gbucket)
    for name in ("step-1", "step-2"):
        _put_checkpoint(moto, src, name)
    gs = f"gs://{gbucket}/dr/"
    policy_file = tmp_path / "p.yaml"
    policy_file.write_text(f"policies:\n  golden:\n    source: s3://{src}/golden/\n    destinations: [{gs}]\n"
                           f"    keep_last: 2\n    mode: append-only\n    verify: none\n")
    code, report, stderr = _replicate(policy_file, emulator_env, tmp_path)
    assert code == 0, stderr
    # a file gone from a checkpoint in the window stays at the destination, and so does the
    # checkpoint the window left
    moto.client().delete_object(Bucket=src, Key="golden/step-2/config.json")   # not one its .metadata names
    _put_checkpoint(moto, src, "step-3")
    code, report, stderr = _replicate(policy_file, emulator_env, tmp_path)
    assert code == 0, stderr
    assert report["policies"][0]["removed"] == {}
    settings = settings_for(emulator_env)
    assert report["policies"][0]["checkpoints"] == ["step-2", "step-3"]
    assert _checkpoints_at(gs, settings) == {"step-1", "step-2", "step-3"}
    from bridge.stores import get_store
    from bridge.urls import parse
    assert get_store(parse(gs), settings).info(parse(f"{gs}step-2/config.json")).size > 0




_DCP = {"__0_0.distcp": 1000, "__1_0.distcp": 1000}
_INDEX = json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})
_ST = {"model-00001-of-00002.safetensors": 500, "model-00002-of-00002.safetensors": 500}
_CASES = {   # what step-2 holds at the source, and what its files say: (files, evidence, ready)
    "DCP .metadata without a shard": ({".metadata": 300, "__0_0.distcp": 1000}, rules.Evidence(dcp=_DCP), {}),
    "DCP .metadata with a short shard": ({".metadata": 300, "__0_0.distcp": 1000, "__1_0.distcp": 10},
                                         rules.Evidence(dcp=_DCP), {}),
    "safetensors index naming a 0-byte shard": (
        {"model.safetensors.index.json": 90, "model-00001-of-00002.safetensors": 500,
         "model-00002-of-00002.safetensors": 0},
        rules.Evidence(indexes={"model.safetensors.index.json": _INDEX},
                       safetensors={**_ST, "model-00002-of-00002.safetensors": "0 bytes, under the 8-byte header"}), {}),
    "safetensors index naming a short shard": (
        {"model.safetensors.index.json": 90, "model-00001-of-00002.safetensors": 500,
         "model-00002-of-00002.safetensors": 200},
        rules.Evidence(indexes={"model.safetensors.index.json": _INDEX}, safetensors=_ST), {}),
    "commit_success.txt alone": ({"commit_success.txt": 30}, rules.Evidence(), {}),
    "lone model.safetensors cut short": ({"model.safetensors": 100},
                                         rules.Evidence(safetensors={"model.safetensors": 500}), {}),
    "a marker-first writer, its .metadata naming shards not there yet": (
        {".metadata": 300}, rules.Evidence(dcp=_DCP), {"marker": ".metadata"}),
    "a marker-first writer of no known layout (taken on trust)": ({"DONE": 0, "shard-0.bin": 10}, rules.Evidence(),
                                                                  {"marker": "DONE"}),
    "a bridge record that holds only some files": ({"a.bin": 10, "b.bin": 10},
                                                   rules.Evidence(recorded={"a.bin": "s3://src/golden/"}), {}),
}


@pytest.mark.parametrize("case", sorted(_CASES))
def test_retention_never_removes_the_last_good_copy(case):
    """Whatever the newer checkpoint's state, even copied and verified as it was listed, the
    older complete one leaves a destination only when the newer one is committed by evidence."""
    files, ev, ready = _CASES[case]
    p = policy(checkpoints="step-*", keep_last=1, mode="mirror", destinations=["gs://dra/x/"], ready=ready)
    dst = p.destinations[0]
    whole = rules.Evidence(dcp=_DCP)
    listing = {"step-1": {".metadata": rules.SourceFile(300, 50.0), **{n: rules.SourceFile(s, 50.0)
                                                                     for n, s in _DCP.items()}},
               "step-2": {n: rules.SourceFile(s, 100.0) for n, s in files.items()}}
    if ready:   # the older one was written by the same writer: its marker is there too
        listing["step-1"][ready["marker"]] = rules.SourceFile(0, 50.0)
    readiness = rules.assess(p, listing, now=1000, evidence={"step-1": whole, "step-2": ev})
    assert readiness["step-1"].committed and not readiness["step-1"].trusted
    assert not readiness["step-2"].committed or readiness["step-2"].trusted, readiness["step-2"]
    verified = {dst: {"step-2": True}}
    assert rules.removals(p, ["step-2"], {dst: {"step-1", "step-2"}}, verified, readiness) == {}
    # the control: the same step-2 once whole by its own files is a good copy, and step-1 goes
    done = {"step-2": {**listing["step-1"]}}
    proven = rules.assess(p.model_copy(update={"ready": rules.Ready()}), {**listing, **done}, now=1000,
                          evidence={"step-1": whole, "step-2": whole})
    assert rules.removals(p, ["step-2"], {dst: {"step-1", "step-2"}}, verified, proven) == {dst: ["step-1"]}


def test_a_bridge_commit_counts_only_for_the_files_it_holds_as_listed():
    """A commit under _bridge/log/ is bridge's claim about the files it wrote: it commits the
    checkpoint only where its entries hold every file with the size and version listed now."""
    p = policy(checkpoints="step-*")
    listing = {"step-1": {"a.bin": rules.SourceFile(10, 1.0), "b.bin": rules.SourceFile(10, 1.0),
                          "_bridge/log/c-000000000001-1733065200000-0f3c9a1b2d4e.json": rules.SourceFile(900, 2.0)}}
    held = rules.assess(p, listing, now=100, evidence={"step-1": rules.Evidence(
        recorded={"a.bin": "s3://src/golden/step-1/", "b.bin": "s3://src/golden/step-1/"})})
    assert held["step-1"].committed and not held["step-1"].trusted
    rewritten = rules.assess(p, listing, now=100, evidence={"step-1": rules.Evidence(
        recorded={"a.bin": "s3://src/golden/step-1/"})})
    assert rules.waiting(rewritten) == {"step-1": "bridge commit at s3://src/golden/step-1/ holds 1 of its 2 files; "
                                                  "not: b.bin"}
    none = rules.assess(p, listing, now=100)
    assert rules.waiting(none) == {"step-1": "its bridge commit (_bridge/log/) holds none of its 2 files as listed"}
