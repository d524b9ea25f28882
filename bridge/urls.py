"""Storage locations: ``s3://bucket/key``, ``gs://bucket/key``, ``az://container/key``,
``file:///abs/path`` and plain local paths, parsed once into a ``Location`` value."""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from bridge.errors import BadURL
from bridge.names import local_join

CLOUD_SCHEMES = ("s3", "gs", "az")
_BUCKET_RULES = {
    "s3": re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$"),
    "gs": re.compile(r"^[a-z0-9][a-z0-9._\-]{1,220}[a-z0-9]$"),
    "az": re.compile(r"^[a-z0-9](?!.*--)[a-z0-9\-]{1,61}[a-z0-9]$"),
}
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
_NEAR_SCHEME_RE = re.compile(r"^(s3|gs|az|file):", re.IGNORECASE)


@dataclass(frozen=True)
class Location:
    """Where objects live. ``key`` never starts with '/'; for local files ``bucket`` is '' and
    ``key`` is the absolute path without its leading '/'."""

    scheme: str
    bucket: str
    key: str

    @property
    def is_local(self) -> bool:
        return self.scheme == "file"

    @property
    def is_prefix(self) -> bool:
        return self.key == "" or self.key.endswith("/")

    @property
    def name(self) -> str:
        return self.key.rstrip("/").rsplit("/", 1)[-1]

    def join(self, rel: str) -> Location:
        """The location of ``rel`` under this one, joined with '/' whatever the platform. An
        object key is kept exactly (``/abs`` and ``a//b`` are keys too); a local path must stay
        a plain path under this one (UnsafeName otherwise)."""
        base = self.key if self.is_prefix else self.key + "/"
        if self.is_local:
            return Location(self.scheme, self.bucket, local_join(base, rel))
        return Location(self.scheme, self.bucket, base + rel)

    def as_prefix(self) -> Location:
        return self if self.is_prefix else Location(self.scheme, self.bucket, self.key + "/")

    def is_within(self, outer: Location) -> bool:
        """Whether this location, taken as a prefix, is ``outer``'s prefix or under it."""
        return (self.scheme, self.bucket) == (outer.scheme, outer.bucket) and \
            self.as_prefix().key.startswith(outer.as_prefix().key)

    def same_as(self, other: Location) -> bool:
        """Whether both name the same object or folder, however spelt (``canonical``)."""
        return canonical(self) == canonical(other)

    def relative_to(self, prefix: Location) -> str:
        return self.key[len(prefix.as_prefix().key):]

    @property
    def local_path(self) -> str:
        return "/" + self.key

    def __str__(self) -> str:
        if self.is_local:
            return self.local_path
        return f"{self.scheme}://{self.bucket}/{self.key}"


def parse(url: str, *, empty_segments: bool = False) -> Location:
    """Parse a URL or local path; raise BadURL with one line naming what is wrong.
    ``empty_segments``: a cloud key may hold them (``a//b``, as listings can return), for an
    object only read, whose key never becomes a local name (the cache's source)."""
    if not url or not url.strip():
        raise BadURL("empty location: give a local path or an s3://, gs://, az:// URL")
    m = _SCHEME_RE.match(url)
    if not m:
        if "://" in url or url.startswith(":"):
            raise BadURL(f"malformed URL {url!r}: expected SCHEME://BUCKET/KEY")
        near = _NEAR_SCHEME_RE.match(url)
        if near:  # s3:/b/k or gs:b/k: a typo of a URL, not a local folder named "s3:"
            scheme = near.group(1).lower()
            hint = "file:///PATH (or ./ before a local name with a colon)" if scheme == "file" else \
                f"{scheme}://BUCKET/KEY"
            raise BadURL(f"malformed URL {url!r}: expected {hint}")
        return _local(url)
    scheme = m.group(1).lower()
    if scheme == "file":
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise BadURL(f"malformed URL {url!r}: file URLs take an absolute path, file:///path")
        return _local(unquote(parts.path) or "/")
    if scheme not in CLOUD_SCHEMES:
        raise BadURL(f"unknown scheme {scheme!r} in {url!r}: use s3://, gs://, az://, file:// or a local path")
    rest = url[m.end():]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise BadURL(f"malformed URL {url!r}: missing bucket name after {scheme}://")
    if not _BUCKET_RULES[scheme].match(bucket):
        raise BadURL(f"malformed URL {url!r}: {bucket!r} is not a valid {scheme} bucket name")
    if not empty_segments and (key.startswith("/") or "//" in key):
        raise BadURL(f"malformed URL {url!r}: empty path segment in key")
    return Location(scheme, bucket, key)


def canonical(loc: Location) -> Location:
    """The one spelling that every alias of ``loc`` shares, to tell whether two locations are one
    object or one inside the other: a local path with its links resolved (a link to a folder
    reaches the folder itself), an Azure name with its '.' and '..' segments resolved as the
    service resolves them. S3 and GCS keep a key exactly as written, so their keys are their own."""
    if loc.is_local:
        real = os.path.realpath(loc.local_path)
        if loc.is_prefix and real != "/":
            real += "/"
        return Location("file", "", real.lstrip("/"))
    if loc.scheme == "az" and any(seg in (".", "..") for seg in loc.key.split("/")):
        resolved = posixpath.normpath("/" + loc.key).lstrip("/")
        if loc.is_prefix and resolved:
            resolved += "/"
        return Location(loc.scheme, loc.bucket, resolved)
    return loc


def _local(path: str) -> Location:
    trailing = path.endswith("/") or path.endswith(os.sep)
    absolute = os.path.abspath(os.path.expanduser(path))
    if trailing or (os.path.isdir(absolute) and absolute != "/"):
        absolute = absolute.rstrip("/") + "/"
    return Location("file", "", absolute.lstrip("/"))
