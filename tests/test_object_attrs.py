"""Objects arrive as they left: headers and user metadata along all 12 directions among local,
s3, gs and az (README, "Headers and metadata"), read back with each provider's own SDK, and the
flags that override them.

A local file keeps them as ``user.`` extended attributes (as rclone's local backend does); a key
Azure cannot hold (not a C# identifier) goes as azcopy's ``rename_``/``rename_key_`` pair and comes
back under its own name; a value that is not ASCII travels RFC 2047-encoded in S3 and Azure headers.
"""

from __future__ import annotations

import gzip
import itertools
import os

import pytest

from bridge.attributes import Attrs
from bridge.stores import get_store
from bridge.urls import parse
from tests.helpers import mcbridge, settings_for

KINDS = ("local", "s3", "gs", "az")
PAIRS = list(itertools.permutations(KINDS, 2))
MiB = 1024 * 1024
USER = {"owner": "team-x", "data-set": "wiki 2024 ✓"}
SENT = {
    # one request; the headers set by hand
    "doc.json.gz": Attrs(content_type="application/json", content_encoding="gzip", cache_control="max-age=60",
                         content_disposition='attachment; filename="doc.json.gz"', content_language="en",
                         user=USER),
    # parts (S3 multipart, GCS compose, Azure block list, local partial file)
    "big.bin": Attrs(content_type="application/x-weights", cache_control="no-cache", user=USER),
    # nothing recorded: Content-Type guessed from the name, as the AWS CLI does
    "table.csv": Attrs(content_type="text/csv"),
}
XATTR = {"content_type": "content-type", "content_encoding": "content-encoding", "cache_control": "cache-control",
         "content_disposition": "content-disposition", "content_language": "content-language"}


def _local_tree(root) -> None:
    root.mkdir(parents=True, exist_ok=True)
    bodies = {"doc.json.gz": gzip.compress(b'{"a": 1}\n' * 100), "big.bin": os.urandom(6 * MiB + 17),
              "table.csv": b"a,b\n1,2\n"}
    for name, data in bodies.items():
        (root / name).write_bytes(data)
        attrs = SENT[name]
        for field, value in attrs.headers().items():
            if name != "table.csv":
                os.setxattr(root / name, f"user.{XATTR[field]}", value.encode())
        for key, value in attrs.user.items():
            os.setxattr(root / name, f"user.{key}", value.encode())


def attrs_at(url: str, env) -> dict[str, Attrs]:
    root = parse(url)
    store = get_store(root, settings_for(env))
    return {rel: store.attributes(info) for rel, info in store.walk(root)}


@pytest.fixture(scope="module")
def seeded(tmp_path_factory, emulator_env, moto, fake_gcs, azurite):
    from tests.emulators import unique_name
    base = tmp_path_factory.mktemp("attrs")
    _local_tree(base / "src")
    roots = {"local": f"{base / 'src'}/"}
    for kind, emulator in (("s3", moto), ("gs", fake_gcs), ("az", azurite)):
        bucket = unique_name()
        emulator.create_bucket(bucket)
        roots[kind] = f"{kind}://{bucket}/tree/"
        r = mcbridge("cp", roots["local"], roots[kind], "--chunk-size", "5MiB", "-q", env=emulator_env,
                     state_dir=base / "state")
        assert r.returncode == 0, r.stderr
    return roots


@pytest.mark.parametrize("src,dst", PAIRS, ids=[f"{a}-to-{b}" for a, b in PAIRS])
def test_headers_and_metadata_arrive(src, dst, seeded, make_root, emulator_env, tmp_path):
    target = make_root(dst) + "copy/"
    r = mcbridge("cp", seeded[src], target, "--chunk-size", "5MiB", "-q", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    assert attrs_at(target, emulator_env) == SENT
    v = mcbridge("verify", target, env=emulator_env, state_dir=tmp_path)
    assert v.returncode == 0, v.stdout + v.stderr


def test_each_store_holds_them_under_its_own_names(seeded, emulator_for):
    """Read with the providers' SDKs, not bridge: what another tool sees."""
    s3 = emulator_for("s3").client()
    loc = parse(seeded["s3"] + "doc.json.gz")
    head = s3.head_object(Bucket=loc.bucket, Key=loc.key)
    assert (head["ContentType"], head["ContentEncoding"], head["CacheControl"]) == \
        ("application/json", "gzip", "max-age=60")
    assert head["Metadata"]["owner"] == "team-x"
    assert head["Metadata"]["data-set"].startswith("=?UTF-8?B?")     # RFC 2047, as S3 answers such values
    assert "bridge_crc32c" in head["Metadata"]                        # bridge's own keys beside them

    loc = parse(seeded["gs"] + "big.bin")
    blob = emulator_for("gs").client().bucket(loc.bucket).get_blob(loc.key)
    assert (blob.content_type, blob.cache_control) == ("application/x-weights", "no-cache")
    assert blob.metadata["data-set"] == "wiki 2024 ✓" and blob.metadata["owner"] == "team-x"

    loc = parse(seeded["az"] + "doc.json.gz")
    props = emulator_for("az").client().get_blob_client(loc.bucket, loc.key).get_blob_properties()
    assert props.content_settings.content_type == "application/json"
    assert props.content_settings.content_language == "en"
    assert props.metadata["owner"] == "team-x"
    assert props.metadata["rename_key_data_set"] == "data-set"        # azcopy's RenameIfInvalid pair
    assert "rename_data_set" in props.metadata


def test_flags_override_and_no_metadata_drops(seeded, make_root, emulator_env, tmp_path):
    target = make_root("s3") + "over/"
    r = mcbridge("cp", seeded["gs"], target, "--content-type", "application/x-mine", "--metadata", "owner=ops",
                 "--metadata", "stage=dr", "-q", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    got = attrs_at(target, emulator_env)
    assert got["doc.json.gz"].content_type == "application/x-mine"
    assert got["doc.json.gz"].cache_control == "max-age=60"
    assert got["doc.json.gz"].user == {"owner": "ops", "data-set": "wiki 2024 ✓", "stage": "dr"}

    target = make_root("az") + "bare/"
    r = mcbridge("cp", seeded["s3"], target, "--no-metadata", "-q", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    got = attrs_at(target, emulator_env)
    assert got["big.bin"].user == {} and got["big.bin"].cache_control is None

    r = mcbridge("cp", seeded["s3"], make_root("gs"), "--metadata", "novalue", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 2 and "--metadata 'novalue': use KEY=VALUE" in r.stderr, r.stderr


def test_a_key_no_mapping_can_hold_fails_the_file_naming_it(make_root, emulator_env, emulator_for, tmp_path):
    src = make_root("gs")
    loc = parse(src + "a.txt")
    blob = emulator_for("gs").client().bucket(loc.bucket).blob(loc.key)
    blob.metadata = {"Owner": "a", "owner": "b"}      # GCS tells them apart; S3 does not
    blob.upload_from_string(b"x")
    r = mcbridge("cp", src, make_root("s3"), "-q", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 1
    assert "differ only in case" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_headers_read_from_s3_come_with_the_get(seeded, moto, make_root, emulator_env, tmp_path):
    """An S3 listing carries no metadata; the GET of a whole object does, so a copy out of S3
    sends no HEAD for it (counted at a proxy)."""
    from tests.faultproxy import FaultProxy, proxied_environment
    target = make_root("local") + "out/"
    with FaultProxy(moto.endpoint) as proxy:
        env = proxied_environment(emulator_env, {"s3": proxy})
        r = mcbridge("cp", seeded["s3"], target, "--chunk-size", "5MiB", "-q", env=env, state_dir=tmp_path)
        assert r.returncode == 0, r.stderr
        heads = [line for line, _ in proxy.log if line.startswith("HEAD ") and "_bridge" not in line]
    assert not any("doc.json.gz" in line or "table.csv" in line for line in heads), heads
    assert attrs_at(target, emulator_env) == SENT


@pytest.mark.parametrize("scheme", ["s3", "gs", "az"])
def test_the_sdk_paths_carry_them_too(scheme, make_root, emulator_env):
    """With the store's direct path off (as with an AWS profile, a SAS, or gcsfs's credentials),
    the SDK's requests write and read the same headers, metadata and class."""
    from bridge.hashing import crc32c, crc_hex
    from bridge.stores import store_class
    klass = {"s3": ("s3", {"storage_class": "STANDARD_IA"}), "gs": ("gcs", {"storage_class": "NEARLINE"}),
             "az": ("azure", {"tier": "Cool"})}[scheme]
    settings = settings_for(emulator_env)
    settings = settings.model_copy(update={klass[0]: getattr(settings, klass[0]).model_copy(update=klass[1])})
    store = store_class(scheme)(settings)
    store._direct = None
    root = parse(make_root(scheme))
    sent = SENT["doc.json.gz"]
    data = b"payload"
    store.put(root.join("one.json"), data, crc32c=crc_hex(crc32c(data)), metadata={"bridge_crc32c": "x"}, attrs=sent)
    got = store.info(root.join("one.json"))
    assert got.attrs == sent and got.metadata["bridge_crc32c"] == "x"
    listed = {info.location.name: info for info in store.list(root)}
    assert listed["one.json"].storage_class == next(iter(klass[1].values()))
    assert store.attributes(listed["one.json"]) == sent

