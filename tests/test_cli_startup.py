"""What a run of one command leaves out at start-up, and that leaving it out changes nothing a
user sees: the plain-line console prints what rich prints, and the app built for one command
parses as the whole app does."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
import typer
from rich.console import Console as RichConsole

from bridge import cli
from bridge.cli.console import Console, printable
from tests.helpers import mcbridge


def _modules_after(code: str, *args: str) -> set[str]:
    """The modules loaded once ``code`` ran in a fresh interpreter (``sys.argv[1:]`` = args)."""
    probe = (f"import sys\nsys.argv[1:] = {list(args)!r}\n{code}\n"
             "sys.stderr.write('\\nMODULES ' + ' '.join(sorted(sys.modules)))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "XDG_CONFIG_HOME": "/nonexistent/mcbridge-test-config"})
    assert r.returncode == 0, r.stderr
    return set(r.stderr.rsplit("\nMODULES ", 1)[1].split())


def test_importing_the_cli_loads_no_rich_yaml_pydantic_or_other_groups():
    loaded = _modules_after("import bridge.cli")
    for heavy in ("rich", "yaml", "pydantic", "bridge.cli.transfer", "bridge.cache", "workers", "fsspec"):
        assert heavy not in loaded, heavy


def test_a_quiet_copy_loads_no_rich_and_no_other_group(tmp_path):
    src = tmp_path / "f.txt"
    src.write_text("x")
    code = ("import bridge.cli\ntry:\n    bridge.cli.main()\nexcept SystemExit as e:\n    assert e.code == 0, e.code")
    loaded = _modules_after(code, "cp", str(src), f"{tmp_path}/out/", "-q")
    assert (tmp_path / "out" / "f.txt").read_text() == "x"
    # typer 0.29 and later convert every parameter through pydantic (pyproject keeps it below 0.29)
    for heavy in ("rich", "yaml", "pydantic", "pydantic_core", "bridge.cli.packing", "bridge.cli.policy", "bridge.cache",
                  "bridge.cli.cache", "bridge.workers", "bridge.workers.commands", "fsspec"):
        assert heavy not in loaded, heavy


def test_each_group_registers_the_names_listed_for_it():
    for module_name, names in cli.GROUPS.items():
        module = cli._import_group(module_name)
        if module is None:
            continue   # not installed here
        app = typer.Typer()
        module.register(app)
        assert tuple(cli.registered_names(app)) == names, module_name


def _plugin_names() -> list[str]:
    app = typer.Typer()
    cli.add_plugin_commands(app)
    return cli.registered_names(app)


@pytest.mark.parametrize("args", [["cp", "a"], ["cp", "--help"], ["policy", "check", "--help"], ["cache"],
                                  ["version", "extra"], ["ls", "--bogus", "x"], ["jobs", "--help"],
                                  ["worker", "--bogus"], ["policy", "status", "--help"]])
def test_the_app_for_one_command_parses_as_the_whole_app(args, capsys):
    """Same output, same exit, whichever app parses a command's arguments."""
    def run(app_or_group):
        try:
            result = app_or_group(args, standalone_mode=False)
        except typer.Exit as exc:
            result = ("exit", exc.exit_code)
        except Exception as exc:
            result = (type(exc).__name__, exc.format_message() if hasattr(exc, "format_message") else str(exc))
        return result, capsys.readouterr()

    view = cli._only(args)
    assert view is not None
    cli._register_extensions()
    assert run(typer.main.get_group(view)) == run(cli.app)


def test_no_name_is_in_two_groups():
    names = [name for group in cli.GROUPS.values() for name in group] + _plugin_names()
    assert len(names) == len(set(names))
    assert "worker" in names   # the service's, added by its plugin (bridge.workers is installed here)


def test_a_name_no_group_has_gets_the_whole_app():
    assert cli._only(["cpp"]) is None and cli._only(["--help"]) is None and cli._only([]) is None


LINES = ["copied 1 files, 6 B in 0.1s (70 B/s); manifest /tmp/x/_bridge/manifest.json", "", "a\nb", "  padded  ",
         "mcbridge: error: invalid size 'x': use a number", "x" * 300, "s3://b/k:v", ":thumbs_up: done",
         "a:smile:b", "[bold]not bold[/bold]", "[x]", r"\[escaped]", "tab\there", "bell\a", "cr\rlf",
         "esc \x1b[31mred", "non-ASCII ✓ 名前", "trailing\n", "a :b: c", "1:2:3"]


@pytest.mark.parametrize("markup", [None, False])
@pytest.mark.parametrize("soft_wrap", [None, True])
@pytest.mark.parametrize("options", [dict(highlight=False, soft_wrap=True), dict(highlight=False)])
def test_the_console_prints_what_rich_prints(options, soft_wrap, markup, monkeypatch):
    """What rich prints of the line with its control characters escaped (bell, CR, ESC: the
    console escapes them, where rich would drop some and pass ESC to the terminal)."""
    for line in LINES:
        for stream_name in ("stdout", "stderr"):
            ours, theirs = io.StringIO(), io.StringIO()
            monkeypatch.setattr(sys, stream_name, ours)
            Console(stderr=stream_name == "stderr", **options).print(line, markup=markup, soft_wrap=soft_wrap)
            monkeypatch.setattr(sys, stream_name, theirs)
            RichConsole(stderr=stream_name == "stderr", **options).print(printable(line), markup=markup,
                                                                         soft_wrap=soft_wrap)
            assert ours.getvalue() == theirs.getvalue(), (line, stream_name)


def test_the_console_goes_through_rich_once_rich_exists(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    console = Console(highlight=False, soft_wrap=True)
    assert console._rich is None
    console.print("plain")
    assert console._rich is None
    console.print("with [bold]markup[/bold]")
    assert console._rich is not None
    console.print("plain again")
    assert out.getvalue().startswith("plain\n") and out.getvalue().endswith("plain again\n")


def test_json_to_a_stream_that_is_no_terminal_is_rich_s_text_without_rich(monkeypatch):
    """``--json`` read by a script: the same text rich would print there, rich never made."""
    from rich.highlighter import JSONHighlighter

    from bridge.cli.console import json_text
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)
    for data in ({"a": [1, {"b": "x\u0001y"}], "s": "é", "t": "[bold]x[/bold] :smile:", "long": "y" * 300,
                  "tab": "a\tb  c"}, [], {}):
        out = io.StringIO()
        monkeypatch.setattr(sys, "stdout", out)
        console = Console(soft_wrap=True)
        console.print_json(data=data)
        assert console._rich is None
        rich = RichConsole(file=io.StringIO(), soft_wrap=True)
        rendered = JSONHighlighter()(json_text(data))
        rendered.no_wrap, rendered.overflow = True, None
        rich.print(rendered, soft_wrap=True)
        assert out.getvalue() == rich.file.getvalue()


@pytest.mark.parametrize("env, tty", [({}, False), ({"FORCE_COLOR": "1"}, True), ({"TTY_COMPATIBLE": "1"}, True),
                                      ({"TTY_COMPATIBLE": "0"}, False), ({"FORCE_COLOR": ""}, False)])
def test_is_terminal_answers_as_rich_does(env, tty, monkeypatch):
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert Console(stderr=True).is_terminal is tty
    assert RichConsole(stderr=True).is_terminal is tty


def test_a_quiet_copy_prints_nothing_and_a_copy_its_summary_line(tmp_path):
    src = tmp_path / "f.txt"
    src.write_text("x")
    r = mcbridge("cp", str(src), f"{tmp_path}/out/", "-q", env=dict(os.environ), state_dir=tmp_path / "state")
    assert r.returncode == 0, r.stderr
    assert (r.stdout, r.stderr) == ("", "")
    r = mcbridge("cp", str(src), f"{tmp_path}/again/", env=dict(os.environ), state_dir=tmp_path / "state")
    assert r.stdout.startswith("copied 1 file, 1 B in ") and "/again/_bridge/log/c-" in r.stdout
    assert r.stderr == ""


def test_the_console_serves_as_a_rich_progress_console(monkeypatch):
    """mcbridge jobs watch hands the console itself to a rich progress bar."""
    from rich.progress import BarColumn, Progress
    monkeypatch.setenv("FORCE_COLOR", "1")   # a terminal, so the live display runs
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    console = Console(stderr=True, highlight=False)
    with Progress(BarColumn(), console=console) as bar:
        task = bar.add_task("copying", total=2)
        bar.update(task, completed=1)
        console.print("a line above the bar", markup=False)
        bar.update(task, completed=2)
    assert "a line above the bar" in stream.getvalue() and "━" in stream.getvalue()   # the bar was drawn
