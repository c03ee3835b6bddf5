"""The console's HTTPS listener: uvicorn in a thread of the ``peep serve`` process.

Bound before it starts (``console.listen`` with port 0 picks a free port, as gRPC does), with the gRPC
listener's certificate and key (``grpc.tls``), TLS 1.2 or newer (uvicorn's default context). It stops
within a couple of seconds: open event streams notice ``stopping`` and end.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from typing import Any

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


class ConsoleServer:
    """Serves a :class:`ConsoleApp` over HTTPS until :meth:`stop`.

    Parameters
    ----------
    console : ConsoleApp
    """

    def __init__(self, console: ConsoleApp) -> None:
        self.console = console
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
        config = uvicorn.Config(
            self.console.app,
            ssl_certfile=str(tls.cert),
            ssl_keyfile=str(tls.key),
            ssl_version=ssl.PROTOCOL_TLS_SERVER,
            lifespan="off",
            log_level="warning",
            access_log=False,
            server_header=False,
            date_header=True,
            # X-Forwarded-* only from the configured proxies (uvicorn takes the nearest untrusted address).
            proxy_headers=bool(cfg.console.trusted_proxies),
            forwarded_allow_ips=list(cfg.console.trusted_proxies) or None,
            timeout_graceful_shutdown=2,
            limit_concurrency=200,
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
