"""``mcbridge plan``, ``mcbridge policy check`` and ``mcbridge replicate --policy``. Registered by
bridge.cli at start; the decisions they print are policies/'s, the facts bridge's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from bridge.cli import ConfigOpt, JsonOpt, ProfileOpt, emit, out, settings_from_flags
from bridge.config import parse_size
from bridge.progress import human_bytes

MaxCostOpt = Annotated[Optional[float], typer.Option(
    "--max-cost", min=0, help="Refuse, before any data request, a job estimated above this many US dollars.")]


def plan(src: str, dst: str,
         pack: Annotated[Optional[str], typer.Option("--pack", help="Allow packing into tar or parquet shards "
                                                     "first (a route of its own).")] = None,
         route: Annotated[Optional[str], typer.Option("--route", help="Use this route; refused if it cannot "
                                                      "serve the pair.")] = None,
         shard_size: Annotated[str, typer.Option("--shard-size", help="Shard size the pack route assumes.")] = "256MiB",
         source_class: Annotated[Optional[str], typer.Option(
             "--source-class", help="Storage class of the source objects, for retrieval fees (e.g. GLACIER, "
             "COLDLINE, COOL).")] = None,
         available: Annotated[Optional[list[str]], typer.Option(
             "--assume-available", help="Plan as if this route could run here (repeatable).")] = None,
         as_json: JsonOpt = False, profile: ProfileOpt = None, config: ConfigOpt = None) -> None:
    """Price every route for copying SRC to DST (bytes, requests, dollars, time) and say which
    one bridge would take and why. Lists the source; moves nothing."""
    from bridge.costing import route_plan
    settings = settings_from_flags(profile, config)
    report = route_plan(src, dst, settings, pack=pack, shard_size=parse_size(shard_size), forced=route,
                        source_class=source_class, available=available)
    if as_json:
        out.print_json(json.dumps(report))
        return
    places = report["places"]
    out.print(f"{report['files']} files, {human_bytes(report['bytes'])}: {report['source']} ({places['source']}) -> "
              f"{report['destination']} ({places['destination']}); this process runs in {places['runs_in']}",
              markup=False)
    out.print(f"{'route':<10} {'valid':<6} {'bytes':>10} {'requests':>9} {'usd':>10} {'time':>10}  why", markup=False)
    for row in report["routes"]:
        mark = "*" if row["chosen"] else " "
        out.print(f"{mark}{row['route']:<9} {'yes' if row['valid'] else 'no':<6} {human_bytes(row['bytes']):>10} "
                  f"{row['requests']:>9} {row['usd']:>10.4f} {row['seconds']:>9.0f}s  {row['why']}", markup=False)
    chosen = next(r for r in report["routes"] if r["chosen"])
    out.print(f"chosen: {chosen['route']}", markup=False)
    for line in chosen["cost"]["breakdown"]:
        out.print(f"  {line}", markup=False)


def register(app: typer.Typer) -> None:
    app.command()(plan)
