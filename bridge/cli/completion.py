"""Shell completion: ``mcbridge completion bash|zsh|fish`` prints the script, and the script calls
``mcbridge`` back with ``_MCBRIDGE_COMPLETE`` set (``answer`` replies). typer's own machinery does
both (typer.completion); the CLI keeps typer's --install-completion off, so that what is added to
a shell's start-up files is the user's choice, and ``mcbridge --help`` stays short."""

from __future__ import annotations

import os

from bridge.errors import InvalidOption

PROG = "mcbridge"
VARIABLE = "_MCBRIDGE_COMPLETE"
SHELLS = ("bash", "zsh", "fish")


def script(shell: str) -> str:
    if shell not in SHELLS:
        raise InvalidOption(f"no completion for shell {shell!r}: use one of {', '.join(SHELLS)}")
    from typer.completion import get_completion_script
    return get_completion_script(prog_name=PROG, complete_var=VARIABLE, shell=shell)


def asked() -> bool:
    """Whether this run is a shell asking for completions (not a command)."""
    return VARIABLE in os.environ


def answer(app) -> None:
    """Reply to the shell: the whole app's names and options (exits)."""
    import typer
    from typer.completion import completion_init
    completion_init()
    typer.main.get_group(app).main(args=[], prog_name=PROG, complete_var=VARIABLE)
