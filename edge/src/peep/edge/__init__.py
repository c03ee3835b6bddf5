"""PEEP edge agent: capture, detect, track, project, perturb and publish face templates.

Pixels never leave the device: the agent publishes only perturbed eigenface
templates (``peep.v1.PerturbedTemplate``) through a durable SQLite spool to
MQTT and/or gRPC. See :mod:`peep.edge.agent` for the wiring and
``deploy/edge/edge.toml`` for a commented configuration.
"""

__version__ = "0.1.0"
