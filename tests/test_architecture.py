"""The import graph keeps one direction: no circles, and no module imports a layer above its own.

Read from the source with ``ast``, the repository's folders named as they install (``workers/``
is ``bridge.workers`` and ``policies/`` is ``bridge.policies``). Every way of importing counts:
at module level, inside a function, under ``if TYPE_CHECKING:`` (a type a module names is a
dependency on its definer, even if it is loaded only by the type checker),
``importlib.import_module("...")`` and ``__import__("...")``, and a string that names one of our
modules (``"bridge.routes.server"``, ``"bridge.stores.s3:S3Store"``): a registry that names a
module loads it later, so it depends on it. What is not seen: a name computed at run time (an
entry point, a variable built from parts); a plugin found that way is outside this graph.

The one circle allowed is a registry (named in ``REGISTRIES``, with why) naming a plugin of its
own package by string while the plugin imports it to register; layers still hold for that pair.

The layers, lowest first, are the README's "Architecture" section, with an order inside the
foundation. A module gets its layer from its exact name, or from a package prefix ending in "."
(``"bridge.stores."`` is every module inside ``bridge/stores/``, not the package itself); a new
module without either fails ``test_every_module_has_a_layer``. The self-tests at the end build
small trees in a temporary folder and check that each rule reports what it is meant to.

One rule is about names, not imports: no two modules share a file name (``shared_basenames``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"bridge": "bridge", "workers": "bridge.workers", "policies": "bridge.policies"}

# Lowest first. Names are exact module names; a name ending in "." covers the modules inside that
# package (the package itself is named on its own). The longest matching entry wins.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # The foundation, in the order its modules import each other.
    ("errors", ("bridge.errors", "bridge.version")),
    ("values", ("bridge.names", "bridge.urls", "bridge.policies.cost.money", "bridge.redact", "bridge.filters",
                "bridge.guards")),
    ("settings", ("bridge.config", "bridge.registry", "bridge.retry", "bridge.logs", "bridge.attributes")),
    ("accounting", ("bridge.progress", "bridge.bwlimit", "bridge.meter", "bridge.journal", "bridge.spill")),
    ("stores", ("bridge.stores", "bridge.stores.", "bridge.hashing", "bridge.verdicts", "bridge.manifest", "bridge.carry",
                "bridge.adopt", "bridge.packing", "bridge.packing.index", "bridge.packing.layout",
                "bridge.packing.rangefile", "bridge.packing.reading", "bridge.packing.writer", "bridge.packing.sink",
                "bridge.packing.tarfmt", "bridge.packing.parquetfmt")),
    # Above it, a transfer's stages (README "Architecture"), in the order they import each other:
    # what the routes and the pipeline share; the listing; the job model the units, the executor
    # and the commit share with the remote routes; the routes and the one route decision
    # (routes.decide: it reads only the roots, and a plan asks its route for its units, so the
    # routes sit below the plan); what a plan reads, writes and requests, counted (the pure
    # counting half of cost: the plan reports its usage through it, so it sits below the plan);
    # the plan; its price; the units; the commit the last unit
    # makes; the executor that runs units and ends in the commit; verify; then the commands
    # built on the pipeline.
    ("contracts", ("bridge.contracts",)),
    ("listing", ("bridge.listing", "bridge.pipeline.parts")),
    ("job model", ("bridge.jobs",)),
    ("choose", ("bridge.routes", "bridge.routes.")),
    ("usage", ("bridge.policies.cost.usage",)),
    ("plan", ("bridge.pipeline", "bridge.pipeline.plan", "bridge.pipeline.forkplan", "bridge.pipeline.syncplan")),
    ("price", ("bridge.pricing", "bridge.policies", "bridge.policies.")),
    ("units", ("bridge.pipeline.units",)),
    ("commit", ("bridge.pipeline.commit",)),
    ("executor", ("bridge.pipeline.forkrun", "bridge.pipeline.execute")),
    ("verify", ("bridge.pipeline.verify",)),
    # bridge.api: the commands as Python functions; the package re-exports them (``bridge.copy``).
    ("commands", ("bridge", "bridge.api", "bridge.pretrained", "bridge.ops", "bridge.treecheck", "bridge.objects", "bridge.packing.job", "bridge.packing.unpack",
                  "bridge.replicator", "bridge.evidence", "bridge.cache", "bridge.cache.")),
    ("training loop", ("bridge.torch", "bridge.torch.")),   # DCP and publish over the commands
    ("cli", ("bridge.cli", "bridge.cli.", "bridge.__main__")),
    ("workers", ("bridge.workers", "bridge.workers.")),
]
OUTSIDE_SERVICE = ("celery", "kombu", "redis", "bridge.workers")
# Registries: modules that name their plugins (modules of their own package) by string and load
# them on first use, while each plugin imports its registry to register with it. Those strings
# are "plugin" edges, left out of the circle rule (see without_plugin_loads); nowhere else.
REGISTRIES = {
    "bridge.stores": "one adapter per scheme, loaded when a URL of its scheme is first used",
    "bridge.routes": "the route modules register themselves; the seam loads them when a route is looked up",
    "bridge.cli": "each command group registers its commands with the CLI's group",
    "bridge.packing.writer": "the shard formats subclass the writer's base; it loads the one a pack asks for",
    "bridge.workers.app": "the task modules register their tasks with the Celery app it includes",
    "bridge.workers.settings": "Celery beat's scheduler class, named as Celery takes it",
}
IMPORTERS = {"import_module", "__import__"}


def modules(root: Path = ROOT, folders: dict[str, str] = FOLDERS) -> dict[str, Path]:
    found = {}
    for folder, package in folders.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def _under_type_checking(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def _absolute(target: str, level: int, package: str) -> str:
    if not level:
        return target
    anchor = package.split(".")[:len(package.split(".")) - (level - 1)]
    return ".".join(anchor + ([target] if target else []))


def _statement_targets(node: ast.Import | ast.ImportFrom, package: str, known: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = _absolute(node.module or "", node.level, package)
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]


def _call_target(node: ast.Call, package: str) -> str | None:
    """The module an ``importlib.import_module("...")`` or ``__import__("...")`` call names."""
    called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
    if called not in IMPORTERS or not node.args:
        return None
    first = node.args[0]
    if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
        return None
    name = first.value
    level = len(name) - len(name.lstrip("."))
    return _absolute(name[level:], level, package)


def _named_module(node: ast.Constant, known: dict[str, Path]) -> str | None:
    """The module a string such as ``"bridge.routes.server"`` or ``"bridge.stores.s3:S3Store"``
    names (a registry's entry); the bare package name is a logger's or a thread's name."""
    if not isinstance(node.value, str):
        return None
    name = node.value.partition(":")[0]
    return name if "." in name and name in known else None


def _resolve(target: str, known: dict[str, Path]) -> str:
    """Ours to the deepest known module; others by their top-level name."""
    while target not in known and "." in target and target.split(".")[0] == "bridge":
        target = target.rpartition(".")[0]
    return target if target in known else target.split(".")[0]


def imports(name: str, path: Path, known: dict[str, Path], registries=REGISTRIES) -> dict[str, str]:
    """Each module ``name`` imports, with how: "import", "TYPE_CHECKING", "importlib", "string",
    or "plugin" (a string in one of the ``registries`` naming a module of its own package). One
    way is kept per imported module: the first ``ast.walk`` meets."""
    tree = ast.parse(path.read_text(), str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            how = "TYPE_CHECKING" if _under_type_checking(node, parents) else "import"
            targets = _statement_targets(node, package, known)
        elif isinstance(node, ast.Call) and (target := _call_target(node, package)):
            how, targets = "importlib", [target]
        elif isinstance(node, ast.Constant) and (target := _named_module(node, known)):
            plugin = name in registries and target.rpartition(".")[0] == package
            how, targets = ("plugin" if plugin else "string"), [target]
        else:
            continue
        for target in targets:
            resolved = _resolve(target, known)
            if resolved != name:
                found.setdefault(resolved, how)
    return found


def layer_of(name: str, layers: list[tuple[str, tuple[str, ...]]] = LAYERS) -> int | None:
    """The index of the layer whose longest entry names ``name``: an exact name, or a prefix
    ending in "." that the name continues; None when no entry names it."""
    best, level = -1, None
    for index, (_, entries) in enumerate(layers):
        for entry in entries:
            names_it = name.startswith(entry) if entry.endswith(".") else name == entry
            if names_it and len(entry) > best:
                best, level = len(entry), index
    return level


def read_graph(root: Path = ROOT, folders: dict[str, str] = FOLDERS, registries=REGISTRIES) -> dict[str, dict[str, str]]:
    known = modules(root, folders)
    return {name: imports(name, path, known, registries) for name, path in known.items()}


def without_layer(graph, layers=LAYERS) -> list[str]:
    return sorted(name for name in graph if layer_of(name, layers) is None)


def upward(graph, layers=LAYERS) -> list[str]:
    found = []
    for module, deps in sorted(graph.items()):
        own = layer_of(module, layers)
        for dep, how in sorted(deps.items()):
            theirs = layer_of(dep, layers) if dep in graph else None
            if own is not None and theirs is not None and theirs > own:
                found.append(f"{module} ({layers[own][0]}) imports {dep} ({layers[theirs][0]}) by {how}")
    return found


def service_imports(graph) -> list[str]:
    return [f"{m} imports {d} by {how}" for m, deps in sorted(graph.items()) if not m.startswith("bridge.workers")
            for d, how in sorted(deps.items()) if any(d == s or d.startswith(s + ".") for s in OUTSIDE_SERVICE)]


def policy_io(graph) -> list[str]:
    return [f"{m} imports {d} by {how}" for m, deps in sorted(graph.items()) if m.startswith("bridge.policies")
            for d, how in sorted(deps.items())
            if d.startswith(("bridge.stores", "bridge.pipeline", "bridge.ops")) or d in ("requests", "urllib3", "socket")]


def without_plugin_loads(graph) -> dict[str, dict[str, str]]:
    """The graph less each registry's string naming a plugin of its own package ("plugin"):
    the plugin imports the registry to register with it, and the registry loads it by name on
    first use. That pair is the one circle allowed, and only by a string: an ``import`` or
    ``importlib`` of the plugin still closes a circle, as does such a string in a module that is
    no registry. Layers still count it: a registry's plugins may not sit above it."""
    return {module: {dep: how for dep, how in deps.items() if how != "plugin"} for module, deps in graph.items()}


def cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start] & graph.keys())))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child] & graph.keys()))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, dict[str, str]]:
    return read_graph()


def test_every_module_has_a_layer(graph):
    assert without_layer(graph) == [], "give each a layer in tests/test_architecture.py"


def test_no_import_runs_upward(graph):
    assert upward(graph) == []


def test_bridge_never_imports_the_service(graph):
    assert service_imports(graph) == []


def test_policies_do_no_io(graph):
    """Decisions are pure functions over data: no store, no engine, no network below them."""
    assert policy_io(graph) == []


def test_no_import_circles(graph):
    assert cycles(without_plugin_loads(graph)) == []


def shared_basenames(found: dict[str, Path]) -> dict[str, list[str]]:
    """File names (packages' __init__ aside) that more than one module has: two jobs.py or two
    compare.py make a reader open the wrong one, and a traceback's file name stop saying which."""
    by_name: dict[str, list[str]] = {}
    for name, path in found.items():
        if path.name != "__init__.py":
            by_name.setdefault(path.name, []).append(name)
    return {base: sorted(names) for base, names in by_name.items() if len(names) > 1}


def test_no_basename_names_two_modules():
    assert shared_basenames(modules()) == {}


# The rules' own tests: each builds a tree that breaks one rule in one way, and the rule says so.

FAKE_LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("low", ("pkg", "pkg.low")),
    ("mid", ("pkg.mid", "pkg.mid.")),
    ("high", ("pkg.high",)),
]


def fake_graph(tmp_path: Path, files: dict[str, str]) -> dict[str, dict[str, str]]:
    for relative, text in {"pkg/__init__.py": "", **files}.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    return read_graph(tmp_path, {"pkg": "pkg"}, {"pkg.mid": "a registry of the fake tree"})


CLEAN = {"pkg/low.py": "import os\n", "pkg/mid/__init__.py": "from pkg import low\n",
         "pkg/mid/part.py": "from . import low_helper\nfrom ..low import x\n", "pkg/mid/low_helper.py": "",
         "pkg/high.py": "import importlib\nfrom pkg.mid import part\nimportlib.import_module('pkg.low')\n"}


def test_the_rules_pass_a_tree_that_keeps_them(tmp_path):
    graph = fake_graph(tmp_path, CLEAN)
    assert graph["pkg.mid.part"] == {"pkg.mid.low_helper": "import", "pkg.low": "import"}
    assert without_layer(graph, FAKE_LAYERS) == []
    assert upward(graph, FAKE_LAYERS) == []
    assert cycles(graph) == []


# Each way of importing pkg.high from pkg.mid.part, and what the reader calls it.
UPWARD_WAYS = {
    "import": ("from pkg.high import thing\n", "import"),
    "function": ("def later():\n    from pkg import high\n    return high\n", "import"),
    "TYPE_CHECKING": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.high import Thing\n",
                      "TYPE_CHECKING"),
    "importlib": ("import importlib\ndef load():\n    return importlib.import_module('pkg.high')\n", "importlib"),
    "relative importlib": ("from importlib import import_module\nimport_module('..high', __package__)\n", "importlib"),
    "__import__": ("def load():\n    return __import__('pkg.high')\n", "importlib"),
    "string": ("PLUGINS = ('pkg.high:Thing',)\n", "string"),
}


@pytest.mark.parametrize("way", sorted(UPWARD_WAYS))
def test_an_upward_import_is_seen_whichever_way_it_is_written(tmp_path, way):
    text, how = UPWARD_WAYS[way]
    graph = fake_graph(tmp_path, {**CLEAN, "pkg/mid/part.py": text})
    assert upward(graph, FAKE_LAYERS) == [f"pkg.mid.part (mid) imports pkg.high (high) by {how}"]


@pytest.mark.parametrize("way", ["TYPE_CHECKING", "function", "importlib"])
def test_a_circle_is_seen_whichever_way_it_is_closed(tmp_path, way):
    closing = UPWARD_WAYS[way][0].replace("pkg.high", "pkg.mid.part").replace("from pkg import high", "import pkg.mid.part")
    graph = fake_graph(tmp_path, {**CLEAN, "pkg/mid/low_helper.py": closing})
    assert cycles(without_plugin_loads(graph)) == [["pkg.mid.low_helper", "pkg.mid.part"]]


def test_only_a_registry_naming_its_own_plugin_by_string_is_no_circle(tmp_path):
    registry = {"pkg/mid/__init__.py": "PLUGINS = ('pkg.mid.part:Thing',)\n",
                "pkg/mid/part.py": "from pkg.mid import PLUGINS\n"}
    graph = fake_graph(tmp_path, {**CLEAN, **registry})
    assert graph["pkg.mid"]["pkg.mid.part"] == "plugin" and cycles(without_plugin_loads(graph)) == []
    loaded = {**registry, "pkg/mid/__init__.py": "import importlib\nimportlib.import_module('pkg.mid.part')\n"}
    assert cycles(without_plugin_loads(fake_graph(tmp_path, {**CLEAN, **loaded}))) == [["pkg.mid", "pkg.mid.part"]]
    not_a_registry = {"pkg/mid/part.py": "PLUGINS = ('pkg.mid.low_helper',)\n",
                      "pkg/mid/low_helper.py": "from pkg.mid.part import PLUGINS\n"}
    graph = fake_graph(tmp_path, {**CLEAN, **not_a_registry})
    assert cycles(without_plugin_loads(graph)) == [["pkg.mid.low_helper", "pkg.mid.part"]]


def test_a_module_no_entry_names_has_no_layer(tmp_path):
    """No catch-all: the package's own name does not cover its modules, nor a prefix a sibling's
    name happens to start with."""
    graph = fake_graph(tmp_path, {**CLEAN, "pkg/stray.py": "", "pkg/lowest.py": "", "pkg/mid_extra.py": ""})
    assert without_layer(graph, FAKE_LAYERS) == ["pkg.lowest", "pkg.mid_extra", "pkg.stray"]


def test_the_foundation_keeps_its_order():
    order = [layer_of(name) for name in ("bridge.errors", "bridge.urls", "bridge.config", "bridge.progress",
                                          "bridge.stores.s3", "bridge.contracts", "bridge.listing", "bridge.jobs",
                                          "bridge.routes.sts", "bridge.policies.cost.usage", "bridge.pipeline.plan",
                                          "bridge.pricing",
                                          "bridge.pipeline.units", "bridge.pipeline.commit",
                                          "bridge.pipeline.execute", "bridge.pipeline.verify", "bridge.ops")]
    assert order == sorted(order) and len(set(order)) == len(order)
    assert layer_of("bridge.routes.sts") == layer_of("bridge.routes")
    assert layer_of("bridge.workers.app") > layer_of("bridge.cli.transfer") > layer_of("bridge.policies.cost")


def test_a_basename_used_twice_is_seen(tmp_path):
    for path in ("pkg/jobs.py", "pkg/mid/jobs.py", "pkg/mid/__init__.py", "pkg/__init__.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    assert shared_basenames(modules(tmp_path, {"pkg": "pkg"})) == {"jobs.py": ["pkg.jobs", "pkg.mid.jobs"]}


def test_the_service_rule_and_the_policy_rule_can_fail():
    assert service_imports({"bridge.ops": {"celery": "TYPE_CHECKING"}}) == ["bridge.ops imports celery by TYPE_CHECKING"]
    assert policy_io({"bridge.policies.cost": {"bridge.stores.s3": "importlib"}}) != []
