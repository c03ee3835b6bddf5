"""Progress displays: redrawn in place on a terminal, a few plain lines in a log file."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from peep.server.progress import Progress, progress_printer

SERVER_SRC = Path(__file__).resolve().parents[2] / "server" / "src" / "peep" / "server"


class FakeClock:
    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("seconds_per_step", "max_lines"), [(0.1, 12), (0.001, 2), (10.0, 12)])
def test_log_file_gets_plain_lines_at_milestones(seconds_per_step, max_lines):
    out = io.StringIO()
    with Progress("normalising", 1000, stream=out, clock=FakeClock(seconds_per_step)) as bar:
        for i in range(1001):
            bar(i, 1000)
    text = out.getvalue()
    lines = text.splitlines()
    assert "\r" not in text and "\x1b" not in text
    assert 2 <= len(lines) <= max_lines, lines
    assert lines[0].startswith("normalising: 0/1000 (0%)")
    assert lines[-1].startswith("normalising: 1000/1000 (100%) in ")
    assert text.endswith("\n")


def test_log_file_lines_are_at_least_the_interval_apart():
    out = io.StringIO()
    bar = Progress("jobs", 100, stream=out, clock=FakeClock(0.5), line_interval=5.0)
    for _ in range(100):
        bar.advance()
    # 50 s: start, then a 10 % step no more often than every 5 s (10 steps of 5 s), then the end.
    assert 2 < len(out.getvalue().splitlines()) <= 12


def test_a_heartbeat_keeps_a_slow_step_from_looking_stuck_in_a_log() -> None:
    # 300 s of updates a second, 3 % of the way: no 10 % milestone after the first line.
    def run(heartbeat: float | None) -> list[str]:
        out = io.StringIO()
        bar = Progress("describing", 10_000, stream=out, clock=FakeClock(1.0), heartbeat=heartbeat)
        for i in range(1, 301):
            bar(i)
        return out.getvalue().splitlines()

    assert len(run(None)) == 1
    beats = run(10.0)
    assert 29 <= len(beats) <= 31 and beats[-1].startswith("describing: 29")


def test_terminal_is_redrawn_in_place():
    term = FakeTerminal()
    callback = progress_printer("training (epochs)", stream=term)
    clock = FakeClock(0.05)
    assert isinstance(callback, Progress)
    callback._clock = clock  # 200 epochs of 50 ms: redrawn at most every 0.2 s
    for epoch in range(1, 201):
        callback(epoch, 200)
    text = term.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")  # one line, ended when done
    assert 10 < text.count("\r") <= 60
    assert "training (epochs): 1/200" in text and "200/200 (100%)" in text.rsplit("\r", 1)[1]


def test_closing_early_shows_where_it_stopped_and_ends_the_line():
    term = FakeTerminal()
    with Progress("jobs", 10, stream=term, clock=FakeClock(0.01)) as bar:
        bar.update(0)
        bar.advance(3)
    assert term.getvalue().endswith("jobs: 3/10 (30%) eta 0s\x1b[K\n")


def test_disabled_and_silenced_write_nothing(monkeypatch):
    out = io.StringIO()
    with Progress("x", 5, stream=out, enabled=False) as bar:
        bar.update(5)
    monkeypatch.setenv("PEEP_PROGRESS", "0")
    with Progress("x", 5, stream=out) as bar:
        bar.update(5)
    assert out.getvalue() == ""


def test_audit_jobs_write_no_carriage_returns_to_a_log(capsys):
    from peep.lab.audit.config import AuditConfig
    from peep.lab.audit.execution import run_jobs

    results, _ = run_jobs(AuditConfig(jobs=1), [(lambda i: (i, 0.0), (i,)) for i in range(300)], "jobs")
    assert results == list(range(300))
    err = capsys.readouterr().err
    assert "\r" not in err and 2 <= len(err.splitlines()) <= 12 and "jobs: 300/300 (100%)" in err


def test_every_progress_display_in_the_server_uses_this_helper():
    for f in SERVER_SRC.rglob("*.py"):
        if f.name == "progress.py":
            continue
        text = f.read_text()
        assert "tqdm" not in text, f
        assert 'end="\\r"' not in text and "'\\r'" not in text, f
