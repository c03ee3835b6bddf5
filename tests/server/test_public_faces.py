"""The serving packages show a narrow face: what another package may import from ``ingest``, ``recognition``,
``transport`` and ``bundles`` is named, and nothing else is reached.

Each of these packages' ``__init__`` lists its public modules in ``__all__``; each public module lists what it
offers in its own ``__all__``. Every import from outside the package, anywhere in the distributions' sources
(server, edge, lab; tests may look inside), must name a public module and a name that module offers. A failure
names the import, so the face grows by a decision (adding the name) and not by accident.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVER = REPO / "server" / "src" / "peep" / "server"
SOURCES = [REPO / d / "src" for d in ("shared", "edge", "server", "lab")]
PACKAGES = ("ingest", "recognition", "transport", "bundles")


def declared_all(path: Path) -> list[str] | None:
    """The literal ``__all__`` of a module, or None when it has none."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return None


@functools.cache
def _imports(path: Path) -> list[ast.Import | ast.ImportFrom]:
    return [
        n for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(n, ast.Import | ast.ImportFrom)
    ]


def outside_imports(package: str, sources: list[Path]) -> list[tuple[str, str, str]]:
    """``(where, module, name)`` of each import of ``peep.server.<package>...`` from a module outside it
    (``name`` is "" for ``import peep.server.<package>.<module>``)."""
    prefix = f"peep.server.{package}"
    found = []
    for src in sources:
        for f in sorted((src / "peep").rglob("*.py")):
            rel = f.relative_to(src).with_suffix("").parts
            module = ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
            if module == prefix or module.startswith(prefix + ".") or module.startswith("peep.v1"):
                continue
            for node in _imports(f):
                where = f"{f.relative_to(src.parent)}:{node.lineno}"
                if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    if node.module == prefix:
                        found.extend((where, a.name, "") for a in node.names)
                    elif node.module.startswith(prefix + "."):
                        found.extend((where, node.module[len(prefix) + 1 :], a.name) for a in node.names)
                elif isinstance(node, ast.Import):
                    found.extend((where, a.name[len(prefix) + 1 :], "") for a in node.names
                                 if a.name.startswith(prefix + "."))  # fmt: skip
    return found


def face_violations(package: str, root: Path, sources: list[Path]) -> list[str]:
    public = declared_all(root / package / "__init__.py")
    if public is None:
        return [f"{package}/__init__.py: no __all__ naming the package's public modules"]
    bad = []
    offers: dict[str, list[str] | None] = {}
    for m in public:
        path = root / package / f"{m}.py"
        offers[m] = declared_all(path) if path.is_file() else None
        if not path.is_file():
            bad.append(f"{package}/__init__.py names {m!r}, which is not a module of the package")
        elif offers[m] is None:
            bad.append(f"{package}/{m}.py is public but has no __all__")
    for where, module, name in outside_imports(package, sources):
        top = module.split(".")[0]
        if top not in public:
            bad.append(f"{where} imports peep.server.{package}.{module}, not one of the package's public modules")
        elif name and name not in (offers.get(top) or []):
            bad.append(f"{where} imports {name} from peep.server.{package}.{module}, which does not offer it")
    return bad


@pytest.mark.parametrize("package", PACKAGES)
def test_what_other_packages_import_is_on_the_package_s_face(package):
    assert outside_imports(package, SOURCES), "the scan sees the package's users"
    bad = face_violations(package, SERVER, SOURCES)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_name_a_public_module_offers_is_defined_there(package):
    for m in declared_all(SERVER / package / "__init__.py") or []:
        module = __import__(f"peep.server.{package}.{m}", fromlist=["__all__"])
        missing = [n for n in module.__all__ if not hasattr(module, n)]
        assert not missing, f"peep.server.{package}.{m}.__all__ names what it does not define: {missing}"


def test_the_check_names_an_import_past_the_face(tmp_path):
    pkg = tmp_path / "server" / "ingest"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('__all__ = ["ingestor"]\n')
    (pkg / "ingestor.py").write_text('__all__ = ["Ingestor"]\n')
    (pkg / "contacts.py").write_text("")
    user = tmp_path / "src" / "peep" / "lab"
    user.mkdir(parents=True)
    (user / "use.py").write_text(
        "from peep.server.ingest.ingestor import Ingestor, _secret\nfrom peep.server.ingest.contacts import X\n"
    )
    bad = face_violations("ingest", tmp_path / "server", [tmp_path / "src"])
    assert [b.split(" ", 1)[1] for b in bad] == [
        "imports _secret from peep.server.ingest.ingestor, which does not offer it",
        "imports peep.server.ingest.contacts, not one of the package's public modules",
    ]
