"""An RTSP server for the edge's stream tests: live H.264 whose every frame carries the time it was made.

Run with Debian's Python (``/usr/bin/python3``: GStreamer's bindings come from the packages
``python3-gi`` and ``gir1.2-gst-rtsp-server-1.0``, not from the venv)::

    /usr/bin/python3 tests/edge/rtsp_server.py --port 8554 [--fps 15] [--gop 15]

serves ``rtsp://127.0.0.1:<port>/stream`` and prints ``READY <port>`` once it listens; SIGTERM or SIGINT
ends it. ``--probe`` only checks that the bindings and the elements load (exit 0) or says which package
is missing (exit 1).

Why frames are pushed through an ``appsrc`` with a binary code painted in: a test measures how old a frame
is when the edge processes it, so each frame must say when it was sent, readably after lossy compression.
``timeoverlay`` draws digits a test would have to OCR; ``cairooverlay`` needs pycairo besides. Here each
frame is drawn by this script just before it is pushed: a 8×6 grid of 40-pixel blocks, black or white, one
bit each: the wall time in milliseconds modulo 2**40 (40 bits, 34 years before it wraps) and an 8-bit
check. Blocks of 40×40 pixels at full contrast survive H.264 at any bitrate (only the block's centre is
read), and the check refuses a frame caught between two codes. The picture is built from bytes (no
numpy: Debian's Python need not have it), luma only, chroma at mid-grey: I420 that ``x264enc`` takes as it
is. The encoder runs ``tune=zerolatency`` with no B-frames, so the measured age includes the encoder's
latency as a camera's would, and a key frame every ``--gop`` frames (1 s by default) so a client that
reconnects decodes within a second.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time

WIDTH, HEIGHT = 320, 240
BLOCK = 40
COLS, ROWS = WIDTH // BLOCK, HEIGHT // BLOCK  # 8 × 6 = 48 bits
TIME_BITS = 40
# Video-range luma: what survives the colour conversions untouched.
BLACK, WHITE = 16, 235
PATH = "/stream"
ELEMENTS = {
    "appsrc": "gstreamer1.0-plugins-base",
    "x264enc": "gstreamer1.0-plugins-ugly",
    "rtph264pay": "gstreamer1.0-plugins-good",
}


def check_byte(ms: int) -> int:
    """The 8-bit check of a 40-bit time code (also computed by the tests' reader)."""
    return (sum((ms >> (8 * i)) & 0xFF for i in range(5)) ^ 0xA5) & 0xFF


def frame_bytes(ms: int) -> bytes:
    """One I420 frame whose blocks, row by row, hold ``ms`` (40 bits, most significant first) and its check."""
    code = ((ms % (1 << TIME_BITS)) << 8) | check_byte(ms % (1 << TIME_BITS))
    bits = [(code >> (COLS * ROWS - 1 - i)) & 1 for i in range(COLS * ROWS)]
    white, black = bytes([WHITE]) * BLOCK, bytes([BLACK]) * BLOCK
    luma = b"".join(b"".join(white if bits[r * COLS + c] else black for c in range(COLS)) * BLOCK for r in range(ROWS))
    return luma + bytes([128]) * (WIDTH * HEIGHT // 2)


def load() -> tuple[object, object, object]:
    """Gst, GstRtspServer and GLib, or SystemExit naming the missing package."""
    try:
        import gi

        gi.require_version("Gst", "1.0")
        gi.require_version("GstRtspServer", "1.0")
        from gi.repository import GLib, Gst, GstRtspServer
    except (ImportError, ValueError) as exc:
        raise SystemExit(
            f"GStreamer's RTSP server bindings: {exc} (apt-get install python3-gi gir1.2-gst-rtsp-server-1.0)"
        ) from None
    Gst.init(None)
    missing = [pkg for name, pkg in ELEMENTS.items() if Gst.ElementFactory.find(name) is None]
    if missing:
        raise SystemExit(f"GStreamer elements missing (apt-get install {' '.join(sorted(set(missing)))})")
    return Gst, GstRtspServer, GLib


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8554)
    ap.add_argument("--fps", type=int, default=15)
    ap.add_argument("--gop", type=int, default=0, help="frames between key frames (default: one second's)")
    ap.add_argument("--probe", action="store_true", help="check the bindings and elements, then exit")
    args = ap.parse_args()
    Gst, GstRtspServer, GLib = load()
    if args.probe:
        return 0
    gop = args.gop or args.fps
    caps = f"video/x-raw,format=I420,width={WIDTH},height={HEIGHT},framerate={args.fps}/1"
    launch = (
        f"( appsrc name=src is-live=true format=time do-timestamp=true caps={caps} "
        f"! x264enc tune=zerolatency speed-preset=ultrafast bframes=0 key-int-max={gop} threads=1 "
        "! rtph264pay name=pay0 pt=96 config-interval=-1 )"
    )
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(launch)
    factory.set_shared(True)  # one encoder for every client, as a camera has
    sources: list[object] = []
    lock = threading.Lock()

    def configure(_factory: object, media: object) -> None:
        with lock:
            sources[:] = [media.get_element().get_child_by_name("src")]

    factory.connect("media-configure", configure)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(args.port))
    server.get_mount_points().add_factory(PATH, factory)
    if server.attach(None) == 0:
        print(f"cannot listen on port {args.port}", file=sys.stderr, flush=True)
        return 1
    loop = GLib.MainLoop()
    stop = threading.Event()

    def push() -> None:
        # Frames at the stream's rate of wall time, each drawn with the time it is pushed.
        interval = 1.0 / args.fps
        due = time.monotonic()
        while not stop.is_set():
            due += interval
            with lock:
                src = sources[0] if sources else None
            if src is not None:
                data = frame_bytes(int(time.time() * 1000))
                src.emit("push-buffer", Gst.Buffer.new_wrapped(data))
            delay = due - time.monotonic()
            if delay > 0:
                stop.wait(delay)
            else:
                due = time.monotonic()  # late (a busy machine): go on from now, not in a burst

    def quit_(*_: object) -> None:
        stop.set()
        loop.quit()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, quit_)
    threading.Thread(target=push, daemon=True).start()
    # GLib's loop returns to Python now and then, so the signal handlers above run.
    GLib.timeout_add(200, lambda: True)
    print(f"READY {args.port}", flush=True)
    loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
