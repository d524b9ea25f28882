"""No secret is printed: the redaction function against each provider's real signed forms, and
the CLI's error line with a SAS connection string whose endpoint does not answer."""

from __future__ import annotations

import datetime as dt
import os
from urllib.parse import parse_qs, urlsplit

import pytest

from bridge.jobs import describe
from bridge.errors import EndpointUnreachable
from bridge.redact import MASK, redact
from tests.emulators import AZURITE_ACCOUNT, AZURITE_KEY, free_port
from tests.helpers import mcbridge

SECRET_PARAMS = {"x-amz-signature", "x-amz-credential", "x-amz-security-token", "x-goog-signature",
                 "x-goog-credential", "sig", "signature"}


def secrets_in(url: str) -> list[str]:
    query = parse_qs(urlsplit(url).query)
    found = [value for name, values in query.items() if name.lower() in SECRET_PARAMS for value in values]
    assert found, url
    return found


def assert_masked(text: str, secrets: list[str]) -> str:
    cleaned = redact(text)
    for secret in secrets:
        assert secret not in cleaned, (secret, cleaned)
        assert secret.replace("/", "%2F").replace("+", "%2B").replace("=", "%3D") not in cleaned
    assert MASK in cleaned
    return cleaned


@pytest.mark.parametrize("version,names", [
    ("s3v4", {"X-Amz-Signature", "X-Amz-Credential", "X-Amz-Security-Token"}),
    ("s3", {"Signature", "x-amz-security-token"}),                  # the older query-string form
])
def test_s3_presigned_url_from_boto3(version, names, emulator_for):
    import boto3
    from botocore.config import Config
    moto = emulator_for("s3")
    client = boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1",
                          aws_access_key_id="AKIAEXAMPLEKEYID0001", aws_secret_access_key="s" * 40,
                          aws_session_token="FwoGZXIvYXdzEXAMPLESESSIONTOKEN/abc+def==",
                          config=Config(signature_version=version))
    url = client.generate_presigned_url("get_object", Params={"Bucket": "bkt", "Key": "a/b.bin"}, ExpiresIn=60)
    assert names <= set(parse_qs(urlsplit(url).query))
    cleaned = assert_masked(f"GET {url} failed: 403 Forbidden", secrets_in(url))
    assert "EXAMPLESESSIONTOKEN" not in cleaned and "a/b.bin" in cleaned   # the object is still named


def test_azure_sas_from_generate_blob_sas():
    from azure.storage.blob import BlobSasPermissions, generate_blob_sas
    token = generate_blob_sas(AZURITE_ACCOUNT, "cont", "dir/blob.bin", account_key=AZURITE_KEY,
                              permission=BlobSasPermissions(read=True),
                              expiry=dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1))
    url = f"http://127.0.0.1:10000/{AZURITE_ACCOUNT}/cont/dir/blob.bin?{token}"
    secrets = secrets_in(url)
    assert_masked(f"cannot reach the Azure endpoint {url}: ServiceRequestError", secrets)
    assert_masked(f"token {token}", secrets)      # a SAS token on its own, as AZURE_STORAGE_SAS_TOKEN holds
    conn = f"BlobEndpoint=http://127.0.0.1:10000/{AZURITE_ACCOUNT};SharedAccessSignature={token}"
    assert_masked(conn, secrets + [token])


def test_azure_connection_string_account_key(emulator_for):
    conn = emulator_for("az").connection_string
    cleaned = assert_masked(f"bad settings: {conn}", [AZURITE_KEY, AZURITE_KEY[:20]])
    assert f"AccountName={AZURITE_ACCOUNT}" in cleaned


def test_gcs_v4_signed_url_from_google_cloud_storage(emulator_for):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from google.oauth2 import service_account
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    creds = service_account.Credentials.from_service_account_info({
        "type": "service_account", "client_email": "copier@proj.iam.gserviceaccount.com", "private_key": pem,
        "private_key_id": "k1", "token_uri": "http://127.0.0.1:1/token", "project_id": "proj"})
    blob = emulator_for("gs").client().bucket("bkt").blob("a/b.bin")
    url = blob.generate_signed_url(version="v4", expiration=dt.timedelta(minutes=5), credentials=creds,
                                   api_access_endpoint="http://127.0.0.1:4443")
    assert {"X-Goog-Signature", "X-Goog-Credential"} <= set(parse_qs(urlsplit(url).query))
    cleaned = assert_masked(f"GET {url}: 403", secrets_in(url))
    assert "copier@proj" not in cleaned


@pytest.mark.parametrize("text", [
    "Authorization: Bearer ya29.a0AfB_byC-EXAMPLE_token.value",
    '{"access_token": "ya29.a0AfB_byC-EXAMPLE_token.value", "token_type": "Bearer"}',
    "refresh failed for ya29.a0AfB_byC-EXAMPLE_token.value",
    "header Bearer ya29.a0AfB_byC-EXAMPLE_token.value rejected",
])
def test_oauth_tokens(text):
    assert_masked(text, ["a0AfB_byC-EXAMPLE_token.value"])


def test_plain_text_and_names_are_left_alone():
    for text in ("copied 3 files to gs://b/sig/ in 1.0s", "s3://b/design=x/token.txt: no such object",
                 "az://c/big-signature.bin: 412 ConditionNotMet"):
        assert redact(text) == text


def test_the_engine_redacts_what_it_records():
    exc = EndpointUnreachable("cannot reach http://h/c/b?sv=2022-11-02&sig=c2VjcmV0%2Bsig%3D: timeout")
    assert "c2VjcmV0" not in describe(exc) and "timeout" in describe(exc)
    assert "c2VjcmV0" not in describe(OSError("GET http://h/c?sig=c2VjcmV0 reset"))


def test_cli_error_with_a_sas_connection_string_prints_no_signature(tmp_path):
    from azure.storage.blob import AccountSasPermissions, ResourceTypes, generate_account_sas
    sas = generate_account_sas(AZURITE_ACCOUNT, AZURITE_KEY, ResourceTypes(service=True, container=True, object=True),
                               AccountSasPermissions(read=True, write=True, list=True),
                               dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1))
    signature = parse_qs(sas)["sig"][0]
    src = tmp_path / "f.txt"
    src.write_text("x")
    endpoint = f"http://127.0.0.1:{free_port()}/{AZURITE_ACCOUNT}"
    env = {"PATH": os.environ["PATH"], "HOME": "/nonexistent-home", "LANG": "C.UTF-8",
           "AZURE_STORAGE_CONNECTION_STRING": f"BlobEndpoint={endpoint};SharedAccessSignature={sas}"}

    r = mcbridge("cp", str(src), "az://cont/f.txt", env=env, state_dir=tmp_path / "state", timeout=120)

    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mcbridge: error: cannot reach"), r.stderr
    for leaked in (signature, signature.replace("/", "%2F").replace("+", "%2B").replace("=", "%3D")):
        assert leaked not in r.stderr + r.stdout
    # the endpoint is named; its SAS is left out (the direct path) or masked (an SDK's message)
    assert endpoint in lines[0] and ("sig=" not in lines[0] or "sig=***" in lines[0]), lines[0]


def test_cli_garbage_connection_string_is_one_line(tmp_path):
    src = tmp_path / "f.txt"
    src.write_text("x")
    env = {"PATH": os.environ["PATH"], "HOME": "/nonexistent-home", "LANG": "C.UTF-8",
           "AZURE_STORAGE_CONNECTION_STRING": "garbage"}
    r = mcbridge("cp", str(src), "az://cont/f.txt", env=env, state_dir=tmp_path / "state")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "connection string" in lines[0] and "malformed" in lines[0]
