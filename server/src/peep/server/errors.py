"""Errors shared by the ``peep`` commands, and how an error message quotes what it received.

Kept apart from :mod:`peep.server.cli`, which imports every command module by
name: a command importing ``cli`` back would be a cycle. Imports nothing of
the server, so every layer may use it.
"""

from __future__ import annotations


class UsageError(Exception):
    """Bad option or configuration: the command exits with code 2 and this message."""


def quote(value: str, limit: int = 64) -> str:
    """``repr`` of at most ``limit`` characters of ``value``, with its length when cut (error messages).

    >>> quote("abc")
    "'abc'"
    >>> quote("x" * 1000, 4)
    "'xxxx'... (1000 characters)"
    """
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"
