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

import hashlib
import hmac
import http.client
import re
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from email.utils import parsedate_to_datetime
from urllib.parse import quote, unquote_plus, urlsplit

from bridge.config import Settings
from bridge.errors import BridgeError, TransientError
from bridge.stores.base import kept_connection, receive
from bridge.urls import Location

_CODE = re.compile(rb"<Code>([^<]+)</Code>")


class Direct:
    page_size: int | None = None   # objects per listing page; None: the service's (1,000)

    def __init__(self, endpoint: str, region: str, key: str, secret: str, token: str | None, timeout: float):
        url = urlsplit(endpoint)
        self.endpoint = endpoint
        self.origin = f"{url.scheme}://{url.netloc}"
        self.netloc = url.netloc
        self.base = url.path.rstrip("/")
        self._connect = lambda: (http.client.HTTPSConnection if url.scheme == "https" else
                                 http.client.HTTPConnection)(url.hostname, url.port, timeout=timeout)
        self._signer = SigV4(key, secret, token, region, https=url.scheme == "https")
        self._local = threading.local()
        self._timeout = timeout

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
        path, headers = self._put_request(loc, data, crc32c_b64, metadata)
        with self._connection(loc) as conn:
            conn.request("PUT", path, body=data, headers=headers)
            resp = conn.getresponse()
            if resp.status >= 300:
                raise _error(loc, resp, from_code)
            resp.read()
        return _put_answer(resp.getheader)

    def _put_request(self, loc: Location, data, crc32c_b64: str, metadata: dict[str, str]) -> tuple[str, dict[str, str]]:
        path = self._path(loc)
        headers = {"Content-Length": str(len(data)), "x-amz-sdk-checksum-algorithm": "CRC32C",
                   "x-amz-checksum-crc32c": crc32c_b64,
                   **{f"x-amz-meta-{k}": v for k, v in metadata.items()}}
        self._signer.sign("PUT", self.netloc, path, "", headers, data)
        return path, headers

    def put_many(self, count: int, body: Callable[[int], tuple], each: Callable[[int, dict], None], from_code, *,
                 connections: int, retries: int) -> dict[int, BridgeError]:
        """Whole objects, ``connections`` PUTs in flight from this thread: ``body(i)`` gives
        (location, bytes, CRC32C base64, metadata) when its request is first about to go (its
        retries send the same), ``each(i, answer)`` takes what S3 answered (as ``put`` returns
        it). Failures by index, as get_many."""
        from bridge.stores.streams import each_of
        bodies: dict[int, tuple] = {}

        async def send(i: int, link) -> dict:
            if i not in bodies:
                bodies[i] = body(i)
            loc, data, crc32c_b64, metadata = bodies[i]
            path, headers = self._put_request(loc, data, crc32c_b64, metadata)
            answer = await link.send("PUT", path, headers, data, what=str(loc))
            if answer.status >= 300:
                raise _error_of(loc, answer.status, answer.body[:65536], from_code)
            del bodies[i]
            return _put_answer(lambda name: answer.headers.get(name.lower()))

        return each_of(count, send, each, self.origin, connections=connections, timeout=self._timeout,
                       retries=retries)

    def _path(self, loc: Location) -> str:
        return f"{self.base}/{quote(loc.bucket)}/{quote(loc.key, safe='/~')}"

    def _connection(self, loc: Location):
        """This thread's connection, given back for reuse only after a clean, complete exchange."""
        return kept_connection(self._local, self._connect, loc, f"the S3 endpoint {self.endpoint}")

    def _call(self, loc: Location, method: str, path: str, from_code, query: str = "",
              headers: dict[str, str] | None = None):
        """Send one request without a body: the answer, its body read (an error status raises)."""
        headers = dict(headers or {})
        self._signer.sign(method, self.netloc, path, query, headers)
        with self._connection(loc) as conn:
            conn.request(method, f"{path}?{query}" if query else path, headers=headers)
            resp = conn.getresponse()
            if resp.status >= 300:
                raise _error(loc, resp, from_code)
            return resp, resp.read()

    def get(self, loc: Location, from_code, offset: int = 0, length: int | None = None,
            into: bytearray | None = None, each=None) -> bytearray | memoryview | int:
        """Bytes [offset, offset+length) of ``loc`` (all of it when length is None), or with
        ``into`` and ``each`` handed over through ``into`` piece by piece and counted
        (bridge.stores.base.receive); ``from_code(loc, code, text)`` turns an S3 error code into
        bridge's error."""
        path = self._path(loc)
        headers = {}
        ranged = offset or length is not None
        if ranged:
            headers["Range"] = f"bytes={offset}-{'' if length is None else offset + length - 1}"
        self._signer.sign("GET", self.netloc, path, "", headers)
        with self._connection(loc) as conn:
            conn.request("GET", path, headers=headers)
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
            return receive(resp, size, loc, into, each)

    def get_many(self, locs: list[Location], each: Callable[[int, bytes], None], from_code, *,
                 connections: int, retries: int) -> dict[int, BridgeError]:
        """Whole objects, ``connections`` requests in flight from this thread
        (``bridge.stores.streams.each_of``: ``each(i, body)`` here as each arrives, failures by index)."""
        from bridge.stores.streams import each_of

        async def send(i: int, link) -> bytes:
            loc = locs[i]
            path = self._path(loc)
            headers: dict[str, str] = {}
            self._signer.sign("GET", self.netloc, path, "", headers)
            answer = await link.send("GET", path, headers, what=str(loc))
            if answer.status >= 300:
                raise _error_of(loc, answer.status, answer.body[:65536], from_code)
            return answer.body

        return each_of(len(locs), send, each, self.origin, connections=connections, timeout=self._timeout,
                       retries=retries)

    def head(self, loc: Location, from_code) -> dict:
        """HEAD one object, checksums asked for; the answer named as botocore's head_object names
        it (ContentLength, ETag, LastModified, VersionId, ChecksumCRC32C, ChecksumType, Metadata)."""
        resp, _ = self._call(loc, "HEAD", self._path(loc), from_code,
                             headers={"x-amz-checksum-mode": "ENABLED"})
        got = resp.getheader
        answer = {"ContentLength": int(got("Content-Length", "0")), "ETag": got("ETag"),
                  "VersionId": got("x-amz-version-id"), "ChecksumCRC32C": got("x-amz-checksum-crc32c"),
                  "ChecksumType": got("x-amz-checksum-type"),
                  "LastModified": parsedate_to_datetime(got("Last-Modified")) if got("Last-Modified") else None,
                  "Metadata": {name[len("x-amz-meta-"):].lower(): value for name, value in resp.getheaders()
                               if name.lower().startswith("x-amz-meta-")}}
        return {k: v for k, v in answer.items() if v is not None}

    def head_bucket(self, loc: Location, from_code) -> None:
        """HEAD the bucket of ``loc``: nothing on success, else bridge's error for the status."""
        self._call(loc, "HEAD", f"{self.base}/{quote(loc.bucket)}", from_code)

    def delete(self, loc: Location, from_code) -> None:
        self._call(loc, "DELETE", self._path(loc), from_code)

    def _list_xml(self, loc: Location, params: dict[str, str], from_code) -> tuple[ET.Element, str]:
        """GET the bucket of ``loc`` with a query; the parsed XML answer and its namespace."""
        path = f"{self.base}/{quote(loc.bucket)}"
        query = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(params.items()))
        _, body = self._call(loc, "GET", path, from_code, query=query)
        try:
            root = ET.fromstring(body)
        except ET.ParseError as exc:
            raise TransientError(f"{loc}: the listing could not be parsed ({exc})") from exc
        return root, root.tag[:root.tag.index("}") + 1] if root.tag.startswith("{") else ""

    def uploads_page(self, prefix: Location, markers: dict[str, str], from_code) -> tuple[list[tuple[str, str]], dict[str, str] | None]:
        """One page of ListMultipartUploads under ``prefix``: [(key, upload id)] and the markers
        of the next page (None: the last)."""
        params = {"uploads": "", "prefix": prefix.key, "encoding-type": "url", **markers}
        if self.page_size:
            params["max-uploads"] = str(self.page_size)
        root, ns = self._list_xml(prefix, params, from_code)
        encoded = root.findtext(f"{ns}EncodingType") == "url"
        decode = unquote_plus if encoded else (lambda key: key)
        uploads = [(decode(up.findtext(f"{ns}Key", "")), up.findtext(f"{ns}UploadId", ""))
                   for up in root.iterfind(f"{ns}Upload")]
        if root.findtext(f"{ns}IsTruncated") != "true":
            return uploads, None
        key_marker = root.findtext(f"{ns}NextKeyMarker") or ""
        if not key_marker:
            raise BridgeError(f"{prefix}: the endpoint truncated the list of uploads without saying "
                              f"where the next page starts")
        return uploads, {"key-marker": decode(key_marker),
                         "upload-id-marker": root.findtext(f"{ns}NextUploadIdMarker") or ""}

    def list_page(self, prefix: Location, token: str | None, from_code) -> tuple[list[dict[str, str]], str | None]:
        """One page of ListObjectsV2 under ``prefix`` (from ``token``): per object its Key, Size,
        ETag and LastModified as the XML gives them, and the next page's token (None: the last).
        Keys are asked for URL-encoded (a space comes back as "+"), and decoded as botocore
        decodes them, so that any key survives XML."""
        params = {"list-type": "2", "prefix": prefix.key, "encoding-type": "url"}
        if self.page_size:
            params["max-keys"] = str(self.page_size)
        if token:
            params["continuation-token"] = token
        root, ns = self._list_xml(prefix, params, from_code)
        encoded = root.findtext(f"{ns}EncodingType") == "url"
        items = []
        for item in root.iterfind(f"{ns}Contents"):
            key = item.findtext(f"{ns}Key", "")
            items.append({"Key": unquote_plus(key) if encoded else key, "Size": item.findtext(f"{ns}Size", "0"),
                          "ETag": item.findtext(f"{ns}ETag", ""),
                          "LastModified": item.findtext(f"{ns}LastModified", ""),
                          "StorageClass": item.findtext(f"{ns}StorageClass", "")})
        following = root.findtext(f"{ns}NextContinuationToken")
        if root.findtext(f"{ns}IsTruncated") != "true":
            return items, None
        if not following:
            raise BridgeError(f"{prefix}: the endpoint truncated the listing without saying where "
                              f"the next page starts")
        return items, following


def _put_answer(header: Callable[[str], str | None]) -> dict[str, str]:
    """A PUT's answer named as botocore names it (ETag, VersionId, ChecksumCRC32C)."""
    answer = {"ETag": header("ETag"), "VersionId": header("x-amz-version-id"),
              "ChecksumCRC32C": header("x-amz-checksum-crc32c")}
    return {k: v for k, v in answer.items() if v}


def _error(loc: Location, resp, from_code) -> BridgeError:
    return _error_of(loc, resp.status, resp.read(65536), from_code)


def _error_of(loc: Location, status: int, body: bytes, from_code) -> BridgeError:
    code = _CODE.search(body)
    if status >= 500 and not code:
        return TransientError(f"{loc}: S3 answered HTTP {status}")
    return from_code(loc, code.group(1).decode() if code else str(status), f"HTTP {status}")


_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


class SigV4:
    """AWS Signature Version 4 for S3, as botocore's S3SigV4Auth makes it (tests/test_s3direct.py
    compares the two on the same request), at a fraction of its Python per request: the signing
    key is derived once a day, and the request is ours, so its headers need no normalising.
    Every header sent is signed. The payload's SHA-256 is signed over plain HTTP; over HTTPS,
    like botocore when a checksum header is sent, the payload is UNSIGNED-PAYLOAD (TLS and the
    CRC32C S3 checks cover the body)."""

    def __init__(self, key: str, secret: str, token: str | None, region: str, https: bool):
        self.key, self._secret, self.token, self.region, self.https = key, secret, token, region, https
        self._day = ""
        self._signing_key = b""

    def _key_for(self, day: str) -> bytes:
        if day != self._day:
            k = hmac.digest(("AWS4" + self._secret).encode(), day.encode(), "sha256")
            for part in (self.region, "s3", "aws4_request"):
                k = hmac.digest(k, part.encode(), "sha256")
            self._signing_key, self._day = k, day
        return self._signing_key

    def sign(self, method: str, host: str, path: str, query: str, headers: dict[str, str],
             body: bytes | bytearray | memoryview | None = None, now: float | None = None) -> None:
        """Add Host, x-amz-date, x-amz-content-sha256, the token and Authorization to ``headers``.
        ``path`` is sent as given (already percent-encoded), ``query`` in canonical form
        (sorted, encoded)."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
        day = stamp[:8]
        if body is not None and not self.https:
            payload = hashlib.sha256(body).hexdigest()
        elif body is not None:
            payload = "UNSIGNED-PAYLOAD"
        else:
            payload = _EMPTY_SHA256
        headers["Host"] = host   # sent as signed (http.client then adds none of its own)
        headers["x-amz-date"] = stamp
        headers["x-amz-content-sha256"] = payload
        if self.token:
            headers["x-amz-security-token"] = self.token
        signed = sorted((k.lower(), " ".join(str(v).split())) for k, v in headers.items())
        names = ";".join(k for k, _ in signed)
        canonical = "\n".join((method, path, query, "".join(f"{k}:{v}\n" for k, v in signed), names, payload))
        scope = f"{day}/{self.region}/s3/aws4_request"
        to_sign = f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        signature = hmac.new(self._key_for(day), to_sign.encode(), "sha256").hexdigest()
        headers["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={self.key}/{scope}, "
                                    f"SignedHeaders={names}, Signature={signature}")
