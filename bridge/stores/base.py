"""The store interface: a few required methods, and what a store can do beyond them declared as data.

A store is bound to one provider account (one Settings). Its required methods list, describe, read,
write and delete objects. Everything else is an ability: a fixed set of methods (``ABILITIES``)
that a store has when its class implements them, and only then. ``Features`` says which a store
has, derived from its class when it is defined and never set by hand, so that the engine,
bridge/routes and policies/ can read it and the shared store suite (tests/stores) runs every
declared ability against each store:

    multipart         begin_upload, upload_part, list_parts, complete_upload, abort_upload
    server_side_copy  copy_object: a whole object inside one account, bytes never leaving the store
    part_copy         copy_part: a range of an object of this account into an upload's part
    copy_from_url     upload_part_from_url: a part pulled by the store from a (signed) URL
    signed_urls       signed_url: a time-limited GET URL that needs no other credentials
    bucket_location   bucket_region: where the bucket lives, as the provider names it
"""

from __future__ import annotations

import abc
import contextlib
import base64
import io
from collections.abc import Awaitable, Callable, Iterable, Iterator
import dataclasses
import heapq
from dataclasses import dataclass, field
from typing import Any, ClassVar

from bridge.attributes import Attrs
from bridge.errors import BridgeError, ObjectNotFound, TransientError
from bridge.urls import Location

MiB = 1024 * 1024
GiB = 1024 * MiB

# How many objects one delete request removes, by store: S3's DeleteObjects takes up to 1,000
# keys, an Azure Blob Batch up to 256 deletions; GCS and local files delete one a request. A sync's deletions go in units of this
# many, and its estimate counts requests by it.
DELETES_PER_REQUEST = {"s3": 1000, "az": 256}


def raise_refused_deletions(errors: list[BridgeError], asked: int) -> None:
    """What a batch delete answered for the objects it did not delete, raised: nothing when each
    was only gone already (deleted), else the first transient error (the whole request is worth
    sending again: deleting twice is deleting) or the first error, with how many more there were."""
    errors = [e for e in errors if not isinstance(e, ObjectNotFound)]
    if not errors:
        return
    first = next((e for e in errors if isinstance(e, TransientError)), errors[0])
    if len(errors) > 1:
        first.args = (f"{first} (and {len(errors) - 1} more of {asked} objects refused)",)
    raise first


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


ABILITIES: dict[str, tuple[str, ...]] = {
    "multipart": ("begin_upload", "upload_part", "list_parts", "complete_upload", "abort_upload"),
    "server_side_copy": ("copy_object",),
    "part_copy": ("copy_part",),
    "copy_from_url": ("upload_part_from_url",),
    "signed_urls": ("signed_url",),
    "bucket_location": ("bucket_region",),
}


@dataclass(frozen=True)
class Features:
    """What a store can do besides the required methods; read by the engine and by policies/.
    A store class declares the limits and checksums; the ability flags are derived (ABILITIES)."""

    checksums: frozenset[str] = frozenset()  # whole-object hashes the store reports itself
    min_part_size: int = 1
    max_part_size: int = 5 * GiB
    max_parts: int = 10_000
    max_object_size: int = 5 * 1024 * GiB
    max_copy_size: int = 5 * GiB            # copy_object in one request up to this; above, in parts or polled
    multipart: bool = False
    server_side_copy: bool = False
    part_copy: bool = False
    copy_from_url: bool = False
    signed_urls: bool = False
    bucket_location: bool = False

    def abilities(self) -> list[str]:
        return [name for name in ABILITIES if getattr(self, name)]


def derived_features(cls: type) -> Features:
    """``cls.features`` with each ability flag set to whether ``cls`` implements its methods."""
    has = {name: all(getattr(cls, m) is not getattr(Store, m) for m in methods)
           for name, methods in ABILITIES.items()}
    return dataclasses.replace(cls.features, **has)


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
    # Standard headers and user metadata (bridge.attributes), None where the answer did not
    # carry them (an S3 listing): Store.attributes then asks.
    attrs: Attrs | None = None
    storage_class: str = ""        # as the store names it (S3 class, GCS class, Azure tier); "" unknown
    needs_restore: bool = False    # archived (S3 Glacier / Deep Archive, Azure Archive): unreadable until restored
    # When the object was last written (seconds since the epoch), where the listing or HEAD says:
    # for ``ls -l`` and the age filters (bridge/filters.py). Never part of the identity.
    modified: float | None = None

    @classmethod
    def listed(cls, location: Location, size: int, identity: dict[str, str], modified: float | None) -> ObjectInfo:
        """``cls(location, size, identity=identity, modified=modified)``, made without the frozen
        dataclass's ``__init__`` (one ``object.__setattr__`` a field, and a call per default):
        a local walk makes one a file (tests/test_local_walk.py: equal to the constructor's)."""
        info = _new(cls)
        info.__dict__.update(location=location, size=size, checksums={}, metadata={}, identity=identity,
                             attrs=None, storage_class="", needs_restore=False, modified=modified)
        return info


_new = object.__new__


def identity_changed(recorded: dict[str, str], seen: dict[str, str]) -> bool:
    """Whether ``seen`` names another version of the object than ``recorded``. Only the fields
    both carry are compared (an S3 listing has no version id, a PUT answer no last-modified); an
    empty record (a manifest written before identities) proves nothing and changes nothing, but a
    record with no field in common with what is seen cannot vouch for it."""
    if not recorded:
        return False
    common = recorded.keys() & seen.keys()
    if not common:
        return True
    for k in common:
        if recorded[k] != seen[k] and not (k == "last_modified" and _rounded(recorded, seen)):
            return True
    return False


def _rounded(recorded: dict[str, str], seen: dict[str, str]) -> bool:
    """The same ETag, and times a second apart: one instant that a listing and a HEAD gave to the
    second in two ways (``rclone serve s3`` rounds a listing's time and truncates a HEAD's, so an
    object written at .5 s or later was "changed" between them). An ETag is the content's (S3:
    its MD5, or its parts'; Azure: one per write), so a rewrite it does not show changed nothing."""
    etag = recorded.get("etag")
    if not etag or etag != seen.get("etag"):
        return False
    from datetime import datetime
    try:
        apart = datetime.fromisoformat(recorded["last_modified"]) - datetime.fromisoformat(seen["last_modified"])
    except (TypeError, ValueError):
        return False
    return abs(apart.total_seconds()) <= 1


def utc_seconds(when) -> str:
    """A store's timestamp (an aware datetime) as ISO-8601 UTC to the second: listings and HEAD
    answers give the same instant in different forms and precisions. Once per listed object:
    isoformat, not strftime, and no conversion of what is in UTC already (1.2 us, not 3.1)."""
    from datetime import timezone
    if when.tzinfo is not timezone.utc:
        when = when.astimezone(timezone.utc)
    return when.isoformat(timespec="seconds")[:19] + "Z"


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
    features: ClassVar[Features] = Features()
    # True where writing an object discards any unfinished upload to its name (Azure).
    commit_discards_uploads: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.features = derived_features(cls)

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

    def read_through(self, loc: Location, offset: int, length: int, buf: bytearray,
                     each: Callable[[int, memoryview], None]) -> int:
        """Bytes [offset, offset+length) in one request, handed over a piece at a time, in order:
        ``each(pos, view)`` for the bytes from ``pos`` of the range (at most ``len(buf)`` of them, a
        view of ``buf`` where a direct path receives straight from the socket, while they are
        still in the CPU's cache). A retried request hands over again from ``pos`` 0. Returns the
        count of bytes, which may differ from ``length``: the caller checks. Here read() first."""
        return hand_over(self.read(loc, offset, length), len(buf), each)

    def read_listed(self, root: Location, files: list[tuple[str, int]]) -> list[bytes]:
        """The whole bytes of each (rel, size) under ``root``, one after another (a pack's run of
        small files). A file's bytes may differ in length from its listed size (the caller
        refuses that); one that grew may be read only to one byte past it. Here read() of each."""
        return [self.read(root.join(rel)) for rel, _size in files]

    # True where read_many keeps several requests in flight from one thread: the engine then
    # hands it batches of small whole files (bridge.pipeline.units, "batch" units) instead of one per unit.
    reads_many: bool = False

    def read_many(self, locs: list[Location], each: Callable[[int, bytes], None], *,
                  connections: int | None = None,
                  pace: Callable[[int], None] | None = None) -> dict[int, BridgeError]:
        """Whole objects: ``each(i, data)`` in this thread as each arrives (in any order); what
        failed, by index. A BridgeError from ``each`` is that object's failure; any other
        exception stops the rest. Here one after another; stores with ``reads_many`` overlap them,
        ``connections`` requests in flight (None: ``transfer.concurrency``). ``pace(i)`` before
        object i is asked for: where a bandwidth limit is taken (bridge.bwlimit)."""
        failures: dict[int, BridgeError] = {}
        for i, loc in enumerate(locs):
            try:
                if pace is not None:
                    pace(i)
                each(i, self.read(loc))
            except BridgeError as exc:
                failures[i] = exc
        return failures

    # True where put_many keeps several requests in flight from one thread (as reads_many).
    writes_many: bool = False

    def put_many(self, count: int, body: Callable[[int], tuple[Location, bytes, str, dict[str, str], Attrs | None]],
                 each: Callable[[int, ObjectInfo], None], *, connections: int | None = None,
                 ready: Callable[[int], Awaitable[None]] | None = None) -> dict[int, BridgeError]:
        """Whole objects: ``body(i)`` gives (location, bytes, CRC32C hex, metadata[, attrs[, SHA-256]]) when object i is
        about to be sent, ``each(i, info)`` takes what ``put`` would have returned; what failed,
        by index. A BridgeError from ``body`` or ``each`` is that object's failure. Here one after
        another; stores with ``writes_many`` overlap them, ``connections`` requests in flight (None:
        ``transfer.concurrency``), each awaiting ``ready(i)`` (where given) before ``body(i)``, so that
        a body still on its way holds up none of the others (here, one after another, ``body``
        waits for it itself)."""
        failures: dict[int, BridgeError] = {}
        for i in range(count):
            try:
                loc, data, crc, metadata, attrs, sha256 = put_args(body(i))
                each(i, self.put(loc, data, crc32c=crc, metadata=metadata, attrs=attrs, sha256=sha256))
            except BridgeError as exc:
                failures[i] = exc
        return failures

    @abc.abstractmethod
    def put(self, loc: Location, data: bytes, *, crc32c: str, metadata: dict[str, str],
            attrs: Attrs | None = None, sha256: str | None = None) -> ObjectInfo:
        """Write a whole object in one request; the store checks ``crc32c`` where it can.
        ``sha256``: the hex SHA-256 of ``data`` when the caller took it of these bytes (a store that
        signs its payload's hash, S3 over plain HTTP, signs that rather than hash them again).
        ``metadata`` is bridge's own keys; ``attrs`` the headers and user metadata to write (the
        store maps them: bridge.attributes), and the store's settings say its storage class and
        encryption (bridge's ``_bridge/`` records keep the bucket's default class). Returns
        what the store's answer says of the written object: the checksums it reports and its
        identity (possibly fewer fields than ``info`` gives, never a second request)."""

    @abc.abstractmethod
    def delete(self, loc: Location) -> None: ...

    def delete_many(self, locs: list[Location]) -> None:
        """Delete each of ``locs``; one already gone counts as deleted. A store whose API removes
        several objects in one request (``DELETES_PER_REQUEST``) overrides this; here, one
        request each."""
        for loc in locs:
            try:
                self.delete(loc)
            except ObjectNotFound:
                pass

    @abc.abstractmethod
    def check_bucket(self, loc: Location) -> None:
        """Raise BucketNotFound unless the bucket/container (or local parent) exists."""

    # -- buckets: listed and made by ``mcbridge ls s3://`` and ``mcbridge mb`` ----------------
    def buckets(self) -> list[str]:
        """The buckets (containers) these credentials can list, by name."""
        from bridge.errors import Unsupported
        raise Unsupported(f"{self.scheme}:// has no buckets to list")

    def make_bucket(self, loc: Location) -> None:
        """Create the bucket (container, local folder) of ``loc``; BridgeError if it exists."""
        from bridge.errors import Unsupported
        raise Unsupported(f"{self.scheme}:// cannot make buckets")

    # -- abilities: a store has one when its class implements the methods (see ABILITIES) ------
    # -- multipart -------------------------------------------------------------------------
    def begin_upload(self, loc: Location, size: int, attrs: Attrs | None = None) -> str:
        """A new upload; ``attrs`` are written with the object where the store takes them at the
        start (S3), otherwise complete_upload's are."""
        raise NotImplementedError

    def upload_part(self, loc: Location, upload_id: str, number: int, offset: int, data: bytes,
                    crc32c: str, *, sha256: str | None = None) -> PartRecord:
        """Part ``number`` of an upload. ``sha256``: the hex SHA-256 of ``data`` when the caller
        has taken it (each part's own, the default digest): a store that signs its payload's
        hash (S3 over plain HTTP) signs that, rather than hash the bytes a second time."""
        raise NotImplementedError

    # A store whose ``upload_part_stream`` sends a part's body as it arrives from the source
    # (store -> store routes: the download and the upload of one part overlap).
    streams_parts: bool = False

    def upload_part_stream(self, loc: Location, upload_id: str, number: int, length: int,
                           pieces: Iterable, crc32c: Callable[[], str]) -> PartRecord:
        """Part ``number`` (``length`` bytes) of an upload, its body the buffers ``pieces``
        yields, sent as each comes; ``crc32c()`` the hex CRC32C of what was sent, asked once the
        body is out, which the store's own checksum of the stored part must equal. Sent once,
        never retried here (``pieces`` cannot be read again): the caller sends the part by
        ``upload_part`` after any failure. Only where ``streams_parts``."""
        raise NotImplementedError

    def list_parts(self, loc: Location, upload_id: str) -> dict[int, PartRecord] | None:
        """Parts the store holds for an unfinished upload, or None when the upload is gone."""
        raise NotImplementedError

    def complete_upload(self, loc: Location, upload_id: str, parts: list[PartRecord], *,
                        crc32c: str, metadata: dict[str, str], attrs: Attrs | None = None) -> ObjectInfo:
        """Make the object from its parts (with ``attrs`` where the store takes them at the end). Returns what the store reports of the object it made
        (the whole-object checksums it keeps, its identity); the engine decides whether that
        proves the object intact (``--store-checksums``)."""
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

    # -- server_side_copy, part_copy -------------------------------------------------------
    def copy_object(self, src: Location, dst: Location, *, size: int, attrs: Attrs | None = None) -> ObjectInfo:
        """Copy ``src`` (``size`` bytes) to ``dst``, both in this store account, without the
        bytes leaving the store; metadata goes with it, or ``attrs`` replace its headers and user
        metadata; the destination's storage class and encryption apply. Returns what the store
        reports of the copy, as ``put`` does (no second request)."""
        raise NotImplementedError

    def copy_part(self, loc: Location, upload_id: str, number: int, offset: int, src: Location,
                  src_offset: int, length: int) -> PartRecord:
        """Part ``number`` (at ``offset``) of an upload, copied by the store from bytes
        [src_offset, src_offset+length) of ``src`` in this account. The record's crc32c is the
        part's CRC32C when the store reports one, else ""."""
        raise NotImplementedError

    # -- copy_from_url ---------------------------------------------------------------------
    def upload_part_from_url(self, loc: Location, upload_id: str, number: int, offset: int, url: str,
                             src_offset: int, length: int) -> PartRecord:
        """Part ``number`` of an upload, fetched by the store itself from bytes
        [src_offset, src_offset+length) of ``url`` (a signed GET URL of another store)."""
        raise NotImplementedError

    # -- signed_urls -----------------------------------------------------------------------
    def signed_url(self, loc: Location, expires: int = 3600) -> str:
        """A GET URL of ``loc`` valid for ``expires`` seconds that carries its own authorization."""
        raise NotImplementedError

    # -- bucket_location -------------------------------------------------------------------
    def bucket_region(self, loc: Location) -> str | None:
        """The region the bucket of ``loc`` lives in, as the provider names it; None when the
        store cannot tell (a store without this ability, such as local paths)."""
        return None

    def body(self, data: bytes | bytearray) -> bytes | bytearray:
        """The form this store sends a body in; called right after a read, so that a conversion
        (a copy) does not live beside the original while the upload runs."""
        return data

    def attributes(self, info: ObjectInfo) -> Attrs:
        """The headers and user metadata of an object: from ``info`` when its answer carried
        them, else from ``info()`` (one request: S3 listings do not carry them)."""
        if info.attrs is not None:
            return info.attrs
        return self.info(info.location).attrs or Attrs()

    def list_level(self, prefix: Location) -> Iterator[ObjectInfo | Location]:
        """One level of the listing under ``prefix``: each object directly under it (ObjectInfo)
        and each sub-prefix once (its Location, ending with '/'), in no particular order. Each
        store asks for it with a delimiter ('/'), so that what lies deeper is never listed; this
        fallback folds the whole listing, for a store that has none."""
        seen: set[str] = set()
        for info in self.list(prefix):
            head, sep, _rest = info.location.relative_to(prefix).partition("/")
            if not sep:
                yield info
            elif head not in seen:
                seen.add(head)
                yield Location(prefix.scheme, prefix.bucket, prefix.key + head + "/")

    # -- helpers --------------------------------------------------------------------------
    def walk(self, prefix: Location) -> Iterator[tuple[str, ObjectInfo]]:
        """(relative path, info) of every data object under ``prefix``, skipping ``_bridge/``."""
        root = prefix.as_prefix()
        for obj in self.list(root):
            rel = obj.location.relative_to(root)
            if rel and not is_reserved(rel):
                yield rel, obj


def merged(left: Iterable[tuple[str, Any]], right: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any, Any]]:
    """Two listings in Store.walk's order (a walk, a manifest's entries), walked side by side as a
    merge join (rclone's march does so): (rel, left's value or None, right's or None) for every rel
    in either, in order, holding one item of each. A listing out of order is an error, not a
    silent miss."""
    a, b = iter(left), iter(right)
    x, y = next(a, None), next(b, None)
    last = None
    while x is not None or y is not None:
        if y is None or (x is not None and x[0] < y[0]):
            rel, out, x = x[0], (x[0], x[1], None), next(a, None)
        elif x is None or y[0] < x[0]:
            rel, out, y = y[0], (y[0], None, y[1]), next(b, None)
        else:
            rel, out, x, y = x[0], (x[0], x[1], y[1]), next(a, None), next(b, None)
        if last is not None and rel <= last:
            raise BridgeError(f"internal error: a listing is not in order ({rel!r} after {last!r})")
        last = rel
        yield out


def in_code_point_order(objects: Iterator[ObjectInfo]) -> Iterator[ObjectInfo]:
    """A listing in UTF-16 order (Azurite's; Azure documents no finer order than "alphabetical")
    put in code-point order, Store.walk's, as it streams. The two orders differ only where a
    character beyond U+FFFF (a surrogate pair, D800-DBFF first) meets one of U+E000-U+FFFF: in
    UTF-16 order such a name comes earlier than in code points, never later. So each name with
    one waits in a heap until a name without any that sorts after it comes by; the others pass
    straight through. (Only those names are held: all of them when a listing has nothing else.)"""
    waiting: list[tuple[str, int, ObjectInfo]] = []
    n = 0
    for obj in objects:
        key = obj.location.key
        if not key.isascii() and max(key) > "\uffff":
            heapq.heappush(waiting, (key, n, obj))
            n += 1
            continue
        while waiting and waiting[0][0] < key:
            yield heapq.heappop(waiting)[2]
        yield obj
    while waiting:
        yield heapq.heappop(waiting)[2]


def put_args(given: tuple) -> tuple:
    """A put_many body's (location, bytes, CRC32C, metadata, attrs, SHA-256 of the bytes or None);
    the last two may be left out."""
    return (*given, *(None,) * (6 - len(given)))


class DirectReads:
    """``reads_many`` and ``read_many`` of a store (GCS, Azure) whose direct path ``_direct`` (None
    where the SDK's path stays) fetches whole objects with ``get_many(locs, each, connections=,
    retries=)``. Listed before Store among the bases."""

    _direct: Any = None

    @property
    def reads_many(self) -> bool:
        return self._direct is not None

    def read_many(self, locs: list[Location], each: Callable[[int, bytes], None], *,
                  connections: int | None = None,
                  pace: Callable[[int], None] | None = None) -> dict[int, BridgeError]:
        if self._direct is None:
            return super().read_many(locs, each, pace=pace)
        return self._direct.get_many(locs, each, connections=connections or self.settings.transfer.concurrency,
                                     retries=self.retries, pace=pace)


def receive(resp, size: int, what: object, into: bytearray | None = None,
            each: Callable[[int, memoryview], None] | None = None) -> bytearray | memoryview | int:
    """The ``size`` bytes of an http.client answer's body, read with ``readinto`` (one copy, from
    the socket) into a new bytearray. With ``into`` and ``each``, they pass through ``into`` a
    piece at a time instead (Store.read_through): ``each(pos, view)`` for each piece, and the
    count of bytes is returned. Writing a part piece by piece while it is in the CPU's cache cost
    a third of the system time of receiving all 8 MiB first and writing it then (bench/README.md).
    A body cut short is a TransientError."""
    from bridge.errors import TransientError
    from bridge.retry import check_stop
    body = _Body(resp)
    if each is not None and into:   # (into: the caller's buffer, reused part after part)
        view = memoryview(into)
        pos = 0
        while pos < size:
            check_stop()
            want = min(len(view), size - pos)
            got = 0
            while got < want:
                n = body.readinto(view[got:want])
                if not n:
                    raise TransientError(f"{what}: connection closed after {pos + got} of {size} bytes")
                got += n
            each(pos, view[:want])
            pos += want
        body.done()
        return size
    buf = bytearray(size)
    view = memoryview(buf)
    pos = 0
    while pos < size:
        check_stop()
        got = body.readinto(view[pos:pos + 256 * 1024])
        if not got:
            raise TransientError(f"{what}: connection closed after {pos} of {size} bytes")
        pos += got
    body.done()
    return buf if each is None else hand_over(buf, size or 1, each)


class _Body:
    """An http.client answer's body (of a known length, as ``receive`` reads it), read with one
    call into C per read: the TLS object's own ``read`` (or the plain socket's ``recv_into``)
    once the bytes http.client's buffered reader already holds are taken, instead of three
    frames of Python per TLS record (``SocketIO.readinto``, ``SSLSocket.recv_into``,
    ``SSLSocket.read``), 65,536 records a GiB. Measured on 512 MiB over HTTPS in 8 threads: 0.31
    s of user CPU against 0.40 s (bench/README.md). An answer of another make (chunked, or
    not over a socket of the standard library's) is read through http.client as before."""

    def __init__(self, resp):
        import socket
        import ssl
        self._resp, self._raw, self._held = resp, None, 0
        self._eof = ssl.SSLEOFError
        sock = getattr(getattr(getattr(resp, "fp", None), "raw", None), "_sock", None)
        if getattr(resp, "chunked", True) or not getattr(resp, "length", None):
            return   # (an empty body: nothing to read, and peek() would wait for bytes that never come)
        if isinstance(sock, ssl.SSLSocket):
            sslobj = getattr(sock, "_sslobj", None)
            if sslobj is not None:
                self._raw = sslobj.read          # read(n, buffer) -> count
        elif type(sock) is socket.socket:
            self._raw = lambda n, view: sock.recv_into(view, n)
        if self._raw is not None:
            self._held = len(resp.fp.peek())     # what the buffered reader holds: read through it first

    def readinto(self, view: memoryview) -> int:
        if self._raw is None:
            return self._resp.readinto(view)
        if self._held:
            n = self._resp.fp.readinto(view[:self._held])
            self._held -= n
            return n
        try:
            return self._raw(len(view), view)
        except self._eof:                        # closed without TLS's goodbye: what SSLSocket makes 0
            return 0

    def done(self) -> None:
        """The whole body read: the answer closed as http.client closes one it read to its end,
        so that its connection takes the next request."""
        if self._raw is not None:
            self._resp.length = 0
            self._resp.read()


def hand_over(data: bytes | bytearray | memoryview, piece: int, each: Callable[[int, memoryview], None]) -> int:
    """``data`` to ``each(pos, view)`` in pieces of at most ``piece`` bytes (Store.read_through)."""
    view = memoryview(data)
    for pos in range(0, len(view), piece):
        each(pos, view[pos:pos + piece])
    return len(view)


def _dropped(sock) -> bool:
    """An idle keep-alive connection that has something to read was closed by the server (or
    holds garbage): either way it is not to be reused. One poll, no waiting."""
    import select
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([sock], [], [], 0)[0])


@contextlib.contextmanager
def kept_connection(local, connect, loc: Location, endpoint: str):
    """This thread's keep-alive http.client connection (``local.conn``, made by ``connect()``),
    given back for reuse only after an exchange that left nothing unread: to keep it after an
    error answer, the caller reads the answer's body and raises after the ``with``. One the
    server closed while it was kept is not reused (a request on it would fail, and be retried).
    ``connect()`` may open the connection itself (to read with a timeout apart from the connect
    timeout); any failure to open it is EndpointUnreachable. A refused connection is
    EndpointUnreachable, a certificate that does not verify a BridgeError (not retried), any other
    failure of the exchange a TransientError; ``endpoint`` names the endpoint in the message."""
    import http.client
    import ssl
    from bridge.errors import EndpointUnreachable, TransientError
    conn = getattr(local, "conn", None)
    local.conn = None
    if conn is not None and (conn.sock is None or _dropped(conn.sock)):
        conn.close()
        conn = None
    if conn is None:
        try:
            conn = connect()
        except ssl.SSLCertVerificationError as exc:
            raise BridgeError(f"{endpoint} did not prove who it is: {exc}") from exc
        except OSError as exc:
            raise EndpointUnreachable(f"cannot reach {endpoint}: {type(exc).__name__}") from exc
    try:
        yield conn
    except ConnectionRefusedError as exc:
        conn.close()
        raise EndpointUnreachable(f"cannot reach {endpoint}: {type(exc).__name__}") from exc
    except ssl.SSLCertVerificationError as exc:
        conn.close()
        raise BridgeError(f"{endpoint} did not prove who it is: {exc}") from exc
    except (http.client.HTTPException, OSError) as exc:
        conn.close()
        raise TransientError(f"{loc}: connection dropped ({type(exc).__name__}: {exc})") from exc
    except BaseException:
        conn.close()
        raise
    local.conn = conn


_TLS: dict[str | None, Any] = {}


def tls_context(cafile: str | None = None):
    """The ssl context the direct paths verify servers with: certificates checked, host names
    matched, against ``cafile`` (a PEM bundle: the settings' or a standard variable's, see
    bridge/config.py) or else the system's trust store (which honours SSL_CERT_FILE and
    SSL_CERT_DIR). One per bundle, shared; a bundle that cannot be read is one BridgeError
    naming it."""
    import ssl
    context = _TLS.get(cafile)
    if context is None:
        try:
            context = ssl.create_default_context(cafile=cafile)
        except (OSError, ssl.SSLError) as exc:
            raise BridgeError(f"the CA bundle {cafile} cannot be used: "
                              f"{exc.strerror or exc.reason if isinstance(exc, OSError) else exc}") from None
        _TLS[cafile] = context
    return context
