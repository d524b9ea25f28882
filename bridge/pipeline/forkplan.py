"""A sync of a large local folder planned by several processes at once, one part of its folders each.

Planning a sync is Python work for every file: the local walk, the destination's listing, the
record, the merge, and for another tool's copy the hashing and judging of each file (bridge/adopt.py).
In one process those threads take turns for one GIL: 20,000 files adopted took 1.2 s of planning
on two cores, one of them mostly idle (bench/notes/adopt-pack.md). Here the folder is split by its
top-level folders, as the service splits a job's listing among workers (bridge.pipeline.parts),
and each part is planned by ``plan_sync`` itself (``part=``) in a process of its own, forked, so
that its result is exactly the plan of the paths it holds. What the parts found is merged back in
path order: the files to send, the deletions, the counts, the listing's lengths and the requests
each part sent (``meter``); the adopted entries (their JSON text as the part encoded it) are read
from the parts' files in path order each time the plan's ``adopted`` is read (``PartEntries``).

When: the source is a local folder whose top level holds two folders or more, and at least
``MIN_ENTRIES`` entries one level below (a smaller sync's fork would cost more than it saves), as
many a folder as make each part's listings no longer than one of the whole (``_big_enough``);
Linux, not a daemonic process (a Celery prefork worker's: ``adopt._can_fork``), and
``transfer.processes`` (0: one a core, at most ``MAX_PROCESSES``) above 1. Otherwise None,
and the sync is planned in this process as before.

Each process writes what it found to files this process opened (and unlinked) before forking,
so a killed run leaves nothing on disk, and a million adopted entries go through no pipe and sit
in no list (nor in a second copy: the plan reads them where the parts wrote them); it says only how it went (counts, errors, progress) through a pipe of its own. A part
that fails raises its error here (the first part's, in path order); a process that dies without
a word fails the plan, naming its exit code; ^C here ends them all.
"""

from __future__ import annotations

import heapq
import json
import os
import pickle
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from bridge import manifest as manifests
from bridge import meter
from bridge.config import Settings
from bridge.errors import BridgeError, ObjectNotFound
from bridge.filters import Filters
from bridge.journal import Encoded, job_key
from bridge.pipeline.parts import Part, split, top_level
from bridge.pipeline.plan import Entries, FileList, Plan, batching, check_chunk_size, spill_dir
from bridge.progress import Progress
from bridge.stores import get_store
from bridge.urls import Location, parse

MIN_ENTRIES = 4096     # entries one level below the top-level folders, at least, for a plan to be split
MAX_PROCESSES = 4
PAGE = 1000            # keys in a page of a store's listing (S3's, GCS's and Azure's most)
CHUNK = 1000           # entries or files per pickled record of a part's output
FLUSH_SECONDS = 0.2    # how often a part's progress reaches this process


def processes_for(settings: Settings) -> int:
    """The processes a job's work may be split over: ``transfer.processes`` (0: one a core, at
    most ``MAX_PROCESSES``), and 1 (none forked) outside the main thread: a fork copies only the
    thread that forks, and a lock another thread held then would be held in the child for good
    (a command runs its job on the main thread; the Python API, a replicator's or a checkpoint
    writer's thread, run it in one process)."""
    if threading.current_thread() is not threading.main_thread():
        return 1
    wanted = settings.transfer.processes
    return wanted if wanted else min(MAX_PROCESSES, os.cpu_count() or 1)


def plan_sync_split(plan_part: Callable[..., tuple[Plan, dict[str, int]]], source: str, destination: str,
                    settings: Settings, *, delete: bool, chunk_size: int | None, adopt: str, filters: Filters | None,
                    progress: Progress | None) -> tuple[Plan, dict[str, int]] | None:
    """The sync's plan made by parts in processes of their own, each by ``plan_part`` (syncplan's
    ``plan_sync``, given ``part=``), or None where it is not split."""
    from bridge.adopt import _can_fork
    processes = processes_for(settings)
    src = parse(source)
    if processes < 2 or not src.is_local or not os.path.isdir(src.local_path) or not _can_fork():
        return None
    if filters is not None and filters.active and filters.prefix():
        return None   # the listing starts in the one folder the filters reach: nothing to split
    src, dst = src.as_prefix(), parse(destination).as_prefix()
    src_store, dst_store = get_store(src, settings), get_store(dst, settings)
    found = _splittable(src_store, src, lambda subs: _big_enough(src, subs, processes))
    if found is None:
        return None
    dst_store.check_bucket(dst)              # as resolve does, before any process starts
    check_chunk_size(chunk_size, dst_store)
    there: tuple[set[str], int, bool] | None = (set(), 0, False)
    if delete:   # what only the destination has is found by the part that holds its folder
        try:
            there = top_level(dst_store, dst)
        except ObjectNotFound:
            there = (set(), 0, False)   # a folder not made yet: nothing there to delete
        except BridgeError:
            return None
        if there is None:
            return None
    parts = split(found[0] | there[0], bool(found[1] or there[1]), processes, record=found[2])
    if progress is not None:
        progress.begin("planning")
    outcomes = _run(parts, min(processes, len(parts)), progress,
                    (plan_part, source, destination, settings, delete, chunk_size, adopt, filters))
    try:
        return _merged(outcomes, settings, src, dst, chunk_size, delete, filters)
    except BaseException:
        for outcome in outcomes:
            outcome["adopted"].close()
        raise
    finally:
        for outcome in outcomes:
            outcome["files"].close()


def sizes_split(store: Any, root: Location, settings: Settings) -> Iterator[tuple[str, int]] | None:
    """``LocalStore.sizes`` of the folder ``root`` (a pack's plan: bridge.packing.job), its
    top-level folders shared among forked processes, or None where it is not split. Each file's
    ``stat`` is a system call of a few microseconds (5 us here, more on a parallel filesystem)
    that one process makes in turn with its Python work; the walks of several run at once. This
    process walks its share and the files at the top while the others write theirs to files it
    opened (as ``_run``'s parts do), read once its own are given. When: as for a sync's plan
    (two top-level folders or more, ``MIN_ENTRIES`` entries one level down, Linux, the main
    thread, not a daemonic process, ``transfer.processes`` above 1), with no page to fill."""
    from bridge.adopt import _can_fork
    processes = processes_for(settings)
    if processes < 2 or not _can_fork():
        return None
    found = _splittable(store, root, lambda subs: _reaches(root, subs, MIN_ENTRIES))
    if found is None:
        return None
    subs = sorted(found[0])
    shares = [set(subs[n::processes]) for n in range(min(processes, len(subs)))]
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    try:
        outputs = [tempfile.TemporaryFile(dir=_output_dir(settings)) for _ in shares[1:]]
    except OSError:
        return None   # no room for the shares' output: walked in one process, which needs none
    children, pipes = [], []
    try:
        for n, share in enumerate(shares[1:]):
            reader, writer = ctx.Pipe(duplex=False)
            child = ctx.Process(target=_walk_share, daemon=True, name=f"mcbridge-walk-{n + 1}",
                                args=(writer, store, root, share, outputs[n]))
            child.start()
            writer.close()
            children.append(child)
            pipes.append(reader)
    except BaseException:
        _end(children, outputs)
        raise
    return _walked(store, root, shares[0], children, pipes, outputs)


def _splittable(store: Any, root: Location, enough: Callable[[set[str]], bool]) -> tuple[set[str], int, bool] | None:
    """``top_level`` of the folder ``root`` where it holds two top-level folders or more and
    ``enough`` of them; None otherwise, and where the top level cannot be listed (one process
    then says what is wrong, as it always has)."""
    try:
        found = top_level(store, root)
    except BridgeError:
        return None
    if found is None or len(found[0]) < 2 or not enough(found[0]):
        return None
    return found


def _walk_share(conn, store: Any, root: Location, share: set[str], out) -> None:
    try:
        forked_child()
        try:
            _dump(out, store.sizes(root, only=share, top_files=False))
            conn.send(("done",))
        except BaseException as exc:   # said to the parent, which raises it (or its text)
            conn.send(("error", _picklable(exc), f"{exc}" or type(exc).__name__))
        conn.close()
    except (BrokenPipeError, ConnectionResetError):
        os._exit(1)


def _walked(store: Any, root: Location, mine: set[str], children: list, pipes: list,
            outputs: list) -> Iterator[tuple[str, int]]:
    """This process's share, then each other's once it is written; an error of a share raised
    here (the first share's), a process that died naming its exit code."""
    try:
        yield from store.sizes(root, only=mine)
        for child, pipe, out in zip(children, pipes, outputs):
            try:
                said = pipe.recv()
            except EOFError:
                child.join()
                raise BridgeError(f"{root}: a process walking part of the folder ended (exit code "
                                  f"{child.exitcode}) before it was done; run the same command again") from None
            if said[0] == "error":
                if said[1] is not None:
                    raise pickle.loads(said[1])
                raise BridgeError(said[2])
            child.join()
            yield from _load(out)
    finally:
        _end(children, outputs)


def _end(children: list, outputs: list) -> None:
    for child in children:
        if child.exitcode is None:
            child.terminate()
    for child in children:
        child.join()
    for out in outputs:
        out.close()


def _reaches(root, subs: set[str], need: int) -> bool:
    """Whether the folders ``subs`` of ``root`` hold ``need`` entries or more between them."""
    seen = 0
    for sub in sorted(subs):
        try:
            with os.scandir(os.path.join(root.local_path, sub)) as entries:
                for _ in entries:
                    seen += 1
                    if seen >= need:
                        return True
        except OSError:
            continue
    return False


def _big_enough(root, subs: set[str], processes: int) -> bool:
    """Whether the top-level folders hold ``MIN_ENTRIES`` entries or more between them, counted
    one level down, and enough a folder that the parts' listings of a store, one LIST a page per
    folder and each part's in turn, take no more round trips than one listing of the whole: at
    least PAGE / (processes - 1) a folder (with 2 processes, a full page of 1,000 each)."""
    return _reaches(root, subs, max(MIN_ENTRIES, len(subs) * -(-PAGE // (processes - 1))))


def _run(parts: list[Part], processes: int, progress: Progress | None, job: tuple) -> list[dict[str, Any]]:
    """Each part planned in one of ``processes`` forked processes (part i by process i mod n);
    what each part found, in the parts' order."""
    import multiprocessing
    from multiprocessing.connection import wait
    ctx = multiprocessing.get_context("fork")
    outputs = [(tempfile.TemporaryFile(dir=_output_dir(job[3])), tempfile.TemporaryFile(dir=_output_dir(job[3])))
               for _ in parts]
    audit = bool(progress is not None and getattr(progress, "audit", False))
    children, readers = [], {}
    try:
        for n in range(processes):
            mine = list(range(n, len(parts), processes))
            reader, writer = ctx.Pipe(duplex=False)
            child = ctx.Process(target=_child, daemon=True, name=f"mcbridge-plan-{n}",
                                args=(writer, [(i, parts[i], outputs[i]) for i in mine], job, audit))
            child.start()
            writer.close()
            children.append(child)
            readers[reader] = child
        done: dict[int, dict[str, Any]] = {}
        failed: dict[int, tuple[bytes | None, str]] = {}
        while readers:   # a pipe ends when its process does, after all it sent
            for ready in wait(list(readers)):
                try:
                    _heard(ready.recv(), progress, done, failed)
                except EOFError:
                    readers.pop(ready).join()
        for child in children:
            child.join()
        if failed:
            index = min(failed)
            raised, text = failed[index]
            if raised is not None:
                raise pickle.loads(raised)
            raise BridgeError(text)
        missing = [i for i in range(len(parts)) if i not in done]
        if missing:
            codes = ", ".join(str(c.exitcode) for c in children if c.exitcode)
            raise BridgeError(f"planning the sync: a planning process ended without its part "
                              f"(exit code {codes or 'unknown'}); run the same command again")
        return [{**done[i], "files": outputs[i][0], "adopted": outputs[i][1]} for i in range(len(parts))]
    except BaseException:
        for child in children:
            if child.exitcode is None:
                child.terminate()
        for child in children:
            child.join()
        for files, adopted in outputs:
            files.close()
            adopted.close()
        raise


def _output_dir(settings: Settings) -> str:
    folder = spill_dir(settings)
    folder.mkdir(parents=True, exist_ok=True)
    return str(folder)


def _heard(message: tuple, progress: Progress | None, done: dict, failed: dict) -> None:
    kind = message[0]
    if kind == "progress":
        _, listed, checked, judged = message
        if progress is not None:
            if listed:
                progress.saw(listed)
            for _ in range(checked):
                progress.checked()
            for rel, verdict, size in judged:
                progress.judged(rel, verdict, size)
    elif kind == "done":
        done[message[1]] = message[2]
    else:
        failed[message[1]] = (message[2], message[3])


class _Relay:
    """A part's progress, said to the planning parent a batch at a time (``FLUSH_SECONDS``); the
    per-file verdicts only when the parent's progress audits them (-v)."""

    def __init__(self, conn, audit: bool) -> None:
        self.conn, self.audit = conn, audit
        self.listed = self.checks = 0
        self.judgements: list[tuple[str, str, int]] = []
        self.last = time.monotonic()

    def begin(self, phase: str) -> None:
        pass

    def saw(self, objects: int) -> None:
        self.listed += objects
        self._maybe()

    def checked(self, nbytes: int = 0) -> None:
        self.checks += 1
        self._maybe()

    def judged(self, rel: str, verdict: str, size: int) -> None:
        if self.audit and verdict in ("adopted", "unchanged"):
            self.judgements.append((rel, verdict, size))

    def _maybe(self) -> None:
        now = time.monotonic()
        if now - self.last >= FLUSH_SECONDS:
            self.last = now
            self.flush()

    def flush(self) -> None:
        if self.listed or self.checks or self.judgements:
            self.conn.send(("progress", self.listed, self.checks, self.judgements))
            self.listed = self.checks = 0
            self.judgements = []


def _child(conn, mine: list[tuple[int, Part, tuple]], job: tuple, audit: bool) -> None:
    """A planning process: its parts planned in turn, each one's output written to its files; a
    parent gone (its end of the pipe closed) ends it at once."""
    try:
        _plan_parts(conn, mine, job, audit)
    except (BrokenPipeError, ConnectionResetError):
        os._exit(1)


def _plan_parts(conn, mine: list[tuple[int, Part, tuple]], job: tuple, audit: bool) -> None:
    forked_child()
    plan_sync, source, destination, settings, delete, chunk_size, adopt, filters = job
    relay = _Relay(conn, audit)
    for index, part, (files_out, adopted_out) in mine:
        try:
            with meter.metering(meter.Meter()) as counted:
                plan, counts = plan_sync(source, destination, settings, delete=delete, chunk_size=chunk_size,
                                         adopt=adopt, filters=filters, progress=relay, part=part)
            _dump(files_out, plan.files)
            heads = _dump_blocks(adopted_out, plan.adopted.encoded())
            relay.flush()
            conn.send(("done", index, {"counts": counts, "listed": plan.listed, "deletions": plan.deletions,
                                       "source": plan.source, "destination": plan.destination, "key": plan.key,
                                       "requests": counted.to_fields(), "blocks": heads}))
            plan.files.close()
            plan.adopted.close()
        except BaseException as exc:   # said to the parent, which raises it (or its text)
            relay.flush()
            conn.send(("error", index, _picklable(exc), f"{exc}" or type(exc).__name__))
            break
    conn.close()


def forked_child() -> None:
    """What a process forked to plan or run part of a job does first: a ^C reaches its parent,
    which ends it (SIGTERM's default), as does its parent's death, however it died (a SIGKILL
    runs none of the parent's handlers: Linux's PR_SET_PDEATHSIG); and it makes stores of its
    own (no connection of the parent's is shared)."""
    from bridge import stores
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    import multiprocessing
    parent = multiprocessing.parent_process()
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if parent is not None and os.getppid() != parent.pid:   # it died before the signal was asked for
        os._exit(1)
    stores._lock = threading.Lock()   # (another thread of the parent's may have held it at the fork)
    stores._cache.clear()


def _picklable(exc: BaseException) -> bytes | None:
    try:
        raised = pickle.dumps(exc)
        pickle.loads(raised)
        return raised
    except Exception:
        return None


def _dump(out, items) -> None:
    chunk: list = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= CHUNK:
            pickle.dump(chunk, out, protocol=pickle.HIGHEST_PROTOCOL)
            chunk = []
    if chunk:
        pickle.dump(chunk, out, protocol=pickle.HIGHEST_PROTOCOL)
    out.flush()


def _load(out) -> Iterator:
    """What ``_dump`` wrote to ``out``."""
    for chunk in _load_records(out):
        yield from chunk


def _load_records(out) -> Iterator:
    """The records pickled to ``out``, read through a file of its own (its own offset: two
    readings at once do not move each other's place)."""
    with open(f"/proc/self/fd/{out.fileno()}", "rb") as own:
        while True:
            try:
                yield pickle.load(own)
            except EOFError:
                return


def _dump_blocks(out, rows: Iterator[tuple[str, str]]) -> list[tuple[str, str]]:
    """A part's adopted entries (path, JSON text), in path order, laid out in ``out`` as the
    shards of a commit (``manifest.blocks_of``: here, in the part's process, not in the parent's
    one after the parts); the first and last path of each."""
    heads = []
    for block in manifests.blocks_of((path, str(text)) for path, text in rows):
        pickle.dump((block.paths, block.body, block.size, block.sha256), out, protocol=pickle.HIGHEST_PROTOCOL)
        heads.append((block.paths[0], block.paths[-1]))
    out.flush()
    return heads


def _blocks(out) -> Iterator[manifests.Block]:
    for paths, body, size, sha256 in _load_records(out):
        yield manifests.Block(paths, body, size, sha256)


def _rows(out) -> Iterator[tuple[str, str]]:
    for block in _blocks(out):
        yield from zip(block.paths, block.body.decode().split("\n"))


class PartEntries(Entries):
    """The parts' adopted entries, laid out by the parts as a commit's shards in the files they
    wrote them to (``_dump_blocks``): committed as they are where no part's entries fall between
    another's (``blocks``), else merged in path order each time they are read: none copied, none held."""

    def __init__(self, outputs: list, heads: list[list[tuple[str, str]]], count: int):
        super().__init__()
        self._outputs, self._heads, self._count = outputs, heads, count

    def append_encoded(self, path: str, text: str) -> None:
        raise TypeError("the parts' adopted entries are read, not added to")

    def encoded(self) -> Iterator[tuple[str, Encoded]]:
        for path, text in heapq.merge(*(_rows(out) for out in self._outputs), key=_first):
            yield path, Encoded(text)

    def blocks(self) -> Iterator[manifests.Block] | None:
        """The parts' blocks in path order, or None where one part's paths fall between
        another's (the files at the top of the folder, among its folders' names)."""
        order = sorted((heads[0][0], i) for i, heads in enumerate(self._heads) if heads)
        last = None
        for _first, i in order:
            for first, end in self._heads[i]:
                if last is not None and first <= last:
                    return None
                last = end
        return (block for _first, i in order for block in _blocks(self._outputs[i]))

    def __iter__(self) -> Iterator[dict]:
        return (json.loads(text) for _path, text in self.encoded())

    def __len__(self) -> int:
        return self._count

    def __repr__(self) -> str:
        return f"PartEntries({self._count})"

    def close(self) -> None:
        for out in self._outputs:
            out.close()


def _first(pair: tuple[str, str]) -> str:
    return pair[0]


def _merged(outcomes: list[dict[str, Any]], settings: Settings, src, dst, chunk_size: int | None, delete: bool,
            filters: Filters | None) -> tuple[Plan, dict[str, int]]:
    source, destination = str(src), str(dst)
    key = job_key("sync", source, destination, chunk_size, delete,
                  *((filters.key(),) if filters is not None and filters.active else ()))
    for outcome in outcomes:
        if (outcome["source"], outcome["destination"], outcome["key"]) != (source, destination, key):
            raise BridgeError(f"internal error: a part planned {outcome['source']} -> {outcome['destination']}, "
                              f"not {source} -> {destination}")
    files = FileList(where=spill_dir(settings))
    files.extend(heapq.merge(*(_load(o["files"]) for o in outcomes), key=lambda f: f.rel))
    counts: Counter = Counter({"new": 0, "changed": 0, "repaired": 0, "unchanged": 0, "adopted": 0})
    listed: Counter = Counter()
    for outcome in outcomes:
        counts.update(outcome["counts"])
        listed.update(outcome["listed"])
    deletions = list(heapq.merge(*(o["deletions"] for o in outcomes)))
    if delete:
        counts["deleted"] = len(deletions)
    ran = meter.current()
    if ran is not None:
        for outcome in outcomes:
            ran.add(meter.Meter.from_fields(outcome["requests"]))
    plan = Plan(source, destination, None, files, deletions)
    plan.listed = {"source": listed["source"], "destination": listed["destination"],
                   "record_reads": listed["record_reads"]}
    plan.adopted = PartEntries([o["adopted"] for o in outcomes], [o["blocks"] for o in outcomes], counts["adopted"])
    plan.key = key
    batching(plan, src, dst, settings)
    return plan, dict(counts)
