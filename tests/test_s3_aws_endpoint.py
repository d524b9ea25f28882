"""bridge against AWS's own S3 endpoint (no endpoint set): the direct request path, each bucket at
its region's virtual host, over HTTPS with a test CA. Run inside a private network namespace
(tests/aws_namespace.py says how), so it needs root and util-linux's unshare; elsewhere it is
skipped, saying why."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(300)


def _can_unshare() -> str | None:
    if os.geteuid() != 0:
        return "needs root (a private network namespace with its own /etc/hosts)"
    if not shutil.which("unshare") or not shutil.which("ip"):
        return "needs util-linux's unshare and iproute2's ip"
    probe = subprocess.run(["unshare", "--net", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare --net --mount is refused here: {probe.stderr.strip()[:200]}"
    return None


def test_aws_default_endpoint_serves_each_bucket_at_its_regions_host_on_the_direct_path(tmp_path):
    why = _can_unshare()
    if why:
        pytest.skip(why)
    run = subprocess.run(["unshare", "--net", "--mount", sys.executable, "-m", "tests.aws_namespace", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=280)
    print(run.stdout)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    assert "bkt-euw1: eu-west-1, requests to https://bkt-euw1.s3.eu-west-1.amazonaws.com/" in run.stdout
    assert "dotted.bkt-euw1: eu-west-1, requests to https://s3.eu-west-1.amazonaws.com/dotted.bkt-euw1" in run.stdout
    assert "41 files up to eu-west-1 and back: identical" in run.stdout
    assert "bkt-path, path-style as asked: requests to https://s3.eu-west-1.amazonaws.com/bkt-path" in run.stdout
    assert "mcbridge verify s3://bkt-path/tree/: ok" in run.stdout


def test_a_bucket_names_its_host_only_when_its_name_can_be_one_under_s3s_certificate():
    """As botocore decides: a DNS label of 3-63 lower-case letters, digits and '-', without dots
    (``*.s3.REGION.amazonaws.com`` covers one label); any other name goes path-style."""
    from bridge.stores.s3direct import virtual_host
    assert virtual_host("bkt-euw1") and virtual_host("a1b") and virtual_host("x" * 63)
    for name in ("dotted.bkt", "ab", "x" * 64, "Upper-case", "-lead", "trail-", "under_score"):
        assert not virtual_host(name), name


def test_a_directory_bucket_is_refused_in_one_line_before_any_request():
    """S3 Express One Zone's directory buckets answer at zonal hosts with session credentials of
    their own, which the direct path does not make: refused by name, nothing sent."""
    from bridge.errors import BadURL
    from bridge.stores.s3direct import Direct
    direct = Direct(None, "us-west-2", lambda: ("AKIDEXAMPLE", "secret", None), 5.0)
    with pytest.raises(BadURL, match=r"s3://ml--usw2-az1--x-s3: a directory bucket \(S3 Express One Zone\)"):
        direct._host("ml--usw2-az1--x-s3")


def test_china_regions_have_their_own_domain_and_iso_partitions_keep_the_sdk(monkeypatch):
    """S3's hosts in a partition of its own: China's regions at amazonaws.com.cn (made here), the
    ISO regions' (named otherwise) left to aiobotocore."""
    from bridge.config import load_settings
    from bridge.stores.s3direct import Direct
    direct = Direct(None, "cn-north-1", lambda: ("AKIDEXAMPLE", "secret", None), 5.0)
    assert direct.endpoint == "https://s3.cn-north-1.amazonaws.com.cn"
    assert direct._aws_host("corpus", "cn-northwest-1").origin == "https://corpus.s3.cn-northwest-1.amazonaws.com.cn"
    assert direct._aws_host("corpus", "eu-west-1").origin == "https://corpus.s3.eu-west-1.amazonaws.com"
    keys = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret"}
    assert Direct.for_settings(load_settings({}, environ={**keys, "AWS_DEFAULT_REGION": "us-iso-east-1"})) is None
    assert Direct.for_settings(load_settings({}, environ={**keys, "AWS_DEFAULT_REGION": "us-gov-west-1"})).aws
