"""S3 reads without the event loop (bridge/stores/s3direct.py), against both S3 emulators:
moto answers a range with 206, ``rclone serve s3`` with 200 and a Content-Range."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from urllib.parse import unquote_plus

import pytest

from bridge import ops
from bridge.errors import BridgeError, BucketNotFound, ObjectNotFound
from bridge.stores import get_store
from bridge.stores.base import crc_hex_to_b64
from bridge.stores.s3direct import Direct
from bridge.urls import parse
from tests.emulators import RcloneS3
from tests.faultproxy import FaultProxy
from tests.helpers import imported_by, settings_for, small_files_go_in_batches_and_verify
from bridge.pipeline import execute as executor
from bridge.pipeline import plan as planning
from bridge.pipeline import verify as verifying

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def rclone_s3():
    with RcloneS3() as server:
        server.create_bucket("direct")
        yield server


@pytest.fixture(params=["moto", "rclone"])
def s3(request, moto, rclone_s3):
    server = moto if request.param == "moto" else rclone_s3
    if request.param == "moto":
        server.create_bucket("direct")
    return server


def test_ranged_and_whole_reads_come_back_byte_exact(s3, tmp_path):
    data = os.urandom(20 * MiB + 7)
    s3.client().put_object(Bucket="direct", Key="a dir/ckpt #1.bin", Body=data)
    settings = settings_for({**s3.env(), "MCBRIDGE_STATE_DIR": str(tmp_path / "state")})
    store = get_store(parse("s3://direct/"), settings)
    assert isinstance(store._direct, Direct)
    loc = parse("s3://direct/a dir/ckpt #1.bin")
    assert bytes(store.read(loc)) == data
    assert bytes(store.read(loc, 5 * MiB, 3)) == data[5 * MiB:5 * MiB + 3]
    assert bytes(store.read(loc, 20 * MiB)) == data[20 * MiB:]
    ops.copy("s3://direct/a dir/ckpt #1.bin", f"{tmp_path}/out/", settings, chunk_size=8 * MiB)
    assert hashlib.sha256((tmp_path / "out" / "ckpt #1.bin").read_bytes()).digest() == hashlib.sha256(data).digest()


def test_missing_objects_and_buckets_are_bridge_errors(s3, tmp_path):
    store = get_store(parse("s3://direct/"), settings_for(s3.env()))
    with pytest.raises(ObjectNotFound):
        store.read(parse("s3://direct/no/such/key"))
    with pytest.raises(BucketNotFound):
        store.read(parse("s3://no-such-bucket-here/key"), 0, 10)


def test_the_default_endpoint_is_direct_but_fips_and_dual_stack_and_given_keys_win_over_a_profile(moto, monkeypatch):
    """(Credentials from profiles, web identity and refreshes: tests/test_credentials.py; AWS's
    own endpoint at work: tests/test_s3_aws_endpoint.py.)"""
    direct = Direct.for_settings(settings_for({**moto.env(), "AWS_PROFILE": "other"}))
    assert direct.credentials == "static"   # as on aiobotocore, which s3fs hands the keys
    env = {k: v for k, v in moto.env().items() if k != "AWS_ENDPOINT_URL"}
    aws = Direct.for_settings(settings_for(env))
    assert aws is not None and aws.aws and aws.endpoint == "https://s3.us-east-1.amazonaws.com"
    for name in ("AWS_USE_FIPS_ENDPOINT", "AWS_USE_DUALSTACK_ENDPOINT"):   # forms of AWS's hosts it does not make
        monkeypatch.setenv(name, "true")
        assert Direct.for_settings(settings_for(env)) is None
        monkeypatch.delenv(name)


def test_puts_carry_the_checksum_and_metadata(s3):
    store = get_store(parse("s3://direct/"), settings_for(s3.env()))
    from bridge.hashing import FileHash
    data = os.urandom(100_000)
    h = FileHash.of(data)
    store.put(parse("s3://direct/small/ü x.bin"), data, crc32c=h.crc32c,
              metadata={"bridge_crc32c": h.crc32c, "bridge_sha256": h.sha256})
    got = s3.client().get_object(Bucket="direct", Key="small/ü x.bin")
    assert got["Body"].read() == data
    # (rclone serve s3 gives metadata names back capitalised, whoever wrote them)
    assert {k.lower(): v for k, v in got["Metadata"].items()} == {"bridge_crc32c": h.crc32c,
                                                                  "bridge_sha256": h.sha256}
    with pytest.raises(BucketNotFound):
        store.put(parse("s3://no-such-bucket-here/k"), b"x", crc32c="00000000", metadata={})


def test_the_signature_is_botocores(monkeypatch):
    """The direct path's SigV4 signer against botocore's on the same requests at the same
    instant, over plain HTTP (the payload signed), with and without a session token."""
    import datetime

    import botocore.auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    from bridge.stores.s3direct import SigV4

    now = 1764554400.0
    monkeypatch.setattr(botocore.auth, "get_current_datetime",
                        lambda: datetime.datetime.fromtimestamp(now, datetime.timezone.utc).replace(tzinfo=None))
    path = "/b/a%20dir/%C3%BC%20x%2B1.bin"
    cases = [("GET", path, "", None, {"Range": "bytes=5-9"}),
             ("PUT", path, "", os.urandom(1000), {"Content-Length": "1000", "x-amz-checksum-crc32c": "AAAAAA==",
                                                   "x-amz-sdk-checksum-algorithm": "CRC32C", "x-amz-meta-k": "v"}),
             ("GET", "/b", "continuation-token=a%2Fb&list-type=2&prefix=d%20%C3%BC%2F", None, {}),
             ("HEAD", "/b", "", None, {})]
    for token in (None, "session-token"):
        for method, p, query, body, headers in cases:
            ours = dict(headers)
            SigV4(lambda: ("AKID", "secret", token), "eu-west-1", https=False).sign(
                method, "127.0.0.1:9000", p, query, ours, body, now)
            url = f"http://127.0.0.1:9000{p}" + (f"?{query}" if query else "")
            theirs = AWSRequest(method, url, headers=dict(headers), data=body)
            botocore.auth.S3SigV4Auth(Credentials("AKID", "secret", token), "s3", "eu-west-1").add_auth(theirs)
            assert ours["Authorization"] == theirs.headers["Authorization"], (method, p, query, token)
            if body is not None:
                # a part's SHA-256 the engine already took is signed as given: the same signature,
                # and the body is not read for it (an object with no bytes would fail to hash)
                given = dict(headers)
                SigV4(lambda: ("AKID", "secret", token), "eu-west-1", https=False).sign(
                    method, "127.0.0.1:9000", p, query, given, object(), now,
                    payload_sha256=hashlib.sha256(body).hexdigest())
                assert given["Authorization"] == theirs.headers["Authorization"]
                assert given["x-amz-content-sha256"] == hashlib.sha256(body).hexdigest()


def test_listing_is_the_sdks(s3, monkeypatch):
    """Listed page by page (two objects a page here) with keys XML cannot carry as they are, and
    (moto) archived objects: the same objects, sizes, identities, times and classes as through
    the SDK."""
    keys = ["list/a b.bin", "list/ü/名前.txt", "list/x+y%z.bin", "list/amp&lt.bin", "list/tab\tkey", "list/z",
            "list/cold", "list/colder"]
    classes = {"list/cold": "GLACIER", "list/colder": "STANDARD_IA"} if s3.name == "moto" else {}
    client = s3.client()
    for i, key in enumerate(keys):
        client.put_object(Bucket="direct", Key=key, Body=os.urandom(10 + i),
                          **({"StorageClass": classes[key]} if key in classes else {}))
    store = get_store(parse("s3://direct/"), settings_for(s3.env()))
    monkeypatch.setattr(store._direct, "page_size", 2)
    direct = sorted(store.list(parse("s3://direct/list/")), key=lambda o: o.location.key)
    monkeypatch.setattr(store, "_direct", None)
    sdk = sorted(store.list(parse("s3://direct/list/")), key=lambda o: o.location.key)
    assert [o.location.key for o in direct] == sorted(keys)
    assert direct == sdk
    assert {o.location.key: o.storage_class for o in direct if o.needs_restore} == \
        ({"list/cold": "GLACIER"} if classes else {})
    with pytest.raises(BucketNotFound):
        list(get_store(parse("s3://direct/"), settings_for(s3.env())).list(parse("s3://no-such-bucket-here/x/")))
    with pytest.raises(BucketNotFound):
        store_direct = get_store(parse("s3://direct/"), settings_for(s3.env()))
        store_direct.check_bucket(parse("s3://no-such-bucket-here/"))


def test_each_listing_page_of_either_emulator_is_read_by_the_pattern_as_elementtree_reads_it(s3, monkeypatch):
    """The emulators' pages are in S3's usual layout: each is read by ``_plain_listing``, never
    handed to ElementTree, and reads as ElementTree reads the same body."""
    from bridge.stores import s3direct
    client = s3.client()
    keys = [f"plain/{i:03d} &<q>+%.bin" for i in range(5)]
    for key in keys:
        client.put_object(Bucket="direct", Key=key, Body=b"x")
    bodies, trees = [], []
    plain, tree = s3direct._plain_listing, s3direct._tree_listing
    monkeypatch.setattr(s3direct, "_plain_listing", lambda body: bodies.append(body) or plain(body))
    monkeypatch.setattr(s3direct, "_tree_listing", lambda prefix, body: trees.append(body) or tree(prefix, body))
    store = get_store(parse("s3://direct/"), settings_for(s3.env()))
    monkeypatch.setattr(store._direct, "page_size", 2)
    assert [o.location.key for o in store.list(parse("s3://direct/plain/"))] == keys
    assert len(bodies) == 3 and trees == []
    for body in bodies:
        objects, encoded, following = plain(body)
        (tree_objects, prefixes), tree_following = tree(parse("s3://direct/plain/"), body)
        assert encoded and prefixes == [] and following == tree_following
        assert [(unquote_plus(o[0]), *o[1:]) for o in objects] == tree_objects


def _page(contents: str, top: str = "<IsTruncated>false</IsTruncated>", head: str = '<?xml version="1.0" encoding="UTF-8"?>\n') -> bytes:
    return (f'{head}<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>b</Name>'
            f"<Prefix></Prefix><KeyCount>2</KeyCount><MaxKeys>1000</MaxKeys>{top}{contents}</ListBucketResult>").encode()


_AWS = ("<Contents><Key>a&amp;b &lt;c&gt; &apos;d&apos;</Key><LastModified>2026-12-07T08:58:13.000Z</LastModified>"
        "<ETag>&quot;e5e983bc2eebb06f78121dcbec67e718&quot;</ETag><ChecksumAlgorithm>CRC64NVME</ChecksumAlgorithm>"
        "<ChecksumType>FULL_OBJECT</ChecksumType><Size>8192</Size><StorageClass>STANDARD</StorageClass></Contents>\n"
        "  <Contents>\n <Key>x</Key> <LastModified>2026-12-07T08:58:14.000Z</LastModified><ETag>\"abc-2\"</ETag>"
        "<Size></Size><Owner><ID>o1</ID><DisplayName>me</DisplayName></Owner>"
        "<StorageClass>GLACIER</StorageClass></Contents>"
        "<Contents><Key>名前 y</Key><LastModified>t</LastModified><ETag></ETag><Size>3</Size>"
        "<StorageClass>STANDARD_IA</StorageClass><Owner><ID>o2</ID></Owner></Contents>")


@pytest.mark.parametrize("body", [
    _page(_AWS),
    _page(_AWS, "<IsTruncated>true</IsTruncated><NextContinuationToken>AbC+/=&amp;</NextContinuationToken>"),
    _page(_AWS, "<EncodingType>url</EncodingType><IsTruncated>false</IsTruncated>", head=""),
    _page(""),
    _page(_AWS + "<NextContinuationToken>t</NextContinuationToken>" + _AWS, "<IsTruncated>true</IsTruncated>"),
], ids=["aws", "truncated", "url-no-prolog", "empty", "token-between"])
def test_a_page_in_s3s_layout_reads_by_the_pattern_as_by_elementtree(body):
    from bridge.stores.s3direct import _plain_listing, _tree_listing
    objects, encoded, following = _plain_listing(body)
    (tree_objects, prefixes), tree_following = _tree_listing(parse("s3://bucket/"), body)
    assert prefixes == [] and following == tree_following
    assert encoded == (b"<EncodingType>url" in body)
    assert [(unquote_plus(o[0]) if encoded else o[0], *o[1:]) for o in objects] == tree_objects
    if body != _page(""):
        assert objects[0][0] == "a&b <c> 'd'" and objects[0][2] == '"e5e983bc2eebb06f78121dcbec67e718"'
        assert objects[1][1] == "0"


def test_random_keys_escaped_as_s3_escapes_them_read_the_same_both_ways():
    """Keys of any printable character, escaped with or without quotes' entities, as they are or
    URL-encoded: the pattern reads each page as ElementTree does."""
    import random
    from urllib.parse import quote_plus
    from xml.sax.saxutils import escape
    from bridge.stores.s3direct import _plain_listing, _tree_listing
    rng = random.Random(52)
    alphabet = [chr(c) for c in range(0x20, 0x7f)] + list("\tüß名前€😀\u00a0")
    for round_ in range(40):
        keys = sorted("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))) for _ in range(25))
        encoded = round_ % 2 == 0
        quotes = {'"': "&quot;", "'": "&apos;"} if round_ % 4 < 2 else {}
        contents = "".join(
            f"<Contents><Key>{escape(quote_plus(k, safe='/') if encoded else k, quotes)}</Key>"
            f"<LastModified>2026-12-07T09:00:00.000Z</LastModified><ETag>&quot;{i:032x}&quot;</ETag>"
            f"<Size>{i}</Size><StorageClass>STANDARD</StorageClass></Contents>" for i, k in enumerate(keys))
        top = ("<EncodingType>url</EncodingType>" if encoded else "") + "<IsTruncated>false</IsTruncated>"
        body = _page(contents, top)
        plain = _plain_listing(body)
        assert plain is not None
        (tree_objects, _), _ = _tree_listing(parse("s3://bucket/"), body)
        assert [(unquote_plus(o[0]) if encoded else o[0], *o[1:]) for o in plain[0]] == tree_objects
        assert [o[0] for o in tree_objects] == keys


_OBJECT = ("<Contents><Key>k</Key><LastModified>t</LastModified><ETag>e</ETag><Size>1</Size>"
           "<StorageClass>STANDARD</StorageClass></Contents>")


@pytest.mark.parametrize("body", [
    _page(_OBJECT.replace("<Key>k</Key>", "<Key><![CDATA[k]]></Key>")),
    _page(_OBJECT + "<!-- a comment -->"),
    _page(_OBJECT.replace("<Key>k</Key>", "<Key>k&#13;</Key>")),
    _page(_OBJECT.replace("<Key>k</Key>", "<Key>k&nbsp;</Key>")),
    _page(_OBJECT.replace("<Key>k</Key>", "<Key>k\x01</Key>")),
    _page(_OBJECT.replace("<Key>k</Key>", "<Key>k]]></Key>")),
    _page(_OBJECT.replace("<Key>k</Key>", "<Key>k\ufffe</Key>")),
    _page(_OBJECT.replace("<Contents>", "\u2028<Contents>")),
    _page(_OBJECT.replace("<ETag>e</ETag>", "<ETag/>")),
    _page(_OBJECT.replace("</StorageClass>", "</StorageClass><RestoreStatus><IsRestoreInProgress>true"
                                              "</IsRestoreInProgress></RestoreStatus>")),
    _page(_OBJECT.replace("<Contents>", '<Contents x="1">')),
    _page(_OBJECT + "<CommonPrefixes><Prefix>p/</Prefix></CommonPrefixes>"),
    _page(_OBJECT + "<CommonPrefixes></CommonPrefixes>"),
    _page(_OBJECT, "<IsTruncated>false</IsTruncated><IsTruncated>true</IsTruncated>"),
    _page(_OBJECT).replace(b"2006-03-01", b"2006-03-02"),
    _page(_OBJECT).replace(b"<Name>", b"\r\n<Name>"),
    _page(_OBJECT, head='<?xml version="1.0" encoding="ISO-8859-1"?>'),
    _page(_OBJECT, "<IsTruncated>true</IsTruncated>"),
    _page(_OBJECT)[:-30],
    _page(_OBJECT)[:-1],
    _page(_OBJECT) + b"<x/>",
    b"<html><body>502 Bad Gateway</body></html>",
    b"\xff" + _page(_OBJECT),
], ids=["cdata", "comment", "charref", "entity", "control", "cdata-end", "noncharacter", "unicode-space",
        "empty-element", "unknown-element", "attribute", "prefixes", "empty-prefixes", "twice", "namespace", "cr",
        "latin-1", "no-token", "cut", "cut-by-one", "trailing", "html", "not-utf-8"])
def test_any_other_page_is_left_to_elementtree(body):
    """Anything outside S3's usual layout is not read by the pattern; ElementTree reads it whole
    (the same objects where it is a listing) or refuses it (a page cut short, or not XML)."""
    from bridge.stores.s3direct import _plain_listing, _tree_listing
    assert _plain_listing(body) is None
    try:
        (objects, _prefixes), _following = _tree_listing(parse("s3://bucket/"), body)
    except BridgeError:
        return
    assert len(objects) == body.count(b"<Contents")


def test_head_is_the_sdks(s3, monkeypatch):
    """info() through the direct HEAD gives what the SDK's head_object gives: size, checksums,
    metadata and identity; a missing object is ObjectNotFound."""
    from bridge.hashing import FileHash
    store = get_store(parse("s3://direct/"), settings_for(s3.env()))
    data = os.urandom(3000)
    h = FileHash.of(data)
    loc = parse("s3://direct/head/ü x.bin")
    store.put(loc, data, crc32c=h.crc32c, metadata={"bridge_crc32c": h.crc32c, "bridge_sha256": h.sha256})
    direct = store.info(loc)
    with pytest.raises(ObjectNotFound):
        store.info(parse("s3://direct/head/none"))
    monkeypatch.setattr(store, "_direct", None)
    assert direct == store.info(loc)
    assert direct.size == 3000 and direct.identity.get("etag")


def test_unfinished_uploads_and_deletes_are_the_sdks(moto, monkeypatch):
    """Unfinished uploads listed page by page (two a page here) are those the SDK lists; a
    delete through the direct path removes the object."""
    moto.create_bucket("direct")
    client = moto.client()
    keys = ["up/a b.bin", "up/ü.bin", "up/x+y.bin", "up/a b.bin"]
    started = {(k, client.create_multipart_upload(Bucket="direct", Key=k)["UploadId"]) for k in keys}
    store = get_store(parse("s3://direct/"), settings_for(moto.env()))
    monkeypatch.setattr(store._direct, "page_size", 2)
    direct = sorted((loc.key, uid) for loc, uid in store.list_uploads(parse("s3://direct/up/")))
    assert direct == sorted(started)
    monkeypatch.setattr(store._direct, "page_size", None)
    client.put_object(Bucket="direct", Key="up/gone.bin", Body=b"x")
    store.delete(parse("s3://direct/up/gone.bin"))
    with pytest.raises(ObjectNotFound):
        store.info(parse("s3://direct/up/gone.bin"))
    monkeypatch.setattr(store, "_direct", None)
    assert sorted((loc.key, uid) for loc, uid in store.list_uploads(parse("s3://direct/up/"))) == direct


def test_many_whole_objects_come_from_one_thread_and_failures_are_per_object(s3):
    """Store.read_many: every object byte-exact through ``each`` in the calling thread, a missing
    one reported by index while the rest still arrive."""
    import threading
    client = s3.client()
    blobs = {f"many/{i:03d} #.bin": os.urandom(i * 997 % 70_000) for i in range(40)}   # 0 bytes too
    for key, data in blobs.items():
        client.put_object(Bucket="direct", Key=key, Body=data)
    store = get_store(parse("s3://direct/"), settings_for(s3.env()))
    assert store.reads_many
    keys = list(blobs)
    keys[7:7] = ["many/gone-1"]
    keys.append("many/gone-2")
    got, threads = {}, set()

    def each(i, data):
        got[keys[i]] = bytes(data)
        threads.add(threading.get_ident())

    failures = store.read_many([parse(f"s3://direct/{k}") for k in keys], each)
    assert got == blobs
    assert threads == {threading.get_ident()}
    assert sorted(failures) == [7, len(keys) - 1]
    assert all(isinstance(exc, ObjectNotFound) for exc in failures.values())


class PeerProxy(FaultProxy):
    """The fault proxy, keeping each request's client connection (its transport)."""

    def __init__(self, upstream: str):
        super().__init__(upstream)
        self.transports: list = []

    async def _handle(self, request):
        self.transports.append(request.transport)
        return await super()._handle(request)

    def hang_up(self) -> None:
        """Close, from the server's side, every connection a request came on, and return once
        their sockets are closed (the client has been told)."""
        async def close():
            for transport in self.transports:
                transport.close()
            while any(transport.get_extra_info("socket").fileno() != -1 for transport in self.transports):
                await asyncio.sleep(0.01)
        asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=30)


def test_runs_of_many_objects_keep_their_connections_and_drop_the_ones_the_server_closed(s3):
    """Successive ``get_many`` runs (an engine batch each) go over the connections the first
    opened, no more than it opened; after the server closes them while they are kept, the next
    run opens new ones instead of failing a request on a dead one (no retries allowed here)."""
    client = s3.client()
    blobs = {f"keep/{i:02d}.bin": os.urandom(1000 + i) for i in range(12)}
    for key, data in blobs.items():
        client.put_object(Bucket="direct", Key=key, Body=data)
    locs = [parse(f"s3://direct/{key}") for key in blobs]
    with PeerProxy(s3.endpoint) as proxy:
        direct = Direct(proxy.endpoint, "us-east-1", lambda: ("testing", "testing", None), 30)
        for run in range(4):
            if run == 3:
                proxy.hang_up()
            got = {}
            failures = direct.get_many(locs, lambda i, data: got.__setitem__(i, bytes(data)), _not_found,
                                       connections=3, retries=0)
            assert failures == {} and [got[i] for i in range(len(locs))] == list(blobs.values())
            if run == 2:
                assert len({id(t) for t in proxy.transports}) == 3
        assert len(proxy.transports) == 4 * len(locs)
        assert len({id(t) for t in proxy.transports}) == 6


def _not_found(loc, code, text):
    return ObjectNotFound(f"{loc}: {code} {text}")


def test_a_batch_of_small_files_is_written_and_resumed_per_file(s3, tmp_path, monkeypatch):
    """S3 -> local copies small files in batch units (several per unit, one unit at a time);
    a file whose object vanished after planning fails the job in one line, the others are
    journaled, and the re-run fetches only what is missing."""
    from bridge.errors import TransferFailed
    monkeypatch.setattr(planning, "BATCH_FILES", 4)
    client = s3.client()
    prefix = f"batch-{os.urandom(3).hex()}/"
    blobs = {f"f{i:02d}.txt": os.urandom(100 + i) for i in range(10)}
    for rel, data in blobs.items():
        client.put_object(Bucket="direct", Key=prefix + rel, Body=data)
    settings = settings_for({**s3.env(), "MCBRIDGE_STATE_DIR": str(tmp_path / "state")})
    plan = planning.plan_copy(f"s3://direct/{prefix}", f"{tmp_path}/out/", settings)
    units = list(plan.units())
    assert [len(u["files"]) for u in units] == [4, 4, 2]
    assert {u["slots"] for u in units} == {settings.transfer.concurrency}
    assert plan.unit_count() == len(units) + 1
    client.delete_object(Bucket="direct", Key=prefix + "f05.txt")
    with pytest.raises(TransferFailed, match="f05.txt"):
        executor.execute(plan, settings)
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == sorted(set(blobs) - {"f05.txt"})
    assert not (out / "_bridge" / "log").exists()
    client.put_object(Bucket="direct", Key=prefix + "f05.txt", Body=blobs["f05.txt"])
    result = ops.copy(f"s3://direct/{prefix}", f"{out}/", settings)
    assert result["bytes_skipped"] == sum(len(d) for rel, d in blobs.items() if rel != "f05.txt")
    assert {rel: (out / rel).read_bytes() for rel in blobs} == blobs


def test_many_puts_from_one_thread_carry_their_checksums_and_fail_per_object(s3):
    """Store.put_many: each object arrives byte-exact with its metadata and the CRC32C it was
    sent with; an object whose body cannot be had (here: the source changed) is that object's
    failure, not the batch's; what each answer says comes back as put's ObjectInfo."""
    from bridge.errors import IntegrityError
    from bridge.hashing import crc32c, crc_hex
    from bridge.stores.base import ObjectInfo
    store = get_store(parse("s3://direct/"), settings_for(s3.env()))
    assert store.writes_many
    prefix = f"puts-{os.urandom(3).hex()}/"
    blobs = [os.urandom(i * 1013 % 50_000) for i in range(30)]
    infos: dict[int, ObjectInfo] = {}

    def body(i):
        if i == 11:
            raise IntegrityError("the source changed")
        return parse(f"s3://direct/{prefix}{i:02d}"), blobs[i], crc_hex(crc32c(blobs[i])), {"n": str(i)}

    failures = store.put_many(len(blobs), body, infos.__setitem__)
    assert sorted(failures) == [11] and isinstance(failures[11], IntegrityError)
    assert sorted(infos) == [i for i in range(30) if i != 11]
    client = s3.client()   # boto3: another client reads them back
    for i, info in infos.items():
        got = client.get_object(Bucket="direct", Key=f"{prefix}{i:02d}", ChecksumMode="ENABLED")
        assert got["Body"].read() == blobs[i]
        assert {k.lower(): v for k, v in got["Metadata"].items()} == {"n": str(i)}   # rclone: "N"
        assert info.size == len(blobs[i]) and info.identity.get("etag")
        if s3.name != "rclone-s3":   # rclone serve s3 keeps no checksums
            assert info.checksums["crc32c"] == crc_hex(crc32c(blobs[i]))
            assert got["ChecksumCRC32C"] == crc_hex_to_b64(info.checksums["crc32c"])


def test_small_files_from_local_to_s3_go_in_batches_and_verify(s3, tmp_path, monkeypatch):
    small_files_go_in_batches_and_verify(s3.env(), f"s3://direct/up-{os.urandom(3).hex()}/", tmp_path, monkeypatch)


def test_over_plain_http_each_part_and_file_is_signed_with_the_sha256_the_engine_took_of_it(moto, tmp_path):
    """Over plain HTTP a request signs its payload's SHA-256; a part's (or a small file's) is the
    one the engine takes of it anyway (the default digest), given to the signer rather than taken twice.
    A proxy that checks every signed hash against the bytes, as S3 does (the emulators do not),
    sees no mismatch in a multipart copy, and refuses a request signed with another hash."""
    from bridge.stores.s3direct import SigV4
    from tests.faultproxy import FaultProxy
    moto.create_bucket("direct")
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(12 * MiB + 5)
    (src / "ckpt.bin").write_bytes(data)
    (src / "small.txt").write_bytes(b"small")
    with FaultProxy(moto.endpoint, check_payload=True) as proxy:
        settings = settings_for({**moto.env(), "AWS_ENDPOINT_URL": proxy.endpoint,
                                 "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}, retries=0)
        ops.copy(f"{src}/", "s3://direct/signed/", settings, chunk_size=5 * MiB)
        assert proxy.counts["payload_mismatch"] == 0 and proxy.counts["requests"] > 3, proxy.log
        assert sum(1 for line, _ in proxy.log if "partNumber=" in line) == 3
        assert any(line == "PUT /direct/signed/small.txt" for line, _ in proxy.log), proxy.log
        assert moto.client().get_object(Bucket="direct", Key="signed/ckpt.bin")["Body"].read() == data
        # the check is real: a body signed as other bytes is refused
        env = moto.env()
        headers = {"Content-Length": "4"}
        SigV4(lambda: (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"], None), "us-east-1", https=False).sign(
            "PUT", f"127.0.0.1:{proxy.port}", "/direct/signed/x", "", headers, b"data",
            payload_sha256=hashlib.sha256(b"else").hexdigest())
        import http.client
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
        conn.request("PUT", "/direct/signed/x", body=b"data", headers=headers)
        assert conn.getresponse().status == 400 and proxy.counts["payload_mismatch"] == 1


def test_a_part_cut_half_way_is_written_again_from_its_start(moto, tmp_path):
    """Parts to a local destination are written piece by piece as they arrive: an answer cut
    half-way is asked again and written again from the part's first byte, and the copy's
    CRC32C and SHA-256 are those of the object, not of the pieces of the cut attempt."""
    from tests.faultproxy import FaultProxy, Rule
    moto.create_bucket("direct")
    data = os.urandom(12 * MiB + 5)
    moto.client().put_object(Bucket="direct", Key="cut/ckpt.bin", Body=data)
    with FaultProxy(moto.endpoint) as proxy:
        settings = settings_for({**moto.env(), "AWS_ENDPOINT_URL": proxy.endpoint,
                                 "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}, retries=2)
        # the second part (bytes from 4 MiB) is cut once, after half of it was sent
        proxy.configure(rules=[Rule(r"^GET /direct/cut/ckpt\.bin", "cut", after=1)])
        result = ops.copy("s3://direct/cut/ckpt.bin", f"{tmp_path}/out/", settings, chunk_size=4 * MiB)
        assert proxy.counts["cut"] == 1, proxy.log
    assert result["files"] == 1
    assert (tmp_path / "out" / "ckpt.bin").read_bytes() == data
    assert verifying.verify(f"{tmp_path}/out/", settings, deep=True)["ok"]


def test_a_multipart_upload_goes_without_the_sdk_and_s3_checks_the_whole(moto, tmp_path):
    """A file of several parts is begun, sent and completed on the direct path: the SDK is never
    imported (its import and client held every part's thread for 0.8 s before the first part
    could go); S3 keeps the whole object's CRC32C as sent at completion, and the class asked for."""
    from bridge.hashing import crc32c, crc_hex
    moto.create_bucket("direct")
    data = os.urandom(11 * MiB + 3)
    (tmp_path / "ckpt.bin").write_bytes(data)
    code = ("import os; from bridge import ops; from tests.helpers import settings_for\n"
            "s = settings_for(dict(os.environ))\n"
            "s = s.model_copy(update={'s3': s.s3.model_copy(update={'storage_class': 'STANDARD_IA'})})\n"
            f"ops.copy({str(tmp_path / 'ckpt.bin')!r}, 's3://direct/mp/', s, chunk_size=5 * 2**20)")
    env = {**os.environ, **moto.env(), "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}
    assert imported_by(code, ("aiobotocore", "s3fs", "botocore.client"), env) == []
    got = moto.client().head_object(Bucket="direct", Key="mp/ckpt.bin", ChecksumMode="ENABLED")
    assert got["ContentLength"] == len(data) and got["StorageClass"] == "STANDARD_IA"
    assert got["ETag"].strip('"').endswith("-3")
    assert got["ChecksumCRC32C"] == crc_hex_to_b64(crc_hex(crc32c(data)))
    assert moto.client().get_object(Bucket="direct", Key="mp/ckpt.bin")["Body"].read() == data
    assert [u for u in moto.client().list_multipart_uploads(Bucket="direct").get("Uploads", [])
            if u["Key"] == "mp/ckpt.bin"] == []


def test_a_completion_answered_200_with_an_error_is_that_error(tmp_path):
    """S3 may answer CompleteMultipartUpload 200 and then an error document (botocore reads it
    so): a transient one is retried as such, not taken for a finished object."""
    import http.server
    import threading

    from bridge.errors import TransientError
    from bridge.stores.s3 import _from_code
    from tests.emulators import LOOPBACK
    answers = [b'<?xml version="1.0"?>\n<Error><Code>InternalError</Code><Message>try again</Message></Error>',
               b'<?xml version="1.0"?>\n<CompleteMultipartUploadResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
               b'<ETag>&quot;abc-2&quot;</ETag><ChecksumCRC32C>AAAAAA==</ChecksumCRC32C>'
               b'<ChecksumType>FULL_OBJECT</ChecksumType></CompleteMultipartUploadResult>']
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            seen.append((self.path, self.rfile.read(int(self.headers["Content-Length"])).decode(),
                         self.headers.get("x-amz-checksum-crc32c")))
            body = answers[len(seen) - 1]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("x-amz-version-id", "v1")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer((LOOPBACK, 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        settings = settings_for({"AWS_ENDPOINT_URL": f"http://{LOOPBACK}:{server.server_port}",
                                 "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
                                 "MCBRIDGE_STATE_DIR": str(tmp_path / "state")})
        direct = Direct.for_settings(settings)
        loc = parse("s3://bkt/k & <x>.bin")
        parts = [(1, '"e1"', "AAAAAA=="), (2, '"e&2"', "")]
        with pytest.raises(TransientError, match="InternalError"):
            direct.complete_upload(loc, "up/1", parts, "AAAAAA==", _from_code)
        answer = direct.complete_upload(loc, "up/1", parts, "AAAAAA==", _from_code)
    finally:
        server.shutdown()
    assert answer == {"ETag": '"abc-2"', "ChecksumCRC32C": "AAAAAA==", "ChecksumType": "FULL_OBJECT",
                      "VersionId": "v1"}
    path, body, crc = seen[1]
    assert path == "/bkt/k%20%26%20%3Cx%3E.bin?uploadId=up%2F1" and crc == "AAAAAA=="
    assert ("<Part><PartNumber>1</PartNumber><ETag>\"e1\"</ETag><ChecksumCRC32C>AAAAAA==</ChecksumCRC32C></Part>"
            "<Part><PartNumber>2</PartNumber><ETag>\"e&amp;2\"</ETag></Part>") in body


@pytest.mark.parametrize("mode, heads", [("skip", 0), ("readback", 1)])
def test_a_completed_upload_is_asked_about_only_when_a_checksum_is_to_be_checked(rclone_s3, tmp_path, mode, heads):
    """rclone serve s3 keeps no checksums, so its answer to the completion names none. Under
    --store-checksums skip nothing is to be checked: the answer's ETag identifies the object, as
    a PUT's does, and no HEAD follows (there it costs the endpoint an MD5 of the whole object);
    otherwise the object is asked about (then read back, as readback says)."""
    data = os.urandom(11 * MiB + 3)
    (tmp_path / "ckpt.bin").write_bytes(data)
    with FaultProxy(rclone_s3.endpoint) as proxy:
        settings = settings_for({**rclone_s3.env(), "AWS_ENDPOINT_URL": proxy.endpoint,
                                 "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}, store_checksums=mode)
        ops.copy(str(tmp_path / "ckpt.bin"), f"s3://direct/{mode}/", settings, chunk_size=5 * MiB)
        lines = [line for line, _ in proxy.log]
        verified = verifying.verify(f"s3://direct/{mode}/", settings)
    done = next(i for i, line in enumerate(lines) if line.startswith(f"POST /direct/{mode}/ckpt.bin?uploadId="))
    assert sum(1 for line in lines[done:] if line == f"HEAD /direct/{mode}/ckpt.bin") == heads, lines
    assert rclone_s3.client().get_object(Bucket="direct", Key=f"{mode}/ckpt.bin")["Body"].read() == data
    assert verified["ok"], verified


def test_copies_resumed_parts_levels_and_buckets_are_the_sdks(moto, monkeypatch):
    """Server-side copies (in one request, keeping or replacing the headers and metadata, and in
    part copies above the single-request limit), the parts listed on a resume, one level of a
    listing and the buckets: what the direct path gives is what the SDK's calls give."""
    import dataclasses

    from bridge.attributes import Attrs
    from bridge.hashing import FileHash, crc32c, crc_hex
    from bridge.stores.s3 import S3Store
    moto.create_bucket("direct")
    store = get_store(parse("s3://direct/"), settings_for(moto.env()))
    small, big = os.urandom(3000), os.urandom(11 * MiB + 5)
    h = FileHash.of(small)
    src = parse("s3://direct/cp/src ü.bin")
    store.put(src, small, crc32c=h.crc32c, metadata={"bridge_crc32c": h.crc32c, "mine": "kept"},
              attrs=Attrs(content_type="text/x-one", user={"mine": "kept"}))
    moto.client().put_object(Bucket="direct", Key="cp/big+1.bin", Body=big)
    monkeypatch.setattr(S3Store, "features", dataclasses.replace(S3Store.features, max_copy_size=5 * MiB))
    replaced = Attrs(content_type="text/x-two", user={"other": "set"})
    ran: dict[str, list] = {}
    for path, direct in (("direct", store._direct), ("sdk", None)):
        monkeypatch.setattr(store, "_direct", direct)
        kept = store.copy_object(src, parse(f"s3://direct/{path}/kept & x.bin"), size=len(small))
        other = store.copy_object(src, parse(f"s3://direct/{path}/replaced.bin"), size=len(small), attrs=replaced)
        parted = store.copy_object(parse("s3://direct/cp/big+1.bin"), parse(f"s3://direct/{path}/big.bin"),
                                   size=len(big))
        ran[path] = [(i.size, i.checksums, store.info(i.location).attrs, store.info(i.location).metadata)
                     for i in (kept, other, parted)]
        assert store.read(parted.location) == big and store.read(kept.location) == small
        assert kept.identity["etag"] and parted.identity["etag"]
    assert ran["direct"] == ran["sdk"]
    assert ran["direct"][0][2].content_type == "text/x-one" and ran["direct"][1][2].content_type == "text/x-two"
    assert ran["direct"][1][3].get("other") == "set" and ran["direct"][1][3].get("bridge_crc32c") == h.crc32c
    assert ran["direct"][2][1].get("crc32c", crc_hex(crc32c(big))) == crc_hex(crc32c(big))

    # The parts of an unfinished upload, a page at a time (one a page), as a resume lists them.
    monkeypatch.setattr(store, "_direct", Direct.for_settings(store.settings))
    loc = parse("s3://direct/resume/ckpt.bin")
    upload_id = store.begin_upload(loc, 3 * MiB)
    for number in (1, 2, 3):
        piece = os.urandom(MiB)
        store.upload_part(loc, upload_id, number, (number - 1) * MiB, piece, crc_hex(crc32c(piece)))
    monkeypatch.setattr(store._direct, "page_size", 1)
    direct = store.list_parts(loc, upload_id)
    assert store.list_parts(loc, "no-such-upload") is None
    direct_store = store._direct
    monkeypatch.setattr(store, "_direct", None)
    assert direct == store.list_parts(loc, upload_id) and sorted(direct) == [1, 2, 3]
    assert all(p.size == MiB and p.token for p in direct.values())   # (moto lists no part checksums)

    # One level: the objects at it and the prefixes below it, keys XML cannot carry as they are.
    for key in ("lvl/a b.bin", "lvl/ü/x", "lvl/x+y%z/1", "lvl/amp&lt/2", "lvl/z", "lvl/zz/deep/3"):
        moto.client().put_object(Bucket="direct", Key=key, Body=b"x")
    sdk = sorted(map(str, store.list_level(parse("s3://direct/lvl/"))))
    monkeypatch.setattr(store, "_direct", direct_store)
    monkeypatch.setattr(store._direct, "page_size", 2)
    listed = list(store.list_level(parse("s3://direct/lvl/")))
    assert sorted(map(str, listed)) == sdk
    assert sorted(o.location.key if hasattr(o, "location") else o.key for o in listed) == [
        "lvl/a b.bin", "lvl/amp&lt/", "lvl/x+y%z/", "lvl/z", "lvl/zz/", "lvl/ü/"]

    # Buckets: listed as the SDK lists them; one made here is there.
    name = f"made-{os.getpid()}"
    store.make_bucket(parse(f"s3://{name}/"))
    store.check_bucket(parse(f"s3://{name}/"))
    listed_buckets = store.buckets()
    monkeypatch.setattr(store, "_direct", None)
    assert listed_buckets == store.buckets() and name in listed_buckets


def test_a_copy_in_parts_and_a_resume_listing_go_without_the_sdk(moto, tmp_path):
    """A server-side copy above the single-request limit and the listing of an upload's parts
    never import the SDK (its import and client cost a short job half a second or more)."""
    moto.create_bucket("direct")
    moto.client().put_object(Bucket="direct", Key="nosdk/big.bin", Body=os.urandom(6 * MiB))
    code = ("import dataclasses, os; from bridge.stores import get_store; from bridge.urls import parse\n"
            "from bridge.stores.s3 import S3Store; from tests.helpers import settings_for\n"
            "S3Store.features = dataclasses.replace(S3Store.features, max_copy_size=5 * 2**20)\n"
            "store = get_store(parse('s3://direct/'), settings_for(dict(os.environ)))\n"
            "info = store.copy_object(parse('s3://direct/nosdk/big.bin'), parse('s3://direct/nosdk/copy.bin'),"
            " size=6 * 2**20)\n"
            "assert info.size == 6 * 2**20, info\n"
            "loc = parse('s3://direct/nosdk/up.bin'); up = store.begin_upload(loc, 1)\n"
            "assert store.list_parts(loc, up) == {}\n"
            "assert [str(x) for x in store.list_level(parse('s3://direct/nosdk/'))]\n"
            "assert 'direct' in store.buckets()\n")
    env = {**os.environ, **moto.env(), "MCBRIDGE_STATE_DIR": str(tmp_path / "state")}
    assert imported_by(code, ("aiobotocore", "s3fs", "botocore.client"), env) == []


def test_a_presigned_url_reads_the_object_and_nothing_else(rclone_s3):
    """A presigned GET URL made without the SDK: rclone serve s3 checks its signature, so the
    object is read with no other credentials, and a URL changed to name another key, or made an
    hour ago for a minute, is refused."""
    import urllib.error
    import urllib.request
    store = get_store(parse("s3://direct/"), settings_for(rclone_s3.env()))
    data = os.urandom(5000)
    loc = parse("s3://direct/signed/ü x+1.bin")
    rclone_s3.client().put_object(Bucket="direct", Key=loc.key, Body=data)
    url = store.signed_url(loc, 300)
    assert store._direct is not None and "X-Amz-Signature=" in url
    with urllib.request.urlopen(url) as answer:
        assert answer.read() == data
    for bad, code in ((url.replace("signed/", "signed/x", 1), b"SignatureDoesNotMatch"),
                      (store._direct.signed_url(loc, 60, now=time.time() - 3600), b"AccessDenied")):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(bad)
        assert code in refused.value.read()


def test_a_timestamp_is_the_same_utc_second_whatever_form_it_came_in():
    """bridge.stores.base.utc_seconds: what a listing (ISO-8601, Z), a HEAD (an HTTP date) and an
    SDK (dateutil's UTC, other offsets) give for one instant is one string, to the second."""
    from datetime import datetime, timedelta, timezone
    from email.utils import parsedate_to_datetime

    from dateutil.tz import tzoffset, tzutc

    from bridge.stores.base import utc_seconds
    same = [datetime.fromisoformat("2026-12-03T13:37:22.999Z"), parsedate_to_datetime("Thu, 03 Dec 2026 13:37:22 GMT"),
            datetime(2026, 12, 3, 13, 37, 22, 5, tzinfo=tzutc()),
            datetime(2026, 12, 3, 15, 37, 22, tzinfo=timezone(timedelta(hours=2))),
            datetime(2026, 12, 3, 8, 37, 22, 500000, tzinfo=tzoffset(None, -5 * 3600))]
    assert {utc_seconds(when) for when in same} == {"2026-12-03T13:37:22Z"}
    assert utc_seconds(datetime(2027, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=1)))) == "2026-12-31T23:30:00Z"
