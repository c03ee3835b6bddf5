"""Fixtures of the console tests (in console_fixtures.py, importable by name: the suite uses importlib mode)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from console_fixtures import console  # noqa: F401
from peep_server_testlib import pg_admin, pg_dsn  # noqa: F401
