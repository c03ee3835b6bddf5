"""What the agent loads: never the server, scikit-learn, nor the test material in peep.edge.testing."""

from __future__ import annotations

import subprocess
import sys

# Imports every peep.edge module except the benchmark and its test material (what
# any agent process could load) and lists what must not have come along.
CODE = """
import importlib, pkgutil, sys
import peep.edge
material = ("peep.edge.testing", "peep.edge.bench")
for m in pkgutil.walk_packages(peep.edge.__path__, "peep.edge."):
    if m.name not in material:
        importlib.import_module(m.name)
bad = [n for n in sys.modules if n in material or n.startswith("peep.server") or n.split(".")[0] == "sklearn"]
print(",".join(sorted(bad)))
"""


def test_agent_modules_load_neither_the_server_nor_the_test_material():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == ""
