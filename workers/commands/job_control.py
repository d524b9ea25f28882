"""``mcbridge jobs list|status|watch|cancel|limit|approve|audit``, and following a job to its end
(``jobs watch``, ``submit --wait``)."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any, Optional

import typer

from bridge.cli.options import JsonOpt, QuietOpt, err, given, out
from bridge.policies.cost.money import usd, usd_column
from bridge.progress import human_bytes, human_duration, plural
from bridge.workers.commands.connection import BrokerOpt, connect, job_records, service_settings


def totals(jobs, record) -> dict[str, int]:
    """Progress of a job, or the sum of its children's for a replication."""
    records = [c for c in (jobs.get(child) for child in record.children) if c] if record.children else [record]
    keys = ("bytes_total", "bytes_done", "bytes_skipped", "files_total", "files_done", "tasks_total", "tasks_done")
    return {k: sum(r.counters.get(k, 0) for r in records) for k in keys}


def _summary_line(jobs, record) -> str:
    t = totals(jobs, record)
    if record.state == "succeeded":
        moved = t["bytes_done"] - t["bytes_skipped"]
        line = (f"job {record.id} succeeded: {t['files_total']} files, {human_bytes(t['bytes_total'])} "
                f"({human_bytes(moved)} sent) in {record.elapsed:.1f}s")
        return line + (f"; manifest {record.manifest}" if record.manifest else "")
    if record.state == "failed":
        first = record.errors[0] if record.errors else "see mcbridge jobs status"
        more = record.counters.get("error_count", 0) - 1
        return f"job {record.id} failed: {first}" + (f" (and {more} more)" if more > 0 else "")
    return f"job {record.id} {record.state}"


def progress_numbers(jobs, record) -> dict[str, Any]:
    """Where a job is, as numbers: bytes and files done of their totals, the rate since it
    started (bytes moved by it, not those found already there) and the seconds left at that
    rate (None until something moved). What ``jobs watch`` prints and the status page draws."""
    t = totals(jobs, record)
    done = min(t["bytes_done"], t["bytes_total"]) if t["bytes_total"] else t["bytes_done"]
    moved = t["bytes_done"] - t["bytes_skipped"]
    rate = moved / record.elapsed if record.elapsed > 0 else 0.0
    left = max(0, t["bytes_total"] - done)
    eta = left / rate if rate > 0 and record.state == "running" else None
    return {**t, "bytes": done, "fraction": done / t["bytes_total"] if t["bytes_total"] else None,
            "rate_bytes_per_s": rate, "eta_s": eta}


def progress_line(record, n: dict[str, Any]) -> str:
    """'running: 1.5 MiB of 4.0 MiB (37%), 3/10 files, 256.0 KiB/s, ETA 10.0s' (IEC units), of a
    job's ``progress_numbers``."""
    pct = f" ({100 * n['fraction']:.0f}%)" if n["fraction"] is not None else ""
    line = (f"{record.state}: {human_bytes(n['bytes'])} of {human_bytes(n['bytes_total'])}{pct}, "
            f"{n['files_done']}/{n['files_total']} files, {human_bytes(n['rate_bytes_per_s'])}/s")
    return line + (f", ETA {human_duration(n['eta_s'])}" if n["eta_s"] is not None else "")


END_GRACE = 5.0   # seconds a follower waits, after a job's end, for its worker to announce it
UNREACHABLE = 120.0   # seconds a follower waits for Redis to answer again before it gives up
EVERY = 10.0      # seconds between progress lines when stderr is no terminal and --stats is not given


def follow(jobs, job_id: str, *, quiet: bool = False, as_json: bool = False, interval: float = 0.5,
           every: float | None = None, timeout: float | None = None) -> int:
    """Follow a job to its end; 0 only if it succeeded. On a terminal, a one-line bar with bytes,
    files, rate and ETA, at the terminal's width; elsewhere a line when the state changes and a
    progress line every ``every`` seconds (the global --stats, else EVERY; neither with -q or
    --json). The record is read every ``interval`` seconds, and at once when the job's end is
    announced (``Jobs.following``). With ``timeout``, gives up after that many seconds with one
    line (exit 1; the job goes on)."""
    from redis.exceptions import RedisError   # here: --help imports this module, and never redis

    from bridge.cli.options import RUN
    from bridge.errors import EndpointUnreachable
    from bridge.workers.jobrecords import TERMINAL
    every = every or RUN.get("stats") or EVERY
    bar_on = not quiet and not as_json and err.is_terminal
    lines_on = not bar_on and not quiet and not as_json
    bar = None
    if bar_on:
        from bridge.cli.console import line_bar
        bar = line_bar(err.rich)
        task = bar.add_task("", total=None, status="queued")
        bar.start()
    last_state = None
    ended_at: float | None = None
    next_line = time.monotonic() + every
    deadline = None if timeout is None else time.monotonic() + timeout
    seen = None          # the record as last read: a job seen and then gone was lost with Redis's data
    unreachable = None   # since when Redis has not answered
    try:
        with jobs.following(job_id) as announced:
            def wait(seconds: float) -> None:
                try:
                    announced(seconds)
                except RedisError:   # its channel went with a restart: read again after the pause
                    time.sleep(seconds)
            while True:
                try:
                    record = jobs.get(job_id)
                    unreachable = None
                except RedisError as exc:   # a restart or failover: followed through, for a while
                    now = time.monotonic()
                    if unreachable is None:
                        unreachable = now
                        if lines_on:
                            err.print(f"job {job_id}: Redis unreachable ({type(exc).__name__}); following "
                                      f"again when it answers", markup=False)
                    if now - unreachable > UNREACHABLE:
                        raise EndpointUnreachable(f"job {job_id}: Redis has not answered for {UNREACHABLE:.0f}s "
                                                  f"({exc}); its workers go on without this follower: "
                                                  f"mcbridge jobs watch {job_id}") from None
                    time.sleep(min(1.0, interval * 2))
                    continue
                if record is None and seen is not None and seen.state not in TERMINAL:
                    if bar is not None:
                        bar.stop()
                        bar = None
                    return _lost(seen, as_json)
                if record is None:
                    raise _no_job(job_id)
                seen = record
                if deadline is not None and time.monotonic() > deadline and record.state not in TERMINAL:
                    if bar is not None:
                        bar.stop()
                        bar = None
                    err.print(f"mcbridge: error: job {job_id} is still {record.state} after {timeout:g}s (--timeout); "
                              f"it goes on: mcbridge jobs watch {job_id}", markup=False, soft_wrap=True)
                    return 1
                if bar is not None:
                    n = progress_numbers(jobs, record)
                    bar.update(task, total=n["bytes_total"] or None, completed=n["bytes"], status=progress_line(record, n))
                elif lines_on and record.state != last_state:
                    err.print(f"job {job_id}: {record.state}", markup=False)
                    next_line = time.monotonic() + every
                elif lines_on and record.state == "running" and time.monotonic() >= next_line:
                    err.print(f"job {job_id}: {progress_line(record, progress_numbers(jobs, record))}", markup=False)
                    next_line = time.monotonic() + every
                last_state = record.state
                if record.state in TERMINAL:
                    # ended; its worker announces it once it is priced (what it spent is then in the
                    # record): a short wait for that, whose timeout covers a worker that died between
                    if jobs.announced(job_id):
                        record = jobs.get(job_id) or record   # read again: complete now
                        break
                    if ended_at is None:
                        ended_at = time.monotonic()
                    elif time.monotonic() - ended_at > END_GRACE:
                        break
                    wait(min(interval, END_GRACE))
                    continue
                wait(interval)
    finally:
        if bar is not None:
            bar.stop()
    if as_json:
        out.print_json(json.dumps(_status_doc(jobs, record)))
    else:
        out.print(_summary_line(jobs, record), markup=False)
    return 0 if record.state == "succeeded" else 1


def metered_text(spent: float | None, metered: dict[str, Any] | None) -> str:
    """What ran, side by side with the estimate: metered requests per store and kind, retried
    answers included, and their price."""
    price = f"{usd(spent)} spent" if spent is not None else "not priced yet"
    if not metered:
        return f"{price} (nothing metered)"
    stores = []
    for store, row in metered.items():
        kinds = ", ".join(f"{n} {kind}" for kind, n in row["requests"].items())
        failed = f"; {row['errors']} answered with an error" if row.get("errors") else ""
        stores.append(f"{store}: {kinds}{failed}")
    total = sum(sum(row["requests"].values()) for row in metered.values())
    return f"{price}, metered {total} requests ({'; '.join(stores)})"


def estimated_text(estimate: float | None, requests: int | None) -> str:
    if estimate is None:
        return "no estimate"
    return f"estimated {usd(estimate)}" + (f" for {requests} requests" if requests is not None else "")


def _no_job(job_id: str):
    from bridge.errors import InvalidOption
    return InvalidOption(f"no job {job_id!r} (it never existed, its record expired, or Redis lost it: "
                         f"restarted without persistence, or flushed)")


def rerun_command(record) -> str:
    """The command that runs a job's copy again (a sync adopts what is already there)."""
    spec = record.spec or {}
    source = spec.get("source", "SRC")
    destinations = spec.get("destinations") or [spec.get("destination", "DST")]
    return f"mcbridge submit sync {source} {' '.join(destinations)}" + (" --delete" if spec.get("delete") else "")


def _lost(record, as_json: bool) -> int:
    """A job whose record was seen and is now gone, before it ended: Redis lost its data (a
    restart without persistence, a flush, a failover to an empty replica). Its queue, journal and
    leases went with it: its workers stop at their next unit (their lease and their job are gone),
    nothing finalizes it, so no manifest is written: the destination holds files of it but no
    commit. One line saying so and how to run it again; exit 1."""
    line = (f"job {record.id} is lost: its record is gone from Redis (restarted without persistence, or "
            f"flushed) while it was {record.state}; nothing of it was committed. Run it again: "
            f"{rerun_command(record)} (it adopts the files this one had copied)")
    if as_json:
        out.print_json(json.dumps({"id": record.id, "state": "lost", "was": record.state, "errors": [line],
                                   "rerun": rerun_command(record)}))
    else:
        err.print(f"mcbridge: error: {line}", markup=False, soft_wrap=True)
    return 1


def _status_doc(jobs, record) -> dict[str, Any]:
    doc = record.to_dict()
    if record.children:
        doc["children"] = [c.to_dict() for c in (jobs.get(child) for child in record.children) if c]
    # A policy run proves each checkpoint on its own (doc["replicas"]), not the source root.
    if (record.kind == "replicate" and not record.policy) or (record.kind == "sync" and record.spec.get("delete")):
        doc["proven_equal"] = jobs.proven(record.spec["source"], record.spec["destinations"])
    return doc


def _cost_column(records) -> dict:
    """Each job's dollars (spent, or ``~`` its estimate) and each replica's, printed by one rule
    (``usd_column``), keyed by job id and by (job id, destination)."""
    keys, amounts, marks = [], [], []
    for r in records:
        amount = r.spent_usd if r.spent_usd is not None else r.estimate_usd
        if amount is not None and (r.spent_usd is not None or amount):
            keys.append(r.id)
            amounts.append(amount)
            marks.append("" if r.spent_usd is not None else "~")
        for dst, row in (r.replicas or {}).items():
            keys.append((r.id, dst))
            amounts.append(row["spent_usd"])
            marks.append("")
    shown = {key: mark + text for key, mark, text in zip(keys, marks, usd_column(amounts))}
    return {**{r.id: "-" for r in records}, **shown}


def jobs_list(state: Annotated[Optional[str], typer.Option("--state", help="Only jobs in this state "
                                                            "(or 'active').")] = None,
              limit: Annotated[int, typer.Option("--limit", min=1)] = 30, as_json: JsonOpt = False,
              broker: BrokerOpt = None) -> None:
    """The most recent jobs, newest first."""
    from bridge.errors import InvalidOption
    from bridge.workers.jobrecords import ACTIVE, STATES
    if state and state != "active" and state not in STATES:
        raise InvalidOption(f"--state {state!r}: use one of {', '.join(STATES)} or active")
    jobs = job_records(service_settings(broker))
    records = jobs.list(limit, ACTIVE if state == "active" else ((state,) if state else None))
    if as_json:
        out.print_json(json.dumps([r.to_dict() for r in records]))
        return
    if not records:
        out.print("no jobs", markup=False)
        return
    costs = _cost_column(records)
    wide = max(9, *(len(c) for c in costs.values()))
    out.print(f"{'ID':<14} {'KIND':<9} {'STATE':<10} {'PROGRESS':>22} {'USD':>{wide}} {'CREATED':<20} ROUTE", markup=False)
    for r in records:
        t = totals(jobs, r)
        pct = f"{100 * min(t['bytes_done'], t['bytes_total']) / t['bytes_total']:.0f}%" if t["bytes_total"] else "-"
        progress = f"{human_bytes(min(t['bytes_done'], t['bytes_total']))} {pct}"
        route = f"{r.spec['source']} -> {', '.join(r.spec['destinations'])}"
        tag = f" [{r.schedule}]" if r.schedule else ""
        out.print(f"{r.id:<14} {r.kind:<9} {r.state:<10} {progress:>22} {costs[r.id]:>{wide}} "
                  f"{r.to_dict()['created']:<20} {route}{tag}", markup=False)
        for dst, row in (r.replicas or {}).items():
            out.print(f"{'':<14} {dst}: lag {row['lag_checkpoints']}, newest verified "
                      f"{row.get('newest_verified') or '-'}, {costs[r.id, dst]}", markup=False)


def jobs_status(job_id: str, as_json: JsonOpt = False, broker: BrokerOpt = None) -> None:
    """Everything about one job: spec, state, progress, errors, verification."""
    jobs = job_records(service_settings(broker))
    record = jobs.get(job_id)
    if record is None:
        raise _no_job(job_id)
    doc = _status_doc(jobs, record)
    if as_json:
        out.print_json(json.dumps(doc))
        return
    t = totals(jobs, record)
    p = doc["progress"]
    lines = [f"job {record.id}  {record.kind}  {record.state}" + (f"  (schedule {record.schedule})" if record.schedule else ""),
             f"  source       {record.spec['source']}",
             f"  destination  {', '.join(record.spec['destinations'])}",
             f"  queue        {record.queue}" + (f"  profile {record.spec['profile']}" if record.spec.get("profile") else "")
             + (f"  tenant {record.tenant}" if record.tenant else ""),
             f"  created      {doc['created']}  started {doc['started'] or '-'}  finished {doc['finished'] or '-'}"]
    pct = f" ({100 * min(t['bytes_done'], t['bytes_total']) / t['bytes_total']:.0f}%)" if t["bytes_total"] else ""
    lines.append(f"  progress     {human_bytes(min(t['bytes_done'], t['bytes_total']))} of {human_bytes(t['bytes_total'])}{pct}, "
                 f"{t['files_done']}/{t['files_total']} files, {t['tasks_done']}/{t['tasks_total']} tasks, "
                 f"{human_bytes(p['rate_bytes_per_s'])}/s")
    lines.append(f"  recovery     {p['retries']} retried requests, {p['requeued']} tasks requeued from lost workers")
    if doc.get("route"):
        r = doc["route"]
        fell = f", {r['fallbacks']} files sent direct" if r["fallbacks"] else ""
        lines.append(f"  route        {r['name']}: {r['why']}; {human_bytes(r['bytes_through_bridge'])} through "
                     f"bridge{fell}")
    if record.manifest:
        lines.append(f"  manifest     {record.manifest}")
    if record.verify and record.verify.get("mode") != "none":
        v = record.verify
        verdict = "OK" if v.get("ok") else "NOT PROVEN" if v.get("unproven") and v.get("mismatched") == 0 \
            and v.get("missing") == 0 else "FAILED"
        unproven = f", {v['unproven']} unproven (verify --deep reads them)" if v.get("unproven") else ""
        lines.append(f"  verified     {verdict} ({v['mode']}): {v['checked']} files, {v['missing']} missing, "
                     f"{v['mismatched']} mismatched, {v['extra']} extra{unproven}, at {v['at']}")
    if record.spent_usd is not None or record.estimate_usd is not None or record.metered:
        lines.append(f"  cost         {metered_text(record.spent_usd, record.metered)}; "
                     f"{estimated_text(record.estimate_usd, record.estimate_requests)}"
                     + (f"; budget {record.budget}" if record.budget else ""))
    for child in doc.get("children", []):
        spent = f", {usd(child['spent_usd'])}" if child.get("spent_usd") is not None else ""
        lines.append(f"  -> {child['spec']['destinations'][0]}  {child['state']}  (job {child['id']}{spent})")
    for dst, row in (record.replicas or {}).items():
        verified = f"{row['newest_verified']} verified {row['verified_at']}" if row.get("newest_verified") else "nothing verified"
        lines.append(f"  replica      {dst}: {verified}; lag {row['lag_checkpoints']} checkpoints; "
                     f"{usd(row['spent_usd'])}" + (f"; removed {', '.join(row['removed'])}" if row.get("removed") else ""))
    for dst, proof in (doc.get("proven_equal") or {}).items():
        proof = proof or {}
        when = f"{proof['proven_at']} (job {proof['job']})" if proof.get("proven_at") else "never"
        if proof.get("synced_at"):
            how = f"verify {proof['verify']}" + (", extra files kept" if proof.get("keeps_extra") else "")
            when += f"; last synced {proof['synced_at']} (job {proof['synced_job']}, {how})"
        lines.append(f"  proven equal {dst}: {when}")
    if record.errors:
        lines.append(f"  errors ({doc['error_count']}):")
        lines += [f"    {e}" for e in record.errors[:10]]
    for line in lines:
        out.print(line, markup=False)


WatchTimeoutOpt = Annotated[Optional[float], typer.Option(
    "--timeout", min=0.1, help="Seconds to follow the job at most; exit 1 if it has not ended by then (the job "
    "goes on). Default: none, until the job ends.")]


def jobs_watch(job_id: str, quiet: QuietOpt = False, as_json: JsonOpt = False, broker: BrokerOpt = None,
               timeout: WatchTimeoutOpt = None) -> None:
    """Follow a job to its end: on a terminal a bar with bytes, files, rate and ETA; elsewhere a
    progress line every 10 s (the global --stats INTERVAL sets another); exit 0 only if it succeeded."""
    raise typer.Exit(follow(job_records(service_settings(broker)), job_id, quiet=quiet, as_json=as_json,
                            timeout=timeout))


def in_flight(jobs, job_id: str) -> tuple[int, int]:
    """(transfer tasks of a job, or of its children, not started yet; tasks running now), from
    the job's pending counter and the service's running tasks (workers/leases.py)."""
    record = jobs.get(job_id)
    ids = {job_id, *(record.children if record else [])}
    running = sum(1 for raw in jobs.r.hvals(jobs.keys.running) if json.loads(raw).get("job") in ids)
    pending = sum(int(jobs.r.get(jobs.keys.job(one, "pending")) or 0) for one in ids)
    return max(0, pending - running), running


def jobs_cancel(job_id: str,
                wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait until the job's workers have "
                                                   "stopped, and say when.")] = True,
                timeout: Annotated[float, typer.Option(
                    "--timeout", min=0, help="Seconds --wait waits for the job's workers to stop; exit 1 if "
                    "they have not by then (0: as --no-wait).")] = 60.0,
                broker: BrokerOpt = None) -> None:
    """Stop a job: no request is sent after its workers see the cancel (they look every 0.2 s,
    also inside a part), its remote transfer is cancelled, its unfinished uploads are aborted, no
    manifest is written. Says at once what it dropped and asked to stop; with --wait (the
    default) also when its workers have stopped."""
    jobs = job_records(service_settings(broker))
    cancelled, state = jobs.cancel(job_id)
    if state is None:
        raise _no_job(job_id)
    if not cancelled:
        err.print(f"mcbridge: job {job_id} is {state}; it can no longer be cancelled", markup=False)
        raise typer.Exit(1)
    if state in ("awaiting-approval", "queued"):
        out.print(f"cancelling job {job_id} (it was {state}): nothing of it had started", markup=False)
    else:
        queued, running = in_flight(jobs, job_id)
        out.print(f"cancelling job {job_id} (it was {state}): {plural(queued, 'task')} not started dropped, "
                  f"{running} running asked to stop", markup=False, soft_wrap=True)
    if not wait or timeout == 0:
        return
    deadline = time.monotonic() + timeout
    with jobs.following(job_id) as wait_for_end:
        stopped = jobs.get(job_id)
        while stopped is not None and stopped.finished is None and time.monotonic() < deadline:
            wait_for_end(min(0.5, max(0.0, deadline - time.monotonic())))
            stopped = jobs.get(job_id)
    if stopped is not None and stopped.finished is not None:
        out.print(f"cancelled job {job_id}: its workers stopped at {stopped.to_dict()['finished']}, "
                  f"nothing committed", markup=False, soft_wrap=True)
        return
    err.print(f"mcbridge: error: job {job_id} is cancelled but its workers had not stopped after {timeout:g}s "
              f"(--timeout); mcbridge jobs status {job_id} shows when they do", markup=False, soft_wrap=True)
    raise typer.Exit(1)


def jobs_limit(job_id: str, rate: Annotated[str, typer.Argument(help="Bytes per second, e.g. 50MiB; 0 or off: none.")],
               broker: BrokerOpt = None) -> None:
    """Change a job's bandwidth limit while it runs; all of its workers follow within seconds."""
    from bridge.config import parse_rate
    from bridge.workers.jobrecords import TERMINAL
    from bridge.workers.limits import set_limit
    if not rate.strip():
        from bridge.errors import InvalidOption
        raise InvalidOption("RATE is empty: give bytes per second (e.g. 50MiB), or 0 or off for no limit")
    value = parse_rate(rate)
    jobs = job_records(service_settings(broker))
    record = jobs.get(job_id)
    if record is None:
        raise _no_job(job_id)
    if record.state in TERMINAL:
        err.print(f"mcbridge: job {job_id} is {record.state}; there is nothing left to limit", markup=False)
        raise typer.Exit(1)
    for target in (job_id, *record.children):  # a replication's destinations run as jobs of their own
        set_limit(jobs.r, jobs.keys, target, value)
    out.print(f"job {job_id}: bandwidth limit {human_bytes(value) + '/s' if value else 'off'}", markup=False)


def jobs_approve(job_id: str, broker: BrokerOpt = None) -> None:
    """Queue a job that waits for approval because it would pass its monthly budget."""
    ws = service_settings(broker)
    connect(ws)
    from bridge.workers.app import configure, service
    configure(ws)
    approved, state = service().approve(job_id)
    if state is None:
        raise _no_job(job_id)
    if not approved:
        err.print(f"mcbridge: job {job_id} is {state}, not awaiting approval", markup=False)
        raise typer.Exit(1)
    out.print(f"approved job {job_id}: queued", markup=False)


def jobs_audit(job: Annotated[Optional[str], typer.Option("--job", help="Only this job (and its children).")] = None,
               tenant: Annotated[Optional[str], typer.Option("--tenant", help="Only this tenant's.")] = None,
               limit: Annotated[int, typer.Option("--limit", min=1)] = 50, as_json: JsonOpt = False,
               broker: BrokerOpt = None) -> None:
    """What the workers decided, newest first: each job's tenant, digest, admitted or refused and
    why, and when it ended its route, bytes and spend (the audit stream)."""
    from bridge.workers.gate import Audit
    from bridge.workers.keys import Keys
    given("--job", job)
    given("--tenant", tenant)
    ws = service_settings(broker)
    entries = list(Audit(connect(ws), Keys(ws.namespace)).read(limit, job=job, tenant=tenant))
    if as_json:
        out.print_json(json.dumps(entries))
        return
    if not entries:
        out.print("no audit entries", markup=False)
        return
    for e in entries:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(e.get("at", 0))))
        what = e.get("job") or (f"schedule {e['schedule']}" if e.get("schedule") else
                                f"policy {e['policy']}" if e.get("policy") else e.get("task", "-"))
        line = f"{when} {e['decision']:<8} {what} tenant {e.get('tenant', '-')}"
        if e.get("source"):
            line += f" {e['source']} -> {', '.join(json.loads(e['destinations'])) if e.get('destinations') else '-'}"
        if e["decision"] == "ended":
            line += f" {e.get('state')}: {human_bytes(int(e.get('bytes', 0)))}, route {e.get('route') or '-'}"
            line += f", {usd(float(e['spent_usd']))}" if e.get("spent_usd") else ""
        if e.get("digest"):
            line += f" digest {e['digest'][:16]}"
        if e.get("reason"):
            line += f": {e['reason']}"
        out.print(line, markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    jobs = typer.Typer(no_args_is_help=True, help="Jobs queued for the workers: list, status, watch, cancel.")
    for name, command in (("list", jobs_list), ("status", jobs_status), ("watch", jobs_watch),
                          ("cancel", jobs_cancel), ("limit", jobs_limit), ("approve", jobs_approve),
                          ("audit", jobs_audit)):
        jobs.command(name)(command)
    app.add_typer(jobs, name="jobs")
