"""The CLI's two consoles, without importing rich for the lines most runs print.

``Console`` stands for a ``rich.console.Console`` made on first need. A plain line of printable
ASCII text, printed with soft wrap, renders in rich to exactly that text and a newline: such a
line is written straight to the stream. Anything else (markup brackets, a possible ``:emoji:``
code, other characters, wrapping, JSON, options) goes to the rich console, and once the rich
console exists (a progress bar, say) every print goes through it, so a live display stays intact.
A whole ``mcbridge cp ... -q`` thus never imports rich (~50 ms of start-up).

This is also where text leaves the process, so both consoles, whatever printed through them,
mask secrets (bridge.redact) in every line and every JSON document, and escape control
characters (C0 but line feed and tab, DEL, C1): an ANSI escape or a carriage return in an object
name cannot colour the terminal or rewrite a line. A name printed as a field of its own goes
through ``shown``, which escapes line feed and tab too. JSON stays exact JSON: the encoder
escapes C0 itself, and DEL and C1 are written as ``\\u`` escapes.
"""

from __future__ import annotations

import collections.abc
import json as jsonlib
import logging
import os
import re
import sys
from typing import Any

from bridge.redact import redact, redact_data

# What rich would change in a line printed with soft wrap: a markup tag opens with "[", an emoji
# code is ":name:" (rich's own pattern), and only printable ASCII is left as it is (rich strips
# some control codes, expands tabs, and may meet a stream that cannot encode the rest).
_EMOJI_CODE = re.compile(r":\S*?:")
_PLAIN = re.compile(r"[ -~\n]*")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROL_IN_NAME = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_IN_JSON = re.compile(r"[\x7f-\x9f]")   # what json.dumps leaves raw


def _escape(match: re.Match) -> str:
    return f"\\x{ord(match.group()):02x}"


def printable(text: str) -> str:
    """``text`` with its secrets masked and its control characters (but line feed and tab) as
    ``\\xNN``: what a line may show on a terminal."""
    return _CONTROL.sub(_escape, redact(text))


def shown(name: str) -> str:
    """An object or file name as one field of a line: every control character as ``\\xNN``."""
    return _CONTROL_IN_NAME.sub(_escape, name)


def json_text(data: Any, *, indent: int | None = 2, default: Any = None) -> str:
    """``data`` as JSON with its secrets masked and no raw control character."""
    safe_default = (lambda o: redact_data(default(o))) if default is not None else None
    text = jsonlib.dumps(redact_data(data), indent=indent, ensure_ascii=False, default=safe_default)
    return _CONTROL_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


class PrintableFormatter(logging.Formatter):
    """Log lines as the consoles print: secrets masked, control characters escaped."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))


def line_bar(console: Any, bar_share: int = 4):
    """A progress display of one line per task that fits the terminal's width: a bar of a
    ``bar_share``-th of the width (10 to 40 columns) and the task's ``status`` field, cut with an
    ellipsis at the right edge, never wrapped onto a second line (which a live display then
    repeats at each refresh). ``console`` is a rich console, whose width is the terminal's."""
    from rich.progress import BarColumn, Progress, ProgressColumn
    from rich.table import Column
    from rich.text import Text

    class Status(ProgressColumn):
        def render(self, task) -> Text:
            return Text(printable(task.fields.get("status", "")), no_wrap=True, overflow="ellipsis")

    width = max(10, min(40, console.width // bar_share))
    return Progress(BarColumn(bar_width=width, table_column=Column(width=width, no_wrap=True)),
                    Status(table_column=Column(no_wrap=True, overflow="ellipsis")), console=console)


class Console:
    def __init__(self, stderr: bool = False, **options: Any):
        self._stderr = stderr
        self._options = options
        self._rich = None

    @property
    def rich(self):
        """The rich console, made the first time it is needed."""
        if self._rich is None:
            from rich.console import Console as RichConsole
            self._rich = RichConsole(stderr=self._stderr, **self._options)
        return self._rich

    @property
    def is_terminal(self) -> bool:
        """rich's answer; without rich when the stream is no tty and no variable says otherwise."""
        if self._rich is None and not os.environ.get("FORCE_COLOR") and os.environ.get("TTY_COMPATIBLE") != "1":
            isatty = getattr(sys.stderr if self._stderr else sys.stdout, "isatty", None)
            try:
                if isatty is None or not isatty():
                    return False
            except ValueError:   # a closed stream
                return False
        return self.rich.is_terminal

    def _plain(self, text: Any, markup: bool | None, soft_wrap: bool | None) -> bool:
        if self._rich is not None or type(text) is not str or not _PLAIN.fullmatch(text):
            return False
        if not (self._options.get("soft_wrap", False) if soft_wrap is None else soft_wrap):
            return False   # rich wraps at the console's width
        if (self._options.get("markup", True) if markup is None else markup) and "[" in text:
            return False
        return self._options.get("emoji", True) is False or not _EMOJI_CODE.search(text)

    def print(self, *objects: Any, markup: bool | None = None, soft_wrap: bool | None = None, **kwargs: Any) -> None:
        objects = tuple(printable(o) if isinstance(o, str) else o for o in objects)
        if len(objects) == 1 and not kwargs and self._plain(objects[0], markup, soft_wrap):
            stream = sys.stderr if self._stderr else sys.stdout
            stream.write(objects[0] + "\n")
            stream.flush()
            return
        self.rich.print(*objects, markup=markup, soft_wrap=soft_wrap, **kwargs)

    def print_json(self, json: str | None = None, *, data: Any = None, indent: int | None = 2,
                   default: Any = None, **kwargs: Any) -> None:
        """rich's ``print_json``, of the data redacted and with no raw control character; to a
        stream that is no terminal, the text itself (what rich would print there, without
        importing it: a script reading ``--json`` pays for no highlighting it would not see)."""
        text = json_text(jsonlib.loads(json) if json is not None else data, indent=indent, default=default)
        if not self.is_terminal:
            stream = sys.stderr if self._stderr else sys.stdout
            stream.write(text + "\n")
            stream.flush()
            return
        from rich.highlighter import JSONHighlighter, NullHighlighter
        rendered = (JSONHighlighter() if kwargs.get("highlight", True) else NullHighlighter())(text)
        rendered.no_wrap, rendered.overflow = True, None
        self.rich.print(rendered, soft_wrap=True)

    def print_json_rows(self, head: dict, key: str, rows: Any, *, chunk: int = 1000) -> None:
        """``head`` with ``rows`` under ``key``, as one JSON document written as the rows come
        (one line each, a piece of ``chunk`` rows at a time, each piece redacted and escaped as
        ``json_text`` does): a list of millions is never held whole, as text or as data."""
        self.print_json_streams(head, {key: rows}, chunk=chunk)

    def print_json_streams(self, head: dict, streams: dict[str, Any], *, chunk: int = 1000) -> None:
        """``head`` and then each of ``streams``, written as it is read (as ``print_json_rows``):
        a Mapping as a JSON object of its ``items()``, anything else iterable as an array."""
        stream = sys.stderr if self._stderr else sys.stdout
        start = json_text(head, default=str)
        stream.write(start[:-2] + ",\n" if head else "{\n")
        encode = jsonlib.JSONEncoder(ensure_ascii=False).encode
        for n, (key, rows) in enumerate(streams.items()):
            mapping = isinstance(rows, collections.abc.Mapping)
            stream.write(f"  {jsonlib.dumps(key)}: " + ("{" if mapping else "["))
            piece: list[str] = []
            first = True

            def write() -> None:
                text = redact(",\n    ".join(piece))
                stream.write(("\n    " if first else ",\n    ") + _CONTROL_IN_JSON.sub(
                    lambda m: f"\\u{ord(m.group()):04x}", text))

            for row in (rows.items() if mapping else rows):
                piece.append(f"{encode(row[0])}: {encode(row[1])}" if mapping else encode(row))
                if len(piece) >= chunk:
                    write()
                    piece, first = [], False
            if piece:
                write()
                first = False
            close = "}" if mapping else "]"
            stream.write((close if first else f"\n  {close}") + (",\n" if n < len(streams) - 1 else "\n"))
        stream.write("}\n")
        stream.flush()

    # A rich Live (a progress bar given this console) enters the console around each refresh.
    def __enter__(self):
        return self.rich.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.rich.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        # print_json, width, _live_stack (rich's Live reads it when this is its console) ...:
        # whatever else a rich console offers. Not our own fields (an instance made without
        # __init__, by copy, has none yet) nor dunders.
        if name.startswith("__") or name in ("_rich", "_stderr", "_options"):
            raise AttributeError(name)
        return getattr(self.rich, name)
