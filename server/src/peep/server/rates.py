"""Per-caller call rates: what bounds the device calls that cost the server work but the device nothing.

Shared by the transports (gRPC and MQTT ask the same bucket for one device) and by the claim checker of
recognition, so it sits below all of them, on nothing but the error helpers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from peep.server.errors import quote


class CallsTooFrequent(Exception):
    """A caller used up its rate of a per-device call (``RESOURCE_EXHAUSTED`` over gRPC; no answer over MQTT)."""


class CallerRate:
    """A token bucket per caller: ``burst`` calls at once, then ``rate_per_s`` a second.

    What bounds the device calls that cost the server work but the device nothing (``GetDeviceModel`` and its
    MQTT twin: a device model is megabytes; a door's claim check,
    :class:`~peep.server.recognition.claims.ClaimChecker`), so one device cannot keep the server serving it. At
    most ``max_callers`` buckets are kept (the least recently used goes): the registered devices are far fewer.

    Parameters
    ----------
    what : str
        The call, as refusals name it.
    rate_per_s, burst : float
    clock : callable
        Monotonic seconds (tests).
    """

    def __init__(
        self,
        what: str,
        *,
        rate_per_s: float,
        burst: float,
        max_callers: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (rate_per_s > 0 and burst >= 1):
            raise ValueError(f"rate_per_s, burst: expected > 0 and >= 1, received {rate_per_s}, {burst}")
        self.what, self.rate_per_s, self.burst = what, float(rate_per_s), float(burst)
        self.max_callers, self.clock = max_callers, clock
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def admit(self, caller: str) -> None:
        """Take one call of ``caller``'s rate, or raise :class:`CallsTooFrequent` naming the rate and the caller."""
        now = self.clock()
        with self._lock:
            tokens, last = self._buckets.pop(caller, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate_per_s)
            if tokens < 1.0:
                self._buckets[caller] = (tokens, now)
                raise CallsTooFrequent(
                    f"{self.what}: expected at most {self.rate_per_s:g} a second (bursts of {self.burst:g}) from "
                    f"one caller, received more from {quote(caller)}"
                )
            self._buckets[caller] = (tokens - 1.0, now)  # re-inserted last: dicts keep insertion order
            while len(self._buckets) > self.max_callers:
                self._buckets.pop(next(iter(self._buckets)))
