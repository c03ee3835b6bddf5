"""No import loops between the server's folders: its packages and top-level modules form layers.

Each subpackage (``config``, ``storage``, ``qbbs``, ...) and each top-level module (``services``, ``app``,
``startup``, ...) of ``peep.server`` is one node; an import anywhere in a node's files of anything in another
node is an edge, wherever the import sits: at module level, inside a function (a lazy import is still a
dependency), under ``if TYPE_CHECKING`` (the types couple the two just the same), relative, or as
``importlib.import_module("peep.server...")``. The graph must have no cycle: a loop between folders is two
parts that cannot be understood, tested or moved one without the other, and what lets a low layer (config,
storage) come to depend on what is built on it. A failure prints each loop with the imports that make it.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from itertools import pairwise
from pathlib import Path

import pytest
from peep_testing.imports import strongly_connected_groups

REPO = Path(__file__).resolve().parents[2]
SERVER = REPO / "server" / "src" / "peep" / "server"
PACKAGE = "peep.server"

#: node -> node it imports -> where ("file:line") each import is.
Graph = dict[str, dict[str, list[str]]]


def nodes(root: Path = SERVER) -> set[str]:
    """The folders: every subpackage and every top-level module of ``peep.server``."""
    packages = {d.name for d in root.iterdir() if d.is_dir() and (d / "__init__.py").is_file()}
    modules = {f.stem for f in root.glob("*.py") if f.name != "__init__.py"}
    return packages | modules


def imported_names(tree: ast.AST, module: str, is_package: bool) -> list[tuple[str, int]]:
    """Every dotted name ``tree`` (the module ``module``) imports, at any depth, with its line.

    ``from a import b`` yields ``a`` and ``a.b`` (``b`` may be a module: ``from peep.server import startup``).
    """
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            found.append((source, node.lineno))
            found.extend((f"{source}.{alias.name}", node.lineno) for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.args[0].value, node.lineno))
    return found


def node_of(name: str, known: set[str]) -> str | None:
    """The folder a dotted name is in, or ``None`` outside ``peep.server`` (or the package itself)."""
    parts = name.split(".")
    if parts[:2] != PACKAGE.split(".") or len(parts) < 3 or parts[2] not in known:
        return None
    return parts[2]


def folder_graph(root: Path = SERVER) -> Graph:
    known = nodes(root)
    graph: Graph = {n: defaultdict(list) for n in sorted(known)}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        source = rel.parts[0].removesuffix(".py")
        if source not in known:  # peep/server/__init__.py: the package itself
            continue
        is_package = path.name == "__init__.py"
        dotted = ".".join((PACKAGE, *rel.with_suffix("").parts))
        module = dotted.removesuffix(".__init__") if is_package else dotted
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for name, line in imported_names(tree, module, is_package):
            target = node_of(name, known)
            if target is not None and target != source:
                where = f"{rel.as_posix()}:{line}"
                if where not in graph[source][target]:
                    graph[source][target].append(where)
    return graph


def knots(graph: Graph) -> list[set[str]]:
    """The strongly connected groups of more than one node: folders each reachable from every other."""
    return [set(g) for g in strongly_connected_groups(graph)]


def cycles(graph: Graph) -> list[list[str]]:
    """A shortest cycle through each knot (from its first node by name), as ``[a, b, ..., a]``."""
    return [_shortest_cycle(graph, group, min(group)) for group in knots(graph)]


def _shortest_cycle(graph: Graph, group: set[str], start: str) -> list[str]:
    """Breadth first from ``start`` inside ``group`` (strongly connected) until an edge leads back to it."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    return [*paths[v], start]
                if w in group and w not in paths:
                    paths[w] = [*paths[v], w]
                    following.append(w)
        frontier = following
    raise AssertionError(f"{sorted(group)}: a strongly connected group has a cycle through each of its nodes")


def describe(cycle: list[str], graph: Graph) -> str:
    lines = [" -> ".join(cycle)]
    for a, b in pairwise(cycle):
        where = graph[a][b]
        lines.append(f"    {a} -> {b}: {', '.join(where[:4])}{' ...' if len(where) > 4 else ''}")
    return "\n".join(lines)


@pytest.mark.slow
def test_the_server_folders_import_each_other_without_loops():
    graph = folder_graph()
    assert {"config", "storage", "services", "qbbs", "app", "commands"} <= graph.keys()
    assert "storage" in graph["services"] and "config" in graph["storage"]  # the scan sees the real imports
    report = [
        f"{', '.join(sorted(knot))} import each other; a loop among them:\n{describe(loop, graph)}"
        for knot, loop in zip(knots(graph), cycles(graph), strict=True)
    ]
    assert not report, "import loops between folders of peep.server:\n" + "\n".join(report)


# --------------------------------------------------------------------------- the scanner itself


@pytest.mark.parametrize(
    ("snippet", "target"),
    [
        ("from peep.server.storage import Store\n", "storage"),
        ("import peep.server.storage.sql\n", "storage"),
        ("from peep.server import startup\n", "startup"),
        ("def f():\n    from peep.server.services import Services\n", "services"),  # lazy
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from peep.server.app import ServerApp\n", "app"),
        ("from ..storage import Store\n", "storage"),  # relative, from peep.server.ingest.x
        ("import importlib\nm = importlib.import_module('peep.server.qbbs')\n", "qbbs"),
    ],
)
def test_the_scanner_sees_every_kind_of_import(snippet, target):
    known = {"ingest", "storage", "startup", "services", "app", "qbbs"}
    names = imported_names(ast.parse(snippet), "peep.server.ingest.x", is_package=False)
    assert target in {node_of(n, known) for n, _ in names}


def test_a_loop_is_found_and_named_with_its_imports(tmp_path):
    root = tmp_path / "peep" / "server"
    for package, body in {
        "config": "from peep.server.errors import UsageError\n",
        "storage": "from peep.server.config import X\n",
        "recognition": "from peep.server.storage import Store\n\ndef f():\n    from peep.server.services import S\n",
    }.items():
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text(body)
    (root / "errors.py").write_text("")
    (root / "services.py").write_text("from peep.server.storage import Store\n")
    graph = folder_graph(root)
    assert cycles(graph) == []
    (root / "storage" / "base.py").write_text("from peep.server.recognition import Model\n")
    graph = folder_graph(root)
    assert cycles(graph) == [["recognition", "storage", "recognition"]]
    assert "storage -> recognition: storage/base.py:1" in describe(cycles(graph)[0], graph)
