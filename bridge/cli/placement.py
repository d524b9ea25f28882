"""What a copy writes besides the bytes, as flags of ``cp`` and ``sync``: headers and metadata
(``--content-type``, ``--metadata K=V``, ``--no-metadata``), the destination's storage class and
encryption (``--storage-class``, ``--kms-key``, ``--bucket-key``, ``--encryption-scope``), and
how existing objects at a destination without a manifest are taken over (``--adopt``,
``--skip-existing``, ``--checksum``). Each flag lands in the settings section it overrides, for
the destination's store only, and is checked there (a class the store does not have is bad input)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from bridge.api import ADOPT, adopt_mode, with_object_flags  # noqa: F401 (what the commands use)

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
