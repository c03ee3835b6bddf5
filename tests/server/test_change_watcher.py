"""The replicas' change watcher outlives the database: a failed check is logged and the thread goes on.

It once logged the failure with a field named like a LogRecord's own attribute; ``logging`` raised KeyError
and the thread ended, so after its first PostgreSQL restart a replica never again learnt of a promoted
model or an erasure (the soak found it: one replica served the old model after a mid-run training).
"""

from __future__ import annotations

import ast
import logging
import threading
import time
from pathlib import Path

import pytest
from peep.server.recognition.watch import ChangeWatcher

ROOT = Path(__file__).resolve().parents[2]


class _Conn:
    """A listening connection whose notifications never come (the fallback checks then run)."""

    def execute(self, _sql: str) -> None:
        return None

    def notifies(self, timeout: float, stop_after: int):
        time.sleep(timeout)
        return iter(())

    def close(self) -> None:
        return None


def test_a_check_that_fails_is_logged_and_the_watcher_keeps_checking(caplog):
    calls = []
    done = threading.Event()

    def check() -> None:
        calls.append(time.monotonic())
        if len(calls) >= 4:
            done.set()
        raise RuntimeError("terminating connection due to administrator command")

    watcher = ChangeWatcher(_Conn, {"peep_models": lambda _p: None}, on_check=check, interval=0.05,
                            name="peep-models-test")  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="peep.server.recognition.watch"):
        watcher.start()
        try:
            assert done.wait(10), f"the watcher stopped checking after {len(calls)} checks"
            assert watcher._thread.is_alive()
        finally:
            watcher.stop()
    failed = [r for r in caplog.records if r.getMessage() == "periodic check failed"]
    assert failed and failed[0].watcher == "peep-models-test"  # type: ignore[attr-defined]


@pytest.mark.slow
def test_no_log_call_names_a_field_like_a_log_records_own_attribute():
    """``extra={"thread": ...}`` (or name, module, message, ...) raises KeyError where it is logged."""
    reserved = set(vars(logging.LogRecord("n", 0, "p", 0, "m", None, None))) | {"message", "asctime"}
    bad = []
    for src in ("shared/src", "edge/src", "server/src"):
        for path in (ROOT / src).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.keyword) and node.arg == "extra" and isinstance(node.value, ast.Dict):
                    for key in node.value.keys:
                        if isinstance(key, ast.Constant) and key.value in reserved:
                            bad.append(f"{path.relative_to(ROOT)}:{node.value.lineno} {key.value!r}")
    assert not bad, bad
