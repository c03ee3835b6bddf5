"""The demo's log file: what the server and the devices log goes to ``<out>/demo.log``, not the terminal.

A demo run makes every kind of refusal on purpose (each impostor's claim, each fail-secure check, a
device's dropped connection): printed, they buried the progress lines and the summary under a hundred
warnings. The demo process and every device process append to one file (line-buffered appends of one
line each, which ``O_APPEND`` keeps whole between processes); errors still reach the terminal as well,
because an error is not expected. At the end :func:`count_log` reads the file back into the counts the
summary prints.
"""

from __future__ import annotations

import logging
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

__all__ = ["LOG_FILE", "close_logs", "count_log", "log_line", "route_logs"]

#: The log's name inside the demo's output folder.
LOG_FILE = "demo.log"

# peep.core.logs.TextFormatter: "<date> <time> <level> <logger>: <event> key=value ..."
_LINE = re.compile(r"^\S+ \S+ (?P<level>[a-z]+)\s+(?P<logger>[\w.]+): (?P<event>\S+)")
_open: list[TextIO] = []


def route_logs(path: Path, *, level: str = "warning") -> None:
    """Send this process's ``peep`` log records to ``path`` (appended), errors to stderr as well.

    Parameters
    ----------
    path : Path
        The run's ``demo.log``.
    level : str
        The lowest level written to the file.
    """
    from peep.core.logs import TextFormatter, setup_logging

    close_logs()  # a second run in one process (the tests) starts a new file handle
    fh = open(path, "a", encoding="utf-8", buffering=1)  # lives as long as the process logs
    _open.append(fh)
    setup_logging(level=level, fmt="text", stream=fh)
    errors = logging.StreamHandler(sys.stderr)
    errors.setLevel(logging.ERROR)
    errors.setFormatter(TextFormatter())
    logging.getLogger("peep").addHandler(errors)


def close_logs() -> None:
    """Close the log file :func:`route_logs` opened in this process (its handler is left writing nowhere)."""
    while _open:
        _open.pop().close()


def count_log(path: Path, *, most: int = 8) -> dict[str, Any]:
    """What ``path`` holds, counted: ``{"file", "warnings", "errors", "events": {event: n}}``.

    ``events`` lists the ``most`` most frequent events, with their loggers (``peep.edge.door: door_refused``).
    """
    levels: Counter[str] = Counter()
    events: Counter[str] = Counter()
    if path.exists():
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                m = _LINE.match(line)
                if m is None:  # a traceback's lines, under the record that carried it
                    continue
                levels[m["level"]] += 1
                events[f"{m['logger']}: {m['event']}"] += 1
    return {
        "file": str(path),
        "warnings": levels["warning"],
        "errors": levels["error"] + levels["critical"],
        "events": dict(events.most_common(most)),
    }


def log_line(counts: dict[str, Any]) -> str:
    """The summary's line about the log."""
    events = ", ".join(f"{k.split(': ', 1)[-1]} {v}" for k, v in counts["events"].items())
    return (
        f"  log                 {counts['warnings']} warnings, {counts['errors']} errors"
        + (f" ({events})" if events else "")
        + f" in {counts['file']}"
    )
