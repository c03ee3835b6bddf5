"""The console's HTTPS listener: uvicorn in a thread of the ``peep serve`` process.

Bound before it starts (``console.listen`` with port 0 picks a free port, as gRPC does), with the gRPC
listener's certificate and key (``grpc.tls``), TLS 1.2 or newer. uvicorn listens on plain TCP and each
connection runs its own TLS handshake, so that connections are counted and timed from accept. It stops
within a couple of seconds: open event streams notice ``stopping`` and end. Connections that do not finish
the handshake or deliver a request in time, or that crowd others out, are closed
(:mod:`~peep.server.console.connections`).
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from typing import Any

from peep.server.console.connections import ConnectionGuard, guarded_protocol
from peep.server.console.web import ConsoleApp

log = logging.getLogger(__name__)


def _bind(listen: str) -> socket.socket:
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host, int(port)), family=family, reuse_port=False)
    except OSError as exc:
        raise OSError(f"console.listen: could not bind {listen} ({exc.strerror or exc})") from None
    sock.set_inheritable(True)
    return sock


def _quiet_disconnects(app: Any) -> Any:
    """``app``, but a client gone before its form arrived (often the header deadline's doing) logs nothing.

    uvicorn would log each such request as an application error with a traceback, so slow clients could
    fill the log; there is no one left to answer.
    """
    from starlette.requests import ClientDisconnect

    async def quiet(scope: Any, receive: Any, send: Any) -> None:
        try:
            await app(scope, receive, send)
        except ClientDisconnect:
            pass

    return quiet


class ConsoleServer:
    """Serves a :class:`ConsoleApp` over HTTPS until :meth:`stop`.

    Parameters
    ----------
    console : ConsoleApp

    Attributes
    ----------
    guard : ConnectionGuard or None
        The listener's connections and limits (``guard.closed`` counts the connections it closed, by
        reason); set by :meth:`start`.
    """

    def __init__(self, console: ConsoleApp) -> None:
        self.console = console
        self.guard: ConnectionGuard | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.port = 0
        self.host = ""

    @property
    def url(self) -> str:
        host = "localhost" if self.host in ("127.0.0.1", "::1", "0.0.0.0", "::") else self.host
        return f"https://{host}:{self.port}/"

    def start(self, *, timeout: float = 15.0) -> ConsoleServer:
        import uvicorn

        cfg = self.console.services.config
        tls = cfg.grpc.tls
        if tls is None:  # the config validator refuses this; a guard for callers building configs by hand
            raise ValueError("console: expected grpc.tls (the console serves HTTPS only)")
        sock = _bind(cfg.console.listen)
        self.host, self.port = sock.getsockname()[:2]
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(tls.cert), str(tls.key))
        closed = self.console.services.metrics.console_connections_closed
        self.guard = ConnectionGuard(
            header_timeout_s=cfg.console.header_timeout_s,
            handshake_timeout_s=cfg.console.tls_handshake_timeout_s,
            max_connections=cfg.console.max_connections,
            max_connections_per_address=cfg.console.max_connections_per_address,
            on_close=lambda reason: closed.labels(reason).inc(),
        )
        config = uvicorn.Config(
            _quiet_disconnects(self.console.app),
            # No ssl_certfile: the protocol runs TLS itself, after the guard has admitted the connection.
            http=guarded_protocol(self.guard, context),
            # The protocol relies on asyncio's start_tls (uvloop's is another implementation).
            loop="asyncio",
            # No upgrade: a WebSocket connection would leave the guard's bookkeeping (the console has none).
            ws="none",
            lifespan="off",
            log_level="warning",
            access_log=False,
            server_header=False,
            date_header=True,
            # X-Forwarded-* only from the configured proxies (uvicorn takes the nearest untrusted address).
            proxy_headers=bool(cfg.console.trusted_proxies),
            forwarded_allow_ips=list(cfg.console.trusted_proxies) or None,
            timeout_graceful_shutdown=2,
            # uvicorn counts every open connection, idle ones too, and answers 503 at the limit; the guard
            # bounds connections itself, so this only backs it up (closed connections count until uvicorn has
            # noticed, an event-loop turn later).
            limit_concurrency=2 * cfg.console.max_connections,
            h11_max_incomplete_event_size=16 * 1024,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="peep-console", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not self._server.started:
            raise RuntimeError(f"console: the HTTPS listener on {cfg.console.listen} did not start")
        log.info("console listening", extra={"url": self.url})
        return self

    def stop(self) -> None:
        self.console.close()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10.0)
