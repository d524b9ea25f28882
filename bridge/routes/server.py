"""The ``server`` route: inside one store account the store copies each object itself.

S3 CopyObject (UploadPartCopy parts above 5 GiB), GCS objects.rewrite (looping on its token),
Azure Copy Blob From URL up to 256 MiB and above it blocks pulled by Put Block From URL and put
in place by one Put Block List (an Azure endpoint without it sends the job ``direct``), local
copy_file_range: see each store's ``copy_object``. A Settings object names one account per scheme, so two roots of one
scheme are in one account.

The manifest entry is committed from what the stores computed, not from bytes bridge read: a
checksum the source's store computed equal to the destination store's for the copy proves it
(S3 computes the copy's CRC32C for CopyObject and a one-request copy's ETag is its MD5; GCS's
crc32c and md5Hash are the service's). Metadata a client can write (``bridge_crc32c``,
``bridge_sha256`` in the source's metadata) is never recorded as a hash: a claim the copy
contradicts fails it. ``computed`` is then empty. With no checksum both stores computed (Azure
computes none for a block blob; an S3 source with only CRC64NVME and a multipart ETag), the copy
is read back inside its account (no egress within a region) and hashed, and the record holds
those hashes (``computed``); with ``transfer.store_checksums: skip`` it is not read, and the entry
is ``unproven:`` (bridge/manifest.py) and says why, which ``verify`` reports until ``verify
--deep`` reads it. Where no CRC32C is known before the copy and the destination keeps none (an
Azure blob bridge did not write), the file goes ``direct``. A local copy is hashed by reading it
back (no egress).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge.attributes import Attrs
from bridge.verdicts import rehash
from bridge.config import Settings
from bridge.errors import IntegrityError, ObjectNotFound, Unsupported
from bridge.routes import Route, Fallback, register
from bridge.routes.delegated import store_proof, store_sums, why_unproven
from bridge.stores import get_store
from bridge.stores.base import ObjectInfo, identity_changed
from bridge.urls import Location

if TYPE_CHECKING:
    from bridge.contracts import FilePlan, RouteContext
    from bridge.manifest import FileEntry


def source_hashes(info: ObjectInfo) -> tuple[str | None, str, str]:
    """(CRC32C, SHA-256, where they come from) known of an object without reading it."""
    crc = info.checksums.get("crc32c")
    sha = info.metadata.get("bridge_sha256", "")
    if crc:
        return crc, sha, "reported by the source store"
    crc = info.metadata.get("bridge_crc32c")
    return crc, sha, "stored by bridge in the source's metadata"


def checked_source(ctx: RouteContext, f: FilePlan) -> tuple[Location, ObjectInfo]:
    """The source object as it is now, refused when it is not the version planned."""
    loc = ctx.src_loc(f.rel)
    info = ctx.src.info(loc)
    if info.size != f.size or identity_changed(f.source_id, info.identity):
        raise IntegrityError(f"{loc}: changed since the copy was planned; run the copy again")
    return loc, info


class ServerRoute(Route):
    name = "server"

    def serves(self, src: Location, dst: Location, settings: Settings) -> str | None:
        if src.scheme != dst.scheme:
            return "server-side copies stay inside one store account"
        if not get_store(dst, settings).features.server_side_copy:
            return f"{dst.scheme}:// stores cannot copy inside themselves"
        return None

    def preferred(self, src: Location, dst: Location) -> bool:
        # A local copy is hashed by reading it back: little is saved unless asked for.
        return not dst.is_local

    def copy_file(self, ctx: RouteContext, f: FilePlan) -> FileEntry:
        from bridge.manifest import FileEntry
        src_loc, info = checked_source(ctx, f)
        dst_loc = ctx.dst_loc(f.rel)
        src_sums = store_sums(None, info)   # checked_source's HEAD: what the source's store computed
        claimed = info.metadata.get("bridge_crc32c")
        if not (src_sums.get("crc32c") or claimed) and "crc32c" not in ctx.dst.features.checksums \
                and not dst_loc.is_local:
            raise Fallback(f"{src_loc} has no CRC32C its store reports or bridge recorded: "
                                   f"its bytes pass through bridge to be hashed")
        objects = ctx.settings.objects
        # The store's copy keeps the source's headers and metadata; given overrides replace them.
        overrides = objects.metadata == "off" or objects.content_type or objects.set_metadata
        attrs = (ctx.attrs(f.rel, info.attrs) or Attrs()) if overrides else None
        try:
            copied = ctx.dst.copy_object(src_loc, dst_loc, size=f.size, attrs=attrs)
        except Unsupported as exc:
            raise Fallback(str(exc), job_wide=True) from exc
        if dst_loc.is_local:
            crc, sha = rehash(ctx.dst, dst_loc, f.size)
            ctx.progress.moved(f.size, through=f.size)
            return FileEntry(f.rel, f.size, crc, sha, computed=["crc32c", "sha256"], identity=dict(copied.identity),
                             note="copied by the kernel (copy_file_range); hashed by reading the copy")
        dst_sums = store_sums(None, copied)
        try:
            entry = self._entry(ctx, f, src_loc, dst_loc, src_sums, dst_sums, claimed)
        except IntegrityError:
            _remove(ctx, dst_loc)
            raise
        entry.identity = dict(copied.identity)
        ctx.progress.moved(f.size, through=f.size if entry.computed else 0)
        return entry

    @staticmethod
    def _entry(ctx: RouteContext, f: FilePlan, src_loc: Location, dst_loc: Location, src_sums: dict[str, str],
               dst_sums: dict[str, str], claimed: str | None) -> FileEntry:
        """The copy's entry from what both stores computed: proven when a checksum of both agrees
        (S3's CRC32C of the copy, computed by S3 for CopyObject, or a one-request ETag's MD5; GCS's
        crc32c and md5Hash, which a rewrite carries over), else read back and hashed (or, with
        store_checksums "skip", unproven, saying why). Metadata the
        source carries (bridge_crc32c, bridge_sha256) is what a client wrote: never recorded as a
        hash, only compared (a claim the copy contradicts fails it)."""
        from bridge.manifest import UNPROVEN, FileEntry
        proven_by = store_proof(dst_loc, src_loc, src_sums, dst_sums)
        crc = dst_sums.get("crc32c") or src_sums.get("crc32c")
        reported = dict(dst_sums)
        if proven_by and crc:
            return FileEntry(f.rel, f.size, crc, "", computed=[], reported=reported,
                             note=f"copied inside the store; {proven_by.upper()} computed by both stores is equal")
        if crc is not None and claimed and crc != claimed:
            raise IntegrityError(f"{dst_loc}: the copy has CRC32C {crc}, its source's metadata says {claimed}; "
                                 f"the copy was removed")
        if proven_by or (crc is None and claimed is None) or ctx.settings.transfer.store_checksums != "skip":
            # Nothing both stores computed proves the copy, or gives its CRC32C (an Azure blob, an
            # endpoint that keeps no checksums): it is read back inside its account (no egress
            # within a region) and hashed, and those hashes are the record's. store_checksums
            # "skip" trusts the store's copy instead, and the entry says it is unproven.
            read_crc, sha = rehash(ctx.dst, dst_loc, f.size)
            known = crc or claimed
            if known and read_crc != known:
                raise IntegrityError(f"{dst_loc}: read back, the copy has CRC32C {read_crc}, its source "
                                     f"{known}; the copy was removed")
            why = "the store reports no CRC32C" if proven_by else why_unproven(src_sums, dst_sums)
            return FileEntry(f.rel, f.size, read_crc, sha, computed=["crc32c", "sha256"], reported=reported,
                             note=f"copied inside the store, and {why}; hashed by reading the copy")
        return FileEntry(f.rel, f.size, crc or claimed, "", computed=[], reported=reported,
                         note=f"{UNPROVEN} copied inside the store, and {why_unproven(src_sums, dst_sums)}"
                              + ("" if crc else "; its CRC32C is the one in the source's metadata"))


def _remove(ctx: RouteContext, loc: Location) -> None:
    try:
        ctx.dst.delete(loc)
    except ObjectNotFound:
        pass


register(ServerRoute())
