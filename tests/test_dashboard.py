"""The Grafana dashboard (deploy/grafana/bridge.json) against Debian's Prometheus: real workers
run real jobs (moto behind a fault proxy, Redis), Prometheus scrapes them with the shipped
configuration (deploy/prometheus/prometheus.yml, its targets and interval made the test's) and
loads the shipped rules, and every query of every panel, its variables filled in, returns data
from the Prometheus HTTP API. The bytes panel's totals are the jobs' records' bytes moved.

Grafana itself is not packaged here; its variables ($namespace, $tenant, $__rate_interval) are
filled in the way Grafana fills them for one namespace and one tenant."""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from bridge.workers.redisbudgets import Budgets
from bridge.workers.testing import purge_namespace, tenant_env
from tests.emulators import free_port, unique_name
from tests.faultproxy import FaultProxy, Rule
from tests.helpers import NO_CONFIG
from tests.test_service_policies import Clock, _beat, _put_checkpoint, _run
from tests.test_workers_service import Harness

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "bridge.json"
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
PROMETHEUS = "/usr/bin/prometheus"
pytestmark = pytest.mark.timeout(300)


def _api(port: int, path: str, **params: str) -> dict:
    url = f"http://127.0.0.1:{port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=30) as response:
        body = json.loads(response.read())
    assert body["status"] == "success", body
    return body["data"]


class Prometheus:
    """Debian's Prometheus on a free loopback port with its own storage, scraping ``targets``
    every second with the shipped configuration's job and the shipped rules."""

    def __init__(self, targets: list[str], directory: Path):
        config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
        config["global"].update(scrape_interval="1s", evaluation_interval="1s")
        config["rule_files"] = [str(PROMETHEUS_DIR / "alerts.yml")]
        [job] = config["scrape_configs"]
        job["static_configs"] = [{"targets": targets}]
        self.job = job["job_name"]
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.log_path = directory / "prometheus.log"
        self.args = [PROMETHEUS, f"--config.file={directory / 'prometheus.yml'}",
                     f"--storage.tsdb.path={directory / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}"]
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> Prometheus:
        self.process = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=self.log_path.open("wb"))
        deadline = time.monotonic() + 60
        while True:
            try:
                _api(self.port, "status/runtimeinfo")
                return self
            except OSError:
                assert self.process.poll() is None, self.log_path.read_text()[-2000:]
                assert time.monotonic() < deadline, "Prometheus did not answer\n" + self.log_path.read_text()[-2000:]
                time.sleep(0.2)

    def __exit__(self, *exc_info) -> None:
        self.process.kill()
        self.process.wait(timeout=30)

    def query(self, expr: str) -> list[dict]:
        return _api(self.port, "query", query=expr)["result"]

    def firing(self, alert: str, **labels: str) -> dict:
        """Wait until ``alert`` fires with ``labels``; its entry in the alerts API."""
        deadline = time.monotonic() + 60
        while True:
            alerts = _api(self.port, "alerts")["alerts"]
            for entry in alerts:
                if entry["state"] == "firing" and entry["labels"]["alertname"] == alert and \
                        all(entry["labels"].get(k) == v for k, v in labels.items()):
                    return entry
            assert time.monotonic() < deadline, f"{alert} {labels} did not fire: {alerts}"
            time.sleep(0.25)

    def scraped_after(self, moment: float, targets: int) -> None:
        """Wait until every target has been scraped, successfully, after ``moment``."""
        deadline = time.monotonic() + 60
        while True:
            rows = self.query(f'timestamp(up{{job="{self.job}"}} == 1)')
            if len(rows) == targets and all(float(r["value"][1]) > moment for r in rows):
                return
            assert time.monotonic() < deadline, f"no scrape after {moment}: {rows}\n" + \
                self.log_path.read_text()[-2000:]
            time.sleep(0.25)


def grafana(expr: str, namespace: str, tenant: str) -> str:
    """The query Grafana sends for one namespace and one tenant (a rate window wide enough to hold
    the whole test's scrapes)."""
    return expr.replace("$namespace", namespace).replace("$tenant", tenant).replace("$__rate_interval", "10m")


def moved_by_route_and_destination(jobs) -> Counter:
    """Bytes the job records say were moved (done less found there already), by route and
    destination store: what the throughput counters must add up to."""
    totals: Counter = Counter()
    for record in jobs:
        moved = record.counters.get("bytes_done", 0) - record.counters.get("bytes_skipped", 0)
        if moved:
            spec_dst = record.spec["destinations"][0]
            scheme, _, rest = spec_dst.partition("://")
            totals[((record.route or {}).get("name"), f"{scheme}://{rest.split('/', 1)[0]}")] += moved
    return totals


@pytest.fixture
def prometheus_binary() -> str:
    if not os.path.exists(PROMETHEUS):
        pytest.skip(f"{PROMETHEUS} not found: apt-get install prometheus (scripts/test.sh installs it)")
    return PROMETHEUS


def test_every_panel_returns_data_from_real_workers_and_the_bytes_match_the_jobs(
        prometheus_binary, moto, redis_url, tmp_path, tmp_path_factory):
    src, dst, dr = unique_name("dash-src"), unique_name("dash-dst"), unique_name("dash-dr")
    for bucket in (src, dst, dr):
        moto.create_bucket(bucket)
    for i in range(6):
        moto.client().put_object(Bucket=src, Key=f"data/{i}.bin", Body=os.urandom(50_000 + i))
    _put_checkpoint(moto, src, "step-100")
    local = tmp_path / "local"
    local.mkdir()
    (local / "notes.txt").write_bytes(os.urandom(7_000))

    namespace = f"mcbt-{uuid.uuid4().hex[:10]}"
    env = {**{k: v for k, v in os.environ.items() if k != "MCBRIDGE_CONFIG"}, **moto.env(),
           "XDG_CONFIG_HOME": NO_CONFIG, "BRIDGE_BROKER_URL": redis_url, "BRIDGE_NAMESPACE": namespace,
           "BRIDGE_LEASE": "3s", "BRIDGE_SWEEP": "0.5s", "BRIDGE_METRICS_PORT": "0",
           "MCBRIDGE_STATE_DIR": str(tmp_path / "state"), "AWS_EC2_METADATA_DISABLED": "true",
           **tenant_env(tmp_path_factory.mktemp("tenant"), local_roots=[str(tmp_path)])}
    service = Harness(env, tmp_path)
    policy_file = tmp_path / "policies.yaml"
    policy_file.write_text(f"""\
policies:
  golden:
    source: s3://{src}/golden/
    destinations: [s3://{dr}/dr/]
    checkpoints: "step-*"
    keep_last: 1
    verify: store
    max_cost_usd: 1
    schedule: {{cron: "0 2 * * *"}}
""")
    # The worker reaches S3 through a proxy that answers the copy's first three PUTs 503: the
    # store's errors and the retries they cost show on the dashboard.
    with FaultProxy(moto.endpoint) as proxy:
        proxy.configure(rules=[Rule(rf"^PUT /{dst}/copy/", "error", times=3)])
        port = free_port()
        worker_env = {**env, "AWS_ENDPOINT_URL": proxy.endpoint, "MCBRIDGE_CACHE_DIR": str(tmp_path / "node-cache"),
                      "MCBRIDGE_CACHE_QUOTA": str(10 * 1024 * 1024)}
        service.env = worker_env
        queues = ["bridge", "bridge.local", "bridge.s3", "bridge.gs", "bridge.az", "bridge.cache.node1"]
        service.worker("w1", concurrency=2, metrics_port=port, queues=queues).wait_ready()
        service.env = env
        try:
            with Prometheus([f"127.0.0.1:{port}"], tmp_path / "prometheus") as prometheus:
                Budgets(service.redis, service.keys).set("team", 1)
                Budgets(service.redis, service.keys).set("golden", 3)
                for args in ((f"s3://{src}/data/", f"s3://{dst}/copy/", "--budget", "team"),
                             (str(local) + "/", f"s3://{dst}/local/")):
                    result = service.cli("submit", "cp", *args, "--wait", "--json")
                    assert result.returncode == 0, result.stderr + result.stdout
                    assert json.loads(result.stdout)["state"] == "succeeded"
                failing = service.cli("submit", "cp", f"s3://{unique_name('gone')}/x/", f"s3://{dst}/gone/",
                                      "--wait", "--json")
                assert failing.returncode != 0
                clock = Clock(datetime(2026, 3, 1, 1, 59, tzinfo=timezone.utc))
                beat = _beat(service.env, policy_file, clock)
                beat.schedule["mcbridge-policy:golden"].last_run_at = datetime(2026, 2, 28, 2, 0, 30,
                                                                               tzinfo=timezone.utc)
                run = _run(service, beat, clock, datetime(2026, 3, 1, 2, 0, 5, tzinfo=timezone.utc))
                assert run.state == "succeeded", run.errors
                for _ in range(2):   # filled, then found there
                    warm = service.cli("cache", "warm", f"s3://{src}/data/", "--node", "node1", "--wait", "--json")
                    assert warm.returncode == 0, warm.stderr
                assert json.loads(warm.stdout)["result"]["hits"] == 6
                assert proxy.counts["error"] == 3
                ended = time.time()
                prometheus.scraped_after(ended + 1, targets=1)
                # and once more: a rate needs two samples, and a counter the last job made has one so far
                prometheus.scraped_after(time.time() + 1, targets=1)

                jobs = service.jobs.list(500)
                assert Counter(r.state for r in jobs) == Counter(
                    {"succeeded": 2 + 1 + len(run.children), "failed": 1}), [(r.kind, r.state) for r in jobs]

                dashboard = json.loads(DASHBOARD.read_text())
                variables = {v["name"]: v for v in dashboard["templating"]["list"]}
                assert set(variables) == {"datasource", "namespace", "tenant"}
                assert namespace in _api(prometheus.port, "label/namespace/values",
                                         **{"match[]": "bridge_queue_depth"})
                assert "tests" in _api(prometheus.port, "label/tenant/values",
                                       **{"match[]": f'bridge_jobs{{namespace="{namespace}"}}'})
                empty = []
                for panel in dashboard["panels"]:
                    for target in panel["targets"]:
                        rows = prometheus.query(grafana(target["expr"], namespace, "tests"))
                        if not any(math.isfinite(float(r["value"][1])) for r in rows):
                            empty.append((panel["title"], target["expr"], rows))
                assert not empty, empty

                [bytes_panel] = [p for p in dashboard["panels"] if p["title"].startswith("Bytes moved by route")]
                rows = prometheus.query(grafana(bytes_panel["targets"][0]["expr"], namespace, "tests"))
                shown = Counter({(r["metric"]["route"], r["metric"]["destination"]): int(float(r["value"][1]))
                                 for r in rows})
                expected = moved_by_route_and_destination(jobs)
                assert shown == expected
                assert set(d for _r, d in shown) == {f"s3://{dst}", f"s3://{dr}"}
                # another tenant's view of the same namespace is empty
                assert prometheus.query(grafana(bytes_panel["targets"][0]["expr"], namespace, "nobody")) == []

                # what the dashboard shows of errors and budgets is what happened
                errors = prometheus.query(f'sum by (store) (bridge_store_errors_total{{namespace="{namespace}"}})')
                by_store = {r["metric"]["store"]: float(r["value"][1]) for r in errors}
                assert by_store.get(f"s3://{dst}") == 3, by_store
                retried = prometheus.query(f'sum by (endpoint) (bridge_store_retries_total{{namespace="{namespace}"}})')
                assert {r["metric"]["endpoint"]: float(r["value"][1]) for r in retried} == {proxy.endpoint: 3}
                spent = prometheus.query(f'bridge_budget_spent_usd{{namespace="{namespace}",budget="team"}}')
                assert float(spent[0]["value"][1]) == pytest.approx(Budgets(service.redis, service.keys).spent("team"))
                # the shipped rules are loaded
                groups = _api(prometheus.port, "rules")["groups"]
                assert len([r for g in groups for r in g["rules"]]) == 8
                # and fire on the workers' own series: the budget alerts, once the limit is moved
                # under what the jobs spent (the scrape and the rule evaluation are each a second)
                spent_team = Budgets(service.redis, service.keys).spent("team")
                for limit, alert in ((spent_team / 0.9, "BridgeBudget80Percent"), (spent_team / 2, "BridgeBudgetExhausted")):
                    Budgets(service.redis, service.keys).set("team", limit)
                    prometheus.firing(alert, namespace=namespace, budget="team")
        finally:
            service.close()
            purge_namespace(redis_url, namespace)


def test_the_compose_stack_scrapes_the_workers_and_loads_the_rules_and_the_dashboard():
    """The compose file read statically (no Docker here): Prometheus gets the shipped config and
    rules where the config looks for them, scrapes every worker on its metrics port, and Grafana
    gets the provisioning that points at that Prometheus and at the dashboard it mounts."""
    from bridge.workers.settings import WorkerSettings
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())

    def mounts(service: str) -> dict[str, Path]:
        out = {}
        for volume in services[service]["volumes"]:
            host, _, inside = volume.partition(":")
            if host.startswith("./"):
                out[inside.removesuffix(":ro")] = ROOT / host
        return out

    prometheus = mounts("prometheus")
    assert prometheus["/etc/prometheus/prometheus.yml"] == PROMETHEUS_DIR / "prometheus.yml"
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]
    assert all(prometheus.get(rule) == PROMETHEUS_DIR / Path(rule).name for rule in config["rule_files"])
    workers = sorted(name for name, svc in services.items() if "worker" in (svc.get("command") or [])[:1])
    port = WorkerSettings.from_env({"BRIDGE_BROKER_URL": "redis://x"}).metrics_port
    assert all(services[w]["environment"]["BRIDGE_METRICS_ADDR"] == "0.0.0.0" for w in workers)
    [job] = config["scrape_configs"]
    assert sorted(t for c in job["static_configs"] for t in c["targets"]) == [f"{w}:{port}" for w in workers]
    assert all(p.startswith("127.0.0.1:") for svc in ("prometheus", "grafana") for p in services[svc]["ports"])

    grafana = mounts("grafana")
    provisioning = grafana["/etc/grafana/provisioning"]
    [source] = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())["datasources"]
    assert source["url"] == f"http://prometheus:{services['prometheus']['ports'][0].rsplit(':', 1)[1]}"
    [provider] = yaml.safe_load((provisioning / "dashboards" / "bridge.yaml").read_text())["providers"]
    assert grafana[f"{provider['options']['path']}/bridge.json"] == DASHBOARD


def test_the_records_gauges_read_what_redis_holds(redis_url, tmp_path):
    """The gauges read at scrape time (workers/metrics.py ``Records``), served by the workers'
    endpoint: a running job's bytes and start (what the stalled-job alert watches), jobs by tenant
    and state, queue depth against the live workers' presence, budgets, and a node's cache."""
    from prometheus_client.parser import text_string_to_metric_families

    from bridge.workers import metrics
    from bridge.workers.jobrecords import Jobs
    from bridge.workers.keys import Keys, redis_client
    from bridge.workers.specs import parse_spec

    namespace = f"mcbt-{uuid.uuid4().hex[:10]}"
    client, keys = redis_client(redis_url), Keys(namespace)
    jobs = Jobs(client, keys, ttl=3600)
    spec = parse_spec({"kind": "copy", "source": "s3://src-b/", "destination": "gs://dst-b/"})
    running = jobs.create(spec, queue="bridge.gs", auth={"tenant": "ml"})
    jobs.transition(running, "planning", ("queued",))
    jobs.transition(running, "running", ("planning",))
    client.hset(keys.job(running), "started", 1_700_000_000.5)
    jobs.add_progress(running, {"bytes_done": 12345})
    jobs.create(spec, queue="bridge.gs", auth={"tenant": "ml"})
    jobs.create(spec, queue="bridge.gs", auth={"tenant": "vision"})
    for _ in range(3):
        client.lpush(f"{namespace}:bridge.gs", "{}")
    client.lpush(f"{namespace}:bridge.gs\x06\x163", "{}")   # kombu's list of a priority step
    # a node's cache queue declared by its worker, now gone, with a warm waiting; another
    # application's queue on the same Redis is none of bridge's
    client.sadd(f"{namespace}:_kombu.binding.bridge.cache.node7", "bridge.cache.node7\x06\x16\x06\x16bridge.cache.node7")
    client.sadd(f"{namespace}:_kombu.binding.celeryev", "x")
    client.lpush(f"{namespace}:bridge.cache.node7", "{}")
    client.set(keys.worker("w1@test"), json.dumps({"queues": ["bridge", "bridge.s3"], "concurrency": 4}), px=60_000)
    Budgets(client, keys).set("team", 10)
    client.hincrbyfloat(f"{namespace}:spend:{time.strftime('%Y-%m', time.gmtime())}", "team", 8.5)

    from bridge.cache.core import Cache
    from bridge.config import load_settings
    cache_dir = tmp_path / "cache"
    settings = load_settings(environ={"MCBRIDGE_CACHE_DIR": str(cache_dir), "MCBRIDGE_CACHE_QUOTA": "1000",
                                      "XDG_CONFIG_HOME": NO_CONFIG})
    Cache(settings).close()   # made, empty
    records = metrics.Records(client, keys, ["bridge", "bridge.gs", "bridge.s3"], "bridge", cache_settings=settings)
    port = free_port()
    server = metrics.serve(port, "127.0.0.1", records)
    assert server is not None
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
        purge_namespace(redis_url, namespace)
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "namespace")))] = s.value
            assert s.labels.get("namespace") == namespace, s
    assert samples[("bridge_job_bytes_done", (("job_id", running), ("queue", "bridge.gs"), ("tenant", "ml")))] == 12345
    assert samples[("bridge_job_started_timestamp_seconds",
                    (("job_id", running), ("queue", "bridge.gs"), ("tenant", "ml")))] == 1_700_000_000.5
    assert samples[("bridge_jobs", (("kind", "copy"), ("state", "queued"), ("tenant", "ml")))] == 1
    assert samples[("bridge_jobs", (("kind", "copy"), ("state", "running"), ("tenant", "ml")))] == 1
    assert samples[("bridge_jobs", (("kind", "copy"), ("state", "queued"), ("tenant", "vision")))] == 1
    assert samples[("bridge_queue_depth", (("queue", "bridge.gs"),))] == 4
    assert samples[("bridge_workers_live", (("queue", "bridge.gs"),))] == 0
    assert samples[("bridge_queue_depth", (("queue", "bridge.cache.node7"),))] == 1
    assert samples[("bridge_workers_live", (("queue", "bridge.cache.node7"),))] == 0
    assert not [key for key in samples if key[0] == "bridge_queue_depth" and ("queue", "celeryev") in key[1]]
    assert samples[("bridge_workers_live", (("queue", "bridge.s3"),))] == 1
    assert samples[("bridge_worker_processes", (("queue", "bridge.s3"),))] == 4
    assert samples[("bridge_budget_limit_usd", (("budget", "team"),))] == 10
    assert samples[("bridge_budget_spent_usd", (("budget", "team"),))] == 8.5
    assert samples[("bridge_cache_node_used_bytes", (("dir", str(cache_dir)),))] == 0
    assert samples[("bridge_cache_node_quota_bytes", (("dir", str(cache_dir)),))] == 1000
