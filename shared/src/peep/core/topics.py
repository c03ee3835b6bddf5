"""The MQTT topic grammar, the one both the edge agent and the server use.

Every topic hangs off a configurable *root* (``peep/v1`` by default; the
edge's and the server's ``mqtt.topic_prefix`` must be equal, or no template
reaches the server)::

    <root>/<site>/<device>/templates    device -> server, protobuf, QoS 1
    <root>/<site>/<device>/status       device, retained "online"/"offline" (last will)
    <root>/<site>/<device>/events       server -> device, recognition events (JSON)
    <root>/<site>/<device>/claims       door -> server, "is this subject enrolled?" (JSON, no template)
    <root>/<site>/<device>/model_request  device -> server, GetDeviceModelRequest (protobuf): its bundle,
                                        site key id and the serial it holds
    <root>/<site>/<device>/model        server -> device, the answer: DeviceModelFiles (QoS 1, not retained)
    <root>/bundle                       server, retained signed bundle announcement
    <root>/model                        server, every device model it issues: DeviceModelFiles (QoS 1, not
                                        retained; a device keeps only a newer one for its bundle and key)
    <root>/deadletter                   server, refused templates (JSON, never the payload)

Servers consume templates through the MQTT v5 shared subscription
``$share/<group>/<root>/+/+/templates`` so that replicas split the load.
Site and device levels are identifiers (:data:`ID_PATTERN`): they can never
contain ``/``, ``+`` or ``#``, so a device id cannot widen a subscription or
reach another device's topics. The broker's ACL (``deploy/mosquitto/acl``)
spells the same root.

Standard library only: the edge, the server and the tests import this module
without protobuf, paho or pydantic.

Examples
--------
>>> t = TopicScheme("acme/peep")
>>> t.templates("lobby", "cam-1")
'acme/peep/lobby/cam-1/templates'
>>> t.shared_templates_filter("peep-server")
'$share/peep-server/acme/peep/+/+/templates'
>>> t.parse("acme/peep/lobby/cam-1/templates", leaf="templates")
DeviceTopic(site='lobby', device_id='cam-1', leaf='templates')
>>> t.parse("peep/v1/lobby/cam-1/templates")
Traceback (most recent call last):
...
peep.core.exceptions.TopicError: topic: expected acme/peep/<site>/<device>/<leaf> ...
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from peep.core.exceptions import TopicError

#: The topic root when the configuration names none.
DEFAULT_ROOT = "peep/v1"
#: Identifiers (site, device, message, bundle and track ids) become MQTT topic
#: levels and database keys: no '/', '+', '#', no leading punctuation.
ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$")
_ROOT_EXPECTATION = "expected topic levels such as 'peep/v1' (no wildcards, no '$', no leading/trailing '/')"
_GROUP_EXPECTATION = "expected a group name without '/', '+', '#', '$'"
_ID_EXPECTATION = "[A-Za-z0-9_.:@-] (1-128 characters, starting with a letter or digit)"


def _refuse(expectation: str, value: object, field: str | None) -> TopicError:
    # Without a field the caller is a config validator: pydantic and peep.core.configfile
    # add the key path and the value received.
    return TopicError(expectation if field is None else f"{field}: {expectation}, received {value!r}")


def check_root(root: str, *, field: str | None = None) -> str:
    """Return ``root`` if it can be the topic root (``mqtt.topic_prefix``), else raise :class:`TopicError`.

    Usable as a pydantic ``AfterValidator`` as it is (``field`` keyword-only, left ``None``).
    """
    if not isinstance(root, str) or not root or root[0] == "/" or root[-1] == "/" or any(c in root for c in "+#$"):
        raise _refuse(_ROOT_EXPECTATION, root, field)
    return root


def check_share_group(group: str, *, field: str | None = None) -> str:
    """Return ``group`` if it can name an MQTT v5 shared-subscription group, else raise :class:`TopicError`."""
    if not isinstance(group, str) or not group or any(c in group for c in "/+#$"):
        raise _refuse(_GROUP_EXPECTATION, group, field)
    return group


def _check_id(value: str, field: str) -> str:
    if not isinstance(value, str) or not ID_PATTERN.match(value):
        raise _refuse(f"expected an identifier {_ID_EXPECTATION}", value, field)
    return value


@dataclass(frozen=True, slots=True)
class DeviceTopic:
    """A per-device topic taken apart: ``<root>/<site>/<device_id>/<leaf>``."""

    site: str
    device_id: str
    leaf: str


@dataclass(frozen=True, slots=True)
class TopicScheme:
    """Topic names and filters under one root.

    Parameters
    ----------
    root : str, default "peep/v1"
        Topic levels every PEEP topic starts with (the configuration's
        ``mqtt.topic_prefix``, identical on devices and servers).

    Raises
    ------
    TopicError
        ``root`` is empty, starts or ends with ``/``, or contains ``+``, ``#`` or ``$``.
    """

    root: str = DEFAULT_ROOT

    def __post_init__(self) -> None:
        check_root(self.root, field="root")

    # -- names ------------------------------------------------------------------------

    def device(self, site: str, device_id: str, leaf: str) -> str:
        """``<root>/<site>/<device_id>/<leaf>``; ids are checked so no wildcard slips in."""
        _check_id(site, "site")
        _check_id(device_id, "device_id")
        if not leaf or any(c in leaf for c in "/+#"):
            raise TopicError(f"leaf: expected one topic level without '/', '+', '#', received {leaf!r}")
        return f"{self.root}/{site}/{device_id}/{leaf}"

    def templates(self, site: str, device_id: str) -> str:
        """Where a device publishes its perturbed templates."""
        return self.device(site, device_id, "templates")

    def status(self, site: str, device_id: str) -> str:
        """A device's retained ``online``/``offline`` state (its last will)."""
        return self.device(site, device_id, "status")

    def report(self, site: str, device_id: str) -> str:
        """A device's retained report: releases, suppressions, budgets (:mod:`peep.core.reports`)."""
        return self.device(site, device_id, "report")

    def events(self, site: str, device_id: str) -> str:
        """Where the server publishes recognition events for one device."""
        return self.device(site, device_id, "events")

    def claims(self, site: str, device_id: str) -> str:
        """Where a door asks whether a claimed subject is enrolled before it releases anything."""
        return self.device(site, device_id, "claims")

    def model_request(self, site: str, device_id: str) -> str:
        """Where a device asks for the newest device model of its bundle and site key (:mod:`peep.core.devicemodel`)."""
        return self.device(site, device_id, "model_request")

    def model(self, site: str, device_id: str) -> str:
        """Where the server answers one device's model request (only that device may read it)."""
        return self.device(site, device_id, "model")

    @property
    def bundle(self) -> str:
        """The retained, signed bundle announcement."""
        return f"{self.root}/bundle"

    @property
    def model_broadcast(self) -> str:
        """Every signed device model as it is issued (not retained: a device that missed one asks)."""
        return f"{self.root}/model"

    @property
    def deadletter(self) -> str:
        """Where the server reports refused templates."""
        return f"{self.root}/deadletter"

    # -- filters ----------------------------------------------------------------------

    def templates_filter(self) -> str:
        """Every device's templates: ``<root>/+/+/templates``."""
        return f"{self.root}/+/+/templates"

    def shared_claims_filter(self, group: str) -> str:
        """``$share/<group>/<root>/+/+/claims``: one replica of ``group`` answers each door's claim check."""
        check_share_group(group, field="share_group")
        return f"$share/{group}/{self.root}/+/+/claims"

    def shared_model_requests_filter(self, group: str) -> str:
        """``$share/<group>/<root>/+/+/model_request``: one replica of ``group`` answers each device's request."""
        check_share_group(group, field="share_group")
        return f"$share/{group}/{self.root}/+/+/model_request"

    def shared_templates_filter(self, group: str) -> str:
        """``$share/<group>/<root>/+/+/templates``: replicas in ``group`` split the templates."""
        check_share_group(group, field="share_group")
        return f"$share/{group}/{self.templates_filter()}"

    # -- parsing ----------------------------------------------------------------------

    def parse(self, topic: str, *, leaf: str | None = None) -> DeviceTopic:
        """Take a per-device topic apart, checking the root, the ids and (optionally) the leaf.

        Parameters
        ----------
        topic : str
            A topic a message arrived on.
        leaf : str, optional
            The last level the caller expects (e.g. ``"templates"``).

        Returns
        -------
        DeviceTopic

        Raises
        ------
        TopicError
            Naming ``topic``, the expected shape and (the first 200 characters of) the topic received.
        """
        shape = f"{self.root}/<site>/<device>/{leaf or '<leaf>'}"
        prefix = self.root + "/"
        rest = topic[len(prefix) :].split("/") if topic.startswith(prefix) else []
        if (
            len(rest) != 3
            or not ID_PATTERN.match(rest[0])
            or not ID_PATTERN.match(rest[1])
            or not rest[2]
            or (leaf is not None and rest[2] != leaf)
        ):
            raise TopicError(
                f"topic: expected {shape} with site and device {_ID_EXPECTATION}, received {topic[:200]!r}"
            )
        return DeviceTopic(site=rest[0], device_id=rest[1], leaf=rest[2])
