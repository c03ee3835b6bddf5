"""A cuttable network path (:class:`TcpProxy`): a thread-based TCP proxy on 127.0.0.1 whose
:meth:`~TcpProxy.cut` drops every connection and refuses new ones until :meth:`~TcpProxy.heal`.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
import time
from typing import Self

log = logging.getLogger(__name__)


class _Connection:
    """One proxied connection: its two sockets, its two pumps, how many pumps have ended."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client, self.upstream = client, upstream
        self.pumps: list[threading.Thread] = []
        self.ended = 0
        self.dropped = False  # by cut() or close(): end with a reset, never a half-close


_LINGER_0 = struct.pack("ii", 1, 0)  # struct linger {on, 0 s}: close() sends RST


def _abort(s: socket.socket) -> None:
    """Close ``s`` with a reset, so its peer's next read or write fails instead of seeing a clean end."""
    with contextlib.suppress(OSError):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_0)
    s.close()


class TcpProxy:
    """A TCP proxy on 127.0.0.1 to ``target``: two threads per connection pump the bytes both ways.

    :meth:`cut` resets every open connection (each side sees its connection fail,
    as after a network fault, rather than end cleanly) and stops listening, so a
    new connect is refused, until :meth:`heal` listens again on the same port. A
    connection's threads end with it; :meth:`close` ends them all.

    Parameters
    ----------
    listen_port : int
        The port to listen on (0: a free one; :attr:`port` says which).
    target : (host, port)
        Where each connection goes.
    max_connections : int
        Connections open at once; more are reset as they arrive (counted in ``refused``).
    connect_timeout : float
        Seconds to connect to ``target``; a connection that cannot is reset.

    Examples
    --------
    >>> with TcpProxy(0, ("127.0.0.1", broker.dev_port)) as path:  # doctest: +SKIP
    ...     camera.connect("localhost", path.port); path.cut(); path.heal()
    """

    def __init__(self, listen_port: int, target: tuple[str, int], *, max_connections: int = 256,
                 connect_timeout: float = 5.0) -> None:  # fmt: skip
        if max_connections < 1:
            raise ValueError(f"max_connections: expected at least 1, received {max_connections}")
        self.target = target
        self.max_connections = max_connections
        self.connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._conns: set[_Connection] = set()
        self._closed = False
        self.is_cut = False
        self.accepted = self.refused = self.cuts = 0
        self.bytes_in = self.bytes_out = 0  # towards the target, back from it
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self.port = listen_port
        self._listen()

    # ------------------------------------------------------------ listening

    def _listen(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # heal binds the port again past TIME_WAIT
        try:
            s.bind(("127.0.0.1", self.port))
        except OSError as exc:
            s.close()
            raise RuntimeError(f"proxy to {self.target}: cannot listen on 127.0.0.1:{self.port} ({exc})") from exc
        s.listen(64)
        s.settimeout(0.2)  # the acceptor looks at least this often whether it should stop
        self.port = int(s.getsockname()[1])
        self._listener = s
        self._acceptor = threading.Thread(target=self._accept, args=(s,), name=f"proxy-{self.port}", daemon=True)
        self._acceptor.start()

    def _unlisten(self) -> None:
        s, t = self._listener, self._acceptor
        self._listener = self._acceptor = None
        if s is not None:
            s.close()
        if t is not None:
            t.join(5)

    def _accept(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed by cut() or close()
            self._open(client)

    def _open(self, client: socket.socket) -> None:
        with self._lock:
            full = len(self._conns) >= self.max_connections
        upstream = None
        if not full:
            try:
                upstream = socket.create_connection(self.target, timeout=self.connect_timeout)
            except OSError:
                upstream = None
        with self._lock:
            if upstream is None or self.is_cut or self._closed:  # full, target down, or cut meanwhile
                self.refused += 1
                _abort(client)
                if upstream is not None:
                    _abort(upstream)
                return
            client.settimeout(None)
            upstream.settimeout(None)
            conn = _Connection(client, upstream)
            name = f"proxy-{self.port}-{self.accepted}"
            conn.pumps = [
                threading.Thread(target=self._pump, args=(conn, client, upstream, "bytes_in"), name=f"{name}-in",
                                 daemon=True),
                threading.Thread(target=self._pump, args=(conn, upstream, client, "bytes_out"), name=f"{name}-out",
                                 daemon=True),
            ]  # fmt: skip
            self._conns.add(conn)
            self.accepted += 1
            for t in conn.pumps:  # started under the lock: cut() may join them as soon as they are listed
                t.start()

    def _pump(self, conn: _Connection, src: socket.socket, dst: socket.socket, counter: str) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
                with self._lock:
                    setattr(self, counter, getattr(self, counter) + len(data))
            if not conn.dropped:
                # The sender finished: pass its half-close on; the other direction may still have bytes to carry.
                dst.shutdown(socket.SHUT_WR)
        except OSError:
            # One side failed: the connection is over both ways (wake the other pump, in recv or sendall).
            conn.dropped = True
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
        finally:
            with self._lock:
                conn.ended += 1
                last = conn.ended == len(conn.pumps)
                if last:
                    self._conns.discard(conn)
            if last:
                for s in (conn.client, conn.upstream):
                    if conn.dropped:
                        _abort(s)
                    else:
                        s.close()

    # ------------------------------------------------------------ faults

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._conns)

    def cut(self, timeout: float = 5.0) -> None:
        """Reset every open connection and refuse new ones until :meth:`heal`; waits (``timeout`` s at most)
        for their threads to end."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"the proxy on port {self.port} is closed")
            self.is_cut = True
            self.cuts += 1
        self._unlisten()
        self._drop_all(timeout)

    def heal(self) -> None:
        """Listen again on the same port (nothing happens when it is not cut)."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"the proxy on port {self.port} is closed")
            if not self.is_cut:
                return
        self._listen()  # still cut if the port was taken meanwhile (it raises)
        with self._lock:
            self.is_cut = False

    def _drop_all(self, timeout: float) -> None:
        with self._lock:
            conns = list(self._conns)
        # SHUT_RD wakes a pump from recv without sending a FIN, so the peers see only the reset the last pump's
        # close sends; a pump blocked in sendall (its reader stalled) needs SHUT_RDWR, FIN first.
        deadline = time.monotonic() + timeout
        for how, wait in ((socket.SHUT_RD, min(0.5, timeout)), (socket.SHUT_RDWR, timeout)):
            for conn in conns:
                conn.dropped = True
                if any(t.is_alive() for t in conn.pumps):
                    for s in (conn.client, conn.upstream):
                        with contextlib.suppress(OSError):
                            s.shutdown(how)
            until = min(deadline, time.monotonic() + wait)
            for conn in conns:
                for t in conn.pumps:
                    t.join(max(0.0, until - time.monotonic()))

    def close(self, timeout: float = 5.0) -> None:
        """Stop listening and reset every connection; the proxy cannot be used again."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._unlisten()
        self._drop_all(timeout)

    def stats(self) -> dict[str, int | bool]:
        """Connections accepted, refused and open, cuts so far, bytes each way, and whether it is cut now."""
        with self._lock:
            return {
                "accepted": self.accepted,
                "refused": self.refused,
                "open": len(self._conns),
                "cuts": self.cuts,
                "cut": self.is_cut,
                "bytes_in": self.bytes_in,
                "bytes_out": self.bytes_out,
            }

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
