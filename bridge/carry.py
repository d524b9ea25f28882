"""Hash once, carry: a copy from a prefix whose record holds a file's SHA-256s takes them from
there instead of computing them again.

A source file's entry is carried only when it vouches for the version being copied: same size,
an identity recorded and unchanged in the listing (so the object is the one that was hashed),
and hashes bridge took from the bytes (not an entry committed from what the stores reported).
The copy then still reads every byte and checks it by CRC32C end to end: each part's against the
source entry's part CRC32Cs, the whole object's against its CRC32C (and the destination store's
completion check against that), so damaged or substituted bytes fail the copy. The destination
entry names the carried hashes, the source document that recorded them and the identity the
source object had (``carried``); ``computed`` is then ``["crc32c"]``.

Carrying needs the destination's part layout to be the source's (a part's SHA-256 is of its
bytes): the plan takes the source entry's part size when no chunk size is asked for and the
destination store accepts it; otherwise the file is hashed as usual.
"""

from __future__ import annotations

from collections.abc import Iterator

from bridge import manifest as manifests
from bridge.errors import ManifestError
from bridge.manifest import FileEntry
from bridge.stores.base import ObjectInfo, Store, identity_changed
from bridge.urls import Location


class Carrier:
    """The carriable hashes of a source prefix's files, looked up in path order (a merge with the
    record's entries as they stream: one entry in memory)."""

    def __init__(self, store: Store, root: Location, want_sha256: bool = False):
        self.root, self.want_sha256 = root.as_prefix(), want_sha256
        try:
            record = manifests.open_record(store, self.root)
        except ManifestError:
            record = None   # a damaged or vanishing record vouches for nothing: hashed as usual
        self._entries: Iterator[tuple[FileEntry, str]] = record.entries_with_origin() if record else iter(())
        self._next = self._advance()

    def _advance(self) -> tuple[FileEntry, str] | None:
        try:
            return next(self._entries, None)
        except ManifestError:
            self._entries = iter(())
            return None

    def lookup(self, rel: str, info: ObjectInfo) -> dict | None:
        """What a file may carry (``rel`` ascending from call to call), or None."""
        while self._next is not None and self._next[0].path < rel:
            self._next = self._advance()
        if self._next is None or self._next[0].path != rel:
            return None
        entry, doc = self._next
        if (entry.size != info.size or not entry.identity or identity_changed(entry.identity, info.identity)
                or entry.reported_only or entry.adopted
                or not (entry.sha256 or (entry.part_sha256 and entry.part_size))
                or (self.want_sha256 and not entry.sha256)):
            return None
        return {"crc32c": entry.crc32c, "sha256": entry.sha256, "part_size": entry.part_size,
                "parts": list(entry.parts) if entry.part_sha256 else [], "part_sha256": list(entry.part_sha256),
                "sha256_tree": entry.sha256_tree, "manifest": str(self.root.join(doc)),
                "identity": dict(entry.identity)}


def fits(carry: dict, part_size: int) -> bool:
    """Whether a file sent with ``part_size`` (0: one request) can carry these hashes."""
    if part_size == 0:
        return bool(carry["sha256"])
    return carry["part_size"] == part_size and len(carry["part_sha256"]) == len(carry["parts"]) > 0


def provenance(carry: dict) -> dict:
    """The destination entry's ``carried``: which hashes, from which document, of which version."""
    hashes = [name for name in ("sha256", "part_sha256", "sha256_tree") if carry.get(name)]
    return {"hashes": hashes, "manifest": carry["manifest"], "identity": carry["identity"]}
