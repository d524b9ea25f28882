"""What a checkpoint's own files say of it, read in the few bytes needed: the facts that
policies/replication.py ``assess`` weighs against a listing to say whether a checkpoint is
committed. Nothing here decides; every reader returns a fact or a short reason it has none.

- PyTorch DCP ``.metadata``: a pickle of ``Metadata`` whose ``storage_data`` maps every tensor or
  byte item to ``_StorageInfo(relative_path, offset, length)``. Read whole (it is small), loaded
  without torch by ``_InertUnpickler``: torch's and pathlib's classes become inert stand-ins that
  only keep their fields, every other class is refused, so a hostile pickle runs nothing. The
  fact: each storage file it names and the bytes it must hold (its largest offset + length).
- safetensors: a file starts with an 8-byte little-endian header length and a JSON header whose
  ``data_offsets`` say where each tensor ends: the file's exact size is 8 + header + the largest
  end. Two ranged reads of the file's head, never its tensors.
- Orbax: the items ``_CHECKPOINT_METADATA`` names (``item_handlers``), each a folder of the step.
- bridge records: a record (``_bridge/log/``) at the checkpoint's folder or at ANY folder above
  it (one ``cp`` of a parent folder records every step under it) holds an entry per file; a file
  whose entry has the listing's size and version is covered by that record.
- POSIX stability (``unsettled``): a file of a local source listed twice a quiet period apart
  with another size or mtime is still being written.

Each fact is kept by the identity of the object it was read from, so a watch that lists every few
seconds reads a header or a ``.metadata`` once per version.
"""

from __future__ import annotations

import json
import pickle
import struct
import time
from collections.abc import Mapping
from typing import Any

from bridge import manifest as manifests
from bridge.errors import BridgeError, ObjectNotFound
from bridge.policies import replication as rules
from bridge.stores.base import RESERVED, ObjectInfo, Store, identity_changed, is_reserved
from bridge.urls import Location

DCP_METADATA_MAX = 64 * 1024 * 1024      # a .metadata larger than this is not read (taken on its name)
SAFETENSORS_HEADER_MAX = 100 * 1024 * 1024   # safetensors' own limit on a header
_HEAD = 64 * 1024                         # the first read of a safetensors file: most headers fit
_CACHE: dict[tuple, Any] = {}             # a fact by (what, location, size, identity)
_CACHE_MAX = 8192


# -- DCP .metadata, without torch -------------------------------------------------------------------

class Inert:
    """A stand-in for a torch or pathlib class in a pickle: it keeps whatever it was built with
    (arguments, state) and can do nothing else."""

    def __new__(cls, *args, **kwargs):
        obj = object.__new__(cls)
        obj.__dict__["_args"] = args
        return obj

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2:   # (dict, slots) of a class with __slots__
            state = {**(state[0] or {}), **(state[1] or {})}
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.__dict__["_state"] = state


_STAND_INS: dict[tuple[str, str], type] = {}
_TRUSTED_MODULES = ("torch", "pathlib")


class _InertUnpickler(pickle.Unpickler):
    """Loads a DCP ``.metadata`` with no torch: classes of torch and pathlib become ``Inert``
    subclasses named as the originals, ``collections.OrderedDict`` stays itself, anything else
    (``os.system``, ``builtins.eval`` …) is refused."""

    def find_class(self, module: str, name: str):
        if module.split(".")[0] in _TRUSTED_MODULES:
            key = (module, name)
            if key not in _STAND_INS:
                _STAND_INS[key] = type(name, (Inert,), {"__module__": module, "__qualname__": name})
            return _STAND_INS[key]
        if (module, name) == ("collections", "OrderedDict"):
            import collections
            return collections.OrderedDict
        raise pickle.UnpicklingError(f"refused to load {module}.{name}")


def dcp_storage(data: bytes) -> dict[str, int] | str | None:
    """Each storage file a DCP ``.metadata`` names, with the bytes it must hold at least; why
    ``data`` is not such a file yet (empty, cut short, another class); None when it is no pickle
    at all (a marker of the user's that only shares DCP's name)."""
    import io
    if not data:
        return "is empty"
    if data[:1] != pickle.PROTO:   # DCP pickles with protocol 2 or later, which starts so
        return None
    try:
        meta = _InertUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError,
            KeyError, struct.error, RecursionError, MemoryError) as exc:
        return f"is not a whole DCP metadata pickle ({type(exc).__name__}: {str(exc)[:80]})"
    if type(meta).__name__ != "Metadata" or not type(meta).__module__.startswith("torch.distributed.checkpoint"):
        return f"holds a {type(meta).__module__}.{type(meta).__name__}, not a DCP Metadata"
    storage = getattr(meta, "storage_data", None)
    if not isinstance(storage, dict):
        return "has no storage_data (not written by a FileSystemWriter)"
    needs: dict[str, int] = {}
    for info in storage.values():
        path, offset, length = (getattr(info, f, None) for f in ("relative_path", "offset", "length"))
        if not isinstance(path, str) or not isinstance(offset, int) or not isinstance(length, int):
            return "names a storage item without relative_path, offset and length"
        needs[path] = max(needs.get(path, 0), offset + length)
    return needs


# -- safetensors headers ------------------------------------------------------------------------------

def safetensors_size(store: Store, info: ObjectInfo) -> int | str | None:
    """The exact size a safetensors file declares in its header; why it cannot be known yet
    (too short to hold its header); None when its first bytes are no safetensors header at all
    (a header length over safetensors' own limit, or not JSON): not a file of this format."""
    if info.size < 8:
        return f"{info.size} bytes, under the 8-byte header length"
    head = store.read(info.location, 0, min(info.size, _HEAD))
    (length,) = struct.unpack("<Q", head[:8])
    if length > SAFETENSORS_HEADER_MAX:
        return None
    if 8 + length > info.size:
        return f"{info.size} bytes, shorter than its own {length}-byte header"
    header = head[8:8 + length] if len(head) >= 8 + length else store.read(info.location, 8, length)
    try:
        tensors = json.loads(header)
        ends = [int(t["data_offsets"][1]) for k, t in tensors.items() if k != "__metadata__"]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None
    return 8 + length + max(ends, default=0)


# -- Orbax ----------------------------------------------------------------------------------------

def orbax_items(data: bytes) -> tuple[str, ...] | str:
    """The items an Orbax ``_CHECKPOINT_METADATA`` names (its ``item_handlers``), or why none."""
    try:
        doc = json.loads(data)
    except ValueError:
        return "is not JSON"
    handlers = doc.get("item_handlers") if isinstance(doc, dict) else None
    if isinstance(handlers, dict):
        return tuple(sorted(str(k) for k in handlers))
    return ()   # one unnamed item (or none): the folder itself


# -- bridge records at the folder and above -------------------------------------------------------------

def _ancestors(root: Location) -> list[Location]:
    """``root`` and every folder above it, up to the bucket (the file system's root)."""
    parts = root.as_prefix().key.rstrip("/").split("/") if root.key.strip("/") else []
    return [Location(root.scheme, root.bucket, "/".join(parts[:n]) + ("/" if n else ""))
            for n in range(len(parts), -1, -1)]


def _record_version(store: Store, at: Location) -> tuple:
    """What names the record at ``at`` as it is now: its files under ``_bridge/``, each with
    its size and version (one listing); () when there is none."""
    home = manifests.record_home(store, at).join(RESERVED).as_prefix()
    return tuple(sorted((info.location.key, info.size, tuple(sorted(info.identity.items())))
                        for info in store.list(home)))


def _record_entries(store: Store, at: Location, under: str = "") -> dict[str, tuple[int, dict]]:
    """The entries of the record at ``at`` whose paths start with ``under`` (path -> size,
    identity); {} when there is none. Read once per version of the record: a watch that lists
    every few seconds pays one listing of ``_bridge/`` per tick, not a read of every commit."""
    try:
        version = _record_version(store, at)
        if not version:
            return {}
        key = ("record", str(at), under, version)
        if key not in _CACHE:
            record = manifests.open_record(store, at)
            _remember(key, {} if record is None else
                      {e.path: (e.size, e.identity) for e in record.entries() if e.path.startswith(under)})
    except BridgeError:   # a folder above the source we may not list, a record being compacted
        return {}
    return _CACHE[key]


Records = list[tuple[Location, str, dict[str, tuple[int, dict]]]]


def records_above(store: Store, root: Location) -> Records:
    """The records at ``root`` and at every folder above it, each with the path of ``root``
    inside it and its entries under ``root``: one listing of each folder's ``_bridge/``."""
    out = []
    for at in _ancestors(root):
        inside = root.relative_to(at)
        entries = _record_entries(store, at, inside)
        if entries:
            out.append((at, inside, entries))
    return out


def recorded(store: Store, root: Location, name: str, files: Mapping[str, ObjectInfo],
             above: Records) -> dict[str, str]:
    """The files of checkpoint ``name`` (under ``root``) that a bridge record at the checkpoint's
    folder or above (``records_above``) holds with the listing's size and version, each with the
    record's folder. The checkpoint's own record is read only where the listing shows one."""
    own = root.join(name).as_prefix()
    homes = [(own, "", _record_entries(store, own))] if any(is_reserved(rel) for rel in files) else []
    homes += [(at, f"{inside}{name}/", entries) for at, inside, entries in above]
    out: dict[str, str] = {}
    for at, inside, entries in homes:
        for rel, info in files.items():
            entry = entries.get(inside + rel)
            if rel not in out and entry is not None and entry[0] == info.size \
                    and not identity_changed(entry[1], info.identity):
                out[rel] = str(at)
    return out


# -- one checkpoint ---------------------------------------------------------------------------------------

def _remember(key: tuple, value: Any) -> None:
    if len(_CACHE) > _CACHE_MAX:
        _CACHE.clear()
    _CACHE[key] = value


def _once(what: str, info: ObjectInfo, read) -> Any:
    """``read(info)``, kept by the object's version: a version is read once."""
    key = (what, str(info.location), info.size, tuple(sorted(info.identity.items())))
    if key not in _CACHE:
        try:
            _remember(key, read(info))
        except ObjectNotFound:
            return "is gone since it was listed"
    return _CACHE[key]


def gather(store: Store, root: Location, name: str, files: Mapping[str, ObjectInfo],
           above: Records) -> rules.Evidence:
    """What the files of checkpoint ``name`` say of it (see the module's docstring)."""
    def text(info: ObjectInfo) -> str:
        return store.read(info.location).decode("utf-8", "replace")

    indexes = {rel: _once("text", files[rel], text) for rel in rules.index_files(files)}
    tensors = {rel: _once("safetensors", info, lambda i: safetensors_size(store, i))
               for rel, info in files.items() if rel.endswith(".safetensors")}
    dcp = None
    meta = files.get(rules.DCP_METADATA)
    if meta is not None and meta.size <= DCP_METADATA_MAX:
        dcp = _once("dcp", meta, lambda i: dcp_storage(store.read(i.location)))
    items = None
    orbax = files.get(rules.ORBAX_METADATA)
    if orbax is not None:
        items = _once("orbax", orbax, lambda i: orbax_items(store.read(i.location)))
    covered = recorded(store, root, name, files, above)
    return rules.Evidence(indexes=indexes, safetensors=tensors, dcp=dcp, orbax_items=items, recorded=covered)


def unsettled(store: Store, root: Location, listed: Mapping[str, Mapping[str, ObjectInfo]],
              quiet_s: float, now: float | None = None) -> dict[str, dict[str, str]]:
    """On a local source: the files written within the last ``quiet_s`` looked at again once
    that quiet period has passed; each whose size or mtime moved, by checkpoint, with how. Files
    older than the quiet period are not looked at again (unchanged across it by their mtime)."""
    now = time.time() if now is None else now
    recent = [(name, rel, info) for name, inner in listed.items() for rel, info in inner.items()
              if info.modified is None or now - info.modified < quiet_s]
    if not recent:
        return {}
    newest = max((i.modified or now) for _n, _r, i in recent)
    time.sleep(max(0.0, min(quiet_s, newest + quiet_s - time.time())))
    out: dict[str, dict[str, str]] = {}
    for name, rel, info in recent:
        try:
            seen = store.info(info.location)
        except ObjectNotFound:
            out.setdefault(name, {})[rel] = "gone"
            continue
        if seen.size != info.size:
            out.setdefault(name, {})[rel] = f"size {info.size} -> {seen.size}"
        elif seen.modified != info.modified or identity_changed(info.identity, seen.identity):
            out.setdefault(name, {})[rel] = "rewritten"
    return out

