"""The Redis budget store: the I/O half of the service's monthly budgets (their rules, the
limit a budget takes and the month a spend falls in, are bridge.policies.cost.budgets).

    <ns>:budgets                 hash: budget name -> monthly limit in USD
    <ns>:spend:<YYYY-MM>         hash: budget name -> USD spent that month (float)
    <ns>:reserved                hash: budget name -> USD held by admitted jobs that have not ended
    <ns>:reservations            hash: job id -> "<budget>\t<USD>": what each of them holds

A job submitted with ``--budget NAME`` carries the estimate made when it was submitted
(bridge/pricing.py). It is created ``awaiting-approval``; admission (``admit``) is one Lua
script: when the month's spend, plus what the jobs admitted before it hold (queued and running
alike), plus its estimate fits the limit, it reserves the estimate and moves the job to
``queued`` in the same step, so ten jobs submitted at once against a budget for three admit
exactly three. The others wait until ``mcbridge jobs approve ID`` (which reserves without the
check) or a cancel. When a job ends (or is cancelled), ``settle`` swaps its reservation for what
it spent, once: the worker prices the requests and bytes that job's stores were sent (metered
at the client, bridge/meter.py), so a job that found files already there, or failed half-way,
spends less than its estimate. A replication policy's runs are charged to the budget of the
policy's name (workers/replicas.py).

The estimate is the submitter's, signed with the job (workers/auth.py). A worker checks, before
the job's first plan, that it holds the reservation of that budget and at least that estimate
(workers/gate.py: a job moved to queued by hand holds none), and prices the plan itself before
any task is sent: a plan priced well above what the job holds must fit the rest of the budget
(``cover`` reserves the difference, atomically) or the job is refused. The limits, spend and
reservations here are Redis's, taken on trust: what checks them is that only admission and
``cover`` write a reservation, not a signature.
"""

from __future__ import annotations

import time

from bridge.policies.cost.budgets import check, month
from bridge.workers.keys import Keys


# KEYS: limits, spend (this month), reserved, reservations, the job's record
# ARGV: budget, estimate, force ("1": approved by a person, no check), now, job id
_ADMIT = """
local state = redis.call('HGET', KEYS[5], 'state')
if state ~= 'awaiting-approval' then return {0, state or ''} end
local est = tonumber(ARGV[2])
local cap = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[3] ~= '1' and cap then
  local spent = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
  local held = tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')
  if spent + held + est > tonumber(cap) + 1e-12 then return {0, state} end
end
redis.call('HINCRBYFLOAT', KEYS[3], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[4], ARGV[5], ARGV[1] .. '\t' .. ARGV[2])
redis.call('HSET', KEYS[5], 'state', 'queued', 'updated', ARGV[4])
return {1, state}
"""

# KEYS: reserved, reservations, spend (this month); ARGV: job id, USD spent
_SETTLE = """
local held = redis.call('HGET', KEYS[2], ARGV[1])
if not held then return 0 end
local tab = string.find(held, '\t', 1, true)
local name, usd = string.sub(held, 1, tab - 1), string.sub(held, tab + 1)
redis.call('HDEL', KEYS[2], ARGV[1])
local left = tonumber(redis.call('HINCRBYFLOAT', KEYS[1], name, '-' .. usd))
if left < 1e-12 then redis.call('HDEL', KEYS[1], name) end
if tonumber(ARGV[2]) > 0 then redis.call('HINCRBYFLOAT', KEYS[3], name, ARGV[2]) end
return 1
"""


# KEYS: limits, spend (this month), reserved, reservations; ARGV: job id, budget, USD the job
# should hold now. Raises what the job holds to that when it fits the budget (or already holds it).
_COVER = """
local held = redis.call('HGET', KEYS[4], ARGV[1])
if not held then return 0 end
local tab = string.find(held, '\t', 1, true)
if string.sub(held, 1, tab - 1) ~= ARGV[2] then return 0 end
local more = tonumber(ARGV[3]) - tonumber(string.sub(held, tab + 1))
if more <= 0 then return 1 end
local cap = redis.call('HGET', KEYS[1], ARGV[2])
if cap then
  local spent = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0')
  local reserved = tonumber(redis.call('HGET', KEYS[3], ARGV[2]) or '0')
  if spent + reserved + more > tonumber(cap) + 1e-12 then return 0 end
end
redis.call('HINCRBYFLOAT', KEYS[3], ARGV[2], tostring(more))
redis.call('HSET', KEYS[4], ARGV[1], ARGV[2] .. '\t' .. ARGV[3])
return 1
"""


class Budgets:
    def __init__(self, client, keys: Keys):
        self.r = client
        self.keys = keys
        self._admit = client.register_script(_ADMIT)
        self._settle = client.register_script(_SETTLE)
        self._cover = client.register_script(_COVER)

    @property
    def _reserved(self) -> str:
        return f"{self.keys.namespace}:reserved"

    @property
    def _reservations(self) -> str:
        return f"{self.keys.namespace}:reservations"

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

    def reserved(self, name: str) -> float:
        """What the admitted jobs of budget ``name`` that have not ended hold."""
        return max(0.0, float(self.r.hget(self._reserved, name) or 0.0))

    def all(self, when: str | None = None) -> dict[str, dict[str, float | None]]:
        limits = self.r.hgetall(self._limits)
        spend = self.r.hgetall(self._spend(when or month()))
        held = self.r.hgetall(self._reserved)
        return {name: {"limit_usd": float(limits[name]) if name in limits else None,
                       "spent_usd": float(spend.get(name, 0.0)),
                       "reserved_usd": max(0.0, float(held.get(name, 0.0)))}
                for name in sorted(set(limits) | set(spend) | set(held))}

    def admit(self, job_id: str, job_key: str, name: str, estimate: float, *, force: bool = False) -> tuple[bool, str]:
        """Atomically: if the job (its record at ``job_key``) awaits approval and its estimate
        fits the rest of budget ``name`` (spend this month and every reservation counted), or
        ``force``, reserve the estimate and move it to queued. (admitted?, the state it was in)."""
        moved, state = self._admit(keys=[self._limits, self._spend(month()), self._reserved, self._reservations, job_key],
                                   args=[name, repr(float(estimate)), "1" if force else "0", time.time(), job_id])
        return bool(moved), state

    def cover(self, job_id: str, name: str, usd: float) -> bool:
        """Atomically: a job admitted against budget ``name`` now holds ``usd`` (its worker priced
        its plan above what it was admitted for), when the difference fits the rest of the budget
        as admission counts it, or it holds that much already. False: it does not fit (or the job
        holds no reservation of that budget); nothing changed."""
        return bool(self._cover(keys=[self._limits, self._spend(month()), self._reserved, self._reservations],
                                args=[job_id, name, repr(float(usd))]))

    def settle(self, job_id: str, spent: float) -> bool:
        """The job has ended: its reservation is released and ``spent`` charged to its budget
        this month, once (False: it held nothing, or was settled already)."""
        return bool(self._settle(keys=[self._reserved, self._reservations, self._spend(month())],
                                 args=[job_id, repr(max(0.0, float(spent)))]))

    def holds(self, job_id: str) -> bool:
        return self.r.hexists(self._reservations, job_id)

    def reservation(self, job_id: str) -> tuple[str, float] | None:
        """(budget, USD) that job ``job_id`` holds since its admission, or None. What is in Redis,
        taken on trust: a worker checks it against the job's signed budget and estimate
        (workers/gate.py), not that the admission that wrote it was not written by hand too."""
        held = self.r.hget(self._reservations, job_id)
        if held is None:
            return None
        name, _, usd = held.rpartition("\t")
        try:
            return name, float(usd)
        except ValueError:
            return name, float("nan")
