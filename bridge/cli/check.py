"""``mcbridge check SRC DST``: compare two trees without manifests (bridge/treecheck.py)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from bridge.cli.options import (ConcOpt, ConfigOpt, JsonOpt, ProfileOpt, out, print_findings, quiet_opt,
                                settings_from_flags)


def check(src: str, dst: str,
          download: Annotated[bool, typer.Option("--download", help="Read both sides and compare CRC32C and "
                                                 "SHA-256, instead of the checksums the stores report.")] = False,
          concurrency: ConcOpt = None, as_json: JsonOpt = False,
          quiet: quiet_opt("Print only what differs, nothing when all is equal: the exit code says.") = False,
          profile: ProfileOpt = None, config: ConfigOpt = None) -> None:
    """Compare the objects under SRC and DST from their listings, by size and a checksum both stores
    report (no manifest needed and no object read, as rclone check); exit 1 naming each missing,
    extra, differing or unproven object. --download reads both sides instead."""
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
        if quiet and report["ok"]:
            return
        out.print(summary(report), markup=False)
    if failed is not None:
        raise typer.Exit(failed.exit_code)


def summary(report: dict) -> str:
    """The last line: how many pairs were equal and by what, then each kind of failure found, so
    that a FAILED line always names why (``FAILED: 5000 of 5000 pairs equal; 1 only at the destination``)."""
    by = ", ".join(f"{n} by {name}" for name, n in sorted(report["by"].items()))
    failures = [f"{n} {what}" for n, what in (
        (len(report["missing"]), "missing at the destination"),
        (len(report["extra"]), "only at the destination"),
        (len(report["differ"]), "differ"),
        (len(report["unproven"]), "unproven by the stores' checksums (--download reads both)")) if n]
    return (f"{'OK' if report['ok'] else 'FAILED'}: {report['equal']} of {report['checked']} pairs equal"
            f"{f' ({by})' if by else ''}" + "".join(f"; {failure}" for failure in failures))


def register(app: typer.Typer) -> None:
    app.command()(check)
