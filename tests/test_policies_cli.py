"""``mcbridge plan`` against the emulators: bucket regions found at the stores, every route
priced, exactly one chosen, --route honoured or refused on one line."""

from __future__ import annotations

import json

import pytest

from bridge.config import load_settings
from bridge.places import locate
from tests.emulators import unique_name
from tests.helpers import NO_CONFIG, mcbridge

ROUTES = ["direct", "server", "from-url", "sts", "datasync", "pack"]


@pytest.fixture
def eu_bucket(moto) -> str:
    name = unique_name()
    moto.client().create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    for i in range(30):
        moto.client().put_object(Bucket=name, Key=f"corpus/{i:03d}.txt", Body=b"x" * (1000 + i))
    return name


@pytest.fixture
def gcs_bucket(fake_gcs) -> str:
    # fake-gcs-server answers location US-CENTRAL1 for every bucket, whatever it was created with
    name = unique_name()
    fake_gcs.client().create_bucket(name, location="US-CENTRAL1")
    return name


def test_bucket_regions_come_from_the_stores(eu_bucket, gcs_bucket, emulator_env):
    settings = load_settings({"azure": {"region": "westeurope"}, "pricing": {"site": "lustre-a"}},
                             environ={**emulator_env, "XDG_CONFIG_HOME": NO_CONFIG})
    assert str(locate(f"s3://{eu_bucket}/corpus/", settings)) == "aws:eu-west-1"
    gcs = locate(f"gs://{gcs_bucket}/x/", settings)
    assert (gcs.provider, gcs.region, gcs.assumed) == ("gcp", "us-central1", False)   # asked, not defaulted
    assert str(locate("az://anything/x/", settings)) == "azure:westeurope"
    assert str(locate("/scratch/run/", settings)) == "site:lustre-a"


def test_plan_prices_every_route_and_chooses_one(eu_bucket, gcs_bucket, emulator_env, tmp_path):
    src, dst = f"s3://{eu_bucket}/corpus/", f"gs://{gcs_bucket}/corpus/"
    r = mcbridge("plan", src, dst, "--json", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["places"] == {"source": "aws:eu-west-1", "destination": "gcp:us-central1",
                                "runs_in": "site:local"}
    rows = {row["route"]: row for row in report["routes"]}
    assert list(rows) == ROUTES
    assert [row["route"] for row in report["routes"] if row["chosen"]] == ["direct"]
    for row in report["routes"]:
        assert set(row) >= {"route", "valid", "chosen", "bytes", "requests", "usd", "seconds", "why"}
        assert isinstance(row["usd"], float) and row["seconds"] > 0 and row["why"]
    assert rows["sts"]["valid"] is False and rows["sts"]["why"] == "not available in this bridge yet"
    assert rows["server"]["valid"] is False and rows["pack"]["valid"] is False
    direct = rows["direct"]
    assert direct["bytes"] == sum(1000 + i for i in range(30))
    assert direct["usage"]["source"]["requests"]["GET"] == 30
    assert direct["usage"]["destination"]["requests"]["PUT"] == 31   # 30 files and the manifest
    # nothing was written: planning lists, it does not copy
    assert list(r for r in mcbridge("ls", dst, env=emulator_env, state_dir=tmp_path).stdout.splitlines()) == []

    # with sts available it is as cheap to the cent for 30 KB, but a transfer job takes a minute to start
    r = mcbridge("plan", src, dst, "--json", "--assume-available", "sts", env=emulator_env, state_dir=tmp_path)
    rows = {row["route"]: row for row in json.loads(r.stdout)["routes"]}
    assert rows["direct"]["chosen"] and rows["sts"]["valid"] and "slower" in rows["sts"]["why"]
    r = mcbridge("plan", src, dst, "--json", "--assume-available", "sts", "--route", "sts", env=emulator_env,
                 state_dir=tmp_path)
    assert [row["route"] for row in json.loads(r.stdout)["routes"] if row["chosen"]] == ["sts"]

    text = mcbridge("plan", src, dst, env=emulator_env, state_dir=tmp_path)
    assert text.returncode == 0 and "chosen: direct" in text.stdout and "aws:eu-west-1 -> site:local" in text.stdout


def test_forced_route(eu_bucket, emulator_env, tmp_path):
    src, dst = f"s3://{eu_bucket}/corpus/", f"s3://{eu_bucket}/copy/"
    r = mcbridge("plan", src, dst, "--json", "--route", "pack", "--pack", "tar", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    assert [row["route"] for row in json.loads(r.stdout)["routes"] if row["chosen"]] == ["pack"]
    bad = mcbridge("plan", src, dst, "--route", "server", env=emulator_env, state_dir=tmp_path)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [bad.stderr.strip()]
    assert "route server cannot be used" in bad.stderr and "not available in this bridge yet" in bad.stderr
    assert "Traceback" not in bad.stderr
    bad = mcbridge("plan", src, dst, "--route", "from-url", env=emulator_env, state_dir=tmp_path)
    assert bad.returncode == 2 and "only Azure pulls from a URL" in bad.stderr
