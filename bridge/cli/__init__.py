"""mcbridge: the command line. Errors become one line on stderr and an exit code (2 for bad
input, 1 for failures at run time), never a traceback.

The CLI is a package of command groups: ``options`` holds what they share (flags, consoles,
settings from flags, progress bar), each group is a module with ``register(app)``, and
``GROUPS`` below lists them in the order ``--help`` shows them. A new group is one module and
one line in ``GROUPS``; its heavy imports (Celery, pyarrow) happen inside its commands, so
``mcbridge --help`` stays fast. ``bridge.cli:main`` is the console script.
"""

from __future__ import annotations

import importlib
import sys

import typer

from bridge.cli.options import (BwlimitFileOpt, BwlimitOpt, ChunkOpt, ConcOpt, ConfigOpt, DeleteOpt, DryOpt,  # noqa: F401
                                JsonOpt, MaxCostOpt, ProfileOpt, ProgressBar, QuietOpt, StoreSumOpt, emit, err,
                                out, print_plan, settings_from_flags)
from bridge.errors import BridgeError
from bridge.redact import redact

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Move ML corpora and checkpoints between local/Lustre, s3://, gs:// and az://.")

# Command groups, each a module exposing ``register(app)``. A group whose package is not
# installed here (workers without Celery) is left out.
GROUPS = ("bridge.cli.transfer", "bridge.cli.packing", "workers.commands", "bridge.cli.policy", "bridge.cache.commands")
_registered = False


def _register_extensions() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    for name in GROUPS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue  # that part of bridge is not installed here
            raise
        module.register(app)


def fail(message: str, code: int) -> None:
    """The one way an error leaves the CLI: secrets masked, one line (a message that lists several
    problems on lines of their own, or an SDK text with a line break, is joined with '; ')."""
    line = "; ".join(part.strip() for part in redact(message).splitlines() if part.strip())
    err.print(f"mcbridge: error: {line}", markup=False, soft_wrap=True)
    sys.exit(code)


def main() -> None:
    _register_extensions()
    try:
        code = app(standalone_mode=False)  # returns the code of a typer.Exit
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
        # A bug of ours: still one line, and an SDK's text in it may quote a signed URL.
        fail(f"internal error: {type(exc).__name__}: {exc}", 1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
