"""Azure Blob Storage over azure-storage-blob (block blobs).

adlfs hides block staging and the uncommitted block list, which resume needs, so this store
talks to the SDK directly. Every block is sent with a transactional CRC64 (MD5 without the SDK's
native extension) that the service checks;
a committed blob carries bridge's CRC32C and SHA-256 in its metadata, and its block list records
each block's size, which ``mcbridge verify`` compares with the manifest. That metadata, like a
block list's Content-MD5 (stored unchecked), is what a client wrote: Azure computes no checksum
of a block blob, so this store reports none it computed (bridge/adopt.py ``reported``).

Copies inside the account (``copy_object``) and blocks pulled from a URL
(``upload_part_from_url``) are pinned to the source's ETag as read. Above 256 MiB a copy is
staged in blocks and put in place by one Put Block List, never by Copy Blob, whose pending
destination a cancel (Abort Copy) leaves as a zero-length blob.

With the account's shared key on a plain endpoint, reads (Get Blob, Get Blob Properties, List
Blobs, Get Container Properties) skip the SDK: bridge/stores/azuredirect.py. The SDK is imported,
and its client built, when something else first needs it.
"""

from __future__ import annotations

import base64
import binascii
import functools
import importlib.util
import logging
import re
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

from bridge import attributes
from bridge.attributes import Attrs
from bridge import meter
from bridge.config import Settings
from bridge.errors import (BridgeError, BucketNotFound, CredentialsMissing, EndpointUnreachable, InvalidOption,
                           IntegrityError, ObjectNotFound, PermissionDenied, TransientError,
                           Unsupported, CopySourceUnreadable)
from bridge.retry import call_with_retries
from bridge.stores.base import (DELETES_PER_REQUEST, put_args, raise_refused_deletions, GiB, MiB, DirectReads, Features, ObjectInfo, PartRecord, Store, in_code_point_order, is_reserved,
                                utc_seconds)
from bridge.urls import Location

# azure-core and azure-storage-blob are imported when first needed: jobs that the direct path
# (azuredirect.py) serves whole never need them, and importing them is a large part of a short
# job's start-up. Here only that they are installed is checked (the registry turns an ImportError
# into an install hint).
for _module in ("azure.core", "azure.storage.blob"):
    if importlib.util.find_spec(_module) is None:
        raise ImportError(f"No module named {_module!r}", name=_module)


_SDK_LOCK = threading.Lock()


def _sdk():
    """The SDK's names, imported by one thread at a time: two threads importing azure.core and
    azure.storage.blob at once can meet in Python's module locks (_DeadlockError, seen in a
    gs -> az copy)."""
    with _SDK_LOCK:
        return _load_sdk()


@functools.cache
def _load_sdk():
    from azure.core import MatchConditions
    from azure.core import exceptions
    from azure.storage.blob import BlobBlock, BlobPrefix, BlobServiceClient, ExponentialRetry
    return SimpleNamespace(MatchConditions=MatchConditions, errors=exceptions, BlobBlock=BlobBlock,
                           BlobPrefix=BlobPrefix, BlobServiceClient=BlobServiceClient, ExponentialRetry=ExponentialRetry)

# azure-core logs a warning for each answer cut short ("Incomplete download.") that Python's
# last-resort handler would print on stderr beside bridge's one-line error; bridge translates
# those failures itself. Applications that configure logging still receive the records.
logging.getLogger("azure").addHandler(logging.NullHandler())


@contextmanager
def _translate(loc: Location, endpoint: str):
    try:
        yield
    except BridgeError:
        raise
    except Exception as exc:
        error = _sdk_error(loc, endpoint, exc)
        if error is None:
            raise
        raise error from exc


def _sdk_error(loc: Location, endpoint: str, exc: Exception) -> BridgeError | None:
    """bridge's error for one of the SDK's, or None to let ``exc`` through as it is."""
    e = _sdk().errors
    if isinstance(exc, e.ResourceNotFoundError):
        _copy_source(loc, exc)
        if getattr(exc, "error_code", None) == "ContainerNotFound":
            return BucketNotFound(f"container {loc.bucket!r} does not exist")
        return ObjectNotFound(f"{loc}: no such blob")
    if isinstance(exc, e.ClientAuthenticationError):
        return PermissionDenied(f"{loc}: authentication failed")
    if isinstance(exc, e.ServiceRequestError):
        return EndpointUnreachable(f"cannot reach the Azure endpoint {endpoint}: {type(exc).__name__}")
    if isinstance(exc, (e.ServiceResponseError, e.DecodeError)):
        # the answer was lost or cut short (IncompleteReadError is a DecodeError)
        return TransientError(f"{loc}: connection dropped ({type(exc).__name__})")
    if isinstance(exc, e.HttpResponseError):
        _copy_source(loc, exc)
        code = getattr(exc, "error_code", None) or ""
        status = exc.status_code or 0
        if not status and isinstance(exc.__cause__, (e.ServiceResponseError, e.DecodeError)):
            # the blob downloader gave up on a body cut short and wrapped the cause
            return TransientError(f"{loc}: connection dropped ({type(exc.__cause__).__name__})")
        return _from_code(loc, status, code, str(exc.message or ""))
    return None


def _from_code(loc: Location, status: int, code: str, message: str = "") -> BridgeError:
    """bridge's error for an Azure error answer: its HTTP status and error code (x-ms-error-code).
    The SDK's HttpResponseError comes here, and the direct path's answers (azuredirect.py)."""
    if status == 404:
        if code == "ContainerNotFound":
            return BucketNotFound(f"container {loc.bucket!r} does not exist")
        return ObjectNotFound(f"{loc}: no such blob")
    if status == 501 or code == "NotImplemented" or "not implemented" in message.lower():
        return Unsupported(f"{loc}: the Azure endpoint does not implement this request ({code or status})")
    if code in ("Md5Mismatch", "Crc64Mismatch", "InvalidMd5"):
        return IntegrityError(f"{loc}: Azure rejected the bytes as not matching their checksum")
    if code == "SourceConditionNotMet":
        return IntegrityError(f"{loc}: the copy source changed since the copy was planned (its ETag is "
                              f"another); run the copy again")
    if status in (401, 403):
        return PermissionDenied(f"{loc}: access denied ({code or status})")
    if status == 429 or status >= 500:
        return TransientError(f"{loc}: HTTP {status} {code}")
    return BridgeError(f"{loc}: Azure error {code or status}")


def _storage_error(exc):
    """Raise ``exc`` as the blob SDK's public calls would: typed, with its ``error_code`` set."""
    try:
        from azure.storage.blob._shared.response_handlers import process_storage_error
    except ImportError:  # pragma: no cover - a layout change in the SDK: the untyped error still maps
        raise exc from None
    process_storage_error(exc)


def _copy_source(loc: Location, exc) -> None:
    """Azure could not read the source URL of a copy (the SDK files it under not-found)."""
    if getattr(exc, "error_code", None) == "CannotVerifyCopySource":
        headers = exc.response.headers if exc.response is not None else {}
        status = headers.get("x-ms-copy-source-status-code")
        raise CopySourceUnreadable(f"{loc}: Azure could not read the copy source"
                                   + (f" (it answered HTTP {status})" if status else "")) from exc


def _transactional_checksum() -> str | bool:
    """CRC64 (twice as fast as MD5) when the SDK's native extension is installed, else MD5."""
    try:
        from azure.storage.extensions import checksums  # noqa: F401
        return "crc64"
    except ImportError:
        return True


def _as_bytes(data) -> bytes:
    return data if isinstance(data, bytes) else bytes(data)


def _identity(etag: str | None, last_modified) -> dict[str, str]:
    """Azure gives every write of a blob (bytes or metadata) a new ETag; listings give it
    without the quotes that property and upload answers carry."""
    ident = {"etag": etag.strip('"')} if etag else {}
    if last_modified:
        ident["last_modified"] = utc_seconds(last_modified)
    return ident


def _put_info(loc: Location, size: int, metadata: dict[str, str], resp: dict) -> ObjectInfo:
    """What an upload's answer says of the blob written (the SDK's or the direct path's)."""
    sums = {"md5": bytes(resp["content_md5"]).hex()} if resp.get("content_md5") else {}
    return ObjectInfo(loc, size, sums, dict(metadata), _identity(resp.get("etag"), resp.get("last_modified")))


SYNC_COPY_MAX = 256 * MiB      # Copy Blob From URL (synchronous) takes up to this
FROM_URL_MAX = 4000 * MiB      # Put Block From URL: bytes per block
COPY_BLOCK = 64 * MiB          # a copy in blocks: its blocks' size, unless 50,000 of them are too few
MAX_BLOCKS = 50_000


def _copy_block(size: int) -> int:
    """The block size of a copy in blocks: COPY_BLOCK, or larger (whole MiB) so that the blob
    fits in Azure's 50,000 blocks."""
    least = -(-size // MAX_BLOCKS)
    return max(COPY_BLOCK, -(-least // MiB) * MiB)


def _block_id(upload_id: str, number: int) -> str:
    # Every block id of a blob must have the same length.
    return base64.b64encode(f"{upload_id}-{number:06d}".encode()).decode()


_UPLOAD_ID = re.compile(r"[0-9a-f]{16}")   # begin_upload's ids


def _block_number(block_id: str) -> tuple[str, int]:
    """(upload id, part number) of one of bridge's block ids; ("", -1) for another writer's."""
    try:
        raw = base64.b64decode(block_id, validate=True).decode(errors="replace")
    except (binascii.Error, ValueError):
        return "", -1
    upload_id, _, number = raw.rpartition("-")
    return upload_id, int(number) if number.isdigit() else -1


def _check_connection_string(value: str) -> None:
    """Refuse a connection string that names an account but carries no way to sign for it.

    The SDK accepts ``AccountName=x`` alone and then talks anonymously to x's public endpoint, so a
    forgotten key shows up much later as "public access is not permitted". Anonymous access to a
    public container stays possible by giving only ``BlobEndpoint=``.
    """
    keys = {part.split("=", 1)[0].strip().lower() for part in value.split(";") if "=" in part}
    if "accountname" in keys and not keys & {"accountkey", "sharedaccesssignature"}:
        raise CredentialsMissing("the Azure connection string (AZURE_STORAGE_CONNECTION_STRING) names an "
                                 "AccountName but has no AccountKey or SharedAccessSignature; for "
                                 "anonymous access to a public container give only BlobEndpoint=")


class AzureStore(DirectReads, Store):
    scheme = "az"
    features = Features(checksums=frozenset({"md5"}), min_part_size=1 * MiB,
                        max_part_size=4000 * MiB, max_parts=50_000, max_object_size=190 * 1024 * GiB,
                        max_copy_size=SYNC_COPY_MAX)

    def __init__(self, settings: Settings):
        self.settings = settings
        az, t = settings.azure, settings.transfer
        if az.connection_string:
            _check_connection_string(az.connection_string.get_secret_value())
        from bridge.stores.azuredirect import Direct
        # None: reads go through the SDK (a SAS, Azure AD, or an endpoint that is not plain)
        self._direct = Direct.for_settings(settings, _from_code)
        self._client = None
        self._client_lock = threading.Lock()
        if self._direct is None:
            self.endpoint = self.client.url   # the SDK client now: what is wrong in the settings shows at once
        else:
            self.endpoint = self._direct.endpoint
        self.retries = t.retries

    @property
    def client(self):
        """The SDK's BlobServiceClient, built on first use."""
        with self._client_lock:
            if self._client is None:
                self._client = self._make_client()
            return self._client

    @functools.cached_property
    def _validate(self) -> str | bool:
        return _transactional_checksum()

    def _make_client(self):
        az, t = self.settings.azure, self.settings.transfer
        sdk = _sdk()
        # bridge.retry is the one retry layer: azure-core sends each request once.
        retry = sdk.ExponentialRetry(retry_total=0)
        common = {"retry_policy": retry, "connection_timeout": t.connect_timeout,
                  "read_timeout": t.read_timeout, "max_single_put_size": 256 * MiB,
                  **meter.azure_hooks(self._endpoint_path()),   # every request it sends metered
                  **({"connection_verify": t.ca_bundle} if t.ca_bundle else {})}   # as the direct path verifies
        BlobServiceClient = sdk.BlobServiceClient
        if az.connection_string:
            try:
                return BlobServiceClient.from_connection_string(
                    az.connection_string.get_secret_value(), **common)
            except ValueError as exc:  # its text is generic; the string itself may hold a key
                raise InvalidOption("the Azure connection string (AZURE_STORAGE_CONNECTION_STRING) is "
                                    "malformed: expected 'Name=value;' pairs with an AccountName and "
                                    "AccountKey or SharedAccessSignature, or a BlobEndpoint") from exc
        elif az.account_name and (az.account_key or az.sas_token):
            url = az.endpoint or f"https://{az.account_name}.blob.core.windows.net"
            cred = ({"account_name": az.account_name, "account_key": az.account_key.get_secret_value()}
                    if az.account_key else az.sas_token.get_secret_value())
            return BlobServiceClient(url, credential=cred, **common)
        elif az.account_name:
            try:
                from azure.identity import DefaultAzureCredential
            except ImportError as exc:
                raise CredentialsMissing("AZURE_STORAGE_ACCOUNT is set without a key: set "
                                         "AZURE_STORAGE_KEY, or install azure-identity") from exc
            url = az.endpoint or f"https://{az.account_name}.blob.core.windows.net"
            return BlobServiceClient(url, credential=DefaultAzureCredential(), **common)
        raise CredentialsMissing("no Azure credentials found: set AZURE_STORAGE_CONNECTION_STRING, "
                                 "or AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY")

    def _endpoint_path(self) -> str:
        """The path of the blob endpoint (``/devstoreaccount1`` on Azurite; empty on Azure), which
        comes before the container in every request's path."""
        from urllib.parse import urlsplit
        az = self.settings.azure
        url = az.endpoint or ""
        if az.connection_string:
            parts = dict(p.split("=", 1) for p in az.connection_string.get_secret_value().split(";") if "=" in p)
            url = parts.get("BlobEndpoint", url)
        return urlsplit(url).path.rstrip("/")

    def _request(self, loc: Location, fn, recovered=None):
        def once():
            with _translate(loc, self.endpoint):
                return fn()
        return call_with_retries(once, self.retries, recovered=recovered, where=self.endpoint)

    def _blob(self, loc: Location):
        return self.client.get_blob_client(loc.bucket, loc.key)

    def list(self, prefix: Location) -> Iterator[ObjectInfo]:
        return in_code_point_order(self._list(prefix))

    def _list(self, prefix: Location) -> Iterator[ObjectInfo]:
        if self._direct is not None:
            yield from self._direct_list(prefix)
            return
        container = self.client.get_container_client(prefix.bucket)
        token = None
        while True:
            def page(token=token):  # one page per request, retried alone
                pages = container.list_blobs(name_starts_with=prefix.key or None,
                                             include=["metadata"]).by_page(continuation_token=token)
                return list(next(pages)), pages.continuation_token
            blobs, token = self._request(prefix, page)
            for blob in blobs:
                yield self._info(prefix.bucket, blob.name, blob.size, blob.content_settings, blob.metadata,
                                 blob.etag, blob.last_modified, blob.blob_tier)
            if not token:
                return

    def list_level(self, prefix: Location) -> Iterator[ObjectInfo | Location]:
        """List Blobs with delimiter='/' (the SDK's walk_blobs, one page per request, not
        descending into the BlobPrefix items it returns)."""
        container = self.client.get_container_client(prefix.bucket)
        blob_prefix = _sdk().BlobPrefix
        token = None
        while True:
            def page(token=token):
                pages = container.walk_blobs(name_starts_with=prefix.key or None, include=["metadata"],
                                             delimiter="/").by_page(continuation_token=token)
                return list(next(pages)), pages.continuation_token
            items, token = self._request(prefix, page)
            for item in items:
                if isinstance(item, blob_prefix):
                    yield Location("az", prefix.bucket, item.name)
                else:
                    yield self._info(prefix.bucket, item.name, item.size, item.content_settings, item.metadata,
                                     item.etag, item.last_modified, item.blob_tier)
            if not token:
                return

    def _direct_list(self, prefix: Location) -> Iterator[ObjectInfo]:
        marker = None
        while True:
            blobs, marker = self._request(prefix, lambda marker=marker: self._direct.list_page(prefix, marker))
            for b in blobs:
                yield self._direct_info(Location("az", prefix.bucket, b["name"]), b)
            if not marker:
                return

    @staticmethod
    def _direct_info(loc: Location, p: dict) -> ObjectInfo:
        sums = {"md5": p["content_md5"].hex()} if p["content_md5"] else {}
        attrs = Attrs(**{name: p.get(name) or None for name in attributes.HEADERS},
                      user=attributes.from_azure(p["metadata"]))
        tier = p.get("tier") or ""
        return ObjectInfo(loc, p["size"], sums, p["metadata"], _identity(p["etag"], p["last_modified"]), attrs,
                          tier, tier == "Archive",
                          modified=p["last_modified"].timestamp() if p["last_modified"] else None)

    @staticmethod
    def _info(container, name, size, content_settings, metadata, etag, last_modified, tier=None) -> ObjectInfo:
        sums = {}
        md5 = getattr(content_settings, "content_md5", None)
        if md5:
            sums["md5"] = bytes(md5).hex()
        attrs = Attrs(**{name: getattr(content_settings, name, None) or None for name in attributes.HEADERS},
                      user=attributes.from_azure(metadata or {}))
        tier = str(getattr(tier, "value", tier) or "")
        return ObjectInfo(Location("az", container, name), int(size), sums, dict(metadata or {}),
                          _identity(etag, last_modified), attrs, tier, tier == "Archive",
                          modified=last_modified.timestamp() if last_modified else None)

    def written(self, loc: Location, metadata: dict[str, str], attrs: Attrs | None) -> dict:
        """The SDK's keywords of a write of ``loc`` besides its bytes: metadata (the user's under
        Azure's names, bridge.attributes.to_azure, and bridge's), content settings, and this
        store's access tier (not for bridge's own records) and encryption scope."""
        from azure.storage.blob import ContentSettings, StandardBlobTier
        kw: dict = {"metadata": {**(attributes.to_azure(attrs.user) if attrs else {}), **metadata}}
        if attrs and attrs.headers():
            kw["content_settings"] = ContentSettings(**attrs.headers())
        az = self.settings.azure
        if az.tier and not is_reserved(loc.key):
            kw["standard_blob_tier"] = StandardBlobTier(az.tier)
        if az.encryption_scope:
            kw["encryption_scope"] = az.encryption_scope
        return kw

    def info(self, loc: Location) -> ObjectInfo:
        if self._direct is not None:
            return self._direct_info(loc, self._request(loc, lambda: self._direct.head(loc)))
        p = self._request(loc, self._blob(loc).get_blob_properties)
        return self._info(loc.bucket, loc.key, p.size, p.content_settings, p.metadata, p.etag, p.last_modified,
                          p.blob_tier)

    def block_sizes(self, loc: Location) -> list[int]:
        committed, _ = self._request(loc, lambda: self._blob(loc).get_block_list("committed"))
        return [b.size for b in committed]

    def read_through(self, loc: Location, offset: int, length: int, buf: bytearray, each) -> int:
        if self._direct is None or not length:
            return super().read_through(loc, offset, length, buf, each)
        return self._request(loc, lambda: self._direct.get(loc, offset, length, into=buf, each=each))

    def read(self, loc: Location, offset: int = 0, length: int | None = None) -> bytes:
        if length == 0:
            return b""
        ranged = bool(offset) or length is not None
        if self._direct is not None:
            return self._request(loc, lambda: self._direct.get(loc, offset, length))
        header = f"bytes={offset}-{'' if length is None else offset + length - 1}" if ranged else None
        return self._request(loc, lambda: self._get(loc, header))

    def _get(self, loc: Location, header: str | None) -> bytes:
        """One GET, its body read whole: exactly one request per attempt of bridge's retry layer.

        ``download_blob`` would send the GET again up to three times, a second apart, when the body
        is cut short (a loop inside azure-storage-blob that no setting reaches), multiplying with
        bridge's own retries; the blob operation under it sends once and leaves retrying to us.
        """
        try:
            stream, headers = self._blob(loc)._client.blob.download(
                range=header, cls=lambda response, _body, headers: (_body, headers))
        except _sdk().errors.HttpResponseError as exc:
            _storage_error(exc)
        data = b"".join(stream)
        expected = headers.get("Content-Length")
        if expected is not None and len(data) != int(expected):
            raise TransientError(f"{loc}: connection dropped (read {len(data)} of {expected} bytes)")
        return data

    def put(self, loc: Location, data: bytes, *, crc32c: str, metadata: dict[str, str],
            attrs: Attrs | None = None, sha256: str | None = None) -> ObjectInfo:
        body = _as_bytes(data)
        kw = self.written(loc, metadata, attrs)
        resp = self._request(loc, lambda: self._blob(loc).upload_blob(body, overwrite=True,
                                                                      validate_content=self._validate, **kw))
        return _put_info(loc, len(data), metadata, resp)

    @property
    def writes_many(self) -> bool:
        return self._direct is not None

    def put_many(self, count: int, body, each, *, connections: int | None = None, ready=None) -> dict:
        """Batches of small blobs go by the direct path's Put Blob, several in flight from one
        thread: through the SDK, a copy of 2,000 x 16 KiB files to Azurite took 6.7 s of CPU,
        its pipeline's work per request more than the request's."""
        if self._direct is None:
            return super().put_many(count, body, each, ready=ready)
        sent: dict[int, tuple[Location, int, dict]] = {}   # what each answer is about

        def request(i: int) -> tuple:
            loc, data, _crc32c, metadata, attrs, _sha256 = put_args(body(i))   # (Azure checks the body's MD5)
            sent[i] = (loc, len(data), metadata)
            return loc, data, self.direct_headers(loc, metadata, attrs)

        def answered(i: int, resp: dict) -> None:
            loc, size, metadata = sent.pop(i)
            each(i, _put_info(loc, size, metadata, resp))

        return self._direct.put_many(count, request, answered,
                                     connections=connections or self.settings.transfer.concurrency,
                                     retries=self.retries, ready=ready)

    def direct_headers(self, loc: Location, metadata: dict[str, str], attrs: Attrs | None) -> dict[str, str]:
        """What ``written`` says, as Put Blob's headers (the direct path)."""
        headers = {f"x-ms-meta-{k}": v for k, v in
                   {**(attributes.to_azure(attrs.user) if attrs else {}), **metadata}.items()}
        for name, value in (attrs.headers() if attrs else {}).items():
            headers[f"x-ms-blob-{attributes.HTTP_NAMES[name].lower()}"] = value
        az = self.settings.azure
        if az.tier and not is_reserved(loc.key):
            headers["x-ms-access-tier"] = az.tier
        if az.encryption_scope:
            headers["x-ms-encryption-scope"] = az.encryption_scope
        return headers

    def body(self, data: bytes | bytearray) -> bytes:
        return _as_bytes(data)

    def delete(self, loc: Location) -> None:
        self._request(loc, self._blob(loc).delete_blob, recovered=lambda: self._gone(loc))

    def delete_many(self, locs: list[Location]) -> None:
        """Blob Batch deletes, up to 256 blobs a request (one already gone counts as deleted). A
        blob Azure refuses fails the call with its error; a transient refusal (429, 5xx) sends
        that batch again, whole: deleting twice is deleting."""
        by_container: dict[str, list[Location]] = {}
        for loc in locs:
            by_container.setdefault(loc.bucket, []).append(loc)
        per_request = DELETES_PER_REQUEST["az"]
        for container, group in by_container.items():
            client = self.client.get_container_client(container)
            for start in range(0, len(group), per_request):
                part = group[start:start + per_request]
                self._request(part[0], functools.partial(self._delete_batch, client, part))

    @staticmethod
    def _delete_batch(client, locs: list[Location]) -> None:
        answers = list(client.delete_blobs(*[loc.key for loc in locs], raise_on_any_failure=False))
        if len(answers) != len(locs):
            raise TransientError(f"{locs[0]}: Azure answered {len(answers)} of a batch of {len(locs)} deletions")
        errors = [_from_code(loc, answer.status_code, answer.headers.get("x-ms-error-code", ""), answer.reason or "")
                  for loc, answer in zip(locs, answers) if answer.status_code >= 300]
        raise_refused_deletions(errors, len(locs))

    def _gone(self, loc: Location) -> bool:
        # A delete whose answer was lost is found done by the next attempt's BlobNotFound.
        try:
            self.info(loc)
        except ObjectNotFound:
            return True
        return False

    def buckets(self) -> list[str]:
        where = Location("az", "", "")
        return sorted(c.name for c in self._request(where, lambda: list(self.client.list_containers())))

    def make_bucket(self, loc: Location) -> None:
        self._request(loc, lambda: self.client.create_container(loc.bucket))

    def check_bucket(self, loc: Location) -> None:
        if self._direct is not None:
            self._request(loc, lambda: self._direct.check_container(loc))
            return
        if not self._request(loc, self.client.get_container_client(loc.bucket).exists):
            raise BucketNotFound(f"container {loc.bucket!r} does not exist")

    # -- server-side copy, blocks from a URL, signed URLs, location ------------------------------
    def copy_object(self, src: Location, dst: Location, *, size: int, attrs: Attrs | None = None) -> ObjectInfo:
        """Copy Blob From URL (synchronous, one atomic write) up to 256 MiB; larger blobs in
        blocks pulled from the source's URL and committed by one Put Block List. Both are pinned
        to the source's ETag as read here. Metadata and content headers go with the bytes, or
        ``attrs`` replace them (bridge's keys kept); the tier and encryption scope are this store's.

        Not Copy Blob above 256 MiB: Azure runs it in the background and the destination stands
        as a pending copy from its start, so a cancel (Abort Copy), a failure or a kill left a
        zero-length blob with full metadata where a verified one stood. Staged blocks change
        nothing that readers see until the commit. An endpoint without Put Block From URL
        (Azurite 3.35) answers Unsupported, and the copy goes another way (the server route
        sends the job ``direct``)."""
        source = self.info(src)
        if size > SYNC_COPY_MAX:
            return self._copy_in_blocks(src, dst, source, size, attrs)
        blob = self._blob(dst)
        kw = {k: v for k, v in self.written(dst, {}, None).items() if k != "metadata"}
        if attrs is not None:
            kw["metadata"] = self.written(dst, attributes.bridge_metadata(source.metadata), attrs)["metadata"]
        if source.identity.get("etag"):
            kw.update(source_etag=f'"{source.identity["etag"]}"',
                      source_match_condition=_sdk().MatchConditions.IfNotModified)
        url = self.signed_url(src)   # Copy Blob From URL reads its source through a SAS
        self._request(dst, lambda: blob.start_copy_from_url(url, requires_sync=True, **kw))
        self._set_headers(dst, attrs)
        return self.info(dst)

    def _copy_in_blocks(self, src: Location, dst: Location, source: ObjectInfo, size: int,
                        attrs: Attrs | None) -> ObjectInfo:
        """Put Block From URL for each range of the source (pinned to its ETag), several at once,
        then Put Block List with the source's headers and metadata (or ``attrs``). A failure or a
        cancel before the commit leaves the blob that stood at ``dst`` as it was."""
        from bridge.meter import Pool
        url, etag = self.signed_url(src), source.identity.get("etag")
        block = _copy_block(size)
        ranges = [(n, off, min(block, size - off)) for n, off in enumerate(range(0, size, block), 1)]
        upload_id = self.begin_upload(dst, size)
        try:
            with Pool(max(1, min(len(ranges), self.settings.transfer.concurrency)),
                      thread_name_prefix="az-copy") as pool:
                parts = list(pool.map(lambda r: self.upload_part_from_url(
                    dst, upload_id, r[0], r[1], url, r[1], r[2], source_etag=f'"{etag}"' if etag else None), ranges))
            if attrs is None:   # the source's own: its metadata as Azure holds it, its headers
                metadata, attrs = dict(source.metadata), Attrs(**(source.attrs.headers() if source.attrs else {}))
            else:
                metadata = attributes.bridge_metadata(source.metadata)
            return self.complete_upload(dst, upload_id, parts, crc32c=source.metadata.get("bridge_crc32c", ""),
                                        metadata=metadata, attrs=attrs)
        except BaseException:
            self._drop_staged(dst)
            raise

    def _drop_staged(self, loc: Location) -> None:
        """After a copy in blocks that did not commit: a blob with nothing committed is deleted
        (which discards its staged blocks); one that stands is left untouched, its ETag and
        bytes as they were: Azure discards the staged blocks at its next commit, or after seven
        days (``mcbridge uploads`` lists them meanwhile)."""
        from bridge.retry import stopping
        with stopping(None):   # sent after a cancel too: it is the cancel's clean-up
            try:
                self.info(loc)
            except ObjectNotFound:
                try:
                    self.delete(loc)
                except ObjectNotFound:
                    pass
            except BridgeError:
                pass   # the failure that brought us here is the one to report

    def _set_headers(self, loc: Location, attrs: Attrs | None) -> None:
        """A copy takes its source's content headers: ``attrs`` replace them after it."""
        if attrs is None:
            return
        from azure.storage.blob import ContentSettings
        settings = ContentSettings(**attrs.headers())
        self._request(loc, lambda: self._blob(loc).set_http_headers(content_settings=settings))

    def copy_part(self, loc: Location, upload_id: str, number: int, offset: int, src: Location,
                  src_offset: int, length: int) -> PartRecord:
        return self.upload_part_from_url(loc, upload_id, number, offset, self.signed_url(src), src_offset, length)

    def upload_part_from_url(self, loc: Location, upload_id: str, number: int, offset: int, url: str,
                             src_offset: int, length: int, *, source_etag: str | None = None,
                             source_md5: str | None = None) -> PartRecord:
        """Put Block From URL: Azure fetches the range itself; the block is staged as upload_part
        stages one, so list_parts, complete_upload and abort_upload treat it alike.

        ``source_etag`` (as the source answers it, quotes included) pins the source version:
        Azure refuses the block when the source's ETag is another (x-ms-source-if-match), which
        is raised as an IntegrityError. ``source_md5`` (hex, the range's MD5 as the source's store
        computed it) is checked by Azure against the bytes it fetched (x-ms-source-content-md5)."""
        block_id = _block_id(upload_id, number)
        conditions = {}
        if source_etag:
            from azure.storage.blob._generated.models import SourceModifiedAccessConditions
            conditions["source_modified_access_conditions"] = SourceModifiedAccessConditions(
                source_if_match=source_etag)
        md5 = bytes.fromhex(source_md5) if source_md5 else None
        self._request(loc, lambda: self._blob(loc).stage_block_from_url(
            block_id, url, source_offset=src_offset, source_length=length, source_content_md5=md5, **conditions))
        return PartRecord(number, length, "", block_id)

    def signed_url(self, loc: Location, expires: int = 3600) -> str:
        """A read-only SAS for one blob, from the account key (or the SAS bridge was given)."""
        import datetime
        from azure.storage.blob import BlobSasPermissions, generate_blob_sas
        blob = self._blob(loc)
        cred = self.client.credential
        key = getattr(cred, "account_key", None)
        if key:
            sas = generate_blob_sas(cred.account_name, loc.bucket, loc.key, account_key=key,
                                    permission=BlobSasPermissions(read=True),
                                    expiry=datetime.datetime.now(datetime.timezone.utc)
                                    + datetime.timedelta(seconds=expires))
            return f"{blob.url}?{sas}"
        if "sig=" in blob.url:
            return blob.url   # the client was given a SAS: its URLs carry it
        raise CredentialsMissing("signing an Azure URL needs the account key (AZURE_STORAGE_KEY or a "
                                 "connection string with AccountKey) or a SAS")

    def bucket_region(self, loc: Location) -> str | None:
        # Azure's data plane does not say where an account is: the settings do (azure.region).
        return self.settings.azure.region

    # -- multipart: staged blocks, then one block-list commit ------------------------------------
    def begin_upload(self, loc: Location, size: int, attrs: Attrs | None = None) -> str:
        return uuid.uuid4().hex[:16]   # the headers and metadata go with the block list

    def upload_part(self, loc: Location, upload_id: str, number: int, offset: int, data: bytes,
                    crc32c: str, *, sha256: str | None = None) -> PartRecord:
        block_id = _block_id(upload_id, number)
        # bytes, not a stream: from a stream the SDK switches to structured-message CRC64,
        # which Azurite does not speak; a bytearray from a ranged read is copied here.
        body = _as_bytes(data)
        scope = {"encryption_scope": self.settings.azure.encryption_scope} if self.settings.azure.encryption_scope else {}
        if self._direct is not None:   # its body in pieces: a cancel stops it mid-way
            extra = {"x-ms-encryption-scope": scope["encryption_scope"]} if scope else {}
            self._request(loc, lambda: self._direct.stage_block(loc, block_id, body, extra))
            return PartRecord(number, len(data), crc32c, block_id)
        self._request(loc, lambda: self._blob(loc).stage_block(block_id, body, length=len(body),
                                                               validate_content=self._validate, **scope))
        return PartRecord(number, len(data), crc32c, block_id)

    def list_parts(self, loc: Location, upload_id: str) -> dict[int, PartRecord] | None:
        try:
            _committed, uncommitted = self._request(loc, lambda: self._blob(loc).get_block_list("uncommitted"))
        except ObjectNotFound:
            return {}
        parts = {}
        for block in uncommitted:
            owner, number = _block_number(block.id)
            if owner == upload_id and number > 0:
                # Azure keeps no checksum of a staged block: the size is what it can tell.
                parts[number] = PartRecord(number, block.size, "", block.id)
        return parts

    def complete_upload(self, loc: Location, upload_id: str, parts: list[PartRecord], *,
                        crc32c: str, metadata: dict[str, str], attrs: Attrs | None = None) -> ObjectInfo:
        """Put Block List, with the headers, metadata, tier and scope. Azure keeps no whole-object checksum of a block blob (each block was
        checked on arrival, by its transactional CRC64 or MD5): the answer reports none."""
        blocks = [_sdk().BlobBlock(block_id=p.token) for p in sorted(parts, key=lambda p: p.number)]
        size = sum(p.size for p in parts)

        def finished() -> bool:  # an earlier attempt committed, and its answer was lost
            try:
                info = self.info(loc)
            except ObjectNotFound:
                return False
            return info.size == size and info.metadata.get("bridge_crc32c") == crc32c

        kw = self.written(loc, metadata, attrs)
        answer = self._request(loc, lambda: self._blob(loc).commit_block_list(blocks, **kw),
                               recovered=finished)
        if not answer:
            return self.info(loc)
        return ObjectInfo(loc, size, {}, dict(metadata), _identity(answer.get("etag"), answer.get("last_modified")))

    # Put Blob and Put Block List both discard a blob's uncommitted blocks: a finished copy leaves
    # no upload behind at the names it wrote, so the engine need not look for any there.
    commit_discards_uploads = True

    def abort_upload(self, loc: Location, upload_id: str) -> None:
        """Discard the upload's uncommitted blocks, keeping what the blob's name shows.

        Azure deletes no uncommitted block alone: it drops all of a blob's uncommitted blocks on
        its next commit (or after seven days). So a blob that has committed content is committed
        again as it is (the same block list, metadata and content headers, under an If-Match on
        its ETag so that a concurrent writer wins); its bytes and metadata stay, its ETag and
        last-modified change. One written in a single Put Blob has no block list to commit: its
        bytes are read and committed as one block. A blob with nothing committed is deleted. Uncommitted
        blocks of other uploads to the same blob go too: this is for leftovers.
        """
        blob = self._blob(loc)
        sdk = _sdk()

        def attempt() -> None:   # each step finds what an earlier attempt did: sent again on a 503
            try:
                committed, uncommitted = blob.get_block_list("all")
            except sdk.errors.ResourceNotFoundError:
                return
            if not any(_block_number(b.id)[0] == upload_id for b in uncommitted):
                return
            try:
                props = blob.get_blob_properties()
            except sdk.errors.ResourceNotFoundError:
                blob.delete_blob()   # only uncommitted blocks: deleting the name discards them
                return
            same = {"etag": props.etag, "match_condition": sdk.MatchConditions.IfNotModified}
            if committed:
                blob.commit_block_list([sdk.BlobBlock(block_id=b.id) for b in committed], metadata=props.metadata,
                                       content_settings=props.content_settings, **same)
            else:
                # Its bytes become one block (numbered 0, which no upload uses, and as long as the
                # others, as Azure requires) committed alone.
                data = blob.download_blob(**same).readall()
                block_id = _block_id(upload_id, 0)
                blob.stage_block(block_id, data, length=len(data), validate_content=self._validate)
                blob.commit_block_list([sdk.BlobBlock(block_id=block_id)], metadata=props.metadata,
                                       content_settings=props.content_settings, **same)

        self._request(loc, attempt)

    def list_uploads(self, prefix: Location) -> Iterator[tuple[Location, str]]:
        """Blobs under ``prefix`` holding uncommitted blocks of bridge's block-id form, one row per
        upload id. Listings do not tell which blobs have uncommitted blocks: each is asked."""
        container = self.client.get_container_client(prefix.bucket)
        names = self._request(prefix, lambda: [b.name for b in container.list_blobs(
            name_starts_with=prefix.key or None, include=["uncommittedblobs"])])
        for name in names:
            loc = Location("az", prefix.bucket, name)
            try:
                _committed, uncommitted = self._request(loc, lambda: self._blob(loc).get_block_list("uncommitted"))
            except ObjectNotFound:
                continue
            owners = {owner for owner, number in map(_block_number, (b.id for b in uncommitted))
                      if number > 0 and _UPLOAD_ID.fullmatch(owner)}
            for owner in sorted(owners):
                yield loc, owner
