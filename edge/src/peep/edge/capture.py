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

Streams (rtsp://, http://, ...) are read by a thread of their own that keeps
only the newest decoded frame: OpenCV's FFmpeg backend ignores
``CAP_PROP_BUFFERSIZE``, so a pipeline slower than the camera would otherwise
be handed frames that waited in the socket's buffer, later and later.
``read()`` returns the newest frame not yet returned, stamped with the wall
time it was received; a frame older than :data:`STREAM_MAX_AGE_S` is never
returned (counted in ``dropped_stale``), nor the backlog FFmpeg buffers while
it probes a stream it has just opened. RTSP runs over TCP unless
``capture.rtsp_transport`` says ``udp``; opening gives up after
:data:`STREAM_OPEN_TIMEOUT_S` and a stream silent for
:data:`STREAM_READ_TIMEOUT_S` counts as dropped, instead of FFmpeg's 30 s.
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
RTSP_TRANSPORTS = ("tcp", "udp")
#: A stream's open (connection, RTSP handshake and FFmpeg's probe, about 2 s) must end within this: long
#: enough for a camera whose key frames are seconds apart, short enough that a hung attempt does not hold
#: the reconnects back for FFmpeg's default 30 s.
STREAM_OPEN_TIMEOUT_S = 5.0
#: A stream that delivers no frame for this long is taken as dropped and re-opened (a camera sends a frame
#: every 40-200 ms; one of 1 frame/s still passes).
STREAM_READ_TIMEOUT_S = 2.0
#: The oldest frame a stream hands out, received-to-returned (and, just after an open, by the stream's own
#: clock): a face seen a second ago may have left the door or the frame.
STREAM_MAX_AGE_S = 1.0
#: After an open, how long frames are judged by the stream's clock before the receive time alone is
#: trusted (a stream whose frames carry no usable times is handed out from then on).
_CATCH_UP_LIMIT_S = 2.0
#: OpenCV reads FFmpeg's options from this variable when it opens; opens that set it are serialised.
_FFMPEG_OPTIONS_ENV = "OPENCV_FFMPEG_CAPTURE_OPTIONS"
_ffmpeg_env_lock = threading.Lock()


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

    def due(self, slack: float = 0.0) -> bool:
        """Whether the next frame is due; ``slack`` (a fraction of the interval) lets an early one count."""
        return self.interval == 0.0 or time.monotonic() >= self._next - slack * self.interval

    def mark(self) -> None:
        if self.interval:
            now = time.monotonic()
            self._next = max(self._next + self.interval, now) if self._next else now + self.interval

    def wait(self) -> None:
        if self.interval:
            delay = self._next - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)


def open_stream(url: str, *, rtsp_transport: str = "tcp") -> Any:
    """``cv2.VideoCapture`` of a stream URL through FFmpeg, with the transport and timeouts set.

    Parameters
    ----------
    url : str
        The stream; ``rtsp_transport`` applies to rtsp:// and rtsps:// only.
    rtsp_transport : {"tcp", "udp"}
        How RTP travels: interleaved in the RTSP connection (TCP) or in UDP datagrams.

    Notes
    -----
    OpenCV takes FFmpeg's options only from ``OPENCV_FFMPEG_CAPTURE_OPTIONS`` (``key;value|...``), read as
    the capture opens: it is set for the open and put back after, under a lock. Options already in it are
    kept, the transport chosen here last so that it wins.
    """
    if rtsp_transport not in RTSP_TRANSPORTS:
        raise ValueError(f"rtsp_transport: expected 'tcp' or 'udp', received {rtsp_transport!r}")
    params = [
        cv2.CAP_PROP_OPEN_TIMEOUT_MSEC,
        int(STREAM_OPEN_TIMEOUT_S * 1000),
        cv2.CAP_PROP_READ_TIMEOUT_MSEC,
        int(STREAM_READ_TIMEOUT_S * 1000),
    ]
    if not url.lower().startswith(("rtsp://", "rtsps://")):
        return cv2.VideoCapture(url, cv2.CAP_FFMPEG, params)
    with _ffmpeg_env_lock:
        before = os.environ.get(_FFMPEG_OPTIONS_ENV)
        os.environ[_FFMPEG_OPTIONS_ENV] = "|".join(filter(None, (before, f"rtsp_transport;{rtsp_transport}")))
        try:
            return cv2.VideoCapture(url, cv2.CAP_FFMPEG, params)
        finally:
            if before is None:
                os.environ.pop(_FFMPEG_OPTIONS_ENV, None)
            else:
                os.environ[_FFMPEG_OPTIONS_ENV] = before


@dataclass(frozen=True)
class _Received:
    """A stream's newest decoded frame: when it arrived and how old it already was then (0 when unknown)."""

    image: NDArray[np.uint8]
    received: float
    behind_s: float


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
        Set to make blocking waits (backoff, pacing, a stream's wait for a frame) return.
    opener : callable(target) -> capture, optional
        Injected for tests; defaults to ``cv2.VideoCapture`` (with the requested size for cameras, with
        :func:`open_stream`'s transport and timeouts for streams).
    on_reconnect : callable(), optional
        Called for every failed attempt to re-open a live source, and once for a drop that the first
        attempt re-opened: each outage counts at least once (``peep_edge_reconnects_total{link="capture"}``).
    loop : bool
        A file only: at its end, play it again from the start, its frames' times going on from where the
        last pass ended (a steady, endless camera for soak runs; tracks never see time go backwards).
    rtsp_transport : {"tcp", "udp"}
        A stream only (rtsp:// and rtsps://): how RTP travels.
    max_age_s : float
        A stream only: frames older than this are never returned (``dropped_stale``).

    Attributes
    ----------
    dropped_stale : int
        Stream frames dropped for being older than ``max_age_s`` (a reconnect's backlog, a pipeline that
        stalled for longer than that).
    dropped_superseded : int
        Stream frames decoded but replaced by a newer one before ``read()`` asked (the pipeline is slower
        than the stream; frames skipped by ``max_fps`` are not decoded and not counted).
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
        reconnect_max_s: float = 5.0,
        reconnect_attempts: int = 0,
        stop: threading.Event | None = None,
        opener: Callable[[int | str], Any] | None = None,
        on_reconnect: Callable[[], None] | None = None,
        sleep: Callable[[float], Any] | None = None,
        loop: bool = False,
        rtsp_transport: str = "tcp",
        max_age_s: float = STREAM_MAX_AGE_S,
    ) -> None:
        if kind not in ("camera", "stream", "file"):
            raise ValueError(f"kind: expected 'camera', 'stream' or 'file', received {kind!r}")
        if rtsp_transport not in RTSP_TRANSPORTS:
            raise ValueError(f"rtsp_transport: expected 'tcp' or 'udp', received {rtsp_transport!r}")
        if not max_age_s > 0:
            raise ValueError(f"max_age_s: expected > 0, received {max_age_s!r}")
        self.target = target
        self.kind = kind
        self.live = kind != "file"
        self.description = f"{kind}:{target}"
        self._stop = stop or threading.Event()
        self._closed = threading.Event()
        self._opener = opener or self._open_cv
        self._width, self._height = width, height
        self._backoff = Backoff(reconnect_min_s, reconnect_max_s)
        self._attempts = reconnect_attempts
        self._on_reconnect = on_reconnect
        self._pacer = _Pacer(max_fps, self._stop, sleep or self._stop.wait)
        self._wait = sleep or self._pause
        self._cap: Any = None
        self._index = 0
        self._fps = 0.0
        if loop and kind != "file":
            raise ValueError(f"loop: expected a video file, received a {kind} ({target!r})")
        self._loop = loop
        self._offset_s = 0.0  # the time the earlier passes of a looped file took
        self._last_ts = 0.0
        self._pass_start = 0  # the index of this pass's first frame
        self._transport = rtsp_transport
        self.max_age_s = max_age_s
        self.dropped_stale = 0
        self.dropped_superseded = 0
        self._open_started = 0.0  # wall time the last successful open began
        self._open_ended = 0.0  # and ended
        self._dropped_at: float | None = None  # monotonic time of the drop being recovered from
        self._newest: _Received | None = None
        self._cond = threading.Condition()
        self._error: CaptureError | None = None
        self._reader: threading.Thread | None = None
        self._open(first=True)
        if kind == "stream" and self._cap is not None:
            self._reader = threading.Thread(target=self._read_stream, name="peep-capture", daemon=True)
            self._reader.start()

    def _stopping(self) -> bool:
        return self._stop.is_set() or self._closed.is_set()

    def _pause(self, delay: float) -> None:
        # The backoff's wait, ended by the stop event or by close() (the stream's thread waits here too).
        end = time.monotonic() + delay
        while not self._stopping() and (left := end - time.monotonic()) > 0:
            self._closed.wait(min(left, 0.1))

    def _open_cv(self, target: int | str) -> Any:
        if self.kind == "stream":
            return open_stream(str(target), rtsp_transport=self._transport)
        cap = cv2.VideoCapture(target)
        if self.kind == "camera" and cap.isOpened():
            if self._width:
                cap.set(cv2.CAP_PROP_FRAME_WIDTH, self._width)
            if self._height:
                cap.set(cv2.CAP_PROP_FRAME_HEIGHT, self._height)
        return cap

    def _open(self, *, first: bool = False) -> bool:
        """(Re)open; live sources retry with backoff until stop. Returns False when stopping."""
        while not self._stopping():
            if self._cap is not None:
                self._cap.release()
                self._cap = None
            started = time.time()
            cap = self._opener(self.target)
            if cap is not None and cap.isOpened():
                self._cap = cap
                self._open_started, self._open_ended = started, time.time()
                fps = float(cap.get(cv2.CAP_PROP_FPS) or 0.0)
                self._fps = fps if 0.0 < fps < 1000.0 else 0.0
                if not first and self.live:
                    if self._backoff.failures == 0 and self._on_reconnect is not None:
                        self._on_reconnect()  # a drop the first attempt recovered: still an outage
                    away = time.monotonic() - self._dropped_at if self._dropped_at is not None else 0.0
                    log_event(
                        _log,
                        logging.INFO,
                        "capture_reconnected",
                        source=self.description,
                        attempts=self._backoff.failures + 1,
                        after_s=round(away, 3),
                    )
                elif not first:
                    log_event(_log, logging.INFO, "capture_reconnected", source=self.description)
                self._dropped_at = None
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

    def _drop(self) -> None:
        log_event(_log, logging.WARNING, "capture_dropped", source=self.description)
        self._dropped_at = time.monotonic()
        if self._cap is not None:
            self._cap.release()
            self._cap = None

    def read(self) -> Frame | None:
        if self._reader is not None:
            return self._read_newest()
        while not self._stopping():
            if self._cap is None and not self._open():
                return None
            if self.live:
                if not self._cap.grab():
                    self._drop()
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

    def _read_newest(self) -> Frame | None:
        """A stream's newest frame not yet returned, waiting for one; ``None`` once stopping."""
        while not self._stopping():
            with self._cond:
                if self._error is not None:
                    raise self._error
                got = self._newest
                if got is None:
                    # Polled: the stop event is set by signal handlers that cannot notify this condition.
                    self._cond.wait(0.1)
                    continue
                self._newest = None
            if time.time() - got.received + got.behind_s > self.max_age_s:
                with self._cond:
                    self.dropped_stale += 1
                continue
            frame = Frame(image=got.image, timestamp=got.received, index=self._index)
            self._index += 1
            return frame
        return None

    def _read_stream(self) -> None:
        """The stream's reader thread: every frame grabbed, the due ones decoded, only the newest kept."""
        try:
            while not self._stopping():
                if self._cap is None and not self._open():
                    break
                self._follow()
        except CaptureError as exc:
            with self._cond:
                self._error = exc
        except Exception as exc:
            # A reader that died silently would leave read() waiting for ever: its error goes to read().
            with self._cond:
                self._error = CaptureError(f"capture.source: reading {self.description} failed: {exc!r}")
            _log.exception("capture reader failed")
        finally:
            if self._cap is not None:
                self._cap.release()
                self._cap = None

    def _follow(self) -> None:
        """Read the open stream until it drops or stopping.

        Just after an open, FFmpeg hands over the frames it buffered while probing the stream (about 2 s of
        them, decoded in a burst). Their receive time says nothing of their age, so until the first frame
        that is recent by the stream's own clock (or :data:`_CATCH_UP_LIMIT_S`), a frame's age is taken as the
        wall time since the open began less the stream time it carries: an upper bound on its true age (the
        stream's first frame was made after the open began), high by the RTSP handshake. "Recent" is half of
        ``max_age_s``: the backlog drains in milliseconds, so waiting for a fresher frame than the limit costs
        nothing, and half leaves room for a slow handshake before the time limit has to end the wait.
        """
        catching_up = True
        grabbed = 0
        while not self._stopping():
            t0 = time.monotonic()
            ok = self._cap.grab()
            # A grab that lasted the read timeout met a silent stream. OpenCV still answers True for the frames
            # its threaded decoder held back (one per extra thread), so waiting for a False would take two or
            # three timeouts; the first grab of a connection may wait for a key frame and is spared.
            timed_out = grabbed > 0 and time.monotonic() - t0 >= 0.9 * STREAM_READ_TIMEOUT_S
            if not ok or timed_out:
                self._drop()
                with self._cond:
                    self._newest = None  # a frame from before the drop never leaves after it
                return
            grabbed += 1
            received = time.time()
            behind = 0.0
            if catching_up:
                position = float(self._cap.get(cv2.CAP_PROP_POS_MSEC) or 0.0) / 1e3
                behind = max(0.0, received - self._open_started - position)
                if behind <= self.max_age_s / 2 or received - self._open_ended > _CATCH_UP_LIMIT_S:
                    catching_up = False
                else:
                    with self._cond:
                        self.dropped_stale += 1
                    continue
            # A quarter interval early still counts: with a cap at the stream's own rate, jitter would
            # otherwise skip every other frame.
            if not self._pacer.due(slack=0.25):
                continue
            ok, image = self._cap.retrieve()
            if not ok or image is None:
                continue
            self._pacer.mark()
            with self._cond:
                if self._newest is not None:
                    self.dropped_superseded += 1
                self._newest = _Received(image=image, received=received, behind_s=behind)
                self._cond.notify()

    def close(self) -> None:
        self._closed.set()
        if self._reader is not None:
            # The thread may sit in a read or an open: bounded by their timeouts, then it releases the capture.
            self._reader.join(timeout=STREAM_OPEN_TIMEOUT_S + 1.0)
            if not self._reader.is_alive():
                self._reader = None
            return
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
    reconnect_max_s: float = 5.0,
    reconnect_attempts: int = 0,
    stop: threading.Event | None = None,
    on_reconnect: Callable[[], None] | None = None,
    loop: bool = False,
    rtsp_transport: str = "tcp",
) -> FrameSource:
    """Open the source named by ``capture.source`` (see :func:`classify_source`).

    ``loop``: a file plays on; ``rtsp_transport``: ``"tcp"`` or ``"udp"`` for an rtsp:// stream.
    """
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
        rtsp_transport=rtsp_transport,
    )
