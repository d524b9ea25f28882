"""``mcbridge check SRC DST``: are two trees equal, with no manifest needed (as ``rclone check``)?

Both listings are walked in sorted order side by side, a merge join (rclone's ``fs/march``), so
memory stays constant whatever the trees' size: a name only the source has is ``missing`` at the
destination, one only the destination has is ``extra``, and a pair is compared by size and the
strongest checksum both listings report, computed by the stores (an MD5 ETag, GCS md5Hash or
crc32c: bridge/adopt.py), reading no cloud object (a local side is hashed: it costs no request),
or with ``download`` by reading both and comparing CRC32C and SHA-256. A pair with no such checksum in common is
``unproven`` unless read: it is never counted equal on its size alone, nor on a value a client
could have written (an object's ``bridge_crc32c`` metadata, an Azure blob's Content-MD5), so a
pair with an Azure side is proven only by ``--download``. Pairs are compared ``concurrency`` at a time, a bounded
window in listing order. Object stores list in key order (UTF-8 byte order, which is Python's
code point order for the names bridge handles); a local tree is walked so that it comes out in
the same order (a folder ``a`` sorts as ``a/``). A listing found out of order is an error, not a
wrong answer.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
from collections import deque
from collections.abc import Iterator
from typing import Any

from bridge import adopt
from bridge.config import Settings
from bridge.errors import BridgeError, ObjectNotFound
from bridge.names import PARTIAL, TEMPORARY
from bridge.stores import Store, get_store
from bridge.stores.base import ObjectInfo, is_reserved
from bridge.urls import Location, parse


def sorted_walk(store: Store, root: Location) -> Iterator[tuple[str, ObjectInfo]]:
    """(relative path, info) of every data object under ``root`` in code point order of the path."""
    if not root.is_local:
        yield from _in_order(store.walk(root), root)
        return
    top = root.local_path
    if not os.path.isdir(top):
        raise ObjectNotFound(f"{root}: no such directory")

    def walk(folder: str, rel: str) -> Iterator[tuple[str, ObjectInfo]]:
        with os.scandir(folder) as it:
            entries = [(e.name + "/" if e.is_dir(follow_symlinks=False) else e.name, e) for e in it]
        for key, entry in sorted(entries, key=lambda pair: pair[0]):
            path = rel + entry.name
            if key.endswith("/"):
                if not is_reserved(path):
                    yield from walk(entry.path, path + "/")
            elif entry.is_file() and PARTIAL not in entry.name and TEMPORARY not in entry.name:
                yield path, store.info(root.join(path))

    yield from walk(top, "")


def _in_order(items: Iterator[tuple[str, ObjectInfo]], root: Location) -> Iterator[tuple[str, ObjectInfo]]:
    last = None
    for rel, info in items:
        if last is not None and rel <= last:
            raise BridgeError(f"{root}: the store listed {rel!r} after {last!r}; check needs key order")
        last = rel
        yield rel, info


def merged(left: Iterator[tuple[str, ObjectInfo]], right: Iterator[tuple[str, ObjectInfo]]
           ) -> Iterator[tuple[str, ObjectInfo | None, ObjectInfo | None]]:
    """A merge join of two sorted listings: (path, left's info or None, right's info or None)."""
    a, b = next(left, None), next(right, None)
    while a is not None or b is not None:
        if b is None or (a is not None and a[0] < b[0]):
            yield a[0], a[1], None
            a = next(left, None)
        elif a is None or b[0] < a[0]:
            yield b[0], None, b[1]
            b = next(right, None)
        else:
            yield a[0], a[1], b[1]
            a, b = next(left, None), next(right, None)


def _read_both(src_store: Store, src: ObjectInfo, dst_store: Store, dst: ObjectInfo) -> adopt.Adoption:
    if src.size != dst.size:
        return adopt.Adoption(False, "size", f"size {dst.size}, source {src.size}")
    mine, theirs = adopt.digest(src_store, src, ("sha256",)), adopt.digest(dst_store, dst, ("sha256",))
    if mine != theirs:
        return adopt.Adoption(False, "download", f"read both: CRC32C {theirs['crc32c']}, source {mine['crc32c']}")
    return adopt.Adoption(True, "download", "read both: CRC32C and SHA-256 equal")


def _by_listing(src_store: Store, src: ObjectInfo, dst_store: Store, dst: ObjectInfo) -> adopt.Adoption:
    """Equal by size and the strongest checksum both listings report, reading no cloud object: a
    local side is hashed (it costs no request); an S3 object whose listing shows no MD5 ETag (a
    multipart upload) is asked for its checksums by one HEAD, only when the listings leave no
    checksum in common. No common checksum: not equal, unproven."""
    if src.size != dst.size:
        return adopt.Adoption(False, "size", f"size {dst.size}, source {src.size}")
    src_local, dst_local = src.location.is_local, dst.location.is_local
    src_sums, dst_sums = adopt.reported(src_store, src), adopt.reported(dst_store, dst)
    name = adopt.common(src_sums, dst_sums, src_local, dst_local)
    if name is None:
        src_sums = adopt.reported(src_store, src, ask=not src_local)
        dst_sums = adopt.reported(dst_store, dst, ask=not dst_local)
        name = adopt.common(src_sums, dst_sums, src_local, dst_local)
    if name is None:
        return adopt.Adoption(False, "", _unproven_why(src, dst))
    if src_local and name not in src_sums:
        src_sums = adopt.digest(src_store, src, (name,))
    if dst_local and name not in dst_sums:
        dst_sums = adopt.digest(dst_store, dst, (name,))
    if src_sums[name] != dst_sums[name]:
        return adopt.Adoption(False, name, f"{name.upper()} {dst_sums[name]}, source {src_sums[name]}")
    return adopt.Adoption(True, name, f"{name.upper()} equal")


def _unproven_why(src: ObjectInfo, dst: ObjectInfo) -> str:
    azure = [side for side, info in (("destination", dst), ("source", src))
             if info.location.scheme in adopt.CLIENT_WRITTEN]
    if azure:
        return (f"sizes equal, not proven: the {azure[0]} is an Azure blob, whose Content-MD5 and metadata "
                f"are what a client wrote (--download reads both)")
    return "sizes equal, not proven: no checksum both stores report (--download reads both)"


def check_trees(source: str, destination: str, settings: Settings, *, download: bool = False) -> dict[str, Any]:
    src_root, dst_root = parse(source).as_prefix(), parse(destination).as_prefix()
    src_store, dst_store = get_store(src_root, settings), get_store(dst_root, settings)
    src_store.check_bucket(src_root)
    dst_store.check_bucket(dst_root)
    report: dict[str, Any] = {"source": str(src_root), "destination": str(dst_root), "download": download,
                              "checked": 0, "equal": 0, "by": {}, "missing": [], "extra": [], "differ": [],
                              "unproven": []}

    def judge(src: ObjectInfo, dst: ObjectInfo) -> adopt.Adoption:
        if download:
            return _read_both(src_store, src, dst_store, dst)
        return _by_listing(src_store, src, dst_store, dst)

    def settle(rel: str, done: cf.Future) -> None:
        verdict = done.result()
        report["checked"] += 1
        if verdict.equal:
            report["equal"] += 1
            report["by"][verdict.by] = report["by"].get(verdict.by, 0) + 1
        elif verdict.by:
            report["differ"].append({"path": rel, "reason": verdict.why})
        else:
            report["unproven"].append({"path": rel, "reason": verdict.why})

    window: deque[tuple[str, cf.Future]] = deque()
    limit = settings.transfer.concurrency * 4
    with cf.ThreadPoolExecutor(settings.transfer.concurrency) as pool:
        for rel, src, dst in merged(sorted_walk(src_store, src_root), sorted_walk(dst_store, dst_root)):
            if dst is None:
                report["missing"].append(rel)
            elif src is None:
                report["extra"].append(rel)
            else:
                window.append((rel, pool.submit(judge, src, dst)))
                if len(window) >= limit:
                    settle(*window.popleft())
        while window:
            settle(*window.popleft())
    report["ok"] = not (report["missing"] or report["extra"] or report["differ"] or report["unproven"])
    return report
