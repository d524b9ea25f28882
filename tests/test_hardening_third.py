"""The audit's text view of a job that spent money, metering that survives a
SIGKILLed worker, submit refusing a bad environment as cp does, and the residue of bad inputs.

Jobs run on real `mcbridge worker` processes over a real Redis and moto (the ``service`` fixture
of tests/test_workers_service.py); bad inputs run the real CLI in a subprocess and read its exit
and its one line.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from bridge import meter
from bridge.policies.cost.money import usd
from tests.faultproxy import FaultProxy, Rule
from tests.test_meter import request_usd
from tests.test_workers_service import service  # noqa: F401  (the fixture: a namespace, workers, the CLI)

pytestmark = pytest.mark.timeout(300)
MiB = 1024 * 1024


def mcbridge(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bridge", *args], env=env if env is not None else os.environ,
                          capture_output=True, text=True, timeout=timeout)


def one_error_line(result: subprocess.CompletedProcess) -> str:
    """The one line a refused command printed: exit 2, nothing on stdout, no traceback."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mcbridge: error: "), result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    return lines[0]


# -- jobs audit, as people read it, once a job has spent money ---------------------------------------

def test_the_audit_text_shows_what_an_ended_job_spent(service, emulator_for, make_root, tmp_path):  # noqa: F811
    emulator_for("s3")
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"{i}.bin").write_bytes(os.urandom(3000 + i))
    dst = make_root("s3")
    service.worker("w1", concurrency=1).wait_ready()
    job_id = service.submit("cp", f"{src}/", dst)
    record = service.wait(job_id)
    assert record.state == "succeeded", record.errors
    assert record.spent_usd and record.spent_usd > 0   # its PUTs are priced

    as_json = service.cli("jobs", "audit", "--job", job_id, "--json")
    assert as_json.returncode == 0, as_json.stderr
    ended = next(e for e in json.loads(as_json.stdout) if e["decision"] == "ended")
    text = service.cli("jobs", "audit", "--job", job_id)
    assert text.returncode == 0, text.stderr
    line = next(line for line in text.stdout.splitlines() if " ended " in line)
    assert "succeeded: " in line and f", {usd(float(ended['spent_usd']))}" in line, line
    assert usd(float(ended["spent_usd"])) == usd(record.spent_usd)


# -- a worker killed with SIGKILL: what it sent is still counted ---------------------------------------

def test_the_part_puts_of_a_sigkilled_worker_are_metered(service, emulator_for, make_root, tmp_path):  # noqa: F811
    """A file of 32 parts of 5 MiB through a proxy that holds the 7th and 8th part PUTs (their
    bodies whole at the proxy): w1 is killed with both in flight, the proxy then forwards them,
    w2 runs the task again and sends the parts w1 did not finish. The job's meter counts every
    part PUT the proxy saw (w1's finished ones, its two in flight, w2's), and spend is priced
    from that; before, w1's requests died with it."""
    moto = emulator_for("s3")
    dst = make_root("s3")
    bucket = dst[len("s3://"):].rstrip("/")
    src = tmp_path / "src"
    src.mkdir()
    parts = 32
    with open(src / "model.bin", "wb") as f:
        for _ in range(parts):
            f.write(os.urandom(5 * MiB))
    part_put = rf"^PUT /{re.escape(bucket)}/[^?]*\?.*partNumber="
    with FaultProxy(moto.endpoint) as proxy:
        proxy.configure(rules=[Rule(part_put, "hold", times=2, after=6)])
        service.env["AWS_ENDPOINT_URL"] = proxy.endpoint
        w1 = service.worker("w1", concurrency=1, threads=2).wait_ready()   # two parts in flight at most
        job_id = service.submit("cp", f"{src}/", dst, "--chunk-size", "5MiB")
        deadline = time.monotonic() + 120
        while proxy.counts["hold"] < 2:
            assert time.monotonic() < deadline, f"the proxy held {proxy.counts['hold']} part PUTs\n{w1.log_tail()}"
            assert service.jobs.state(job_id) not in ("succeeded", "failed"), service.jobs.get(job_id).errors
            time.sleep(0.02)
        w1.kill()   # both of its part PUTs wait at the proxy: none is half sent
        proxy.release()
        service.worker("w2", concurrency=1, threads=2).wait_ready()
        record = service.wait(job_id, timeout=180)
        seen = [line for line, action in proxy.log if action != "error"]
        bytes_up = proxy.counts["bytes_up"]

    assert record.state == "succeeded", record.errors
    assert record.counters.get("requeued", 0) >= 1
    part_puts = [line for line in seen if re.search(part_put, line)]
    assert len(part_puts) > parts, "no part was sent twice: the kill did not land mid-file"
    store = f"s3://{bucket}"
    metered = record.metered   # as jobs status shows it
    assert metered[store]["requests"]["PART"] == len(part_puts)
    assert sum(row["bytes_sent"] for row in metered.values()) == bytes_up   # every body the proxy read
    assert bytes_up >= len(part_puts) * 5 * MiB
    # and every other request the proxy carried to the bucket, kind by kind
    classified = [meter.classify("s3", *line.split(" ", 1)) for line in seen]
    assert Counter(metered[store]["requests"]) == Counter(kind for at, kind in classified if at == store)
    # spend is priced from them: at least the price table's price of every part PUT the proxy saw
    assert record.spent_usd >= request_usd("s3", Counter(PART=len(part_puts)))
    print(f"SIGKILL with 2 part PUTs held: {len(part_puts)} part PUTs at the proxy for {parts} parts, "
          f"{metered[store]['requests']['PART']} metered; {bytes_up / MiB:.1f} MiB on the wire for a "
          f"{parts * 5} MiB file, {sum(row['bytes_sent'] for row in metered.values()) / MiB:.1f} MiB metered")


# -- submit checks its own environment, as cp does -------------------------------------------------------

BAD_ENVIRONMENT = [
    ("AWS_ENDPOINT_URL", "not a url"),
    ("MCBRIDGE_CONCURRENCY", "nan"),
    ("MCBRIDGE_CHUNK_SIZE", "abc"),
    ("MCBRIDGE_BWLIMIT", "-5"),
    ("MCBRIDGE_SMALL_FILES_IN_FLIGHT", "0"),
    ("BRIDGE_SERVICE_POLICY", "/etc/passwd"),
]


@pytest.fixture
def submitter(redis_url, tmp_path, tmp_path_factory):
    """A submitter's environment (a tenant's key, a broker, a namespace of its own) that queues a
    job when nothing is wrong with it; and a look at what the namespace holds in Redis."""
    import uuid

    from bridge.workers.keys import redis_client
    from bridge.workers.testing import purge_namespace, tenant_env
    namespace = f"mcbt-{uuid.uuid4().hex[:10]}"
    env = {**os.environ, "BRIDGE_BROKER_URL": redis_url, "BRIDGE_NAMESPACE": namespace,
           "MCBRIDGE_STATE_DIR": str(tmp_path / "state"),
           **tenant_env(tmp_path_factory.mktemp("tenant"), local_roots=[str(tmp_path)])}
    env.pop("MCBRIDGE_CONFIG", None)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("a\n")
    client = redis_client(redis_url)
    yield env, lambda: sorted(client.scan_iter(match=f"{namespace}:*"))
    purge_namespace(redis_url, namespace)


def test_submit_queues_a_job_when_its_environment_is_sound(submitter, tmp_path):
    env, keys = submitter
    result = mcbridge("submit", "cp", f"{tmp_path}/src/", "s3://some-bucket/in/", env=env)
    assert result.returncode == 0, result.stderr
    assert keys() != []   # the control: the refusals below are the environment's


@pytest.mark.parametrize("variable,value", BAD_ENVIRONMENT, ids=[v for v, _ in BAD_ENVIRONMENT])
def test_submit_refuses_a_bad_environment_before_queueing(submitter, tmp_path, variable, value):
    env, keys = submitter
    env = {**env, variable: value}
    submitted = mcbridge("submit", "cp", f"{tmp_path}/src/", "s3://some-bucket/in/", env=env)
    line = one_error_line(submitted)
    assert keys() == [], "the job reached Redis"
    assert value in line or variable in line, line
    if variable.startswith("BRIDGE_"):
        return   # the service's own setting: cp runs no service
    copied = mcbridge("cp", f"{tmp_path}/src/", f"{tmp_path}/out/", env=env)
    assert one_error_line(copied) == line   # in cp's words: the same function said it


# -- the residue: each refused with exit 2 and one line ------------------------------------------------

@pytest.fixture
def local_env(tmp_path):
    env = {**os.environ, "MCBRIDGE_STATE_DIR": str(tmp_path / "state"), "MCBRIDGE_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("MCBRIDGE_CONFIG", None)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("a\n")
    return env


@pytest.mark.parametrize("ttl", ["", "nan", "inf", "1e999", "1" * 40, "-5", "0", "3651d"])
def test_cache_pin_refuses_a_ttl_that_is_no_duration(local_env, tmp_path, ttl):
    line = one_error_line(mcbridge("cache", "pin", str(tmp_path / "src" / "a.txt"), "--ttl", ttl, env=local_env))
    assert "--ttl" in line or repr(ttl) in line, line
    assert not list((tmp_path / "cache").glob("pins/*.json")), "pinned all the same"


def test_cache_pin_keeps_a_ttl_that_is_one(local_env, tmp_path):
    result = mcbridge("cache", "pin", str(tmp_path / "src" / "a.txt"), "--ttl", "12h", env=local_env)
    assert result.returncode == 0, result.stderr
    until = json.loads(next((tmp_path / "cache").glob("pins/*.json")).read_text())["until"]
    assert 12 * 3600 - 60 < until - time.time() <= 12 * 3600


@pytest.mark.parametrize("args,flag", [
    (["pack", "{src}/", "{out}/", "-f", "tar", "--memory", "0"], "--memory"),
    (["pack", "{src}/", "{out}/", "-f", "tar", "--shard-size", "0"], "--shard-size"),
    (["plan", "{src}/", "{out}/", "--pack", "tar", "--shard-size", "0"], "--shard-size"),
    (["migrate", "{src}/", "{out}/", "--pack", "tar", "--shard-size", "0"], "--shard-size"),
], ids=["pack --memory 0", "pack --shard-size 0", "plan --pack tar --shard-size 0", "migrate --shard-size 0"])
def test_a_size_of_nothing_is_refused_by_pack_and_plan_alike(local_env, tmp_path, args, flag):
    argv = [a.format(src=tmp_path / "src", out=tmp_path / "out") for a in args]
    line = one_error_line(mcbridge(*argv, env=local_env))
    assert line == f"mcbridge: error: {flag} '0' must be at least 1 byte"
    assert not (tmp_path / "out").exists()


def test_submit_pack_refuses_a_shard_size_of_nothing_before_queueing(submitter, tmp_path):
    env, keys = submitter
    for args in (["pack", "--shard-size", "0"], ["migrate", "--pack", "tar", "--shard-size", "0"]):
        line = one_error_line(mcbridge("submit", args[0], f"{tmp_path}/src/", "s3://some-bucket/shards/", *args[1:],
                                       env=env))
        assert line == "mcbridge: error: --shard-size '0' must be at least 1 byte"
    assert keys() == []


def test_a_budget_of_1e40_dollars_is_refused_not_printed_in_41_digits(submitter):
    env, keys = submitter
    line = one_error_line(mcbridge("budgets", "set", "team", "1e40", env=env))
    assert line == "mcbridge: error: USD 1e+40: give at most 1000000000000 US dollars"
    assert keys() == []
    line = one_error_line(mcbridge("cp", "--max-cost", "1e40", "/nonexistent/", "/nonexistent-too/", env=env))
    assert "--max-cost 1e+40" in line
    done = mcbridge("budgets", "set", "team", "1e12", env=env)
    assert done.returncode == 0 and done.stdout.strip() == "budget team: $1000000000000.00 a month", done


@pytest.mark.parametrize("state_dir", ["/proc/self/fdinfo", "/proc/self/fdinfo/state"])
def test_a_state_directory_where_nothing_can_be_made_is_bad_input(local_env, tmp_path, state_dir):
    if not Path("/proc/self/fdinfo").is_dir():
        pytest.skip("no /proc here")
    env = {**local_env, "MCBRIDGE_STATE_DIR": state_dir}
    line = one_error_line(mcbridge("cp", f"{tmp_path}/src/", f"{tmp_path}/out/", env=env))
    assert line.startswith(f"mcbridge: error: state directory {state_dir} (transfer.state_dir, MCBRIDGE_STATE_DIR): ")
    assert not (tmp_path / "out").exists()
