"""GCS V4 signed URLs (bridge/stores/gcs.py ``_signed_v4``) against google-cloud-storage's own
signer, with a service-account key made for the test: the emulator accepts any URL, so this is
where the signature itself is checked."""

from __future__ import annotations

import datetime
import json
from urllib.parse import parse_qs, urlsplit

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.cloud.storage._signing import generate_signed_url_v4
from google.oauth2 import service_account

from bridge.stores.gcs import _signed_v4
from bridge.urls import Location


def _credentials():
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    info = {"type": "service_account", "project_id": "p", "private_key_id": "k1", "private_key": pem,
            "client_email": "bridge@p.iam.gserviceaccount.com", "client_id": "1",
            "token_uri": "https://oauth2.googleapis.com/token"}
    return service_account.Credentials.from_service_account_info(json.loads(json.dumps(info)))


def test_v4_signature_is_the_one_google_cloud_storage_makes():
    creds = _credentials()
    now = datetime.datetime(2026, 12, 1, 2, 3, 4, tzinfo=datetime.timezone.utc)
    loc = Location("gs", "my-bucket", "dir/ünï cödé+name~.bin")
    ours = urlsplit(_signed_v4(creds, "https://storage.googleapis.com", loc, 900, now=now))
    theirs = urlsplit(generate_signed_url_v4(creds, "/my-bucket/dir/%C3%BCn%C3%AF%20c%C3%B6d%C3%A9%2Bname~.bin",
                                             900, api_access_endpoint="https://storage.googleapis.com",
                                             _request_timestamp="20261201T020304Z"))
    assert (ours.scheme, ours.netloc, ours.path) == (theirs.scheme, theirs.netloc, theirs.path)
    assert parse_qs(ours.query) == parse_qs(theirs.query)
