"""What a replica hears of each device over MQTT, outside the share group: its status, its report, its claim checks.

Every replica subscribes to ``<root>/+/+/status`` and ``<root>/+/+/report`` with plain filters, so each keeps the
latest status and report per device for its console (:class:`DeviceHeard`), bounded whatever the broker sends.
A message that is not a registered device's at its registered site is not kept; the bridge clears it when it is
retained and ``mqtt.clear_retained`` asks for it (the reason :class:`DeviceHeard` returns). A door's claim check
is read here too (:func:`read_claim_check`): exactly a nonce and a subject id, nothing else answered.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from typing import Final

import paho.mqtt.client as mqtt
from peep.core.exceptions import TopicError
from peep.core.reports import DeviceReport, ReportError, parse_device_report
from peep.core.topics import DeviceTopic, TopicScheme
from peep.core.wire import check_subject_id
from peep.server.ingest.auth import DeviceRegistry

log = logging.getLogger(__name__)

STATUSES: Final = (b"online", b"offline")
#: Largest claim check read (a nonce and a subject id are far shorter).
MAX_CLAIM_CHECK_BYTES: Final = 1024
#: A claim's nonce: 128 random bits in hex (peep.edge.door.Claim).
NONCE: Final = re.compile(r"[0-9a-f]{32}")
#: Devices whose status and report are kept at most (the oldest first out).
MAX_DEVICES: Final = 100_000


def sender_refusal(devices: DeviceRegistry, where: DeviceTopic) -> str | None:
    """``unknown_device`` or ``wrong_site`` when a registry lists devices and the topic's is not one at its site."""
    if len(devices) and not devices.is_registered(where.device_id):
        return "unknown_device"
    if len(devices) and devices.site_of(where.device_id) not in (None, where.site):
        return "wrong_site"
    return None


def read_claim_check(payload: bytes) -> tuple[str, str]:
    """``(nonce, claimed subject)`` of a claim check's JSON; ``ValueError`` (or KeyError, TypeError,
    WireError) for anything but a 32-hex nonce and a valid subject id. The caller bounds the size first
    (:data:`MAX_CLAIM_CHECK_BYTES`, refused as ``too_large``)."""
    doc = json.loads(payload)
    nonce, subject = doc["nonce"], doc["claimed_subject"]
    if not (isinstance(nonce, str) and NONCE.fullmatch(nonce) and isinstance(subject, str)):
        raise ValueError("expected a 32-hex nonce and a subject id")
    return nonce, check_subject_id(subject, "claimed_subject")


class DeviceHeard:
    """The latest status and report of each device this replica heard (thread-safe, bounded).

    Parameters
    ----------
    topics : TopicScheme
    devices : DeviceRegistry
    require_registered_device : bool
        A status from a device the registry does not list (when it lists any) is refused
        (``mqtt.require_registered_device``); a report always is.
    """

    def __init__(self, topics: TopicScheme, devices: DeviceRegistry, *, require_registered_device: bool) -> None:
        self.topics = topics
        self.devices = devices
        self.require_registered_device = require_registered_device
        self._statuses: dict[str, tuple[str, float]] = {}
        self._reports: dict[str, tuple[DeviceReport, float]] = {}
        self._lock = threading.Lock()

    def statuses(self) -> dict[str, tuple[str, float]]:
        """``{device_id: (status, when it was received)}``: ``online`` or ``offline``, a cleared one not listed."""
        with self._lock:
            return dict(self._statuses)

    def reports(self) -> dict[str, tuple[DeviceReport, float]]:
        """``{device_id: (report, when it was received)}``: each registered device's latest report."""
        with self._lock:
            return dict(self._reports)

    def take_status(self, msg: mqtt.MQTTMessage) -> str | None:
        """Keep a status; the reason it is refused (and, retained, should be cleared), or None.

        A refused status is never listed by :meth:`statuses`, retained or not.
        """
        try:
            where = self.topics.parse(msg.topic, leaf="status")
        except TopicError:
            return "bad_topic" if msg.payload else None
        with self._lock:
            if msg.payload in STATUSES:
                self._statuses[where.device_id] = (msg.payload.decode(), time.time())
            elif not msg.payload:
                self._statuses.pop(where.device_id, None)
            if len(self._statuses) > MAX_DEVICES:
                self._statuses.pop(next(iter(self._statuses)))
        if not msg.payload:
            return None
        reason = None
        if msg.payload not in STATUSES:
            reason = "bad_payload"
        elif self.require_registered_device:
            reason = sender_refusal(self.devices, where)
        if reason is not None:
            with self._lock:
                self._statuses.pop(where.device_id, None)
        return reason

    def take_report(self, msg: mqtt.MQTTMessage) -> str | None:
        """Keep a registered device's report from its registered site; else the reason it was refused."""
        if not msg.payload:
            return None  # a cleared report
        try:
            where = self.topics.parse(msg.topic, leaf="report")
        except TopicError:
            return None
        reason = sender_refusal(self.devices, where)
        if reason is not None:
            return reason
        try:
            report = parse_device_report(bytes(msg.payload))
        except ReportError as exc:
            log.warning("mqtt device report refused", extra={"device": where.device_id, "error": str(exc)})
            return "bad_payload"
        with self._lock:
            self._reports[where.device_id] = (report, time.time())
            if len(self._reports) > MAX_DEVICES:
                self._reports.pop(next(iter(self._reports)))
        return None
