"""A loopback double of Google Storage Transfer Service, REST v1, for the real
``google-cloud-storage-transfer`` client (``client_options={"api_endpoint": double.endpoint}``,
``transport="rest"``, anonymous credentials).

Emulated, with the documented required fields checked and refused in Google's error shape
(``{"error": {"code": 400, "message": ..., "status": "INVALID_ARGUMENT"}}``):

    POST   /v1/transferJobs                          create: projectId, status, transferSpec with
                                                     one source (awsS3DataSource, azureBlobStorage-
                                                     DataSource, httpDataSource, gcsDataSource)
                                                     and gcsDataSink;
                                                     a client-chosen name must match the documented
                                                     pattern; paths are "" or end with "/"
    POST   /v1/transferJobs/{id}:run                 projectId; starts an operation
    GET    /v1/transferJobs/{id}?projectId=          the job, credentials left out (input-only), with
                                                     latestOperationName once it has run
    DELETE /v1/transferJobs/{id}?projectId=
    GET    /v1/transferOperations/{id}               google.longrunning.Operation whose metadata is a
                                                     TransferOperation: status, counters, errorBreakdowns
    POST   /v1/transferOperations/{id}:cancel        the run stops before its next object: ABORTED

An operation really moves the bytes: from moto (S3, read with the access key in the spec), from
Azurite (with the SAS in the spec), from fake-gcs-server, or from the URLs of a TsvHttpData-1.0 list (checking each
object's size and MD5), into fake-gcs-server, under ``gcsDataSink.path`` (an HTTP object is named
``host/path``, as the service names it). ``objectConditions.includePrefixes`` filter by prefix; the
service's rules for them are checked at create (at most 1,000, none empty, over 1,024 bytes, with a
leading "/" or a line break, and none a prefix of another).
``deny_projects`` answers PERMISSION_DENIED and ``quota_exhausted`` RESOURCE_EXHAUSTED on create.

Not emulated: authentication (any caller is accepted), IAM (a roleArn is checked for form only,
and S3 is then read with moto's test keys), schedules and event-driven jobs, agent pools and
POSIX/HDFS sources, the service agent's access to GCS buckets, transferOptions (overwrite, delete, metadata), a manifest's generation column,
logging and notifications, pagination of list calls, the
service's own retries and parallelism, the minutes a real job takes to be scheduled.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import re
import threading
import time
import urllib.parse
import urllib.request

from tests.doubles.common import (ApiError, AzureSide, GCSSide, LoopbackServer, Run, S3Side, Side,
                                  now_rfc3339)

JOB_NAME = re.compile(r"^transferJobs/[A-Za-z0-9\-._~]*[A-Za-z0-9]$")
ROLE_ARN = re.compile(r"^arn:aws:iam::\d{12}:role/[\w+=,.@/\-]+$")
SOURCES = ("awsS3DataSource", "azureBlobStorageDataSource", "httpDataSource", "gcsDataSource",
           "posixDataSource", "awsS3CompatibleDataSource", "hdfsDataSource")
SECRETS = ("awsAccessKey", "azureCredentials")          # input-only: never returned
STATES = {"queued": "QUEUED", "running": "IN_PROGRESS", "success": "SUCCESS", "failed": "FAILED",
          "cancelled": "ABORTED"}
STATUS_NAMES = {0: "STATUS_UNSPECIFIED", 1: "ENABLED", 2: "DISABLED", 3: "DELETED"}
HTTP_STATUS = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 404: "NOT_FOUND", 409: "ALREADY_EXISTS",
               429: "RESOURCE_EXHAUSTED", 501: "UNIMPLEMENTED"}


def _need(doc: dict, path: str) -> object:
    value = doc
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value in (None, "", {}):
        raise ApiError(400, "INVALID_ARGUMENT", f"{path} is required")
    return value


def _path_ok(doc: dict, field: str, where: str) -> None:
    value = doc.get(field, "")
    if value and (not value.endswith("/") or value.startswith("/")):
        raise ApiError(400, "INVALID_ARGUMENT", f"{where}.{field} must be empty or a path that ends with '/'"
                                                f" and does not start with '/': {value!r}")


class HttpListSide(Side):
    """The objects of a TsvHttpData-1.0 URL list; named host/path, as the service names them."""

    def __init__(self, list_url: str):
        with urllib.request.urlopen(list_url, timeout=10) as response:
            lines = response.read().decode().splitlines()
        if not lines or lines[0].strip() != "TsvHttpData-1.0":
            raise ValueError(f"{list_url}: not a TsvHttpData-1.0 list")
        self.entries = {}
        for line in filter(None, (ln.strip() for ln in lines[1:])):
            url, size, md5 = (line.split("\t") + ["", ""])[:3]
            split = urllib.parse.urlsplit(url)
            self.entries[split.netloc + urllib.parse.unquote(split.path)] = (url, int(size or 0), md5)

    def list(self) -> list[tuple[str, int]]:
        return [(rel, size) for rel, (_url, size, _md5) in self.entries.items()]

    def read(self, rel: str) -> bytes:
        url, size, md5 = self.entries[rel]
        with urllib.request.urlopen(url, timeout=10) as response:
            data = response.read()
        if len(data) != size or (md5 and base64.b64encode(hashlib.md5(data).digest()).decode() != md5):
            raise ValueError(f"{url}: size or MD5 differs from the URL list")
        return data


class Named(Side):
    """The objects a transfer manifest names, and only those; a named object the source lacks
    fails the run, as the service reports it."""

    def __init__(self, side: Side, names: set[str]):
        self.side, self.names = side, names

    def list(self) -> list[tuple[str, int]]:
        listed = [(rel, size) for rel, size in self.side.list() if rel in self.names]
        missing = self.names - {rel for rel, _ in listed}
        if missing:
            raise FileNotFoundError(f"404 NotFound: {sorted(missing)[0]!r} from the transfer manifest is not in "
                                    f"the source")
        return listed

    def read(self, rel: str) -> bytes:
        return self.side.read(rel)


class StorageTransferDouble:
    """``StorageTransferDouble(s3_endpoint=..., gcs_endpoint=..., azure_endpoint=...)`` as a
    context manager; ``azure_endpoint`` may hold ``{account}``. ``delay`` seconds between objects;
    while ``paused`` is set, operations hold before their next object."""

    def __init__(self, *, gcs_endpoint: str, s3_endpoint: str | None = None, azure_endpoint: str | None = None,
                 delay: float = 0.0):
        self.gcs_endpoint, self.s3_endpoint, self.azure_endpoint = gcs_endpoint, s3_endpoint, azure_endpoint
        self.delay = delay
        self.deny_projects: set[str] = set()
        self.quota_exhausted = False
        self.after_write = None   # called with each destination name once written (a third party's turn)
        self.paused = threading.Event()     # set: operations hold before their next object
        self.jobs: dict[str, dict] = {}
        self.operations: dict[str, tuple[dict, Run]] = {}
        self._lock = threading.Lock()
        self.server = LoopbackServer(self._handle)

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def __enter__(self) -> StorageTransferDouble:
        self.server.start()
        return self

    def __exit__(self, *exc) -> None:
        self.paused.clear()
        for _op, run in self.operations.values():
            run.cancel()
        self.server.stop()

    # -- HTTP ---------------------------------------------------------------------------------
    def _handle(self, method: str, raw_path: str, headers: dict, body: bytes):
        split = urllib.parse.urlsplit(raw_path)
        path, query = urllib.parse.unquote(split.path), dict(urllib.parse.parse_qsl(split.query))
        try:
            doc = json.loads(body) if body else {}
            if method == "POST" and path == "/v1/transferJobs":
                return self._ok(self._create(doc))
            if m := re.fullmatch(r"/v1/(transferJobs/.+):run", path):
                return self._ok(self._run(m.group(1), doc) if method == "POST" else self._no(path))
            if m := re.fullmatch(r"/v1/(transferOperations/.+):cancel", path):
                return self._ok(self._cancel(m.group(1)) if method == "POST" else self._no(path))
            if m := re.fullmatch(r"/v1/(transferOperations/.+)", path):
                return self._ok(self._operation(m.group(1)) if method == "GET" else self._no(path))
            if m := re.fullmatch(r"/v1/(transferJobs/.+)", path):
                job = self._job(m.group(1), query.get("projectId", ""))
                if method == "DELETE":
                    job["status"] = "DELETED"
                    return self._ok({})
                return self._ok(self._public(job) if method == "GET" else self._no(path))
            return self._no(path)
        except ApiError as exc:
            payload = {"error": {"code": exc.status, "message": exc.message, "status": exc.code}}
            return exc.status, {"Content-Type": "application/json"}, json.dumps(payload).encode()
        except ValueError as exc:
            payload = {"error": {"code": 400, "message": f"invalid JSON: {exc}", "status": "INVALID_ARGUMENT"}}
            return 400, {"Content-Type": "application/json"}, json.dumps(payload).encode()

    @staticmethod
    def _ok(doc: dict):
        return 200, {"Content-Type": "application/json"}, json.dumps(doc).encode()

    @staticmethod
    def _no(path: str):
        raise ApiError(404, "NOT_FOUND", f"no such method: {path}")

    # -- transferJobs -------------------------------------------------------------------------
    def _create(self, job: dict) -> dict:
        project = _need(job, "projectId")
        if project in self.deny_projects:
            raise ApiError(403, "PERMISSION_DENIED", f"The caller does not have permission to create transfer "
                                                     f"jobs in project {project}")
        if self.quota_exhausted:
            raise ApiError(429, "RESOURCE_EXHAUSTED", "Quota exceeded for quota metric 'Transfer jobs'")
        status = job.get("status")
        status = STATUS_NAMES.get(status, status) if isinstance(status, int) else status
        if status in (None, "", "STATUS_UNSPECIFIED"):
            raise ApiError(400, "INVALID_ARGUMENT", "status is required: ENABLED or DISABLED")
        spec = _need(job, "transferSpec")
        sources = [s for s in SOURCES if s in spec]
        if len(sources) != 1:
            raise ApiError(400, "INVALID_ARGUMENT", f"transferSpec needs exactly one data source, got {sources}")
        if sources[0] not in ("awsS3DataSource", "azureBlobStorageDataSource", "httpDataSource", "gcsDataSource"):
            raise ApiError(501, "UNIMPLEMENTED", f"this double does not emulate {sources[0]}")
        _need(spec, "gcsDataSink.bucketName")
        _path_ok(spec["gcsDataSink"], "path", "gcsDataSink")
        _check_prefixes(spec.get("objectConditions", {}).get("includePrefixes", []))
        if "awsS3DataSource" in spec:
            s3 = spec["awsS3DataSource"]
            _need(s3, "bucketName")
            _path_ok(s3, "path", "awsS3DataSource")
            if s3.get("roleArn"):
                if not ROLE_ARN.match(s3["roleArn"]):
                    raise ApiError(400, "INVALID_ARGUMENT", "awsS3DataSource.roleArn is not an IAM role ARN")
            else:
                _need(s3, "awsAccessKey.accessKeyId")
                _need(s3, "awsAccessKey.secretAccessKey")
        if "azureBlobStorageDataSource" in spec:
            az = spec["azureBlobStorageDataSource"]
            for field in ("storageAccount", "container", "azureCredentials.sasToken"):
                _need(az, field)
            _path_ok(az, "path", "azureBlobStorageDataSource")
        if "httpDataSource" in spec:
            _need(spec, "httpDataSource.listUrl")
            if "transferManifest" in spec:
                raise ApiError(400, "INVALID_ARGUMENT", "a URL list is its own manifest: transferManifest is not "
                                                        "supported with httpDataSource")
        if "transferManifest" in spec and not str(spec["transferManifest"].get("location", "")).startswith("gs://"):
            raise ApiError(400, "INVALID_ARGUMENT", "transferManifest.location must be a gs:// object")
        if "gcsDataSource" in spec:
            _need(spec, "gcsDataSource.bucketName")
            _path_ok(spec["gcsDataSource"], "path", "gcsDataSource")
        name = job.get("name") or f"transferJobs/{int(time.time() * 1e6)}"
        if not JOB_NAME.match(name):
            raise ApiError(400, "INVALID_ARGUMENT", f"name {name!r} does not match {JOB_NAME.pattern}")
        with self._lock:
            if name in self.jobs:
                raise ApiError(409, "ALREADY_EXISTS", f"{name} already exists")
            self.jobs[name] = {**job, "name": name, "status": status, "creationTime": now_rfc3339()}
        return self._public(self.jobs[name])

    def _job(self, name: str, project: str) -> dict:
        job = self.jobs.get(name)
        if job is None or job["status"] == "DELETED":
            raise ApiError(404, "NOT_FOUND", f"{name} not found")
        if not project:
            raise ApiError(400, "INVALID_ARGUMENT", "projectId is required")
        if project != job["projectId"]:
            raise ApiError(403, "PERMISSION_DENIED", f"{name} is not in project {project}")
        return job

    @staticmethod
    def _public(job: dict) -> dict:
        spec = dict(job["transferSpec"])
        for source in SOURCES:
            if source in spec:
                spec[source] = {k: v for k, v in spec[source].items() if k not in SECRETS}
        return {**job, "transferSpec": spec}

    def _run(self, name: str, body: dict) -> dict:
        job = self._job(name, str(_need(body, "projectId")))
        if job["status"] != "ENABLED":
            raise ApiError(400, "FAILED_PRECONDITION", f"{name} is {job['status']}: only an ENABLED job runs")
        spec = job["transferSpec"]
        sink = spec["gcsDataSink"]
        prefixes = spec.get("objectConditions", {}).get("includePrefixes", [])
        source = self._source(spec)
        if "transferManifest" in spec:
            source = self._named(source, spec["transferManifest"]["location"])
        run = Run(source, lambda: GCSSide(self.gcs_endpoint, sink["bucketName"], sink.get("path", "")),
                  include=lambda rel: not prefixes or any(rel.startswith(p) for p in prefixes), delay=self.delay,
                  after_write=self.after_write)
        op_name = f"transferOperations/{name.replace('/', '-')}-{time.time_ns()}"
        meta = {"@type": "type.googleapis.com/google.storagetransfer.v1.TransferOperation", "name": op_name,
                "projectId": job["projectId"], "transferSpec": self._public(job)["transferSpec"],
                "transferJobName": name, "startTime": now_rfc3339()}
        job["latestOperationName"] = op_name
        self.operations[op_name] = (meta, run.pausable(self.paused).start())
        return self._operation(op_name)

    def _source(self, spec: dict):
        if "awsS3DataSource" in spec:
            s3 = spec["awsS3DataSource"]
            key = s3.get("awsAccessKey") or {"accessKeyId": "testing", "secretAccessKey": "testing"}
            return lambda: S3Side(self.s3_endpoint, s3["bucketName"], s3.get("path", ""),
                                  key["accessKeyId"], key["secretAccessKey"])
        if "azureBlobStorageDataSource" in spec:
            az = spec["azureBlobStorageDataSource"]
            base = self.azure_endpoint.format(account=az["storageAccount"])
            return lambda: AzureSide(f"{base}/{az['container']}", az["azureCredentials"]["sasToken"],
                                     az.get("path", ""))
        if "gcsDataSource" in spec:
            gcs = spec["gcsDataSource"]
            return lambda: GCSSide(self.gcs_endpoint, gcs["bucketName"], gcs.get("path", ""))
        return lambda: HttpListSide(spec["httpDataSource"]["listUrl"])

    def _named(self, source, location: str):
        """The source as a transfer manifest narrows it, read when the run starts."""
        def build() -> Side:
            bucket, _, key = location[len("gs://"):].partition("/")
            text = GCSSide(self.gcs_endpoint, bucket, "").read(key).decode()
            names = {row[0] for row in csv.reader(io.StringIO(text)) if row and row[0]}
            return Named(source(), names)
        return build

    # -- transferOperations -------------------------------------------------------------------
    def _find(self, name: str) -> tuple[dict, Run]:
        if name not in self.operations:
            raise ApiError(404, "NOT_FOUND", f"{name} not found")
        return self.operations[name]

    def _operation(self, name: str) -> dict:
        meta, run = self._find(name)
        status = STATES[run.state]
        meta = {**meta, "status": status, "counters": {
            "objectsFoundFromSource": str(run.objects_found), "bytesFoundFromSource": str(run.bytes_found),
            "objectsCopiedToSink": str(run.objects_copied), "bytesCopiedToSink": str(run.bytes_copied),
            "objectsFromSourceFailed": str(run.objects_failed), "bytesFromSourceFailed": str(run.bytes_failed)}}
        op = {"name": name, "metadata": meta, "done": run.finished.is_set()}
        if run.state == "failed":
            code = "PERMISSION_DENIED" if re.search(r"AccessDenied|Authorization\w*(Failure|Mismatch)|403", run.error) \
                else "NOT_FOUND" if re.search(r"NoSuch(Bucket|Key)|(Container|Blob)NotFound|404", run.error) else "UNKNOWN"
            meta["errorBreakdowns"] = [{"errorCode": code, "errorCount": str(max(run.objects_failed, 1)),
                                        "errorLogEntries": [{"url": "", "errorDetails": [run.error[:300]]}]}]
            op["error"] = {"code": 9, "message": f"transfer failed: {code}"}
        if run.finished.is_set():
            meta["endTime"] = now_rfc3339()
            if run.state == "cancelled":
                op["error"] = {"code": 1, "message": "Operation cancelled"}
            elif run.state == "success":
                op["response"] = {"@type": "type.googleapis.com/google.protobuf.Empty"}
        return op

    def _cancel(self, name: str) -> dict:
        _meta, run = self._find(name)
        run.cancel()
        return {}


def _check_prefixes(prefixes: list[str]) -> None:
    """What the service refuses in objectConditions.includePrefixes: more than 1,000, an empty one,
    one over 1,024 bytes, a leading '/', a line break, and one that is a prefix of another (each
    must name a distinct part of the namespace)."""
    if len(prefixes) > 1000:
        raise ApiError(400, "INVALID_ARGUMENT", f"includePrefixes holds {len(prefixes)} values; at most 1000")
    for p in prefixes:
        if not p or len(p.encode()) > 1024 or p.startswith("/") or "\n" in p or "\r" in p:
            raise ApiError(400, "INVALID_ARGUMENT", f"include prefix {p!r} is empty, too long, begins with '/' or "
                                                    f"holds a line break")
    ordered = sorted(prefixes)
    for a, b in zip(ordered, ordered[1:]):
        if b.startswith(a):
            raise ApiError(400, "INVALID_ARGUMENT", f"include prefix {a!r} is a prefix of {b!r}: each include "
                                                    f"prefix must name a distinct portion of the namespace")
