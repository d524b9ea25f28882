"""The service policy: who may have the workers read and write what. Checked before any job runs.

    # service.yaml
    tenants:
      team-a:
        read:  [s3://corpus/team-a/, gs://public-data/]      # sources (what it may write, it may read)
        write: [s3://models/team-a/, az://dr/team-a/]        # destinations: written, overwritten, deleted
        local:                                               # local paths, per worker group
          hpc: {read: [/lustre/team-a/], write: [/lustre/team-a/out/]}
        routes: [direct, server]                             # default: every route
        budgets: [team-a]                                    # jobs must be charged to one of these
      ops:
        read: ["s3://", "gs://", "az://"]                    # a scheme alone: every bucket of that store
        write: ["s3://", "gs://", "az://"]

A job runs as one tenant (its signature says which: workers/auth.py). Its source and each place
it reads must be inside the tenant's ``read`` or ``write`` prefixes, its destinations inside
``write``. A local path must be inside the tenant's ``local`` prefixes for the group of the worker
that runs it (``BRIDGE_WORKER_GROUP``, default ``default``) *and* inside that worker's own roots
(``BRIDGE_LOCAL_ROOTS``, default none). Prefixes end at a '/': ``s3://b/team-a/`` does not
cover ``s3://b/team-ab/``. What the decision is given is already canonical: local paths with
their links and ``..`` resolved by the caller (this module does no I/O beyond reading its file).

A file with mistakes is refused whole, one line per mistake: ``FILE:LINE: FIELD: what is wrong``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from bridge.errors import BridgeError
from bridge.policies.replication import PolicyError
from bridge.policies.yamlcheck import compose, line_of, read
from bridge.urls import CLOUD_SCHEMES
from bridge.urls import parse as parse_url

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}$")
_SCHEME_ONLY = re.compile(r"^(s3|gs|az)://$")
DEFAULT_GROUP = "default"


def _slash(text: str) -> str:
    return text if text.endswith("/") else text + "/"


def _cloud_prefix(text: str) -> str:
    if not isinstance(text, str) or not text:
        raise ValueError("expected a URL prefix such as s3://bucket/prefix/ (or s3:// for every bucket)")
    if _SCHEME_ONLY.match(text):
        return text
    try:
        loc = parse_url(text)
    except BridgeError as exc:
        raise ValueError(str(exc)) from None
    if loc.is_local:
        raise ValueError(f"{text!r} is a local path: local paths go under local: GROUP: {{read: [...], write: [...]}}")
    if any(seg in (".", "..") for seg in loc.key.split("/")):
        raise ValueError(f"{text!r}: a prefix has no '.' or '..' segments")
    return _slash(str(loc))


def _local_prefix(text: str) -> str:
    if not isinstance(text, str) or not text.startswith("/"):
        raise ValueError(f"{text!r}: a local prefix is an absolute path such as /data/team-a/")
    if any(seg in (".", "..") for seg in text.split("/")):
        raise ValueError(f"{text!r}: a prefix has no '.' or '..' segments")
    return _slash(text)


class LocalScope(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    read: list[str] = []
    write: list[str] = []

    @field_validator("read", "write")
    @classmethod
    def _paths(cls, items: list[str]) -> list[str]:
        return [_local_prefix(p) for p in items]


class Tenant(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    read: list[str] = []
    write: list[str] = []
    local: dict[str, LocalScope] = {}
    routes: list[str] | None = None
    budgets: list[str] | None = None

    @field_validator("read", "write")
    @classmethod
    def _urls(cls, items: list[str]) -> list[str]:
        return [_cloud_prefix(u) for u in items]

    @field_validator("local")
    @classmethod
    def _groups(cls, groups: dict[str, LocalScope]) -> dict[str, LocalScope]:
        for name in groups:
            if not _NAME_RE.match(str(name)):
                raise ValueError(f"worker group {name!r}: use letters, digits, '_', '.', '-'")
        return groups

    @field_validator("routes")
    @classmethod
    def _routes(cls, names: list[str] | None) -> list[str] | None:
        for name in names or []:
            if not re.fullmatch(r"[a-z][a-z\-]*", str(name)):
                raise ValueError(f"route {name!r} is not a route name (direct, server, sts, ...)")
        return names


@dataclass(frozen=True)
class ServicePolicy:
    tenants: dict[str, Tenant]
    path: str = "service.yaml"

    def tenant(self, name: str) -> Tenant | None:
        return self.tenants.get(name)


def parse(text: str, filename: str = "service.yaml") -> ServicePolicy:
    """The tenants of ``text``, or PolicyError naming the line and field of each mistake."""
    try:
        root, doc = compose(text, filename)
    except ValueError as exc:
        raise PolicyError([str(exc)]) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("tenants"), dict):
        raise PolicyError([f"{filename}:{line_of(root, ('tenants',)) or 1}: tenants: expected a mapping of "
                           f"tenant names to what each may read and write"])
    problems: list[str] = []
    for key in (k for k, _ in root.value):
        if key.value != "tenants":
            problems.append(f"{filename}:{key.start_mark.line + 1}: {key.value}: unknown top-level field "
                            f"(only 'tenants')")
    tenants: dict[str, Tenant] = {}
    for name, body in doc["tenants"].items():
        where = f"tenants.{name}"
        line = line_of(root, ("tenants", name), keys=True) or 1
        if not isinstance(name, str) or not _NAME_RE.match(name):
            problems.append(f"{filename}:{line}: {where}: a tenant name uses letters, digits, '_', '.', '-' "
                            f"(at most 63)")
            continue
        if not isinstance(body, dict):
            problems.append(f"{filename}:{line}: {where}: expected a mapping with read, write, local, routes, budgets")
            continue
        try:
            tenants[name] = Tenant.model_validate(body)
        except ValidationError as exc:
            for err in exc.errors():
                loc = tuple(err["loc"])
                unknown = err["type"] == "extra_forbidden"
                at = (line_of(root, ("tenants", name, *loc), keys=unknown) if loc else line) or line
                field = ".".join([where, *map(str, loc)])
                message = "unknown field" if unknown else err["msg"].removeprefix("Value error, ")
                problems.append(f"{filename}:{at}: {field}: {message}")
    if problems:
        raise PolicyError(problems)
    return ServicePolicy(tenants, filename)


def load(path) -> ServicePolicy:
    """The service policy of a file, or PolicyError (one line per mistake)."""
    try:
        text = read(path, "service policy")
    except ValueError as exc:
        raise PolicyError([str(exc)]) from None
    return parse(text, str(path))


def is_service_policy(text: str) -> bool:
    """Whether a policy file's text is a service policy (``tenants:``) rather than replication policies."""
    return re.search(r"^tenants\s*:", text, re.MULTILINE) is not None


# -- decisions ------------------------------------------------------------------------------

def _is_local(url: str) -> bool:
    return url.startswith("/")


def refusal(name: str, tenant: Tenant | None, *, reads: Iterable[str] = (), writes: Iterable[str] = (),
            group: str = DEFAULT_GROUP, local_roots: Iterable[str] = (), route: str | None = None,
            budget: str | None = None, job: bool = True) -> str | None:
    """Why tenant ``name`` may not have a worker of ``group`` (whose own roots are ``local_roots``)
    read ``reads`` and write ``writes`` over ``route``, charged to ``budget`` (``job``: budgets
    apply; a cache warm is charged to none); None when it may.
    Every URL is canonical (local paths resolved); the first problem is the answer."""
    if tenant is None:
        return f"tenant {name!r} is not in the service policy"
    roots = [_slash(r) for r in local_roots]
    in_roots = tuple(roots)
    scope = tenant.local.get(group, LocalScope())
    clouds = tuple(f"{scheme}://" for scheme in CLOUD_SCHEMES)
    for access, urls in (("read", reads), ("write", writes)):
        # a URL is allowed when it is at or under one of these prefixes (one tuple for all of a plan's files)
        local = tuple(scope.write if access == "write" else [*scope.read, *scope.write])
        cloud = tuple(tenant.write if access == "write" else [*tenant.read, *tenant.write])
        for url in urls:
            target = _slash(url)
            if _is_local(url):
                if not target.startswith(in_roots):
                    return (f"{url} is outside this worker's local roots (BRIDGE_LOCAL_ROOTS: "
                            f"{', '.join(roots) or 'none'})")
                if not target.startswith(local):
                    return f"tenant {name!r} may not {access} {url} on worker group {group!r}"
            else:
                if not url.startswith(clouds):
                    return f"{url}: not a location a tenant can be given"
                if not target.startswith(cloud):
                    return f"tenant {name!r} may not {access} {url}"
    if route is not None and tenant.routes is not None and route not in tenant.routes:
        return f"tenant {name!r} may not use route {route!r} (allowed: {', '.join(tenant.routes) or 'none'})"
    if job and tenant.budgets is not None and budget not in tenant.budgets:
        named = f"budget {budget!r}" if budget else "no budget"
        return f"tenant {name!r} may not run a job charged to {named} (its budgets: {', '.join(tenant.budgets) or 'none'})"
    return None


def describe(policy: ServicePolicy) -> list[str]:
    """One line per tenant, for ``mcbridge policy check``."""
    lines = []
    for name, t in policy.tenants.items():
        local = "; ".join(f"{g}: read {', '.join(s.read) or '-'} write {', '.join(s.write) or '-'}"
                          for g, s in t.local.items())
        lines.append(f"{name}: read {', '.join(t.read) or '-'}; write {', '.join(t.write) or '-'}"
                     + (f"; local {local}" if local else "")
                     + (f"; routes {', '.join(t.routes)}" if t.routes is not None else "")
                     + (f"; budgets {', '.join(t.budgets)}" if t.budgets is not None else ""))
    return lines


def single_tenant(tenant: str, local: Iterable[str] = (), group: str = DEFAULT_GROUP) -> str:
    """The text of a service policy of one tenant allowed every bucket of every store, and the
    ``local`` folders on workers of ``group`` (``mcbridge service init``)."""
    import json
    lines = ["# mcbridge service policy (policies/tenants.py): who may read and write what.",
             "tenants:", f"  {tenant}:",
             '    read: ["s3://", "gs://", "az://"]',
             '    write: ["s3://", "gs://", "az://"]']
    folders = [_slash(p) for p in local]
    if folders:
        quoted = ", ".join(json.dumps(p) for p in folders)
        lines += ["    local:", f"      {group}: {{read: [{quoted}], write: [{quoted}]}}"]
    return "\n".join(lines) + "\n"
