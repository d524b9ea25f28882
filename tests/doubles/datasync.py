"""A loopback double of AWS DataSync's JSON 1.1 API (``POST /`` with ``X-Amz-Target:
FmrsService.<Operation>``), for real boto3 (``boto3.client("datasync", endpoint_url=...)``).

Emulated, each request's documented required members checked and refused in the service's error
shape (HTTP 400, ``{"__type": "InvalidRequestException", "message": ...}``):

    CreateLocationS3             S3BucketArn (arn:aws:s3:::bucket), S3Config.BucketAccessRoleArn
    CreateLocationObjectStorage  ServerHostname, BucketName; AccessKey and SecretKey together
    CreateLocationAzureBlob      ContainerUrl, AuthenticationType (SAS needs SasConfiguration.Token)
    CreateTask                   SourceLocationArn, DestinationLocationArn (existing locations);
                                 Options.VerifyMode; Includes of FilterType SIMPLE_PATTERN; TaskMode:
                                 ENHANCED refuses POINT_IN_TIME_CONSISTENT, a bandwidth limit, pairs
                                 without S3, and (``no_service_linked_role``) callers that may not
                                 create its service-linked role; BASIC needs AgentArns on
                                 object-storage and Azure locations
    StartTaskExecution           TaskArn; one execution of a task at a time
    DescribeTaskExecution        Status (QUEUED, TRANSFERRING, SUCCESS, ERROR), Estimated*, FilesTransferred,
                                 BytesWritten, BytesTransferred, FilesVerified, Result.ErrorCode/ErrorDetail
    CancelTaskExecution          the execution stops before its next object and ends ERROR, cancelled
    DescribeTask                 Status (AVAILABLE, RUNNING), CurrentTaskExecutionArn (its latest)
    DeleteTask, DeleteLocation

An execution moves the bytes: S3 locations are buckets of the moto given to the double (the role
is checked for form only); an object-storage location is read or written through the GCS JSON
API at ServerHostname:ServerPort (fake-gcs-server speaks no S3 listing: the real service uses the
S3-compatible XML API with the HMAC key, which the double checks only for presence); an Azure
location is its ContainerUrl with the SAS token. Include patterns (``|``-separated, ``*``
wildcards, a folder pattern including what is under it) are matched against ``/`` + the path
under the location's Subdirectory. ``deny_role`` answers AccessDenied-style InvalidRequestException
for locations with that role.

Not emulated: SigV4 checking (any signature passes), agents and their activation, NFS/SMB/HDFS/EFS/
FSx locations, Excludes, manifests, task reports, schedules, CloudWatch logging, Options other than
VerifyMode (overwrite, preserve, bandwidth), the verification pass itself (FilesVerified is the
count copied), List* calls, Describe* calls other than DescribeTask and DescribeTaskExecution,
the minutes the service takes to launch an execution.
"""

from __future__ import annotations

import fnmatch
import json
import re
import threading
import uuid

from tests.doubles.common import ApiError, AzureSide, GCSSide, LoopbackServer, Run, S3Side, now_rfc3339

ACCOUNT, REGION = "111122223333", "us-east-1"
ROLE_ARN = re.compile(r"^arn:aws[\-a-z]*:iam::\d{12}:role/[\w+=,.@/\-]+$")
BUCKET_ARN = re.compile(r"^arn:aws[\-a-z]*:s3:::([a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])$")
VERIFY_MODES = {"POINT_IN_TIME_CONSISTENT", "ONLY_FILES_TRANSFERRED", "NONE"}
STATUS = {"queued": "QUEUED", "running": "TRANSFERRING", "success": "SUCCESS", "failed": "ERROR",
          "cancelled": "ERROR"}


def _need(doc: dict, path: str) -> object:
    value = doc
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value in (None, "", [], {}):
        raise ApiError(400, "InvalidRequestException", f"{path} is required")
    return value


def _subdirectory(doc: dict) -> str:
    sub = doc.get("Subdirectory", "/").strip("/")
    return sub + "/" if sub else ""


def _matches(rel: str, patterns: list[str]) -> bool:
    path = "/" + rel
    return any(fnmatch.fnmatchcase(path, p) or path.startswith(p.rstrip("/") + "/") for p in patterns)


class DataSyncDouble:
    """``DataSyncDouble(s3_endpoint=moto.endpoint)`` as a context manager; ``delay`` seconds
    between objects of an execution; while ``paused`` is set, executions hold before their next
    object."""

    def __init__(self, *, s3_endpoint: str, delay: float = 0.0):
        self.s3_endpoint, self.delay = s3_endpoint, delay
        self.deny_role: str | None = None
        self.after_write = None   # called with each destination name once written (a third party's turn)
        # The caller may not create DataSync's service-linked role, which an Enhanced mode task needs
        # (iam:CreateServiceLinkedRole): CreateTask in Enhanced mode is refused, as the service does.
        self.no_service_linked_role = False
        self.paused = threading.Event()     # set: executions hold before their next object
        self.locations: dict[str, dict] = {}
        self.tasks: dict[str, dict] = {}
        self.executions: dict[str, tuple[dict, Run]] = {}
        self._lock = threading.Lock()
        self.server = LoopbackServer(self._handle)

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def __enter__(self) -> DataSyncDouble:
        self.server.start()
        return self

    def __exit__(self, *exc) -> None:
        self.paused.clear()
        for _task, run in self.executions.values():
            run.cancel()
        self.server.stop()

    def calls(self, operation: str) -> list[dict]:
        return [json.loads(b or b"{}") for _m, _p, h, b in self.server.requests
                if h.get("x-amz-target") == f"FmrsService.{operation}"]

    def _handle(self, method: str, path: str, headers: dict, body: bytes):
        target = headers.get("x-amz-target", "")
        kind = {"Content-Type": "application/x-amz-json-1.1"}
        try:
            if method != "POST" or path != "/" or not target.startswith("FmrsService."):
                raise ApiError(400, "InvalidRequestException", f"unknown request {method} {path} {target!r}")
            operation = getattr(self, "_op_" + target.split(".", 1)[1], None)
            if operation is None:
                raise ApiError(400, "InvalidRequestException", f"this double does not emulate {target}")
            try:
                doc = json.loads(body or b"{}")
            except ValueError:
                raise ApiError(400, "SerializationException", "body is not JSON") from None
            return 200, kind, json.dumps(operation(doc)).encode()
        except ApiError as exc:
            payload = {"__type": exc.code, "message": exc.message}
            return exc.status, {**kind, "x-amzn-ErrorType": exc.code}, json.dumps(payload).encode()

    def _arn(self, kind: str, prefix: str) -> str:
        return f"arn:aws:datasync:{REGION}:{ACCOUNT}:{kind}/{prefix}-{uuid.uuid4().hex[:17]}"

    # -- locations ----------------------------------------------------------------------------
    def _location(self, kind: str, doc: dict) -> dict:
        arn = self._arn("location", "loc")
        self.locations[arn] = {"kind": kind, **doc, "CreationTime": now_rfc3339()}
        return {"LocationArn": arn}

    def _op_CreateLocationS3(self, doc: dict) -> dict:
        bucket_arn, role = _need(doc, "S3BucketArn"), _need(doc, "S3Config.BucketAccessRoleArn")
        if not BUCKET_ARN.match(bucket_arn):
            raise ApiError(400, "InvalidRequestException", f"S3BucketArn {bucket_arn!r} is not an S3 bucket ARN")
        if not ROLE_ARN.match(role):
            raise ApiError(400, "InvalidRequestException", f"BucketAccessRoleArn {role!r} is not an IAM role ARN")
        if role == self.deny_role:
            raise ApiError(400, "InvalidRequestException", f"DataSync location access test failed: could not "
                                                           f"perform s3:ListObjectsV2 on bucket with role {role}")
        return self._location("s3", doc)

    def _op_CreateLocationObjectStorage(self, doc: dict) -> dict:
        _need(doc, "ServerHostname"), _need(doc, "BucketName")
        if bool(doc.get("AccessKey")) != bool(doc.get("SecretKey")):
            raise ApiError(400, "InvalidRequestException", "AccessKey and SecretKey go together")
        if doc.get("ServerProtocol", "HTTPS") not in ("HTTP", "HTTPS"):
            raise ApiError(400, "InvalidRequestException", "ServerProtocol must be HTTP or HTTPS")
        return self._location("object-storage", doc)

    def _op_CreateLocationAzureBlob(self, doc: dict) -> dict:
        _need(doc, "ContainerUrl")
        auth = _need(doc, "AuthenticationType")
        if auth not in ("SAS", "NONE"):
            raise ApiError(400, "InvalidRequestException", "AuthenticationType must be SAS or NONE")
        if auth == "SAS":
            _need(doc, "SasConfiguration.Token")
        return self._location("azure", doc)

    def _op_DeleteLocation(self, doc: dict) -> dict:
        if self.locations.pop(_need(doc, "LocationArn"), None) is None:
            raise ApiError(400, "InvalidRequestException", "location not found")
        return {}

    # -- tasks and executions -----------------------------------------------------------------
    def _op_CreateTask(self, doc: dict) -> dict:
        ends = [self.locations.get(_need(doc, key)) for key in ("SourceLocationArn", "DestinationLocationArn")]
        if None in ends:
            raise ApiError(400, "InvalidRequestException", "the source or destination location does not exist")
        verify = doc.get("Options", {}).get("VerifyMode", "POINT_IN_TIME_CONSISTENT")
        if verify not in VERIFY_MODES:
            raise ApiError(400, "InvalidRequestException", f"VerifyMode {verify!r} is not one of {sorted(VERIFY_MODES)}")
        mode = doc.get("TaskMode", "BASIC")
        if mode == "ENHANCED" and verify == "POINT_IN_TIME_CONSISTENT":
            raise ApiError(400, "InvalidRequestException", "Enhanced mode tasks do not support POINT_IN_TIME_CONSISTENT")
        if mode not in ("BASIC", "ENHANCED"):
            raise ApiError(400, "InvalidRequestException", f"TaskMode {mode!r} is not BASIC or ENHANCED")
        if mode == "ENHANCED":
            if self.no_service_linked_role:
                raise ApiError(400, "AccessDeniedException", "Enhanced mode needs DataSync's service-linked role, "
                                                             "and the caller may not create it "
                                                             "(iam:CreateServiceLinkedRole)")
            if doc.get("Options", {}).get("BytesPerSecond", -1) != -1:
                raise ApiError(400, "InvalidRequestException", "Enhanced mode tasks do not take a bandwidth limit "
                                                               "(Options.BytesPerSecond)")
            if not any(end["kind"] == "s3" for end in ends):
                raise ApiError(400, "InvalidRequestException", "Enhanced mode moves data to or from Amazon S3 only")
        if mode == "BASIC" and any(end["kind"] != "s3" and not end.get("AgentArns") for end in ends):
            raise ApiError(400, "InvalidRequestException", "a Basic mode task needs an agent for this location")
        for rule in doc.get("Includes", []):
            if rule.get("FilterType") != "SIMPLE_PATTERN" or not rule.get("Value"):
                raise ApiError(400, "InvalidRequestException", "Includes need FilterType SIMPLE_PATTERN and a Value")
        arn = self._arn("task", "task")
        self.tasks[arn] = {**doc, "VerifyMode": verify, "TaskMode": mode, "CreationTime": now_rfc3339()}
        return {"TaskArn": arn}

    def _op_DescribeTask(self, doc: dict) -> dict:
        arn = _need(doc, "TaskArn")
        task = self.tasks.get(arn)
        if task is None:
            raise ApiError(400, "InvalidRequestException", f"task {arn} not found")
        runs = [(a, r) for a, (t, r) in self.executions.items() if t is task]
        out = {"TaskArn": arn, "Name": task.get("Name", ""), "TaskMode": task["TaskMode"],
               "Status": "RUNNING" if any(not r.finished.is_set() for _a, r in runs) else "AVAILABLE",
               "SourceLocationArn": task["SourceLocationArn"],
               "DestinationLocationArn": task["DestinationLocationArn"],
               "Options": {**task.get("Options", {}), "VerifyMode": task["VerifyMode"]},
               "Includes": task.get("Includes", []), "CreationTime": task["CreationTime"]}
        if runs:
            out["CurrentTaskExecutionArn"] = runs[-1][0]
        return out

    def _op_DeleteTask(self, doc: dict) -> dict:
        if self.tasks.pop(_need(doc, "TaskArn"), None) is None:
            raise ApiError(400, "InvalidRequestException", "task not found")
        return {}

    def _side(self, location: dict):
        sub = _subdirectory(location)
        if location["kind"] == "s3":
            bucket = BUCKET_ARN.match(location["S3BucketArn"]).group(1)
            return lambda: S3Side(self.s3_endpoint, bucket, sub)
        if location["kind"] == "object-storage":
            scheme = location.get("ServerProtocol", "HTTPS").lower()
            port = location.get("ServerPort") or (443 if scheme == "https" else 80)
            endpoint = f"{scheme}://{location['ServerHostname']}:{port}"
            return lambda: GCSSide(endpoint, location["BucketName"], sub)
        return lambda: AzureSide(location["ContainerUrl"], location.get("SasConfiguration", {}).get("Token", ""), sub)

    def _op_StartTaskExecution(self, doc: dict) -> dict:
        task_arn = _need(doc, "TaskArn")
        task = self.tasks.get(task_arn)
        if task is None:
            raise ApiError(400, "InvalidRequestException", f"task {task_arn} not found")
        with self._lock:
            if any(t is task and not r.finished.is_set() for t, r in self.executions.values()):
                raise ApiError(400, "InvalidRequestException", "the task already has an execution running")
            includes = doc.get("Includes") or task.get("Includes") or []
            patterns = [p for rule in includes for p in rule["Value"].split("|") if p]
            run = Run(self._side(self.locations[task["SourceLocationArn"]]),
                      self._side(self.locations[task["DestinationLocationArn"]]),
                      include=lambda rel: not patterns or _matches(rel, patterns), delay=self.delay,
                      after_write=self.after_write)
            arn = f"{task_arn}/execution/exec-{uuid.uuid4().hex[:17]}"
            self.executions[arn] = (task, run.pausable(self.paused).start())
        return {"TaskExecutionArn": arn}

    def _execution(self, doc: dict) -> tuple[str, dict, Run]:
        arn = _need(doc, "TaskExecutionArn")
        if arn not in self.executions:
            raise ApiError(400, "InvalidRequestException", f"task execution {arn} not found")
        return (arn, *self.executions[arn])

    def _op_DescribeTaskExecution(self, doc: dict) -> dict:
        arn, task, run = self._execution(doc)
        status = STATUS[run.state]
        if run.cancel_requested.is_set() and not run.finished.is_set():
            status = "CANCELLING"
        result = {"TransferStatus": "SUCCESS" if run.state == "success" else "PENDING"}
        if run.state == "failed":
            result.update(TransferStatus="ERROR", ErrorCode="OpNotPermitted" if "denied" in run.error.lower()
                          or "authoriz" in run.error.lower() else "InternalError", ErrorDetail=run.error[:300])
        if run.state == "cancelled":
            result.update(TransferStatus="ERROR", ErrorCode="Cancelled", ErrorDetail="Task execution cancelled by user")
        return {"TaskExecutionArn": arn, "Status": status, "Options": {"VerifyMode": task["VerifyMode"]},
                "Includes": task.get("Includes", []), "EstimatedFilesToTransfer": run.objects_found,
                "EstimatedBytesToTransfer": run.bytes_found, "FilesTransferred": run.objects_copied,
                "BytesWritten": run.bytes_copied, "BytesTransferred": run.bytes_copied,
                "FilesVerified": run.objects_copied if run.state == "success" and task["VerifyMode"] != "NONE" else 0,
                "Result": result}

    def _op_CancelTaskExecution(self, doc: dict) -> dict:
        _arn, _task, run = self._execution(doc)
        if run.finished.is_set():
            raise ApiError(400, "InvalidRequestException", "the task execution has already ended")
        run.cancel()
        return {}
