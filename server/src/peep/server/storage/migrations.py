"""Numbered schema migrations, one list per SQL dialect, and the one function that applies them.

A migration is applied once, in a transaction, and recorded in
``peep_schema``; opening a database whose schema is newer than this software
knows fails (never guess at an unknown schema). Append new migrations; never
edit an applied one.

Every table is created here, QBBS's too (the odometer in migration 4, the soft
traits in migration 16): the server's database on SQLite or PostgreSQL, and
the file QBBS keeps its soft traits in on a single node
(:data:`SOFT_TRAIT_MIGRATIONS`, numbered on their own in ``qbbs_schema``), all
by :func:`migrate`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from peep.server.storage.dialect import POSTGRES, SQLITE, Dialect
from peep.server.storage.interface import StoreError

# Written out, not generated from TEMPLATE_COLUMNS: an applied migration must not change when
# the record does (a new column is a new migration). tests/server/test_storage.py checks that the
# migrated table has exactly the record's columns.
_TEMPLATES = """
CREATE TABLE templates (
    message_id          TEXT NOT NULL,
    device_id           TEXT NOT NULL,
    site                TEXT NOT NULL,
    bundle_id           TEXT NOT NULL,
    mechanism_kind      TEXT NOT NULL,
    epsilon             {real} NOT NULL,
    delta               {real} NOT NULL,
    epsilon_coordinate  {real} NOT NULL,
    epsilon_vector      {real} NOT NULL,
    noise_std           {real} NOT NULL,
    purpose             TEXT NOT NULL,
    subject             TEXT,
    track_id            TEXT NOT NULL,
    capture_time        {real} NOT NULL,
    received_at         {real} NOT NULL,
    n_components        INTEGER NOT NULL,
    vals                {blob} NOT NULL,
    soft_traits         TEXT,
    CONSTRAINT templates_pk PRIMARY KEY (message_id)
)
"""

_COMMON = [
    "CREATE INDEX templates_enrolment ON templates (bundle_id, purpose, subject)",
    "CREATE INDEX templates_subject ON templates (subject)",
    "CREATE INDEX templates_received ON templates (received_at)",
    "CREATE TABLE bundles (bundle_id TEXT PRIMARY KEY, published_at {real} NOT NULL, payload {blob} NOT NULL)",
    "CREATE INDEX bundles_published ON bundles (published_at)",
    "CREATE TABLE erasures (subject TEXT PRIMARY KEY, erased_at {real} NOT NULL)",
]


# Migration 2: message ids are unique per device, not globally (before, another device
# re-using an id was answered DUPLICATE and its template dropped). The key becomes (device_id, message_id).
# SQLite cannot change a primary key in place, so both dialects rebuild the table with the same
# statements: copy every row into the new table, drop the old one (its indexes go with it), rename,
# recreate the indexes, plus one on message_id alone (relabelling and look-ups by id). The new key
# has its own constraint name: PostgreSQL names the key's index after it, and the old one exists
# until the old table is dropped.
_COLUMNS_V1 = (
    "message_id, device_id, site, bundle_id, mechanism_kind, epsilon, delta, epsilon_coordinate, epsilon_vector, "
    "noise_std, purpose, subject, track_id, capture_time, received_at, n_components, vals, soft_traits"
)
_PER_DEVICE_KEY = [
    _TEMPLATES.replace("CREATE TABLE templates (", "CREATE TABLE templates_v2 (").replace(
        "CONSTRAINT templates_pk PRIMARY KEY (message_id)",
        "CONSTRAINT templates_device_message_pk PRIMARY KEY (device_id, message_id)",
    ),
    f"INSERT INTO templates_v2 ({_COLUMNS_V1}) SELECT {_COLUMNS_V1} FROM templates",
    "DROP TABLE templates",
    "ALTER TABLE templates_v2 RENAME TO templates",
    *_COMMON[:3],
    "CREATE INDEX templates_message ON templates (message_id)",
]


# Migration 3: the model registry in the database, so that replicas on one PostgreSQL share
# it: each version's ONNX model, validation scores and metadata (with the thresholds it serves with as
# columns) in one row, and the serving version in a one-row table. A promotion inserts the version and
# points model_current at it in one transaction. SQLite has the same tables (one query set), but a
# single node on SQLite keeps its registry in training.model_dir.
_MODELS = [
    """
CREATE TABLE model_versions (
    version             INTEGER PRIMARY KEY,
    name                TEXT NOT NULL UNIQUE,
    created_at          {real} NOT NULL,
    bundle_id           TEXT NOT NULL,
    unknown_threshold   {real} NOT NULL,
    verify_threshold    {real} NOT NULL,
    target_far          {real} NOT NULL,
    meta                TEXT NOT NULL,
    onnx                {blob} NOT NULL,
    onnx_sha256         TEXT NOT NULL,
    scores              {blob}
)
""",
    "CREATE TABLE model_current (slot INTEGER PRIMARY KEY CHECK (slot = 1), version INTEGER NOT NULL, "
    "promoted_at {real} NOT NULL)",
]


# Migration 4: the QBBS privacy odometer in the database, so that replicas enforce one
# cap per subject: the running total per subject (the row a spend locks) and every spend (the audit log;
# kept when the subject is erased). The soft traits themselves stay in the QBBS package's own tables
# (only peep.server.qbbs._store may name them, tests/qbbs/test_store_boundary.py).
_ODOMETER = {
    "sqlite": "INTEGER PRIMARY KEY",  # the rowid: increasing
    "postgres": "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
}


def _odometer(dialect: Dialect) -> list[str]:
    return [
        "CREATE TABLE qbbs_odometer (subject TEXT PRIMARY KEY, epsilon_spent {real} NOT NULL, "
        "releases INTEGER NOT NULL)",
        f"CREATE TABLE qbbs_spends (id {_ODOMETER[dialect.name]}, subject TEXT NOT NULL, epsilon {{real}} NOT NULL, "
        "spent_at {real} NOT NULL, note TEXT NOT NULL)",
        "CREATE INDEX qbbs_spends_subject ON qbbs_spends (subject, id)",
    ]


# Migration 5: the operator console (peep.server.console): its accounts (scrypt hashes, never
# passwords), server-side sessions (the SHA-256 of the cookie's id, never the id), unknown-face alerts and
# who acknowledged them, and the console's audit log (who did what, when; kept when a subject is erased:
# it names the subject only as the target of the erasure). In the database so that replicas share them.
def _console(dialect: Dialect) -> list[str]:
    return [
        "CREATE TABLE console_users (name TEXT PRIMARY KEY, role TEXT NOT NULL, password_hash TEXT NOT NULL, "
        "must_change INTEGER NOT NULL, disabled INTEGER NOT NULL, created_at {real} NOT NULL)",
        "CREATE TABLE console_sessions (id_sha256 TEXT PRIMARY KEY, name TEXT NOT NULL, csrf TEXT NOT NULL, "
        "created_at {real} NOT NULL, expires_at {real} NOT NULL, last_seen {real} NOT NULL)",
        "CREATE INDEX console_sessions_name ON console_sessions (name)",
        "CREATE TABLE console_alerts (event_id TEXT PRIMARY KEY, at {real} NOT NULL, site TEXT NOT NULL, "
        "device_id TEXT NOT NULL, probability {real} NOT NULL, model_version TEXT NOT NULL, "
        "acknowledged_by TEXT, acknowledged_at {real})",
        "CREATE INDEX console_alerts_at ON console_alerts (at)",
        f"CREATE TABLE console_audit (id {_ODOMETER[dialect.name]}, at {{real}} NOT NULL, actor TEXT NOT NULL, "
        "action TEXT NOT NULL, target TEXT NOT NULL, outcome TEXT NOT NULL, address TEXT NOT NULL)",
        "CREATE INDEX console_audit_at ON console_audit (at)",
    ]


# Migration 6: the console's failed logins, per account name and per client address, in the database so
# that every replica behind one load balancer counts the same failures (one row per failure and key; rows
# older than the throttle's window are deleted as new ones arrive).
_LOGIN_FAILURES = [
    "CREATE TABLE console_login_failures (kind TEXT NOT NULL, value TEXT NOT NULL, at {real} NOT NULL)",
    "CREATE INDEX console_login_failures_key ON console_login_failures (kind, value, at)",
    "CREATE INDEX console_login_failures_at ON console_login_failures (at)",
]


# Migration 7: each device's latest report sent over gRPC (peep.core.reports; the MQTT twin is a retained
# message), one row per device, so that every replica's console shows it. Counts and ε only: no face.
_DEVICE_REPORTS = [
    "CREATE TABLE device_reports (device_id TEXT PRIMARY KEY, site TEXT NOT NULL, report {blob} NOT NULL, "
    "received_at {real} NOT NULL)",
]


# Migration 8: a track's recent releases by (device, track), so that a replica deciding a track's later
# release can fuse it with an earlier one another replica took (recognition/fusion.py, clustered only).
_TRACK_INDEX = ["CREATE INDEX templates_track ON templates (device_id, track_id)"]


# Migration 9: decide, then forget. Identify/verify templates are no longer written before they are decided
# (recognition.keep, default none): de-duplication moves from the templates table's key to a ledger of
# received message ids (ids, times and the release's mechanism and ε; no template), seeded here with every
# stored template so that a redelivery of one is still a duplicate. The decisions are kept (recognition_events,
# with an increasing id), a track's recent release for fusion across replicas has a table of its own that
# expires with the fusion window (track_memory; the index on templates for that look-up goes), and a kept
# identify/verify template records whom it was recognised as, so that erasing that person deletes it.
_LEDGER_TRAITS_EPSILON = {
    "sqlite": "COALESCE((SELECT SUM(json_extract(value, '$.epsilon')) FROM json_each(templates.soft_traits)), 0)",
    "postgres": "COALESCE((SELECT SUM((e ->> 'epsilon')::float8) "
    "FROM json_array_elements(templates.soft_traits::json) e), 0)",
}
_EVENT_ID = {
    "sqlite": "INTEGER PRIMARY KEY AUTOINCREMENT",  # never reused, even after the oldest rows are deleted
    "postgres": "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
}


def _forget(dialect: Dialect) -> list[str]:
    ledger_columns = (
        "device_id, message_id, site, received_at, purpose, track_id, bundle_id, mechanism_kind, "
        "epsilon_coordinate, epsilon_vector, epsilon_traits"
    )
    return [
        "CREATE TABLE ingest_ledger (device_id TEXT NOT NULL, message_id TEXT NOT NULL, site TEXT NOT NULL, "
        "received_at {real} NOT NULL, purpose TEXT NOT NULL, track_id TEXT NOT NULL, bundle_id TEXT NOT NULL, "
        "mechanism_kind TEXT NOT NULL, epsilon_coordinate {real} NOT NULL, epsilon_vector {real} NOT NULL, "
        # Keyed (message_id, device_id): look-ups bind message ids first (Dialect.any_pair_of).
        "epsilon_traits {real} NOT NULL, CONSTRAINT ingest_ledger_pk PRIMARY KEY (message_id, device_id))",
        "CREATE INDEX ingest_ledger_received ON ingest_ledger (received_at)",
        f"INSERT INTO ingest_ledger ({ledger_columns}) SELECT device_id, message_id, site, received_at, purpose, "
        "track_id, bundle_id, mechanism_kind, epsilon_coordinate, epsilon_vector, "
        f"{_LEDGER_TRAITS_EPSILON[dialect.name]} FROM templates",
        f"CREATE TABLE recognition_events (id {_EVENT_ID[dialect.name]}, event_id TEXT NOT NULL, "
        "at {real} NOT NULL, site TEXT NOT NULL, device_id TEXT NOT NULL, message_id TEXT NOT NULL, "
        "track_id TEXT NOT NULL, purpose TEXT NOT NULL, subject TEXT NOT NULL, claimed_subject TEXT NOT NULL, "
        "unknown INTEGER NOT NULL, accepted INTEGER, probability {real} NOT NULL, model_version TEXT NOT NULL, "
        "releases_fused INTEGER NOT NULL)",
        # One index besides the id: ingest writes a row per decision, and reads by anything but age (an
        # erasure's subject, a message id) are rare enough to scan at most events_days of rows.
        "CREATE INDEX recognition_events_at ON recognition_events (at)",
        "CREATE TABLE track_memory (device_id TEXT NOT NULL, track_id TEXT NOT NULL, message_id TEXT NOT NULL, "
        "site TEXT NOT NULL, bundle_id TEXT NOT NULL, capture_time {real} NOT NULL, expires_at {real} NOT NULL, "
        "n_components INTEGER NOT NULL, vals {blob} NOT NULL, "
        "CONSTRAINT track_memory_pk PRIMARY KEY (message_id, device_id))",
        "CREATE INDEX track_memory_track ON track_memory (device_id, track_id)",
        "CREATE INDEX track_memory_expires ON track_memory (expires_at)",
        "ALTER TABLE templates ADD COLUMN decided_subject TEXT",
        "CREATE INDEX templates_decided ON templates (decided_subject)",
        "DROP INDEX templates_track",
    ]


# Migration 10: the site key each template was released under (its public id; "" for none). Training
# never mixes keys, and the serving model's key decides which identify/verify templates it can answer.
# (A model's key id is in its metadata.)
_KEY_ID = ["ALTER TABLE templates ADD COLUMN key_id TEXT NOT NULL DEFAULT ''"]


# Migration 11: which process holds each cluster.replica_id (one at a time), kept alive by its heartbeat.
_REPLICAS = [
    "CREATE TABLE replica_registrations (replica_id TEXT PRIMARY KEY, host TEXT NOT NULL, pid INTEGER NOT NULL, "
    "token TEXT NOT NULL, started_at {real} NOT NULL, heartbeat_at {real} NOT NULL)"
]


# Migration 12: which replica made each decision (its cluster.replica_id; "" for a single server), so a
# replica with cluster.events = false can stream only its own from the shared log of decisions.
_DECISION_ORIGIN = ["ALTER TABLE recognition_events ADD COLUMN origin TEXT NOT NULL DEFAULT ''"]


# Migration 13: how each ledger row arrived (transport: grpc or mqtt) and whose credential sent it (sent_by:
# device or admin), so that the console shows a device's own transport and counts what the administrator
# enrolled in a device's name (public background faces) apart from the device's own releases. Rows from
# before are "" (not recorded) in both.
_LEDGER_ORIGIN = [
    "ALTER TABLE ingest_ledger ADD COLUMN transport TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE ingest_ledger ADD COLUMN sent_by TEXT NOT NULL DEFAULT ''",
]


# Migration 14: the signed device models issued (peep.server.recognition.devicemodels), one row per serial: the
# serial (strictly increasing, the largest never deleted), the server model it was made from, its bundle and site
# key, when it was issued and expires, how many of its subjects were erased since training, the calibration set it
# carries, why it was issued, whether it was withdrawn (its site key retired), and its files (the encoded
# DeviceModelFiles) while it is the newest of its bundle and key. In the database so that replicas serve one serial.
_SERIAL = {"sqlite": "INTEGER PRIMARY KEY", "postgres": "BIGINT PRIMARY KEY"}


def _device_models(dialect: Dialect) -> list[str]:
    return [
        f"CREATE TABLE device_models (serial {_SERIAL[dialect.name]}, model_version TEXT NOT NULL, "
        "bundle_id TEXT NOT NULL, key_id TEXT NOT NULL, trained_at {real} NOT NULL, issued_at {real} NOT NULL, "
        "expires_at {real} NOT NULL, subjects INTEGER NOT NULL, erased INTEGER NOT NULL, calibration TEXT NOT NULL, "
        "reason TEXT NOT NULL, withdrawn_at {real}, payload {blob})",
        "CREATE INDEX device_models_scope ON device_models (bundle_id, key_id, serial)",
    ]


# Migration 15: decisions made on a device (a release carrying a decision instead of a template). The ledger
# charges such a release the ε of its label (epsilon_label; its template ε are 0: there is no template), and a
# kept decision says where it was made (decided_on: server or device), its label's ε and the serial of the
# device model that made it. Rows from before are the server's, with no label.
def _device_decisions(dialect: Dialect) -> list[str]:
    return [
        "ALTER TABLE ingest_ledger ADD COLUMN epsilon_label {real} NOT NULL DEFAULT 0",
        "ALTER TABLE recognition_events ADD COLUMN decided_on TEXT NOT NULL DEFAULT 'server'",
        "ALTER TABLE recognition_events ADD COLUMN epsilon_label {real} NOT NULL DEFAULT 0",
        f"ALTER TABLE recognition_events ADD COLUMN model_serial {_SERIAL[dialect.name].split()[0]} NOT NULL DEFAULT 0",
    ]


# Migration 16: QBBS's soft traits and its store's metadata (the query structure fixed at the first enrolment),
# in the database so that replicas on one PostgreSQL read one set. The QBBS package used to create these itself
# when it opened its store, with IF NOT EXISTS; the same statements here migrate a database where it did without
# a change. They are also the whole schema of the SQLite file QBBS keeps on a single node (SOFT_TRAIT_MIGRATIONS).
# Created here only; read and written only by the QBBS package's store (tests/qbbs/test_store_boundary.py).
def _soft_traits(dialect: Dialect) -> list[str]:
    without_rowid = " WITHOUT ROWID" if dialect.name == "sqlite" else ""  # (subject, trait) is the only key
    return [
        "CREATE TABLE IF NOT EXISTS qbbs_soft_traits (subject TEXT NOT NULL, trait TEXT NOT NULL, "
        "value {real} NOT NULL, enrolled_at {real} NOT NULL, PRIMARY KEY (subject, trait))" + without_rowid,
        "CREATE INDEX IF NOT EXISTS qbbs_soft_traits_trait ON qbbs_soft_traits (trait, subject)",
        "CREATE TABLE IF NOT EXISTS qbbs_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    ]


# Migration 17: a door's opening asked from Home Assistant is kept as what it was, an access record naming nobody
# with who asked (requested_by); rows from before were all claims at the door.
_DOOR_REQUESTS = ["ALTER TABLE recognition_events ADD COLUMN requested_by TEXT NOT NULL DEFAULT ''"]


# Migration 18: the subjects who opted in to be shown in Home Assistant (off by default: no row, not shown), when,
# and the display name they agreed to (transport/homeassistant_people.py). Deleted when the subject opts out or is
# erased; nothing else is kept of it (the console's audit log records that it changed, not the name).
_HOME_ASSISTANT_PEOPLE = [
    "CREATE TABLE home_assistant_people (subject TEXT PRIMARY KEY, display_name TEXT NOT NULL, "
    "opted_in_at {real} NOT NULL)"
]


def _render(dialect: Dialect, statements: list[str]) -> list[str]:
    return [s.format(real=dialect.real, blob=dialect.blob) for s in statements]


#: dialect -> list of migrations; migration i (1-based) is a list of statements.
MIGRATIONS: dict[str, list[list[str]]] = {
    d.name: [
        _render(d, [_TEMPLATES, *_COMMON]),
        _render(d, _PER_DEVICE_KEY),
        _render(d, _MODELS),
        _render(d, _odometer(d)),
        _render(d, _console(d)),
        _render(d, _LOGIN_FAILURES),
        _render(d, _DEVICE_REPORTS),
        _render(d, _TRACK_INDEX),
        _render(d, _forget(d)),
        _render(d, _KEY_ID),
        _render(d, _REPLICAS),
        _render(d, _DECISION_ORIGIN),
        _render(d, _LEDGER_ORIGIN),
        _render(d, _device_models(d)),
        _render(d, _device_decisions(d)),
        _render(d, _soft_traits(d)),
        _render(d, _DOOR_REQUESTS),
        _render(d, _HOME_ASSISTANT_PEOPLE),
    ]
    for d in (SQLITE, POSTGRES)
}

SCHEMA_TABLE = "peep_schema"

#: The SQLite file QBBS keeps its soft traits in on a single node (``qbbs.store_path``, or in memory): migration
#: 16's tables, numbered on their own and recorded in :data:`SOFT_TRAIT_SCHEMA_TABLE` of that file.
SOFT_TRAIT_MIGRATIONS: list[list[str]] = [_render(SQLITE, _soft_traits(SQLITE))]
SOFT_TRAIT_SCHEMA_TABLE = "qbbs_schema"


def latest(dialect: str) -> int:
    return len(MIGRATIONS[dialect])


def migrate(
    conn: Any, steps: Sequence[Sequence[str]], dialect: Dialect, *, source: str, table: str = SCHEMA_TABLE
) -> int:
    """Apply the migrations of ``steps`` that ``conn``'s database lacks; returns its schema version.

    Run in one transaction the caller holds (with whatever lock keeps other processes' migrations out), so
    a migration is recorded if and only if all its statements ran.

    Parameters
    ----------
    conn : DB-API connection
        In a transaction.
    steps : sequence of sequences of str
        Migration ``i`` (1-based) is ``steps[i - 1]``.
    dialect : Dialect
    source : str
        What an error names: the setting that points at this database.
    table : str
        Where the applied versions are recorded.

    Raises
    ------
    StoreError
        The database's schema is newer than ``steps`` knows.
    """
    p = dialect.param
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {table} (version INTEGER PRIMARY KEY, applied_at {dialect.real} NOT NULL)"
    )
    row = conn.execute(f"SELECT COALESCE(MAX(version), 0) FROM {table}").fetchone()
    current = int(row[0]) if row else 0
    if current > len(steps):
        raise StoreError(
            f"{source}: schema version {current} is newer than this software's {len(steps)}; upgrade peep-server"
        )
    for version in range(current + 1, len(steps) + 1):
        for stmt in steps[version - 1]:
            conn.execute(stmt)
        conn.execute(f"INSERT INTO {table} (version, applied_at) VALUES ({p}, {p})", (version, time.time()))
    return len(steps)
