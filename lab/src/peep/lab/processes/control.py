"""Starting, waiting for and stopping real processes, and reading them: the lab's and the tests' one way.

:class:`PartUnavailable` (a tool this machine lacks, named), :func:`wait_for`, :func:`stop_process` (a signal,
then SIGKILL after a timeout), :func:`port_open`, :func:`running`, :func:`process_cpu_s`, :class:`ProcessStats`
(memory, open files, threads and CPU of a process from ``/proc``), and :func:`unit_environment` (the
``Environment=`` of a shipped systemd unit, so that a process runs as a deployment runs it).
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["process_cpu_s", "stop_process", "wait_for"]


log = logging.getLogger(__name__)


class PartUnavailable(RuntimeError):
    """A part cannot run on this machine: a tool is missing or cannot be used (the message names which)."""


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.2) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def checkout_file(*parts: str) -> Path:
    """A file of the checkout this lab runs from (``deploy/...``): the shipped configurations it starts."""
    # control.py sits at <checkout>/lab/src/peep/lab/processes/.
    return Path(__file__).resolve().parents[5].joinpath(*parts)


def unit_environment(unit: str, systemd: Path | None = None) -> dict[str, str]:
    """The ``Environment=`` a shipped systemd unit (``deploy/systemd/<unit>``) gives its process.

    The soak runs each process as a deployment does: the allocator's arenas and the maths libraries' threads
    set as the unit sets them (a process run without ``MALLOC_ARENA_MAX`` grows in ways a deployed one does
    not, and the other way round).

    Raises
    ------
    PartUnavailable
        The unit is not in the checkout, or an assignment is not ``KEY=VALUE``.
    """
    path = (systemd or checkout_file("deploy", "systemd")) / unit
    if not path.is_file():
        raise PartUnavailable(f"{path} not found (the soak runs its processes as deploy/systemd's units do)")
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line.startswith("Environment="):
            continue
        for word in shlex.split(line[len("Environment=") :]):
            key, eq, value = word.partition("=")
            if not eq or not key.isidentifier():
                raise PartUnavailable(f"{path}: Environment= expected KEY=VALUE, received {word[:80]!r}")
            env[key] = value
    return env


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


class ProcessStats:
    """Readings of a process from Linux ``/proc`` (no dependency): memory, open files, threads, CPU time."""

    _TICK = os.sysconf("SC_CLK_TCK")

    @classmethod
    def sample(cls, pid: int) -> dict[str, float] | None:
        """``{rss_mb, fds, threads, cpu_s}`` of process ``pid``, or None when it is gone or a zombie.

        ``rss_mb``: resident memory in MiB; ``fds``: open file descriptors;
        ``threads``: its threads; ``cpu_s``: user + system CPU seconds since it
        started (its own, not its children's). A process that ends between the
        reads also gives None. Reading another user's descriptors needs that
        user or root (PermissionError otherwise).
        """
        base = Path(f"/proc/{pid}")
        try:
            status = (base / "status").read_text()
            fields = (base / "stat").read_text().rsplit(")", 1)[1].split()
            fds = len(os.listdir(base / "fd"))
        except (FileNotFoundError, ProcessLookupError):
            return None
        # fields[0] is the state (the third field of stat); a zombie has no memory, files or threads left.
        if fields[0] in ("Z", "X"):
            return None
        values: dict[str, int] = {}
        for line in status.splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "Threads"):
                values[key] = int(rest.split()[0])
        if "VmRSS" not in values:  # a kernel thread, or the process ended while being read
            return None
        return {
            "rss_mb": round(values["VmRSS"] / 1024, 3),
            "fds": fds,
            "threads": values.get("Threads", 0),
            "cpu_s": (int(fields[11]) + int(fields[12])) / cls._TICK,
        }


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
