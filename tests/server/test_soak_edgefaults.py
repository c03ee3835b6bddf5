"""The soak's camera-machine faults: a size-limited state folder filled and freed, a wall clock stepped.

Real parts: a tmpfs (root and ``mount``), the edge's real spool and ledger on it, libfaketime on real child
processes. Each test skips, saying why, only where its tool is absent.
"""

from __future__ import annotations

import itertools
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from peep.lab.bench.soak import edgefaults
from peep.lab.bench.soak.edgefaults import LimitedFolder, SteppedClock, _mounted_at, find_libfaketime
from peep.lab.processes.control import PartUnavailable

pytestmark = pytest.mark.processes

PEEP_EDGE = str(Path(sys.executable).parent / "peep-edge")


def _limited(folder: Path, size_mb: int = 4) -> LimitedFolder:
    try:
        return LimitedFolder(folder, size_mb=size_mb).mount()
    except PartUnavailable as exc:
        pytest.skip(f"no size-limited folder here: {exc}")


def _clock(tmp_path: Path) -> SteppedClock:
    try:
        return SteppedClock(tmp_path / "clocks", name="cam-t")
    except PartUnavailable as exc:
        pytest.skip(f"no stepped clock here: {exc}")


# --------------------------------------------------------------------------- LimitedFolder


def test_a_limited_folder_fills_to_enospc_keeps_the_edge_state_and_frees(tmp_path):
    from peep.edge.ledger import SqliteLedger
    from peep.edge.spool import Spool, is_disk_full

    disk = _limited(tmp_path / "state")
    try:
        assert _mounted_at(disk.folder)
        assert 3 * 2**20 < disk.free_bytes() <= 4 * 2**20
        spool = Spool(disk.folder / "spool.sqlite3", destinations=["grpc"])
        ledger = SqliteLedger(disk.folder / "ledger.sqlite3")
        spool.put(message_id="m0", purpose="identify", payload=b"x" * 600)
        taken = disk.fill()
        assert taken > 2 * 2**20 and disk.free_bytes() == 0
        with pytest.raises(sqlite3.OperationalError) as err:
            spool.put(message_id="m1", purpose="identify", payload=b"x" * 600)
        assert is_disk_full(err.value)
        assert [it.message_id for it in spool.peek("grpc", 10)] == ["m0"], "the spool keeps what it held"
        disk.free()
        assert disk.free_bytes() > 3 * 2**20
        spool.put(message_id="m2", purpose="identify", payload=b"x" * 600)
        assert spool.depth() == 2
        spool.close()
        ledger.close()
    finally:
        disk.close()
    assert not _mounted_at(tmp_path / "state")


def test_a_limited_folder_held_open_by_a_process_is_unmounted_lazily(tmp_path):
    disk = _limited(tmp_path / "state", size_mb=1)
    f = open(disk.folder / "held", "wb")  # a camera still running with its files open
    try:
        disk.close()
        assert not disk.mounted and not _mounted_at(disk.folder)
    finally:
        f.close()


def test_fill_refuses_a_folder_it_did_not_mount(tmp_path):
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("LimitedFolder needs root and mount to exist at all")
    disk = LimitedFolder(tmp_path / "state", size_mb=1)  # not mounted: filling would fill the machine's disk
    with pytest.raises(RuntimeError, match="not mounted"):
        disk.fill()


def test_a_limited_folder_without_root_is_unavailable_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(PartUnavailable, match="needs root"):
        LimitedFolder(tmp_path / "state")


def test_a_limited_folder_without_mount_is_unavailable_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(PartUnavailable, match="mount and umount"):
        LimitedFolder(tmp_path / "state")


# --------------------------------------------------------------------------- SteppedClock

_TICKER = """
import sys, time
for _ in range(int(sys.argv[1])):
    print(repr(time.time()), repr(time.monotonic()), flush=True)
    time.sleep(0.2)
"""


def test_a_step_moves_a_child_s_wall_clock_and_not_its_monotonic_clock(tmp_path):
    clock = _clock(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", _TICKER, "30"], env={**os.environ, **clock.env()},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        time.sleep(1.5)
        clock.step(600)
        time.sleep(1.5)
        clock.reset()
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err[-500:]  # time.sleep works under it (the shim, where needed)
    rows = [tuple(map(float, line.split())) for line in out.splitlines()]
    assert len(rows) == 30
    walls = [w - m for w, m in rows]  # the wall clock's lead over the monotonic one, per line
    jumps = [b - a for a, b in itertools.pairwise(walls)]
    assert sum(1 for j in jumps if 590 < j < 610) == 1, jumps
    assert sum(1 for j in jumps if -610 < j < -590) == 1, jumps
    assert all(abs(j) < 1 or 590 < abs(j) < 610 for j in jumps)
    monos = [m for _, m in rows]
    gaps = [b - a for a, b in itertools.pairwise(monos)]
    assert all(0.15 < g < 2.0 for g in gaps), "the monotonic clock goes on at its own pace"


def test_the_edge_runs_under_a_stepped_clock(tmp_path):
    clock = _clock(tmp_path)
    clock.step(600)
    # The edge's heavy imports (OpenCV, onnxruntime, gRPC) load under the preload, and its CLI starts.
    code = "import cv2, onnxruntime, grpc, time; import peep.edge.agent; print(repr(time.time()))"
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, **clock.env()}, capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr[-800:]
    assert 590 < float(r.stdout.split()[-1]) - time.time() < 610
    r = subprocess.run([PEEP_EDGE, "--help"], env={**os.environ, **clock.env()}, capture_output=True, text=True,
                       timeout=60)  # fmt: skip
    assert r.returncode == 0 and "peep-edge" in r.stdout, r.stderr[-800:]
    clock.close()


def test_step_is_bounded_and_not_cumulative(tmp_path):
    clock = _clock(tmp_path)
    clock.step(600)
    clock.step(600)
    assert clock.file.read_text().strip() == "+600"
    clock.step(-30)
    assert clock.file.read_text().strip() == "-30"
    with pytest.raises(ValueError, match="within ten years"):
        clock.step(float("nan"))
    clock.reset()
    assert clock.file.read_text().strip() == "+0"


def test_without_libfaketime_the_clock_is_unavailable_with_the_install_hint(tmp_path, monkeypatch):
    monkeypatch.delenv("PEEP_LIBFAKETIME", raising=False)
    monkeypatch.setattr(edgefaults, "LIBFAKETIME_GLOBS", (str(tmp_path / "nowhere" / "libfaketime.so.1"),))
    with pytest.raises(PartUnavailable, match="apt-get install libfaketime"):
        SteppedClock(tmp_path / "clocks")


def test_libfaketime_is_found_where_debian_puts_it():
    try:
        lib = find_libfaketime()
    except PartUnavailable as exc:
        pytest.skip(str(exc))
    assert lib.name == "libfaketime.so.1" and lib.is_file()
