"""The Azure and GCS direct paths over HTTPS with a CA of the tests' own (tests/emulators.py:
LocalCA, TLSAzurite, TLSFakeGCS): Azure with an account key, a SAS and an Azure AD bearer token
that is asked for again as it expires (Azurite's ``--oauth basic`` checks each token's lifetime,
issuer and audience); GCS anonymously, as an emulator is reached. The S3 side:
tests/test_credentials.py."""

from __future__ import annotations

import base64
import datetime
import json
import os
import time
from pathlib import Path

import pytest

from bridge import ops
from bridge.errors import BridgeError
from bridge.stores import get_store
from bridge.stores.azure import _from_code
from bridge.stores.azuredirect import API_VERSION, Bearer, Direct as AzureDirect
from bridge.stores.gcsdirect import Direct as GCSDirect
from bridge.urls import parse
from tests.emulators import AZURITE_ACCOUNT, AZURITE_KEY, LocalCA, TLSAzurite, TLSFakeGCS, unique_name
from tests.helpers import settings_for


@pytest.fixture(scope="module")
def ca(tmp_path_factory) -> LocalCA:
    return LocalCA(tmp_path_factory.mktemp("ca"))


class _OAuthAzurite(TLSAzurite):
    name = "azurite-oauth"

    def command(self) -> list[str]:
        return [*super().command(), "--oauth", "basic"]


@pytest.fixture(scope="module")
def azurite(ca):
    with _OAuthAzurite(ca) as server:
        yield server


@pytest.fixture(scope="module")
def fake_gcs(ca):
    with TLSFakeGCS(ca) as server:
        yield server


def _files(tmp_path: Path, count: int = 5) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(count):
        (src / f"f{i}.bin").write_bytes(os.urandom(5_000 + i))
    return src


def _same(a: Path, b: Path) -> None:
    for f in a.iterdir():
        assert (b / f.name).read_bytes() == f.read_bytes()


def _round_trip(settings, root: str, tmp_path: Path) -> None:
    src = _files(tmp_path)
    ops.copy(f"{src}/", root, settings)
    ops.copy(root, f"{tmp_path}/back/", settings)
    _same(src, tmp_path / "back")


def _env(server, tmp_path: Path, **more: str) -> dict[str, str]:
    return {"MCBRIDGE_CA_BUNDLE": str(server.ca.ca_file), "MCBRIDGE_STATE_DIR": str(tmp_path / "state"), **more}


def test_azure_account_key_over_tls(azurite, tmp_path):
    container = unique_name()
    azurite.create_bucket(container)
    settings = settings_for(_env(azurite, tmp_path, AZURE_STORAGE_CONNECTION_STRING=azurite.connection_string))
    store = get_store(parse(f"az://{container}/"), settings)
    assert isinstance(store._direct, AzureDirect) and store._direct.credentials == "key"
    assert store._direct.endpoint.startswith("https://")
    _round_trip(settings, f"az://{container}/", tmp_path)


def test_azure_sas_over_tls(azurite, tmp_path):
    from azure.storage.blob import AccountSasPermissions, ResourceTypes, generate_account_sas
    container = unique_name()
    azurite.create_bucket(container)
    sas = generate_account_sas(AZURITE_ACCOUNT, AZURITE_KEY, ResourceTypes(service=True, container=True, object=True),
                               AccountSasPermissions(read=True, write=True, list=True, create=True, add=True, delete=True),
                               expiry=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1))
    conn = f"BlobEndpoint={azurite.endpoint}/{AZURITE_ACCOUNT};SharedAccessSignature={sas}"
    settings = settings_for(_env(azurite, tmp_path, AZURE_STORAGE_CONNECTION_STRING=conn))
    store = get_store(parse(f"az://{container}/"), settings)
    assert isinstance(store._direct, AzureDirect) and store._direct.credentials == "sas"
    _round_trip(settings, f"az://{container}/", tmp_path)
    # A SAS that does not allow writing is refused by the service: the direct path sent it as given.
    read_only = generate_account_sas(AZURITE_ACCOUNT, AZURITE_KEY, ResourceTypes(container=True, object=True),
                                     AccountSasPermissions(read=True, list=True),
                                     expiry=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1))
    settings = settings_for(_env(azurite, tmp_path, AZURE_STORAGE_CONNECTION_STRING=conn.replace(sas, read_only)))
    ops.copy(f"az://{container}/", f"{tmp_path}/again/", settings)
    _same(tmp_path / "src", tmp_path / "again")
    with pytest.raises(BridgeError):
        ops.copy(f"{tmp_path}/src/", f"az://{container}/other/", settings)


class _Tokens:
    """An azure.core TokenCredential handing out Azure AD-shaped tokens (Azurite's basic OAuth
    checks their lifetime, issuer and audience, not a signature) that expire within a minute:
    inside the direct path's refresh window, so that each request asks for a new one."""

    def __init__(self):
        self.handed_out = 0

    def get_token(self, *scopes, **kwargs):
        from azure.core.credentials import AccessToken
        assert scopes == ("https://storage.azure.com/.default",)
        self.handed_out += 1
        now = int(time.time())
        claims = {"aud": "https://storage.azure.com", "iss": "https://sts.windows.net/ab1f708d-50f6-404c-a006-d71b2ac7a606/",
                  "iat": now - 5, "nbf": now - 5, "exp": now + 60, "oid": "test", "tid": "test"}
        part = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()
        return AccessToken(f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part(claims)}.c2ln", now + 60)


def test_azure_ad_bearer_tokens_refreshed_over_tls(azurite, tmp_path):
    container = unique_name()
    azurite.create_bucket(container)
    tokens = _Tokens()
    direct = AzureDirect(f"{azurite.endpoint}/{AZURITE_ACCOUNT}", AZURITE_ACCOUNT, Bearer(tokens), API_VERSION,
                         _from_code, 5.0, 30.0, str(azurite.ca.ca_file))
    assert direct.credentials == "azure-ad"
    bodies = [os.urandom(3_000 + i) for i in range(4)]
    locs = [parse(f"az://{container}/ad/{i}.bin") for i in range(4)]
    failed = direct.put_many(len(bodies), lambda i: (locs[i], bodies[i], {}), lambda i, answer: None,
                             connections=2, retries=0)
    assert failed == {}
    got: dict[int, bytes] = {}
    assert direct.get_many(locs, lambda i, body: got.__setitem__(i, bytes(body)), connections=2, retries=0) == {}
    assert [got[i] for i in range(4)] == bodies
    assert bytes(direct.get(locs[1])) == bodies[1]
    assert direct.head(locs[2])["size"] == len(bodies[2])
    assert tokens.handed_out >= 10   # a new token for each request: none was sent expired


def test_azure_ad_settings_without_azure_identity_keep_the_sdks_answer(azurite):
    """The account alone means Azure AD; without azure-identity installed the store says what to
    install (the direct path needs its credential too)."""
    pytest.importorskip("azure.storage.blob")
    try:
        import azure.identity  # noqa: F401
        pytest.skip("azure-identity is installed here")
    except ImportError:
        pass
    from bridge.errors import CredentialsMissing
    with pytest.raises(CredentialsMissing, match="azure-identity"):
        get_store(parse("az://ccc/"), settings_for({"AZURE_STORAGE_ACCOUNT": AZURITE_ACCOUNT}))


def test_gcs_over_tls(fake_gcs, tmp_path):
    bucket = unique_name()
    fake_gcs.create_bucket(bucket)
    client = fake_gcs.client()
    data = {f"d/f{i}.bin": os.urandom(4_000 + i) for i in range(5)}
    for name, body in data.items():
        client.bucket(bucket).blob(name).upload_from_string(body)
    settings = settings_for(_env(fake_gcs, tmp_path, **fake_gcs.env()))
    store = get_store(parse(f"gs://{bucket}/"), settings)
    assert isinstance(store._direct, GCSDirect) and store._direct.endpoint.startswith("https://")
    ops.copy(f"gs://{bucket}/d/", f"{tmp_path}/back/", settings)
    for name, body in data.items():
        assert (tmp_path / "back" / name.split("/")[1]).read_bytes() == body
