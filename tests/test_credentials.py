"""The S3 direct path (bridge/stores/s3direct.py) with every kind of credentials botocore
resolves, over HTTPS with a CA of the tests' own (tests/emulators.py: LocalCA, TLSMotoServer).

The moto server here checks requests as AWS does once its setup is done (POST
/moto-api/reset-auth): the access key must be one IAM or STS issued, the signature must match
its secret, and the policy must allow the action. So a copy that succeeds proves that the direct
path signed with the keys (and session token) the credential source handed out.

botocore reads its credential sources from os.environ (AWS_CONFIG_FILE, AWS_ROLE_ARN,
AWS_EC2_METADATA_SERVICE_ENDPOINT ...): each test sets them with monkeypatch, which puts the
environment back after it.
"""

from __future__ import annotations

import datetime
import hashlib
import http.server
import json
import os
import stat
import threading
from pathlib import Path

import pytest

from bridge import ops
from bridge.errors import TransientError
from bridge.hashing import FileHash
from bridge.stores import get_store
from bridge.stores.s3direct import Direct, SigV4, botocore_credentials, shared_file_keys
from bridge.urls import parse
from tests.emulators import AWS_TEST_REGION, LocalCA, TLSMotoServer, TLSRcloneS3, unique_name
from tests.helpers import mcbridge, settings_for

BUCKET = "creds"
ROLE_ARN = "arn:aws:iam::123456789012:role/copier"
ALLOW_S3 = json.dumps({"Version": "2012-10-17",
                       "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]})


@pytest.fixture(scope="module")
def ca(tmp_path_factory) -> LocalCA:
    return LocalCA(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def aws(ca):
    """A moto server over HTTPS that checks signatures and policies, with a role to assume by web
    identity and a user with three access keys; yields (server, [(key, secret)])."""
    import boto3
    with TLSMotoServer(ca) as server:
        common = dict(endpoint_url=server.endpoint, region_name=AWS_TEST_REGION, verify=str(ca.ca_file),
                      aws_access_key_id="setup", aws_secret_access_key="setup")
        server.client().create_bucket(Bucket=BUCKET)
        iam = boto3.client("iam", **common)
        trust = json.dumps({"Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Principal": {"Federated": "accounts.example"},
            "Action": "sts:AssumeRoleWithWebIdentity"}]})
        iam.create_role(RoleName="copier", AssumeRolePolicyDocument=trust)
        iam.put_role_policy(RoleName="copier", PolicyName="s3", PolicyDocument=ALLOW_S3)
        iam.create_user(UserName="copier")
        iam.put_user_policy(UserName="copier", PolicyName="s3", PolicyDocument=ALLOW_S3)
        keys = [(k["AccessKeyId"], k["SecretAccessKey"])
                for k in (iam.create_access_key(UserName="copier")["AccessKey"] for _ in range(2))]
        checking(server, True)
        yield server, keys


def checking(server: TLSMotoServer, on: bool) -> None:
    """Turn moto's checks of keys, signatures and policies on, or off."""
    import ssl
    import urllib.request
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(
        context=ssl.create_default_context(cafile=str(server.ca.ca_file))))
    opener.open(urllib.request.Request(f"{server.endpoint}/moto-api/reset-auth", data=b"0" if on else b"inf",
                                       method="POST", headers={"Content-Type": "text/plain"}))


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """os.environ without any AWS credentials or files of the machine's, IMDS off."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return monkeypatch


def settings_env(server, ca: LocalCA, tmp_path: Path, **more: str) -> dict[str, str]:
    """The settings' environment: the endpoint and CA bundle, no keys (botocore finds them)."""
    return {"AWS_ENDPOINT_URL": server.endpoint, "AWS_CA_BUNDLE": str(ca.ca_file),
            "MCBRIDGE_STATE_DIR": str(tmp_path / "state"), **more}


def round_trip(settings, tmp_path: Path, count: int = 6) -> None:
    """Files up to the bucket and back through the direct path, byte-exact."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(count):
        (src / f"f{i}.bin").write_bytes(os.urandom(10_000 + i))
    prefix = f"s3://{BUCKET}/{unique_name()}/"
    ops.copy(f"{src}/", prefix, settings)
    ops.copy(prefix, f"{tmp_path}/back/", settings)
    for i in range(count):
        assert (tmp_path / "back" / f"f{i}.bin").read_bytes() == (src / f"f{i}.bin").read_bytes()


def signs_as_botocore(direct: Direct, credentials) -> None:
    """One PUT signed by the direct path's signer and by botocore's, with the keys the credentials
    object has now: the same Authorization, session token and all."""
    import botocore.auth
    from botocore.awsrequest import AWSRequest
    now = 1764554400.0
    frozen = credentials.get_frozen_credentials()
    body = b"x" * 1000
    ours = {"Content-Length": "1000", "x-amz-checksum-crc32c": "AAAAAA=="}
    SigV4(lambda: frozen, direct.region, https=False).sign("PUT", "h:1", "/b/k", "", ours, body, now)
    theirs = AWSRequest("PUT", "http://h:1/b/k", headers={"Content-Length": "1000",
                                                          "x-amz-checksum-crc32c": "AAAAAA=="}, data=body)
    at = datetime.datetime.fromtimestamp(now, datetime.timezone.utc).replace(tzinfo=None)
    original = botocore.auth.get_current_datetime
    botocore.auth.get_current_datetime = lambda: at
    try:
        botocore.auth.S3SigV4Auth(frozen, "s3", direct.region).add_auth(theirs)
    finally:
        botocore.auth.get_current_datetime = original
    assert ours["Authorization"] == theirs.headers["Authorization"]
    assert ours.get("x-amz-security-token") == theirs.headers.get("x-amz-security-token")
    # A presigned GET URL: the same query, signature and all.
    from urllib.parse import parse_qsl, urlsplit
    query = SigV4(lambda: frozen, direct.region, https=True).presign("GET", "h:1", "/b/%C3%BC%20k", 900, now)
    theirs = AWSRequest("GET", "https://h:1/b/%C3%BC%20k")
    botocore.auth.get_current_datetime = lambda: at
    try:
        botocore.auth.S3SigV4QueryAuth(frozen, "s3", direct.region, expires=900).add_auth(theirs)
    finally:
        botocore.auth.get_current_datetime = original
    assert sorted(parse_qsl(query, keep_blank_values=True)) == sorted(
        parse_qsl(urlsplit(theirs.prepare().url).query, keep_blank_values=True))


def test_keys_from_a_profile_in_the_shared_files(aws, ca, clean_env, tmp_path):
    server, keys = aws
    (tmp_path / "credentials").write_text(f"[work]\naws_access_key_id = {keys[0][0]}\n"
                                          f"aws_secret_access_key = {keys[0][1]}\n")
    (tmp_path / "config").write_text(f"[profile work]\nregion = eu-west-1\nca_bundle = {ca.ca_file}\n")
    clean_env.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    clean_env.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    # No CA bundle in the settings: the profile's ca_bundle is the one the endpoint is verified against.
    env = {k: v for k, v in settings_env(server, ca, tmp_path, AWS_PROFILE="work").items() if k != "AWS_CA_BUNDLE"}
    settings = settings_for(env)
    store = get_store(parse(f"s3://{BUCKET}/"), settings)
    assert isinstance(store._direct, Direct) and store._direct.credentials == "shared-credentials-file"
    assert store._direct.endpoint.startswith("https://")
    assert (store._direct.region, store._direct.cafile) == ("eu-west-1", str(ca.ca_file))
    round_trip(settings, tmp_path)
    # A multipart upload: begun, sent and completed on the direct path, with the same keys.
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(12 * 1024 * 1024 + 5))
    ops.copy(str(big), f"s3://{BUCKET}/big/", settings, chunk_size=8 * 1024 * 1024)
    ops.copy(f"s3://{BUCKET}/big/big.bin", f"{tmp_path}/big-back/", settings)
    assert (tmp_path / "big-back" / "big.bin").read_bytes() == big.read_bytes()
    import boto3
    s3 = boto3.client("s3", endpoint_url=server.endpoint, region_name=AWS_TEST_REGION, verify=str(ca.ca_file),
                      aws_access_key_id=keys[0][0], aws_secret_access_key=keys[0][1])
    assert s3.head_object(Bucket=BUCKET, Key="big/big.bin")["ETag"].endswith('-2"')   # two parts
    found, _ = botocore_credentials("work")
    signs_as_botocore(store._direct, found)
    # Read without botocore, as botocore reads them: from the credentials file, else the config file.
    assert botocore_credentials("work")[0].method == "shared-credentials-file"
    assert shared_file_keys("work")[0] == tuple(found.get_frozen_credentials())[:3]
    (tmp_path / "config").write_text(f"[profile work]\nregion = {AWS_TEST_REGION}\n[profile cfg]\n"
                                     f"aws_access_key_id = {keys[1][0]}\naws_secret_access_key = {keys[1][1]}\n"
                                     f"aws_session_token = tok\n[profile role]\nrole_arn = {ROLE_ARN}\n"
                                     f"source_profile = work\n")
    in_config, _ = botocore_credentials("cfg")
    assert in_config.method == "config-file"
    assert shared_file_keys("cfg")[0] == tuple(in_config.get_frozen_credentials())[:3] == (*keys[1], "tok")
    assert shared_file_keys("role") is None   # a role to assume: botocore's to resolve


def test_a_web_identity_token_exchanged_at_sts(aws, ca, clean_env, tmp_path):
    server, _ = aws
    (tmp_path / "token").write_text("a-web-identity-token")
    clean_env.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(tmp_path / "token"))
    clean_env.setenv("AWS_ROLE_ARN", ROLE_ARN)
    clean_env.setenv("AWS_ROLE_SESSION_NAME", "bridge-test")
    clean_env.setenv("AWS_ENDPOINT_URL_STS", server.endpoint)   # moto's STS, over the same TLS
    clean_env.setenv("AWS_CA_BUNDLE", str(ca.ca_file))
    clean_env.setenv("AWS_DEFAULT_REGION", AWS_TEST_REGION)
    settings = settings_for(settings_env(server, ca, tmp_path))
    store = get_store(parse(f"s3://{BUCKET}/"), settings)
    assert isinstance(store._direct, Direct)
    assert store._direct.credentials == "assume-role-with-web-identity"
    # moto's STS refuses an unsigned AssumeRoleWithWebIdentity while it checks requests: the
    # exchange happens with the checks off, the copies (on the keys it gave, for an hour) with them on.
    checking(server, False)
    try:
        assert store._direct._signer.keys()[2]   # temporary keys: a session token goes along
    finally:
        checking(server, True)
    round_trip(settings, tmp_path)
    # Server-side copies (in one request, and in part copies), a level's listing and an upload's
    # parts, signed with the exchanged keys and their session token while moto checks them.
    import dataclasses

    from bridge.stores.s3 import S3Store
    data = os.urandom(6 * 1024 * 1024 + 1)
    top = f"s3://{BUCKET}/{unique_name()}/"
    store.put(parse(top + "a.bin"), data, crc32c=FileHash.of(data).crc32c, metadata={})
    one = store.copy_object(parse(top + "a.bin"), parse(top + "one/a.bin"), size=len(data))
    clean_env.setattr(S3Store, "features", dataclasses.replace(S3Store.features, max_copy_size=5 * 1024 * 1024))
    parted = store.copy_object(parse(top + "a.bin"), parse(top + "parts/a.bin"), size=len(data))
    assert store.read(one.location) == data and store.read(parted.location) == data
    assert sorted(str(getattr(x, "location", x)) for x in store.list_level(parse(top))) == [
        top + "a.bin", top + "one/", top + "parts/"]
    upload_id = store.begin_upload(parse(top + "up.bin"), 1)
    assert store.list_parts(parse(top + "up.bin"), upload_id) == {}
    store.abort_upload(parse(top + "up.bin"), upload_id)
    # A presigned URL (as a copy from URL hands its destination) reads the object with nothing
    # else. moto's checks cannot judge a presigned request (they answer 500, for botocore's URL
    # too): it is read with them off here; tests/test_s3direct.py has rclone check its signature.
    import ssl
    import urllib.request
    url = store.signed_url(parse(top + "one/a.bin"), 600)
    assert "X-Amz-Security-Token=" in url
    checking(server, False)
    try:
        with urllib.request.urlopen(url, context=ssl.create_default_context(cafile=str(ca.ca_file))) as answer:
            assert answer.read() == data
    finally:
        checking(server, True)
    found, _ = botocore_credentials(None)
    checking(server, False)
    try:
        signs_as_botocore(store._direct, found)
    finally:
        checking(server, True)


def test_credentials_that_expire_mid_job_are_refreshed(aws, ca, clean_env, tmp_path):
    """A credential_process that hands out keys valid for five minutes, the two access keys of
    the user in turn: inside botocore's refresh window, so every signature asks for new keys,
    and the job runs on keys that changed under it."""
    server, keys = aws
    counter = tmp_path / "handed-out"
    script = tmp_path / "creds.sh"
    script.write_text("#!/bin/sh\n"
                      f"n=$(cat {counter} 2>/dev/null || echo 0); echo $((n + 1)) > {counter}\n"
                      f"if [ $((n % 2)) = 0 ]; then k={keys[0][0]}; s={keys[0][1]}; "
                      f"else k={keys[1][0]}; s={keys[1][1]}; fi\n"
                      "e=$(date -u -d '+5 min' +%Y-%m-%dT%H:%M:%SZ)\n"
                      'printf \'{"Version": 1, "AccessKeyId": "%s", "SecretAccessKey": "%s", '
                      '"Expiration": "%s"}\' "$k" "$s" "$e"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "config").write_text(f"[profile rotating]\ncredential_process = {script}\n")
    clean_env.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    settings = settings_for(settings_env(server, ca, tmp_path, AWS_PROFILE="rotating"))
    store = get_store(parse(f"s3://{BUCKET}/"), settings)
    assert isinstance(store._direct, Direct) and store._direct.credentials == "custom-process"
    before = int(counter.read_text())
    round_trip(settings, tmp_path)
    assert int(counter.read_text()) - before > 6   # refreshed many times during the job
    found, _ = botocore_credentials("rotating")
    signs_as_botocore(store._direct, found)


class _IMDS(http.server.BaseHTTPRequestHandler):
    """Instance metadata (IMDSv2) on loopback: a session token, then a role's keys, valid for an
    hour (botocore moves a nearer expiry of instance keys out by a random 12-20 minutes, so the
    refresh mid-job is shown with a credential_process above)."""
    keys: list[tuple[str, str]] = []
    served = 0

    def do_PUT(self):
        self._answer(b"imds-session-token")

    def do_GET(self):
        if self.headers.get("X-aws-ec2-metadata-token") != "imds-session-token":
            self.send_response(401)
            self.end_headers()
            return
        if self.path.rstrip("/") == "/latest/meta-data/iam/security-credentials":
            self._answer(b"copier")
        elif self.path == "/latest/meta-data/iam/security-credentials/copier":
            key, secret = self.keys[type(self).served % len(self.keys)]
            type(self).served += 1
            expires = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
            self._answer(json.dumps({"Code": "Success", "AccessKeyId": key, "SecretAccessKey": secret,
                                     "Token": "", "Expiration": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}).encode())
        else:
            self.send_response(404)
            self.end_headers()

    def _answer(self, body: bytes):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_instance_metadata_credentials(aws, ca, clean_env, tmp_path):
    server, keys = aws
    _IMDS.keys, _IMDS.served = keys, 0
    imds = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _IMDS)
    threading.Thread(target=imds.serve_forever, daemon=True).start()
    try:
        clean_env.delenv("AWS_EC2_METADATA_DISABLED")
        clean_env.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", f"http://127.0.0.1:{imds.server_port}/")
        settings = settings_for(settings_env(server, ca, tmp_path))
        store = get_store(parse(f"s3://{BUCKET}/"), settings)
        assert isinstance(store._direct, Direct) and store._direct.credentials == "iam-role"
        round_trip(settings, tmp_path)
        assert _IMDS.served >= 1
        found, _ = botocore_credentials(None)
        signs_as_botocore(store._direct, found)
    finally:
        imds.shutdown()
        imds.server_close()


def test_a_certificate_that_does_not_verify_fails_in_one_line(ca, tmp_path):
    """An endpoint whose CA is not trusted, and one whose certificate names another host: one
    line naming the endpoint, a non-zero exit, no traceback, no retries."""
    other = LocalCA(tmp_path / "other", trusted=False)
    wrong_host = LocalCA(tmp_path / "wrong-host", hosts=("elsewhere.invalid",))
    (tmp_path / "f.bin").write_bytes(b"x" * 100)
    for server_ca, trusted in ((ca, other), (wrong_host, wrong_host)):
        with TLSRcloneS3(server_ca) as server:
            env = {**os.environ, **server.env(), "AWS_CA_BUNDLE": str(trusted.ca_file), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
            for args in (["cp", str(tmp_path / "f.bin"), "s3://nowhere/f.bin"], ["cp", "s3://nowhere/f.bin", str(tmp_path / "g.bin")]):
                done = mcbridge(*args, env=env, state_dir=tmp_path / "state")
                assert done.returncode != 0
                assert "Traceback" not in done.stderr
                lines = [line for line in done.stderr.splitlines() if line.strip()]
                assert len(lines) == 1 and f"127.0.0.1:{server.port}" in lines[0], done.stderr
                assert "did not prove who it is" in lines[0]
            # The batched path (asyncio links, bridge/stores/streams.py) says the same, without retrying.
            from bridge.stores.s3 import _from_code
            direct = Direct(server.endpoint, AWS_TEST_REGION, lambda: ("testing", "testing", None), 10.0,
                            str(trusted.ca_file))
            failed = direct.get_many([parse("s3://nowhere/a"), parse("s3://nowhere/b")], lambda i, body: None,
                                     _from_code, connections=2, retries=3)
            assert sorted(failed) == [0, 1]
            assert all(f"127.0.0.1:{server.port} did not prove who it is" in str(e) for e in failed.values())
            assert not any(isinstance(e, TransientError) for e in failed.values())


@pytest.mark.parametrize("tls", [True, False], ids=["https", "http"])
def test_a_body_is_read_in_c_and_its_connection_kept(ca, tls, tmp_path, monkeypatch):
    """A ranged read hands its body over from the TLS object (or the socket) straight into the
    caller's buffer, not through http.client's buffered reader, byte-exact, cut at any piece
    size; the connection then takes the next request (the answer was closed as read)."""
    import socket

    from tests.emulators import RcloneS3
    data = os.urandom(3 * 1024 * 1024 + 17)
    with (TLSRcloneS3(ca) if tls else RcloneS3()) as server:
        server.create_bucket("body")
        store = get_store(parse("s3://body/"), settings_for({**server.env(), "MCBRIDGE_STATE_DIR": str(tmp_path)}))
        store.put(parse("s3://body/b.bin"), data, crc32c=FileHash.of(data).crc32c, metadata={})
        calls = [0]
        original = socket.SocketIO.readinto

        def counted(self, b):
            calls[0] += 1
            return original(self, b)
        monkeypatch.setattr(socket.SocketIO, "readinto", counted)
        loc = parse("s3://body/b.bin")
        conns = set()
        for piece, (offset, length) in ((64 * 1024, (0, len(data))), (100_003, (5, 2 * 1024 * 1024)), (7, (9, 40))):
            got = bytearray()
            n = store.read_through(loc, offset, length, bytearray(piece),
                                   lambda pos, view: got.extend(view))
            assert n == length and bytes(got) == data[offset:offset + length]
            conns.add(id(store._direct._host("body").local.conn))
        assert len(conns) == 1   # one connection for the three requests
        # headers and what the buffered reader held: a few reads; the body's hundreds of TLS
        # records (or socket reads) went around it
        assert calls[0] < 20, calls[0]
