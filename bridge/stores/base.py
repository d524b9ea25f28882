"""The store interface: a few required methods, and what a store can do beyond them declared as data.

A store is bound to one provider account (one Settings). Its required methods list, describe, read,
write and delete objects; multipart uploads are an ability (``Features.multipart``) with a fixed
set of methods, so the engine plans parts the same way for every provider.
"""

from __future__ import annotations

import abc
import base64
import io
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from bridge.urls import Location

MiB = 1024 * 1024
GiB = 1024 * MiB

RESERVED = "_bridge"  # bridge's metadata folder; never copied as data


class BufferReader(io.RawIOBase):
    """A read-only file over a buffer (bytes or bytearray) that never copies it whole.

    HTTP clients copy a bytes body's unsent rest into their socket buffer (aiohttp), unshare a
    BytesIO, or insist on bytes (azure's content validation): each costs a second copy of every
    part in flight. From a file object they read and send chunk by chunk."""

    def __init__(self, data: bytes):
        self._view = memoryview(data)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        n = min(len(buf), len(self._view) - self._pos)
        buf[:n] = self._view[self._pos:self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def __len__(self) -> int:
        return len(self._view)


@dataclass(frozen=True)
class Features:
    """What a store can do besides the required methods; read by the engine and by policies/."""

    checksums: frozenset[str] = frozenset()  # whole-object hashes the store reports itself
    multipart: bool = False                 # begin/upload_part/list_parts/complete/abort work
    min_part_size: int = 1
    max_part_size: int = 5 * GiB
    max_parts: int = 10_000
    max_object_size: int = 5 * 1024 * GiB
    server_side_copy: bool = False          # copy inside the same store without moving bytes through us
    copy_from_url: bool = False             # pull an object from a URL (presigned GET) into this store
    compose: bool = False                   # concatenate existing objects server-side


@dataclass(frozen=True)
class ObjectInfo:
    location: Location
    size: int
    checksums: dict[str, str] = field(default_factory=dict)  # name -> lowercase hex
    metadata: dict[str, str] = field(default_factory=dict)
    # What names this exact version of the object on its store (S3 ETag and version id, GCS
    # generation, Azure ETag and last-modified, a local file's inode and times): a rewrite, even
    # one that keeps size, metadata and checksums, changes it. Compared with identity_changed.
    identity: dict[str, str] = field(default_factory=dict)


def identity_changed(recorded: dict[str, str], seen: dict[str, str]) -> bool:
    """Whether ``seen`` names another version of the object than ``recorded``. Only the fields
    both carry are compared (an S3 listing has no version id, a PUT answer no last-modified); an
    empty record (a manifest written before identities) proves nothing and changes nothing, but a
    record with no field in common with what is seen cannot vouch for it."""
    if not recorded:
        return False
    common = recorded.keys() & seen.keys()
    return not common or any(recorded[k] != seen[k] for k in common)


def utc_seconds(when) -> str:
    """A store's timestamp (an aware datetime) as ISO-8601 UTC to the second: listings and HEAD
    answers give the same instant in different forms and precisions."""
    from datetime import timezone
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class PartRecord:
    """A part the store has accepted. ``token`` is whatever the store needs to complete
    (S3 ETag, Azure block id, GCS part object name, local offset)."""

    number: int
    size: int
    crc32c: str
    token: str

    def to_dict(self) -> dict[str, Any]:
        return {"number": self.number, "size": self.size, "crc32c": self.crc32c, "token": self.token}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PartRecord:
        return cls(int(d["number"]), int(d["size"]), d["crc32c"], d["token"])


def crc_hex_to_b64(hex_value: str) -> str:
    return base64.b64encode(bytes.fromhex(hex_value)).decode()


def crc_b64_to_hex(b64_value: str) -> str:
    return base64.b64decode(b64_value).hex()


def is_reserved(rel: str) -> bool:
    return rel == RESERVED or rel.startswith(RESERVED + "/") or f"/{RESERVED}/" in f"/{rel}"


class Store(abc.ABC):
    scheme: ClassVar[str]
    features: ClassVar[Features]
    # True where writing an object discards any unfinished upload to its name (Azure).
    commit_discards_uploads: ClassVar[bool] = False

    # -- required -------------------------------------------------------------------------
    @abc.abstractmethod
    def list(self, prefix: Location) -> Iterator[ObjectInfo]:
        """Every object under ``prefix`` (recursive), in no particular order, with the identity
        the listing gives (so that checking an object against its manifest costs no request)."""

    @abc.abstractmethod
    def info(self, loc: Location) -> ObjectInfo:
        """Size, native checksums, metadata and identity of one object; ObjectNotFound if absent."""

    @abc.abstractmethod
    def read(self, loc: Location, offset: int = 0, length: int | None = None) -> bytes:
        """Bytes [offset, offset+length) in one request."""

    @abc.abstractmethod
    def put(self, loc: Location, data: bytes, *, crc32c: str, metadata: dict[str, str]) -> ObjectInfo:
        """Write a whole object in one request; the store checks ``crc32c`` where it can. Returns
        what the store's answer says of the written object: the checksums it reports and its
        identity (possibly fewer fields than ``info`` gives, never a second request)."""

    @abc.abstractmethod
    def delete(self, loc: Location) -> None: ...

    @abc.abstractmethod
    def check_bucket(self, loc: Location) -> None:
        """Raise BucketNotFound unless the bucket/container (or local parent) exists."""

    # -- multipart ability (Features.multipart) -----------------------------------------------
    def begin_upload(self, loc: Location, size: int) -> str:
        raise NotImplementedError

    def upload_part(self, loc: Location, upload_id: str, number: int, offset: int, data: bytes,
                    crc32c: str) -> PartRecord:
        raise NotImplementedError

    def list_parts(self, loc: Location, upload_id: str) -> dict[int, PartRecord] | None:
        """Parts the store holds for an unfinished upload, or None when the upload is gone."""
        raise NotImplementedError

    def complete_upload(self, loc: Location, upload_id: str, parts: list[PartRecord], *,
                        crc32c: str, metadata: dict[str, str]) -> None:
        raise NotImplementedError

    def abort_upload(self, loc: Location, upload_id: str) -> None:
        raise NotImplementedError

    def list_uploads(self, prefix: Location) -> Iterator[tuple[Location, str]]:
        """Unfinished uploads under ``prefix``: (location, upload_id)."""
        return iter(())

    def clean_temporaries(self, folders: Iterable[Location]) -> int:
        """Remove what killed runs left in ``folders`` outside any upload (a local store's
        temporaries); object stores write nothing visible before an object is whole."""
        return 0

    def bucket_region(self, loc: Location) -> str | None:
        """The region the bucket of ``loc`` lives in, as the provider names it; None when the
        store cannot tell (Azure's data plane does not say; local paths have no region)."""
        return None

    def body(self, data: bytes | bytearray) -> bytes | bytearray:
        """The form this store sends a body in; called right after a read, so that a conversion
        (a copy) does not live beside the original while the upload runs."""
        return data

    # -- helpers --------------------------------------------------------------------------
    def walk(self, prefix: Location) -> Iterator[tuple[str, ObjectInfo]]:
        """(relative path, info) of every data object under ``prefix``, skipping ``_bridge/``."""
        root = prefix.as_prefix()
        for obj in self.list(root):
            rel = obj.location.relative_to(root)
            if rel and not is_reserved(rel):
                yield rel, obj
