"""GCS reads without the event loop: one keep-alive http.client connection per thread, the JSON
API's media GET read straight into the buffer that is returned, object metadata, bucket metadata
and listing pages as plain JSON GETs.

Why: gcsfs runs every request of the engine's threads on one aiohttp event loop, and
each small GET paid gcsfs's and aiohttp's Python there, one request at a time; a big object's
bytes were copied out of the parser, joined, then copied again. Here each thread sends its own
request and reads the body with ``readinto`` (one copy, from the socket into the buffer) while
the GIL is free. Batches of small whole objects (``get_many``, the engine's "batch" units) go
over a few keep-alive connections of one event loop in the calling thread
(bridge.stores.streams), where a thread per request spends its time passing the GIL around.

The requests are the ones gcsfs sent for the same calls (``/storage/v1/b/{bucket}/o/{name}``,
with ``alt=media`` for the bytes; listing pages of 1,000), so what comes back is the same JSON
and the same bytes, with one difference kept on purpose: a media GET asks for
``Accept-Encoding: gzip``, so an object stored with ``Content-Encoding: gzip`` comes back as the
bytes GCS stores, whose size and CRC32C are the ones its metadata and listing report (aiohttp
under gcsfs let GCS decompress it, and the copy then failed on a size that did not match).

Used for:
- an explicit endpoint (``settings.gcs.endpoint``: an emulator), reached anonymously as gcsfs
  reaches it;
- Google credentials (a key file, or application default credentials) on the default endpoint
  ``https://storage.googleapis.com``: the bearer token of the google.auth credentials object,
  refreshed under a lock when it has expired (or is about to: google.auth's ``valid``). Not when
  the credentials belong to another universe, nor when client certificates are asked for (mTLS,
  GOOGLE_API_USE_CLIENT_CERTIFICATE): those keep gcsfs, which knows them.
Batches of small whole objects go up here too (``put_many``: the multipart upload gcsfs sends,
their CRC32C in it, over the same event loop), and so do single objects and a big file's parts
(``put``), their compose and deletes: an upload never imports gcsfs and aiohttp (0.6-0.9 s of
import on a busy two-core machine, and 40 MiB of a 1 GiB upload's peak memory). Rewrites stay
on gcsfs. Failures are raised as bridge's errors with the meaning gcs.py gives gcsfs's; nothing
is retried here (the store retries each call through bridge.retry, the one retry layer).
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import zlib
from collections.abc import Callable
from urllib.parse import quote, urlencode, urlsplit

from bridge.errors import (BridgeError, BucketNotFound, CredentialsMissing,
                           ObjectNotFound, PermissionDenied, TransientError)
from bridge import bwlimit, meter
from bridge.stores.base import hand_over, kept_connection, receive, tls_context
from bridge.urls import Location

DEFAULT_ENDPOINT = "https://storage.googleapis.com"


class Bearer:
    """The Authorization header from a google.auth credentials object, refreshed by one thread
    at a time when google.auth says the token is no longer valid (expired, or expiring within
    its refresh threshold); the other threads wait for that refresh and use its token."""

    def __init__(self, credentials):
        self.credentials = credentials
        self._lock = threading.Lock()
        self._request = None

    def apply(self, headers: dict[str, str]) -> None:
        creds = self.credentials
        if not creds.valid:
            with self._lock:
                if not creds.valid:
                    self._refresh()
        creds.apply(headers)   # Authorization, and x-goog-user-project for a quota project

    def _refresh(self) -> None:
        import google.auth.exceptions
        from google.auth.transport.requests import Request
        if self._request is None:
            self._request = Request()
        try:
            self.credentials.refresh(self._request)
        except google.auth.exceptions.TransportError as exc:
            raise TransientError(f"cannot refresh the Google access token: {exc}") from exc
        except google.auth.exceptions.RefreshError as exc:
            raise PermissionDenied(f"Google refused to refresh the access token: {exc}") from exc
        except google.auth.exceptions.DefaultCredentialsError as exc:
            raise CredentialsMissing(f"the Google credentials cannot make an access token: {exc}") from exc


def _document(loc: Location, body: bytes) -> dict:
    """GCS's JSON answer about ``loc``; one that cannot be read is worth another try."""
    try:
        return json.loads(body)
    except ValueError as exc:
        raise TransientError(f"{loc}: GCS's answer could not be read as JSON ({exc})") from exc


class Direct:
    page_size: int = 1000   # objects per listing page, as gcsfs asks for

    def __init__(self, endpoint: str, bearer: Bearer | None, timeout: float, cafile: str | None = None):
        url = urlsplit(endpoint)
        # HTTPS verified against the settings' CA bundle (transfer.ca_bundle) or the system's
        self._tls = tls_context(cafile) if url.scheme == "https" else None
        tls = {"context": self._tls} if self._tls is not None else {}
        self.endpoint = endpoint
        self.origin = f"{url.scheme}://{url.netloc}"
        self.netloc = url.netloc
        self._timeout = timeout
        self.base = url.path.rstrip("/") + "/storage/v1/b/"
        self.upload_base = url.path.rstrip("/") + "/upload/storage/v1/b/"
        self._bearer = bearer
        self.root = url.path.rstrip("/")
        self._connect = lambda: meter.connection(url.scheme == "https", "gs", self.root)(
            url.hostname, url.port, timeout=timeout, **tls)
        self._local = threading.local()

    @classmethod
    def for_store(cls, endpoint: str | None, token, timeout: float, cafile: str | None = None) -> Direct | None:
        """The direct path for a GCS store: ``endpoint`` as set (None: Google's), ``token`` what
        the store resolved its credentials to ("anon", a key file's path, or a google.auth
        credentials object), ``cafile`` the CA bundle to verify HTTPS with (None: the system's).
        None where gcsfs must stay (see the module's docstring)."""
        if token == "anon":
            return cls(endpoint or DEFAULT_ENDPOINT, None, timeout, cafile)
        if endpoint:
            return None
        credentials = _google_credentials(token)
        if credentials is None:
            return None
        return cls(DEFAULT_ENDPOINT, Bearer(credentials), timeout, cafile)

    # -- requests ---------------------------------------------------------------------------
    def _object_path(self, loc: Location) -> str:
        return f"{self.base}{quote(loc.bucket, safe='')}/o/{quote(loc.key, safe='')}"

    def _connection(self, loc: Location):
        """This thread's connection, given back for reuse only after a clean, complete exchange."""
        return kept_connection(self._local, self._connect, loc, f"the GCS endpoint {self.endpoint}")

    def _send(self, conn, loc: Location, method: str, target: str, headers: dict[str, str], body=None):
        """One request on ``conn``, its answer (its status checked: an error raises)."""
        if self._bearer is not None:
            self._bearer.apply(headers)
        conn.request(method, target, body=body, headers=headers)
        resp = conn.getresponse()
        if resp.status >= 300:
            raise _error(loc, resp)
        return resp

    def _json(self, loc: Location, target: str, method: str = "GET", body: bytes | None = None,
              headers: dict[str, str] | None = None) -> dict:
        """The JSON document GCS answers a request with."""
        with self._connection(loc) as conn:
            answer = self._send(conn, loc, method, target, headers or {}, body).read()
        return _document(loc, answer)

    def get(self, loc: Location, offset: int = 0, length: int | None = None,
            into: bytearray | None = None, each=None) -> bytearray | memoryview | int:
        """Bytes [offset, offset+length) of ``loc`` as GCS stores them (all of it when length
        is None), or with ``into`` and ``each`` handed over piece by piece and counted
        (bridge.stores.base.receive)."""
        headers = {"Accept-Encoding": "gzip"}
        ranged = bool(offset) or length is not None
        if ranged:
            headers["Range"] = f"bytes={offset}-{'' if length is None else offset + length - 1}"
        with self._connection(loc) as conn:
            resp = self._send(conn, loc, "GET", self._object_path(loc) + "?alt=media", headers)
            got_range = resp.getheader("Content-Range", "")
            if ranged and not got_range.startswith(f"bytes {offset}-"):
                raise BridgeError(f"{loc}: the endpoint ignored the byte range asked for "
                                  f"(HTTP {resp.status}, Content-Range {got_range!r})")
            if _compressed_on_the_way(resp.getheader):
                buf = bytearray(_gunzip(loc, resp.read(), length))
                return buf if each is None else hand_over(buf, len(into or buf) or 1, each)
            announced = resp.getheader("Content-Length")
            if announced is None:   # chunked: no size to read into
                buf = bytearray(resp.read())
                if length is not None and len(buf) != length:
                    raise TransientError(f"{loc}: the endpoint sent {len(buf)} bytes, asked for {length}")
                return buf if each is None else hand_over(buf, len(into or buf) or 1, each)
            size = int(announced)
            if length is not None and size != length:
                raise TransientError(f"{loc}: the endpoint announced {size} bytes, asked for {length}")
            return receive(resp, size, loc, into, each)

    def get_many(self, locs: list[Location], each: Callable[[int, bytes], None], *,
                 connections: int, retries: int, pace: Callable[[int], None] | None = None) -> dict[int, BridgeError]:
        """Whole objects, ``connections`` requests in flight from this thread
        (``bridge.stores.streams.each_of``: ``each(i, body)`` here as each arrives, failures by index)."""
        from bridge.stores.streams import each_of

        async def send(i: int, link) -> bytes:
            loc = locs[i]
            headers = {"Host": self.netloc, "Accept-Encoding": "gzip"}
            if self._bearer is not None:
                self._bearer.apply(headers)
            answer = await link.send("GET", self._object_path(loc) + "?alt=media", headers, what=str(loc),
                                     alike=loc.bucket)
            if answer.status >= 300:
                raise _error_of(loc, answer.status, answer.body[:65536])
            if _compressed_on_the_way(answer.headers.get):
                return _gunzip(loc, answer.body, None)
            return answer.body

        return each_of(len(locs), send, each, self.origin, connections=connections, timeout=self._timeout,
                       metered=("gs", self.root),
                       retries=retries, tls=self._tls, pace=pace)

    def put_many(self, count: int, body: Callable[[int], tuple], each: Callable[[int, dict], None], *,
                 connections: int, retries: int, ready=None) -> dict[int, BridgeError]:
        """Whole objects by multipart upload (objects.insert), ``connections`` in flight from this
        thread: ``body(i)`` gives (location, bytes, CRC32C base64, the object resource's other
        fields: metadata, headers, class) when object i is
        first about to go (its retries send the same), ``each(i, item)`` takes the object resource
        GCS answered with, as gcsfs's upload gives it. GCS checks the bytes against the CRC32C
        sent with them. Failures by index (bridge.stores.streams.each_of)."""
        from bridge.stores.streams import each_of
        bodies: dict[int, tuple] = {}

        async def send(i: int, link) -> dict:
            if i not in bodies:
                loc, data, crc32c_b64, resource = body(i)
                bodies[i] = (loc, *multipart(loc, data, crc32c_b64, resource))
                await bwlimit.settle()   # a bandwidth limit taken in body(): sent when due
            loc, content_type, payload = bodies[i]
            headers = {"Host": self.netloc, "Content-Type": content_type, "Content-Length": str(len(payload))}
            if self._bearer is not None:
                self._bearer.apply(headers)
            target = f"{self.upload_base}{quote(loc.bucket, safe='')}/o?uploadType=multipart"
            answer = await link.send("POST", target, headers, payload, what=str(loc), alike=loc.bucket)
            if answer.status >= 300:
                error = _error_of(loc, answer.status, answer.body[:65536])
                if isinstance(error, ObjectNotFound):   # an upload's 404: no such bucket
                    raise BucketNotFound(f"bucket {loc.bucket!r} does not exist") from error
                raise error
            item = _document(loc, answer.body)
            del bodies[i]
            return item

        return each_of(count, send, each, self.origin, connections=connections, timeout=self._timeout,
                       metered=("gs", self.root),
                       retries=retries, tls=self._tls, ready=ready)

    def put(self, loc: Location, data, crc32c_b64: str, resource: dict) -> dict:
        """One object by multipart upload (objects.insert) on this thread's connection, its body
        sent in pieces so that a cancelled job's request stops mid-way (bridge/meter.py): a
        whole object, or a part's temporary one. The object resource GCS answered with, as
        ``put_many`` gives it."""
        if len(data) > meter.PIECE:   # sent piece by piece, never joined into a second copy
            content_type, payload = multipart_pieces(loc, data, crc32c_b64, resource)
            length = sum(len(piece) for piece in payload)
        else:
            content_type, payload = multipart(loc, data, crc32c_b64, resource)
            length = len(payload)
        headers = {"Content-Type": content_type, "Content-Length": str(length)}
        # the name in the query too, as gcsfs sends it (bridge/meter.py tells a part by it)
        target = (f"{self.upload_base}{quote(loc.bucket, safe='')}/o?uploadType=multipart"
                  f"&name={quote(loc.key, safe='')}")
        try:
            return self._json(loc, target, "POST", payload, headers)
        except ObjectNotFound as error:   # an upload's 404: no such bucket
            raise BucketNotFound(f"bucket {loc.bucket!r} does not exist") from error

    def put_stream(self, loc: Location, length: int, pieces, resource: dict) -> dict:
        """``put`` of a body of ``length`` bytes that ``pieces`` yields as it comes, with no
        CRC32C in the request (the caller compares GCS's with the bytes it sent). One attempt:
        a body that was partly sent cannot be sent again from here."""
        import itertools
        content_type, (head, _, tail) = multipart_pieces(loc, b"", None, resource)
        headers = {"Content-Type": content_type, "Content-Length": str(len(head) + length + len(tail))}
        target = (f"{self.upload_base}{quote(loc.bucket, safe='')}/o?uploadType=multipart"
                  f"&name={quote(loc.key, safe='')}")
        return self._json(loc, target, "POST", itertools.chain((head,), pieces, (tail,)), headers)

    def compose(self, loc: Location, request: dict) -> dict:
        """objects.compose into ``loc`` (``request``: the composeRequest, as gcsfs sends it); the
        object resource GCS answered with."""
        payload = json.dumps(request).encode()
        return self._json(loc, f"{self._object_path(loc)}/compose", "POST", payload,
                          {"Content-Type": "application/json", "Content-Length": str(len(payload))})

    def delete(self, loc: Location) -> None:
        with self._connection(loc) as conn:
            self._send(conn, loc, "DELETE", self._object_path(loc), {}).read()

    def object(self, loc: Location) -> dict:
        """The object's metadata, as objects.get gives it (name, size, crc32c, md5Hash,
        generation, metadata, ...)."""
        return self._json(loc, self._object_path(loc))

    def bucket(self, loc: Location) -> dict:
        return self._json(loc, f"{self.base}{quote(loc.bucket, safe='')}")

    def list_page(self, prefix: Location, token: str | None) -> tuple[list[dict], str | None]:
        """One page of objects.list under ``prefix`` (from ``token``): the items, and the next
        page's token (None: the last)."""
        params = {"prefix": prefix.key, "maxResults": str(self.page_size)}
        if token:
            params["pageToken"] = token
        page = self._json(prefix, f"{self.base}{quote(prefix.bucket, safe='')}/o?"
                                  f"{urlencode(params, quote_via=quote, safe='')}")
        return page.get("items", []), page.get("nextPageToken") or None


def _compressed_on_the_way(header: Callable[[str], str | None]) -> bool:
    """gzip-compressed by the server for this answer only, the stored object not being so."""
    return ((header("content-encoding") or "").lower() == "gzip"
            and (header("x-goog-stored-content-encoding") or "").lower() != "gzip")


def _gunzip(loc: Location, body: bytes, length: int | None) -> bytes:
    try:
        data = zlib.decompress(body, wbits=31)
    except zlib.error as exc:
        raise TransientError(f"{loc}: a gzip-compressed answer could not be decompressed ({exc})") from exc
    if length is not None and len(data) != length:
        raise TransientError(f"{loc}: the endpoint sent {len(data)} bytes, asked for {length}")
    return data


def multipart(loc: Location, data, crc32c_b64: str, resource: dict) -> tuple[str, bytes]:
    """The Content-Type and body of a multipart upload (objects.insert, uploadType=multipart) of
    ``data`` to ``loc``, with its CRC32C and the resource's other fields (metadata, contentType
    ..., storageClass, kmsKeyName), as gcsfs sends one."""
    content_type, pieces = multipart_pieces(loc, data, crc32c_b64, resource)
    return content_type, b"".join(pieces)


def multipart_pieces(loc: Location, data, crc32c_b64: str | None, resource: dict) -> tuple[str, list]:
    """``multipart``'s body as its three pieces (head, ``data`` itself, tail), for a body too
    large to copy: a part of 8 MiB sent joined held a second 8 MiB copy while in flight.
    ``crc32c_b64`` None: the request declares no CRC32C (``Direct.put_stream``)."""
    meta = {"metadata": {}, **resource, "name": loc.key,
            **({"crc32c": crc32c_b64} if crc32c_b64 is not None else {})}
    boundary = "bridge-" + os.urandom(16).hex()
    head = b"".join([
        f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode(),
        json.dumps(meta).encode(),
        f"\r\n--{boundary}\r\nContent-Type: {resource.get('contentType') or 'application/octet-stream'}\r\n\r\n".encode(),
    ])
    return f"multipart/related; boundary={boundary}", [head, data, f"\r\n--{boundary}--\r\n".encode()]


def _error(loc: Location, resp) -> BridgeError:
    return _error_of(loc, resp.status, resp.read(65536))


def _error_of(loc: Location, status: int, body: bytes) -> BridgeError:
    """bridge's error for an error status, as gcs.py's ``_translate`` gives it for gcsfs's."""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body.decode("utf-8", "replace").strip()
    if status == 404:
        if "bucket does not exist" in message.lower():   # GCS: "The specified bucket does not exist."
            return BucketNotFound(f"bucket {loc.bucket!r} does not exist")
        return ObjectNotFound(f"{loc}: no such object")
    if status in (401, 403):
        return PermissionDenied(f"{loc}: access denied ({message or status})")
    if status == 429 or status >= 500:
        return TransientError(f"{loc}: HTTP {status}")
    return BridgeError(f"{loc}: GCS error {status}: {message}")


def _google_credentials(token):
    """A google.auth credentials object whose bearer token can be sent to Google's endpoint, or
    None (gcsfs then keeps the reads). ``token`` is a key file's path or a credentials object."""
    if _uses_client_cert() or os.environ.get(_UNIVERSE_VARIABLE, "googleapis.com") != "googleapis.com":
        return None
    if isinstance(token, str):
        token = _key_file_credentials(token)
    if not (hasattr(token, "refresh") and hasattr(token, "apply") and hasattr(token, "valid")):
        return None
    if getattr(token, "universe_domain", "googleapis.com") != "googleapis.com":
        return None
    return token


def _key_file_credentials(path: str):
    """The credentials of a service account's key or a user's (gcloud's) credentials file, as
    gcsfs reads them; None for any other kind of file (gcsfs then keeps the reads)."""
    from google.oauth2 import credentials, service_account
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
        if info.get("type") == "service_account":
            return service_account.Credentials.from_service_account_info(info, scopes=[_SCOPE])
        if info.get("type") == "authorized_user":
            return credentials.Credentials.from_authorized_user_info(info, scopes=[_SCOPE])
    except (OSError, ValueError, AttributeError):
        return None   # gcsfs reports what is wrong with the file when it reads it
    return None


_SCOPE = "https://www.googleapis.com/auth/devstorage.full_control"

# gcsfs sends to storage.{this universe} and presents a client certificate when google-auth says
# so; both are decided from the environment, there, when its filesystem is made. The direct path
# steps aside in both cases rather than send elsewhere than gcsfs would.
_UNIVERSE_VARIABLE = "GOOGLE_CLOUD_UNIVERSE_DOMAIN"


def _uses_client_cert() -> bool:
    from google.auth.transport import mtls
    should = getattr(mtls, "should_use_client_cert", None)
    return bool(should and should() and mtls.has_default_client_cert_source())
