"""How loud the libraries under bridge are: their loggers at WARNING unless asked for more.

azure-core logs every request's and answer's headers at INFO, botocore and urllib3 each
connection, Celery each task it receives and finishes: at a worker's INFO level that was 180,771
lines (8 MB) in 15 minutes of a few dozen jobs. ``quiet_libraries`` sets each of those loggers to
WARNING (or, verbose, leaves them to the root's level), so a worker's log holds bridge's own
lines, one per job event, each naming its job (workers/executor.py), and the warnings and
errors of everything. The CLI calls it at start (its ``-v`` lifts it), a worker when Celery has
set up its logging (``--loglevel DEBUG`` lifts it).
"""

from __future__ import annotations

import logging

# Loggers of the SDKs and frameworks that speak per request, per connection or per task.
LIBRARIES = ("azure", "botocore", "aiobotocore", "boto3", "s3transfer", "s3fs", "gcsfs", "fsspec", "google",
             "google_auth_httplib2", "urllib3", "requests", "aiohttp", "asyncio", "kombu", "amqp",
             "celery.worker.strategy", "celery.app.trace", "celery.worker.consumer", "celery.bootsteps")


def quiet_libraries(verbose: bool = False) -> None:
    """The libraries' loggers at WARNING, or (``verbose``) at whatever the root logger lets through."""
    level = logging.NOTSET if verbose else logging.WARNING
    for name in LIBRARIES:
        logging.getLogger(name).setLevel(level)
