"""The soft-trait store's only read path is the query module (a structural guarantee).

Scans every Python file under server/src, edge/src and shared/src: outside
``peep.server.qbbs`` nothing may import the store module, name its class,
reach into the module's ``_soft_trait_store`` attribute, or mention its tables (SQL is the
other way to read them). Inside the package only ``module.py`` (the query
module) may hold the store, and only ``_store.py`` may name the tables. The
storage migrations create every table, these too: there, and only there, a
statement that creates them (``CREATE TABLE|INDEX IF NOT EXISTS``) may name
them, and nothing else may.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = [REPO / "server" / "src", REPO / "edge" / "src", REPO / "shared" / "src", REPO / "lab" / "src"]
PACKAGE = REPO / "server" / "src" / "peep" / "server" / "qbbs"
#: Creates the tables (and may name them in the statements that do, nowhere else).
MIGRATIONS = REPO / "server" / "src" / "peep" / "server" / "storage" / "migrations.py"
CREATES = re.compile(r"^CREATE (TABLE|INDEX) IF NOT EXISTS qbbs_\w+ (\(|ON qbbs_\w+ \()")
STORE_MODULE = "peep.server.qbbs._store"
TABLES = ("qbbs_soft_traits", "qbbs_meta")
STORE_NAMES = ("SoftTraitStore", "_store")
#: Attributes holding the store (QbbsModule._soft_trait_store) or its class.
STORE_ATTRIBUTES = ("_soft_trait_store", "SoftTraitStore")


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return _dotted(node.value) + "." + node.attr
    return ""


def violations(source: str, path: Path) -> list[str]:
    """What in ``source`` (the file ``path``) reads around the query module."""
    inside = PACKAGE in path.parents
    holder = inside and path.name == "module.py"
    table_owner = inside and path.name == "_store.py"
    found: list[str] = []
    tree = ast.parse(source, filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == STORE_MODULE or alias.name.startswith(STORE_MODULE + "."):
                    if not holder:
                        found.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            names = {a.name for a in node.names}
            via_package = mod == "peep.server.qbbs" and names & set(STORE_NAMES)
            relative = node.level > 0 and (mod == "_store" or "_store" in names)
            if (mod == STORE_MODULE or via_package or relative) and not holder:
                found.append(f"line {node.lineno}: from {'.' * node.level}{mod} import {sorted(names)}")
        elif (
            isinstance(node, ast.Attribute)
            and not holder
            and (node.attr in STORE_ATTRIBUTES or (node.attr == "_store" and _dotted(node.value).endswith("qbbs")))
        ):
            found.append(f"line {node.lineno}: attribute {_dotted(node)}")
        elif isinstance(node, ast.Name) and node.id == "SoftTraitStore" and not (holder or table_owner):
            found.append(f"line {node.lineno}: name SoftTraitStore")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and not table_owner:
            if path == MIGRATIONS and CREATES.match(node.value):
                continue
            low = node.value.lower()
            hits = [t for t in TABLES if t in low]
            if hits or "peep.server.qbbs._store" in node.value:
                found.append(f"line {node.lineno}: string mentions {hits or [STORE_MODULE]}")
    return found


def _python_files() -> list[Path]:
    files = sorted(f for root in ROOTS for f in root.rglob("*.py") if "egg-info" not in str(f))
    assert len(files) > 20, "expected to scan the whole source tree"
    return files


def test_no_code_outside_the_query_module_reads_the_store():
    bad: dict[str, list[str]] = {}
    for f in _python_files():
        if f == Path(__file__):
            continue
        found = violations(f.read_text(encoding="utf-8"), f)
        if found:
            bad[str(f.relative_to(REPO))] = found
    assert not bad, f"code outside the QBBS query module reaches the soft-trait store: {bad}"


def test_the_store_class_is_private_to_the_package():
    import peep.server.qbbs as qbbs

    assert not any("store" in name.lower() for name in qbbs.__all__)
    assert (PACKAGE / "_store.py").is_file()
    assert any(STORE_MODULE in f.read_text() for f in PACKAGE.glob("module.py"))


@pytest.mark.parametrize(
    "snippet",
    [
        "from peep.server.qbbs._store import SoftTraitStore\n",
        "import peep.server.qbbs._store as s\n",
        "from peep.server.qbbs import _store\n",
        "from ._store import SoftTraitStore\n",
        "def f(m):\n    return m._soft_trait_store.column('age')\n",
        "import peep.server.qbbs\nx = peep.server.qbbs._store\n",
        "SQL = 'SELECT value FROM qbbs_soft_traits'\n",
        'q = "select * from QBBS_SOFT_TRAITS where subject = ?"\n',
        "import importlib\nimportlib.import_module('peep.server.qbbs._store')\n",
    ],
)
def test_the_scanner_catches_each_way_around(snippet):
    outside = REPO / "server" / "src" / "peep" / "server" / "storage.py"
    assert violations(snippet, outside), snippet
    sibling = PACKAGE / "service.py"
    assert violations(snippet, sibling), snippet


def test_the_migrations_may_create_the_tables_and_nothing_more():
    create = 'DDL = "CREATE TABLE IF NOT EXISTS qbbs_soft_traits (subject TEXT NOT NULL)"\n'
    index = 'DDL = "CREATE INDEX IF NOT EXISTS qbbs_soft_traits_trait ON qbbs_soft_traits (trait, subject)"\n'
    assert violations(create, MIGRATIONS) == [] and violations(index, MIGRATIONS) == []
    for snippet in (
        "SQL = 'SELECT value FROM qbbs_soft_traits'\n",
        "SQL = 'INSERT INTO qbbs_meta SELECT * FROM qbbs_soft_traits'\n",
        'DDL = "CREATE TABLE IF NOT EXISTS qbbs_copy AS SELECT * FROM qbbs_soft_traits"\n',
        "import peep.server.qbbs._store\n",
    ):
        assert violations(snippet, MIGRATIONS), snippet
    assert violations(create, REPO / "server" / "src" / "peep" / "server" / "storage" / "base.py")


def test_the_scanner_allows_the_query_module_itself():
    module = PACKAGE / "module.py"
    assert violations(module.read_text(), module) == []
    # Other components' own stores are not this store.
    ok = "import numpy as np\nclass S:\n    def f(self):\n        return self._store.get(np.zeros(3))\n"
    assert violations(ok, REPO / "server" / "src" / "x.py") == []
