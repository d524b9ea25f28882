"""The engine's ``Journal`` kept in Redis, shared by every worker running units of one job.

Records go to one hash per kind of key (``file:``, ``part:``, ``upload:`` ...). The keys of the
``file:`` records are also kept in a sorted set of equal scores (``<journal>:file:order``), so that
the commit reads them in key order a page at a time, streaming, however many files the job had,
without sorting them in memory. The journal is keyed by the plan's key, like the in-process one:
submitting a failed job again finds what the first run finished.

Writes of finished files (``file:``) are buffered and sent together, at most
``FLUSH_RECORDS`` records or ``FLUSH_SECONDS`` after the first of them, and at ``flush()`` (the
end of every task, before it reports itself done): one round trip per hundreds of files instead of
one per file. A worker killed before a flush loses only the records of its last moment: the
re-run finds those files unjournaled and sends them again, as it would had the kill come a moment
earlier. An upload's id is written at once (its parts must be able to find it), and so is each
finished part: a part is MiBs against one round trip, and a worker killed inside a big file must
cost only the parts in flight.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from bridge.journal import encode

PAGE = 1000   # values read per HMGET by items()
BUFFERED = ("file",)
ORDERED = "file"
FLUSH_RECORDS = 512
FLUSH_SECONDS = 1.0


# Which fields of one hash exist, without sending their values back.
_EXISTS = "local out = {} for i = 1, #ARGV do out[i] = redis.call('HEXISTS', KEYS[1], ARGV[i]) end return out"


_dumps = encode   # compact JSON, or an ``Encoded`` value's text as given


class RedisJournal:
    def __init__(self, client, key: str, ttl: float):
        self.client = client
        self.key = key
        self.ttl = int(ttl)
        self._pending: dict[str, str] = {}
        self._since = 0.0
        self._lock = threading.Lock()

    def _hash(self, key: str) -> str:
        kind = key.partition(":")[0]
        return f"{self.key}:{kind}"

    def _order(self, kind: str) -> str:
        return f"{self.key}:{kind}:order"

    def get(self, key: str) -> Any | None:
        with self._lock:
            raw = self._pending.get(key)
        if raw is None:
            raw = self.client.hget(self._hash(key), key)
        return None if raw is None else json.loads(raw)

    def get_many(self, keys: list[str]) -> list[Any | None]:
        """The records of ``keys`` (None where there is none), one HMGET per kind."""
        found = self._raw(keys)
        return [json.loads(found[k]) if k in found else None for k in keys]

    def _raw(self, keys: list[str]) -> dict[str, str]:
        with self._lock:
            found = {k: self._pending[k] for k in keys if k in self._pending}
        by_hash: dict[str, list[str]] = {}
        for key in keys:
            if key not in found:
                by_hash.setdefault(self._hash(key), []).append(key)
        if by_hash:
            pipe = self.client.pipeline(transaction=False)
            for name, names in by_hash.items():
                pipe.hmget(name, names)
            for names, values in zip(by_hash.values(), pipe.execute()):
                found.update((k, v) for k, v in zip(names, values) if v is not None)
        return found

    def put(self, key: str, value: Any) -> None:
        if key.partition(":")[0] not in BUFFERED:
            self._send([(key, _dumps(value))])
            return
        with self._lock:
            if not self._pending:
                self._since = time.monotonic()
            self._pending[key] = _dumps(value)
            due = len(self._pending) >= FLUSH_RECORDS or time.monotonic() - self._since >= FLUSH_SECONDS
        if due:
            self.flush()

    def put_many(self, records: list[tuple[str, Any]]) -> None:
        """Several records in one round trip (with whatever is buffered)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        self._send([*pending.items(), *((key, _dumps(value)) for key, value in records)])

    def flush(self) -> None:
        """Send what is buffered."""
        with self._lock:
            pending, self._pending = self._pending, {}
        self._send(list(pending.items()))

    def _send(self, records: Iterable[tuple[str, str]]) -> None:
        by_hash: dict[str, dict[str, str]] = {}
        for key, raw in records:
            by_hash.setdefault(self._hash(key), {})[key] = raw
        if not by_hash:
            return
        pipe = self.client.pipeline(transaction=False)
        for name, mapping in by_hash.items():
            pipe.hset(name, mapping=mapping)
            pipe.expire(name, self.ttl)
            if name == f"{self.key}:{ORDERED}":
                pipe.zadd(self._order(ORDERED), dict.fromkeys(mapping, 0))
                pipe.expire(self._order(ORDERED), self.ttl)
        pipe.execute()

    def empty(self, kinds: tuple[str, ...] = ("file", "part", "upload")) -> bool:
        """Whether the journal holds no record of these kinds (one round trip)."""
        return not self.client.exists(*(f"{self.key}:{kind}" for kind in kinds))

    def present(self, keys: list[str]) -> set[str]:
        """Which of ``keys`` have a record: one round trip per kind, not per key, and without
        their values."""
        with self._lock:
            found = {k for k in keys if k in self._pending}
        by_hash: dict[str, list[str]] = {}
        for key in keys:
            if key not in found:
                by_hash.setdefault(self._hash(key), []).append(key)
        exists = self.client.register_script(_EXISTS)
        for name, names in by_hash.items():
            found.update(k for k, there in zip(names, exists(keys=[name], args=names)) if there)
        return found

    def items(self, prefix: str) -> Iterator[tuple[str, Any]]:
        """(key, value) of the records whose key starts with ``prefix``, in key order (as the
        in-process journal gives them), a page at a time."""
        for key, raw in self.raw_items(prefix):
            yield key, json.loads(raw)

    def raw_items(self, prefix: str) -> Iterator[tuple[str, str]]:
        """``items``, each value as the JSON text stored."""
        self.flush()
        name = self._hash(prefix)
        kind = prefix.partition(":")[0]
        if prefix == f"{kind}:" and kind == ORDERED and self._indexed(name):
            pages = self._ordered_keys(self._order(kind))
        else:   # a few records (uploads), or a journal written before the order was kept
            keys = sorted(k for k, _v in self.client.hscan_iter(name) if k.startswith(prefix))
            pages = (keys[start:start + PAGE] for start in range(0, len(keys), PAGE))
        for page in pages:
            for key, raw in zip(page, self.client.hmget(name, page)):
                if raw is not None:
                    yield key, raw

    def _indexed(self, name: str) -> bool:
        pipe = self.client.pipeline(transaction=False)
        pipe.hlen(name)
        pipe.zcard(self._order(ORDERED))
        records, ordered = pipe.execute()
        return records == ordered

    def _ordered_keys(self, order: str) -> Iterator[list[str]]:
        low = "-"
        while True:
            page = self.client.zrangebylex(order, low, "+", start=0, num=PAGE)
            if page:
                yield page
            if len(page) < PAGE:
                return
            low = "(" + page[-1]

    def clear(self) -> None:
        with self._lock:
            self._pending = {}
        names = list(self.client.scan_iter(match=f"{self.key}:*", count=100))
        if names:
            self.client.delete(*names)
