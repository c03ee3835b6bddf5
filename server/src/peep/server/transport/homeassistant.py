"""Home Assistant's MQTT discovery: a site's doors and cameras appear in Home Assistant by themselves.

Home Assistant reads a retained JSON configuration on ``<prefix>/<component>/<node_id>/<object_id>/config`` for
each entity (``homeassistant`` is its default prefix) and removes the entity when that topic is emptied. For each
registered device at the server's site this module describes:

- a **door** (a device registered with ``door = true``, or named in ``home_assistant.doors``): a ``lock`` whose
  state is what the door itself publishes on ``<root>/<site>/<door>/lock`` (``locked``, ``unlocked``, ``jammed``;
  its command topic, which Home Assistant's lock must have, is acted on by nothing and closed to Home Assistant by
  the shipped ACL), and an ``event`` entity of its access decisions (``opened``; ``refused`` with the reason);
- a **camera** (any other registered device, an enrolment desk aside): an ``event`` entity of its recognitions
  (``enrolled_person`` or ``unknown``).

Each entity's availability is the device's own retained ``status`` (``online``; ``offline`` from its last will),
so Home Assistant shows a stopped device as unavailable. What an event carries is chosen so that Home Assistant
learns nothing a bystander at the camera would not: never a template, a probability or a score (a score of a
claim can be inverted into how alike two faces are), never a subject's name, and therefore never a list of who is
enrolled. Home Assistant keeps what it receives in its own recorder, for as long as its own settings say.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from peep.core.topics import TopicScheme
from peep.v1 import recognition_pb2, template_pb2

log = logging.getLogger(__name__)

__all__ = [
    "ACCESS_EVENTS",
    "RECOGNITION_EVENTS",
    "DiscoveredDevice",
    "HomeAssistantDiscovery",
    "HomeAssistantPublisher",
    "discovered_devices",
]

#: What a camera's recognition event may say.
RECOGNITION_EVENTS: Final = ("enrolled_person", "unknown")
#: What a door's access event may say.
ACCESS_EVENTS: Final = ("opened", "refused")
#: A lock's states as the door publishes them (Home Assistant's MQTT lock defaults, lower-cased).
LOCK_STATES: Final = {"state_locked": "locked", "state_unlocked": "unlocked", "state_jammed": "jammed"}


@dataclass(frozen=True, slots=True)
class DiscoveredDevice:
    """A registered device as Home Assistant is told of it."""

    device_id: str
    site: str
    door: bool


def _object_id(text: str) -> str:
    """Home Assistant's ids are ``[a-zA-Z0-9_-]``; PEEP's ids may also hold ``.:@``."""
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in text)


class HomeAssistantDiscovery:
    """The discovery configurations of a site's devices and the events Home Assistant receives.

    Parameters
    ----------
    topics : TopicScheme
        The server's topic root, as Home Assistant sees it on the broker.
    prefix : str
        Home Assistant's discovery prefix (``home_assistant.discovery_prefix``).
    version : str
        This server's version, in each device's ``sw_version``.
    """

    def __init__(self, topics: TopicScheme, *, prefix: str = "homeassistant", version: str = "") -> None:
        self.topics = topics
        self.prefix = prefix
        self.version = version

    def node_id(self, d: DiscoveredDevice) -> str:
        return _object_id(f"peep_{d.site}_{d.device_id}")

    def configs(self, devices: Iterable[DiscoveredDevice]) -> dict[str, bytes]:
        """``{config topic: retained JSON}`` of every entity of ``devices``.

        Parameters
        ----------
        devices : iterable of DiscoveredDevice

        Returns
        -------
        dict of str to bytes
            Publish each retained; an entity no longer wanted is removed by an empty retained payload on its topic.
        """
        out: dict[str, bytes] = {}
        for d in devices:
            node = self.node_id(d)
            common: dict[str, Any] = {
                "availability_topic": self.topics.status(d.site, d.device_id),
                "payload_available": "online",
                "payload_not_available": "offline",
                "device": {
                    "identifiers": [node],
                    "name": f"{d.device_id} ({d.site})",
                    "manufacturer": "PEEP",
                    "model": "door" if d.door else "camera",
                    **({"sw_version": self.version} if self.version else {}),
                },
                "origin": {"name": "PEEP", **({"sw_version": self.version} if self.version else {})},
            }
            if d.door:
                out[self._topic("lock", node, "lock")] = self._json(
                    {
                        **common,
                        "name": "Lock",
                        "unique_id": f"{node}_lock",
                        "state_topic": self.topics.device(d.site, d.device_id, "lock"),
                        # Home Assistant's MQTT lock must name a command topic. Nothing of PEEP acts on this one,
                        # and the shipped ACL does not let Home Assistant write it: a command there opens nothing.
                        "command_topic": self.topics.device(d.site, d.device_id, "lock_command"),
                        **LOCK_STATES,
                    }
                )
                out[self._topic("event", node, "access")] = self._json(
                    {
                        **common,
                        "name": "Access",
                        "unique_id": f"{node}_access",
                        "state_topic": self.topics.device(d.site, d.device_id, "access"),
                        "event_types": list(ACCESS_EVENTS),
                    }
                )
            else:
                out[self._topic("event", node, "recognition")] = self._json(
                    {
                        **common,
                        "name": "Recognition",
                        "unique_id": f"{node}_recognition",
                        "state_topic": self.topics.device(d.site, d.device_id, "recognition"),
                        "event_types": list(RECOGNITION_EVENTS),
                    }
                )
        return out

    def event(self, ev: recognition_pb2.RecognitionEvent) -> tuple[str, bytes] | None:
        """The topic and JSON of what Home Assistant hears of a decision, or None (an enrolment, say).

        A door's decision (a claim's verification, on the server or on the door) becomes ``opened`` or
        ``refused``; a camera's identification ``enrolled_person`` or ``unknown``. Neither carries a name, a
        probability or a template: ``decided_on`` (``server`` or ``device``) and, for a camera, the track (an id
        the camera made up, the same one a person walking past gets on every release).
        """
        if ev.purpose == template_pb2.PURPOSE_VERIFY:
            doc: dict[str, Any] = {"event_type": "opened" if ev.accepted else "refused", "decided_on": ev.decided_on}
            if not ev.accepted:
                doc["reason"] = "not_the_claimed_person"
            return self.topics.device(ev.site, ev.device_id, "access"), self._json(doc)
        if ev.purpose == template_pb2.PURPOSE_IDENTIFY:
            doc = {"event_type": "unknown" if ev.unknown else "enrolled_person", "decided_on": ev.decided_on}
            if ev.track_id:
                doc["track"] = ev.track_id[:128]
            return self.topics.device(ev.site, ev.device_id, "recognition"), self._json(doc)
        return None

    def _topic(self, component: str, node: str, object_id: str) -> str:
        return f"{self.prefix}/{component}/{node}/{object_id}/config"

    @staticmethod
    def _json(doc: dict[str, Any]) -> bytes:
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def discovered_devices(devices: Any, doors: Iterable[str] = ()) -> tuple[list[DiscoveredDevice], list[str]]:
    """The registered devices Home Assistant is told of, and the ids left out with why.

    Parameters
    ----------
    devices : DeviceRegistry
        ``auth.devices``: enabled devices with a registered site; an enrolment desk is not shown.
    doors : iterable of str
        Device ids shown as doors besides those registered with ``door = true``.
    """
    extra_doors = set(doors)
    shown, left_out = [], []
    for d in devices.devices.values():
        if not d.enabled or d.enrolment_desk:
            continue
        if d.site is None:
            left_out.append(f"{d.id}: no site registered (auth.devices[].site), so no topic of its own to name")
            continue
        shown.append(DiscoveredDevice(device_id=d.id, site=d.site, door=bool(d.door) or d.id in extra_doors))
    return shown, left_out


class HomeAssistantPublisher:
    """Publishes the discovery configurations (retained, on every connect) and each decision's event.

    Parameters
    ----------
    discovery : HomeAssistantDiscovery
    devices : DeviceRegistry
    doors : iterable of str
        ``home_assistant.doors``.
    publisher : callable returning a paho client
        The connection to publish on (the bridge's connection 0, or a retiring one while it is down).
    connected : callable returning bool
        Events are dropped while the bridge is not connected, as the bridge's own events are.
    """

    def __init__(
        self,
        discovery: HomeAssistantDiscovery,
        devices: Any,
        *,
        doors: Iterable[str] = (),
        publisher: Callable[[], Any],
        connected: Callable[[], bool],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.discovery = discovery
        self.devices = devices
        self.doors = tuple(doors)
        self._publisher = publisher
        self._connected = connected
        self._clock = clock
        #: What the console will show of the integration.
        self.entities: list[str] = []
        self.left_out: list[str] = []
        self.events_published = 0
        self.last_publish: float | None = None

    def announce(self) -> int:
        """Publish every entity's configuration, retained; returns how many."""
        shown, self.left_out = discovered_devices(self.devices, self.doors)
        configs = self.discovery.configs(shown)
        client = self._publisher()
        for topic, payload in configs.items():
            client.publish(topic, payload, qos=1, retain=True)
        self.entities = sorted(configs)
        self.last_publish = self._clock()
        for why in self.left_out:
            log.warning("home assistant: device not announced", extra={"why": why})
        return len(configs)

    def event(self, ev: recognition_pb2.RecognitionEvent) -> None:
        """Publish what Home Assistant hears of a committed decision (nothing while disconnected)."""
        if not self._connected():
            return
        out = self.discovery.event(ev)
        if out is None:
            return
        self._publisher().publish(out[0], out[1], qos=1)
        self.events_published += 1
        self.last_publish = self._clock()
