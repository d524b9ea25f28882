"""bridge: move ML corpora and checkpoints between local/Lustre, S3, GCS and Azure Blob.

From Python: ``bridge.copy``, ``sync``, ``verify``, ``check`` and ``replicate`` (bridge/api.py)
and ``publish`` of a Hugging Face folder (bridge/pretrained.py), loaded on first use so that
``import bridge`` stays cheap; failures are ``bridge.errors``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bridge.version import __version__

API = ("copy", "sync", "verify", "check", "replicate")
__all__ = ["__version__", *API, "publish"]

if TYPE_CHECKING:
    from bridge.api import check, copy, replicate, sync, verify  # noqa: F401
    from bridge.pretrained import publish  # noqa: F401


def __getattr__(name: str) -> Any:
    if name in API:
        from bridge import api
        return getattr(api, name)
    if name == "publish":
        from bridge.pretrained import publish
        return publish
    raise AttributeError(f"module 'bridge' has no attribute {name!r}")
