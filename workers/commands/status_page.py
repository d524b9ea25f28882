"""``mcbridge status serve``: the service's read-only status page (bridge.workers.statuspage),
on loopback unless told otherwise, behind a token kept in a file only its owner reads."""

from __future__ import annotations

import ipaddress
import os
import stat
from pathlib import Path
from typing import Annotated, Optional

import typer

from bridge.cli.options import ConfigOpt, ProfileOpt, err, given, out, settings_from_flags
from bridge.workers.commands.connection import BrokerOpt, connect, service_settings

TOKEN_FILE_NAME = "status-token"
DEFAULT_BIND = "127.0.0.1:8790"


def parse_bind(text: str) -> tuple[str, int]:
    """'HOST:PORT' ('[::1]:PORT' for IPv6; port 0: any free one), or one line saying what is wrong."""
    from bridge.errors import InvalidOption
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise InvalidOption(f"--bind {text!r}: use HOST:PORT, e.g. {DEFAULT_BIND}")
    return host, int(port)


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token(path: Path) -> tuple[str, bool]:
    """The page's token from ``path``, written first (32 random bytes as hex, mode 600, as tenant
    keys are) if there is none; (token, written now). A file others may read is refused."""
    from bridge import redact
    from bridge.errors import InvalidOption
    from bridge.workers.auth import new_key
    written = False
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(new_key() + "\n")
        written = True
    try:
        mode = path.stat().st_mode
        token = path.read_text().strip()
    except OSError as exc:
        raise InvalidOption(f"--token-file {path} cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise InvalidOption(f"--token-file {path} is not a text file holding a token") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InvalidOption(f"--token-file {path} is readable by others: chmod 600 {path}")
    if len(token) < 16 or any(c.isspace() or not c.isprintable() or c in ";,\"\\" for c in token):
        raise InvalidOption(f"--token-file {path} should hold one token of at least 16 characters, no spaces, "
                            f"quotes, commas or semicolons")
    redact.remember(token)
    return token, written


def status_serve(bind: Annotated[str, typer.Option(
                     "--bind", help="HOST:PORT to listen on (port 0: any free one). Loopback by default: the "
                     "page is plain HTTP, its token its only guard.")] = DEFAULT_BIND,
                 token_file: Annotated[Optional[Path], typer.Option(
                     "--token-file", help="File holding the page's token; written with a fresh one (mode 600) if "
                     "absent (default: ~/.config/mcbridge/status-token).")] = None,
                 policies: Annotated[Optional[Path], typer.Option(
                     "--policies", help="Replication policies to show (default: $BRIDGE_POLICIES).")] = None,
                 profile: ProfileOpt = None, config: ConfigOpt = None, broker: BrokerOpt = None) -> None:
    """Serve the read-only status page: jobs with progress, policies with their lag, budgets and
    the cache, as the jobs, policy status, budgets list and cache stat commands read them. Open
    http://HOST:PORT/?token=TOKEN once in a browser (it then keeps a cookie), or send
    'Authorization: Bearer TOKEN'."""
    from bridge.workers.settings import service_dir
    from bridge.workers.statuspage import serve
    given("--token-file", token_file)
    given("--policies", policies)
    host, port = parse_bind(bind)
    ws = service_settings(broker)
    connect(ws)   # an unreachable broker is one line now, not a 503 on every request
    chosen = policies or (Path(ws.policies) if ws.policies else None)
    if chosen is not None and not chosen.is_file():
        from bridge.errors import InvalidOption
        raise InvalidOption(f"--policies {chosen}: no such file")
    path = token_file or service_dir(os.environ) / TOKEN_FILE_NAME
    token, written = read_token(path)
    if written:
        out.print(f"wrote a new token to {path} (mode 600)", markup=False)
    try:
        server = serve(ws, settings_from_flags(profile, config, cache_dir=True), chosen, (host, port), token)
    except OSError as exc:
        from bridge.errors import InvalidOption
        raise InvalidOption(f"--bind {bind}: cannot listen there: {exc.strerror or exc}") from None
    bound_host, bound_port = server.server_address[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    if not loopback(host):
        err.print(f"mcbridge: the status page listens on {bind}, beyond this machine: plain HTTP, guarded by its "
                  f"token only", markup=False)
    import signal
    for stop in (signal.SIGINT, signal.SIGTERM):   # a server has nothing to resume: the socket closed, exit 0
        signal.signal(stop, _interrupted)
    out.print(f"status page at http://{shown}:{bound_port}/ (token in {path}; read-only; Ctrl-C stops it)",
              markup=False)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def _interrupted(*_: object) -> None:
    raise KeyboardInterrupt


def register(app: typer.Typer) -> None:
    status = typer.Typer(no_args_is_help=True, help="The service's read-only status page.")
    status.command("serve")(status_serve)
    app.add_typer(status, name="status")
