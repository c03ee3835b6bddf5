"""Errors shared by the ``peep`` commands.

Kept apart from :mod:`peep.server.cli`, which imports every command module by
name: a command importing ``cli`` back would be a cycle.
"""

from __future__ import annotations


class UsageError(Exception):
    """Bad option or configuration: the command exits with code 2 and this message."""
