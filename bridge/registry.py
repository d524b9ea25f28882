"""Optional parts of bridge (stores, shard formats) are named as "module:attribute" with the pip
extra that installs what they import, and loaded only when used. Plugins (the service's
commands) fill hooks bridge defines here, found through an entry-point group."""

from __future__ import annotations

import importlib
import json
from typing import Any, Callable
from urllib.parse import unquote, urlparse

from bridge.errors import MissingBackend

DISTRIBUTION = "cloud-artifact-bridge"


def install_hint(extra: str) -> str:
    """The command that adds ``extra`` to this installation, in the form it was installed by
    (pip's record of where it came from, ``direct_url.json``): ``pip install -e 'CLONE[extra]'``
    for a clone installed editable, ``pip install 'PATH[extra]'`` for one installed from a folder
    or a wheel file. Otherwise both forms: the distribution is on no package index, so a bare
    ``pip install 'cloud-artifact-bridge[extra]'`` would install nothing, or whoever took the name."""
    from importlib import metadata   # (imported here: at the top it cost every command 20 ms of start-up)
    records = (dist.read_text("direct_url.json") for dist in metadata.distributions(name=DISTRIBUTION))
    try:   # a clone's own *.egg-info (no record) may come first on the path
        origin = json.loads(next((text for text in records if text), "{}"))
    except ValueError:
        origin = {}
    url = urlparse(origin.get("url", ""))
    if url.scheme == "file":
        editable = "-e " if origin.get("dir_info", {}).get("editable") else ""
        return f"pip install {editable}'{unquote(url.path)}[{extra}]'"
    return (f"from a clone, pip install -e '.[{extra}]'; from a built wheel, "
            f"pip install 'dist/cloud_artifact_bridge-VERSION-py3-none-any.whl[{extra}]'")


def load(target: str, extra: str, what: str) -> Any:
    """The attribute named by ``target``; MissingBackend with an install hint if its extra is not
    installed (``what`` names the feature in the message, e.g. "s3://")."""
    module_name, _, attribute = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise MissingBackend(f"{what} needs the '{extra}' extra: {install_hint(extra)} "
                             f"({exc.name} is missing)") from exc
    return getattr(module, attribute)


# -- plugins: what another package adds to bridge, through hooks bridge defines --------------------
# A plugin is a module named in the PLUGINS entry-point group of its package's metadata, with a
# ``register(hooks)`` that fills some of the hooks below (as pytest plugins implement the hooks
# pytest specifies, and Celery's extensions add commands through "celery.commands"). bridge then
# asks for "what handles X", never for a plugin's function by its name. The service (bridge.workers)
# is such a plugin.
PLUGINS = "mcbridge.service"
HOOKS: dict[str, str] = {
    "commands": "fn(app): adds commands and command groups to mcbridge",
    "policy commands": "fn(group): adds commands to the group of mcbridge policy",
    "warm on a node": "fn(node, items, *, profile, lookahead, wait, broker, timeout) -> summary: queues a cache "
                      "warm for the worker on that node (mcbridge cache warm --node); the first one is used",
}


class Hooks:
    """For each hook bridge defines, the callables plugins added to it, in the order they did."""

    def __init__(self) -> None:
        self._filled: dict[str, list[Callable[..., Any]]] = {name: [] for name in HOOKS}

    def add(self, hook: str, fn: Callable[..., Any]) -> None:
        if hook not in self._filled:   # a plugin's typo would otherwise be a hook nothing calls
            raise ValueError(f"no hook {hook!r}: bridge defines {', '.join(map(repr, HOOKS))}")
        self._filled[hook].append(fn)

    def each(self, hook: str) -> list[Callable[..., Any]]:
        return list(self._filled[hook])

    def first(self, hook: str) -> Callable[..., Any] | None:
        filled = self._filled[hook]
        return filled[0] if filled else None


_plugins: Hooks | None = None


def plugins() -> Hooks:
    """The hooks every installed plugin filled: each entry point of PLUGINS loaded once per
    process, its ``register(hooks)`` called. Only the commands that need a hook ask, so a run of
    one of bridge's own commands neither reads the installed packages' metadata nor imports a plugin."""
    global _plugins
    if _plugins is None:
        from importlib.metadata import entry_points
        hooks = Hooks()
        for found in entry_points(group=PLUGINS):
            found.load().register(hooks)
        _plugins = hooks
    return _plugins
