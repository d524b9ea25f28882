"""The tasks: thin wrappers that hand a delivery to ``bridge.workers.executor.Service``.

Every task's first argument is its job id; none carries a credential. What a task may do is
checked by the worker before it does it (workers/gate.py): the job's signature on every task, a
transfer's slice of the plan against the planner's signature (``sig``) and the tenant's scope,
beat's messages against beat's (``auth``). A job's first slice is run by its planner from
memory and never sent, and its finalize by the worker that finished its last slice
(``Service._leased``). ``plan``, ``transfer``
and ``finalize`` take a lease when they start (workers/leases.py), so a duplicate delivery does
nothing and a dead worker's task runs again elsewhere. Their outcome is in the job's record, so
Celery stores no result for them (a round trip less per task).
"""

from __future__ import annotations

from bridge.workers.app import app, service
from bridge.workers.executor import FINALIZE, LIST, PLAN, SCHEDULED, TRANSFER
from bridge.workers.leases import TaskRef
from bridge.workers.replicas import POLICY


def _ref(task, args: list) -> TaskRef:
    request = task.request
    return TaskRef(id=request.id, task=task.name, args=list(args), job=args[0],
                   queue=(request.delivery_info or {}).get("routing_key") or service().ws.control_queue,
                   tag=(request.properties or {}).get("delivery_tag"), worker=request.hostname or "")


@app.task(name=PLAN, bind=True, ignore_result=True)
def plan(self, job_id: str) -> dict:
    """List the source, prepare the destination, fan the units out."""
    return service().run(_ref(self, [job_id]))


@app.task(name=LIST, bind=True, ignore_result=True)
def list_part(self, job_id: str, index: int, part: str, sig: str) -> dict:
    """One part of a job's listing split by sub-prefix (the text of the planner's part that
    ``sig`` signs): listed, compared, its slices pushed; the last part dispatches the job."""
    return service().run(_ref(self, [job_id, index, part, sig]))


@app.task(name=TRANSFER, bind=True, ignore_result=True)
def transfer(self, job_id: str, sub_plan: str | dict, sig: str | None = None) -> dict:
    """One multipart file, or a batch of small files and deletions, on a thread pool. ``sub_plan``:
    the text of the planner's slice that ``sig`` signs (a sub-plan as JSON data is taken too)."""
    return service().run(_ref(self, [job_id, sub_plan, sig]))


@app.task(name=FINALIZE, bind=True, ignore_result=True)
def finalize(self, job_id: str) -> dict:
    """Write the manifest and verify the destination (or clean up a cancelled job)."""
    return service().run(_ref(self, [job_id]))


@app.task(name=SCHEDULED, bind=True)
def scheduled(self, name: str, spec: dict, auth: dict | None = None) -> dict:
    """Sent by beat when a schedule is due: start its job."""
    return service().fire(name, spec, fire_id=self.request.id, auth=auth)


@app.task(name=POLICY, bind=True)
def policy(self, name: str, policy: dict, auth: dict | None = None) -> dict:
    """Sent by beat when a replication policy is due: price its run and start it."""
    return service().fire_policy(name, policy, fire_id=self.request.id, auth=auth)
