"""The service's commands, one module per command group:

    daemons.py       mcbridge worker | beat
    submitting.py    mcbridge submit cp|sync|replicate|pack|migrate|unpack
    job_control.py   mcbridge jobs list|status|watch|cancel|limit|approve|audit (and submit --wait)
    tenancy.py       mcbridge service init|add-tenant
    spending.py      mcbridge budgets set|list
    policy_state.py  mcbridge policy status (a command of the core's policy group)
    warming.py       mcbridge cache warm --node (the core's warm, queued for a node's worker)
    status_page.py   mcbridge status serve (the read-only status page, bridge.workers.statuspage)
    connection.py    what they share: settings, the broker checked, the 'service' extra named

The service is a plugin of the CLI: pyproject.toml names this package in the "mcbridge.service"
entry-point group, and bridge.registry.plugins() calls ``register(hooks)`` below, which fills the
hooks the core defines (bridge.registry.HOOKS). The core never names a command or a function of
this package. Each group's module is imported only when its hook is called, and Celery, Redis and
the rest only inside the commands, so ``mcbridge --help`` stays fast. Settings come from
``bridge.workers.settings`` (environment), with the flags winning; a bad value, a bad URL or an
unreachable broker is refused on one line before anything is queued.
"""

from __future__ import annotations

import importlib

from bridge.registry import Hooks

# Top-level commands and groups, in the order --help lists them.
GROUPS = ("daemons", "submitting", "tenancy", "spending", "job_control", "status_page")


def register(hooks: Hooks) -> None:
    hooks.add("commands", _add_commands)
    hooks.add("policy commands", lambda policy_group: _command_module("policy_state").register(policy_group))
    hooks.add("warm on a node", lambda *args, **kwargs: _command_module("warming").submit_warm(*args, **kwargs))


def _command_module(name: str):
    return importlib.import_module(f"{__name__}.{name}")


def _add_commands(app) -> None:
    for name in GROUPS:
        _command_module(name).register(app)
