"""The :class:`Store` interface the server programs against, its error, and opening one from the configuration."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from peep.core import wire
from peep.server.storage.records import (
    DecisionRecord,
    EnrolmentSet,
    IngestBatch,
    KeptCounts,
    ReplicaHolder,
    ShownPerson,
    TemplateRecord,
    TrackRelease,
)


class StoreError(RuntimeError):
    """The database failed (connection, schema newer than this software, ...)."""


def is_database_outage(exc: BaseException) -> bool:
    """Whether ``exc`` is the database not answering (refused, gone mid-query), not a fault of the request.

    A client can only be told to try again for these; their text stays in the log (a driver's message can name
    hosts, a DSN its password).
    """
    if isinstance(exc, StoreError):
        return True
    if type(exc).__module__.startswith("psycopg"):
        import psycopg

        return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
    import sqlite3

    return isinstance(exc, sqlite3.OperationalError)


class Store(Protocol):
    """What the server needs from a database."""

    dialect: str

    def schema_version(self) -> int:
        """Applied migration number."""
        ...

    def insert_templates(self, records: Sequence[TemplateRecord]) -> list[bool]:
        """Insert in one transaction, idempotently by ``(device_id, message_id)``.

        Message ids are unique per device (schema version 2): another device
        may use the same id. Returns, per input record, True when it was stored
        now and False when its device's ``message_id`` was already stored (or
        repeated earlier in the batch).
        """
        ...

    def get_template(self, message_id: str, *, device_id: str | None = None) -> TemplateRecord | None:
        """The template ``device_id`` sent as ``message_id``; without ``device_id``, the first received of that id."""
        ...

    def devices_of(self, message_ids: Sequence[str]) -> dict[str, list[str]]:
        """For each stored message id among ``message_ids``, the devices that sent one (sorted)."""
        ...

    def count_templates(
        self, *, subject: str | None = None, bundle_id: str | None = None, purpose: str | None = None
    ) -> int: ...

    def enrolment_kinds(self, bundle_id: str) -> dict[str, int]:
        """Number of labelled enrolment templates of ``bundle_id`` per mechanism kind."""
        ...

    def enrolment_set(self, bundle_id: str, kinds: Sequence[str], key_id: str | None = None) -> EnrolmentSet:
        """Labelled enrolment templates of ``bundle_id`` released with one of ``kinds`` (under ``key_id`` if given)."""
        ...

    def delete_key_templates(self, key_id: str) -> int:
        """Delete every template released under site key ``key_id`` ("" = unkeyed); returns rows deleted."""
        ...

    def enrolment_key_ids(self, bundle_id: str, kinds: Sequence[str]) -> dict[str, int]:
        """Number of labelled enrolment templates of ``bundle_id`` and ``kinds`` per site key id ("" = none)."""
        ...

    def relabel(self, keys: Sequence[tuple[str, str]], subject: str) -> int:
        """Mark the stored templates ``(device_id, message_id)`` as enrolments of ``subject``; returns rows changed."""
        ...

    def delete_subject(self, subject: str) -> int:
        """Delete every template labelled, claimed or recognised as ``subject``; returns rows deleted."""
        ...

    def delete_received_before(self, cutoff: float, *, include_enrolment: bool = False) -> int:
        """Retention: delete templates received before ``cutoff`` (Unix time)."""
        ...

    def put_bundle(self, bundle_id: str, payload: bytes, published_at: float) -> None:
        """Store a verified bundle (serialised ``BundleFiles``) and make it the current one."""
        ...

    def get_bundle(self, bundle_id: str | None = None) -> bytes | None:
        """A stored bundle's payload; the most recently published when ``bundle_id`` is None."""
        ...

    def seen(self, keys: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        """The ``(device_id, message_id)`` keys among ``keys`` that the ingest ledger holds (received before)."""
        ...

    def commit_ingest(self, batch: IngestBatch) -> list[bool]:
        """Write one ingest batch in one transaction (see :class:`IngestBatch`).

        Returns, per ledger entry, True when its key was new (its rows were
        written) and False for a duplicate (already in the ledger, another
        replica's concurrent commit included, or repeated earlier in the batch).
        """
        ...

    def count_received(self, *, device_id: str | None = None) -> int:
        """Message ids in the ingest ledger (templates received within its window), of one device or all."""
        ...

    def add_decisions(self, records: Sequence[DecisionRecord]) -> None:
        """Keep decisions made outside ingest (the Identify and Verify calls)."""
        ...

    def decisions(
        self, *, since_id: int = 0, limit: int = 1000, site: str = "", device_id: str = "", origin: str | None = None
    ) -> list[tuple[int, DecisionRecord]]:
        """Kept decisions with an id above ``since_id``, oldest first, with their ids.

        Only those of ``site`` / ``device_id`` / replica ``origin`` when given ("" / None: any).
        """
        ...

    def last_decision_id(self) -> int:
        """The largest id of a kept decision (0: none yet)."""
        ...

    def first_decision_id(self) -> int:
        """The smallest id of a kept decision (0: none kept)."""
        ...

    def track_memory(self, tracks: Sequence[tuple[str, str]], *, now: float) -> list[TrackRelease]:
        """Unexpired remembered releases of the ``(device_id, track_id)`` pairs, in no particular order."""
        ...

    def expire_track_memory(self, now: float) -> int:
        """Delete remembered releases that expired at or before ``now``; returns how many."""
        ...

    def delete_ledger_before(self, cutoff: float) -> int:
        """Forget message ids received before ``cutoff``; returns how many."""
        ...

    def delete_decisions_before(self, cutoff: float) -> int:
        """Delete decisions made before ``cutoff``; returns how many."""
        ...

    def delete_alerts_before(self, cutoff: float) -> int:
        """Delete the console's unknown-face alerts raised before ``cutoff``; returns how many."""
        ...

    def delete_recognition_templates(
        self, *, before: float | None = None, unknown_only: bool = False
    ) -> dict[str, int]:
        """Delete kept identify/verify templates (received before ``before``; only unknown ones).

        Returns ``{"recognised": n, "unknown": n}`` deleted.
        """
        ...

    def names_subject(self, subject: str) -> bool:
        """Whether a stored template, a kept decision or an opt-in to Home Assistant names ``subject`` (what an erasure
        would delete)."""
        ...

    def delete_subject_decisions(self, subject: str) -> int:
        """Delete the decisions that name ``subject`` (identified as, or claimed); returns how many."""
        ...

    def register_replica(self, replica_id: str, *, host: str, pid: int, token: str, now: float, stale_s: float,
                         alive: Callable[[int], bool]) -> ReplicaHolder | None:  # fmt: skip
        """Hold ``replica_id`` for this process: None when held now, else the live holder (see SqlStore)."""
        ...

    def heartbeat_replica(self, replica_id: str, token: str, now: float) -> bool:
        """Renew the registration; False when another process holds the id now."""
        ...

    def release_replica(self, replica_id: str, token: str) -> None:
        """Give the id up (a clean stop)."""
        ...

    def kept_counts(self, background_prefix: str) -> KeptCounts:
        """What is kept, per category (:class:`KeptCounts`)."""
        ...

    def put_device_report(self, device_id: str, site: str, report: bytes, received_at: float) -> None:
        """Keep ``report`` (a validated :mod:`peep.core.reports` payload) as the device's latest."""
        ...

    def device_reports(self) -> dict[str, tuple[str, bytes, float]]:
        """``{device_id: (site, report payload, received_at)}``: each device's latest report over gRPC."""
        ...

    def record_erasure(self, subject: str, at: float) -> None: ...

    def erasures(self) -> Mapping[str, float]:
        """Erased subjects and when (a model trained before then must not name them)."""
        ...

    def set_home_assistant_person(self, subject: str, display_name: str, at: float) -> bool:
        """Opt ``subject`` in to Home Assistant under ``display_name`` (``ValueError`` if it is not a usable name:
        :func:`~peep.server.storage.records.check_display_name`), or change the name; True when newly in."""
        ...

    def clear_home_assistant_person(self, subject: str) -> bool:
        """Opt ``subject`` out of Home Assistant (an opt-out or an erasure); True when they were in."""
        ...

    def home_assistant_people(self) -> dict[str, ShownPerson]:
        """The subjects who opted in to be shown in Home Assistant, each with their display name and when."""
        ...

    def close(self) -> None: ...


def template_keys(store: Store, refs: Sequence[str], field: str = "message_ids") -> list[tuple[str, str]]:
    """``(device_id, message_id)`` of the stored templates ``refs`` name; unknown ones are skipped.

    Message ids are unique per device, so a reference is ``DEVICE_ID/MESSAGE_ID``
    (``/`` never occurs in an id), or a bare ``MESSAGE_ID`` that exactly one
    device sent. A bare id several devices used is refused (``ValueError``
    naming them), never resolved to all of them: a device could otherwise get
    its own template trained on as someone's enrolment by re-using an id it saw.
    """
    keys: list[tuple[str, str]] = []
    bare: list[tuple[int, str]] = []
    for i, ref in enumerate(refs):
        device, sep, mid = ref.rpartition("/")
        if not (wire.ID_PATTERN.match(mid) and (not sep or wire.ID_PATTERN.match(device))):
            raise ValueError(
                f"{field}[{i}]: expected MESSAGE_ID or DEVICE_ID/MESSAGE_ID (1-128 characters [A-Za-z0-9_.:@-] "
                f"each), received {ref[:64]!r}"
            )
        if sep:
            keys.append((device, mid))
        else:
            bare.append((i, ref))
    found = store.devices_of([ref for _, ref in bare]) if bare else {}
    for i, ref in bare:
        devices = found.get(ref, [])
        if len(devices) > 1:
            shown = ", ".join(devices[:5]) + (", ..." if len(devices) > 5 else "")
            raise ValueError(
                f"{field}[{i}]: expected a message id one device sent, received {ref!r}, sent by {len(devices)} "
                f"devices ({shown}); name one as DEVICE_ID/{ref}"
            )
        if devices:
            keys.append((devices[0], ref))
    return keys
