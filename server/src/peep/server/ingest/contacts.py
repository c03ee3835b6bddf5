"""When each device last reached the server over gRPC, and whether it has a call open.

A device that speaks only gRPC leaves no retained ``online``/``offline`` status on the broker, so
the console's Devices page had nothing to say about it. :class:`DeviceContacts` is told by the
authentication interceptor (:class:`~peep.server.ingest.auth.AuthInterceptor`) of every call an
authenticated device makes (template streams and unary ingest, ``ReportDevice``, ``Identify``,
``Verify``, ``StreamEvents``, ``GetBundle``…) when it starts and when it ends. It keeps, in memory
and per replica, the last contact and the number of calls open per device: a lock, a dictionary
update and a clock read per call, never a database write, so the template hot path does not pay
for it. Only authenticated device identities are recorded (registered, enabled devices), and at
most ``max_devices`` of them whatever the registry holds.

:meth:`DeviceContacts.statuses` turns that into ``online``/``offline``: online while a call is
open or within :data:`ONLINE_WINDOW_S` of the last contact.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ONLINE_WINDOW_S", "DeviceContacts"]

#: A device silent over gRPC for longer than this is ``offline``. An edge agent without MQTT sends its
#: report with ``ReportDevice`` every ``grpc.report_interval_s`` (60 s by default) even when nobody walks
#: past, so a running device is heard from at least that often: two intervals tolerate one late or lost
#: report before a device is called offline.
ONLINE_WINDOW_S = 120.0
#: Devices tracked at most (the registry bounds them already; this bounds the memory whatever it holds).
MAX_DEVICES = 100_000


@dataclass(slots=True)
class Contact:
    """One device's gRPC contact: the last one (Unix time) and the calls open now."""

    last: float
    open: int = 0


class _Call:
    """One call of one device; :meth:`close` is idempotent (the call's end is reported from two places)."""

    __slots__ = ("_book", "_closed", "_device")

    def __init__(self, book: DeviceContacts, device: str) -> None:
        self._book = book
        self._device = device
        self._closed = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._book._closed(self._device)


class DeviceContacts:
    """Per-device last gRPC contact and open calls, in memory (see module docstring).

    Parameters
    ----------
    max_devices : int
        Devices tracked at most; past it, the device heard from longest ago without a call open is forgotten.
    clock : callable
        Unix time (injected for tests).
    """

    def __init__(self, *, max_devices: int = MAX_DEVICES, clock: Callable[[], float] = time.time) -> None:
        if max_devices < 1:
            raise ValueError(f"max_devices: expected a number of devices >= 1, received {max_devices!r}")
        self.max_devices = int(max_devices)
        self.clock = clock
        # Least recently heard from first: eviction past max_devices takes from the front.
        self._contacts: OrderedDict[str, Contact] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._contacts)

    def opened(self, device_id: str) -> _Call:
        """Record the start of a call of ``device_id``; close the returned handle when the call ends."""
        now = self.clock()
        with self._lock:
            c = self._contacts.get(device_id)
            if c is None:
                if len(self._contacts) >= self.max_devices:
                    self._evict_locked()
                c = self._contacts[device_id] = Contact(now)
            else:
                c.last = now
                self._contacts.move_to_end(device_id)
            c.open += 1
        return _Call(self, device_id)

    def _closed(self, device_id: str) -> None:
        now = self.clock()
        with self._lock:
            c = self._contacts.get(device_id)
            if c is None:
                return  # evicted while open: only when max_devices calls were open at once
            c.last = now
            c.open = max(0, c.open - 1)
            self._contacts.move_to_end(device_id)

    def _evict_locked(self) -> None:
        for device_id, c in self._contacts.items():
            if not c.open:
                del self._contacts[device_id]
                return
        self._contacts.popitem(last=False)  # every tracked device has a call open: the oldest goes

    def contacts(self) -> dict[str, Contact]:
        """``{device_id: Contact}``: a copy of what is tracked."""
        with self._lock:
            return {d: Contact(c.last, c.open) for d, c in self._contacts.items()}

    def statuses(
        self, *, now: float | None = None, window_s: float = ONLINE_WINDOW_S
    ) -> dict[str, tuple[str, float, str]]:
        """``{device_id: (status, since, "grpc")}`` of every device heard from over gRPC.

        Parameters
        ----------
        now : float, optional
            Unix time to judge at (default: the clock).
        window_s : float
            A device is ``online`` while a call is open or for this long after its last contact.

        Returns
        -------
        dict of str to (str, float, str)
            ``status`` is ``online`` or ``offline``; ``since`` is the last contact (Unix time), or ``now``
            while a call is open (the device is in contact at this moment).
        """
        if not window_s >= 0:
            raise ValueError(f"window_s: expected a number of seconds >= 0, received {window_s!r}")
        t = self.clock() if now is None else now
        out: dict[str, tuple[str, float, str]] = {}
        for device_id, c in self.contacts().items():
            if c.open:
                out[device_id] = ("online", max(t, c.last), "grpc")
            else:
                out[device_id] = ("online" if t - c.last <= window_s else "offline", c.last, "grpc")
        return out
