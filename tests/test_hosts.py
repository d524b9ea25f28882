"""The service across hosts: worker hosts in network namespaces (tests/hosts.py), each with its
own shaped link to the stores and a separate link to Redis. A host cut off mid-job costs at most
its in-flight units; a host that loses Redis but not the stores stops before its leases lapse and
never writes after the worker that took its task over; Redis restarted mid-job; one large file's
parts written from several hosts. Evidence comes from the endpoint's own request log (moto logs
each request with its client's address) and from the journal, never from a worker's say-so.

No timing is asserted. Needs root and ``ip netns`` (CI runs as root); skipped otherwise.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from tests.hosts import Cluster, unavailable

LEASE = 4.0   # seconds; a dead host's tasks run again about LEASE + SWEEP later


# -- fencing at the lease (real Redis, no namespaces) ---------------------------------------------

@pytest.fixture
def leases(redis_url):
    from bridge.workers.keys import Keys, redis_client
    from bridge.workers.leases import Leases
    from bridge.workers.testing import purge_namespace
    namespace = f"fence-{uuid.uuid4().hex[:8]}"
    yield Leases(redis_client(redis_url), Keys(namespace), 3.0)
    purge_namespace(redis_url, namespace)


def _ref(task: str = "j1.t0"):
    from bridge.workers.leases import TaskRef
    return TaskRef(task, "bridge.transfer", ["j1", {}], "q", "j1", worker="w@a")


def test_a_lapsed_lease_is_not_taken_back_once_another_worker_ran_the_task(leases):
    first = leases.lease(_ref())
    assert first.acquire() == "ok"
    leases.r.delete(leases.keys.lease("j1.t0"))     # it lapsed while its holder could not renew
    second = leases.lease(_ref())
    assert second.acquire() == "ok"
    assert second.complete(True) is not None
    assert not first.renew() and first.lost.is_set(), "the late holder resumed a task another ran"
    assert not leases.r.exists(leases.keys.lease("j1.t0"))


def test_a_lapsed_lease_is_not_taken_back_once_the_sweeper_queued_the_task_again(leases):
    holder = leases.lease(_ref())
    assert holder.acquire() == "ok"
    leases.r.delete(leases.keys.lease("j1.t0"))
    leases.r.hdel(leases.keys.running, "j1.t0")     # what the sweeper's claim does as it requeues
    assert not holder.renew() and holder.lost.is_set()


def test_a_lapsed_lease_nobody_took_is_taken_again(leases):
    holder = leases.lease(_ref())
    assert holder.acquire() == "ok"
    leases.r.delete(leases.keys.lease("j1.t0"))
    assert holder.renew() and not holder.lost.is_set()
    assert leases.r.get(leases.keys.lease("j1.t0")) == holder.ref.token


def test_a_holder_cut_off_from_redis_stops_before_its_lease_lapses(leases):
    """Its heartbeat cannot get through: it stops itself (and its requests) while Redis still holds
    its lease, so no other worker can be running the task yet."""
    import redis
    from tests.emulators import free_port
    from bridge.workers.leases import Leases
    holder = leases.lease(_ref())
    assert holder.acquire() == "ok"
    requests = __import__("threading").Event()
    holder.fences.append(requests)
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.2, socket_timeout=0.2)
    holder.leases = Leases(dead, leases.keys, leases.ttl)
    with holder.heartbeat():
        assert holder.lost.wait(30), "never stopped"
        left = leases.r.pttl(leases.keys.lease("j1.t0"))
    assert requests.is_set()
    assert left > 0, "stopped only after its lease had lapsed"


# -- hosts -----------------------------------------------------------------------------------------

needs_hosts = pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("hosts-data")
    env = {"BRIDGE_LEASE": f"{LEASE}s", "BRIDGE_SWEEP": "1s", "BRIDGE_TASK_SECONDS": "1s",
           "MCBRIDGE_CHUNK_SIZE": "5MiB", "BRIDGE_FILE_TASK_BYTES": "5MiB",
           "MCBRIDGE_SMALL_FILES_IN_FLIGHT": "8", "MCBRIDGE_CONCURRENCY": "4"}
    with Cluster(hosts=3, rate="8mbit", stores=("s3",), workers=1, concurrency=2, env=env,
                 local_roots=[str(root)]) as made:
        made.data = root
        yield made


@pytest.fixture
def hosts(cluster):
    yield cluster
    for host in cluster.hosts:   # a test's cut ends with it
        host.restore()


def _corpus(cluster, name: str, files: int, size: int) -> str:
    folder = Path(cluster.data) / name
    folder.mkdir()
    for n in range(files):
        (folder / f"f{n:04d}.bin").write_bytes(os.urandom(size))
    return f"{folder}/"


def _bucket(cluster) -> str:
    name = f"h-{uuid.uuid4().hex[:8]}"
    cluster.stores["s3"].create_bucket(name)
    return name


def _until(what, timeout: float = 120, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        found = what()
        if found:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError("waited too long")
        time.sleep(every)


def _busy_host(cluster, job_id: str):
    """A host running a transfer of the job, once the job has journaled some files: (host, its
    tasks' sub-plans)."""
    record = cluster.job(job_id)
    if not record.get("plan_key") or int(record.get("files_done") or 0) < 20:
        return None
    by_host: dict = {}
    for task in cluster.running().values():
        host = cluster.host_of(task.get("worker", ""))
        if task["task"] == "bridge.transfer" and task["job"] == job_id and host is not None:
            by_host.setdefault(host.index, (host, []))[1].append(task["args"][1])
    # not the planner's host: its first slice runs from memory and the rest go on without it
    for host, subs in by_host.values():
        return host, subs
    return None


def _unjournaled(cluster, job_id: str, subs: list) -> set[str]:
    """The files of ``subs`` that the job's journal does not hold: the most a re-run sends again."""
    from bridge.pipeline.plan import Plan
    from bridge.workers.keys import Keys
    from bridge.workers.redisjournal import RedisJournal
    journal = RedisJournal(cluster.redis_client(), Keys(cluster.namespace).journal(cluster.job(job_id)["plan_key"]), 60)
    rels = {f.rel for sub in subs for f in Plan.from_dict(json.loads(sub) if isinstance(sub, str) else sub).files}
    done = journal.present([f"file:{rel}" for rel in rels])
    return {rel for rel in rels if f"file:{rel}" not in done}


def _puts(cluster, bucket: str, prefix: str, since: int = 0) -> list[tuple[str, str]]:
    """(client address, key) of each object PUT under ``prefix`` that the endpoint answered, in order."""
    head = f"/{bucket}/{prefix}"
    return [(addr, path[len(head):]) for addr, method, path in cluster.requests("s3")[since:]
            if method == "PUT" and path.startswith(head) and "?" not in path
            and not path[len(head):].startswith("_bridge/")]   # the job's own log and manifest


def _ended_ok(record: dict) -> None:
    assert record["state"] == "succeeded", record.get("errors")
    verify = json.loads(record["verify"])
    assert verify["ok"] and verify["missing"] == 0 and verify["mismatched"] == 0, verify


def _manifest_puts(cluster, record: dict) -> int:
    url = record["manifest"]
    assert url.startswith("s3://"), url
    path = "/" + url[len("s3://"):]
    return sum(1 for _a, m, p in cluster.requests("s3") if m == "PUT" and p.split("?")[0] == path)


@needs_hosts
def test_one_large_files_parts_are_written_from_several_hosts(hosts):
    cluster = hosts
    big = Path(cluster.data) / "big.bin"
    big.write_bytes(os.urandom(20 * 1024 * 1024))   # 4 parts of 5 MiB, a task each
    bucket = _bucket(cluster)
    job = cluster.submit("cp", str(big), f"s3://{bucket}/big.bin")["id"]
    _ended_ok(cluster.wait(job))
    parts = [(addr, path) for addr, method, path in cluster.requests("s3")
             if method == "PUT" and path.startswith(f"/{bucket}/big.bin?") and "partNumber=" in path]
    senders = Counter(addr for addr, _ in parts)
    hosts_addresses = {h.address for h in cluster.hosts}
    assert set(senders) <= hosts_addresses
    assert len(senders) >= 2, f"parts sent from {dict(senders)}"


def _lists(cluster, bucket: str, since: int = 0) -> list[tuple[str, str, str]]:
    """(client address, prefix, delimiter) of each LIST of ``bucket`` the endpoint answered."""
    from urllib.parse import parse_qs, urlsplit
    found = []
    for addr, method, path in cluster.requests("s3")[since:]:
        split = urlsplit(path)
        if method == "GET" and split.path.rstrip("/") == f"/{bucket}" and split.query:
            query = parse_qs(split.query, keep_blank_values=True)
            if "list-type" in query or "prefix" in query:
                found.append((addr, query.get("prefix", [""])[0], query.get("delimiter", [""])[0]))
    return found


@needs_hosts
def test_a_prefixs_listing_is_split_by_sub_prefix_over_hosts(hosts):
    """Twelve folders under one prefix: the top level is listed once with a delimiter, then each
    folder once, the whole prefix never, and the folders' LISTs come from several hosts (by their
    addresses in the endpoint's log); the job commits verified. (Before the tests that cut hosts:
    a host cut off may take a while to consume again.)"""
    cluster = hosts
    bucket = _bucket(cluster)
    client = cluster.stores["s3"].client()
    subs = [f"s{n:02d}" for n in range(12)]
    for sub in subs:
        for i in range(10):
            client.put_object(Bucket=bucket, Key=f"src/{sub}/f{i:02d}.bin", Body=os.urandom(2048))
    mark = len(cluster.requests("s3"))
    out = Path(cluster.data) / "fanned"
    job = cluster.submit("cp", f"s3://{bucket}/src/", f"{out}/")["id"]
    record = cluster.wait(job)
    _ended_ok(record)
    # 2 parts per live pool process (3 hosts x -c 2 when all have announced themselves), at most one a folder
    assert 2 <= len(json.loads(record["list_parts"])) <= len(subs)
    lists = _lists(cluster, bucket, mark)
    hosts_addresses = {h.address for h in cluster.hosts}
    assert {addr for addr, _p, _d in lists} <= hosts_addresses
    assert Counter((p, d) for _a, p, d in lists if p == "src/") == {("src/", "/"): 1}, lists   # never the whole prefix
    per_folder = Counter(p for _a, p, d in lists if p != "src/")
    assert per_folder == {f"src/{sub}/": 1 for sub in subs}, per_folder
    listers = Counter(addr for addr, p, _d in lists if p != "src/")
    assert len(listers) >= 2, f"every folder listed from one host: {dict(listers)}"
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.bin")) == \
        sorted(f"{sub}/f{i:02d}.bin" for sub in subs for i in range(10))


def _lose_a_busy_host(cluster, name: str, lose) -> tuple:
    """A corpus job; once a host runs a slice of it, ``lose(host)``. (job, host, the files its
    slices had not journaled then, the endpoint's log length then, the bucket.)"""
    src = _corpus(cluster, name, 400, 32 * 1024)
    bucket = _bucket(cluster)
    job = cluster.submit("cp", src, f"s3://{bucket}/{name}/")["id"]
    host, subs = _until(lambda: _busy_host(cluster, job))
    mark = len(cluster.requests("s3"))
    lose(host)
    return job, host, _unjournaled(cluster, job, subs), mark, bucket   # it journals nothing more from now on


def _sent_once_but(cluster, bucket: str, prefix: str, in_flight: set[str]) -> list[tuple[str, str]]:
    """Every file written, and none more than once but the lost host's unjournaled ones."""
    puts = _puts(cluster, bucket, prefix)
    sent = Counter(key for _addr, key in puts)
    again = {key for key, n in sent.items() if n > 1}
    assert len(sent) == 400
    assert again <= in_flight, f"sent again beyond the lost host's in-flight units: {sorted(again - in_flight)[:5]}"
    return puts


@needs_hosts
def test_a_host_cut_mid_job_costs_at_most_its_in_flight_units(hosts):
    cluster = hosts
    job, host, in_flight, _mark, bucket = _lose_a_busy_host(cluster, "cut", lambda host: host.cut())
    record = cluster.wait(job)
    _ended_ok(record)
    assert _manifest_puts(cluster, record) == 1, "committed more than once"
    puts = _sent_once_but(cluster, bucket, "cut/", in_flight)
    assert any(addr == host.address for addr, _ in puts), "the cut host had sent nothing: no test"
    assert any(addr != host.address for addr, _ in puts)


@needs_hosts
def test_a_host_partitioned_from_redis_stops_and_never_writes_after_its_successor(hosts):
    cluster = hosts
    job, host, in_flight, mark, bucket = _lose_a_busy_host(cluster, "part", lambda host: host.cut_redis())
    record = cluster.wait(job)   # it still reaches the store
    _ended_ok(record)
    assert _manifest_puts(cluster, record) == 1, "committed more than once"
    last: dict[str, str] = {}
    late = []
    for addr, key in _puts(cluster, bucket, "part/", since=mark):
        if addr == host.address and key in last and last[key] != host.address:
            late.append(key)          # it wrote a file after another host had written it again
        last[key] = addr
    assert not late, f"the partitioned host wrote after its successor: {late[:5]}"
    _sent_once_but(cluster, bucket, "part/", in_flight)
    logs = "".join(w.log_path.read_text(errors="replace") for w in host.workers)
    assert "no lease renewal got through" in logs, "it never stopped itself"


@needs_hosts
def test_redis_restarted_mid_job_the_job_resumes_and_commits_once(hosts):
    cluster = hosts
    src = _corpus(cluster, "restart", 400, 32 * 1024)
    bucket = _bucket(cluster)
    job = cluster.submit("cp", src, f"s3://{bucket}/r/")["id"]
    _until(lambda: int(cluster.job(job).get("files_done") or 0) >= 20)
    cluster.redis.restart(down=1.0)
    record = cluster.wait(job, timeout=240)
    _ended_ok(record)
    assert _manifest_puts(cluster, record) == 1, "committed more than once"
    sent = Counter(key for _addr, key in _puts(cluster, bucket, "r/"))
    assert len(sent) == 400

