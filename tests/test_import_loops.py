"""No import loop between the modules of any PEEP distribution: files form layers as the folders do.

Every module of peep.core, peep.edge, peep.server and peep.lab is a node; each import of another PEEP module is
an edge, wherever it sits (module level, inside a function, under ``if TYPE_CHECKING``, relative, or
``importlib.import_module("literal")``). ``from package import name`` is an edge to the submodule when ``name``
is one, else to the package. A loop is two modules that cannot be read, tested or moved one without the other;
a failure names each loop with the imports that make it. The server's folder-level layers are
``tests/server/test_import_layers.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from peep_testing.imports import strongly_connected_groups

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "shared" / "src", ROOT / "edge" / "src", ROOT / "server" / "src", ROOT / "lab" / "src"]
GENERATED = "peep.v1"


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for src in SOURCES:
        for f in sorted((src / "peep").rglob("*.py")):
            parts = list(f.relative_to(src).with_suffix("").parts)
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            if not name.startswith(GENERATED):
                out[name] = f
    return out


def _called(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def import_graph(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    """module -> imported module -> the line of the first such import."""
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: dict[str, int] = {}

        def add(target: str, line: int, name: str = name, edges: dict[str, int] = edges) -> None:
            while target and target not in modules:  # peep.x.y.Name -> peep.x.y
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.setdefault(target, line)

        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                for a in node.names:
                    add(a.name, node.lineno)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                for a in node.names:
                    sub = f"{source}.{a.name}"
                    add(sub if sub in modules else source, node.lineno)
            elif (
                isinstance(node, ast.Call)
                and (node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", ""))
                == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                add(node.args[0].value, node.lineno)
        graph[name] = {t: ln for t, ln in edges.items() if t.startswith("peep.")}
    return graph


def loops(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted."""
    return strongly_connected_groups(graph)


def test_no_module_imports_another_that_imports_it_back():
    modules = _modules()
    graph = import_graph(modules)
    assert len(graph) > 250 and sum(map(len, graph.values())) > 500  # the scan sees the code
    found = loops(graph)
    lines = []
    for comp in found:
        members = set(comp)
        lines.append(" <-> ".join(comp))
        for m in comp:
            for t, ln in sorted(graph[m].items()):
                if t in members:
                    lines.append(f"    {modules[m].relative_to(ROOT)}:{ln} imports {t}")
    assert not found, "import loops between modules:\n" + "\n".join(lines)


def test_the_check_finds_a_loop():
    graph = {"peep.a": {"peep.b": 1}, "peep.b": {"peep.c": 2}, "peep.c": {"peep.a": 3}, "peep.d": {"peep.a": 4}}
    assert loops(graph) == [["peep.a", "peep.b", "peep.c"]]


def test_no_module_imports_another_module_s_private_name():
    """A name with a leading underscore is its module's own: another module that needs it gets a public name."""
    bad = []
    for path in _modules().values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("peep")) or (
                isinstance(node, ast.ImportFrom) and node.level
            ):
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        bad.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}.{a.name}")
    assert not bad, "private names imported across modules:\n" + "\n".join(bad)


def _private_reaches(path: Path, module: str) -> list[str]:
    """Where ``path`` (module ``module``) reaches a private name of another PEEP module: ``alias._name`` on a
    module it imported, or a private module (``peep.x._y``) imported from outside the package that holds it."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    aliases: dict[str, str] = {}
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    bad = []
    for node in ast.walk(tree):
        targets: list[tuple[str, str]] = []
        if isinstance(node, ast.Import):
            targets = [(a.asname or a.name.split(".")[0], a.name if a.asname else a.name.split(".")[0])
                       for a in node.names]  # fmt: skip
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("peep")):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            targets = [(a.asname or a.name, f"{source}.{a.name}") for a in node.names]
            for part_at, part in enumerate(source.split(".")):
                if part.startswith("_") and not part.startswith("__"):
                    owner = ".".join(source.split(".")[:part_at])
                    if not (module == owner or module.startswith(owner + ".")):
                        bad.append(f"{shown}:{node.lineno} imports the private module {source}")
        for local, target in targets:
            if target.startswith("peep"):
                aliases[local] = target
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):  # fmt: skip
            bad.append(f"{shown}:{node.lineno} reaches {aliases[node.value.id]}.{node.attr}")
    return bad


def test_no_module_reaches_a_private_name_through_a_module_it_imported():
    """``execution._split`` is the same private name as ``from execution import _split``, only harder to see."""
    bad = [b for name, path in _modules().items() for b in _private_reaches(path, name)]
    assert not bad, "private names reached across modules:\n" + "\n".join(sorted(set(bad)))


def test_the_check_sees_a_private_name_reached_through_a_module(tmp_path):
    f = tmp_path / "user.py"
    f.write_text("from peep.lab.audit import execution\nimport peep.core.wire as w\nfrom peep.core._hidden "
                 "import check_int\nexecution._split(1)\nw.encode_template\nexecution.public\n")  # fmt: skip
    found = _private_reaches(f, "peep.lab.user")
    assert [b.split(" ", 1)[1] for b in found] == [
        "imports the private module peep.core._hidden", "reaches peep.lab.audit.execution._split"]  # fmt: skip
