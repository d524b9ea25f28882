"""``publish(folder, url)``: a Hugging Face ``save_pretrained`` folder (``config.json``, safetensors
shards and their ``model.safetensors.index.json``, tokenizer files) copied with ``mcbridge cp``'s
pipeline, committed by bridge's record, and announced to the replication policies covering
``url`` (``bridge.replicator.announce``).

The folder is checked before any byte moves, from what its files say of themselves
(bridge/evidence.py): every safetensors file holds exactly the bytes its header declares, and every
shard the index names is there. A folder that fails is refused with one line naming the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from bridge import evidence, ops, replicator
from bridge.config import Settings, load_settings
from bridge.errors import InvalidOption
from bridge.stores import get_store
from bridge.urls import parse

INDEX_SUFFIX = ".safetensors.index.json"


def check_folder(folder: Path, settings: Settings) -> list[str]:
    """The safetensors files of a ``save_pretrained`` folder, each checked whole by its header,
    and the shards its indexes name; InvalidOption names the first problem."""
    if not folder.is_dir():
        raise InvalidOption(f"{folder}: no such folder")
    names = sorted(p.name for p in folder.iterdir() if p.is_file())
    tensors = [n for n in names if n.endswith(".safetensors")]
    if "config.json" not in names and not tensors:
        raise InvalidOption(f"{folder}: neither config.json nor a .safetensors file: not a save_pretrained folder")
    root = parse(f"{folder.as_posix()}/")
    store = get_store(root, settings)
    for name in tensors:
        info = store.info(root.join(name))
        declared = evidence.safetensors_size(store, info)
        if declared is None:
            raise InvalidOption(f"{folder / name}: no safetensors header")
        if isinstance(declared, str) or declared != info.size:
            said = declared if isinstance(declared, str) else f"{info.size} bytes, its header says {declared}"
            raise InvalidOption(f"{folder / name}: {said}: cut short or still being written")
    for index in (n for n in names if n.endswith(INDEX_SUFFIX)):
        try:
            shards = set(json.loads((folder / index).read_text())["weight_map"].values())
        except (ValueError, KeyError, TypeError, AttributeError):
            raise InvalidOption(f"{folder / index}: not a safetensors index (no weight_map)") from None
        missing = sorted(shards - set(names))
        if missing:
            raise InvalidOption(f"{folder / index}: names {missing[0]}, which the folder does not hold")
    return tensors


def publish(folder: str | os.PathLike, url: str, *, settings: Settings | None = None) -> dict:
    """Copy the ``save_pretrained`` folder to ``url``, commit it, tell the policies covering it.
    Returns the copy's report (``manifest``: the record written)."""
    settings = settings or load_settings()
    folder = Path(folder).absolute()
    check_folder(folder, settings)
    report = ops.copy(f"{folder.as_posix()}/", str(parse(url).as_prefix()), settings)
    replicator.announce(str(parse(url).as_prefix()), settings)
    return report


__all__ = ["check_folder", "publish"]
