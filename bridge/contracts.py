"""What the route seam and the pipeline (bridge.pipeline) share, kept below both so that neither
imports the other for it: one file's plan (``FilePlan``), and what a route reads of the plan it carries
(``RoutedPlan``) and of the job it runs in (``RouteContext``).

``FilePlan`` is a value both build and read. The two others are Protocols naming only what
``bridge.routes`` uses: ``bridge.pipeline.plan.Plan`` and ``bridge.pipeline.execute.JobContext``
are the classes that have it, and a route never needs the pipeline's other parts.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from bridge.attributes import Attrs
    from bridge.config import Settings
    from bridge.progress import Progress
    from bridge.stores.base import Store
    from bridge.urls import Location


@dataclass
class FilePlan:
    rel: str
    size: int
    part_size: int = 0   # 0: one request
    # What names this version of the source object (its ObjectInfo.identity): journaled with the file's upload and records, so a source rewritten between a kill
    # and the re-run, even at the same size, is sent again rather than finished from old parts.
    source_id: dict[str, str] = field(default_factory=dict)

    # A task of the Celery executor may send only some of a large file's parts: first_part to
    # last_part (1-based, inclusive; 0: to the end). The file's ``complete`` then runs at commit.
    first_part: int = 1
    last_part: int = 0
    # The source's headers and user metadata when its listing carried them (bridge.attributes);
    # None: asked of the source when the file is written.
    attrs: dict | None = None
    storage_class: str = ""   # the source's, when its listing names one (for retrieval prices)
    # Hashes the source's record holds for this version of the file (bridge.carry): checked by
    # CRC32C as the bytes pass, carried into the destination's entry instead of recomputed.
    carry: dict | None = None

    @property
    def parts(self) -> int:
        return math.ceil(self.size / self.part_size) if self.part_size else 1

    def part_numbers(self) -> range:
        """The parts this plan sends."""
        return range(self.first_part, (self.last_part or self.parts) + 1)

    @property
    def whole(self) -> bool:
        """Whether this plan sends every part (and so completes the file itself)."""
        return len(self.part_numbers()) == self.parts


class RoutedPlan(Protocol):
    """A plan as a route sees it: the roots, its files and deletions, and the route chosen for it
    (``bridge.routes.choose`` sets ``route`` and ``route_why``)."""

    source: str
    destination: str
    single: str | None
    deletions: list[str]
    route: str
    route_why: str

    @property
    def files(self) -> Iterable[FilePlan]: ...


class RouteContext(Protocol):
    """A job's shared state as a route uses it: the plan, settings, progress, both stores and
    roots, and the cancel signal a remote route watches (with what it says of a cancelled or
    started remote job)."""

    plan: RoutedPlan
    settings: Settings
    progress: Progress
    src: Store
    dst: Store
    src_root: Location
    dst_root: Location
    cancelled: threading.Event
    cancel_note: str
    remote: dict | None

    def src_loc(self, rel: str) -> Location: ...

    def dst_loc(self, rel: str) -> Location: ...

    def attrs(self, rel: str, known: Attrs | None = None) -> Attrs | None: ...
