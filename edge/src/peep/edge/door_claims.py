"""Where a door's claims come from: lines of subject ids from a reader, a serial port, a FIFO or a local socket.

Every source is a stream of bytes cut into lines; each line is one claim, taken only when (its line break and
the spaces and tabs around it removed) it is a valid subject id. An over-long line (:data:`MAX_CLAIM_LINE`), one
that is not UTF-8 or one that holds a control or separator character is dropped whole, never cut or repaired
into someone's id, and logged by its length and reason, never its content. A source waiting for its next line
sees the door's stop within half a second. :func:`serve_claims` hands each claim in turn to a
:class:`~peep.edge.door_session.DoorSession`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from peep.edge.door import Outcome
from peep.edge.door_session import DoorSession
from peep.edge.logs import log_event

# The door's logger: a dropped claim line is the door's event, as a refused claim is.
_log = logging.getLogger("peep.edge.door")

#: Longest line a claim source takes, in bytes (a badge number or a subject id is far shorter): a longer line
#: is dropped whole, never cut to a claim.
MAX_CLAIM_LINE = 256


def _log_too_long(length: int) -> None:
    log_event(_log, logging.WARNING, "door_claim_malformed", length=length, reason="too long")


class ClaimLineSplitter:
    """Byte chunks in, claim lines out: a line longer than :data:`MAX_CLAIM_LINE` bytes is dropped whole.

    Whatever the source (a terminal, a serial port, a FIFO, a socket), an over-long line is never cut down to
    its first bytes — ``alice`` and 100 kB of padding is no claim for ``alice`` — and it is logged with its
    real length (never its content), however many chunks it spanned. At most :data:`MAX_CLAIM_LINE` bytes are
    held at a time.

    Examples
    --------
    >>> s = ClaimLineSplitter()
    >>> s.feed(b"alice\\nbo"), s.feed(b"b\\n" + b"x" * 300), s.feed(b"x\\ncarol\\n"), s.dropped
    ([b'alice'], [b'bob'], [b'carol'], [301])
    """

    def __init__(self) -> None:
        self._buf = b""
        self._dropping: int | None = None  # bytes so far of an over-long line being dropped
        #: The lengths of the lines dropped (the last 100).
        self.dropped: list[int] = []

    def _drop(self, length: int) -> None:
        self.dropped = [*self.dropped[-99:], length]
        _log_too_long(length)

    def feed(self, chunk: bytes) -> list[bytes]:
        """The complete lines ``chunk`` ends (without their line break)."""
        out: list[bytes] = []
        data = self._buf + chunk
        while (i := data.find(b"\n")) >= 0:
            line, data = data[:i], data[i + 1 :]
            if self._dropping is not None:
                self._drop(self._dropping + len(line))
                self._dropping = None
            elif len(line) > MAX_CLAIM_LINE:
                self._drop(len(line))
            else:
                out.append(line)
        if self._dropping is not None:
            self._dropping += len(data)
            data = b""
        elif len(data) > MAX_CLAIM_LINE:
            self._dropping, data = len(data), b""
        self._buf = data
        return out

    def end(self) -> list[bytes]:
        """The last line of a source that ended without a line break."""
        if self._dropping is not None:
            self._drop(self._dropping)
            self._dropping = None
            return []
        rest, self._buf = self._buf, b""
        return [rest] if rest else []


def read_claims(lines: Any) -> Any:
    """Subject ids from a line source (a keyboard-wedge reader, a serial port, stdin, a socket's stream).

    Each line is one claim: its line break and any ASCII spaces and tabs around it removed, checked as a
    subject id (NFC, no control or bidi characters). A line that is not valid UTF-8, or that holds any other
    control or separator character anywhere (``\\x1c``, ``\\x85``, a no-break space; an ASCII space inside an
    id is allowed), is dropped whole rather than repaired into someone's id; so is a line longer than
    :data:`MAX_CLAIM_LINE` bytes. A dropped line is logged by its length and reason, never echoed.
    """
    from peep.core.exceptions import WireError
    from peep.core.wire import check_subject_id

    for raw in lines:
        data = raw if isinstance(raw, bytes) else str(raw).encode("utf-8", "surrogatepass")
        body = data.rstrip(b"\r\n")
        if len(body) > MAX_CLAIM_LINE:
            _log_too_long(len(body))
            continue
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            log_event(_log, logging.WARNING, "door_claim_malformed", length=len(body), reason="not UTF-8")
            continue
        line = text.strip(" \t")
        if not line:
            continue
        if any(_is_control_or_separator(ch) for ch in line):
            log_event(_log, logging.WARNING, "door_claim_malformed", length=len(body), reason="control or separator")
            continue
        try:
            yield check_subject_id(line, "claim")
        except WireError:
            log_event(_log, logging.WARNING, "door_claim_malformed", length=len(line))


def _is_control_or_separator(ch: str) -> bool:
    """A control (Cc, Cf, Cs, Co, Cn) or separator (Zs, Zl, Zp) character other than the ASCII space, which a
    subject id may hold."""
    import unicodedata

    return ch != " " and unicodedata.category(ch)[0] in "CZ"


def fd_claim_lines(fd: int, *, stop: threading.Event | None = None, poll_s: float = 0.5) -> Any:
    """Claim lines read from the file descriptor ``fd`` (stdin, a serial port, a FIFO, a file) until it ends.

    The descriptor is polled, never read while empty, so a door waiting for a claim sees ``stop`` within
    ``poll_s`` (SIGTERM while nobody types: the door ends and releases its lock). Lines go through a
    :class:`ClaimLineSplitter`.
    """
    import select

    splitter = ClaimLineSplitter()
    while stop is None or not stop.is_set():
        try:
            ready, _, _ = select.select([fd], [], [], poll_s)
        except InterruptedError:  # pragma: no cover  (retried by Python since PEP 475; kept for old kernels)
            continue
        if not ready:
            continue
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            continue
        if not chunk:
            yield from splitter.end()
            return
        yield from splitter.feed(chunk)


def path_claim_lines(path: str, *, stop: threading.Event | None = None) -> Any:
    """Claim lines from a path: a serial device, a FIFO (kept open across writers) or a file (ends at its end).

    Raises
    ------
    OSError
        When ``path`` cannot be opened (before the first line is asked for: the caller names the option).
    """
    import stat

    st = os.stat(path)
    if stat.S_ISFIFO(st.st_mode):
        # Read and write: the FIFO never reaches end-of-file when an access controller closes and reopens it,
        # and opening it does not block until the first writer (which would hold up a SIGTERM).
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    elif stat.S_ISCHR(st.st_mode):
        fd = os.open(path, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
    else:
        fd = os.open(path, os.O_RDONLY)

    def lines() -> Any:
        try:
            yield from fd_claim_lines(fd, stop=stop)
        finally:
            os.close(fd)

    return lines()


def socket_claims(path: str | os.PathLike[str], *, stop: threading.Event | None = None) -> Any:
    """Lines from a local (Unix) socket at ``path``: an access controller connects and writes one claim a line.

    The socket is created owner and group only (mode 0660: give the controller's user the door's group);
    connections are served one after another; a line longer than :data:`MAX_CLAIM_LINE` bytes is dropped.
    A file already at ``path`` is refused unless it is a stale socket.
    """
    import socket
    import stat

    p = os.fspath(path)
    if os.path.lexists(p):
        if not stat.S_ISSOCK(os.lstat(p).st_mode):
            raise FileExistsError(f"--claims: {p[:200]} exists and is not a socket")
        os.unlink(p)
    # Bound under a private name and renamed once listening: a controller that sees the path can connect
    # (bound at ``p`` directly, a connect between bind and listen is refused).
    staging = os.path.join(os.path.dirname(p), f".{os.getpid()}-{threading.get_ident() % 100000}.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o117)
    try:
        server.bind(staging if len(os.fsencode(staging)) < 108 else p)
    finally:
        os.umask(old)
    try:
        server.listen(4)
        if server.getsockname() == staging:
            os.replace(staging, p)
        server.settimeout(0.5)
        while stop is None or not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                yield from _lines(conn, stop)
    finally:
        server.close()
        for leftover in (staging, p):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)


def _lines(conn: Any, stop: threading.Event | None) -> Any:
    """Lines of one connection, through a :class:`ClaimLineSplitter` (over-long lines dropped whole, logged)."""
    conn.settimeout(0.5)  # a connection left open and silent must not keep a stopping door waiting
    splitter = ClaimLineSplitter()
    while stop is None or not stop.is_set():
        try:
            chunk = conn.recv(4096)
        except TimeoutError:
            continue
        if not chunk:
            yield from splitter.end()
            return
        yield from splitter.feed(chunk)


def serve_claims(session: DoorSession, claims: Any, read_frame: Callable[[], Any],
                 on_outcome: Callable[[Outcome], None] | None = None) -> int:  # fmt: skip
    """Handle every claim of ``claims`` in turn (a claim waits for the previous one); returns how many opened.

    Ends when the source ends or the session's ``stop`` is set (the claim in progress, if any, ends locked).
    """
    opened = 0
    for subject in read_claims(claims):
        if session.stop is not None and session.stop.is_set():
            break
        outcome = session.handle(subject, read_frame)
        opened += int(outcome.opened)
        if on_outcome is not None:
            on_outcome(outcome)
    return opened
