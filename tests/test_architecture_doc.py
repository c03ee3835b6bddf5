"""docs/ARCHITECTURE.md names only what exists, and its claims hold: who imports the edge, which modules of the
core import which library, and which modules write SQL.

A rename or a split that forgets the page makes it lie; these tests read every module, package,
attribute and path it names in backticks and look each up in the tree (by reading source, never by
importing, so a lab module without its extra is still found).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
SOURCES = {
    "core": ROOT / "shared" / "src" / "peep" / "core",
    "edge": ROOT / "edge" / "src" / "peep" / "edge",
    "server": ROOT / "server" / "src" / "peep" / "server",
    "lab": ROOT / "lab" / "src" / "peep" / "lab",
    "v1": ROOT / "shared" / "src" / "peep" / "v1",
}
#: The server modules (folders or files of peep.server) the page says import the edge, and why.
SERVER_MODULES_IMPORTING_EDGE = {"descriptors", "facework"}

_DOTTED = re.compile(r"`(peep(?:\.[A-Za-z_][A-Za-z0-9_]*)+)`")
_ROW = re.compile(r"^\| (`peep\.[^|]*) \|(.*)\|\s*$")
_TOKEN = re.compile(r"`([a-z_][a-z0-9_]*)`")
_PATH = re.compile(r"`([A-Za-z0-9_.\-/]+/[A-Za-z0-9_.\-]*)`")


def _module_path(dotted: str) -> Path | None:
    """The file or package folder of ``peep.<dist>.<...>``, or None."""
    parts = dotted.split(".")
    if len(parts) < 2 or parts[0] != "peep" or parts[1] not in SOURCES:
        return None
    base = SOURCES[parts[1]].joinpath(*parts[2:])
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file() or (len(parts) == 2 and base.is_dir()):
        return base
    return None


def _defines(path: Path, name: str) -> bool:
    """Whether the module file (or any module of the package folder) defines ``name`` at any depth."""
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                return True
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return True
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
                return True
    return False


def _resolves(dotted: str) -> bool:
    """A module or package, or a name defined in one (``peep.server.cli.COMMANDS``)."""
    if _module_path(dotted) is not None:
        return True
    owner, _, name = dotted.rpartition(".")
    path = _module_path(owner)
    return path is not None and _defines(path, name)


def unresolved_names(text: str) -> list[str]:
    """What the page names in backticks that the tree does not hold, sorted."""
    missing: set[str] = set()
    for m in _DOTTED.finditer(text):
        if not _resolves(m.group(1)):
            missing.add(m.group(1))
    for line in text.splitlines():
        row = _ROW.match(line)
        if row is None:
            continue
        # "`peep.core.sampling`, `accounting`": the first names a module, the rest its siblings.
        heads = re.findall(r"`([A-Za-z0-9_.]+)`", row.group(1))
        first = heads[0]
        parent = first.rpartition(".")[0]
        packages = [first] + [f"{parent}.{h}" for h in heads[1:]]
        for dotted in packages:
            if not _resolves(dotted):
                missing.add(dotted)
        # The second cell's lower-case names are the first package's modules or names defined in it.
        package = _module_path(first)
        if package is None or not package.is_dir():
            continue
        for token in _TOKEN.findall(row.group(2)):
            if not _resolves(f"{first}.{token}") and not _defines(package, token):
                missing.add(f"{first}.{token}")
    tracked = [p.as_posix() for p in ROOT.rglob("*") if ".git" not in p.parts and ".venv" not in p.parts]
    for m in _PATH.finditer(text):
        path = m.group(1).rstrip("/")
        if "<" in path or path.startswith(("http", "$")):
            continue
        if not (ROOT / path).exists() and not any(t.endswith("/" + path) for t in tracked):
            missing.add(m.group(1))
    return sorted(missing)


def test_every_module_package_name_and_path_the_page_names_exists():
    text = DOC.read_text(encoding="utf-8")
    assert len(_DOTTED.findall(text)) > 40  # the page names modules; a reformat that hid them fails here
    assert unresolved_names(text) == []


def test_the_check_reports_what_does_not_exist():
    text = (
        "`peep.core.bundle` and `peep.core.bundle.ProjectionBundle` and `peep.server.cli.COMMANDS` exist;\n"
        "`peep.core.eigenfaces` and `peep.server.storage.base` and `peep.core.bundle.EigenfaceBundle` do not.\n"
        "| `peep.server.recognition` | `presets`, `fitting`, `registry` (gone), `claims` |\n"
        "| `peep.core.sampling`, `accounting`, `nowhere` | ... |\n"
        "See `server/src/peep/server/storage/sql.py`, `console/templates/` and `storage/base.py`.\n"
    )
    assert unresolved_names(text) == [
        "peep.core.bundle.EigenfaceBundle",
        "peep.core.eigenfaces",
        "peep.core.nowhere",
        "peep.server.recognition.registry",
        "peep.server.storage.base",
        "storage/base.py",
    ]


def _imports_edge(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        if any(n == "peep.edge" or n.startswith("peep.edge.") for n in names):
            return True
    return False


def test_the_server_imports_the_edge_only_where_the_page_says():
    server = SOURCES["server"]
    importing = {f.relative_to(server).parts[0].removesuffix(".py") for f in server.rglob("*.py") if _imports_edge(f)}
    assert importing, "the scan found no import of peep.edge at all: descriptor bundles use the edge's encoder"
    assert importing == SERVER_MODULES_IMPORTING_EDGE, sorted(importing ^ SERVER_MODULES_IMPORTING_EDGE)
    text = DOC.read_text(encoding="utf-8")
    for module in SERVER_MODULES_IMPORTING_EDGE:
        assert f"`peep.server.{module}`" in text, module


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _library_table(text: str) -> dict[str, set[str]]:
    """The page's table "| library | modules of peep.core |": library -> the module files it names."""
    rows: dict[str, set[str]] = {}
    lines = text.splitlines()
    start = lines.index("| library | modules of peep.core |")
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        library, modules = (c.strip() for c in line.strip("|").split("|"))
        rows[library] = set(re.findall(r"`([\w/]+\.py)`", modules))
    return rows


def test_the_core_imports_each_library_exactly_where_the_page_says():
    table = _library_table(DOC.read_text(encoding="utf-8"))
    assert {"scipy", "cryptography", "cv2", "onnx", "onnxruntime", "google.protobuf"} <= set(table)
    core = SOURCES["core"]
    for library, said in table.items():
        actual = {
            f.relative_to(core).as_posix()
            for f in core.rglob("*.py")
            if any(n == library or n.startswith(library + ".") for n in _imported(f))
        }
        assert actual == said, f"{library}: the page says {sorted(said)}, the code imports it in {sorted(actual)}"


#: SQL as this code writes it: keywords in capitals (a docstring's "Create ``name``" is not).
_SQL = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|ALTER|DROP|WITH)\s")


def _writes_sql(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _SQL.match(node.value):
            if re.search(r"\b(FROM|INTO|TABLE|SET|WHERE|VALUES|INDEX)\b", node.value):
                return True
    return False


def test_sql_is_written_only_where_the_page_says():
    text = DOC.read_text(encoding="utf-8")
    paragraph = text[text.index("SQL is written only in these modules:") :].split("\n\n")[0]
    said = set(re.findall(r"`([\w/]+(?:\.py|/))`", paragraph))
    server, lab = SOURCES["server"], SOURCES["lab"]
    actual = {f.relative_to(server).as_posix() for f in server.rglob("*.py") if _writes_sql(f)}
    actual_lab = {f.relative_to(lab).as_posix() for f in lab.rglob("*.py") if _writes_sql(f)}
    assert "storage/sql.py" in actual and "console/store.py" in actual  # the scan finds SQL at all
    assert actual == said - {p for p in said if p.startswith(("bench/", "processes/"))}, sorted(actual ^ said)
    for f in actual_lab:
        assert f in said or any(f.startswith(p) for p in said if p.endswith("/")), f"lab/{f} writes SQL"
