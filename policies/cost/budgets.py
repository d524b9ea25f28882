"""The rules of a monthly budget, as pure functions: what a limit may be, and which month a
spend belongs to. The store that keeps the limits, spend and reservations (and admits jobs
against them atomically) is the service's, in Redis: bridge.workers.redisbudgets.
"""

from __future__ import annotations

import math
import time

from bridge.errors import InvalidOption


def month(ts: float | None = None) -> str:
    """The month a spend at ``ts`` (now by default) is charged to: ``YYYY-MM``, in UTC."""
    return time.strftime("%Y-%m", time.gmtime(time.time() if ts is None else ts))


def check(name: str, usd: float) -> None:
    """A budget needs a name and a finite limit of 0 or more: nan would admit every job (it
    compares false with every estimate), inf likewise, and an empty name is no budget."""
    if not name.strip():
        raise InvalidOption("the budget name is empty: name it, e.g. after the team or policy it limits")
    if name != name.strip() or any(not c.isprintable() for c in name):
        raise InvalidOption(f"budget name {name!r}: no spaces at its ends and no control characters")
    if not (math.isfinite(usd) and usd >= 0):
        raise InvalidOption(f"budget {name}: {usd} is not a limit: give a finite number of US dollars, 0 or more")
