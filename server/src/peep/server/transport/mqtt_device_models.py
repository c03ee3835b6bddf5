"""Device models over MQTT: every issued model broadcast, and each device's request answered on its own topic.

Topics (:mod:`peep.core.topics`; ``<root>`` as in :mod:`peep.server.transport.mqtt`):

``<root>/model``
    Every device model the server issues, as the encoded ``peep.v1.DeviceModelFiles`` (QoS 1, **not
    retained**: a device that was away asks instead). Every device of every bundle and key hears it; a device
    keeps only a newer, correctly signed one for its own bundle and site key
    (:func:`peep.core.devicemodel.verify_device_model_files`).
``<root>/<site>/<device>/model_request``
    A device's ask: an encoded ``peep.v1.GetDeviceModelRequest`` (``bundle_id``, ``key_id``, ``have_serial``;
    at most :data:`MAX_REQUEST_BYTES`), consumed through the share group (one replica answers) at QoS 0 (an
    ask nobody heard is asked again, never queued for later).
``<root>/<site>/<device>/model``
    The answer, QoS 1, not retained: the newest model of the asked bundle and key, or ``unchanged`` (its
    serial, no files) when the device holds it, or -- none issued for that bundle and key, or its key retired
    -- a ``DeviceModelFiles`` with serial 0 and no files.

Only a registered device at its registered site is answered, within the per-device rate shared with
``GetDeviceModel`` (:class:`~peep.server.rates.CallerRate`); anything else gets no answer and is
logged by size only. A model larger than the broker's maximum packet size is not published (the broker would
drop the connection); an error says to raise ``max_packet_size``, and devices fetch it over gRPC.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from google.protobuf.message import DecodeError
from peep.core.exceptions import TopicError
from peep.core.topics import TopicScheme
from peep.server.rates import CallsTooFrequent
from peep.server.recognition.devicemodels import NoDeviceModel, check_model_request
from peep.server.storage.devicemodels import IssuedModel
from peep.v1 import recognition_pb2

log = logging.getLogger(__name__)

#: Largest model request read (a bundle id, a key id and a serial are far shorter).
MAX_REQUEST_BYTES = 1024
#: What a publication adds to its payload: fixed header (<= 5), topic length (2), packet id (2), properties (1).
_OVERHEAD = 10


class DeviceModelTopics:
    """Broadcast device models and answer devices' requests for them (see the module docstring).

    Parameters
    ----------
    topics : TopicScheme
    services : Services
        Its device models, device registry and the per-device rate of model requests.
    publisher : callable
        ``publisher() -> paho client`` to publish on (the bridge's connection 0, or a retiring session's).
    max_packet_size : callable
        The broker's maximum packet size from CONNACK (None: not announced).
    connected : callable
        Whether the bridge is connected (nothing is queued for a connection that is down).
    """

    def __init__(
        self,
        topics: TopicScheme,
        services: Any,
        *,
        publisher: Callable[[], Any],
        max_packet_size: Callable[[], int | None],
        connected: Callable[[], bool],
    ) -> None:
        self.topics = topics
        self.s = services
        self._publisher = publisher
        self._max_packet_size = max_packet_size
        self._connected = connected
        self.counts = {"broadcast": 0, "answered": 0, "refused": 0, "too_large": 0}

    def _fits(self, topic: str, payload: bytes, serial: int) -> bool:
        limit = self._max_packet_size()
        size = len(payload) + len(topic.encode()) + _OVERHEAD
        if limit is not None and size > limit:
            self.counts["too_large"] += 1
            log.error(
                "device model not published: larger than the broker's maximum packet size (raise max_packet_size "
                "in mosquitto.conf); devices can fetch it over gRPC (GetDeviceModel)",
                extra={"serial": serial, "bytes": size, "max_packet_size": limit, "topic": topic[:256]},
            )
            return False
        return True

    def broadcast(self, model: IssuedModel) -> None:
        """Publish an issued model on ``<root>/model`` (QoS 1, not retained)."""
        if model.payload is None or not self._connected():
            return
        topic = self.topics.model_broadcast
        if not self._fits(topic, model.payload, model.serial):
            return
        self._publisher().publish(topic, model.payload, qos=1, retain=False)
        self.counts["broadcast"] += 1
        log.info("device model broadcast", extra={"serial": model.serial, "topic": topic})

    def answer(self, topic: str, payload: bytes) -> None:
        """Answer one ``model_request`` (a message of the shared subscription) on the device's ``model`` topic."""
        try:
            where = self.topics.parse(topic, leaf="model_request")
        except TopicError:
            return
        devices = self.s.devices
        reason = None
        request = recognition_pb2.GetDeviceModelRequest()
        if len(devices) and not devices.is_registered(where.device_id):
            reason = "unknown_device"
        elif len(devices) and devices.site_of(where.device_id) not in (None, where.site):
            reason = "wrong_site"
        elif len(payload) > MAX_REQUEST_BYTES:
            reason = "too_large"
        else:
            try:
                request.ParseFromString(bytes(payload))
                check_model_request(request.bundle_id, request.key_id)
                self.s.device_model_requests.admit(where.device_id)
            except (DecodeError, ValueError):
                reason = "bad_payload"
            except CallsTooFrequent:
                reason = "too_frequent"
        if reason is not None:
            self.counts["refused"] += 1
            log.warning("mqtt model request refused", extra={"device": where.device_id, "reason": reason,
                                                             "size": len(payload)})  # fmt: skip
            return
        try:
            out = self.s.device_models.answer(request.bundle_id, request.key_id, int(request.have_serial))
            serial = int(request.have_serial)
        except NoDeviceModel:
            out, serial = recognition_pb2.DeviceModelFiles(serial=0).SerializeToString(), 0
        reply = self.topics.model(where.site, where.device_id)
        if not self._fits(reply, out, serial):
            return
        self._publisher().publish(reply, out, qos=1, retain=False)
        self.counts["answered"] += 1
