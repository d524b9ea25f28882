"""``mcbridge worker`` and ``mcbridge beat``: Celery's own worker and scheduler, started with
bridge's settings once the broker, the keys and the policies they need were checked."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from bridge.cli.options import err, given, out
from bridge.workers.commands.connection import BrokerOpt, connect, safe_url, service_settings


def worker(
    concurrency: Annotated[Optional[int], typer.Option(
        "--concurrency", "-c", min=1, help="Tasks at once (pool processes; default: CPU count).")] = None,
    queues: Annotated[Optional[str], typer.Option(
        "--queues", "-Q", help="Comma-separated queues (default: the control queue and every route).")] = None,
    hostname: Annotated[Optional[str], typer.Option("--hostname", "-n", help="Worker name, e.g. w1@%h.")] = None,
    pool: Annotated[str, typer.Option("--pool", "-P", help="prefork, threads or solo.")] = "prefork",
    loglevel: Annotated[str, typer.Option("--loglevel", "-l")] = "INFO",
    metrics_port: Annotated[Optional[int], typer.Option(
        "--metrics-port", min=0, max=65535, help="Prometheus endpoint (default $BRIDGE_METRICS_PORT or 9808; 0: off).")] = None,
    broker: BrokerOpt = None,
) -> None:
    """Start a worker (Celery's own, with bridge's settings): runs the units of queued jobs."""
    _queue_names(queues)
    for flag, value in (("--hostname", hostname), ("--pool", pool), ("--loglevel", loglevel)):
        given(flag, value)
    ws = service_settings(broker, metrics_port=metrics_port)
    warning = broker_warning(ws.broker_url)
    if warning:
        err.print(f"mcbridge: warning: {warning}", markup=False, soft_wrap=True)
    _check_gate(ws)
    connect(ws)
    from bridge.workers.app import app, configure
    configure(ws)
    argv = ["worker", f"--loglevel={loglevel}", f"--pool={pool}", f"--queues={queues or ','.join(ws.default_queues())}"]
    if concurrency:
        argv.append(f"--concurrency={concurrency}")
    if hostname:
        argv.append(f"--hostname={hostname}")
    app.worker_main(argv)


def broker_warning(url: str) -> str | None:
    """What is wrong with a broker that anyone on the network can reach: no password, not on this machine."""
    import ipaddress
    from urllib.parse import urlsplit
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or parts.password:
        return None   # unix sockets are this machine's
    host = parts.hostname or "localhost"
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return None
    return (f"the broker {safe_url(url)} has no password and is not on this machine: whoever reaches it can "
            f"queue and cancel jobs and read their records; give Redis a password (requirepass, then "
            f"redis://:PASSWORD@HOST:PORT/DB) and TLS (rediss://), see deploy/README.md")


def _check_gate(ws) -> None:
    """A worker's keys and service policy, read now so that a bad file is one line at start; without
    them it starts, but runs no job (it says so)."""
    from bridge.workers.auth import Keyring
    keyring = Keyring.load(ws)
    if ws.service_policy:
        from bridge.cli.policy import load_service_policy
        load_service_policy(Path(ws.service_policy))
    if not keyring.keys or not ws.service_policy:
        missing = " and ".join(name for name, given in (("tenant keys (BRIDGE_KEYS_FILE)", keyring.keys),
                                                        ("service policy (BRIDGE_SERVICE_POLICY)", ws.service_policy))
                               if not given)
        err.print(f"mcbridge: warning: no {missing}: this worker refuses every job; run mcbridge service init",
                  markup=False, soft_wrap=True)
    if not ws.local_roots:
        err.print("mcbridge: note: BRIDGE_LOCAL_ROOTS is not set: this worker reads and writes no local path",
                  markup=False, soft_wrap=True)


def _queue_names(queues: str | None) -> list[str] | None:
    """The queues of -Q, each a name: an empty one would make Celery consume every queue."""
    from bridge.errors import InvalidOption
    from bridge.workers.settings import _NAME_RE
    if queues is None:
        return None
    names = [name.strip() for name in queues.split(",")]
    if not any(names):
        raise InvalidOption("--queues is empty: name the queues, or leave the option out for the defaults")
    for name in names:
        if not _NAME_RE.match(name):
            raise InvalidOption(f"--queues {queues!r}: {name!r} is not a queue name (letters, digits, '_', '.', '-')")
    return names


def beat(
    schedules: Annotated[Optional[Path], typer.Option(
        "--schedules", help="YAML file of schedules (default: $BRIDGE_SCHEDULES).")] = None,
    policies: Annotated[Optional[Path], typer.Option(
        "--policies", help="YAML file of replication policies; each one with a schedule runs on it "
        "(default: $BRIDGE_POLICIES).")] = None,
    schedule_db: Annotated[Optional[Path], typer.Option(
        "--schedule-db", help="Where beat remembers last run times (default: beat-NAMESPACE in $MCBRIDGE_STATE_DIR).")] = None,
    check: Annotated[bool, typer.Option("--check", help="Validate the schedules and policy files and exit.")] = False,
    loglevel: Annotated[str, typer.Option("--loglevel", "-l")] = "INFO",
    broker: BrokerOpt = None,
) -> None:
    """Start the scheduler (Celery beat) for the schedules file and the replication policies'
    schedules; run exactly one."""
    from bridge.workers.schedules import load
    ws = service_settings(broker, schedules=str(schedules) if schedules else None, policies=str(policies) if policies else None)
    loaded = load(ws.schedules) if ws.schedules else []
    timed = _scheduled_policies(ws.policies) if ws.policies else []
    if check:
        for s in loaded:
            out.print(s.describe() + ("" if s.enabled else " (disabled)"), markup=False)
        for p in timed:
            when = p.policy.schedule
            out.print(f"policy {p.name}: {f'cron {when.cron!r}' if when.cron else f'every {when.every}'}, "
                      f"{p.policy.source} -> {', '.join(p.policy.destinations)}", markup=False)
        if ws.schedules:
            out.print(f"{len(loaded)} schedules OK", markup=False)
        if ws.policies:
            out.print(f"{len(timed)} scheduled policies OK", markup=False)
        if not (ws.schedules or ws.policies):
            out.print("no schedules or policy file given", markup=False)
        return
    if not (ws.schedules or ws.policies):
        err.print("mcbridge: warning: no schedules or policy file (--schedules, --policies, BRIDGE_SCHEDULES, "
                  "BRIDGE_POLICIES): beat will send nothing", markup=False)
    from bridge.workers.auth import Keyring
    if ws.schedules or ws.policies:
        Keyring.load(ws).signer()   # beat signs what it sends: refused here, not by every worker later
    connect(ws)
    from bridge.config import load_settings
    from bridge.workers.app import app, configure
    configure(ws)
    # The state dir as every command resolves it ($MCBRIDGE_STATE_DIR, the settings file...):
    # it is the volume compose and k8s mount, so last run times survive a restart of beat.
    state_dir = Path(load_settings(environ=os.environ).transfer.state_dir)
    db = schedule_db or state_dir / f"beat-{ws.namespace}"
    db.parent.mkdir(parents=True, exist_ok=True)
    app.start(["beat", f"--schedule={db}", f"--loglevel={loglevel}"])


def _scheduled_policies(path: str):
    """The policies of a file that have a schedule; a bad file (or a cron Celery refuses) exits 2
    naming file, line and field."""
    from bridge.cli.policy import load_policies
    from bridge.workers.replicas import check_crons
    policies = load_policies(Path(path))
    problems = check_crons(policies)
    if problems:
        lines = {p.name: p.line for p in policies}
        for problem in problems:
            name = problem.split(".")[1]
            err.print(f"mcbridge: error: {path}:{lines.get(name, 1)}: {problem}", markup=False, soft_wrap=True)
        raise typer.Exit(2)
    return [p for p in policies if p.policy.schedule is not None]


def register(app: typer.Typer) -> None:
    app.command("worker")(worker)
    app.command("beat")(beat)
