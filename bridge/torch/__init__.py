"""bridge in the training loop: PyTorch Distributed Checkpoint saved and loaded through bridge
(``BridgeWriter``, ``BridgeReader``: bridge/torch/dcp.py), saves uploaded behind the step loop
(``resume_pending``, ``wait``: bridge/torch/behind.py), and ``publish`` of a Hugging Face folder
(bridge/pretrained.py, also ``bridge.publish``). PyTorch is an optional extra (``[torch]``): it is
imported only when the writer or reader is first used, and ``publish`` needs none.
"""

from __future__ import annotations

from typing import Any

from bridge.pretrained import publish

_LAZY = {"BridgeWriter": "bridge.torch.dcp", "BridgeReader": "bridge.torch.dcp",
         "resume_pending": "bridge.torch.behind", "wait": "bridge.torch.behind", "pending": "bridge.torch.behind"}


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'bridge.torch' has no attribute {name!r}")
    import importlib
    try:
        module = importlib.import_module(where)
    except ImportError as exc:
        if exc.name is not None and exc.name.split(".")[0] == "torch":
            from bridge.errors import MissingBackend
            from bridge.registry import install_hint
            raise MissingBackend(f"bridge.torch needs PyTorch: {install_hint('torch')}") from None
        raise
    return getattr(module, name)


__all__ = ["BridgeReader", "BridgeWriter", "pending", "publish", "resume_pending", "wait"]
