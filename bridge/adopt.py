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

import hashlib
import os
import re
from dataclasses import dataclass

from bridge import hashing
from bridge.manifest import FileEntry, entry_text
from bridge.stores.base import ObjectInfo, Store

ORDER = ("md5", "crc64nvme", "crc32c", "crc32")   # strongest first
COMPUTABLE = ("md5", "crc32c", "crc32")            # what bridge can hash a local file's bytes with
_COMPUTABLE = frozenset(COMPUTABLE)
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
    scheme = info.location.scheme
    if scheme in CLIENT_WRITTEN:
        return {}
    sums = info.checksums
    if scheme == "s3":
        etag = info.identity.get("etag", "").lower()
        if _MD5.match(etag):
            sums = {**sums}
            sums.setdefault("md5", etag)          # a one-request upload's ETag is its MD5
        elif ask and not sums:
            sums = store.info(info.location).checksums
    return {k: v.lower() for k, v in sums.items() if k in ORDER and v} if sums else {}


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
    return hashing.read_small(info.location.local_path, info.size)


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
    return dst.location.is_local or not _COMPUTABLE.isdisjoint(reported(None, dst))


def common(src_sums: dict[str, str], dst_sums: dict[str, str], src_local: bool, dst_local: bool) -> str | None:
    """The strongest checksum both sides have or, for a local side, can compute."""
    for name in ORDER:
        have_src = name in src_sums or (src_local and name in COMPUTABLE)
        have_dst = name in dst_sums or (dst_local and name in COMPUTABLE)
        if have_src and have_dst:
            return name
    return None


def compare(src_store: Store, src: ObjectInfo, dst_store: Store, dst: ObjectInfo, rel: str,
            deep: bool = False, known: dict[str, str] | None = None) -> Adoption:
    """Whether ``dst`` holds ``src``'s bytes, by size and the strongest common checksum (or, with
    ``deep`` where none is common, by reading both). ``known``: a local source's CRC32C, MD5 and
    SHA-256, computed of its bytes by ``Prefetch``'s process (read again where they do not serve)."""
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
        if src_local and known is not None and name in known:
            read = {"crc32c": known["crc32c"], name: known[name], "sha256": known["sha256"]}
        else:
            read = digest(src_store, src, (name, "sha256") if name in COMPUTABLE else ("sha256",))
        src_sums = {**src_sums, **read}
    if dst_local:
        dst_sums = {**dst_sums, **digest(dst_store, dst, (name,))}
    if src_sums[name] != dst_sums[name]:
        return Adoption(False, name, f"{name.upper()} {dst_sums[name]}, source {src_sums[name]}")
    return Adoption(True, name, f"{name.upper()} equal", _entry(rel, src, dst, dst_sums, {**src_sums, **read}, name))


def quick(rel: str, src: ObjectInfo, dst: ObjectInfo, known: dict[str, str] | None = None) -> str | bool | None:
    """``compare``'s answer in its most common case, for half its time a file: a small local
    file against a cloud object whose listing reports its MD5 (an S3 ETag of one request, GCS
    md5Hash), the file read once (or its ``known`` digests). The adopted object's entry as the
    JSON text ``compare``'s entry encodes to (tests/test_adopt.py holds the two equal), False
    where the MD5s differ, None where ``compare`` is to answer: any other case, or a file that
    cannot be read as listed (its error is the store's). Adopting 20,000 files spent a fifth of
    its CPU in ``compare``'s dicts, its dataclasses and the entry's encoding."""
    if (src.size != dst.size or src.size > INLINE_BYTES or src.location.scheme != "file"
            or dst.location.scheme == "file" or src.checksums):
        return None
    theirs = reported(None, dst)
    md5 = theirs.get("md5")
    if md5 is None:
        return None
    if known is None:
        data = hashing.read_small("/" + src.location.key, src.size)   # (its local_path)
        if data is None:
            return None
        if hashlib.md5(data).hexdigest() != md5:
            return False
        crc, sha = hashing.crc_hex(hashing.crc32c(data)), hashlib.sha256(data).hexdigest()
    elif known["md5"] != md5:
        return False
    else:
        crc, sha = known["crc32c"], known["sha256"]
    return entry_text(rel, dst.size, crc, sha, 0, [], ["crc32c", "sha256"], theirs, dst.identity, [], _BY_MD5,
                      src.identity, "md5", "", {})


_BY_MD5 = "adopted: equal to its source by MD5"   # (``_entry``'s note)


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
    read = src.location.is_local or both_read or "sha256" in src_sums   # (the same for both names)
    computed = [h for h in ("crc32c", "sha256") if h in src_sums] if read else []
    note = f"adopted: equal to its source by {'reading both' if by == 'deep' else by.upper()}"
    return FileEntry(rel, dst.size, src_sums.get("crc32c", ""), src_sums.get("sha256", ""),
                     computed=computed, reported=dict(dst_sums), identity=dict(dst.identity), note=note,
                     adopted=by, source_id=dict(src.identity))


class Prefetch:
    """The digests of small local files to adopt, computed by processes of their own a batch at a
    time, while this one lists, merges and records: hashing 8 KiB in this process held the GIL
    for its every step (a thread pool measured slower than hashing inline, on two cores), and
    was a quarter of a 20,000-file adoption. Each file is still read once, and its CRC32C, MD5
    and SHA-256 are of the bytes read (``hashing.small_files``).

    ``add`` gives a ticket; ``get`` its digests, or None where they are to be computed here: a
    file the process could not read as listed (read again here, so that the error is the
    store's), or a batch handed out before ``BATCH`` files were waiting, as in a small sync,
    which never starts a process. The processes are forked when the first full batch is handed
    out (Linux only, and never in a daemonic process such as a Celery prefork worker's), and an
    answer that takes longer than ``WAIT`` seconds ends them (its files hashed here)."""

    BATCH = 256
    WAIT = 120.0

    def __init__(self, processes: int | None = None) -> None:
        self.processes = processes or max(1, min(4, (os.cpu_count() or 2) - 1))
        self._pool = None
        self._off = not _can_fork()
        self._waiting: list[tuple[str, int]] = []
        self._batches: list = []        # per batch: its AsyncResult, its answer, or None (hash here)
        self.elsewhere = 0              # files whose digests a process computed

    def add(self, info: ObjectInfo) -> tuple[int, int] | None:
        if self._off:
            return None
        self._waiting.append((info.location.local_path, info.size))
        ticket = (len(self._batches), len(self._waiting) - 1)
        if len(self._waiting) >= self.BATCH:
            self._hand_out()
        return ticket

    def get(self, ticket: tuple[int, int] | None) -> dict[str, str] | None:
        if ticket is None:
            return None
        batch, index = ticket
        if batch == len(self._batches):   # still waiting: handed out now (or, short, hashed here)
            self._hand_out()
        answer = self._batches[batch]
        if answer is not None and not isinstance(answer, list):
            try:
                answer = answer.get(self.WAIT)
            except Exception:   # a process that died or hung: its batch, and the rest, hashed here
                self._off, answer = True, None
                self.close(done=False)
            self._batches[batch] = answer
        found = None if answer is None else answer[index]
        if found is None:
            return None
        self.elsewhere += 1
        return {"crc32c": found[0], "md5": found[1], "sha256": found[2]}

    def _hand_out(self) -> None:
        files, self._waiting = self._waiting, []
        if self._pool is None and not self._off and len(files) >= self.BATCH:
            import multiprocessing
            # forked while the listings' threads run: the child runs only hashing.small_files
            self._pool = multiprocessing.get_context("fork").Pool(self.processes, initializer=_child)
        self._batches.append(None if self._pool is None or self._off
                             else self._pool.apply_async(hashing.small_files, (files,)))

    def close(self, done: bool = True) -> None:
        """The processes ended: after their last batch (``done``), or at once."""
        if self._pool is not None:
            if done and not self._off:
                self._pool.close()
            else:
                self._pool.terminate()
            self._pool.join()
            self._pool = None


def _child() -> None:
    """A hashing process: the command's handlers of SIGINT and SIGTERM are not its own (a ^C
    reaches this process's parent, which ends it)."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _can_fork() -> bool:
    """Linux, and not a daemonic process of multiprocessing's or of billiard's (Celery's prefork
    workers), asked only of a module already loaded: a sync's start imports neither."""
    import sys
    if sys.platform != "linux":
        return False
    for name in ("multiprocessing", "billiard"):
        module = sys.modules.get(name)
        if module is not None and module.current_process().daemon:
            return False
    return True
