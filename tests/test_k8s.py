"""The Kubernetes manifests refuse a broker without a password, as docker-compose.yml does: the
Redis container's own command, run here by a real redis-server on a free loopback port, exits at
once on an empty REDIS_PASSWORD and otherwise requires it; the secret example holds no empty value."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.emulators import free_port

K8S = Path(__file__).resolve().parent.parent / "deploy" / "k8s"


def _redis_container() -> dict:
    statefulset = next(doc for doc in yaml.safe_load_all((K8S / "redis.yaml").read_text())
                       if doc and doc["kind"] == "StatefulSet")
    [container] = statefulset["spec"]["template"]["spec"]["containers"]
    return container


def _run(container: dict, password: str, port: int, directory: Path) -> subprocess.Popen:
    """The container's command and args as the kubelet runs them (command, then args), with its
    password; only where it listens and keeps its files differ from the container's."""
    argv = [*container["command"], *container.get("args", []), "--port", str(port), "--bind", "127.0.0.1",
            "--dir", str(directory)]
    env = {"PATH": os.environ["PATH"], "REDIS_PASSWORD": password}
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_k8s_redis_refuses_to_start_on_an_empty_password(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not found: apt-get install redis-server")
    container = _redis_container()
    # the kubelet expands $(VAR) in a command itself: the password must reach the shell unexpanded
    assert not any("$(" in part for part in [*container["command"], *container.get("args", [])])
    assert {"name": "REDIS_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "mcbridge-broker", "key": "REDIS_PASSWORD"}}} \
        in container["env"]
    port = free_port()
    server = _run(container, "", port, tmp_path)
    try:
        _out, err = server.communicate(timeout=10)
    finally:
        if server.poll() is None:
            server.kill()
    assert server.returncode == 1
    assert err.strip().splitlines() == ["redis: REDIS_PASSWORD in secret mcbridge-broker is empty: set one "
                                        "(openssl rand -hex 24); Redis does not run without a password"]


def test_the_k8s_redis_with_a_password_requires_it(tmp_path):
    import redis
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not found: apt-get install redis-server")
    password, port = secrets.token_hex(24), free_port()
    server = _run(_redis_container(), password, port, tmp_path)
    try:
        anonymous = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
        deadline = time.monotonic() + 30
        while True:
            try:
                anonymous.ping()
                raise AssertionError("Redis answered a client without the password")
            except redis.exceptions.AuthenticationError:
                break
            except redis.exceptions.ConnectionError:
                assert server.poll() is None and time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        assert redis.Redis(host="127.0.0.1", port=port, password=password, socket_timeout=5).ping()
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_secret_example_holds_no_empty_value_and_no_broker_password():
    docs = [doc for doc in yaml.safe_load_all((K8S / "secret.example.yaml").read_text()) if doc]
    for doc in docs:
        for key, value in (doc.get("stringData") or {}).items():
            assert str(value).strip(), f"{doc['metadata']['name']}.{key} is empty"
    # a password copied from an example would be one everyone knows: it is made, not shipped
    assert "mcbridge-broker" not in {doc["metadata"]["name"] for doc in docs}
    assert "--from-literal=REDIS_PASSWORD=\"$(openssl rand -hex 24)\"" in (K8S / "secret.example.yaml").read_text()
