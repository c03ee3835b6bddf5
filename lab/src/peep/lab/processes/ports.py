"""Ports for the processes the benches, the soak and the tests start: chosen so no other process takes them
first, and a check that a process itself listens on one."""

from __future__ import annotations

import collections
import os
import random
import socket
from pathlib import Path

__all__ = ["free_port", "listens_on"]

_PORTS_FLOOR = 20000
_PORT_SLOTS = 16
_handed_out: collections.deque[int] = collections.deque(maxlen=256)


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing holds now, for a process about to listen on it.

    A port the kernel hands out for ``bind(0)`` comes from the ephemeral range, the one every
    outgoing connection's source port is drawn from: between choosing it and a broker or
    balancer binding it, a client elsewhere may take it (seen in CI under four test workers).
    So the port is drawn below that range, from a slot of its own per test worker
    (``PYTEST_XDIST_WORKER``), never twice in a row from one process, and checked by binding it.
    """
    top = _ephemeral_floor()
    if top - _PORTS_FLOOR < 2 * _PORT_SLOTS:
        return _kernel_port()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    slot = int(worker[2:]) if worker[:2] == "gw" and worker[2:].isdigit() else os.getpid()
    width = (top - _PORTS_FLOOR) // _PORT_SLOTS
    low = _PORTS_FLOOR + (slot % _PORT_SLOTS) * width
    rng = random.Random()
    for _ in range(64):
        port = rng.randrange(low, low + width)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.append(port)
        return port
    return _kernel_port()


def listens_on(pid: int, port: int) -> bool:
    """Whether process ``pid`` itself holds a TCP socket listening on ``port`` (Linux ``/proc``).

    A connection that succeeds says only that *someone* listens: a process that lost the
    port to another and is about to exit would pass that check.
    """
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    if not inodes:
        return False
    fds = Path(f"/proc/{pid}/fd")
    try:
        for fd in fds.iterdir():
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                return True
    except OSError:
        return False
    return False


def _kernel_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
