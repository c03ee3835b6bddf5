"""Login throttling kept in the database, so that replicas behind one balancer count the same failures
(:class:`SharedLoginThrottle`)."""

from __future__ import annotations

import time
from collections.abc import Callable

from peep.server.console.store import ConsoleStore


class SharedLoginThrottle:
    """Login throttling on failures kept in the database.

    Failed logins per account name and per client address within ``window_s``; the next attempt of a key
    that has used up ``attempts`` is refused (:class:`~peep.server.console.accounts.Throttled`), right
    password or not. Kept in the server's database, so every replica sharing it counts the same failures
    (an in-memory count would give an attacker ``attempts`` per replica behind a load balancer).

    Parameters
    ----------
    store : ConsoleStore
    attempts : int
    window_s : float
    max_rows : int
        Failures kept at most (the oldest are forgotten first): a flood of names cannot grow the table.
    clock : callable, optional
        Wall-clock seconds (shared by replicas; injected for tests).
    """

    def __init__(
        self,
        store: ConsoleStore,
        *,
        attempts: int,
        window_s: float,
        max_rows: int = 100_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if attempts < 1:
            raise ValueError(f"attempts: expected at least 1, received {attempts}")
        if not window_s > 0:
            raise ValueError(f"window_s: expected a number > 0, received {window_s}")
        self.store = store
        self.attempts = attempts
        self.window_s = window_s
        self.max_rows = max_rows
        self._clock = clock

    def check(self, name: str, address: str) -> None:
        """Raise :class:`~peep.server.console.accounts.Throttled` if ``name`` or ``address`` used up its failures."""
        from peep.server.console.accounts import Throttled

        now = self._clock()
        for kind, value in (("account", name), ("address", address)):
            times = self.store.login_failures(kind, value, now - self.window_s)
            if len(times) >= self.attempts:
                raise Throttled(kind, times[-self.attempts] + self.window_s - now)

    def failed(self, name: str, address: str) -> None:
        now = self._clock()
        self.store.add_login_failure(
            [("account", name), ("address", address)], now, older_than=now - self.window_s, max_rows=self.max_rows
        )

    def succeeded(self, name: str) -> None:
        """A successful login clears the account's failures (not the address's)."""
        self.store.clear_login_failures("account", name)

    def clear(self) -> None:
        """Forget every failure (tests; an administrator after a false alarm)."""
        self.store.clear_login_failures("account")
        self.store.clear_login_failures("address")
