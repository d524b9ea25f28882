"""Monthly budgets for the service, kept in Redis next to the jobs.

    <ns>:budgets                 hash: budget name -> monthly limit in USD
    <ns>:spend:<YYYY-MM>         hash: budget name -> USD spent that month (float)

A job submitted with ``--budget NAME`` carries the estimate made when it was submitted
(bridge/costing.py). When the month's spend plus the estimate would pass the limit, the job is
created in state ``awaiting-approval`` and nothing is queued until ``mcbridge jobs approve ID``
(or it is cancelled). When a job ends, what actually ran is charged to its budget: the worker
prices the requests and bytes of the units that finished (workers/executor.py ``_spent``), so a
job that found files already there, or failed half-way, spends less than its estimate. A
replication policy's runs are charged to the budget of the policy's name (workers/replicas.py).
"""

from __future__ import annotations

import math
import time

from bridge.workers.keys import Keys


def month(ts: float | None = None) -> str:
    return time.strftime("%Y-%m", time.gmtime(time.time() if ts is None else ts))


def check(name: str, usd: float) -> None:
    """A budget needs a name and a finite limit of 0 or more: nan would admit every job (it
    compares false with every estimate), inf likewise, and an empty name is no budget."""
    from bridge.errors import InvalidOption
    if not name.strip():
        raise InvalidOption("the budget name is empty: name it, e.g. after the team or policy it limits")
    if name != name.strip() or any(not c.isprintable() for c in name):
        raise InvalidOption(f"budget name {name!r}: no spaces at its ends and no control characters")
    if not (math.isfinite(usd) and usd >= 0):
        raise InvalidOption(f"budget {name}: {usd} is not a limit: give a finite number of US dollars, 0 or more")


class Budgets:
    def __init__(self, client, keys: Keys):
        self.r = client
        self.keys = keys

    @property
    def _limits(self) -> str:
        return f"{self.keys.namespace}:budgets"

    def _spend(self, when: str) -> str:
        return f"{self.keys.namespace}:spend:{when}"

    def set(self, name: str, usd: float) -> None:
        check(name, usd)
        self.r.hset(self._limits, name, repr(float(usd)))

    def limit(self, name: str) -> float | None:
        raw = self.r.hget(self._limits, name)
        return float(raw) if raw is not None else None

    def spent(self, name: str, when: str | None = None) -> float:
        return float(self.r.hget(self._spend(when or month()), name) or 0.0)

    def all(self, when: str | None = None) -> dict[str, dict[str, float | None]]:
        limits = self.r.hgetall(self._limits)
        spend = self.r.hgetall(self._spend(when or month()))
        return {name: {"limit_usd": float(limits[name]) if name in limits else None,
                       "spent_usd": float(spend.get(name, 0.0))} for name in sorted(set(limits) | set(spend))}

    def admits(self, name: str, estimate: float) -> bool:
        """Whether a job estimated at ``estimate`` fits the month's rest of budget ``name``."""
        cap = self.limit(name)
        return cap is None or self.spent(name) + estimate <= cap

    def charge(self, name: str, usd: float) -> float:
        return float(self.r.hincrbyfloat(self._spend(month()), name, usd))
