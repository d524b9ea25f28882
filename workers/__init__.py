"""The service: Celery workers on Redis that run bridge's units for many machines at once.

    settings.py   every setting, one table, read from the environment once
    app.py        the Celery app (``celery -A bridge.workers.app ...``) and each worker's upkeep
    tasks.py      thin tasks: plan, transfer, finalize, scheduled
    executor.py   what they do: fan a planned job out, run units, write the manifest, verify
    leases.py     leases, heartbeats and the sweeper: dead workers' tasks run again, slow ones once
    broker.py     the little the sweeper needs to know about kombu's Redis transport
    jobs.py       job records in Redis;  journal.py  the engine's journal in Redis
    specs.py      what a job asks for;   schedules.py  YAML schedules for beat
    metrics.py    Prometheus (secrets are kept out by bridge.redact)
    auth.py       tenant keys and signatures: jobs, task slices, beat's messages
    gate.py       what a worker checks before it touches anything, and the audit stream
    commands/     mcbridge worker|beat|submit|jobs|service|budgets and policy status: a plugin of
                  the CLI, one module per command group;  testing.py  real processes for tests

Nothing under ``bridge/`` imports this package or Celery.
"""
