"""What the door's tests share: a lock that records what it was told, and a bounded frame reader."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class RecordingLock:
    """A lock that records each command: ``open`` when energised, ``lock`` when released or closed."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def energise(self) -> None:
        self.events.append("open")

    def release(self) -> None:
        self.events.append("lock")

    def close(self) -> None:
        self.events.append("lock")


def frames(path: str, limit: int = 60) -> Callable[[], Any]:
    """A ``read()`` over the video at ``path`` that ends after ``limit`` frames."""
    from peep.edge.capture import VideoSource

    src = VideoSource(path, kind="file")
    n = {"i": 0}

    def read() -> Any:
        n["i"] += 1
        return src.read() if n["i"] <= limit else None

    return read
