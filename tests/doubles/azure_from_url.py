"""Azure Put Block From URL, in front of Azurite (which answers it "not implemented").

An aiohttp server on 127.0.0.1 (a free port) that the real azure-storage-blob client reaches as
its blob endpoint (``http://127.0.0.1:PORT/devstoreaccount1``). Every request is forwarded to
Azurite unchanged (method, path, query, headers, body: the SharedKey signature covers them and
Azurite checks it) except Put Block From URL:

    PUT /<account>/<container>/<blob>?comp=block&blockid=<id>   (Content-Length: 0)
    x-ms-copy-source: <URL of the source, signed or public>
    x-ms-source-range: bytes=<start>-<end>                     (optional: the whole source)
    x-ms-source-content-md5: <base64 MD5 of that range>        (optional)

which the double serves as the service documents it: it checks the request's SharedKey
signature with the account key (403 AuthenticationFailed otherwise), requires ``blockid`` and
``x-ms-copy-source`` (400 MissingRequiredHeader / MissingRequiredQueryParameter), and fetches the
range from the source URL itself, as Azure does:

- a redirect is not followed (Azure refuses one): CannotVerifyCopySource with the source's status
  in ``x-ms-copy-source-status-code``, as for any answer other than 200/206;
- ``x-ms-source-if-match`` goes to the source as ``If-Match`` and is checked against the ETag the
  source answers with: a source that answers 412, or another ETag, gives 412
  SourceConditionNotMet (a source rewritten since the ETag was read);
- a source that ignores ``Range`` (200 with the whole object for a part of it) is refused, 400
  InvalidSourceBlobRange, as is a range of another length;
- ``x-ms-source-content-md5`` (400 Md5Mismatch) and ``x-ms-source-content-crc64`` (Azure's CRC64,
  400 Crc64Mismatch) are checked against the bytes fetched;

and then stages the bytes into Azurite with an ordinary Put Block that it signs with the account
key. Azurite then holds an uncommitted block exactly as if the client had sent the bytes: Get
Block List, Put Block List and the rest behave as on Azure. ``counts`` tells how many blocks were
staged this way and how many bytes the double fetched from sources (none of them passed through
the client), and how many Copy Blob requests went on to Azurite. ``on_fetched`` (a test's hook)
is called with the number of sources fetched so far after each fetch, before the block is
checked and staged: a test rewrites a source there, between two blocks.

Not emulated: authorizing Put Block From URL by SAS or OAuth (only SharedKey is checked),
``x-ms-copy-source-authorization`` (the source URL must carry its own authorization, as a
presigned S3 URL or a SAS does), the other ``x-ms-source-if-*`` conditions, encryption scopes and
customer-provided keys, lease conditions, and the service's limits (4000 MiB per block, request
rates). Put Blob From URL and Append/Put Page From URL are not served (they go to Azurite, which
refuses them).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import threading
from collections import Counter
from collections.abc import Callable
from email.utils import formatdate
from urllib.parse import unquote

from aiohttp import web

from tests.faultproxy import LOOPBACK, LoopbackServer
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "content-length", "expect"}
_SIGNED = ("content-encoding", "content-language", "content-length", "content-md5", "content-type", "date",
           "if-modified-since", "if-match", "if-none-match", "if-unmodified-since", "range")


def shared_key_signature(method: str, raw_path: str, query: dict[str, str], headers: dict[str, str],
                         account: str, key: str) -> str:
    """The SharedKey signature of a request, as the Blob service computes it (headers by lower-case name)."""
    values = []
    for name in _SIGNED:
        value = headers.get(name, "")
        values.append("" if name == "content-length" and value == "0" else value)
    canonical_headers = "".join(f"{k}:{headers[k].strip()}\n" for k in sorted(headers) if k.startswith("x-ms-"))
    resource = f"/{account}{raw_path}" + "".join(f"\n{k.lower()}:{unquote(v)}" for k, v in sorted(query.items()))
    to_sign = method + "\n" + "".join(v + "\n" for v in values) + canonical_headers + resource
    digest = hmac.new(base64.b64decode(key), to_sign.encode("utf-8"), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def _crc64(data: bytes) -> bytes:
    """Azure's CRC64 of ``data``, as the service computes it (the SDK's native extension)."""
    from azure.storage.blob._shared.validation import calculate_crc64_bytes
    return calculate_crc64_bytes(data)


def _error(status: int, code: str, message: str, **headers: str) -> web.Response:
    body = (f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code>'
            f"<Message>{message}</Message></Error>").encode()
    return web.Response(status=status, body=body, headers={"x-ms-error-code": code,
                                                           "Content-Type": "application/xml", **headers})


class AzureFromUrl(LoopbackServer):
    name = "az-from-url"

    def __init__(self, upstream: str, account: str, key: str):
        super().__init__()
        self.upstream = upstream.rstrip("/")
        self.account, self.key = account, key
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.on_fetched: Callable[[int], None] | None = None

    @property
    def endpoint(self) -> str:
        """The account's blob endpoint through the double."""
        return f"http://{LOOPBACK}:{self.port}/{self.account}"

    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={self.account};AccountKey={self.key};"
                f"BlobEndpoint={self.endpoint};")

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    # -- requests ---------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if (request.method == "PUT" and request.query.get("comp") == "block"
                and "x-ms-copy-source" in request.headers):
            return await self._put_block_from_url(request)
        return await self._forward(request)

    async def _forward(self, request: web.Request) -> web.Response:
        self._count("forwarded")
        if "x-ms-copy-source" in request.headers:
            self._count("copies_forwarded")   # Copy Blob (From URL), which Azurite serves itself
        body = await request.read()
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
        async with self._session.request(request.method, self.upstream + str(request.rel_url), headers=headers,
                                         data=body, allow_redirects=False,
                                         skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding",
                                                            "Content-Type")) as upstream:
            payload = await upstream.read()
            response = web.Response(status=upstream.status, body=payload)
            for k, v in upstream.headers.items():
                if k.lower() not in _HOP:
                    response.headers.add(k, v)
            if request.method == "HEAD" and upstream.headers.get("Content-Length") is not None:
                response.headers["Content-Length"] = upstream.headers["Content-Length"]
            return response

    def _authorized(self, request: web.Request) -> bool:
        given = request.headers.get("Authorization", "")
        prefix = f"SharedKey {self.account}:"
        if not given.startswith(prefix):
            return False
        headers = {k.lower(): v for k, v in request.headers.items()}
        want = shared_key_signature(request.method, request.rel_url.raw_path, dict(request.query), headers,
                                    self.account, self.key)
        return hmac.compare_digest(given[len(prefix):], want)

    async def _put_block_from_url(self, request: web.Request) -> web.Response:
        await request.read()
        if not self._authorized(request):
            return _error(403, "AuthenticationFailed", "Server failed to authenticate the request (SharedKey).")
        block_id = request.query.get("blockid")
        if not block_id:
            return _error(400, "MissingRequiredQueryParameter", "blockid is required.")
        if request.headers.get("Content-Length", "0") not in ("", "0"):
            return _error(400, "InvalidHeaderValue", "Put Block From URL has no request body.")
        source = request.headers["x-ms-copy-source"]
        fetch_headers = {}
        expected = None
        if "x-ms-source-range" in request.headers:
            rng = request.headers["x-ms-source-range"]
            try:
                start, end = (int(x) for x in rng.removeprefix("bytes=").split("-"))
            except ValueError:
                return _error(400, "InvalidHeaderValue", f"x-ms-source-range {rng!r} is not bytes=start-end.")
            fetch_headers["Range"] = f"bytes={start}-{end}"
            expected = end - start + 1
        pinned = request.headers.get("x-ms-source-if-match")
        if pinned:
            fetch_headers["If-Match"] = pinned
        async with self._session.get(source, headers=fetch_headers, allow_redirects=False) as got:
            data = await got.read()
            status, etag = got.status, got.headers.get("ETag")
        self._count("fetches")
        if self.on_fetched is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.on_fetched, self.counts["fetches"])
        if pinned and (status == 412 or (status in (200, 206) and etag != pinned)):
            return _error(412, "SourceConditionNotMet",
                          "The source condition specified using HTTP conditional header(s) is not met.")
        if status not in (200, 206):   # a redirect included: Azure follows none
            return _error(status if 400 <= status < 500 else 400 if status < 400 else 502, "CannotVerifyCopySource",
                          f"The source answered HTTP {status}.", **{"x-ms-copy-source-status-code": str(status)})
        if expected is not None and status == 200 and not (start == 0 and len(data) == expected):
            return _error(400, "InvalidSourceBlobRange", "The source ignored the range asked of it.")
        if expected is not None and len(data) != expected:
            return _error(400, "InvalidSourceBlobRange",
                          f"The source gave {len(data)} bytes for a range of {expected}.")
        md5 = request.headers.get("x-ms-source-content-md5")
        if md5 and base64.b64decode(md5) != hashlib.md5(data).digest():
            return _error(400, "Md5Mismatch", "The MD5 of the source range differs from x-ms-source-content-md5.")
        crc64 = request.headers.get("x-ms-source-content-crc64")
        if crc64 and base64.b64decode(crc64) != _crc64(data):
            return _error(400, "Crc64Mismatch", "The CRC64 of the source range differs from x-ms-source-content-crc64.")
        self._count("fetched_bytes", len(data))
        return await self._stage(request, block_id, data)

    async def _stage(self, request: web.Request, block_id: str, data: bytes) -> web.Response:
        headers = {"x-ms-date": formatdate(usegmt=True),
                   "x-ms-version": request.headers.get("x-ms-version", "2021-08-06"),
                   "content-length": str(len(data))}
        query = {"comp": "block", "blockid": block_id}
        signature = shared_key_signature("PUT", request.rel_url.raw_path, query, headers, self.account, self.key)
        headers["Authorization"] = f"SharedKey {self.account}:{signature}"
        async with self._session.put(self.upstream + request.rel_url.raw_path, params=query, headers=headers,
                                     data=data, skip_auto_headers=("Content-Type",)) as answer:
            payload = await answer.read()
            if answer.status != 201:
                return web.Response(status=answer.status, body=payload, headers={
                    k: v for k, v in answer.headers.items() if k.lower() not in _HOP})
            self._count("blocks_from_url")
            return web.Response(status=201, headers={
                "x-ms-request-id": answer.headers.get("x-ms-request-id", ""),
                "x-ms-version": headers["x-ms-version"], "x-ms-request-server-encrypted": "false",
                "Content-MD5": base64.b64encode(hashlib.md5(data).digest()).decode()})
