"""Optional parts of bridge (stores, shard formats) are named as "module:attribute" with the pip
extra that installs what they import, and loaded only when used."""

from __future__ import annotations

import importlib
from typing import Any

from bridge.errors import MissingBackend


def load(target: str, extra: str, what: str) -> Any:
    """The attribute named by ``target``; MissingBackend with an install hint if its extra is not
    installed (``what`` names the feature in the message, e.g. "s3://")."""
    module_name, _, attribute = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise MissingBackend(f"{what} needs the '{extra}' extra: pip install 'cloud-artifact-bridge[{extra}]' "
                             f"({exc.name} is missing)") from exc
    return getattr(module, attribute)
