"""Cron expressions as Celery reads them: shared by the schedules file (schedules.py) and the
replication policies' schedules (replicas.py), so neither imports the other."""

from __future__ import annotations

CRON_FIELDS = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")


def check_cron(expr: str) -> str | None:
    """Why ``expr`` is not a five-field cron expression, or None."""
    from celery.schedules import crontab
    parts = expr.split()
    if len(parts) != 5:
        return f"{expr!r} has {len(parts)} fields; a cron expression has 5: minute hour day-of-month month day-of-week"
    for name, value in zip(CRON_FIELDS, parts):
        try:
            crontab(**{name: value})
        except Exception as exc:  # celery raises ValueError or its own ParseException
            return f"{name.replace('_', '-')} {value!r}: {exc}"
    return None
