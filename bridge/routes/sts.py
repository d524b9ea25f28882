"""The ``sts`` route: Google Storage Transfer Service copies into GCS, from S3, Azure Blob, GCS or
the URLs of a TsvHttpData-1.0 list, through ``google-cloud-storage-transfer`` (REST transport).

One bridge copy is one transfer job with no schedule (``transferJobs.create`` then
``transferJobs.run``, which starts one operation), followed with ``transferOperations.get``,
cancelled with ``transferOperations.cancel``, and deleted once it has ended. Object names are
kept: the sink path is the destination prefix, the source path the source prefix. A job for some
of a prefix's objects (one object, a sync's changes, a filtered copy) names exactly those in a
transfer manifest (``transferSpec.transferManifest``): a CSV of names relative to the source path,
written under the destination's ``_bridge/sts/`` before the job is created and deleted once it has
ended. Include prefixes were not exact: "shard-1" also takes "shard-10", which a filter had left
out, and the service refuses prefixes nested in one another.

What the service needs, besides a project (``native.sts_project``, else ``gcs.project``) whose
Storage Transfer service agent may write the destination bucket:

    from s3://   an IAM role the service assumes (``native.sts_aws_role_arn``), else the access
                 key and secret bridge has for S3 (temporary session keys cannot be used)
    from az://   a SAS token: ``azure.sas_token``, else one bridge signs with the account key for
                 the container (read and list, valid SAS_DAYS days)
    from gs://   nothing: the project's service agent needs read access to the source bucket
    from a list  each URL must be readable by the service (public or signed)

They travel in the job's spec only, which the service never returns. ``native.sts_endpoint``
points the client at another endpoint (a test double) with anonymous credentials.
"""

from __future__ import annotations

import base64
import csv
import datetime as dt
import functools
import os
import threading
import urllib.parse
import io
import urllib.request
import uuid

from bridge.routes import delegated as native
from bridge.config import Settings
from bridge.errors import (InvalidOption, JobCancelled, MissingBackend, ObjectNotFound, PermissionDenied,
                           RouteFailed, RouteUnavailable)
from bridge.routes.ledger import Ledger
from bridge.registry import install_hint
from bridge.progress import Progress
from bridge.redact import redact
from bridge.stores import get_store
from bridge.hashing import crc32c, crc_hex
from bridge.stores.base import RESERVED, ObjectInfo
from bridge.urls import Location, parse

ROUTE = "sts"
# Objects one job names in its transfer manifest: the service takes a manifest of any size from an
# agentless source (S3, Azure, GCS), but bridge builds it in memory and writes it in one request.
MAX_NAMED = 1_000_000
PAIRS = {("s3", "gs"), ("az", "gs"), ("gs", "gs")}
SAS_DAYS = 7
LIST_HEADER = "TsvHttpData-1.0"


def client_for(settings: Settings):
    try:
        from google.cloud import storage_transfer
    except ImportError as exc:
        raise MissingBackend(f"the sts route needs the 'native' extra: {install_hint('native')}") from exc
    if settings.native.sts_endpoint:
        from google.auth.credentials import AnonymousCredentials
        return storage_transfer.StorageTransferServiceClient(
            credentials=AnonymousCredentials(), transport="rest",
            client_options={"api_endpoint": settings.native.sts_endpoint})
    credentials = None
    if settings.gcs.credentials_file:
        from google.oauth2 import service_account
        credentials = service_account.Credentials.from_service_account_file(
            settings.gcs.credentials_file, scopes=["https://www.googleapis.com/auth/cloud-platform"])
    return storage_transfer.StorageTransferServiceClient(credentials=credentials, transport="rest")


def _credentials(settings: Settings) -> None:
    """RouteUnavailable unless Google credentials to call the service can be found: without them
    the client's first request failed as an internal error, after the copy had been planned."""
    if settings.native.sts_endpoint:
        return
    if settings.gcs.credentials_file:
        if not os.path.exists(settings.gcs.credentials_file):
            raise RouteUnavailable(f"route sts needs Google credentials: GOOGLE_APPLICATION_CREDENTIALS points at "
                                   f"a missing file: {settings.gcs.credentials_file}")
        return
    if not _default_credentials_found():
        raise RouteUnavailable("route sts needs Google credentials to call Storage Transfer Service: set "
                               "GOOGLE_APPLICATION_CREDENTIALS (gcs.credentials_file) or run 'gcloud auth "
                               "application-default login'")


@functools.cache
def _default_credentials_found() -> bool:
    try:
        import google.auth
        import google.auth.exceptions
    except ImportError:
        return False
    try:
        google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    except google.auth.exceptions.DefaultCredentialsError:
        return False
    return True


def _project(settings: Settings) -> str:
    project = settings.native.sts_project or settings.gcs.project
    if not project:
        raise RouteUnavailable("route sts needs the project that runs the transfer job: set native.sts_project "
                               "(or gcs.project, GOOGLE_CLOUD_PROJECT)")
    return project


def _dir(loc: Location) -> str:
    return loc.as_prefix().key


# -- the transfer spec (holds the source credentials: never logged, never returned) --------------

def _s3_source(loc: Location, settings: Settings) -> dict:
    spec = {"bucket_name": loc.bucket, "path": _dir(loc)}
    role, s3 = settings.native.sts_aws_role_arn, settings.s3
    if role:
        return {**spec, "role_arn": role}
    if s3.session_token:
        raise RouteUnavailable("route sts cannot use temporary AWS keys (a session token is set): set "
                               "native.sts_aws_role_arn to a role the service may assume")
    if not (s3.access_key_id and s3.secret_access_key):
        raise RouteUnavailable("route sts needs AWS credentials to read S3: set native.sts_aws_role_arn, or "
                               "s3.access_key_id and s3.secret_access_key")
    return {**spec, "aws_access_key": {"access_key_id": s3.access_key_id,
                                       "secret_access_key": s3.secret_access_key.get_secret_value()}}


def _azure_source(loc: Location, settings: Settings) -> dict:
    client = get_store(loc, settings).client
    account = client.account_name
    if settings.azure.sas_token:
        sas = settings.azure.sas_token.get_secret_value().lstrip("?")
    else:
        key = getattr(client.credential, "account_key", None)
        if not key:
            raise RouteUnavailable("route sts needs a SAS token for Azure: set azure.sas_token, or an account "
                                   "key so that bridge can sign one")
        from azure.storage.blob import ContainerSasPermissions, generate_container_sas
        sas = generate_container_sas(account, loc.bucket, account_key=key,
                                     permission=ContainerSasPermissions(read=True, list=True),
                                     expiry=dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=SAS_DAYS))
    return {"storage_account": account, "container": loc.bucket, "path": _dir(loc),
            "azure_credentials": {"sas_token": sas}}


def transfer_spec(transfer: native.Transfer, settings: Settings, list_url: str | None = None,
                  manifest: Location | None = None) -> dict:
    """The job's transferSpec; ``manifest``: where the CSV naming a filtered job's objects is."""
    sink = {"gcs_data_sink": {"bucket_name": transfer.dst_root.bucket, "path": _dir(transfer.dst_root)}}
    if list_url:
        return {"http_data_source": {"list_url": list_url}, **sink}
    src = transfer.src_root
    if src.scheme == "s3":
        source = {"aws_s3_data_source": _s3_source(src, settings)}
    elif src.scheme == "az":
        source = {"azure_blob_storage_data_source": _azure_source(src, settings)}
    else:   # the project's transfer service agent reads it: no credential travels
        source = {"gcs_data_source": {"bucket_name": src.bucket, "path": _dir(src)}}
    if transfer.filtered and manifest is not None:
        source["transfer_manifest"] = {"location": f"gs://{manifest.bucket}/{manifest.key}"}
    return {**source, **sink}


def unnamable(rels: list[str], listed=()) -> str | None:
    """Why one job's transfer manifest cannot name exactly these objects, or None when it can
    (a manifest names objects, never folders: what else is ``listed`` does not matter)."""
    if len(rels) > MAX_NAMED:
        return f"route sts names at most {MAX_NAMED:,} objects in one job's transfer manifest, not {len(rels):,}"
    odd = next((rel for rel in rels if "\n" in rel or "\r" in rel), None)
    if odd is not None:
        return f"route sts cannot name {odd!r} in a transfer manifest: the name holds a line break"
    return None


def manifest_csv(rels) -> bytes:
    """The transfer manifest: one name a row, relative to the source path, quoted as CSV quotes
    (a name with a comma or a double quote), UTF-8."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for rel in rels:
        writer.writerow([rel])
    return out.getvalue().encode()


def _manifest_location(transfer: native.Transfer, token: str) -> Location:
    # Beside the destination's record, whose folder listings and verify leave out: the service
    # agent already reads and writes the destination bucket, so it may read this object too.
    return transfer.dst_root.as_prefix().join(f"{RESERVED}/sts/{token}.csv")


def _write_manifest(transfer: native.Transfer, settings: Settings, token: str) -> Location:
    loc = _manifest_location(transfer, token)
    data = manifest_csv(rel for rel, _ in transfer.objects)
    get_store(loc, settings).put(loc, data, crc32c=crc_hex(crc32c(data)), metadata={})
    return loc


def _drop_manifest(settings: Settings, where: str) -> None:
    """Delete a transfer manifest bridge wrote (a name from the ledger); one already gone is."""
    if not where:
        return
    loc = parse(where)
    try:
        get_store(loc, settings).delete(loc)
    except ObjectNotFound:
        pass


def check(src: Location, dst: Location, settings: Settings) -> None:
    """RouteUnavailable unless the settings hold what a job from ``src`` to ``dst`` needs (no request)."""
    if (src.scheme, dst.scheme) not in PAIRS:
        raise RouteUnavailable("Storage Transfer Service copies s3://, az:// or gs:// into gs:// here")
    _project(settings)
    _credentials(settings)
    transfer_spec(native.Transfer(ROUTE, src, dst, [], None), settings)


# -- an HTTP URL list as a source -------------------------------------------------------------

def is_url_list(source: str) -> bool:
    return source.startswith(("https://", "http://"))


def plan_url_list(list_url: str, destination: str, settings: Settings) -> native.Transfer:
    """The objects a URL list names: ``host/path`` under the destination, as the service names
    them, each with the size and MD5 the list gives (the service checks both)."""
    dst = parse(destination)
    if dst.scheme != "gs" or not dst.is_prefix:
        raise RouteUnavailable("route sts copies a URL list into a gs:// prefix (ending with '/')")
    try:
        with urllib.request.urlopen(list_url, timeout=settings.transfer.read_timeout) as response:
            lines = response.read().decode().splitlines()
    except OSError as exc:
        raise InvalidOption(f"cannot read the URL list {redact(list_url)}: {exc}") from None
    if not lines or lines[0].strip() != LIST_HEADER:
        raise InvalidOption(f"{redact(list_url)} is not a URL list: its first line must be {LIST_HEADER}")
    objects = []
    for n, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue
        fields = line.split("\t")
        try:
            url, size, md5 = fields[0], int(fields[1]), base64.b64decode(fields[2], validate=True).hex()
        except (IndexError, ValueError):
            raise InvalidOption(f"URL list line {n}: expected URL, size and base64 MD5 separated by tabs") from None
        split = urllib.parse.urlsplit(url)
        rel = split.netloc + urllib.parse.unquote(split.path)
        objects.append((rel, ObjectInfo(Location("https", split.netloc, split.path.lstrip("/")), size,
                                        {"md5": md5})))
    get_store(dst, settings).check_bucket(dst)
    return native.Transfer(ROUTE, Location("https", "", ""), dst, sorted(objects, key=lambda o: o[0]), None,
                           origin=redact(list_url))


# -- running ------------------------------------------------------------------------------------

def _failure(doing: str, exc: Exception) -> RouteFailed | PermissionDenied:
    message = getattr(exc, "message", None) or str(exc)
    line = native.one_line(f"Storage Transfer Service refused {doing}: {getattr(exc, 'code', '')} {message}")
    if getattr(exc, "code", None) == 403:
        failure = PermissionDenied(line + " (the caller needs roles/storagetransfer.user on the project)")
        failure.moved_data = False
        return failure
    return RouteFailed(line, moved_data=False)


def _remote(client, op_name: str) -> native.Remote:
    from google.api_core import exceptions as gexc
    try:
        op = client.get_operation({"name": op_name})
    except (gexc.GoogleAPICallError, gexc.RetryError, OSError) as exc:
        raise RouteFailed(native.one_line(f"lost track of Storage Transfer Service operation {op_name} (it may "
                                          f"still run; see it in the console): {exc}"), moved_data=True) from None
    return _read(op)


def _read(op) -> native.Remote:
    from google.cloud import storage_transfer
    meta = storage_transfer.TransferOperation.deserialize(op.metadata.value)
    counters = meta.counters
    status = storage_transfer.TransferOperation.Status
    state = {status.SUCCESS: "done", status.FAILED: "failed", status.ABORTED: "cancelled"}.get(meta.status, "running")
    if op.done and state == "running":
        state = "failed"   # done without a final status: treat as a failure, never a success
    error = ""
    if state == "failed":
        from google.rpc import code_pb2
        parts = [f"{code_pb2.Code.Name(int(b.error_code))} x{b.error_count}: "
                 + "; ".join(d for e in b.error_log_entries for d in e.error_details)
                 for b in meta.error_breakdowns]
        error = "; ".join(parts) or (op.error.message if op.HasField("error") else "no reason given")
    return native.Remote(state, int(counters.objects_copied_to_sink), int(counters.bytes_copied_to_sink), error)


def _delete_job(client, job_name: str, project: str) -> bool:
    """Delete a transfer job bridge created; whether it is gone (a job already deleted is)."""
    from google.api_core import exceptions as gexc
    try:
        client.delete_transfer_job({"job_name": job_name, "project_id": project})
    except gexc.NotFound:
        return True
    except (gexc.GoogleAPICallError, gexc.RetryError, OSError):
        return False
    return True


def _adopt(client, ledger: Ledger, interval: float, settings: Settings) -> tuple[str, str, str] | None:
    """What a killed run of this job left at the service: its (job, operation, project) when that
    operation runs or succeeded for the same objects (the re-run follows it instead of copying
    everything again); otherwise the operation is cancelled, the job and its transfer manifest
    deleted, and None returned."""
    from google.api_core import exceptions as gexc
    record = ledger.load()
    if not record:
        return None
    job_name, project, op_name = record.get("job", ""), record.get("project", ""), record.get("operation", "")
    try:
        if job_name and not op_name:   # killed between run and recording its operation, or before run
            try:
                op_name = client.get_transfer_job({"job_name": job_name, "project_id": project}).latest_operation_name
            except gexc.NotFound:
                op_name = ""
        if op_name:
            try:
                seen = _read(client.get_operation({"name": op_name}))
            except gexc.NotFound:
                seen = native.Remote("gone")
            if seen.state in ("running", "done") and ledger.matches(record):
                ledger.note(operation=op_name)
                return job_name, op_name, project
            if seen.state == "running":
                seen = native.stop_remote(lambda: _remote(client, op_name),
                                          lambda: client.cancel_operation({"name": op_name}), interval)
                if seen.state == "running":
                    raise RouteFailed(f"a killed run of this job left Storage Transfer Service operation {op_name} "
                                      f"running and it does not stop; cancel it in the console", moved_data=True)
    except (gexc.GoogleAPICallError, gexc.RetryError, OSError) as exc:
        raise RouteFailed(native.one_line(f"a killed run of this job left {job_name or op_name} at Storage Transfer "
                                          f"Service and bridge cannot reach it to adopt or cancel it: {exc}"),
                          moved_data=True) from None
    if job_name and not _delete_job(client, job_name, project):
        raise RouteFailed(f"a killed run of this job left {job_name} at Storage Transfer Service and bridge "
                          f"cannot delete it; run the copy again", moved_data=True)
    _drop_manifest(settings, record.get("manifest", ""))
    ledger.drop()
    return None


def run(transfer: native.Transfer, settings: Settings, *, progress: Progress, stop: threading.Event | None = None,
        count_files: bool = True, client=None, list_url: str | None = None, before_start=lambda: None) -> dict:
    """Create the transfer job, call ``before_start``, run it and follow its operation to the
    end; the job is deleted afterwards. Returns the names of the remote job and operation.
    RouteFailed(moved_data=False) when the service refused before any byte could move.

    The job's name is recorded in the state dir (bridge/routes/ledger.py) before it is created,
    and its operation's once it runs: a re-run after a kill follows that operation when it still
    runs (or succeeded) for the same objects, rather than starting a second one."""
    from google.api_core import exceptions as gexc
    from google.cloud import storage_transfer

    project = _project(settings)
    why = unnamable([rel for rel, _ in transfer.objects]) if transfer.filtered and not list_url else None
    if why:
        raise RouteUnavailable(why)
    client = client or client_for(settings)
    ledger = Ledger(settings, transfer)
    interval = settings.native.poll_interval
    adopted = _adopt(client, ledger, interval, settings)
    if adopted:
        job_name, op_name, project = adopted
        before_start()
    else:
        token = uuid.uuid4().hex
        job_name = f"transferJobs/mcbridge-{token}"
        manifest = _manifest_location(transfer, token) if transfer.filtered and not list_url else None
        job = {"name": job_name, "project_id": project, "status": storage_transfer.TransferJob.Status.ENABLED,
               "description": f"mcbridge copy to {transfer.dst_root}"[:1024],
               "transfer_spec": transfer_spec(transfer, settings, list_url, manifest)}
        ledger.begin(route=ROUTE, project=project, job=job_name, manifest=str(manifest or ""))
        if manifest is not None:   # named in the record first: a run killed now leaves no orphan
            _write_manifest(transfer, settings, token)
        try:
            client.create_transfer_job({"transfer_job": job})
        except (gexc.GoogleAPICallError, gexc.RetryError, OSError) as exc:
            if _delete_job(client, job_name, project):   # a create that timed out may have happened
                _drop_manifest(settings, ledger.get("manifest"))
                ledger.drop()
            raise _failure("to create the transfer job", exc) from None
        del job
    final = native.Remote("failed", error="not started")
    try:
        if not adopted:
            before_start()
            try:
                started = client.run_transfer_job({"job_name": job_name, "project_id": project})
            except (gexc.GoogleAPICallError, gexc.RetryError, OSError) as exc:
                raise _failure(f"to run {job_name}", exc) from None
            op_name = started.operation.name
            ledger.note(operation=op_name)
        final = native.follow(f"transfer operation {op_name}", lambda: _remote(client, op_name),
                              lambda: client.cancel_operation({"name": op_name}),
                              interval=interval, progress=progress, stop=stop, count_files=count_files)
    except JobCancelled:
        final = native.Remote("cancelled")
        raise
    finally:
        # A one-time job without a schedule never runs again; deleting it leaves nothing behind.
        # The record goes with it, unless the operation may still run (the service unreachable).
        if _delete_job(client, job_name, project) and final.state != "running":
            _drop_manifest(settings, ledger.get("manifest"))
            ledger.drop()
    if final.state != "done":
        raise RouteFailed(native.one_line(f"Storage Transfer Service operation {op_name} {final.state}: "
                                          f"{final.error}"),
                          moved_data=final.files_done > 0 or final.bytes_done > 0)
    return {"service": "storage-transfer", "project": project, "job": job_name, "operation": op_name,
            **({"adopted": True} if adopted else {})}


def copy(source: str, destination: str, settings: Settings, *, progress: Progress | None = None,
         stop: threading.Event | None = None, client=None) -> dict:
    """Copy ``source`` (s3://, az://, or the https:// URL of a TsvHttpData-1.0 list) into a
    gs:// ``destination`` with Storage Transfer Service and commit its manifest; the summary
    names the transfer job and operation. RouteUnavailable or RouteFailed(moved_data=False)
    leave the destination untouched."""
    progress = progress or Progress()
    list_url = source if is_url_list(source) else None
    transfer = plan_url_list(source, destination, settings) if list_url else \
        native.plan(ROUTE, source, destination, settings, PAIRS)
    progress.plan(transfer.bytes, len(transfer.objects))
    dst_store = get_store(transfer.dst_root, settings)
    remote = run(transfer, settings, progress=progress, stop=stop, client=client, list_url=list_url)
    return native.summary(transfer, progress, native.commit(transfer, settings), remote)
