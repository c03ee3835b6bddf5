"""Structured logging: one JSON object per line (journald/Loki friendly).

Use :func:`log_event` so every record carries machine-readable fields::

    log_event(log, logging.INFO, "release", track="t-1", epsilon_vector=1024.0)

Any record that shows ε carries both ``epsilon_coordinate`` and
``epsilon_vector`` (DESIGN "Privacy semantics").
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_FIELDS = "peep_fields"


class JsonFormatter(logging.Formatter):
    """``{"ts": ..., "level": ..., "logger": ..., "event": ..., <fields>}``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        fields = getattr(record, _FIELDS, None)
        if fields:
            out.update(fields)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False, allow_nan=True)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        level = record.levelname.lower()
        base = f"{self.formatTime(record)} {level:7s} {record.name}: {record.getMessage()}"
        fields = getattr(record, _FIELDS, None)
        if fields:
            base += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        if record.exc_info:
            base += "\n" + self.formatException(record.exc_info)
        return base


def log_event(logger: logging.Logger, level: int, event: str, /, **fields: Any) -> None:
    """Log ``event`` with structured ``fields``."""
    if logger.isEnabledFor(level):
        logger.log(level, event, extra={_FIELDS: fields})


def setup_logging(level: str = "info", fmt: str = "json") -> None:
    """Configure the ``peep`` loggers to write to stderr in ``fmt``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger("peep")
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    root.propagate = False
    # paho logs through its own logger only when enabled; keep library noise out.
    logging.getLogger("paho").setLevel(logging.WARNING)
