"""A full state disk: the device stops releasing (nothing charged that is not queued) and resumes with space.

The state folder is a small tmpfs (root and ``mount`` needed; skipped otherwise) filled to ENOSPC by a filler
file, with the real pipeline, ledger and spool on it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from peep.core.accounting import Spend
from peep.edge.agent import Agent
from peep.edge.capture import VideoSource
from peep.edge.config import load_config
from peep.edge.ledger import SqliteLedger
from peep.edge.spool import Spool, disk_room, is_disk_full


def _mount_tmpfs(folder: Path, size: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a size-limited state folder needs root and mount (tmpfs)")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                       capture_output=True, text=True, timeout=20)  # fmt: skip
    if r.returncode != 0:
        pytest.skip(f"mount -t tmpfs refused here: {r.stderr.strip()}")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs at ``tmp_path/state`` (the edge config's default state folder)."""
    state = tmp_path / "state"
    _mount_tmpfs(state, "4m")
    try:
        yield state
    finally:
        subprocess.run(["umount", "-l", str(state)], capture_output=True, timeout=20)


def fill(folder: Path) -> Path:
    """Write a filler file in ``folder`` until its filesystem refuses more (ENOSPC)."""
    filler = folder / "filler"
    with open(filler, "wb") as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 65536)
                f.flush()
    return filler


def _spend(i: int) -> Spend:
    return Spend(key=f"track:r-{i}", epsilon=1.0, delta=0.0, time=time.time(), note="", epsilon_coordinate=0.1,
                 purpose="identify", message_id=f"m{i}")  # fmt: skip


def test_sqlite_on_a_full_disk_says_so_records_nothing_and_works_again_when_freed(small_disk):
    ledger = SqliteLedger(small_disk / "ledger.sqlite3")
    spool = Spool(small_disk / "spool.sqlite3", destinations=["grpc"])
    ledger.append(_spend(0))
    spool.put(message_id="m0", purpose="identify", payload=b"x" * 600)
    filler = fill(small_disk)
    assert not disk_room([small_disk / "ledger.sqlite3"])
    # SQLite rolls the transaction back itself: the error says the disk is full (not "no transaction is active").
    with pytest.raises(sqlite3.OperationalError, match="full") as err:
        ledger.append(_spend(1))
    assert is_disk_full(err.value)
    assert ledger.lifetime()[2] == 1
    with pytest.raises(sqlite3.OperationalError, match="full"):
        spool.ack("grpc", ["m0"])  # a delete is a write too
    assert spool.depth() == 1
    filler.unlink()
    assert disk_room([small_disk / "ledger.sqlite3"])
    ledger.append(_spend(2))
    assert spool.ack("grpc", ["m0"]) == 1
    assert [e.message_id for e in ledger.entries()] == ["m0", "m2"]
    ledger.close()
    spool.close()


def _ledgered(agent: Agent) -> list[str]:
    assert agent.ledger is not None
    return [e.message_id for e in agent.ledger.entries() if e.key.startswith("track:")]


def _queued(agent: Agent) -> set[str]:
    assert agent.spool is not None
    return {it.message_id for it in agent.spool.peek("mqtt", 10_000)}


@pytest.fixture
def agent_on_small_disk(make_config, small_disk) -> Iterator[Agent]:
    privacy = {"epsilon": 4.0, "track_budget": 1e6, "releases_per_window": 1, "window_seconds": 2.0,
               "min_track_frames": 3}  # fmt: skip
    agent = Agent(load_config(make_config(privacy=privacy)), environ={})
    assert agent.cfg.device.state_dir == small_disk
    yield agent
    agent.shutdown(drain_timeout=0)


@pytest.mark.slow
def test_a_full_disk_stops_releases_uncharged_and_they_resume_when_freed(agent_on_small_disk, crowd_video,
                                                                          small_disk):  # fmt: skip
    agent = agent_on_small_disk
    pipeline = agent.open()
    src = VideoSource(crowd_video["path"], kind="file")
    frames = []
    while (frame := src.read()) is not None:
        frames.append(frame)
    src.close()
    third = len(frames) // 3
    for frame in frames[:third]:
        pipeline.process(frame)
    before = _ledgered(agent)
    assert before, "the video's first third releases something"
    assert set(before) == _queued(agent)

    filler = fill(small_disk)
    for frame in frames[third : 2 * third]:
        pipeline.process(frame)  # no exception: the device keeps running
    assert _ledgered(agent) == before, "nothing is charged while the disk is full"
    assert _queued(agent) == set(before)
    assert pipeline.policy.suppressed.get("disk_full", 0) > 0

    filler.unlink()
    for frame in frames[2 * third :]:
        pipeline.process(frame)
    after = _ledgered(agent)
    assert len(after) > len(before), "releases resume once space returns"
    assert set(after) == _queued(agent), "every charged release is queued"


@pytest.mark.slow
def test_a_charged_template_the_spool_refused_is_queued_before_anything_else(agent_on_small_disk, crowd_video,
                                                                            monkeypatch):  # fmt: skip
    # The disk fills between the charge and the queueing (room() said yes just before): the template is
    # charged, so it is held and queued first, and nothing more is released until it is.
    agent = agent_on_small_disk
    pipeline = agent.open()
    assert agent.spool is not None
    real_put = agent.spool.put
    refusing = {"on": True}

    def put(**kw):
        if refusing["on"]:
            raise sqlite3.OperationalError("database or disk is full")
        return real_put(**kw)

    monkeypatch.setattr(agent.spool, "put", put)
    src = VideoSource(crowd_video["path"], kind="file")
    n = 0
    while (frame := src.read()) is not None and not pipeline.unspooled:
        pipeline.process(frame)
        n += 1
    assert pipeline.unspooled, "a release was due within the video"
    held = [m for m, _, _ in pipeline.unspooled]
    assert _ledgered(agent) == held
    for _ in range(20):  # still refused: held, and no further charge
        frame = src.read()
        assert frame is not None
        pipeline.process(frame)
    assert _ledgered(agent) == held and [m for m, _, _ in pipeline.unspooled] == held
    refusing["on"] = False
    while (frame := src.read()) is not None:
        pipeline.process(frame)
    src.close()
    assert not pipeline.unspooled
    assert set(_ledgered(agent)) == _queued(agent)
    assert set(held) <= _queued(agent)
