"""The ``from-url`` route: Azure pulls each file's blocks from a signed URL of the source.

For every file: the source's signed GET URL (S3 presigned, GCS V4 signed, or an emulator's
plain URL), then one Put Block From URL per part (the plan's part size, or one block for a
file planned as one request), several at once, then Put Block List with bridge's metadata.
Only requests pass through bridge; Azure reads the source over the network, so the source's
egress is paid as on the direct route, but no bridge machine carries the bytes.

S3 cannot pull from another cloud (UploadPartCopy takes S3 sources only) and GCS has no such
call: the route serves only pairs into Azure (bridge.policies.routes says so for mcbridge plan).

Azure is told which version to read and what its bytes are: each block carries
``x-ms-source-if-match`` with the source's ETag as planned (S3; GCS gives none, so there the
source's generation is looked at again once the blocks are staged, before they are committed),
and where the source's store computed an MD5 of the whole object (S3's ETag of a one-request
upload, GCS md5Hash) the object goes as one block (up to 4000 MiB) with that MD5 as
``x-ms-source-content-md5``, which Azure checks against the bytes it fetched. A source rewritten
while its blocks are pulled is refused (IntegrityError, the staged blocks dropped), never
committed as a mix of two versions.

The manifest entry takes its CRC32C from what the source store reports (S3's full-object
CRC32C, GCS's crc32c) or, for an object bridge wrote, from its metadata; it is written into the
blob's metadata, since Azure keeps no checksum of a block blob. The entry is proven only where
Azure checked the source's MD5 and the CRC32C is one the source's store computed; otherwise its
note begins "unproven:" and says why (no MD5 to check: a multipart or composite source; a CRC32C
from metadata, which any client can write), and ``verify --deep`` reads the bytes to prove it.
Only a forced ``--route from-url`` commits such a pull: where bridge chose the route itself, a
file Azure could not check goes ``direct`` (its bytes hashed as they pass, the source's egress
paid once either way), with the reason in ``route.fallbacks``. A
source object with no CRC32C known goes ``direct``, as does one whose store's MD5 Azure finds
unlike its bytes while its version is unchanged (an S3 ETag under SSE-KMS is no MD5). An
endpoint that does not implement Put Block From URL (Azurite), or that cannot fetch the source
URL (a source only this machine can reach), sends the whole job ``direct`` after its first
refusal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from bridge.meter import Pool
from bridge.config import Settings
from bridge.errors import AuthError, BridgeError, CopySourceUnreadable, IntegrityError, Unsupported
from bridge.routes import Fallback, Route, forced, register
from bridge.routes.server import checked_source, source_hashes
from bridge.stores import get_store
from bridge.stores.base import ObjectInfo, PartRecord
from bridge.urls import Location

if TYPE_CHECKING:
    from bridge.contracts import FilePlan, RouteContext
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

    def copy_file(self, ctx: RouteContext, f: FilePlan) -> FileEntry:
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
        pull = Pull(url, _pinned_etag(info), _source_md5(ctx, info))
        unprovable = _unprovable(ctx, f, info, crc, pull)
        if unprovable and not forced(ctx.plan):
            # Azure could check nothing of what it fetched: bytes through bridge are hashed as
            # they pass, where a pull would be committed unproven (--route from-url takes that).
            raise Fallback(f"{src_loc}: {unprovable}: its bytes pass through bridge to be hashed")
        if f.size == 0:
            committed = ctx.dst.put(dst_loc, b"", crc32c=crc, metadata=metadata, attrs=attrs)
            checked = False   # no byte for Azure to fetch: the empty blob is what bridge wrote
        else:
            committed, checked = self._blocks(ctx, f, src_loc, dst_loc, pull, crc, metadata, attrs)
        ctx.progress.moved(f.size, through=0)
        store_crc = info.checksums.get("crc32c") == crc   # the source's store computed it
        return _entry(f, crc, sha, origin, store_crc, pull, checked, committed)

    def _blocks(self, ctx: RouteContext, f: FilePlan, src_loc: Location, dst_loc: Location, pull: Pull, crc: str,
                metadata: dict, attrs=None) -> tuple[ObjectInfo, bool]:
        """Stage the blocks, check that the source is still the version planned, commit them.
        Returns what the destination reports and whether Azure checked the source's MD5."""
        # One block for the whole object where the source's MD5 is known: it is then that block's MD5.
        whole = pull.md5 is not None and f.size <= ctx.dst.features.max_part_size
        block = f.size if whole else (f.part_size or f.size)
        ranges = [(n, off, min(block, f.size - off)) for n, off in enumerate(range(0, f.size, block), 1)]
        md5 = pull.md5 if whole else None
        upload_id = ctx.dst.begin_upload(dst_loc, f.size, attrs)
        try:
            workers = max(1, min(len(ranges), ctx.settings.transfer.concurrency))
            with Pool(workers, thread_name_prefix="from-url") as pool:
                parts: list[PartRecord] = list(pool.map(
                    lambda r: ctx.dst.upload_part_from_url(dst_loc, upload_id, r[0], r[1], pull.url, r[1], r[2],
                                                           source_etag=pull.etag, source_md5=md5), ranges))
            # Where no ETag pinned each block (a GCS source), a version that changed while they
            # were fetched shows now: versions only move on, so the planned one still there means
            # every block read it.
            checked_source(ctx, f)
            ctx.dst.complete_upload(dst_loc, upload_id, parts, crc32c=crc, metadata=metadata, attrs=attrs)
        except Unsupported as exc:
            _abort(ctx, dst_loc, upload_id)
            raise Fallback(f"{ctx.dst.scheme}:// endpoint does not implement Put Block From URL: {exc}",
                           job_wide=True) from exc
        except CopySourceUnreadable as exc:
            _abort(ctx, dst_loc, upload_id)
            raise Fallback(f"Azure could not read the source URL: {exc}", job_wide=True) from exc
        except IntegrityError as exc:
            _abort(ctx, dst_loc, upload_id)
            raise _refused(ctx, f, src_loc, md5, exc) from exc
        except BridgeError:
            _abort(ctx, dst_loc, upload_id)
            raise
        return ctx.dst.info(dst_loc), md5 is not None


@dataclass(frozen=True)
class Pull:
    """What Azure is given to fetch a source: its signed URL, the ETag that pins the version
    planned (quoted, as the source answers it; None where the store gives none, GCS), and its
    MD5 as the source's store computed it (hex; None where it keeps none)."""
    url: str
    etag: str | None
    md5: str | None


def _unprovable(ctx: RouteContext, f: FilePlan, info: ObjectInfo, crc: str, pull: Pull) -> str:
    """Why a pull of this file would be committed unproven ("" when Azure can prove it): the
    checks ``_entry`` makes, made before any request."""
    if f.size == 0:
        return ""
    if pull.md5 is None or f.size > ctx.dst.features.max_part_size:
        return "its store computed no MD5 of it (a multipart or composite object) for Azure to check"
    if info.checksums.get("crc32c") != crc:
        return "its CRC32C is one a client wrote in its metadata"
    return ""


def _pinned_etag(info: ObjectInfo) -> str | None:
    etag = info.identity.get("etag")
    return f'"{etag}"' if etag else None


def _source_md5(ctx: RouteContext, info: ObjectInfo) -> str | None:
    """The source's whole-object MD5 its store computed (S3's ETag of a one-request upload, GCS
    md5Hash): bridge.adopt.reported takes no client-written value."""
    from bridge.adopt import reported
    return reported(ctx.src, info).get("md5")


def _refused(ctx: RouteContext, f: FilePlan, src_loc: Location, md5: str | None, exc: IntegrityError) -> BridgeError:
    """A block Azure refused as not the source's: the source changed (the error says so), or the
    MD5 its store reported is no MD5 of its bytes (an S3 ETag under SSE-KMS), which only this
    file's bytes passing through bridge can settle."""
    if md5 is None:
        return exc
    try:
        checked_source(ctx, f)
    except IntegrityError as changed:
        return changed
    return Fallback(f"{src_loc}: Azure found its bytes unlike the MD5 its store reports (an S3 ETag under "
                    f"SSE-KMS is no MD5): its bytes pass through bridge to be hashed")


def _entry(f: FilePlan, crc: str, sha: str, origin: str, store_crc: bool, pull: Pull, checked: bool,
           committed: ObjectInfo) -> FileEntry:
    """The record of a pulled blob. Proven only where Azure checked the bytes it fetched against
    the MD5 the source's store computed, and the CRC32C is the one that store reported of that
    version: Azure keeps no checksum of its own to compare, and its blob's metadata is bridge's
    own claim. Otherwise the note begins "unproven:" and says why (verify --deep reads it)."""
    from bridge.manifest import FileEntry
    if f.size == 0:
        return FileEntry(f.rel, 0, crc, sha, computed=[], reported={}, identity=dict(committed.identity),
                         source_id=dict(f.source_id), note="empty at the source: written by bridge, nothing pulled")
    how = ("pulled by Azure from a signed URL (Put Block From URL)"
           + (", pinned to the source's ETag" if pull.etag else ""))
    why_not = []
    if not checked:
        why_not.append("no MD5 of the source (a multipart or composite object, or above one block) for "
                       "Azure to check the bytes it fetched against")
    if not store_crc:
        why_not.append(f"its CRC32C is {origin}, which any client can write")
    reported = {"md5": pull.md5} if checked and pull.md5 else {}
    if store_crc:
        reported["source_crc32c"] = crc
    if why_not:
        note = f"unproven: {how}; " + "; ".join(why_not) + " (verify --deep reads it)"
    else:
        note = f"{how}; Azure checked its bytes against the MD5 the source's store computed; CRC32C {origin}"
    if sha:
        note += "; SHA-256 stored by bridge in the source's metadata"
    return FileEntry(f.rel, f.size, crc, sha, computed=[], reported=reported, identity=dict(committed.identity),
                     source_id=dict(f.source_id), note=note)


def _abort(ctx: RouteContext, loc: Location, upload_id: str) -> None:
    from bridge.retry import stopping
    try:
        with stopping(None):   # a cancelled copy's clean-up is sent after the cancel
            ctx.dst.abort_upload(loc, upload_id)
    except BridgeError:
        pass   # left for `mcbridge uploads --abort`; the failure that brought us here is the one to report


register(FromUrlRoute())
