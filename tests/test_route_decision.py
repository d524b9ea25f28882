"""One route decision for every entry point: over a table of scenarios, the route ``mcbridge plan
--json`` marks chosen is the route ``mcbridge cp --json`` reports having taken, run in this
process and on the service (a worker's job record)."""

from __future__ import annotations

import json

import pytest

from tests.helpers import mcbridge, settings_for
from tests.test_native_cli import datasync_double, env, sts_double  # noqa: F401  (fixtures)
from tests.test_native_sts import FILES, fill
from tests.test_workers_service import service  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(300)

# (source scheme, destination scheme, native routes enabled, the route bridge takes)
SCENARIOS = [
    ("local", "local", "", "direct"),        # server only with --route: it saves only the copy's writes
    ("local", "s3", "", "direct"),
    ("s3", "s3", "", "server"),              # one account: the store copies inside itself
    ("gs", "gs", "", "server"),
    ("az", "az", "", "server"),
    ("s3", "az", "", "from-url"),            # Azure pulls from a signed URL (Azurite cannot: falls back per file)
    ("s3", "gs", "datasync,sts", "datasync"),   # enabled routes, in the order the settings give
    ("s3", "gs", "sts,datasync", "sts"),
    ("gs", "s3", "datasync", "datasync"),
    ("az", "gs", "", "direct"),              # native routes are never taken unless enabled
]


def _ids(s) -> str:
    return f"{s[0]}-{s[1]}-{s[2] or 'none'}"


def _chosen(plan_doc: dict) -> str:
    [row] = [r for r in plan_doc["routes"] if r["chosen"]]
    return row["route"]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=_ids)
def test_plan_marks_the_route_cp_takes(scenario, make_root, env, tmp_path):  # noqa: F811
    src_scheme, dst_scheme, native, expected = scenario
    environ = {**env, "MCBRIDGE_NATIVE_ROUTES": native} if native else dict(env)
    settings = settings_for(environ)
    src, dst = make_root(src_scheme), make_root(dst_scheme) + "copy/"
    fill(src, settings, FILES)
    plan = mcbridge("plan", src, dst, "--json", env=environ, state_dir=tmp_path)
    assert plan.returncode == 0, plan.stderr
    cp = mcbridge("cp", src, dst, "--json", env=environ, state_dir=tmp_path)
    assert cp.returncode == 0, cp.stderr
    ran = json.loads(cp.stdout)["route"]["name"]
    assert _chosen(json.loads(plan.stdout)) == ran == expected


# What the doubles of the native services need, taken from the in-process scenarios' settings.
NATIVE_ENV = ("MCBRIDGE_STS_ENDPOINT", "AWS_ENDPOINT_URL_DATASYNC", "MCBRIDGE_POLL_INTERVAL",
              "MCBRIDGE_DATASYNC_S3_ROLE_ARN", "MCBRIDGE_GCS_HMAC_ACCESS_ID", "MCBRIDGE_GCS_HMAC_SECRET",
              "MCBRIDGE_GCS_XML_ENDPOINT")


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s[0] != "local"], ids=_ids)
def test_plan_marks_the_route_a_service_job_takes(scenario, service, make_root, env, tmp_path):  # noqa: F811
    """The same decision on the service: a real worker, with the native routes enabled as the
    scenario says (and their services' doubles), runs the route ``plan --json`` marks chosen."""
    src_scheme, dst_scheme, native, expected = scenario
    service.env.update({k: env[k] for k in NATIVE_ENV})
    if native:
        service.env["MCBRIDGE_NATIVE_ROUTES"] = native
    settings = settings_for(service.env)
    src, dst = make_root(src_scheme), make_root(dst_scheme) + "copy/"
    fill(src, settings, FILES)
    plan = service.cli("plan", src, dst, "--json")
    assert plan.returncode == 0, plan.stderr
    service.worker("w1", concurrency=1).wait_ready()
    ran = service.cli("submit", "cp", src, dst, "--wait", "--json")
    assert ran.returncode == 0, ran.stderr + ran.stdout
    status = json.loads(ran.stdout)
    assert status["state"] == "succeeded", status
    assert _chosen(json.loads(plan.stdout)) == status["route"]["name"] == expected
    if native:   # the service's double carried every file (from-url falls back per file on Azurite)
        assert not status["route"]["fallbacks"] and status["route"]["bytes_through_bridge"] == 0, status["route"]
