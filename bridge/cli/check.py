"""``mcbridge check SRC DST``: compare two trees without manifests (bridge/treecheck.py)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from bridge.cli.options import ConcOpt, ConfigOpt, JsonOpt, ProfileOpt, out, print_findings, settings_from_flags


def check(src: str, dst: str,
          download: Annotated[bool, typer.Option("--download", help="Read both sides and compare CRC32C and "
                                                 "SHA-256, instead of the checksums the stores report.")] = False,
          concurrency: ConcOpt = None, as_json: JsonOpt = False, profile: ProfileOpt = None,
          config: ConfigOpt = None) -> None:
    """Compare the objects under SRC and DST by size and a checksum both stores report (no manifest
    needed, as rclone check); exit 1 naming each missing, extra, differing or unproven object."""
    from bridge import api
    from bridge.errors import TreesDiffer
    failed = None
    try:
        settings = settings_from_flags(profile, config, concurrency)
        report = api.check(src, dst, download=download, settings=settings).report
    except TreesDiffer as exc:
        failed, report = exc, exc.result.report
    if as_json:
        out.print_json(json.dumps(report))
    else:
        print_findings(report, ("missing", "extra", "differ", "unproven"))
        by = ", ".join(f"{n} by {name}" for name, n in sorted(report["by"].items()))
        out.print(f"{'OK' if report['ok'] else 'FAILED'}: {report['equal']} of {report['checked']} pairs equal"
                  f"{f' ({by})' if by else ''}; {len(report['missing'])} missing at {report['destination']}, "
                  f"{len(report['extra'])} extra there, {len(report['differ'])} differ, "
                  f"{len(report['unproven'])} unproven", markup=False)
    if failed is not None:
        raise typer.Exit(failed.exit_code)


def register(app: typer.Typer) -> None:
    app.command()(check)
