"""Taking over copies bridge did not make: is the object at the destination the source's, proven
without sending it?

Two objects are equal for adoption when their sizes agree and so does the strongest checksum both
stores computed and report of them, in this order: MD5 (S3's ETag of a one-request upload, GCS
md5Hash), CRC64NVME (S3), CRC32C (S3 full-object checksum, GCS crc32c), CRC32 (S3). A value a
client could have written is no evidence: neither the CRC32C bridge keeps in an object's metadata
(any client can write the same) nor an Azure blob's Content-MD5 (stored unchecked for a Put Block
List, settable by Set Blob Properties): an Azure blob reports nothing here. A local file reports
nothing but costs no egress to read, so whatever the other side reports is computed from its
bytes. Where no checksum is common, ``deep`` reads both sides and compares CRC32C and SHA-256;
otherwise the object counts as different and is sent again (``check``: unproven). An S3 ETag is
an MD5 only for an unencrypted (or SSE-S3) one-request upload: under SSE-KMS it is not, and such
an object merely fails to match (it is sent again, never taken wrongly).

``compare`` answers with an ``Adoption``: ``equal`` and by which checksum, and the manifest entry
that records the object as adopted (``FileEntry.adopted`` names the checksum; ``computed`` the
hashes bridge took from bytes it read: a local source's, or both sides' under ``deep``).
Sync's adoption asks it; ``check_trees`` (bridge/treecheck.py) asks ``reported`` and ``common``
only, so that it reads no cloud object.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from bridge import hashing
from bridge.manifest import FileEntry
from bridge.stores.base import ObjectInfo, Store

ORDER = ("md5", "crc64nvme", "crc32c", "crc32")   # strongest first
COMPUTABLE = ("md5", "crc32c", "crc32")            # what bridge can hash a local file's bytes with
_MD5 = re.compile(r"[0-9a-f]{32}\Z")


@dataclass(frozen=True)
class Adoption:
    equal: bool
    by: str                 # the checksum that decided ("md5", ..., "deep"), or "" when none could
    why: str                # one line: how it was decided
    entry: FileEntry | None = None   # when equal: the manifest entry of the adopted object


# Stores whose every reported checksum a client can write: Azure keeps a Put Block List's
# Content-MD5 unchecked, and Set Blob Properties sets one on any blob, while nothing in the data
# plane tells how a blob was written.
CLIENT_WRITTEN = frozenset({"az"})


def reported(store: Store | None, info: ObjectInfo, ask: bool = False) -> dict[str, str]:
    """The whole-object checksums a store computed of an object and reports, lower-case hex, by
    ``ORDER``'s names; with ``ask``, an S3 object whose listing gives none (no MD5 ETag: a
    multipart upload) is asked for them (S3's checksums come with HEAD only). Never a value a
    client could have written: not an object's metadata (``bridge_crc32c``), not an Azure blob's
    Content-MD5, so an Azure blob reports none."""
    if info.location.scheme in CLIENT_WRITTEN:
        return {}
    sums = dict(info.checksums)
    etag = info.identity.get("etag", "").lower()
    if info.location.scheme == "s3" and _MD5.match(etag):
        sums.setdefault("md5", etag)          # a one-request upload's ETag is its MD5
    elif ask and info.location.scheme == "s3" and not sums:
        sums = dict(store.info(info.location).checksums)
    return {k: v.lower() for k, v in sums.items() if k in ORDER and v}


def digest(store: Store, info: ObjectInfo, names: tuple[str, ...]) -> dict[str, str]:
    """``names`` (of ``md5``, ``crc32c``, ``crc32``, ``sha256``) and the CRC32C of the object's
    bytes, read in bounded ranges (a small local file in one read: ``_small``)."""
    if info.location.is_local and info.size <= INLINE_BYTES:
        data = _small(info)
        if data is not None:
            return {name: hashing.digest_bytes(data, name) for name in dict.fromkeys(("crc32c", *names))}
    return hashing.digest(hashing.reader(store, info.location), info.size, ("crc32c", *names),
                          name=str(info.location))


def _small(info: ObjectInfo) -> bytes | None:
    """A small local file's bytes in one read, when it still holds ``info.size`` of them; None
    otherwise, or on any error (the store's read then says what is wrong, as for any file).
    Python's buffered ``open`` cost more than hashing 8 KiB: 20,000 files' adoption spent a
    tenth of its time opening them."""
    try:
        fd = os.open(info.location.local_path, os.O_RDONLY | O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, info.size + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) == info.size else None


O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


# A local file up to this size is hashed for a comparison in the thread that asks (a pool's
# hand-over costs more than hashing it, and the GIL serialises hashing so small anyway).
INLINE_BYTES = 1024 * 1024


def offline(src: ObjectInfo, dst: ObjectInfo) -> bool:
    """Whether ``compare`` (without ``deep``) of these two sends no request and reads no more than
    a small local file: a local source of at most INLINE_BYTES against a local destination, or
    against one whose listing reports a checksum bridge can compute of local bytes (an MD5 ETag,
    GCS md5Hash or crc32c, ...); or sizes that differ."""
    if src.size != dst.size:
        return True
    if not src.location.is_local or src.size > INLINE_BYTES:
        return False
    return dst.location.is_local or any(name in COMPUTABLE for name in reported(None, dst))


def common(src_sums: dict[str, str], dst_sums: dict[str, str], src_local: bool, dst_local: bool) -> str | None:
    """The strongest checksum both sides have or, for a local side, can compute."""
    for name in ORDER:
        have_src = name in src_sums or (src_local and name in COMPUTABLE)
        have_dst = name in dst_sums or (dst_local and name in COMPUTABLE)
        if have_src and have_dst:
            return name
    return None


def compare(src_store: Store, src: ObjectInfo, dst_store: Store, dst: ObjectInfo, rel: str,
            deep: bool = False) -> Adoption:
    """Whether ``dst`` holds ``src``'s bytes, by size and the strongest common checksum (or, with
    ``deep`` where none is common, by reading both)."""
    if src.size != dst.size:
        return Adoption(False, "size", f"size {dst.size}, source {src.size}")
    src_local, dst_local = src.location.is_local, dst.location.is_local
    src_sums = reported(src_store, src, ask=not src_local)
    dst_sums = reported(dst_store, dst, ask=not dst_local)
    name = common(src_sums, dst_sums, src_local, dst_local)
    read: dict[str, str] = {}
    if name is None and not deep:
        return Adoption(False, "", _none_common(src, dst))
    if name is None:
        read = digest(src_store, src, ("sha256",))
        theirs = digest(dst_store, dst, ("sha256",))
        if (read["crc32c"], read["sha256"]) != (theirs["crc32c"], theirs["sha256"]):
            return Adoption(False, "deep", "read both: CRC32C or SHA-256 differ")
        return Adoption(True, "deep", "read both: CRC32C and SHA-256 equal",
                        _entry(rel, src, dst, dst_sums, read, "deep", both_read=True))
    if src_local or "crc32c" not in src_sums:
        # A local source costs nothing to read. A cloud source that reports no CRC32C is read
        # too: the entry needs its CRC32C, by which verify checks the destination object.
        read = digest(src_store, src, (name, "sha256") if name in COMPUTABLE else ("sha256",))
        src_sums = {**src_sums, **read}
    if dst_local:
        dst_sums = {**dst_sums, **digest(dst_store, dst, (name,))}
    if src_sums[name] != dst_sums[name]:
        return Adoption(False, name, f"{name.upper()} {dst_sums[name]}, source {src_sums[name]}")
    return Adoption(True, name, f"{name.upper()} equal", _entry(rel, src, dst, dst_sums, {**src_sums, **read}, name))


def _none_common(src: ObjectInfo, dst: ObjectInfo) -> str:
    """Why no checksum decides, naming a side whose every checksum is a client's claim."""
    azure = [side for side, info in (("destination", dst), ("source", src))
             if info.location.scheme in CLIENT_WRITTEN]
    if azure:
        return (f"the {azure[0]} is an Azure blob: Azure computes no checksum of a block blob, and its "
                f"Content-MD5 and metadata are what a client wrote (--adopt deep reads both)")
    return "no checksum both stores report (--adopt deep reads both)"


def _entry(rel: str, src: ObjectInfo, dst: ObjectInfo, dst_sums: dict[str, str], src_sums: dict[str, str],
           by: str, both_read: bool = False) -> FileEntry:
    """The manifest entry of an adopted object: its CRC32C the source's (reported or computed),
    its SHA-256 where bridge read the source, what the destination reports, its identity, and
    the source's version it was found equal to (``source_id``), as a copy records the version it
    read: while both listings show those versions, a later sync passes the object at no request
    (without it, every sync read each adopted object of a cloud source to hash it again)."""
    computed = [h for h in ("crc32c", "sha256") if h in src_sums and (src.location.is_local or both_read
                                                                      or "sha256" in src_sums)]
    note = f"adopted: equal to its source by {'reading both' if by == 'deep' else by.upper()}"
    return FileEntry(rel, dst.size, src_sums.get("crc32c", ""), src_sums.get("sha256", ""),
                     computed=computed, reported=dict(dst_sums), identity=dict(dst.identity), note=note,
                     adopted=by, source_id=dict(src.identity))
