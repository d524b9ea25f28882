"""Storage classes and encryption per destination: set by flags and profiles, read back with the
providers' SDKs where the emulator keeps them, priced by ``plan``.

What the emulators keep (seen with their SDKs, 2026-12-01): moto keeps StorageClass,
ServerSideEncryption=aws:kms with SSEKMSKeyId (a key from its own KMS), BucketKeyEnabled (of a
PUT; not of a multipart upload, though CreateMultipartUpload takes it), and
refuses a GET of a GLACIER/DEEP_ARCHIVE object (InvalidObjectState). fake-gcs-server keeps
storageClass of an upload (not of a compose: the class asked for is dropped) but not kmsKeyName
(accepted, not returned). Azurite keeps the access tier
(Hot/Cool/Cold/Archive) and refuses reads of an Archive blob (BlobArchived), but does not keep an
encryption scope (accepted, not returned). So the CMEK key and the encryption scope are sent
(the requests succeed) but not read back here.
"""

from __future__ import annotations

import json
import os

import boto3

from bridge.urls import parse
from tests.helpers import mcbridge

MiB = 1024 * 1024


def _tree(root):
    root.mkdir(parents=True, exist_ok=True)
    (root / "small.txt").write_bytes(b"hello\n")
    (root / "big.bin").write_bytes(os.urandom(6 * MiB + 5))   # parts with --chunk-size 5MiB
    return f"{root}/"


def _kms_key(moto) -> str:
    kms = boto3.client("kms", endpoint_url=moto.endpoint, region_name="us-east-1",
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    return kms.create_key()["KeyMetadata"]["KeyId"]


def test_s3_class_and_sse_kms_are_set_and_read_back(moto, make_root, emulator_env, tmp_path):
    key = _kms_key(moto)
    src = _tree(tmp_path / "src")
    dst = make_root("s3") + "dr/"
    r = mcbridge("cp", src, dst, "--chunk-size", "5MiB", "--storage-class", "DEEP_ARCHIVE", "--kms-key", key,
                 "--bucket-key", "-q", env=emulator_env, state_dir=tmp_path / "state")
    assert r.returncode == 0, r.stderr
    s3 = moto.client()
    root = parse(dst)
    for name in ("small.txt", "big.bin"):
        head = s3.head_object(Bucket=root.bucket, Key=root.key + name)
        assert head["StorageClass"] == "DEEP_ARCHIVE", (name, head)
        assert head["ServerSideEncryption"] == "aws:kms" and key in head["SSEKMSKeyId"]
        if name == "small.txt":   # moto keeps BucketKeyEnabled for a PUT, not for a multipart upload
            assert head["BucketKeyEnabled"] is True
    # bridge's own record stays in the bucket's default class (readable without a restore)
    [commit] = [o["Key"] for o in s3.list_objects_v2(Bucket=root.bucket, Prefix=root.key + "_bridge/log/")["Contents"]]
    manifest = s3.head_object(Bucket=root.bucket, Key=commit)
    assert manifest.get("StorageClass", "STANDARD") == "STANDARD"
    assert mcbridge("verify", dst, env=emulator_env, state_dir=tmp_path / "state").returncode == 0

    # The archived copy as a source: one line saying a restore is needed, nothing copied.
    out = make_root("gs")
    r = mcbridge("cp", dst, out, env=emulator_env, state_dir=tmp_path / "state")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "2 source objects are archived (s3:// DEEP_ARCHIVE) and need a restore" in r.stderr
    r = mcbridge("plan", dst, out, "--json", env=emulator_env, state_dir=tmp_path / "state")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["restore"]["files"] == 2


def test_s3_server_side_copy_takes_the_destination_class(moto, make_root, emulator_env, tmp_path):
    src = _tree(tmp_path / "src")
    first = make_root("s3") + "a/"
    assert mcbridge("cp", src, first, "-q", env=emulator_env, state_dir=tmp_path / "s").returncode == 0
    second = make_root("s3") + "b/"
    r = mcbridge("cp", first, second, "--storage-class", "GLACIER_IR", "--json", env=emulator_env,
                 state_dir=tmp_path / "s")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["route"]["name"] == "server"
    root = parse(second)
    head = moto.client().head_object(Bucket=root.bucket, Key=root.key + "small.txt")
    assert head["StorageClass"] == "GLACIER_IR" and head["ContentType"] == "text/plain"


def test_gcs_class_is_set_and_read_back(fake_gcs, make_root, emulator_env, tmp_path):
    src = _tree(tmp_path / "src")
    dst = make_root("gs") + "dr/"
    r = mcbridge("cp", src, dst, "--chunk-size", "5MiB", "--storage-class", "COLDLINE", "--kms-key",
                 "projects/p/locations/us/keyRings/r/cryptoKeys/k", "-q", env=emulator_env,
                 state_dir=tmp_path / "state")
    assert r.returncode == 0, r.stderr
    root = parse(dst)
    bucket = fake_gcs.client().bucket(root.bucket)
    assert bucket.get_blob(root.key + "small.txt").storage_class == "COLDLINE"
    [commit] = list(bucket.list_blobs(prefix=root.key + "_bridge/log/"))
    assert bucket.get_blob(commit.name).storage_class != "COLDLINE"
    # fake-gcs-server ignores a compose's destination storageClass (it keeps its contentType and
    # metadata): what bridge's compose asks for is checked instead.
    from bridge.stores import get_store
    from tests.helpers import settings_for
    settings = settings_for(emulator_env)
    settings = settings.model_copy(update={"gcs": settings.gcs.model_copy(update={"storage_class": "COLDLINE"})})
    asked = get_store(root, settings).resource(root.join("big.bin"), {"bridge_crc32c": "0"}, None)
    assert asked["storageClass"] == "COLDLINE"


def test_azure_tier_from_a_profile_is_set_and_read_back(azurite, make_root, emulator_env, tmp_path):
    src = _tree(tmp_path / "src")
    for i in range(5):    # several small files: the direct path's batched Put Blob
        (tmp_path / "src" / f"s{i}.txt").write_bytes(b"x" * i)
    config = tmp_path / "config.yaml"
    config.write_text("profiles:\n  dr:\n    azure: {tier: Cool, encryption_scope: scope1}\n")
    dst = make_root("az") + "dr/"
    r = mcbridge("cp", src, dst, "--chunk-size", "5MiB", "--profile", "dr", "--config", str(config), "-q",
                 env=emulator_env, state_dir=tmp_path / "state")
    assert r.returncode == 0, r.stderr
    root = parse(dst)
    container = azurite.client().get_container_client(root.bucket)
    tiers = {b.name[len(root.key):]: b.blob_tier for b in container.list_blobs(name_starts_with=root.key)}
    [commit] = [name for name in tiers if name.startswith("_bridge/log/")]
    assert tiers.pop(commit) == "Hot"
    assert set(tiers.values()) == {"Cool"} and len(tiers) == 7, tiers


def test_a_class_the_destination_does_not_have_is_bad_input(make_root, emulator_env, tmp_path):
    src = _tree(tmp_path / "src")
    r = mcbridge("cp", src, make_root("s3"), "--storage-class", "COLDLINE", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 2 and "s3.storage_class: must be one of" in r.stderr, r.stderr
    r = mcbridge("cp", src, make_root("s3"), "--encryption-scope", "x", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 2 and "--encryption-scope does not apply to a s3:// destination" in r.stderr


def test_plan_prices_a_deep_archive_destination_and_a_read_from_a_cold_class(fake_gcs, make_root, emulator_env,
                                                                             tmp_path):
    src = make_root("gs") + "cold/"
    loc = parse(src)
    bucket = fake_gcs.client().bucket(loc.bucket)
    for i in range(3):
        blob = bucket.blob(f"{loc.key}f{i}.bin")
        blob.storage_class = "COLDLINE"
        blob.upload_from_string(os.urandom(MiB))
    dst = make_root("s3")
    r = mcbridge("plan", src, dst, "--storage-class", "DEEP_ARCHIVE", "--json", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["source_classes"] == {"COLDLINE": 3 * MiB} and report["destination_class"] == "DEEP_ARCHIVE"
    direct = next(row for row in report["routes"] if row["route"] == "direct")
    cost = direct["cost"]
    gb = 3 * MiB / 2**30
    assert abs(cost["retrieval_usd"] - gb * 0.02) < 1e-6   # GCS Coldline retrieval, $0.02/GB (rounded to 6 places)
    storage = cost["storage"]
    assert storage["class"] == "DEEP_ARCHIVE" and storage["min_days"] == 180
    assert abs(storage["month_usd"] - gb * 0.00099) < 1e-6
    assert abs(storage["minimum_usd"] - gb * 0.00099 * 6) < 1e-6
    # three PUTs into Deep Archive at $0.05 per 1,000 (not S3 Standard's $0.005), and the
    # manifest's, priced the same way (a small overestimate)
    assert any("requests at aws" in line and "4 PUT" in line for line in cost["breakdown"])
    standard = json.loads(mcbridge("plan", src, dst, "--json", env=emulator_env, state_dir=tmp_path).stdout)
    plain = next(row for row in standard["routes"] if row["route"] == "direct")["cost"]
    assert abs((cost["requests_usd"] - plain["requests_usd"]) - 4 * (0.05 - 0.005) / 1000) < 1e-6
    assert "storage" not in plain


def test_a_replication_policy_places_each_destination(azurite, make_root, emulator_env, tmp_path):
    src = tmp_path / "ckpts"
    (src / "step-1").mkdir(parents=True)
    (src / "step-1" / "model.safetensors").write_bytes(os.urandom(2048))
    cool, hot = make_root("az") + "dr/", make_root("az") + "hot/"
    policy = tmp_path / "policies.yaml"
    policy.write_text(f"policies:\n  golden:\n    source: {src}/\n    destinations: [{cool}, {hot}]\n"
                      f"    placement:\n      {cool}: {{storage_class: Cold}}\n")
    r = mcbridge("replicate", "--policy", str(policy), "--once", "--json", env=emulator_env, state_dir=tmp_path / "s")
    assert r.returncode == 0, r.stdout + r.stderr
    tiers = {}
    for root in (cool, hot):
        loc = parse(root)
        blob = azurite.client().get_blob_client(loc.bucket, loc.key + "step-1/model.safetensors")
        tiers[root] = blob.get_blob_properties().blob_tier
    assert tiers == {cool: "Cold", hot: "Hot"}
