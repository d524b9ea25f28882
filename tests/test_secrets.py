"""No secret leaves the process, whichever command fails and however it fails.

Every command that can print an error runs with secrets in play: an Azure SAS (a connection
string whose endpoint is a loopback port nobody answers), an account key (the same, keyed), and
an S3 presigned URL (signed by boto3, given as an argument). Their secret values are then looked
for in stdout, stderr, the ``--json`` output, the log lines, and, for jobs run by a real worker
over Redis, in the job's records and the worker's log. The secrets are always masked; the text
around them (the endpoint, the object) stays, so a user still sees what failed.

Also: object names with control characters (ANSI escapes, CR, DEL, C1) are printed escaped by
``ls``, ``verify`` and ``sync --dry-run``, from a local tree and from an object store, and the
``--json`` output of the same stays exact JSON.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

import pytest

from bridge.redact import MASK, redact
from tests.emulators import AZURITE_ACCOUNT, AZURITE_KEY, free_port, unique_name
from tests.helpers import mcbridge, settings_for

pytestmark = pytest.mark.timeout(600)

ACCOUNT_KEY = base64.b64encode(b"an account key of this test only" * 2).decode()


def _sas() -> str:
    from azure.storage.blob import AccountSasPermissions, ResourceTypes, generate_account_sas
    return generate_account_sas(AZURITE_ACCOUNT, AZURITE_KEY, ResourceTypes(service=True, container=True, object=True),
                                AccountSasPermissions(read=True, write=True, list=True, delete=True),
                                dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1))


def _presigned(moto) -> str:
    import boto3
    from botocore.config import Config
    client = boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1",
                          aws_access_key_id="AKIAEXAMPLEKEYID0001", aws_secret_access_key="s" * 40,
                          aws_session_token="FwoGZXIvYXdzEXAMPLESESSIONTOKENxyz/abc+def==",
                          config=Config(signature_version="s3v4"))
    return client.generate_presigned_url("get_object", Params={"Bucket": "bkt", "Key": "data/f.bin"}, ExpiresIn=600)


class Secrets:
    """The secret values of one run and every form they could be printed in."""

    def __init__(self, moto):
        self.sas = _sas()
        self.presigned = _presigned(moto)
        query = parse_qs(urlsplit(self.presigned).query)
        self.values = {"SAS signature": parse_qs(self.sas)["sig"][0], "account key": ACCOUNT_KEY,
                       "X-Amz-Signature": query["X-Amz-Signature"][0],
                       "X-Amz-Credential": query["X-Amz-Credential"][0],
                       "X-Amz-Security-Token": query["X-Amz-Security-Token"][0]}
        self.dead = f"http://127.0.0.1:{free_port()}/{AZURITE_ACCOUNT}"   # nobody answers there

    def env(self, kind: str, base: dict[str, str]) -> dict[str, str]:
        conn = (f"BlobEndpoint={self.dead};SharedAccessSignature={self.sas}" if kind == "sas" else
                f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={ACCOUNT_KEY};"
                f"BlobEndpoint={self.dead}")
        return {**base, "AZURE_STORAGE_CONNECTION_STRING": conn}

    def leaks(self, text: str) -> list[str]:
        """The secrets found in ``text``, in any of the forms they travel in."""
        found = []
        for name, value in self.values.items():
            forms = {value, quote(value, safe=""), quote(value, safe="/"), value.replace("%2F", "/")}
            if len(value) > 24:
                forms |= {value[:24], value[-24:]}    # half a secret is a secret
            if any(form in text for form in forms):
                found.append(name)
        return found


@pytest.fixture
def secrets(moto) -> Secrets:
    return Secrets(moto)


@pytest.fixture
def local(tmp_path) -> Path:
    src = tmp_path / "src"
    (src / "step-1").mkdir(parents=True)
    (src / "step-1" / "weights.bin").write_bytes(b"w" * 1000)
    (src / "f.txt").write_text("hello\n")
    return src


def _base_env(moto, tmp_path: Path) -> dict[str, str]:
    """The emulators' S3 and a settings file that lets bridge try each request once: a request to
    the unreachable account fails the same way on its last try as on its first."""
    config = tmp_path / "config.yaml"
    config.write_text("profiles:\n  default:\n    transfer: {retries: 0, connect_timeout: 2}\n")
    return {"PATH": os.environ["PATH"], "HOME": "/nonexistent-home", "LANG": "C.UTF-8",
            "MCBRIDGE_CONFIG": str(config), "XDG_CONFIG_HOME": "/nonexistent/mcbridge-test-config",
            "AWS_ENDPOINT_URL": moto.endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1"}


def _run(*args: str, env: dict[str, str], state: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bridge", *args], env={**env, "MCBRIDGE_STATE_DIR": str(state)},
                          capture_output=True, text=True, timeout=300)


def _commands(local: Path, tmp_path: Path, presigned: str) -> list[tuple[str, list[str], bool]]:
    """(name, arguments, has --json) of each command that can fail on the unreachable account
    (or, given the presigned URL, on its argument)."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"policies:\n  golden:\n    source: {local}/\n    destinations: [az://cont/dr/]\n"
                      f"    checkpoints: 'step-*'\n")
    az = "az://cont/p/"
    return [
        ("ls", ["ls", az], True),
        ("cp", ["cp", "-q", f"{local}/", az], True),
        ("cp presigned", ["cp", "-q", presigned, f"{tmp_path}/out/"], True),
        ("sync", ["sync", "-q", f"{local}/", az], True),
        ("sync --dry-run", ["sync", "--dry-run", f"{local}/", az], True),
        ("verify", ["verify", az], True),
        ("verify presigned", ["verify", presigned], True),
        ("uploads", ["uploads", az], True),
        ("plan", ["plan", f"{local}/", az], True),
        ("replicate", ["replicate", "--policy", str(policy), "--once"], True),
        ("migrate", ["migrate", f"{local}/", "az://cont/m/", "--pack", "tar"], True),
        ("pack", ["pack", f"{local}/", "az://cont/shards/"], True),
        ("unpack", ["unpack", "az://cont/shards/", f"{tmp_path}/unpacked/"], True),
        ("cat", ["cat", "az://cont/shards/", "f.txt"], False),
        ("cache path", ["cache", "path", "az://cont/p/f.txt"], False),
        ("cache warm", ["cache", "warm", az], True),
    ]


@pytest.mark.parametrize("kind", ["sas", "key"])
def test_no_command_prints_a_secret(kind, secrets, local, moto, tmp_path):
    env = secrets.env(kind, _base_env(moto, tmp_path))
    env["MCBRIDGE_CACHE_DIR"] = str(tmp_path / "cache")
    failures, leaks = [], []
    for name, args, has_json in _commands(local, tmp_path, secrets.presigned):
        for extra in ([], ["--json"]) if has_json else ([],):
            r = _run(*args, *extra, env=env, state=tmp_path / "state")
            where = f"{name} {' '.join(extra)}".strip()
            if r.returncode == 0:
                failures.append(f"{where}: exit 0")
            if "Traceback" in r.stderr:
                failures.append(f"{where}: traceback")
            for stream, text in (("stdout", r.stdout), ("stderr", r.stderr)):
                leaks += [f"{where}: {secret} on {stream}" for secret in secrets.leaks(text)]
            if "presigned" not in name and kind == "sas":
                # what failed is still named: the endpoint, its SAS left out or the signature masked
                if "127.0.0.1" not in r.stdout + r.stderr:
                    failures.append(f"{where}: the unreachable endpoint is not named: {r.stderr or r.stdout}")
            if extra and r.stdout.strip():
                json.loads(r.stdout)   # what --json printed is JSON
    assert not leaks, leaks
    assert not failures, failures


def test_warnings_logged_by_an_sdk_reach_stderr_masked(secrets, tmp_path):
    """What an SDK's logger says during a command goes through the CLI's redacting handler."""
    url = secrets.presigned
    probe = ("import logging, sys\nfrom bridge import cli\n"
             "sys.argv = ['mcbridge', 'version']\n"
             "cli.log_to_stderr()\n"
             "from bridge.config import load_settings\nload_settings()\n"   # as every command does first
             f"logging.getLogger('urllib3.connectionpool').warning('Retrying GET %s: reset', {url!r})\n"
             f"logging.getLogger('azure.core').error('AccountKey={ACCOUNT_KEY}; bare {ACCOUNT_KEY}; \\x1b[31m')\n")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "XDG_CONFIG_HOME": "/nonexistent/mcbridge-test-config",
                            "AZURE_STORAGE_KEY": ACCOUNT_KEY, "MCBRIDGE_STATE_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert "Retrying GET http://127.0.0.1" in r.stderr and "data/f.bin" in r.stderr
    assert secrets.leaks(r.stderr) == [] and "\x1b" not in r.stderr and "\\x1b[31m" in r.stderr


def test_a_bare_configured_account_key_is_masked(tmp_path):
    key = base64.b64encode(os.urandom(64)).decode()
    settings_for({"AZURE_STORAGE_KEY": key, "MCBRIDGE_STATE_DIR": str(tmp_path)})
    assert key not in redact(f"request signed with {key} refused")
    assert quote(key, safe="") not in redact(f"GET /x?k={quote(key, safe='')}")
    assert redact("an ordinary line about az://c/k") == "an ordinary line about az://c/k"


# -- job records ----------------------------------------------------------------------------------

def _namespace_dump(client, namespace: str) -> str:
    """Every value stored under the namespace, as text."""
    parts = []
    for key in client.scan_iter(match=f"{namespace}*"):
        kind = client.type(key)
        if kind == "hash":
            parts.append(json.dumps(client.hgetall(key)))
        elif kind == "list":
            parts.append(json.dumps(client.lrange(key, 0, -1)))
        elif kind == "string":
            parts.append(client.get(key) or "")
        elif kind in ("set", "zset"):
            parts.append(json.dumps(sorted(client.smembers(key) if kind == "set" else client.zrange(key, 0, -1))))
        elif kind == "stream":   # the audit log
            parts.append(json.dumps(client.xrange(key)))
    return "\n".join(parts)


def test_job_records_and_worker_logs_hold_no_secret(secrets, local, moto, redis_url, tmp_path):
    from bridge.workers.jobrecords import TERMINAL, Jobs
    from bridge.workers.keys import Keys, redis_client
    from bridge.workers.testing import ServiceProcess, purge_namespace, tenant_env
    namespace = f"mcbt-{uuid.uuid4().hex[:10]}"
    env = {**secrets.env("sas", _base_env(moto, tmp_path)), "BRIDGE_BROKER_URL": redis_url, "BRIDGE_NAMESPACE": namespace,
           "BRIDGE_LEASE": "3s", "BRIDGE_SWEEP": "0.5s", "BRIDGE_METRICS_PORT": "0",
           "MCBRIDGE_STATE_DIR": str(tmp_path / "state"), **tenant_env(tmp_path / "tenant", local_roots=[str(local)])}
    client = redis_client(redis_url)
    jobs = Jobs(client, Keys(namespace), ttl=3600)
    worker = ServiceProcess.worker(env, "secrets", tmp_path, concurrency=2)
    try:
        worker.start().wait_ready()
        outputs, ids = [], []
        for args in (["cp", f"{local}/", "az://cont/p/"], ["replicate", f"{local}/", "az://cont/a/", "az://cont/b/"]):
            r = subprocess.run([sys.executable, "-m", "bridge", "submit", *args], env=env, capture_output=True,
                               text=True, timeout=300)
            outputs.append(r.stdout + r.stderr)
            if r.returncode == 0:
                ids.append(r.stdout.strip().splitlines()[-1])
        assert len(ids) == 2, outputs
        for job_id in ids:
            deadline = time.monotonic() + 240
            while (record := jobs.get(job_id)) is None or record.state not in TERMINAL:
                assert time.monotonic() < deadline, f"job {job_id} still {record and record.state}\n{worker.log_tail()}"
                time.sleep(0.2)
            assert record.state == "failed" and record.errors, record
            # the error was about the SAS endpoint (a replicate job's: its children's)
            errors = record.errors + [e for child in record.children for e in jobs.get(child).errors]
            assert "cannot reach the Azure endpoint http://127.0.0.1" in "".join(errors), errors
            for extra in ([], ["--json"]):
                r = subprocess.run([sys.executable, "-m", "bridge", "jobs", "status", job_id, *extra], env=env,
                                   capture_output=True, text=True, timeout=120)
                outputs.append(r.stdout + r.stderr)
        stored = _namespace_dump(client, namespace)   # the errors name the endpoint, never its SAS
        leaks = {"records": secrets.leaks(stored), "cli": secrets.leaks("\n".join(outputs)),
                 "worker log": secrets.leaks(worker.log_path.read_text(errors="replace"))}
        assert leaks == {"records": [], "cli": [], "worker log": []}, leaks
    finally:
        worker.stop()
        purge_namespace(redis_url, namespace)


# -- control characters in names ---------------------------------------------------------------

HOSTILE = ["red\x1b[31mX.txt", "cr\rover.txt", "del\x7fd.txt", "c1\x9bq.txt", "bell\x07.txt", "plain.txt"]
RAW = ["\x1b", "\r", "\x7f", "\x9b", "\x07"]


def _no_raw_controls(text: str, where: str) -> None:
    for ch in RAW:
        assert ch not in text, (where, ch, text)


def _check_listing_outputs(root: str, extra_at: str, env: dict[str, str], tmp_path: Path) -> Path:
    state = tmp_path / "state"
    r = mcbridge("ls", root, env=env, state_dir=state)
    assert r.returncode == 0, r.stderr
    _no_raw_controls(r.stdout, "ls")
    assert "red\\x1b[31mX.txt" in r.stdout and "cr\\x0dover.txt" in r.stdout and "c1\\x9bq.txt" in r.stdout
    listed = json.loads(mcbridge("ls", root, "--json", env=env, state_dir=state).stdout)
    assert sorted(row["path"] for row in listed) == sorted(HOSTILE)     # exact names in JSON
    dst = tmp_path / "dst"
    r = mcbridge("sync", "--dry-run", root, f"{dst}/", env=env, state_dir=state)
    assert r.returncode == 0, r.stderr
    _no_raw_controls(r.stdout, "sync --dry-run")
    assert "copy del\\x7fd.txt" in r.stdout
    planned = json.loads(mcbridge("sync", "--dry-run", "--json", root, f"{dst}/", env=env, state_dir=state).stdout)
    assert sorted(row["path"] for row in planned["plan"]) == sorted(HOSTILE)
    r = mcbridge("cp", "-q", root, extra_at, env=env, state_dir=state)
    assert r.returncode == 0, r.stderr
    return state


def test_names_with_control_characters_are_escaped_from_a_local_tree(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in HOSTILE:
        (src / name).write_text(name)
    env = {"PATH": os.environ["PATH"], "HOME": "/nonexistent-home", "LANG": "C.UTF-8"}
    copy = tmp_path / "copy"
    state = _check_listing_outputs(f"{src}/", f"{copy}/", env, tmp_path)
    (copy / "x\x1b]0;title\x07y.txt").write_text("planted")
    r = mcbridge("verify", f"{copy}/", env=env, state_dir=state)
    assert r.returncode == 1
    _no_raw_controls(r.stdout + r.stderr, "verify")
    assert "extra       x\\x1b]0;title\\x07y.txt" in r.stdout
    report = json.loads(mcbridge("verify", f"{copy}/", "--json", env=env, state_dir=state).stdout)
    assert report["extra"] == ["x\x1b]0;title\x07y.txt"]


def test_names_with_control_characters_are_escaped_from_s3(moto, emulator_env, tmp_path):
    bucket = unique_name()
    moto.create_bucket(bucket)
    s3 = moto.client()
    for name in HOSTILE:
        s3.put_object(Bucket=bucket, Key=f"src/{name}", Body=name.encode())
    state = _check_listing_outputs(f"s3://{bucket}/src/", f"s3://{bucket}/copy/", emulator_env, tmp_path)
    s3.put_object(Bucket=bucket, Key="copy/x\x1b[2Jy.txt", Body=b"planted")
    s3.delete_object(Bucket=bucket, Key="copy/del\x7fd.txt")
    r = mcbridge("verify", f"s3://{bucket}/copy/", env=emulator_env, state_dir=state)
    assert r.returncode == 1
    _no_raw_controls(r.stdout + r.stderr, "verify")
    assert "extra       x\\x1b[2Jy.txt" in r.stdout and "missing     del\\x7fd.txt" in r.stdout


def test_policy_run_reports_are_stored_masked(secrets, redis_url):
    """What a policy run stores per destination (the job's replicas, the policy's state) quotes
    the children's errors and retention's listing error: stored masked, in real Redis."""
    from bridge.workers.jobrecords import Jobs
    from bridge.workers.keys import Keys, redis_client
    from bridge.workers.replicas import PolicyState
    from bridge.workers.specs import parse_spec
    from bridge.workers.testing import purge_namespace
    namespace = f"mcbt-{uuid.uuid4().hex[:10]}"
    client, keys = redis_client(redis_url), Keys(namespace)
    problem = f"az://cont/a/: cannot reach the Azure endpoint {secrets.dead}/?{secrets.sas}: ServiceRequestError"
    try:
        jobs = Jobs(client, keys, ttl=60)
        job_id = jobs.create(parse_spec({"kind": "replicate", "source": "s3://src-b/ck/",
                                         "destinations": ["az://cont/a/"]}), queue="bridge.control")
        row = {"ok": False, "newest_verified": "step-1", "errors": [problem]}
        jobs.update(job_id, replicas={"az://cont/a/": row}, verify={"ok": False, "error": problem})
        PolicyState(client, keys).put("golden", "az://cont/a/", row)
        stored = _namespace_dump(client, namespace)
        assert f"sig={MASK}" in stored and secrets.leaks(stored) == []
        assert PolicyState(client, keys).destinations("golden")["az://cont/a/"]["newest_verified"] == "step-1"
    finally:
        purge_namespace(redis_url, namespace)
