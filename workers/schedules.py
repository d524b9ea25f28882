"""Named schedules in YAML, run by Celery beat.

    # schedules.yaml
    schedules:
      golden-nightly:                 # a name: letters, digits, '_', '.', '-'
        cron: "0 2 * * *"             # minute hour day-of-month month day-of-week (BRIDGE_TIMEZONE)
        kind: sync                    # copy | sync | replicate
        source: gs://models/golden/
        destination: s3://models-dr/golden/
        delete: true
      corpus-dr:
        every: 6h                     # instead of cron: an interval (30s, 15m, 6h, 1d)
        kind: replicate               # keep every destination equal to the source (sync + verify)
        delete: true                  # remove there what the source lacks: asked for, never a default
        source: s3://corpus/train/
        destinations: [gs://corpus-dr/train/, az://corpus-dr/train/]
        verify: deep

Besides ``cron``/``every`` (exactly one) and ``enabled`` (default true), a schedule holds the
fields of a job spec (workers/specs.py: kind, source, destination(s), delete, chunk_size,
concurrency, profile, queue, verify). A file with mistakes is refused as a whole, one line per
mistake: ``schedules.yaml:7: schedules.golden-nightly.cron: hour '25': ...``.

When a schedule is due, beat sends ``bridge.scheduled`` on the control queue; a worker starts
the job, unless the job that schedule started last time is still active. ``Scheduler`` is the
beat scheduler of the app (``beat_scheduler``): it reads the file named by ``BRIDGE_SCHEDULES``
(or ``mcbridge beat --schedules``) when beat starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

from bridge.errors import InvalidOption
from bridge.policies.yamlcheck import line_of as _line_of
from bridge.workers.crons import CRON_FIELDS, check_cron
from bridge.workers.settings import parse_duration
from bridge.workers.specs import JobSpec, SpecError

SCHEDULE_KEYS = ("cron", "every", "enabled")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$")
MIN_INTERVAL = 1.0


class ScheduleError(InvalidOption):
    """A schedules file that cannot be used; ``problems`` has one line per mistake."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems) if len(problems) > 1 else problems[0])


@dataclass(frozen=True)
class Schedule:
    name: str
    spec: JobSpec
    cron: str | None
    every: float | None
    enabled: bool
    line: int

    def celery_schedule(self, app=None):
        from celery.schedules import crontab, schedule
        if self.cron is not None:
            return crontab(**dict(zip(CRON_FIELDS, self.cron.split())), app=app)
        return schedule(timedelta(seconds=self.every), app=app)

    def describe(self) -> str:
        when = f"cron '{self.cron}'" if self.cron else f"every {self.every:g}s"
        return f"{self.name}: {when}, {self.spec.kind} {self.spec.source} -> {', '.join(self.spec.destinations)}"


# -- locating a field in the YAML text ---------------------------------------------------------

def _mapping_keys(node: yaml.Node) -> list[yaml.Node]:
    return [key for key, _ in node.value] if isinstance(node, yaml.MappingNode) else []


def parse(text: str, filename: str = "schedules.yaml") -> list[Schedule]:
    """Every schedule in ``text``, or ScheduleError naming the line and field of each mistake."""
    problems: list[str] = []

    def problem(line: int | None, where: str, message: str) -> None:
        problems.append(f"{filename}:{line or 1}: {where}: {message}" if where else f"{filename}:{line or 1}: {message}")

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        reason = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ScheduleError([f"{filename}:{mark.line + 1 if mark else 1}: not valid YAML: {reason}"]) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("schedules"), dict):
        raise ScheduleError([f"{filename}:{_line_of(root, ('schedules',))}: schedules: expected a mapping of "
                             f"schedule names to schedules"])
    for key in _mapping_keys(root):
        if key.value != "schedules":
            problem(key.start_mark.line + 1, key.value, "unknown top-level field (only 'schedules')")
    names_node = dict((k.value, v) for k, v in root.value)["schedules"] if isinstance(root, yaml.MappingNode) else None
    seen: set[str] = set()
    for key in _mapping_keys(names_node):
        if key.value in seen:
            problem(key.start_mark.line + 1, f"schedules.{key.value}", "defined twice")
        seen.add(key.value)

    schedules: list[Schedule] = []
    for name, body in doc["schedules"].items():
        where = f"schedules.{name}"
        line = _line_of(root, ("schedules", name), keys=True)
        if not isinstance(name, str) or not _NAME_RE.match(name):
            problem(_line_of(root, ("schedules", name), keys=True), where,
                    "a schedule name uses letters, digits, '_', '.', '-'")
            continue
        if not isinstance(body, dict):
            problem(line, where, "expected a mapping with cron or every, kind, source and destination")
            continue
        timing = {k: body[k] for k in SCHEDULE_KEYS if k in body}
        spec_fields = {k: v for k, v in body.items() if k not in SCHEDULE_KEYS}
        cron, every = timing.get("cron"), timing.get("every")
        if (cron is None) == (every is None):
            problem(line, where, "give exactly one of cron (e.g. \"0 2 * * *\") or every (e.g. 6h)")
        elif cron is not None:
            reason = check_cron(cron) if isinstance(cron, str) else "expected a string such as \"0 2 * * *\""
            if reason:
                problem(_line_of(root, ("schedules", name, "cron")), f"{where}.cron", reason)
        else:
            try:
                every = parse_duration(every if isinstance(every, (int, float)) else str(every))
                if every < MIN_INTERVAL:
                    raise ValueError(f"at least {MIN_INTERVAL:g}s")
            except ValueError as exc:
                problem(_line_of(root, ("schedules", name, "every")), f"{where}.every", str(exc))
        enabled = timing.get("enabled", True)
        if not isinstance(enabled, bool):
            problem(_line_of(root, ("schedules", name, "enabled")), f"{where}.enabled", "expected true or false")
        try:
            spec = JobSpec.from_dict(spec_fields)
        except SpecError as exc:
            for found in exc.problems:
                loc = found.loc
                if loc[:1] == ("destinations",) and "destination" in body:
                    loc = ("destination", *loc[1:])
                problem(_line_of(root, ("schedules", name, *loc), keys=found.unknown),
                        ".".join([where, *map(str, loc)]), found.message)
            continue
        if not problems:
            schedules.append(Schedule(name, spec, cron, every if cron is None else None, enabled, line or 1))
    if problems:
        raise ScheduleError(problems)
    return schedules


def load(path: str | Path) -> list[Schedule]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ScheduleError([f"{path}: cannot read the schedules file: {exc.strerror or exc}"]) from None
    return parse(text, str(path))


def beat_entries(schedules: list[Schedule], control_queue: str, app=None) -> dict[str, dict[str, Any]]:
    """Celery ``beat_schedule`` entries that send ``bridge.scheduled`` for each enabled schedule,
    signed by beat as it sends each."""
    from bridge.workers.auth import BeatSignature
    from bridge.workers.executor import SCHEDULED
    return {f"mcbridge:{s.name}": {"task": SCHEDULED, "schedule": s.celery_schedule(app),
                                   "args": [s.name, s.spec.to_dict(), BeatSignature(SCHEDULED, s.name, s.spec.to_dict())],
                                   "options": {"queue": control_queue}}
            for s in schedules if s.enabled}


try:
    from celery.beat import PersistentScheduler
except ImportError:  # celery not installed: the loader above still validates files
    PersistentScheduler = object  # type: ignore[misc,assignment]


class Scheduler(PersistentScheduler):  # type: ignore[misc,valid-type]
    """Celery beat's persistent scheduler, with the entries of the schedules file merged in."""

    def setup_schedule(self) -> None:
        import logging

        import bridge.workers.app as bridge_app
        ws = bridge_app.settings
        log = logging.getLogger(__name__)
        entries: dict[str, dict[str, Any]] = {}
        if ws.schedules:
            schedules = load(ws.schedules)
            entries.update(beat_entries(schedules, ws.control_queue, self.app))
            for s in schedules:
                log.info("schedule %s%s", s.describe(), "" if s.enabled else " (disabled)")
        if ws.policies:
            from bridge.policies.replication import load as load_policies
            from bridge.workers import replicas
            policies = load_policies(ws.policies)
            entries.update(replicas.beat_entries(policies, ws.control_queue, self.app))
            for p in policies:
                when = p.policy.schedule
                log.info("policy %s: %s", p.name, f"cron '{when.cron}'" if when and when.cron else
                         f"every {when.every}" if when else "no schedule (run it with mcbridge replicate --policy)")
        if ws.schedules or ws.policies:
            kept = {k: v for k, v in (self.app.conf.beat_schedule or {}).items()
                    if not k.startswith(("mcbridge:", "mcbridge-policy:"))}
            self.app.conf.beat_schedule = {**kept, **entries}
        super().setup_schedule()

