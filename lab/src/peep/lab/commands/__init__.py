"""The lab's ``peep`` commands: each module has ``register(subparsers)``, named in ``lab/pyproject.toml``'s
``peep.commands`` entry points (:mod:`peep.server.cli` loads them)."""
