"""WebDataset tar shards: POSIX (pax) tar of regular files with fixed metadata.

Every member has mtime 0, uid/gid 0, no user or group name and mode 0644, so the same files give
byte-identical shards. Each member is a 512-byte header (more when a pax header carries a long or
non-ASCII name), the data, and zero padding to a 512-byte boundary; the archive ends with two zero
blocks and is padded to a 10 KiB record, as ``tar`` and Python's ``tarfile`` do. Sizes, and
therefore every member's data offset, are known before a byte is read.
"""

from __future__ import annotations

from collections.abc import Iterable
from json.encoder import encode_basestring   # what json.dumps(ensure_ascii=False) quotes a str with

from bridge.errors import IntegrityError
from bridge.packing.writer import ShardEncoder, ShardFormat

BLOCK = 512
RECORD = 20 * BLOCK
MODE = 0o644
MTIME = 0
_USTAR_NAME = 100
_USTAR_SIZE = 8 ** 11   # the octal size field's limit; larger sizes go into a pax header
_PAX_NAME = b"././@PaxHeader"


def _ustar(name: bytes, size: int, typeflag: bytes, mode: int = MODE) -> bytes:
    """One POSIX ustar header block, laid out as Python's tarfile writes it (kept here so the
    bytes do not depend on the Python version)."""
    block = b"".join([
        name[:_USTAR_NAME].ljust(_USTAR_NAME, b"\0"),
        b"%07o\0" % mode, b"%07o\0" % 0, b"%07o\0" % 0,      # mode, uid, gid
        b"%011o\0" % size, b"%011o\0" % MTIME,
        b" " * 8,                                              # checksum, counted as spaces
        typeflag, bytes(100),                                  # type, link name
        b"ustar\x0000", bytes(32), bytes(32),                  # magic and version, user, group
        bytes(8), bytes(8), bytes(155), bytes(12),             # devmajor, devminor, prefix, pad
    ])
    return block[:148] + b"%06o\0 " % sum(block) + block[156:]


# A regular file's ustar block around its two varying fields (name, size), and the checksum of
# the constant bytes: a short ASCII name's header is then six joins and two sums, not a block
# built anew per file (``_ustar`` lays out the same bytes; tests compare the two).
_PLAIN = _ustar(b"", 0, b"0")
_MODE_TO_SIZE = _PLAIN[_USTAR_NAME:124]
_AFTER_SIZE = _PLAIN[136:148]
_AFTER_SUM = _PLAIN[156:]
_PLAIN_SUM = sum(_MODE_TO_SIZE) + sum(_AFTER_SIZE) + 8 * ord(" ") + sum(_AFTER_SUM)
_ZEROS = [bytes(n) for n in range(BLOCK)]   # padding by length


def _plain_header(name: bytes, size: int) -> list[bytes]:
    """The pieces of the ustar block of a regular file whose name is ASCII and at most 100 bytes
    and whose size fits the octal field."""
    size_field = b"%011o\0" % size
    return [name, _ZEROS[_USTAR_NAME - len(name)], _MODE_TO_SIZE, size_field, _AFTER_SIZE,
            b"%06o\0 " % (_PLAIN_SUM + sum(name) + sum(size_field)), _AFTER_SUM]


def _pax_record(key: str, value: str) -> bytes:
    body = f" {key}={value}\n".encode()
    length = len(body) + len(str(len(body)))
    length += len(str(length)) - len(str(len(body)))
    return str(length).encode() + body


def member_header(rel: str, size: int) -> bytes:
    """The header(s) of one regular file: a ustar block, preceded by a pax block when the name is
    long or not ASCII, or the size too big for the octal field."""
    records = b""
    if not rel.isascii() or len(rel) > _USTAR_NAME:
        records += _pax_record("path", rel)
    if size >= _USTAR_SIZE:
        records += _pax_record("size", str(size))
    own = _ustar(rel.encode("ascii", "replace"), size if size < _USTAR_SIZE else 0, b"0")
    if not records:
        return own
    return _ustar(_PAX_NAME, len(records), b"x", mode=0) + records + bytes(padding(len(records))) + own


def header_size(rel: str, size: int) -> int:
    if rel.isascii() and len(rel) <= _USTAR_NAME and size < _USTAR_SIZE:
        return BLOCK
    return len(member_header(rel, size))


_LINE = '{"path":%s,"offset":%d,"length":%d,"sha256":"%s"}\n'


def padding(size: int) -> int:
    return -size % BLOCK


def archive_size(members_bytes: int) -> int:
    end = members_bytes + 2 * BLOCK
    return end + -end % RECORD


class TarEncoder(ShardEncoder):
    """Placements are (offset, length) pairs; a run of small files is one write to the sink."""

    def _member(self, rel: str, size: int) -> None:
        self.sink.write(member_header(rel, size))
        self.placements.append((self.sink.tell(), size))

    def add(self, rel: str, data: bytes, sha256: str) -> None:
        self.add_many([(rel, len(data))], [(data, sha256)])

    def add_many(self, files: list[tuple[str, int]], read: list[tuple[bytes, str]]) -> None:
        pieces: list[bytes] = []
        pos = self.sink.tell()
        placements = self.placements
        for (rel, _size), (data, _sha) in zip(files, read, strict=True):
            size = len(data)
            if len(rel) <= _USTAR_NAME and size < _USTAR_SIZE and rel.isascii():
                pieces += _plain_header(rel.encode("ascii"), size)
                pos += BLOCK
            else:
                head = member_header(rel, size)
                pieces.append(head)
                pos += len(head)
            placements.append((pos, size))
            pad = -size % BLOCK
            pieces += (data, _ZEROS[pad])
            pos += size + pad
        self.sink.write(b"".join(pieces))

    def format_lines(self, placed: list[tuple[str, str]], placements: list) -> bytes:
        """The bytes json.dumps gives (compact, not ASCII-escaped) for {"path", "offset",
        "length", "sha256"}, formatted without a dict per file."""
        return "".join([_LINE % (encode_basestring(rel), offset, length, sha)
                        for (rel, sha), (offset, length) in zip(placed, placements, strict=True)]).encode()

    def add_stream(self, rel: str, size: int, chunks: Iterable[bytes]) -> None:
        self._member(rel, size)
        sent = 0
        for chunk in chunks:
            sent += len(chunk)
            if sent > size:
                break
            self.sink.write(chunk)
        if sent != size:
            raise IntegrityError(f"{rel}: read {sent} bytes, listed {size}: the source changed during packing")
        self.sink.write(bytes(padding(size)))

    def finish(self) -> None:
        self.sink.write(bytes(archive_size(self.sink.tell()) - self.sink.tell()))


class TarFormat(ShardFormat):
    name = "tar"
    extension = "tar"
    max_file_size = 2 ** 63 - 1
    streams_large_files = True
    exact_sizes = True

    def file_size(self, rel: str, size: int) -> int:
        if size < _USTAR_SIZE and len(rel) <= _USTAR_NAME and rel.isascii():   # (header_size's own test)
            return BLOCK + size + -size % BLOCK
        return header_size(rel, size) + size + padding(size)

    def shard_size(self, files_bytes: int) -> int:
        return archive_size(files_bytes)

    def encoder(self, sink) -> TarEncoder:
        return TarEncoder(sink)
