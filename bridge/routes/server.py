"""The ``server`` route: inside one store account the store copies each object itself.

S3 CopyObject (UploadPartCopy parts above 5 GiB), GCS objects.rewrite (looping on its token),
Azure Copy Blob From URL up to 256 MiB and above it blocks pulled by Put Block From URL and put
in place by one Put Block List (an Azure endpoint without it sends the job ``direct``), local
copy_file_range: see each store's ``copy_object``. A Settings object names one account per scheme, so two roots of one
scheme are in one account.

The manifest entry is committed from what the stores report, not from bytes bridge read: the
CRC32C the destination reports for the copy (S3 computes it for CopyObject, GCS keeps one for
every object), checked against the one the source reports or the one bridge stored in the
source's metadata when it wrote it; the SHA-256 bridge stored there, when there is one.
``computed`` is then empty and ``note`` says where the hashes come from; ``verify --deep``
reads the bytes. Where no CRC32C is known before the copy and the destination keeps none (an
Azure blob bridge did not write), the file goes ``direct``; where neither store reports one
after the copy (an S3 endpoint without checksums), the copy is read back and hashed. A local
copy is hashed by reading it back (no egress).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge.attributes import Attrs
from bridge.check import rehash
from bridge.config import Settings
from bridge.errors import IntegrityError, ObjectNotFound, Unsupported
from bridge.routes import Route, Fallback, register
from bridge.stores import get_store
from bridge.stores.base import ObjectInfo, identity_changed
from bridge.urls import Location

if TYPE_CHECKING:
    from bridge.engine import FilePlan, JobContext
    from bridge.manifest import FileEntry


def source_hashes(info: ObjectInfo) -> tuple[str | None, str, str]:
    """(CRC32C, SHA-256, where they come from) known of an object without reading it."""
    crc = info.checksums.get("crc32c")
    sha = info.metadata.get("bridge_sha256", "")
    if crc:
        return crc, sha, "reported by the source store"
    crc = info.metadata.get("bridge_crc32c")
    return crc, sha, "stored by bridge in the source's metadata"


def checked_source(ctx: JobContext, f: FilePlan) -> tuple[Location, ObjectInfo]:
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

    def copy_file(self, ctx: JobContext, f: FilePlan) -> FileEntry:
        from bridge.manifest import FileEntry
        src_loc, info = checked_source(ctx, f)
        dst_loc = ctx.dst_loc(f.rel)
        known_crc, sha, origin = source_hashes(info)
        if known_crc is None and "crc32c" not in ctx.dst.features.checksums and not dst_loc.is_local:
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
        through, computed, note = 0, [], ""
        crc = copied.checksums.get("crc32c")
        if dst_loc.is_local:
            crc, sha = rehash(ctx.dst, dst_loc, f.size)
            through, computed = f.size, ["crc32c", "sha256"]
            note = "copied by the kernel (copy_file_range); hashed by reading the copy"
        elif crc is None and known_crc is None:
            # Neither store reports a CRC32C (an endpoint that keeps no checksums): the copy is
            # read back to be hashed, and those bytes count as passing through bridge.
            crc, sha = rehash(ctx.dst, dst_loc, f.size)
            through, computed = f.size, ["crc32c", "sha256"]
            note = "copied inside the store, which reports no CRC32C; hashed by reading the copy"
        elif crc is None:
            crc = known_crc
            note = f"copied inside the store; CRC32C {origin}"
        else:
            note = "copied inside the store; CRC32C reported by the destination store"
        if known_crc is not None and crc != known_crc:
            _remove(ctx, dst_loc)
            raise IntegrityError(f"{dst_loc}: the copy has CRC32C {crc}, its source {known_crc}; "
                                 f"the copy was removed")
        if sha and not computed:
            note += "; SHA-256 stored by bridge in the source's metadata"
        ctx.progress.moved(f.size, through=through)
        reported = dict(copied.checksums)
        if not computed:
            reported.setdefault("crc32c", crc)
        return FileEntry(f.rel, f.size, crc, sha, computed=computed, reported=reported,
                         identity=dict(copied.identity), note=note)


def _remove(ctx: JobContext, loc: Location) -> None:
    try:
        ctx.dst.delete(loc)
    except ObjectNotFound:
        pass


register(ServerRoute())
