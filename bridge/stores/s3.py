"""Amazon S3 (and S3-compatible endpoints) over s3fs/aiobotocore.

Multipart uploads carry a CRC32C per part, which S3 checks on arrival; the completed object is
asked for a FULL_OBJECT CRC32C, which S3 checks against the whole file's CRC32C we send.
"""

from __future__ import annotations

import errno
import functools
import http.client
import importlib.util
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from types import SimpleNamespace

from bridge import attributes
from bridge.attributes import Attrs
from bridge.meter import Pool
from bridge import meter
from bridge.config import Settings
from bridge.errors import (BridgeError, BucketNotFound, ClockSkewed, CredentialsMissing, EndpointUnreachable,
                           IntegrityError, ObjectNotFound, PermissionDenied, TransientError, Unsupported)
from bridge.hashing import crc_hex
from bridge.retry import call_with_retries
from bridge.stores.base import (DELETES_PER_REQUEST, put_args, raise_refused_deletions, GiB, MiB, BufferReader, Features, ObjectInfo, PartRecord, Store, crc_b64_to_hex,
                                crc_hex_to_b64, is_reserved, utc_seconds)
from bridge.urls import Location

# The SDK stack (s3fs, aiobotocore, botocore, aiohttp) is imported when first needed: jobs that
# the direct path (s3direct.py) serves whole never need it, and importing it is a large part of
# a short job's start-up. Here only that it is installed is checked (the registry turns an
# ImportError into an install hint).
for _module in ("s3fs", "aiobotocore", "botocore", "aiohttp"):
    if importlib.util.find_spec(_module) is None:
        raise ImportError(f"No module named {_module!r}", name=_module)

# characters XML 1.0 cannot carry in an element (a carriage return it would read as a newline)
_XML_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\ufffe\uffff]")
_THROTTLE_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout",
                   "InternalError", "ServiceUnavailable", "503", "500", "502", "504"}


_SDK_LOCK = threading.Lock()


def _sdk():
    """``_load_sdk()``, imported by one thread at a time (two threads importing an SDK's modules
    at once can meet in Python's module locks: _DeadlockError)."""
    with _SDK_LOCK:
        return _load_sdk()


@functools.cache
def _load_sdk():
    """The SDK's modules, and the errors that mean a dropped connection or a body cut short:
    from botocore (ReadTimeoutError, ConnectionClosedError, ResponseStreamingError are
    HTTPClientErrors), from aiohttp under aiobotocore, or the stdlib."""
    import aiohttp
    import botocore.exceptions as bce
    from botocore.parsers import ResponseParserError
    import s3fs
    from xml.etree.ElementTree import ParseError   # a 503 to GetBucketLocation has no XML for its handler
    dropped = (bce.HTTPClientError, ResponseParserError, ParseError, aiohttp.ClientPayloadError,
               aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, http.client.IncompleteRead,
               TimeoutError, ConnectionResetError, ConnectionAbortedError, BrokenPipeError)   # asyncio.TimeoutError is TimeoutError (3.11)
    return SimpleNamespace(bce=bce, s3fs=s3fs, dropped=dropped)


def _code(exc: BaseException) -> str | None:
    """The S3 error code of a ClientError, or of the OSError s3fs made of one."""
    bce = _sdk().bce
    for e in (exc, exc.__cause__):
        if isinstance(e, bce.ClientError):
            return e.response.get("Error", {}).get("Code", "")
    return None


@contextmanager
def _translate(loc: Location, endpoint: str | None):
    try:
        yield
    except BridgeError:
        raise
    except Exception as exc:
        translated = _translation(loc, endpoint, exc)
        if translated is None:
            raise
        raise translated from exc


def _translation(loc: Location, endpoint: str | None, exc: Exception) -> BridgeError | None:
    """bridge's error for an SDK's or the system's, or None to let it through as it is."""
    sdk = _sdk()
    bce = sdk.bce
    if isinstance(exc, (bce.NoCredentialsError, bce.PartialCredentialsError)):
        return CredentialsMissing("no AWS credentials found: set AWS_ACCESS_KEY_ID and "
                                  "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE")
    if isinstance(exc, bce.SSLError):   # not retried: the endpoint will not prove itself next time either
        return BridgeError(f"the S3 endpoint {endpoint or 'of AWS'} did not prove who it is: {exc}")
    if isinstance(exc, (bce.EndpointConnectionError, bce.ConnectTimeoutError, ConnectionRefusedError)):
        return EndpointUnreachable(f"cannot reach the S3 endpoint {endpoint or 'of AWS'}: {type(exc).__name__}")
    if isinstance(exc, sdk.dropped):
        return TransientError(f"{loc}: connection dropped ({type(exc).__name__})")
    if not isinstance(exc, (bce.ClientError, OSError)):
        return None
    code = _code(exc)
    if code is not None:
        return _from_code(loc, code, str(exc))
    if isinstance(exc, FileNotFoundError):
        if "bucket" in str(exc).lower():
            return BucketNotFound(f"bucket {loc.bucket!r} does not exist")
        return ObjectNotFound(f"{loc}: no such object")
    if isinstance(exc, PermissionError):
        return PermissionDenied(f"{loc}: access denied ({exc})")
    if isinstance(exc, OSError) and exc.errno in (errno.ETIMEDOUT, errno.ECONNRESET, errno.EBUSY, errno.EAGAIN):
        return TransientError(f"{loc}: {exc}")
    return BridgeError(f"{loc}: {exc}")


def _from_code(loc: Location, code: str, text: str) -> BridgeError:
    if code in ("NoSuchBucket",):
        return BucketNotFound(f"bucket {loc.bucket!r} does not exist")
    if code in ("NoSuchKey", "404", "NotFound"):
        return ObjectNotFound(f"{loc}: no such object")
    if code == "NoSuchUpload":
        return UploadGone(f"{loc}: the multipart upload no longer exists")
    if code == "RequestTimeTooSkewed":
        return ClockSkewed("S3 refused the request because this machine's clock differs from the "
                           "service's by more than 15 minutes: set the clock (NTP) and run again")
    if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "Forbidden"):
        return PermissionDenied(f"{loc}: access denied ({code})")
    if code in _THROTTLE_CODES:
        return TransientError(f"{loc}: {code}")
    if code in ("NotImplemented", "501"):
        return Unsupported(f"{loc}: the S3 endpoint does not implement this request ({code})")
    if code == "InvalidObjectState":
        return BridgeError(f"{loc}: archived (Glacier or Deep Archive): restore it before it can be read")
    if code in ("BadDigest", "InvalidDigest", "XAmzContentChecksumMismatch"):
        return IntegrityError(f"{loc}: S3 rejected the bytes as not matching their checksum ({code})")
    return BridgeError(f"{loc}: S3 error {code or text}")


COPY_PART = 512 * MiB   # UploadPartCopy part size, for copies over max_copy_size
SEEN = 4096             # whole-object GETs whose headers are kept for attributes()
_HEADER_NAMES = tuple((name, attributes.HTTP_NAMES[name].lower()) for name in attributes.HEADERS)


class UploadGone(ObjectNotFound):
    """NoSuchUpload: aborted, expired, or completed by an earlier attempt whose answer was lost."""


class S3Store(Store):
    scheme = "s3"
    features = Features(checksums=frozenset({"crc32c"}), min_part_size=5 * MiB,
                        max_part_size=5 * GiB, max_parts=10_000, max_object_size=5 * 1024 * GiB,
                        max_copy_size=5 * GiB)

    def __init__(self, settings: Settings):
        self.settings = settings
        s3, t = settings.s3, settings.transfer
        self.endpoint = s3.endpoint_url
        from bridge.stores.s3direct import Direct
        self._direct = Direct.for_settings(settings)  # None: reads go through aiobotocore
        # Headers and metadata seen on whole-object GETs, until attributes() takes them: copying
        # them then costs no HEAD. Bounded: objects read for other reasons are forgotten.
        self._seen: OrderedDict[str, Attrs] = OrderedDict()
        self._seen_lock = threading.Lock()
        if self._direct is not None:
            self._direct.on_headers = self._remember
        self._fs = None
        self._fs_lock = threading.Lock()
        self.retries = t.retries

    @property
    def fs(self):
        """The s3fs/aiobotocore client, built on first use."""
        with self._fs_lock:
            if self._fs is None:
                s3, t = self.settings.s3, self.settings.transfer
                # A session of our own, so that every request botocore sends is metered (bridge/meter.py).
                from aiobotocore.session import AioSession
                session = AioSession(profile=s3.profile) if s3.profile else AioSession()
                meter.botocore_hooks(session)
                fs = _sdk().s3fs.S3FileSystem(
                    session=session,
                    key=s3.access_key_id,
                    secret=s3.secret_access_key.get_secret_value() if s3.secret_access_key else None,
                    token=s3.session_token.get_secret_value() if s3.session_token else None,
                    profile=s3.profile,
                    endpoint_url=s3.endpoint_url,
                    # The region the direct path signs for (a profile's, when the settings name
                    # none) and the CA bundle it verifies with (None: botocore's own choice).
                    client_kwargs={"region_name": self._direct.region if self._direct else s3.region or "us-east-1",
                                   "verify": self._direct.cafile if self._direct else s3.ca_bundle or t.ca_bundle},
                    # bridge.retry is the one retry layer: botocore sends each request once.
                    config_kwargs={"retries": {"total_max_attempts": 1, "mode": "standard"},
                                   "connect_timeout": t.connect_timeout, "read_timeout": t.read_timeout,
                                   "max_pool_connections": max(10, t.concurrency * 2),
                                   "request_checksum_calculation": "when_required",
                                   "response_checksum_validation": "when_required",
                                   **({"s3": {"addressing_style": "path"}} if s3.addressing_style == "path" else {})},
                    skip_instance_cache=True,
                    use_listings_cache=False,
                )
                fs.retries = 1  # s3fs's own retry loop: one pass, no retry
                self._fs = fs
            return self._fs

    def _request(self, loc: Location, fn, recovered=None):
        def once():
            with _translate(loc, self.endpoint):
                return fn()
        return call_with_retries(once, self.retries, recovered=recovered, where=self.endpoint or "AWS S3")

    def _call(self, loc: Location, method: str, recovered=None, **kwargs):
        def send():
            body = kwargs.get("Body")
            if hasattr(body, "seek"):
                body.seek(0)  # a retry sends the body again from its start
            return self.fs.call_s3(method, **kwargs)
        return self._request(loc, send, recovered)

    def list(self, prefix: Location) -> Iterator[ObjectInfo]:
        if self._direct is not None:
            yield from self._direct_list(prefix)
            return
        token = None
        while True:
            kw = {"Bucket": prefix.bucket, "Prefix": prefix.key}
            if token:
                kw["ContinuationToken"] = token
            page = self._call(prefix, "list_objects_v2", **kw)
            for item in page.get("Contents", []):
                yield _listed(prefix.bucket, item)
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    def list_level(self, prefix: Location) -> Iterator[ObjectInfo | Location]:
        """ListObjectsV2 with Delimiter='/': the objects at this level and CommonPrefixes."""
        if self._direct is not None:
            yield from self._direct_list(prefix, level=True)
            return
        token = None
        while True:
            kw = {"Bucket": prefix.bucket, "Prefix": prefix.key, "Delimiter": "/"}
            if token:
                kw["ContinuationToken"] = token
            page = self._call(prefix, "list_objects_v2", **kw)
            for item in page.get("Contents", []):
                yield _listed(prefix.bucket, item)
            for common in page.get("CommonPrefixes", []):
                yield Location("s3", prefix.bucket, common["Prefix"])
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    def _direct_list(self, prefix: Location, level: bool = False) -> Iterator[ObjectInfo | Location]:
        token = None
        made = _Lister(prefix.bucket)
        while True:
            (objects, prefixes), token = self._request(
                prefix, lambda: self._direct.list_page(prefix, token, _from_code, level))
            for item in objects:
                yield made(*item)
            for key in prefixes:
                yield Location("s3", prefix.bucket, key)
            if token is None:
                return

    def info(self, loc: Location) -> ObjectInfo:
        if self._direct is not None:
            head = self._request(loc, lambda: self._direct.head(loc, _from_code))
        else:
            head = self._call(loc, "head_object", Bucket=loc.bucket, Key=loc.key, ChecksumMode="ENABLED")
        sums = {}
        kind = head.get("ChecksumType", "FULL_OBJECT")
        for name in ("CRC32C", "CRC64NVME", "CRC32"):
            value = head.get(f"Checksum{name}")
            if value and "-" not in value and kind == "FULL_OBJECT":
                sums[name.lower()] = crc_b64_to_hex(value)
        metadata = dict(head.get("Metadata", {}))
        attrs = Attrs(**{name: head.get(_SDK_HEADERS[name]) or None for name in attributes.HEADERS},
                      user=attributes.from_s3(metadata))
        cls = head.get("StorageClass") or "STANDARD"
        return ObjectInfo(loc, int(head["ContentLength"]), sums, metadata, _identity(head), attrs, cls,
                          _needs_restore(cls, head.get("Restore")), modified=_when(head))

    def read(self, loc: Location, offset: int = 0, length: int | None = None) -> bytes:
        kw = {"Bucket": loc.bucket, "Key": loc.key}
        if offset or length is not None:
            end = "" if length is None else str(offset + length - 1)
            if length == 0:
                return b""
            kw["Range"] = f"bytes={offset}-{end}"
        if self._direct is not None:
            return self._request(loc, lambda: self._direct.get(loc, _from_code, offset, length))

        def get():  # a body cut short is read again with its request
            resp = self.fs.call_s3("get_object", **kw)
            return _sync_read(self.fs, resp["Body"], int(resp["ContentLength"]))
        return self._request(loc, get)

    def read_through(self, loc: Location, offset: int, length: int, buf: bytearray, each) -> int:
        if self._direct is None or not length:
            return super().read_through(loc, offset, length, buf, each)
        return self._request(loc, lambda: self._direct.get(loc, _from_code, offset, length, into=buf, each=each))

    @property
    def reads_many(self) -> bool:
        return self._direct is not None

    def read_many(self, locs: list[Location], each, *, connections: int | None = None, pace=None) -> dict:
        if self._direct is None:
            return super().read_many(locs, each, pace=pace)
        return self._direct.get_many(locs, each, _from_code, connections=connections or self.settings.transfer.concurrency,
                                     retries=self.retries, pace=pace)

    def _remember(self, loc: Location, named: dict[str, str]) -> None:
        """``named``: the answer's headers by lower-case name."""
        attrs = Attrs(**{name: named.get(header) or None for name, header in _HEADER_NAMES},
                      user=attributes.from_s3({k[11:]: v for k, v in named.items() if k.startswith("x-amz-meta-")}))
        with self._seen_lock:
            self._seen[str(loc)] = attrs
            while len(self._seen) > SEEN:
                self._seen.popitem(last=False)

    def attributes(self, info: ObjectInfo) -> Attrs:
        """From the object's last whole GET here when there was one (no request), else HEAD."""
        if info.attrs is None:
            with self._seen_lock:
                seen = self._seen.pop(str(info.location), None)
            if seen is not None:
                return seen
        return super().attributes(info)

    def written(self, loc: Location, metadata: dict[str, str], attrs: Attrs | None) -> dict:
        """The parameters of a write of ``loc`` besides its bytes, as botocore names them: bridge's
        metadata with the user's (bridge.attributes.to_s3), the headers, and this store's storage
        class and encryption (not for bridge's own records, which stay readable)."""
        user = attributes.to_s3(attrs.user) if attrs else {}
        params: dict = {"Metadata": {**user, **metadata}}
        for name, value in (attrs.headers() if attrs else {}).items():
            params[_SDK_HEADERS[name]] = value
        s3 = self.settings.s3
        if s3.storage_class and not is_reserved(loc.key):
            params["StorageClass"] = s3.storage_class
        if s3.sse_kms_key_id:
            params["ServerSideEncryption"] = "aws:kms"
            params["SSEKMSKeyId"] = s3.sse_kms_key_id
            if s3.bucket_key is not None:
                params["BucketKeyEnabled"] = s3.bucket_key
        return params

    def put(self, loc: Location, data: bytes, *, crc32c: str, metadata: dict[str, str],
            attrs: Attrs | None = None, sha256: str | None = None) -> ObjectInfo:
        # S3 checks the body against the CRC32C header on arrival and rejects a mismatch.
        params = self.written(loc, metadata, attrs)
        if self._direct is not None:
            resp = self._request(loc, lambda: self._direct.put(loc, data, crc_hex_to_b64(crc32c), params, _from_code,
                                                               payload_sha256=sha256))
        else:
            resp = self._call(loc, "put_object", Bucket=loc.bucket, Key=loc.key, Body=_body(data),
                              ChecksumAlgorithm="CRC32C", ChecksumCRC32C=crc_hex_to_b64(crc32c), **params)
        return _put_info(loc, len(data), metadata, resp)

    @property
    def writes_many(self) -> bool:
        return self._direct is not None

    def put_many(self, count: int, body, each, *, connections: int | None = None, ready=None) -> dict:
        if self._direct is None:
            return super().put_many(count, body, each, ready=ready)
        sent: dict[int, tuple[Location, int, dict]] = {}   # what each answer is about

        def request(i: int) -> tuple:
            loc, data, crc32c, metadata, attrs, sha256 = put_args(body(i))
            sent[i] = (loc, len(data), metadata)
            return loc, data, crc_hex_to_b64(crc32c), self.written(loc, metadata, attrs), sha256

        def answered(i: int, resp: dict) -> None:
            loc, size, metadata = sent.pop(i)
            each(i, _put_info(loc, size, metadata, resp))

        return self._direct.put_many(count, request, answered, _from_code,
                                     connections=connections or self.settings.transfer.concurrency,
                                     retries=self.retries, ready=ready)

    def delete(self, loc: Location) -> None:
        if self._direct is not None:
            self._request(loc, lambda: self._direct.delete(loc, _from_code))
        else:
            self._call(loc, "delete_object", Bucket=loc.bucket, Key=loc.key)

    def delete_many(self, locs: list[Location]) -> None:
        """DeleteObjects, up to 1,000 keys a request (a key no XML can carry, one with a control
        character, goes alone by DELETE). A key S3 refuses fails the call with its error; a
        transient refusal (SlowDown, InternalError) sends that request again, whole: deleting
        twice is deleting."""
        by_bucket: dict[str, list[str]] = {}
        for loc in locs:
            if _XML_UNSAFE.search(loc.key):
                try:
                    self.delete(loc)
                except ObjectNotFound:
                    pass
            else:
                by_bucket.setdefault(loc.bucket, []).append(loc.key)
        per_request = DELETES_PER_REQUEST["s3"]
        for bucket, keys in by_bucket.items():
            where = Location("s3", bucket, "")
            for start in range(0, len(keys), per_request):
                self._request(where, functools.partial(self._delete_objects, where, keys[start:start + per_request]))

    def _delete_objects(self, where: Location, keys: list[str]) -> None:
        if self._direct is not None:
            errors = self._direct.delete_many(where, keys, _from_code)
        else:
            answer = self.fs.call_s3("delete_objects", Bucket=where.bucket,
                                     Delete={"Objects": [{"Key": key} for key in keys], "Quiet": True})
            errors = [_from_code(Location("s3", where.bucket, e.get("Key", "")), e.get("Code", ""), e.get("Message", ""))
                      for e in answer.get("Errors", [])]
        raise_refused_deletions(errors, len(keys))

    def check_bucket(self, loc: Location) -> None:
        try:
            if self._direct is not None:
                self._request(loc, lambda: self._direct.head_bucket(loc, _from_code))
            else:
                self._call(loc, "head_bucket", Bucket=loc.bucket)
        except ObjectNotFound as exc:
            raise BucketNotFound(f"bucket {loc.bucket!r} does not exist") from exc

    def buckets(self) -> list[str]:
        if self._direct is not None:
            return sorted(self._request(Location("s3", "", ""), lambda: self._direct.buckets(_from_code)))
        answer = self._call(Location("s3", "", ""), "list_buckets")
        return sorted(b["Name"] for b in answer.get("Buckets", []))

    def make_bucket(self, loc: Location) -> None:
        kwargs: dict = {"Bucket": loc.bucket}
        region = self.settings.s3.region
        if self._direct is not None:
            self._request(loc, lambda: self._direct.make_bucket(loc, region, _from_code))
            return
        if region and region != "us-east-1":   # the one region S3 takes without a constraint
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
        self._call(loc, "create_bucket", **kwargs)

    def bucket_region(self, loc: Location) -> str | None:
        if self._direct is not None:
            return self._request(loc, lambda: self._direct.bucket_region(loc, _from_code))
        # GetBucketLocation answers no constraint for us-east-1, the region S3 began in.
        answer = self._call(loc, "get_bucket_location", Bucket=loc.bucket)
        return answer.get("LocationConstraint") or "us-east-1"

    # -- server-side copy, part copy, signed URLs ------------------------------------------
    def copy_object(self, src: Location, dst: Location, *, size: int, attrs: Attrs | None = None) -> ObjectInfo:
        """CopyObject up to ``max_copy_size`` (S3: 5 GiB), else a multipart upload of
        UploadPartCopy parts. S3 computes the copy's CRC32C itself (ChecksumAlgorithm). The
        source's headers and metadata go with it (COPY), or ``attrs`` replace them (REPLACE,
        bridge's keys of the source kept); the storage class and encryption are this store's."""
        if size > self.features.max_copy_size:
            return self._copy_in_parts(src, dst, size, attrs)
        if attrs is None:
            params = {k: v for k, v in self.written(dst, {}, None).items() if k != "Metadata"}
            params["MetadataDirective"] = "COPY"
        else:
            kept = attributes.bridge_metadata(self.info(src).metadata)
            params = {**self.written(dst, kept, attrs), "MetadataDirective": "REPLACE"}
        if self._direct is not None:
            directive = params.pop("MetadataDirective")
            result = self._request(dst, lambda: self._direct.copy(src, dst, params, directive, _from_code))
        else:
            resp = self._call(dst, "copy_object", Bucket=dst.bucket, Key=dst.key,
                              CopySource={"Bucket": src.bucket, "Key": src.key}, ChecksumAlgorithm="CRC32C",
                              **params)
            result = {**resp.get("CopyObjectResult", {}), "VersionId": resp.get("VersionId")}
        sums = {"crc32c": crc_b64_to_hex(result["ChecksumCRC32C"])} if result.get("ChecksumCRC32C") else {}
        return ObjectInfo(dst, size, sums, {}, _identity(result))

    def _copy_in_parts(self, src: Location, dst: Location, size: int, attrs: Attrs | None = None) -> ObjectInfo:
        from bridge.hashing import combine_parts
        f = self.features
        part = max(f.min_part_size, -(-size // f.max_parts), min(COPY_PART, f.max_copy_size))
        head = self.info(src)
        params = self.written(dst, attributes.bridge_metadata(head.metadata), attrs if attrs is not None else head.attrs)
        upload_id = self._create_upload(dst, params)
        try:
            ranges = list(enumerate(range(0, size, part), 1))
            with Pool(min(len(ranges), self.settings.transfer.concurrency)) as pool:
                parts = list(pool.map(lambda r: self.copy_part(dst, upload_id, r[0], r[1], src, r[1],
                                                               min(part, size - r[1])), ranges))
            # S3 checks the whole object against the CRC32C combined from its parts'; an endpoint
            # that reports no part checksums (moto) is asked what it kept of the whole, below.
            whole = (crc_hex(combine_parts([(int(p.crc32c, 16), p.size) for p in parts]))
                     if all(p.crc32c for p in parts) else None)
            self._complete(dst, upload_id, parts, whole)
        except BaseException:
            from bridge.retry import stopping
            with stopping(None):   # the clean-up of a cancelled copy is sent after the cancel
                self.abort_upload(dst, upload_id)
            raise
        return self.info(dst)

    def copy_part(self, loc: Location, upload_id: str, number: int, offset: int, src: Location,
                  src_offset: int, length: int) -> PartRecord:
        if self._direct is not None:
            etag, crc = self._request(loc, lambda: self._direct.copy_part(
                loc, upload_id, number, src, src_offset, src_offset + length - 1, _from_code))
            return PartRecord(number, length, crc_b64_to_hex(crc) if crc else "", etag)
        resp = self._call(loc, "upload_part_copy", Bucket=loc.bucket, Key=loc.key, UploadId=upload_id,
                          PartNumber=number, CopySource={"Bucket": src.bucket, "Key": src.key},
                          CopySourceRange=f"bytes={src_offset}-{src_offset + length - 1}")
        result = resp.get("CopyPartResult", {})
        crc = crc_b64_to_hex(result["ChecksumCRC32C"]) if result.get("ChecksumCRC32C") else ""
        return PartRecord(number, length, crc, result["ETag"])

    def signed_url(self, loc: Location, expires: int = 3600) -> str:
        if self._direct is not None:
            return self._request(loc, lambda: self._direct.signed_url(loc, expires))
        return self._request(loc, lambda: self.fs.url(f"{loc.bucket}/{loc.key}", expires=expires))

    # -- multipart -----------------------------------------------------------------------
    def begin_upload(self, loc: Location, size: int, attrs: Attrs | None = None) -> str:
        # S3 takes the headers, metadata, class and encryption when the upload starts.
        return self._create_upload(loc, self.written(loc, {}, attrs))

    def _create_upload(self, loc: Location, params: dict) -> str:
        if self._direct is not None:
            return self._request(loc, lambda: self._direct.create_upload(loc, params, _from_code))
        resp = self._call(loc, "create_multipart_upload", Bucket=loc.bucket, Key=loc.key,
                          ChecksumAlgorithm="CRC32C", ChecksumType="FULL_OBJECT", **params)
        return resp["UploadId"]

    def upload_part(self, loc: Location, upload_id: str, number: int, offset: int, data: bytes,
                    crc32c: str, *, sha256: str | None = None) -> PartRecord:
        if self._direct is not None:
            etag = self._request(loc, lambda: self._direct.upload_part(loc, upload_id, number, data,
                                                                       crc_hex_to_b64(crc32c), _from_code,
                                                                       payload_sha256=sha256))
            return PartRecord(number, len(data), crc32c, etag)
        resp = self._call(loc, "upload_part", Bucket=loc.bucket, Key=loc.key, UploadId=upload_id,
                          PartNumber=number, Body=_body(data), ChecksumCRC32C=crc_hex_to_b64(crc32c))
        return PartRecord(number, len(data), crc32c, resp["ETag"])

    def list_parts(self, loc: Location, upload_id: str) -> dict[int, PartRecord] | None:
        parts: dict[int, PartRecord] = {}
        marker: int | None = 0
        if self._direct is not None:
            while marker is not None:
                try:
                    page, marker = self._request(loc, lambda m=marker: self._direct.parts_page(loc, upload_id, m,
                                                                                               _from_code))
                except ObjectNotFound:   # NoSuchUpload (UploadGone) or a missing bucket's key
                    return None
                for number, size, etag, crc in page:
                    parts[number] = PartRecord(number, size, crc_b64_to_hex(crc) if crc else "", etag)
            return parts
        while True:
            try:
                page = self._call(loc, "list_parts", Bucket=loc.bucket, Key=loc.key, UploadId=upload_id,
                                  PartNumberMarker=marker)
            except (ObjectNotFound, BridgeError) as exc:
                if "NoSuchUpload" in str(exc) or isinstance(exc, ObjectNotFound):
                    return None
                raise
            for p in page.get("Parts", []):
                crc = crc_b64_to_hex(p["ChecksumCRC32C"]) if p.get("ChecksumCRC32C") else ""
                parts[p["PartNumber"]] = PartRecord(p["PartNumber"], int(p["Size"]), crc, p["ETag"])
            if not page.get("IsTruncated"):
                return parts
            marker = page["NextPartNumberMarker"]

    def complete_upload(self, loc: Location, upload_id: str, parts: list[PartRecord], *,
                        crc32c: str, metadata: dict[str, str], attrs: Attrs | None = None) -> ObjectInfo:
        """S3 checks the whole object against the CRC32C sent (FULL_OBJECT) and answers with the
        one it keeps; the engine compares that with ours (--store-checksums)."""
        size = sum(p.size for p in parts)

        def finished() -> bool:  # an earlier attempt completed it (then: NoSuchUpload)
            try:
                info = self.info(loc)
            except ObjectNotFound:
                return False
            return info.size == size and info.checksums.get("crc32c") == crc32c

        answer = self._complete(loc, upload_id, parts, crc32c, recovered=finished)
        value = (answer or {}).get("ChecksumCRC32C")
        whole = bool(value) and "-" not in value and (answer or {}).get("ChecksumType", "FULL_OBJECT") == "FULL_OBJECT"
        if whole:
            return ObjectInfo(loc, size, {"crc32c": crc_b64_to_hex(value)}, dict(metadata), _identity(answer))
        if answer and answer.get("ETag") and self.settings.transfer.store_checksums == "skip":
            # No checksum is to be checked: the answer names the object (its ETag and version), as
            # a PUT's does. Asking anyway cost rclone serve s3, which keeps none, an MD5 of the
            # whole object (1.6 s for 1 GiB) that no peer's upload waits for.
            return ObjectInfo(loc, size, {}, dict(metadata), _identity(answer))
        return self.info(loc)   # recovered, or an answer without a whole-object checksum: ask

    def _complete(self, loc: Location, upload_id: str, parts: list[PartRecord], crc32c: str | None,
                  recovered=None) -> dict:
        """CompleteMultipartUpload of ``parts``, the whole checked against ``crc32c`` (hex;
        FULL_OBJECT) when given; S3's answer, named as botocore names it."""
        whole = crc_hex_to_b64(crc32c) if crc32c else None
        if self._direct is not None:
            listed = [(p.number, p.token, crc_hex_to_b64(p.crc32c) if p.crc32c else "") for p in parts]
            return self._request(loc, lambda: self._direct.complete_upload(loc, upload_id, listed, whole, _from_code),
                                 recovered=recovered)
        body = {"Parts": [{"PartNumber": p.number, "ETag": p.token,
                           **({"ChecksumCRC32C": crc_hex_to_b64(p.crc32c)} if p.crc32c else {})} for p in parts]}
        checked = {"ChecksumCRC32C": whole, "ChecksumType": "FULL_OBJECT"} if whole else {}
        return self._call(loc, "complete_multipart_upload", recovered=recovered, Bucket=loc.bucket,
                          Key=loc.key, UploadId=upload_id, MultipartUpload=body, **checked)

    def abort_upload(self, loc: Location, upload_id: str) -> None:
        try:
            if self._direct is not None:
                self._request(loc, lambda: self._direct.abort_upload(loc, upload_id, _from_code))
            else:
                self._call(loc, "abort_multipart_upload", Bucket=loc.bucket, Key=loc.key, UploadId=upload_id)
        except ObjectNotFound:
            pass

    def list_uploads(self, prefix: Location) -> Iterator[tuple[Location, str]]:
        if self._direct is not None:
            after: dict[str, str] | None = {}
            while after is not None:
                page, after = self._request(prefix, lambda m=after: self._direct.uploads_page(prefix, m, _from_code))
                yield from ((Location("s3", prefix.bucket, key), upload_id) for key, upload_id in page)
            return
        # At most 1,000 uploads a page; the next page starts after the (key, upload id) markers.
        markers: dict[str, str] = {}
        while True:
            page = self._call(prefix, "list_multipart_uploads", Bucket=prefix.bucket, Prefix=prefix.key,
                              **markers)
            for up in page.get("Uploads", []):
                yield Location("s3", prefix.bucket, up["Key"]), up["UploadId"]
            if not page.get("IsTruncated"):
                return
            markers = {"KeyMarker": page.get("NextKeyMarker", ""),
                       "UploadIdMarker": page.get("NextUploadIdMarker", "")}
            if not markers["KeyMarker"]:
                raise BridgeError(f"{prefix}: the endpoint truncated the list of uploads without "
                                  f"saying where the next page starts")


_SDK_HEADERS = {"content_type": "ContentType", "content_encoding": "ContentEncoding",
                "content_disposition": "ContentDisposition", "content_language": "ContentLanguage",
                "cache_control": "CacheControl"}
ARCHIVED = ("GLACIER", "DEEP_ARCHIVE")   # GLACIER_IR reads at once; these need a restore first


def _needs_restore(storage_class: str | None, restore: str | None) -> bool:
    """Archived and not restored: a GET answers InvalidObjectState (x-amz-restore says
    ongoing-request="false" once a restored copy is there)."""
    return storage_class in ARCHIVED and 'ongoing-request="false"' not in (restore or "")


def _listed(bucket: str, item: dict) -> ObjectInfo:
    cls = item.get("StorageClass") or "STANDARD"
    restored = (item.get("RestoreStatus") or {}).get("IsRestoreInProgress") is False
    return ObjectInfo(Location("s3", bucket, item["Key"]), int(item["Size"]), identity=_identity(item),
                      storage_class=cls, needs_restore=cls in ARCHIVED and not restored, modified=_when(item))


class _Lister:
    """A direct listing's objects as ``_listed`` makes them from the SDK's answer (the same
    infos: tests/test_s3direct.py), for a fraction of the time an object: the info
    made without the frozen dataclass's ``__init__`` (``ObjectInfo.listed``'s way), and each
    distinct LastModified parsed once (a listing's objects share a few seconds)."""

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket
        self._times: dict[str, tuple[str, float]] = {}

    def __call__(self, key: str, size: str, etag: str, modified: str, cls: str) -> ObjectInfo:
        identity = {"etag": etag.strip('"')} if etag else {}
        stamp = None
        if modified:
            when = self._times.get(modified)
            if when is None:
                if len(self._times) >= 4096:
                    self._times.clear()
                parsed = datetime.fromisoformat(modified)
                when = self._times[modified] = (utc_seconds(parsed), parsed.timestamp())
            identity["last_modified"], stamp = when
        cls = cls or "STANDARD"
        info = _new_info(ObjectInfo)
        info.__dict__.update(location=Location("s3", self.bucket, key), size=int(size), checksums={}, metadata={},
                             identity=identity, attrs=None, storage_class=cls, needs_restore=cls in ARCHIVED,
                             modified=stamp)
        return info


_new_info = object.__new__


def _put_info(loc: Location, size: int, metadata: dict[str, str], resp: dict) -> ObjectInfo:
    sums = {"crc32c": crc_b64_to_hex(resp["ChecksumCRC32C"])} if resp.get("ChecksumCRC32C") else {}
    return ObjectInfo(loc, size, sums, dict(metadata), _identity(resp))


def _identity(answer: dict) -> dict[str, str]:
    """ETag (an MD5 of the bytes for one PUT, of the parts' MD5s for a multipart upload, random
    under SSE-KMS: a rewrite with other bytes changes it), the version id when the bucket keeps
    versions, and the last-modified time when the answer carries one (listings, HEAD)."""
    ident = {"etag": answer["ETag"].strip('"')} if answer.get("ETag") else {}
    if answer.get("VersionId") and answer["VersionId"] != "null":
        ident["version_id"] = answer["VersionId"]
    if answer.get("LastModified"):
        ident["last_modified"] = utc_seconds(answer["LastModified"])
    return ident


def _when(answer: dict) -> float | None:
    modified = answer.get("LastModified")
    return modified.timestamp() if modified else None


def _body(data: bytes):
    return BufferReader(data) if len(data) > 1024 * 1024 else data


def _sync_read(fs, body, length: int) -> bytes | bytearray:
    """The body in one buffer of the announced length, filled chunk by chunk (reading it whole
    would hold the chunks and their join at once: twice the part in memory)."""
    from fsspec.asyn import sync

    async def _read():
        buf, pos = bytearray(length), 0
        async with body:
            while pos < length:
                chunk = await body.read(min(1 << 20, length - pos))
                if not chunk:
                    break
                buf[pos:pos + len(chunk)] = chunk
                pos += len(chunk)
        if pos != length:
            raise TransientError(f"connection closed after {pos} of {length} bytes")
        return buf

    return sync(fs.loop, _read)
