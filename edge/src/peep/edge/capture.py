"""Frame sources: camera index, video file, RTSP/HTTP stream, folder of images.

All implement :class:`FrameSource`: ``read()`` returns the next
:class:`Frame` or ``None`` at the end of a finite source (file, folder).
Live sources (camera, stream) never end: when the device or the stream
drops, they re-open with exponential backoff (``reconnect_min_s`` doubling up
to ``reconnect_max_s``), counting ``peep_edge_reconnects_total{link="capture"}``,
until the stop event is set (or ``reconnect_attempts`` is exhausted:
:class:`~peep.edge.errors.CaptureError`, exit 1, systemd restarts).

Timestamps are the source's own clock in seconds: wall time for live
sources, media time (frame index / fps) for files and folders, so the
release policy's windows mean the same thing when a recorded video is
processed faster than real time.

The frame-rate cap: live sources ``grab()`` every frame (so the driver's
buffer never goes stale) but decode only when the next frame is due; files
and folders are paced to ``max_fps`` when it is set.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import cv2
import numpy as np
from numpy.typing import NDArray
from peep.edge.errors import CaptureError, ConfigError
from peep.edge.logs import log_event

_log = logging.getLogger("peep.edge.capture")

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".pgm", ".bmp", ".ppm", ".webp")
STREAM_SCHEMES = ("rtsp://", "rtsps://", "http://", "https://", "rtmp://", "udp://", "tcp://")


@dataclass(frozen=True)
class Frame:
    """One decoded frame: BGR (or gray) pixels that never leave the device."""

    image: NDArray[np.uint8]
    timestamp: float
    index: int


class FrameSource(Protocol):
    """Where frames come from (camera, file, stream, folder, test fakes)."""

    live: bool
    description: str

    def read(self) -> Frame | None:
        """The next frame, or ``None`` when a finite source is exhausted (or stopping)."""
        ...

    def close(self) -> None: ...


class Backoff:
    """Exponential backoff ``min_s, 2·min_s, ...`` capped at ``max_s``; :meth:`reset` on success."""

    def __init__(self, min_s: float, max_s: float) -> None:
        self.min_s = min_s
        self.max_s = max(max_s, min_s)
        self.failures = 0

    def next_delay(self) -> float:
        delay = min(self.max_s, self.min_s * (2.0 ** min(self.failures, 30)))
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0


class _Pacer:
    """Sleeps so that frames are returned at most ``max_fps`` per second of wall time."""

    def __init__(self, max_fps: float, stop: threading.Event, sleep: Callable[[float], Any]) -> None:
        self.interval = 1.0 / max_fps if max_fps > 0 else 0.0
        self._next = 0.0
        self._stop = stop
        self._sleep = sleep

    def due(self) -> bool:
        return self.interval == 0.0 or time.monotonic() >= self._next

    def mark(self) -> None:
        if self.interval:
            now = time.monotonic()
            self._next = max(self._next + self.interval, now) if self._next else now + self.interval

    def wait(self) -> None:
        if self.interval:
            delay = self._next - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)


def classify_source(source: int | str) -> tuple[str, int | str]:
    """``("camera", 0)``, ``("stream", url)``, ``("file", path)`` or ``("folder", path)``.

    Raises
    ------
    ConfigError
        naming ``capture.source`` when a path does not exist.
    """
    if isinstance(source, int):
        return "camera", source
    s = source.strip()
    if s.isdigit():
        return "camera", int(s)
    if s.lower().startswith(STREAM_SCHEMES):
        return "stream", s
    p = Path(s).expanduser()
    if p.is_dir():
        return "folder", str(p)
    if p.is_file():
        return "file", str(p)
    if s.startswith("/dev/video"):
        return "camera", s
    raise ConfigError(
        "capture.source: expected a camera index, an existing video file or image folder, or an "
        f"rtsp/http URL, received {source!r} (no such file or directory)"
    )


class VideoSource:
    """Camera, stream or video file through ``cv2.VideoCapture``.

    Parameters
    ----------
    target : int or str
        Camera index/device, URL or file path.
    kind : {"camera", "stream", "file"}
    max_fps : float
        0 = no cap.
    stop : threading.Event
        Set to make blocking waits (backoff, pacing) return.
    opener : callable(target) -> capture, optional
        Injected for tests; defaults to ``cv2.VideoCapture`` (with the requested size for cameras).
    loop : bool
        A file only: at its end, play it again from the start, its frames' times going on from where the
        last pass ended (a steady, endless camera for soak runs; tracks never see time go backwards).
    """

    def __init__(
        self,
        target: int | str,
        *,
        kind: str,
        max_fps: float = 0.0,
        width: int | None = None,
        height: int | None = None,
        reconnect_min_s: float = 1.0,
        reconnect_max_s: float = 60.0,
        reconnect_attempts: int = 0,
        stop: threading.Event | None = None,
        opener: Callable[[int | str], Any] | None = None,
        on_reconnect: Callable[[], None] | None = None,
        sleep: Callable[[float], Any] | None = None,
        loop: bool = False,
    ) -> None:
        if kind not in ("camera", "stream", "file"):
            raise ValueError(f"kind: expected 'camera', 'stream' or 'file', received {kind!r}")
        self.target = target
        self.kind = kind
        self.live = kind != "file"
        self.description = f"{kind}:{target}"
        self._stop = stop or threading.Event()
        self._opener = opener or self._open_cv
        self._width, self._height = width, height
        self._backoff = Backoff(reconnect_min_s, reconnect_max_s)
        self._attempts = reconnect_attempts
        self._on_reconnect = on_reconnect
        self._pacer = _Pacer(max_fps, self._stop, sleep or self._stop.wait)
        self._wait = sleep or self._stop.wait
        self._cap: Any = None
        self._index = 0
        self._fps = 0.0
        if loop and kind != "file":
            raise ValueError(f"loop: expected a video file, received a {kind} ({target!r})")
        self._loop = loop
        self._offset_s = 0.0  # the time the earlier passes of a looped file took
        self._last_ts = 0.0
        self._pass_start = 0  # the index of this pass's first frame
        self._open(first=True)

    def _open_cv(self, target: int | str) -> Any:
        cap = cv2.VideoCapture(target)
        if self.kind == "camera" and cap.isOpened():
            if self._width:
                cap.set(cv2.CAP_PROP_FRAME_WIDTH, self._width)
            if self._height:
                cap.set(cv2.CAP_PROP_FRAME_HEIGHT, self._height)
        return cap

    def _open(self, *, first: bool = False) -> bool:
        """(Re)open; live sources retry with backoff until stop. Returns False when stopping."""
        while not self._stop.is_set():
            if self._cap is not None:
                self._cap.release()
                self._cap = None
            cap = self._opener(self.target)
            if cap is not None and cap.isOpened():
                self._cap = cap
                fps = float(cap.get(cv2.CAP_PROP_FPS) or 0.0)
                self._fps = fps if 0.0 < fps < 1000.0 else 0.0
                if not first:
                    log_event(_log, logging.INFO, "capture_reconnected", source=self.description)
                self._backoff.reset()
                return True
            if cap is not None:
                cap.release()
            if not self.live:
                raise CaptureError(f"capture.source: OpenCV could not open the video file {self.target!r}")
            if self._attempts and self._backoff.failures >= self._attempts:
                raise CaptureError(
                    f"capture.source: could not open {self.description} after {self._backoff.failures} attempts"
                )
            delay = self._backoff.next_delay()
            log_event(
                _log,
                logging.WARNING,
                "capture_unavailable",
                source=self.description,
                retry_in_s=delay,
            )
            if self._on_reconnect is not None:
                self._on_reconnect()
            self._wait(delay)
        return False

    def read(self) -> Frame | None:
        while not self._stop.is_set():
            if self._cap is None and not self._open():
                return None
            if self.live:
                if not self._cap.grab():
                    log_event(_log, logging.WARNING, "capture_dropped", source=self.description)
                    self._cap.release()
                    self._cap = None
                    continue
                if not self._pacer.due():
                    continue
                ok, image = self._cap.retrieve()
                if not ok or image is None:
                    self._cap.release()
                    self._cap = None
                    continue
                self._pacer.mark()
                ts = time.time()
            else:
                self._pacer.wait()
                ok, image = self._cap.read()
                if not ok or image is None:
                    if not self._loop or self._index == 0:
                        return None
                    self._offset_s = self._last_ts + (1.0 / self._fps if self._fps else 0.1)
                    self._pass_start = self._index
                    if not self._open():
                        return None
                    continue
                self._pacer.mark()
                in_pass = self._index - self._pass_start
                position = in_pass / self._fps if self._fps else float(self._cap.get(cv2.CAP_PROP_POS_MSEC)) / 1e3
                ts = self._offset_s + position
                self._last_ts = ts
            frame = Frame(image=image, timestamp=ts, index=self._index)
            self._index += 1
            return frame
        return None

    def close(self) -> None:
        if self._cap is not None:
            self._cap.release()
            self._cap = None


class FolderSource:
    """Images of a folder in name order, one frame each (timestamps ``index / fps``).

    Parameters
    ----------
    folder : str or Path
    fps : float
        Nominal rate for timestamps (and the pacing cap when ``pace``).
    """

    def __init__(
        self,
        folder: str | Path,
        *,
        fps: float = 1.0,
        pace: bool = False,
        stop: threading.Event | None = None,
    ) -> None:
        self.folder = Path(folder)
        self.live = False
        self.description = f"folder:{self.folder}"
        self.files = sorted(p for p in self.folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        if not self.files:
            raise ConfigError(
                f"capture.source: expected image files ({', '.join(IMAGE_SUFFIXES)}) in {self.folder}, found none"
            )
        self._fps = fps if fps > 0 else 1.0
        self._stop = stop or threading.Event()
        self._pacer = _Pacer(fps if pace else 0.0, self._stop, self._stop.wait)
        self._index = 0
        self._pos = 0

    def read(self) -> Frame | None:
        while self._pos < len(self.files) and not self._stop.is_set():
            path = self.files[self._pos]
            self._pos += 1
            image = cv2.imread(os.fspath(path), cv2.IMREAD_COLOR)
            if image is None:
                log_event(_log, logging.WARNING, "capture_unreadable_image", path=str(path))
                continue
            self._pacer.wait()
            self._pacer.mark()
            frame = Frame(
                image=np.asarray(image, dtype=np.uint8),
                timestamp=self._index / self._fps,
                index=self._index,
            )
            self._index += 1
            return frame
        return None

    def close(self) -> None:
        self._pos = len(self.files)


def open_source(
    source: int | str,
    *,
    max_fps: float = 0.0,
    width: int | None = None,
    height: int | None = None,
    reconnect_min_s: float = 1.0,
    reconnect_max_s: float = 60.0,
    reconnect_attempts: int = 0,
    stop: threading.Event | None = None,
    on_reconnect: Callable[[], None] | None = None,
    loop: bool = False,
) -> FrameSource:
    """Open the source named by ``capture.source`` (see :func:`classify_source`); ``loop``: a file plays on."""
    kind, target = classify_source(source)
    if loop and kind != "file":
        raise ValueError(f"capture.loop: expected a video file as capture.source, received a {kind} ({source!r})")
    if kind == "folder":
        return FolderSource(str(target), fps=max_fps or 1.0, pace=max_fps > 0, stop=stop)
    return VideoSource(
        target,
        kind="camera" if kind == "camera" else kind,
        max_fps=max_fps,
        width=width,
        height=height,
        reconnect_min_s=reconnect_min_s,
        reconnect_max_s=reconnect_max_s,
        reconnect_attempts=reconnect_attempts,
        stop=stop,
        on_reconnect=on_reconnect,
        loop=loop,
    )
