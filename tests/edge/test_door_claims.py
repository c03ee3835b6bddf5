"""A door's claim lines as they arrive from a reader: stripped, checked and dropped whole when malformed."""

from __future__ import annotations

import threading
import time

import pytest


def _wait_for(pred, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def test_an_over_long_line_from_any_iterable_is_dropped_not_cut():
    from peep.edge.door_claims import read_claims

    assert list(read_claims(["Kofi_Annan" + " " * 102_400 + "tail", "bob"])) == ["bob"]


@pytest.mark.parametrize(
    "line",
    [
        b"Kofi_Annan\xff\n",  # not UTF-8: once read with replacement it was a claim for "Kofi_Annan\ufffd"
        b"\xc3(alice\n",
        b"\x1calice\n",  # controls and separators at a line's ends were stripped into "alice"
        "alice\x85\n".encode(),
        "\u00a0alice\n".encode(),
        "ali\u2028ce\n".encode(),
        b"alice\x00\n",
    ],
)
def test_a_claim_line_that_is_not_utf8_or_holds_a_control_or_separator_is_dropped_whole(line, caplog):
    from peep.edge.door_claims import read_claims

    with caplog.at_level("WARNING", logger="peep.edge"):
        assert list(read_claims([line, b"bob\n", " carol \t\r\n", "Kofi Annan\n"])) == ["bob", "carol", "Kofi Annan"]
    dropped = [rec for rec in caplog.records if rec.getMessage() == "door_claim_malformed"]
    assert len(dropped) == 1
    assert "alice" not in caplog.text and "Kofi" not in dropped[0].getMessage()


def test_a_fifo_stays_open_across_writers_and_a_stop_ends_the_wait(tmp_path):
    """An access controller may close and reopen the FIFO between claims; a stop ends the wait within the poll."""
    import os

    from peep.edge.door_claims import path_claim_lines, read_claims

    fifo = tmp_path / "claims.fifo"
    os.mkfifo(fifo)
    stop = threading.Event()
    got: list[str] = []
    ended = threading.Event()

    def read() -> None:
        got.extend(read_claims(path_claim_lines(str(fifo), stop=stop)))
        ended.set()

    threading.Thread(target=read, daemon=True).start()
    for line in (b"alice\n", b"bob\n"):  # two writers, one after the other
        with open(fifo, "wb") as w:
            w.write(line)
        time.sleep(0.2)
    assert _wait_for(lambda: got == ["alice", "bob"], 5) and not ended.is_set()  # no end of file between writers
    t0 = time.monotonic()
    stop.set()
    assert ended.wait(3) and time.monotonic() - t0 < 1.5
