"""Frame sources: classification, folders, files, reconnect with exponential backoff, frame-rate cap."""

from __future__ import annotations

import itertools
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
