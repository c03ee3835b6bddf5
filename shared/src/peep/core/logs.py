"""Structured logs for every PEEP process: one JSON object per line on stderr.

``peep-edge`` and the ``peep`` server both log through this module, so one
query (journald, Loki, ``jq``) reads both. The schema of a JSON line:

``ts``
    Time of the record, ISO 8601 UTC with milliseconds (``2024-05-01T12:00:00.123Z``).
``level``
    ``debug``, ``info``, ``warning``, ``error`` or ``critical``.
``logger``
    The logger's name (``peep.edge.agent``, ``peep.server.app``, ...).
``event``
    What happened: the snake_case name given to :func:`log_event`
    (``release``, ``mqtt_connected``) or the message of a plain
    ``log.info("model promoted", extra={...})`` call. ``event`` rather than
    ``msg`` because most records are named events that operators filter on.
*fields*
    Every keyword of :func:`log_event` and every ``extra={...}`` key, at the
    top level. A field that would overwrite one of the schema's keys is
    written as ``field_<name>`` instead, so those keys mean the same thing on
    every line.
``exception``
    The formatted traceback, when the record carries one.

Any record that shows ε carries both ``epsilon_coordinate`` and
``epsilon_vector``. Never log template values, images or secrets.

Standard library only.

Examples
--------
>>> import json, logging
>>> record = logging.LogRecord("peep.server.app", logging.INFO, __file__, 1, "model promoted", (), None)
>>> record.version = "v000002"  # what extra={"version": ...} does
>>> doc = json.loads(JsonFormatter().format(record))
>>> sorted(doc)
['event', 'level', 'logger', 'ts', 'version']
>>> doc["event"], doc["level"], doc["version"]
('model promoted', 'info', 'v000002')
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import IO, Any

__all__ = ["JsonFormatter", "TextFormatter", "log_event", "setup_logging"]

#: The record attribute :func:`log_event` puts its fields under (a dict, so no
#: field name can collide with a ``LogRecord`` attribute).
_FIELDS = "peep_fields"
_SCHEMA = ("ts", "level", "logger", "event", "exception")
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",
    _FIELDS,
}
_LEVELS = ("debug", "info", "warning", "error", "critical")
_FORMATS = ("json", "text")


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """The record's structured fields: :func:`log_event`'s, then ``extra=`` keys."""
    out: dict[str, Any] = dict(getattr(record, _FIELDS, None) or {})
    for key, value in record.__dict__.items():
        if key not in _STANDARD and not key.startswith("_"):
            out[key] = value
    return out


class JsonFormatter(logging.Formatter):
    """One JSON object per record, in the schema of the module docstring."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        for key, value in _fields(record).items():
            out[f"field_{key}" if key in _SCHEMA else key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``<time> <level> <logger>: <event> key=value ...`` for a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        text = f"{self.formatTime(record)} {record.levelname.lower():7s} {record.name}: {record.getMessage()}"
        fields = _fields(record)
        if fields:
            text += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def log_event(logger: logging.Logger, level: int, event: str, /, **fields: Any) -> None:
    """Log the named ``event`` with structured ``fields`` (any names, JSON-able or ``str()``-able values)."""
    if logger.isEnabledFor(level):
        # stacklevel=2: the record points at the caller, not at this helper.
        logger.log(level, event, extra={_FIELDS: fields}, stacklevel=2)


def setup_logging(*, level: str = "info", fmt: str = "json", stream: IO[str] | None = None) -> None:
    """Route the ``peep`` loggers to ``stream`` (stderr) in ``fmt``.

    Keyword-only: the edge and the server once took these two strings in
    opposite orders.

    Parameters
    ----------
    level : {"debug", "info", "warning", "error", "critical"}
    fmt : {"json", "text"}
    stream : text stream, optional
        Default ``sys.stderr`` (journald under systemd).

    Raises
    ------
    ValueError
        ``level`` or ``fmt`` is not one of the listed values.
    """
    if level not in _LEVELS:
        raise ValueError(f"level: expected one of {', '.join(_LEVELS)}, received {level!r}")
    if fmt not in _FORMATS:
        raise ValueError(f"fmt: expected one of {', '.join(_FORMATS)}, received {fmt!r}")
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger("peep")
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    root.propagate = False
    # paho logs through its own logger only when enabled; keep library noise out.
    logging.getLogger("paho").setLevel(logging.WARNING)
