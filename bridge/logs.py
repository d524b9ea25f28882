"""How loud the libraries under bridge are: their loggers at WARNING unless asked for more.

azure-core logs every request's and answer's headers at INFO, botocore and urllib3 each
connection, Celery each task it receives and finishes: at a worker's INFO level that was 180,771
lines (8 MB) in 15 minutes of a few dozen jobs. ``quiet_libraries`` sets each of those loggers to
WARNING (or, verbose, leaves them to the root's level), so a worker's log holds bridge's own
lines, one per job event, each naming its job (workers/executor.py), and the warnings and
errors of everything. The CLI calls it at start (its ``-v`` lifts it), a worker when Celery has
set up its logging (``--loglevel DEBUG`` lifts it).

``JsonFormatter`` writes each record as one JSON object a line (``--log-format json``): time,
level, logger and message, and the fields of an object's audit line (bridge.progress) as keys
of their own, so that a log reader needs no pattern to find what happened to which object.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone

LOG_FORMATS = ("text", "json")

# Loggers of the SDKs and frameworks that speak per request, per connection or per task.
LIBRARIES = ("azure", "botocore", "aiobotocore", "boto3", "s3transfer", "s3fs", "gcsfs", "fsspec", "google",
             "google_auth_httplib2", "urllib3", "requests", "aiohttp", "asyncio", "kombu", "amqp",
             "celery.worker.strategy", "celery.app.trace", "celery.worker.consumer", "celery.bootsteps")


def quiet_libraries(verbose: bool = False) -> None:
    """The libraries' loggers at WARNING, or (``verbose``) at whatever the root logger lets through."""
    level = logging.NOTSET if verbose else logging.WARNING
    for name in LIBRARIES:
        logging.getLogger(name).setLevel(level)


class JsonFormatter(logging.Formatter):
    """One JSON object per record (masking is the handler's filters' work, as for text lines)."""

    def format(self, record: logging.LogRecord) -> str:
        row = {"time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
               "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        row.update(getattr(record, "audit", None) or {})
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            row["exception"] = record.exc_text
        return json.dumps(row, ensure_ascii=True, default=str)
