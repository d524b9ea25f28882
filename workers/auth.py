"""Signed jobs: a job says which tenant asks for it, and a worker believes it only when signed.

Each tenant has a secret key (32 random bytes, HMAC-SHA256). Submitters and beat hold their own
tenant's key; workers hold every tenant's. What is signed is canonical JSON (sorted keys, no
spaces) of plain data, so the signer and the checker hash the same bytes:

    job      {"v", "tenant", "job", "spec", "budget", "expires",   kept in the job record (``auth``)
              "estimate", "record"}
    task     {"v", "job", "digest", "task", "sub"}                  a transfer task's slice of the plan,
                                                                   signed by the planner (workers/executor.py)
    message  {"v", "tenant", "task", "name", "payload", "nonce", "expires"}
                                                                   beat's scheduled and policy messages

A job's signature covers every field of its record that steers what a worker reads, writes,
deletes or spends, not only the spec. ``estimate``: the USD its budget admitted it for (a job
charged to a budget holds a reservation of at least that, workers/redisbudgets.py; it is the
submitter's own, so a worker prices the plan again, workers/gate.py ``priced``). ``record``: the
text of the record's other steering fields as they were written (a policy run's ``policy``,
``policy_spec``: its mode, retention and checkpoints glob, and ``checkpoints``: the window it
keeps; workers/replicas.py), their names listed in the block's ``fields``. A record holding one
of ``STEERING`` that its signature does not name is refused as one whose signature does not
match. Both keys are in the signed document only when the block has them, so a job signed
without them checks as before.

A job's signature is checked by the worker on every task of the job; its ``expires`` bounds when
it may be admitted (its first plan), and its job id is admitted once (SET NX in Redis). A
transfer task's slice is checked against the planner's signature, so a task message written by
hand names nothing the planner did not plan. The ``digest`` of a job (SHA-256 of its signed bytes)
names it in the audit log.

Keys file (``BRIDGE_KEYS_FILE``, written by ``mcbridge service init``), one tenant a line::

    # tenant   key (64 hex digits)
    team-a     9f2c...e1
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge import redact
from bridge.errors import BridgeError, InvalidOption

VERSION = 1
# Record fields that steer a worker besides the spec (see the module's docstring): a record that
# holds one is run only when its signature covers it.
STEERING = ("policy", "policy_spec", "checkpoints")
_KEY_RE = re.compile(r"^[0-9a-fA-F]{64}$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}$")


class Refused(BridgeError):
    """A job, task or message a worker will not run: not signed, signed wrongly, expired, replayed,
    or outside its tenant's scope. The message says why (and names no secret)."""


def canonical(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _text(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=True).encode()


def digest(doc: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical(doc)).hexdigest()


def _matches(mac: str, sig: Any, tenant: str, what: str) -> None:
    """Refused unless ``sig`` is the signature ``mac``, compared in constant time."""
    if not isinstance(sig, str) or not hmac.compare_digest(mac, sig):
        raise Refused(f"{what}: the signature does not match (not signed with tenant {tenant!r}'s key, "
                      f"or changed since)")


def new_key() -> str:
    return secrets.token_hex(32)


def parse_keys(text: str, where: str) -> dict[str, bytes]:
    """'TENANT HEX' lines (a '#' starts a comment), or InvalidOption naming the line."""
    keys: dict[str, bytes] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not _NAME_RE.match(parts[0]) or not _KEY_RE.match(parts[1]):
            raise InvalidOption(f"{where}:{number}: expected 'TENANT KEY' (a name and 64 hex digits)")
        keys[parts[0]] = bytes.fromhex(parts[1])
    return keys


def parse_inline(text: str) -> dict[str, bytes]:
    """'TENANT=HEX,...' (BRIDGE_KEYS)."""
    keys: dict[str, bytes] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, key = item.partition("=")
        if not sep or not _NAME_RE.match(name.strip()) or not _KEY_RE.match(key.strip()):
            raise InvalidOption("BRIDGE_KEYS: expected TENANT=KEY,... (a name and 64 hex digits each)")
        keys[name.strip()] = bytes.fromhex(key.strip())
    return keys


@dataclass(frozen=True)
class Keyring:
    """The tenant keys this process holds, and the tenant it signs as."""

    keys: Mapping[str, bytes]
    tenant: str | None = None

    def __repr__(self) -> str:   # never the keys
        return f"Keyring(tenants={sorted(self.keys)}, tenant={self.tenant!r})"

    @classmethod
    def load(cls, ws) -> Keyring:
        keys: dict[str, bytes] = {}
        if ws.keys_file:
            path = Path(ws.keys_file)
            try:
                text = path.read_text()
            except OSError as exc:
                raise InvalidOption(f"BRIDGE_KEYS_FILE {path}: cannot read the tenant keys: "
                                    f"{exc.strerror or exc}") from None
            except UnicodeDecodeError:
                raise InvalidOption(f"BRIDGE_KEYS_FILE {path}: not a text file of tenant keys") from None
            keys.update(parse_keys(text, str(path)))
        if ws.keys:
            keys.update(parse_inline(ws.keys))
        for key in keys.values():
            redact.remember(key.hex())
        tenant = ws.tenant or (next(iter(keys)) if len(keys) == 1 else None)
        return cls(keys, tenant)

    def key(self, tenant: str) -> bytes:
        try:
            return self.keys[tenant]
        except KeyError:
            raise Refused(f"no key for tenant {tenant!r} here") from None

    def signer(self) -> str:
        """The tenant this process signs as, or one line saying how to give one."""
        if not self.keys:
            raise InvalidOption("no tenant key: run mcbridge service init (or set BRIDGE_KEYS_FILE) to sign jobs")
        if self.tenant is None:
            raise InvalidOption(f"BRIDGE_TENANT: name the tenant to sign as; the keys hold "
                                f"{', '.join(sorted(self.keys))}")
        if self.tenant not in self.keys:
            raise InvalidOption(f"BRIDGE_TENANT={self.tenant!r}: no key for that tenant in the keys given")
        return self.tenant

    def mac(self, tenant: str, doc: Mapping[str, Any]) -> str:
        return hmac.new(self.key(tenant), canonical(doc), hashlib.sha256).hexdigest()

    def check(self, tenant: str, doc: Mapping[str, Any], sig: Any, what: str) -> None:
        _matches(self.mac(tenant, doc), sig, tenant, what)

    # -- jobs ----------------------------------------------------------------------------------
    def sign_job(self, tenant: str, job_id: str, spec: Mapping[str, Any], *, budget: str | None,
                 ttl: float, now: float | None = None, estimate: float | None = None,
                 fields: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The signature block of a job: ``estimate``, the USD its budget admits it for (a job
        charged to a budget); ``fields``, the record's other fields that steer its workers, as
        ``Jobs.update`` writes them."""
        auth: dict[str, Any] = {"v": VERSION, "tenant": tenant, "job": job_id, "budget": budget,
                                "expires": round((now or time.time()) + ttl, 3)}
        if estimate is not None:
            auth["estimate"] = float(estimate)
        record = {name: field_text(value) for name, value in (fields or {}).items()}
        if record:
            auth["fields"] = sorted(record)
        return {**auth, "sig": self.mac(tenant, job_document(auth, json.loads(json.dumps(spec)), record))}

    def check_job(self, job_id: str, spec: Mapping[str, Any], auth: Any,
                  record: Mapping[str, str | None] | None = None) -> str:
        """The job's digest when ``auth`` signs ``spec`` as job ``job_id``, with ``record``: the
        text of the record's steering fields as a worker read them (those of ``STEERING`` it
        holds, and those the block names); Refused otherwise."""
        if not isinstance(auth, dict):
            raise Refused(f"job {job_id} is not signed (a job needs a tenant's signature: mcbridge submit "
                          f"signs with BRIDGE_KEYS_FILE)")
        tenant = auth.get("tenant")
        if not isinstance(tenant, str) or auth.get("v") != VERSION or not _well_formed(auth):
            raise Refused(f"job {job_id}: its signature block is malformed")
        if auth.get("job") != job_id:
            raise Refused(f"job {job_id}: signed for job {auth.get('job')!r}, not this one")
        record = dict(record or {})
        named = auth.get("fields", [])
        for name in STEERING:
            if record.get(name) is not None and name not in named:
                raise Refused(f"job {job_id}: its record holds {name}, which its signature does not cover "
                              f"(the signature does not match what the record holds)")
        doc = job_document(auth, spec, {name: record.get(name) for name in named})
        self.check(tenant, doc, auth.get("sig"), f"job {job_id}")
        return digest(doc)

    # -- a transfer task's slice of the plan ------------------------------------------------------
    def sign_task(self, tenant: str, job_digest: str, task_id: str, sub: Mapping[str, Any]) -> str:
        # as the worker will see it: through JSON (a key that is a number comes back a string)
        sub = json.loads(json.dumps(sub))
        return self.mac(tenant, {"v": VERSION, "job": job_digest, "task": task_id, "sub": sub})

    def task_text(self, tenant: str, job_digest: str, task_id: str, sub: Mapping[str, Any]) -> tuple[str, str]:
        """A sub-plan as canonical JSON and ``sign_task``'s signature of it, from that one encoding
        (the planner keeps the text, so the sub-plan is encoded once). The bytes signed are those
        ``canonical`` makes of the task's document: its keys in order (job, sub, task, v), the
        sub-plan's own text in its place. A sub-plan is JSON data with text keys, so the checker's
        encoding of it, read back, is this text again."""
        text = canonical(sub)
        return text.decode(), self._task_mac(tenant, job_digest, task_id, text)

    def _task_mac(self, tenant: str, job_digest: str, task_id: str, text: bytes) -> str:
        doc = b'{"job":%s,"sub":%s,"task":%s,"v":%s}' % (_text(job_digest), text, _text(task_id), _text(VERSION))
        return hmac.new(self.key(tenant), doc, hashlib.sha256).hexdigest()

    def check_task(self, tenant: str, job_digest: str, task_id: str, sub: Any, sig: Any) -> dict[str, Any]:
        """The sub-plan ``sig`` signs as task ``task_id`` of the job; Refused otherwise. ``sub``:
        the sub-plan, or the text ``task_text`` made of it (what a transfer task carries: its
        signature is checked over those very bytes, which are then read once, where a sub-plan
        sent as JSON data was decoded, encoded again to be checked, and walked a third time)."""
        what = f"task {task_id}: its slice of the plan"
        if isinstance(sub, str):
            _matches(self._task_mac(tenant, job_digest, task_id, sub.encode()), sig, tenant, what)
            try:
                parsed = json.loads(sub)
            except ValueError:
                parsed = None
            if not isinstance(parsed, dict):
                raise Refused(f"task {task_id}: no plan to run")
            return parsed
        if not isinstance(sub, dict):
            raise Refused(f"task {task_id}: no plan to run")
        self.check(tenant, {"v": VERSION, "job": job_digest, "task": task_id, "sub": sub}, sig, what)
        return sub

    # -- beat's messages --------------------------------------------------------------------------
    def sign_message(self, tenant: str, task: str, name: str, payload: Any, *, ttl: float,
                     now: float | None = None) -> dict[str, Any]:
        auth = {"v": VERSION, "tenant": tenant, "nonce": secrets.token_hex(12),
                "expires": round((now or time.time()) + ttl, 3)}
        payload = json.loads(json.dumps(payload))
        return {**auth, "sig": self.mac(tenant, message_document(auth, task, name, payload))}

    def check_message(self, task: str, name: str, payload: Any, auth: Any, now: float | None = None) -> dict[str, Any]:
        """``auth`` when it signs this message and has not expired; Refused otherwise."""
        what = f"{task} {name!r}"
        if not isinstance(auth, dict) or not isinstance(auth.get("tenant"), str) or \
                not isinstance(auth.get("expires"), (int, float)) or not isinstance(auth.get("nonce"), str):
            raise Refused(f"{what} is not signed (beat signs with BRIDGE_KEYS_FILE and BRIDGE_TENANT)")
        self.check(auth["tenant"], message_document(auth, task, name, payload), auth.get("sig"), what)
        if (now or time.time()) > auth["expires"]:
            raise Refused(f"{what}: its signature expired at {iso(auth['expires'])}")
        return auth


def job_document(auth: Mapping[str, Any], spec: Mapping[str, Any],
                 record: Mapping[str, str | None] | None = None) -> dict[str, Any]:
    doc = {"v": VERSION, "tenant": auth.get("tenant"), "job": auth.get("job"), "budget": auth.get("budget"),
           "expires": auth.get("expires"), "spec": dict(spec)}
    if "estimate" in auth:
        doc["estimate"] = auth["estimate"]
    if "fields" in auth:
        doc["record"] = {name: (record or {}).get(name) for name in auth["fields"]}
    return doc


def field_text(value: Any) -> str:
    """A record field's value as the job record keeps it (``Jobs.update``): text as it is, a
    list or mapping as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    raise TypeError(f"a signed record field is text, a list or a mapping, not {type(value).__name__}")


def _well_formed(auth: Mapping[str, Any]) -> bool:
    """The block's own shape: a numeric expiry; an estimate, if any, a number; the fields it
    covers, if any, a list of names."""
    estimate, fields = auth.get("estimate", 0.0), auth.get("fields", [])
    return isinstance(auth.get("expires"), (int, float)) and isinstance(estimate, (int, float)) and \
        not isinstance(estimate, bool) and isinstance(fields, list) and all(isinstance(f, str) for f in fields)


def message_document(auth: Mapping[str, Any], task: str, name: str, payload: Any) -> dict[str, Any]:
    return {"v": VERSION, "tenant": auth.get("tenant"), "task": task, "name": name, "payload": payload,
            "nonce": auth.get("nonce"), "expires": auth.get("expires")}


def iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def write_keys_file(path: Path, keys: Mapping[str, str]) -> None:
    """A keys file only its owner can read, written whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("# mcbridge tenant keys: TENANT KEY (keep secret; workers need every tenant's, a submitter its own)\n")
        for name, key in keys.items():
            f.write(f"{name} {key}\n")
    os.replace(tmp, path)


# -- beat ----------------------------------------------------------------------------------------

_settings = None   # this process's WorkerSettings (bridge.workers.app.configure sets them)


def configure(ws) -> None:
    global _settings
    _settings = ws


def message_ttl(ws) -> float:
    """How long a message beat (or cache warm) signs stays good: a tenth of BRIDGE_SIGNATURE_TTL,
    at least a minute."""
    return max(60.0, ws.signature_ttl / 10)


def sign_now(task: str, name: str, payload: Any) -> dict[str, Any]:
    """beat's signature over one message, as BRIDGE_TENANT, made as it is sent."""
    if _settings is None:
        raise InvalidOption("beat has no settings to sign with")
    keyring = Keyring.load(_settings)
    return keyring.sign_message(keyring.signer(), task, name, payload, ttl=message_ttl(_settings))


def __getattr__(name: str) -> Any:
    """``BeatSignature``, made on first use: only beat needs it, and celery.beat, its base, costs a
    submitter (which imports this module to sign) a fifth of its start-up. Made here, under this
    module's name, it pickles and unpickles as the class defined at module level did."""
    if name != "BeatSignature":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _BEAT_CLASS_LOCK:   # one class, whichever thread asks first
        if "BeatSignature" in globals():
            return globals()["BeatSignature"]
        return _make_beat_signature()


_BEAT_CLASS_LOCK = threading.Lock()


def _make_beat_signature() -> type:
    from celery.beat import BeatLazyFunc

    class BeatSignature(BeatLazyFunc):
        """The last argument of a beat entry of bridge's: celery calls it when it sends the entry,
        whichever beat scheduler runs, so each message is signed then, with a fresh nonce and expiry."""

        def __init__(self, task: str, name: str, payload: Any):
            super().__init__(sign_now, task, name, payload)

        def __eq__(self, other: object) -> bool:   # an unchanged entry stays unchanged across restarts
            return isinstance(other, BeatSignature) and self._func_params == other._func_params

        __hash__ = None  # type: ignore[assignment]

    BeatSignature.__qualname__ = "BeatSignature"
    globals()["BeatSignature"] = BeatSignature
    return BeatSignature
