"""S3 GETs and PUTs without the event loop: one keep-alive http.client connection per thread, requests
signed with botocore's own SigV4 signer, the body read straight into the buffer that is returned.

Why: a profile of a 1 GiB download had aiobotocore's single event-loop thread do
everything for every request at once: parse HTTP, copy each chunk out of the parser, copy it
again into the part's buffer, zero-fill new buffers. Here each thread of the engine reads its own
response with ``readinto`` (one copy, from the socket into the buffer) while the GIL is free, and
a small object costs one signature and one request instead of a trip through the loop. Measured
against ``rclone serve s3``: see bench/README.md.

A PUT carries the same checks as the SDK's: the CRC32C header S3 verifies the body against,
the metadata, and (over plain HTTP) the payload's SHA-256 in the signature. A multipart upload
is begun, sent, completed and aborted here too (a big upload never imports the SDK), and so are
server-side copies (CopyObject, UploadPartCopy), the parts listed on a resume, one level of a
listing, the buckets listed and made, and presigned URLs: wherever this path serves, the store
never imports the SDK (tests/test_s3direct.py). Used for an
explicit endpoint (path-style addressing, as botocore uses for one), over HTTP or HTTPS, and for AWS's own (no endpoint set): each bucket at
its region's host, ``https://BUCKET.s3.REGION.amazonaws.com`` (path-style at
``s3.REGION.amazonaws.com`` for a name with a dot, which no certificate of S3's covers), the
region asked of S3 once per bucket and process (``x-amz-bucket-region`` of a HEAD of the bucket,
which S3 answers whatever the status: a bucket elsewhere answers 301 and names its region, as
botocore's region redirects read it), so that no request meets a redirect. FIPS and dual-stack
endpoints (AWS_USE_FIPS_ENDPOINT, AWS_USE_DUALSTACK_ENDPOINT) and the ISO partitions stay on
aiobotocore (China's regions are at ``amazonaws.com.cn``); a directory
bucket (S3 Express One Zone: zonal hosts, session credentials) is refused by name. Any
credentials botocore resolves serve it: static keys
from the settings are signed with as they are; otherwise botocore's own credential chain (a
profile or the shared credentials file, credential_process, SSO, web identity through STS,
container or instance metadata) gives a credentials object whose ``get_frozen_credentials()``
each request signs with, so that keys that expire are refreshed as botocore refreshes them
(under its lock, before they expire), the session token sent with them. Keys that sit in a
profile of the shared files as they are (the commonest case) are read here without botocore,
whose import costs half a second of a short job's start (``shared_file_keys``). HTTPS verifies the
server against the CA bundle of the settings (``s3.ca_bundle``/AWS_CA_BUNDLE, the profile's
``ca_bundle``, then ``transfer.ca_bundle``: MCBRIDGE_CA_BUNDLE, REQUESTS_CA_BUNDLE, SSL_CERT_FILE)
or the system's; a server that does not prove who it is fails at once, naming the endpoint.
Failures are raised as
bridge's errors, through the same codes as the store's own translation; nothing is retried here
(the store retries each call through bridge.retry, the one retry layer).
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import re
import ssl
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from datetime import datetime
from email.utils import parsedate_to_datetime
from urllib.parse import quote, unquote_plus, urlsplit

from bridge import bwlimit, meter
from bridge.config import Settings
from bridge.errors import BadURL, BridgeError, TransientError
from bridge.hashing import hmac_sha256
from bridge.stores.base import kept_connection, receive, tls_context
from bridge.urls import Location

# What requests are signed with, asked for before each signature: (access key, secret, token or
# None, ...), a tuple or botocore's ReadOnlyCredentials (get_frozen_credentials, which refreshes).
Keys = Callable[[], tuple]


# Settings in a profile, or variables, that put another provider before the shared files in
# botocore's chain (assume role, web identity, SSO), or after them with keys of their own.
_NOT_PLAIN = ("role_arn", "web_identity_token_file", "sso_session", "sso_start_url", "sso_account_id",
              "credential_source", "source_profile")


def shared_file_keys(profile: str | None) -> tuple[tuple[str, str, str | None], dict[str, str | None], str] | None:
    """((key, secret, token), {region, ca_bundle}, botocore's name of the provider) for a profile
    whose keys sit in the shared credentials or config file, read as botocore's chain would take
    them but without importing botocore (half a second of a short job's start on this kind of
    machine); None when anything could make botocore choose otherwise (a role to assume, web
    identity, SSO, a credential_process, keys in neither file, a file that does not parse): then
    botocore resolves them (botocore_credentials). tests/test_credentials.py checks that both agree."""
    import configparser
    import os
    env = os.environ
    if env.get("AWS_WEB_IDENTITY_TOKEN_FILE") or env.get("AWS_ROLE_ARN"):
        return None
    name = profile or env.get("AWS_DEFAULT_PROFILE") or "default"

    def section(path: str, title: str) -> dict[str, str] | None:
        parser = configparser.RawConfigParser(default_section="\x00", interpolation=None)
        try:
            parser.read(os.path.expanduser(path))
        except (configparser.Error, OSError, UnicodeDecodeError):
            raise LookupError from None
        return dict(parser[title]) if parser.has_section(title) else None

    try:
        config = section(env.get("AWS_CONFIG_FILE", "~/.aws/config"), name if name == "default" else f"profile {name}")
        if config is None and name == "default":
            config = section(env.get("AWS_CONFIG_FILE", "~/.aws/config"), "profile default")
        config = config or {}
        if any(config.get(k) for k in _NOT_PLAIN):
            return None
        settings = {"region": env.get("AWS_DEFAULT_REGION") or config.get("region"),
                    "ca_bundle": env.get("AWS_CA_BUNDLE") or config.get("ca_bundle")}
        found = section(env.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"), name) or {}
        for keys, method in ((found, "shared-credentials-file"), (config, "config-file")):
            if keys.get("aws_access_key_id") and keys.get("aws_secret_access_key"):
                return ((keys["aws_access_key_id"], keys["aws_secret_access_key"],
                         keys.get("aws_session_token") or keys.get("aws_security_token") or None), settings, method)
            if keys is found and config.get("credential_process"):
                return None
    except LookupError:
        return None
    return None


def botocore_credentials(profile: str | None):
    """(credentials, {region, ca_bundle}) as botocore resolves them for ``profile`` (None: the
    default chain: environment, shared files, SSO, web identity, container, instance metadata),
    or None when it finds none, or the profile is not there (aiobotocore then says which)."""
    import botocore.exceptions
    import botocore.session
    session = botocore.session.Session(profile=profile)
    try:
        credentials = session.get_credentials()
        config = {name: session.get_config_variable(name) for name in ("region", "ca_bundle")}
    except botocore.exceptions.BotoCoreError:
        return None
    if credentials is None:
        return None
    return credentials, config

_CODE = re.compile(rb"<Code>([^<]+)</Code>")


class _Host:
    """Where the requests for a bucket go: an origin, the path buckets sit under on it (``base``;
    None when the bucket names the host), the region they are signed for, and each thread's
    connection."""

    def __init__(self, origin: str, base: str | None, region: str, keys: Keys, timeout: float,
                 tls: ssl.SSLContext | None, meter_base: str):
        url = urlsplit(origin)
        self.origin, self.netloc, self.base, self.region = origin, url.netloc, base, region
        self.meter_base = meter_base   # the endpoint's own path, left out when metering (bridge/meter.py)
        self.tls = tls
        more = {"context": tls} if tls is not None else {}
        self.connect = lambda: meter.connection(tls is not None, "s3", meter_base)(
            url.hostname, url.port, timeout=timeout, **more)
        self.signer = SigV4(keys, region, https=url.scheme == "https")
        self.local = threading.local()

    def bucket_path(self, bucket: str) -> str:
        """The path of ``bucket``'s root on this host ('' when the bucket names the host)."""
        return "" if self.base is None else f"{self.base}/{quote(bucket)}"


def virtual_host(bucket: str) -> bool:
    """Whether a bucket can name its host on AWS (as botocore decides): a DNS label of its own,
    without dots (a dotted name would not match the certificate's ``*.s3.REGION.amazonaws.com``)."""
    return bool(_DNS_BUCKET.match(bucket)) and "." not in bucket


_DNS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9\-]{1,61}[a-z0-9]$")


def aws_domain(region: str) -> str:
    """The domain of S3's hosts in ``region``'s partition (China's regions have their own)."""
    return "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"


# Partitions whose hosts are named otherwise (the ISO regions): aiobotocore knows them.
_OTHER_PARTITIONS = ("us-iso-", "us-isob-", "us-isof-", "eu-isoe-")


class Direct:
    page_size: int | None = None   # objects per listing page; None: the service's (1,000)
    # Called with (location, {lower-case header: value}) of each whole-object GET's answer: the
    # store keeps the headers and metadata it carries, so that copying them costs no HEAD.
    on_headers: Callable[[Location, dict[str, str]], None] | None = None

    def __init__(self, endpoint: str | None, region: str, keys: Keys, timeout: float, cafile: str | None = None,
                 credentials: str = "static", path_style: bool = False):
        """``endpoint``: one endpoint for every bucket, path-style; None: AWS's own, each bucket at
        its own region's host (``https://BUCKET.s3.REGION.amazonaws.com``; ``s3.REGION.amazonaws.com``
        path-style for a name that cannot be a host, or for every bucket with ``path_style``), the
        region asked of S3 once per bucket."""
        self.aws = endpoint is None
        self.path_style = path_style
        self.endpoint = endpoint or f"https://s3.{region}.{aws_domain(region)}"
        self.region = region
        self.credentials = credentials   # where the keys came from: "static", or botocore's provider's method
        self.cafile = cafile
        self._keys = keys
        self._timeout = timeout
        url = urlsplit(self.endpoint)
        self._tls = tls_context(cafile) if url.scheme == "https" else None
        self._base = url.path.rstrip("/")
        self._hosts: dict[str, _Host] = {}
        self._hosts_lock = threading.Lock()
        self._one = None if self.aws else _Host(f"{url.scheme}://{url.netloc}", self._base, region, keys, timeout,
                                                self._tls, self._base)

    @property
    def _signer(self) -> SigV4:
        """The signer of the endpoint's own region (every bucket's, on an endpoint set outright)."""
        return self._one.signer if self._one is not None else SigV4(self._keys, self.region, https=True)

    def _host(self, bucket: str) -> _Host:
        """Where ``bucket``'s requests go (on AWS: made on first use, after asking for its region)."""
        if self._one is not None:
            return self._one
        host = self._hosts.get(bucket)
        if host is None:
            region = self._region_of(bucket)
            with self._hosts_lock:
                host = self._hosts.get(bucket)
                if host is None:
                    host = self._hosts[bucket] = self._aws_host(bucket, region)
        return host

    def _aws_host(self, bucket: str, region: str) -> _Host:
        if bucket.endswith("--x-s3"):
            # S3 Express One Zone: zonal hosts and session credentials (CreateSession) of its own
            raise BadURL(f"s3://{bucket}: a directory bucket (S3 Express One Zone) is not supported")
        if virtual_host(bucket) and not self.path_style:
            return _Host(f"https://{bucket}.s3.{region}.{aws_domain(region)}", None, region, self._keys,
                         self._timeout, self._tls, "")
        return _Host(f"https://s3.{region}.{aws_domain(region)}", "", region, self._keys, self._timeout, self._tls, "")

    def _region_of(self, bucket: str) -> str:
        """The region ``bucket`` lives in, as S3 says it in ``x-amz-bucket-region`` on a HEAD of the
        bucket at the configured region's host, whatever the status (a bucket elsewhere answers
        301, one this caller may not list 403: both name the region); the configured region when
        the answer names none (the requests then fail or succeed there, saying why)."""
        probe = self._aws_host(bucket, self.region)
        headers: dict[str, str] = {}
        path = probe.bucket_path(bucket) or "/"
        probe.signer.sign("HEAD", probe.netloc, path, "", headers)
        loc = Location("s3", bucket, "")
        with kept_connection(probe.local, probe.connect, loc, f"the S3 endpoint {probe.origin}") as conn:
            conn.request("HEAD", path, headers=headers)
            resp = conn.getresponse()
            resp.read()
            region = resp.getheader("x-amz-bucket-region")
        return region or self.region

    @classmethod
    def for_settings(cls, settings: Settings) -> Direct | None:
        """The direct path for these settings, or None where aiobotocore stays: no credentials
        botocore can find (aiobotocore then says so), or AWS's own endpoint asked for in a form
        this path does not make (FIPS or dual-stack: AWS_USE_FIPS_ENDPOINT, AWS_USE_DUALSTACK_ENDPOINT;
        the ISO partitions' regions)."""
        import os
        s3 = settings.s3
        if not s3.endpoint_url and any((os.environ.get(name) or "").lower() == "true"
                                       for name in ("AWS_USE_FIPS_ENDPOINT", "AWS_USE_DUALSTACK_ENDPOINT")):
            return None
        config: dict[str, str | None] = {}   # the profile's region and ca_bundle
        if s3.access_key_id and s3.secret_access_key:
            # Keys given outright win over a profile, as they do on aiobotocore (s3fs passes them).
            fixed = (s3.access_key_id, s3.secret_access_key.get_secret_value(),
                     s3.session_token.get_secret_value() if s3.session_token else None)
            keys: Keys = lambda: fixed
            method = "static"
        elif (plain := shared_file_keys(s3.profile)) is not None:
            fixed, config, method = plain
            keys = lambda: fixed
        else:
            found = botocore_credentials(s3.profile)
            if found is None:
                return None
            credentials, config = found
            keys, method = credentials.get_frozen_credentials, credentials.method
        region = s3.region or config.get("region") or "us-east-1"
        if not s3.endpoint_url and region.startswith(_OTHER_PARTITIONS):
            return None
        return cls(s3.endpoint_url or None, region, keys,
                   settings.transfer.read_timeout,
                   s3.ca_bundle or config.get("ca_bundle") or settings.transfer.ca_bundle, method,
                   path_style=s3.addressing_style == "path")

    def put(self, loc: Location, data: bytes | bytearray, crc32c_b64: str, params: dict,
            from_code, payload_sha256: str | None = None) -> dict[str, str]:
        """PUT one object with ``params`` named as botocore's put_object names them (Metadata,
        ContentType ..., StorageClass, ServerSideEncryption, SSEKMSKeyId, BucketKeyEnabled); what
        S3 answered, named as botocore names it (ETag, VersionId, ChecksumCRC32C), for the store
        to make its ObjectInfo of."""
        path, headers = self._put_request(loc, data, crc32c_b64, params, payload_sha256)
        with self._connection(loc) as conn:
            conn.request("PUT", path, body=data, headers=headers)
            resp = conn.getresponse()
            if resp.status >= 300:
                raise _error(loc, resp, from_code)
            resp.read()
        return _put_answer(resp.getheader)

    def upload_part(self, loc: Location, upload_id: str, number: int, data, crc32c_b64: str, from_code,
                    payload_sha256: str | None = None) -> str:
        """UploadPart on this thread's connection (its body in pieces, so that a cancel stops it
        mid-way: bridge/meter.py); the part's ETag. ``payload_sha256``: the body's SHA-256, when
        the caller has it (signed over plain HTTP without hashing the body again)."""
        path, host = self._path(loc), self._host(loc.bucket)
        query = f"partNumber={number}&uploadId={quote(upload_id, safe='-_.~')}"
        headers = {"Content-Length": str(len(data)), "x-amz-sdk-checksum-algorithm": "CRC32C",
                   "x-amz-checksum-crc32c": crc32c_b64}
        host.signer.sign("PUT", host.netloc, path, query, headers, data, payload_sha256=payload_sha256)
        with self._connection(loc) as conn:
            conn.request("PUT", f"{path}?{query}", body=data, headers=headers)
            resp = conn.getresponse()
            if resp.status >= 300:
                raise _error(loc, resp, from_code)
            resp.read()
        return resp.getheader("ETag") or ""

    # -- the rest of a multipart upload: the SDK's client cost a big upload its import and set-up
    # (0.8 s, with the parts' threads waiting for the upload id) before its first part could go
    def create_upload(self, loc: Location, params: dict, from_code) -> str:
        """CreateMultipartUpload with ``params`` as put_object's (metadata, headers, class,
        encryption), its whole-object checksum to be CRC32C (FULL_OBJECT); the upload id."""
        headers = {"x-amz-checksum-algorithm": "CRC32C", "x-amz-checksum-type": "FULL_OBJECT",
                   **_param_headers(params)}
        _, body = self._call(loc, "POST", self._path(loc), from_code, query="uploads=", headers=headers)
        root, ns = _xml(loc, body)
        upload_id = root.findtext(f"{ns}UploadId")
        if not upload_id:
            raise TransientError(f"{loc}: the answer to CreateMultipartUpload named no upload id")
        return upload_id

    def complete_upload(self, loc: Location, upload_id: str, parts: list[tuple[int, str, str]],
                        crc32c_b64: str | None, from_code) -> dict[str, str]:
        """CompleteMultipartUpload of ``parts`` (number, ETag, CRC32C base64 or ""), the whole
        object checked by S3 against ``crc32c_b64`` (FULL_OBJECT) when given; the answer named
        as botocore names it (ETag, VersionId, ChecksumCRC32C, ChecksumType). S3 may answer 200
        and then an error in the body (as botocore reads it): that is the error raised."""
        from xml.sax.saxutils import escape
        body = "".join(
            ["<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"]
            + [f"<Part><PartNumber>{number}</PartNumber><ETag>{escape(etag)}</ETag>"
               + (f"<ChecksumCRC32C>{crc}</ChecksumCRC32C>" if crc else "") + "</Part>"
               for number, etag, crc in parts]
            + ["</CompleteMultipartUpload>"]).encode()
        headers = {"Content-Length": str(len(body)), "Content-Type": "application/xml"}
        if crc32c_b64:
            headers.update({"x-amz-checksum-crc32c": crc32c_b64, "x-amz-checksum-type": "FULL_OBJECT"})
        path, host = self._path(loc), self._host(loc.bucket)
        query = f"uploadId={quote(upload_id, safe='-_.~')}"
        host.signer.sign("POST", host.netloc, path, query, headers, body)
        with self._connection(loc) as conn:
            conn.request("POST", f"{path}?{query}", body=body, headers=headers)
            resp = conn.getresponse()
            if resp.status >= 300:
                raise _error(loc, resp, from_code)
            answer = resp.read()
        root, ns = _answer_of(loc, answer, from_code)
        got = {"ETag": root.findtext(f"{ns}ETag"), "ChecksumCRC32C": root.findtext(f"{ns}ChecksumCRC32C"),
               "ChecksumType": root.findtext(f"{ns}ChecksumType"), "VersionId": resp.getheader("x-amz-version-id")}
        return {k: v for k, v in got.items() if v}

    def abort_upload(self, loc: Location, upload_id: str, from_code) -> None:
        self._call(loc, "DELETE", self._path(loc), from_code, query=f"uploadId={quote(upload_id, safe='-_.~')}")

    def parts_page(self, loc: Location, upload_id: str, marker: int, from_code) -> tuple[list[tuple[int, int, str, str]], int | None]:
        """One page of ListParts of an upload (after part ``marker``): [(number, size, ETag,
        CRC32C base64 or "")] and the marker of the next page (None: the last)."""
        params = {"uploadId": upload_id}
        if marker:
            params["part-number-marker"] = str(marker)
        if self.page_size:
            params["max-parts"] = str(self.page_size)
        root, ns = self._list_xml(loc, params, from_code, path=self._path(loc))
        parts = [(int(p.findtext(f"{ns}PartNumber", "0")), int(p.findtext(f"{ns}Size", "0")),
                  p.findtext(f"{ns}ETag", ""), p.findtext(f"{ns}ChecksumCRC32C", ""))
                 for p in root.iterfind(f"{ns}Part")]
        if root.findtext(f"{ns}IsTruncated") != "true":
            return parts, None
        following = int(root.findtext(f"{ns}NextPartNumberMarker") or 0)
        if following <= marker:
            raise BridgeError(f"{loc}: the endpoint truncated the list of parts without saying "
                              f"where the next page starts")
        return parts, following

    # -- server-side copies: S3 moves the bytes; the request names the source
    def copy(self, src: Location, dst: Location, params: dict, directive: str, from_code) -> dict:
        """CopyObject of ``src`` to ``dst``, S3 to compute the copy's CRC32C; the metadata as the
        source's (``directive`` COPY) or ``params``' (REPLACE), which also carry the headers,
        class and encryption as put_object's do. The answer named as botocore names it (ETag,
        ChecksumCRC32C, LastModified, VersionId); a 200 whose body is an error (S3 may send
        one once the copy has begun) is that error."""
        headers = {"x-amz-copy-source": _copy_source(src), "x-amz-checksum-algorithm": "CRC32C",
                   "x-amz-metadata-directive": directive, **_param_headers(params)}
        resp, body = self._call(dst, "PUT", self._path(dst), from_code, headers=headers)
        root, ns = _answer_of(dst, body, from_code)
        modified = root.findtext(f"{ns}LastModified")
        got = {"ETag": root.findtext(f"{ns}ETag"), "ChecksumCRC32C": root.findtext(f"{ns}ChecksumCRC32C"),
               "LastModified": datetime.fromisoformat(modified) if modified else None,
               "VersionId": resp.getheader("x-amz-version-id")}
        return {k: v for k, v in got.items() if v}

    def copy_part(self, loc: Location, upload_id: str, number: int, src: Location, first: int, last: int,
                  from_code) -> tuple[str, str]:
        """UploadPartCopy of bytes [first, last] of ``src`` as part ``number``: its ETag and
        CRC32C (base64, "" when the endpoint reports none)."""
        headers = {"x-amz-copy-source": _copy_source(src), "x-amz-copy-source-range": f"bytes={first}-{last}"}
        query = f"partNumber={number}&uploadId={quote(upload_id, safe='-_.~')}"
        _, body = self._call(loc, "PUT", self._path(loc), from_code, query=query, headers=headers)
        root, ns = _answer_of(loc, body, from_code)
        return root.findtext(f"{ns}ETag", ""), root.findtext(f"{ns}ChecksumCRC32C", "")

    def signed_url(self, loc: Location, expires: int, now: float | None = None) -> str:
        """A GET URL of ``loc`` that needs no other credentials for ``expires`` seconds (as
        botocore's generate_presigned_url makes it; no request is sent)."""
        host, path = self._host(loc.bucket), self._path(loc)
        return f"{host.origin}{path}?{host.signer.presign('GET', host.netloc, path, expires, now)}"

    # -- buckets
    def buckets(self, from_code) -> list[str]:
        """The names of the buckets these credentials own (ListBuckets, page by page)."""
        host = self._one or self._aws_host("", self.region)
        names: list[str] = []
        token = ""
        while True:
            params = {"continuation-token": token} if token else {}
            root, ns = self._list_xml(Location("s3", "", ""), params, from_code,
                                      path=host.bucket_path(""), host=host)
            names += [b.findtext(f"{ns}Name", "") for b in root.iterfind(f"{ns}Buckets/{ns}Bucket")]
            token = root.findtext(f"{ns}ContinuationToken") or ""
            if not token:
                return names

    def make_bucket(self, loc: Location, region: str | None, from_code) -> None:
        """CreateBucket of ``loc``'s bucket, in ``region`` when given (S3 takes us-east-1 only
        without a location constraint)."""
        body = None
        if region and region != "us-east-1":
            body = ("<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
                    f"<LocationConstraint>{region}</LocationConstraint></CreateBucketConfiguration>").encode()
        self._call(loc, "PUT", self._bucket_path(loc), from_code, body=body)

    def _put_request(self, loc: Location, data, crc32c_b64: str, params: dict,
                     payload_sha256: str | None = None) -> tuple[str, dict[str, str]]:
        path = self._path(loc)
        headers = {"Content-Length": str(len(data)), "x-amz-sdk-checksum-algorithm": "CRC32C",
                   "x-amz-checksum-crc32c": crc32c_b64, **_param_headers(params)}
        host = self._host(loc.bucket)
        host.signer.sign("PUT", host.netloc, path, "", headers, data, payload_sha256=payload_sha256)
        return path, headers

    def put_many(self, count: int, body: Callable[[int], tuple], each: Callable[[int, dict], None], from_code, *,
                 connections: int, retries: int, ready=None) -> dict[int, BridgeError]:
        """Whole objects, ``connections`` PUTs in flight from this thread: ``body(i)`` gives
        (location, bytes, CRC32C base64, put_object's parameters, the bytes' SHA-256 or None) when its request is first about to go (its
        retries send the same), ``each(i, answer)`` takes what S3 answered (as ``put`` returns
        it). Failures by index, as get_many."""
        bodies: dict[int, tuple] = {}

        async def send(i: int, link) -> dict:
            if i not in bodies:
                bodies[i] = body(i)
                await bwlimit.settle()   # a bandwidth limit taken in body(): sent, and signed, when due
            loc, data, crc32c_b64, params, sha256 = bodies[i]
            path, headers = self._put_request(loc, data, crc32c_b64, params, sha256)
            answer = await link.send("PUT", path, headers, data, what=str(loc), alike=loc.bucket)
            if answer.status >= 300:
                raise _error_of(loc, answer.status, answer.body[:65536], from_code)
            del bodies[i]
            return _put_answer(lambda name: answer.headers.get(name.lower()))

        host = self._one or self._batch_host(count, body, bodies)
        return self._each_of(host, count, send, each, connections, retries, ready=ready)

    def _batch_host(self, count: int, body: Callable[[int], tuple], bodies: dict[int, tuple]) -> _Host:
        """On AWS, the host of a batch's bucket (a batch is of one destination): the first body
        that can be made names it (kept for its request); one that cannot is that object's
        failure, raised again when its request asks for it."""
        for i in range(count):
            try:
                bodies[i] = body(i)
            except BridgeError:
                continue
            return self._host(bodies[i][0].bucket)
        return self._aws_host("", self.region)   # nothing to send: no request goes

    def _each_of(self, host: _Host, count: int, send, each, connections: int, retries: int, pace=None, ready=None):
        """``streams.each_of`` to one host (a batch's objects are in one bucket)."""
        from bridge.stores.streams import each_of
        return each_of(count, send, each, host.origin, connections=connections, timeout=self._timeout,
                       metered=("s3", host.meter_base), retries=retries, tls=host.tls, pace=pace, ready=ready)

    def _path(self, loc: Location) -> str:
        return f"{self._host(loc.bucket).bucket_path(loc.bucket)}/{quote(loc.key, safe='/~')}"

    def _bucket_path(self, loc: Location) -> str:
        return self._host(loc.bucket).bucket_path(loc.bucket) or "/"

    def _connection(self, loc: Location):
        """This thread's connection, given back for reuse only after a clean, complete exchange."""
        host = self._host(loc.bucket)
        return kept_connection(host.local, host.connect, loc, f"the S3 endpoint {host.origin}")

    def _call(self, loc: Location, method: str, path: str, from_code, query: str = "",
              headers: dict[str, str] | None = None, body: bytes | None = None, host: _Host | None = None):
        """Send one request (``body``: a small one, signed whole): the answer, its body read (an
        error status raises). ``host``: where it goes, when not ``loc``'s bucket's host."""
        headers = dict(headers or {})
        host = host or self._host(loc.bucket)
        if body is not None:
            headers["Content-Length"] = str(len(body))
        host.signer.sign(method, host.netloc, path, query, headers, body)
        with kept_connection(host.local, host.connect, loc, f"the S3 endpoint {host.origin}") as conn:
            conn.request(method, f"{path}?{query}" if query else path, body=body, headers=headers)
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
        host = self._host(loc.bucket)
        host.signer.sign("GET", host.netloc, path, "", headers)
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
            got = receive(resp, size, loc, into, each)
        if not ranged and self.on_headers is not None:
            self.on_headers(loc, {name.lower(): value for name, value in resp.getheaders()})
        return got

    def get_many(self, locs: list[Location], each: Callable[[int, bytes], None], from_code, *,
                 connections: int, retries: int, pace: Callable[[int], None] | None = None) -> dict[int, BridgeError]:
        """Whole objects, ``connections`` requests in flight from this thread
        (``bridge.stores.streams.each_of``: ``each(i, body)`` here as each arrives, failures by index)."""

        async def send(i: int, link) -> bytes:
            loc = locs[i]
            path = self._path(loc)
            headers: dict[str, str] = {}
            host = self._host(loc.bucket)
            host.signer.sign("GET", host.netloc, path, "", headers)
            answer = await link.send("GET", path, headers, what=str(loc), alike=loc.bucket)
            if answer.status >= 300:
                raise _error_of(loc, answer.status, answer.body[:65536], from_code)
            if self.on_headers is not None:
                self.on_headers(loc, answer.headers)
            return answer.body

        if not locs:
            return {}
        return self._each_of(self._host(locs[0].bucket), len(locs), send, each, connections, retries, pace)

    def head(self, loc: Location, from_code) -> dict:
        """HEAD one object, checksums asked for; the answer named as botocore's head_object names
        it (ContentLength, ETag, LastModified, VersionId, ChecksumCRC32C, ChecksumType, Metadata)."""
        resp, _ = self._call(loc, "HEAD", self._path(loc), from_code,
                             headers={"x-amz-checksum-mode": "ENABLED"})
        got = resp.getheader
        answer = {"ContentLength": int(got("Content-Length", "0")), "ETag": got("ETag"),
                  "VersionId": got("x-amz-version-id"), "ChecksumCRC32C": got("x-amz-checksum-crc32c"),
                  "ChecksumCRC64NVME": got("x-amz-checksum-crc64nvme"), "ChecksumCRC32": got("x-amz-checksum-crc32"),
                  "ChecksumType": got("x-amz-checksum-type"),
                  "StorageClass": got("x-amz-storage-class"), "Restore": got("x-amz-restore"),
                  **{name: got(header) for name, header in PUT_HEADERS.items()
                     if name.startswith(("Content", "Cache"))},
                  "LastModified": parsedate_to_datetime(got("Last-Modified")) if got("Last-Modified") else None,
                  "Metadata": {name[len("x-amz-meta-"):].lower(): value for name, value in resp.getheaders()
                               if name.lower().startswith("x-amz-meta-")}}
        return {k: v for k, v in answer.items() if v is not None}

    def head_bucket(self, loc: Location, from_code) -> None:
        """HEAD the bucket of ``loc``: nothing on success, else bridge's error for the status."""
        self._call(loc, "HEAD", self._bucket_path(loc), from_code)

    def bucket_region(self, loc: Location, from_code) -> str:
        """The region of ``loc``'s bucket: on AWS the one S3 named for it (``_region_of``);
        elsewhere GetBucketLocation's answer, none meaning us-east-1 (where S3 began)."""
        if self.aws:
            return self._host(loc.bucket).region
        _, body = self._call(loc, "GET", self._bucket_path(loc), from_code, query="location=")
        try:
            text = ET.fromstring(body).text
        except ET.ParseError as exc:
            raise TransientError(f"{loc}: the bucket's location could not be parsed ({exc})") from exc
        return (text or "").strip() or "us-east-1"

    def delete(self, loc: Location, from_code) -> None:
        self._call(loc, "DELETE", self._path(loc), from_code)

    def delete_many(self, bucket: Location, keys: list[str], from_code) -> list[BridgeError]:
        """DeleteObjects of up to 1,000 ``keys`` in ``bucket`` (quiet: S3 answers only the keys it
        could not delete; a key already gone counts as deleted). The errors of the keys it
        refused, as ``from_code`` names them; a refusal of the whole request raises."""
        from xml.sax.saxutils import escape
        body = "".join(
            ["<Delete xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Quiet>true</Quiet>"]
            + [f"<Object><Key>{escape(key)}</Key></Object>" for key in keys]
            + ["</Delete>"]).encode()
        # S3 requires a checksum of the body on DeleteObjects: Content-MD5
        headers = {"Content-Type": "application/xml",
                   "Content-MD5": base64.b64encode(hashlib.md5(body).digest()).decode()}
        _, answer = self._call(bucket, "POST", self._bucket_path(bucket), from_code, query="delete=",
                               headers=headers, body=body)
        root, ns = _answer_of(bucket, answer, from_code)
        return [from_code(Location(bucket.scheme, bucket.bucket, error.findtext(f"{ns}Key", "")), error.findtext(f"{ns}Code", ""),
                          error.findtext(f"{ns}Message", ""))
                for error in root.iterfind(f"{ns}Error")]

    def _list_xml(self, loc: Location, params: dict[str, str], from_code, path: str | None = None,
                  host: _Host | None = None) -> tuple[ET.Element, str]:
        """GET the bucket of ``loc`` (or ``path``) with a query; the parsed XML answer and its namespace."""
        return _xml(loc, self._list_body(loc, params, from_code, path, host))

    def _list_body(self, loc: Location, params: dict[str, str], from_code, path: str | None = None,
                   host: _Host | None = None) -> bytes:
        """GET the bucket of ``loc`` (or ``path``) with a query; the answer's body."""
        query = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(params.items()))
        return self._call(loc, "GET", path or self._bucket_path(loc), from_code, query=query, host=host)[1]

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

    def list_page(self, prefix: Location, token: str | None, from_code,
                  level: bool = False) -> tuple[tuple[list[tuple[str, str, str, str, str]], list[str]], str | None]:
        """One page of ListObjectsV2 under ``prefix`` (from ``token``): per object (Key, Size,
        ETag, LastModified, StorageClass) as the XML gives them, the common prefixes below it
        (``level``: one level, delimiter "/"), and the next page's token (None: the last).
        Keys are asked for URL-encoded (a space comes back as "+"), and decoded as botocore
        decodes them, so that any key survives XML. A page in S3's usual layout is read by a
        pattern (``_plain_listing``), any other by ElementTree (``_tree_listing``)."""
        params = {"list-type": "2", "prefix": prefix.key, "encoding-type": "url"}
        if level:
            params["delimiter"] = "/"
        if self.page_size:
            params["max-keys"] = str(self.page_size)
        if token:
            params["continuation-token"] = token
        body = self._list_body(prefix, params, from_code)
        plain = None if level else _plain_listing(body)
        if plain is None:
            return _tree_listing(prefix, body)
        objects, encoded, following = plain
        if encoded:
            objects = [(unquote_plus(o[0]) if "%" in o[0] or "+" in o[0] else o[0], *o[1:]) for o in objects]
        return (objects, []), following


# put_object's parameters that travel as headers of their own (Metadata goes as x-amz-meta-*).
PUT_HEADERS = {"ContentType": "Content-Type", "ContentEncoding": "Content-Encoding",
               "ContentDisposition": "Content-Disposition", "ContentLanguage": "Content-Language",
               "CacheControl": "Cache-Control", "StorageClass": "x-amz-storage-class",
               "ServerSideEncryption": "x-amz-server-side-encryption",
               "SSEKMSKeyId": "x-amz-server-side-encryption-aws-kms-key-id",
               "BucketKeyEnabled": "x-amz-server-side-encryption-bucket-key-enabled"}


def _param_headers(params: dict) -> dict[str, str]:
    """put_object's (or create_multipart_upload's) parameters as the headers that carry them."""
    headers = {f"x-amz-meta-{k}": v for k, v in params.get("Metadata", {}).items()}
    for name, value in params.items():
        if name in PUT_HEADERS:
            headers[PUT_HEADERS[name]] = str(value).lower() if isinstance(value, bool) else value
    return headers


# One page of ListObjectsV2 in the layout S3 and its emulators write (no delimiter): the document
# whole, each object's elements in S3's order (with or without checksum fields and owner), the
# rest simple elements, no comments, CDATA, character references, attributes or characters XML
# refuses. Read by one pattern in a third of ElementTree's time (a page of 1,000 objects: 1.1 ms
# against 3.7 ms, 1.8 ms where every ETag is quoted by entities, as AWS's are; adopting 100,000
# files lists 100 pages). Any other document is ElementTree's, which reads it whole or refuses it.
_S = r"[ \t\n]*"   # XML's white space (a CR sends the page to ElementTree, which reads it as LF)
_OWNER = rf"(?:<Owner>{_S}(?:<(?:ID|DisplayName)>[^<]*</(?:ID|DisplayName)>{_S})*</Owner>{_S})?"
_LISTING = re.compile(
    rf'\A(?:<\?xml version="1\.0" encoding="(?i:utf-8)"\?>)?{_S}'
    rf'<ListBucketResult xmlns="http://s3\.amazonaws\.com/doc/2006-03-01/">(.*)</ListBucketResult>{_S}\Z', re.S)
_LISTED = re.compile(
    rf"<Contents>{_S}<Key>([^<]*)</Key>{_S}<LastModified>([^<]*)</LastModified>{_S}<ETag>([^<]*)</ETag>{_S}"
    rf"(?:<Checksum(?:Algorithm|Type)>[^<]*</Checksum(?:Algorithm|Type)>{_S})*<Size>([^<]*)</Size>{_S}"
    rf"{_OWNER}<StorageClass>([^<]*)</StorageClass>{_S}{_OWNER}</Contents>"
    r"|<(\w+)>([^<]*)</\6>"   # an element of the page's own: its name and text
    r"|([^ \t\n])")           # anything else: not this layout
_CONTROL = bytes([*range(0x09), 0x0b, 0x0c, *range(0x0e, 0x20)])   # characters no XML document holds
_NONCHARACTERS = re.compile("[\ufffe\uffff]")                     # (and these two)
_OTHER_REFERENCE = re.compile("&(?!(?:lt|gt|amp|quot|apos);)")     # anything but XML's own five entities
_ENTITIES = (("&lt;", "<"), ("&gt;", ">"), ("&quot;", '"'), ("&apos;", "'"), ("&amp;", "&"))


def _plain_listing(body: bytes) -> tuple[list[tuple[str, str, str, str, str]], bool, str | None] | None:
    """A ListObjectsV2 page in S3's own layout, read as ElementTree would read it: its objects
    (Key, Size, ETag, LastModified, StorageClass; keys as sent), whether the keys are URL-encoded,
    and the next page's token (None: the last). None for any other document, for ElementTree."""
    # (Comments, CDATA and declarations begin with "<!", which no element's text holds and no
    # branch of the pattern takes; what a text may hold is checked here, each in a pass of C.)
    if b"\r" in body or len(body.translate(None, _CONTROL)) != len(body):
        return None   # a CR (which XML reads as LF) or characters XML refuses
    try:
        text = body.decode()
    except UnicodeDecodeError:
        return None
    amp = "&" in text
    if (amp and _OTHER_REFERENCE.search(text)) or ("]" in text and "]]>" in text) \
            or (not text.isascii() and _NONCHARACTERS.search(text)):
        return None   # character references, entities of a DTD's, or what XML refuses
    whole = _LISTING.match(text)
    if whole is None:
        return None
    objects = []
    top: dict[str, str] = {}
    for key, modified, etag, size, storage, name, value, stray in _LISTED.findall(whole.group(1)):
        if stray:
            return None
        if name:
            if name in top or name in ("Contents", "CommonPrefixes"):
                return None
            top[name] = _unescaped(value)
        elif amp:
            objects.append((_unescaped(key), _unescaped(size) or "0", _unescaped(etag), _unescaped(modified),
                            _unescaped(storage)))
        else:
            objects.append((key, size or "0", etag, modified, storage))
    following = top.get("NextContinuationToken")
    if top.get("IsTruncated") != "true":
        following = None
    elif not following:
        return None   # ElementTree's reading raises it
    return objects, top.get("EncodingType") == "url", following


def _tree_listing(prefix: Location, body: bytes) -> tuple[tuple[list[tuple[str, str, str, str, str]], list[str]], str | None]:
    """``list_page``'s answer from any ListObjectsV2 document, read by ElementTree."""
    root, ns = _xml(prefix, body)
    encoded = root.findtext(f"{ns}EncodingType") == "url"
    cut = len(ns)
    objects = []
    for item in root.iterfind(f"{ns}Contents"):
        fields = {child.tag[cut:]: child.text for child in item}
        key = fields.get("Key") or ""
        if encoded and ("%" in key or "+" in key):
            key = unquote_plus(key)
        objects.append((key, fields.get("Size") or "0", fields.get("ETag") or "",
                        fields.get("LastModified") or "", fields.get("StorageClass") or ""))
    prefixes = []
    for common in root.iterfind(f"{ns}CommonPrefixes"):
        key = common.findtext(f"{ns}Prefix", "")
        prefixes.append(unquote_plus(key) if encoded else key)
    following = root.findtext(f"{ns}NextContinuationToken")
    if root.findtext(f"{ns}IsTruncated") != "true":
        return (objects, prefixes), None
    if not following:
        raise BridgeError(f"{prefix}: the endpoint truncated the listing without saying where "
                          f"the next page starts")
    return (objects, prefixes), following


def _unescaped(text: str) -> str:
    if "&" in text:
        for entity, char in _ENTITIES:
            text = text.replace(entity, char)
    return text


def _xml(loc: Location, body: bytes) -> tuple[ET.Element, str]:
    """An answer's XML and its namespace; one that does not parse is worth another try."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError as exc:
        raise TransientError(f"{loc}: S3's answer could not be parsed ({exc})") from exc
    return root, root.tag[:root.tag.index("}") + 1] if root.tag.startswith("{") else ""


def _answer_of(loc: Location, body: bytes, from_code) -> tuple[ET.Element, str]:
    """The XML of a 200 answer that may still be an error (CompleteMultipartUpload, CopyObject,
    UploadPartCopy: S3 sends the status before it knows, and botocore reads the body so): that
    error raised, as a 500's would be."""
    root, ns = _xml(loc, body)
    if root.tag == "Error" or root.tag.endswith("}Error"):
        raise _error_of(loc, 500, body, from_code)
    return root, ns


def _copy_source(src: Location) -> str:
    """x-amz-copy-source for ``src``, percent-encoded as botocore encodes it."""
    return quote(f"{src.bucket}/{src.key}", safe="/-._~")


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
    and tests/test_credentials.py compare the two on the same request, for each kind of
    credentials), at a fraction of its Python per request: the signing key is derived once a day
    (and again when the keys change), and the request is ours, so its headers need no normalising.
    Every header sent is signed. The payload's SHA-256 is signed over plain HTTP; over HTTPS,
    like botocore when a checksum header is sent, the payload is UNSIGNED-PAYLOAD (TLS and the
    CRC32C S3 checks cover the body). ``keys()`` is asked for the keys at each signature."""

    def __init__(self, keys: Keys, region: str, https: bool):
        self.keys, self.region, self.https = keys, region, https
        self._derived: tuple[str, str, bytes] = ("", "", b"")   # (day, secret, signing key)

    def _key_for(self, day: str, secret: str) -> bytes:
        derived = self._derived
        if derived[0] != day or derived[1] != secret:
            k = hmac_sha256(("AWS4" + secret).encode(), day.encode())
            for part in (self.region, "s3", "aws4_request"):
                k = hmac_sha256(k, part.encode())
            derived = self._derived = (day, secret, k)
        return derived[2]

    def sign(self, method: str, host: str, path: str, query: str, headers: dict[str, str],
             body: bytes | bytearray | memoryview | None = None, now: float | None = None,
             payload_sha256: str | None = None) -> None:
        """Add Host, x-amz-date, x-amz-content-sha256, the token and Authorization to ``headers``.
        ``path`` is sent as given (already percent-encoded), ``query`` in canonical form
        (sorted, encoded). ``payload_sha256``: ``body``'s SHA-256 in hex, when the caller has
        already taken it (a part's own SHA-256, bridge's default digest): over plain HTTP it is
        signed as it is, where hashing the body again cost a second pass over every byte sent (a
        ``cp`` of 512 MiB over HTTP: 1.92-2.27 s of user CPU with it, 1.27-1.61 s without)."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
        day = stamp[:8]
        if body is not None and not self.https:
            payload = payload_sha256 or hashlib.sha256(body).hexdigest()
        elif body is not None:
            payload = "UNSIGNED-PAYLOAD"
        else:
            payload = _EMPTY_SHA256
        keys = self.keys()
        key, secret, token = keys[0], keys[1], keys[2]
        headers["Host"] = host   # sent as signed (http.client then adds none of its own)
        headers["x-amz-date"] = stamp
        headers["x-amz-content-sha256"] = payload
        if token:
            headers["x-amz-security-token"] = token
        signed = sorted((k.lower(), " ".join(str(v).split())) for k, v in headers.items())
        names = ";".join(k for k, _ in signed)
        canonical = "\n".join((method, path, query, "".join(f"{k}:{v}\n" for k, v in signed), names, payload))
        scope = f"{day}/{self.region}/s3/aws4_request"
        to_sign = f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        signature = hmac_sha256(self._key_for(day, secret), to_sign.encode()).hex()
        headers["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={key}/{scope}, "
                                    f"SignedHeaders={names}, Signature={signature}")

    def presign(self, method: str, host: str, path: str, expires: int, now: float | None = None) -> str:
        """The query of a presigned URL for ``method`` on ``path`` (percent-encoded), valid
        ``expires`` seconds, as botocore's S3SigV4QueryAuth makes it: the credential, date,
        lifetime and session token in the query, the Host header alone signed, the payload
        UNSIGNED-PAYLOAD, the signature last."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
        day = stamp[:8]
        keys = self.keys()
        key, secret, token = keys[0], keys[1], keys[2]
        scope = f"{day}/{self.region}/s3/aws4_request"
        params = {"X-Amz-Algorithm": "AWS4-HMAC-SHA256", "X-Amz-Credential": f"{key}/{scope}",
                  "X-Amz-Date": stamp, "X-Amz-Expires": str(expires), "X-Amz-SignedHeaders": "host"}
        if token is not None:   # as botocore: an empty token (a test's IMDS) still goes, empty
            params["X-Amz-Security-Token"] = token
        query = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(params.items()))
        canonical = "\n".join((method, path, query, f"host:{host}\n", "host", "UNSIGNED-PAYLOAD"))
        to_sign = f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        signature = hmac_sha256(self._key_for(day, secret), to_sign.encode()).hex()
        return f"{query}&X-Amz-Signature={signature}"
