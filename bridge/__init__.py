"""bridge: move ML corpora and checkpoints between local/Lustre, S3, GCS and Azure Blob."""

__version__ = "0.1.0"
