"""The import graph keeps one direction: no circles, and no module imports a layer above its own.

Read from the source with ``ast`` (every import, at module level or inside a function, except
those under ``if TYPE_CHECKING:``), the repository's folders named as they install:
``workers/`` is ``bridge.workers`` and ``policies/`` is ``bridge.policies``. The layers, lowest
first, are the README's "Architecture" section; a new module must be given its layer here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"bridge": "bridge", "workers": "bridge.workers", "policies": "bridge.policies"}

# Lowest first. A module belongs to the layer of the longest prefix that names it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("bridge", "bridge.errors", "bridge.urls", "bridge.names", "bridge.config", "bridge.redact",
                    "bridge.retry", "bridge.registry", "bridge.journal", "bridge.spill", "bridge.progress",
                    "bridge.bwlimit", "bridge.attributes", "bridge.logs", "bridge.meter", "bridge.money", "bridge.filters")),
    ("stores", ("bridge.stores", "bridge.hashing", "bridge.check", "bridge.manifest", "bridge.carry", "bridge.adopt",
                "bridge.packing",
                "bridge.packing.index", "bridge.packing.layout", "bridge.packing.rangefile",
                "bridge.packing.reading", "bridge.packing.writer", "bridge.packing.sink",
                "bridge.packing.tarfmt", "bridge.packing.parquetfmt")),
    ("plan", ("bridge.engine", "bridge.estimate", "bridge.jobs", "bridge.routes")),
    ("policies", ("bridge.policies",)),
    ("executor", ("bridge.costing", "bridge.ops", "bridge.compare", "bridge.objects", "bridge.packing.job", "bridge.packing.unpack",
                  "bridge.replication", "bridge.evidence", "bridge.cache", "bridge.routes.server", "bridge.routes.fromurl",
                  "bridge.routes.delegated", "bridge.routes.sts", "bridge.routes.datasync",
                  "bridge.routes.native", "bridge.routes.ledger")),
    ("cli", ("bridge.cli", "bridge.__main__")),
    ("workers", ("bridge.workers",)),
]
OUTSIDE_SERVICE = ("celery", "kombu", "redis", "bridge.workers")


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules ``name`` imports: ours resolved to the deepest known module, others by their
    top-level name."""
    tree = ast.parse(path.read_text(), str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or _type_checking_only(node, parents):
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in targets:
            while target not in known and "." in target and target.split(".")[0] == "bridge":
                target = target.rpartition(".")[0]
            if target != name:
                found.add(target if target in known else target.split(".")[0])
    return found


def layer_of(name: str) -> int:
    best, level = -1, None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), index
    assert level is not None, f"{name} has no layer: give it one in tests/test_architecture.py"
    return level


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_every_module_has_a_layer(graph):
    for name in graph:
        layer_of(name)


def test_no_import_runs_upward(graph):
    upward = [f"{m} ({LAYERS[layer_of(m)][0]}) imports {d} ({LAYERS[layer_of(d)][0]})"
              for m, deps in sorted(graph.items()) for d in sorted(deps)
              if d in graph and layer_of(d) > layer_of(m)]
    assert upward == []


def test_bridge_never_imports_the_service(graph):
    wrong = [f"{m} imports {d}" for m, deps in sorted(graph.items()) if not m.startswith("bridge.workers")
             for d in sorted(deps) if any(d == s or d.startswith(s + ".") for s in OUTSIDE_SERVICE)]
    assert wrong == []


def test_policies_do_no_io(graph):
    """Decisions are pure functions over data: no store, no engine, no network below them."""
    wrong = [f"{m} imports {d}" for m, deps in sorted(graph.items()) if m.startswith("bridge.policies")
             for d in sorted(deps)
             if d.startswith(("bridge.stores", "bridge.engine", "bridge.ops")) or d in ("requests", "urllib3", "socket")]
    assert wrong == []


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
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


def test_no_import_circles(graph):
    assert cycles(graph) == []


def test_the_checks_can_fail():
    """The cycle finder and the layer rule see what they are meant to see."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layer_of("bridge.routes.sts") > layer_of("bridge.routes") > layer_of("bridge.stores.s3")
    assert layer_of("bridge.workers.app") > layer_of("bridge.cli.transfer") > layer_of("bridge.policies.cost")
