"""Warming one node's cache through its own queue: a real worker consuming bridge.cache.<node>
(its own cache dir), queued by ``mcbridge cache warm --node``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import uuid

import pytest

from tests.emulators import free_port, unique_name
from tests.helpers import NO_CONFIG
from bridge.workers.testing import ServiceProcess, purge_namespace, tenant_env

pytestmark = pytest.mark.timeout(240)


def metric_total(port: int, name: str) -> float:
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
            f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def test_warm_on_a_node_queue(moto, redis_url, tmp_path):
    bucket = unique_name("warm")
    moto.create_bucket(bucket)
    for i in range(3):
        moto.client().put_object(Bucket=bucket, Key=f"shards/{i}.tar", Body=os.urandom(100_000 + i))
    namespace = f"t{uuid.uuid4().hex[:8]}"
    env = {**{k: v for k, v in os.environ.items() if k != "MCBRIDGE_CONFIG"}, **moto.env(),
           "BRIDGE_BROKER_URL": redis_url, "BRIDGE_NAMESPACE": namespace, "XDG_CONFIG_HOME": NO_CONFIG,
           "MCBRIDGE_STATE_DIR": str(tmp_path / "state"), "AWS_EC2_METADATA_DISABLED": "true",
           **tenant_env(tmp_path / "tenant")}
    node_env = {**env, "MCBRIDGE_CACHE_DIR": str(tmp_path / "node1-cache")}
    try:
        port = free_port()
        with ServiceProcess.worker(node_env, "node1", tmp_path, queues=["bridge.cache.node1"], pool="solo",
                                   metrics_port=port):
            r = subprocess.run([sys.executable, "-m", "bridge", "cache", "warm", f"s3://{bucket}/shards/",
                                "--node", "node1", "--wait", "--json"],
                               env={**env, "MCBRIDGE_CACHE_DIR": str(tmp_path / "here")},
                               capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr
            summary = json.loads(r.stdout)
            assert summary["queue"] == "bridge.cache.node1"
            assert summary["result"]["objects"] == 3 and summary["result"]["misses"] == 3
            assert summary["result"]["dir"] == str(tmp_path / "node1-cache")
            assert metric_total(port, "bridge_cache_objects_total") == 3
            assert metric_total(port, "bridge_cache_bytes_filled_total") == 3 * 100_000 + 3
    finally:
        purge_namespace(redis_url, namespace)
    stat = subprocess.run([sys.executable, "-m", "bridge", "cache", "stat", "--json"], env=node_env,
                          capture_output=True, text=True)
    assert json.loads(stat.stdout)["entries"] == 3
    assert not (tmp_path / "here" / "objects").exists() or not any((tmp_path / "here" / "objects").iterdir())
