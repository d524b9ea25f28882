"""The ``datasync`` route: AWS DataSync copies between S3 and GCS or Azure Blob (and S3 to S3),
through boto3.

One bridge copy is two locations, one task and one task execution: ``CreateLocationS3`` (with
the IAM role DataSync assumes, ``native.datasync_s3_role_arn``), ``CreateLocationObjectStorage``
for GCS through its S3-compatible XML API (an HMAC key, ``native.gcs_hmac_access_id`` and
``native.gcs_hmac_secret``, at ``native.gcs_xml_endpoint``), ``CreateLocationAzureBlob`` with a
SAS (``azure.sas_token``, else one bridge signs with the account key for the container);
``CreateTask`` with ``VerifyMode`` ONLY_FILES_TRANSFERRED (DataSync checks what it wrote) and, for
some of a prefix's objects, an include filter naming each (``include_filter``: ``|`` separates its
patterns and ``*`` is a wildcard, with no escape for either, so a name holding one cannot be named
exactly: such a job is refused before any request and goes ``direct`` on the route seam); ``StartTaskExecution``; ``DescribeTaskExecution`` until
it ends; ``CancelTaskExecution`` when the bridge job is cancelled. Task and locations are deleted
afterwards; their ARNs are recorded in the state dir meanwhile, so that the re-run of a killed
copy adopts its execution or deletes them (``run``).

The task mode is a setting (``native.datasync_task_mode``), sent as CreateTask's ``TaskMode``
and priced by it (policies/cost/prices/aws.yaml): ENHANCED, the default, DataSync's agentless mode
between clouds (the caller needs ``iam:CreateServiceLinkedRole``; no agent, no bandwidth limit);
BASIC reaches GCS or Azure through agents (``native.datasync_agent_arns``). What a mode cannot do
is refused before any request, as are missing AWS credentials (``check``).

S3 reports a full-object CRC32C only for objects written with one; where DataSync left none,
bridge asks S3 to compute it by copying the object onto itself with ``ChecksumAlgorithm=CRC32C``
(a request inside S3; no byte passes through bridge; objects up to 5 GiB), so that the manifest
holds a CRC32C that S3 itself computed, compared with the one the source reports.
"""

from __future__ import annotations

import threading
import urllib.parse
import uuid

from bridge.routes import delegated as native
from bridge.config import Settings
from bridge.errors import BridgeError, JobCancelled, MissingBackend, PermissionDenied, RouteFailed, RouteUnavailable
from bridge.routes.ledger import Ledger
from bridge.registry import install_hint
from bridge.progress import Progress
from bridge.stores import get_store
from bridge.stores.base import GiB, ObjectInfo, Store
from bridge.urls import Location

ROUTE = "datasync"
PAIRS = {("gs", "s3"), ("az", "s3"), ("s3", "gs"), ("s3", "az"), ("s3", "s3")}
SAS_DAYS = 7
MAX_FILTER = 102_400          # characters in one include filter's Value
COPY_LIMIT = 5 * GiB          # CopyObject's limit: larger objects keep the source's CRC32C
ENDED = {"SUCCESS": "done", "ERROR": "failed"}


def _boto_session(settings: Settings):
    try:
        import boto3
    except ImportError as exc:
        raise MissingBackend(f"the datasync route needs the 'native' extra: {install_hint('native')}") from exc
    s3 = settings.s3
    return boto3.session.Session(
        aws_access_key_id=s3.access_key_id, profile_name=s3.profile,
        aws_secret_access_key=s3.secret_access_key.get_secret_value() if s3.secret_access_key else None,
        aws_session_token=s3.session_token.get_secret_value() if s3.session_token else None)


def client_for(settings: Settings):
    region = settings.native.datasync_region or settings.s3.region
    if not region:
        raise RouteUnavailable("route datasync needs the AWS region that runs the task: set "
                               "native.datasync_region (or s3.region, AWS_REGION)")
    return _boto_session(settings).client("datasync", region_name=region,
                                          endpoint_url=settings.native.datasync_endpoint)


def _sub(loc: Location) -> str:
    return "/" + loc.as_prefix().key


def _sas(loc: Location, settings: Settings, writing: bool) -> tuple[str, str]:
    """(container URL, SAS token) for an Azure location."""
    client = get_store(loc, settings).client
    url = f"{client.url.split('?')[0].rstrip('/')}/{loc.bucket}"
    if settings.azure.sas_token:
        return url, settings.azure.sas_token.get_secret_value().lstrip("?")
    key = getattr(client.credential, "account_key", None)
    if not key:
        raise RouteUnavailable("route datasync needs a SAS token for Azure: set azure.sas_token, or an account "
                               "key so that bridge can sign one")
    import datetime as dt
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas
    perms = ContainerSasPermissions(read=True, list=True, write=writing, add=writing, create=writing,
                                    delete=writing)
    return url, generate_container_sas(client.account_name, loc.bucket, account_key=key, permission=perms,
                                       expiry=dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=SAS_DAYS))


def location_request(loc: Location, settings: Settings, writing: bool) -> tuple[str, dict]:
    """(operation, request) creating the DataSync location of ``loc`` (holds its credentials)."""
    basic = settings.native.datasync_task_mode == "BASIC"
    agents = {"AgentArns": list(settings.native.datasync_agent_arns)} if basic else {}
    if loc.scheme == "s3":
        role = settings.native.datasync_s3_role_arn
        if not role:
            raise RouteUnavailable("route datasync needs the IAM role DataSync assumes to reach S3: set "
                                   "native.datasync_s3_role_arn")
        return "create_location_s3", {"S3BucketArn": f"arn:aws:s3:::{loc.bucket}", "Subdirectory": _sub(loc),
                                      "S3Config": {"BucketAccessRoleArn": role}}
    if loc.scheme == "gs":
        n = settings.native
        if not (n.gcs_hmac_access_id and n.gcs_hmac_secret):
            raise RouteUnavailable("route datasync reaches GCS through its XML API with an HMAC key: set "
                                   "native.gcs_hmac_access_id and native.gcs_hmac_secret")
        server = urllib.parse.urlsplit(n.gcs_xml_endpoint)
        protocol = "HTTP" if server.scheme == "http" else "HTTPS"
        return "create_location_object_storage", {
            "ServerHostname": server.hostname, "ServerPort": server.port or (80 if protocol == "HTTP" else 443),
            "ServerProtocol": protocol, "BucketName": loc.bucket, "Subdirectory": _sub(loc),
            "AccessKey": n.gcs_hmac_access_id, "SecretKey": n.gcs_hmac_secret.get_secret_value(), **agents}
    url, sas = _sas(loc, settings, writing)
    return "create_location_azure_blob", {"ContainerUrl": url, "AuthenticationType": "SAS",
                                          "SasConfiguration": {"Token": sas}, "BlobType": "BLOCK",
                                          "Subdirectory": _sub(loc), **agents}


def unnamable(rels: list[str], listed=()) -> str | None:
    """Why one task's include filter cannot name exactly these objects among the source's
    ``listed`` names, or None when it can."""
    odd = next((rel for rel in rels if "|" in rel or "*" in rel), None)
    if odd is not None:
        return (f"route datasync cannot name {odd!r} in an include filter: DataSync reads '|' as the "
                f"separator of its patterns and '*' as a wildcard, and escapes neither")
    if sum(len(rel) + 2 for rel in rels) > MAX_FILTER:
        return f"route datasync cannot name {len(rels):,} objects in one include filter ({MAX_FILTER:,} characters)"
    folder = _folder_named(rels, listed)
    if folder is not None:
        return (f"route datasync cannot name {folder!r} alone in an include filter: DataSync reads the pattern "
                f"'/{folder}' as the folder {folder}/ too, and other objects of the source are under it")
    return None


def _folder_named(rels: list[str], listed) -> str | None:
    """A name of ``rels`` that is a folder of a ``listed`` name outside ``rels``: a pattern for it
    would take that object too."""
    named = set(rels)
    for name in listed:
        if name in named:
            continue
        parts = name.split("/")
        head = next(("/".join(parts[:i]) for i in range(1, len(parts)) if "/".join(parts[:i]) in named), None)
        if head is not None:
            return head
    return None


def include_filter(rels: list[str], listed=()) -> list[dict]:
    """The task's Includes naming exactly ``rels`` (relative to the source's Subdirectory), among
    the source's ``listed`` names."""
    why = unnamable(rels, listed)
    if why:
        raise RouteUnavailable(why)
    return [{"FilterType": "SIMPLE_PATTERN", "Value": "|".join("/" + rel for rel in rels)}]


def _under(transfer: native.Transfer, settings: Settings) -> list[str]:
    """For one object: the names under it as a folder (its pattern would take them); a filtered
    prefix was listed whole when planned (bridge/routes/native.py passes that listing)."""
    if transfer.single is None or len(transfer.objects) != 1:
        return []
    rel = transfer.objects[0][0]
    folder = transfer.src_root.join(rel).as_prefix()
    first = next(iter(get_store(folder, settings).list(folder)), None)
    return [first.location.relative_to(transfer.src_root)] if first is not None else []


def check(src: Location, dst: Location, settings: Settings) -> None:
    """RouteUnavailable unless the settings hold what a task from ``src`` to ``dst`` needs (no request)."""
    if (src.scheme, dst.scheme) not in PAIRS:
        raise RouteUnavailable("DataSync copies between s3:// and gs://, az:// or s3:// here")
    if not (settings.native.datasync_region or settings.s3.region):
        raise RouteUnavailable("route datasync needs the AWS region that runs the task: set "
                               "native.datasync_region (or s3.region, AWS_REGION)")
    _mode(src, dst, settings)
    location_request(src, settings, False)
    location_request(dst, settings, True)
    _aws_credentials(settings)


def _mode(src: Location, dst: Location, settings: Settings) -> None:
    """RouteUnavailable when the task mode cannot carry the pair as the settings give it."""
    n = settings.native
    if n.datasync_task_mode == "ENHANCED" and n.datasync_agent_arns:
        raise RouteUnavailable("route datasync: an Enhanced mode task runs without agents; set "
                               "native.datasync_task_mode to BASIC to use native.datasync_agent_arns")
    other = [loc.scheme for loc in (src, dst) if loc.scheme != "s3"]
    if n.datasync_task_mode == "BASIC" and other and not n.datasync_agent_arns:
        raise RouteUnavailable(f"route datasync: a Basic mode task reaches {other[0]}:// through a DataSync "
                               f"agent; set native.datasync_agent_arns, or native.datasync_task_mode ENHANCED")


def _aws_credentials(settings: Settings) -> None:
    """RouteUnavailable unless boto3 finds AWS credentials to call DataSync with (no request to
    the service): without them the first call failed after the copy had been planned."""
    try:
        found = _boto_session(settings).get_credentials()
    except Exception as exc:   # botocore's profile and provider errors: what it says is the reason
        raise RouteUnavailable(f"route datasync cannot read AWS credentials: {native.one_line(str(exc), 200)}") from None
    if found is None:
        raise RouteUnavailable("route datasync needs AWS credentials to call DataSync: set AWS_ACCESS_KEY_ID and "
                               "AWS_SECRET_ACCESS_KEY (s3.access_key_id, s3.secret_access_key) or AWS_PROFILE")


def _error(exc: Exception) -> str:
    code = getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)
    message = getattr(exc, "response", {}).get("Error", {}).get("Message", str(exc))
    return f"{code}: {message}"


def _refused(doing: str, exc: Exception) -> BridgeError:
    line = native.one_line(f"DataSync refused {doing}: {_error(exc)}")
    status = getattr(exc, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
    if status == 403 or "AccessDenied" in line:
        failure = PermissionDenied(line + " (the caller needs datasync:* and iam:PassRole on the role, and for an "
                                          "Enhanced mode task, one without an agent, iam:CreateServiceLinkedRole)")
    else:
        failure = RouteFailed(line, moved_data=False)
    failure.moved_data = False
    return failure


def _remote(client, arn: str, cancelling: threading.Event) -> native.Remote:
    from botocore.exceptions import BotoCoreError, ClientError
    try:
        ex = client.describe_task_execution(TaskExecutionArn=arn)
    except (ClientError, BotoCoreError) as exc:
        raise RouteFailed(native.one_line(f"lost track of DataSync task execution {arn} (it may still run; "
                                          f"see it in the console): {_error(exc)}"), moved_data=True) from None
    state = ENDED.get(ex["Status"], "running")
    if state == "failed" and cancelling.is_set():
        state = "cancelled"
    result = ex.get("Result", {})
    error = f"{result.get('ErrorCode', 'error')}: {result.get('ErrorDetail', 'no detail given')}" if state == "failed" else ""
    return native.Remote(state, int(ex.get("FilesTransferred", 0)), int(ex.get("BytesWritten", 0)), error)


def _with_crc32c(settings: Settings):
    """How commit reads a written object: an S3 object with no full-object CRC32C gets one that
    S3 computes, by an in-place copy (objects up to COPY_LIMIT)."""
    s3 = None

    def look(store: Store, loc: Location) -> ObjectInfo:
        nonlocal s3
        info = store.info(loc)
        if loc.scheme != "s3" or "crc32c" in info.checksums or info.size > COPY_LIMIT:
            return info
        s3 = s3 or _boto_session(settings).client("s3", endpoint_url=settings.s3.endpoint_url,
                                                  region_name=settings.s3.region)
        head = s3.head_object(Bucket=loc.bucket, Key=loc.key)
        extra = {k: head[k] for k in ("ContentType", "ContentEncoding", "CacheControl") if head.get(k)}
        s3.copy_object(Bucket=loc.bucket, Key=loc.key, CopySource={"Bucket": loc.bucket, "Key": loc.key},
                       ChecksumAlgorithm="CRC32C", MetadataDirective="REPLACE", Metadata=head.get("Metadata", {}),
                       CopySourceIfMatch=head["ETag"], **extra)
        return store.info(loc)
    return look


def _gone(exc: Exception) -> bool:
    """Whether DataSync's answer says the resource does not exist (it answers 400 for that)."""
    return "not found" in _error(exc).lower() or "does not exist" in _error(exc).lower()


def _delete(client, made: list[tuple[str, str]]) -> bool:
    """Delete what bridge created, in reverse; whether all of it is gone."""
    from botocore.exceptions import BotoCoreError, ClientError
    gone = True
    for operation, arn in reversed(made):
        try:
            getattr(client, operation)(**({"TaskArn": arn} if operation == "delete_task" else {"LocationArn": arn}))
        except ClientError as exc:
            gone = gone and _gone(exc)
        except BotoCoreError:
            gone = False
    return gone


def _made(record: dict) -> list[tuple[str, str]]:
    made = [("delete_location", arn) for arn in record.get("locations", [])]
    return made + ([("delete_task", record["task"])] if record.get("task") else [])


def _adopt(client, ledger: Ledger, interval: float) -> tuple[str, str, list[tuple[str, str]]] | None:
    """What a killed run of this job left at DataSync: its (task, execution, what to delete)
    when that execution runs or succeeded for the same objects (the re-run follows it instead of
    copying everything again); otherwise the execution is cancelled, task and locations deleted,
    and None returned."""
    from botocore.exceptions import BotoCoreError, ClientError
    record = ledger.load()
    if not record:
        return None
    task, arn, made = record.get("task", ""), record.get("execution", ""), _made(record)
    cancelling = threading.Event()
    try:
        if task and not arn:   # killed between start and recording the execution, or before start
            try:
                arn = client.describe_task(TaskArn=task).get("CurrentTaskExecutionArn", "")
            except ClientError as exc:
                if not _gone(exc):
                    raise
        if arn:
            try:
                seen = _remote(client, arn, cancelling)
            except RouteFailed:
                seen = native.Remote("gone")
            if seen.state in ("running", "done") and ledger.matches(record):
                ledger.note(execution=arn)
                return task, arn, made

            def cancel() -> None:
                cancelling.set()
                client.cancel_task_execution(TaskExecutionArn=arn)
            if seen.state == "running" and native.stop_remote(lambda: _remote(client, arn, cancelling), cancel,
                                                              interval).state == "running":
                raise RouteFailed(f"a killed run of this job left DataSync task execution {arn} running and it "
                                  f"does not stop; cancel it in the console", moved_data=True)
    except (ClientError, BotoCoreError) as exc:
        raise RouteFailed(native.one_line(f"a killed run of this job left {arn or task or 'locations'} at DataSync "
                                          f"and bridge cannot reach it to adopt or cancel it: {_error(exc)}"),
                          moved_data=True) from None
    if not _delete(client, made):
        raise RouteFailed(native.one_line(f"a killed run of this job left {task or 'locations'} at DataSync and "
                                          f"bridge cannot delete them; run the copy again"), moved_data=True)
    ledger.drop()
    return None


def run(transfer: native.Transfer, settings: Settings, *, progress: Progress, stop: threading.Event | None = None,
        count_files: bool = True, client=None, before_start=lambda: None) -> dict:
    """Create the locations and the task, call ``before_start``, start an execution and follow
    it to the end; task and locations are deleted afterwards. Returns the remote names.
    RouteFailed(moved_data=False) when the service refused before any byte could move.

    Each ARN is recorded in the state dir (bridge/routes/ledger.py) as the service gives it,
    and the execution's once started: a re-run after a kill follows that execution when it still
    runs (or succeeded) for the same objects, rather than starting a second one; otherwise it
    cancels it and deletes the task and locations first. (A kill in the instant between the
    service creating a location and bridge reading its answer leaves that location unrecorded.)"""
    from botocore.exceptions import BotoCoreError, ClientError

    includes = include_filter([rel for rel, _ in transfer.objects], _under(transfer, settings)) \
        if transfer.filtered else None
    requests = [location_request(transfer.src_root, settings, False),
                location_request(transfer.dst_root, settings, True)]
    client = client or client_for(settings)
    ledger = Ledger(settings, transfer)
    interval = settings.native.poll_interval
    cancelling = threading.Event()
    adopted = _adopt(client, ledger, interval)
    final = native.Remote("failed", error="not started")
    made: list[tuple[str, str]] = []      # (delete operation, arn), undone in reverse at the end
    try:
        if adopted:
            task_arn, arn, made = adopted
            del requests
            before_start()
        else:
            ledger.begin(route=ROUTE, locations=[])
            try:
                arns = []
                for operation, request in requests:
                    arns.append(getattr(client, operation)(**request)["LocationArn"])
                    made.append(("delete_location", arns[-1]))
                    ledger.note(locations=list(arns))
                del requests
                task = {"SourceLocationArn": arns[0], "DestinationLocationArn": arns[1],
                        "Name": f"mcbridge-{uuid.uuid4().hex[:12]}", "TaskMode": settings.native.datasync_task_mode,
                        "Options": {"VerifyMode": "ONLY_FILES_TRANSFERRED", "OverwriteMode": "ALWAYS",
                                    "PreserveDeletedFiles": "PRESERVE", "TransferMode": "ALL"}}
                if includes:
                    task["Includes"] = includes
                task_arn = client.create_task(**task)["TaskArn"]
                made.append(("delete_task", task_arn))
                ledger.note(task=task_arn)
            except (ClientError, BotoCoreError) as exc:
                raise _refused("to set up the task", exc) from None
            before_start()
            try:
                arn = client.start_task_execution(TaskArn=task_arn)["TaskExecutionArn"]
            except (ClientError, BotoCoreError) as exc:
                raise _refused(f"to start {task_arn}", exc) from None
            ledger.note(execution=arn)

        def cancel() -> None:
            cancelling.set()
            client.cancel_task_execution(TaskExecutionArn=arn)
        final = native.follow(f"DataSync task execution {arn}", lambda: _remote(client, arn, cancelling), cancel,
                              interval=interval, progress=progress, stop=stop, count_files=count_files)
    except JobCancelled:
        final = native.Remote("cancelled")
        raise
    finally:
        # A task left behind does not run again by itself, but it and its locations (which hold
        # credentials) are bridge's to remove; the record goes with them.
        if _delete(client, made) and final.state != "running":
            ledger.drop()
    if final.state != "done":
        raise RouteFailed(native.one_line(f"DataSync task execution {arn} {final.state}: {final.error}"),
                          moved_data=final.files_done > 0 or final.bytes_done > 0)
    return {"service": "datasync", "task": task_arn, "execution": arn, **({"adopted": True} if adopted else {})}


def copy(source: str, destination: str, settings: Settings, *, progress: Progress | None = None,
         stop: threading.Event | None = None, client=None) -> dict:
    """Copy ``source`` to ``destination`` with DataSync (one of PAIRS) and commit its manifest;
    the summary names the task and its execution. RouteUnavailable or
    RouteFailed(moved_data=False) leave the destination untouched."""
    progress = progress or Progress()
    transfer = native.plan(ROUTE, source, destination, settings, PAIRS)
    progress.plan(transfer.bytes, len(transfer.objects))
    dst_store = get_store(transfer.dst_root, settings)
    remote = run(transfer, settings, progress=progress, stop=stop, client=client)
    return native.summary(transfer, progress, native.commit(transfer, settings, _with_crc32c(settings)), remote)
