"""Waiting on a condition and stopping a child process: what every harness of the bench (cluster, soak) does."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["process_cpu_s", "stop_process", "wait_for"]


def wait_for(pred: Callable[[], bool], timeout: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return bool(pred())


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used (Linux ``/proc``; its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop_process(proc: subprocess.Popen[Any] | None, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
    """Send ``sig`` to a running ``proc`` and wait ``timeout`` s for it; SIGKILL after that."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
