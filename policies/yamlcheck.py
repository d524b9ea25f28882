"""Where a field is in a YAML text, so that a refused file is named by file, line and field.

Shared by the schedules file (workers/schedules.py) and replication policies
(policies/replication.py): both parse with PyYAML's composer, validate with pydantic, and map
each error's location back to the node it came from.
"""

from __future__ import annotations

import yaml


def line_of(node: yaml.Node | None, path: tuple, keys: bool = False) -> int | None:
    """1-based line of the node at ``path``; of its key when ``keys``. When the path ends early
    (a missing field), the line of the last key found, i.e. of what lacks the field."""
    line = node.start_mark.line + 1 if node is not None else None
    key_line: int | None = None
    for step in path:
        if isinstance(node, yaml.MappingNode):
            for key, value in reversed(node.value):  # the last of duplicate keys wins, as in YAML
                if key.value == str(step):
                    node = value
                    line = (key if keys and step == path[-1] else value).start_mark.line + 1
                    key_line = key.start_mark.line + 1
                    break
            else:
                return key_line or line
        elif isinstance(node, yaml.SequenceNode) and isinstance(step, int) and step < len(node.value):
            node = node.value[step]
            line = node.start_mark.line + 1
        else:
            return line
    return line


MAX_BYTES = 4 * 1024 * 1024   # a policy or schedules file is a few KiB; /dev/zero must not fill memory


def read(path, what: str) -> str:
    """The UTF-8 text of a YAML file the user named, or ValueError naming the file (and the line
    of a byte that is not UTF-8): bridge.config.read_text_file's checks, in this module's form."""
    from pathlib import Path

    from bridge.config import UnreadableText, read_text_file
    path = Path(path)
    try:
        return read_text_file(path, what, MAX_BYTES)
    except UnreadableText as exc:
        where = f"{path}:{exc.line}" if exc.line else str(path)
        raise ValueError(f"{where}: cannot read the {what}: {exc.reason}") from None


def compose(text: str, filename: str) -> tuple[yaml.Node | None, object]:
    """The node tree and the plain document; ValueError naming the line of a YAML mistake."""
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader), yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        reason = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ValueError(f"{filename}:{mark.line + 1 if mark else 1}: not valid YAML: {reason}") from None
    except RecursionError:   # PyYAML composes recursively: thousands of nested [ or {
        raise ValueError(f"{filename}:1: nested too deeply to read") from None
