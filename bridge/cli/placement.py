"""What a copy writes besides the bytes, as flags of ``cp`` and ``sync``: headers and metadata
(``--content-type``, ``--metadata K=V``, ``--no-metadata``), the destination's storage class and
encryption (``--storage-class``, ``--kms-key``, ``--bucket-key``, ``--encryption-scope``), and
how existing objects at a destination without a manifest are taken over (``--adopt``,
``--skip-existing``, ``--checksum``). Each flag lands in the settings section it overrides, for
the destination's store only, and is checked there (a class the store does not have is bad input)."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from bridge.config import Settings
from bridge.errors import InvalidOption

ContentTypeOpt = Annotated[Optional[str], typer.Option(
    "--content-type", help="Content-Type of every object written (default: the source's; a local file's "
    "guessed from its name).")]
MetadataOpt = Annotated[Optional[list[str]], typer.Option(
    "--metadata", help="KEY=VALUE user metadata set on every object written, over the source's (repeatable).")]
NoMetadataOpt = Annotated[bool, typer.Option(
    "--no-metadata", help="Carry none of the source's headers and user metadata.")]
StorageClassOpt = Annotated[Optional[str], typer.Option(
    "--storage-class", help="Storage class (S3, GCS) or access tier (Azure: Hot, Cool, Cold, Archive) of the "
    "objects written.")]
KmsKeyOpt = Annotated[Optional[str], typer.Option(
    "--kms-key", help="Encrypt with this key: S3 SSE-KMS key id/ARN/alias, GCS CMEK key name.")]
BucketKeyOpt = Annotated[Optional[bool], typer.Option(
    "--bucket-key/--no-bucket-key", help="S3: use (or not) an S3 Bucket Key with --kms-key.")]
ScopeOpt = Annotated[Optional[str], typer.Option(
    "--encryption-scope", help="Azure: the encryption scope of the blobs written.")]
AdoptOpt = Annotated[Optional[str], typer.Option(
    "--adopt", help="Objects already at a destination without a manifest: 'checksum' (default) takes those "
    "whose size and a checksum both stores report agree; 'deep' also reads and hashes both sides where "
    "no common checksum exists; 'off' sends everything.")]
SkipExistingOpt = Annotated[bool, typer.Option(
    "--skip-existing", help="Send only what the destination lacks or holds with another size or checksum "
    "(as sync's --adopt checksum).")]
ChecksumOpt = Annotated[bool, typer.Option(
    "--checksum", help="Like --skip-existing (rclone's name for comparing by size and checksum).")]

ADOPT = ("checksum", "deep", "off")


def with_object_flags(settings: Settings, destination: str, *, content_type: str | None = None,
                      metadata: list[str] | None = None, no_metadata: bool = False,
                      storage_class: str | None = None, kms_key: str | None = None,
                      bucket_key: bool | None = None, encryption_scope: str | None = None) -> Settings:
    """``settings`` with the flags given applied (bridge.attributes.with_objects)."""
    from bridge.attributes import parse_pairs, with_objects
    if content_type is not None and not content_type.strip():
        raise InvalidOption("--content-type is empty: give a type such as application/json")
    objects: dict[str, Any] = {}
    if no_metadata:
        objects["metadata"] = "off"
    if content_type is not None:
        objects["content_type"] = content_type
    if metadata:
        objects["set_metadata"] = parse_pairs(metadata)
    return with_objects(settings, destination, objects, storage_class=storage_class, kms_key=kms_key,
                        bucket_key=bucket_key, encryption_scope=encryption_scope)


def adopt_mode(adopt: str | None, skip_existing: bool = False, checksum: bool = False,
               default: str | None = "off") -> str | None:
    if adopt is not None and adopt not in ADOPT:
        raise InvalidOption(f"--adopt {adopt!r}: use one of {', '.join(ADOPT)}")
    if adopt is not None:
        return adopt
    return "checksum" if (skip_existing or checksum) else default
