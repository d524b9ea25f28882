"""Google Cloud Storage over gcsfs's HTTP session (JSON API).

Large objects are uploaded as parallel parts, each a temporary object under the bucket's
``_bridge/uploads/<upload id>/`` carrying its CRC32C, then composed into the destination (32
sources per compose, in a tree when there are more). GCS computes the composite's CRC32C itself,
which is compared with the whole file's CRC32C.

Reads (bytes, object metadata, listings, bucket metadata) go through gcsdirect.py, one
http.client connection per thread, wherever it can stand in for gcsfs (an emulator's endpoint,
or Google credentials on Google's endpoint; see there), and so do batches of small uploads;
gcsfs and aiohttp are imported only when first needed, so a job that only reads from GCS never
loads them.
"""

from __future__ import annotations

import functools
import http.client
import importlib.util
import json
import os
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from bridge import attributes
from bridge.attributes import Attrs
from bridge import meter
from bridge.config import Settings
from bridge.errors import (BridgeError, BucketNotFound, CredentialsMissing, EndpointUnreachable,
                           IntegrityError, ObjectNotFound, PermissionDenied, TransientError)
from bridge.retry import call_with_retries
from bridge.stores.base import (put_args, GiB, MiB, RESERVED, DirectReads, Features, ObjectInfo, PartRecord, Store,
                                crc_b64_to_hex, crc_hex_to_b64, is_reserved)
from bridge.urls import Location

# Only that the SDK stack is installed is checked here (the registry turns an ImportError into
# an install hint); it is imported when first needed.
for _module in ("gcsfs", "aiohttp", "fsspec", "google.auth"):
    if importlib.util.find_spec(_module) is None:
        raise ImportError(f"No module named {_module!r}", name=_module)

UPLOADS = f"{RESERVED}/uploads/"
COMPOSE_MAX = 32


def _signed_v4(creds, endpoint: str, loc: Location, expires: int, now=None) -> str:
    """GET URL signed with the V4 scheme (GOOG4-RSA-SHA256, headers: host only)."""
    import datetime
    import hashlib
    from urllib.parse import quote, urlsplit
    now = now or datetime.datetime.now(datetime.timezone.utc)
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    host = urlsplit(endpoint).netloc
    path = f"/{loc.bucket}/{quote(loc.key, safe='/~')}"
    query = {"X-Goog-Algorithm": "GOOG4-RSA-SHA256",
             "X-Goog-Credential": f"{creds.service_account_email}/{day}/auto/storage/goog4_request",
             "X-Goog-Date": stamp, "X-Goog-Expires": str(expires), "X-Goog-SignedHeaders": "host"}
    canonical_query = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in sorted(query.items()))
    request = "\n".join(["GET", path, canonical_query, f"host:{host}\n", "host", "UNSIGNED-PAYLOAD"])
    to_sign = "\n".join(["GOOG4-RSA-SHA256", stamp, f"{day}/auto/storage/goog4_request",
                         hashlib.sha256(request.encode()).hexdigest()])
    signature = creds.sign_bytes(to_sign.encode()).hex()
    return f"{endpoint}{path}?{canonical_query}&X-Goog-Signature={signature}"


_SDK_LOCK = threading.Lock()


def _sdk():
    """``_load_sdk()``, imported by one thread at a time (two threads importing an SDK's modules
    at once can meet in Python's module locks: _DeadlockError)."""
    with _SDK_LOCK:
        return _load_sdk()


@functools.cache
def _load_sdk():
    import aiohttp
    from fsspec.asyn import sync
    from gcsfs.core import GCSFileSystem  # gcsfs.core skips the experimental gRPC bucket probe
    from gcsfs.retry import HttpError
    return aiohttp, sync, GCSFileSystem, HttpError


@contextmanager
def _translate(loc: Location, endpoint: str):
    aiohttp, _sync, _fs, HttpError = _sdk()
    try:
        yield
    except BridgeError:
        raise
    except FileNotFoundError as exc:
        raise ObjectNotFound(f"{loc}: no such object") from exc
    except (aiohttp.ClientConnectorError, ConnectionRefusedError) as exc:
        raise EndpointUnreachable(f"cannot reach the GCS endpoint {endpoint}: {type(exc).__name__}") from exc
    except (aiohttp.ClientError, TimeoutError, ConnectionError, http.client.IncompleteRead) as exc:
        # ClientPayloadError (a body cut short), ServerDisconnectedError, resets, timeouts
        raise TransientError(f"{loc}: connection dropped ({type(exc).__name__})") from exc
    except HttpError as exc:
        code = getattr(exc, "code", 0) or 0
        if code in (401, 403):
            raise PermissionDenied(f"{loc}: access denied ({exc.message})") from exc
        if code == 429 or code >= 500:
            raise TransientError(f"{loc}: HTTP {code}") from exc
        raise BridgeError(f"{loc}: GCS error {code}: {exc.message}") from exc
    except OSError as exc:
        if str(exc).startswith("Forbidden"):
            raise PermissionDenied(f"{loc}: access denied") from exc
        raise BridgeError(f"{loc}: {exc}") from exc
    except ValueError as exc:
        raise BridgeError(f"{loc}: GCS rejected the request: {str(exc).splitlines()[-1]}") from exc


def _credentials(settings: Settings):
    """The token argument for gcsfs: anonymous against an emulator, else real credentials,
    resolved here so that a missing one is an error and not a silent anonymous request."""
    gcs = settings.gcs
    if gcs.endpoint:
        return "anon"
    if gcs.credentials_file:
        if not os.path.exists(gcs.credentials_file):
            raise CredentialsMissing(f"GOOGLE_APPLICATION_CREDENTIALS points at a missing file: "
                                     f"{gcs.credentials_file}")
        return gcs.credentials_file
    try:
        import google.auth
        import google.auth.exceptions
        creds, _project = google.auth.default(
            scopes=["https://www.googleapis.com/auth/devstorage.full_control"])
    except google.auth.exceptions.DefaultCredentialsError as exc:
        raise CredentialsMissing("no Google credentials found: set GOOGLE_APPLICATION_CREDENTIALS "
                                 "or run 'gcloud auth application-default login'") from exc
    return creds


class GCSStore(DirectReads, Store):
    scheme = "gs"
    features = Features(checksums=frozenset({"crc32c", "md5"}), min_part_size=5 * MiB,
                        max_part_size=5 * 1024 * GiB, max_parts=10_000, max_object_size=5 * 1024 * GiB,
                        max_copy_size=5 * 1024 * GiB)

    def __init__(self, settings: Settings):
        self.settings = settings
        endpoint = settings.gcs.endpoint
        if endpoint and not endpoint.startswith("http"):
            endpoint = "http://" + endpoint
        self.endpoint = endpoint or "https://storage.googleapis.com"
        self._endpoint_url = endpoint
        self._token = _credentials(settings)
        from bridge.stores.gcsdirect import Direct
        # None: reads go through gcsfs too
        self._direct = Direct.for_store(endpoint, self._token, settings.transfer.read_timeout,
                                        settings.transfer.ca_bundle)
        self._fs = None
        self._fs_lock = threading.Lock()
        self.retries = settings.transfer.retries

    @property
    def fs(self):
        """The gcsfs filesystem, built on first use."""
        with self._fs_lock:
            if self._fs is None:
                _aiohttp, _sync, GCSFileSystem, _e = _sdk()
                from urllib.parse import urlsplit
                # every request of its session metered (bridge/meter.py)
                trace = meter.aiohttp_trace("gs", urlsplit(self.endpoint).path.rstrip("/"))
                self._fs = GCSFileSystem(project=self.settings.gcs.project or "", token=self._token,
                                         endpoint_url=self._endpoint_url, skip_instance_cache=True,
                                         requests_timeout=self.settings.transfer.read_timeout,
                                         session_kwargs={"trace_configs": [trace]})
                # gcsfs's _request retries inside; bridge.retry is the one retry layer, so call under it.
                self._raw_request = type(self._fs)._request.__wrapped__
            return self._fs

    # One request, no hidden retry loop; errors translated by the caller.
    async def _acall(self, method, path, *args, json_out=False, **kwargs):
        _status, headers, _info, contents = await self._raw_request(self.fs, method, path, *args, **kwargs)
        return json.loads(contents) if json_out else (headers, contents)

    def _call(self, loc: Location, method: str, path: str, *args, recovered=None, **kwargs):
        fs, sync = self.fs, _sdk()[1]

        def once():
            with _translate(loc, self.endpoint):
                return sync(fs.loop, self._acall, method, path, *args, **kwargs)
        return call_with_retries(once, self.retries, recovered=recovered, where=self.endpoint)

    def _direct_call(self, fn, recovered=None):
        """One request of the direct path, retried as _call's are (it raises bridge's errors itself)."""
        return call_with_retries(fn, self.retries, recovered=recovered, where=self.endpoint)

    @staticmethod
    def _info(bucket: str, item: dict) -> ObjectInfo:
        sums = {}
        if item.get("crc32c"):
            sums["crc32c"] = crc_b64_to_hex(item["crc32c"])
        if item.get("md5Hash"):
            sums["md5"] = crc_b64_to_hex(item["md5Hash"])
        # The generation changes with every write of the object's bytes and only then.
        identity = {"generation": str(item["generation"])} if item.get("generation") else {}
        # An ARCHIVE object reads at once on GCS (at a retrieval fee): nothing to restore.
        return ObjectInfo(Location("gs", bucket, item["name"]), int(item.get("size", 0)), sums,
                          dict(item.get("metadata") or {}), identity, attributes.from_gcs_resource(item),
                          item.get("storageClass") or "", modified=_when(item.get("updated")))

    def resource(self, loc: Location, metadata: dict[str, str], attrs: Attrs | None) -> dict:
        """The object resource of a write besides its name: headers, user metadata with bridge's,
        and this store's storage class (not for bridge's own records) and CMEK key."""
        out: dict = attributes.to_gcs_resource(attrs) if attrs else {}
        merged = {**(attrs.user if attrs else {}), **metadata}
        if merged:
            out["metadata"] = merged
        gcs = self.settings.gcs
        if gcs.storage_class and not is_reserved(loc.key):
            out["storageClass"] = gcs.storage_class
        if gcs.kms_key_name:
            out["kmsKeyName"] = gcs.kms_key_name
        return out

    def _list_raw(self, prefix: Location) -> Iterator[dict]:
        page = self._direct_page if self._direct is not None else self._gcsfs_page
        token = None
        while True:
            try:
                items, token = page(prefix, token)
            except ObjectNotFound as exc:
                raise BucketNotFound(f"bucket {prefix.bucket!r} does not exist") from exc
            yield from items
            if not token:
                return

    def _direct_page(self, prefix: Location, token: str | None) -> tuple[list[dict], str | None]:
        return self._direct_call(lambda: self._direct.list_page(prefix, token))

    def _gcsfs_page(self, prefix: Location, token: str | None) -> tuple[list[dict], str | None]:
        params = {"prefix": prefix.key, "maxResults": 1000}
        if token:
            params["pageToken"] = token
        page = self._call(prefix, "GET", "b/{}/o", prefix.bucket, json_out=True, **params)
        return page.get("items", []), page.get("nextPageToken")

    def list(self, prefix: Location) -> Iterator[ObjectInfo]:
        for item in self._list_raw(prefix):
            yield self._info(prefix.bucket, item)

    def list_level(self, prefix: Location) -> Iterator[ObjectInfo | Location]:
        """objects.list with delimiter='/': the objects at this level (``items``) and
        ``prefixes``."""
        token = None
        while True:
            params = {"prefix": prefix.key, "delimiter": "/", "maxResults": 1000}
            if token:
                params["pageToken"] = token
            try:
                page = self._call(prefix, "GET", "b/{}/o", prefix.bucket, json_out=True, **params)
            except ObjectNotFound as exc:
                raise BucketNotFound(f"bucket {prefix.bucket!r} does not exist") from exc
            for item in page.get("items", []):
                yield self._info(prefix.bucket, item)
            for sub in page.get("prefixes", []):
                yield Location("gs", prefix.bucket, sub)
            token = page.get("nextPageToken")
            if not token:
                return

    def info(self, loc: Location) -> ObjectInfo:
        if self._direct is not None:
            return self._info(loc.bucket, self._direct_call(lambda: self._direct.object(loc)))
        return self._info(loc.bucket, self._call(loc, "GET", "b/{}/o/{}", loc.bucket, loc.key, json_out=True))

    def read(self, loc: Location, offset: int = 0, length: int | None = None) -> bytes:
        if length == 0:
            return b""
        if self._direct is not None:
            return self._direct_call(lambda: self._direct.get(loc, offset, length))
        headers = {}
        if offset or length is not None:
            end = "" if length is None else str(offset + length - 1)
            headers["Range"] = f"bytes={offset}-{end}"
        _h, body = self._call(loc, "GET", "b/{}/o/{}", loc.bucket, loc.key, alt="media", headers=headers)
        return body

    def read_through(self, loc: Location, offset: int, length: int, buf: bytearray, each) -> int:
        if self._direct is None or not length:
            return super().read_through(loc, offset, length, buf, each)
        return self._direct_call(lambda: self._direct.get(loc, offset, length, into=buf, each=each))

    def _upload(self, loc: Location, data: bytes, crc32c: str, metadata: dict[str, str],
                attrs: Attrs | None = None) -> dict:
        from bridge.stores.gcsdirect import multipart
        content_type, body = multipart(loc, data, crc_hex_to_b64(crc32c), self.resource(loc, metadata, attrs))
        try:
            return self._call(loc, "POST", f"{self.fs._location}/upload/storage/v1/b/{{}}/o", loc.bucket,
                              uploadType="multipart", json_out=True, data=body,
                              headers={"Content-Type": content_type})
        except ObjectNotFound as exc:
            raise BucketNotFound(f"bucket {loc.bucket!r} does not exist") from exc

    def put(self, loc: Location, data: bytes, *, crc32c: str, metadata: dict[str, str],
            attrs: Attrs | None = None, sha256: str | None = None) -> ObjectInfo:
        if self._direct is not None:
            item = self._direct_call(lambda: self._direct.put(loc, data, crc_hex_to_b64(crc32c),
                                                              self.resource(loc, metadata, attrs)))
        else:
            item = self._upload(loc, data, crc32c, metadata, attrs)
        self._check_crc(loc, item, crc32c)
        return self._info(loc.bucket, item)

    @property
    def writes_many(self) -> bool:
        return self._direct is not None

    def put_many(self, count: int, body, each, *, connections: int | None = None, ready=None) -> dict:
        """Batches of small objects by the direct path's multipart uploads, several in flight from
        one thread: through gcsfs, a copy of 2,000 x 16 KiB files to fake-gcs-server took 3.0-3.9 s
        of CPU."""
        if self._direct is None:
            return super().put_many(count, body, each, ready=ready)
        sent: dict[int, tuple[Location, str]] = {}   # what each answer is about

        def request(i: int) -> tuple:
            loc, data, crc32c, metadata, attrs, _sha256 = put_args(body(i))
            sent[i] = (loc, crc32c)
            return loc, data, crc_hex_to_b64(crc32c), self.resource(loc, metadata, attrs)

        def answered(i: int, item: dict) -> None:
            loc, crc32c = sent.pop(i)
            self._check_crc(loc, item, crc32c)
            each(i, self._info(loc.bucket, item))

        return self._direct.put_many(count, request, answered,
                                     connections=connections or self.settings.transfer.concurrency,
                                     retries=self.retries, ready=ready)

    @staticmethod
    def _check_crc(loc: Location, item: dict, crc32c: str) -> None:
        reported = crc_b64_to_hex(item["crc32c"]) if item.get("crc32c") else None
        if reported != crc32c:
            raise IntegrityError(f"{loc}: GCS reports CRC32C {reported} for the written object, "
                                 f"expected {crc32c}")

    def delete(self, loc: Location) -> None:
        # A delete whose answer was lost is found done by the next attempt's 404.
        if self._direct is not None:
            self._direct_call(lambda: self._direct.delete(loc), recovered=lambda: self._gone(loc))
            return
        self._call(loc, "DELETE", "b/{}/o/{}", loc.bucket, loc.key, recovered=lambda: self._gone(loc))

    def _gone(self, loc: Location) -> bool:
        try:
            self.info(loc)
        except ObjectNotFound:
            return True
        return False

    def _bucket(self, loc: Location) -> dict:
        try:
            if self._direct is not None:
                return self._direct_call(lambda: self._direct.bucket(loc))
            return self._call(loc, "GET", "b/{}", loc.bucket, json_out=True)
        except ObjectNotFound as exc:
            raise BucketNotFound(f"bucket {loc.bucket!r} does not exist") from exc

    def check_bucket(self, loc: Location) -> None:
        self._bucket(loc)

    def buckets(self) -> list[str]:
        names, token = [], None
        where = Location("gs", "", "")
        while True:
            params = {"project": self.settings.gcs.project or "", **({"pageToken": token} if token else {})}
            page = self._call(where, "GET", "b", json_out=True, **params)
            names += [item["name"] for item in page.get("items", [])]
            token = page.get("nextPageToken")
            if not token:
                return sorted(names)

    def make_bucket(self, loc: Location) -> None:
        self._call(loc, "POST", "b", json_out=True, project=self.settings.gcs.project or "",
                   json={"name": loc.bucket}, headers={"Content-Type": "application/json"})

    def bucket_region(self, loc: Location) -> str | None:
        return self._bucket(loc).get("location")

    # -- server-side copy, signed URLs ------------------------------------------------------
    def copy_object(self, src: Location, dst: Location, *, size: int, attrs: Attrs | None = None) -> ObjectInfo:
        """objects.rewrite, called again with its rewriteToken until done (a large object, or one
        changing location or storage class, takes several calls on GCS). The source's headers and
        metadata go with it; where ``attrs`` or this store's class or key change anything, the
        whole destination resource is sent (a partial one would drop the rest)."""
        gcs = self.settings.gcs
        body: dict = {}
        if attrs is not None or gcs.storage_class or gcs.kms_key_name:
            source = self.info(src)
            body = self.resource(dst, attributes.bridge_metadata(source.metadata),
                                 attrs if attrs is not None else source.attrs)
            body.pop("kmsKeyName", None)   # a query parameter of rewrite
        params: dict = {"destinationKmsKeyName": gcs.kms_key_name} if gcs.kms_key_name else {}
        while True:
            answer = self._call(dst, "POST", "b/{}/o/{}/rewriteTo/b/{}/o/{}", src.bucket, src.key,
                                dst.bucket, dst.key, json_out=True, json=body,
                                headers={"Content-Type": "application/json"}, **params)
            if answer.get("done"):
                return self._info(dst.bucket, answer["resource"])
            params = {**params, "rewriteToken": answer["rewriteToken"]}

    def signed_url(self, loc: Location, expires: int = 3600) -> str:
        """A V4 signed URL from service-account credentials. Against an endpoint reached
        anonymously (an emulator: settings.gcs.endpoint) there is nothing to sign with: the
        object's plain media URL, which that endpoint serves to anyone."""
        from urllib.parse import quote
        if self._token == "anon":
            return f"{self.endpoint}/download/storage/v1/b/{loc.bucket}/o/{quote(loc.key, safe='')}?alt=media"
        return _signed_v4(self._signing_credentials(), self.endpoint, loc, expires)

    def _signing_credentials(self):
        creds = self._token
        if isinstance(creds, str):
            from google.oauth2 import service_account
            creds = service_account.Credentials.from_service_account_file(creds)
        if not hasattr(creds, "sign_bytes") or not getattr(creds, "service_account_email", None):
            raise CredentialsMissing("signing a GCS URL needs service-account credentials "
                                     "(GOOGLE_APPLICATION_CREDENTIALS pointing at a key file)")
        return creds

    # -- multipart: part objects, then compose ----------------------------------------------
    def _part_loc(self, loc: Location, upload_id: str, number: int) -> Location:
        return Location("gs", loc.bucket, f"{UPLOADS}{upload_id}/{number:06d}")

    def begin_upload(self, loc: Location, size: int, attrs: Attrs | None = None) -> str:
        return uuid.uuid4().hex   # the headers and metadata go with the compose

    def upload_part(self, loc: Location, upload_id: str, number: int, offset: int, data: bytes,
                    crc32c: str, *, sha256: str | None = None) -> PartRecord:
        part = self._part_loc(loc, upload_id, number)
        if self._direct is not None:   # its body in pieces: a cancel stops it mid-way
            item = self._direct_call(lambda: self._direct.put(part, data, crc_hex_to_b64(crc32c),
                                                              self.resource(part, {"bridge_target": loc.key}, None)))
        else:
            item = self._upload(part, data, crc32c, {"bridge_target": loc.key})
        self._check_crc(part, item, crc32c)
        return PartRecord(number, len(data), crc32c, part.key)

    @property
    def streams_parts(self) -> bool:
        return self._direct is not None

    def upload_part_stream(self, loc: Location, upload_id: str, number: int, length: int, pieces,
                           crc32c) -> PartRecord:
        part = self._part_loc(loc, upload_id, number)
        # no CRC32C in the request (it is known only once the body is out): GCS computes the
        # stored part's, which must equal that of the bytes sent
        item = self._direct.put_stream(part, length, pieces, self.resource(part, {"bridge_target": loc.key}, None))
        crc = crc32c()
        self._check_crc(part, item, crc)
        return PartRecord(number, length, crc, part.key)

    def list_parts(self, loc: Location, upload_id: str) -> dict[int, PartRecord] | None:
        prefix = Location("gs", loc.bucket, f"{UPLOADS}{upload_id}/")
        parts = {}
        for item in self._list_raw(prefix):
            number = int(item["name"].rsplit("/", 1)[-1])
            crc = crc_b64_to_hex(item["crc32c"]) if item.get("crc32c") else ""
            parts[number] = PartRecord(number, int(item["size"]), crc, item["name"])
        return parts

    def _compose(self, loc: Location, sources: list[str], metadata: dict[str, str] | None,
                 recovered=None, attrs: Attrs | None = None) -> dict | None:
        """Compose ``sources``; the intermediate objects of a tree (``metadata`` None) are plain."""
        resource = self.resource(loc, metadata, attrs) if metadata is not None else {}
        body = {"sourceObjects": [{"name": s} for s in sources], "kind": "storage#composeRequest",
                "destination": {"name": loc.key, "bucket": loc.bucket,
                                "contentType": "application/octet-stream", **resource}}
        if self._direct is not None:
            return self._direct_call(lambda: self._direct.compose(loc, body), recovered)
        return self._call(loc, "POST", "b/{}/o/{}/compose", loc.bucket, loc.key, json_out=True,
                          json=body, headers={"Content-Type": "application/json"}, recovered=recovered)

    def complete_upload(self, loc: Location, upload_id: str, parts: list[PartRecord], *,
                        crc32c: str, metadata: dict[str, str], attrs: Attrs | None = None) -> ObjectInfo:
        names = [p.token for p in sorted(parts, key=lambda p: p.number)]
        size = sum(p.size for p in parts)
        level = 0
        temporaries: list[str] = []
        while len(names) > COMPOSE_MAX:
            grouped = []
            for i in range(0, len(names), COMPOSE_MAX):
                inter = Location("gs", loc.bucket, f"{UPLOADS}{upload_id}/c{level}-{i // COMPOSE_MAX:06d}")
                self._compose(inter, names[i:i + COMPOSE_MAX], None)
                grouped.append(inter.key)
            temporaries += grouped
            names, level = grouped, level + 1

        def finished() -> bool:
            # A compose whose answer was lost may have run: a retry then finds its sources gone
            # (once cleaned up) and fails, though the object it was to make is there.
            try:
                info = self.info(loc)
            except ObjectNotFound:
                return False
            return info.size == size and info.checksums.get("crc32c") == crc32c

        item = self._compose(loc, names, metadata, recovered=finished, attrs=attrs)
        try:
            self.abort_upload(loc, upload_id)
        except BridgeError:
            pass  # the object is complete; parts left behind are for `mcbridge uploads --abort`
        # GCS computes the composite's CRC32C itself; the engine compares it with ours.
        return self._info(loc.bucket, item) if item else self.info(loc)

    def abort_upload(self, loc: Location, upload_id: str) -> None:
        """The upload's part objects deleted, ``transfer.concurrency`` at a time (one after another,
        a 1 GiB file's 128 parts cost 128 round trips at the end of its upload)."""
        prefix = Location("gs", loc.bucket, f"{UPLOADS}{upload_id}/")
        names = [item["name"] for item in self._list_raw(prefix)]

        def delete(name: str) -> None:
            try:
                self.delete(Location("gs", loc.bucket, name))
            except ObjectNotFound:
                pass
        if names:
            from bridge.meter import Pool
            with Pool(min(len(names), self.settings.transfer.concurrency)) as pool:
                list(pool.map(delete, names))

    def list_uploads(self, prefix: Location) -> Iterator[tuple[Location, str]]:
        seen = set()
        for item in self._list_raw(Location("gs", prefix.bucket, UPLOADS)):
            upload_id = item["name"][len(UPLOADS):].split("/", 1)[0]
            target = (item.get("metadata") or {}).get("bridge_target")
            if upload_id not in seen and target and target.startswith(prefix.key):
                seen.add(upload_id)
                yield Location("gs", prefix.bucket, target), upload_id


def _when(text: str | None) -> float | None:
    """An RFC 3339 time of the JSON API ('2026-01-31T12:00:00.123Z') in seconds since the epoch."""
    if not text:
        return None
    from datetime import datetime
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
