"""Replication policies run by the service: beat fires a policy, a worker runs it as jobs.

    beat ──(policy due)──> bridge.policy ──> fire(): list the source, keep the window, price
    every (destination, checkpoint) sync; over max_cost_usd: a failed job, nothing sent; over
    the policy's monthly budget: a job awaiting approval; else a replicate job, whose children
    are one sync per destination and checkpoint (include/exclude, mirror or append-only,
    verify mode of the policy) ──(last child ends)──> ended(): retention (only once the newest
    checkpoint is verified at every destination), per-destination state, spend and metrics.

The policy file is read by beat (``mcbridge beat --policies FILE``) and travels in the task, as
schedules' specs do; the decisions are policies/replication.py's, the I/O bridge/replicator.py's.
The run's record keeps the policy and the window it was started for (``policy_spec``,
``checkpoints``), both covered by the run's signature (workers/auth.py): its children are started
from them and its end checks them again before retention deletes anything.

Per destination, in ``<ns>:policy:<name>`` (field: the destination URL; JSON): when the policy
last ran there (``last_run``, ``job``, ``ok``), the newest checkpoint verified there and when
(``newest_verified``, ``verified_at``) and how long after its commit (``commit_to_verified_s``,
the run's end from the checkpoint's commit), the newest at the source and how many source checkpoints
are newer than the verified one (``newest_source``, ``lag_checkpoints``), what retention removed.
Spend per destination and month is in ``<ns>:policy-spend:<YYYY-MM>``; the policy's own monthly
budget is the budget of its name (workers/redisbudgets.py). The lag of each run's end, per
destination, is kept in a short list, ``<ns>:policy:<name>:lag:<destination>`` (JSON samples
``{"at", "lag", "job"}``, oldest first, the newest ``LAG_SAMPLES``): the status page's lag chart.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import timedelta
from typing import Any

from bridge.policies.cost import money
from bridge.errors import BridgeError
from bridge.redact import redact
from bridge.policies import replication as rules
from bridge.policies.replication import NamedPolicy, Policy
from bridge.workers import metrics
from bridge.policies.cost.budgets import month
from bridge.workers.jobrecords import ACTIVE, iso
from bridge.workers.keys import Keys
from bridge.workers.specs import JobSpec, parse_spec

log = logging.getLogger(__name__)

POLICY = "bridge.policy"

# Lag samples kept per policy and destination: a day of runs every 15 minutes.
LAG_SAMPLES = 96


# -- beat ------------------------------------------------------------------------------------

def celery_schedule(schedule: rules.Schedule, app=None, nowfun=None):
    """The Celery schedule of a policy's ``schedule`` (cron, or every N s/m/h/d)."""
    from celery.schedules import crontab
    from celery.schedules import schedule as every
    from bridge.workers.crons import CRON_FIELDS
    from bridge.workers.settings import parse_duration
    if schedule.cron is not None:
        return crontab(**dict(zip(CRON_FIELDS, schedule.cron.split())), app=app, nowfun=nowfun)
    return every(timedelta(seconds=parse_duration(schedule.every)), app=app, nowfun=nowfun)


def beat_entries(policies: list[NamedPolicy], control_queue: str, app=None, nowfun=None) -> dict[str, dict[str, Any]]:
    """Celery ``beat_schedule`` entries sending ``bridge.policy`` for each policy with a schedule."""
    from bridge.workers.auth import BeatSignature
    return {f"mcbridge-policy:{p.name}": {"task": POLICY, "schedule": celery_schedule(p.policy.schedule, app, nowfun),
                                          "args": [p.name, p.policy.model_dump(mode="json"),
                                                   BeatSignature(POLICY, p.name, p.policy.model_dump(mode="json"))],
                                          "options": {"queue": control_queue}}
            for p in policies if p.policy.schedule is not None}


def check_crons(policies: list[NamedPolicy]) -> list[str]:
    """Cron expressions Celery refuses (the policy file's own check counts fields only)."""
    from bridge.workers.crons import check_cron
    problems = []
    for p in policies:
        if p.policy.schedule is not None and p.policy.schedule.cron is not None:
            reason = check_cron(p.policy.schedule.cron)
            if reason:
                problems.append(f"policies.{p.name}.schedule.cron: {reason}")
    return problems


# -- state -----------------------------------------------------------------------------------

class PolicyState:
    def __init__(self, client, keys: Keys):
        self.r, self.keys = client, keys

    def destinations(self, name: str) -> dict[str, dict[str, Any]]:
        return {dst: json.loads(raw) for dst, raw in self.r.hgetall(self.keys.policy(name)).items()}

    def put(self, name: str, destination: str, state: dict[str, Any]) -> None:
        state = {**state, "errors": [redact(e) for e in state.get("errors", [])]}   # they quote SDK errors
        self.r.hset(self.keys.policy(name), destination, json.dumps(state))

    def _lag_key(self, name: str, destination: str) -> str:
        return f"{self.keys.policy(name)}:lag:{destination}"   # a policy's name holds no ':'

    def record_lag(self, name: str, destination: str, at: float, lag: int | None, job: str) -> None:
        """One sample of a run's end, the list trimmed to the newest ``LAG_SAMPLES``."""
        key = self._lag_key(name, destination)
        pipe = self.r.pipeline()
        pipe.rpush(key, json.dumps({"at": at, "lag": lag, "job": job}))
        pipe.ltrim(key, -LAG_SAMPLES, -1)
        pipe.execute()

    def lag_history(self, name: str, destination: str) -> list[dict[str, Any]]:
        """The samples of ``record_lag``, oldest first (Redis's word, as the rest of the state)."""
        out = []
        for raw in self.r.lrange(self._lag_key(name, destination), 0, -1):
            try:
                sample = json.loads(raw)
                out.append({"at": float(sample["at"]), "lag": sample["lag"], "job": str(sample.get("job", ""))})
            except (TypeError, ValueError, KeyError):
                continue   # not a sample of ours: left out of the chart
        return out

    def add_spend(self, name: str, destination: str, usd: float) -> None:
        if usd:
            self.r.hincrbyfloat(self.keys.policy_spend(month()), f"{name} {destination}", usd)

    def spend(self, name: str, when: str | None = None) -> dict[str, float]:
        raw = self.r.hgetall(self.keys.policy_spend(when or month()))
        prefix = f"{name} "
        return {k[len(prefix):]: float(v) for k, v in raw.items() if k.startswith(prefix)}


def _spec(policy: Policy) -> JobSpec:
    return parse_spec({"kind": "replicate", "source": policy.source, "destinations": policy.destinations,
                       "delete": policy.mode == "mirror", "max_delete": policy.max_delete, "verify": policy.verify,
                       "include": policy.include or None, "exclude": policy.exclude or None,
                       "placement": {url: placed.model_dump(exclude_none=True)
                                     for url, placed in policy.placement.items()} or None})


def _fail(svc, spec: JobSpec, name: str, problem: str, **fields: Any) -> str:
    """A run that cannot start: a failed job saying why, nothing queued."""
    job_id = svc.jobs.create(spec, queue=svc.ws.control_queue, schedule=name, state="queued")
    svc.jobs.update(job_id, **{"policy": name, **fields})
    svc._end(job_id, "failed", [problem])
    return job_id


# -- a run -------------------------------------------------------------------------------------

def fire(svc, name: str, policy_dict: dict, fire_id: str, auth: Any = None) -> dict:
    """A policy is due: price its run and start it (unless its last run is still going). The
    message is beat's, signed for a tenant (workers/gate.py), whose scope the policy must be in."""
    from bridge.workers.auth import Refused
    if not svc.r.set(svc.keys.once(fire_id), "1", nx=True, ex=86400):
        return {"skipped": "duplicate delivery"}
    try:
        tenant = svc.gate.message(POLICY, name, policy_dict, auth)
    except Refused as exc:
        svc.gate.audit.record("refused", task=fire_id, policy=name, reason=str(exc))
        return {"refused": str(exc)}
    last = svc.r.hget(svc.keys.schedule(f"policy:{name}"), "job")
    if last and svc.jobs.state(last) in ACTIVE:
        log.info("policy %s: run %s is still %s; not starting another", name, last, svc.jobs.state(last))
        return {"skipped": "previous run active", "job": last}
    job_id = start(svc, name, Policy.model_validate(policy_dict), tenant)
    svc.r.hset(svc.keys.schedule(f"policy:{name}"), mapping={"job": job_id, "fired": time.time()})
    log.info("policy %s: started job %s", name, job_id)
    return {"job": job_id}


def start(svc, name: str, policy: Policy, tenant: str) -> str:
    """Plan and price one run of a policy for ``tenant``; queue it, hold it for approval, or refuse
    it. Nothing is listed before the policy's places are found in the tenant's scope."""
    from bridge import pricing
    from bridge.policies.cost import usage as counting
    from bridge import replicator as run
    from bridge.workers.auth import Refused
    from bridge.workers.gate import Admitted
    spec = _spec(policy)
    try:
        svc.gate.scope(Admitted(tenant, "", name), reads=[policy.source], writes=policy.destinations, budget=name)
    except Refused as exc:
        svc.gate.audit.record("refused", tenant=tenant, policy=name, source=policy.source,
                              destinations=policy.destinations, reason=str(exc))
        return _fail(svc, spec, name, f"policy {name} refused: {exc}")
    settings = svc.settings_for(spec)
    try:
        readiness = run.survey(policy, settings)
        kept, plans, _unreachable = run.prepare(policy, settings, readiness)
        from bridge import routes
        for plan in plans.values():   # priced by the route each sync's workers will choose
            routes.choose(plan, settings)
        usd = pricing.total_cost([p.usage() for p in plans.values()], settings)
    except BridgeError as exc:
        return _fail(svc, spec, name, f"policy {name}: {exc}")
    if not kept:
        pending = rules.waiting(readiness)
        return _fail(svc, spec, name, f"policy {name}: no committed checkpoint under {policy.source} matches "
                                      f"{policy.checkpoints!r}" + (f" ({len(pending)} not committed yet)"
                                                                   if pending else ""))
    policy_fields = {"policy": name, "policy_spec": json.dumps(policy.model_dump(mode="json")),
                     "checkpoints": json.dumps(kept), "waiting": json.dumps(rules.waiting(readiness)),
                     "committed_at": json.dumps({c: readiness[c].committed_at for c in kept})}
    if policy.max_cost_usd is not None and money.over(usd, policy.max_cost_usd):
        shown, cap = money.usd_apart(usd, policy.max_cost_usd)
        return _fail(svc, spec, name, f"policy {name} refused: estimated {shown} for {len(plans)} syncs of "
                                      f"{', '.join(kept)} is over max_cost_usd {cap}; "
                                      f"nothing was sent", estimate_usd=repr(usd), **policy_fields)
    return svc.submit(spec, schedule=name, budget=name, estimate=usd, extra=policy_fields, tenant=tenant)


def _loaded(record, spec: JobSpec) -> tuple[str | None, Policy, list[str]]:
    """The policy a run was started for and the window it keeps, from the record the gate
    checked: the very text its signature covers (workers/auth.py), not read from Redis again.
    Refused unless its places are those of the run's signed spec."""
    from bridge.workers.auth import Refused
    fields = record.steering
    try:
        policy = Policy.model_validate(json.loads(fields["policy_spec"]))
        kept = json.loads(fields["checkpoints"])
    except (KeyError, TypeError, ValueError):   # pydantic's ValidationError is a ValueError
        raise Refused(f"job {record.id}: its record holds no policy that can be run") from None
    if policy.source != spec.source or policy.destinations != list(spec.destinations):
        raise Refused(f"job {record.id}: its policy's places are not those of its signed spec")
    return fields.get("policy"), policy, kept


def pairs(policy: Policy, kept: list[str]) -> list[tuple[str, str]]:
    """(destination, checkpoint) of each child job, in the children's order."""
    return [(dst, ckpt) for dst in policy.destinations for ckpt in kept]


def start_children(svc, record, spec: JobSpec, who) -> dict:
    """One sync per destination and checkpoint of the window, each verified as the policy says,
    each signed for the run's tenant."""
    name, policy, kept = _loaded(record, spec)
    wanted = pairs(policy, kept)
    children = children_of(record.id, len(wanted))
    svc.r.hsetnx(svc.keys.job(record.id), "children", json.dumps(children))   # for people and the parent's spend
    svc.r.hsetnx(svc.keys.job(record.id), "children_pending", len(children))
    svc.jobs.update(record.id, tasks_total=len(children))
    svc.jobs.transition(record.id, "running", ("planning",))
    for child_id, (dst, ckpt) in zip(children, wanted):
        if svc.jobs.state(child_id) in (None, "queued"):
            child = child_spec(spec, dst, ckpt)
            svc.submit(child, parent=record.id, job_id=child_id, schedule=record.schedule, extra={"policy": name},
                       tenant=who.tenant, scope_budget=who.budget)
    return {"children": children}


def ended(svc, parent) -> None:
    """The last child of a policy run ended: retention, per-destination state, the run's verdict.
    The run's signature is checked again first, over the policy and window its record holds now:
    a record changed since it was signed deletes nothing, and the run fails, refused. A child
    counts only as the signed sync of its checkpoint to its destination (``_child``)."""
    from bridge import replicator as run
    from bridge.workers.auth import Refused
    try:
        who = svc.gate.check(parent)
        run_spec = JobSpec.from_dict(parent.spec)
        name, policy, kept = _loaded(parent, run_spec)
    except Refused as exc:
        _refused(svc, parent, str(exc))
        return
    verified: dict[str, dict[str, bool]] = {dst: {} for dst in policy.destinations}
    spent: dict[str, float] = dict.fromkeys(policy.destinations, 0.0)
    problems: dict[str, list[str]] = {dst: [] for dst in policy.destinations}
    wanted = pairs(policy, kept)
    for child_id, (dst, ckpt) in zip(children_of(parent.id, len(wanted)), wanted):
        child, refused = _child(svc, child_id, child_spec(run_spec, dst, ckpt))
        ok = refused is None and child.state == "succeeded" and \
            (policy.verify == "none" or bool((child.verify or {}).get("ok")))
        verified[dst][ckpt] = ok
        spent[dst] += (child.spent_usd or 0.0) if refused is None else 0.0
        if not ok:
            why = refused or (child.errors[0] if child.errors else child.state)
            problems[dst].append(f"{dst}{ckpt}/: {why}")
    settings = svc.settings_for(_spec(policy))
    _landed(policy, kept, verified, problems, settings)
    try:   # the source now: retention counts only checkpoints still committed there by evidence
        found = run.listing(policy.source, settings)
        readiness = run.survey(policy, settings, found=found)
        source_now = rules.committed(readiness)
    except BridgeError:   # not listed: no checkpoint is proven, so retention removes nothing
        found, readiness, source_now = {}, {}, set(kept)
    prints = {c: run.fingerprint(found[c]) for c in kept if c in found}
    try:   # retention deletes at the destinations: the run's tenant must still be allowed to write there
        svc.gate.scope(who, reads=[policy.source], writes=policy.destinations, budget=who.budget)
        removed, unlisted = run.retain(policy, kept, verified, settings, readiness)
    except Refused as exc:
        removed, unlisted = {}, {dst: f"retention refused: {exc}" for dst in policy.destinations}
    except BridgeError as exc:
        removed, unlisted = {}, {dst: str(exc) for dst in policy.destinations}
    copies, enough = rules.outcome(policy, kept, verified)

    state = PolicyState(svc.r, svc.keys)
    before = state.destinations(name)
    commits = json.loads(parent.steering.get("committed_at") or "{}")
    now = time.time()
    replicas = {}
    for dst in policy.destinations:
        prev = before.get(dst, {})
        proven = [c for c in kept if verified[dst].get(c)]
        if prev.get("newest_verified") and prev["newest_verified"] not in removed.get(dst, []):
            proven.append(prev["newest_verified"])
        newest = max(proven, key=rules.natural_key) if proven else None
        renewed = newest is not None and verified[dst].get(newest)
        lag = rules.lag(policy, source_now, [newest] if newest else [])
        commit = commits.get(newest) if renewed and newest in kept and not prev.get("newest_verified") == newest else None
        # A checkpoint verified here before from a source listed otherwise than now was copied and
        # verified again by this run: said so, as the in-process --watch says it.
        was = prev.get("sources") or {}
        again = {c: f"changed at the source after it was verified at {dst}: copied and verified again"
                 for c in kept if verified[dst].get(c) and c in was and c in prints and was[c] != prints[c]}
        row = {"last_run": iso(now), "job": parent.id, "ok": all(verified[dst].get(c) for c in kept),
               "sources": {**{c: v for c, v in was.items() if c in kept and not verified[dst].get(c)},
                           **{c: prints[c] for c in kept if verified[dst].get(c) and c in prints}},
               "revisited": again,
               "checkpoints": verified[dst], "newest_verified": newest,
               "verified_at": iso(now) if renewed else prev.get("verified_at"),
               "newest_source": lag["newest_source"], "lag_checkpoints": lag["lag_checkpoints"],
               "commit_to_verified_s": round(max(0.0, now - commit), 1) if commit is not None
               else prev.get("commit_to_verified_s"),
               "removed": removed.get(dst, []), "spent_usd": money.usd_number(spent[dst]),
               "errors": (problems[dst] + ([unlisted[dst]] if dst in unlisted else []))[:5]}
        state.put(name, dst, row)
        state.record_lag(name, dst, now, lag["lag_checkpoints"], parent.id)
        state.add_spend(name, dst, spent[dst])
        replicas[dst] = row
        metrics.replica(name, dst, lag=lag["lag_checkpoints"],
                        verified_at=now if renewed else _ts(prev.get("verified_at")), spent=spent[dst],
                        commit_to_verified=max(0.0, now - commit) if commit is not None else None,
                        committed_at=getattr(readiness.get(lag["newest_source"]), "committed_at", None),
                        verified_committed_at=commits.get(newest) or getattr(readiness.get(newest), "committed_at", None),
                        rpo=policy.rpo_s)
    svc.jobs.update(parent.id, replicas=replicas, verified_copies=copies, copies_needed=policy.copies_needed)
    errors = [p for dst in policy.destinations for p in problems[dst]] + \
             [f"{dst}: not listed for retention: {why}" for dst, why in unlisted.items()]
    if not enough:
        errors.insert(0, f"policy {name}: {kept[-1]} verified at {copies} of {len(policy.destinations)} "
                         f"destinations, {policy.copies_needed} needed")
    svc._end(parent.id, "succeeded" if enough else "failed", errors or None)


def _landed(policy: Policy, kept: list[str], verified: dict[str, dict[str, bool]],
            problems: dict[str, list[str]], settings) -> None:
    """The newest checkpoint of the window counts as verified at a destination (what lets
    retention remove older ones everywhere) only where the destination holds bridge's commit
    record of it: a child's state and verify summary are its record's word, in Redis; the record
    at the destination is the copy's own, written when it committed. One listing per destination."""
    from bridge import manifest
    from bridge.stores import get_store
    from bridge.urls import parse
    newest = kept[-1] if kept else None
    for dst in policy.destinations:
        if not verified[dst].get(newest):
            continue
        root = parse(f"{dst}{newest}/").as_prefix()
        try:
            there, why = manifest.committed(get_store(root, settings), root), ""
        except BridgeError as exc:
            there, why = False, f": {exc}"
        if not there:
            verified[dst][newest] = False
            problems[dst].append(f"{dst}{newest}/: its job says it was verified, but no commit record of bridge's "
                                 f"is there{why}")


def children_of(run_id: str, count: int) -> list[str]:
    """The ids of a run's children, in the order of ``pairs``: made from the run's id, so that
    its end does not take the record's list of them (Redis's word) for which jobs to look at."""
    return [f"{run_id}-{n}" for n in range(1, count + 1)]


def child_spec(spec: JobSpec, dst: str, ckpt: str) -> JobSpec:
    """The sync of checkpoint ``ckpt`` of a run (its spec ``spec``) to destination ``dst``."""
    return spec.for_destination(f"{dst}{ckpt}/", source=f"{spec.source}{ckpt}/")


def _child(svc, child_id: str, expected: JobSpec) -> tuple[Any, str | None]:
    """(the child's record, None) when it is the signed, admitted job ``expected``; else (the
    record or None, why not). Its state and verify summary are its record's, taken on trust: no
    signature covers what a job did, only what it was asked."""
    from bridge.workers.auth import Refused
    child = svc.jobs.get(child_id)
    if child is None:
        return None, "never started"
    try:
        svc.gate.check(child)
    except Refused as exc:
        return child, f"refused: {exc}"
    if child.spec != expected.to_dict():
        return child, f"refused: job {child_id} is not the sync of {expected.source} to {expected.destination}"
    return child, None


def _refused(svc, parent, reason: str) -> None:
    """A run whose record its signature does not cover: audited, failed, nothing removed."""
    spec = parent.spec if isinstance(parent.spec, dict) else {}
    svc.gate.audit.record("refused", job=parent.id, tenant=parent.tenant, task=f"{parent.id}.ended",
                          kind=parent.kind, policy=parent.policy, source=spec.get("source"),
                          destinations=spec.get("destinations"), reason=reason)
    svc._end(parent.id, "failed", [f"refused: {reason}; retention removed nothing"])


def _ts(text: str | None) -> float | None:
    if not text:
        return None
    import calendar
    return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))
