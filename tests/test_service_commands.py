"""The service's commands come in as a plugin: bridge's CLI loads every entry point of the
"mcbridge.service" group and lets each fill the hooks bridge defines (bridge.registry); it names
no command and no function of the service. A plugin bridge has never heard of gets its commands
in the same way, and without a plugin bridge's own commands still work."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import mcbridge

ROOT = Path(__file__).resolve().parent.parent
UNREACHABLE = "redis://127.0.0.1:1/0"   # nothing listens on port 1: the service's commands stop at the broker


def _service_names() -> set[str]:
    """The functions and classes the service's command modules offer (policy_status, submit_warm,
    jobs_list...): public, with a name of more than one word, which no other library's are
    (``connect`` or ``worker`` alone are also sqlite3's or a variable's)."""
    return {node.name for path in (ROOT / "workers" / "commands").glob("*.py")
            for node in ast.parse(path.read_text()).body
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and "_" in node.name.strip("_")
            and not node.name.startswith("_")}


def _used_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return ({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
            | {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
            | {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names})


def test_bridge_names_no_function_of_the_service():
    service = _service_names()
    assert {"policy_status", "submit_warm", "submit_cp", "jobs_list", "service_settings"} <= service
    for path in sorted((ROOT / "bridge").rglob("*.py")):
        named = _used_names(path) & service
        assert not named, f"{path.relative_to(ROOT)} names the service's {sorted(named)}"


def _plugin(tmp_path: Path) -> dict[str, str]:
    """A package installed only as metadata on PYTHONPATH: its module, and a dist-info whose
    entry point puts it in bridge's plugin group. The environment that finds it."""
    (tmp_path / "hello_plugin.py").write_text('''
def hello(name: str) -> None:
    """Say hello."""
    print(f"hello {name}")


def plugged() -> None:
    """A command added to bridge's policy group."""
    print("policy plugged in")


def register(hooks) -> None:
    hooks.add("commands", lambda app: app.command("hello")(hello))
    hooks.add("policy commands", lambda group: group.command("plugged")(plugged))
''')
    info = tmp_path / "hello_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hello-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[mcbridge.service]\nhello = hello_plugin\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}


def test_a_plugin_of_the_group_adds_its_commands_and_extends_bridge_s_group(tmp_path):
    (tmp_path / "site").mkdir()
    env = _plugin(tmp_path / "site")
    state = tmp_path / "state"
    r = mcbridge("hello", "world", env=env, state_dir=state)
    assert (r.returncode, r.stdout, r.stderr) == (0, "hello world\n", "")
    r = mcbridge("policy", "plugged", env=env, state_dir=state)
    assert (r.returncode, r.stdout) == (0, "policy plugged in\n"), r.stderr
    r = mcbridge("--help", env=env, state_dir=state)
    assert "hello" in r.stdout and "worker" in r.stdout   # both plugins, side by side
    r = mcbridge("policy", "--help", env=env, state_dir=state)
    assert "plugged" in r.stdout and "status" in r.stdout and "check" in r.stdout


def test_policy_status_and_cache_warm_node_are_the_service_s(tmp_path):
    """Through the service's hooks: both go as far as its broker (here unreachable), one line."""
    policy = tmp_path / "policies.yaml"
    policy.write_text("policies:\n  p:\n    source: s3://src-bucket/ckpt/\n    destinations: [gs://dst-bucket/ckpt/]\n")
    env = dict(os.environ)
    for args in (["policy", "status", str(policy), "--broker", UNREACHABLE],
                 ["cache", "warm", "s3://bucket/key", "--node", "n1", "--broker", UNREACHABLE]):
        r = mcbridge(*args, env=env, state_dir=tmp_path / "state")
        assert r.returncode == 1, (args, r.stderr)
        assert r.stderr.startswith("mcbridge: error: cannot reach the broker at redis://127.0.0.1:1/0")
        assert len(r.stderr.splitlines()) == 1 and r.stdout == ""


def _without_plugins(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """mcbridge in an installation where no package fills a hook (the service not installed)."""
    code = ("import sys, bridge.registry as registry; registry._plugins = registry.Hooks(); "
            f"from bridge.cli import main; sys.argv = ['mcbridge', *{list(args)!r}]; main()")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "MCBRIDGE_STATE_DIR": str(tmp_path / "state"),
                               "XDG_CONFIG_HOME": str(tmp_path / "config")})


def test_without_the_service_bridge_s_commands_work_and_its_own_are_absent(tmp_path):
    src = tmp_path / "f.txt"
    src.write_text("x")
    r = _without_plugins(tmp_path, "cp", str(src), f"{tmp_path}/out/", "-q")
    assert r.returncode == 0 and (tmp_path / "out" / "f.txt").read_text() == "x", r.stderr
    r = _without_plugins(tmp_path, "policy", "--help")
    assert r.returncode == 0 and "check" in r.stdout and "status" not in r.stdout
    r = _without_plugins(tmp_path, "cache", "warm", "s3://bucket/key", "--node", "n1")
    assert r.returncode == 1
    assert r.stderr == ("mcbridge: error: cache warm --node needs the service: "
                        f"pip install -e '{ROOT}[service]'\n")   # this clone's editable install
    r = _without_plugins(tmp_path, "worker")
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == "mcbridge: error: No such command 'worker'."


def test_worker_without_the_service_extra_names_it(tmp_path):
    """The service's package is there, Celery is not: its worker says which extra to install."""
    code = ("import sys; sys.modules['celery'] = None; from bridge.cli import main; "
            f"sys.argv = ['mcbridge', 'worker', '--broker', {UNREACHABLE!r}]; main()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "MCBRIDGE_STATE_DIR": str(tmp_path)})
    assert r.returncode == 1
    assert r.stderr == ("mcbridge: error: the service needs the 'service' extra: "
                        f"pip install -e '{ROOT}[service]' (celery is missing)\n")


def test_a_hook_bridge_does_not_define_is_refused():
    from bridge.registry import Hooks
    hooks = Hooks()
    try:
        hooks.add("policy comands", print)
    except ValueError as exc:
        assert "no hook 'policy comands'" in str(exc) and "'policy commands'" in str(exc)
    else:
        raise AssertionError("a misspelt hook was accepted")
