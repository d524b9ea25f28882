"""Create buckets on the local stack's emulators (docker-compose.yml's "buckets" service), and
seed a checkpoint for the quickstart to copy.

    python deploy/local/buckets.py s3://demo-src gs://demo-dr az://demo-dr --seed s3://demo-src/golden/step-1000/

Clients are configured from the standard variables the compose file sets (AWS_ENDPOINT_URL,
STORAGE_EMULATOR_HOST, AZURE_STORAGE_CONNECTION_STRING); an existing bucket is left as it is.
``--seed S3_PREFIX`` writes a small checkpoint there (two shards and a config), then its
``COMMITTED`` marker last, as a trainer would (deploy/local/policies.yaml waits for it); a
checkpoint already seeded is left as it is.
"""

from __future__ import annotations

import os
import sys
import time


def create(url: str) -> None:
    scheme, _, name = url.partition("://")
    name = name.strip("/")
    if scheme == "s3":
        import boto3
        client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
        if name not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
            client.create_bucket(Bucket=name)
    elif scheme == "gs":
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage
        client = storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT", "local"),
                                credentials=AnonymousCredentials(),
                                client_options={"api_endpoint": os.environ["STORAGE_EMULATOR_HOST"]})
        if client.lookup_bucket(name) is None:
            client.create_bucket(name)
    elif scheme == "az":
        from azure.storage.blob import BlobServiceClient
        service = BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"])
        if not service.get_container_client(name).exists():
            service.create_container(name)
    else:
        raise SystemExit(f"{url}: use s3://, gs:// or az://")
    print(f"bucket {url} ready")


SEED = {"shard-0.bin": 256 * 1024, "shard-1.bin": 256 * 1024, "config.json": 0}
MARKER = "COMMITTED"


def seed(url: str) -> None:
    scheme, _, rest = url.partition("://")
    bucket, _, prefix = rest.partition("/")
    if scheme != "s3" or not prefix.endswith("/"):
        raise SystemExit(f"--seed {url}: give an s3:// prefix ending in '/'")
    import boto3
    client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    if client.list_objects_v2(Bucket=bucket, Prefix=prefix + MARKER).get("KeyCount", 0):
        print(f"checkpoint {url} already seeded")
        return
    for name, size in SEED.items():
        body = os.urandom(size) if size else b'{"model": "demo", "step": 1000}\n'
        client.put_object(Bucket=bucket, Key=prefix + name, Body=body)
    client.put_object(Bucket=bucket, Key=prefix + MARKER, Body=b"")
    print(f"checkpoint {url} seeded")


def retried(step, url: str) -> None:
    for attempt in range(30):  # the emulators may still be starting
        try:
            step(url)
            return
        except SystemExit:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure here means "not up yet"
            if attempt == 29:
                raise SystemExit(f"{url}: {exc}")
            time.sleep(1)


def main() -> None:
    args = sys.argv[1:]
    seeds = [args[i + 1] for i, arg in enumerate(args) if arg == "--seed" and i + 1 < len(args)]
    buckets = [arg for i, arg in enumerate(args) if arg != "--seed" and (i == 0 or args[i - 1] != "--seed")]
    for url in buckets:
        retried(create, url)
    for url in seeds:
        retried(seed, url)


if __name__ == "__main__":
    main()
