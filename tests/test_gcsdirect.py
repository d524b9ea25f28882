"""GCS reads without gcsfs (bridge/stores/gcsdirect.py), against fake-gcs-server over real HTTP,
directly and through the fault proxy."""

from __future__ import annotations

import datetime
import gzip
import hashlib
import json
import os
import threading

import pytest
from cryptography.hazmat.primitives import serialization

from bridge import ops
from bridge.errors import BucketNotFound, EndpointUnreachable, NotFound, ObjectNotFound, TransientError
from bridge.stores import get_store
from bridge.stores.gcsdirect import Bearer, Direct
from bridge.urls import parse
from tests.emulators import free_port, unique_name
from tests.faultproxy import FaultProxy, Rule
from tests.helpers import imported_by, settings_for, small_files_go_in_batches_and_verify
from bridge.pipeline import verify as verifying

MiB = 1024 * 1024
NAME = "a dir/ckpt #1 ü?&=+.bin"


@pytest.fixture
def bucket(fake_gcs):
    name = unique_name("gd")
    fake_gcs.create_bucket(name)
    return name


@pytest.fixture
def store(fake_gcs, bucket, tmp_path):
    return get_store(parse(f"gs://{bucket}/"), settings_for({**fake_gcs.env(), "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}))


def put(fake_gcs, bucket: str, key: str, data: bytes, **attrs) -> None:
    blob = fake_gcs.client().bucket(bucket).blob(key)
    for name, value in attrs.items():
        setattr(blob, name, value)
    blob.upload_from_string(data, content_type="application/octet-stream")


def test_ranged_and_whole_reads_come_back_byte_exact(fake_gcs, bucket, store, tmp_path):
    data = os.urandom(20 * MiB + 7)
    put(fake_gcs, bucket, NAME, data)
    assert isinstance(store._direct, Direct)
    loc = parse(f"gs://{bucket}/{NAME}")
    assert bytes(store.read(loc)) == data
    assert bytes(store.read(loc, 5 * MiB, 3)) == data[5 * MiB:5 * MiB + 3]
    assert bytes(store.read(loc, 20 * MiB)) == data[20 * MiB:]
    assert bytes(store.read(loc, 0, 1)) == data[:1]
    assert store.read(loc, 7, 0) == b""
    ops.copy(f"gs://{bucket}/{NAME}", f"{tmp_path}/out/", store.settings, chunk_size=8 * MiB)
    got = (tmp_path / "out" / NAME.rsplit("/", 1)[-1]).read_bytes()
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()


def test_missing_objects_and_buckets_are_bridge_errors(store, bucket):
    with pytest.raises(ObjectNotFound):
        store.read(parse(f"gs://{bucket}/no/such/key"))
    with pytest.raises(ObjectNotFound):
        store.info(parse(f"gs://{bucket}/no/such/key"))
    # fake-gcs-server answers a missing bucket's object with a plain 404 (GCS says which one is
    # missing, and the read is then BucketNotFound): not found, either way.
    with pytest.raises(NotFound):
        store.read(parse("gs://no-such-bucket-here/key"), 0, 10)
    with pytest.raises(BucketNotFound):
        list(store.list(parse("gs://no-such-bucket-here/x/")))
    with pytest.raises(BucketNotFound):
        store.check_bucket(parse("gs://no-such-bucket-here/"))


def test_metadata_and_listings_are_gcsfs_own(fake_gcs, bucket, store, monkeypatch):
    """info(), list() (two objects a page here) and the bucket's location through the direct
    path give what they gave through gcsfs: names, sizes, checksums, metadata, generations."""
    from bridge.hashing import FileHash
    keys = ["list/a b.bin", "list/ü/名前.txt", "list/x+y%z.bin", "list/amp&lt?.bin", "list/tab\tkey", "list/z"]
    for i, key in enumerate(keys):
        data = os.urandom(10 + i)
        store.put(parse(f"gs://{bucket}/{key}"), data, crc32c=FileHash.of(data).crc32c, metadata={"k": str(i)})
    monkeypatch.setattr(store._direct, "page_size", 2)
    prefix = parse(f"gs://{bucket}/list/")
    direct = sorted(store.list(prefix), key=lambda o: o.location.key)
    one = store.info(parse(f"gs://{bucket}/{keys[1]}"))
    region = store.bucket_region(prefix)
    monkeypatch.setattr(store, "_direct", None)
    assert [o.location.key for o in direct] == sorted(keys)
    assert direct == sorted(store.list(prefix), key=lambda o: o.location.key)
    assert one == store.info(parse(f"gs://{bucket}/{keys[1]}"))
    assert one.identity["generation"] and one.metadata == {"k": "1"} and one.checksums["crc32c"]
    assert region == store.bucket_region(prefix)


def test_a_gzip_encoded_object_comes_back_as_stored(fake_gcs, bucket, store, tmp_path):
    """An object stored with Content-Encoding gzip is read as the bytes GCS stores, whose size
    and CRC32C are the listing's: the copy completes and verifies (through gcsfs, aiohttp had
    them decompressed and the copy failed on the size)."""
    stored = gzip.compress(os.urandom(3000) + b"a" * 100_000)
    put(fake_gcs, bucket, "z/logs.json", stored, content_encoding="gzip")
    loc = parse(f"gs://{bucket}/z/logs.json")
    assert store.info(loc).size == len(stored)
    assert bytes(store.read(loc)) == stored
    assert bytes(store.read(loc, 10, 100)) == stored[10:110]
    ops.copy(f"gs://{bucket}/z/", f"{tmp_path}/out/", store.settings)
    assert (tmp_path / "out" / "logs.json").read_bytes() == stored


def test_a_body_cut_short_is_read_again_and_errors_are_retried(fake_gcs, bucket, tmp_path):
    data = os.urandom(3 * MiB)
    put(fake_gcs, bucket, NAME, data)
    loc = parse(f"gs://{bucket}/{NAME}")
    with FaultProxy(fake_gcs.endpoint) as proxy:
        store = get_store(loc, settings_for({**fake_gcs.env(), "STORAGE_EMULATOR_HOST": proxy.endpoint}, retries=2))
        assert isinstance(store._direct, Direct)
        proxy.configure(rules=[Rule(r"^GET /storage/v1/b/[^/]+/o/[^?]+\?alt=media", "cut")])
        assert bytes(store.read(loc)) == data
        assert proxy.counts["cut"] == 1 and proxy.counts["requests"] == 2, proxy.log
        proxy.configure(rules=[Rule(r"alt=media", "cut"), Rule(r"alt=media", "error")])
        assert bytes(store.read(loc, MiB, MiB)) == data[MiB:2 * MiB]
        assert [action for _, action in proxy.log] == ["cut", "error", "forward"]
        proxy.configure(rules=[Rule(r"^GET /storage/v1/b/[^/]+/o\?", "error"),
                               Rule(r"^GET /storage/v1/b/[^/]+/o/[^?]+$", "cut")])
        assert [o.location.key for o in store.list(parse(f"gs://{bucket}/a dir/"))] == [NAME]
        assert store.info(loc).size == len(data)
        assert proxy.counts["error"] == 1 and proxy.counts["cut"] == 1
        # Cut every time: 1 + retries GETs, then the error; the store still works afterwards.
        proxy.configure(rules=[Rule(r"alt=media", "cut", times=10_000)])
        with pytest.raises(TransientError):
            store.read(loc, 0, 100)
        assert proxy.counts["requests"] == 3
        proxy.configure()
        assert bytes(store.read(loc, 0, 100)) == data[:100]


def test_nothing_listening_is_endpoint_unreachable(tmp_path):
    env = {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{free_port()}", "GOOGLE_CLOUD_PROJECT": "test"}
    store = get_store(parse("gs://bucket/"), settings_for(env, retries=0))
    with pytest.raises(EndpointUnreachable):
        store.read(parse("gs://bucket/k"))


def test_a_download_never_imports_gcsfs(fake_gcs, bucket, tmp_path):
    """A job that only reads from GCS runs without gcsfs and aiohttp: their import was most of
    the store's start-up."""
    put(fake_gcs, bucket, "d/one.bin", os.urandom(1000))
    put(fake_gcs, bucket, "d/two.bin", os.urandom(9 * MiB))
    code = ("import os; from bridge import ops; from tests.helpers import settings_for\n"
            f"ops.copy('gs://{bucket}/d/', {str(tmp_path / 'out')!r} + '/', settings_for(dict(os.environ)), chunk_size=4 * 2**20)")
    env = {**os.environ, **fake_gcs.env(), "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}
    assert imported_by(code, ("gcsfs", "aiohttp", "fsspec.asyn"), env) == []
    assert sorted(os.listdir(tmp_path / "out")) == ["_bridge", "one.bin", "two.bin"]


class HeaderProxy(FaultProxy):
    """The fault proxy, keeping the Authorization header of each request."""

    def __init__(self, upstream: str):
        super().__init__(upstream)
        self.authorizations: list[str | None] = []

    async def _handle(self, request):
        self.authorizations.append(request.headers.get("Authorization"))
        return await super()._handle(request)


def test_a_bearer_token_is_sent_and_refreshed_once_when_expired(fake_gcs, bucket):
    """Real google.auth credentials (user credentials with a refresh handler, so that no token
    service is needed): an expired token is refreshed by one thread while the others wait,
    and each request carries the token that is valid."""
    from google.oauth2.credentials import Credentials

    refreshes = []
    lock = threading.Lock()

    def refresh_handler(request, scopes):
        with lock:
            refreshes.append(1)
            n = len(refreshes)
        return f"token-{n}", datetime.datetime.utcnow() + datetime.timedelta(hours=1)

    creds = Credentials(token="stale", expiry=datetime.datetime.utcnow() - datetime.timedelta(minutes=1),
                        refresh_handler=refresh_handler)
    assert not creds.valid
    data = os.urandom(1000)
    put(fake_gcs, bucket, "auth/x.bin", data)
    loc = parse(f"gs://{bucket}/auth/x.bin")
    with HeaderProxy(fake_gcs.endpoint) as proxy:
        direct = Direct(proxy.endpoint, Bearer(creds), timeout=30)
        results = []
        threads = [threading.Thread(target=lambda: results.append(bytes(direct.get(loc)))) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [data] * 8
        assert len(refreshes) == 1
        assert proxy.authorizations == ["Bearer token-1"] * 8
        creds.expiry = datetime.datetime.utcnow() - datetime.timedelta(seconds=1)
        assert direct.object(loc)["size"] == "1000"
        assert proxy.authorizations[-1] == "Bearer token-2" and len(refreshes) == 2


def test_which_credentials_go_direct(tmp_path, monkeypatch):
    from google.oauth2.credentials import Credentials
    assert Direct.for_store("http://127.0.0.1:1", "anon", 5).endpoint == "http://127.0.0.1:1"
    user = Credentials(token="t", refresh_handler=lambda request, scopes: ("t", None))
    assert Direct.for_store(None, user, 5).endpoint == "https://storage.googleapis.com"
    elsewhere = Credentials(token="t", universe_domain="example.goog")
    assert Direct.for_store(None, elsewhere, 5) is None
    monkeypatch.setenv("GOOGLE_CLOUD_UNIVERSE_DOMAIN", "example.goog")
    assert Direct.for_store(None, user, 5) is None
    monkeypatch.delenv("GOOGLE_CLOUD_UNIVERSE_DOMAIN")
    not_json = tmp_path / "key.txt"
    not_json.write_text("not a key")
    assert Direct.for_store(None, str(not_json), 5) is None
    # A service account's key and a user's credentials file, as GOOGLE_APPLICATION_CREDENTIALS:
    # bearer tokens on Google's endpoint (nothing is sent until a read).
    from cryptography.hazmat.primitives.asymmetric import rsa
    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    key = tmp_path / "sa.json"
    key.write_text(json.dumps({"type": "service_account", "project_id": "p", "private_key_id": "k1",
                               "private_key": pem, "client_email": "bridge@p.iam.gserviceaccount.com",
                               "client_id": "1", "token_uri": "https://oauth2.googleapis.com/token"}))
    user_file = tmp_path / "user.json"
    user_file.write_text(json.dumps({"type": "authorized_user", "client_id": "c", "client_secret": "s",
                                     "refresh_token": "r"}))
    for path in (key, user_file):
        store = get_store(parse("gs://bucket/"), settings_for({"GOOGLE_APPLICATION_CREDENTIALS": str(path),
                                                              "GOOGLE_CLOUD_PROJECT": "p"}))
        assert store._direct.endpoint == "https://storage.googleapis.com"
        assert store._direct._bearer.credentials.requires_scopes is False


def test_gcs_answers_are_translated_as_gcsfs_ones_were(fake_gcs, bucket):
    """Answers fake-gcs-server does not give, as GCS gives them, through the proxy's replies:
    GCS names a missing bucket; 401/403 are refused at once; 429 and 5xx are retried; any other
    status is an error that is not."""
    from bridge.errors import BridgeError, PermissionDenied

    def reply(status: int, message: str) -> Rule:
        body = json.dumps({"error": {"code": status, "message": message}}).encode()
        return Rule(r"alt=media", "reply", reply=(status, {"Content-Type": "application/json"}, body))

    data = os.urandom(1000)
    put(fake_gcs, bucket, "t/x.bin", data)
    loc = parse(f"gs://{bucket}/t/x.bin")
    with FaultProxy(fake_gcs.endpoint) as proxy:
        store = get_store(loc, settings_for({**fake_gcs.env(), "STORAGE_EMULATOR_HOST": proxy.endpoint}, retries=3))
        cases = [(reply(404, "The specified bucket does not exist."), BucketNotFound),
                 (reply(404, f"No such object: {bucket}/t/x.bin"), ObjectNotFound),
                 (reply(403, "caller does not have storage.objects.get access"), PermissionDenied),
                 (reply(401, "Invalid Credentials"), PermissionDenied),
                 (reply(400, "Invalid argument"), BridgeError)]
        for rule, error in cases:
            proxy.configure(rules=[rule])
            with pytest.raises(error) as raised:
                store.read(loc)
            assert not isinstance(raised.value, TransientError)
            assert proxy.counts["requests"] == 1, (rule, proxy.log)
        for status in (429, 500, 503):
            proxy.configure(rules=[reply(status, "slow down")])
            assert bytes(store.read(loc)) == data
            assert [action for _, action in proxy.log] == ["reply", "forward"]


def test_batches_of_small_objects_are_read_whole_and_retried_per_object(fake_gcs, bucket, tmp_path):
    """read_many (the engine's batches of small files): every object byte-exact, a gzip-encoded
    one as stored, a cut or refused answer sent again, a missing object that object's failure
    alone; and a copy of small files to a local folder runs through it."""
    files = {f"s/{i:03d} ü.bin": os.urandom(100 + i) for i in range(40)}
    files["s/z.gz"] = gzip.compress(b"z" * 50_000)
    for key, data in files.items():
        put(fake_gcs, bucket, key, data, **({"content_encoding": "gzip"} if key.endswith(".gz") else {}))
    keys = sorted(files) + ["s/missing"]
    with FaultProxy(fake_gcs.endpoint) as proxy:
        store = get_store(parse(f"gs://{bucket}/"), settings_for(
            {**fake_gcs.env(), "STORAGE_EMULATOR_HOST": proxy.endpoint, "MCBRIDGE_STATE_DIR": str(tmp_path / "state")},
            retries=2))
        assert store.reads_many
        proxy.configure(rules=[Rule(r"005%20", "cut"), Rule(r"017%20", "error"), Rule(r"z\.gz", "cut")])
        got: dict[int, bytes] = {}
        failures = store.read_many([parse(f"gs://{bucket}/{k}") for k in keys], lambda i, data: got.__setitem__(i, bytes(data)))
        assert list(failures) == [len(keys) - 1] and isinstance(failures[len(keys) - 1], ObjectNotFound)
        assert {keys[i]: data for i, data in got.items()} == files
        assert proxy.counts["cut"] == 2 and proxy.counts["error"] == 1
        proxy.configure()
        ops.copy(f"gs://{bucket}/s/", f"{tmp_path}/out/", store.settings)
        assert proxy.counts["requests"] >= len(files)
    assert {f"s/{p.name}": p.read_bytes() for p in (tmp_path / "out").iterdir() if p.is_file()} == files


def test_many_puts_from_one_thread_carry_their_crc32c_and_fail_per_object(fake_gcs, bucket, store, tmp_path):
    """Store.put_many on the direct path: each object arrives byte-exact with its metadata and the
    CRC32C it was sent with; a body that cannot be had is that object's failure, a missing bucket
    each object's, not the batch's; through the fault proxy, an answer cut or refused is sent
    again; what each answer says comes back as put's ObjectInfo."""
    from bridge.errors import IntegrityError
    from bridge.hashing import crc32c, crc_hex
    assert store.writes_many
    names = [f"puts/{i:02d} {NAME}" for i in range(25)]
    blobs = [os.urandom(i * 1013 % 40_000) for i in range(len(names))]
    infos = {}

    def body(i):
        if i == 7:
            raise IntegrityError("the source changed")
        return parse(f"gs://{bucket}/{names[i]}"), blobs[i], crc_hex(crc32c(blobs[i])), {"n": str(i)}

    with FaultProxy(fake_gcs.endpoint) as proxy:
        proxied = get_store(parse(f"gs://{bucket}/"), settings_for(
            {**fake_gcs.env(), "STORAGE_EMULATOR_HOST": proxy.endpoint, "MCBRIDGE_STATE_DIR": str(tmp_path / "state")},
            retries=2, concurrency=3))
        proxy.configure(rules=[Rule(r"^POST ", "cut", times=2), Rule(r"^POST ", "error", times=1)])
        failures = proxied.put_many(len(names), body, infos.__setitem__)
        assert proxy.counts["cut"] == 2 and proxy.counts["error"] == 1
    assert sorted(failures) == [7] and isinstance(failures[7], IntegrityError)
    assert sorted(infos) == [i for i in range(len(names)) if i != 7]
    client = fake_gcs.client().bucket(bucket)
    for i, info in infos.items():
        blob = client.get_blob(names[i])
        assert blob.download_as_bytes() == blobs[i] and blob.metadata == {"n": str(i)}
        assert info.size == len(blobs[i]) and info.checksums["crc32c"] == crc_hex(crc32c(blobs[i]))
        assert info.identity["generation"] == str(blob.generation) and info.location.key == names[i]

    missing = store.put_many(2, lambda i: (parse(f"gs://no-such-bucket-{i}x/k"), b"x", crc_hex(crc32c(b"x")), {}),
                             infos.__setitem__)
    assert sorted(missing) == [0, 1] and all(isinstance(e, BucketNotFound) for e in missing.values())


def test_small_files_from_local_to_gcs_go_in_batches_and_verify(fake_gcs, bucket, tmp_path, monkeypatch):
    small_files_go_in_batches_and_verify(fake_gcs.env(), f"gs://{bucket}/up/", tmp_path, monkeypatch)


def test_a_large_part_is_sent_without_a_second_copy_of_its_bytes(fake_gcs, bucket, store):
    """A part's multipart body goes as its head, the part's own bytes and its tail: joined, each
    of the eight parts in flight held a second copy of itself (8 MiB) while it was sent. The
    object arrives byte-exact and GCS accepts the CRC32C sent with it."""
    import tracemalloc

    from bridge.hashing import crc32c, crc_hex
    from bridge.stores.base import crc_hex_to_b64
    data = os.urandom(6 * MiB + 5)
    crc = crc_hex_to_b64(crc_hex(crc32c(data)))
    loc = parse(f"gs://{bucket}/parts/{NAME}")
    store._direct.put(loc, data, crc, {})   # a first request: the connection made
    tracemalloc.start()
    try:
        item = store._direct.put(loc, data, crc, {"metadata": {"n": "2"}})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MiB, f"{peak} bytes allocated while a {len(data)}-byte part was sent"
    assert int(item["size"]) == len(data)
    blob = fake_gcs.client().bucket(bucket).get_blob(loc.key)
    assert blob.download_as_bytes() == data and blob.metadata == {"n": "2"}


def test_an_upload_never_imports_gcsfs(fake_gcs, bucket, tmp_path):
    """A job that writes to GCS (a small file, a file of three parts composed into one, the
    manifest) runs without gcsfs and aiohttp; the parts' temporary objects are gone after the
    compose and the copy verifies."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "small.txt").write_bytes(b"small")
    (src / "ckpt.bin").write_bytes(os.urandom(11 * MiB + 3))
    code = ("import os; from bridge import ops; from tests.helpers import settings_for\n"
            f"ops.copy({str(src)!r} + '/', 'gs://{bucket}/up/', settings_for(dict(os.environ)), chunk_size=5 * 2**20)")
    env = {**os.environ, **fake_gcs.env(), "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}
    assert imported_by(code, ("gcsfs", "aiohttp", "fsspec.asyn"), env) == []
    names = sorted(blob.name for blob in fake_gcs.client().bucket(bucket).list_blobs())
    assert [n for n in names if not n.startswith("up/_bridge/")] == ["up/ckpt.bin", "up/small.txt"], names
    assert not any(n.startswith("_bridge/uploads/") for n in names), names
    blob = fake_gcs.client().bucket(bucket).get_blob("up/ckpt.bin")
    assert blob.download_as_bytes() == (src / "ckpt.bin").read_bytes()
    settings = settings_for({**fake_gcs.env(), "MCBRIDGE_STATE_DIR": str(tmp_path / "state")})
    assert verifying.verify(f"gs://{bucket}/up/", settings, deep=True)["ok"]
