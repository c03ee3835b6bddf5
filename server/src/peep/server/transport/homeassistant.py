"""Home Assistant's MQTT discovery: a site's doors and cameras appear in Home Assistant by themselves.

Home Assistant reads a retained JSON configuration on ``<prefix>/<component>/<node_id>/<object_id>/config`` for
each entity (``homeassistant`` is its default prefix) and removes the entity when that topic is emptied. For each
registered device at the server's site this module describes:

- a **door** (a device registered with ``door = true``, or named in ``home_assistant.doors``): a ``lock`` whose
  state is what the door itself publishes on ``<root>/<site>/<door>/lock`` (``locked``, ``unlocked``, ``jammed``;
  its command topic, which Home Assistant's lock must have, is acted on only by a door with
  ``door.home_assistant_open`` and written only by an account the broker's ACL grants it, none as shipped), and an
  ``event`` entity of its access decisions (``opened``, with ``requested_by`` when Home Assistant asked; ``refused``
  with the reason);
- a **camera** (any other registered device, an enrolment desk aside): an ``event`` entity of its recognitions
  (``enrolled_person`` or ``unknown``), and a ``sensor`` of how many distinct enrolled people it recognised in the
  last ``home_assistant.recent_minutes`` (a count only, retained on ``<root>/<site>/<camera>/recognised_recently``;
  :mod:`~peep.server.transport.homeassistant_recent` keeps the window in memory only).

The configurations are published retained when connection 0 connects and again when Home Assistant says ``online``
on ``<prefix>/status`` (its birth message, after a restart), at most once every few seconds. Each announcement also
empties the retained configurations still on the broker of this server's own entities that are no longer shown
(a device unregistered, disabled, moved to another site or made an enrolment desk), so a server restarted with a
smaller registry removes what an earlier run published; another site's or another integration's are never touched.

Each entity's availability is the device's own retained ``status`` (``online``; ``offline`` from its last will),
so Home Assistant shows a stopped device as unavailable. What an event carries is chosen so that Home Assistant
learns nothing a bystander at the camera would not: never a template, a probability or a score (a score of a
claim can be inverted into how alike two faces are), never a subject's name, and therefore never a list of who is
enrolled, but for the subjects who opted in to an entity of their own
(:mod:`~peep.server.transport.homeassistant_people`). Home Assistant keeps what it receives in its own recorder, for
as long as its own settings say.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from paho.mqtt.client import error_string
from paho.mqtt.subscribeoptions import SubscribeOptions
from peep.core.topics import TopicScheme
from peep.server.transport.homeassistant_people import PeopleShown
from peep.server.transport.homeassistant_recent import RecentlyRecognised
from peep.v1 import recognition_pb2, template_pb2

log = logging.getLogger(__name__)

__all__ = [
    "ACCESS_EVENTS",
    "RECOGNITION_EVENTS",
    "DiscoveredDevice",
    "HomeAssistantDiscovery",
    "HomeAssistantPublisher",
    "HomeAssistantState",
    "discovered_devices",
]

#: What a camera's recognition event may say.
RECOGNITION_EVENTS: Final = ("enrolled_person", "unknown")
#: What a door's access event may say.
ACCESS_EVENTS: Final = ("opened", "refused")
#: A lock's states as the door publishes them (Home Assistant's MQTT lock defaults, lower-cased).
LOCK_STATES: Final = {"state_locked": "locked", "state_unlocked": "unlocked", "state_jammed": "jammed"}
#: The leaf of a camera's count of the people it recognised recently (retained; the server writes it).
RECENT_LEAF: Final = "recognised_recently"
#: Larger than any configuration this module writes (about 700 bytes): a bigger one is not ours, and is not parsed.
MAX_CONFIG_BYTES: Final = 16_384


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

    @property
    def status_topic(self) -> str:
        """Where Home Assistant says ``online`` (its birth) and ``offline`` (its will)."""
        return f"{self.prefix}/status"

    @property
    def config_filter(self) -> str:
        """Every entity configuration under the prefix, whoever published it (``<prefix>/+/+/+/config``)."""
        return f"{self.prefix}/+/+/+/config"

    def ours(self, topic: str, payload: bytes, sites: Iterable[str]) -> str | None:
        """Whether a retained configuration is one this server publishes, for one of ``sites``.

        Only a configuration whose node id is ``peep_<site>_<device>``, whose origin is PEEP and whose availability
        is that very device's status under this server's root, at a site of its own, is this server's: another
        integration's (another node id or origin) and another site's (sanitised node ids can coincide: ``peep_a_b_c``
        is site ``a`` or ``a_b``, the availability topic says which) are not.

        Returns
        -------
        str or None
            None when it is not ours; else the state topic to empty with it when it is a camera's count (the
            retained count of a camera no longer shown), or ``""``.
        """
        levels = topic[len(self.prefix) + 1 :].split("/") if topic.startswith(self.prefix + "/") else []
        if len(levels) != 4 or not levels[1].startswith("peep_") or len(payload) > MAX_CONFIG_BYTES:
            return None
        try:
            doc = json.loads(payload)
            if not isinstance(doc, dict) or (doc.get("origin") or {}).get("name") != "PEEP":
                return None
            where = self.topics.parse(str(doc.get("availability_topic", "")), leaf="status")
        except (ValueError, TypeError, AttributeError):  # a TopicError is a ValueError
            return None
        node = self.node_id(DiscoveredDevice(device_id=where.device_id, site=where.site, door=False))
        if where.site not in set(sites) or node != levels[1]:
            return None
        state = self.topics.device(where.site, where.device_id, RECENT_LEAF)
        return state if doc.get("state_topic") == state else ""

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
                        # Home Assistant's MQTT lock must name a command topic. Only a door told to
                        # (door.home_assistant_open) acts on it, and only an account the broker's ACL grants that
                        # door's topic may write it; as shipped none is, so a command there opens nothing.
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
                # A number only: how many distinct enrolled people, never who (HomeAssistantPublisher.recent).
                out[self._topic("sensor", node, RECENT_LEAF)] = self._json(
                    {
                        **common,
                        "name": "Recognised recently",
                        "unique_id": f"{node}_{RECENT_LEAF}",
                        "state_topic": self.topics.device(d.site, d.device_id, RECENT_LEAF),
                        "unit_of_measurement": "people",
                        "state_class": "measurement",
                        "icon": "mdi:account-multiple",
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
            if ev.requested_by:  # opened from Home Assistant's lock (door.home_assistant_open), not by a face
                doc["requested_by"] = ev.requested_by
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
        ``auth.devices``: enabled devices with a registered site; an enrolment desk is not shown (nor is any
        device left out named in Home Assistant: each is in the list left out, with why).
    doors : iterable of str
        Device ids shown as doors besides those registered with ``door = true``.
    """
    extra_doors = set(doors)
    shown, left_out = [], []
    for d in devices.devices.values():
        if not d.enabled:
            left_out.append(f"{d.id}: disabled (auth.devices[].enabled = false)")
            continue
        if d.enrolment_desk:
            left_out.append(f"{d.id}: an enrolment desk, which is never shown")
            continue
        if d.site is None:
            left_out.append(f"{d.id}: no site registered (auth.devices[].site), so no topic of its own to name")
            continue
        shown.append(DiscoveredDevice(device_id=d.id, site=d.site, door=bool(d.door) or d.id in extra_doors))
    return shown, left_out


@dataclass(frozen=True, slots=True)
class HomeAssistantState:
    """What the console shows of the integration: a snapshot of :class:`HomeAssistantPublisher`.

    Attributes
    ----------
    prefix : str
        The discovery prefix.
    entities : tuple of str
        The configuration topics of the last announcement.
    left_out : tuple of str
        ``"<device>: why"`` of each registered device not shown.
    events_published, announcements, births : int
        Events sent; announcements made; Home Assistant's ``online`` heard on ``<prefix>/status``.
    removed : tuple of str
        The latest configuration topics emptied (an entity of a device no longer shown), newest first.
    removed_total, errors : int
        How many were emptied; how many publishes raised, were not sent, or were refused by the broker.
    last_publish, last_error_at : float or None
        Unix times.
    last_error : str
        The topic and what went wrong, or ``""``.
    recent_minutes : int
        The window of the cameras' counts.
    recognised_recently : dict of str to int
        ``{"<site>/<camera>": distinct people recognised in the window}``: numbers, never who.
    devices : tuple of DiscoveredDevice
        The devices the last announcement showed.
    """

    prefix: str
    entities: tuple[str, ...]
    left_out: tuple[str, ...]
    events_published: int
    announcements: int
    births: int
    removed: tuple[str, ...]
    removed_total: int
    errors: int
    last_publish: float | None
    last_error: str
    last_error_at: float | None
    recent_minutes: int
    recognised_recently: dict[str, int] = field(default_factory=dict)
    devices: tuple[DiscoveredDevice, ...] = ()


#: Publishes awaiting their PUBACK, and refusals heard before their publish was noted: bounds on each.
_MAX_PENDING: Final = 10_000
_MAX_EARLY: Final = 16
#: Retained configurations of this server's own sites remembered from the broker (far more than any site has).
_MAX_ON_BROKER: Final = 50_000


class HomeAssistantPublisher:
    """Publishes the discovery configurations and each decision's event, re-announces, removes stale entities.

    Announcements: when connection 0 connects (:meth:`announce`) and when Home Assistant says ``online`` on
    ``<prefix>/status`` (:meth:`take`), at most once per ``debounce_s``. The retained configurations on the broker
    arrive with the subscription to ``<prefix>/+/+/+/config``: those of this server's sites (:meth:`~HomeAssistant
    Discovery.ours`) that the announcement does not hold are emptied, whenever they arrive.

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
    clock : callable returning float, default time.time
        Unix time, for what the console shows.
    recent_minutes : int, default 15
        The window of each camera's count of the people it recognised (``home_assistant.recent_minutes``).
    monotonic : callable returning float, default time.monotonic
        The clock of that window and of the debounce.
    debounce_s : float, default 5.0
        Home Assistant's ``online`` within this of the last announcement announces nothing more.
    refresh_s : float, default 10.0
        How often :meth:`start`'s thread re-counts, so that a count falls as people leave the window.
    people : callable returning a mapping, optional
        The store's ``home_assistant_people``: who opted in to be shown, each with an entity of their own
        (:class:`PeopleShown`, as :attr:`people`); without it nobody is ever named.
    stopping : threading.Event, optional
        Ends that thread when set (the bridge's own stop); :meth:`stop` sets it.
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
        recent_minutes: int = 15,
        monotonic: Callable[[], float] = time.monotonic,
        debounce_s: float = 5.0,
        refresh_s: float = 10.0,
        stopping: threading.Event | None = None,
        people: Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        self.discovery = discovery
        self.devices = devices
        self.doors = tuple(doors)
        self._publisher = publisher
        self._connected = connected
        self._clock = clock
        self._monotonic = monotonic
        self.debounce_s = debounce_s
        self.refresh_s = refresh_s
        self.recent_minutes = recent_minutes
        self.recent = RecentlyRecognised(recent_minutes * 60.0, clock=monotonic)
        #: What the console shows of the integration (:meth:`state`).
        self.entities: list[str] = []
        self.left_out: list[str] = []
        self.events_published = 0
        self.last_publish: float | None = None
        self.announcements = 0
        self.births = 0
        self.removed: list[str] = []
        self.removed_total = 0
        self.errors = 0
        self.last_error = ""
        self.last_error_at: float | None = None
        # _lock: the state, and the order in which counts and configurations are published (re-entrant: a birth
        # announces). _ack_lock: what paho's PUBACK callback touches; that callback runs holding paho's own locks,
        # which a publish needs, so it must never wait on _lock (held across publishes).
        self._lock = threading.RLock()
        self._ack_lock = threading.Lock()
        self._pending: dict[tuple[int, int], str] = {}
        self._early: dict[tuple[int, int], tuple[str, float]] = {}
        self._on_broker: dict[str, str] = {}  # our sites' retained configs -> the count topic to empty with it
        self._current: set[str] = set()
        self._announced_at: float | None = None
        self._logged: set[str] = set()
        self._counts: dict[tuple[str, str], int] = {}  # as last published
        self._cameras: dict[tuple[str, str], str] = {}
        self._shown: tuple[DiscoveredDevice, ...] = ()
        self._set_cameras(discovered_devices(devices, self.doors)[0])  # decisions before the first announce count
        self._stop = stopping if stopping is not None else threading.Event()
        self.people: PeopleShown | None = None
        if people is not None:
            self.people = PeopleShown(discovery.topics, prefix=discovery.prefix, read=people, version=discovery.version,
                                      clock=clock, monotonic=monotonic)  # fmt: skip
            self.people.bind(self._publish)
        self._timer: threading.Thread | None = None

    # ------------------------------------------------------------ what the bridge calls

    def subscriptions(self) -> list[tuple[str, SubscribeOptions]]:
        """Connection 0's subscriptions: Home Assistant's status, and every configuration under the prefix.

        QoS 0, nothing queued while the server is away (what is retained arrives with every subscription); no
        local: the server's own configurations do not come back to it.
        """
        opts = SubscribeOptions(qos=0, noLocal=True)
        return [(self.discovery.status_topic, opts), (self.discovery.config_filter, opts)]

    def take(self, msg: Any) -> bool:
        """Handle a message (paho's) of :meth:`subscriptions`; False when its topic is none of theirs."""
        topic = msg.topic
        if topic == self.discovery.status_topic:
            self.birth(bytes(msg.payload))
            return True
        if topic.startswith(self.discovery.prefix + "/") and topic.endswith("/config"):
            # Only what the broker retained: a configuration another replica publishes while running arrives
            # without the flag, so replicas whose registries differ a moment (a rolling change) do not undo each
            # other's on every publish.
            if msg.retain:
                self._config_seen(topic, bytes(msg.payload))
            return True
        return False

    def birth(self, payload: bytes) -> bool:
        """Home Assistant's status: ``online`` (it started, or reconnected) announces again, unless an announcement
        was made within ``debounce_s``; anything else (``offline``, its will) is ignored. Returns whether it
        announced."""
        if len(payload) > 16 or bytes(payload).strip() != b"online":
            return False
        with self._lock:
            self.births += 1
            if self._announced_at is not None and self._monotonic() - self._announced_at < self.debounce_s:
                return False
            self.announce()
            return True

    def announce(self) -> int:
        """Publish every entity's configuration and every camera's count, retained, and empty the configurations
        of this server's sites that are no longer shown; returns how many configurations were published."""
        with self._lock:
            shown, left_out = discovered_devices(self.devices, self.doors)
            configs = self.discovery.configs(shown)
            self._set_cameras(shown)
            for topic, payload in configs.items():
                self._publish(topic, payload, retain=True)
            self.entities, self.left_out, self._current = sorted(configs), left_out, set(configs)
            self._shown = tuple(shown)
            self._announced_at = self._monotonic()
            self.announcements += 1
            for topic in [t for t in self._on_broker if t not in self._current]:
                self._remove(topic)
            self._publish_counts(force=True)
            if self.people is not None:
                self.people.announce(d.site for d in shown if not d.door)
        self.start()
        for why in left_out:
            if why not in self._logged:  # once per process, not on every reconnect
                self._logged.add(why)
                log.warning("home assistant: device not announced", extra={"why": why})
        return len(configs)

    def event(self, ev: recognition_pb2.RecognitionEvent) -> None:
        """Count a camera's recognition of an enrolled person, and publish what Home Assistant hears of the
        decision and the camera's new count (nothing while disconnected; the count is published on connecting)."""
        camera = (ev.site, ev.device_id)
        counted = ev.purpose == template_pb2.PURPOSE_IDENTIFY and not ev.unknown and ev.subject
        if counted and camera in self._cameras:
            self.recent.add(camera, ev.subject)
        if not self._connected():
            return
        out = self.discovery.event(ev)
        if self.people is not None and camera in self._cameras:  # an opted-in person's name, and last-seen state
            out = self.people.event(ev, out)
        with self._lock:
            if out is not None and self._publish(out[0], out[1], retain=False):
                self.events_published += 1
            if counted and camera in self._cameras:
                self._publish_count(camera, force=False)

    def refresh(self) -> None:
        """Publish each count that changed: it falls as people leave the window, with no decision to say so; and
        re-read who opted in to be shown (:meth:`PeopleShown.refresh`)."""
        if not self._connected():
            return
        with self._lock:
            self._publish_counts(force=False)
        if self.people is not None:
            self.people.refresh()

    def start(self) -> None:
        """Start the thread that calls :meth:`refresh` every ``refresh_s`` until it is stopped (the first
        :meth:`announce` starts it; once stopped, it stays so)."""
        if self._timer is None and not self._stop.is_set():
            self._timer = threading.Thread(target=self._refresh_loop, name="peep-ha-recent", daemon=True)
            self._timer.start()

    def stop(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.join(timeout=5.0)
            self._timer = None

    def published(self, client: Any, userdata: Any, mid: int, reason_code: Any, properties: Any) -> None:
        """paho's ``on_publish`` of connection 0: a PUBACK refusing one of this publisher's messages is an error
        (most often the broker's ACL: the shipped one lets the server write ``homeassistant/#`` only)."""
        key, failed = (id(client), mid), bool(getattr(reason_code, "is_failure", False))
        with self._ack_lock:
            topic = self._pending.pop(key, None)
            if topic is None:
                if failed:  # before its publish was noted, or not this publisher's: kept briefly, in case
                    self._early[key] = (str(reason_code), self._monotonic())
                    while len(self._early) > _MAX_EARLY:
                        del self._early[next(iter(self._early))]
                return
        if failed:
            self._error(topic, f"refused by the broker ({reason_code})")

    def state(self) -> HomeAssistantState:
        """A snapshot for the console (any thread)."""
        with self._lock, self._ack_lock:
            return HomeAssistantState(
                prefix=self.discovery.prefix,
                entities=tuple(self.entities),
                left_out=tuple(self.left_out),
                events_published=self.events_published,
                announcements=self.announcements,
                births=self.births,
                removed=tuple(self.removed),
                removed_total=self.removed_total,
                errors=self.errors,
                last_publish=self.last_publish,
                last_error=self.last_error,
                last_error_at=self.last_error_at,
                recent_minutes=self.recent_minutes,
                recognised_recently={f"{s}/{d}": self.recent.count((s, d)) for s, d in sorted(self._cameras)},
                devices=self._shown,
            )

    # ------------------------------------------------------------ the rest

    def _refresh_loop(self) -> None:
        while not self._stop.wait(self.refresh_s):
            try:
                self.refresh()
            except Exception:
                log.exception("home assistant: re-counting the people recognised recently failed")

    def _set_cameras(self, shown: list[DiscoveredDevice]) -> None:
        cameras = {(d.site, d.device_id): self.discovery.topics.device(d.site, d.device_id, RECENT_LEAF)
                   for d in shown if not d.door}  # fmt: skip
        self._cameras = cameras  # replaced whole: event() reads it without the lock
        self._counts = {c: n for c, n in self._counts.items() if c in cameras}
        self.recent.forget(set(cameras))

    def _sites(self) -> set[str]:
        """The sites this server registers devices at: only their entities are ever its to remove."""
        return {d.site for d in self.devices.devices.values() if d.site}

    def _config_seen(self, topic: str, payload: bytes) -> None:
        with self._lock:
            if self.people is not None and self.people.seen(topic, payload, self._sites()):
                return  # a person's entity (no device availability: not recognised by ours())
            if not payload:
                self._on_broker.pop(topic, None)
                return
            count_topic = self.discovery.ours(topic, payload, self._sites())
            if count_topic is None:
                return
            self._on_broker[topic] = count_topic
            if self._announced_at is not None and topic not in self._current:
                self._remove(topic)
            elif len(self._on_broker) > _MAX_ON_BROKER:
                del self._on_broker[topic]

    def _remove(self, topic: str) -> None:
        """Empty a configuration of ours no longer shown (Home Assistant removes the entity), and its count."""
        count_topic = self._on_broker.pop(topic, "")
        if self._publish(topic, b"", retain=True):
            self.removed = [topic, *self.removed[:49]]
            self.removed_total += 1
            log.info("home assistant: entity removed", extra={"topic": topic[:200]})
        if count_topic:
            self._publish(count_topic, b"", retain=True)

    def _publish_counts(self, *, force: bool) -> None:
        for camera in list(self._cameras):
            self._publish_count(camera, force=force)

    def _publish_count(self, camera: tuple[str, str], *, force: bool) -> None:
        n = self.recent.count(camera)
        if (force or self._counts.get(camera) != n) and self._publish(self._cameras[camera], b"%d" % n, retain=True):
            self._counts[camera] = n

    def _publish(self, topic: str, payload: bytes, *, retain: bool) -> bool:
        """QoS 1; False (and an error noted) when it raised or was not sent. The broker's refusal comes later, to
        :meth:`published`."""
        try:
            client = self._publisher()
            info = client.publish(topic, payload, qos=1, retain=retain)
        except Exception as exc:  # a closed client, a bad topic: noted for the console, never raised at a caller
            self._error(topic, f"{type(exc).__name__}: {exc}")
            return False
        if info.rc:
            self._error(topic, f"not sent ({error_string(info.rc)})")
            return False
        key = (id(client), info.mid)
        with self._ack_lock:
            early = self._early.pop(key, None)
            if early is None or self._monotonic() - early[1] > 5.0:
                self._pending[key] = topic
                while len(self._pending) > _MAX_PENDING:
                    del self._pending[next(iter(self._pending))]
                early = None
        if early is not None:
            self._error(topic, f"refused by the broker ({early[0]})")
        self.last_publish = self._clock()
        return True

    def _error(self, topic: str, why: str) -> None:
        with self._ack_lock:
            self.errors += 1
            self.last_error = f"{topic[:200]}: {why}"[:500]
            self.last_error_at = self._clock()
        log.warning("home assistant: publish failed", extra={"topic": topic[:200], "why": why[:300]})
