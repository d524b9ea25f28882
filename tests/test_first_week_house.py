"""Cost in one home and a plan's usage through one method; the rough edges a newcomer hits in
the first week (money printed one way, install hints, the cache at exit, the demo, ...)."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.packing import job as packing
from bridge.packing import unpack
from bridge.pipeline import plan as planning
from bridge.policies.cost import usage as counting
from tests.emulators import unique_name
from tests.helpers import NO_CONFIG, mcbridge, settings_for
from tests.test_workers_service import service  # noqa: F401  (the fixture: a namespace, workers, the CLI)

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, XDG_CONFIG_HOME="/nonexistent")


def _tree(root: Path) -> None:
    for i in range(12):
        path = root / f"s{i % 3}" / f"x{i:02d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(100 + i))


def test_every_job_kinds_plan_reports_its_usage_through_one_method(tmp_path):
    _tree(tmp_path / "src")
    settings = settings_for(ENV, state_dir=str(tmp_path / "state"))
    copy_plan = planning.plan_copy(f"{tmp_path}/src/", f"{tmp_path}/dst/", settings, settings.transfer.chunk_size)
    pack_plan = packing.plan_pack(f"{tmp_path}/src/", f"{tmp_path}/set/", settings)
    packing.pack(f"{tmp_path}/src/", f"{tmp_path}/set/", settings)
    unpack_plan = unpack.plan_unpack(f"{tmp_path}/set/", f"{tmp_path}/back/", settings)
    try:
        for plan, route in ((copy_plan, "direct"), (pack_plan, "pack"), (unpack_plan, "unpack")):
            parameters = list(inspect.signature(type(plan).usage).parameters.values())[1:]
            assert parameters[0].name == "route" and parameters[0].default is None, type(plan)
            assert all(p.default is not inspect.Parameter.empty for p in parameters), type(plan)
            used = plan.usage()
            assert isinstance(used, counting.Usage) and used.route == route and used.files == 12
            assert plan.usage(route=route).to_dict() == used.to_dict()
        assert copy_plan.usage(route="pack").objects_written == 1     # what the pack route would cut
        for plan in (pack_plan, unpack_plan):
            with pytest.raises(ValueError, match="runs by route"):
                plan.usage(route="direct")
    finally:
        unpack_plan.close()
    # the other ways are gone: counting is asked by the plans only
    for old in ("usage", "of_plan", "pack_usage", "unpack_usage"):
        assert not hasattr(counting, old), old


@pytest.mark.parametrize("old", ["bridge.estimate", "bridge.costing", "bridge.money", "bridge.policies.prices",
                                 "bridge.workers.budgets"])
def test_cost_left_no_module_at_its_old_paths(old):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


def test_the_cost_home_maps_every_piece_and_its_io_half_says_so():
    home = importlib.import_module("bridge.policies.cost")
    pure = sorted(p.name for p in (ROOT / "policies" / "cost").glob("*.py") if p.name != "__init__.py")
    assert pure == ["budgets.py", "model.py", "money.py", "prices.py", "usage.py"]
    for name in pure + ["bridge/pricing.py", "workers/redisbudgets.py", "bridge/meter.py", "policies.routes"]:
        assert name in home.__doc__, name
    for io_half in ("bridge.pricing", "bridge.workers.redisbudgets"):
        assert "I/O half" in importlib.import_module(io_half).__doc__.split("\n\n")[0], io_half


# -- one money formatter --------------------------------------------------------------------------

def _estimate(src: str, dst: str, emulator_env: dict[str, str]) -> float:
    from bridge import pricing
    from bridge.config import load_settings
    settings = load_settings({}, environ={**emulator_env, "XDG_CONFIG_HOME": NO_CONFIG})
    plan = planning.plan_copy(src, dst, settings, settings.transfer.chunk_size)
    return pricing.total_cost([plan.usage()], settings)


def test_a_max_cost_refusal_prints_the_digits_that_tell_the_two_amounts_apart(moto, emulator_env, tmp_path):
    bucket = unique_name()
    moto.client().create_bucket(Bucket=bucket)
    _tree(tmp_path / "src")
    src, dst = f"{tmp_path}/src/", f"s3://{bucket}/out/"
    estimate = _estimate(src, dst, emulator_env)
    assert estimate > 0
    just_under = estimate * (1 - 1e-6)      # the same amount at four significant digits
    r = mcbridge("cp", src, dst, "--max-cost", repr(just_under), env=emulator_env, state_dir=tmp_path / "state")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    shown, cap = re.search(r"estimated (\$[\d.]+) .* is over --max-cost (\$[\d.]+)", r.stderr).groups()
    assert shown != cap and float(shown[1:]) > float(cap[1:]), r.stderr
    assert moto.client().list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0   # nothing was sent
    # at the estimate itself the copy runs: not over is not over at any rounding
    r = mcbridge("cp", src, dst, "--max-cost", repr(estimate), env=emulator_env, state_dir=tmp_path / "state")
    assert r.returncode == 0, r.stderr


def test_plans_usd_column_prints_every_row_by_one_rule(moto, emulator_env, tmp_path):
    bucket = unique_name()
    moto.client().create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    for i in range(30):
        moto.client().put_object(Bucket=bucket, Key=f"corpus/{i:03d}.txt", Body=b"x" * (1000 + i))
    r = mcbridge("plan", f"s3://{bucket}/corpus/", f"{tmp_path}/out/", "--assume-available", "sts",
                 env=emulator_env, state_dir=tmp_path / "state")
    assert r.returncode == 0, r.stderr
    routes = r"[* ](direct|server|from-url|sts|datasync|pack) "
    rows = [line for line in r.stdout.splitlines() if re.match(routes, line)]
    dollars = [re.search(r" (-?\$\d+\.(\d+)) ", row) for row in rows]
    assert len(rows) == 6 and all(dollars), r.stdout
    assert len({len(d.group(2)) for d in dollars}) == 1, r.stdout     # one number of decimals
    assert len({d.group(1) for d in dollars}) > 1, r.stdout            # of amounts that differ


def test_a_copy_between_two_local_folders_says_no_cloud_charges(tmp_path):
    _tree(tmp_path / "src")
    r = mcbridge("plan", f"{tmp_path}/src/", f"{tmp_path}/dst/", env=ENV, state_dir=tmp_path / "state")
    assert r.returncode == 0, r.stderr
    assert "local -> local: no cloud charges (neither end is in a cloud)" in r.stdout
    assert "site:local -> site:local" not in r.stdout and "no charge\n" not in r.stdout


def test_jobs_lists_usd_column_prints_every_row_by_one_rule():
    from types import SimpleNamespace as Record
    from bridge.workers.commands.job_control import _cost_column
    records = [Record(id="spent", spent_usd=1.0301, estimate_usd=0.9, replicas=None),
               Record(id="estimated", spent_usd=None, estimate_usd=0.0000123, replicas=None),
               Record(id="unpriced", spent_usd=None, estimate_usd=None, replicas=None),
               Record(id="policy", spent_usd=0.0136, estimate_usd=None, replicas={"gs://b/dr/": {"spent_usd": 0.0136}})]
    shown = _cost_column(records)
    assert shown == {"spent": "$1.03010000", "estimated": "~$0.00001230", "unpriced": "-", "policy": "$0.01360000",
                     ("policy", "gs://b/dr/"): "$0.01360000"}


# -- rough edges ----------------------------------------------------------------------------------

FILL_COLD = """
import fsspec, webdataset
from bridge import cache
webdataset.gopen_schemes["bridgecache"] = cache.gopen_handler()   # held by webdataset until exit
stream = webdataset.gopen("bridgecache://{url}")
assert len(stream.read()) == {size}
print(cache.fetch("{url}"))
with fsspec.open("bridgecache::{url}") as f:
    assert len(f.read()) == {size}
"""


def test_a_script_that_fills_the_cache_cold_exits_with_an_empty_stderr(moto, tmp_path):
    bucket = unique_name()
    moto.create_bucket(bucket)
    moto.client().put_object(Bucket=bucket, Key="shards/000.tar", Body=os.urandom(3 * 1024 * 1024))
    url = f"s3://{bucket}/shards/000.tar"
    env = {**ENV, **moto.env(), "MCBRIDGE_CACHE_DIR": str(tmp_path / "cache"), "MCBRIDGE_STATE_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", FILL_COLD.format(url=url, size=3 * 1024 * 1024)], env=env,
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith(str(tmp_path / "cache")), r.stderr
    assert r.stderr == ""


def test_the_bridgecache_filesystem_lists_a_folder_and_an_object(moto, tmp_path, monkeypatch):
    import fsspec
    from bridge.cache.fs import BridgeCacheFileSystem
    bucket = unique_name()
    moto.create_bucket(bucket)
    for key, size in (("shards/000.tar", 10), ("shards/001.tar", 20), ("shards/deeper/x.bin", 5)):
        moto.client().put_object(Bucket=bucket, Key=key, Body=b"x" * size)
    settings = settings_for({**ENV, **moto.env()}, state_dir=str(tmp_path / "state"))
    settings = settings.model_copy(update={"cache": settings.cache.model_copy(update={"dir": str(tmp_path / "c")})})
    fs = BridgeCacheFileSystem(settings=settings, skip_instance_cache=True)
    shards = f"s3://{bucket}/shards"
    assert fs.ls(f"{shards}/", detail=False) == [f"{shards}/000.tar", f"{shards}/001.tar", f"{shards}/deeper"]
    listed = {e["name"]: (e["type"], e["size"]) for e in fs.ls(f"s3://{bucket}/shards")}
    assert listed[f"s3://{bucket}/shards/001.tar"] == ("file", 20)
    assert listed[f"s3://{bucket}/shards/deeper"] == ("directory", 0)
    assert fs.ls(f"s3://{bucket}/shards/000.tar", detail=False) == [f"s3://{bucket}/shards/000.tar"]
    assert fs.isdir(f"s3://{bucket}/shards") and not fs.exists(f"s3://{bucket}/none/")
    assert sorted(fs.find(f"s3://{bucket}/")) == [f"s3://{bucket}/shards/000.tar", f"s3://{bucket}/shards/001.tar",
                                                  f"s3://{bucket}/shards/deeper/x.bin"]
    # the chained form names entries as fsspec gave the path
    chained = BridgeCacheFileSystem(target_protocol="s3", settings=settings, skip_instance_cache=True)
    assert chained.ls(f"{bucket}/shards/deeper", detail=False) == [f"{bucket}/shards/deeper/x.bin"]
    assert fsspec.get_filesystem_class("bridgecache") is BridgeCacheFileSystem
    with pytest.raises(FileNotFoundError):
        fs.ls(f"s3://{bucket}/none/")


def test_cp_skip_existing_of_a_recorded_copy_writes_no_commit_and_counts_what_it_skipped(moto, emulator_env, tmp_path):
    bucket = unique_name()
    moto.create_bucket(bucket)
    _tree(tmp_path / "src")
    src, dst = f"{tmp_path}/src/", f"s3://{bucket}/copy/"

    def commits() -> list[str]:
        listed = moto.client().list_objects_v2(Bucket=bucket, Prefix="copy/_bridge/log/")
        return sorted(o["Key"] for o in listed.get("Contents", []))

    first = mcbridge("cp", src, dst, env=emulator_env, state_dir=tmp_path / "state")
    assert first.returncode == 0 and len(commits()) == 1, first.stderr
    again = mcbridge("cp", src, dst, "--skip-existing", env=emulator_env, state_dir=tmp_path / "state")
    assert again.returncode == 0, again.stderr
    assert "copied 0 files" in again.stdout and "12 skipped (equal at the destination)" in again.stdout, again.stdout
    assert len(commits()) == 1                     # nothing sent, nothing new to record: no commit
    as_json = mcbridge("cp", src, dst, "--skip-existing", "--json", env=emulator_env, state_dir=tmp_path / "state")
    assert json.loads(as_json.stdout)["skipped"] == 12 and len(commits()) == 1
    # one file new: it is sent and committed, the others still counted as skipped
    (tmp_path / "src" / "new.bin").write_bytes(b"new")
    more = mcbridge("cp", src, dst, "--skip-existing", env=emulator_env, state_dir=tmp_path / "state")
    assert "copied 1 file" in more.stdout and "12 skipped" in more.stdout and len(commits()) == 2, more.stdout


def test_the_demo_leaves_nothing_in_tmpdir(tmp_path):
    """scripts/demo.sh makes its ~150 MiB in a temporary folder of its own and removes it at the end."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in ENV.items() if not k.startswith("MCBRIDGE_")}
    r = subprocess.run(["bash", str(ROOT / "scripts" / "demo.sh")], env={**env, "TMPDIR": str(tmp)},
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "mcbridge sync" in r.stdout and "==> removed" in r.stdout
    assert list(tmp.iterdir()) == []


def test_submit_migrate_is_listed_as_a_migrate_job_and_runs_as_a_pack(service, moto, tmp_path):  # noqa: F811
    src, dst = unique_name(), unique_name()
    moto.create_bucket(src)
    moto.create_bucket(dst)
    for i in range(6):
        moto.client().put_object(Bucket=src, Key=f"corpus/{i:02d}.bin", Body=bytes([i]) * 3000)
    service.worker("w1", concurrency=1).wait_ready()
    r = service.cli("submit", "migrate", f"s3://{src}/corpus/", f"s3://{dst}/shards/", "--pack", "tar",
                    "--shard-size", "16KiB", "--wait", "--json")
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)
    assert job["kind"] == "migrate" and job["state"] == "succeeded", job
    listed = service.cli("jobs", "list")
    assert re.search(rf"^{job['id']}\s+migrate\s+succeeded", listed.stdout, re.M), listed.stdout
    shards = [o["Key"] for o in moto.client().list_objects_v2(Bucket=dst, Prefix="shards/")["Contents"]]
    assert any(k.endswith(".tar") for k in shards) and any(k.endswith(".index.json") for k in shards), shards
