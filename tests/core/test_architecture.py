"""peep.core stays pure: no edge/server/paho/grpc/scikit-learn, and each outside
library only in the module allowed to use it (docs/CONVENTIONS.md, item 1)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "shared" / "src" / "peep" / "core"

FORBIDDEN = ("peep.edge", "peep.server", "paho", "grpc", "sklearn", "opendp", "torch")
# Paths relative to peep/core. Projections build their part of the bundle's
# ONNX projector, so onnx (graph building, imported lazily) may appear there too.
ALLOWED_ONLY_IN = {
    "cv2": {"imaging.py"},
    "google.protobuf": {"wire.py"},
    "peep.v1": {"wire.py"},
    "onnx": {"bundle.py", "projections/base.py"},
    "onnxruntime": {"bundle.py"},
    "cryptography": {"bundle.py", "signing.py"},
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_core_modules_import_only_what_they_may():
    files = sorted(CORE.rglob("*.py"))
    assert len(files) > 5
    assert any(f.parent.name == "mechanisms" for f in files) and any(f.parent.name == "projections" for f in files)
    for f in files:
        rel = f.relative_to(CORE).as_posix()
        for name in _imports(f):
            for bad in FORBIDDEN:
                assert not _matches(name, bad), f"{rel} imports {name}"
            for lib, allowed in ALLOWED_ONLY_IN.items():
                if _matches(name, lib):
                    assert rel in allowed, f"{rel} imports {name}; only {sorted(allowed)} may"


def test_importing_core_loads_no_forbidden_module():
    code = (
        "import sys, peep.core.eigenface_model, peep.core.statistics, peep.core.bounding, peep.core.mechanisms, "
        "peep.core.sampling, peep.core.accounting, peep.core.wire, peep.core.bundle, peep.core.imaging;"
        "bad=[m for m in sys.modules if m.split('.')[0] in ('sklearn','grpc','paho','opendp') "
        "or m.startswith(('peep.edge','peep.server'))]; print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_device_release_path_does_not_import_heavy_libraries():
    """A device loads bundles and releases templates; onnx (graph building) and scipy
    (eigen-decomposition, Gaussian calibration) would cost a Pi ~25 MB for nothing."""
    code = (
        "import sys, peep.core.release, peep.core.bundle, peep.core.mechanisms, peep.core.wire, peep.core.imaging,"
        " peep.core.domains; from peep.core.mechanisms import mechanism_kinds; mechanism_kinds();"
        "print(','.join(m for m in ('onnx', 'scipy', 'sklearn') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_releasing_with_every_mechanism_does_not_import_scipy():
    """The unit-sphere and Gaussian mechanisms need special functions (incomplete beta, normal quantiles);
    peep.core.special has them, so building and running any mechanism on a device loads no scipy (21 MB)."""
    code = (
        "import sys, numpy as np; from peep.core.mechanisms import make_mechanism;"
        "x = np.full(24, 0.2);"
        "[make_mechanism(k, epsilon=8.0, n_components=24).release(x / np.linalg.norm(x)) for k in"
        " ('privunit', 'privunit-g')];"
        "make_mechanism('gaussian-l2', epsilon=1.0, delta=1e-6, n_components=24, radius_l2=1.0).release(x);"
        "print(','.join(m for m in ('onnx', 'scipy', 'sklearn') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
