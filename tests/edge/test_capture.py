"""Frame sources: classification, folders, files, reconnect with exponential backoff, frame-rate cap."""

from __future__ import annotations

import itertools
import logging
import threading
import time

import cv2
import numpy as np
import pytest
from peep.edge.capture import FolderSource, VideoSource, classify_source, open_source
from peep.edge.errors import CaptureError, ConfigError


def test_classify_source(tmp_path, crowd_video):
    assert classify_source(0) == ("camera", 0)
    assert classify_source("2") == ("camera", 2)
    assert classify_source("rtsp://cam.local/stream1") == ("stream", "rtsp://cam.local/stream1")
    assert classify_source("http://10.0.0.5/video.mjpg")[0] == "stream"
    assert classify_source(str(tmp_path)) == ("folder", str(tmp_path))
    assert classify_source(crowd_video["path"]) == ("file", crowd_video["path"])
    with pytest.raises(ConfigError, match=r"capture.source: expected a camera index.*no such file"):
        classify_source(str(tmp_path / "missing.mp4"))


def test_video_file_has_media_timestamps_and_ends(crowd_video):
    src = open_source(crowd_video["path"])
    frames = []
    while (f := src.read()) is not None:
        frames.append(f)
    assert len(frames) == crowd_video["n_frames"]
    assert frames[0].image.shape == (480, 640, 3)
    assert frames[10].timestamp == pytest.approx(1.0)  # 10 fps: media time, not wall time
    assert not src.live


def test_folder_source_reads_images_in_order_and_skips_unreadable(tmp_path, people):
    imgs = people[sorted(people)[0]][:3]
    for i, p in enumerate(imgs):
        (tmp_path / f"{i:02d}.jpg").write_bytes(p.read_bytes())
    (tmp_path / "03.jpg").write_bytes(b"not a jpeg")
    src = FolderSource(tmp_path, fps=2.0)
    out = []
    while (f := src.read()) is not None:
        out.append(f)
    assert [f.index for f in out] == [0, 1, 2]
    assert [f.timestamp for f in out] == [0.0, 0.5, 1.0]
    with pytest.raises(ConfigError, match="capture.source: expected image files"):
        FolderSource(tmp_path / "03.jpg")


class FakeCapture:
    """A camera that delivers ``frames`` frames, then drops (grab fails)."""

    def __init__(self, frames: int, opened: bool = True) -> None:
        self.frames, self.opened = frames, opened

    def isOpened(self):
        return self.opened

    def get(self, prop):
        return 25.0 if prop == cv2.CAP_PROP_FPS else 0.0

    def grab(self):
        self.frames -= 1
        return self.frames >= 0

    def retrieve(self):
        return True, np.zeros((48, 64, 3), np.uint8)

    def release(self):
        self.opened = False


def test_live_source_reconnects_with_exponential_backoff():
    # open ok (2 frames) -> drop -> 3 failed opens -> ok (1 frame) -> drop -> stop
    plan = [FakeCapture(2), FakeCapture(0, False), FakeCapture(0, False), FakeCapture(0, False), FakeCapture(1)]
    stop = threading.Event()
    delays: list[float] = []
    reconnects = []

    def opener(target):
        if plan:
            return plan.pop(0)
        stop.set()
        return FakeCapture(0, False)

    src = VideoSource(
        0,
        kind="camera",
        stop=stop,
        opener=opener,
        reconnect_min_s=0.5,
        reconnect_max_s=1.5,
        sleep=delays.append,
        on_reconnect=lambda: reconnects.append(1),
    )
    got = []
    while (f := src.read()) is not None:
        got.append(f)
    assert len(got) == 3
    # Backoff doubles from reconnect_min_s, capped at reconnect_max_s; success resets it.
    assert delays == [0.5, 1.0, 1.5, 0.5]
    assert len(reconnects) == len(delays)


def test_live_source_gives_up_after_the_configured_attempts():
    with pytest.raises(CaptureError, match="after 3 attempts"):
        VideoSource(
            "rtsp://nowhere/stream",
            kind="stream",
            opener=lambda t: FakeCapture(0, False),
            reconnect_attempts=3,
            sleep=lambda s: None,
        )


def test_frame_rate_cap_paces_a_file(crowd_video):
    src = open_source(crowd_video["path"], max_fps=20.0)
    t0 = time.monotonic()
    for _ in range(11):
        assert src.read() is not None
    assert time.monotonic() - t0 >= 0.45  # 10 intervals of 50 ms


def test_a_looped_file_plays_on_with_its_times_going_on(crowd_video):
    n = crowd_video["n_frames"]
    src = open_source(crowd_video["path"], loop=True)
    frames = [src.read() for _ in range(2 * n + 3)]
    src.close()
    assert all(f is not None for f in frames)  # past the file's end: a second and a third pass
    ts = [f.timestamp for f in frames]
    assert all(b > a for a, b in itertools.pairwise(ts))  # never backwards across a pass
    assert [f.index for f in frames] == list(range(2 * n + 3))
    step = ts[1] - ts[0]
    assert ts[n] - ts[n - 1] == pytest.approx(step, rel=1e-6)  # the pass joins at one frame's interval


def test_loop_is_refused_for_what_has_no_end(tmp_path):
    with pytest.raises(ValueError, match="loop: expected a video file"):
        VideoSource(0, kind="camera", loop=True, opener=lambda t: None)
    with pytest.raises(ValueError, match="capture.loop: expected a video file"):
        open_source(str(tmp_path), loop=True)  # a folder of images
    from peep.edge.config import CaptureConfig

    with pytest.raises(ValueError, match="capture.loop: expected a video file"):
        CaptureConfig(source="rtsp://cam/1", loop=True)
    assert CaptureConfig(source="/videos/lobby.mp4", loop=True).loop


class FakeStream:
    """A stream of ``fps`` frames a second of wall time; each frame's pixels hold its number.

    ``frames``: it drops (grab fails) after that many. ``backlog``: the first frames are there at once, as
    FFmpeg hands over what it buffered while probing a stream it opened.
    """

    def __init__(self, fps: float = 50.0, frames: int | None = None, backlog: int = 0) -> None:
        self.fps, self.frames, self.backlog = fps, frames, backlog
        self.n, self.opened, self.t0 = 0, True, time.monotonic()

    def isOpened(self):
        return self.opened

    def get(self, prop):
        if prop == cv2.CAP_PROP_FPS:
            return self.fps
        return (self.n - 1) / self.fps * 1000.0 if prop == cv2.CAP_PROP_POS_MSEC else 0.0

    def grab(self):
        if not self.opened or (self.frames is not None and self.n >= self.frames):
            return False
        delay = self.t0 + (self.n - self.backlog) / self.fps - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        self.n += 1
        return True

    def retrieve(self):
        return True, np.full((8, 8, 3), (self.n - 1) % 256, np.uint8)

    def release(self):
        self.opened = False


def test_a_stream_hands_a_slow_reader_the_newest_frame():
    src = VideoSource("rtsp://cam/1", kind="stream", opener=lambda t: FakeStream(fps=50.0))
    try:
        got = []
        for _ in range(8):
            f = src.read()
            got.append((int(f.image[0, 0, 0]), time.time() - f.timestamp))
            time.sleep(0.06)  # three frames' time
    finally:
        src.close()
    numbers = [n for n, _ in got]
    assert all(b - a >= 2 for a, b in itertools.pairwise(numbers))  # the frames in between were skipped
    assert all(age < 0.05 for _, age in got)  # and the one handed over had just arrived
    assert src.dropped_superseded >= 2 * (len(got) - 1)


def test_a_stream_drops_the_backlog_of_its_open():
    # The open takes 0.6 s (FFmpeg's probe), and the 30 frames that arrived meanwhile come at once after it.
    def opener(target):
        time.sleep(0.6)
        return FakeStream(fps=50.0, backlog=30)

    src = VideoSource("rtsp://cam/1", kind="stream", opener=opener, max_age_s=0.5)
    try:
        first = src.read()
    finally:
        src.close()
    # Until a frame is at most half of max_age_s old by the stream's clock: 0.6 s - n/50 <= 0.25.
    assert int(first.image[0, 0, 0]) >= 17
    assert src.dropped_stale >= 17


def test_a_dropped_stream_reconnects_counted_and_logged(caplog):
    plan = [FakeStream(frames=3), FakeStream()]
    reconnects = []
    caplog.set_level(logging.INFO, logger="peep.edge.capture")
    src = VideoSource(
        "rtsp://cam/1",
        kind="stream",
        opener=lambda t: plan.pop(0),
        on_reconnect=lambda: reconnects.append(1),
    )
    try:
        got = [src.read() for _ in range(6)]
    finally:
        src.close()
    assert all(f is not None for f in got)
    assert len(reconnects) == 1  # re-opened at the first attempt: the outage still counts
    events = [r.getMessage() for r in caplog.records]
    assert "capture_dropped" in events and "capture_reconnected" in events


def test_a_stream_that_stays_away_raises_in_read_and_stop_ends_the_wait():
    plan = [FakeStream(frames=2)]
    src = VideoSource(
        "rtsp://cam/1",
        kind="stream",
        opener=lambda t: plan.pop(0) if plan else FakeCapture(0, False),
        reconnect_attempts=2,
        sleep=lambda s: None,
    )
    with pytest.raises(CaptureError, match="after 2 attempts"):
        for _ in range(10):
            src.read()
    src.close()

    stop = threading.Event()
    src = VideoSource("rtsp://cam/1", kind="stream", stop=stop, opener=lambda t: FakeStream(fps=0.5))
    src.read()  # the first frame at once, the next one 2 s later
    threading.Timer(0.2, stop.set).start()
    t0 = time.monotonic()
    assert src.read() is None
    assert time.monotonic() - t0 < 1.0
    src.close()


def test_rtsp_transport_is_checked():
    with pytest.raises(ValueError, match="rtsp_transport: expected 'tcp' or 'udp'"):
        VideoSource("rtsp://cam/1", kind="stream", opener=lambda t: FakeStream(), rtsp_transport="http")
    from peep.edge.config import CaptureConfig

    assert CaptureConfig(source="rtsp://cam/1").rtsp_transport == "tcp"
    assert CaptureConfig(source="rtsp://cam/1").reconnect_max_s == 5.0
