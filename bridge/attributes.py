"""What an object carries besides its bytes, and how each store holds it.

``Attrs`` is the part that travels with a copy: five standard headers (Content-Type,
Content-Encoding, Content-Disposition, Content-Language, Cache-Control) and user metadata, under
names of its own that no store dictates. Each store translates at its edge:

    header / user key   S3                       GCS                Azure                       local file
    content_type        Content-Type             contentType        x-ms-blob-content-type      xattr user.content-type
    cache_control       Cache-Control            cacheControl       x-ms-blob-cache-control     xattr user.cache-control
    ...                 ...                      ...                ...                         ...
    user key k          x-amz-meta-k             metadata[k]        x-ms-meta-k (C# identifier) xattr user.k

The rules a key must follow differ. S3 and Azure compare metadata names without case (S3 keeps
them lower-case); GCS keeps any string. Azure takes only C# identifiers (``[A-Za-z_][A-Za-z0-9_]*``),
so another key goes as azcopy's ``RenameIfInvalid`` writes it: ``rename_<key, other characters as
_>`` holding the value and ``rename_key_<same>`` holding the original name, which ``from_azure``
reads back; S3 and Azure carry values in HTTP headers, so a value that is not printable ASCII goes
as RFC 2047 (``=?UTF-8?B?...?=``, as S3 itself answers such values) and is decoded on the way back.
What cannot be mapped (two keys that differ only in case bound for a store that ignores case, a
renamed key that meets one of its own name) is ``MetadataError``: the file fails with one line,
nothing is dropped silently.

bridge's own keys (``bridge_crc32c``, ``bridge_sha256``, ``bridge_target``) live in the same
metadata on the stores but are never user metadata: ``user_metadata`` leaves them out, and each copy
writes its own.

``ObjectSettings`` (``Settings.objects``, flags ``--content-type``, ``--metadata K=V``,
``--no-metadata``) overrides what a copy writes: ``for_copy`` applies it. A local source gets its
Content-Type guessed from its name with ``mimetypes``, as the AWS CLI does, unless its extended
attributes say otherwise.
"""

from __future__ import annotations

import base64
import mimetypes
import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from bridge.errors import InvalidOption, MetadataError

HEADERS = ("content_type", "content_encoding", "content_disposition", "content_language", "cache_control")
HTTP_NAMES = {"content_type": "Content-Type", "content_encoding": "Content-Encoding",
              "content_disposition": "Content-Disposition", "content_language": "Content-Language",
              "cache_control": "Cache-Control"}
GCS_NAMES = {"content_type": "contentType", "content_encoding": "contentEncoding",
             "content_disposition": "contentDisposition", "content_language": "contentLanguage",
             "cache_control": "cacheControl"}
BRIDGE_PREFIX = "bridge_"
AZURE_RENAMED = "rename_"
AZURE_ORIGINAL = "rename_key_"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_NOT_IDENTIFIER = re.compile(r"[^A-Za-z0-9_]")
_HTTP_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_ENCODED = re.compile(r"=\?UTF-8\?B\?([A-Za-z0-9+/=]*)\?=\Z", re.IGNORECASE)


@dataclass(frozen=True)
class Attrs:
    """The standard headers (None: not set) and user metadata of one object."""

    content_type: str | None = None
    content_encoding: str | None = None
    content_disposition: str | None = None
    content_language: str | None = None
    cache_control: str | None = None
    user: dict[str, str] = field(default_factory=dict)

    def headers(self) -> dict[str, str]:
        """The standard headers that are set, by bridge's names."""
        return {name: getattr(self, name) for name in HEADERS if getattr(self, name)}

    def to_dict(self) -> dict[str, Any]:
        return {**self.headers(), **({"user": dict(self.user)} if self.user else {})}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Attrs:
        d = d or {}
        return cls(**{name: d.get(name) for name in HEADERS}, user=dict(d.get("user") or {}))


def user_metadata(metadata: Mapping[str, str]) -> dict[str, str]:
    """A store's metadata without bridge's own keys."""
    return {k: v for k, v in metadata.items() if not k.lower().startswith(BRIDGE_PREFIX)}


def bridge_metadata(metadata: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in metadata.items() if k.lower().startswith(BRIDGE_PREFIX)}


# -- values in HTTP headers (S3, Azure) -----------------------------------------------------

def header_value(value: str) -> str:
    """A metadata value as an HTTP header carries it: printable ASCII as it is, anything else
    RFC 2047-encoded."""
    if value.isascii() and value.isprintable() and value == value.strip():
        return value
    return "=?UTF-8?B?" + base64.b64encode(value.encode()).decode() + "?="


def from_header_value(value: str) -> str:
    m = _ENCODED.match(value.strip())
    if m:
        try:
            return base64.b64decode(m.group(1), validate=True).decode()
        except (ValueError, UnicodeDecodeError):
            return value
    return value


def _no_case_clash(user: Mapping[str, str], where: str) -> None:
    seen: dict[str, str] = {}
    for key in user:
        other = seen.setdefault(key.lower(), key)
        if other != key:
            raise MetadataError(f"metadata keys {other!r} and {key!r} differ only in case, which {where} "
                                f"does not tell apart")


# -- S3 -------------------------------------------------------------------------------------

def to_s3(user: Mapping[str, str]) -> dict[str, str]:
    """User metadata for x-amz-meta-*: keys lower-case (S3 keeps them so), values header-safe."""
    _no_case_clash(user, "S3")
    out = {}
    for key, value in user.items():
        if not _HTTP_TOKEN.match(key):
            raise MetadataError(f"metadata key {key!r} cannot be an S3 header name (x-amz-meta-{key})")
        out[key.lower()] = header_value(value)
    return out


def from_s3(metadata: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): from_header_value(v) for k, v in user_metadata(metadata).items()}


# -- Azure ----------------------------------------------------------------------------------

def to_azure(user: Mapping[str, str]) -> dict[str, str]:
    """User metadata for x-ms-meta-*: C# identifiers kept, others renamed as azcopy's
    RenameIfInvalid renames them (reversibly), values header-safe."""
    _no_case_clash(user, "Azure")
    out: dict[str, str] = {}
    for key, value in user.items():
        if _IDENTIFIER.match(key) and not key.lower().startswith(AZURE_RENAMED):
            out[key] = header_value(value)
            continue
        valid = _NOT_IDENTIFIER.sub("_", key)
        renamed, original = AZURE_RENAMED + valid, AZURE_ORIGINAL + valid
        if renamed.lower() in {k.lower() for k in out} or original.lower() in {k.lower() for k in out}:
            raise MetadataError(f"metadata key {key!r} is no C# identifier, and its Azure name {renamed!r} "
                                f"is taken by another key")
        out[renamed] = header_value(value)
        out[original] = header_value(key)
    return out


def from_azure(metadata: Mapping[str, str]) -> dict[str, str]:
    user = {k: from_header_value(v) for k, v in user_metadata(metadata).items()}
    originals = {k[len(AZURE_ORIGINAL):]: v for k, v in user.items() if k.lower().startswith(AZURE_ORIGINAL)}
    out = {}
    for key, value in user.items():
        if key.lower().startswith(AZURE_ORIGINAL):
            continue
        if key.lower().startswith(AZURE_RENAMED) and key[len(AZURE_RENAMED):] in originals:
            out[originals[key[len(AZURE_RENAMED):]]] = value
        else:
            out[key] = value
    return out


# -- GCS ------------------------------------------------------------------------------------

def to_gcs_resource(attrs: Attrs) -> dict[str, Any]:
    """The object resource's fields for ``attrs`` (metadata: bridge's keys are added by the caller)."""
    return {GCS_NAMES[name]: value for name, value in attrs.headers().items()}


def from_gcs_resource(item: Mapping[str, Any]) -> Attrs:
    return Attrs(**{name: item.get(GCS_NAMES[name]) or None for name in HEADERS},
                 user=user_metadata(item.get("metadata") or {}))


# -- local files: extended attributes, as rclone's local backend names them -----------------

XATTR = "user."
XATTR_HEADERS = {name: HTTP_NAMES[name].lower() for name in HEADERS}


def to_xattrs(attrs: Attrs, *, content_type: bool = True) -> dict[str, bytes]:
    """``content_type=False``: as for ``attrs`` without its Content-Type."""
    out = {XATTR + XATTR_HEADERS[name]: value.encode() for name, value in attrs.headers().items()
           if content_type or name != "content_type"}
    for key, value in attrs.user.items():
        name = XATTR + key
        if name in out:
            raise MetadataError(f"metadata key {key!r} has the name of a header on a local file "
                                f"(extended attribute {name})")
        out[name] = value.encode()
    return out


def from_xattrs(values: Mapping[str, bytes], name: str) -> Attrs:
    """Attrs from a file's ``user.`` extended attributes; its Content-Type guessed from ``name``
    when none is recorded."""
    headers: dict[str, str | None] = {}
    user = {}
    by_xattr = {v: k for k, v in XATTR_HEADERS.items()}
    for key, raw in values.items():
        if not key.startswith(XATTR):
            continue
        text = raw.decode("utf-8", "replace")
        short = key[len(XATTR):]
        if short in by_xattr:
            headers[by_xattr[short]] = text
        else:
            user[short] = text
    if not headers.get("content_type"):
        headers["content_type"] = guess_content_type(name)
    return Attrs(**headers, user=user)


def guess_content_type(name: str) -> str | None:
    """As the AWS CLI guesses it: ``mimetypes`` from the name, nothing when it does not know.
    A name whose one extension decides alone (no URL scheme, no compression or compound suffix
    for mimetypes to look behind) is answered from a small cache by extension: a download of
    many small files asks once per file."""
    if ":" not in name:
        ext = posixpath.splitext(name)[1]
        if ext and ext.lower() not in _compound_suffixes():
            return _by_extension(ext)
    return mimetypes.guess_type(name, strict=False)[0]


@lru_cache(maxsize=512)
def _by_extension(ext: str) -> str | None:
    return mimetypes.guess_type("x" + ext, strict=False)[0]


@lru_cache(maxsize=1)
def _compound_suffixes() -> frozenset[str]:
    """The suffixes after which mimetypes looks at the one before (``.tgz``, ``.gz``, ...)."""
    mimetypes.init() if not mimetypes.inited else None
    return frozenset(k.lower() for k in (*mimetypes.suffix_map, *mimetypes.encodings_map))


# -- what a copy writes -----------------------------------------------------------------------

def parse_pairs(pairs: Iterable[str], flag: str = "--metadata") -> dict[str, str]:
    """``["k=v", ...]`` as a mapping; bad input names the pair."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidOption(f"{flag} {pair!r}: use KEY=VALUE")
        if key.lower().startswith(BRIDGE_PREFIX):
            raise InvalidOption(f"{flag} {pair!r}: keys starting {BRIDGE_PREFIX!r} are bridge's own")
        out[key.strip()] = value
    return out


def for_copy(source: Attrs | None, objects) -> Attrs:
    """What a copy writes from what the source carries and the ``objects`` settings: with
    ``metadata: off`` nothing of the source's (a Content-Type given is still set); then the
    Content-Type given, then the metadata given over the source's keys."""
    base = source if (source is not None and objects.metadata == "on") else Attrs()
    if objects.content_type:
        base = replace(base, content_type=objects.content_type)
    if objects.set_metadata:
        base = replace(base, user={**base.user, **objects.set_metadata})
    return base


# -- where the settings say it: a destination's class and encryption, a copy's overrides ------

_SECTION = {"s3": "s3", "gs": "gcs", "az": "azure"}
_PLACEMENT = {"s3": {"storage_class": "storage_class", "kms_key": "sse_kms_key_id", "bucket_key": "bucket_key"},
              "gs": {"storage_class": "storage_class", "kms_key": "kms_key_name"},
              "az": {"storage_class": "tier", "encryption_scope": "encryption_scope"}}


def placement_overrides(destination: str, **placement: Any) -> dict[str, dict[str, Any]]:
    """A destination's placement (storage_class, kms_key, bucket_key, encryption_scope) as the
    settings section of its store it overrides: ``{"azure": {"tier": "Cool"}}``."""
    from bridge.urls import parse
    scheme = parse(destination).scheme
    given = {k: v for k, v in placement.items() if v is not None}
    if not given:
        return {}
    fields = _PLACEMENT.get(scheme, {})
    wrong = [f"--{k.replace('_', '-')}" for k in given if k not in fields]
    if wrong:
        raise InvalidOption(f"{', '.join(wrong)} does not apply to a {scheme}:// destination")
    return {_SECTION[scheme]: {fields[k]: v for k, v in given.items()}}


def with_objects(settings, destination: str, objects: Mapping[str, Any] | None = None, *,
                 storage_class: str | None = None, kms_key: str | None = None, bucket_key: bool | None = None,
                 encryption_scope: str | None = None):
    """``settings`` with ``objects`` (the ``objects`` section's fields) and the destination's
    storage class and encryption (in its store's section: S3 storage_class, sse_kms_key_id,
    bucket_key; GCS storage_class, kms_key_name; Azure tier, encryption_scope) applied and
    checked; one given for a store that has no such thing is bad input."""
    from bridge.config import _Invalid
    from bridge.urls import parse
    updates: dict[str, dict[str, Any]] = {"objects": dict(objects)} if objects else {}
    updates.update(placement_overrides(destination, storage_class=storage_class, kms_key=kms_key,
                                       bucket_key=bucket_key, encryption_scope=encryption_scope))
    if not updates:
        return settings
    try:
        sections = {name: type(getattr(settings, name))._from({**getattr(settings, name).model_dump(), **values},
                                                               name)
                    for name, values in updates.items()}
    except _Invalid as exc:
        raise InvalidOption(str(exc).replace("invalid setting ", "invalid ", 1)) from None
    return settings.model_copy(update=sections)
