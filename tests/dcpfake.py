"""A PyTorch DCP ``.metadata`` as ``torch.distributed.checkpoint`` writes it, made without torch.

The classes below carry the module paths and names of torch's own (``metadata.Metadata``,
``MetadataIndex``, ``TensorStorageMetadata``, ``ChunkStorageMetadata``, ``TensorProperties``,
``StorageMeta``, ``filesystem._StorageInfo``, ``torch.Size``, ``torch.float32``) and pickle as
they do, so the bytes name the same globals a real ``dcp.save`` pickles. While they are pickled,
stand-in modules of those names sit in ``sys.modules`` (pickle looks each class up by its name to
be sure it is the one it writes); they are taken away again afterwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import pickle
import subprocess
import sys
import types
from pathlib import Path

_META = "torch.distributed.checkpoint.metadata"
_FS = "torch.distributed.checkpoint.filesystem"


class Size(tuple):
    def __reduce__(self):
        return (Size, (tuple(self),))


class dtype:  # noqa: N801 (torch's name)
    def __init__(self, name: str):
        self.name = name

    def __reduce__(self):
        return self.name   # a global: torch.float32


class _Named:
    def __init__(self, name: str):
        self.name = name

    def __reduce__(self):
        return self.name   # torch.strided, torch.contiguous_format


float32 = dtype("float32")
strided = _Named("strided")
contiguous_format = _Named("contiguous_format")


@dataclasses.dataclass
class ChunkStorageMetadata:
    offsets: Size
    sizes: Size


@dataclasses.dataclass
class TensorProperties:
    dtype: dtype = float32
    layout: object = strided
    requires_grad: bool = False
    memory_format: object = contiguous_format
    pin_memory: bool = False


@dataclasses.dataclass
class TensorStorageMetadata:
    properties: TensorProperties
    size: Size
    chunks: list


@dataclasses.dataclass
class StorageMeta:
    checkpoint_id: object = None
    save_id: str = ""
    load_id: str = ""


@dataclasses.dataclass
class Metadata:
    state_dict_metadata: dict
    planner_data: object = None
    storage_data: object = None
    storage_meta: object = None
    version: str = "1.0.0"


@dataclasses.dataclass(frozen=True)
class MetadataIndex:
    fqn: str
    offset: Size | None = None
    index: int | None = dataclasses.field(hash=False, compare=False, default=None)


@dataclasses.dataclass
class _StorageInfo:
    relative_path: str
    offset: int
    length: int


_HOMES = {"torch": [Size, dtype, _Named], _META: [ChunkStorageMetadata, TensorProperties, TensorStorageMetadata,
                                                  StorageMeta, Metadata, MetadataIndex], _FS: [_StorageInfo]}


_NAMES = ("torch", "torch.distributed", "torch.distributed.checkpoint", _META, _FS)


def _pickled_elsewhere(shards: dict[str, list[int]], folder: str) -> bytes:
    """``metadata`` made by a Python of its own: this process holds torch itself (webdataset, for
    one, imports it when it is installed), whose names the stand-ins cannot take."""
    code = ("import json, sys\nfrom tests.dcpfake import metadata\n"
            "sys.stdout.buffer.write(metadata(json.loads(sys.argv[1]), sys.argv[2]))\n")
    run = subprocess.run([sys.executable, "-c", code, json.dumps(shards), folder], capture_output=True,
                         cwd=Path(__file__).resolve().parent.parent, timeout=120)
    if run.returncode != 0:
        raise RuntimeError(f"making the DCP fixture failed: {run.stderr.decode(errors='replace')}")
    return run.stdout


@contextlib.contextmanager
def _torch_named():
    """torch's module names in ``sys.modules`` for as long as pickling takes, holding the classes."""
    names = list(_NAMES)
    if any(n in sys.modules for n in names):
        raise RuntimeError("torch is imported here: make the fixture with the real torch")
    made = {n: types.ModuleType(n) for n in names}
    for home, classes in _HOMES.items():
        for cls in classes:
            cls.__module__ = home
            setattr(made[home], cls.__name__, cls)
    for value in (float32, strided, contiguous_format):
        setattr(made["torch"], value.name, value)
    sys.modules.update(made)
    try:
        yield
    finally:
        for n in names:
            sys.modules.pop(n, None)


def metadata(shards: dict[str, list[int]], folder: str = "/ckpt/step") -> bytes:
    """The ``.metadata`` of a checkpoint whose storage file ``name`` holds one tensor item per
    length in ``shards[name]``, one after another: each as ``_StorageInfo(name, offset, length)``."""
    if any(n in sys.modules for n in _NAMES):
        return _pickled_elsewhere(shards, folder)
    state, storage = {}, {}
    for rank, (name, lengths) in enumerate(sorted(shards.items())):
        offset = 0
        for n, length in enumerate(lengths):
            fqn = f"layers.{rank}.{n}.weight"
            shape = Size((length // 4,))
            state[fqn] = TensorStorageMetadata(TensorProperties(), shape,
                                               [ChunkStorageMetadata(Size((0,)), shape)])
            storage[MetadataIndex(fqn, Size((0,)), 0)] = _StorageInfo(name, offset, length)
            offset += length
    meta = Metadata(state, None, storage, StorageMeta(pathlib.PurePosixPath(folder), "save-1", ""))
    with _torch_named():
        return pickle.dumps(meta, protocol=pickle.DEFAULT_PROTOCOL)


def needs(shards: dict[str, list[int]]) -> dict[str, int]:
    """How many bytes each storage file must hold for ``metadata(shards)``."""
    return {name: sum(lengths) for name, lengths in shards.items()}
