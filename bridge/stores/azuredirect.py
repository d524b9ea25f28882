"""Azure Blob reads without the SDK's pipeline: one keep-alive http.client connection per thread,
requests signed with Shared Key here, the body read straight into the buffer that is returned.

Why: a download through azure-storage-blob runs each request through azure-core's
pipeline of policies (request ids, user agent, signing, response hooks, deserialisation) and
then joins the body out of the transport's chunks, a copy per chunk and another for the join.
Here Get Blob costs one signature and one request, and each thread of the engine reads its
answer with ``readinto`` (one copy, from the socket into the buffer) while the GIL is free.
bench/bench_speed.py --stores azure measures it against rclone on Azurite.

What is sent is what the SDK sends for the same call, with the same checks on the answer: Get
Blob, whole or a range (``x-ms-range``), the body's length against its Content-Length (and that
a range was honoured); Get Blob Properties (HEAD) for ``info``; List Blobs pages with metadata;
Get Container Properties for ``check_bucket``; and Put Blob for batches of small files
(``put_many``), with the Content-MD5 the SDK's ``validate_content`` sends. Single uploads, blocks,
block lists, copies and everything else stay on the SDK.

Used only where it is plainly equivalent: the settings give the account's shared key (a
connection string with AccountKey, read as the SDK reads it, or AZURE_STORAGE_ACCOUNT with
AZURE_STORAGE_KEY), and the endpoint is a plain blob endpoint, path-style
(``http://127.0.0.1:10000/devstoreaccount1``, as Azurite) or the account's own host
(``https://ACCOUNT.blob.core.windows.net``). The same holds for a SAS (AZURE_STORAGE_SAS_TOKEN with
the account, or a connection string's SharedAccessSignature with its BlobEndpoint: its parameters
go on every request) and for Azure AD (the account alone: azure-identity's DefaultAzureCredential,
so environment service principals, workload identity, managed identity, the Azure CLI login; its
bearer token asked for again before it expires; over HTTPS only, as azure-core has it). HTTPS is
verified against ``transfer.ca_bundle`` (MCBRIDGE_CA_BUNDLE, REQUESTS_CA_BUNDLE, SSL_CERT_FILE) or
the system's trust store. A job the direct path serves whole (a
download to local files) never imports the SDK: the store builds its client on first use.

Failures are raised as bridge's errors through the store's own ``from_code(loc, status, code)``,
the meaning azure.py gives the SDK's errors; a connection that cannot be opened is
EndpointUnreachable, one dropped or cut short is TransientError (bridge.stores.base.kept_connection,
as on the S3 and GCS direct paths). Nothing is retried here: the store retries each call
through bridge.retry, the one retry layer, and each attempt is one request.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import re
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from contextlib import suppress
from datetime import datetime
from email.utils import formatdate, parsedate_to_datetime
from urllib.parse import quote, unquote, urlsplit

from bridge.config import AzureSettings, Settings
from bridge.errors import BridgeError, BucketNotFound, IntegrityError, ObjectNotFound, TransientError
from bridge.hashing import hmac_sha256
from bridge import bwlimit, meter
from bridge.stores.base import kept_connection, receive, tls_context
from bridge.urls import Location

_CODE = re.compile(rb"<Code>([^<]+)</Code>")
# The service version sent, as azure-storage-blob sends its newest (tests/test_azuredirect.py
# checks that they agree).
API_VERSION = "2026-10-06"


def shared_key(az: AzureSettings) -> tuple[str, str, str] | None:
    """(blob endpoint, account name, account key) when the settings give the account's shared
    key, read as azure-storage-blob reads a connection string; None otherwise (a SAS, Azure AD,
    development storage, or a string the SDK is left to refuse)."""
    if az.connection_string:
        pairs = [part.split("=", 1) for part in az.connection_string.get_secret_value().rstrip(";").split(";")]
        if any(len(pair) != 2 for pair in pairs):
            return None
        conf = {name.upper(): value for name, value in pairs}
        account, key = conf.get("ACCOUNTNAME"), conf.get("ACCOUNTKEY")
        if not (account and key) or "USEDEVELOPMENTSTORAGE" in conf:
            return None
        endpoint = conf.get("BLOBENDPOINT")
        if not endpoint:
            if "BLOBSECONDARYENDPOINT" in conf:
                return None
            if "DEFAULTENDPOINTSPROTOCOL" in conf and "ENDPOINTSUFFIX" in conf:
                endpoint = f"{conf['DEFAULTENDPOINTSPROTOCOL']}://{account}.blob.{conf['ENDPOINTSUFFIX']}"
            else:
                endpoint = f"https://{account}.blob.{conf.get('ENDPOINTSUFFIX', 'core.windows.net')}"
    elif az.account_name and az.account_key:
        endpoint = az.endpoint or f"https://{az.account_name}.blob.core.windows.net"
        account, key = az.account_name, az.account_key.get_secret_value()
    else:
        return None
    try:
        base64.b64decode(key, validate=True)
    except ValueError:
        return None   # the SDK fails to sign with it, and says so
    return endpoint.rstrip("/"), account, key


# The standard headers Shared Key signs, by value, in this order (an absent one as an empty line).
_SIGNED = ("content-encoding", "content-language", "content-length", "content-md5", "content-type", "date",
           "if-modified-since", "if-match", "if-none-match", "if-unmodified-since", "range")


def _service_order(name: str) -> str:
    """The order the service sorts x-ms- header names in (azure-storage-blob's
    ``_storage_header_sort`` emulates it): hyphens do not count, '_' comes before digits and letters."""
    return name.replace("-", "").replace("_", "\x01")


class SharedKey:
    """Shared Key authorization as azure-storage-blob's SharedKeyCredentialPolicy makes it
    (tests/test_azuredirect.py compares the two on the same requests), without its pipeline."""

    query_suffix = ""

    def __init__(self, account: str, key: str):
        self.account = account
        self._key = base64.b64decode(key)
        self._second, self._date = -1, ""

    def _now(self, now: float | None) -> str:
        second = int(time.time() if now is None else now)
        if second != self._second:
            self._date, self._second = formatdate(second, usegmt=True), second
        return self._date

    def sign(self, method: str, path: str, query: dict[str, str], headers: dict[str, str],
             now: float | None = None) -> None:
        """Add x-ms-date and Authorization to ``headers``. ``path`` is sent as given (already
        percent-encoded); ``query`` holds the values before encoding."""
        headers["x-ms-date"] = self._now(now)
        lower = {k.lower(): str(v) for k, v in headers.items()}
        if lower.get("content-length") == "0":
            del lower["content-length"]
        standard = "".join(f"{lower.get(name, '')}\n" for name in _SIGNED)
        ms = "".join(f"{k}:{lower[k]}\n" for k in sorted((k for k in lower if k.startswith("x-ms-")),
                                                            key=_service_order))
        resource = f"/{self.account}{path}" + "".join(f"\n{k.lower()}:{v}" for k, v in sorted(query.items()))
        to_sign = f"{method}\n{standard}{ms}{resource}"
        signature = base64.b64encode(hmac_sha256(self._key, to_sign.encode())).decode()
        headers["Authorization"] = f"SharedKey {self.account}:{signature}"


class Sas:
    """A shared access signature: its query parameters go on every request as they were given;
    nothing is signed here (the service checks the signature the SAS carries)."""

    query_suffix: str

    def __init__(self, token: str):
        self.query_suffix = token.strip().lstrip("?")

    def sign(self, method: str, path: str, query: dict[str, str], headers: dict[str, str],
             now: float | None = None) -> None:
        pass


class Bearer:
    """Azure AD (Microsoft Entra ID): the bearer token of an azure-identity credential (any
    azure.core TokenCredential: DefaultAzureCredential, a managed identity, a service
    principal, workload identity) for Azure Storage, asked for again by one thread at a time
    within five minutes of its expiry, as azure-core's BearerTokenCredentialPolicy does; the
    other threads wait for it and use it."""

    SCOPE = "https://storage.azure.com/.default"
    REFRESH_BEFORE = 300   # seconds
    query_suffix = ""

    def __init__(self, credential):
        self.credential = credential
        self._lock = threading.Lock()
        self._token, self._expires = "", 0.0

    def sign(self, method: str, path: str, query: dict[str, str], headers: dict[str, str],
             now: float | None = None) -> None:
        if time.time() >= self._expires - self.REFRESH_BEFORE:
            with self._lock:
                if time.time() >= self._expires - self.REFRESH_BEFORE:
                    self._fetch()
        headers["Authorization"] = f"Bearer {self._token}"

    def _fetch(self) -> None:
        from bridge.errors import CredentialsMissing
        try:
            got = self.credential.get_token(self.SCOPE)
        except Exception as exc:   # azure.identity's CredentialUnavailableError, ClientAuthenticationError
            raise CredentialsMissing(f"no Azure AD token for Azure Storage: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc
        self._token, self._expires = got.token, float(got.expires_on)


def sas_or_identity(az: AzureSettings) -> tuple[str, str, Sas | Bearer] | None:
    """(blob endpoint, account, Sas or Bearer) for settings that give a SAS (with the account or
    a connection string's BlobEndpoint) or an account alone (Azure AD through azure-identity's
    DefaultAzureCredential, when it is installed); None otherwise."""
    if az.connection_string:
        pairs = [part.split("=", 1) for part in az.connection_string.get_secret_value().rstrip(";").split(";")]
        if any(len(pair) != 2 for pair in pairs):
            return None
        conf = {name.upper(): value for name, value in pairs}
        endpoint, sas = conf.get("BLOBENDPOINT"), conf.get("SHAREDACCESSSIGNATURE")
        if not (endpoint and sas) or "ACCOUNTKEY" in conf:
            return None
        path = urlsplit(endpoint).path.strip("/")
        account = conf.get("ACCOUNTNAME") or path or (urlsplit(endpoint).hostname or "").split(".")[0]
        return endpoint.rstrip("/"), account, Sas(sas)
    if not az.account_name or az.account_key:
        return None
    endpoint = (az.endpoint or f"https://{az.account_name}.blob.core.windows.net").rstrip("/")
    if az.sas_token:
        return endpoint, az.account_name, Sas(az.sas_token.get_secret_value())
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError:
        return None   # the SDK path says what to install
    return endpoint, az.account_name, Bearer(DefaultAzureCredential())


class Direct:
    page_size: int | None = None   # blobs per listing page; None: the service's (5,000)

    def __init__(self, endpoint: str, account: str, auth: SharedKey | Sas | Bearer, api_version: str, from_code,
                 connect_timeout: float, read_timeout: float, cafile: str | None = None):
        url = urlsplit(endpoint)
        self.endpoint = endpoint.rstrip("/")
        self.origin = f"{url.scheme}://{url.netloc}"
        self.netloc = url.netloc
        self.base = url.path.rstrip("/")
        self.version = api_version
        self.read_timeout = read_timeout
        self._timeout = max(connect_timeout, read_timeout)
        self._from_code = from_code
        self._tls = tls_context(cafile) if url.scheme == "https" else None
        tls = {"context": self._tls} if self._tls is not None else {}
        self._connect = lambda: meter.connection(url.scheme == "https", "az", self.base)(
            url.hostname, url.port, timeout=connect_timeout, **tls)
        self._signer = auth
        self.credentials = {SharedKey: "key", Sas: "sas", Bearer: "azure-ad"}[type(auth)]
        self._local = threading.local()

    @classmethod
    def for_settings(cls, settings: Settings, from_code) -> Direct | None:
        """The direct path for ``settings``, or None where the SDK path stays: no shared key, or
        an endpoint that is not plain."""
        found = shared_key(settings.azure)
        if found is not None:
            endpoint, account, key = found
            auth: SharedKey | Sas | Bearer = SharedKey(account, key)
        else:
            other = sas_or_identity(settings.azure)
            if other is None:
                return None
            endpoint, account, auth = other
        url = urlsplit(endpoint)
        if url.scheme not in ("http", "https") or url.query or url.fragment or url.username or not url.hostname:
            return None
        path = url.path.rstrip("/")
        path_style = path == f"/{account}"
        account_host = not path and url.hostname.startswith(f"{account}.blob.")
        if not (path_style or account_host) or (isinstance(auth, Bearer) and url.scheme != "https"):
            return None
        t = settings.transfer
        return cls(endpoint, account, auth, API_VERSION, from_code, t.connect_timeout, t.read_timeout,
                   t.ca_bundle)

    # -- one exchange on this thread's connection ---------------------------------------------------
    def _open(self) -> http.client.HTTPConnection:
        """A new connection, opened within the connect timeout, then reading within the read timeout."""
        conn = self._connect()
        try:
            conn.connect()
        except BaseException:
            conn.close()
            raise
        conn.sock.settimeout(self.read_timeout)
        return conn

    def _exchange(self, loc: Location, method: str, path: str, query: dict[str, str],
                  headers: dict[str, str], take_body, body=None):
        """Send one signed request; ``take_body(resp)`` of a success, else the error raised. The
        connection is kept for the thread's next request after a complete exchange, an error
        answer's included (its body is read to the end)."""
        headers["x-ms-version"] = self.version
        self._signer.sign(method, path, query, headers)
        target = self._target(path, query)
        with kept_connection(self._local, self._open, loc, f"the Azure endpoint {self.endpoint}") as conn:
            conn.request(method, target, body=body, headers=headers)
            resp = conn.getresponse()
            if resp.status >= 300:
                error, result = self._error(loc, resp, resp.read()), None
            else:
                error, result = None, take_body(resp)
        if error is not None:
            raise error
        return resp, result

    def _target(self, path: str, query: dict[str, str]) -> str:
        """The request's target: ``path``, the query, and a SAS's own parameters after it."""
        parts = [f"{k}={quote(v, safe='')}" for k, v in query.items()]
        if self._signer.query_suffix:
            parts.append(self._signer.query_suffix)
        return path + ("?" + "&".join(parts) if parts else "")

    def _error(self, loc: Location, resp, body: bytes) -> BridgeError:
        return self._error_of(loc, resp.status, resp.getheader("x-ms-error-code"), body)

    def _error_of(self, loc: Location, status: int, code: str | None, body: bytes) -> BridgeError:
        if not code:
            found = _CODE.search(body[:65536])
            code = found.group(1).decode() if found else ""
        return self._from_code(loc, status, code)

    def _path(self, loc: Location) -> str:
        return f"{self.base}/{quote(loc.bucket)}/{quote(loc.key, safe='~/')}"

    # -- Get Blob, Get Blob Properties, List Blobs -------------------------------------------------
    def check_container(self, loc: Location) -> None:
        """Get Container Properties: nothing when the container of ``loc`` exists, else BucketNotFound."""
        try:
            self._exchange(loc, "HEAD", f"{self.base}/{quote(loc.bucket)}", {"restype": "container"}, {},
                           lambda resp: resp.read())
        except ObjectNotFound as exc:   # an answer without an error code (a HEAD has no body)
            if isinstance(exc, BucketNotFound):
                raise
            raise BucketNotFound(f"container {loc.bucket!r} does not exist") from exc

    def get(self, loc: Location, offset: int = 0, length: int | None = None,
            into: bytearray | None = None, each=None) -> bytearray | memoryview | int:
        """Bytes [offset, offset+length) of ``loc`` (from offset to the end when length is None),
        or with ``into`` and ``each`` handed over piece by piece and counted
        (bridge.stores.base.receive)."""
        ranged = bool(offset) or length is not None
        headers = {}
        if ranged:
            headers["x-ms-range"] = f"bytes={offset}-{'' if length is None else offset + length - 1}"

        def body(resp) -> bytearray | memoryview | int:
            got_range = resp.getheader("Content-Range", "")
            if ranged and not got_range.startswith(f"bytes {offset}-"):
                raise BridgeError(f"{loc}: the endpoint ignored the byte range asked for "
                                  f"(HTTP {resp.status}, Content-Range {got_range!r})")
            size = int(resp.getheader("Content-Length", "-1"))
            if size < 0:
                raise TransientError(f"{loc}: the answer carries no Content-Length")
            return receive(resp, size, loc, into, each)

        return self._exchange(loc, "GET", self._path(loc), {}, headers, body)[1]

    def get_many(self, locs: list[Location], each: Callable[[int, bytes], None], *,
                 connections: int, retries: int, pace: Callable[[int], None] | None = None) -> dict[int, BridgeError]:
        """Whole blobs, ``connections`` requests in flight from this thread
        (``bridge.stores.streams.each_of``: ``each(i, body)`` here as each arrives, failures by
        index). A body is read to its Content-Length or the attempt fails, as get() reads one."""
        from bridge.stores.streams import each_of

        async def send(i: int, link) -> bytes:
            loc = locs[i]
            path = self._path(loc)
            headers = {"Host": self.netloc, "x-ms-version": self.version}
            self._signer.sign("GET", path, {}, headers)
            answer = await link.send("GET", self._target(path, {}), headers, what=str(loc), alike=loc.bucket)
            if answer.status >= 300:
                raise self._error_of(loc, answer.status, answer.headers.get("x-ms-error-code"), answer.body)
            return answer.body

        return each_of(len(locs), send, each, self.origin, connections=connections, timeout=self._timeout,
                       metered=("az", self.base),
                       retries=retries, tls=self._tls, pace=pace)

    def put_many(self, count: int, body: Callable[[int], tuple], each: Callable[[int, dict], None], *,
                 connections: int, retries: int, ready=None) -> dict[int, BridgeError]:
        """Put Blob for whole block blobs, ``connections`` requests in flight from this thread:
        ``body(i)`` gives (location, bytes, headers: metadata, content headers, tier) when blob i is first about to go (its
        retries send the same), ``each(i, answer)`` takes what the service answered: etag,
        last_modified, content_md5 (as ``head`` names them). Each body goes with its Content-MD5,
        which the service checks before it stores the blob and keeps as the blob's property, as
        the SDK's ``validate_content`` has it do; the MD5 the answer carries is compared too.
        Failures by index (bridge.stores.streams.each_of)."""
        from bridge.stores.streams import each_of
        bodies: dict[int, tuple] = {}

        async def send(i: int, link) -> dict:
            if i not in bodies:
                loc, data, extra = body(i)
                bodies[i] = (loc, data, extra, base64.b64encode(hashlib.md5(data).digest()).decode())
                await bwlimit.settle()   # a bandwidth limit taken in body(): sent, and signed, when due
            loc, data, extra, md5 = bodies[i]
            path = self._path(loc)
            headers = {"Host": self.netloc, "x-ms-version": self.version, "x-ms-blob-type": "BlockBlob",
                       "Content-Type": "application/octet-stream", "Content-Length": str(len(data)),
                       "Content-MD5": md5, **extra}
            self._signer.sign("PUT", path, {}, headers)
            answer = await link.send("PUT", self._target(path, {}), headers, data, what=str(loc),
                                     alike=loc.bucket)
            if answer.status >= 300:
                raise self._error_of(loc, answer.status, answer.headers.get("x-ms-error-code"), answer.body)
            got = answer.headers.get
            if got("content-md5", md5) != md5:
                raise IntegrityError(f"{loc}: stored with MD5 {got('content-md5')}, sent {md5}")
            del bodies[i]
            modified = got("last-modified")
            return {"etag": got("etag"), "last_modified": parsedate_to_datetime(modified) if modified else None,
                    "content_md5": base64.b64decode(md5)}

        return each_of(count, send, each, self.origin, connections=connections, timeout=self._timeout,
                       metered=("az", self.base),
                       retries=retries, tls=self._tls, ready=ready)

    def stage_block(self, loc: Location, block_id: str, data, extra: dict[str, str]) -> None:
        """Put Block on this thread's connection, with the Content-MD5 the service checks (and
        ``extra`` headers: an encryption scope); its body goes in pieces, so that a cancelled
        job's request stops mid-way (bridge/meter.py). ``block_id`` is sent base64-encoded, as the
        SDK's stage_block sends it (and its get_block_list decodes it)."""
        headers = {"Content-Length": str(len(data)),
                   "Content-MD5": base64.b64encode(hashlib.md5(data).digest()).decode(), **extra}
        self._exchange(loc, "PUT", self._path(loc), {"comp": "block", "blockid": base64.b64encode(block_id.encode()).decode()}, headers,
                       lambda resp: resp.read(), body=data)

    def head(self, loc: Location) -> dict:
        """Get Blob Properties: size, content_md5 (bytes or None), metadata, etag, last_modified."""
        resp, _ = self._exchange(loc, "HEAD", self._path(loc), {}, {}, lambda resp: resp.read())
        got = resp.getheader
        md5 = got("Content-MD5")
        modified = got("Last-Modified")
        return {"size": int(got("Content-Length", "0")), "content_md5": base64.b64decode(md5) if md5 else None,
                "metadata": {k[10:]: v for k, v in resp.getheaders() if k.lower().startswith("x-ms-meta-")},
                "etag": got("ETag"), "last_modified": parsedate_to_datetime(modified) if modified else None,
                "tier": got("x-ms-access-tier"),
                **{name: got(header) for name, header in _CONTENT.items()}}

    def list_page(self, prefix: Location, marker: str | None) -> tuple[list[dict], str | None]:
        """One page of List Blobs under ``prefix`` with their metadata, from ``marker``: per blob
        what head() gives and its name, and the next page's marker (None: the last)."""
        query = {"restype": "container", "comp": "list", "include": "metadata"}
        if prefix.key:
            query["prefix"] = prefix.key
        if marker:
            query["marker"] = marker
        if self.page_size:
            query["maxresults"] = str(self.page_size)
        _, body = self._exchange(prefix, "GET", f"{self.base}/{quote(prefix.bucket)}", query, {},
                                 lambda resp: resp.read())
        try:
            root = ET.fromstring(body)
        except ET.ParseError as exc:
            raise TransientError(f"{prefix}: the listing could not be parsed ({exc})") from exc
        blobs = []
        for blob in root.iterfind("Blobs/Blob"):
            name = blob.find("Name")
            text = name.text or "" if name is not None else ""
            props = blob.find("Properties")
            prop = (lambda tag: props.findtext(tag) or None) if props is not None else (lambda tag: None)
            md5, modified = prop("Content-MD5"), prop("Last-Modified")
            meta = blob.find("Metadata")
            blobs.append({"name": unquote(text) if name is not None and name.get("Encoded") == "true" else text,
                          "size": int(prop("Content-Length") or 0),
                          "content_md5": base64.b64decode(md5) if md5 else None,
                          "metadata": {m.tag: m.text or "" for m in meta} if meta is not None else {},
                          "etag": prop("Etag"),
                          "last_modified": _when(modified), "tier": prop("AccessTier"),
                          **{name: prop(header) for name, header in _CONTENT.items()}})
        return blobs, root.findtext("NextMarker") or None


# Content headers as Get Blob Properties names them (and List Blobs' Properties elements do).
_CONTENT = {"content_type": "Content-Type", "content_encoding": "Content-Encoding",
            "content_language": "Content-Language", "content_disposition": "Content-Disposition",
            "cache_control": "Cache-Control"}


def _when(text: str | None) -> datetime | None:
    if not text:
        return None
    with suppress(TypeError, ValueError):
        return parsedate_to_datetime(text)
    return None
