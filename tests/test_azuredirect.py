"""Azure without the SDK's pipeline (bridge/stores/azuredirect.py), against Azurite over real
HTTP: Get Blob whole and ranged, Get Blob Properties, List Blobs, Put Blob in batches, the errors,
a body cut short, and the Shared Key signature against the SDK's own policy."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

from bridge import ops
from bridge.errors import BridgeError, BucketNotFound, EndpointUnreachable, ObjectNotFound, PermissionDenied
from bridge.stores import get_store
from bridge.stores.azuredirect import Direct, SharedKey
from bridge.urls import parse
from tests.emulators import AZURITE_ACCOUNT, AZURITE_KEY
from tests.faultproxy import FaultProxy, Rule, proxied_environment
from tests.helpers import settings_for, small_files_go_in_batches_and_verify

MiB = 1024 * 1024
KEYS = ["a dir/ckpt #1.bin", "ü/名前 x+y%z.bin", "amp&lt<.bin", "tilde~/plain"]


def _store(env, **transfer):
    store = get_store(parse("az://ccc/"), settings_for(env, **transfer))
    assert isinstance(store._direct, Direct)
    return store


def _put(azurite, container, key, data, metadata=None):
    azurite.client().get_blob_client(container, key).upload_blob(data, overwrite=True, metadata=metadata)


def test_ranged_and_whole_reads_come_back_byte_exact(azurite, make_root, tmp_path):
    container = parse(make_root("az")).bucket
    data = os.urandom(20 * MiB + 7)
    _put(azurite, container, KEYS[0], data)
    store = _store({**azurite.env(), "MCBRIDGE_STATE_DIR": str(tmp_path / "state")})
    loc = parse(f"az://{container}/{KEYS[0]}")
    assert bytes(store.read(loc)) == data
    assert bytes(store.read(loc, 5 * MiB, 3)) == data[5 * MiB:5 * MiB + 3]
    assert bytes(store.read(loc, 20 * MiB)) == data[20 * MiB:]
    assert bytes(store.read(loc, 0, 1)) == data[:1]
    for key in KEYS[1:]:
        small = os.urandom(1000)
        _put(azurite, container, key, small)
        assert bytes(store.read(parse(f"az://{container}/{key}"))) == small
    _put(azurite, container, "empty", b"")
    assert store.read(parse(f"az://{container}/empty")) == b""
    ops.copy(f"az://{container}/{KEYS[0]}", f"{tmp_path}/out/", settings_for({**azurite.env(),
             "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}), chunk_size=4 * MiB)
    assert hashlib.sha256((tmp_path / "out" / "ckpt #1.bin").read_bytes()).digest() == hashlib.sha256(data).digest()


def test_missing_blobs_and_containers_are_bridge_errors(azurite, make_root):
    container = parse(make_root("az")).bucket
    store = _store(azurite.env())
    for call in (lambda loc: store.read(loc), lambda loc: store.read(loc, 0, 10), store.info):
        with pytest.raises(ObjectNotFound) as caught:
            call(parse(f"az://{container}/no/such/blob"))
        assert not isinstance(caught.value, BucketNotFound)
        with pytest.raises(BucketNotFound):
            call(parse("az://no-such-container-here/blob"))
    with pytest.raises(BucketNotFound):
        list(store.list(parse("az://no-such-container-here/x/")))


def test_a_wrong_key_is_permission_denied_and_a_closed_port_unreachable(azurite, make_root):
    container = parse(make_root("az")).bucket
    _put(azurite, container, "k", b"data")
    wrong = base64.b64encode(b"not the account key").decode()
    env = {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string.replace(AZURITE_KEY, wrong)}
    store = _store(env, retries=0)
    loc = parse(f"az://{container}/k")
    for call in (store.read, store.info, lambda loc: list(store.list(loc.as_prefix()))):
        with pytest.raises(PermissionDenied):
            call(loc)
    closed = FaultProxy(azurite.endpoint)   # a free port that nothing listens on
    env = {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string.replace(azurite.endpoint, closed.endpoint)}
    with pytest.raises(EndpointUnreachable):
        _store(env, retries=0).read(loc)


def test_an_endpoint_that_is_not_plain_keeps_the_sdk_path(azurite):
    """(A SAS and Azure AD take the direct path: tests/test_credentials_azure.py.)"""
    sas = (f"BlobEndpoint={azurite.endpoint}/{AZURITE_ACCOUNT};"
           f"SharedAccessSignature=sv=2024-08-04&ss=b&srt=sco&sp=rl&se=2099-01-01&sig=abc")
    assert get_store(parse("az://ccc/"), settings_for({"AZURE_STORAGE_CONNECTION_STRING": sas}))._direct.credentials == "sas"
    other_path = azurite.connection_string.replace(f"{azurite.endpoint}/{AZURITE_ACCOUNT}",
                                                   f"{azurite.endpoint}/gateway/{AZURITE_ACCOUNT}")
    assert get_store(parse("az://ccc/"), settings_for({"AZURE_STORAGE_CONNECTION_STRING": other_path}))._direct is None
    by_settings = {"AZURE_STORAGE_ACCOUNT": "acct", "AZURE_STORAGE_KEY": AZURITE_KEY}
    direct = get_store(parse("az://ccc/"), settings_for(by_settings))._direct
    assert isinstance(direct, Direct) and direct.endpoint == "https://acct.blob.core.windows.net"


def test_head_and_listing_are_the_sdks(azurite, make_root, monkeypatch):
    """info() and list() through the direct path give what the SDK gives (size, MD5, metadata,
    identity), listed here two blobs a page."""
    root = make_root("az")
    container = parse(root).bucket
    for i, key in enumerate(KEYS):
        _put(azurite, container, f"list/{key}", os.urandom(10 + i), metadata={"bridge_crc32c": f"{i:08x}", "Mixed": "v"})
    _put(azurite, container, "other", b"x")
    store = _store(azurite.env())
    monkeypatch.setattr(store._direct, "page_size", 2)
    prefix = parse(f"{root}list/")
    direct_list = list(store.list(prefix))
    direct_info = [store.info(o.location) for o in direct_list]
    monkeypatch.setattr(store, "_direct", None)
    assert direct_list == list(store.list(prefix))
    assert sorted(o.location.key for o in direct_list) == sorted(f"list/{k}" for k in KEYS)
    assert direct_info == [store.info(o.location) for o in direct_list]
    assert all(o.checksums.get("md5") and o.identity.get("etag") and o.metadata["Mixed"] == "v" for o in direct_info)


def test_a_body_cut_short_is_read_again_and_one_request_each_attempt(azurite, make_root):
    container = parse(make_root("az")).bucket
    data = os.urandom(3 * MiB)
    _put(azurite, container, "cut/me.bin", data)
    loc = parse(f"az://{container}/cut/me.bin")
    with FaultProxy(azurite.endpoint) as proxy:
        store = _store(proxied_environment({}, {"az": proxy}), retries=2)
        assert bytes(store.read(loc, 0, 10)) == data[:10]   # the connection is kept alive from here
        proxy.configure(rules=[Rule(r"^GET /[^?]*cut/me\.bin", "cut", times=1)])
        assert bytes(store.read(loc, MiB, MiB)) == data[MiB:2 * MiB]
        assert bytes(store.read(loc)) == data
        gets = [line for line, _ in proxy.log if line.startswith("GET")]
        assert len(gets) == 3 and proxy.counts["cut"] == 1, proxy.log


def test_the_signature_is_the_sdks():
    """The Shared Key signature against azure-storage-blob's SharedKeyCredentialPolicy on the
    same requests and headers (x-ms-date included)."""
    from azure.core.pipeline import PipelineContext, PipelineRequest
    from azure.core.rest import HttpRequest
    from azure.storage.blob._shared.authentication import SharedKeyCredentialPolicy

    now = 1764554400.0
    base = f"/{AZURITE_ACCOUNT}/c"
    cases = [("GET", f"{base}/a%20dir/%C3%BC%20x%2B1.bin", {}, {"x-ms-range": "bytes=5-9"}),
             ("GET", f"{base}/plain", {}, {}),
             ("HEAD", f"{base}/plain", {}, {}),
             ("GET", base, {"restype": "container", "comp": "list", "include": "metadata",
                            "prefix": "d ü/&=+", "marker": "2!8!MDAw"}, {}),
             ("PUT", f"{base}/k", {}, {"Content-Length": "10", "Content-MD5": "abc=", "x-ms-blob-type": "BlockBlob",
                                        "x-ms-meta-bridge_crc32c": "00", "x-ms-meta-a-b": "1", "x-ms-meta-ab0": "2"}),
             ("PUT", f"{base}/k", {"comp": "block", "blockid": "YQ=="}, {"Content-Length": "0"})]
    for method, path, query, headers in cases:
        ours = {"x-ms-version": "2026-10-06", **headers}
        SharedKey(AZURITE_ACCOUNT, AZURITE_KEY).sign(method, path, query, ours, now)
        url = f"http://127.0.0.1:10000{path}" + ("?" + "&".join(f"{k}={quote(v, safe='')}" for k, v in query.items())
                                               if query else "")
        theirs = HttpRequest(method, url, headers={k: v for k, v in ours.items() if k != "Authorization"})
        SharedKeyCredentialPolicy(AZURITE_ACCOUNT, AZURITE_KEY).on_request(
            PipelineRequest(theirs, PipelineContext(None)))
        assert ours["Authorization"] == theirs.headers["Authorization"], (method, path, query)


CONNECTION_STRINGS = [
    f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
    f"BlobEndpoint=http://127.0.0.1:10000/{AZURITE_ACCOUNT};",
    f"AccountName=acct;AccountKey={AZURITE_KEY}",
    f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={AZURITE_KEY};EndpointSuffix=core.chinacloudapi.cn",
    f"DefaultEndpointsProtocol=http;AccountName=acct;AccountKey={AZURITE_KEY}",     # the SDK keeps https
    f"accountname=acct;accountkey={AZURITE_KEY};blobendpoint=https://acct.blob.core.windows.net/",
    f"AccountName=acct;AccountKey={AZURITE_KEY};SharedAccessSignature=sv=1&sig=x",   # the key signs
    "BlobEndpoint=https://acct.blob.core.windows.net;SharedAccessSignature=sv=1&sig=x",
    f"BlobEndpoint=http://127.0.0.1:10000/{AZURITE_ACCOUNT};AccountName={AZURITE_ACCOUNT}",
]


@pytest.mark.parametrize("text", CONNECTION_STRINGS)
def test_connection_strings_are_read_as_the_sdk_reads_them(text):
    """Where the direct path finds a shared key, the SDK's client has the same endpoint, account
    and key; where it finds none, the SDK signs with no shared key either."""
    from azure.storage.blob import BlobServiceClient

    from bridge.config import AzureSettings
    from bridge.stores.azuredirect import API_VERSION, shared_key

    client = BlobServiceClient.from_connection_string(text)
    found = shared_key(AzureSettings(connection_string=text))
    cred = client.credential
    if found is None:
        assert getattr(cred, "account_key", None) is None
    else:
        assert found == (client.url.rstrip("/"), cred.account_name, cred.account_key)
    assert API_VERSION == client.api_version


def test_a_download_never_imports_the_sdk(azurite, make_root, tmp_path):
    """A job the direct path serves whole (check the container, list, HEAD, GET) runs without
    azure-core or azure-storage-blob loaded (only found: their namespace packages are)."""
    container = parse(make_root("az")).bucket
    for i in range(3):
        _put(azurite, container, f"d/{i}.bin", os.urandom(1000 + i))
    code = ("import sys; from bridge import ops; from tests.helpers import settings_for; import json, os\n"
            "settings = settings_for(json.loads(os.environ['ENV']))\n"
            f"ops.copy('az://{container}/d/', sys.argv[1], settings)\n"
            f"ops.copy('az://{container}/d/1.bin', sys.argv[1] + 'one/', settings)\n"
            "print(sorted(m for m in sys.modules if m.startswith(('azure.core', 'azure.storage.'))))\n")
    run = subprocess.run([sys.executable, "-c", code, f"{tmp_path}/out/"], capture_output=True, text=True,
                         env={**os.environ, "ENV": json.dumps({**azurite.env(), "MCBRIDGE_STATE_DIR": str(tmp_path / "s")})},
                         cwd=Path(__file__).parent.parent, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"
    assert sorted(p.name for p in (tmp_path / "out").glob("*.bin")) == ["0.bin", "1.bin", "2.bin"]
    assert (tmp_path / "out" / "one" / "1.bin").stat().st_size == 1001


def test_many_small_blobs_from_one_thread(azurite, make_root):
    """read_many: each blob whole, a missing one a failure of its own, a missing container too;
    through a proxy (which cannot forward every name as it was signed: plain names there), a body
    cut short read again, one request per attempt."""
    container = parse(make_root("az")).bucket
    blobs = {f"many/{k}": os.urandom(5000 + i) for i, k in enumerate(KEYS + ["b", "c", "d"])}
    for key, data in blobs.items():
        _put(azurite, container, key, data)
    locs = [parse(f"az://{container}/{key}") for key in blobs]
    missing = [parse(f"az://{container}/many/none"), parse("az://no-such-container-here/x")]
    store = _store(azurite.env(), concurrency=3)
    assert store.reads_many
    got: dict[int, bytes] = {}
    failures = store.read_many(locs + missing, lambda i, data: got.__setitem__(i, bytes(data)))
    assert got == dict(enumerate(blobs.values())), failures
    assert sorted(failures) == [len(blobs), len(blobs) + 1]
    assert type(failures[len(blobs)]) is ObjectNotFound and type(failures[len(blobs) + 1]) is BucketNotFound

    plain = [loc for loc in locs if loc.key in ("many/b", "many/c", "many/d")]
    with FaultProxy(azurite.endpoint) as proxy:
        store = _store(proxied_environment({}, {"az": proxy}), retries=2, concurrency=3)
        proxy.configure(rules=[Rule(r"^GET /[^?]*many/b$", "cut", times=1)])
        got = {}
        assert store.read_many(plain, lambda i, data: got.__setitem__(i, bytes(data))) == {}
        assert [line for line, _ in proxy.log].count(f"GET /{AZURITE_ACCOUNT}/{container}/many/b") == 2
    assert got == {i: blobs[loc.key] for i, loc in enumerate(plain)}


def test_many_puts_from_one_thread_carry_their_md5_and_fail_per_blob(azurite, make_root, monkeypatch):
    """Store.put_many on the direct path: each blob arrives byte-exact with its metadata and the
    Content-MD5 it was sent with, which Azurite checks (a wrong one is that blob's IntegrityError,
    not the batch's); a body that cannot be had is that blob's failure; what each answer says
    comes back as put's ObjectInfo, and names like the SDK's sign and land as given."""
    from bridge.errors import IntegrityError
    from bridge.stores import azuredirect
    container = parse(make_root("az")).bucket
    store = _store(azurite.env(), concurrency=3)
    assert store.writes_many
    names = [f"puts/{k}" for k in KEYS] + [f"puts/{i:02d}" for i in range(20)]
    blobs = [os.urandom(i * 1013 % 40_000) for i in range(len(names))]
    infos = {}

    def body(i):
        if i == 7:
            raise IntegrityError("the source changed")
        return parse(f"az://{container}/{names[i]}"), blobs[i], "", {"bridge_n": str(i)}

    failures = store.put_many(len(names), body, infos.__setitem__)
    assert sorted(failures) == [7] and isinstance(failures[7], IntegrityError)
    assert sorted(infos) == [i for i in range(len(names)) if i != 7]
    client = azurite.client().get_container_client(container)
    for i, info in infos.items():
        blob = client.get_blob_client(names[i])
        assert blob.download_blob().readall() == blobs[i]
        props = blob.get_blob_properties()
        assert props.metadata == {"bridge_n": str(i)}
        assert bytes(props.content_settings.content_md5) == hashlib.md5(blobs[i]).digest()
        assert info.size == len(blobs[i]) and info.checksums["md5"] == hashlib.md5(blobs[i]).hexdigest()
        assert info.identity["etag"] == props.etag.strip('"')

    real_md5 = hashlib.md5

    class _Wrong:
        def __init__(self, data):
            self._digest = real_md5(bytes(data) + b"!").digest()

        def digest(self):
            return self._digest

    monkeypatch.setattr(azuredirect.hashlib, "md5", _Wrong)
    failures = store.put_many(1, lambda i: (parse(f"az://{container}/puts/wrong"), b"data", "", {}),
                              infos.__setitem__)
    # Azure answers Md5Mismatch (bridge: IntegrityError); Azurite InvalidOperation, "Provided
    # contentMD5 doesn't match": either way that blob's failure, and nothing stored.
    assert isinstance(failures.get(0), BridgeError) and "InvalidOperation" in str(failures[0]), failures
    assert not client.get_blob_client("puts/wrong").exists()


def test_small_files_from_local_to_azure_go_in_batches_and_verify(azurite, make_root, tmp_path, monkeypatch):
    small_files_go_in_batches_and_verify(azurite.env(), f"{make_root('az')}up/", tmp_path, monkeypatch)
