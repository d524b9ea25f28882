"""Create buckets on the local stack's emulators (docker-compose.yml's "buckets" service).

    python deploy/local/buckets.py s3://demo-src gs://demo-dr az://demo-dr

Clients are configured from the standard variables the compose file sets (AWS_ENDPOINT_URL,
STORAGE_EMULATOR_HOST, AZURE_STORAGE_CONNECTION_STRING); an existing bucket is left as it is.
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


def main() -> None:
    for url in sys.argv[1:]:
        for attempt in range(30):  # the emulators may still be starting
            try:
                create(url)
                break
            except Exception as exc:  # noqa: BLE001 - any failure here means "not up yet"
                if attempt == 29:
                    raise SystemExit(f"{url}: {exc}")
                time.sleep(1)


if __name__ == "__main__":
    main()
