"""Parquet shards: one row per file, ``path`` (string), ``data`` (binary), ``size`` (int64) and
``sha256`` (hex string), all required, in pack order.

``data`` is written PLAIN and uncompressed (ML payloads are compressed already), so each file's
bytes sit contiguously in the shard: after a row group is written, the encoder walks the page
headers of the bytes it just produced (a few lines of Thrift compact protocol) to record each
value's byte offset, and checks every located value against the file's bytes. The index then
gives both the row group and row, for Parquet readers, and the byte range, for one ranged read.
The small columns are zstd-compressed. Row groups close at ``row_group_size`` bytes of data.
"""

from __future__ import annotations

import struct
from typing import Any

from bridge.errors import BridgeError
from bridge.packing.writer import READ_AHEAD_BYTES, ShardEncoder, ShardFormat
from bridge.stores.base import MiB

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
except ImportError as exc:   # get_format turns this into an install hint
    raise ImportError(str(exc), name=exc.name) from exc

DEFAULT_ROW_GROUP = 32 * MiB
MAX_VALUE = 2 ** 31 - 1024       # Parquet BYTE_ARRAY lengths and Arrow binary offsets are int32
ROW_OVERHEAD = 4 + 8 + 64 + 16   # length prefix, size, sha256, levels and page share
COLUMNS = ("path", "data", "size", "sha256")
SCHEMA = pa.schema([pa.field("path", pa.string(), nullable=False),
                    pa.field("data", pa.binary(), nullable=False),
                    pa.field("size", pa.int64(), nullable=False),
                    pa.field("sha256", pa.string(), nullable=False)],
                   metadata={"mcbridge": "shard v1: path, data, size, sha256 per file"})
DATA_COLUMN = COLUMNS.index("data")


class ParquetFormat(ShardFormat):
    name = "parquet"
    extension = "parquet"
    max_file_size = MAX_VALUE
    streams_large_files = False
    exact_sizes = False

    @property
    def row_group_size(self) -> int:
        return int(self.options.get("row_group_size") or DEFAULT_ROW_GROUP)

    def file_size(self, rel: str, size: int) -> int:
        return size + len(rel.encode()) + ROW_OVERHEAD

    def shard_size(self, files_bytes: int) -> int:
        return files_bytes + 4096

    def memory_per_writer(self, part_size: int) -> int:
        # the rows of one row group, its Arrow table, and the written bytes kept to locate values
        return super().memory_per_writer(part_size) + 3 * self.row_group_size

    def encoder(self, sink) -> ParquetEncoder:
        return ParquetEncoder(sink, self.row_group_size)


class _Tap:
    """The file object pyarrow writes to: passes bytes to the upload and keeps a copy of the
    current row group's bytes. Closing it does not close the upload."""

    def __init__(self, sink):
        self.sink = sink
        self.captured: bytearray | None = None
        self.closed = False

    def write(self, data) -> int:
        if self.captured is not None:
            self.captured += data
        return self.sink.write(data)

    def tell(self) -> int:
        return self.sink.tell()

    def flush(self) -> None:
        pass

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True


class ParquetEncoder(ShardEncoder):
    def __init__(self, sink, row_group_size: int):
        super().__init__(sink)
        self.row_group_size = row_group_size
        self._tap = _Tap(sink)
        self._writer = pq.ParquetWriter(
            self._tap, SCHEMA, compression={"path": "zstd", "data": "none", "size": "zstd", "sha256": "zstd"},
            use_dictionary=False, write_statistics=["path", "size"], data_page_version="1.0")
        self._rows: list[tuple[str, bytes, str]] = []
        self._pending = 0
        self._row_group = 0

    def add(self, rel: str, data: bytes, sha256: str) -> None:
        if self._rows and self._pending + len(data) > self.row_group_size:
            self._flush()
        self._rows.append((rel, data, sha256))
        self._pending += len(data)

    def _flush(self) -> None:
        if not self._rows:
            return
        paths, datas, shas = zip(*self._rows, strict=True)
        table = pa.table([pa.array(paths, pa.string()), pa.array(datas, pa.binary()),
                          pa.array([len(d) for d in datas], pa.int64()), pa.array(shas, pa.string())],
                         schema=SCHEMA)
        start = self._tap.tell()
        self._tap.captured = bytearray()
        self._writer.write_table(table, row_group_size=len(datas))
        written, self._tap.captured = self._tap.captured, None
        offsets = locate_values(written, len(datas), DATA_COLUMN)
        for row, (offset, data) in enumerate(zip(offsets, datas, strict=True)):
            if written[offset:offset + len(data)] != data:
                raise BridgeError(f"internal error: Parquet value {row} of row group {self._row_group} "
                                  f"not where its page headers put it")
            self.placements.append({"offset": start + offset, "length": len(data),
                                    "row_group": self._row_group, "row": row})
        self._row_group += 1
        self._rows, self._pending = [], 0

    def finish(self) -> None:
        self._flush()
        self._writer.close()


# -- where values are: page headers in Thrift compact protocol ------------------------------------

DATA_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 2, 3


def locate_values(buf: bytes | bytearray, rows: int, column: int) -> list[int]:
    """Offsets in ``buf`` (one row group's column chunks, in schema order) of each value of the
    PLAIN, uncompressed, required BYTE_ARRAY ``column``."""
    pos = 0
    for index in range(column + 1):
        values = 0
        found: list[int] = []
        while values < rows:
            header, body = _struct(buf, pos)
            kind, size = header[1], header[3]
            if kind == DATA_PAGE:
                count, levels = header[5][1], 0
            elif kind == DATA_PAGE_V2:
                count, levels = header[8][1], header[8].get(5, 0) + header[8].get(6, 0)
            elif kind == DICTIONARY_PAGE and index != column:
                count, levels = 0, 0
            else:
                raise BridgeError(f"internal error: unexpected Parquet page type {kind} in column {index}")
            if index == column:
                p = body + levels
                for _ in range(count):
                    (length,) = struct.unpack_from("<I", buf, p)
                    found.append(p + 4)
                    p += 4 + length
                if p != body + size:
                    raise BridgeError("internal error: Parquet data page is not PLAIN and uncompressed")
            values += count
            pos = body + size
        if index == column:
            return found
    raise AssertionError("unreachable")


def _varint(buf, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _value(buf, pos: int, ctype: int) -> tuple[Any, int]:
    if ctype in (1, 2):                  # booleans live in the field header
        return ctype == 1, pos
    if ctype == 3:
        return buf[pos], pos + 1
    if ctype in (4, 5, 6):
        raw, pos = _varint(buf, pos)
        return _zigzag(raw), pos
    if ctype == 7:
        return struct.unpack_from("<d", buf, pos)[0], pos + 8
    if ctype == 8:
        length, pos = _varint(buf, pos)
        return bytes(buf[pos:pos + length]), pos + length
    if ctype in (9, 10):
        head = buf[pos]
        pos += 1
        count, elem = head >> 4, head & 0x0F
        if count == 15:
            count, pos = _varint(buf, pos)
        items = []
        for _ in range(count):
            if elem in (1, 2):
                items.append(buf[pos] == 1)
                pos += 1
            else:
                item, pos = _value(buf, pos, elem)
                items.append(item)
        return items, pos
    if ctype == 11:
        count, pos = _varint(buf, pos)
        if not count:
            return {}, pos
        kinds = buf[pos]
        pos += 1
        out = {}
        for _ in range(count):
            key, pos = _value(buf, pos, kinds >> 4)
            out[key], pos = _value(buf, pos, kinds & 0x0F)
        return out, pos
    if ctype == 12:
        return _struct(buf, pos)
    raise BridgeError(f"internal error: Thrift type {ctype} in a Parquet page header")


def _struct(buf, pos: int) -> tuple[dict[int, Any], int]:
    fields: dict[int, Any] = {}
    last = 0
    while True:
        head = buf[pos]
        pos += 1
        if head == 0:
            return fields, pos
        delta, ctype = head >> 4, head & 0x0F
        if delta:
            field_id = last + delta
        else:
            raw, pos = _varint(buf, pos)
            field_id = _zigzag(raw)
        fields[field_id], pos = _value(buf, pos, ctype)
        last = field_id

