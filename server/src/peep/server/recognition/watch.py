"""What another replica changed, learnt through PostgreSQL ``LISTEN/NOTIFY`` with a periodic check.

:class:`ChangeWatcher` holds one connection of its own, ``LISTEN``\\ s on some
channels and calls a handler for each notification, in the order PostgreSQL
delivers them (the commit order of the notifying transactions, whichever
replica made them). Every ``interval`` seconds without a notification, and
after every reconnection (notifications sent while it was disconnected are
lost), it calls ``on_check`` so that a missed notification delays a change by
at most ``interval``. A database that is down only delays changes: the watcher
retries, and the replica keeps serving what it has.

The server uses it for the model registry (``peep_models``: a promotion or a
deleted version, the recogniser reloads; ``peep_erasures``: the erasure list
is re-read) and for recognition events of the other replicas
(:mod:`peep.server.ingest.events`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["ChangeWatcher"]

log = logging.getLogger(__name__)

Handler = Callable[[str], None]


class ChangeWatcher:
    """Listen on ``handlers``' channels in a thread (see module docstring).

    Parameters
    ----------
    connect : callable returning a psycopg connection (autocommit)
    handlers : mapping of channel to ``fn(payload)``
    on_check : callable, optional
        Called every ``interval`` s without notifications and after each (re)connection.
    interval : float
        The fallback check's period (s).
    name : str
        The thread's name (logs).
    """

    def __init__(
        self,
        connect: Callable[[], Any],
        handlers: Mapping[str, Handler],
        *,
        on_check: Callable[[], None] | None = None,
        interval: float = 2.0,
        name: str = "peep-watch",
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval: expected a number of seconds > 0, received {interval!r}")
        self._connect = connect
        self._handlers = dict(handlers)
        self._on_check = on_check
        self.interval = float(interval)
        self._stop = threading.Event()
        self._conn: Any = None
        self.listening = threading.Event()
        self.notifications = 0
        self.checks = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> ChangeWatcher:
        self._thread.start()
        return self

    def wait_listening(self, timeout: float) -> bool:
        """Whether the watcher is connected and listening within ``timeout`` s."""
        return self.listening.wait(timeout)

    def _check(self) -> None:
        if self._on_check is None:
            return
        self.checks += 1
        try:
            self._on_check()
        except Exception as exc:  # the database being down must not stop the watcher
            # "watcher", not "thread": a LogRecord's own attribute name raises KeyError, which ended this thread.
            log.warning("periodic check failed", extra={"watcher": self._thread.name, "error": str(exc)[:200]})

    def _dispatch(self, channel: str, payload: str) -> None:
        fn = self._handlers.get(channel)
        if fn is None:
            return
        self.notifications += 1
        try:
            fn(payload)
        except Exception:
            log.exception("notification handler failed", extra={"channel": channel})

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                conn = self._connect()
            except Exception as exc:
                log.warning("cannot listen for changes; retrying", extra={"error": str(exc)})
                self._check()
                self._stop.wait(min(backoff, self.interval))
                backoff = min(backoff * 2, 10.0)
                continue
            self._conn = conn
            try:
                for channel in self._handlers:
                    conn.execute(f'LISTEN "{channel}"')
                self.listening.set()
                backoff = 0.5
                self._check()  # what changed while not listening
                last = time.monotonic()
                while not self._stop.is_set():
                    timeout = max(0.05, self.interval - (time.monotonic() - last))
                    got = False
                    for n in conn.notifies(timeout=min(timeout, 0.5), stop_after=64):
                        got = True
                        self._dispatch(n.channel, n.payload)
                    if got:
                        last = time.monotonic()
                    elif time.monotonic() - last >= self.interval:
                        self._check()
                        last = time.monotonic()
            except Exception as exc:
                if not self._stop.is_set():
                    log.warning("change listener lost its connection; reconnecting", extra={"error": str(exc)})
            finally:
                self.listening.clear()
                self._conn = None
                try:
                    conn.close()
                except Exception:
                    pass

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
