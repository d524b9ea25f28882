"""The ``from-url`` route: Azure pulls each file's blocks from a signed URL of the source.

For every file: the source's signed GET URL (S3 presigned, GCS V4 signed, or an emulator's
plain URL), then one Put Block From URL per part (the plan's part size, or one block for a
file planned as one request), several at once, then Put Block List with bridge's metadata.
Only requests pass through bridge; Azure reads the source over the network, so the source's
egress is paid as on the direct route, but no bridge machine carries the bytes.

S3 cannot pull from another cloud (UploadPartCopy takes S3 sources only) and GCS has no such
call: the route serves only pairs into Azure (bridge.policies.routes says so for mcbridge plan).

The manifest entry takes its CRC32C from what the source store reports (S3's full-object
CRC32C, GCS's crc32c) or, for an object bridge wrote, from its metadata: Azure keeps no CRC32C
of a block blob, so that is the hash written into the blob's metadata, and ``verify --deep``
reads the bytes to prove it. A source object with no CRC32C known goes ``direct``. An endpoint
that does not implement Put Block From URL (Azurite), or that cannot fetch the source URL (a
source only this machine can reach), sends the whole job ``direct`` after its first refusal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge.meter import Pool
from bridge.config import Settings
from bridge.errors import AuthError, BridgeError, CopySourceUnreadable, Unsupported
from bridge.routes import Fallback, Route, register
from bridge.routes.server import checked_source, source_hashes
from bridge.stores import get_store
from bridge.stores.base import PartRecord
from bridge.urls import Location

if TYPE_CHECKING:
    from bridge.engine import FilePlan, JobContext
    from bridge.manifest import FileEntry

URL_LIFETIME = 6 * 3600   # seconds a source URL stays valid: longer than any one file's blocks take


class FromUrlRoute(Route):
    name = "from-url"

    def serves(self, src: Location, dst: Location, settings: Settings) -> str | None:
        if not get_store(dst, settings).features.copy_from_url:
            return f"{dst.scheme}:// stores cannot pull bytes from a URL"
        if not get_store(src, settings).features.signed_urls:
            return f"{src.scheme}:// stores cannot sign a URL for another cloud to read"
        return None

    def copy_file(self, ctx: JobContext, f: FilePlan) -> FileEntry:
        from bridge.manifest import FileEntry
        src_loc, info = checked_source(ctx, f)
        dst_loc = ctx.dst_loc(f.rel)
        crc, sha, origin = source_hashes(info)
        if crc is None:
            raise Fallback(f"{src_loc}: its store reports no CRC32C and bridge recorded none: its bytes "
                           f"pass through bridge to be hashed")
        try:
            url = ctx.src.signed_url(src_loc, URL_LIFETIME)
        except AuthError as exc:
            raise Fallback(f"cannot sign a URL of {src_loc}: {exc}", job_wide=True) from exc
        metadata = {"bridge_crc32c": crc, **({"bridge_sha256": sha} if sha else {})}
        attrs = ctx.attrs(f.rel, info.attrs)
        if f.size == 0:
            committed = ctx.dst.put(dst_loc, b"", crc32c=crc, metadata=metadata, attrs=attrs)
        else:
            committed = self._blocks(ctx, f, dst_loc, url, crc, metadata, attrs)
        ctx.progress.moved(f.size, through=0)
        return FileEntry(f.rel, f.size, crc, sha, computed=[],
                         reported={"crc32c": crc, **committed.checksums}, identity=dict(committed.identity),
                         note=f"pulled by Azure from a signed URL (Put Block From URL); CRC32C {origin}"
                              + ("; SHA-256 stored by bridge in the source's metadata" if sha else ""))

    def _blocks(self, ctx: JobContext, f: FilePlan, dst_loc: Location, url: str, crc: str, metadata: dict,
                attrs=None):
        block = f.part_size or f.size
        ranges = [(n, off, min(block, f.size - off)) for n, off in enumerate(range(0, f.size, block), 1)]
        upload_id = ctx.dst.begin_upload(dst_loc, f.size, attrs)
        try:
            workers = max(1, min(len(ranges), ctx.settings.transfer.concurrency))
            with Pool(workers, thread_name_prefix="from-url") as pool:
                parts: list[PartRecord] = list(pool.map(
                    lambda r: ctx.dst.upload_part_from_url(dst_loc, upload_id, r[0], r[1], url, r[1], r[2]), ranges))
            ctx.dst.complete_upload(dst_loc, upload_id, parts, crc32c=crc, metadata=metadata, attrs=attrs)
        except Unsupported as exc:
            _abort(ctx, dst_loc, upload_id)
            raise Fallback(f"{ctx.dst.scheme}:// endpoint does not implement Put Block From URL: {exc}",
                           job_wide=True) from exc
        except CopySourceUnreadable as exc:
            _abort(ctx, dst_loc, upload_id)
            raise Fallback(f"Azure could not read the source URL: {exc}", job_wide=True) from exc
        except BridgeError:
            _abort(ctx, dst_loc, upload_id)
            raise
        return ctx.dst.info(dst_loc)


def _abort(ctx: JobContext, loc: Location, upload_id: str) -> None:
    from bridge.retry import stopping
    try:
        with stopping(None):   # a cancelled copy's clean-up is sent after the cancel
            ctx.dst.abort_upload(loc, upload_id)
    except BridgeError:
        pass   # left for `mcbridge uploads --abort`; the failure that brought us here is the one to report


register(FromUrlRoute())
