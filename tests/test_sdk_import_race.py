"""The SDKs are imported lazily (``_sdk`` in bridge/stores/azure.py, s3.py, gcs.py); the first calls
from several threads at once, in a fresh interpreter, import each once without Python's
_DeadlockError (a gs -> az copy met it when two threads imported azure.core and azure.storage.blob
at the same time)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import threading
from bridge.stores import azure, gcs, s3
barrier, errors = threading.Barrier(8), []
def first():
    barrier.wait()
    try:
        azure._sdk().BlobServiceClient, s3._sdk(), gcs._sdk()
    except BaseException as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=first) for _ in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
print(errors)
"""


def test_first_calls_from_many_threads_import_the_sdk_once():
    for _ in range(3):
        run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == "[]", run.stdout
