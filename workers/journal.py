"""The engine's ``Journal`` kept in Redis, shared by every worker running units of one job.

Records go to one hash per kind of key (``file:``, ``part:``, ``upload:`` ...), so that the
finalize step reads every ``file:`` record with one scan of one hash however many parts the job
had. The journal is keyed by the plan's key, like the in-process one: submitting a failed job
again finds what the first run finished.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

PAGE = 1000   # values read per HMGET by items()


class RedisJournal:
    def __init__(self, client, key: str, ttl: float):
        self.client = client
        self.key = key
        self.ttl = int(ttl)

    def _hash(self, key: str) -> str:
        kind = key.partition(":")[0]
        return f"{self.key}:{kind}"

    def get(self, key: str) -> Any | None:
        raw = self.client.hget(self._hash(key), key)
        return None if raw is None else json.loads(raw)

    def put(self, key: str, value: Any) -> None:
        name = self._hash(key)
        pipe = self.client.pipeline(transaction=False)
        pipe.hset(name, key, json.dumps(value, separators=(",", ":")))
        pipe.expire(name, self.ttl)
        pipe.execute()

    def put_many(self, records: list[tuple[str, Any]]) -> None:
        """Several records in one round trip."""
        if not records:
            return
        by_hash: dict[str, dict[str, str]] = {}
        for key, value in records:
            by_hash.setdefault(self._hash(key), {})[key] = json.dumps(value, separators=(",", ":"))
        pipe = self.client.pipeline(transaction=False)
        for name, mapping in by_hash.items():
            pipe.hset(name, mapping=mapping)
            pipe.expire(name, self.ttl)
        pipe.execute()

    def present(self, keys: list[str]) -> set[str]:
        """Which of ``keys`` have a record: one HMGET per kind, not a round trip per key."""
        by_hash: dict[str, list[str]] = {}
        for key in keys:
            by_hash.setdefault(self._hash(key), []).append(key)
        pipe = self.client.pipeline(transaction=False)
        for name, names in by_hash.items():
            pipe.hmget(name, names)
        found = set()
        for names, values in zip(by_hash.values(), pipe.execute()):
            found.update(k for k, v in zip(names, values) if v is not None)
        return found

    def items(self, prefix: str) -> Iterator[tuple[str, Any]]:
        """(key, value) of the records whose key starts with ``prefix``, in key order (as the
        in-process journal gives them): the keys are sorted here, the values read a page at a
        time."""
        name = self._hash(prefix)
        keys = sorted(k for k, _v in self.client.hscan_iter(name) if k.startswith(prefix))
        for start in range(0, len(keys), PAGE):
            page = keys[start:start + PAGE]
            for key, raw in zip(page, self.client.hmget(name, page)):
                if raw is not None:
                    yield key, json.loads(raw)

    def clear(self) -> None:
        names = list(self.client.scan_iter(match=f"{self.key}:*", count=100))
        if names:
            self.client.delete(*names)
