"""Does an object match its manifest entry? Shared by ``verify`` and ``sync``.

Cheap checks ask the store: the size, and the CRC32C the store reports (S3 full-object
checksum, GCS crc32c) or, where it keeps none, the CRC32C bridge stored in the object's metadata
(Azure) together with the committed block sizes. A local file reports nothing, so its CRC32C is
computed from the disk. ``deep`` re-reads every object and compares CRC32C and SHA-256 (CRC32C alone for a file the
clouds copied, whose entry holds only what the stores reported): a file copied in parts is re-read
part by part in parallel and checked by its part SHA-256s, their ``sha256-tree`` and the CRC32C
combined from the parts; its plain whole-file SHA-256, one stream that cannot be split, only when
asked (``verify --deep --sha256``) or when the entry has no part SHA-256s.
An object store's object whose listing shows the version committed (its ETag, generation or
version id as recorded, for an entry holding what the store reported then, or one adopted by
reading both sides) needs no request at all. Where the store reports no CRC32C (an object committed with ``--store-checksums skip``, or one
adopted from another tool's copy), another checksum the store computed and reported at commit
(``reported``: an S3 one-request ETag's MD5, GCS md5; never an Azure Content-MD5, which a client
can write) is compared, or else the object is re-read and hashed: listed as ``rehashed`` when
equal, never passed on trust.

All of that vouches only for the object version bridge committed. The manifest records that
version's identity (ETag, generation, version id, last-modified, inode and times); an object
whose identity has changed since was rewritten behind bridge's back, possibly keeping size,
metadata and even checksums, so even the cheap check re-reads it and compares CRC32C and SHA-256.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from bridge.errors import IntegrityError, ObjectNotFound
from bridge.hashing import TREE, FileHash, rehash, rehash_parts, sha256_tree
from bridge.manifest import READ_BACK, FileEntry
from bridge.stores.base import ObjectInfo, Store, identity_changed
from bridge.urls import Location


def completed(store: Store, loc: Location, reported: ObjectInfo, crc32c: str, mode: str) -> ObjectInfo:
    """``--store-checksums`` on an object just completed from parts, the same for every store.

    require (the default): a store that keeps a whole-object CRC32C (S3, GCS) must report ours;
    one that keeps none (Azure block blobs, local files) checked each part on arrival, and
    that stands. readback: where the store reports no CRC32C, the object is read back and
    hashed. skip: nothing is checked. An object that fails is removed; the error says why."""
    if mode == "skip":
        return reported
    got = reported.checksums.get("crc32c")
    if got is None and mode == "readback":
        got, _ = rehash(store, loc, reported.size, sha=False)
    elif got is None and "crc32c" in store.features.checksums:
        _remove(store, loc)
        raise IntegrityError(f"{loc}: the endpoint reports no CRC32C for the completed upload, so it cannot "
                             f"be proven intact; the object was removed (use --store-checksums readback for "
                             f"endpoints that keep no checksums)")
    if got is not None and got != crc32c:
        _remove(store, loc)
        raise IntegrityError(f"{loc}: the store reports CRC32C {got} for the completed upload, expected "
                             f"{crc32c}; the object was removed")
    return reported


def wants_md5(loc: Location, mode: str) -> bool:
    """Whether a one-request upload to ``loc`` has its bytes' MD5 computed: under
    ``--store-checksums skip`` or ``readback`` an S3 endpoint may keep no checksum of its own, and
    its ETag, the MD5 of the bytes it stored, is then what proves it holds bridge's bytes."""
    return loc.scheme == "s3" and mode != "require"


def md5_evidence(committed: ObjectInfo, md5: str | None) -> ObjectInfo:
    """``committed`` with ``md5`` recorded as reported by the store, when the store reported no
    checksum and its ETag is that MD5 (a one-request upload's ETag, unless the object is
    encrypted with a KMS key): a later verify trusts the listing of this version by it."""
    if md5 is None or committed.checksums or committed.identity.get("etag", "").lower() != md5:
        return committed
    return replace(committed, checksums={"md5": md5})


def _remove(store: Store, loc: Location) -> None:
    try:
        store.delete(loc)
    except ObjectNotFound:
        pass


def reported_crc32c(store: Store, info: ObjectInfo) -> str | None:
    if "crc32c" in store.features.checksums:
        if "crc32c" not in info.checksums:
            info = store.info(info.location)  # listings do not always carry checksums (S3)
        return info.checksums.get("crc32c")
    return info.metadata.get("bridge_crc32c")


@dataclass(frozen=True)
class Verdict:
    problem: str | None = None    # why the object does not match its entry; None when it does
    rehashed: str | None = None   # why a cheap check re-read it anyway (its identity changed)


def mismatch(store: Store, info: ObjectInfo, entry: FileEntry, deep: bool = False) -> str | None:
    """Why the object does not match its entry, or None when it does."""
    return judge(store, info, entry, deep).problem


def judge(store: Store, info: ObjectInfo, entry: FileEntry, deep: bool = False, sha256: bool = False) -> Verdict:
    """``sha256``: a deep check computes the plain whole-file SHA-256 too (``verify --deep --sha256``)."""
    if info.size != entry.size:
        return Verdict(f"size {info.size}, manifest says {entry.size}")
    if deep:
        return Verdict(_bytes_differ(store, info, entry, sha256))
    if proven_by_listing(info, entry):   # the case verify decides in place, decided the same way here
        return Verdict(None)
    changed = _identity_change(store, info, entry)
    if changed:
        # Another version than the one committed: what the store reports of it, and metadata
        # anyone can copy, prove nothing; only its bytes can.
        differ = _bytes_differ(store, info, entry)
        if differ:
            return Verdict(f"rewritten since the manifest was written ({changed}): {differ}", changed)
        return Verdict(None, f"{changed} since the manifest was written; bytes proven equal by rehash")
    if _listed_as_committed(info, entry):
        return Verdict(None)
    problem = _cheap_problem(store, info, entry)
    if problem is not _UNREPORTED:
        return Verdict(problem)
    # The store reports no CRC32C (an object rewritten with the same bytes by a plain PUT, or
    # one bridge adopted): another checksum recorded for it at commit, else its bytes, decide.
    from bridge.adopt import reported
    now = reported(store, info, ask=True)
    common = [name for name in ("md5", "crc64nvme", "crc32c", "crc32") if name in now and name in entry.reported]
    if common:
        name = common[0]
        if now[name] == entry.reported[name]:
            return Verdict(None)
        return Verdict(f"{name.upper()} {now[name]} reported by the store, manifest says {entry.reported[name]}")
    differ = _bytes_differ(store, info, entry)
    why = "the store reports no CRC32C for it"
    if differ:
        return Verdict(f"{why}; read again: {differ}", why)
    return Verdict(None, f"{why}; bytes proven equal by rehash")


def proven_by_listing(info: ObjectInfo, entry: FileEntry) -> bool:
    """Whether ``judge`` (not deep) would pass the object from what its listing says alone, with
    no request: the recorded size, and the listing's version of it the one committed. A caller
    with many objects to judge decides these in place and sends only the rest to a pool."""
    return info.size == entry.size and bool(entry.identity) and bool(info.identity) \
        and not identity_changed(entry.identity, info.identity) and _listed_as_committed(info, entry)


# What an object store gives each write of an object anew (S3's ETag and version id, GCS's
# generation, Azure's ETag): the same value in the listing as in the commit's answer means the
# version the commit checked is the one there.
_VERSION_FIELDS = ("etag", "generation", "version_id")


def _listed_as_committed(info: ObjectInfo, entry: FileEntry) -> bool:
    """Whether the listing alone shows the committed version of an object-store object: its
    size and a version field equal to the recorded ones, for an entry holding what the store
    reported of that version at commit (the checksums checked then against ours), or one adopted
    by reading both sides, or proven by a deep read (that version's bytes hashed then: an Azure
    blob reports nothing), so no request of its own is needed. Files on a local path have no such
    field: their bytes are checked."""
    if info.location.is_local or not entry.identity or not info.identity \
            or not (entry.reported or entry.adopted == "deep" or entry.note.startswith(READ_BACK)):
        return False
    common = [k for k in _VERSION_FIELDS if k in entry.identity and k in info.identity]
    return bool(common) and all(entry.identity[k] == info.identity[k] for k in common)


def _identity_change(store: Store, info: ObjectInfo, entry: FileEntry) -> str | None:
    if not entry.identity:
        return None   # a manifest from before identities: trusted as it always was
    seen = info.identity or store.info(info.location).identity
    if not identity_changed(entry.identity, seen):
        return None
    fields = sorted(k for k in entry.identity.keys() & seen.keys() if entry.identity[k] != seen[k])
    return f"its {', '.join(fields)} changed" if fields else "its identity is unknown"


def _bytes_differ(store: Store, info: ObjectInfo, entry: FileEntry, sha256: bool = False) -> str | None:
    """Re-read, checking every hash the entry has. An entry with part SHA-256s is read part by
    part in parallel (its CRC32C combined from the parts'), and its tree digest recomputed; the
    whole-file SHA-256 (one stream, in order) is computed only where it is the entry's one
    SHA-256 or ``sha256`` asks for it."""
    if entry.part_sha256 and entry.part_size:
        crc, sha, part_sha = rehash_parts(store, info.location, info.size, entry.part_size, whole=sha256)
    else:
        (crc, sha), part_sha = rehash(store, info.location, info.size), []
    return _hashes_differ(entry, crc, sha, part_sha)


def judged_whole(entry: FileEntry) -> bool:
    """Whether a deep check of ``entry`` reads its object in one stream, whole (``judge_many``
    can take it): it records no SHA-256 per part."""
    return not (entry.part_sha256 and entry.part_size)


def judge_many(store: Store, pairs: list[tuple[ObjectInfo, FileEntry]], connections: int) -> list[Verdict]:
    """``judge(..., deep=True)`` of many small objects whose entries are ``judged_whole``, read
    through ``store.read_many`` with ``connections`` requests in flight from this thread (a
    batch of small files, as a copy reads them) instead of one request per thread. A read that
    failed raises its error, as ``judge`` would."""
    verdicts: list[Verdict | None] = [None] * len(pairs)

    def each(i: int, data) -> None:
        info, entry = pairs[i]
        if len(data) != entry.size:
            verdicts[i] = Verdict(f"size {len(data)}, manifest says {entry.size}")
            return
        h = FileHash.of(data)
        verdicts[i] = Verdict(_hashes_differ(entry, h.crc32c, h.sha256, []))

    failures = store.read_many([info.location for info, _ in pairs], each, connections=connections)
    if failures:
        raise failures[min(failures)]
    return verdicts


def _hashes_differ(entry: FileEntry, crc: str, sha: str | None, part_sha: list[str]) -> str | None:
    if crc != entry.crc32c:
        return f"CRC32C {crc}, manifest says {entry.crc32c}"
    if entry.sha256 and sha and sha != entry.sha256:
        return f"SHA-256 {sha}, manifest says {entry.sha256}"
    if not entry.sha256 and not entry.part_sha256 and not entry.reported_only:
        return "the manifest has no SHA-256 for it"
    bad = [n for n, (got, want) in enumerate(zip(part_sha, entry.part_sha256), 1) if got != want]
    if bad:
        return f"SHA-256 of part {bad[0]} differs from the manifest"
    tree = sha256_tree(part_sha, entry.part_size) if entry.sha256_tree else None
    if tree is not None and tree != entry.sha256_tree:
        return f"{TREE} {tree}, manifest says {entry.sha256_tree}"
    return None


_UNREPORTED = "the store reports no CRC32C"


def _cheap_problem(store: Store, info: ObjectInfo, entry: FileEntry) -> str | None:
    if not store.features.checksums and info.location.is_local:
        crc, _ = rehash(store, info.location, info.size, sha=False)
        return None if crc == entry.crc32c else f"CRC32C {crc}, manifest says {entry.crc32c}"
    crc = reported_crc32c(store, info)
    if crc is None:
        return _UNREPORTED
    if crc != entry.crc32c:
        return f"CRC32C {crc} reported by the store, manifest says {entry.crc32c}"
    if entry.sha256 and "bridge_sha256" in info.metadata and info.metadata["bridge_sha256"] != entry.sha256:
        return "SHA-256 in the object's metadata differs from the manifest"
    block_sizes = getattr(store, "block_sizes", None)
    if block_sizes and entry.part_size:
        sizes = block_sizes(info.location)
        if sizes != entry.part_sizes():
            return f"committed blocks {len(sizes)} do not match the {len(entry.parts)} parts in the manifest"
    return None
