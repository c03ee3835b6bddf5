"""Device reports that arrive over gRPC (``ReportDevice``), the twin of the retained MQTT report.

A device that speaks only gRPC has no retained ``…/report`` topic, so the
console's Devices page had nothing to show for its suppressed releases and
budgets. :class:`DeviceReportBook` takes the same document
(:mod:`peep.core.reports`) over gRPC, from the device it describes only,
bounded and parsed exactly as the MQTT bridge does, at most one per device
every ``min_interval_s`` (a hostile device cannot turn reports into database
writes at line rate), and keeps the latest per device in the store so that
every replica's console sees it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from peep.core.reports import DeviceReport, ReportError, parse_device_report
from peep.core.wire import ID_PATTERN
from peep.server.ingest.auth import Identity
from peep.server.ingest.ingestor import PermissionRefused

__all__ = ["DeviceReportBook", "ReportTooFrequent"]

#: Error text: what an id must look like.
_ID = "1-128 characters [A-Za-z0-9_.:@-]"


class ReportTooFrequent(Exception):
    """A device sent its next report sooner than ``min_interval_s`` after the last (RESOURCE_EXHAUSTED)."""


def _quote(value: str) -> str:
    return repr(value[:64])


class DeviceReportBook:
    """Accept devices' reports over gRPC and serve each device's latest (see module docstring).

    Parameters
    ----------
    store : Store
        Where the latest report per device is kept (``device_reports``).
    min_interval_s : float
        Shortest time between two accepted reports of one device (per replica).
    clock : callable
        Unix time (injected for tests).
    """

    def __init__(self, store: Any, *, min_interval_s: float = 1.0, clock: Callable[[], float] = time.time) -> None:
        if not min_interval_s >= 0:
            raise ValueError(f"min_interval_s: expected a number of seconds >= 0, received {min_interval_s!r}")
        self.store = store
        self.min_interval_s = float(min_interval_s)
        self.clock = clock
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def accept(self, ident: Identity | None, device_id: str, site: str, payload: bytes) -> float:
        """Validate, authorise and keep one report; returns when it was stored (Unix time).

        Raises
        ------
        PermissionRefused
            Not the device's own credential (no credential, the admin, another
            device), or a site other than the device's registered one.
        ValueError
            A malformed id, or a payload that is not a report
            (:class:`~peep.core.reports.ReportError` names the field).
        ReportTooFrequent
            Sooner than ``min_interval_s`` after this device's last report.
        """
        # Every id's length before any id's form, so an oversized field is the one named.
        for name, value in (("device_id", device_id), ("site", site)):
            if len(value) > 128:
                raise ValueError(f"{name}: expected {_ID}, received {len(value)} characters")
        if not ID_PATTERN.match(device_id):
            raise ValueError(f"device_id: expected a device id of {_ID}, received {_quote(device_id)}")
        if not ID_PATTERN.match(site):
            raise ValueError(f"site: expected a site id of {_ID}, received {_quote(site)}")
        if ident is None or ident.is_admin:
            who = "no credentials" if ident is None else "the admin credential"
            raise PermissionRefused(
                "report_not_permitted",
                f"ReportDevice: expected the credential of the device the report describes, received {who}",
            )
        if device_id != ident.name:
            raise PermissionRefused(
                "wrong_device",
                f"device_id: expected {ident.name!r} (the authenticated device), received {_quote(device_id)}",
            )
        if ident.site is not None and site != ident.site:
            raise PermissionRefused(
                "wrong_site",
                f"site: expected {ident.site!r} (device {ident.name}'s registered site), received {_quote(site)}",
            )
        parse_device_report(payload)  # ReportError (a ValueError) names the field
        now = self.clock()
        with self._lock:
            last = self._last.get(device_id)
            if last is not None and now - last < self.min_interval_s:
                raise ReportTooFrequent(
                    f"ReportDevice: expected at most one report per {self.min_interval_s:g} s from device "
                    f"{device_id!r}; the last came {now - last:.2f} s ago"
                )
            self._last[device_id] = now
        self.store.put_device_report(device_id, site, bytes(payload), now)
        return now

    def latest(self) -> dict[str, tuple[DeviceReport, float]]:
        """``{device_id: (report, when it was received)}`` for every device that reported over gRPC."""
        out: dict[str, tuple[DeviceReport, float]] = {}
        for device_id, (_site, payload, at) in self.store.device_reports().items():
            try:
                out[device_id] = (parse_device_report(payload), at)
            except ReportError:
                continue  # validated when it arrived; a row written by hand is not shown
        return out
