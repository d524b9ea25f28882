"""AWS's own S3 endpoint, as bridge's direct path meets it, inside a private network namespace.

    unshare --net --mount python -m tests.aws_namespace WORKDIR

(tests/test_s3_aws_endpoint.py runs it.) Inside the namespace only loopback exists: this
module brings it up, lays a hosts file over /etc/hosts that sends AWS's S3 host names
(``s3.amazonaws.com``, ``s3.REGION.amazonaws.com`` and ``BUCKET.s3.REGION.amazonaws.com`` for
the buckets below) to 127.0.0.1, and serves moto there on port 443 over HTTPS, with a
certificate of a test CA for ``*.s3.REGION.amazonaws.com``. Port 443 and the host names are the
namespace's own: nothing outside it is touched or assumed. Then bridge runs with no endpoint
set, as it runs against AWS: each bucket's requests go to the host of the region S3 names for
it, a bucket whose name has a dot path-style; a host not in the hosts file fails to resolve, so a
request sent anywhere else fails the run. It prints what it checked; any failure exits non-zero.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from tests.emulators import LocalCA, TLSMotoServer

REGIONS = ("us-east-1", "eu-west-1")
BUCKETS = {"bkt-use1": "us-east-1", "bkt-euw1": "eu-west-1", "dotted.bkt-euw1": "eu-west-1"}
PATH_ONLY = "bkt-path"   # in eu-west-1, no host of its own in the hosts file: reached path-style only
KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


class AWSMoto(TLSMotoServer):
    """moto on the namespace's port 443, as S3's hosts answer."""

    fixed_port = 443


def hosts() -> list[str]:
    names = ["s3.amazonaws.com", *(f"s3.{r}.amazonaws.com" for r in REGIONS)]
    for bucket, region in BUCKETS.items():
        if "." not in bucket:
            # asked for its region at the configured region's host, then used at its own; botocore
            # (multipart uploads, copies) names a us-east-1 bucket at the global host
            names += [f"{bucket}.s3.us-east-1.amazonaws.com", f"{bucket}.s3.{region}.amazonaws.com",
                      f"{bucket}.s3.amazonaws.com"]
    return sorted(set(names))


def enter(work: Path) -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    hosts_file = work / "hosts"
    hosts_file.write_text("127.0.0.1 localhost\n" + "".join(f"127.0.0.1 {name}\n" for name in hosts()))
    subprocess.run(["mount", "--bind", str(hosts_file), "/etc/hosts"], check=True)


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "_bridge" not in p.parts}


def main() -> None:
    work = Path(sys.argv[1])
    enter(work)
    names = [*hosts(), *(f"*.s3.{r}.amazonaws.com" for r in REGIONS), "*.s3.amazonaws.com", "127.0.0.1"]
    ca = LocalCA(work / "ca", hosts=tuple(names))
    moto = AWSMoto(ca).start()
    try:
        import boto3
        client = boto3.client("s3", endpoint_url="https://s3.amazonaws.com", region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing", verify=str(ca.ca_file))
        for bucket, region in {**BUCKETS, PATH_ONLY: "eu-west-1"}.items():
            extra = {} if region == "us-east-1" else {"CreateBucketConfiguration": {"LocationConstraint": region}}
            client.create_bucket(Bucket=bucket, **extra)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MCBRIDGE_", "BRIDGE_"))}
        env.update(KEYS, AWS_DEFAULT_REGION="us-east-1", AWS_CA_BUNDLE=str(ca.ca_file),
                   AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=str(work / "no-config"),
                   AWS_SHARED_CREDENTIALS_FILE=str(work / "no-credentials"),
                   MCBRIDGE_STATE_DIR=str(work / "state"), XDG_CONFIG_HOME=str(work / "config"))
        os.environ.clear()
        os.environ.update(env)

        # the store: no endpoint set, so AWS's; each bucket at its own region's host
        from bridge import meter
        from bridge.config import load_settings
        from bridge.hashing import crc32c, crc_hex
        from bridge.stores import get_store
        from bridge.stores.s3direct import Direct
        from bridge.urls import parse
        settings = load_settings({})
        assert settings.s3.endpoint_url is None
        for bucket, region in BUCKETS.items():
            store = get_store(parse(f"s3://{bucket}/"), settings)
            assert isinstance(store._direct, Direct) and store._direct.aws, "AWS's endpoint is not on the direct path"
            loc = parse(f"s3://{bucket}/probe/one.txt")
            counted = meter.Meter()
            with meter.metering(counted):
                store.put(loc, b"first object\n", crc32c=crc_hex(crc32c(b"first object\n")), metadata={})
                assert bytes(store.read(loc)) == b"first object\n" and store.info(loc).size == 13
                assert [info.location.key for info in store.list(parse(f"s3://{bucket}/probe/"))] == ["probe/one.txt"]
            # each request counted against its bucket, whether the bucket named the host or the path
            # (the HEAD that asked for the bucket's region included)
            assert counted.to_dict()[f"s3://{bucket}"]["requests"] == {"GET": 1, "HEAD": 2, "LIST": 1, "PUT": 1}, \
                counted.to_dict()
            host = store._direct._host(bucket)
            want = (f"https://s3.{region}.amazonaws.com" if "." in bucket
                    else f"https://{bucket}.s3.{region}.amazonaws.com")
            assert (host.origin, host.region) == (want, region), (bucket, host.origin, host.region)
            assert store.bucket_region(loc) == region
            print(f"{bucket}: {region}, requests to {host.origin}{host.bucket_path(bucket) or '/'}")

        # path-style when asked: every bucket at its region's host, a bucket whose own host does
        # not resolve included
        store = get_store(parse(f"s3://{PATH_ONLY}/"), load_settings({"s3": {"addressing_style": "path"}}))
        loc = parse(f"s3://{PATH_ONLY}/probe/one.txt")
        store.put(loc, b"path-style\n", crc32c=crc_hex(crc32c(b"path-style\n")), metadata={})
        assert [info.location.key for info in store.list(parse(f"s3://{PATH_ONLY}/probe/"))] == ["probe/one.txt"]
        host = store._direct._host(PATH_ONLY)
        assert (host.origin, host.bucket_path(PATH_ONLY)) == ("https://s3.eu-west-1.amazonaws.com", f"/{PATH_ONLY}")
        print(f"{PATH_ONLY}, path-style as asked: requests to {host.origin}{host.bucket_path(PATH_ONLY)}")

        # the CLI: a tree with a multipart file up to a bucket in another region and back, verified
        src, back = work / "src", work / "back"
        for i in range(40):
            (src / f"d{i % 4}").mkdir(parents=True, exist_ok=True)
            (src / f"d{i % 4}" / f"f{i:03d}.bin").write_bytes(os.urandom(3000 + i))
        (src / "ckpt.bin").write_bytes(os.urandom(12 * 1024 * 1024))
        mcbridge = [sys.executable, "-m", "bridge"]
        for cmd in (["cp", f"{src}/", "s3://bkt-euw1/tree/", "--chunk-size", "5MiB", "-q"],
                    ["verify", "s3://bkt-euw1/tree/"],
                    ["cp", "s3://bkt-euw1/tree/", f"{back}/", "-q"],
                    ["cp", "s3://bkt-euw1/tree/", "s3://dotted.bkt-euw1/copy/", "-q"],
                    ["verify", "s3://dotted.bkt-euw1/copy/"]):
            run = subprocess.run([*mcbridge, *cmd], env=env, capture_output=True, text=True)
            assert run.returncode == 0, (cmd, run.stdout[-2000:], run.stderr[-2000:])
            print(f"mcbridge {' '.join(cmd[:3])}: ok")
        # and the CLI path-style, a multipart upload included (aiobotocore is told too)
        for cmd in (["cp", f"{src}/", f"s3://{PATH_ONLY}/tree/", "--chunk-size", "5MiB", "-q"],
                    ["verify", f"s3://{PATH_ONLY}/tree/"]):
            run = subprocess.run([*mcbridge, *cmd], env={**env, "MCBRIDGE_S3_ADDRESSING_STYLE": "path"},
                                 capture_output=True, text=True)
            assert run.returncode == 0, (cmd, run.stdout[-2000:], run.stderr[-2000:])
            print(f"mcbridge {' '.join(cmd[:3])}: ok")
        assert tree(back) == tree(src), "the tree came back different"
        print(f"{len(tree(src))} files up to eu-west-1 and back: identical")
    finally:
        moto.stop()


if __name__ == "__main__":
    main()
