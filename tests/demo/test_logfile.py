"""The demo's log: per-claim and per-connection lines go to <out>/demo.log, counted; errors reach the terminal."""

from __future__ import annotations

import logging
import multiprocessing
from pathlib import Path

import pytest
from peep.core.logs import log_event
from peep.lab.demo.logfile import close_logs, count_log, log_line, route_logs


@pytest.fixture(autouse=True)
def _restore_peep_logger():
    logger = logging.getLogger("peep")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    close_logs()
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


def _child(path: str) -> None:
    route_logs(Path(path))
    for i in range(50):
        log_event(logging.getLogger("peep.edge.door"), logging.WARNING, "door_refused", reason="rejected", n=i)


def test_warnings_go_to_the_file_and_not_the_terminal_errors_to_both(tmp_path: Path, capfd):
    path = tmp_path / "demo.log"
    route_logs(path)
    log_event(logging.getLogger("peep.edge.door"), logging.WARNING, "door_refused", reason="rejected")
    log_event(logging.getLogger("peep.server.transport"), logging.WARNING, "mqtt_disconnected", rc=7)
    log_event(logging.getLogger("peep.server.ingest"), logging.ERROR, "store_failed", table="events")
    logging.getLogger("peep.edge.door").info("not written: below warning")
    out, err = capfd.readouterr()
    assert "door_refused" not in out + err and "mqtt_disconnected" not in out + err
    assert "store_failed" in err
    text = path.read_text()
    assert "door_refused reason=rejected" in text and "mqtt_disconnected rc=7" in text and "store_failed" in text
    assert "not written" not in text
    counts = count_log(path)
    assert counts["warnings"] == 2 and counts["errors"] == 1
    assert counts["events"] == {
        "peep.edge.door: door_refused": 1,
        "peep.server.transport: mqtt_disconnected": 1,
        "peep.server.ingest: store_failed": 1,
    }
    line = log_line(counts)
    assert "2 warnings, 1 errors" in line and str(path) in line


def test_device_processes_append_whole_lines_to_the_same_file(tmp_path: Path):
    path = tmp_path / "demo.log"
    route_logs(path)
    log_event(logging.getLogger("peep.lab.demo"), logging.WARNING, "parent_line")
    ctx = multiprocessing.get_context("spawn")  # as the demo starts its devices
    procs = [ctx.Process(target=_child, args=(str(path),)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    lines = path.read_text().splitlines()
    assert len(lines) == 151
    counts = count_log(path)
    assert counts["warnings"] == 151 and counts["events"]["peep.edge.door: door_refused"] == 150


def test_a_missing_log_counts_nothing(tmp_path: Path):
    assert count_log(tmp_path / "absent.log") == {
        "file": str(tmp_path / "absent.log"), "warnings": 0, "errors": 0, "events": {}
    }  # fmt: skip
