"""Keeping slow clients from locking operators out of the console's HTTPS listener.

uvicorn has no deadline for a request's head: its keep-alive timer starts only after a response and any
byte received cancels it, and its ``limit_concurrency`` counts every open connection, so connections that
finish TLS and then send nothing (or a byte now and then) make every other request answer 503 for as long
as they stay open. Here each connection gets ``console.header_timeout_s`` to deliver a whole request (head
and body: the console takes small forms only) after its TLS handshake or after its previous response; once a
request has arrived the connection belongs to its handler, so a Live event stream runs as long as it likes.
The number of connections is bounded per client address and in all (``console.max_connections_per_address``,
``console.max_connections``).

A TLS listener would hand a connection to its protocol only once the handshake is done, so connections that
never finish it would be neither counted nor timed (asyncio gives them 60 s). The listener therefore accepts
plain TCP: the guard admits each connection at accept, gives it ``console.tls_handshake_timeout_s`` for the
handshake, which :class:`GuardedH11Protocol` then runs itself (:meth:`asyncio.loop.start_tls`), and counts it
until it closes.

Everything here runs on the listener's event loop, so the bookkeeping needs no lock.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

#: Why connections were closed, the keys of :attr:`ConnectionGuard.closed`.
REASONS = ("handshake_timeout", "header_timeout", "evicted", "refused")


class ConnectionGuard:
    """The open connections of one listener: who is waiting for a request, and the limits.

    Parameters
    ----------
    header_timeout_s : float
        A connection must deliver a whole request within this many seconds of its TLS handshake or of its
        previous response.
    handshake_timeout_s : float
        A connection must complete its TLS handshake within this many seconds of being accepted.
    max_connections : int
        Open connections in all.
    max_connections_per_address : int
        Open connections per client address.
    on_close : callable, optional
        Called with the reason (one of :data:`REASONS`) of every connection the guard closes (metrics).

    Attributes
    ----------
    closed : collections.Counter
        Connections closed by the guard, by reason (:data:`REASONS`).
    """

    def __init__(
        self,
        *,
        header_timeout_s: float,
        handshake_timeout_s: float,
        max_connections: int,
        max_connections_per_address: int,
        on_close: Callable[[str], None] | None = None,
    ) -> None:
        self.header_timeout_s = header_timeout_s
        self.handshake_timeout_s = handshake_timeout_s
        self.max_connections = max_connections
        self.max_connections_per_address = max_connections_per_address
        self.closed: collections.Counter[str] = collections.Counter({reason: 0 for reason in REASONS})
        self._on_close = on_close
        self._per_address: dict[str, int] = {}
        self._open: set[GuardedH11Protocol] = set()
        # Insertion order is the order in which connections began to wait: the first is the longest waiting.
        self._waiting: dict[GuardedH11Protocol, None] = {}
        self._waiting_per_address: dict[str, dict[GuardedH11Protocol, None]] = {}

    @property
    def open(self) -> int:
        """Connections admitted and not yet closed."""
        return len(self._open)

    @property
    def waiting(self) -> int:
        """Open connections waiting for a request (or still in their TLS handshake)."""
        return len(self._waiting)

    def admit(self, conn: GuardedH11Protocol) -> bool:
        """Make room for a new connection; False when it must be refused.

        An operator behind the same NAT or proxy address as an attacker must still get in, so a new
        connection closes the connection that has waited longest for its request (of that address, resp.
        overall) rather than being refused; it is refused only when every connection over the limit is
        busy with a request, which a client cannot prolong without completing requests.
        """
        address = conn.address
        if self._per_address.get(address, 0) >= self.max_connections_per_address and not self._evict(
            self._waiting_per_address.get(address, {})
        ):
            self._closing("refused")
            return False
        if len(self._open) >= self.max_connections and not self._evict(self._waiting):
            self._closing("refused")
            return False
        self._open.add(conn)
        self._per_address[address] = self._per_address.get(address, 0) + 1
        return True

    def wait(self, conn: GuardedH11Protocol) -> bool:
        """``conn`` begins to wait for its handshake or a request (to the back of the queue); False if it is no
        longer open."""
        if conn not in self._open:
            return False
        self.busy(conn)
        self._waiting[conn] = None
        self._waiting_per_address.setdefault(conn.address, {})[conn] = None
        return True

    def busy(self, conn: GuardedH11Protocol) -> None:
        """``conn`` has received a whole request: it is no longer a candidate for closing."""
        if conn not in self._waiting:
            return
        del self._waiting[conn]
        mine = self._waiting_per_address[conn.address]
        del mine[conn]
        if not mine:
            del self._waiting_per_address[conn.address]

    def release(self, conn: GuardedH11Protocol) -> None:
        """Forget ``conn`` (closed, by either side); calling it twice is harmless."""
        if conn not in self._open:
            return
        self.busy(conn)
        self._open.discard(conn)
        left = self._per_address[conn.address] - 1
        if left:
            self._per_address[conn.address] = left
        else:
            del self._per_address[conn.address]

    def timed_out(self, conn: GuardedH11Protocol, reason: str = "header_timeout") -> None:
        """``conn`` did not complete its handshake (``reason`` handshake_timeout) or deliver its request in time."""
        self.release(conn)
        self._closing(reason)

    def _evict(self, queue: dict[GuardedH11Protocol, None]) -> bool:
        victim = next(iter(queue), None)
        if victim is None:
            return False
        self.release(victim)
        self._closing("evicted")
        victim.drop()
        return True

    def _closing(self, reason: str) -> None:
        self.closed[reason] += 1
        if self._on_close is not None:
            self._on_close(reason)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol under a :class:`ConnectionGuard`, running the TLS handshake itself.

    Subclassed per listener by :func:`guarded_protocol`, for a listener that accepts plain TCP: the connection
    is admitted at accept, the handshake runs under its own deadline, and uvicorn's protocol starts on the TLS
    transport. Relies on uvicorn's ``H11Protocol`` internals (checked against uvicorn 0.54): its
    ``connection_made`` sets up the connection from the transport it is given, ``self.connections`` is the set
    uvicorn's shutdown walks, ``self.cycle`` is the current request's cycle, ``cycle.more_body`` turns false
    when the whole body has arrived, ``cycle.response_complete`` when the response has been written,
    ``on_response_complete`` runs then, and ``_unset_keepalive_if_required`` cancels and drops the keep-alive
    timer. Relies on asyncio's ``start_tls`` (not uvloop's: the listener runs the asyncio loop) delivering data
    and loss to the protocol as soon as the handshake is done, before ``start_tls`` returns.
    """

    guard: ConnectionGuard
    ssl_context: ssl.SSLContext

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.address = ""
        self._deadline: asyncio.TimerHandle | None = None
        #: The TCP transport while the handshake runs; None once TLS is up or the connection is gone.
        self._tcp: asyncio.Transport | None = None
        self._tls_up = False
        #: Request bytes that arrived between the end of the handshake and uvicorn's taking over.
        self._early = bytearray()
        # Held here: the event loop keeps only a weak reference to a running task.
        self._handshake: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        peer = transport.get_extra_info("peername")
        self.address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if not self.guard.admit(self):
            transport.abort()
            return
        # Until start_tls has taken the transport over, bytes of the handshake must not reach this protocol.
        transport.pause_reading()
        self._tcp = transport
        # uvicorn's shutdown closes the connections in this set: a handshake in progress too.
        self.connections.add(self)
        self.guard.wait(self)
        self._deadline = self.loop.call_later(self.guard.handshake_timeout_s, self._timed_out, "handshake_timeout")
        self._handshake = self.loop.create_task(self._start_tls(transport))

    async def _start_tls(self, tcp: asyncio.Transport) -> None:
        if self._tcp is None:  # closed before this task first ran (evicted, or the client left)
            return
        tls: asyncio.Transport | None
        try:
            tls = await self.loop.start_tls(
                tcp,
                self,
                self.ssl_context,
                server_side=True,
                # Only a backstop: the guard's deadline closes the connection first and counts it.
                ssl_handshake_timeout=2 * self.guard.handshake_timeout_s,
            )
        except OSError:  # not TLS, a reset, a client's alert: nothing to answer, no one to tell
            tls = None
        except BaseException:
            self._forget()
            raise
        if tls is None or self._tcp is None or tls.is_closing():
            # Failed, or closed while it ran (evicted, timed out, the client left).
            self._forget()
            return
        self._tcp = None
        self._tls_up = True
        self._cancel_deadline()
        super().connection_made(tls)
        self._wait()
        if self._early:
            early, self._early = bytes(self._early), bytearray()
            super().data_received(early)

    def data_received(self, data: bytes) -> None:
        if not self._tls_up:
            self._early += data
            return
        super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._tls_up:  # uvicorn's side of the connection was never set up
            self._forget()
            return
        super().connection_lost(exc)
        self._cancel_deadline()
        self.guard.release(self)
        # uvicorn drops its keep-alive timer only on a clean close. A fired timer, or one left by a connection
        # that ended with an error (a client resetting the connection keep-alive was closing), refers back to
        # this protocol: a reference cycle holding the TLS state (a 256 KiB buffer each), freed only by a full
        # garbage collection, rare in a long-lived server. The operator's connections made the replica creep.
        self._unset_keepalive_if_required()
        self._handshake = None

    def handle_events(self) -> None:
        super().handle_events()
        cycle = self.cycle
        if self._deadline is not None and cycle is not None and not cycle.more_body and not cycle.response_complete:
            # The whole request is in: from here the connection is its handler's (an event stream may run for hours).
            self._cancel_deadline()
            self.guard.busy(self)

    def on_response_complete(self) -> None:
        # Before uvicorn's own: it may go on to a pipelined request, which handle_events then marks busy.
        self._wait()
        super().on_response_complete()

    def shutdown(self) -> None:
        if not self._tls_up:
            self.drop()
            return
        super().shutdown()

    def drop(self) -> None:
        """Close the connection at once (the guard has already forgotten it, or is about to)."""
        self._cancel_deadline()
        transport = self.transport if self._tls_up else self._tcp
        if transport is not None:
            # abort, not close: a graceful TLS close would wait up to 30 s for the client's close_notify.
            transport.abort()

    def _forget(self) -> None:
        """The connection ended before TLS was up: forget it everywhere."""
        self._tcp = None
        self._cancel_deadline()
        self.connections.discard(self)
        self.guard.release(self)

    def _wait(self) -> None:
        self._cancel_deadline()
        if self.guard.wait(self):
            self._deadline = self.loop.call_later(self.guard.header_timeout_s, self._timed_out, "header_timeout")

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _timed_out(self, reason: str) -> None:
        self._deadline = None
        self.guard.timed_out(self, reason)
        # Also ends a connection whose graceful close is still waiting for the client's close_notify.
        self.drop()


def guarded_protocol(guard: ConnectionGuard, ssl_context: ssl.SSLContext) -> type[GuardedH11Protocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` of a plain-TCP listener: ``guard`` keeps its
    connections, which speak TLS with ``ssl_context``."""
    return type("ConsoleH11Protocol", (GuardedH11Protocol,), {"guard": guard, "ssl_context": ssl_context})
