"""Names and order inside a shard set, and which member paths are safe to restore.

A shard set under a root, for the default prefix ``shard``::

    shard-000000.tar                    shards, six-digit numbers, in pack order
    shard-000001.tar
    shard.index.d/shard-000000.tar.jsonl  per shard: one line per file (path, offset, length, sha256)
    shard.index.json                    the shard set's index, written last: its commit marker

Files go into shards in *pack order*: by WebDataset sample key (the path up to the first dot
of the basename, as ``webdataset`` splits it), then by path. That is plain path order except
where a directory name with a dot would come between the files of one sample; those stay
adjacent, and a sample is never split across two shards.
"""

from __future__ import annotations

import re

from bridge.errors import InvalidOption, UnsafeMember  # noqa: F401 (UnsafeMember re-exported)
from bridge.stores.base import RESERVED

INDEX_FORMAT = "mcbridge-shardset"
INDEX_VERSION = 1
MAX_SHARDS = 1_000_000            # six digits
_SAMPLE_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")   # webdataset.tariterators.base_plus_ext
_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,99}$")
_SHARD = re.compile(r"^(?P<prefix>.+)-(?P<number>\d{6})\.(?P<ext>tar|parquet)$")


def sample_key(path: str) -> str:
    match = _SAMPLE_KEY.match(path)
    return match.group(1) if match else path


def sample_keys(paths: list[str]) -> list[str]:
    """``sample_key`` of each path, in one pass (a plan's every file)."""
    return [match[1] if match else path for path, match in zip(paths, map(_SAMPLE_KEY.match, paths))]


def pack_order(path: str) -> tuple[str, str]:
    return sample_key(path), path


def check_prefix(prefix: str) -> str:
    if not _PREFIX.match(prefix) or prefix.endswith(".index"):
        raise InvalidOption(f"invalid shard prefix {prefix!r}: use letters, digits, '.', '_' or '-', "
                            f"no '/'")
    return prefix


def shard_name(prefix: str, number: int, extension: str) -> str:
    if number >= MAX_SHARDS:
        raise InvalidOption(f"more than {MAX_SHARDS} shards: raise --shard-size")
    return f"{prefix}-{number:06d}.{extension}"


def parse_shard_name(name: str) -> tuple[str, int, str] | None:
    match = _SHARD.match(name)
    return (match["prefix"], int(match["number"]), match["ext"]) if match else None


def index_name(prefix: str) -> str:
    return f"{prefix}.index.json"


def list_name(prefix: str, shard: str) -> str:
    return f"{prefix}.index.d/{shard}.jsonl"


def normalize_member(name: str) -> tuple[str, str | None]:
    """(the path a member restores to, or the reason it must not be restored).

    ``./a//b`` is ``a/b``; absolute names, ``..`` anywhere (with either slash), NUL bytes and
    bridge's reserved folder are refused rather than repaired.
    """
    if "\\" not in name and "\x00" not in name and name[:1] != "/" and name[1:3] != ":/":
        # A plain path (the common case, checked per file of a pack): no backslash, no empty,
        # "." or ".." segment; what is left of the checks below is the reserved folder.
        wrapped = f"/{name}/"
        if "//" not in wrapped and "/./" not in wrapped and "/../" not in wrapped:
            if name.partition("/")[0] == RESERVED:
                return name, f"is inside bridge's reserved {RESERVED}/ folder"
            return name, None
    if "\x00" in name:
        return name, "has a NUL byte in its name"
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:[\\/]", name):
        return name, "is an absolute path"
    if ".." in re.split(r"[\\/]", name):
        return name, "climbs out of the target with '..'"
    path = "/".join(p for p in name.split("/") if p not in ("", "."))
    if not path:
        return name, "has an empty name"
    if path.split("/", 1)[0] == RESERVED:
        return path, f"is inside bridge's reserved {RESERVED}/ folder"
    return path, None
