"""Storage of perturbed templates and metadata behind one :class:`Store` interface.

Two implementations: :class:`~peep.server.storage.sqlite.SqliteStore`
(embedded default, WAL) and :class:`~peep.server.storage.postgres.PostgresStore`
(several server replicas). Both apply the same numbered migrations
(:mod:`peep.server.storage.migrations`) at open.

This package's face is what the rest of the server imports: the records
(:mod:`~peep.server.storage.records`), the :class:`Store` interface and
:func:`open_store` (:mod:`~peep.server.storage.interface`); the SQL written
once for both databases is :mod:`~peep.server.storage.sql`.

What is stored is exactly what devices send after local-DP noise: the
perturbed coefficients (float32 bytes), the mechanism description, ids, times
and the (already perturbed) soft traits of a template. Nothing else about a
face ever reaches the server.

What is kept is less (``[recognition]`` in the configuration, docs/OPERATIONS.md):

``templates``
    enrolment and background templates (until erased), and identify/verify
    templates only where ``recognition.keep`` asks for them (for
    ``recognition.keep_days``); :class:`TemplateRecord`.
``ingest_ledger``
    one row per received message id -- ids, times and the release's
    mechanism, no template -- for ``ingest.max_age_s + ingest.max_clock_skew_s``,
    so that a redelivered template is answered DUPLICATE after the template
    itself was forgotten; :class:`LedgerEntry`.
``recognition_events``
    the decisions, for ``recognition.events_days``; :class:`DecisionRecord`.
``track_memory``
    (replicas on PostgreSQL only) a track's latest identify release, for at
    most ``training.track_fusion_s``, so that another replica can fuse the
    track's next release with it; :class:`TrackRelease`.
``home_assistant_people``
    the subjects who opted in to be shown in Home Assistant, under the
    display name they agreed to, until they opt out or are erased;
    :class:`ShownPerson`.
"""

from __future__ import annotations

from peep.server.storage.interface import Store, StoreError, template_keys
from peep.server.storage.opening import open_store
from peep.server.storage.records import (
    ACCESS_RECORD,
    COLUMNS,
    DECISION_COLUMNS,
    LEDGER_COLUMNS,
    TEMPLATE_COLUMNS,
    TRACK_COLUMNS,
    Column,
    DecisionRecord,
    EnrolmentSet,
    IngestBatch,
    KeptCounts,
    LedgerEntry,
    ReplicaHolder,
    ShownPerson,
    TemplateRecord,
    TrackRelease,
    check_display_name,
    stack_blobs,
)

__all__ = [
    "ACCESS_RECORD",
    "COLUMNS",
    "DECISION_COLUMNS",
    "LEDGER_COLUMNS",
    "TEMPLATE_COLUMNS",
    "TRACK_COLUMNS",
    "Column",
    "DecisionRecord",
    "EnrolmentSet",
    "IngestBatch",
    "KeptCounts",
    "LedgerEntry",
    "ReplicaHolder",
    "ShownPerson",
    "Store",
    "StoreError",
    "TemplateRecord",
    "TrackRelease",
    "check_display_name",
    "open_store",
    "stack_blobs",
    "template_keys",
]
