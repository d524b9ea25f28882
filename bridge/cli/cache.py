"""``mcbridge cache path|warm|ls|stat|pin|unpin|evict|verify``. Registered by bridge.cli at start.

The cache directory and quota come from the settings (``MCBRIDGE_CACHE_DIR``,
``MCBRIDGE_CACHE_QUOTA``, ``cache:`` in the settings file). ``cache warm --node NAME`` queues the
warm on that node's queue (``<prefix>.cache.NAME``) for a worker running there
(``mcbridge worker -Q bridge.cache.NAME``) instead of running it here: the plugin that fills the
"warm on a node" hook (bridge.registry; the service) queues it.
"""

from __future__ import annotations

import json
import re
import time
from typing import Annotated, Optional

import typer

from bridge.cli.options import (ConfigOpt, ExcludeOpt, FilesFromOpt, IncludeOpt, JsonOpt, MaxAgeOpt, MaxSizeOpt,
                                MinAgeOpt, MinSizeOpt, ProfileOpt, err, filters_from_flags, given, out,
                                settings_from_flags)
from bridge.progress import Progress, human_bytes, plural

LookaheadOpt = Annotated[Optional[int], typer.Option(
    "--lookahead", min=1, max=256, help="Objects filled ahead of the one read (default: cache.lookahead).")]


def _cache(profile, config):
    from bridge.cache.core import Cache
    return Cache(settings_from_flags(profile, config, cache_dir=True))


_TTL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$", re.IGNORECASE)   # no nan, inf or 1e999
_TTL_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
TTL_MAX_DAYS = 3650   # a pin meant to outlive ten years is a pin without --ttl


def _duration(text: str) -> float:
    """--ttl in seconds: a number with an optional unit, more than 0 and at most TTL_MAX_DAYS."""
    from bridge.errors import InvalidOption
    given("--ttl", text)
    m = _TTL.match(text)
    if not m:
        raise InvalidOption(f"invalid TTL {text!r}: use seconds or a number with s, m, h or d, e.g. 12h")
    value = float(m.group(1)) * _TTL_UNITS[m.group(2).lower()]
    if not 0 < value <= TTL_MAX_DAYS * 86400:
        raise InvalidOption(f"invalid TTL {text!r}: give more than 0 and at most {TTL_MAX_DAYS}d, or leave "
                            f"--ttl out to pin until unpinned")
    return value


def path(url: str, profile: ProfileOpt = None, config: ConfigOpt = None) -> None:
    """Fill the cache with URL if it does not hold its current version; print the local path (last line)."""
    out.print(str(_cache(profile, config).fetch(url)), markup=False)


def warm(items: Annotated[list[str], typer.Argument(help="Objects, prefixes (trailing /) or shard-set "
                                                    "indexes (*.index.json).")],
         node: Annotated[Optional[str], typer.Option(
             "--node", help="Queue the warm for the worker on this node (queue <prefix>.cache.NODE).")] = None,
         wait: Annotated[bool, typer.Option("--wait", help="With --node: wait for the worker's summary.")] = False,
         timeout: Annotated[float, typer.Option("--timeout", min=0.1, help="With --node --wait: seconds to wait for "
                                                "the worker's summary; exit 1 if none came by then.")] = 3600.0,
         broker: Annotated[Optional[str], typer.Option("--broker", help="With --node: Redis URL of the broker.")] = None,
         lookahead: LookaheadOpt = None,
         include: IncludeOpt = None, exclude: ExcludeOpt = None, files_from: FilesFromOpt = None,
         min_size: MinSizeOpt = None, max_size: MaxSizeOpt = None, min_age: MinAgeOpt = None,
         max_age: MaxAgeOpt = None, as_json: JsonOpt = False,
         profile: ProfileOpt = None, config: ConfigOpt = None) -> None:
    """Fill the cache with objects, every object under prefixes (those the filters select), or
    the shards of shard sets, in order."""
    filters = filters_from_flags(include, exclude, files_from, min_size, max_size, min_age, max_age)
    if node:
        if filters is not None:
            from bridge.errors import InvalidOption
            raise InvalidOption("--node queues the targets as given: list the objects to warm there, or warm "
                                "here with the filters")
        from bridge.errors import MissingBackend
        from bridge.registry import install_hint
        from bridge.registry import plugins
        warm_on_node = plugins().first("warm on a node")
        if warm_on_node is None:
            raise MissingBackend(f"cache warm --node needs the service: {install_hint('service')}")
        summary = warm_on_node(node, items, profile=profile, lookahead=lookahead, wait=wait, broker=broker,
                               timeout=timeout)
        if as_json:
            out.print_json(json.dumps(summary))
        elif wait:
            _print_warm(summary["result"])
        else:
            out.print(summary["task_id"], markup=False)
            err.print(f"queued cache warm of {plural(len(items), 'target')} on {summary['queue']}", markup=False)
        return
    from bridge.cache.core import warm as run_warm
    settings = settings_from_flags(profile, config)
    # a line per object where -v or --log-file lets it through
    summary = run_warm(items, settings, lookahead, filters=filters, progress=Progress(audit=True))
    if as_json:
        out.print_json(json.dumps(summary))
    else:
        _print_warm(summary)


def _print_warm(s: dict) -> None:
    out.print(f"warmed {plural(s['objects'], 'object')}, {human_bytes(s['bytes'])}: {s['hits']} already cached, "
              f"{s['misses']} filled ({human_bytes(s['bytes_filled'])}) in {s['dir']}", markup=False)


def ls(as_json: JsonOpt = False, profile: ProfileOpt = None, config: ConfigOpt = None) -> None:
    """List the cache's entries, most recently used first."""
    cache = _cache(profile, config)
    pins = cache.pins()
    from bridge.cache.core import url_hash
    rows = [{"url": e.url, "size": e.size, "last_used": e.last_used, "path": str(cache.data_path(e.key)),
             "pinned": url_hash(e.url) in pins, "identity": e.meta.get("identity", {})}
            for e in sorted(cache.entries(), key=lambda e: -e.last_used)]
    if as_json:
        out.print_json(json.dumps(rows))
        return
    for row in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["last_used"]))
        out.print(f"{row['size']:>14}  {when}  {'pinned' if row['pinned'] else '      '}  {row['url']}", markup=False)


def stat(as_json: JsonOpt = False, profile: ProfileOpt = None, config: ConfigOpt = None) -> None:
    """Usage against the quota, and the counters: hits, misses, bytes filled, evictions, fill time."""
    s = _cache(profile, config).stat()
    if as_json:
        out.print_json(json.dumps(s))
        return
    quota = human_bytes(s["quota"]) if s["quota"] else "none"
    out.print(f"{s['dir']}: {plural(s['entries'], 'entry', 'entries')}, {human_bytes(s['bytes'])} of quota {quota}; "
              f"{s['pinned']} pinned, {s['filling']} filling", markup=False)
    out.print(f"hits {int(s['hits'])} (of which waited for another's fill {int(s['waits'])}), misses {int(s['misses'])}, "
              f"bytes filled {human_bytes(s['bytes_filled'])} in {s['fill_seconds']:.1f}s, "
              f"evictions {int(s['evictions'])} ({human_bytes(s['bytes_evicted'])}), corrupted removed "
              f"{int(s['corrupted'])}", markup=False)


def pin(url: str, ttl: Annotated[Optional[str], typer.Option(
            "--ttl", help="Unpin by itself after this long, e.g. 12h (default: until unpinned).")] = None,
        profile: ProfileOpt = None, config: ConfigOpt = None) -> None:
    """Fill URL if needed and keep it: eviction never removes a pinned object."""
    seconds = _duration(ttl) if ttl is not None else None
    local = _cache(profile, config).pin(url, seconds)
    out.print(f"pinned {url}" + (f" for {ttl}" if ttl else ""), markup=False)
    out.print(str(local), markup=False)


def unpin(url: str, profile: ProfileOpt = None, config: ConfigOpt = None) -> None:
    """Let eviction remove URL again."""
    was = _cache(profile, config).unpin(url)
    out.print(f"unpinned {url}" if was else f"{url} was not pinned", markup=False)


def evict(url: Annotated[Optional[str], typer.Argument(metavar="[URL]",
                                                        help="Only this object (every version held).")] = None,
          everything: Annotated[bool, typer.Option("--all", help="Every entry that is not pinned (the cache may "
                                                   "be shared by the node's jobs).")] = False,
          as_json: JsonOpt = False, profile: ProfileOpt = None, config: ConfigOpt = None) -> None:
    """Remove URL's entries, or with --all every entry that is not pinned; entries being filled stay."""
    from bridge.errors import InvalidOption
    if url is not None and not url.strip():   # '' must not mean "everything"
        raise InvalidOption("URL is empty: name the object to evict, or give --all to evict every unpinned entry")
    if (url is None) == (not everything):
        raise InvalidOption("name the object to evict, or give --all to evict every unpinned entry"
                            if url is None else "give a URL or --all, not both")
    removed = _cache(profile, config).evict(url)
    if as_json:
        out.print_json(json.dumps({"removed": removed}))
        return
    for u in removed:
        out.print(f"evicted {u}", markup=False)
    out.print(f"{plural(len(removed), 'entry', 'entries')} evicted", markup=False)


def verify(as_json: JsonOpt = False, profile: ProfileOpt = None, config: ConfigOpt = None) -> None:
    """Rehash every entry; name and remove those whose bytes changed (exit 1 if any)."""
    report = _cache(profile, config).verify()
    if as_json:
        out.print_json(json.dumps(report))
    else:
        for row in report["corrupted"]:
            out.print(f"corrupted {row['url']}: {row['problem']} ({row['path']}); removed", markup=False)
        out.print(f"{'OK' if report['ok'] else 'FAILED'}: {report['checked']} entries checked, "
                  f"{len(report['corrupted'])} corrupted and removed", markup=False)
    if not report["ok"]:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    group = typer.Typer(no_args_is_help=True, help="The node-local read cache (MCBRIDGE_CACHE_DIR).")
    for fn in (path, warm, ls, stat, pin, unpin, evict, verify):
        group.command(fn.__name__)(fn)
    app.add_typer(group, name="cache")
