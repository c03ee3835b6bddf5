"""Structured logging of the agent: :mod:`peep.core.logs`, the one schema edge and server share.

Kept so ``from peep.edge.logs import log_event`` keeps working; use it so every
record carries machine-readable fields::

    log_event(log, logging.INFO, "release", track="t-1", epsilon_vector=1024.0)
"""

from __future__ import annotations

from peep.core.logs import JsonFormatter, TextFormatter, log_event, setup_logging

__all__ = ["JsonFormatter", "TextFormatter", "log_event", "setup_logging"]
