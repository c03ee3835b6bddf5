"""A person's own Home Assistant entity, for the subjects who opted in, and for no one else.

Off by default: a subject is shown only once someone allowed to manage subjects has recorded that they opted in,
with the display name they agreed to (``home_assistant_people``, set from the console's People page or
``peep subjects home-assistant``). For each of them, at each site with a camera shown in Home Assistant, this module
publishes:

- a ``sensor`` "Last seen" on ``<prefix>/sensor/peep_<site>_person_<slug>/last_seen/config`` (retained), whose
  device is named with the display name, and whose state is the camera that last identified them;
- its state on ``<root>/<site>/people/<slug>/last_seen`` (retained JSON: ``camera``, ``site``, ``at``), written on
  each identification naming them at a camera of that site;
- the display name as the attribute ``person`` of that camera's recognition event.

``<slug>`` is the subject id when it holds only ``[A-Za-z0-9_-]``, else the id with every other character replaced
by ``_`` and the first 10 hex digits of its SHA-256 appended (:func:`person_slug`: two ids never share one).

Everyone else's decisions stay as they are, ``enrolled_person`` with no name. When a subject opts out or is erased,
their configuration and state topics are emptied (retained empty payloads: Home Assistant removes the entity) and
nothing more is published for them; a configuration of this kind left on the broker by an earlier run for someone no
longer opted in is emptied too, when it arrives with the publisher's subscription.

The list is read from the database, so every replica names the same people, but not on each decision: it changes
rarely and by hand, and a read on every decision would put the database on the path of every event (and its outage
there). :class:`PeopleShown` re-reads it on the publisher's timer (every 10 s) and at once when this server's console
changes it (:meth:`PeopleShown.reload`); a change made elsewhere (the command line, another replica's console) takes
effect within that interval. If the list cannot be read for ``max_age_s`` nobody is named (an event is sent without a
name and no state is written) until it can: a database away is never taken for consent.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from peep.core.topics import TopicScheme
from peep.v1 import recognition_pb2, template_pb2

log = logging.getLogger(__name__)

__all__ = ["LAST_SEEN", "PEOPLE_LEVEL", "PeopleShown", "person_slug"]

#: The topic level after the site under which each shown person's state is (``<root>/<site>/people/<slug>/…``).
PEOPLE_LEVEL: Final = "people"
#: The object id of a person's sensor and the leaf of its state topic.
LAST_SEEN: Final = "last_seen"
#: Larger than any configuration this module writes: a bigger one is not ours, and is not parsed.
_MAX_CONFIG_BYTES: Final = 16_384


def _ascii_id(text: str) -> str:
    return "".join(c if (c.isascii() and c.isalnum()) or c in "_-" else "_" for c in text)


def person_slug(subject: str) -> str:
    """A subject id as a Home Assistant object id and a topic level (``[A-Za-z0-9_-]``), one-to-one.

    Examples
    --------
    >>> person_slug("alice_b")
    'alice_b'
    >>> person_slug("alice.b")
    'alice_b_9f5eb4f140'
    """
    plain = _ascii_id(subject)
    if plain == subject:
        return plain
    return f"{plain}_{hashlib.sha256(subject.encode()).hexdigest()[:10]}"


class PeopleShown:
    """The entities of the people who opted in to Home Assistant (see the module docstring).

    :class:`~peep.server.transport.homeassistant.HomeAssistantPublisher` drives it: :meth:`announce` with each
    announcement, :meth:`event` with each decision, :meth:`seen` with each retained configuration under the prefix,
    :meth:`refresh` on its timer. It publishes through the publisher's own publish (:meth:`bind`).

    Parameters
    ----------
    topics : TopicScheme
        The server's topic root.
    prefix : str
        Home Assistant's discovery prefix.
    read : callable returning a mapping
        ``() -> {subject: ShownPerson}``: the store's ``home_assistant_people``.
    version : str
        This server's version, in each entity's ``sw_version``.
    max_age_s : float, default 30.0
        Nobody is named once the list was last read longer ago than this (a database away).
    clock, monotonic : callable returning float
        Unix time (a decision without a time); the clock of ``max_age_s``.
    """

    def __init__(
        self,
        topics: TopicScheme,
        *,
        prefix: str,
        read: Callable[[], Mapping[str, Any]],
        version: str = "",
        max_age_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.topics = topics
        self.prefix = prefix
        self.version = version
        self.max_age_s = max_age_s
        self._read = read
        self._clock = clock
        self._monotonic = monotonic
        self._publish: Callable[..., bool] | None = None
        # One lock for the list and every publish of this module: an opt-out's emptying is never overtaken by a
        # state write of the same person from another thread.
        self._lock = threading.RLock()
        self._people: dict[str, tuple[str, str]] = {}  # subject -> (slug, display name)
        self._read_at: float | None = None
        self._sites: frozenset[str] = frozenset()  # the sites whose cameras are shown
        self._current: dict[str, str] = {}  # config topic published -> its state topic
        self._sent: dict[str, bytes] = {}  # config topic -> the payload last published on it
        self._on_broker: dict[str, str] = {}  # our person configs retained on the broker -> their state topic
        self._announced = False
        self.removed_total = 0

    def bind(self, publish: Callable[..., bool]) -> None:
        """``publish(topic, payload, *, retain) -> bool``: the publisher's (QoS 1, errors noted for the console)."""
        self._publish = publish

    # ------------------------------------------------------------ what the publisher calls

    def announce(self, sites: Iterable[str]) -> None:
        """Publish the configuration of every opted-in person at each of ``sites`` (those with a camera shown),
        retained, and empty those of ours on the broker that are no longer wanted."""
        with self._lock:
            self._sites = frozenset(sites)
            self._load()
            self._sync(force=True)
            self._announced = True
            for topic in [t for t in self._on_broker if t not in self._current]:
                self._remove(topic, self._on_broker[topic])

    def refresh(self) -> None:
        """Re-read the list (the publisher's timer) and publish what changed."""
        self.reload()

    def reload(self) -> None:
        """Re-read the list now (this server's console changed it) and publish what changed: a new person's
        configuration, a changed name, or an opted-out or erased person's entity emptied."""
        with self._lock:
            if self._load() and self._announced:
                self._sync(force=False)

    def event(self, ev: recognition_pb2.RecognitionEvent, out: tuple[str, bytes] | None) -> tuple[str, bytes] | None:
        """What Home Assistant hears of ``ev`` (``out``, from the discovery), with the display name when it
        identifies an opted-in person at a shown camera's site, whose last-seen state is then written (retained)."""
        if out is None or ev.purpose != template_pb2.PURPOSE_IDENTIFY or ev.unknown or not ev.subject:
            return out
        with self._lock:
            person = self._people.get(ev.subject)
            fresh = self._read_at is not None and self._monotonic() - self._read_at <= self.max_age_s
            if person is None or not fresh or ev.site not in self._sites or self._publish is None:
                return out
            slug, name = person
            at = ev.time.ToDatetime(tzinfo=UTC) if ev.HasField("time") else None
            at = at or datetime.fromtimestamp(self._clock(), tz=UTC)
            state = {"camera": ev.device_id, "site": ev.site, "at": at.isoformat(timespec="seconds")}
            self._publish(self._state_topic(ev.site, slug), _json(state), retain=True)
            doc = json.loads(out[1])
            doc["person"] = name
            return out[0], _json(doc)

    def seen(self, topic: str, payload: bytes, sites: Iterable[str]) -> bool:
        """A retained configuration under the prefix (the publisher's subscription): True when it is a person's of
        this server's, at one of ``sites`` (emptied when that person is no longer shown); an empty one is noted as
        gone and left to the publisher too."""
        with self._lock:
            if not payload:
                self._on_broker.pop(topic, None)
                return False
            state = self._ours(topic, payload, set(sites))
            if state is None:
                return False
            self._on_broker[topic] = state
            if self._announced and topic not in self._current:
                self._remove(topic, state)
            return True

    @property
    def shown(self) -> int:
        """How many people are shown (entities published, over all sites)."""
        with self._lock:
            return len(self._current)

    # ------------------------------------------------------------ the rest

    def _load(self) -> bool:
        """Read the list; False (and the previous one kept, for emptying only) when it cannot be read."""
        try:
            rows = self._read()
        except Exception as exc:  # whatever the store's driver raises: logged; nobody named once it is too old
            log.warning("home assistant: the people shown could not be read", extra={"error": str(exc)[:200]})
            return False
        people: dict[str, tuple[str, str]] = {}
        slugs: dict[str, str] = {}
        for subject in sorted(rows):
            slug = person_slug(subject)
            if slug in slugs:  # an id that is another's slug with its hash: the first (sorted) is shown
                log.warning("home assistant: two subjects share one entity id; the second is not shown")
                continue
            slugs[slug] = subject
            people[subject] = (slug, str(rows[subject].display_name))
        self._people = people
        self._read_at = self._monotonic()
        return True

    def _sync(self, *, force: bool) -> None:
        """Publish the configurations wanted (all of them when ``force``, else those new or changed) and empty
        those published that are no longer wanted."""
        wanted: dict[str, tuple[str, bytes]] = {}
        for site in sorted(self._sites):
            for slug, name in self._people.values():
                topic, state = self._config_topic(site, slug), self._state_topic(site, slug)
                wanted[topic] = (state, self._config(site, slug, name, state))
        for topic in [t for t in self._current if t not in wanted]:
            self._remove(topic, self._current[topic])
        for topic, (state, payload) in wanted.items():
            if (force or self._sent.get(topic) != payload) and self._send(topic, payload, retain=True):
                self._sent[topic] = payload
            self._current[topic] = state

    def _remove(self, topic: str, state: str) -> None:
        """Empty a person's configuration and state (Home Assistant removes the entity)."""
        self._send(topic, b"", retain=True)
        self._send(state, b"", retain=True)
        self._current.pop(topic, None)
        self._on_broker.pop(topic, None)
        self._sent.pop(topic, None)
        self.removed_total += 1
        log.info("home assistant: a person's entity removed")

    def _send(self, topic: str, payload: bytes, *, retain: bool) -> bool:
        return self._publish is not None and self._publish(topic, payload, retain=retain)

    def _node(self, site: str, slug: str) -> str:
        return f"peep_{_ascii_id(site)}_person_{slug}"

    def _config_topic(self, site: str, slug: str) -> str:
        return f"{self.prefix}/sensor/{self._node(site, slug)}/{LAST_SEEN}/config"

    def _state_topic(self, site: str, slug: str) -> str:
        return f"{self.topics.device(site, PEOPLE_LEVEL, slug)}/{LAST_SEEN}"

    def _config(self, site: str, slug: str, name: str, state: str) -> bytes:
        node = self._node(site, slug)
        sw = {"sw_version": self.version} if self.version else {}
        return _json(
            {
                "name": "Last seen",
                "unique_id": f"{node}_{LAST_SEEN}",
                "state_topic": state,
                # The state is the camera; the JSON's other keys (site, time) are the entity's attributes.
                "value_template": "{{ value_json.camera }}",
                "json_attributes_topic": state,
                "icon": "mdi:account-eye",
                "device": {"identifiers": [node], "name": name, "manufacturer": "PEEP", "model": "person", **sw},
                "origin": {"name": "PEEP", **sw},
            }
        )

    def _ours(self, topic: str, payload: bytes, sites: set[str]) -> str | None:
        """The state topic of a person's configuration this server publishes, at one of ``sites``; else None."""
        levels = topic[len(self.prefix) + 1 :].split("/") if topic.startswith(self.prefix + "/") else []
        if len(levels) != 4 or levels[0] != "sensor" or levels[2] != LAST_SEEN or len(payload) > _MAX_CONFIG_BYTES:
            return None
        if not levels[1].startswith("peep_") or "_person_" not in levels[1]:
            return None
        try:
            doc = json.loads(payload)
            if not isinstance(doc, dict) or (doc.get("origin") or {}).get("name") != "PEEP":
                return None
            state = str(doc.get("state_topic", ""))
        except (ValueError, TypeError, AttributeError):
            return None
        rest = state[len(self.topics.root) + 1 :].split("/") if state.startswith(self.topics.root + "/") else []
        if len(rest) != 4 or rest[1] != PEOPLE_LEVEL or rest[3] != LAST_SEEN or rest[0] not in sites:
            return None
        site, slug = rest[0], rest[2]
        if not slug or _ascii_id(slug) != slug or levels[1] != self._node(site, slug):
            return None
        return state


def _json(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
