"""``mcbridge plan`` against the emulators: bucket regions found at the stores, every route
priced, exactly one chosen, --route honoured or refused on one line."""

from __future__ import annotations

import json
from typing import get_args, get_type_hints

import pytest

from bridge.policies.cost import usage as counting
from bridge import routes as registry
from bridge.config import NativeSettings, load_settings
from bridge.pricing import locate
from bridge.policies import routes as planner
from bridge.policies.cost.model import SERVICE_OF_ROUTE
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
    assert rows["sts"]["valid"] is False and rows["sts"]["why"] == "built, not enabled in these settings"
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


def test_route_names_have_one_source():
    """The planner, the estimates and the settings name the routes the registry names, and every
    route but direct and pack is a registered Route (a stale copy of the list once left the
    native routes out of what plan called built)."""
    assert list(registry.NAMES) == ROUTES
    assert planner.ORDER == counting.ROUTES == registry.NAMES
    assert set(planner.DEFAULT_SPEEDS) == set(registry.NAMES)
    assert set(SERVICE_OF_ROUTE) == set(registry.NATIVE)   # the native routes' services, priced per job
    enabled = get_args(get_type_hints(NativeSettings)["enabled"])[0]
    assert set(get_args(enabled)) == set(registry.NATIVE)
    assert registry.built() == ROUTES   # loads the registered routes
    assert set(registry.REGISTRY) | {registry.DIRECT, registry.PACK} == set(registry.NAMES)
    with pytest.raises(ValueError, match="not in bridge.routes.NAMES"):
        registry.register(type("Teleport", (registry.Route,), {"name": "teleport"})())
    assert "teleport" not in registry.REGISTRY


def test_plan_lists_the_native_routes_as_built(eu_bucket, gcs_bucket, emulator_env, tmp_path):
    src, dst = f"s3://{eu_bucket}/corpus/", f"gs://{gcs_bucket}/corpus/"
    r = mcbridge("plan", src, dst, "--json", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = {row["route"]: row for row in json.loads(r.stdout)["routes"]}
    assert all(row["built"] for row in rows.values()), rows
    for native in ("sts", "datasync"):
        assert not rows[native]["valid"] and rows[native]["why"] == "built, not enabled in these settings"
    r = mcbridge("plan", src, dst, "--json", env={**emulator_env, "MCBRIDGE_NATIVE_ROUTES": "sts"}, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = {row["route"]: row for row in json.loads(r.stdout)["routes"]}
    assert rows["sts"]["valid"] and rows["datasync"]["why"] == "built, not enabled in these settings"
    text = mcbridge("plan", src, dst, env=emulator_env, state_dir=tmp_path)
    assert text.returncode == 0 and "built, not enabled in these settings" in text.stdout


def test_forced_route(eu_bucket, emulator_env, tmp_path):
    src, dst = f"s3://{eu_bucket}/corpus/", f"s3://{eu_bucket}/copy/"
    r = mcbridge("plan", src, dst, "--json", "--route", "pack", "--pack", "tar", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    assert [row["route"] for row in json.loads(r.stdout)["routes"] if row["chosen"]] == ["pack"]
    # inside one bucket the store copies (bridge/routes/server.py): nothing crosses the network
    r = mcbridge("plan", src, dst, "--json", env=emulator_env, state_dir=tmp_path)
    rows = {row["route"]: row for row in json.loads(r.stdout)["routes"]}
    assert rows["server"]["valid"] and rows["server"]["chosen"], rows["server"]
    # DataSync is built but not enabled in these settings: priced, not runnable
    bad = mcbridge("plan", src, dst, "--route", "datasync", env=emulator_env, state_dir=tmp_path)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [bad.stderr.strip()]
    assert "route datasync cannot be used" in bad.stderr and "built, not enabled in these settings" in bad.stderr
    assert "Traceback" not in bad.stderr
    bad = mcbridge("plan", src, dst, "--route", "from-url", env=emulator_env, state_dir=tmp_path)
    assert bad.returncode == 2 and "only Azure pulls from a URL" in bad.stderr


def test_the_settings_file_prices_with_discounts_interconnects_and_named_places(eu_bucket, azurite, emulator_env,
                                                                               tmp_path):
    """What the settings file says (a negotiated discount, a private link, the Azure account's
    region, the site local paths belong to) changes what mcbridge plan prices, read from the file."""
    src = f"s3://{eu_bucket}/corpus/"
    payload_gb = sum(1000 + i for i in range(30)) / 2**30

    def plan(config_text: str, dst: str) -> dict:
        config = tmp_path / "settings.yaml"
        config.write_text(config_text)
        r = mcbridge("plan", src, dst, "--json", "--config", str(config), env=emulator_env, state_dir=tmp_path)
        assert r.returncode == 0, r.stderr
        return next(row for row in json.loads(r.stdout)["routes"] if row["route"] == "direct") | {
            "places": json.loads(r.stdout)["places"]}

    base = plan("profiles:\n  default:\n    pricing: {site: lab}\n", str(tmp_path / "out") + "/")
    assert base["places"]["destination"] == "site:lab" and base["places"]["runs_in"] == "site:local"
    # aws.yaml egress.internet.eu, first tier: $0.09/GB
    assert base["cost"]["egress_usd"] == pytest.approx(round(payload_gb * 0.09, 6), abs=2e-6)

    off = plan("profiles:\n  default:\n    pricing:\n      site: lab\n"
               "      discounts: {aws: {egress_pct: 50, requests_pct: 25}}\n", str(tmp_path / "out") + "/")
    assert off["cost"]["egress_usd"] == pytest.approx(base["cost"]["egress_usd"] * 0.5, abs=2e-6)
    assert off["cost"]["requests_usd"] == pytest.approx(base["cost"]["requests_usd"] * 0.75, abs=2e-6)

    # a private link from the bucket's region to this process's site replaces internet egress
    link = plan("profiles:\n  default:\n    pricing:\n      site: lab\n      runs_in: site:lab\n"
                "      interconnects: [{between: [aws:eu-west-1, site:lab], usd_per_gb: 0.01}]\n",
                str(tmp_path / "out") + "/")
    assert link["cost"]["egress_usd"] == pytest.approx(round(payload_gb * 0.01, 6), abs=2e-6)
    assert any("private interconnect" in line for line in link["cost"]["breakdown"])

    # the Azure account's region comes from the settings file (its data plane does not say)
    container = unique_name()
    azurite.create_bucket(container)
    az = plan("profiles:\n  default:\n    azure: {region: westeurope}\n", f"az://{container}/corpus/")
    assert az["places"]["destination"] == "azure:westeurope"


def test_the_routes_bridge_runs_are_the_ones_planned_as_valid(eu_bucket, azurite, emulator_env, tmp_path):
    """Runnable means registered with bridge/routes: from-url into Azure is planned as valid; the
    native routes only once enabled in the settings."""
    container = unique_name()
    azurite.create_bucket(container)
    src, dst = f"s3://{eu_bucket}/corpus/", f"az://{container}/corpus/"
    r = mcbridge("plan", src, dst, "--json", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = {row["route"]: row for row in json.loads(r.stdout)["routes"]}
    assert rows["from-url"]["valid"], rows["from-url"]
    assert rows["datasync"]["why"] == "built, not enabled in these settings"
    r = mcbridge("plan", src, dst, "--json", env={**emulator_env, "MCBRIDGE_NATIVE_ROUTES": "datasync"},
                 state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    assert {row["route"]: row for row in json.loads(r.stdout)["routes"]}["datasync"]["valid"]
