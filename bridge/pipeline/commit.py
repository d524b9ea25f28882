"""Stage 6, commit: the finalize unit turns a job's journal into one commit of the manifest
(``bridge.jobs.commit``), written last; the objects a plan adopted are journaled beforehand so
that the commit names them beside what the job wrote."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from bridge import jobs
from bridge.journal import Journal
from bridge.manifest import FileEntry, RawEntry, entry_of
from bridge.pipeline.plan import Entries


def journal_adopted(journal: Journal, adopted: Iterable[dict] | Entries) -> None:
    """Adopted objects' entries into the job's journal as files it holds (``file:<path>``), a page
    at a time, where the journal has no record of the path yet (a file a killed run of the job
    wrote keeps the record of what it wrote): the commit then names them with what the job
    wrote, read from the journal as those are (in process, and the service's finalize alike).
    A plan's ``Entries`` are journaled as the text they were encoded to once."""
    page: list[tuple[str, Any]] = []

    def flush() -> None:
        held = journal.get_many([key for key, _ in page])
        journal.put_many([record for record, there in zip(page, held) if there is None])
        page.clear()

    pairs = adopted.encoded() if isinstance(adopted, Entries) else ((e["path"], e) for e in adopted)
    for path, entry in pairs:
        page.append((f"file:{path}", entry))
        if len(page) >= 2000:
            flush()
    if page:
        flush()


def journaled_entries(journal: Journal, counted: list[int] | None = None) -> Iterator[FileEntry | RawEntry]:
    """The entries of the files a job's journal holds as written, sorted by path (the journal's
    key order), read as they are consumed; ``counted[0]`` counts them. A record in the form
    ``JobContext.written`` gives it is committed as its text (``RawEntry``), any other decoded."""
    for _key, raw in journal.raw_items("file:"):
        if counted is not None:
            counted[0] += 1
        yield entry_of(raw)


def finalize(ctx: jobs.Context, unit: dict) -> dict:
    """The finalize unit: what the job wrote made durable, then committed."""
    ctx.settle()  # every file durable before the manifest, the commit marker, names it
    counted = [0]
    # (objects adopted, found already at the destination and equal to their source, are in the
    # journal beside what the job wrote: journal_adopted)
    where = jobs.commit(ctx.dst, ctx.dst_root, ctx.plan.source, ctx.plan.destination,
                        journaled_entries(ctx.journal, counted), removed=ctx.plan.deletions)
    return {"manifest": where, "files": counted[0]}
