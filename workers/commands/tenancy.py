"""``mcbridge service init|add-tenant``: the tenant keys and the service policy, written here;
nothing else of the service is needed (no broker, no Celery)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from bridge.cli.options import out


def service_init(tenant: Annotated[str, typer.Option("--tenant", help="The one tenant's name.")] = "default",
                 directory: Annotated[Optional[Path], typer.Option(
                     "--dir", help="Where to write service-keys and service.yaml (default: ~/.config/mcbridge, "
                     "where workers and submitters on this machine look when BRIDGE_KEYS_FILE and "
                     "BRIDGE_SERVICE_POLICY are unset).")] = None,
                 local: Annotated[Optional[list[str]], typer.Option(
                     "--local", help="A local folder the tenant may read and write on workers (repeatable; "
                     "workers need it in BRIDGE_LOCAL_ROOTS too).")] = None,
                 force: Annotated[bool, typer.Option("--force", help="Replace files that exist.")] = False) -> None:
    """Set up a single-user service: one tenant with a fresh key, allowed every bucket of every
    store (and the --local folders). Edit service.yaml to narrow it or add tenants."""
    from bridge.errors import InvalidOption
    from bridge.workers.auth import new_key, write_keys_file
    from bridge.workers.settings import KEYS_FILE_NAME, SERVICE_POLICY_NAME, _tenant, service_dir
    try:
        _tenant(tenant)
    except ValueError as exc:
        raise InvalidOption(f"--tenant: {exc}") from None
    folders = [os.path.realpath(os.path.expanduser(p)) for p in local or []]
    if any(not f or not Path(f).is_dir() for f in folders):
        raise InvalidOption(f"--local: {next(p for p, f in zip(local, folders) if not Path(f).is_dir())!r} is not a folder")
    home = directory or service_dir(os.environ)
    keys_path, policy_path = home / KEYS_FILE_NAME, home / SERVICE_POLICY_NAME
    for path in (keys_path, policy_path):
        if path.exists() and not force:
            raise InvalidOption(f"{path} exists: keep it, or give --force to replace it")
    policy_path.parent.mkdir(parents=True, exist_ok=True)
    from bridge.policies.tenants import single_tenant
    policy_path.write_text(single_tenant(tenant, folders))
    write_keys_file(keys_path, {tenant: new_key()})
    out.print(f"wrote {keys_path} (tenant {tenant}'s key; mode 600) and {policy_path}", markup=False)
    if directory is not None:
        out.print(f"export BRIDGE_KEYS_FILE={keys_path} BRIDGE_SERVICE_POLICY={policy_path}", markup=False)
    if folders:
        out.print(f"workers: export BRIDGE_LOCAL_ROOTS={':'.join(folders)}", markup=False)


def service_add_tenant(tenant: Annotated[str, typer.Argument(help="The new tenant's name.")],
                       keys_file: Annotated[Optional[Path], typer.Option(
                           "--keys-file", help="The keys file (default: $BRIDGE_KEYS_FILE, else ~/.config/mcbridge/service-keys).")] = None,
                       out_file: Annotated[Optional[Path], typer.Option(
                           "--out", help="Also write the new tenant's key alone to this file (for its submitters).")] = None) -> None:
    """Add a tenant with a fresh key to a keys file (workers need the whole file, the tenant's
    submitters only --out); then give the tenant a scope in the service policy."""
    from bridge.errors import InvalidOption
    from bridge.workers.auth import new_key, parse_keys, write_keys_file
    from bridge.workers.settings import KEYS_FILE_NAME, _tenant, service_dir
    try:
        _tenant(tenant)
    except ValueError as exc:
        raise InvalidOption(f"TENANT: {exc}") from None
    from bridge.workers.settings import WorkerSettings
    path = keys_file or Path(WorkerSettings.from_env(os.environ).keys_file or service_dir(os.environ) / KEYS_FILE_NAME)
    existing = {name: key.hex() for name, key in parse_keys(path.read_text(), str(path)).items()} if path.exists() else {}
    if tenant in existing:
        raise InvalidOption(f"{path} already holds a key for tenant {tenant!r}")
    key = new_key()
    write_keys_file(path, {**existing, tenant: key})
    if out_file is not None:
        write_keys_file(out_file, {tenant: key})
    out.print(f"added tenant {tenant} to {path}" + (f" and wrote its key alone to {out_file}" if out_file else ""),
              markup=False)
    out.print(f"now give it a scope in the service policy (tenants: {tenant}: read: [...] write: [...]) and check it "
              f"with mcbridge policy check", markup=False)


def register(app: typer.Typer) -> None:
    service = typer.Typer(no_args_is_help=True, help="Tenants of the service: set up, add.")
    service.command("init")(service_init)
    service.command("add-tenant")(service_add_tenant)
    app.add_typer(service, name="service")
