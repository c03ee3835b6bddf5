"""The runtime apart from the tooling (docs/CONVENTIONS.md, item 3a): no serving module of peep.server imports
the lab or what only the lab needs, so a serving install (peep-server without its extra ``lab``) runs.

The split is stated once, in :mod:`peep.server.extras` (``LAB_MODULES``, ``LAB_DEPENDENCIES``); this file
checks the code against it, the ``lab`` extra against it, and a fresh interpreter without the lab's
dependencies against both.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from peep.server.extras import LAB_DEPENDENCIES, LAB_MODULES, is_lab_module

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "server" / "src"
PACKAGE = SRC / "peep" / "server"

# Imports no serving module may make besides the lab's own dependencies: PyTorch comes with the extra `sgap`
# (the lab's SGAP training), scikit-image only with the dev tools (tests compare our SSIM with it).
LAB_ONLY_IMPORTS = (*LAB_DEPENDENCIES, "torch", "skimage")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(f): f for f in sorted(PACKAGE.rglob("*.py"))}
SERVING = {name: f for name, f in MODULES.items() if not is_lab_module(name)}


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


def test_the_split_names_what_exists():
    assert len(SERVING) > 50 and len(MODULES) - len(SERVING) > 30
    for lab in LAB_MODULES:
        assert any(_under(name, lab) for name in MODULES), f"extras.LAB_MODULES names {lab}, which does not exist"
    # What `peep serve` and the backend's commands run is serving, the hosted QBBS module included.
    for name in (
        "peep.server.app",
        "peep.server.cli",
        "peep.server.startup",
        "peep.server.commands.serve",
        "peep.server.commands.qbbs",
        "peep.server.qbbs",
        "peep.server.qbbs.hosting",
        "peep.server.qbbs.service",
        "peep.server.qbbs.calibration",
        "peep.server.qbbs.anthropometry",
    ):
        assert name in SERVING, name


def test_no_serving_module_imports_the_lab_or_its_dependencies():
    bad = []
    for name, path in SERVING.items():
        for line, module in _imports(name, path):
            if is_lab_module(module) or any(_under(module, dep) for dep in LAB_ONLY_IMPORTS):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not bad, "serving modules import the lab (move what they share to a serving module):\n" + "\n".join(bad)


def test_the_lab_extra_holds_the_lab_dependencies_and_the_serving_install_none():
    project = tomllib.loads((ROOT / "server" / "pyproject.toml").read_text())["project"]
    base = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    lab = {canonicalize_name(Requirement(r).name) for r in project["optional-dependencies"]["lab"]}
    assert lab == {canonicalize_name(d) for d in LAB_DEPENDENCIES.values()}
    assert not base & (lab | {"scikit-image", "torch"})


def test_a_fresh_interpreter_without_the_lab_loads_every_serving_module_and_the_cli():
    """What the AST cannot see (an import made by a library on our behalf, a name built at run time)."""
    code = f"""
import importlib, sys
blocked = {LAB_ONLY_IMPORTS!r}
for m in blocked:
    sys.modules[m] = None  # importing it raises ModuleNotFoundError, as in a serving install
for name in {sorted(SERVING)!r}:
    importlib.import_module(name)
from peep.server.cli import build_parser
build_parser().format_help()
from peep.server.qbbs import QbbsConfig, QbbsModule
QbbsModule(QbbsConfig()).close()
from peep.server.extras import is_lab_module
print("\\n".join(sorted(m for m in sys.modules if is_lab_module(m))))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "", f"serving code loaded lab modules:\n{r.stdout}"


def test_the_demo_extra_holds_the_lab_dependencies_the_demo_imports_and_no_others():
    """``peep demo`` (its package, its command and every peep.server module they reach) imports only the lab
    dependencies of DEMO_DEPENDENCIES, and its extra installs those and the edge agent, not OpenDP."""
    from peep.server.extras import DEMO_DEPENDENCIES

    project = tomllib.loads((ROOT / "server" / "pyproject.toml").read_text())["project"]
    demo = {canonicalize_name(Requirement(r).name) for r in project["optional-dependencies"]["demo"]}
    assert demo == {"peep-edge", *(canonicalize_name(LAB_DEPENDENCIES[n]) for n in DEMO_DEPENDENCIES)}
    # The peep.server modules the demo reaches, followed through their imports.
    todo = [n for n in MODULES if n.startswith("peep.server.demo")] + ["peep.server.commands.demo"]
    seen: set[str] = set()
    used: dict[str, str] = {}
    while todo:
        name = todo.pop()
        if name in seen or name not in MODULES:
            continue
        seen.add(name)
        for line, module in _imports(name, MODULES[name]):
            for dep in LAB_DEPENDENCIES:
                if _under(module, dep):
                    used.setdefault(dep, f"{MODULES[name].relative_to(ROOT)}:{line}")
            if module.startswith("peep.server"):
                todo += [module, module.rpartition(".")[0]]
    assert "peep.server.demo.runner" in seen and len(seen) > 20 and "matplotlib" in used
    extra = {dep: where for dep, where in used.items() if dep not in DEMO_DEPENDENCIES}
    assert not extra, f"the demo imports lab dependencies its extra does not install: {extra}"
