"""Errors of the edge agent; each names the config field or file at fault.

The CLI maps :class:`ConfigError` (and its subclasses) to exit code 2 and
every other :class:`EdgeError` to exit code 1.
"""

from __future__ import annotations

from collections.abc import Sequence


class EdgeError(RuntimeError):
    """A failure of the agent at run time (exit code 1)."""


class ConfigError(ValueError):
    """The configuration (or a command-line option) is invalid (exit code 2).

    Parameters
    ----------
    problems : sequence of (path, message)
        One entry per invalid field: the dotted key path (``privacy.epsilon``)
        and what was expected and received.
    """

    def __init__(self, problems: Sequence[tuple[str, str]] | str) -> None:
        if isinstance(problems, str):
            path, _, msg = problems.partition(": ")
            problems = [(path, msg)] if msg else [("", problems)]
        self.problems = list(problems)
        super().__init__("\n".join(f"{p}: {m}" if p else m for p, m in self.problems))


class MissingExtraError(ConfigError):
    """The configuration enables a feature whose optional extra is not installed."""


class SpoolFullError(EdgeError):
    """The spool is full of templates its drop policy may not drop (enrolment)."""


class CaptureError(EdgeError):
    """A frame source could not be opened or re-opened."""
