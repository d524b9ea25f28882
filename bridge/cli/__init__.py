"""mcbridge: the command line. Errors become one line on stderr and an exit code (2 for bad
input, 1 for failures at run time), never a traceback.

The CLI is a package of command groups: ``options`` holds what they share (flags, consoles,
settings from flags, progress bar), each group is a module with ``register(app)``, and
``GROUPS`` below lists them in the order ``--help`` shows them, each with the names it registers.
A new group is one module and one line in ``GROUPS``; its heavy imports (pyarrow) happen
inside its commands, so ``mcbridge --help`` stays fast. Another package adds commands as a plugin
(bridge.registry): the service's (``mcbridge worker``, ``submit``, ``jobs``...) fill the hooks of
its "mcbridge.service" entry point, and this package names none of them; --help lists them after
bridge's own. ``bridge.cli:main`` is the console script.

A run of one command imports only the group that has it and builds only that command: typer
reads every command's signature to build it (~1.5 ms each, ~40 commands), and a copy of a few
small files should not pay for the rest; the plugins are asked only for a name bridge's own
groups do not have. ``--help`` and a name nothing has get the whole app.
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

    from bridge.cli.options import (RUN, BwlimitFileOpt, BwlimitOpt, ChunkOpt, ConcOpt, ConfigOpt,  # noqa: F401
                                    DeleteOpt, DryOpt, JsonOpt, MaxCostOpt, ProfileOpt, ProgressBar, QuietOpt,
                                    StoreSumOpt, emit, err, given, out, print_plan, settings_from_flags)
    from bridge.errors import BridgeError, InvalidOption, JobCancelled, JobTerminated, UsageError
    from bridge.cli.console import PrintableFormatter
    from bridge.redact import RedactingFilter, redact
    gc.freeze()
finally:
    if _collecting:
        gc.enable()

# Plain help (no rich markup mode): click wraps each paragraph to the terminal's width, and
# --help needs no rich.
_APP = dict(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
            help="Move ML corpora and checkpoints between local/Lustre, s3://, gs:// and az://.\n\n"
                 "Global options, before or after the command: -v (-vv) says more (every retry and "
                 "why, and a line per object copied, skipped or deleted at -v; unchanged ones too at -vv); "
                 "--log-file FILE keeps a log with times; --log-format json writes it one JSON object a line; "
                 "--log-level LEVEL (debug, info, warning, error); --stats 30s prints a progress line that often when stderr is not "
                 "a terminal; --manifest-dir DIR keeps the records of local destinations under DIR "
                 "instead of a _bridge/ folder inside the data; --version. Shell completion: mcbridge completion bash|zsh|fish.")
app = typer.Typer(**_APP)

# bridge's own command groups, each a module exposing ``register(app)``, and the names of the
# commands and sub-groups it registers (tests/test_cli_startup.py checks them). A group whose
# package is not installed here is left out. Plugins add theirs through the "commands" hook
# (bridge.registry): the service's (worker, submit, jobs...) are bridge.workers', which bridge/
# never imports and this module never names.
GROUPS: dict[str, tuple[str, ...]] = {
    "bridge.cli.transfer": ("cp", "sync", "verify", "uploads", "version", "completion"),
    "bridge.cli.verbs": ("ls", "du", "cat", "rm", "mv", "hashsum", "mb"),
    "bridge.cli.check": ("check",),
    "bridge.cli.packing": ("pack", "unpack", "migrate"),
    "bridge.cli.policy": ("plan", "replicate", "policy"),
    "bridge.cli.cache": ("cache",),
}
_registered = False


def _import_group(name: str):
    """The group's module; None when that part of bridge is not installed here."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            return None
        raise


def add_plugin_commands(cli: typer.Typer) -> None:
    """The commands and groups of every installed plugin, added to ``cli``."""
    from bridge.registry import plugins
    for add in plugins().each("commands"):
        add(cli)


def _register_extensions() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    for name in GROUPS:
        module = _import_group(name)
        if module is not None:
            module.register(app)
    add_plugin_commands(app)


def registered_names(cli: typer.Typer) -> list[str]:
    """The names of the commands and sub-groups registered on ``cli``, as typer names them."""
    return ([c.name or typer.main.get_command_name(c.callback.__name__) for c in cli.registered_commands]
            + [g.name for g in cli.registered_groups])


def _only(args: list[str]) -> typer.Typer | None:
    """An app like ``app`` holding just the command (or sub-group) that ``args`` start with, or
    None when they start with no name a group or a plugin registers."""
    name = args[0] if args else None
    if name is None or name.startswith("-"):
        return None
    module = next((_import_group(m) for m, names in GROUPS.items() if name in names), None)
    view = typer.Typer(**_APP)
    if module is not None:
        module.register(view)
    else:   # none of bridge's own: a plugin's, or no command at all
        add_plugin_commands(view)
    view.registered_commands = [c for c in view.registered_commands
                                if (c.name or typer.main.get_command_name(c.callback.__name__)) == name]
    view.registered_groups = [g for g in view.registered_groups if g.name == name]
    return view if view.registered_commands or view.registered_groups else None


def _run(args: list[str]):
    """What ``app(standalone_mode=False)`` does, building only the command that runs."""
    view = _only(args)
    if view is None:
        _register_extensions()
        return plain_arguments(typer.main.get_group(app))(args, standalone_mode=False, prog_name=PROG)
    if sys.excepthook != typer.main.except_hook:   # as Typer.__call__ does
        sys.excepthook = typer.main.except_hook
    # A group even with one command in it (typer would make a lone command the whole program).
    return plain_arguments(typer.main.get_group(view))(args, standalone_mode=False, prog_name=PROG)


PROG = "mcbridge"


def plain_arguments(command):
    """``command`` with its arguments shown as SRC, URL ... in usage lines and help, as most
    tools show them (typer writes a required argument as {src}), and each option's value by a
    name (--queues QUEUES, -j N) where typer would write its type (<str>, <int range>)."""
    stack = [command]
    while stack:
        cmd = stack.pop()
        stack.extend(getattr(cmd, "commands", {}).values())
        for param in cmd.params:
            if isinstance(param, typer.core.TyperOption) and param.metavar is None and not param.is_flag \
                    and not hasattr(param.type, "choices"):
                kind = getattr(param.type, "name", "")
                longest = max(param.opts, key=len).lstrip("-")
                param.metavar = {"integer": "N", "integer range": "N", "float": "NUMBER",
                                 "float range": "NUMBER"}.get(kind, longest.upper().replace("-", "_"))
            if isinstance(param, typer.core.TyperArgument) and param.metavar is None:
                param.metavar = (param.name or "").upper() + ("..." if param.nargs != 1 else "")
            if isinstance(param, typer.core.TyperArgument) and not isinstance(param, _PlainArgument):
                param.__class__ = _PlainArgument
    return command


class _PlainArgument(typer.core.TyperArgument):
    def make_metavar(self, ctx, *, usage: bool = False) -> str:
        name = self.metavar or (self.name or "").upper()
        return name if self.required or name.startswith("[") else f"[{name}]"


# -- global options: read before the command, wherever they are on the line ------------------------
VERBOSITY = {"-v": 1, "-vv": 2, "-vvv": 3, "--verbose": 1}
LEVELS = ("debug", "info", "warning", "error")


def global_options(args: list[str]) -> tuple[list[str], dict]:
    """The arguments without the global options, and those options: -v/-vv/--verbose (counted),
    --log-file, --log-level, --stats, --manifest-dir, --version. A '--' ends them, as it ends
    options."""
    rest: list[str] = []
    found: dict = {"verbose": 0, "log_file": None, "log_level": None, "stats": None, "version": False,
                   "manifest_dir": None, "log_format": None}
    values = {"--log-file": "log_file", "--log-level": "log_level", "--stats": "stats",
              "--manifest-dir": "manifest_dir", "--log-format": "log_format"}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest.extend(args[i:])
            break
        name, eq, value = arg.partition("=")
        if arg in VERBOSITY:
            found["verbose"] += VERBOSITY[arg]
        elif arg == "--version":
            found["version"] = True
        elif name in values:
            if not eq:
                if i + 1 >= len(args):
                    from bridge.errors import InvalidOption
                    raise InvalidOption(f"{name} needs a value")
                i += 1
                value = args[i]
            found[values[name]] = value
        else:
            rest.append(arg)
        i += 1
    return rest, found


def setup_logging(found: dict) -> None:
    """Where log lines go, at which level: bridge's loggers at WARNING, INFO with -v, DEBUG with
    -vv (or --log-level); the SDKs' (botocore, azure-core, urllib3, google) at WARNING unless -vv.
    --log-file gets the same lines with times, at INFO at least."""
    import logging
    from bridge.errors import InvalidOption
    level_name = found["log_level"]
    if level_name is not None and level_name.lower() not in LEVELS:
        raise InvalidOption(f"--log-level {level_name!r}: use one of {', '.join(LEVELS)}")
    from bridge.logs import LOG_FORMATS, JsonFormatter
    log_format = found.get("log_format")
    if log_format is not None and log_format not in LOG_FORMATS:
        raise InvalidOption(f"--log-format {log_format!r}: use one of {', '.join(LOG_FORMATS)}")
    if log_format == "json":
        for handler in logging.getLogger().handlers:
            if getattr(handler, "bridge_console", False):
                handler.setFormatter(JsonFormatter())
    verbose = found["verbose"]
    level = getattr(logging, level_name.upper()) if level_name else \
        (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)]
    sdk_level = logging.DEBUG if verbose >= 3 else logging.INFO if verbose == 2 else logging.WARNING
    for sdk in ("botocore", "boto3", "s3fs", "aiobotocore", "azure", "urllib3", "google", "gcsfs", "fsspec"):
        logging.getLogger(sdk).setLevel(sdk_level)
    if not (verbose or level_name or found["log_file"]):
        return   # bridge's loggers follow the root's level (Celery's --loglevel in worker and beat)
    logging.getLogger("bridge").setLevel(level)
    shown_level = min(level, sdk_level) if verbose >= 2 else level
    for handler in logging.getLogger().handlers:
        if getattr(handler, "bridge_console", False):
            handler.setLevel(shown_level)
    logging.getLogger().setLevel(min(level, sdk_level, logging.INFO if found["log_file"] else logging.WARNING))
    if found["log_file"]:
        from pathlib import Path
        path = Path(found["log_file"])
        if path.is_dir() or not path.parent.is_dir():
            raise InvalidOption(f"--log-file {path}: {'is a directory' if path.is_dir() else 'its folder does not exist'}")
        try:
            handler = logging.FileHandler(path, encoding="utf-8")
        except OSError as exc:
            raise InvalidOption(f"--log-file {path} cannot be written: {exc.strerror or exc}") from None
        handler.setLevel(min(level, logging.INFO))
        handler.setFormatter(JsonFormatter() if log_format == "json" else
                             PrintableFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler.addFilter(RedactingFilter())
        logging.getLogger().addHandler(handler)
        logging.getLogger("bridge").setLevel(min(level, logging.INFO))


def stats_seconds(text: str | None) -> float | None:
    if text is None:
        return None
    from bridge.errors import InvalidOption
    from bridge.filters import parse_age
    try:
        seconds = parse_age(text, "--stats")
    except InvalidOption:
        seconds = -1
    if not 0 < seconds < 10 ** 7:
        raise InvalidOption(f"--stats {text!r}: give an interval such as 30s, 5m or 1h")
    return seconds


class Terminated(BaseException):
    """SIGTERM: the job stops as on Ctrl-C (what catches BaseException cleans up), and says how
    to resume. Not a KeyboardInterrupt: typer turns those into exit 130, and SIGTERM exits 143."""


def stopped_by(signal: BaseException) -> type[JobCancelled]:
    """The error class (and so the exit code) of a run stopped by a signal: SIGTERM's, Ctrl-C's."""
    return JobTerminated if isinstance(signal, Terminated) else JobCancelled


INTERRUPTED = "mcbridge: interrupted: run the same command to resume"


def catch_signals() -> None:
    """Ctrl-C and SIGTERM say at once that the run stops and how to resume (cleaning up may
    take a moment more); the second Ctrl-C stops without waiting."""
    import signal
    told = {"n": 0}

    def stop(signum, _frame) -> None:
        told["n"] += 1
        if told["n"] == 1:
            err.print(INTERRUPTED, markup=False)
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)


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
    handler.bridge_console = True   # setup_logging sets its level
    handler.setLevel(logging.WARNING)
    handler.setFormatter(PrintableFormatter())
    handler.addFilter(unhandled)
    handler.addFilter(RedactingFilter())
    logging.getLogger().addHandler(handler)


def _click_usage(exc: Exception) -> bool:
    """A click usage error (a missing argument, an unknown option): click's own class, or the one
    of the click typer carries inside it."""
    return any(kind.__name__ == "UsageError" and kind.__module__.endswith("exceptions") for kind in type(exc).__mro__)


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
        from bridge.cli import completion
        if completion.asked():
            _register_extensions()
            completion.answer(app)
            return
        args, found = global_options(sys.argv[1:])
        if found["version"]:
            from bridge import __version__
            out.print(f"mcbridge {__version__}", markup=False)
            return
        setup_logging(found)
        RUN["stats"] = stats_seconds(found["stats"])
        RUN["manifest_dir"] = given("--manifest-dir", found["manifest_dir"])
        catch_signals()
        code = _run(args)  # returns the code of a typer.Exit
    except BridgeError as exc:
        fail(str(exc), exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort as exc:
        # click turns Ctrl-C (and SIGTERM, raised as one by catch_signals) into Abort; the
        # signal's line was printed when it came
        if isinstance(exc.__cause__, KeyboardInterrupt):
            sys.exit(stopped_by(exc.__cause__).exit_code)
        err.print("mcbridge: aborted", markup=False)
        sys.exit(JobCancelled.exit_code)
    except (Terminated, KeyboardInterrupt) as exc:
        sys.exit(stopped_by(exc).exit_code)
    except Exception as exc:
        # Usage errors of typer's (vendored) click arrive here in non-standalone mode.
        if hasattr(exc, "format_message") and isinstance(getattr(exc, "exit_code", None), int):
            fail(exc.format_message(), (UsageError if _click_usage(exc) else BridgeError).exit_code)
        named = _bad_sdk_setting(exc)
        if named:
            fail(named, InvalidOption.exit_code)
        # A bug of ours: still one line, and an SDK's text in it may quote a signed URL.
        fail(f"internal error: {type(exc).__name__}: {exc}", BridgeError.exit_code)
    finally:
        # The command is done and has said so; what it made is freed with the process. Python's
        # collections at exit would walk all of it first (a service command's Celery, redis and
        # pydantic, which nothing froze before); frozen, they skip it. The exit handlers (logs
        # flushed, temporary files removed) run as before.
        gc.freeze()
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
