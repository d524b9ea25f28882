"""mcbridge: the command line. Errors become one line on stderr and an exit code (2 for bad
input, 1 for failures at run time), never a traceback.

The CLI is a package of command groups: ``options`` holds what they share (flags, consoles,
settings from flags, progress bar), each group is a module with ``register(app)``, and
``GROUPS`` below lists them in the order ``--help`` shows them, each with the names it registers.
A new group is one module and one line in ``GROUPS``; its heavy imports (Celery, pyarrow) happen
inside its commands, so ``mcbridge --help`` stays fast. ``bridge.cli:main`` is the console script.

A run of one command imports only the group that has it and builds only that command: typer
reads every command's signature to build it (~1.5 ms each, ~40 commands), and a copy of a few
small files should not pay for the rest. ``--help`` and a name no group has get the whole app.
"""

from __future__ import annotations

import gc

# What is imported here (typer, the settings models) lives as long as the process. The
# cyclic collector would walk it again and again while it loads (~60 young collections and a few
# older ones, ~20 ms of a run's CPU): it pauses for these imports, and what they made is frozen
# out of its reach (gc.freeze), as bridge.ops does once the stores exist.
_collecting = gc.isenabled()
gc.disable()
try:
    import importlib
    import sys

    import typer

    from bridge.cli.options import (BwlimitFileOpt, BwlimitOpt, ChunkOpt, ConcOpt, ConfigOpt, DeleteOpt,  # noqa: F401
                                    DryOpt, JsonOpt, MaxCostOpt, ProfileOpt, ProgressBar, QuietOpt, StoreSumOpt, emit,
                                    err, out, print_plan, settings_from_flags)
    from bridge.errors import BridgeError
    from bridge.cli.console import PrintableFormatter
    from bridge.redact import RedactingFilter, redact
    gc.freeze()
finally:
    if _collecting:
        gc.enable()

_APP = dict(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
            help="Move ML corpora and checkpoints between local/Lustre, s3://, gs:// and az://.")
app = typer.Typer(**_APP)

# Command groups, each a module exposing ``register(app)``, and the names of the commands and
# sub-groups it registers (tests/test_cli_startup.py checks them). A group whose package is not
# installed here is left out. The service's commands are the service's (bridge/workers/commands.py):
# bridge/ never imports bridge.workers, it finds them through the "mcbridge.service" entry point.
SERVICE = "mcbridge.service"
GROUPS: dict[str, tuple[str, ...]] = {
    "bridge.cli.transfer": ("ls", "cp", "sync", "verify", "uploads", "version"),
    "bridge.cli.compare": ("check",),
    "bridge.cli.packing": ("pack", "unpack", "cat", "migrate"),
    SERVICE: ("worker", "beat", "submit", "budgets", "jobs"),
    "bridge.cli.policy": ("plan", "replicate", "policy"),
    "bridge.cli.cache": ("cache",),
}
_registered = False


def service_commands():
    """The service's command module, as the installed package registers it (pyproject.toml's
    "mcbridge.service" entry point); None when this installation has no service."""
    from importlib.metadata import entry_points
    found = entry_points(group=SERVICE, name="commands")
    return next(iter(found)).load() if found else None


def _import_group(name: str):
    """The group's module; None when that part of bridge is not installed here."""
    if name == SERVICE:
        return service_commands()
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            return None
        raise


def _register_extensions() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    for name in GROUPS:
        module = _import_group(name)
        if module is not None:
            module.register(app)


def registered_names(cli: typer.Typer) -> list[str]:
    """The names of the commands and sub-groups registered on ``cli``, as typer names them."""
    return ([c.name or typer.main.get_command_name(c.callback.__name__) for c in cli.registered_commands]
            + [g.name for g in cli.registered_groups])


def _only(args: list[str]) -> typer.Typer | None:
    """An app like ``app`` holding just the command (or sub-group) that ``args`` start with, or
    None when they start with no name a group registers."""
    name = args[0] if args else None
    module = next((_import_group(m) for m, names in GROUPS.items() if name in names), None)
    if module is None:
        return None
    view = typer.Typer(**_APP)
    module.register(view)
    view.registered_commands = [c for c in view.registered_commands
                                if (c.name or typer.main.get_command_name(c.callback.__name__)) == name]
    view.registered_groups = [g for g in view.registered_groups if g.name == name]
    return view if view.registered_commands or view.registered_groups else None


def _run(args: list[str]):
    """What ``app(standalone_mode=False)`` does, building only the command that runs."""
    view = _only(args)
    if view is None:
        _register_extensions()
        return app(standalone_mode=False)
    if sys.excepthook != typer.main.except_hook:   # as Typer.__call__ does
        sys.excepthook = typer.main.except_hook
    # A group even with one command in it (typer would make a lone command the whole program).
    return typer.main.get_group(view)(args, standalone_mode=False)


def fail(message: str, code: int) -> None:
    """The one way an error leaves the CLI: secrets masked, one line (a message that lists several
    problems on lines of their own, or an SDK text with a line break, is joined with '; ')."""
    line = "; ".join(part.strip() for part in redact(message).splitlines() if part.strip())
    err.print(f"mcbridge: error: {line}", markup=False, soft_wrap=True)
    sys.exit(code)


def log_to_stderr() -> None:
    """What bridge's and the SDKs' loggers say at WARNING and above reaches stderr as Python's
    last-resort handler would print it (only what no logger of its own handles or silences, as
    google.auth does with a NullHandler), but masked and escaped like every console line."""
    import logging

    def unhandled(record: logging.LogRecord) -> bool:
        logger = logging.getLogger(record.name)
        while logger is not logging.root:
            if logger.handlers:
                return False
            logger = logger.parent
        return True

    from bridge.logs import quiet_libraries
    quiet_libraries()
    handler = logging.StreamHandler()
    handler.setLevel(logging.WARNING)
    handler.setFormatter(PrintableFormatter())
    handler.addFilter(unhandled)
    handler.addFilter(RedactingFilter())
    logging.getLogger().addHandler(handler)


def _bad_sdk_setting(exc: Exception) -> str | None:
    """A setting an SDK refused while reading its own configuration (not a bug of ours): the
    line naming it. Looked up only when an SDK is loaded, which it is when it raised."""
    botocore = sys.modules.get("botocore.exceptions")
    if botocore is not None and isinstance(exc, botocore.ProfileNotFound):
        return f"AWS profile {exc.kwargs.get('profile')!r} (AWS_PROFILE or s3.profile) is not in the AWS config files"
    if botocore is not None and isinstance(exc, botocore.ConfigParseError):
        return f"AWS config file {exc.kwargs.get('path')} (AWS_CONFIG_FILE) cannot be parsed"
    return None


def main() -> None:
    log_to_stderr()
    try:
        code = _run(sys.argv[1:])  # returns the code of a typer.Exit
    except BridgeError as exc:
        fail(str(exc), exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        err.print("mcbridge: aborted", markup=False)
        sys.exit(130)
    except KeyboardInterrupt:
        err.print("mcbridge: interrupted; run the same command again to resume", markup=False)
        sys.exit(130)
    except Exception as exc:
        # Usage errors of typer's (vendored) click arrive here in non-standalone mode.
        if hasattr(exc, "format_message") and isinstance(getattr(exc, "exit_code", None), int):
            fail(exc.format_message(), exc.exit_code)
        named = _bad_sdk_setting(exc)
        if named:
            fail(named, 2)
        # A bug of ours: still one line, and an SDK's text in it may quote a signed URL.
        fail(f"internal error: {type(exc).__name__}: {exc}", 1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
