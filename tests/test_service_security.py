"""Who may have the workers move what: a real Redis, real `mcbridge worker` processes, moto.

One tenant, team-a, may read s3://SRC/team-a/ and write s3://DST/team-a/, and on the workers
(group default) read and write ALLOWED, the workers' only local root. What a worker refuses it
refuses before any request: moto's log shows no request to the buckets involved, the record and
the exit of `submit --wait` say why, and the audit stream has the refusal.

Messages "written to Redis by hand" are exactly that: kombu's message format, LPUSHed onto the
queue's list with a plain Redis client, as anyone who can reach the broker can do.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from bridge.workers.auth import Keyring
from bridge.workers.settings import WorkerSettings
from bridge.workers.testing import purge_namespace, tenant_env
from tests.emulators import unique_name
from tests.test_workers_service import Harness

pytestmark = pytest.mark.timeout(300)


def bucket_requests(moto, buckets: set[str], since: int) -> list[str]:
    """Every request line for ``buckets`` (listings included) in moto's log after byte ``since``."""
    text = moto.log_path.read_bytes()[since:].decode(errors="replace")
    pattern = re.compile(r'"(GET|PUT|POST|DELETE|HEAD) /(?P<bucket>[a-z0-9.\-]+)[/? ]')
    return [line for line in text.splitlines() if (m := pattern.search(line)) and m["bucket"] in buckets]


def keys_of(moto, bucket: str, prefix: str = "") -> list[str]:
    listing = moto.client().list_objects_v2(Bucket=bucket, Prefix=prefix)
    return [obj["Key"] for obj in listing.get("Contents", [])]


class Secured(Harness):
    def __init__(self, env, tmp_path, moto, src, dst, allowed, outside):
        super().__init__(env, tmp_path)
        self.moto, self.src, self.dst, self.allowed, self.outside = moto, src, dst, allowed, outside
        ws = WorkerSettings.from_env(env)
        self.keyring = Keyring.load(ws)

    def refused(self, *args: str, planned: bool = False) -> tuple[subprocess.CompletedProcess, str]:
        """Submit with --wait; the job must fail refused, before any request to either bucket
        (``planned``: refused once the plan was made, so the destination's bucket was looked at:
        no object read or written, no listing)."""
        mark = self.moto.log_path.stat().st_size
        result = self.cli("submit", *args, "--wait", "--json")
        assert result.returncode == 1, result.stdout + result.stderr
        status = json.loads(result.stdout)
        assert status["state"] == "failed" and status["errors"][0].startswith("refused: "), status
        requests = bucket_requests(self.moto, {self.src, self.dst}, mark)
        if planned:
            requests = [line for line in requests if not re.search(r'"HEAD /[a-z0-9.\-]+ HTTP', line)]
        assert requests == []
        return result, status["errors"][0]

    def push(self, task: str, args: list, queue: str = "bridge") -> str:
        """A Celery message written to Redis by hand (kombu's Redis transport format)."""
        task_id = str(uuid.uuid4())
        body = json.dumps([args, {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}])
        message = {
            "body": base64.b64encode(body.encode()).decode(), "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": {"lang": "py", "task": task, "id": task_id, "shadow": None, "eta": None, "expires": None,
                        "group": None, "group_index": None, "retries": 0, "timelimit": [None, None],
                        "root_id": task_id, "parent_id": None, "argsrepr": repr(args), "kwargsrepr": "{}",
                        "origin": "by-hand", "ignore_result": False},
            "properties": {"correlation_id": task_id, "reply_to": str(uuid.uuid4()), "delivery_mode": 2,
                           "delivery_info": {"exchange": "", "routing_key": queue}, "priority": 0,
                           "body_encoding": "base64", "delivery_tag": str(uuid.uuid4())}}
        self.redis.lpush(f"{self.keys.namespace}:{queue}", json.dumps(message))
        return task_id

    def audit(self, **match: str) -> dict:
        """The newest audit entry with these fields, waited for (the worker writes it)."""
        deadline = time.monotonic() + 60
        while True:
            for _id, fields in self.redis.xrevrange(self.keys.audit, count=200):
                if all(fields.get(k) == v for k, v in match.items()):
                    return fields
            if time.monotonic() > deadline:
                raise AssertionError(f"no audit entry {match}\n{self.processes[0].log_tail()}")
            time.sleep(0.1)

    def write_record(self, job_id: str, spec: dict, auth: dict | None, state: str = "queued") -> None:
        """A job record as the submitter writes one, written by hand."""
        now = time.time()
        fields = {"id": job_id, "kind": spec["kind"], "state": state, "spec": json.dumps(spec), "queue": "bridge",
                  "created": now, "updated": now}
        if auth is not None:
            fields["auth"] = json.dumps(auth)
        self.redis.hset(self.keys.job(job_id), mapping=fields)
        self.redis.zadd(self.keys.jobs, {job_id: now})


@pytest.fixture
def secured(redis_url, moto, tmp_path, tmp_path_factory):
    src, dst = unique_name(), unique_name()
    moto.create_bucket(src)
    moto.create_bucket(dst)
    for i in range(3):
        moto.client().put_object(Bucket=src, Key=f"team-a/in/{i}.bin", Body=os.urandom(2000 + i))
        moto.client().put_object(Bucket=src, Key=f"team-b/in/{i}.bin", Body=os.urandom(2000 + i))
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    allowed.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("the worker's secret\n")
    policy = (f"tenants:\n  team-a:\n    read: [s3://{src}/team-a/]\n    write: [s3://{dst}/team-a/]\n"
              f"    local:\n      default: {{read: [{allowed}/], write: [{allowed}/]}}\n")
    namespace = f"mcbt-{uuid.uuid4().hex[:10]}"
    env = {**os.environ, **moto.env(), "BRIDGE_BROKER_URL": redis_url, "BRIDGE_NAMESPACE": namespace,
           "BRIDGE_LEASE": "3s", "BRIDGE_SWEEP": "0.5s", "BRIDGE_METRICS_PORT": "0",
           "MCBRIDGE_STATE_DIR": str(tmp_path / "state"), "AWS_EC2_METADATA_DISABLED": "true",
           **tenant_env(tmp_path_factory.mktemp("keys"), local_roots=[str(allowed)], tenant="team-a", policy=policy)}
    env.pop("MCBRIDGE_CONFIG", None)
    harness = Secured(env, tmp_path, moto, src, dst, allowed, outside)
    harness.worker("w1", concurrency=2).wait_ready()
    yield harness
    harness.close()
    purge_namespace(redis_url, namespace)


def test_a_job_outside_its_tenants_prefixes_is_refused_by_the_worker(secured):
    s = secured
    _, why = s.refused("cp", f"s3://{s.src}/team-b/", f"s3://{s.dst}/team-a/stolen/")
    assert why == f"refused: tenant 'team-a' may not read s3://{s.src}/team-b/"
    _, why = s.refused("cp", f"s3://{s.src}/team-a/", f"s3://{s.dst}/elsewhere/")
    assert why == f"refused: tenant 'team-a' may not write s3://{s.dst}/elsewhere/"
    # a prefix ends at '/': team-a/ does not cover team-ab/
    _, why = s.refused("sync", f"s3://{s.src}/team-a/", f"s3://{s.dst}/team-ab/")
    assert "may not write" in why
    assert keys_of(s.moto, s.dst) == []
    entry = s.audit(decision="refused", reason=why.removeprefix("refused: "))
    assert entry["tenant"] == "team-a" and entry["source"] == f"s3://{s.src}/team-a/"

    # the audit log, as people read it
    out = s.cli("jobs", "audit", "--limit", "3")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("refused") == 3 and f"may not read s3://{s.src}/team-b/" in out.stdout


def test_a_local_path_outside_the_workers_roots_is_refused_including_through_a_symlink(secured):
    s = secured
    secret = s.outside / "secret.txt"
    # the issue's own example: a worker's /etc/passwd to a bucket the tenant may write
    _, why = s.refused("cp", "/etc/passwd", f"s3://{s.dst}/team-a/exfil/passwd")
    assert why == f"refused: /etc/passwd is outside this worker's local roots (BRIDGE_LOCAL_ROOTS: {s.allowed}/)"
    # through a link to a folder outside: resolved before the check
    (s.allowed / "link").symlink_to(s.outside, target_is_directory=True)
    _, why = s.refused("cp", f"{s.allowed}/link/secret.txt", f"s3://{s.dst}/team-a/exfil/")
    assert f"{secret} is outside this worker's local roots" in why
    # '..' in the path (resolved by the submitter already, and by the worker again)
    _, why = s.refused("cp", f"{s.allowed}/../outside/secret.txt", f"s3://{s.dst}/team-a/exfil/")
    assert f"{secret} is outside" in why
    # a file link inside a tree the tenant may read: found when the plan is made, before a byte moves
    tree = s.allowed / "tree"
    tree.mkdir()
    (tree / "fine.txt").write_text("fine\n")
    (tree / "evil.txt").symlink_to(secret)
    _, why = s.refused("cp", f"{tree}/", f"s3://{s.dst}/team-a/tree/", planned=True)
    assert f"{secret} is outside" in why
    # writing through a link: a destination not made yet is judged by where it would land
    before = sorted(p.name for p in s.outside.iterdir())
    _, why = s.refused("cp", f"s3://{s.src}/team-a/in/", f"{s.allowed}/link/planted/")
    assert f"{s.outside}/planted is outside" in why
    assert sorted(p.name for p in s.outside.iterdir()) == before
    assert keys_of(s.moto, s.dst) == []

    # the same tree without the link, in scope: it runs
    (tree / "evil.txt").unlink()
    r = s.cli("submit", "cp", f"{tree}/", f"s3://{s.dst}/team-a/tree/", "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    keys = sorted(keys_of(s.moto, s.dst, "team-a/tree/"))
    assert len(keys) == 2 and keys[0].startswith("team-a/tree/_bridge/log/c-") and keys[1] == "team-a/tree/fine.txt", keys


def test_hand_written_messages_without_a_valid_signature_run_nothing(secured):
    s = secured
    private = s.allowed / "private.txt"
    private.write_text("in the tenant's own folder, but no one asked to copy it\n")
    mark = s.moto.log_path.stat().st_size

    # a job record and a plan message with no signature
    spec = {"kind": "copy", "source": str(private), "destinations": [f"s3://{s.dst}/team-a/exfil/"], "verify": "store"}
    s.write_record("byhand1", spec, auth=None)
    s.push("bridge.plan", ["byhand1"])
    assert "is not signed" in s.audit(decision="refused", job="byhand1")["reason"]
    # ... and with a signature that is not the tenant's key's
    auth = {"v": 1, "tenant": "team-a", "job": "byhand2", "budget": None, "expires": time.time() + 3600, "sig": "0" * 64}
    s.write_record("byhand2", spec, auth=auth)
    s.push("bridge.plan", ["byhand2"])
    assert "signature does not match" in s.audit(decision="refused", job="byhand2")["reason"]
    # ... and a real signature over another spec, its record changed to copy something else
    good = s.keyring.sign_job("team-a", "byhand3", {**spec, "source": f"s3://{s.src}/team-a/in/"}, budget=None, ttl=3600)
    s.write_record("byhand3", spec, auth=good)
    s.push("bridge.plan", ["byhand3"])
    assert "signature does not match" in s.audit(decision="refused", job="byhand3")["reason"]
    for job in ("byhand1", "byhand2", "byhand3"):
        record = s.jobs.get(job)
        assert record.state == "failed" and record.errors[0].startswith("refused: "), record

    # a schedule message, as beat sends one, without beat's signature: no job is started
    s.push("bridge.scheduled", ["nightly", {"kind": "copy", "source": str(private),
                                            "destinations": [f"s3://{s.dst}/team-a/exfil2/"]}])
    assert "is not signed" in s.audit(decision="refused", schedule="nightly")["reason"]
    assert not s.redis.exists(s.keys.schedule("nightly"))

    # a correctly signed job in scope runs as today
    r = s.cli("submit", "cp", f"s3://{s.src}/team-a/in/", f"s3://{s.dst}/team-a/copy/", "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    job_id = r.stdout.split()[0]
    assert len(keys_of(s.moto, s.dst, "team-a/copy/")) == 4   # three files and the manifest
    admitted = s.audit(decision="admitted", job=job_id)
    ended = s.audit(decision="ended", job=job_id)
    assert admitted["tenant"] == ended["tenant"] == "team-a" and len(admitted["digest"]) == 64
    assert ended["state"] == "succeeded" and int(ended["bytes"]) == 2000 + 2001 + 2002 and ended["route"]
    assert float(ended["spent_usd"]) > 0

    # a transfer task for that signed job, its slice of the plan written by hand (the job put
    # back to running, as anyone with the broker can): the planner never signed that slice
    s.redis.hset(s.keys.job(job_id), "state", "running")
    sub = {"source": str(s.allowed) + "/", "destination": f"s3://{s.dst}/team-a/exfil3/", "single": None,
           "files": [{"rel": "private.txt", "size": private.stat().st_size, "part_size": 0}], "deletions": [],
           "key": "x", "route": "direct", "route_why": "", "completions": [], "batch": 0, "slots": 1}
    task = s.push("bridge.transfer", [job_id, sub, "f" * 64])
    refused = s.audit(decision="refused", task=task)
    assert "its slice of the plan: the signature does not match" in refused["reason"]
    assert [line for line in bucket_requests(s.moto, {s.dst}, mark) if "exfil" in line] == []
    assert keys_of(s.moto, s.dst, "team-a/exfil") == []


def test_a_signed_job_replayed_after_expiry_or_a_second_time_runs_nothing(secured):
    s = secured
    spec = {"kind": "copy", "source": f"s3://{s.src}/team-a/in/", "destinations": [f"s3://{s.dst}/team-a/replayed/"],
            "verify": "store"}
    # signed with the tenant's key, but its hour ran out before a worker saw it
    stale = s.keyring.sign_job("team-a", "stale1", spec, budget=None, ttl=3600, now=time.time() - 7200)
    s.write_record("stale1", spec, auth=stale)
    mark = s.moto.log_path.stat().st_size
    s.push("bridge.plan", ["stale1"])
    assert "its signature expired at" in s.audit(decision="refused", job="stale1")["reason"]
    assert bucket_requests(s.moto, {s.src, s.dst}, mark) == []

    # a job that ran, submitted again by hand from its own record: its id was admitted once
    r = s.cli("submit", "cp", f"s3://{s.src}/team-a/in/", f"s3://{s.dst}/team-a/once/", "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    job_id = r.stdout.split()[0]
    record = s.jobs.get(job_id)
    s.redis.delete(s.keys.job(job_id, "errors"))
    s.write_record(job_id, record.spec, auth=record.auth)
    mark = s.moto.log_path.stat().st_size
    s.push("bridge.plan", [job_id])
    deadline = time.monotonic() + 60
    while s.jobs.get(job_id).state != "failed" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "admitted before: a job id runs once" in s.jobs.get(job_id).errors[0]
    assert bucket_requests(s.moto, {s.src, s.dst}, mark) == []
    # All of Redis is the broker's: delete the record of its admission too, and the same signed
    # job would run again while its signature lasts; after it expires, never. Here a job signed
    # for 5 s (BRIDGE_SIGNATURE_TTL of its submitter) runs, and is replayed once that has passed.
    short = subprocess.run([sys.executable, "-m", "bridge", "submit", "cp", f"s3://{s.src}/team-a/in/",
                            f"s3://{s.dst}/team-a/short/", "--wait"], env={**s.env, "BRIDGE_SIGNATURE_TTL": "5s"},
                           capture_output=True, text=True, timeout=120)
    assert short.returncode == 0, short.stdout + short.stderr
    job_id = short.stdout.split()[0]
    record = s.jobs.get(job_id)
    while time.time() <= record.auth["expires"]:
        time.sleep(0.2)
    s.redis.delete(s.keys.admitted(job_id), s.keys.job(job_id, "errors"))
    s.write_record(job_id, record.spec, auth=record.auth)
    mark = s.moto.log_path.stat().st_size
    s.push("bridge.plan", [job_id])
    assert "its signature expired at" in s.audit(decision="refused", job=job_id)["reason"]
    assert bucket_requests(s.moto, {s.src, s.dst}, mark) == []

    out = s.cli("jobs", "audit", "--json", "--limit", "100")
    entries = json.loads(out.stdout)
    assert {e["decision"] for e in entries} >= {"admitted", "refused", "ended"}


def test_a_bad_service_policy_is_named_by_line_and_field(tmp_path):
    path = tmp_path / "service.yaml"
    path.write_text("tenants:\n  team-a:\n    read: [s3://okay/x/]\n    write: [/etc/]\n  b c:\n    read: []\n"
                    "  team-c:\n    colour: red\n")
    r = subprocess.run([sys.executable, "-m", "bridge", "policy", "check", str(path)], capture_output=True, text=True)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith(f"mcbridge: error: {path}:4: tenants.team-a.write: '/etc/' is a local path")
    assert f"{path}:5: tenants.b c: a tenant name" in lines[1]
    assert f"{path}:8: tenants.team-c.colour: unknown field" in lines[2]
    path.write_text("tenants:\n  team-a:\n    read: [s3://okay/x]\n    local:\n      hpc: {write: [/lustre/a]}\n")
    r = subprocess.run([sys.executable, "-m", "bridge", "policy", "check", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "team-a: read s3://okay/x/; write -; local hpc: read - write /lustre/a/" in r.stdout


def _own_network_namespace() -> list[str]:
    """The command prefix that runs a program in a new network namespace (root's ``unshare -n``,
    or an unprivileged user namespace's ``unshare -rn``); the test is skipped where neither works."""
    unshare = shutil.which("unshare")
    for prefix in ([unshare, "-n"], [unshare, "-rn"]) if unshare else ():
        if subprocess.run([*prefix, "true"], capture_output=True).returncode == 0:
            return prefix
    pytest.skip("no network namespace can be made here (unshare -n / -rn)")


def test_a_worker_warns_of_a_broker_without_a_password_off_this_machine(tmp_path):
    from bridge.workers.commands.daemons import broker_warning
    assert broker_warning("redis://10.1.2.3:6379/0")
    assert broker_warning("redis://redis:6379/0")
    for quiet in ("redis://127.0.0.1:6379/0", "redis://localhost/0", "redis://[::1]:6379/0",
                  "redis://:pw@10.1.2.3:6379/0", "rediss://:pw@redis:6380/0", "unix:///run/redis.sock"):
        assert broker_warning(quiet) is None, quiet
    # The worker runs in a network namespace of its own, where no address but a loopback that is
    # down exists: its connection to the broker fails at once and nothing leaves this machine.
    isolate = _own_network_namespace()
    env = {**os.environ, "BRIDGE_BROKER_URL": "redis://192.0.2.1:6379/0", "XDG_CONFIG_HOME": str(tmp_path)}
    r = subprocess.run([*isolate, sys.executable, "-m", "bridge", "worker"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0   # nothing answers there
    assert "warning: the broker redis://192.0.2.1:6379/0 has no password and is not on this machine" in r.stderr
    assert "refuses every job" in r.stderr


def test_service_init_sets_up_one_tenant_whose_key_is_never_printed(tmp_path):
    home = tmp_path / "cfg"
    env = {**os.environ, "XDG_CONFIG_HOME": str(home)}
    for name in ("BRIDGE_KEYS_FILE", "BRIDGE_SERVICE_POLICY", "BRIDGE_KEYS", "BRIDGE_TENANT"):
        env.pop(name, None)
    r = subprocess.run([sys.executable, "-m", "bridge", "service", "init", "--local", str(tmp_path)], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    keys = home / "mcbridge" / "service-keys"
    key = keys.read_text().split()[-1]
    assert oct(keys.stat().st_mode & 0o777) == "0o600" and len(key) == 64 and key not in r.stdout + r.stderr
    # found by default, with no variable set
    ws = WorkerSettings.from_env(env)
    assert ws.keys_file == str(keys) and ws.service_policy == str(home / "mcbridge" / "service.yaml")
    assert Keyring.load(ws).signer() == "default" and key not in repr(Keyring.load(ws)) + repr(ws)
    again = subprocess.run([sys.executable, "-m", "bridge", "service", "init"], env=env, capture_output=True, text=True)
    assert again.returncode == 2 and "exists" in again.stderr


def test_a_cache_warm_is_signed_and_scoped_too(secured, tmp_path):
    s = secured
    s.env["MCBRIDGE_CACHE_DIR"] = str(tmp_path / "node-cache")
    s.worker("n1", queues=["bridge.cache.n1"], pool="solo").wait_ready()
    mark = s.moto.log_path.stat().st_size
    r = s.cli("cache", "warm", f"s3://{s.src}/team-b/in/", "--node", "n1", "--wait")
    assert r.returncode == 1 and f"tenant 'team-a' may not read s3://{s.src}/team-b/in/" in r.stderr, r.stderr
    task = s.push("bridge.cache.warm", [[f"s3://{s.src}/team-a/in/"], None, None], queue="bridge.cache.n1")
    assert "is not signed" in s.audit(decision="refused", task=task)["reason"]
    assert bucket_requests(s.moto, {s.src}, mark) == []
    r = s.cli("cache", "warm", f"s3://{s.src}/team-a/in/", "--node", "n1", "--wait", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["result"]["objects"] == 3


def test_the_scope_decision_is_a_pure_function_over_resolved_places():
    from bridge.policies.tenants import parse, refusal
    policy = parse("tenants:\n  a:\n    read: [s3://corpus/a/]\n    write: [gs://out/a/]\n"
                   "    local:\n      hpc: {read: [/lustre/a/], write: [/lustre/a/out/]}\n"
                   "    routes: [direct]\n    budgets: [team-a]\n")
    a = policy.tenant("a")

    def why(**kw):
        return refusal("a", a, **{"budget": "team-a", "group": "hpc", "local_roots": ["/lustre"], **kw})

    assert why(reads=["s3://corpus/a/x.bin"], writes=["gs://out/a/"]) is None
    assert why(reads=["gs://out/a/y"]) is None                         # what it may write it may read
    assert why(reads=["s3://corpus/ab/x"]) == "tenant 'a' may not read s3://corpus/ab/x"
    assert why(writes=["s3://corpus/a/x"]) == "tenant 'a' may not write s3://corpus/a/x"
    assert why(reads=["/lustre/a/in/f"], writes=["/lustre/a/out/g"]) is None
    assert why(writes=["/lustre/a/in/f"]) == "tenant 'a' may not write /lustre/a/in/f on worker group 'hpc'"
    assert "may not read /lustre/a/f on worker group 'default'" in why(reads=["/lustre/a/f"], group="default")
    assert "outside this worker's local roots" in why(reads=["/lustre/a/f"], local_roots=["/scratch"])
    assert "outside this worker's local roots (BRIDGE_LOCAL_ROOTS: none)" in why(reads=["/lustre/a/f"], local_roots=[])
    assert why(reads=["s3://corpus/a/x"], route="server") == "tenant 'a' may not use route 'server' (allowed: direct)"
    assert "charged to budget 'other'" in why(reads=["s3://corpus/a/x"], budget="other")
    assert "charged to no budget" in why(reads=["s3://corpus/a/x"], budget=None)
    assert why(reads=["s3://corpus/a/x"], budget=None, job=False) is None   # a cache warm is charged to none
    assert refusal("b", policy.tenant("b"), reads=["s3://corpus/a/x"]) == "tenant 'b' is not in the service policy"


def test_signatures_cover_every_field_and_name_no_key(tmp_path):
    from bridge.workers.auth import Keyring, Refused
    ring = Keyring({"a": bytes(range(32)), "b": bytes(range(1, 33))}, "a")
    spec = {"kind": "copy", "source": "s3://corpus/a/", "destinations": ["gs://out/a/"]}
    auth = ring.sign_job("a", "j1", spec, budget=None, ttl=60)
    assert len(ring.check_job("j1", spec, auth)) == 64
    for changed_spec, changed_auth in (({**spec, "source": "s3://corpus/b/"}, auth), (spec, {**auth, "tenant": "b"}),
                                       (spec, {**auth, "budget": "x"}), (spec, {**auth, "expires": auth["expires"] + 9})):
        with pytest.raises(Refused, match="signature does not match"):
            ring.check_job("j1", changed_spec, changed_auth)
    with pytest.raises(Refused, match="signed for job 'j1'"):
        ring.check_job("j2", spec, {**auth, "job": "j1"})
    sub = {"source": "s3://corpus/a/", "files": [{"rel": "x", "size": 1}], "sizes": {1: 2}}
    sig = ring.sign_task("a", "d" * 64, "j1.t0", sub)
    ring.check_task("a", "d" * 64, "j1.t0", json.loads(json.dumps(sub)), sig)   # as a task receives it
    with pytest.raises(Refused):
        ring.check_task("a", "d" * 64, "j1.t1", json.loads(json.dumps(sub)), sig)
    # the planner's one encoding: the text it keeps reads back as the sub-plan its signature covers
    plain = {"source": "s3://corpus/a/", "files": [{"rel": "x\u00e9\"/", "size": 1, "id": {"b": "1", "a": None}}],
             "batch": 256, "ratio": 0.5}
    text, sig = ring.task_text("a", "d" * 64, "j1.t0", plain)
    assert json.loads(text) == plain and sig == ring.sign_task("a", "d" * 64, "j1.t0", plain)
    ring.check_task("a", "d" * 64, "j1.t0", json.loads(text), sig)
    for changed in ({**plain, "batch": 257}, {**plain, "files": []}):
        with pytest.raises(Refused):
            ring.check_task("a", "d" * 64, "j1.t0", changed, sig)
    assert "00010203" not in repr(ring)


def test_a_slice_carried_as_its_signed_text_is_checked_over_those_bytes():
    """A transfer task carries the text the planner signed: the signature is checked over those
    bytes before they are read; a changed byte, another task's signature, or a text that is no
    sub-plan is refused. The planner's stored entries are cut into (id, text, signature) without
    decoding the text, and an entry in another spelling is still read."""
    from bridge.workers.auth import Keyring, Refused, canonical
    from bridge.workers.executor import _task_entry
    ring = Keyring({"a": bytes(range(32))}, "a")
    sub = {"source": "/data/a/", "destination": "s3://out/a/", "files": [{"rel": "x\u00e9,\"]/", "size": 1}]}
    text, sig = ring.task_text("a", "d" * 64, "j1.t0", sub)
    assert ring.check_task("a", "d" * 64, "j1.t0", text, sig) == sub
    for changed, task in ((text.replace('"size":1', '"size":2'), "j1.t0"), (text, "j1.t1"), (text + " ", "j1.t0")):
        with pytest.raises(Refused, match="signature does not match"):
            ring.check_task("a", "d" * 64, task, changed, sig)
    listed, listed_sig = ring.task_text("a", "d" * 64, "j1.t0", {"a": 1})
    assert ring.check_task("a", "d" * 64, "j1.t0", listed, listed_sig) == {"a": 1}
    other, other_sig = "[1,2]", ring._task_mac("a", "d" * 64, "j1.t0", b"[1,2]")
    with pytest.raises(Refused, match="no plan to run"):
        ring.check_task("a", "d" * 64, "j1.t0", other, other_sig)
    raw = "[" + json.dumps("j1.t0") + "," + text + "," + json.dumps(sig) + "]"
    assert _task_entry(raw.encode()) == ("j1.t0", text, sig)
    assert _task_entry(json.dumps(["j1.t0", sub, sig])) == ("j1.t0", canonical(sub).decode(), sig)


def test_a_plans_cloud_urls_resolve_as_written_and_a_bad_bucket_is_still_refused():
    """A plan's S3 and GCS URLs are their own canonical spelling (keys as written, '..' too); its
    bucket is checked once per plan, and a bad one fails the check as a single URL would; Azure
    names still have their dot segments resolved."""
    import pytest
    from bridge.errors import BadURL
    from bridge.workers.gate import resolve
    folders: dict[str, str] = {}
    assert resolve("s3://corpus/a/../b", folders) == "s3://corpus/a/../b"
    assert resolve("gs://out/a//x", folders) == "gs://out/a//x"
    assert set(folders) == {"s3://corpus", "gs://out"}
    with pytest.raises(BadURL, match="not a valid s3 bucket name"):
        resolve("s3://Not_A_Bucket/x", folders)
    assert resolve("az://acct/c/a/../b", folders) == "az://acct/c/b"


def test_a_plans_local_paths_resolve_as_realpath_does(tmp_path):
    """The check's spelling of a local path is ``os.path.realpath``'s, whatever the path's shape
    (the resolver skips normalising a path already in normal form, and resolves each folder once)."""
    import os
    from bridge.workers.gate import resolve
    inside, outside = tmp_path / "in", tmp_path / "out"
    (inside / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret").write_text("x")
    (inside / "sub" / "plain").write_text("x")
    (inside / "link-file").symlink_to(outside / "secret")
    (inside / "link-dir").symlink_to(outside)
    paths = [f"{inside}/sub/plain", f"{inside}/link-file", f"{inside}/link-dir/secret", f"{inside}/link-dir/",
             f"{inside}//sub//plain", f"{inside}/./sub/plain", f"{inside}/sub/../link-file", f"{inside}/sub/..",
             f"{inside}/sub/.", f"{inside}/sub/", f"{inside}/missing/new", "/", f"{inside}/.hidden"]
    folders: dict[str, str] = {}
    for path in paths * 2:   # the second time from the folders already resolved
        assert (resolve(path, folders).rstrip("/") or "/") == os.path.realpath(path), path
    assert resolve(f"{inside}/link-file", folders) == str(outside / "secret")
    assert resolve(f"{inside}/link-dir/secret", folders) == str(outside / "secret")


def test_a_tenant_name_follows_one_rule_in_the_keys_the_policy_and_the_settings():
    """BRIDGE_TENANT is checked with the keys file's rule (the policy's module loads YAML, which a
    submitter's start-up does without): the two rules are one."""
    import pytest
    from bridge.policies import tenants
    from bridge.workers import auth
    from bridge.workers.settings import _tenant
    assert auth._NAME_RE.pattern == tenants._NAME_RE.pattern
    assert _tenant("team-a.1") == "team-a.1"
    with pytest.raises(ValueError, match="a tenant name uses"):
        _tenant("-bad")
