"""What the store keeps, row by row: the records and columns of its tables (see :mod:`peep.server.storage`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any, get_args, get_type_hints

import numpy as np
from numpy.typing import NDArray
from peep.core import wire
from peep.v1 import recognition_pb2, template_pb2


@dataclass(frozen=True, slots=True)
class TemplateRecord:
    """One stored template (a row of ``templates``).

    The fields, in order, are the columns of ``templates`` (see :data:`TEMPLATE_COLUMNS`);
    a field whose column is named otherwise says so in its ``column`` metadata.
    """

    message_id: str
    device_id: str
    site: str
    bundle_id: str
    mechanism_kind: str
    epsilon: float
    delta: float
    epsilon_coordinate: float
    epsilon_vector: float
    noise_std: float
    purpose: str
    subject: str | None
    track_id: str
    capture_time: float
    received_at: float
    n_components: int
    values: bytes = field(metadata={"column": "vals"})
    soft_traits: str | None = None
    #: The subject a kept identify/verify template was recognised as (None: unknown, undecided, enrolment);
    #: erasing that subject deletes the template.
    decided_subject: str | None = None
    #: The public id of the site key the values were released under ("" for none).
    key_id: str = ""

    @classmethod
    def from_message(
        cls,
        msg: template_pb2.PerturbedTemplate,
        values: NDArray[np.float32],
        *,
        received_at: float,
        decided_subject: str | None = None,
    ) -> TemplateRecord:
        """A record for a validated message; ``values`` are its coefficients."""
        m = msg.mechanism
        traits = None
        if len(msg.soft_traits):
            traits = json.dumps(
                [
                    {"trait": wire.trait_name(t.kind), "value": t.value, "epsilon": t.epsilon, "mechanism": t.mechanism}
                    for t in msg.soft_traits
                ],
                separators=(",", ":"),
            )
        return cls(
            message_id=msg.message_id,
            device_id=msg.device_id,
            site=msg.site,
            bundle_id=msg.bundle_id,
            mechanism_kind=wire.mechanism_kind_name(m.kind),
            epsilon=m.epsilon,
            delta=m.delta,
            epsilon_coordinate=m.epsilon_coordinate,
            epsilon_vector=m.epsilon_vector,
            noise_std=m.noise_std,
            purpose=wire.purpose_name(msg.purpose),
            subject=msg.subject or None,
            track_id=msg.track_id,
            capture_time=msg.capture_time.seconds + msg.capture_time.nanos * 1e-9,
            received_at=received_at,
            n_components=int(values.shape[0]),
            values=np.ascontiguousarray(values, dtype="<f4").tobytes(),
            soft_traits=traits,
            decided_subject=decided_subject,
            key_id=msg.key_id,
        )

    def as_array(self) -> NDArray[np.float32]:
        """The coefficients, shape (n_components,)."""
        return np.frombuffer(self.values, dtype="<f4").astype(np.float32)

    def row(self) -> tuple[object, ...]:
        """The column values, in the order of :data:`COLUMNS`."""
        return tuple(_column_values(self))

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TemplateRecord:
        """The record of a row of ``templates`` given as column name -> value."""
        return cls(**{c.attribute: _plain(row[c.name]) for c in TEMPLATE_COLUMNS})


def _plain(value: Any) -> Any:
    # A driver may return a binary column as a buffer rather than bytes; records hold bytes.
    return bytes(value) if isinstance(value, memoryview | bytearray) else value


@dataclass(frozen=True, slots=True)
class Column:
    """A column of ``templates``: its name, the :class:`TemplateRecord` field it stores and that field's type.

    ``value_type`` is ``str``, ``float``, ``int`` or ``bytes`` (an optional field's column holds NULL too).
    """

    name: str
    attribute: str
    value_type: type


def _template_columns() -> tuple[Column, ...]:
    hints = get_type_hints(TemplateRecord)
    columns = []
    for f in fields(TemplateRecord):
        hint = hints[f.name]
        value_type = next((t for t in get_args(hint) if t is not type(None)), hint)  # T | None -> T
        columns.append(Column(f.metadata.get("column", f.name), f.name, value_type))
    return tuple(columns)


#: The columns of ``templates`` in table order: the one list of them, read off :class:`TemplateRecord`.
TEMPLATE_COLUMNS = _template_columns()
#: Their names.
COLUMNS = tuple(c.name for c in TEMPLATE_COLUMNS)
_column_values = attrgetter(*(c.attribute for c in TEMPLATE_COLUMNS))


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One received message id (a row of ``ingest_ledger``): what de-duplicates ingest, with no template in it.

    Ids are random (a device's message id, its per-run track id); the rest
    describes the release's privacy cost (its mechanism and ε), which the
    console sums per device, and how it arrived (``transport``, ``sent_by``),
    which tells a device's own releases from what the administrator sent in
    its name. Nothing here is derived from the face.
    """

    device_id: str
    message_id: str
    site: str
    received_at: float
    purpose: str
    track_id: str
    bundle_id: str
    mechanism_kind: str
    epsilon_coordinate: float
    epsilon_vector: float
    #: ε of the soft-trait releases that came with the template (their sum; sequential composition).
    epsilon_traits: float
    #: How it arrived: ``grpc`` or ``mqtt`` ("" for rows received before this was recorded).
    transport: str = ""
    #: Whose credential sent it: ``device`` (the device's own, or its MQTT topic) or ``admin`` ("" before recorded).
    sent_by: str = ""
    #: ε of a device's released decision label (k-ary randomized response); 0 for a template and for a door's
    #: access record. A decision has no template, so its template ε (``epsilon_coordinate``, ``epsilon_vector``) are 0.
    epsilon_label: float = 0.0

    @classmethod
    def from_message(
        cls, msg: template_pb2.PerturbedTemplate, *, received_at: float, transport: str = "", sent_by: str = ""
    ) -> LedgerEntry:
        """The ledger row of ``msg``: its ids, times and ε, never its values.

        Parameters
        ----------
        msg : PerturbedTemplate
        received_at : float
            Unix time of receipt.
        transport : {"grpc", "mqtt", ""}
            How it arrived.
        sent_by : {"device", "admin", ""}
            Whose credential sent it.
        """
        m = msg.mechanism
        decided = msg.HasField("decision")
        return cls(
            device_id=msg.device_id,
            message_id=msg.message_id,
            site=msg.site,
            received_at=received_at,
            purpose=wire.purpose_name(msg.purpose),
            track_id=msg.track_id,
            bundle_id=msg.bundle_id,
            mechanism_kind=decision_mechanism(msg) if decided else wire.mechanism_kind_name(m.kind),
            epsilon_coordinate=0.0 if decided else m.epsilon_coordinate,
            epsilon_vector=0.0 if decided else m.epsilon_vector,
            epsilon_traits=float(sum(t.epsilon for t in msg.soft_traits)),
            transport=transport,
            sent_by=sent_by,
            epsilon_label=float(msg.decision.epsilon_label) if decided else 0.0,
        )

    @property
    def key(self) -> tuple[str, str]:
        return (self.device_id, self.message_id)

    def row(self) -> tuple[object, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))


#: What the ledger calls the release of a door's access record (the door's own action; no label mechanism).
ACCESS_RECORD = "access-record"


def decision_mechanism(msg: template_pb2.PerturbedTemplate) -> str:
    """The mechanism a release carrying a decision went through: its label's (``k-rr``), or a door's record."""
    return msg.decision.label_mechanism or ACCESS_RECORD


#: The columns of ``ingest_ledger``, in table order.
LEDGER_COLUMNS = tuple(f.name for f in fields(LedgerEntry))


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One decision (a row of ``recognition_events``): what a recognition event says, kept ``events_days``.

    An unknown identification names nobody: ``subject`` is empty and no
    template value or soft trait is kept with it.
    """

    event_id: str
    at: float
    site: str
    device_id: str
    message_id: str
    track_id: str
    purpose: str
    subject: str
    claimed_subject: str
    unknown: bool
    accepted: bool | None
    probability: float
    model_version: str
    releases_fused: int
    origin: str = ""  # the replica that decided (cluster.replica_id); "" for a single server
    #: ``server`` (on a perturbed template) or ``device`` (the device's own decision with a device model).
    decided_on: str = "server"
    #: A device's decision: its label's ε (0 for a door's access record) and the device model's serial.
    epsilon_label: float = 0.0
    model_serial: int = 0
    #: A door's opening asked by another than a claim at the door (``home_assistant``); "" for a claim.
    requested_by: str = ""

    @classmethod
    def from_event(cls, ev: Any, *, origin: str = "") -> DecisionRecord:
        """The row of a :class:`peep.v1.recognition_pb2.RecognitionEvent` decided by replica ``origin``."""
        verify = ev.purpose == template_pb2.PURPOSE_VERIFY
        return cls(
            event_id=ev.event_id,
            at=ev.time.seconds + ev.time.nanos * 1e-9,
            site=ev.site,
            device_id=ev.device_id,
            message_id=ev.message_id,
            track_id=ev.track_id,
            purpose=wire.purpose_name(ev.purpose) if ev.purpose else "unspecified",
            subject=ev.subject,
            claimed_subject=ev.claimed_subject,
            unknown=bool(ev.unknown),
            accepted=bool(ev.accepted) if verify else None,
            probability=float(ev.probability),
            model_version=ev.model_version,
            releases_fused=int(ev.releases_fused or 1),
            origin=origin,
            decided_on=ev.decided_on or "server",
            epsilon_label=float(ev.epsilon_label),
            model_serial=int(ev.model_serial),
            requested_by=ev.requested_by,
        )

    def to_event(self, seq: int = 0) -> Any:
        """The :class:`peep.v1.recognition_pb2.RecognitionEvent` this row keeps, ``seq`` its id in the log."""
        ev = recognition_pb2.RecognitionEvent(
            event_id=self.event_id,
            site=self.site,
            device_id=self.device_id,
            message_id=self.message_id,
            track_id=self.track_id,
            purpose=wire.PURPOSES.get(self.purpose, 0),  # type: ignore[arg-type]
            subject=self.subject,
            unknown=self.unknown,
            probability=self.probability,
            claimed_subject=self.claimed_subject,
            accepted=bool(self.accepted),
            model_version=self.model_version,
            releases_fused=self.releases_fused,
            seq=seq,
            decided_on=self.decided_on,
            epsilon_label=self.epsilon_label,
            model_serial=self.model_serial,
            requested_by=self.requested_by,
        )
        ev.time.FromNanoseconds(round(self.at * 1e9))
        return ev

    @property
    def key(self) -> tuple[str, str]:
        return (self.device_id, self.message_id)

    def row(self) -> tuple[object, ...]:
        values: list[object] = []
        for f in fields(self):
            v = getattr(self, f.name)
            values.append(int(v) if isinstance(v, bool) else v)
        return tuple(values)


#: The columns of ``recognition_events`` a :class:`DecisionRecord` writes (the table adds an increasing ``id``).
DECISION_COLUMNS = tuple(f.name for f in fields(DecisionRecord))


@dataclass(frozen=True, slots=True)
class TrackRelease:
    """A track's identify release remembered for fusion by another replica (a row of ``track_memory``).

    Kept until ``expires_at`` (receipt + ``training.track_fusion_s``) and
    swept by every replica; never in ``templates``.
    """

    device_id: str
    track_id: str
    message_id: str
    site: str
    bundle_id: str
    capture_time: float
    expires_at: float
    n_components: int
    values: bytes = field(metadata={"column": "vals"})

    @property
    def key(self) -> tuple[str, str]:
        return (self.device_id, self.message_id)

    def row(self) -> tuple[object, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))

    def as_array(self) -> NDArray[np.float32]:
        return np.frombuffer(self.values, dtype="<f4").astype(np.float32)


#: The columns of ``track_memory``, in table order.
TRACK_COLUMNS = tuple(f.metadata.get("column", f.name) for f in fields(TrackRelease))


@dataclass(frozen=True)
class IngestBatch:
    """What one ingest transaction writes, keyed by each template's ``(device_id, message_id)``.

    ``ledger`` decides what is new: a key already in the ledger (or repeated in
    the batch) is a duplicate, and the other lists' rows of a duplicate key
    are not written.
    """

    ledger: Sequence[LedgerEntry]
    templates: Sequence[TemplateRecord] = ()
    decisions: Sequence[DecisionRecord] = ()
    tracks: Sequence[TrackRelease] = ()


@dataclass(frozen=True)
class KeptCounts:
    """Templates kept per category, and the other kept rows (the console's and the demo's minimisation report)."""

    enrolment: int
    background: int
    recognised: int
    unknown: int
    decisions: int
    unknown_decisions: int
    ledger: int
    track_memory: int


@dataclass(frozen=True)
class EnrolmentSet:
    """Labelled enrolment templates of one bundle (the training data).

    Attributes
    ----------
    values : ndarray of shape (n_templates, n_components), float32
    subjects : ndarray of shape (n_templates,), object (str)
    kinds : ndarray of shape (n_templates,), object (str)
    message_ids : list of str
    """

    values: NDArray[np.float32]
    subjects: NDArray[np.object_]
    kinds: NDArray[np.object_]
    message_ids: list[str]

    def __len__(self) -> int:
        return int(self.values.shape[0])


def stack_blobs(blobs: Sequence[bytes], n_components: int) -> NDArray[np.float32]:
    """Stack float32 value blobs into shape (n, n_components)."""
    if not blobs:
        return np.zeros((0, n_components), dtype=np.float32)
    arr = np.frombuffer(b"".join(blobs), dtype="<f4").astype(np.float32)
    return arr.reshape(len(blobs), n_components)


@dataclass(frozen=True)
class ReplicaHolder:
    """The process registered under a ``cluster.replica_id``: where it runs, since when, its last heartbeat."""

    host: str
    pid: int
    token: str
    started_at: float
    heartbeat_at: float


#: The longest display name a person may agree to be shown under in Home Assistant (its device's name there).
MAX_DISPLAY_NAME = 64


def check_display_name(value: Any, field: str = "name") -> str:
    """Return ``value`` in NFC if it is a usable display name for Home Assistant, else raise ``ValueError``.

    1-:data:`MAX_DISPLAY_NAME` characters after trimming the ends' spaces, none of them a control, format, bidi or
    line/paragraph separator character (Unicode Cc, Cf, Cs, Zl, Zp: a name that displays as another, or breaks a
    line in Home Assistant's pages): the rule subject ids follow (:func:`peep.core.wire.check_subject_id`), with
    ``/``, ``+`` and ``#`` allowed, since a display name is a payload, never a topic level.

    Examples
    --------
    >>> check_display_name("  Alice B. ")
    'Alice B.'
    >>> check_display_name("x" * 65, "--name")
    Traceback (most recent call last):
    ...
    ValueError: --name: expected a display name of 1-64 characters ..., received 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...'
    """
    import unicodedata

    text = unicodedata.normalize("NFC", value).strip() if isinstance(value, str) else None
    if (
        text is None
        or not 1 <= len(text) <= MAX_DISPLAY_NAME
        or any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp") for c in text)
    ):
        shown = repr(value[:32] + "..." if isinstance(value, str) and len(value) > 32 else value)
        raise ValueError(
            f"{field}: expected a display name of 1-{MAX_DISPLAY_NAME} characters with no control, format or bidi "
            f"character, received {shown}"
        )
    return text


@dataclass(frozen=True, slots=True)
class ShownPerson:
    """A subject who opted in to be shown in Home Assistant (a row of ``home_assistant_people``, migration 18).

    Attributes
    ----------
    subject : str
        The enrolled subject.
    display_name : str
        The name they agreed to be shown under (:func:`check_display_name`).
    opted_in_at : float
        Unix time of the opt-in (or of the last change of the name).
    """

    subject: str
    display_name: str
    opted_in_at: float
