"""What a worker checks before it touches anything for a job, and the audit log of what it decided.

    plan       the job's signature (workers/auth.py: over its spec and every record field that
               steers it, a policy run's policy and window among them), its expiry, its id
               admitted once (SET NX ``<ns>:admitted:<job>``, a MAC of the job's digest with
               its tenant's key, so a mark written by hand admits nothing); a job charged to a budget, the
               reservation its admission made (that budget, its signed estimate: one moved to
               queued by hand holds none); then its source and destinations against its
               tenant's scope (policies/tenants.py) and this worker's local roots; after
               listing, before anything is written, every file the plan reads or writes, and
               the route chosen
    transfer   the job's signature and admission, the planner's signature over the task's slice
               of the plan, and every file in that slice (a slice its planner runs itself, from
               memory, was checked with the plan)
    finalize   the job's signature and admission, and what the manifest and verify touch
    a policy run's end   its signature and admission again, before retention deletes anything
               (workers/replicas.py), and the tenant's scope over the policy's places
    scheduled, policy   beat's signature over the message, its expiry, its nonce used once

Local paths are resolved before the check: links and '..' (``os.path.realpath``, which resolves
the deepest part that exists, so a destination not made yet is judged by the real folder it
would land in). The worker's roots and the tenants' local prefixes are resolved the same way.

Every decision goes to the audit stream ``<ns>:audit`` (XADD, oldest trimmed past
``BRIDGE_AUDIT_MAXLEN``) and the worker's log: the tenant, the job's digest, admitted or refused
and why, and when the job ends its route, bytes and spend. ``mcbridge jobs audit`` reads it.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from bridge.errors import BridgeError
from bridge.redact import redact
from bridge.workers.auth import VERSION, Keyring, Refused
from bridge.workers.keys import Keys
from bridge.workers.settings import WorkerSettings

log = logging.getLogger("bridge.workers.audit")


@dataclass(frozen=True)
class Admitted:
    tenant: str
    digest: str
    budget: str | None
    estimate: float | None = None   # the USD a job charged to a budget was admitted for (signed)

    @classmethod
    def of(cls, auth: dict[str, Any], digest: str) -> Admitted:
        estimate = auth.get("estimate")
        return cls(auth["tenant"], digest, auth.get("budget"), None if estimate is None else float(estimate))


# How far above the USD a job was admitted for its worker's own price of the plan may be before
# the difference must fit the budget too: the submitter priced the job from a listing made
# before, and a few files more since then are no forgery.
REPRICE_SLACK = 0.25


def resolve(url: str, folders: dict[str, str] | None = None) -> str:
    """The canonical spelling a scope is checked against: a local path with its links and '..'
    resolved, an Azure name with its '.' and '..' resolved; S3 and GCS keys as written.
    ``folders``: real paths of folders already resolved, kept across the files of one plan."""
    from bridge.urls import canonical, parse
    if url.startswith("/"):
        # A plan's own spelling of a local file (str of a Location): absolute already, so what
        # parse() would make of it without its stat of every file (is it a folder?), which the
        # links resolved below make no difference to.
        path = url
        if "/." in url or "//" in url:   # else normpath would give it back as it is
            path = "/" + posixpath.normpath(url).lstrip("/")
            if url.endswith("/") and path != "/":
                path += "/"
    else:
        scheme, sep, rest = url.partition("://")
        if sep and scheme in ("s3", "gs") and folders is not None:
            # S3 and GCS keep a key as written: the canonical spelling is the URL itself once its
            # bucket is known good (parse checks it), which one plan's thousands of files share.
            bucket = f"{scheme}://{rest.partition('/')[0]}"
            if bucket not in folders:
                parse(url, empty_segments=True)
                folders[bucket] = bucket
            return url
        loc = parse(url, empty_segments=True)
        if not loc.is_local:
            return str(canonical(loc))
        path = loc.local_path   # absolute, without '.' or '..' (bridge.urls made it so)
    if folders is None:
        return os.path.realpath(path)
    head, _, tail = path.rpartition("/")   # os.path.split's, for a path in normal form
    head = head or "/"
    real = folders.get(head)
    if real is None:
        real = folders[head] = os.path.realpath(head)
    full = f"{real}/{tail}" if real != "/" else f"/{tail}"
    return os.path.realpath(full) if tail in ("", ".", "..") or os.path.islink(full) else full


@dataclass(frozen=True)
class Names:
    """What a scope check reads of a copy's or sync's plan that its planner holds (bridge.pipeline.plan
    ``Plan``): roots, route, and the names of its files, deletions and completions, read from the
    plan's rows without a dict made for each file. Only the planner makes one; a task's slice
    arrives as the plain dict it was signed as."""
    source: str
    destination: str
    single: str | None
    route: str | None
    rels: Callable[[], Iterable[str]]
    deletions: Iterable[str] = ()
    completions: Iterable[str] = ()

    @classmethod
    def of(cls, plan) -> Names:
        return cls(plan.source, plan.destination, plan.single, plan.route, plan.files.rels, plan.deletions,
                   plan.completions)

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name, default)


def touched(kind: str, plan: dict[str, Any] | Names) -> tuple[list[str], list[str]]:
    """(what it reads, what it writes) of a plan or a task's slice of one, as URLs: the roots and
    every file. ``kind``: the job's (copy, sync, pack, unpack, or one that runs as one of them);
    any other is refused, not read as a plan of no files."""
    from bridge.urls import parse
    from bridge.workers.specs import runs_as
    kind = runs_as(kind)
    if kind not in ("copy", "sync", "pack", "unpack"):
        raise ValueError(f"a {kind} job has no plan of its own to check")
    if isinstance(plan, Names):
        if kind not in ("copy", "sync"):
            raise ValueError(f"a {kind} plan is checked as the plan itself")
        source, destination, rels = plan.source, plan.destination, plan.rels()
    else:
        source, destination = plan["source"], plan["destination"]
        rels = (f["rel"] for f in plan.get("files", []))
    reads, writes = [source], [destination]
    dst = parse(destination)
    if kind in ("copy", "sync"):
        single = plan.get("single")
        under = _joiner(dst)
        if single is None:
            src = _joiner(parse(source))
            for rel in rels:
                reads.append(src(rel))
                writes.append(under(rel))
        else:
            for rel in rels:
                reads.append(single)
                writes.append(under(rel))
        writes += [under(rel) for rel in plan.get("deletions", [])]
        writes += [under(rel) for rel in plan.get("completions", [])]
    elif kind == "pack":
        root = parse(plan["source_root"])
        reads.append(plan["source_root"])
        for shard in plan.get("shards", []):
            reads += [str(root.join(rel)) for rel, _size in shard["files"]]
            writes.append(str(dst.as_prefix().join(shard["name"])))
    elif kind == "unpack":
        for shard in plan.get("shards", []):
            reads.append(shard["loc"])
            writes += [str(dst.as_prefix().join(m["path"])) for m in shard.get("members", ())]
    return reads, writes


def _joiner(root) -> Callable[[str], str]:
    """``str(root.join(rel))`` for each ``rel``, without a Location made for each of a plan's files
    (a local name is checked as join checks it: UnsafeName for one that is not a plain path)."""
    from bridge.names import local_join
    base = root.key if root.is_prefix else root.key + "/"
    if root.is_local:
        return lambda rel: "/" + local_join(base, rel)
    head = f"{root.scheme}://{root.bucket}/{base}"
    return lambda rel: head + rel


class Audit:
    """The append-only audit stream of a deployment, and the worker's log beside it."""

    def __init__(self, client, keys: Keys, maxlen: int = 0):
        self.r, self.keys, self.maxlen = client, keys, maxlen

    def record(self, decision: str, **fields: Any) -> None:
        entry = {"decision": decision, "at": f"{time.time():.3f}", "worker": socket.gethostname(),
                 **{k: (json.dumps(v) if isinstance(v, (list, dict)) else str(v)) for k, v in fields.items()
                    if v is not None}}
        entry = {k: redact(v) for k, v in entry.items()}
        log.info("audit: %s", " ".join(f"{k}={v}" for k, v in entry.items() if k not in ("at", "worker")))
        from redis.exceptions import RedisError
        try:
            if self.maxlen:
                self.r.xadd(self.keys.audit, entry, maxlen=self.maxlen, approximate=True)
            else:
                self.r.xadd(self.keys.audit, entry)
        except RedisError as exc:   # the log line above stands; the stream is the second copy
            log.warning("audit: not written to %s: %s", self.keys.audit, exc)

    def read(self, limit: int = 50, job: str | None = None, tenant: str | None = None) -> Iterator[dict[str, Any]]:
        """Newest first, up to ``limit`` entries that match."""
        shown, last = 0, "+"
        while shown < limit:
            batch = self.r.xrevrange(self.keys.audit, max=last, count=500)
            if last != "+":
                batch = batch[1:]
            if not batch:
                return
            for entry_id, fields in batch:
                if (job and fields.get("job") != job and fields.get("parent") != job) or \
                        (tenant and fields.get("tenant") != tenant):
                    continue
                yield {"id": entry_id, **fields}
                shown += 1
                if shown >= limit:
                    return
            last = batch[-1][0]


class Gate:
    """A worker's checks (see the module's docstring). The keys and the service policy are read
    once per process, when first needed."""

    def __init__(self, ws: WorkerSettings, client, keys: Keys):
        self.ws, self.r, self.keys = ws, client, keys
        self.audit = Audit(client, keys, ws.audit_maxlen)
        self._keyring: Keyring | None = None
        self._policy = None
        self._roots = tuple(os.path.realpath(root) for root in ws.local_roots)

    @property
    def keyring(self) -> Keyring:
        if self._keyring is None:
            self._keyring = Keyring.load(self.ws)
        return self._keyring

    @property
    def policy(self):
        if self._policy is None:
            if not self.ws.service_policy:
                raise Refused("this worker has no service policy (BRIDGE_SERVICE_POLICY): it runs no job; "
                              "see mcbridge service init")
            from bridge.policies.replication import PolicyError
            from bridge.policies.tenants import load
            try:
                self._policy = load(self.ws.service_policy)
            except PolicyError as exc:
                raise Refused(f"the service policy cannot be used: {exc.problems[0]}") from None
        return self._policy

    # -- jobs ------------------------------------------------------------------------------------
    def admit(self, record, now: float | None = None) -> Admitted:
        """The first plan of a job (and a plan run again after its worker died)."""
        auth = record.auth
        digest = self.keyring.check_job(record.id, record.spec, auth, record.steering)
        self.budget_admitted(record)
        key, mark = self.keys.admitted(record.id), self.mark(auth["tenant"], digest)
        before = self.r.get(key)
        if before is not None:
            if before == mark and record.state in ("planning", "running"):
                return Admitted.of(auth, digest)   # its planner died: still once
            raise Refused(f"job {record.id} was admitted before: a job id runs once (a replay of a signed job?)")
        if (now or time.time()) > auth["expires"]:
            from bridge.workers.auth import iso
            raise Refused(f"job {record.id}: its signature expired at {iso(auth['expires'])} before a worker "
                          f"admitted it (BRIDGE_SIGNATURE_TTL); submit it again")
        ttl = int(max(self.ws.job_ttl, auth["expires"] - time.time() + 86400))
        if not self.r.set(key, mark, nx=True, ex=ttl):
            raise Refused(f"job {record.id} was admitted before: a job id runs once (a replay of a signed job?)")
        admitted = Admitted.of(auth, digest)
        spec = record.spec
        destinations = spec.get("destinations") or []
        # the records of local destinations are written in the manifest folder: a place the tenant writes too
        records = [spec["manifest_dir"].rstrip("/") + "/"] if spec.get("manifest_dir") else []
        self.scope(admitted, reads=[spec["source"]], writes=destinations + records, route=spec.get("route"),
                   budget=admitted.budget)
        return admitted

    def check(self, record) -> Admitted:
        """Every later task of a job: signed, and admitted as that same signed job."""
        auth = record.auth
        digest = self.keyring.check_job(record.id, record.spec, auth, record.steering)
        if self.r.get(self.keys.admitted(record.id)) != self.mark(auth["tenant"], digest):
            raise Refused(f"job {record.id} was never admitted by a worker; its tasks run nothing")
        return Admitted.of(auth, digest)

    def mark(self, tenant: str, digest: str) -> str:
        """What ``<ns>:admitted:<job>`` holds once a worker admitted the job: a MAC of its digest
        with its tenant's key. The digest alone is no evidence: anyone can hash the record's
        signed document, and so write a mark by hand."""
        return self.keyring.mac(tenant, {"v": VERSION, "admitted": digest})

    def budget_admitted(self, record) -> None:
        """Refused unless a job signed with an estimate (one charged to a budget) holds the
        reservation its admission makes (workers/redisbudgets.py): that budget, that estimate. A job
        moved past its admission by hand holds none; one whose record's estimate was changed
        before it was approved holds another amount. The reservation itself is Redis's word."""
        from bridge.workers.redisbudgets import Budgets
        auth = record.auth
        if "estimate" not in auth:   # not charged to a budget of its own (a policy run's child)
            return
        budget, estimate = auth.get("budget"), float(auth["estimate"])
        held = Budgets(self.r, self.keys).reservation(record.id)
        if held is None:
            raise Refused(f"job {record.id} was never admitted against budget {budget!r}: it holds no reservation "
                          f"(its state was moved past awaiting-approval by hand?)")
        # more than the estimate is what cover() reserves when this job's plan was priced higher
        if held[0] != budget or not held[1] >= estimate:
            raise Refused(f"job {record.id}: the reservation it holds ({held[1]!r} USD of budget {held[0]!r}) is "
                          f"not the estimate it was signed with ({estimate!r} USD of budget {budget!r})")

    def priced(self, who: Admitted, job_id: str, usd: float | None) -> None:
        """The worker's own price of a job's plan, before any of its tasks is sent: a job charged to
        a budget and priced well above the estimate it was admitted for (its submitter's, which
        the submitter's own key signs, true or not) holds the difference too when it fits the
        budget; Refused when it does not (and what it held is freed)."""
        if who.estimate is None or usd is None or usd <= who.estimate * (1 + REPRICE_SLACK) + 1e-9:
            return
        from bridge.workers.redisbudgets import Budgets
        budgets = Budgets(self.r, self.keys)
        if not budgets.cover(job_id, who.budget, usd):
            # refused before any task is sent: what it held is freed (its listing, like any refused
            # job's requests, is not charged)
            budgets.settle(job_id, 0.0)
            raise Refused(f"job {job_id}: its plan is priced at {usd:.9f} USD here, not the {who.estimate:.9f} USD "
                          f"it was admitted for, and budget {who.budget!r} has no room for the difference")
        self.audit.record("repriced", job=job_id, tenant=who.tenant, budget=who.budget,
                          estimate_usd=f"{who.estimate:.9f}", priced_usd=f"{usd:.9f}")

    def scope(self, who: Admitted, *, reads: Iterable[str] = (), writes: Iterable[str] = (),
              route: str | None = None, budget: str | None = None, job: bool = True) -> None:
        """Refused unless ``who``'s tenant may read ``reads`` and write ``writes`` (over ``route``)."""
        from bridge.policies.tenants import refusal
        folders: dict[str, str] = {}
        try:
            real_reads, real_writes = [resolve(u, folders) for u in reads], [resolve(u, folders) for u in writes]
        except BridgeError as exc:
            raise Refused(f"refused: {exc}") from None
        tenant = self._tenant(who.tenant)
        reason = refusal(who.tenant, tenant, reads=real_reads, writes=real_writes, group=self.ws.worker_group,
                         local_roots=self._roots, route=route, budget=budget, job=job)
        if reason:
            raise Refused(reason)

    def plan(self, who: Admitted, kind: str, plan: dict[str, Any] | Names) -> None:
        """Every file a plan (or a task's slice of one) reads and writes, and its route."""
        try:
            reads, writes = touched(kind, plan)
        except (BridgeError, KeyError, TypeError, ValueError) as exc:
            raise Refused(f"refused: the plan names a place that cannot be checked: {exc}") from None
        self.scope(who, reads=reads, writes=writes, route=plan.get("route"), budget=who.budget)

    def _tenant(self, name: str):
        """The tenant's scope with its local prefixes resolved as paths are."""
        tenant = self.policy.tenant(name)
        if tenant is None or not tenant.local:
            return tenant
        from bridge.policies.tenants import LocalScope

        def real(prefixes: list[str]) -> list[str]:
            return [os.path.realpath(p) + "/" if os.path.realpath(p) != "/" else "/" for p in prefixes]
        local = {g: LocalScope.model_construct(read=real(s.read), write=real(s.write)) for g, s in tenant.local.items()}
        return tenant.model_copy(update={"local": local})

    # -- beat's messages -----------------------------------------------------------------------
    def message(self, task: str, name: str, payload: Any, auth: Any) -> str:
        """The tenant of a signed, unexpired message from beat, its nonce used once."""
        checked = self.keyring.check_message(task, name, payload, auth)
        if not self.r.set(self.keys.once(f"nonce:{checked['nonce']}"), "1", nx=True,
                          ex=int(max(60, checked["expires"] - time.time() + 60))):
            raise Refused(f"{task} {name!r}: this signed message was delivered before (a replay?)")
        if self.policy.tenant(checked["tenant"]) is None:
            raise Refused(f"tenant {checked['tenant']!r} is not in the service policy")
        return checked["tenant"]
