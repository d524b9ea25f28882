"""What `pip install .` gives a user: one import package, `bridge`, with the service and the
policies inside it (`bridge.workers`, `bridge.policies`, their data files), the `mcbridge`
command, and the service's commands found through the package's entry point.

The wheel is built from this checkout (no build isolation: nothing is fetched) and installed
with --no-deps into a new virtual environment, which borrows the test environment's third-party
packages through a plain path entry (no .pth of theirs runs, so this checkout's editable install
is not seen)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("pkg")
    source = work / "source"   # a copy: setuptools builds in the source tree (build/, *.egg-info)
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for name in ("bridge", "workers", "policies"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(work / "dist"), str(source)], check=True, capture_output=True, cwd=work)
    wheel = next((work / "dist").glob("*.whl"))
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "zz_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def run(venv: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / args[0]), *args[1:]], capture_output=True, text=True,
                          cwd=venv.parent, timeout=120)


def test_wheel_holds_one_import_package(installed):
    wheel = next((installed.parent / "dist").glob("*.whl"))
    assert wheel.name.startswith("cloud_artifact_bridge-")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"bridge"}
    assert "bridge/workers/app.py" in names and "bridge/policies/cost/model.py" in names
    assert any(n.startswith("bridge/policies/cost/prices/") and n.endswith(".yaml") for n in names)


def test_wheel_holds_every_module_of_the_tree(installed):
    """A package missing from pyproject's list is left out of the wheel without a word, and the
    installed command fails only when it first imports it."""
    names = set(zipfile.ZipFile(next((installed.parent / "dist").glob("*.whl"))).namelist())
    tree = {f"bridge/{p.relative_to(ROOT / folder).as_posix()}" if folder == "bridge"
            else f"bridge/{folder}/{p.relative_to(ROOT / folder).as_posix()}"
            for folder in ("bridge", "workers", "policies") for p in (ROOT / folder).rglob("*.py")
            if "__pycache__" not in p.parts}
    assert sorted(tree - names) == []


def test_top_level_workers_is_not_importable(installed):
    r = run(installed, "python", "-c", "import workers")
    assert r.returncode == 1 and "No module named 'workers'" in r.stderr
    r = run(installed, "python", "-c", "import policies")
    assert r.returncode == 1 and "No module named 'policies'" in r.stderr


def test_service_and_policies_import_from_the_package(installed):
    r = run(installed, "python", "-c",
            "import bridge, bridge.workers.app, bridge.workers.tasks, bridge.policies.cost.prices as p;"
            "print(bridge.__file__); print(sorted(p.builtin()))")
    assert r.returncode == 0, r.stderr
    where, tables = r.stdout.splitlines()
    assert str(installed) in where
    assert "aws" in tables and "gcp" in tables


def test_command_finds_the_service_commands(installed):
    r = run(installed, "mcbridge", "jobs", "--help")
    assert r.returncode == 0, r.stderr
    assert "list" in r.stdout and "cancel" in r.stdout
    r = run(installed, "mcbridge", "policy", "status", "--help")
    assert r.returncode == 0 and "--broker" in r.stdout


@pytest.mark.parametrize("missing", ["redis", "celery"])
def test_service_command_without_the_service_extra_names_it(missing, tmp_path):
    """Without Celery or redis, a service command says which extra to install, in one line."""
    code = (f"import sys; sys.modules[{missing!r}] = None; from bridge.cli import main; "
            "sys.argv = ['mcbridge', 'jobs', 'list', '--broker', 'redis://127.0.0.1:1/0']; main()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "MCBRIDGE_STATE_DIR": str(tmp_path)})
    assert r.returncode == 1
    assert r.stderr.strip() == ("mcbridge: error: the service needs the 'service' extra: "
                                f"pip install -e '{ROOT}[service]' ({missing} is missing)")


def test_a_wheels_missing_extra_hint_names_the_wheel(installed):
    """Installed from a built wheel, the hint adds the extra to that wheel: the distribution is on
    no package index, so its bare name would install nothing (or whoever took the name)."""
    r = run(installed, "python", "-c", "import sys; sys.modules['celery'] = None; from bridge.cli import main; "
            "sys.argv = ['mcbridge', 'jobs', 'list', '--broker', 'redis://127.0.0.1:1/0']; main()")
    wheel = next((installed.parent / "dist").glob("*.whl"))
    assert r.returncode == 1
    assert r.stderr.strip() == ("mcbridge: error: the service needs the 'service' extra: "
                                f"pip install '{wheel}[service]' (celery is missing)")
