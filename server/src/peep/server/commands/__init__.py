"""Sub-commands of ``peep``; each module exposes ``register(subparsers)``."""
