"""S3 GETs and PUTs without the event loop: one keep-alive http.client connection per thread, requests
signed with botocore's own SigV4 signer, the body read straight into the buffer that is returned.

Why: a profile of a 1 GiB download (issue 13) had aiobotocore's single event-loop thread do
everything for every request at once: parse HTTP, copy each chunk out of the parser, copy it
again into the part's buffer, zero-fill new buffers. Here each thread of the engine reads its own
response with ``readinto`` (one copy, from the socket into the buffer) while the GIL is free, and
a small object costs one signature and one request instead of a trip through the loop. Measured
against ``rclone serve s3``: see bench/README.md.

A PUT carries the same checks as the SDK's: the CRC32C header S3 verifies the body against,
the metadata, and (over plain HTTP) the payload's SHA-256 in the signature. Multipart uploads
and everything else stay on aiobotocore. Used only where it is plainly equivalent: an explicit endpoint (path-style
addressing, as botocore uses for one) and static keys. Credentials from a profile, SSO or instance
metadata keep the aiobotocore path, which knows how to refresh them. Failures are raised as
bridge's errors, through the same codes as the store's own translation; nothing is retried here
(the store retries each call through bridge.retry, the one retry layer).
"""

from __future__ import annotations

import http.client
import re
import threading
from contextlib import contextmanager
from urllib.parse import quote, urlsplit

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from bridge.config import Settings
from bridge.errors import BridgeError, EndpointUnreachable, TransientError
from bridge.urls import Location

_CODE = re.compile(rb"<Code>([^<]+)</Code>")


class Direct:
    def __init__(self, endpoint: str, region: str, key: str, secret: str, token: str | None, timeout: float):
        url = urlsplit(endpoint)
        self.endpoint = endpoint
        self.origin = f"{url.scheme}://{url.netloc}"
        self.base = url.path.rstrip("/")
        self._connect = lambda: (http.client.HTTPSConnection if url.scheme == "https" else
                                 http.client.HTTPConnection)(url.hostname, url.port, timeout=timeout)
        self._signer = S3SigV4Auth(Credentials(key, secret, token), "s3", region)
        self._local = threading.local()

    @classmethod
    def for_settings(cls, settings: Settings) -> Direct | None:
        s3 = settings.s3
        if not (s3.endpoint_url and s3.access_key_id and s3.secret_access_key) or s3.profile:
            return None
        token = s3.session_token.get_secret_value() if s3.session_token else None
        return cls(s3.endpoint_url, s3.region or "us-east-1", s3.access_key_id,
                   s3.secret_access_key.get_secret_value(), token, settings.transfer.read_timeout)

    def put(self, loc: Location, data: bytes | bytearray, crc32c_b64: str, metadata: dict[str, str],
            from_code) -> dict[str, str]:
        """PUT one object; what S3 answered, named as botocore names it (ETag, VersionId,
        ChecksumCRC32C), for the store to make its ObjectInfo of."""
        path = self._path(loc)
        headers = {"Content-Length": str(len(data)), "x-amz-sdk-checksum-algorithm": "CRC32C",
                   "x-amz-checksum-crc32c": crc32c_b64,
                   **{f"x-amz-meta-{k}": v for k, v in metadata.items()}}
        request = AWSRequest("PUT", self.origin + path, headers=headers, data=data)
        self._signer.add_auth(request)
        with self._connection(loc) as conn:
            conn.request("PUT", path, body=data, headers=dict(request.headers.items()))
            resp = conn.getresponse()
            if resp.status >= 300:
                raise _error(loc, resp, from_code)
            resp.read()
        answer = {"ETag": resp.getheader("ETag"), "VersionId": resp.getheader("x-amz-version-id"),
                  "ChecksumCRC32C": resp.getheader("x-amz-checksum-crc32c")}
        return {k: v for k, v in answer.items() if v}

    def _path(self, loc: Location) -> str:
        return f"{self.base}/{quote(loc.bucket)}/{quote(loc.key, safe='/~')}"

    @contextmanager
    def _connection(self, loc: Location):
        """This thread's connection, given back for reuse only after a clean, complete exchange."""
        conn = getattr(self._local, "conn", None) or self._connect()
        self._local.conn = None
        try:
            yield conn
        except ConnectionRefusedError as exc:
            conn.close()
            raise EndpointUnreachable(f"cannot reach the S3 endpoint {self.endpoint}: {type(exc).__name__}") from exc
        except (http.client.HTTPException, OSError) as exc:
            conn.close()
            raise TransientError(f"{loc}: connection dropped ({type(exc).__name__}: {exc})") from exc
        except BaseException:
            conn.close()
            raise
        self._local.conn = conn

    def get(self, loc: Location, from_code, offset: int = 0, length: int | None = None) -> bytearray:
        """Bytes [offset, offset+length) of ``loc`` (all of it when length is None);
        ``from_code(loc, code, text)`` turns an S3 error code into bridge's error."""
        path = self._path(loc)
        headers = {}
        ranged = offset or length is not None
        if ranged:
            headers["Range"] = f"bytes={offset}-{'' if length is None else offset + length - 1}"
        request = AWSRequest("GET", self.origin + path, headers=headers)
        self._signer.add_auth(request)
        with self._connection(loc) as conn:
            conn.request("GET", path, headers=dict(request.headers.items()))
            resp = conn.getresponse()
            if resp.status >= 300:
                raise _error(loc, resp, from_code)
            # Some endpoints (rclone serve s3) answer a range with 200 and a Content-Range: the
            # range is what counts, not the status.
            got_range = resp.getheader("Content-Range", "")
            if ranged and not got_range.startswith(f"bytes {offset}-"):
                raise BridgeError(f"{loc}: the endpoint ignored the byte range asked for "
                                  f"(HTTP {resp.status}, Content-Range {got_range!r})")
            size = int(resp.getheader("Content-Length", "-1"))
            if size < 0 or (length is not None and size != length):
                raise TransientError(f"{loc}: the endpoint announced {size} bytes, asked for {length}")
            buf = bytearray(size)
            view, pos = memoryview(buf), 0
            while pos < size:
                got = resp.readinto(view[pos:])
                if not got:
                    raise TransientError(f"{loc}: connection closed after {pos} of {size} bytes")
                pos += got
        return buf


def _error(loc: Location, resp, from_code) -> BridgeError:
    code = _CODE.search(resp.read(65536))
    if resp.status >= 500 and not code:
        return TransientError(f"{loc}: S3 answered HTTP {resp.status}")
    return from_code(loc, code.group(1).decode() if code else str(resp.status), f"HTTP {resp.status}")
