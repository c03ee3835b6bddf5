"""Fixtures of the console tests (defined in ``peep_testing.console``)."""

from __future__ import annotations

from peep_testing.console import console  # noqa: F401
from peep_testing.server import pg_admin, pg_dsn  # noqa: F401
